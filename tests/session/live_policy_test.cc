// PATCH /v1/sessions/{id}/policy: a running session's network tightened
// live. The removed host is refused from the next connection on, and a
// tunnel open to it through the proxy is closed before the answer.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "daemon_fixture.h"
#include "upstream.h"
#include "linux/fd.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;
using e2e::TempDir;

// Inside: a CONNECT tunnel through the session's proxy to 127.0.0.1:PORT,
// held until the far end closes it.
const char kHolder[] =
    "import os, socket, sys, urllib.parse\n"
    "p = urllib.parse.urlparse(os.environ['HTTP_PROXY'])\n"
    "s = socket.create_connection((p.hostname, p.port))\n"
    "s.sendall(b'CONNECT 127.0.0.1:' + sys.argv[1].encode() + b' HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n')\n"
    "head = s.recv(4096)\n"
    "print('head', head.split(b'\\r\\n')[0].decode(), flush=True)\n"
    "s.sendall(b'hold\\n')\n"
    "while s.recv(4096): pass\n"
    "print('closed', flush=True)\n";

class LivePolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(up_.port(), 0);
    ASSERT_TRUE(d_.Start()) << d_.error();
    target_ = "127.0.0.1:" + std::to_string(up_.port());
    id_ = CreateSession(c(), ws_.path(),
                        {{"policy", "version: 1\nnetwork:\n  allow: [\"" + target_ + "\", \"127.0.0.2:9\"]\n"}});
    ASSERT_FALSE(id_.empty());
  }
  daemon::Client& c() { return d_.client(); }
  Answer Patch(const std::string& yaml, const std::string& by = "") {
    json body = {{"policy", yaml}};
    if (!by.empty()) body["by"] = by;
    return Call(c(), "PATCH", "/v1/sessions/" + id_ + "/policy", body);
  }
  json Fetch() {
    return Bash(c(), id_, "NO_PROXY= no_proxy= curl -fsS --max-time 10 http://" + target_ + "/");
  }

  Upstream up_;
  TempDir ws_{"agentbox-live-policy-ws-"};
  Daemon d_;
  std::string id_, target_;
};

