// The supervisor's side of resource limits: the run's cgroup, and what it
// tells after the run (usage, OOM kills, the limits that were in force).
#pragma once

#include <sys/resource.h>

#include <memory>
#include <string>
#include <vector>

#include "agentbox/outcome.h"
#include "agentbox/plan.h"
#include "agentbox/status.h"
#include "linux/cgroups.h"
#include "linux/rlimits.h"

namespace agentbox::supervise {

// The run's cgroup, or null when the plan asks for no cgroup-backed limit
// (then nothing is created and nothing is paid). Stale cgroups of dead
// supervisors under ours are removed on the way.
[[nodiscard]] Result<std::unique_ptr<linux::SandboxCgroup>> MakeRunCgroup(const Plan& plan);

// The files a child writes "0" to, before its exec, to join `cgroup` (v2's
// cgroup.procs, and each v1 hierarchy's tasks); none without a cgroup.
[[nodiscard]] Result<std::vector<linux::UniqueFd>> RunCgroupTaskFiles(const linux::SandboxCgroup* cgroup);

// The limits in force for a command launched from `plan`: the rlimits its
// runner set (`rlimits`, as linux::RlimitsFor gives them in the process the
// runner comes from), and the cgroup's limits when `cgroup_mechanism` names
// the cgroup it runs in ("" = none). The one place that says so, for `run`
// and for a session's calls alike.
LimitsInForce LimitsFor(const Plan& plan, const std::string& cgroup_mechanism, const linux::RlimitsSet& rlimits);

// Usage from a wait4() rusage of what ran (cpu times, peak RSS).
void FillRusage(const struct rusage& ru, Usage* usage);

// Fills usage from the cgroup's counters (where it has them; rusage stays
// for the rest) and records the limits in force (LimitsFor, with the
// rlimits computed in this process: call it where the runner came from).
void FillUsage(const Plan& plan, const linux::SandboxCgroup* cgroup, const linux::CgroupStats& stats,
               Usage* usage);

// The denial an OOM kill at the memory limit is: facet resources, op
// memory, target "memory.max" (the outcome stays oom_killed; this entry is
// what an escalation offer for more memory attaches to).
Denial OomDenial(std::uint64_t limit_bytes, std::uint64_t kills);

}  // namespace agentbox::supervise
