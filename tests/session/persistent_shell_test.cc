// session.shell: persistent — one bash per session, through the daemon's
// API: state carries over, output and status stay exactly the call's, a
// timeout or cancel ends the call but keeps the shell, a dead shell is
// started again and both calls say so.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "daemon_fixture.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;
using e2e::TempDir;

constexpr char kPersistent[] = "version: 1\nsession:\n  shell: persistent\n";

class PersistentShellTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(d_.Start()) << d_.error();
    id_ = CreateSession(c(), ws_.path(), {{"policy", policy_}});
    ASSERT_FALSE(id_.empty());
  }
  daemon::Client& c() { return d_.client(); }
  json Run(const json& input, const std::string& call_id = "") {
    json body = {{"name", "bash"}, {"input", input}};
    if (!call_id.empty()) body["call_id"] = call_id;
    Answer a = Call(c(), "POST", "/v1/sessions/" + id_ + "/execute", body);
    EXPECT_EQ(a.status, 200) << a.text;
    return a.body;
  }
  json Run(const char* command) { return Run(json{{"command", command}}); }
  json Run(const std::string& command) { return Run(json{{"command", command}}); }
  static std::string Output(const json& r) { return r.value("output", ""); }
  static bool Restarted(const json& r) { return r.contains("shell") && r["shell"].value("restarted", false); }

  std::string policy_ = kPersistent;
  TempDir ws_{"agentbox-shell-ws-"};  // outlives the daemon
  Daemon d_;
  std::string id_;
};

TEST_F(PersistentShellTest, CwdVariablesFunctionsAndOptionsCarryOverBetweenCalls) {
  json first = Run("mkdir -p sub/deeper && cd sub && export SEEN=exported; plain=set; declare -a arr=(x y z); "
                   "greet() { echo \"hello $1\"; }; shopt -s expand_aliases; alias ll='echo aliased'; set -o noglob");
  ASSERT_EQ(first.value("exit_code", -1), 0) << first.dump();
  EXPECT_EQ(first["shell"].value("mode", ""), "persistent") << first.dump();
  EXPECT_FALSE(Restarted(first)) << "the first shell is not a restart: " << first.dump();
  json second = Run("pwd; echo \"$SEEN $plain ${arr[2]}\"; greet you; ll; echo *; bash -c 'echo child:$SEEN'");
  EXPECT_EQ(second.value("exit_code", -1), 0) << second.dump();
  EXPECT_TRUE(Contains(Output(second), "/sub\nexported set z\nhello you\naliased\n*\nchild:exported\n")) << second.dump();
  EXPECT_FALSE(Restarted(second)) << second.dump();
  // The same pid: one bash, not a copy of its state.
  json pid1 = Run("echo $$");
  json pid2 = Run("echo $$");
  EXPECT_EQ(Output(pid1), Output(pid2));
  // A call's cwd is where the shell goes for it (and stays, as after cd).
  json there = Run(json{{"command", "pwd"}, {"cwd", "sub/deeper"}});
  EXPECT_TRUE(Contains(Output(there), "/sub/deeper\n")) << there.dump();
  EXPECT_TRUE(Contains(Output(Run("pwd")), "/sub/deeper\n"));
}

