// Processes, network, environment and lifetime: what the command can see of
// the host (its pids, interfaces, fds, variables), and that nothing it starts
// outlives the run.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>

#include "harness.h"
#include "linux/fd.h"

namespace agentbox::e2e {
namespace {

using Fd = agentbox::linux::UniqueFd;

// ------------------------------------------------------------ pid namespace

TEST(Pid, RunnerIsPidOneAndHostPidsAreInvisible) {
  Sandbox sb;
  RunResult r = sb.Sh("cat /proc/1/comm; echo \"self=$$\"; echo \"pids=$(ls /proc | grep -cE '^[0-9]+$')\";"
                      "test -d /proc/" + std::to_string(getpid()) + " && echo test-pid-visible; exit 0");
  ASSERT_EQ(r.status, 0) << r.Describe();
  auto lines = Lines(r.out);
  ASSERT_GE(lines.size(), 3u) << r.Describe();
  EXPECT_EQ(lines[0], "agentbox-init");
  int self = std::stoi(lines[1].substr(5));
  EXPECT_GE(self, 2);
  EXPECT_LE(self, 5) << r.Describe();
  int pids = std::stoi(lines[2].substr(5));
  EXPECT_LT(pids, 10) << "host processes are visible\n" << r.Describe();
  EXPECT_FALSE(Contains(r.out, "test-pid-visible")) << r.Describe();
}

TEST(Pid, KillingPidOneFromInsideIsHarmless) {
  Sandbox sb;
  RunResult r = sb.Sh("kill -KILL 1; kill -STOP 1; sleep 0.1; kill -KILL 1; echo still-here");
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "still-here\n")) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
  EXPECT_EQ(ReportInt(r, "exit_code"), 0) << r.Describe();
}

TEST(Pid, RunnerMemoryAndFdsAreOffLimits) {
  Sandbox sb;
  RunResult r = sb.Sh("cat /proc/1/environ >/dev/null 2>&1 && echo environ-readable;"
                      "head -c 1 /proc/1/mem >/dev/null 2>&1 && echo mem-readable;"
                      "echo \"links=$(readlink /proc/1/fd/* 2>/dev/null | wc -l)\"; exit 0",
                      {}, {"RUNNER_SECRET=runner-secret-value"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "environ-readable")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "mem-readable")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "links=0\n")) << r.Describe();
  EXPECT_FALSE(Contains(r.out + r.err, "runner-secret-value")) << r.Describe();
}

TEST(Privileges, NoCapabilitiesAndNoNewPrivs) {
  Sandbox sb;
  RunResult r = sb.Sh("grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status; echo \"uid=$(id -u) gid=$(id -g)\";"
                      "mount -t tmpfs none /tmp 2>/dev/null && echo mount-ok; exit 0");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "CapEff:\t0000000000000000")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "CapPrm:\t0000000000000000")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "CapAmb:\t0000000000000000")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "NoNewPrivs:\t1")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "uid=" + std::to_string(getuid()) + " gid=" + std::to_string(getgid())))
      << "ids are mapped to themselves\n" << r.Describe();
  EXPECT_FALSE(Contains(r.out, "mount-ok")) << r.Describe();
}

// ------------------------------------------------------------ network

