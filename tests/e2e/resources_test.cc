// Resources: limits from cgroups and rlimits, oom_killed and timed_out told
// apart from ordinary exits, usage in the report, and nothing left behind.
//
// What a run gets depends on who runs it: with a writable cgroup (root here)
// limits are enforced; without one (an unprivileged user with no delegation)
// the resources facet is partial, `--require full` refuses, and `--require
// partial` runs with rlimits only. Each test asserts the behaviour expected
// for the privilege it runs with; none skips.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>

#include "harness.h"

namespace agentbox::e2e {
namespace {

const nlohmann::json& Usage(const RunResult& r) { return (*r.report)["usage"]; }
const nlohmann::json& ResourcesFacet(const RunResult& r) {
  return (*r.report)["enforcement"]["facets"]["resources"];
}
// The supervisor pid a run cgroup's owner tag names ("" when untagged):
// user.agentbox.owner = <pidns>-<pid>-<starttime>.
std::string OwnerPid(const std::string& dir) {
  char buf[256];
  ssize_t n = getxattr(dir.c_str(), "user.agentbox.owner", buf, sizeof(buf));
  if (n <= 0) return "";
  std::string tag(buf, static_cast<size_t>(n));
  auto a = tag.find('-'), b = tag.rfind('-');
  return a == std::string::npos || b <= a ? "" : tag.substr(a + 1, b - a - 1);
}

// Run cgroups (agentbox-*) anywhere under /sys/fs/cgroup owned by `pid`.
std::vector<std::string> RunCgroupsOf(pid_t pid) {
  RunResult r = RunCommand({{"/usr/bin/find", "/sys/fs/cgroup", "-maxdepth", "8", "-type", "d", "-name",
                             "agentbox-*"}});
  std::vector<std::string> out;
  for (const auto& dir : Lines(r.out)) {
    if (OwnerPid(dir) == std::to_string(pid)) out.push_back(dir);
  }
  return out;
}

// A memory hog with no interpreter: tail keeps a line with no newline whole.
constexpr const char* kMemoryHog = "head -c 400M /dev/zero | tail > /dev/null";

// Unprivileged: the limit is refused under full, reported missing under partial.
void ExpectRefusedThenPartial(const Sandbox& sb, const std::string& script, const std::vector<std::string>& opts,
                              const std::string& missing_key) {
  RunResult refused = sb.Sh(script, opts);
  EXPECT_EQ(refused.status, 125) << refused.Describe();
  ASSERT_TRUE(refused.report) << refused.Describe();
  EXPECT_EQ(OutcomeOf(refused), "sandbox_error");
  EXPECT_EQ(ErrorStage(refused), "confine");
  EXPECT_TRUE(Contains(refused.err, missing_key)) << refused.Describe();

  std::vector<std::string> partial = opts;
  partial.insert(partial.begin(), {"--require", "partial"});
  RunResult r = sb.Sh("echo ran", partial);
  EXPECT_EQ(r.status, 0) << r.Describe();
  ASSERT_TRUE(r.report) << r.Describe();
  EXPECT_EQ(EnforcementLevel(r), "partial");
  EXPECT_EQ(ResourcesFacet(r)["level"], "partial");
  EXPECT_TRUE(Contains(MissingText(r), missing_key)) << MissingText(r);
  EXPECT_TRUE(Usage(r)["limits"]["cgroup"].is_null()) << r.Describe();
  EXPECT_EQ(Usage(r)["limits"]["core_dumps"], false);
}

// No pids cgroup, but RLIMIT_NPROC in the sandbox's own user namespace (a
// host fact checked without agentbox): the run is not refused, the limit is
// named as in force, and a fork past it fails with EAGAIN. The forks are
// counted by the command itself (python: dash exits at its first failed fork).
void ExpectCappedByNproc(const Sandbox& sb) {
  const std::string marker = "nproc-" + RandomHex(4);
  const std::string script =
      "import os, errno, sys, time\n"
      "made, err = 0, 0\n"
      "for i in range(200):\n"
      "    try:\n"
      "        pid = os.fork()\n"
      "    except OSError as e:\n"
      "        err = e.errno\n"
      "        break\n"
      "    if pid == 0:\n"
      "        time.sleep(300)\n"
      "        os._exit(0)\n"
      "    made += 1\n"
      "print('made=%d err=%s' % (made, errno.errorcode.get(err, err)), flush=True)\n"
      "# " + marker + "\n";
  RunResult r = sb.RunArgv({"python3", "-c", script}, {"--max-processes", "32", "--timeout", "60s"}, {}, 120000);
  ASSERT_TRUE(r.report) << r.Describe();
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << "the run ended with the command, not at its deadline\n" << r.Describe();
  EXPECT_TRUE(Contains(r.out, "err=EAGAIN")) << r.Describe();
  // 32 tasks in all: python, the runner and its threads count too.
  int made = -1;
  if (auto at = r.out.find("made="); at != std::string::npos) made = std::atoi(r.out.c_str() + at + 5);
  EXPECT_GE(made, 20) << r.Describe();
  EXPECT_LT(made, 32) << r.Describe();
  EXPECT_TRUE(WaitUntilNoProcess(marker, 30000)) << "the forked children outlived the run";
  const auto& u = Usage(r);
  EXPECT_EQ(u["limits"]["nproc"], 32) << r.Describe();
  EXPECT_FALSE(u["limits"].contains("pids_max")) << r.Describe();
  EXPECT_EQ(ResourcesFacet(r)["level"], "full") << r.Describe();
  const auto& mech = ResourcesFacet(r)["mechanisms"];
  EXPECT_NE(std::find(mech.begin(), mech.end(), "rlimit-nproc-userns"), mech.end()) << r.Describe();
  EXPECT_EQ(EnforcementLevel(r), "full") << r.Describe();
}

// ------------------------------------------------------------------ memory

TEST(Memory, BombIsOomKilledWithPeakNearTheLimit) {
  Sandbox sb;
  if (!CgroupsExpected({"memory"})) {
    ExpectRefusedThenPartial(sb, kMemoryHog, {"--memory", "64Mi"}, "memory_gib");
    return;
  }
  RunResult r = sb.Sh(kMemoryHog, {"--memory", "64Mi"});
  EXPECT_EQ(r.status, 137) << r.Describe();
  ASSERT_TRUE(r.report) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "oom_killed") << r.Describe();
  EXPECT_EQ(ErrorStage(r), "oom");
  // One line on stderr says so, as for a timeout.
  std::size_t lines = 0;
  for (const auto& line : Lines(r.err)) lines += line.rfind("agentbox: oom_killed at the memory limit of 64 MiB", 0) == 0;
  EXPECT_EQ(lines, 1u) << r.Describe();
  const auto& u = Usage(r);
  EXPECT_GE(u["oom_kills"].get<int>(), 1);
  ASSERT_TRUE(u["peak_memory_bytes"].is_number()) << r.Describe();
  auto peak = u["peak_memory_bytes"].get<std::uint64_t>();
  EXPECT_GE(peak, 48ull << 20) << r.Describe();
  EXPECT_LE(peak, 64ull << 20) << r.Describe();
  EXPECT_EQ(u["limits"]["memory_max_bytes"], 64ull << 20);
  EXPECT_EQ(u["source"], "cgroup");
  EXPECT_EQ(ResourcesFacet(r)["level"], "full");
  EXPECT_EQ(EnforcementLevel(r), "full");
  // The host is fine: the next run works.
  RunResult next = sb.Sh("echo alive");
  EXPECT_EQ(next.status, 0) << next.Describe();
}

TEST(Memory, OomInsidePipelineReportedThoughTopExitsZero) {
  Sandbox sb;
  const std::string script = std::string("bash -c '") + kMemoryHog + "; exit 0'";
  if (!CgroupsExpected({"memory"})) {
    ExpectRefusedThenPartial(sb, script, {"--memory", "64Mi"}, "memory_gib");
    return;
  }
  RunResult r = sb.Sh(script, {"--memory", "64Mi"});
  EXPECT_EQ(r.status, 137) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "oom_killed") << r.Describe();
  EXPECT_EQ(ReportInt(r, "exit_code"), 0) << r.Describe();  // the command's own code is kept
}