TEST_F(PersistentShellTest, OutputAndStatusAreExactlyTheCalls) {
  // No newline at the end, stderr with stdout, text that looks like a status.
  json r = Run("printf 'out'; printf ' err' >&2; printf '\\n0\\n'; printf 'tail'");
  EXPECT_EQ(Output(r), "out err\n0\ntail") << r.dump();
  EXPECT_EQ(r.value("exit_code", -1), 0);
  json failed = Run("echo before; (exit 7)");
  EXPECT_EQ(failed.value("exit_code", -1), 7) << failed.dump();
  EXPECT_EQ(Output(failed), "before\n[exit code 7]");
  EXPECT_EQ(Run("false").value("exit_code", -1), 1);
  // Quotes, substitutions, a heredoc and a syntax error in the command's
  // text change nothing of how the shell reads the next call.
  json quoted = Run("cat <<'EOF'\nit's \"$HOME\" $(not run) `nor this`\nEOF\necho '}; exit 9'");
  EXPECT_EQ(Output(quoted), "it's \"$HOME\" $(not run) `nor this`\n}; exit 9\n") << quoted.dump();
  json broken = Run("if then fi (");
  EXPECT_EQ(broken.value("exit_code", -1), 2) << broken.dump();
  EXPECT_TRUE(Contains(Output(broken), "syntax error")) << broken.dump();
  json after = Run("echo still here");
  EXPECT_EQ(Output(after), "still here\n") << after.dump();
  EXPECT_FALSE(Restarted(after)) << after.dump();
  // Large output, all of it and only it.
  json big = Run("head -c 200000 /dev/zero | tr '\\0' a");
  EXPECT_EQ(big.value("output_bytes", 0), 200000) << big.value("truncated", false);
}

TEST_F(PersistentShellTest, StdinAndEnvAreTheCallsOwn) {
  json fed = Run(json{{"command", "cat; echo \"[$ONE]\""}, {"stdin", "line one\nline two\n"}, {"env", {{"ONE", "a 'b' $c"}}}});
  EXPECT_EQ(Output(fed), "line one\nline two\n[a 'b' $c]\n") << fed.dump();
  // The next call's stdin is empty, and the env is gone.
  json next = Run("cat; echo \"[${ONE-unset}]\"");
  EXPECT_EQ(Output(next), "[unset]\n") << next.dump();
  Answer bad = Call(c(), "POST", "/v1/sessions/" + id_ + "/execute",
                    {{"name", "bash"}, {"input", {{"command", "true"}, {"env", {{"NOT-A-NAME", "x"}}}}}});
  EXPECT_EQ(bad.status, 400) << bad.text;
  EXPECT_TRUE(Contains(bad.message(), "input.env.NOT-A-NAME")) << bad.text;
}

TEST_F(PersistentShellTest, ATimeoutEndsTheCallButKeepsTheShellAndWhatEarlierCallsLeftRunning) {
  json setup = Run("cd /tmp && export KEEP=yes; sleep 300 & echo $!");
  const std::string earlier = Output(setup);
  ASSERT_FALSE(earlier.empty()) << setup.dump();
  json slow = Run(json{{"command", "echo started; sleep 60; echo never"}, {"timeout", "1s"}});
  EXPECT_EQ(slow.value("kind", ""), "timed_out") << slow.dump();
  EXPECT_TRUE(Contains(Output(slow), "started\n")) << slow.dump();
  EXPECT_FALSE(Contains(Output(slow), "never")) << slow.dump();
  json after = Run("echo \"$KEEP $PWD\"; kill -0 " + earlier.substr(0, earlier.size() - 1) + " && echo alive");
  EXPECT_EQ(Output(after), "yes /tmp\nalive\n") << after.dump();
  EXPECT_FALSE(Restarted(after)) << after.dump();
  // What the timed-out call started in the background died with it.
  json bg = Run(json{{"command", "sleep 200 & echo $!; sleep 60"}, {"timeout", "1s"}});
  const std::string pid = Output(bg).substr(0, Output(bg).find('\n'));
  ASSERT_FALSE(pid.empty()) << bg.dump();
  json gone = Run("kill -0 " + pid + " 2>/dev/null && echo alive || echo gone");
  EXPECT_EQ(Output(gone), "gone\n") << gone.dump();
}