TEST(Network, OnlyLoopbackExists) {
  Sandbox sb;
  RunResult r = sb.Sh("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(r.out, "lo\n") << r.Describe();
}

TEST(Network, HostLoopbackListenerIsUnreachable) {
  ASSERT_TRUE(HavePython()) << "python3 is missing (scripts/install-deps.sh installs it)";
  Fd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_GE(listener.get(), 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener.get(), 8), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);

  // Control: the host listener does accept connections from the host.
  {
    Fd probe(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_EQ(connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  Sandbox sb;
  RunResult r = sb.RunArgv({"python3", "-c",
                            "import socket\n"
                            "s = socket.socket()\n"
                            "s.settimeout(3)\n"
                            "try:\n"
                            "    s.connect(('127.0.0.1', " + std::to_string(port) + "))\n"
                            "    print('connected')\n"
                            "except OSError as e:\n"
                            "    print('refused', e.errno)\n"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "refused")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "connected")) << r.Describe();
}

TEST(Network, LoopbackInsideTheSandboxWorks) {
  ASSERT_TRUE(HavePython()) << "python3 is missing (scripts/install-deps.sh installs it)";
  Sandbox sb;
  RunResult r = sb.RunArgv({"python3", "-c",
                            "import socket\n"
                            "srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(1)\n"
                            "c = socket.create_connection(srv.getsockname(), timeout=3)\n"
                            "conn, _ = srv.accept(); conn.sendall(b'inside-loopback-ok'); conn.close()\n"
                            "print(c.recv(64).decode())\n"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(r.out, "inside-loopback-ok\n") << r.Describe();
}

TEST(Network, NoRouteToTheOutside) {
  ASSERT_TRUE(HavePython()) << "python3 is missing (scripts/install-deps.sh installs it)";
  Sandbox sb;
  // 192.0.2.1 (TEST-NET-1): the connect() broker refuses it (nothing is
  // allowed), so nothing is dialled from the host either.
  RunResult r = sb.RunArgv({"python3", "-c",
                            "import socket\n"
                            "s = socket.socket(); s.settimeout(2)\n"
                            "try:\n"
                            "    s.connect(('192.0.2.1', 80)); print('connected')\n"
                            "except OSError as e:\n"
                            "    print('failed', e.errno)\n"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "failed 111")) << "expected ECONNREFUSED\n" << r.Describe();
  ASSERT_TRUE(r.report);
  bool denied = false;
  for (const auto& d : (*r.report)["denials"]) {
    denied = denied || (d["facet"] == "network" && d["op"] == "connect" && d["target"] == "192.0.2.1:80");
  }
  EXPECT_TRUE(denied) << r.Describe();
}

// ------------------------------------------------------------ fds

TEST(Fds, InheritedDescriptorsAreClosed) {
  Sandbox sb;
  const std::string secret_path = sb.scratch() + "/leaky-secret.txt";
  WriteFile(secret_path, "FD-SECRET-" + RandomHex() + "\n");
  // Deliberately inheritable (no O_CLOEXEC), at fds a careless runner keeps.
  int file = open(secret_path.c_str(), O_RDONLY);
  ASSERT_GE(file, 0);
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  Fd f(file), p0(pipefd[0]), p1(pipefd[1]);
  Fd high(dup2(file, 57));
  ASSERT_EQ(high.get(), 57);
  ASSERT_EQ(fcntl(file, F_GETFD) & FD_CLOEXEC, 0);

  RunResult r = sb.Sh("ls /proc/self/fd; echo ---; for f in /proc/$$/fd/*; do readlink \"$f\"; done;"
                      "cat <&57 2>/dev/null && echo read-57");
  ASSERT_NE(r.status, 125) << r.Describe();
  auto listing = r.out.substr(0, r.out.find("---"));
  std::set<std::string> fds;
  for (const auto& l : Lines(listing)) fds.insert(l);
  // 0-2, plus the directory ls itself has open.
  EXPECT_EQ(fds, (std::set<std::string>{"0", "1", "2", "3"})) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "leaky-secret")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "FD-SECRET")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "read-57")) << r.Describe();
}

// With a terminal on stdin, TIOCSTI could push keystrokes into the user's
// shell once the command ends. The command has no controlling terminal.
TEST(Fds, TerminalInputCannotBeInjected) {
  ASSERT_TRUE(HavePython()) << "python3 is missing (scripts/install-deps.sh installs it)";
  int master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) GTEST_SKIP() << "not applicable here: this host gives no pseudo-terminal (posix_openpt failed)";
  Fd m(master);
  ASSERT_EQ(grantpt(master), 0);
  ASSERT_EQ(unlockpt(master), 0);
  Fd slave(open(ptsname(master), O_RDWR | O_NOCTTY | O_CLOEXEC));
  ASSERT_GE(slave.get(), 0);
  Sandbox sb;
  Command c = sb.AgentboxCommand(
      {"run", "--", "python3", "-c",
       "import fcntl, termios, sys\n"
       "try:\n"
       "    fcntl.ioctl(0, termios.TIOCSTI, b'#')\n"
       "    print('injected')\n"
       "except OSError as e:\n"
       "    print('refused', e.errno)\n"});
  c.stdin_fd = slave.get();
  RunResult r = RunCommand(c);
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "refused")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "injected")) << r.Describe();
}

// ------------------------------------------------------------ environment

