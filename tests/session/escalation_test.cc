// Escalations through the daemon: a denial's offer asked for
// (POST /v1/sessions/{id}/escalations), decided by --approve-command or
// through the API (--approve-api), applied for one call or for the
// session, held against on_violation.max_grant, and audited in the log.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "host_facts.h"

#include "daemon_fixture.h"
#include "upstream.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;
using e2e::TempDir;

// The first denial's offer in a result, or null.
json OfferOf(const json& result) {
  if (!result.contains("outcome") || !result["outcome"].contains("denials")) return nullptr;
  for (const json& d : result["outcome"]["denials"]) {
    if (d.contains("escalation")) return d["escalation"];
  }
  return nullptr;
}

// How many requests an approver script saw (one line each in `log`).
int Asked(const std::string& log) {
  auto text = e2e::ReadFile(log);
  return text ? static_cast<int>(e2e::Lines(*text).size()) : 0;
}

class EscalationTest : public ::testing::Test {
 protected:
  // A daemon whose approver is a script: it appends its request to
  // approver.log and runs `body` (which prints the answer).
  void StartWith(const std::string& body, const std::vector<std::string>& extra = {}) {
    ASSERT_GT(up_.port(), 0);
    WriteApprover(body);
    std::vector<std::string> flags = {"--approve-command", approver_};
    flags.insert(flags.end(), extra.begin(), extra.end());
    ASSERT_TRUE(d_.Start(flags)) << d_.error();
    CreateWithPolicy();
  }
  void WriteApprover(const std::string& body) {
    approver_ = d_.root() + "/approver";
    asked_log_ = d_.root() + "/approver.log";
    e2e::WriteFile(approver_, "#!/bin/sh\nread -r line; printf '%s\\n' \"$line\" >> " + asked_log_ + "\n" + body, 0755);
  }
  void StartWithApi(const std::string& timeout) {
    ASSERT_GT(up_.port(), 0);
    ASSERT_TRUE(d_.Start({"--approve-api", "--approve-timeout", timeout})) << d_.error();
    CreateWithPolicy();
  }
  void CreateWithPolicy() {
    target_ = "127.0.0.1:" + std::to_string(up_.port());
    // 127.0.0.1 is within the ceiling; 127.0.0.3 is not.
    const std::string policy = "version: 1\n"
                               "network:\n  allow: [\"127.0.0.2:9\"]\n"
                               "on_violation:\n  escalation: one_time_approval\n"
                               "  max_grant:\n    network: [\"127.0.0.1\"]\n";
    id_ = CreateSession(c(), ws_.path(), {{"policy", policy}});
    ASSERT_FALSE(id_.empty());
  }
  daemon::Client& c() { return d_.client(); }
  json Fetch(const std::string& target, const std::string& call_id = "") {
    return Bash(c(), id_, "NO_PROXY= no_proxy= curl -fsS --max-time 10 http://" + target + "/", call_id);
  }
  // A denied fetch of `target` and the offer its result carries.
  std::string DeniedOffer(const std::string& target, bool within = true) {
    json denied = Fetch(target);
    EXPECT_EQ(denied.value("kind", ""), "sandbox_denied") << denied.dump();
    json offer = OfferOf(denied);
    EXPECT_TRUE(offer.is_object()) << denied.dump();
    if (!offer.is_object()) return "";
    EXPECT_EQ(offer.value("within_ceiling", !within), within) << offer.dump();
    EXPECT_EQ(offer["grant"], json({{"network.allow", target}})) << offer.dump();
    return offer.value("id", "");
  }
  // How many worlds the session has had (provisioned and reprovisioned events).
  int Worlds() {
    auto log = c().Call("GET", "/v1/sessions/" + id_ + "/log");
    if (!log.ok()) return -1;
    int worlds = 0;
    for (const std::string& line : e2e::Lines(log->body)) {
      if (Contains(line, "\"provisioned\"") || Contains(line, "\"reprovisioned\"")) ++worlds;
    }
    return worlds;
  }
  Answer Ask(const std::string& offer_id, const std::string& request_id = "") {
    json body = {{"offer_id", offer_id}, {"reason", "the build fetches its dependencies"}};
    if (!request_id.empty()) body["request_id"] = request_id;
    return Call(c(), "POST", "/v1/sessions/" + id_ + "/escalations", body);
  }