TEST_F(LivePolicyTest, RemovingAHostClosesItsTunnelAndRefusesItFromThenOn) {
  json before = Fetch();
  ASSERT_EQ(before.value("output", ""), "ok") << before.dump();
  json written = Bash(c(), id_, std::string("cat > /tmp/holder.py <<'EOF'\n") + kHolder + "EOF\n");
  ASSERT_EQ(written.value("exit_code", -1), 0) << written.dump();
  json started = Bash(c(), id_, "python3 /tmp/holder.py " + std::to_string(up_.port()) + " > holder.out 2>&1 &");
  ASSERT_EQ(started.value("exit_code", -1), 0) << started.dump();
  for (int i = 0; i < 100 && up_.held() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(up_.held(), 1) << "the tunnel did not reach the upstream: "
                           << Bash(c(), id_, "cat holder.out").value("output", "");

  Answer patched = Patch("network:\n  allow: [\"127.0.0.2:9\"]\n", "reviewer@example");
  ASSERT_EQ(patched.status, 200) << patched.text;
  EXPECT_EQ(patched.body.value("applied", ""), "live") << patched.text;
  // Closed before the answer came (the proxy ends it on the rules' thread);
  // the far end sees it within moments.
  for (int i = 0; i < 50 && up_.closed() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(up_.closed(), 1) << "the open tunnel to the removed host was not closed";
  json holder;
  for (int i = 0; i < 50; ++i) {
    holder = Bash(c(), id_, "cat holder.out");
    if (Contains(holder.value("output", ""), "closed")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(Contains(holder.value("output", ""), "closed")) << holder.dump();

  json after = Fetch();
  EXPECT_EQ(after.value("kind", ""), "sandbox_denied") << after.dump();
  EXPECT_TRUE(Contains(after.value("output", ""), target_)) << after.dump();

  auto log = c().Call("GET", "/v1/sessions/" + id_ + "/log");
  ASSERT_TRUE(log.ok());
  EXPECT_TRUE(Contains(log->body, "\"policy_changed\"")) << log->body;
  EXPECT_TRUE(Contains(log->body, "reviewer@example")) << log->body;
}

TEST_F(LivePolicyTest, WideningAndOtherKeysAreRefusedNamingThem) {
  Answer widen = Patch("network:\n  allow: [\"" + target_ + "\", \"127.0.0.2:9\", \"127.0.0.3:80\"]\n");
  EXPECT_EQ(widen.status, 400) << widen.text;
  EXPECT_TRUE(Contains(widen.message(), "127.0.0.3:80")) << widen.text;
  Answer deny_less = Patch("network:\n  deny: []\n  allow: [\"127.0.0.2:9\"]\n");
  EXPECT_EQ(deny_less.status, 200) << deny_less.text << " (the session had no deny entries to lose)";
  Answer other = Patch("resources:\n  memory_gib: 64\n");
  EXPECT_EQ(other.status, 400) << other.text;
  EXPECT_TRUE(Contains(other.message(), "resources")) << other.text;
  Answer empty = Patch("network: {}\n");
  EXPECT_EQ(empty.status, 400) << empty.text;
  Answer garbage = Patch("network: [unclosed\n");
  EXPECT_EQ(garbage.status, 400) << garbage.text;
  EXPECT_EQ(Call(c(), "PATCH", "/v1/sessions/s-nope/policy", {{"policy", "network:\n  allow: []\n"}}).status, 404);
}

// Before the first call there is no world: the change is in the session's
// recipe, and the world that starts has it.
TEST_F(LivePolicyTest, AChangeBeforeTheWorldStartsIsTheWorldsFromTheStart) {
  Answer patched = Patch("network:\n  deny: [\"" + target_ + "\"]\n");
  ASSERT_EQ(patched.status, 200) << patched.text;
  EXPECT_EQ(patched.body.value("applied", ""), "next_world") << patched.text;
  json r = Fetch();
  EXPECT_EQ(r.value("kind", ""), "sandbox_denied") << r.dump();
}

// A connection the connect() broker installed directly in the sandbox (no
// proxy in its path) is the sandbox's own socket: a tightening ends it too.
// The daemon runs in a network namespace of the test's, whose loopback also
// has 198.18.0.10 (a benchmarking address, reached only as an IP literal
// entry allows): the sandbox's own loopback has no such address, so its
// connect() to it goes through the broker.
class LivePolicyBrokerTest : public ::testing::Test {
 protected:
  static constexpr const char* kAddr = "198.18.0.10";
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "not applicable here: a network namespace of the test's own needs root";
    home_.reset(open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(home_.valid());
    ASSERT_EQ(unshare(CLONE_NEWNET), 0) << std::strerror(errno);
    in_netns_ = true;
    for (const std::string& cmd : {std::string("ip link set lo up"), std::string("ip addr add ") + kAddr + "/32 dev lo"}) {
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
    up_ = std::make_unique<Upstream>(kAddr);
    ASSERT_GT(up_->port(), 0);
    target_ = std::string(kAddr) + ":" + std::to_string(up_->port());
    ASSERT_TRUE(d_.Start()) << d_.error();
    // Back to the test's own network; the daemon and the upstream stay there.
    ASSERT_EQ(setns(home_.get(), CLONE_NEWNET), 0) << std::strerror(errno);
    in_netns_ = false;
    id_ = CreateSession(d_.client(), ws_.path(), {{"policy", "version: 1\nnetwork:\n  allow: [\"" + target_ + "\"]\n"}});
    ASSERT_FALSE(id_.empty());
  }
  void TearDown() override {
    if (in_netns_) (void)setns(home_.get(), CLONE_NEWNET);
  }

  linux::UniqueFd home_;
  bool in_netns_ = false;
  std::unique_ptr<Upstream> up_;
  TempDir ws_{"agentbox-live-policy-ws-"};
  Daemon d_;
  std::string id_, target_;
};

TEST_F(LivePolicyBrokerTest, RemovingAHostEndsADirectConnectionToIt) {
  const std::string holder = std::string("import socket\n") + "s = socket.create_connection(('" + kAddr + "', " +
                             std::to_string(up_->port()) + "))\n" +
                             "s.sendall(b'hold\\n'); print('connected', flush=True)\n"
                             "while s.recv(4096): pass\n"
                             "print('closed', flush=True)\n";
  json written = Bash(d_.client(), id_, "cat > /tmp/holder.py <<'EOF'\n" + holder + "EOF\n");
  ASSERT_EQ(written.value("exit_code", -1), 0) << written.dump();
  json started = Bash(d_.client(), id_, "python3 /tmp/holder.py > holder.out 2>&1 &");
  ASSERT_EQ(started.value("exit_code", -1), 0) << started.dump();
  for (int i = 0; i < 100 && up_->held() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(up_->held(), 1) << "the direct connection did not reach the upstream: "
                            << Bash(d_.client(), id_, "cat holder.out").value("output", "");
  Answer patched = Call(d_.client(), "PATCH", "/v1/sessions/" + id_ + "/policy",
                        {{"policy", "network:\n  allow: []\n"}, {"by", "test"}});
  ASSERT_EQ(patched.status, 200) << patched.text;
  EXPECT_EQ(patched.body.value("applied", ""), "live") << patched.text;
  for (int i = 0; i < 50 && up_->closed() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(up_->closed(), 1) << "the direct connection to the removed host was not ended";
  json holder_out;
  for (int i = 0; i < 50; ++i) {
    holder_out = Bash(d_.client(), id_, "cat holder.out");
    if (Contains(holder_out.value("output", ""), "closed")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(Contains(holder_out.value("output", ""), "closed")) << holder_out.dump();
  json again = Bash(d_.client(), id_, "python3 -c \"import socket; socket.create_connection(('" + std::string(kAddr) +
                                          "', " + std::to_string(up_->port()) + "))\"");
  EXPECT_EQ(again.value("kind", ""), "sandbox_denied") << again.dump();
}

}  // namespace
}  // namespace agentbox::session_test
