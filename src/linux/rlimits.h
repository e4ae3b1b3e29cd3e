// Resource limits of the sandbox's processes that need no cgroup: set in
// the runner before the command starts, inherited by everything it runs.
#pragma once

#include "agentbox/plan.h"
#include "agentbox/status.h"

namespace agentbox::linux {

// RLIMIT_CORE 0 (no core dumps: they would land in the workspace and carry
// the process's memory), RLIMIT_NOFILE soft = min(hard, limits.nofile),
// RLIMIT_FSIZE = limits.fsize_bytes when set (soft and hard: a write past it
// fails with EFBIG, once SIGXFSZ is ignored, and the command cannot raise it).
// Only lowers limits, so it needs no privilege.
[[nodiscard]] Status ApplyRlimits(const ResourceLimits& limits);

}  // namespace agentbox::linux
