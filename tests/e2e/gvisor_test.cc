// sandbox.isolation: container — the command on gVisor's kernel (runsc),
// from the same policy and CLI, with the same report.
//
// The host fact these tests depend on is checked without agentbox: runsc
// installed and able to start a sandbox for this user (`runsc do`, with
// --rootless when not root). Where it is not, each test says "not
// applicable here" and why; the refusal test runs everywhere.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <string>

#include "harness.h"
#include "ladder_workloads.h"

namespace agentbox::e2e {
namespace {

std::string ContainerPolicy(const Sandbox& sb, const std::string& extra = "") {
  const std::string path = sb.scratch() + "/container.yaml";
  WriteFile(path, "version: 1\nmode: workspace-write\nsandbox: { isolation: container }\n" + extra);
  return path;
}

std::string HostRelease() {
  struct utsname u {};
  uname(&u);
  return u.release;
}

TEST(Gvisor, WithoutRunscTheLevelIsRefusedNeverDowngraded) {
  Sandbox sb;
  const std::string policy = ContainerPolicy(sb);
  for (const char* require : {"full", "partial"}) {
    // A PATH with no runsc on it: agentbox looks for it there.
    Command c = sb.AgentboxCommand({"run", "--policy", policy, "--require", require, "--report", sb.report_path(),
                                    "--", "/bin/true"});
    for (auto& e : c.env) {
      if (e.rfind("PATH=", 0) == 0) e = "PATH=" + sb.scratch();
    }
    unlink(sb.report_path().c_str());
    RunResult r = RunCommand(c);
    EXPECT_EQ(r.status, 125) << r.Describe();
    EXPECT_TRUE(Contains(r.err, "sandbox.isolation: container: gVisor's runsc is not installed")) << r.Describe();
    EXPECT_TRUE(Contains(r.err, "refusing rather than downgrading")) << r.Describe();
  }
}

TEST(Gvisor, CheckNamesTheLadder) {
  Sandbox sb;
  RunResult r = RunCommand(sb.AgentboxCommand({"check", "--policy", ContainerPolicy(sb), "--json"}));
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.Describe();
  const auto& c = j["host"]["ladder"]["container"];
  EXPECT_EQ(c["available"].get<bool>(), GvisorLack().empty()) << r.out;
  EXPECT_EQ(c["rootless"].get<bool>(), geteuid() != 0);
  EXPECT_TRUE(j["host"]["ladder"]["microvm"].contains("kvm")) << r.out;
  if (GvisorLack().empty()) {
    EXPECT_EQ(j["enforcement"]["backend"], "gvisor") << r.out;
    EXPECT_EQ(j["enforcement"]["runtime"].get<std::string>().rfind("runsc ", 0), 0u) << r.out;
  }
}

TEST(Gvisor, CompatWorkloadsRunOnGvisorsKernel) {
  REQUIRE_GVISOR();
  Sandbox sb;
  RunResult r = sb.Sh(CompatScript(), {"--policy", ContainerPolicy(sb)});
  ExpectCompat(sb, r);
  if (HasFatalFailure()) return;
  // Another kernel: gVisor's Sentry names its own release.
  EXPECT_TRUE(Contains(r.out, "release=")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "release=" + HostRelease() + "\n")) << r.Describe();
  const auto& e = (*r.report)["enforcement"];
  EXPECT_EQ(e["backend"], "gvisor") << e.dump();
  EXPECT_EQ(e["runtime"].get<std::string>().rfind("runsc ", 0), 0u) << e.dump();
  EXPECT_EQ(e["level"], "full") << e.dump();
  const auto& m = e["facets"]["syscalls"]["mechanisms"];
  EXPECT_NE(std::find(m.begin(), m.end(), "gvisor-sentry"), m.end()) << e.dump();
}

TEST(Gvisor, SecretsStayAbsentAndNothingOutsideTheWorkspaceIsWritten) {
  REQUIRE_GVISOR();
  Sandbox sb;
  SecretsCheck check;
  RunResult r = sb.Sh(check.Script(sb), {"--policy", ContainerPolicy(sb)});
  check.Expect(sb, r);
  if (HasFatalFailure()) return;
}

TEST(Gvisor, TimeoutOomAndAForkBombAreToldApart) {
  REQUIRE_GVISOR();
  Sandbox sb;
  const std::string policy = ContainerPolicy(sb);
  RunResult t = sb.Sh("sleep 30", {"--policy", policy, "--timeout", "1s"});
  ASSERT_TRUE(t.report) << t.Describe();
  EXPECT_EQ(OutcomeOf(t), "timed_out") << t.Describe();
  EXPECT_EQ(t.status, 124);
  EXPECT_LT(t.elapsed_ms, 10000);

  if (CgroupsExpected({"memory"})) {
    RunResult m = sb.Sh("head -c 400M /dev/zero | tail > /dev/null", {"--policy", policy, "--memory", "128Mi"});
    ASSERT_TRUE(m.report) << m.Describe();
    EXPECT_EQ(OutcomeOf(m), "oom_killed") << m.Describe();
    EXPECT_EQ(m.status, 137) << m.Describe();
  } else {
    RunResult m = sb.Sh("true", {"--policy", policy, "--memory", "128Mi"});
    EXPECT_EQ(m.status, 125) << m.Describe();
    EXPECT_TRUE(Contains(m.err, "memory_gib")) << m.Describe();
  }

  // max_processes is the Sentry's count: a fork past it fails with EAGAIN.
  RunResult f = sb.Sh(
      "python3 -c '\nimport os, time\nn = 0\ntry:\n    for i in range(500):\n        if os.fork() == 0:\n"
      "            time.sleep(3); os._exit(0)\n        n += 1\nexcept OSError as e:\n    print(\"stopped\", n, e.errno)\n'",
      {"--policy", policy, "--max-processes", "32"});
  ASSERT_TRUE(f.report) << f.Describe();
  EXPECT_TRUE(Contains(f.out, "stopped ")) << f.Describe();
  for (const auto& line : Lines(f.out)) {
    if (line.rfind("stopped ", 0) == 0) { EXPECT_LT(std::stoi(line.substr(8)), 32) << f.Describe(); }
  }
  const std::string marker = "bomb-" + RandomHex(4);
  RunResult b = sb.Sh("f() { f | f & }; f 2>/dev/null; sleep 30 # " + marker,
                      {"--policy", policy, "--max-processes", "64", "--timeout", "3s"});
  ASSERT_TRUE(b.report) << b.Describe();
  EXPECT_EQ(OutcomeOf(b), "timed_out") << b.Describe();
  EXPECT_LT(b.elapsed_ms, 20000);
}

// The bundle directories named after supervisor `pid` in /tmp ("" none).
std::string BundlesOf(pid_t pid) {
  RunResult r = RunCommand({{"/usr/bin/find", "/tmp", "-maxdepth", "1", "-name",
                             "agentbox-gvisor-" + std::to_string(pid) + "-*"}});
  return r.out;
}

TEST(Gvisor, ARunRemovesItsBundle) {
  REQUIRE_GVISOR();
  Sandbox sb;
  // Masks included (the mode-0 mask-dir, which the caller cannot read unless root).
  Process p(sb.AgentboxCommand({"run", "--policy", ContainerPolicy(sb), "--", "/bin/true"}));
  ASSERT_TRUE(p.started()) << p.start_error();
  RunResult r = p.Wait();
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(BundlesOf(p.pid()), "");
}

TEST(Gvisor, KillingTheSupervisorLeavesNoSandbox) {
  REQUIRE_GVISOR();
  Sandbox sb;
  Command c = sb.AgentboxCommand({"run", "--policy", ContainerPolicy(sb), "--", "sh", "-c", "echo up; sleep 1000"});
  Process p(c);
  ASSERT_TRUE(p.started()) << p.start_error();
  ASSERT_TRUE(p.WaitForStdout("up", 30000)) << p.err();
  const std::string bundle = "agentbox-gvisor-" + std::to_string(p.pid()) + "-";
  EXPECT_FALSE(PidsWithCmdline(bundle).empty()) << "no runsc process names the run's bundle";
  ASSERT_EQ(kill(p.pid(), SIGKILL), 0);
  p.Wait();
  EXPECT_TRUE(WaitUntilNoProcess(bundle, 15000)) << PidsWithCmdline(bundle).size() << " left";
  RunResult gc = RunCommand(sb.AgentboxCommand({"gc"}));
  EXPECT_EQ(gc.status, 0) << gc.Describe();
  EXPECT_TRUE(Contains(gc.out + gc.err, bundle)) << gc.Describe();
  EXPECT_EQ(BundlesOf(p.pid()), "") << "gc said it removed the bundle, and it is still there";
}

// agentbox itself on a kernel without pidfds (gVisor's own, here: `runsc
// do`, whose Linux emulation takes CLONE_PIDFD and answers no descriptor):
// refused at once, naming the missing pidfd, never a run that waits on no
// descriptor for ever.
TEST(Gvisor, AKernelWithoutPidfdsIsRefusedNotWaitedOn) {
  REQUIRE_GVISOR();
  Sandbox sb;
  const std::string runsc = FindTool("runsc");
  TempDir state("agentbox-e2e-runsc-");
  auto inside = [&](std::vector<std::string> args, int timeout_ms) {
    Command c;
    c.argv = {runsc, "--root=" + state.path(), "--network=none", "--ignore-cgroups"};
    if (geteuid() != 0) c.argv.push_back("--rootless");
    c.argv.insert(c.argv.end(), {"do", AgentboxBin()});
    c.argv.insert(c.argv.end(), args.begin(), args.end());
    c.env = {"PATH=/usr/bin:/bin", "HOME=" + sb.home()};
    c.cwd = sb.ws();
    c.timeout_ms = timeout_ms;
    return RunCommand(c);
  };
  RunResult check = inside({"check", "--json"}, 60000);
  auto j = nlohmann::json::parse(check.out, nullptr, false);
  ASSERT_TRUE(j.is_object() && j["host"].contains("pidfd")) << check.Describe();
  if (j["host"]["pidfd"].get<bool>()) GTEST_SKIP() << "not applicable here: this gVisor's kernel has pidfds";
  const std::string policy = sb.scratch() + "/full.yaml";
  WriteFile(policy, "version: 1\nmode: danger-full-access\n");
  RunResult r = inside({"run", "--policy", policy, "--", "/bin/echo", "ran"}, 30000);
  EXPECT_FALSE(r.timed_out) << "agentbox waited on a runner it had no pidfd for: " << r.Describe();
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "stage=clone") && Contains(r.err, "pidfd")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ran")) << "the command ran unwatched: " << r.Describe();
}