// The OOM kill is a denial of facet resources; under
// on_violation.escalation: one_time_approval it carries the offer of twice
// the limit, in whole GiB, within max_grant.memory_gib.
TEST(Memory, OomKillIsAMemoryDenialWithItsEscalationOffer) {
  Sandbox sb;
  if (!CgroupsExpected({"memory"})) GTEST_SKIP() << "not applicable here: no memory cgroup this user may limit";
  const std::string policy = sb.scratch() + "/policy.yaml";
  WriteFile(policy, "version: 1\nresources:\n  memory_gib: 64Mi\non_violation:\n  escalation: one_time_approval\n"
                    "  max_grant:\n    memory_gib: 1\n");
  RunResult r = sb.Sh(kMemoryHog, {"--policy", policy});
  EXPECT_EQ(r.status, 137) << r.Describe();
  ASSERT_TRUE(r.report) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "oom_killed") << r.Describe();
  const nlohmann::json* memory = nullptr;
  for (const auto& d : (*r.report)["denials"]) {
    if (d["facet"] == "resources" && d["op"] == "memory") memory = &d;
  }
  ASSERT_NE(memory, nullptr) << r.Describe();
  EXPECT_EQ((*memory)["source"], "cgroup") << r.Describe();
  ASSERT_TRUE(memory->contains("escalation")) << r.Describe();
  EXPECT_EQ((*memory)["escalation"]["grant"], nlohmann::json({{"resources.memory_gib", 1}})) << r.Describe();
  EXPECT_EQ((*memory)["escalation"]["within_ceiling"], true) << r.Describe();
}

