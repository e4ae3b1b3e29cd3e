// Landlock: the only place that calls the three Landlock syscalls. (Not
// named landlock.h: that would shadow <linux/landlock.h>.)
#pragma once

#include <string>
#include <vector>

#include "agentbox/plan.h"
#include "agentbox/status.h"
#include "linux/fd.h"

namespace agentbox::linux {

// The kernel's Landlock ABI version; 0 when Landlock is unavailable.
int LandlockAbiVersion();

// What landlock_restrict_self left in force, against what the plan asked.
struct LandlockOutcome {
  int abi = 0;                     // the ABI the kernel offered
  bool enforced = false;           // a domain is in force
  std::vector<std::string> short_of_plan;  // rights or scopes the plan wanted and did not get
};

// Builds the ruleset and restricts the calling thread (and all it starts)
// to it. Irreversible. Needs no_new_privs (or CAP_SYS_ADMIN). Called in the
// runner after the root is final: rules name paths inside the sandbox.
// Besides the plan's rules, stdio that is a file or device outside those
// rules stays reopenable (/dev/stdout on a host terminal or a report file).
[[nodiscard]] Result<LandlockOutcome> ApplyLandlock(const LandlockPlan& plan);

// A ruleset that scopes signals and nothing else (ABI 6 and later; an
// invalid fd below that). A process that restricts itself to it can no
// longer signal any process outside its new, nested domain: the runner
// above it included.
[[nodiscard]] Result<UniqueFd> SignalScopeRuleset();
// A ruleset for a call with no network at all (a run_code program): TCP
// bind and connect handled with no port allowed (ABI 4 and later), and from
// ABI 6 signals and abstract unix sockets scoped to the new domain, as
// SignalScopeRuleset does. An invalid fd below ABI 4; the seccomp side
// (NoNetworkFilter) refuses socket() whatever the ABI.
[[nodiscard]] Result<UniqueFd> NoNetworkRuleset();
// landlock_restrict_self(ruleset): syscalls only, for a vfork child.
int RestrictSelfTo(int ruleset);

}  // namespace agentbox::linux
