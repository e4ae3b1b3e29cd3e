#include "supervise/approver.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "session/test_files.h"

namespace agentbox::supervise {
namespace {

using nlohmann::json;
using session::testing::Read;
using session::testing::TempDir;
using namespace std::chrono_literals;

bool Contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A deny whose reason says `part`.
::testing::AssertionResult DeniedSaying(const ApprovalDecision& d, const std::string& part) {
  if (d.answer != ApprovalAnswer::kDeny) return ::testing::AssertionFailure() << "not a deny: " << AnswerName(d.answer);
  if (!Contains(d.reason, part)) return ::testing::AssertionFailure() << "the reason \"" << d.reason << "\" lacks " << part;
  return ::testing::AssertionSuccess();
}

// Alive and not a zombie (a zombie waits for a parent that is not us).
bool Alive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

bool GoneWithin(pid_t pid, std::chrono::milliseconds bound) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (Alive(pid)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

pid_t PidIn(const std::string& path) {
  std::ifstream in(path);
  pid_t pid = -1;
  in >> pid;
  return pid;
}

ApprovalRequest Request(const std::string& call_id = "call-1") {
  return {"s-42", "offer-7", call_id, "write to /etc/hosts: read-only",
          json{{"filesystem", {{"read_write", {"/etc/hosts"}}}}}};
}

class ApproverTest : public ::testing::Test {
 protected:
  // A /bin/sh script `name` in the temp dir with `body`; its path.
  std::string Script(const std::string& name, const std::string& body) {
    const std::string path = dir_ / name;
    session::testing::Write(path, "#!/bin/sh\n" + body + "\n", 0755);
    return path;
  }
  ApprovalDecision Ask(const std::string& body, std::chrono::milliseconds timeout = 10s) {
    return DecideByCommand({Script("approve", body)}, Request(), timeout);
  }

  TempDir dir_{"approver"};
};

TEST_F(ApproverTest, AnswersInOneWord) {
  const std::string once = Script("once", "cat >/dev/null; echo once");
  ApprovalDecision d = DecideByCommand({once}, Request(), 10s);
  EXPECT_EQ(d.answer, ApprovalAnswer::kOnce) << d.reason;
  EXPECT_EQ(d.by, "approve-command " + once);
  EXPECT_EQ(d.reason, "");

  d = Ask("printf '  session \\n\\n'");
  EXPECT_EQ(d.answer, ApprovalAnswer::kSession) << d.reason;

  d = Ask("echo deny");
  EXPECT_TRUE(DeniedSaying(d, "denied by approve-command"));
}

TEST_F(ApproverTest, AnswersAsAJsonObjectWithAReason) {
  ApprovalDecision d = Ask(R"(echo '{"decision": "deny", "reason": "not on a Friday"}')");
  EXPECT_EQ(d.answer, ApprovalAnswer::kDeny);
  EXPECT_EQ(d.reason, "not on a Friday");

  d = Ask(R"(echo '{"decision":"session","reason":"fine for this task"}')");
  EXPECT_EQ(d.answer, ApprovalAnswer::kSession) << d.reason;
  EXPECT_EQ(d.reason, "fine for this task");

  d = Ask(R"(echo '{"decision":"once"}')");
  EXPECT_EQ(d.answer, ApprovalAnswer::kOnce) << d.reason;
}

TEST_F(ApproverTest, AJsonAnswerOfAnotherShapeIsADeny) {
  ApprovalDecision d = Ask(R"(echo '{"decision":"always"}')");
  EXPECT_TRUE(DeniedSaying(d, "not once, session or deny"));

  d = Ask(R"(echo '{"decision":"once","until":"tomorrow"}')");
  EXPECT_TRUE(DeniedSaying(d, "unknown key \"until\""));

  d = Ask(R"(echo '{"decision":"once",')");
  EXPECT_TRUE(DeniedSaying(d, "not a JSON object"));
}

TEST_F(ApproverTest, TheRequestArrivesOnStdinAsOneJsonLine) {
  const std::string got = dir_ / "request";
  ApprovalDecision d = Ask("cat > '" + got + "'; echo once");
  ASSERT_EQ(d.answer, ApprovalAnswer::kOnce) << d.reason;  // cat ended: stdin was closed
  const std::string text = Read(got);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.find('\n'), text.size() - 1) << "one line and a newline: " << text;
  const json expected = {{"type", "escalation"},
                         {"session", "s-42"},
                         {"offer_id", "offer-7"},
                         {"call_id", "call-1"},
                         {"reason", "write to /etc/hosts: read-only"},
                         {"grant", {{"filesystem", {{"read_write", {"/etc/hosts"}}}}}}};
  EXPECT_EQ(json::parse(text), expected);
}

TEST_F(ApproverTest, RunsInAProcessGroupOfItsOwn) {
  const std::string got = dir_ / "group";
  ApprovalDecision d = Ask("echo $$ $(cut -d' ' -f5 /proc/$$/stat) > '" + got + "'; echo once");
  ASSERT_EQ(d.answer, ApprovalAnswer::kOnce) << d.reason;
  std::ifstream in(got);
  pid_t pid = -1, group = -1;
  in >> pid >> group;
  EXPECT_GT(pid, 0);
  EXPECT_EQ(group, pid) << "the program leads a group";
  EXPECT_NE(group, getpgrp());
}

TEST_F(ApproverTest, NoAnswerInTimeIsADenyAndNothingOfItIsLeft) {
  const std::string self = dir_ / "self.pid", child = dir_ / "child.pid";
  const auto start = std::chrono::steady_clock::now();
  ApprovalDecision d = Ask("echo $$ > '" + self + "'; sleep 100 & echo $! > '" + child + "'; wait", 700ms);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(DeniedSaying(d, "did not answer within 700 ms"));
  EXPECT_LT(took, 5s);
  const pid_t shell = PidIn(self), sleeper = PidIn(child);
  ASSERT_GT(shell, 0) << "the script did not write its pid in 700 ms";
  ASSERT_GT(sleeper, 0) << "the script did not write its child's pid in 700 ms";
  EXPECT_TRUE(GoneWithin(shell, 5s)) << "the program " << shell << " is still alive";
  EXPECT_TRUE(GoneWithin(sleeper, 5s)) << "its child " << sleeper << " is still alive";
}

TEST_F(ApproverTest, AnAnswerCountsWhenItExitsEvenIfAChildHoldsItsStdout) {
  const std::string child = dir_ / "child.pid";
  const auto start = std::chrono::steady_clock::now();
  ApprovalDecision d = Ask("sleep 100 & echo $! > '" + child + "'; echo once", 20s);
  EXPECT_EQ(d.answer, ApprovalAnswer::kOnce) << d.reason;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  const pid_t sleeper = PidIn(child);
  ASSERT_GT(sleeper, 0);
  EXPECT_TRUE(GoneWithin(sleeper, 5s)) << "its child " << sleeper << " outlived the decision";
}

TEST_F(ApproverTest, DeathBySignalIsADenyNamingTheSignal) {
  ApprovalDecision d = Ask("kill -SEGV $$");
  EXPECT_TRUE(DeniedSaying(d, "killed by signal SIGSEGV"));
}

TEST_F(ApproverTest, ANonZeroExitIsADenyEvenAfterOnce) {
  ApprovalDecision d = Ask("echo once; exit 3");
  EXPECT_TRUE(DeniedSaying(d, "exited with status 3"));
  EXPECT_TRUE(Contains(d.reason, "\"once\"")) << d.reason;
}

TEST_F(ApproverTest, AnythingElseIsADenyQuotingIt) {
  ApprovalDecision d = Ask("echo 'yes please'");
  EXPECT_TRUE(DeniedSaying(d, "answered \"yes please\", not once, session or deny"));

  // A long answer is quoted in part.
  const std::string long_answer(300, 'y');
  d = Ask("echo " + long_answer);
  EXPECT_TRUE(DeniedSaying(d, "\"" + std::string(80, 'y') + "\"..."));
  EXPECT_FALSE(Contains(d.reason, std::string(81, 'y'))) << d.reason;

  d = Ask("printf 'once\\nsession\\n'");
  EXPECT_TRUE(DeniedSaying(d, "\"once\\nsession\""));
}

TEST_F(ApproverTest, NoAnswerAtAllIsADeny) {
  ApprovalDecision d = Ask("cat >/dev/null");
  EXPECT_TRUE(DeniedSaying(d, "printed nothing"));
}

TEST_F(ApproverTest, TooLongAnAnswerIsADeny) {
  ApprovalDecision d = Ask("head -c 10000 /dev/zero | tr '\\0' o");
  EXPECT_TRUE(DeniedSaying(d, "printed more than 4096 bytes"));
}

TEST_F(ApproverTest, AProgramThatCannotStartIsADenyNamingPathAndErrno) {
  const std::string missing = dir_ / "no-such-approver";
  ApprovalDecision d = DecideByCommand({missing}, Request(), 10s);
  EXPECT_TRUE(DeniedSaying(d, "could not start"));
  EXPECT_EQ(d.by, "approve-command " + missing);
  EXPECT_TRUE(Contains(d.reason, missing)) << d.reason;
  EXPECT_TRUE(Contains(d.reason, "ENOENT")) << d.reason;

  const std::string not_executable = dir_ / "not-executable";
  session::testing::Write(not_executable, "#!/bin/sh\necho once\n", 0644);
  d = DecideByCommand({not_executable}, Request(), 10s);
  EXPECT_TRUE(DeniedSaying(d, "EACCES"));
}

TEST_F(ApproverTest, ARequestLargerThanAPipeIsADeny) {
  const std::string once = Script("once", "cat >/dev/null; echo once");
  ApprovalRequest big = Request();
  big.grant = json{{"padding", std::string(100 * 1024, 'x')}};
  ApprovalDecision d = DecideByCommand({once}, big, 10s);
  EXPECT_TRUE(DeniedSaying(d, "more than 65536"));
}

TEST_F(ApproverTest, WithoutAnApproverEveryRequestIsDenied) {
  ApprovalDecision d = NoApprover();
  EXPECT_EQ(d.answer, ApprovalAnswer::kDeny);
  EXPECT_EQ(d.reason, "no approver is configured");
  EXPECT_EQ(d.by, "");
  d = DecideByCommand({}, Request(), 10s);
  EXPECT_EQ(d.answer, ApprovalAnswer::kDeny);
  EXPECT_EQ(d.reason, "no approver is configured");
}

TEST_F(ApproverTest, EightThreadsDecideAtOnceEachWithItsOwnAnswer) {
  constexpr int kThreads = 8;
  const char* answers[] = {"once", "session", "deny"};
  std::vector<std::string> scripts;
  for (int i = 0; i < kThreads; ++i) {
    // Each waits a little so that all eight run at the same time, and
    // answers with its own reason.
    scripts.push_back(Script("approve-" + std::to_string(i),
                             "cat >/dev/null; sleep 0.3; echo '{\"decision\":\"" + std::string(answers[i % 3]) +
                                 "\",\"reason\":\"r" + std::to_string(i) + "\"}'"));
  }
  std::vector<ApprovalDecision> decisions(kThreads);
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] { decisions[i] = DecideByCommand({scripts[i]}, Request("c" + std::to_string(i)), 20s); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_STREQ(AnswerName(decisions[i].answer), answers[i % 3]) << i << ": " << decisions[i].reason;
    EXPECT_EQ(decisions[i].reason, "r" + std::to_string(i));
    EXPECT_EQ(decisions[i].by, "approve-command " + scripts[i]);
  }
  // Side by side, not one after another (8 × 0.3 s).
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2400ms);
}

