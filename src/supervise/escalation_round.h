// `agentbox run --on-denial ask` (docs/report.md, "escalations"): once the
// command has ended, every offer its denials carry is decided, once per
// offer id, and the grants approved widen the policy for one re-run.
//
// An offer beyond the ceiling (within_ceiling false) is never put to the
// approver: it is recorded as refused, with its why_not. An offer within it
// is put to `approve` (the approver program or the terminal,
// supervise/approver.h); `session` counts as `once`, since a run has no
// session, and the record says so. Every offer, whether asked, and every
// decision lands in the report: the audit of what was granted and why.
//
// Pure but for what `approve` does; not thread-safe (one run, one thread).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agentbox/outcome.h"
#include "agentbox/policy.h"
#include "agentbox/status.h"
#include "supervise/approver.h"

namespace agentbox::supervise {

struct EscalationRecord {
  EscalationOffer offer;
  std::string denial;     // "connect 127.0.0.1:8080: not-allowed: ...", the first denial that carried it
  bool asked = false;     // false: beyond the ceiling, nobody was asked
  ApprovalDecision decision;  // kOnce or kDeny (kSession is recorded as kOnce)
  bool applied = false;   // the grant is in the re-run's policy
};

// Decides `request` (its session and call_id are empty for a run).
using Approve = std::function<ApprovalDecision(const ApprovalRequest& request)>;

// One record per distinct offer id among `denials`, in the order the
// denials list them; `approve` runs once for each offer within the ceiling.
std::vector<EscalationRecord> DecideOffers(const std::vector<Denial>& denials, const Approve& approve);

// Writes every approved grant into `policy` (ApplyGrant) and marks it
// applied; a grant ApplyGrant refuses becomes a deny whose reason says why.
// Returns how many were applied: 0 means there is nothing to run again.
int ApplyApproved(std::vector<EscalationRecord>* records, Policy* policy);

// The report's `escalations`: [{offer_id, grant, within_ceiling, denial,
// asked, decision, decided_by, reason, applied}].
nlohmann::json EscalationsJson(const std::vector<EscalationRecord>& records);

// The report's `first_attempt` for the attempt before a re-run: {outcome,
// exit_code, signal, exit_status, denials, policy_sha256}.
nlohmann::json FirstAttemptJson(const Outcome& first);

}  // namespace agentbox::supervise
