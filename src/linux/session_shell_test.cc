#include "linux/session_shell.h"

#include <gtest/gtest.h>

#include <csignal>
#include <string>

namespace agentbox::linux {
namespace {

TEST(ShellQuoteTest, NothingInsideIsExpanded) {
  EXPECT_EQ(ShellQuote("plain"), "'plain'");
  EXPECT_EQ(ShellQuote(""), "''");
  EXPECT_EQ(ShellQuote("it's $HOME `x` \"q\""), "'it'\\''s $HOME `x` \"q\"'");
}

TEST(ShellVariableNameTest, OnlyWhatBashCanAssign) {
  EXPECT_TRUE(IsShellVariableName("PATH"));
  EXPECT_TRUE(IsShellVariableName("_x1"));
  EXPECT_FALSE(IsShellVariableName(""));
  EXPECT_FALSE(IsShellVariableName("1x"));
  EXPECT_FALSE(IsShellVariableName("A-B"));
  EXPECT_FALSE(IsShellVariableName("A B"));
  EXPECT_FALSE(IsShellVariableName("A=B"));
}

TEST(ShellCallLineTest, TheCommandIsReadFromItsFileAndTheStatusGoesToItsFifo) {
  const std::string abort = std::to_string(ShellAbortSignal());
  EXPECT_EQ(ShellCallLine("/dev/shm/d", 3, "", {}, false),
            "builtin trap 'builtin return 143' " + abort +
                "; builtin unset -f source; { source -- '/dev/shm/d/3.cmd'; } </dev/null >'/dev/shm/d/3.out' 2>&1; "
                "builtin printf '%s\\n' \"$?\" >'/dev/shm/d/3.status'\n");
}

TEST(ShellCallLineTest, CwdEnvAndStdinAreQuotedAndInvalidNamesLeftOut) {
  const std::string line = ShellCallLine("/tmp/d", 1, "/w/it's", {"A=x'y", "BAD-NAME=z", "B="}, true);
  EXPECT_NE(line.find("builtin cd -- '/w/it'\\''s' && A='x'\\''y' B='' source -- '/tmp/d/1.cmd'; } <'/tmp/d/1.in'"),
            std::string::npos)
      << line;
  EXPECT_EQ(line.find("BAD-NAME"), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), line.size() - 1) << "one line: " << line;
}

TEST(ShellAbortSignalTest, IsARealTimeSignal) {
  EXPECT_GE(ShellAbortSignal(), SIGRTMIN);
  EXPECT_LE(ShellAbortSignal(), SIGRTMAX);
}

}  // namespace
}  // namespace agentbox::linux
