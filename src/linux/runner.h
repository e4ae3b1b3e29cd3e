// The runner stage: runs in the cloned child, becomes pid 1 of the sandbox.
#pragma once

#include <string>
#include <vector>

#include "agentbox/plan.h"
#include "linux/resolve.h"

namespace agentbox::linux {

// Never returns. Reports setup and exec failures, then the command's exit,
// on `status_fd`; dies with the supervisor (lifeline + PR_SET_PDEATHSIG).
// `filter_fd` delivers the compiled seccomp program (-1: the plan has none);
// `proxy_fd` carries the proxy's listeners to the supervisor (-1: no proxy).
[[noreturn]] void RunnerMain(const Plan& plan, const ResolvedPlan& resolved,
                             const std::vector<std::string>& argv, int status_fd, int lifeline_fd,
                             int filter_fd, int proxy_fd);

}  // namespace agentbox::linux
