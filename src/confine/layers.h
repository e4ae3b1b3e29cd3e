// Planning of the two defence-in-depth layers stacked on the namespaces:
// Landlock (filesystem) and seccomp (syscalls). Pure, like the rest of
// confine/: the host's abilities come in as numbers, no kernel is asked.
#pragma once

#include <string>
#include <vector>

#include "agentbox/plan.h"

namespace agentbox {

// The newest Landlock ABI this version knows; the oldest it applies. ABI 1
// has no REFER right: every rename or link across directories would fail
// (EXDEV), which breaks git, so the layer starts at ABI 2.
inline constexpr int kNewestLandlockAbi = 7;
inline constexpr int kMinLandlockAbi = 2;

// What Landlock at `abi` cannot restrict that the newest ABI can, in words.
std::vector<std::string> LandlockLeftOut(int abi);

// Rules mirroring `plan.mounts` (which must be final). abi < kMinLandlockAbi
// gives an empty plan (abi 0).
LandlockPlan PlanLandlock(const Plan& plan, int host_abi, bool required);

// The denied syscalls and argument checks (docs/seccomp.md gives the reasons).
SeccompPlan PlanSeccomp(bool host_has_seccomp);

}  // namespace agentbox
