// Escalation offers (on_violation.escalation: one_time_approval): for one
// denial, the grant that would have allowed it, held against the policy's
// ceiling (on_violation.max_grant). Pure but for `PathExists`, which the
// caller supplies. Asking and deciding are the session's (session.h
// RequestEscalation) and `run --on-denial ask`'s; ApplyGrant writes an
// approved grant into a policy.
//
// A grant is scoped to what was denied, never wider: a network grant is the
// host:port as denied; a read grant the path as denied; a read_write grant
// the path as denied, or, for a write that creates a path, its nearest
// existing parent directory; a memory grant twice the limit in force,
// rounded up to a whole GiB and capped at max_grant.memory_gib.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "agentbox/outcome.h"
#include "agentbox/plan.h"
#include "agentbox/policy.h"
#include "agentbox/status.h"

namespace agentbox {

// Whether `path` (absolute, inside the sandbox) exists.
using PathExists = std::function<bool(const std::string& path)>;

// The offer for `denial` under `plan`, or nothing: escalation is `deny`, or
// no grant could lift the denial (a protected path, set-id bits, a unix
// socket, an argument-filtered syscall, an L7 rule, a full disk, memory
// already at the ceiling). A grant that exists but lies beyond the ceiling
// (a path under filesystem.deny, a syscall that is never granted, a host
// max_grant.network does not cover) is offered with within_ceiling false
// and why_not saying what puts it beyond.
std::optional<EscalationOffer> OfferFor(const Denial& denial, const Plan& plan, const PathExists& exists);

// An offer for the grant `key: text` (or `key: gib`): its id and canonical
// JSON; within_ceiling false, no why_not.
EscalationOffer MakeOffer(const std::string& key, const std::string& text, std::optional<std::uint64_t> gib);

// The reason of a denial of a path below an on_violation.max_grant tree
// that the sandbox does not mount.
inline constexpr const char* kNotMountedReason =
    "access to a path the sandbox does not mount (within on_violation.max_grant: a grant can mount it)";

// Sets every denial's offer (OfferFor) when the plan offers them; paths are
// looked up on the host, those in the workspace at its source. A
// kNotMountedReason denial of a path that does not exist on the host, or
// that lies in a tree the sandbox mounts, is dropped: that is a missing
// file, not a denial.
void AttachOffers(const Plan& plan, std::vector<Denial>* denials);

// Widens `policy` by one approved grant: network.allow gains the host:port,
// filesystem.read_only (filesystem.read) or filesystem.read_write the path,
// granted.syscalls the name, resources.memory_limit_bytes becomes the GiB.
// An entry already there is not added twice. Checks nothing against the
// ceiling (OfferFor did): a key it does not know, or a grant without its
// value, is an error naming it.
Status ApplyGrant(const EscalationOffer& grant, Policy* policy);

// The offer a grant's JSON ({"network.allow": "host:443"}) stands for
// (MakeOffer): an error for anything but one known key with its value.
Result<EscalationOffer> OfferFromGrant(const std::string& grant_json);

}  // namespace agentbox
