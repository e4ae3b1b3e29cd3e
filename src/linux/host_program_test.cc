#include "linux/host_program.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <string>

namespace agentbox::linux {
namespace {

using namespace std::chrono_literals;

std::string Field(const std::string& status, const std::string& name) {
  const auto at = status.find(name + ":");
  if (at == std::string::npos) return "";
  const auto begin = status.find_first_not_of(" \t", at + name.size() + 1);
  return status.substr(begin, status.find('\n', begin) - begin);
}

// A request thread of the daemon blocks and ignores signals of its own; the
// program gets a clean slate.
TEST(RunHostProgram, TheProgramGetsNoBlockedOrIgnoredSignal) {
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &term, &old), 0);
  struct sigaction ignore {}, previous {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGPIPE, &ignore, &previous), 0);
  auto run = RunHostProgram({"/bin/cat", "/proc/self/status"}, "", 10s, 64 * 1024);
  sigaction(SIGPIPE, &previous, nullptr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  ASSERT_EQ(run->end, ProgramRun::End::kExited);
  EXPECT_EQ(Field(run->output, "SigBlk"), "0000000000000000") << run->output;
  // Signals 32 and 33 are glibc's own (thread cancellation, setxid); its
  // posix_spawn leaves them ignored, and every glibc program installs its
  // handlers for them at start.
  const std::uint64_t ignored = std::stoull(Field(run->output, "SigIgn"), nullptr, 16);
  const std::uint64_t glibc_own = (std::uint64_t{1} << 31) | (std::uint64_t{1} << 32);
  EXPECT_EQ(ignored & ~glibc_own, 0u) << run->output;
}

TEST(RunHostProgram, TheProgramGetsOnlyStdinStdoutAndStderr) {
  // A descriptor this process holds without close-on-exec.
  const int leaked = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(leaked, 0);
  // The shell's builtins open nothing: every descriptor from 3 up is one it inherited.
  auto run = RunHostProgram({"/bin/sh", "-c",
                             "i=0; while [ $i -le 1024 ]; do [ -e /proc/$$/fd/$i ] && echo $i; i=$((i+1)); done"},
                            "", 20s, 4096);
  ::close(leaked);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->output, "0\n1\n2\n") << "the program's descriptors (this process had " << leaked << " open)";
}

TEST(RunHostProgram, InputIsReadThenEndOfFile) {
  auto run = RunHostProgram({"/bin/cat"}, "question\n", 10s, 4096);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->end, ProgramRun::End::kExited);
  EXPECT_TRUE(WIFEXITED(run->wait_status) && WEXITSTATUS(run->wait_status) == 0);
  EXPECT_EQ(run->output, "question\n");
}

TEST(RunHostProgram, ASpawnFailureNamesTheProgram) {
  auto run = RunHostProgram({"/nonexistent/agentbox-helper"}, "", 10s, 4096);
  ASSERT_FALSE(run.ok());
  EXPECT_EQ(run.status().err(), ENOENT);
  EXPECT_NE(run.status().message().find("/nonexistent/agentbox-helper"), std::string::npos)
      << run.status().message();
}

TEST(DescribeWaitStatus, NamesCodesAndSignals) {
  EXPECT_EQ(DescribeWaitStatus(3 << 8), "exited with status 3");
  EXPECT_EQ(DescribeWaitStatus(SIGSEGV), "was killed by signal SIGSEGV (11)");
}

}  // namespace
}  // namespace agentbox::linux
