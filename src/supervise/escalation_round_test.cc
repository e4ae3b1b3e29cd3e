#include "supervise/escalation_round.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "agentbox/policy.h"
#include "confine/escalation.h"

namespace agentbox::supervise {
namespace {

using nlohmann::json;

Denial NetworkDenial(const std::string& target, bool within) {
  Denial d{"network", "connect", target, "not-allowed: " + target + " is not in network.allow", "proxy", 1, {}};
  d.escalation = MakeOffer("network.allow", target, std::nullopt);
  d.escalation->within_ceiling = within;
  if (!within) d.escalation->why_not = "on_violation.max_grant.network does not cover " + target;
  return d;
}

// An approver that answers `answer` and records what it was asked.
struct FakeApprover {
  ApprovalAnswer answer = ApprovalAnswer::kOnce;
  std::vector<ApprovalRequest> asked;
  Approve Get() {
    return [this](const ApprovalRequest& r) {
      asked.push_back(r);
      return ApprovalDecision{answer, "approve-command /fake", answer == ApprovalAnswer::kDeny ? "no" : ""};
    };
  }
};

TEST(EscalationRound, EachOfferIsDecidedOnceAndOnlyWithinTheCeiling) {
  FakeApprover approver;
  const std::vector<Denial> denials = {NetworkDenial("a.test:443", true), NetworkDenial("a.test:443", true),
                                       NetworkDenial("evil.test:443", false),
                                       {"filesystem", "write", "/etc/x", "read-only", "stderr-signature", 0, {}}};
  auto records = DecideOffers(denials, approver.Get());
  ASSERT_EQ(records.size(), 2u);
  ASSERT_EQ(approver.asked.size(), 1u) << "the same offer twice is asked once; beyond the ceiling never";
  EXPECT_EQ(approver.asked[0].offer_id, denials[0].escalation->id);
  EXPECT_EQ(approver.asked[0].grant, json({{"network.allow", "a.test:443"}}));
  EXPECT_EQ(approver.asked[0].reason, "connect a.test:443: not-allowed: a.test:443 is not in network.allow");
  EXPECT_EQ(approver.asked[0].session, "");

  EXPECT_TRUE(records[0].asked);
  EXPECT_EQ(records[0].decision.answer, ApprovalAnswer::kOnce);
  EXPECT_FALSE(records[1].asked);
  EXPECT_EQ(records[1].decision.answer, ApprovalAnswer::kDeny);
  EXPECT_EQ(records[1].decision.by, "");
  EXPECT_NE(records[1].decision.reason.find("does not cover evil.test:443"), std::string::npos);
}

TEST(EscalationRound, SessionIsOnceForARunAndSaysSo) {
  FakeApprover approver;
  approver.answer = ApprovalAnswer::kSession;
  auto records = DecideOffers({NetworkDenial("a.test:443", true)}, approver.Get());
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].decision.answer, ApprovalAnswer::kOnce);
  EXPECT_NE(records[0].decision.reason.find("a run has no session"), std::string::npos) << records[0].decision.reason;
}

TEST(EscalationRound, ApprovedGrantsWidenThePolicyAndNothingElse) {
  FakeApprover approver;
  auto records = DecideOffers({NetworkDenial("a.test:443", true), NetworkDenial("evil.test:443", false)}, approver.Get());
  Policy policy;
  EXPECT_EQ(ApplyApproved(&records, &policy), 1);
  EXPECT_EQ(policy.network.allow, std::vector<std::string>{"a.test:443"});
  EXPECT_TRUE(records[0].applied);
  EXPECT_FALSE(records[1].applied);

  approver.answer = ApprovalAnswer::kDeny;
  auto denied = DecideOffers({NetworkDenial("b.test:443", true)}, approver.Get());
  Policy untouched;
  EXPECT_EQ(ApplyApproved(&denied, &untouched), 0);
  EXPECT_TRUE(untouched.network.allow.empty());

  // A grant ApplyGrant refuses is a deny saying why.
  std::vector<EscalationRecord> broken(1);
  broken[0].offer = MakeOffer("network.allow", "", std::nullopt);
  broken[0].decision = {ApprovalAnswer::kOnce, "terminal", ""};
  EXPECT_EQ(ApplyApproved(&broken, &untouched), 0);
  EXPECT_EQ(broken[0].decision.answer, ApprovalAnswer::kDeny);
  EXPECT_NE(broken[0].decision.reason.find("could not be applied"), std::string::npos);
}

TEST(EscalationRound, TheReportListsEveryOfferAndDecision) {
  FakeApprover approver;
  auto records = DecideOffers({NetworkDenial("a.test:443", true), NetworkDenial("evil.test:443", false)}, approver.Get());
  Policy policy;
  (void)ApplyApproved(&records, &policy);
  const json j = EscalationsJson(records);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["offer_id"], records[0].offer.id);
  EXPECT_EQ(j[0]["grant"], json({{"network.allow", "a.test:443"}}));
  EXPECT_EQ(j[0]["within_ceiling"], true);
  EXPECT_EQ(j[0]["asked"], true);
  EXPECT_EQ(j[0]["decision"], "once");
  EXPECT_EQ(j[0]["decided_by"], "approve-command /fake");
  EXPECT_EQ(j[0]["applied"], true);
  EXPECT_EQ(j[1]["asked"], false);
  EXPECT_EQ(j[1]["decision"], "deny");
  EXPECT_TRUE(j[1]["decided_by"].is_null());

  Outcome first;
  first.kind = OutcomeKind::kSandboxDenied;
  first.exit_code = 22;
  first.denials = {NetworkDenial("a.test:443", true)};
  first.policy_sha256 = "abc";
  const json f = FirstAttemptJson(first);
  EXPECT_EQ(f["outcome"], "sandbox_denied");
  EXPECT_EQ(f["exit_code"], 22);
  EXPECT_EQ(f["exit_status"], first.ExitStatus());
  EXPECT_EQ(f["denials"][0]["escalation"]["id"], records[0].offer.id);
  EXPECT_EQ(f["policy_sha256"], "abc");
}

}  // namespace
}  // namespace agentbox::supervise
