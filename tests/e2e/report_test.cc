// The outcome report and the exit status (DESIGN §2, §4): the command's own
// ending is propagated, and a sandbox that fails or refuses is never mistaken
// for the command failing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <regex>
#include <string>

#include "harness.h"

namespace agentbox::e2e {
namespace {

const std::string kFixtures = FixturesDir();

// ------------------------------------------------------------ the command's ending

TEST(ExitStatus, CodeIsPropagated) {
  Sandbox sb;
  RunResult r = sb.Sh("exit 7");
  EXPECT_EQ(r.status, 7) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
  EXPECT_EQ(ReportInt(r, "exit_code"), 7) << r.Describe();
  ASSERT_TRUE(r.report);
  EXPECT_TRUE((*r.report)["signal"].is_null()) << r.Describe();
  EXPECT_TRUE((*r.report)["error"].is_null()) << r.Describe();
  EXPECT_TRUE((*r.report)["denials"].is_array() && (*r.report)["denials"].empty()) << r.Describe();
}

TEST(ExitStatus, FailureWithoutDenialIsPlainExit) {
  Sandbox sb;
  RunResult r = sb.Sh("echo 'something went wrong: No such file or directory' >&2; ls /nonexistent-e2e; exit 1");
  EXPECT_EQ(r.status, 1) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << "an ordinary failure is not a sandbox denial\n" << r.Describe();
}

TEST(ExitStatus, TermSignalIsPropagated) {
  Sandbox sb;
  RunResult r = sb.Sh("kill -TERM $$");
  EXPECT_EQ(r.status, 143) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "signaled") << r.Describe();
  EXPECT_EQ(ReportInt(r, "signal"), 15) << r.Describe();
  ASSERT_TRUE(r.report);
  EXPECT_TRUE((*r.report)["exit_code"].is_null()) << r.Describe();
}

TEST(ExitStatus, KillSignalIsNotAnOomKill) {
  Sandbox sb;
  RunResult r = sb.Sh("kill -KILL $$");
  EXPECT_EQ(r.status, 137) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "signaled") << r.Describe();
  EXPECT_EQ(ReportInt(r, "signal"), 9) << r.Describe();
}

TEST(ExitStatus, CommandNotFoundIs127WithExecStage) {
  Sandbox sb;
  RunResult r = sb.RunArgv({"agentbox-e2e-no-such-command"});
  EXPECT_EQ(r.status, 127) << r.Describe();
  EXPECT_EQ(ErrorStage(r), "exec") << r.Describe();
  EXPECT_NE(OutcomeOf(r), "sandbox_error") << r.Describe();
  EXPECT_EQ(ReportInt(r, "exit_code"), 127) << r.Describe();
}

TEST(ExitStatus, NotExecutableIs126) {
  Sandbox sb;
  WriteFile(sb.ws() + "/script.sh", "#!/bin/sh\necho should-not-run\n", 0644);
  RunResult r = sb.RunArgv({"./script.sh"});
  EXPECT_EQ(r.status, 126) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "should-not-run")) << r.Describe();
  EXPECT_EQ(ErrorStage(r), "exec") << r.Describe();
}

TEST(ExitStatus, DenialKeepsTheCommandsOwnCode) {
  Sandbox sb;
  WriteFile(sb.ws() + "/.env", "SECRET\n");
  RunResult r = sb.Sh("cat .env; exit 0");
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << "a command that succeeds anyway is not sandbox_denied\n" << r.Describe();
  EXPECT_TRUE(HasDenial(r, ".env")) << "the report still says what was denied\n" << r.Describe();
}

TEST(Report, DescribesTheEnforcement) {
  Sandbox sb;
  RunResult r = sb.Sh("true");
  ASSERT_EQ(r.status, 0) << r.Describe();
  ASSERT_TRUE(r.report) << r.Describe();
  const auto& j = *r.report;
  EXPECT_EQ(j["enforcement"]["level"], "full") << r.Describe();
  EXPECT_EQ(j["enforcement"]["backend"], "linux-namespaces") << r.Describe();
  for (const char* facet : {"filesystem", "network", "processes"}) {
    ASSERT_TRUE(j["enforcement"]["facets"].contains(facet)) << facet << "\n" << r.Describe();
    EXPECT_EQ(j["enforcement"]["facets"][facet]["level"], "full") << facet;
    EXPECT_FALSE(j["enforcement"]["facets"][facet]["mechanisms"].empty()) << facet;
  }
  EXPECT_TRUE(j["enforcement"]["missing"].is_array() && j["enforcement"]["missing"].empty()) << r.Describe();
  EXPECT_TRUE(std::regex_match(j.value("policy_sha256", ""), std::regex("[0-9a-f]{64}"))) << r.Describe();
  EXPECT_FALSE(j.value("agentbox_version", "").empty()) << r.Describe();
  ASSERT_TRUE(j["usage"].is_object()) << r.Describe();
  EXPECT_TRUE(j["usage"]["wall_ms"].is_number()) << r.Describe();
  EXPECT_LT(j["usage"]["wall_ms"].get<long>(), 30000) << r.Describe();
}

