// `agentbox run --tty`: the command gets a pseudo-terminal of the sandbox's
// own (its own devpts instance on the namespaces backend), as its controlling
// terminal, with job control and window sizes; the caller's terminal stays
// out of reach and TIOCSTI stays fenced.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pty.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <string>

#include "harness.h"
#include "linux/fd.h"

namespace agentbox::e2e {
namespace {

using Fd = agentbox::linux::UniqueFd;

std::string BackendOf(const RunResult& r) {
  if (!r.report || !r.report->contains("enforcement")) return "";
  return (*r.report)["enforcement"].value("backend", "");
}

TEST(RunTty, TheCommandHasAControllingTerminalOfItsOwn) {
  Sandbox sb;
  RunResult r = sb.Sh("tty; [ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo all-ttys;"
                      "( exec 3</dev/tty ) 2>/dev/null && echo has-ctty; echo pts=$(ls /dev/pts | wc -l):$(ls /dev/pts | head -1)",
                      {"--tty"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "all-ttys")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "has-ctty")) << r.Describe();
  if (BackendOf(r) == "linux-namespaces") {
    // A devpts instance of its own: its first pty, and nothing else in it.
    EXPECT_TRUE(Contains(r.out, "/dev/pts/0\r\n")) << r.Describe();
    EXPECT_TRUE(Contains(r.out, "pts=2:0\r\n")) << r.Describe();
  }
}

TEST(RunTty, WithoutTheFlagThereIsNoTerminal) {
  Sandbox sb;
  RunResult r = sb.Sh("[ -t 0 ] || [ -t 1 ] && echo a-tty; ( exec 3</dev/tty ) 2>/dev/null && echo has-ctty; echo done");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "a-tty")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "has-ctty")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "done")) << r.Describe();
}

TEST(RunTty, InputIsRelayedAndEndOfInputEndsTheCommand) {
  Sandbox sb;
  Command c = sb.AgentboxCommand({"run", "--tty", "--", "sh", "-c", "read line; echo got:$line; cat; echo cat-ended"});
  c.stdin_data = "hello\nsecond\n";
  RunResult r = RunCommand(c);
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "got:hello\r\n")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "cat-ended")) << r.Describe();
}

TEST(RunTty, ExitStatusAndSignalsComeThrough) {
  Sandbox sb;
  RunResult r = sb.Sh("exit 7", {"--tty"});
  EXPECT_EQ(r.status, 7) << r.Describe();
  RunResult k = sb.Sh("kill -TERM $$", {"--tty"});
  EXPECT_EQ(k.status, 128 + SIGTERM) << k.Describe();
}

TEST(RunTty, BashGetsJobControl) {
  Sandbox sb;
  if (FindTool("bash").empty()) GTEST_SKIP() << "not applicable here: no bash on this host";
  RunResult r = sb.RunArgv({"bash", "-ic", "case $- in *m*) echo job-control-on;; esac; sleep 30 & jobs; kill %1; wait; echo ok"},
                           {"--tty"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "job-control-on")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "Running")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "no job control")) << r.Describe();
}

// The caller's terminal is a pty of the test's: its size reaches the
// sandbox's pty at the start and on SIGWINCH.
TEST(RunTty, WindowSizeFollowsTheCallersTerminal) {
  Sandbox sb;
  int master = -1, slave = -1;
  struct winsize size {};
  size.ws_col = 100;
  size.ws_row = 30;
  ASSERT_EQ(openpty(&master, &slave, nullptr, nullptr, &size), 0) << std::strerror(errno);
  Fd m(master), s(slave);
  Command c = sb.AgentboxCommand({"run", "--tty", "--", "bash", "-c",
                                  "stty size; trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 0.05; done"});
  c.stdin_fd = s.get();
  c.timeout_ms = 20000;
  Process p(c);
  ASSERT_TRUE(p.started()) << p.start_error();
  ASSERT_TRUE(p.WaitForStdout("ready", 15000)) << p.out() << p.err();
  EXPECT_TRUE(Contains(p.out(), "30 100\r\n")) << p.out();
  size.ws_col = 120;
  size.ws_row = 40;
  ASSERT_EQ(ioctl(m.get(), TIOCSWINSZ, &size), 0);
  kill(p.pid(), SIGWINCH);  // as the terminal would (agentbox is not its foreground group here)
  RunResult r = p.Wait();
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "40 120\r\n")) << r.Describe();
}

