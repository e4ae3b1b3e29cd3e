// What a sandbox sees of the host: the runner's command line, the host's
// identifiers (boot_id, machine-id) and the run's cgroup name. Each would
// tell the command where it runs (host paths, the supervisor's pid, which
// boot of which machine); docs/security-model.md lists what stays visible.
#include <gtest/gtest.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <string>

#include "harness.h"

namespace agentbox::e2e {
namespace {

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// "4026531836" for this process's pid namespace (the supervisor's too).
std::string OwnPidNsInode() {
  char buf[64] = {};
  ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
  std::string link = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  auto a = link.find('['), b = link.find(']');
  return a != std::string::npos && b != std::string::npos ? link.substr(a + 1, b - a - 1) : "";
}

// The runner's command line as the command reads it: its parent is the
// runner on both backends (pid 1 of the sandbox's pid namespace, or the
// command's parent on the landlock-only backend).
// With `remap`, the workspace is at /workspace inside: its host path is then
// nothing the command needs to know.
void ExpectRunnerCmdlineHoldsNoHostPath(const std::vector<std::string>& options, bool remap) {
  Sandbox sb;
  std::vector<std::string> opts = options;
  if (remap) {
    WriteFile(sb.scratch() + "/policy.yaml",
              "version: 1\nfilesystem:\n  workspace: { path: /workspace, mode: read-write }\n");
    opts.insert(opts.end(), {"--policy", sb.scratch() + "/policy.yaml"});
  }
  RunResult r = sb.Sh("tr '\\0' ' ' < /proc/$PPID/cmdline; echo", opts);
  ASSERT_EQ(r.status, 0) << r.Describe();
  const std::string cmdline = Lines(r.out).at(0);
  EXPECT_FALSE(cmdline.empty()) << r.Describe();
  EXPECT_FALSE(Contains(cmdline, sb.scratch())) << "report/policy path in the runner's argv: " << cmdline;
  if (remap) {
    EXPECT_FALSE(Contains(cmdline, sb.ws())) << "workspace path in the runner's argv: " << cmdline;
  }
  EXPECT_FALSE(Contains(cmdline, "--report")) << cmdline;
  EXPECT_FALSE(Contains(cmdline, "--policy")) << cmdline;
  EXPECT_FALSE(Contains(cmdline, " run ")) << cmdline;
  EXPECT_TRUE(Contains(cmdline, "agentbox")) << cmdline;
}

TEST(HostView, RunnerCmdlineHoldsNoHostPath) { ExpectRunnerCmdlineHoldsNoHostPath({}, true); }

TEST(HostView, RunnerCmdlineHoldsNoHostPathLandlockOnly) {
  ExpectRunnerCmdlineHoldsNoHostPath({"--backend", "landlock", "--require", "partial"}, false);
}

TEST(HostView, BootIdAndMachineIdAreNotTheHosts) {
  Sandbox sb;
  const std::string host_boot = Trim(ReadFile("/proc/sys/kernel/random/boot_id").value_or(""));
  ASSERT_EQ(host_boot.size(), 36u) << "the host's boot_id: " << host_boot;
  RunResult r = sb.Sh(
      "cat /proc/sys/kernel/random/boot_id; cat /proc/sys/kernel/random/boot_id; "
      "echo \"etc=$(cat /etc/machine-id 2>/dev/null)\"; "
      "echo \"dbus=$(cat /var/lib/dbus/machine-id 2>/dev/null)\"");
  ASSERT_EQ(r.status, 0) << r.Describe();
  auto lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 4u) << r.Describe();
  EXPECT_NE(lines[0], host_boot);
  EXPECT_EQ(lines[0].size(), 36u) << "not a uuid: " << lines[0];
  EXPECT_EQ(lines[0][8], '-') << lines[0];
  EXPECT_EQ(lines[0], lines[1]) << "boot_id changes within one sandbox";
  // Another sandbox gets another value: it is not a constant either.
  RunResult again = sb.Sh("cat /proc/sys/kernel/random/boot_id");
  ASSERT_EQ(again.status, 0) << again.Describe();
  EXPECT_NE(Trim(again.out), lines[0]);

  int compared = 0;
  for (const auto& [key, path] : {std::pair<std::string, std::string>{"etc=", "/etc/machine-id"},
                                  {"dbus=", "/var/lib/dbus/machine-id"}}) {
    const std::string host = Trim(ReadFile(path).value_or(""));
    const std::string& line = key == "etc=" ? lines[2] : lines[3];
    ASSERT_EQ(line.rfind(key, 0), 0u) << r.Describe();
    const std::string inside = line.substr(key.size());
    if (host.empty() || inside.empty()) continue;  // not on the host, or not inside the sandbox's tree
    ++compared;
    EXPECT_NE(inside, host) << path << " is the host's inside the sandbox";
    EXPECT_EQ(inside.size(), 32u) << path << ": " << inside;
  }
  if (Exists("/etc/machine-id") && IsDir("/etc")) {
    // The default policy shows /etc: the host's machine-id must have been seen and replaced.
    RunResult etc = sb.Sh("test -e /etc && echo has-etc || echo no-etc");
    if (Contains(etc.out, "has-etc")) {
      EXPECT_GE(compared, 1) << r.Describe();
    }
  }
}

TEST(HostView, CgroupNameCarriesNeitherSupervisorPidNorPidNamespace) {
  if (!CgroupsExpected({"pids"})) {
    GTEST_SKIP() << "not applicable here: no writable cgroup with the pids controller for this user";
  }
  Sandbox sb;
  const std::string pidns = OwnPidNsInode();
  ASSERT_FALSE(pidns.empty());
  Process p(sb.AgentboxCommand({"run", "--max-processes", "64", "--", "sh", "-c",
                                "cat /proc/self/cgroup; echo ready; sleep 1000"}));
  ASSERT_TRUE(p.started());
  ASSERT_TRUE(p.WaitForStdout("ready", 10000)) << p.err();
  const std::string supervisor = std::to_string(p.pid());
  // The run's cgroup as the command sees it, and as the host does.
  std::string inside = p.out();
  RunResult host = RunCommand({{"/usr/bin/find", "/sys/fs/cgroup", "-maxdepth", "6", "-type", "d", "-name",
                                "agentbox-*"}});
  kill(p.pid(), SIGTERM);
  p.Wait();
  std::string name;
  for (const auto& line : Lines(inside)) {
    auto at = line.find("agentbox-");
    if (at == std::string::npos) continue;
    name = line.substr(at);
    EXPECT_FALSE(Contains(line, pidns)) << "pid namespace inode in the cgroup name: " << line;
    EXPECT_FALSE(Contains(line, "-" + supervisor + "-")) << "supervisor pid in the cgroup name: " << line;
  }
  ASSERT_FALSE(name.empty()) << "the command is not in a run cgroup:\n" << inside;
  // The host knows the cgroup by the same name (runs of other suites may be listed too).
  bool found = false;
  for (const auto& dir : Lines(host.out)) found = found || (dir.size() >= name.size() &&
                                                            dir.compare(dir.size() - name.size(), name.size(), name) == 0);
  EXPECT_TRUE(found) << name << " not among\n" << host.out;
}

}  // namespace
}  // namespace agentbox::e2e