// ------------------------------------------------------------ the sandbox failing

void ExpectSandboxError(const RunResult& r, const std::string& why) {
  EXPECT_EQ(r.status, 125) << why << "\n" << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "sandbox_error") << why << "\n" << r.Describe();
  EXPECT_FALSE(ErrorStage(r).empty()) << why << ": error.stage must say where it broke\n" << r.Describe();
}

TEST(SandboxError, MissingWorkspace) {
  Sandbox sb;
  RunResult r = sb.Sh("echo ran", {"--workspace", "/nonexistent-e2e/x"});
  ExpectSandboxError(r, "a missing workspace");
  EXPECT_FALSE(Contains(r.out, "ran")) << r.Describe();
}

TEST(SandboxError, WorkspaceThatIsAFile) {
  Sandbox sb;
  WriteFile(sb.scratch() + "/file", "x");
  RunResult r = sb.Sh("echo ran", {"--workspace", sb.scratch() + "/file"});
  ExpectSandboxError(r, "a workspace that is a regular file");
  EXPECT_FALSE(Contains(r.out, "ran")) << r.Describe();
}

TEST(SandboxError, ImpossibleInsideWorkspacePath) {
  Sandbox sb;
  WriteFile(sb.scratch() + "/policy.yaml",
            "version: 1\nfilesystem:\n  workspace: { path: /proc/agentbox-e2e, mode: read-write }\n");
  RunResult r = sb.Sh("echo ran", {"--policy", sb.scratch() + "/policy.yaml"});
  ExpectSandboxError(r, "a workspace mount point that cannot exist");
  EXPECT_FALSE(Contains(r.out, "ran")) << r.Describe();
}

TEST(SandboxError, RemoteIsRefusedNotDowngraded) {
  Sandbox sb;
  WriteFile(sb.scratch() + "/policy.yaml", "version: 1\nsandbox:\n  isolation: remote\n");
  RunResult r = sb.Sh("echo ran", {"--policy", sb.scratch() + "/policy.yaml"});
  ExpectSandboxError(r, "isolation: remote");
  EXPECT_FALSE(Contains(r.out, "ran")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "remote")) << r.Describe();
}

TEST(SandboxError, UnenforceableMemoryLimitRefusedUnderRequireFull) {
  Sandbox sb;
  WriteFile(sb.scratch() + "/policy.yaml", "version: 1\nresources:\n  memory_gib: { limit: 1 }\n");
  RunResult r = sb.Sh("echo ran", {"--policy", sb.scratch() + "/policy.yaml"});
  if (r.status == 0) {
    // A version that enforces memory limits runs it, and must say so truthfully.
    EXPECT_EQ(EnforcementLevel(r), "full") << r.Describe();
    ASSERT_TRUE(r.report);
    EXPECT_EQ((*r.report)["enforcement"]["facets"]["resources"]["level"], "full") << r.Describe();
    return;
  }
  ExpectSandboxError(r, "memory_gib without cgroup enforcement");
  EXPECT_FALSE(Contains(r.out, "ran")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "memory_gib")) << r.Describe();
}