// --- The terminal -------------------------------------------------------------

ApprovalRequest TerminalRequest() {
  return {"", "esc-0123456789ab", "", "connect 127.0.0.1:8080: not-allowed: 127.0.0.1:8080 is not in network.allow",
          json{{"network.allow", "127.0.0.1:8080"}}};
}

// The terminal's side of a question, on a socket pair standing in for it.
class TerminalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    ours_ = fds[0];
    theirs_ = fds[1];
  }
  void TearDown() override {
    close(ours_);
    if (theirs_ >= 0) close(theirs_);
  }
  // Types `typed` (before the question: a socket has no type-ahead flush),
  // asks, and returns the decision; what was printed goes to printed_.
  ApprovalDecision Answer(const std::string& typed, std::chrono::milliseconds timeout = 5s) {
    if (!typed.empty()) { EXPECT_EQ(write(theirs_, typed.data(), typed.size()), static_cast<ssize_t>(typed.size())); }
    ApprovalDecision d = AskOnDescriptors(ours_, ours_, TerminalRequest(), timeout);
    char buf[4096];
    ssize_t n;
    printed_.clear();
    while ((n = recv(theirs_, buf, sizeof(buf), MSG_DONTWAIT)) > 0) printed_.append(buf, static_cast<std::size_t>(n));
    return d;
  }
  int ours_ = -1, theirs_ = -1;
  std::string printed_;
};