TEST(Env, ScrubbedToAnAllowlist) {
  Sandbox sb;
  RunResult r =
      sb.RunArgv({"env"}, {},
                 {"SECRET_TOKEN=xyz-secret-token", "AWS_SECRET_ACCESS_KEY=abc-aws-key", "GITHUB_TOKEN=ghp-e2e",
                  "SSH_AUTH_SOCK=/tmp/agent.sock", "TERM=xterm-e2e", "SHELL=/bin/sh"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  for (const char* leaked : {"SECRET_TOKEN", "xyz-secret-token", "AWS_SECRET_ACCESS_KEY", "abc-aws-key",
                             "GITHUB_TOKEN", "SSH_AUTH_SOCK", "AGENTBOX_PLAN"}) {
    EXPECT_FALSE(Contains(r.out, leaked)) << leaked << "\n" << r.Describe();
  }
  const auto lines = Lines(r.out);
  auto has = [&](const std::string& kv) { return std::find(lines.begin(), lines.end(), kv) != lines.end(); };
  EXPECT_TRUE(has("LANG=C")) << r.Describe();
  EXPECT_TRUE(has("TERM=xterm-e2e")) << r.Describe();
  EXPECT_TRUE(has("SHELL=/bin/sh")) << r.Describe();  // a shell need not look it up in the user database
  EXPECT_TRUE(has("HOME=" + sb.home())) << r.Describe();
  EXPECT_TRUE(has("PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")) << r.Describe();
}

// `--env` is repeatable and comes, like every option, right before `--`.
TEST(Env, FlagSetsAndPassesVariables) {
  Sandbox sb;
  RunResult r = sb.RunArgv({"sh", "-c", "env"}, {"--env", "FOO=bar", "--env", "PASS_ME"},
                           {"PASS_ME=passed-value", "NOT_PASSED=nope"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  const auto lines = Lines(r.out);
  auto has = [&](const std::string& kv) { return std::find(lines.begin(), lines.end(), kv) != lines.end(); };
  EXPECT_TRUE(has("FOO=bar")) << r.Describe();
  EXPECT_TRUE(has("PASS_ME=passed-value")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "NOT_PASSED")) << r.Describe();
}

TEST(Env, PathIsSetEvenWhenTheCallerHasNone) {
  Sandbox sb;
  Command c = sb.AgentboxCommand({"run", "--", "sh", "-c", "echo \"path=$PATH\"; ls / >/dev/null && echo ls-ok"});
  c.env = {"HOME=" + sb.home()};
  RunResult r = RunCommand(c);
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "path=/")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "ls-ok")) << r.Describe();
}

// ------------------------------------------------------------ lifetime

TEST(Cleanup, BackgroundProcessesDieWithTheRun) {
  Sandbox sb;
  const std::string marker = "1000." + std::to_string(100000 + (std::stoul(RandomHex(3), nullptr, 16) % 800000));
  RunResult r = sb.Sh("sleep " + marker + " & (setsid sleep " + marker + " &) ; echo started");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(r.out, "started\n");
  EXPECT_LT(r.elapsed_ms, 60000) << "agentbox waited for the background sleep (1000 s)";
  EXPECT_TRUE(WaitUntilNoProcess("sleep " + marker, 30000)) << "a background process outlived the run";
}

TEST(Cleanup, KillingTheSupervisorKillsTheSandbox) {
  Sandbox sb;
  const std::string marker = "1000." + std::to_string(100000 + (std::stoul(RandomHex(3), nullptr, 16) % 800000));
  Process p(sb.AgentboxCommand({"run", "--", "sh", "-c", "sleep " + marker + " & echo started; wait"}));
  ASSERT_TRUE(p.WaitForStdout("started\n", 15000)) << p.out() << p.err();
  // The sleep exists on the host, under the sandbox's pid namespace.
  const long until = NowMs() + 5000;
  while (PidsWithCmdline("sleep " + marker).empty() && NowMs() < until) usleep(10000);
  ASSERT_FALSE(PidsWithCmdline("sleep " + marker).empty());
  ASSERT_EQ(kill(p.pid(), SIGKILL), 0);
  RunResult r = p.Wait();
  EXPECT_EQ(r.status, 128 + SIGKILL);
  EXPECT_TRUE(WaitUntilNoProcess("sleep " + marker, 30000)) << "the sandbox outlived its supervisor";
}

TEST(Signals, InterruptIsForwardedToTheCommand) {
  Sandbox sb;
  Process p(sb.AgentboxCommand(
      {"run", "--report", sb.report_path(), "--", "sh", "-c",
       "trap 'echo got-int; exit 5' INT; echo ready; sleep 100 & wait"}));
  ASSERT_TRUE(p.WaitForStdout("ready\n", 15000)) << p.out() << p.err();
  ASSERT_EQ(kill(p.pid(), SIGINT), 0);
  RunResult r = p.Wait();
  EXPECT_EQ(r.status, 5) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "got-int\n")) << r.Describe();
  EXPECT_LT(r.elapsed_ms, 60000) << "the command outlived its interrupt (sleep 100)";
  auto report = ReadFile(sb.report_path());
  ASSERT_TRUE(report.has_value());
  auto j = nlohmann::json::parse(*report);
  EXPECT_EQ(j["outcome"], "exited");
  EXPECT_EQ(j["exit_code"], 5);
}