// runsc's version is asked once per binary and remembered in the user's
// cache; a record that is not one version token is ignored and rewritten.
TEST(Gvisor, RunscVersionIsRememberedPerBinary) {
  REQUIRE_GVISOR();
  Sandbox sb;
  const std::string cache_dir = sb.home() + "/.cache/agentbox";
  RunResult first = sb.RunArgv({"/bin/true"}, {"--policy", ContainerPolicy(sb)});
  ASSERT_TRUE(first.report) << first.Describe();
  const std::string runtime = (*first.report)["enforcement"]["runtime"].get<std::string>();
  RunResult found = RunCommand({{"/usr/bin/find", cache_dir, "-name", "runsc-version-*"}});
  const auto files = Lines(found.out);
  ASSERT_EQ(files.size(), 1u) << found.Describe();
  const std::string version = ReadFile(files[0]).value_or("");
  EXPECT_TRUE(Contains(runtime, "runsc " + version + " (")) << runtime << " vs " << version;
  WriteFile(files[0], "forged version\n");
  RunResult second = sb.RunArgv({"/bin/true"}, {"--policy", ContainerPolicy(sb)});
  ASSERT_TRUE(second.report) << second.Describe();
  EXPECT_EQ((*second.report)["enforcement"]["runtime"].get<std::string>(), runtime);
  EXPECT_EQ(ReadFile(files[0]).value_or(""), version);
}