TEST_F(TerminalTest, PrintsTheDenialAndTheGrant) {
  ApprovalDecision d = Answer("once\n");
  EXPECT_EQ(d.answer, ApprovalAnswer::kOnce) << d.reason;
  EXPECT_EQ(d.by, "terminal");
  EXPECT_TRUE(Contains(printed_, "connect 127.0.0.1:8080: not-allowed")) << printed_;
  EXPECT_TRUE(Contains(printed_, R"({"network.allow":"127.0.0.1:8080"})")) << printed_;
  EXPECT_TRUE(Contains(printed_, "[o]nce / [s]ession")) << printed_;
}

TEST_F(TerminalTest, OnceYesAndSessionAreAnswersAndTheRestIsADeny) {
  for (const char* once : {"once\n", "o\n", "y\n", " YES \n", "Yes\r\n"}) {
    EXPECT_EQ(Answer(once).answer, ApprovalAnswer::kOnce) << once;
  }
  for (const char* session : {"session\n", "s\n"}) EXPECT_EQ(Answer(session).answer, ApprovalAnswer::kSession) << session;
  EXPECT_TRUE(DeniedSaying(Answer("deny\n"), "denied at the terminal"));
  EXPECT_TRUE(DeniedSaying(Answer("n\n"), "denied at the terminal"));
  EXPECT_TRUE(DeniedSaying(Answer("no\n"), "denied at the terminal"));
  EXPECT_TRUE(DeniedSaying(Answer("\n"), "an empty answer"));
  EXPECT_TRUE(DeniedSaying(Answer("always\n"), "answered \"always\", not once, session or deny"));
}

