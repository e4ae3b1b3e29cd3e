// Resource limits of the sandbox's processes that need no cgroup: set in
// the runner before the command starts, inherited by everything it runs.
#pragma once

#include <cstdint>
#include <optional>

#include "agentbox/plan.h"
#include "agentbox/status.h"

namespace agentbox::linux {

// The values ApplyRlimits sets, from `limits` and the calling process's
// own limits (which a runner cloned or spawned from it inherits): what a
// report names as in force. RLIMIT_CORE is always 0.
struct RlimitsSet {
  std::uint64_t nofile_soft = 0;
  std::optional<std::uint64_t> fsize;  // RLIMIT_FSIZE, soft and hard; none: left as it was
  std::optional<std::uint64_t> nproc;  // RLIMIT_NPROC, soft and hard; none: left as it was
};
RlimitsSet RlimitsFor(const ResourceLimits& limits);

// RLIMIT_CORE 0 (no core dumps: they would land in the workspace and carry
// the process's memory), RLIMIT_NOFILE soft = min(hard, limits.nofile),
// RLIMIT_FSIZE = limits.fsize_bytes when set (soft and hard: a write past it
// fails with EFBIG, once SIGXFSZ is ignored, and the command cannot raise it).
// RLIMIT_NPROC = limits.nproc when set (soft and hard), only ever called in
// the runner, inside the sandbox's new user namespace: there the kernel's
// count is the sandbox's own tasks (see docs/policy.md, max_processes).
// Only lowers limits, so it needs no privilege.
[[nodiscard]] Status ApplyRlimits(const ResourceLimits& limits);

}  // namespace agentbox::linux