// Attack: TIOCSTI pushes input into a terminal; the command's own
// controlling terminal is the one it could reach. Refused by the filter.
TEST(RunTtyAttack, TiocstiIntoItsOwnTerminalIsRefused) {
  Sandbox sb;
  if (!Exists("/usr/bin/python3")) GTEST_SKIP() << "not applicable here: no /usr/bin/python3 on this host";
  RunResult r = sb.RunArgv({"/usr/bin/python3", "-c",
                            "import fcntl, termios\n"
                            "try:\n"
                            "    fcntl.ioctl(0, termios.TIOCSTI, b'x')\n"
                            "    print('injected')\n"
                            "except OSError as e:\n"
                            "    print('refused', e.errno)\n"},
                           {"--tty"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "refused 1")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "injected")) << r.Describe();
}

// Attack: the caller's terminal (a pty of the host's devpts) is not in the
// sandbox: neither as an fd nor by its path.
TEST(RunTtyAttack, TheCallersTerminalIsOutOfReach) {
  Sandbox sb;
  // The caller's pty must not share its name with the sandbox's first one
  // (/dev/pts/0): a second pty is never number 0.
  int master = -1, slave = -1, spare_m = -1, spare_s = -1;
  ASSERT_EQ(openpty(&spare_m, &spare_s, nullptr, nullptr, nullptr), 0) << std::strerror(errno);
  Fd sm(spare_m), ss(spare_s);
  ASSERT_EQ(openpty(&master, &slave, nullptr, nullptr, nullptr), 0) << std::strerror(errno);
  Fd m(master), s(slave);
  const std::string host_name = ttyname(s.get()) ? ttyname(s.get()) : "";
  ASSERT_NE(host_name, "/dev/pts/0");
  ASSERT_FALSE(host_name.empty());
  Command c = sb.AgentboxCommand({"run", "--report", sb.report_path(), "--tty", "--", "sh", "-c",
                                  "for fd in 0 1 2; do readlink /proc/self/fd/$fd; done;"
                                  "echo marker-from-inside > " + host_name + " 2>/dev/null && echo wrote-host-tty; echo end"});
  c.stdin_fd = s.get();
  RunResult r = RunCommand(c);
  ASSERT_EQ(r.status, 0) << r.Describe();
  auto report = ReadFile(sb.report_path());
  ASSERT_TRUE(report) << r.Describe();
  const std::string backend = nlohmann::json::parse(*report)["enforcement"].value("backend", "");
  if (backend != "linux-namespaces") {
    GTEST_SKIP() << "not applicable here: the landlock-only backend shares the host's devpts (backend " << backend << ")";
  }
  // Every stdio fd is the sandbox's pty, none the caller's.
  EXPECT_FALSE(Contains(r.out, host_name + "\r\n")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "wrote-host-tty")) << r.Describe();
  // Nothing but the relay wrote to the caller's terminal: the master holds
  // the relayed output, in which the marker never appears.
  fcntl(m.get(), F_SETFL, O_NONBLOCK);
  std::string seen;
  char buf[4096];
  ssize_t n;
  while ((n = read(m.get(), buf, sizeof(buf))) > 0) seen.append(buf, static_cast<size_t>(n));
  EXPECT_FALSE(Contains(seen, "marker-from-inside")) << seen;
}

}  // namespace
}  // namespace agentbox::e2e