TEST(Memory, GuaranteedAboveLimitIsRejected) {
  Sandbox sb;
  WriteFile(sb.scratch() + "/p.yaml",
            "version: 1\nresources:\n  memory_gib: { guaranteed: 2, limit: 1 }\n");
  RunResult r = sb.Sh("true", {"--policy", sb.scratch() + "/p.yaml"});
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "guaranteed")) << r.Describe();
}

// --------------------------------------------------------------- processes

TEST(Processes, ForkBombIsCappedAndTheRunEndsCleanly) {
  Sandbox sb;
  // Bounded on purpose: without the cap (no cgroup) it would still end.
  // The sleepers would outlive the command by far: the run must end with
  // the command, and take them along.
  const std::string marker = "300." + std::to_string(100000 + std::stoul(RandomHex(2), nullptr, 16));
  const std::string script = "i=0; while [ $i -lt 200 ]; do sleep " + marker +
                             " & i=$((i+1)); done 2>/dev/null; echo spawned; exit 0";
  std::optional<bool> keeps_peak;
  if (!CgroupControllerDelegated("pids", "pids.peak", &keeps_peak)) {
    if (NprocCapsUserNamespace()) {
      ExpectCappedByNproc(sb);
    } else {
      ExpectRefusedThenPartial(sb, script, {"--max-processes", "32"}, "max_processes");
    }
    return;
  }
  RunResult r = sb.Sh(script, {"--max-processes", "32", "--timeout", "120s"}, {}, 180000);
  ASSERT_TRUE(r.report) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << "the run ended with the command, not at its deadline\n" << r.Describe();
  EXPECT_LT(r.elapsed_ms, 100000) << "the run waited for the sleepers\n" << r.Describe();
  EXPECT_TRUE(WaitUntilNoProcess("sleep " + marker, 30000)) << "the sleepers outlived the run";
  const auto& u = Usage(r);
  EXPECT_EQ(u["limits"]["pids_max"], 32);
  // pids.peak is kept by newer kernels only (checked above, without agentbox).
  if (keeps_peak.value_or(false)) {
    ASSERT_TRUE(u["peak_processes"].is_number()) << "this kernel keeps pids.peak\n" << r.Describe();
    EXPECT_LE(u["peak_processes"].get<int>(), 32) << r.Describe();
    EXPECT_GE(u["peak_processes"].get<int>(), 20) << r.Describe();
  } else if (keeps_peak.has_value()) {
    EXPECT_TRUE(u["peak_processes"].is_null()) << "this kernel keeps no pids.peak\n" << r.Describe();
  } else if (u["peak_processes"].is_number()) {
    // The v2 root, where only enabling the controller would tell: the bound still holds.
    EXPECT_LE(u["peak_processes"].get<int>(), 32) << r.Describe();
  }
}