TEST_F(TerminalTest, SilenceAndEndOfInputAreADeny) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(DeniedSaying(Answer("", 300ms), "no answer within 300 ms"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_TRUE(Contains(printed_, "denied")) << "the terminal is told: " << printed_;
  // Half an answer, then the terminal goes away.
  ASSERT_EQ(write(theirs_, "onc", 3), 3);
  ASSERT_EQ(shutdown(theirs_, SHUT_WR), 0);
  EXPECT_TRUE(DeniedSaying(Answer(""), "EOF"));
}

TEST_F(TerminalTest, AnOverlongLineIsADeny) {
  EXPECT_TRUE(DeniedSaying(Answer(std::string(1000, 'o')), "longer than 256 bytes"));
}

// Without a controlling terminal (a new session has none) nobody is asked.
TEST(Terminal, NoTerminalIsADenySayingSo) {
  int result[2];
  ASSERT_EQ(pipe2(result, O_CLOEXEC), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setsid();
    const ApprovalDecision d = DecideOnTerminal(TerminalRequest(), 1s);
    const std::string line = std::string(AnswerName(d.answer)) + "|" + d.by + "|" + d.reason;
    ssize_t ignored = write(result[1], line.data(), line.size());
    (void)ignored;
    _exit(0);
  }
  close(result[1]);
  std::string got;
  char buf[512];
  ssize_t n;
  while ((n = read(result[0], buf, sizeof(buf))) > 0) got.append(buf, static_cast<std::size_t>(n));
  close(result[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_EQ(got, "deny|terminal|no terminal to ask");
}

}  // namespace
}  // namespace agentbox::supervise
