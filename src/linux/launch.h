// Backend::launch: settle the plan, clone into the namespaces, start the runner.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "agentbox/plan.h"
#include "agentbox/status.h"
#include "linux/cgroups.h"
#include "linux/fd.h"
#include "linux/resolve.h"
#include "linux/runner.h"

namespace agentbox::linux {

enum class StderrMode {
  kInherit,   // the command writes to our stderr directly (a terminal, usually)
  kCapture,   // through a pipe the supervisor copies and scans for denials
};

// A started runner. Owns its fds and placeholders; destroying it does not
// stop the runner (the supervisor does), but closing the lifeline kills it.
struct Launched {
  pid_t pid = -1;
  UniqueFd pidfd;
  UniqueFd status;      // read end of the status pipe
  UniqueFd stderr_pipe; // read end, with StderrMode::kCapture
  UniqueFd lifeline;    // write end: the runner dies when this closes
  ResolvedPlan resolved;
  Status filter_error;  // the seccomp program could not be compiled or sent
  UniqueFd proxy_listeners;  // the runner sends the proxy's two listeners here (plans with a proxy)
  UniqueFd upper_layer;      // the runner sends its upper layer's tmpfs here (run --workspace-overlay)
};

// With a `cgroup`, the runner starts inside it before it runs any code of
// its own: v2 by clone3(CLONE_INTO_CGROUP); v1 by writing its pid into each
// cgroup.procs while it waits on a "go" pipe (only then: without a cgroup
// the launch pays nothing for this). The runner's rlimits are set first
// thing in the child (confined plans).
//
// With `session`, the runner becomes a session's init (SessionInitMain) on
// `session->control_fd` instead of running argv.
struct SessionLaunch {
  int control_fd = -1;
  int upper_seed_fd = -1;  // an earlier world's upper filesystem (runner.h); -1: none
  SessionHooks hooks;
};
[[nodiscard]] Result<Launched> Launch(const Plan& plan, const std::vector<std::string>& argv,
                                      StderrMode stderr_mode, const SandboxCgroup* cgroup = nullptr,
                                      const SessionLaunch* session = nullptr);

}  // namespace agentbox::linux