// Egress, as root: the sandbox joins a network namespace of the run's whose
// loopback holds the proxy's listeners and nothing else. Without root,
// runsc --rootless cannot join it: refused, naming why.
TEST(Gvisor, EgressGoesThroughTheProxyAndADenialIsNamed) {
  REQUIRE_GVISOR();
  Sandbox sb;
  EgressCheck check(sb);
  RunResult r = sb.Sh(check.Script(), {"--policy", ContainerPolicy(sb, check.PolicyLines())});
  if (geteuid() != 0) {
    EXPECT_EQ(r.status, 125) << r.Describe();
    EXPECT_TRUE(Contains(r.err, "runsc --rootless cannot join")) << r.Describe();
    EXPECT_EQ(check.allowed.served(), 0);
    return;
  }
  check.Expect(r);
  const auto& mech = (*r.report)["enforcement"]["facets"]["network"]["mechanisms"];
  EXPECT_EQ(mech, nlohmann::json({"gvisor-hostinet-private-netns", "egress-proxy"})) << r.Describe();
  // The host sockets it has are in that namespace alone: no device of the
  // host's, and no raw socket.
  RunResult inside = sb.Sh("echo ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\\n' ,); "
                           "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)' "
                           "2>/dev/null; echo raw=$?",
                           {"--policy", ContainerPolicy(sb, check.PolicyLines())});
  EXPECT_EQ(inside.status, 0) << inside.Describe();
  EXPECT_TRUE(Contains(inside.out, "ifaces=lo,\n")) << inside.Describe();
  EXPECT_FALSE(Contains(inside.out, "raw=0")) << inside.Describe();
}

TEST(Gvisor, APolicyThatEndsTlsIsRefusedNamingWhy) {
  REQUIRE_GVISOR();
  Sandbox sb;
  RunResult r = sb.Sh("true", {"--policy", ContainerPolicy(sb, "network:\n  allow: [\"api.test\"]\n  http_rules:\n"
                                                             "    - host: api.test\n      allow: [\"GET /**\"]\n")});
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "http_rules")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "gVisor")) << r.Describe();
}

}  // namespace
}  // namespace agentbox::e2e