  Upstream up_;
  TempDir ws_{"agentbox-escalation-ws-"};
  Daemon d_;
  std::string id_, target_, approver_, asked_log_;
};

// Denied → offer → approved once → the next call reaches the host → the
// call after it is denied again; every step is a line of the log.
TEST_F(EscalationTest, AOnceGrantServesTheNextCallOnly) {
  StartWith("echo once\n");
  const std::string offer = DeniedOffer(target_);
  ASSERT_FALSE(offer.empty());

  Answer asked = Ask(offer);
  ASSERT_EQ(asked.status, 200) << asked.text;
  EXPECT_EQ(asked.body.value("state", ""), "granted") << asked.text;
  EXPECT_EQ(asked.body.value("decision", ""), "once") << asked.text;
  EXPECT_TRUE(asked.body.value("asked", false)) << asked.text;
  EXPECT_TRUE(Contains(asked.body.value("decided_by", ""), "approve-command")) << asked.text;
  EXPECT_EQ(Asked(asked_log_), 1);
  // The approver saw the grant and the agent's reason.
  auto seen = e2e::ReadFile(asked_log_);
  ASSERT_TRUE(seen.has_value());
  EXPECT_TRUE(Contains(*seen, target_)) << *seen;
  EXPECT_TRUE(Contains(*seen, "the build fetches its dependencies")) << *seen;

  json granted = Fetch(target_);
  EXPECT_EQ(granted.value("output", ""), "ok") << granted.dump();
  ASSERT_TRUE(granted.contains("grants")) << granted.dump();
  EXPECT_EQ(granted["grants"][0].value("escalation", ""), asked.body.value("id", "")) << granted.dump();
  EXPECT_EQ(granted["grants"][0].value("applied", ""), "live") << granted.dump();

  json again = Fetch(target_);
  EXPECT_EQ(again.value("kind", ""), "sandbox_denied") << again.dump();

  // The audit: offers, the request, the decision, the grant, its use and end.
  e2e::Command cmd;
  cmd.argv = {e2e::AgentboxBin(), "session", "--socket", d_.socket(), "log", id_, "--grants"};
  cmd.env = d_.Env();
  cmd.timeout_ms = 30000;
  e2e::RunResult log = e2e::RunCommand(cmd);
  ASSERT_EQ(log.status, 0) << log.Describe();
  for (const char* word : {"offered", "requested", "decided", "granted", "used", "expired"}) {
    EXPECT_TRUE(Contains(log.out, std::string(word) + " ")) << word << " missing from:\n" << log.out;
  }
  EXPECT_TRUE(Contains(log.out, offer)) << log.out;
}

// A session grant lasts: every later call reaches the host, with the world
// that was running (same sandbox pid).
TEST_F(EscalationTest, ASessionGrantLastsAndIsLive) {
  StartWith("echo session\n");
  const std::string offer = DeniedOffer(target_);
  Answer asked = Ask(offer);
  ASSERT_EQ(asked.status, 200) << asked.text;
  EXPECT_EQ(asked.body.value("decision", ""), "session") << asked.text;
  EXPECT_EQ(asked.body.value("applied", ""), "live") << asked.text;
  for (int i = 0; i < 3; ++i) {
    json r = Fetch(target_);
    EXPECT_EQ(r.value("output", ""), "ok") << i << ": " << r.dump();
  }
  // One world all along: provisioned once, never again.
  EXPECT_EQ(Worlds(), 1) << "the grant restarted the world";
}