TEST_F(PersistentShellTest, ACancelEndsTheCallButKeepsTheShell) {
  ASSERT_EQ(Run("export KEEP=kept").value("exit_code", -1), 0);
  daemon::Client other(d_.endpoint());
  auto running = std::async(std::launch::async, [&] { return Run(json{{"command", "sleep 120"}}, "long-one"); });
  Answer cancel;
  for (int i = 0; i < 100 && cancel.status != 202; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cancel = Call(other, "POST", "/v1/sessions/" + id_ + "/calls/long-one/cancel");
  }
  EXPECT_EQ(cancel.status, 202) << cancel.text;
  json cancelled = running.get();
  EXPECT_EQ(cancelled.value("kind", ""), "cancelled") << cancelled.dump();
  json after = Run("echo $KEEP");
  EXPECT_EQ(Output(after), "kept\n") << after.dump();
  EXPECT_FALSE(Restarted(after)) << after.dump();
}

TEST_F(PersistentShellTest, AnExitedShellIsStartedAgainAndBothCallsSaySo) {
  ASSERT_EQ(Run("export GONE=soon; cd /tmp").value("exit_code", -1), 0);
  json quit = Run("echo bye; exit 3");
  EXPECT_EQ(quit.value("exit_code", -1), 3) << quit.dump();
  EXPECT_TRUE(quit["shell"].value("ended", false)) << quit.dump();
  EXPECT_TRUE(Contains(Output(quit), "bye\n")) << quit.dump();
  EXPECT_TRUE(Contains(Output(quit), "the shell exited with status 3; the next call starts a new shell")) << quit.dump();
  json next = Run("echo \"[${GONE-unset}]\"");
  EXPECT_TRUE(Restarted(next)) << next.dump();
  EXPECT_TRUE(Contains(Output(next), "[persistent shell: this call ran in a new shell")) << next.dump();
  EXPECT_TRUE(Contains(Output(next), "[unset]\n")) << next.dump();
  EXPECT_FALSE(Restarted(Run("true")));
}

TEST_F(PersistentShellTest, ABuiltinLoopIsEndedWithoutTheShell) {
  ASSERT_EQ(Run("export X=1").value("exit_code", -1), 0);
  // Nothing to kill but the shell's own loop: the shell leaves it.
  json loop = Run(json{{"command", "while :; do :; done; echo never"}, {"timeout", "1s"}});
  EXPECT_EQ(loop.value("kind", ""), "timed_out") << loop.dump();
  EXPECT_FALSE(Contains(Output(loop), "never")) << loop.dump();
  json next = Run("echo \"[${X-unset}]\"");
  EXPECT_FALSE(Restarted(next)) << next.dump();
  EXPECT_EQ(Output(next), "[1]\n") << next.dump();
}

TEST_F(PersistentShellTest, ACommandHoldingTheShellItselfIsEndedWithIt) {
  ASSERT_EQ(Run("export X=1").value("exit_code", -1), 0);
  // The command ignores the signal the shell leaves a command on.
  json held = Run(json{{"command", "trap '' RTMIN+5; while :; do :; done"}, {"timeout", "1s"}});
  EXPECT_EQ(held.value("kind", ""), "timed_out") << held.dump();
  EXPECT_TRUE(held["shell"].value("ended", false)) << held.dump();
  EXPECT_TRUE(Contains(Output(held), "the next call starts a new shell")) << held.dump();
  json next = Run("echo \"[${X-unset}]\"");
  EXPECT_TRUE(Restarted(next)) << next.dump();
  EXPECT_TRUE(Contains(Output(next), "[unset]\n")) << next.dump();
}

