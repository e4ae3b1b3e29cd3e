#include "linux/launch.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include "linux/compat.h"
#include "linux/namespaces.h"
#include "linux/runner.h"

namespace agentbox::linux {

Result<Launched> Launch(const Plan& plan, const std::vector<std::string>& argv, StderrMode stderr_mode) {
  Launched out;
  auto resolved = ResolvePlan(plan);
  if (!resolved.ok()) return resolved.status();
  out.resolved = std::move(*resolved);

  int status_pipe[2], lifeline_pipe[2], stderr_pipe[2] = {-1, -1};
  if (pipe2(status_pipe, O_CLOEXEC) != 0) return Status::Errno("launch", "pipe2");
  UniqueFd status_w(status_pipe[1]);
  out.status.reset(status_pipe[0]);
  if (pipe2(lifeline_pipe, O_CLOEXEC) != 0) return Status::Errno("launch", "pipe2");
  UniqueFd lifeline_r(lifeline_pipe[0]);
  out.lifeline.reset(lifeline_pipe[1]);
  UniqueFd stderr_w;
  if (stderr_mode == StderrMode::kCapture) {
    if (pipe2(stderr_pipe, O_CLOEXEC) != 0) return Status::Errno("launch", "pipe2");
    out.stderr_pipe.reset(stderr_pipe[0]);
    stderr_w.reset(stderr_pipe[1]);
  }

  CloneArgs args{};
  args.flags = CLONE_PIDFD | (plan.confined ? NamespaceFlags(plan.namespaces) : 0);
  int pidfd = -1;
  args.pidfd = reinterpret_cast<std::uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  long pid = Clone3(&args);
  if (pid < 0) {
    return Status::Errno("clone", plan.confined ? "clone3(CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWPID|...)"
                                                : "clone3");
  }
  if (pid == 0) {
    // Child: from here on only the runner's code runs; it never returns.
    if (stderr_w.valid() && dup2(stderr_w.get(), STDERR_FILENO) < 0) _exit(125);
    RunnerMain(plan, out.resolved, argv, status_w.get(), lifeline_r.get());
  }
  out.pid = static_cast<pid_t>(pid);
  out.pidfd.reset(pidfd);
  return out;
}

}  // namespace agentbox::linux
