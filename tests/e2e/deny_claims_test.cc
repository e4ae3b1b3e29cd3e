// The report never claims more than was enforced: for each backend, every
// path the default policy denies is read from inside the sandbox, and what
// happened is held against the credentials facet's claim. A facet that says
// `full` must have every read fail; a path that could be read must leave the
// facet `partial`, with its deny entry named in `missing`.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness.h"

namespace agentbox::e2e {
namespace {

struct DeniedPath {
  std::string path;    // on the host (and, with either backend, at the same path inside)
  std::string entry;   // the default policy's deny entry that names it
  std::string secret;  // a marker in its content ("" for a host file we do not print)
};

// "namespaces (...)", "landlock-only (...)" or "none (why)": what `check`
// says this host gives for `--backend`.
std::string BackendLine(const Sandbox& box, const std::string& backend) {
  RunResult r = RunCommand(box.AgentboxCommand({"check", "--json", "--backend", backend}));
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  if (j.is_discarded() || !j["backend"].is_string()) return "none (check printed no backend: " + r.Describe() + ")";
  return j["backend"].get<std::string>();
}

class DenyClaims : public ::testing::TestWithParam<const char*> {};

TEST_P(DenyClaims, EveryDeniedPathReadAgainstTheCredentialsFacet) {
  Sandbox box;
  const std::string backend = GetParam();
  const std::string line = BackendLine(box, backend);
  if (line.rfind("none", 0) == 0) GTEST_SKIP() << "not applicable here: --backend " << backend << ": " << line;

  const std::string env_secret = "DOTENV-" + RandomHex();
  const std::string nested_secret = "NESTED-DOTENV-" + RandomHex();
  WriteFile(box.ws() + "/.env", "TOKEN=" + env_secret + "\n", 0600);
  WriteFile(box.ws() + "/service/.env", "TOKEN=" + nested_secret + "\n", 0600);
  const std::vector<DeniedPath> denied = {
      {box.ws() + "/.env", "'**/.env'", env_secret},
      {box.ws() + "/service/.env", "'**/.env'", nested_secret},
      {box.home() + "/.ssh/id_rsa", "'~/.ssh'", box.ssh_secret()},
      {box.home() + "/.aws/credentials", "'~/.aws'", box.aws_secret()},
      // Never printed: only whether it could be opened.
      {"/etc/shadow", "'/etc/shadow'", ""},
  };
  std::string script;
  for (const auto& d : denied) {
    script += "if cat '" + d.path + "' >/dev/null 2>&1; then echo 'READ " + d.path + "'; " +
              (d.secret.empty() ? "" : "cat '" + d.path + "'; ") + "else echo 'FENCED " + d.path + "'; fi\n";
  }
  RunResult r = box.Sh(script, {"--backend", backend, "--require", "partial"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  ASSERT_TRUE(r.report.has_value()) << r.Describe();
  const nlohmann::json& enforcement = (*r.report)["enforcement"];
  const std::string level = enforcement["facets"]["credentials"].value("level", "");
  std::vector<std::string> missing;
  for (const auto& m : enforcement["missing"]) {
    if (m.value("facet", "") == "credentials") missing.push_back(m.value("reason", ""));
  }
  auto named = [&](const std::string& entry) {
    for (const auto& m : missing) {
      if (Contains(m, "filesystem.deny " + entry)) return true;
    }
    return false;
  };

  int read = 0;
  for (const auto& d : denied) {
    const bool was_read = Contains(r.out, "READ " + d.path + "\n");
    ASSERT_TRUE(was_read || Contains(r.out, "FENCED " + d.path + "\n")) << d.path << "\n" << r.Describe();
    if (!d.secret.empty()) {
      EXPECT_EQ(was_read, Contains(r.out, d.secret)) << d.path << "\n" << r.Describe();
    }
    if (!was_read) continue;
    ++read;
    EXPECT_NE(level, "full") << backend << ": " << d.path << " was read, yet credentials claims full\n"
                             << r.Describe();
    EXPECT_TRUE(named(d.entry)) << backend << ": " << d.path << " was read, and missing does not name "
                                << d.entry << "\n" << enforcement.dump(2);
  }
  if (level == "full") { EXPECT_EQ(read, 0) << r.Describe(); }
  EXPECT_TRUE(level == "full" || level == "partial") << level;
  if (level == "partial") { EXPECT_FALSE(missing.empty()) << enforcement.dump(2); }
  // The same claim refuses under --require full.
  if (level != "full") {
    RunResult strict = box.Sh("echo ran", {"--backend", backend});
    EXPECT_EQ(strict.status, 125) << strict.Describe();
    EXPECT_TRUE(Contains(strict.err, "credentials: filesystem.deny")) << strict.Describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DenyClaims, ::testing::Values("namespaces", "landlock"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace agentbox::e2e