TEST(Processes, RealForkBombEndsAtTheDeadline) {
  Sandbox sb;
  if (!CgroupsExpected({"pids"}) && !NprocCapsUserNamespace()) {
    // Never run an uncapped fork bomb: only the refusal is asserted here.
    RunResult refused = sb.Sh("true", {"--max-processes", "64"});
    EXPECT_EQ(refused.status, 125) << refused.Describe();
    return;
  }
  const std::string marker = "forkbomb-" + RandomHex(4);
  RunResult r = sb.Sh("f() { f | f & }; f 2>/dev/null; sleep 30 # " + marker,
                      {"--max-processes", "64", "--timeout", "2s"}, {}, 30000);
  ASSERT_TRUE(r.report) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "timed_out") << r.Describe();
  EXPECT_EQ(r.status, 124);
  EXPECT_TRUE(WaitUntilNoProcess(marker, 30000));
}

// --------------------------------------------------------------------- cpu

TEST(Cpu, HalfACoreLimitUsesAboutHalfACore) {
  Sandbox sb;
  if (!CgroupsExpected({"cpu"})) {
    ExpectRefusedThenPartial(sb, "true", {"--cpus", "0.5"}, "cpu");
    return;
  }
  RunResult r = sb.Sh("while :; do :; done", {"--cpus", "0.5", "--timeout", "3s"});
  ASSERT_TRUE(r.report) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "timed_out") << r.Describe();
  const auto& u = Usage(r);
  EXPECT_EQ(u["source"], "cgroup");
  double cpu = u["cpu_user_ms"].get<double>() + u["cpu_sys_ms"].get<double>();
  double share = cpu / u["wall_ms"].get<double>();
  // The limit promises a ceiling; a loaded host may give the loop less.
  EXPECT_GT(cpu, 0) << r.Describe();
  EXPECT_LT(share, 0.7) << r.Describe();
  EXPECT_EQ(u["limits"]["cpu_max_cores"], 0.5);
}

// ---------------------------------------------------------------- deadline

void ExpectDeadlineKillsSleeperAndStoppedChild(const std::vector<std::string>& extra) {
  Sandbox sb;
  const std::string marker = "deadline-" + RandomHex(4);
  std::vector<std::string> opts = {"--timeout", "1s"};
  opts.insert(opts.end(), extra.begin(), extra.end());
  // A stopped process cannot act on SIGTERM; it must die all the same.
  RunResult r = sb.Sh("sh -c 'kill -STOP $$; sleep 1000 # " + marker + "' & sleep 1000 # " + marker, opts);
  EXPECT_EQ(r.status, 124) << r.Describe();
  ASSERT_TRUE(r.report) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "timed_out");
  EXPECT_LT(r.elapsed_ms, 60000) << "never killed (sleep 1000)\n" << r.Describe();
  EXPECT_TRUE(WaitUntilNoProcess(marker, 30000)) << "a sandbox process survived the deadline";
}

TEST(Deadline, SleeperAndStoppedChildDieWithoutCgroup) { ExpectDeadlineKillsSleeperAndStoppedChild({}); }

