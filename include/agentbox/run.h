// Launch + supervise: running a confined command to its outcome.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "agentbox/confine.h"
#include "agentbox/outcome.h"

namespace agentbox {

// What the supervisor does once a sandbox's runner, the init of its pid
// namespace, has reported the end (every other process of the sandbox
// killed and reaped first): kAwait reaps the runner before Run returns,
// after the kernel has released its namespaces (a mount namespace's release
// waits for an RCU grace period: milliseconds on a busy machine);
// kLeaveToExit, for a process that exits as soon as the run is reported
// (the CLI), takes the usage from the runner's report and leaves that
// release to finish after the process is gone (whoever inherits the runner
// reaps it). Nothing of the sandbox runs any more in either case. A run
// with a cgroup, a project quota or a workspace overlay always awaits.
enum class RunnerTeardown { kAwait, kLeaveToExit };

struct RunOptions {
  RunnerTeardown runner_teardown = RunnerTeardown::kAwait;
  int stderr_fd = 2;       // where the command's stderr ends up
  // Copy the command's stderr through the supervisor to scan it for denial
  // signatures. Off for a terminal, so interactive programs keep their tty.
  bool scan_stderr = true;
  bool forward_signals = true;  // SIGINT/SIGTERM/SIGHUP/SIGQUIT go to the sandbox
  // on_unknown_domain: ask → this program answers; empty: the controlling
  // terminal asks when agentbox is in its foreground, otherwise deny.
  std::string ask_command;
  std::uint64_t ask_timeout_ms = 60000;  // a question unanswered by then is a deny
  bool ask_on_terminal = true;  // false: never the terminal (a daemon's sandboxes have none of their own)
  std::string network_log;      // every proxied connection as a JSON line to this file ("" = none)
  // Every proxied connection's record (one JSON line) as it ends, on the
  // proxy's thread; set, the records are not kept for the report.
  std::function<void(const std::string&)> on_connection;
};

// Runs the confined command and classifies what happened (DESIGN §4).
// Never throws; a sandbox that cannot start is an outcome (sandbox_error).
Outcome Run(const ConfinedCommand& command, const RunOptions& options);

// Runs a plan directly (the `agentbox __exec` side of `wrap`), using the
// given argv. Classification uses `denial_signatures` when non-empty.
Outcome RunPlan(const Plan& plan, const std::vector<std::string>& argv,
                const std::vector<Signature>& denial_signatures, const RunOptions& options);

// Removes what killed supervisors left behind: their run cgroups under this
// process's own cgroups (the pid namespace's init took their processes and
// mounts with it). A live run's cgroup is never touched. Returns the paths
// removed. `agentbox gc` runs it; so does every run that creates a cgroup.
std::vector<std::string> CollectGarbage();

// The outcome of a run that never started: sandbox_error with the reason.
Outcome RefusedOutcome(const Status& why, const EnforcementReport& enforcement,
                       const std::string& policy_sha256);

}  // namespace agentbox
