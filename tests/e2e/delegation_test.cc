// Delegation: an unprivileged user that `agentbox setup-delegation` handed a
// cgroup subtree gets its limits from it, `check` shows it, the report names
// it, and no run leaves a cgroup behind in it. tests/delegation/run.sh sets
// the delegation up (as root, under a cgroup of its own) and runs this as
// the user, together with the resources tests, which then expect limits.
#include <gtest/gtest.h>
#include <dirent.h>
#include <unistd.h>

#include <string>

#include "harness.h"

namespace agentbox::e2e {
namespace {

// The record's v1 directories this uid owns, per controller: empty when
// there is no delegation here (a host fact, set up by tests/delegation/run.sh).
std::map<std::string, std::string> DelegatedDirs() {
  std::map<std::string, std::string> dirs;
  for (const char* c : {"memory", "pids", "cpu"}) {
    std::string d = host_facts::DelegatedDir(c);
    if (!d.empty()) dirs[c] = d;
  }
  return dirs;
}

std::vector<std::string> RunCgroupsIn(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (struct dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name.rfind("agentbox-", 0) == 0) out.push_back(dir + "/" + name);
    }
    closedir(d);
  }
  return out;
}

TEST(Delegation, CheckShowsItAndARunIsLimitedInItAndLeavesNothing) {
  auto dirs = DelegatedDirs();
  if (dirs.size() < 3 || getuid() == 0) {
    GTEST_SKIP() << "not applicable here: no delegation of memory, pids and cpu to this uid ("
                 << getuid() << "); tests/delegation/run.sh sets one up";
  }
  Sandbox sb;
  // check: the directory per controller, in human and JSON form.
  RunResult check = RunCommand(sb.AgentboxCommand({"check", "--json"}));
  auto j = nlohmann::json::parse(check.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << check.Describe();
  const auto& d = j["host"]["cgroups"]["delegation"];
  for (const auto& [c, dir] : dirs) EXPECT_EQ(d.value(c, ""), dir) << c << "\n" << check.out;
  RunResult human = RunCommand(sb.AgentboxCommand({"check"}));
  for (const auto& [c, dir] : dirs) EXPECT_TRUE(Contains(human.out, "delegation        " + c + ": " + dir)) << human.out;

  // A run with all three limits: enforced in full, the delegation named.
  RunResult r = sb.Sh("echo ok", {"--memory", "256Mi", "--max-processes", "64", "--cpus", "0.5"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  ASSERT_TRUE(r.report) << r.Describe();
  EXPECT_EQ(EnforcementLevel(r), "full") << r.Describe();
  const auto& facet = (*r.report)["enforcement"]["facets"]["resources"];
  EXPECT_EQ(facet["level"], "full");
  const std::string notes = facet["notes"].dump();
  for (const auto& [c, dir] : dirs) {
    EXPECT_TRUE(Contains(notes, c + ": delegated by setup-delegation at " + dir)) << notes;
  }
  const std::string mech = facet["mechanisms"].dump();
  EXPECT_TRUE(Contains(mech, "cgroup-v1-memory") || Contains(mech, "cgroup-v2-memory")) << mech;
  const auto& limits = (*r.report)["usage"]["limits"];
  EXPECT_EQ(limits["cpu_max_cores"], 0.5) << limits.dump();
  EXPECT_EQ(limits["memory_max_bytes"], 256ull << 20) << limits.dump();
  EXPECT_EQ(limits["pids_max"], 64) << limits.dump();
  EXPECT_TRUE(limits["cgroup"].is_string()) << limits.dump();
  EXPECT_EQ((*r.report)["usage"]["source"], "cgroup");

  // Nothing left: the run's cgroups went with it.
  for (const auto& [c, dir] : dirs) EXPECT_TRUE(RunCgroupsIn(dir).empty()) << dir;
}

}  // namespace
}  // namespace agentbox::e2e