TEST(Deadline, SleeperAndStoppedChildDieWithCgroup) {
  if (!CgroupsExpected({"memory"})) {
    ExpectDeadlineKillsSleeperAndStoppedChild({"--require", "partial", "--memory", "256Mi"});
    return;
  }
  ExpectDeadlineKillsSleeperAndStoppedChild({"--memory", "256Mi"});
}

TEST(Deadline, TimeoutInsidePipelineReportedThoughTopExitsZero) {
  Sandbox sb;
  RunResult r = sb.Sh("bash -c 'sleep 100 | cat; exit 0'", {"--timeout", "1s"});
  EXPECT_EQ(r.status, 124) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "timed_out") << r.Describe();
}

// -------------------------------------------------------------------- disk

// The workspace itself is bounded only by a project quota or an overlay
// (workspace_disk_test.cc): without either, disk_gib is partial.
TEST(Disk, TmpFillStopsAtDiskGib) {
  Sandbox sb;
  WriteFile(sb.scratch() + "/p.yaml",
            "version: 1\nmode: workspace-write\nsandbox:\n  require: partial\nresources:\n  disk_gib: 16Mi\n");
  RunResult r = sb.Sh("dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>/dev/null; "
                      "echo size=$(wc -c < /tmp/fill); echo fsize=$(ulimit -f); ulimit -c; exit 0",
                      {"--policy", sb.scratch() + "/p.yaml"});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "size=16777216\n")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "fsize=32768\n")) << r.Describe();  // 512-byte blocks
  EXPECT_TRUE(Contains(r.out, "\n0\n")) << "core dumps are on\n" << r.Describe();
  ASSERT_TRUE(r.report);
  EXPECT_EQ(Usage(r)["limits"]["fsize_bytes"], 16ull << 20);
  EXPECT_TRUE(Contains(ResourcesFacet(r)["notes"].dump(), "/tmp, HOME and /dev/shm are each a tmpfs")) << r.Describe();
  EXPECT_TRUE(Contains(MissingText(r), "disk_gib: the workspace " + sb.ws())) << MissingText(r);
}

// ------------------------------------------------------------------- usage

// The rlimits a report names are the ones a command reads inside, also when
// agentbox starts under a hard NOFILE limit below the plan's 65536.
TEST(Usage, RlimitsInTheReportAreTheOnesReadInside) {
  Sandbox sb;
  WriteFile(sb.scratch() + "/p.yaml", "version: 1\nsandbox:\n  require: partial\nresources:\n  disk_gib: 16Mi\n");
  Command c = sb.AgentboxCommand({"run", "--report", sb.report_path(), "--policy", sb.scratch() + "/p.yaml", "--",
                                  "sh", "-c", "echo nofile=$(ulimit -n) core=$(ulimit -c) fsize=$(ulimit -f)"});
  // sh's `ulimit -n` sets the soft and the hard limit alike.
  c.argv.insert(c.argv.begin(), {"/bin/sh", "-c", "ulimit -n 4096 && exec \"$@\"", "sh"});
  RunResult r = RunCommand(c);
  ASSERT_EQ(r.status, 0) << r.Describe();
  auto report = ReadFile(sb.report_path());
  ASSERT_TRUE(report) << r.Describe();
  const nlohmann::json l = nlohmann::json::parse(*report)["usage"]["limits"];
  EXPECT_TRUE(Contains(r.out, "nofile=4096 ")) << r.Describe();
  EXPECT_EQ(l["nofile"], 4096) << l.dump();
  EXPECT_TRUE(Contains(r.out, "core=0 ")) << r.Describe();
  EXPECT_EQ(l["core_dumps"], false) << l.dump();
  EXPECT_TRUE(Contains(r.out, "fsize=32768\n")) << r.Describe();  // 512-byte blocks
  EXPECT_EQ(l["fsize_bytes"], 16ull << 20) << l.dump();
}