TEST(SandboxError, RequirePartialRunsAndSaysWhatIsMissing) {
  Sandbox sb;
  WriteFile(sb.scratch() + "/policy.yaml", "version: 1\nresources:\n  memory_gib: { limit: 1 }\n");
  RunResult r = sb.Sh("echo ran", {"--policy", sb.scratch() + "/policy.yaml", "--require", "partial"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(r.out, "ran\n");
  ASSERT_TRUE(r.report) << r.Describe();
  const auto& e = (*r.report)["enforcement"];
  bool resources_missing = false;
  for (const auto& m : e["missing"]) resources_missing |= m.value("facet", "") == "resources";
  // The host fact, checked without agentbox: a child cgroup with the memory controller.
  if (CgroupsExpected({"memory"})) {
    EXPECT_EQ(e["level"], "full") << "this host delegates the memory controller\n" << r.Describe();
    EXPECT_EQ(e["facets"]["resources"]["level"], "full") << r.Describe();
    EXPECT_FALSE(resources_missing) << r.Describe();
  } else {
    EXPECT_EQ(e["level"], "partial") << "this host gives no memory cgroup\n" << r.Describe();
    EXPECT_TRUE(resources_missing) << r.Describe();
    EXPECT_NE(e["facets"]["resources"]["level"], "full") << r.Describe();
  }
}

TEST(SandboxError, MemoryFlagIsEnforcedOrRefused) {
  Sandbox sb;
  RunResult r = sb.Sh("echo ran", {"--memory", "256Mi"});
  if (!CgroupsExpected({"memory"})) {
    EXPECT_EQ(r.status, 125) << "this host gives no memory cgroup: the limit must be refused\n" << r.Describe();
    EXPECT_EQ(OutcomeOf(r), "sandbox_error") << r.Describe();
    EXPECT_FALSE(Contains(r.out, "ran")) << r.Describe();
  } else {
    EXPECT_EQ(r.status, 0) << "this host delegates the memory controller\n" << r.Describe();
    EXPECT_EQ(EnforcementLevel(r), "full") << "it ran, so the memory limit must be in force\n" << r.Describe();
    ASSERT_TRUE(r.report) << r.Describe();
    EXPECT_EQ((*r.report)["usage"]["limits"]["memory_max_bytes"], 256ull << 20) << r.Describe();
  }
}

// Limits and network rules this version cannot enforce are refused under the
// default --require full, never silently dropped.
TEST(SandboxError, UnenforceableFlagsAreRefusedNotIgnored) {
  Sandbox sb;
  struct Case {
    std::vector<std::string> flags;
    bool enforceable;  // the host fact, checked without agentbox
  };
  // The egress proxy runs in the supervisor on any host the namespaces work on.
  for (const Case& c : {Case{{"--max-processes", "10"}, CgroupsExpected({"pids"}) || NprocCapsUserNamespace()},
                        Case{{"--cpus", "1"}, CgroupsExpected({"cpu"})},
                        Case{{"--allow-domain", "github.com", "--quiet"}, true}}) {
    const std::string& flag = c.flags[0];
    RunResult r = sb.Sh("echo ran", c.flags);
    if (c.enforceable) {
      EXPECT_EQ(r.status, 0) << flag << ": this host can enforce it\n" << r.Describe();
      EXPECT_EQ(EnforcementLevel(r), "full") << flag << " ran, so it must be enforced\n" << r.Describe();
      continue;
    }
    EXPECT_EQ(r.status, 125) << flag << ": this host cannot enforce it\n" << r.Describe();
    EXPECT_EQ(OutcomeOf(r), "sandbox_error") << flag << "\n" << r.Describe();
    EXPECT_FALSE(Contains(r.out, "ran")) << flag << "\n" << r.Describe();
  }
}

TEST(SandboxError, SeedPolicyIsRefused) {
  Sandbox sb;
  RunResult r = sb.Sh("echo ran", {"--policy", kFixtures + "/seed_policy.yaml"});
  ExpectSandboxError(r, "the seed's illustrative policy (microvm, image, proxies)");
  EXPECT_FALSE(Contains(r.out, "ran")) << r.Describe();
}

TEST(SandboxError, InvalidPolicyFileIsASandboxError) {
  Sandbox sb;
  WriteFile(sb.scratch() + "/policy.yaml", "version: 1\nfilesystem:\n  not_a_key: true\n");
  RunResult r = sb.Sh("echo ran", {"--policy", sb.scratch() + "/policy.yaml"});
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ran")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "policy.yaml:3:")) << "the error names file:line\n" << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "sandbox_error") << r.Describe();
}

// ------------------------------------------------------------ danger-full-access

TEST(DangerFullAccess, RunsUnconfinedAndSaysSo) {
  Sandbox sb;
  RunResult r = sb.Sh("cat \"$HOME/.ssh/id_rsa\"; test -d /proc/" + std::to_string(getpid()) +
                          " && echo host-pid-visible; echo \"token=$SECRET_TOKEN\"",
                      {"--mode", "danger-full-access"}, {"SECRET_TOKEN=passed-through"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, sb.ssh_secret())) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "host-pid-visible")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "token=passed-through")) << r.Describe();
  EXPECT_EQ(EnforcementLevel(r), "none") << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
}

}  // namespace
}  // namespace agentbox::e2e