TEST(Signals, TerminateWithoutTrapEndsTheCommandBySignal) {
  Sandbox sb;
  Process p(sb.AgentboxCommand({"run", "--report", sb.report_path(), "--", "sh", "-c", "echo ready; exec sleep 100"}));
  ASSERT_TRUE(p.WaitForStdout("ready\n", 15000)) << p.out() << p.err();
  ASSERT_EQ(kill(p.pid(), SIGTERM), 0);
  RunResult r = p.Wait();
  EXPECT_EQ(r.status, 128 + SIGTERM) << r.Describe();
  auto j = nlohmann::json::parse(ReadFile(sb.report_path()).value_or("{}"));
  EXPECT_EQ(j["outcome"], "signaled") << j.dump(2);
  EXPECT_EQ(j["signal"], SIGTERM) << j.dump(2);
}

// Upper bounds on elapsed time only catch "never killed" (the command alone
// would run for 100 s or forever); they leave a loaded host a minute.
TEST(Timeout, WallClockEndsTheRun) {
  Sandbox sb;
  RunResult r = sb.RunArgv({"sleep", "100"}, {"--timeout", "1s"}, {}, 120000);
  EXPECT_FALSE(r.timed_out) << "agentbox never ended the run\n" << r.Describe();
  EXPECT_EQ(r.status, 124) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "timed_out") << r.Describe();
  EXPECT_GE(r.elapsed_ms, 1000) << "ended before the deadline\n" << r.Describe();
  EXPECT_LT(r.elapsed_ms, 60000) << r.Describe();
}

TEST(Timeout, CommandIgnoringTermIsKilled) {
  Sandbox sb;
  RunResult r = sb.Sh("trap '' TERM; echo ready; while :; do sleep 0.05; done", {"--timeout", "500ms"}, {}, 120000);
  EXPECT_FALSE(r.timed_out) << "agentbox never ended the run\n" << r.Describe();
  EXPECT_EQ(r.status, 124) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "timed_out") << r.Describe();
  EXPECT_TRUE(Contains(r.out, "ready")) << r.Describe();
  EXPECT_LT(r.elapsed_ms, 60000) << r.Describe();
}

TEST(Timeout, GraceIsConfigurableAndTermIsSentFirst) {
  Sandbox sb;
  // The command gets SIGTERM at the deadline and may clean up within the grace.
  RunResult polite = sb.Sh("trap 'echo got-term; sleep 0.3; echo cleaned; exit 3' TERM; sleep 100 & wait",
                           {"--timeout", "300ms", "--kill-grace", "10s"}, {}, 120000);
  EXPECT_EQ(polite.status, 124) << polite.Describe();
  EXPECT_TRUE(Contains(polite.out, "got-term")) << polite.Describe();
  EXPECT_TRUE(Contains(polite.out, "cleaned")) << polite.Describe();
  // A command that ignores SIGTERM dies when the grace ends: a short grace
  // ends it seconds before a long one (compared, not timed against a clock,
  // so a loaded host slows both alike).
  const std::string stubborn_script = "trap '' TERM; while :; do sleep 0.05; done";
  RunResult patient = sb.Sh(stubborn_script, {"--timeout", "300ms", "--kill-grace", "8s"}, {}, 120000);
  EXPECT_EQ(patient.status, 124) << patient.Describe();
  EXPECT_GE(patient.elapsed_ms, 8300) << "killed before the grace ended\n" << patient.Describe();
  RunResult stubborn = sb.Sh(stubborn_script, {"--timeout", "300ms", "--kill-grace", "200ms"}, {}, 120000);
  EXPECT_EQ(stubborn.status, 124) << stubborn.Describe();
  EXPECT_LT(stubborn.elapsed_ms, patient.elapsed_ms - 4000) << stubborn.Describe();
  // The policy key says the same.
  WriteFile(sb.scratch() + "/p.yaml", "version: 1\nresources: { wall_clock_min: 300ms, kill_grace: 200ms }\n");
  RunResult keyed = sb.Sh(stubborn_script, {"--policy", sb.scratch() + "/p.yaml"}, {}, 120000);
  EXPECT_EQ(keyed.status, 124) << keyed.Describe();
  EXPECT_LT(keyed.elapsed_ms, patient.elapsed_ms - 4000) << keyed.Describe();
}

}  // namespace
}  // namespace agentbox::e2e
