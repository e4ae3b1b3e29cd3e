#include "linux/launch.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <optional>

#include "linux/compat.h"
#include "linux/namespaces.h"
#include "linux/phases.h"
#include "linux/rlimits.h"
#include "linux/runner.h"
#include "linux/seccomp_filter.h"
#include "linux/status_pipe.h"

namespace agentbox::linux {

Result<Launched> Launch(const Plan& plan, const std::vector<std::string>& argv, StderrMode stderr_mode,
                        const SandboxCgroup* cgroup, const SessionLaunch* session) {
  Launched out;
  auto resolved = ResolvePlan(plan);
  if (!resolved.ok()) return resolved.status();
  out.resolved = std::move(*resolved);
  phases::Mark("resolve");

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

  // v1 placement: the runner moves itself into each v1 cgroup before doing
  // anything, so that all it does (and all it starts) is charged there.
  std::vector<UniqueFd> task_files;
  if (cgroup && cgroup->NeedsAttach()) {
    auto files = cgroup->OpenTaskFiles();
    if (!files.ok()) return files.status();
    task_files = std::move(*files);
  }

  // The seccomp program, compiled (or read from its cache) before the
  // clone: the runner inherits it (see seccomp_filter.h). None when it
  // could not be compiled: the runner then refuses with stage seccomp, and
  // the reason is kept for the report.
  std::optional<BpfProgram> filter;
  if (plan.confined && plan.seccomp.enabled) {
    auto program = CompileSeccompCached(plan.seccomp);
    if (program.ok()) {
      filter = std::move(*program);
    } else {
      out.filter_error = program.status();
    }
    phases::Mark("seccomp compiled");
  }

  // The proxy's listeners come back over another: created by the runner
  // inside the network namespace, served by the supervisor.
  // With the connect() broker, the same socket then carries its requests
  // (on both backends).
  const bool proxied = plan.confined && ((plan.backend == Backend::kNamespaces && plan.network.proxy.has_value()) ||
                                         plan.network.broker);
  UniqueFd proxy_send;
  if (proxied) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
      return Status::Errno("launch", "socketpair");
    }
    out.proxy_listeners.reset(sv[0]);
    proxy_send.reset(sv[1]);
  }

  // The capped upper layer of `run --workspace-overlay` comes back over a
  // third: the supervisor applies it after the sandbox is gone.
  UniqueFd upper_send;
  if (plan.confined && plan.workspace_overlay && plan.workspace_overlay->tmpfs_bytes) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
      return Status::Errno("launch", "socketpair");
    }
    out.upper_layer.reset(sv[0]);
    upper_send.reset(sv[1]);
    for (auto& m : out.resolved.mounts) {
      if (m.op.kind == MountKind::kOverlay) m.upper_channel = upper_send.get();
    }
  }

  // Without pidfds (before Linux 5.3, gVisor) nothing could watch the
  // runner: refused before it starts (once a process: the answer stays).
  static const int pidfd_errno = [] {
    UniqueFd self(PidfdOpen(getpid()));
    return self.valid() ? 0 : errno;
  }();
  // A session's world inside gVisor (whose kernel has none) watches its
  // init by the status pipe instead (world_main.cc).
  const bool inside_gvisor = !plan.confined && plan.gvisor && plan.gvisor->inside;
  if (pidfd_errno != 0 && !inside_gvisor) {
    return Status::Syscall("clone", "pidfd_open", "this kernel's pidfds (Linux 5.3 and later; `agentbox check` shows "
                                                  "pidfd): agentbox watches every sandbox through one",
                           pidfd_errno);
  }
  CloneArgs args{};
  args.flags = CLONE_PIDFD | (plan.confined ? NamespaceFlags(plan.namespaces) : 0);
  if (cgroup && cgroup->v2_fd() >= 0) {
    args.flags |= CLONE_INTO_CGROUP;
    args.cgroup = static_cast<std::uint64_t>(cgroup->v2_fd());
  }
  int pidfd = -1;
  args.pidfd = reinterpret_cast<std::uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  phases::Mark("pre-clone");
  long pid = CloneProcess(&args);
  if (pid < 0) {
    return Status::Errno("clone", plan.confined ? "clone3(CLONE_NEWUSER|CLONE_NEWNS|CLONE_NEWPID|...)"
                                                : "clone3");
  }
  if (pid == 0) {
    // Child: from here on only the runner's code runs; it never returns.
    phases::Mark("runner: started");
    for (const auto& fd : task_files) {
      if (write(fd.get(), "0", 1) != 1) {
        WriteMessage(status_w.get(), {RunnerMessage::Type::kSetupError, Status::Errno("cgroup", "write", "tasks")});
        _exit(125);
      }
    }
    if (stderr_w.valid() && dup2(stderr_w.get(), STDERR_FILENO) < 0) _exit(125);
    if (plan.confined) {
      if (Status s = ApplyRlimits(plan.limits); !s.ok()) {
        WriteMessage(status_w.get(), {RunnerMessage::Type::kSetupError, s});
        _exit(125);
      }
    }
    if (session) {
      SessionInitMain(plan, out.resolved, status_w.get(), lifeline_r.get(), filter ? &*filter : nullptr,
                      proxy_send.get(), session->control_fd, session->upper_seed_fd, session->hooks);
    }
    RunnerMain(plan, out.resolved, argv, status_w.get(), lifeline_r.get(), filter ? &*filter : nullptr,
               proxy_send.get());
  }
  if (pidfd < 0 && !inside_gvisor) {
    // A kernel that takes CLONE_PIDFD without answering it (gVisor's, one
    // before Linux 5.3 with the raw clone) leaves nothing to watch the
    // runner by: every wait below would be on no descriptor, for ever.
    kill(static_cast<pid_t>(pid), SIGKILL);
    while (waitpid(static_cast<pid_t>(pid), nullptr, 0) < 0 && errno == EINTR) {
    }
    return Status::Error("clone", "the kernel started the sandbox's runner but gave no pidfd for it (CLONE_PIDFD, "
                                  "Linux 5.3 and later; `agentbox check` shows pidfd): agentbox watches every "
                                  "sandbox through one and refuses to run without");
  }
  phases::Mark("clone returned");
  out.pid = static_cast<pid_t>(pid);
  out.pidfd.reset(pidfd);
  upper_send.reset();
  proxy_send.reset();  // the runner's end: closed here, so that its exit reads as end of file
  return out;
}

}  // namespace agentbox::linux