TEST_F(PersistentShellTest, WhatACallLeavesRunningWritesToTheBackgroundLogNotTheNextCall) {
  json r = Run("(sleep 0.5; echo after-the-call) & echo in-the-call");
  EXPECT_EQ(Output(r), "in-the-call\n") << r.dump();
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  json next = Run("echo next");
  EXPECT_EQ(Output(next), "next\n") << next.dump();
  std::string log;
  for (int i = 0; i < 100 && log != "after-the-call\n"; ++i) {
    log = Call(c(), "GET", "/v1/sessions/" + id_ + "/background/log").text;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(log, "after-the-call\n");
}

TEST_F(PersistentShellTest, CallsAtOnceTakeTurnsInTheOneShell) {
  daemon::Client other(d_.endpoint());
  auto slow = std::async(std::launch::async, [&] {
    return Call(c(), "POST", "/v1/sessions/" + id_ + "/execute",
                {{"name", "bash"}, {"input", {{"command", "sleep 1; export ORDER=first; echo slow"}}}});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Answer quick = Call(other, "POST", "/v1/sessions/" + id_ + "/execute",
                      {{"name", "bash"}, {"input", {{"command", "echo quick:${ORDER-none}"}}}});
  Answer first = slow.get();
  EXPECT_EQ(first.body.value("output", ""), "slow\n") << first.text;
  EXPECT_EQ(quick.body.value("output", ""), "quick:first\n") << quick.text;
}

TEST_F(PersistentShellTest, TheSandboxStillDeniesAndSaysSo) {
  json denied = Run("cd / && echo x > /usr/agentbox-shell-probe");
  EXPECT_NE(denied.value("exit_code", 0), 0) << denied.dump();
  EXPECT_EQ(denied.value("kind", ""), "sandbox_denied") << denied.dump();
  EXPECT_EQ(Output(Run("pwd")), "/\n");
}

// The shell's keeper is outside the commands' signal scope: the shell can
// kill itself, never the keeper that would start it again.
TEST_F(PersistentShellTest, TheShellCannotSignalItsKeeper) {
  json r = Run("ps_keeper=$PPID; kill -9 $ps_keeper; echo \"kill:$?\"; kill -STOP $ps_keeper; echo \"stop:$?\"");
  EXPECT_TRUE(Contains(Output(r), "kill:1\n")) << r.dump();
  EXPECT_TRUE(Contains(Output(r), "stop:1\n")) << r.dump();
  json next = Run("echo alive");
  EXPECT_EQ(Output(next), "alive\n") << next.dump();
  EXPECT_FALSE(Restarted(next)) << next.dump();
}

// A syscall the filter denies is the call's that made it, and only its.
TEST_F(PersistentShellTest, SeccompDenialsAreCountedForTheCallThatMadeThem) {
  json denied = Run("cd /tmp && touch setid && chmod u+s setid");
  EXPECT_EQ(denied.value("kind", ""), "sandbox_denied") << denied.dump();
  ASSERT_TRUE(denied["outcome"]["denials"].is_array()) << denied.dump();
  bool seccomp = false;
  for (const auto& d : denied["outcome"]["denials"]) seccomp = seccomp || d.value("source", "") == "seccomp";
  EXPECT_TRUE(seccomp) << denied.dump();
  json clean = Run("ls setid");
  EXPECT_EQ(clean.value("kind", ""), "exited") << clean.dump();
  EXPECT_TRUE(clean["outcome"]["denials"].empty()) << clean.dump();
}

class PersistentShellIdleTest : public PersistentShellTest {
 protected:
  PersistentShellIdleTest() { policy_ = "version: 1\nsession:\n  shell: persistent\n  idle_timeout: 1s\n"; }
};

TEST_F(PersistentShellIdleTest, ANewWorldMeansANewShellAndTheCallSaysSo) {
  ASSERT_EQ(Run("export LOST=yes").value("exit_code", -1), 0);
  bool stopped = false;
  for (int i = 0; i < 300 && !stopped; ++i) {
    Answer a = Call(c(), "GET", "/v1/sessions/" + id_);
    stopped = a.status == 200 && !a.body.value("provisioned", true);
    if (!stopped) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(stopped) << "the idle session's world was not stopped";
  json next = Run("echo \"[${LOST-unset}]\"");
  EXPECT_TRUE(Restarted(next)) << next.dump();
  EXPECT_TRUE(Contains(Output(next), "sandbox was started again")) << next.dump();
  EXPECT_TRUE(Contains(Output(next), "[unset]\n")) << next.dump();
}

}  // namespace
}  // namespace agentbox::session_test
