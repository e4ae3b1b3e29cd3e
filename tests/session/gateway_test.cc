// The tool gateway through the daemon's API: an upstream's tools by
// NAME.TOOL over execute, and an upstream that leaves a process holding its
// output (in a session of its own, out of reach of its group's kill) can
// neither wedge the removal of its session nor hide its own crash.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>

#include "daemon_fixture.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;
using e2e::TempDir;
using Clock = std::chrono::steady_clock;

class GatewayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "not applicable here: python3 is not installed";
    ASSERT_TRUE(d_.Start()) << d_.error();
  }
  void TearDown() override {
    // The orphans, by the pids they wrote.
    std::ifstream f(pidfile_);
    pid_t pid = 0;
    while (f >> pid) {
      if (pid > 0) kill(pid, SIGKILL);
    }
  }
  daemon::Client& c() { return d_.client(); }
  std::string Create(const std::string& timeout) {
    const std::string policy = "version: 1\ntools:\n  upstream:\n    - name: fixture\n      command: [python3, \"" +
                               std::string(AGENTBOX_FIXTURES) + "/mcp_upstream.py\", --orphan, \"" + pidfile_ +
                               "\"]\n      allow: [echo, crash]\n      timeout: " + timeout + "\n";
    return CreateSession(c(), ws_.path(), {{"policy", policy}});
  }
  // Whether the orphan the server started is alive.
  bool OrphanAlive() {
    std::ifstream f(pidfile_);
    pid_t pid = 0;
    return f >> pid && pid > 0 && kill(pid, 0) == 0;
  }
  static long Ms(Clock::time_point since) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since).count();
  }

  TempDir ws_{"agentbox-gateway-ws-"};
  TempDir tmp_{"agentbox-gateway-"};
  std::string pidfile_ = tmp_ / "orphan.pid";
  Daemon d_;
};

TEST_F(GatewayTest, RemovingASessionReturnsThoughItsUpstreamLeftAProcessHoldingItsOutput) {
  const std::string id = Create("30s");
  json r = Execute(c(), id, "fixture.echo", {{"text", "hello"}});
  ASSERT_EQ(r.value("output", ""), "hello") << r.dump(2);
  ASSERT_TRUE(OrphanAlive()) << "the fixture's orphan did not start: the test would prove nothing";
  const auto t0 = Clock::now();
  Answer removed = Call(c(), "DELETE", "/v1/sessions/" + id);
  EXPECT_EQ(removed.status, 204) << removed.text;
  EXPECT_LT(Ms(t0), 15000) << "the removal waited on the orphan's pipe";
  // The daemon serves on.
  EXPECT_EQ(Call(c(), "GET", "/v1/health").status, 200);
}

TEST_F(GatewayTest, ACrashIsNamedAtOnceAndTheNextCallStartsTheServerAgain) {
  const std::string id = Create("60s");
  ASSERT_EQ(Execute(c(), id, "fixture.echo", {{"text", "one"}}).value("output", ""), "one");
  ASSERT_TRUE(OrphanAlive());
  const auto t0 = Clock::now();
  json crashed = Execute(c(), id, "fixture.crash", json::object());
  EXPECT_EQ(crashed.value("kind", ""), "tool_error") << crashed.dump(2);
  EXPECT_TRUE(Contains(crashed.value("output", ""), "upstream fixture is gone")) << crashed.dump(2);
  EXPECT_TRUE(Contains(crashed.value("output", ""), "status 3")) << crashed.dump(2);
  EXPECT_LT(Ms(t0), 20000) << "the crash was seen only at the call's 60 s timeout";
  json again = Execute(c(), id, "fixture.echo", {{"text", "two"}});
  EXPECT_EQ(again.value("output", ""), "two") << again.dump(2);
}

// An upstream call made again with its call_id is answered from the log:
// the server is not asked (each start of the fixture adds a line to the
// pid file, so a crash call that ran twice would start it twice).
TEST_F(GatewayTest, AnUpstreamCallReplayedByItsCallIdIsNotMadeAgain) {
  const std::string id = Create("60s");
  auto starts = [&] {
    std::ifstream f(pidfile_);
    int n = 0;
    for (std::string line; std::getline(f, line);) n += !line.empty();
    return n;
  };
  json first = Execute(c(), id, "fixture.crash", json::object(), "crash-1");
  ASSERT_EQ(first.value("kind", ""), "tool_error") << first.dump(2);
  ASSERT_EQ(starts(), 1);
  json replayed = Execute(c(), id, "fixture.crash", json::object(), "crash-1");
  EXPECT_EQ(replayed.value("output", ""), first.value("output", "")) << replayed.dump(2);
  EXPECT_EQ(starts(), 1) << "the replayed call reached the upstream again";
  EXPECT_EQ(Execute(c(), id, "fixture.echo", {{"text", "fresh"}}).value("output", ""), "fresh");
  EXPECT_EQ(starts(), 2);
}

}  // namespace
}  // namespace agentbox::session_test
