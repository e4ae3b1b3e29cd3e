// `agentbox serve --approve-command PROG --approve-timeout DURATION`: the
// flags are checked before anything listens, and the daemon logs whom it
// will ask.
#include <gtest/gtest.h>

#include "daemon_fixture.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;

TEST(DaemonApprover, ABadApproveTimeoutIsRefusedNamingTheFlag) {
  Daemon d;
  for (const char* bad : {"0", "0s", "soon"}) {
    EXPECT_GT(d.StartExpectingFailure({"--approve-timeout", bad}), 0) << bad;
    EXPECT_TRUE(Contains(d.error(), "--approve-timeout")) << d.error();
    EXPECT_TRUE(Contains(d.error(), bad)) << d.error();
    EXPECT_FALSE(e2e::Exists(d.socket())) << "it listened before refusing " << bad;
  }
}

TEST(DaemonApprover, AnApproveCommandThatIsNoProgramIsRefused) {
  Daemon d;
  const std::string missing = d.root() + "/no-such-approver";
  EXPECT_GT(d.StartExpectingFailure({"--approve-command", missing}), 0);
  EXPECT_TRUE(Contains(d.error(), "--approve-command")) << d.error();
  EXPECT_TRUE(Contains(d.error(), missing)) << d.error();
  EXPECT_TRUE(Contains(d.error(), "No such file")) << d.error();

  const std::string plain = d.root() + "/not-executable";
  e2e::WriteFile(plain, "#!/bin/sh\necho once\n");
  EXPECT_GT(d.StartExpectingFailure({"--approve-command", plain}), 0);
  EXPECT_TRUE(Contains(d.error(), plain)) << d.error();
  EXPECT_TRUE(Contains(d.error(), "Permission denied")) << d.error();
  EXPECT_FALSE(e2e::Exists(d.socket()));
}

TEST(DaemonApprover, TheApproverIsLoggedAtStart) {
  Daemon d;
  const std::string approver = d.root() + "/approver";
  e2e::WriteFile(approver, "#!/bin/sh\necho deny\n", 0755);
  ASSERT_TRUE(d.Start({"--approve-command", approver, "--approve-timeout", "90s"})) << d.error();
  const json event = d.LogEvent("approver");
  ASSERT_FALSE(event.is_null()) << d.output();
  EXPECT_EQ(event["command"], approver);
  EXPECT_EQ(event["timeout_ms"], 90000);
}

TEST(DaemonApprover, WithoutAnApproveCommandNoOneIsAsked) {
  Daemon d;
  ASSERT_TRUE(d.Start()) << d.error();
  const json event = d.LogEvent("approver");
  ASSERT_FALSE(event.is_null()) << d.output();
  EXPECT_TRUE(event["command"].is_null()) << event;
  EXPECT_EQ(event["timeout_ms"], 60000);
}

}  // namespace
}  // namespace agentbox::session_test
