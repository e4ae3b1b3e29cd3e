#include "supervise/escalation_round.h"

#include <set>

#include "confine/escalation.h"
#include "report/report_json.h"

namespace agentbox::supervise {

using nlohmann::json;

namespace {

json GrantJson(const EscalationOffer& offer) {
  json grant = json::parse(offer.grant_json, nullptr, false);
  return grant.is_discarded() ? json(offer.grant_json) : grant;
}

std::string DenialText(const Denial& d) {
  std::string text = d.op + " " + d.target;
  if (!d.reason.empty()) text += ": " + d.reason;
  return text;
}

}  // namespace

std::vector<EscalationRecord> DecideOffers(const std::vector<Denial>& denials, const Approve& approve) {
  std::vector<EscalationRecord> records;
  std::set<std::string> seen;
  for (const Denial& d : denials) {
    if (!d.escalation || !seen.insert(d.escalation->id).second) continue;
    EscalationRecord r;
    r.offer = *d.escalation;
    r.denial = DenialText(d);
    if (!r.offer.within_ceiling) {
      r.decision = {ApprovalAnswer::kDeny, "", "beyond the ceiling, not asked: " + r.offer.why_not};
      records.push_back(std::move(r));
      continue;
    }
    r.asked = true;
    r.decision = approve(ApprovalRequest{"", r.offer.id, "", r.denial, GrantJson(r.offer)});
    if (r.decision.answer == ApprovalAnswer::kSession) {
      r.decision.answer = ApprovalAnswer::kOnce;
      const std::string note = "answered session; a run has no session, so once: for the one re-run";
      r.decision.reason = r.decision.reason.empty() ? note : note + " (" + r.decision.reason + ")";
    }
    records.push_back(std::move(r));
  }
  return records;
}

int ApplyApproved(std::vector<EscalationRecord>* records, Policy* policy) {
  int applied = 0;
  for (EscalationRecord& r : *records) {
    if (r.decision.answer != ApprovalAnswer::kOnce) continue;
    if (Status s = ApplyGrant(r.offer, policy); !s.ok()) {
      r.decision.answer = ApprovalAnswer::kDeny;
      r.decision.reason = "approved, but the grant could not be applied: " + s.message();
      continue;
    }
    r.applied = true;
    ++applied;
  }
  return applied;
}

json EscalationsJson(const std::vector<EscalationRecord>& records) {
  json out = json::array();
  for (const EscalationRecord& r : records) {
    json j = {{"offer_id", r.offer.id},
              {"grant", GrantJson(r.offer)},
              {"within_ceiling", r.offer.within_ceiling},
              {"denial", r.denial},
              {"asked", r.asked},
              {"decision", AnswerName(r.decision.answer)},
              {"decided_by", r.decision.by.empty() ? json(nullptr) : json(r.decision.by)},
              {"reason", r.decision.reason},
              {"applied", r.applied}};
    out.push_back(std::move(j));
  }
  return out;
}

json FirstAttemptJson(const Outcome& first) {
  json denials = json::array();
  for (const Denial& d : first.denials) denials.push_back(ToJsonValue(d));
  return {{"outcome", ToString(first.kind)},
          {"exit_code", first.exit_code ? json(*first.exit_code) : json(nullptr)},
          {"signal", first.signal ? json(*first.signal) : json(nullptr)},
          {"exit_status", first.ExitStatus()},
          {"denials", denials},
          {"policy_sha256", first.policy_sha256}};
}

}  // namespace agentbox::supervise