// Beyond the ceiling nobody is asked: the approver never runs.
TEST_F(EscalationTest, BeyondTheCeilingIsRefusedWithoutAsking) {
  StartWith("echo once\n");
  Upstream other("127.0.0.3");
  ASSERT_GT(other.port(), 0);
  const std::string offer = DeniedOffer("127.0.0.3:" + std::to_string(other.port()), /*within=*/false);
  Answer asked = Ask(offer);
  ASSERT_EQ(asked.status, 200) << asked.text;
  EXPECT_EQ(asked.body.value("state", ""), "denied") << asked.text;
  EXPECT_EQ(asked.body.value("decided_by", ""), "ceiling") << asked.text;
  EXPECT_FALSE(asked.body.value("asked", true)) << asked.text;
  EXPECT_TRUE(Contains(asked.body.value("decision_reason", ""), "max_grant")) << asked.text;
  EXPECT_EQ(Asked(asked_log_), 0) << "the approver was asked for a grant beyond the ceiling";

  // An offer the session never made is no offer: 404, nobody asked.
  Answer made_up = Ask("esc-000000000000");
  EXPECT_EQ(made_up.status, 404) << made_up.text;
  // A credential path through PATCH: beyond, whatever max_grant says.
  Answer ssh = Call(c(), "PATCH", "/v1/sessions/" + id_ + "/policy",
                    {{"policy", "filesystem:\n  read_only: [\"~/.ssh\"]\n"}});
  EXPECT_EQ(ssh.status, 400) << ssh.text;
  EXPECT_TRUE(Contains(ssh.message(), ".ssh")) << ssh.text;
  // The sandbox itself: no grant turns a session into danger-full-access.
  Answer full = Call(c(), "PATCH", "/v1/sessions/" + id_ + "/policy", {{"policy", "mode: danger-full-access\n"}});
  EXPECT_EQ(full.status, 400) << full.text;
  EXPECT_TRUE(Contains(full.message(), "mode")) << full.text;
  EXPECT_EQ(Asked(asked_log_), 0);
  // And the session still runs confined: the denied host is still denied.
  EXPECT_EQ(Fetch(target_).value("kind", ""), "sandbox_denied");
}

// An approver that answers too late, crashes, or prints garbage: a deny,
// with what happened as its reason.
TEST_F(EscalationTest, AnApproverThatFailsIsADenyWithItsReason) {
  StartWith("case \"$line\" in *slow*) sleep 30;; esac\n"
            "if [ -e " + d_.root() + "/garbage ]; then echo 'perhaps tomorrow'; exit 0; fi\n"
            "exit 3\n",
            {"--approve-timeout", "2s"});
  const std::string offer = DeniedOffer(target_);
  Answer crashed = Ask(offer);
  ASSERT_EQ(crashed.status, 200) << crashed.text;
  EXPECT_EQ(crashed.body.value("state", ""), "denied") << crashed.text;
  EXPECT_TRUE(Contains(crashed.body.value("decision_reason", ""), "approve-command")) << crashed.text;
  EXPECT_TRUE(Contains(crashed.body.value("decision_reason", ""), "3")) << crashed.text;

  e2e::WriteFile(d_.root() + "/garbage", "");
  Answer garbage = Ask(offer);
  EXPECT_EQ(garbage.body.value("state", ""), "denied") << garbage.text;
  EXPECT_TRUE(Contains(garbage.body.value("decision_reason", ""), "perhaps tomorrow")) << garbage.text;
  // Still denied: no grant was made.
  EXPECT_EQ(Fetch(target_).value("kind", ""), "sandbox_denied");

  Answer slow = Call(c(), "POST", "/v1/sessions/" + id_ + "/escalations",
                     {{"offer_id", offer}, {"reason", "slow please"}});
  EXPECT_EQ(slow.body.value("state", ""), "denied") << slow.text;
  EXPECT_TRUE(Contains(slow.body.value("decision_reason", ""), "did not answer within")) << slow.text;
  // Every decision is on record.
  Answer list = Call(c(), "GET", "/v1/sessions/" + id_ + "/escalations");
  ASSERT_EQ(list.status, 200) << list.text;
  EXPECT_EQ(list.body["escalations"].size(), 3u) << list.text;
}