TEST(Usage, LimitsInForceAreReportedAndNoCgroupRemains) {
  Sandbox sb;
  if (!CgroupsExpected({"memory", "pids"})) {
    ExpectRefusedThenPartial(sb, "true", {"--memory", "512Mi", "--max-processes", "64"}, "memory_gib");
    return;
  }
  RunResult r = sb.Sh("echo ok", {"--memory", "512Mi", "--max-processes", "64", "--timeout", "30s"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  const auto& l = Usage(r)["limits"];
  EXPECT_TRUE(l["cgroup"].is_string()) << r.Describe();
  EXPECT_EQ(l["memory_max_bytes"], 512ull << 20);
  EXPECT_EQ(l["pids_max"], 64);
  EXPECT_EQ(l["wall_clock_ms"], 30000);
  EXPECT_EQ(l["core_dumps"], false);
  EXPECT_TRUE(Usage(r)["peak_memory_bytes"].is_number());
  RunResult left = RunCommand({{"/usr/bin/find", "/sys/fs/cgroup", "-maxdepth", "8", "-type", "d", "-name",
                                "agentbox-*"}});
  // Other suites may run in parallel: only cgroups of dead supervisors would be ours to blame.
  for (const auto& dir : Lines(left.out)) {
    const std::string pid = OwnerPid(dir);
    if (pid.empty()) continue;  // another version's (its owner in its name), or still being set up
    EXPECT_EQ(access(("/proc/" + pid).c_str(), F_OK), 0) << "stale cgroup " << dir;
  }
}

TEST(Usage, NoCgroupWithoutCgroupLimits) {
  Sandbox sb;
  RunResult r = sb.Sh("cat /proc/self/cgroup", {"--timeout", "30s"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Usage(r)["limits"]["cgroup"].is_null()) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "agentbox-")) << r.Describe();
}

// ---------------------------------------------------- supervisor SIGKILLed

TEST(Cleanup, KilledSupervisorLeavesNoProcessAndGcRemovesItsCgroup) {
  Sandbox sb;
  const std::string marker = "orphan-" + RandomHex(4);
  std::vector<std::string> args = {"run"};
  const bool cgroups = CgroupsExpected({"memory", "pids"});
  if (cgroups) {
    args.insert(args.end(), {"--memory", "128Mi", "--max-processes", "32"});
  }
  args.insert(args.end(), {"--", "sh", "-c", "sleep 1000 & echo ready; sleep 1000 # " + marker});
  std::string mounts_before = ReadFile("/proc/self/mountinfo").value_or("");
  Process p(sb.AgentboxCommand(args));
  ASSERT_TRUE(p.started());
  ASSERT_TRUE(p.WaitForStdout("ready", 10000)) << p.err();
  const pid_t supervisor = p.pid();
  if (cgroups) {
    EXPECT_FALSE(RunCgroupsOf(supervisor).empty()) << "the run has no cgroup";
  }
  ASSERT_EQ(kill(supervisor, SIGKILL), 0);
  RunResult killed = p.Wait();
  EXPECT_EQ(killed.status, 128 + SIGKILL);
  EXPECT_TRUE(WaitUntilNoProcess(marker, 30000)) << "a sandbox process outlived its supervisor";
  EXPECT_EQ(ReadFile("/proc/self/mountinfo").value_or(""), mounts_before);
  if (cgroups) {
    RunResult gc = RunCommand(sb.AgentboxCommand({"gc"}));
    EXPECT_EQ(gc.status, 0) << gc.Describe();
    EXPECT_TRUE(RunCgroupsOf(supervisor).empty()) << gc.Describe();
  } else {
    RunResult gc = RunCommand(sb.AgentboxCommand({"gc"}));
    EXPECT_EQ(gc.status, 0) << gc.Describe();
    EXPECT_TRUE(gc.out.empty()) << gc.Describe();
  }
}

}  // namespace
}  // namespace agentbox::e2e