// Through the API: a pending request is on the stream, a person decides,
// the requester gets the decision. Unanswered, it is denied at the timeout.
TEST_F(EscalationTest, TheApiDecidesAndSilenceIsADeny) {
  StartWithApi("3s");
  const std::string offer = DeniedOffer(target_);
  Answer unanswered = Ask(offer);
  ASSERT_EQ(unanswered.status, 200) << unanswered.text;
  EXPECT_EQ(unanswered.body.value("state", ""), "denied") << unanswered.text;
  EXPECT_EQ(unanswered.body.value("decided_by", ""), "timeout") << unanswered.text;

  Answer answer;
  std::thread requester([&] {
    daemon::Client own(d_.endpoint());
    answer = Call(own, "POST", "/v1/sessions/" + id_ + "/escalations", {{"offer_id", offer}, {"reason", "r"}});
  });
  // The pending one, as a UI finds it.
  std::string eid;
  for (int i = 0; i < 50 && eid.empty(); ++i) {
    Answer list = Call(c(), "GET", "/v1/sessions/" + id_ + "/escalations");
    for (const json& e : list.body.value("escalations", json::array())) {
      if (e.value("state", "") == "pending") eid = e.value("id", "");
    }
    if (eid.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(eid.empty());
  Answer decided = Call(c(), "POST", "/v1/sessions/" + id_ + "/escalations/" + eid + "/decision",
                        {{"decision", "session"}, {"by", "reviewer@example"}});
  requester.join();
  EXPECT_EQ(decided.status, 200) << decided.text;
  EXPECT_EQ(answer.body.value("state", ""), "granted") << answer.text;
  EXPECT_EQ(answer.body.value("decision", ""), "session") << answer.text;
  EXPECT_TRUE(Contains(answer.body.value("decided_by", ""), "reviewer@example")) << answer.text;
  EXPECT_EQ(Fetch(target_).value("output", ""), "ok");
  // Decided once: a second decision is a conflict.
  Answer twice = Call(c(), "POST", "/v1/sessions/" + id_ + "/escalations/" + eid + "/decision", {{"decision", "deny"}});
  EXPECT_EQ(twice.status, 409) << twice.text;

  // The stream replays what happened, in order.
  // A stream does not end by itself: read it for a moment.
  std::string seen = RawExchange(d_.socket(), "GET /v1/escalations/stream HTTP/1.1\r\nHost: x\r\n\r\n", 1500);
  EXPECT_TRUE(Contains(seen, "\"pending\"")) << seen;
  EXPECT_TRUE(Contains(seen, "\"granted\"")) << seen;
}

// Concurrent requests: two offers decided apart (the approver answers by
// the grant), and two requests for one offer share one question.
TEST_F(EscalationTest, ConcurrentRequestsAreDecidedApart) {
  Upstream second;
  ASSERT_GT(second.port(), 0);
  const std::string second_target = "127.0.0.1:" + std::to_string(second.port());
  StartWith("sleep 1\ncase \"$line\" in *" + std::to_string(second.port()) + "*) echo deny;; *) echo session;; esac\n");
  const std::string first_offer = DeniedOffer(target_);
  const std::string second_offer = DeniedOffer(second_target);
  Answer a, b, a_again;
  std::thread ta([&] {
    daemon::Client own(d_.endpoint());
    a = Call(own, "POST", "/v1/sessions/" + id_ + "/escalations", {{"offer_id", first_offer}});
  });
  std::thread tb([&] {
    daemon::Client own(d_.endpoint());
    b = Call(own, "POST", "/v1/sessions/" + id_ + "/escalations", {{"offer_id", second_offer}});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::thread tc([&] {
    daemon::Client own(d_.endpoint());
    a_again = Call(own, "POST", "/v1/sessions/" + id_ + "/escalations", {{"offer_id", first_offer}});
  });
  ta.join();
  tb.join();
  tc.join();
  EXPECT_EQ(a.body.value("decision", ""), "session") << a.text;
  EXPECT_EQ(b.body.value("decision", ""), "deny") << b.text;
  EXPECT_EQ(a_again.body.value("id", ""), a.body.value("id", "")) << a_again.text;
  EXPECT_EQ(Asked(asked_log_), 2) << "the same pending offer was asked twice";
  EXPECT_EQ(Fetch(target_).value("output", ""), "ok");
  EXPECT_EQ(Fetch(second_target).value("kind", ""), "sandbox_denied");
}

// A replayed request (same request_id) returns the recorded decision,
// never a new one; a replayed call returns the grant it used.
TEST_F(EscalationTest, AReplayReturnsTheRecordedDecision) {
  StartWith("echo once\n");
  const std::string offer = DeniedOffer(target_);
  Answer first = Ask(offer, "req-1");
  ASSERT_EQ(first.body.value("decision", ""), "once") << first.text;
  e2e::WriteFile(approver_, "#!/bin/sh\necho deny\n", 0755);
  Answer replay = Ask(offer, "req-1");
  EXPECT_EQ(replay.body.value("decision", ""), "once") << replay.text;
  EXPECT_TRUE(replay.body.value("replayed", false)) << replay.text;
  EXPECT_EQ(replay.body.value("id", ""), first.body.value("id", "")) << replay.text;
  EXPECT_EQ(Asked(asked_log_), 1);

  json used = Fetch(target_, "call-1");
  EXPECT_EQ(used.value("output", ""), "ok") << used.dump();
  json replayed = Fetch(target_, "call-1");
  EXPECT_TRUE(replayed.value("replayed", false)) << replayed.dump();
  EXPECT_EQ(replayed["grants"], used["grants"]) << replayed.dump();
  // The once grant is spent: a new call is denied.
  EXPECT_EQ(Fetch(target_).value("kind", ""), "sandbox_denied");
}

// A denied read of a directory outside the sandbox → offer → approved for
// the session → readable (read-only) for the rest of it, in the same world:
// the directory is mounted into the running world's mount namespace from
// outside, below the ceiling's Landlock rule (same init, no new world).
TEST_F(EscalationTest, AMountGrantLastsForTheSessionInTheSameWorld) {
  char dir_template[] = "/var/tmp/agentbox-grant-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr) << "/var/tmp: " << std::strerror(errno);
  const std::string outside = dir_template;
  struct Cleanup {
    std::string path;
    ~Cleanup() { e2e::RemoveTree(path); }
  } cleanup{outside};
  chmod(outside.c_str(), 0755);
  e2e::WriteFile(outside + "/notes.txt", "from outside\n");

  WriteApprover("echo session\n");
  ASSERT_TRUE(d_.Start({"--approve-command", approver_})) << d_.error();
  const std::string policy = "version: 1\n"
                             "on_violation:\n  escalation: one_time_approval\n"
                             "  max_grant:\n    filesystem_read: [\"/var/tmp\"]\n";
  id_ = CreateSession(c(), ws_.path(), {{"policy", policy}});
  ASSERT_FALSE(id_.empty());

  json denied = Bash(c(), id_, "ls " + outside);
  ASSERT_NE(denied.value("exit_code", 0), 0) << denied.dump();
  EXPECT_EQ(denied.value("kind", ""), "sandbox_denied") << denied.dump();
  json offer = OfferOf(denied);
  ASSERT_TRUE(offer.is_object()) << denied.dump();
  EXPECT_EQ(offer["grant"], json({{"filesystem.read", outside}})) << offer.dump();
  EXPECT_TRUE(offer.value("within_ceiling", false)) << offer.dump();
  // The init's start time (field 22 of its stat) names it: pid 1 is pid 1
  // in every world.
  const std::string init_before = Bash(c(), id_, "cut -d' ' -f22 /proc/1/stat").value("output", "");
  ASSERT_FALSE(init_before.empty());
  // Something the session left running before the grant sees it too.
  Bash(c(), id_, "(sleep 60 & echo $! > /tmp/bg.pid)");

  Answer asked = Ask(offer.value("id", ""));
  ASSERT_EQ(asked.status, 200) << asked.text;
  EXPECT_EQ(asked.body.value("decision", ""), "session") << asked.text;
  EXPECT_EQ(asked.body.value("applied", ""), "live") << asked.text;

  for (int i = 0; i < 2; ++i) {
    json read = Bash(c(), id_, "cat " + outside + "/notes.txt");
    EXPECT_EQ(read.value("output", ""), "from outside\n") << i << ": " << read.dump();
    EXPECT_EQ(read.value("kind", ""), "exited") << read.dump();
  }
  // Read-only: the write fails, and nothing reaches the host.
  json write = Bash(c(), id_, "echo x > " + outside + "/new.txt");
  EXPECT_NE(write.value("exit_code", 0), 0) << "a read grant is read-only: " << write.dump();
  EXPECT_FALSE(e2e::Exists(outside + "/new.txt"));
  // A file the host adds later is there too: the grant is the tree, live.
  e2e::WriteFile(outside + "/later.txt", "added later\n");
  EXPECT_EQ(Bash(c(), id_, "cat " + outside + "/later.txt").value("output", ""), "added later\n");
  // A missing file below the grant is a missing file, not a denial.
  json missing = Bash(c(), id_, "cat " + outside + "/no-such-file");
  EXPECT_EQ(missing.value("kind", ""), "exited") << missing.dump();
  // Its siblings under the ceiling are still not there.
  json sibling = Bash(c(), id_, "ls /var/tmp");
  EXPECT_EQ(sibling.value("output", ""), outside.substr(std::string("/var/tmp/").size()) + "\n") << sibling.dump();
  // The same world: the same init, the process left running still runs,
  // and the log has one world.
  EXPECT_EQ(Bash(c(), id_, "cut -d' ' -f22 /proc/1/stat").value("output", ""), init_before);
  EXPECT_EQ(Bash(c(), id_, "test -d /proc/$(cat /tmp/bg.pid) && echo alive").value("output", ""), "alive\n");
  EXPECT_EQ(Worlds(), 1);
}

// A memory grant for the session is a write to the running world's cgroup:
// a call that was killed at the old limit runs under the new one, in the
// same world.
TEST_F(EscalationTest, AMemoryGrantRaisesTheLimitOfTheRunningWorld) {
  if (!host_facts::CgroupsExpected({"memory"})) {
    GTEST_SKIP() << "not applicable here: no writable cgroup with the memory controller for this user";
  }
  WriteApprover("echo session\n");
  ASSERT_TRUE(d_.Start({"--approve-command", approver_})) << d_.error();
  id_ = CreateSession(c(), ws_.path(),
                      {{"policy", "version: 1\nresources:\n  memory_gib: { limit: 256Mi }\n"
                                  "on_violation:\n  escalation: one_time_approval\n  max_grant:\n    memory_gib: 1\n"}});
  ASSERT_FALSE(id_.empty());
  const std::string hog =
      "python3 -c 'b = bytearray(400 << 20); b[::4096] = b\"x\" * len(b[::4096]); print(\"held\")'";
  json killed = Bash(c(), id_, hog);
  ASSERT_EQ(killed.value("kind", ""), "oom_killed") << killed.dump();
  json offer = OfferOf(killed);
  ASSERT_TRUE(offer.is_object()) << killed.dump();
  EXPECT_EQ(offer["grant"], json({{"resources.memory_gib", 1}})) << offer.dump();
  const std::string init_before = Bash(c(), id_, "cut -d' ' -f22 /proc/1/stat").value("output", "");

  Answer asked = Ask(offer.value("id", ""));
  ASSERT_EQ(asked.status, 200) << asked.text;
  EXPECT_EQ(asked.body.value("applied", ""), "live") << asked.text;
  json held = Bash(c(), id_, hog);
  EXPECT_EQ(held.value("output", ""), "held\n") << held.dump();
  EXPECT_EQ(Bash(c(), id_, "cut -d' ' -f22 /proc/1/stat").value("output", ""), init_before);
  EXPECT_EQ(Worlds(), 1);
}

// A syscall grant needs a new world (a seccomp filter is never loosened in
// place): the once grant gets one for its call, and the call after it is
// back in a world without it.
TEST_F(EscalationTest, ASyscallGrantGetsAWorldOfItsOwnForItsCall) {
  WriteApprover("echo once\n");
  ASSERT_TRUE(d_.Start({"--approve-command", approver_})) << d_.error();
  id_ = CreateSession(c(), ws_.path(),
                      {{"policy", "version: 1\non_violation:\n  escalation: one_time_approval\n"
                                  "  max_grant:\n    syscalls: [ptrace]\n"}});
  ASSERT_FALSE(id_.empty());
  const std::string traceme =
      "python3 -c \"import ctypes, sys; l = ctypes.CDLL(None, use_errno=True); r = l.ptrace(0, 0, 0, 0); "
      "print(r, ctypes.get_errno()); sys.exit(0 if r == 0 else 1)\"";
  json denied = Bash(c(), id_, traceme);
  EXPECT_EQ(denied.value("kind", ""), "sandbox_denied") << denied.dump();
  json offer = OfferOf(denied);
  ASSERT_TRUE(offer.is_object()) << denied.dump();
  EXPECT_EQ(offer["grant"], json({{"syscalls.allow", "ptrace"}})) << offer.dump();
  Answer asked = Ask(offer.value("id", ""));
  ASSERT_EQ(asked.body.value("decision", ""), "once") << asked.text;
  json granted = Bash(c(), id_, traceme);
  EXPECT_EQ(granted.value("exit_code", -1), 0) << granted.dump();
  ASSERT_TRUE(granted.contains("grants")) << granted.dump();
  EXPECT_EQ(granted["grants"][0].value("applied", ""), "new_world") << granted.dump();
  json after = Bash(c(), id_, traceme);
  EXPECT_EQ(after.value("kind", ""), "sandbox_denied") << after.dump();
}

// PATCH widens within the ceiling, and only within it.
TEST_F(EscalationTest, APatchWidensWithinTheCeiling) {
  StartWith("echo deny\n");
  EXPECT_EQ(Fetch(target_).value("kind", ""), "sandbox_denied");
  Answer widen = Call(c(), "PATCH", "/v1/sessions/" + id_ + "/policy",
                      {{"policy", "network:\n  allow: [\"127.0.0.2:9\", \"" + target_ + "\"]\n"}, {"by", "ops"}});
  ASSERT_EQ(widen.status, 200) << widen.text;
  EXPECT_EQ(widen.body.value("applied", ""), "live") << widen.text;
  EXPECT_EQ(Fetch(target_).value("output", ""), "ok");
  Answer beyond = Call(c(), "PATCH", "/v1/sessions/" + id_ + "/policy",
                       {{"policy", "network:\n  allow: [\"127.0.0.3:80\"]\n"}});
  EXPECT_EQ(beyond.status, 400) << beyond.text;
  EXPECT_TRUE(Contains(beyond.message(), "127.0.0.3:80")) << beyond.text;
  EXPECT_EQ(Asked(asked_log_), 0) << "a PATCH asks no approver";
}

}  // namespace
}  // namespace agentbox::session_test
