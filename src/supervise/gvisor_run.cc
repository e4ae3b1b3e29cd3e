// A run on gVisor (sandbox.isolation: container): the plan as an OCI
// bundle, `runsc run` started in the run's cgroup, watched and classified as
// a namespaces run is.
//
// Egress (a plan with the proxy): the sandbox joins a network namespace of
// the run's with a loopback and the proxy's listeners on it (runsc
// --network=host there), so every connection it makes reaches the
// supervisor's proxy or nothing.
//
// runsc dies with the supervisor (PR_SET_PDEATHSIG), and its sandbox and
// gofer with it (`run` starts the sandbox attached), so a kill -9 of
// agentbox leaves no sandbox behind; the bundle directory it leaves is
// removed by `agentbox gc` (its name carries the supervisor's pid).
#include "supervise/gvisor_run.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "linux/compat.h"
#include "linux/fd.h"
#include "linux/gvisor.h"
#include "linux/namespaces.h"
#include "linux/proxy_listeners.h"
#include "linux/resolve.h"
#include "linux/runner.h"
#include "supervise/denial_scanner.h"
#include "supervise/egress.h"
#include "supervise/resources.h"
#include "supervise/run_dirs.h"
#include "supervise/run_io.h"

namespace agentbox::supervise {
namespace {

using Clock = RunClock;

std::string ReadFile(const std::string& path) {
  std::string out;
  linux::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return out;
  char buf[8192];
  for (ssize_t n; (n = read(fd.get(), buf, sizeof(buf))) > 0;) {
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (1u << 20)) break;
  }
  return out;
}

Outcome Failed(Outcome out, const std::string& stage, const std::string& message, int err,
               Clock::time_point started) {
  out.kind = OutcomeKind::kSandboxError;
  out.error = ErrorInfo{stage, message, err};
  out.usage.wall_ms = Ms(Clock::now() - started);
  return out;
}

// A network namespace with its loopback up and the proxy's listeners on it
// (127.0.0.1 at the plan's ports), made by a child that leaves at once: the
// namespace lives on in `ns` (and in the listeners).
struct EgressNamespace {
  linux::UniqueFd ns;
  linux::EgressListeners listeners;
};

Result<EgressNamespace> PrepareEgressNamespace(const Plan& plan) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return Status::Errno("network", "socketpair", "egress namespace");
  }
  linux::UniqueFd mine(sv[0]), theirs(sv[1]);
  const pid_t pid = fork();
  if (pid < 0) return Status::Errno("network", "fork", "egress namespace");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    mine.reset();
    if (unshare(CLONE_NEWNET) != 0) _exit(10);
    if (!linux::BringUpLoopback().ok()) _exit(11);
    if (!linux::SendEgressListeners(theirs.get(), plan.network).ok()) _exit(12);
    char c;
    (void)!read(theirs.get(), &c, 1);  // until the supervisor holds the namespace
    _exit(0);
  }
  theirs.reset();
  EgressNamespace e;
  auto listeners = linux::ReceiveEgressListeners(mine.get());
  if (listeners.ok()) {
    e.listeners = std::move(*listeners);
    e.ns.reset(open(("/proc/" + std::to_string(pid) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC));
  }
  const int open_errno = errno;
  mine.reset();
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!listeners.ok()) {
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    const char* step = code == 10 ? "unshare(CLONE_NEWNET)" : code == 11 ? "bringing up its loopback"
                       : code == 12 ? "binding the proxy's listeners" : "its helper";
    return Status::Error("network", std::string("the sandbox's network namespace could not be prepared: ") + step +
                                        " failed (" + listeners.status().message() + ")");
  }
  if (!e.ns.valid()) return Status::Syscall("network", "open", "the egress namespace", open_errno);
  return e;
}

}  // namespace

Outcome RunGvisor(const Plan& plan, const std::vector<std::string>& argv,
                  const std::vector<Signature>& denial_signatures, const RunOptions& options) {
  Outcome out;
  out.policy_sha256 = plan.policy_sha256;
  const auto started = Clock::now();
  if (!plan.gvisor) return Failed(out, "gvisor", "the plan names no runsc", 0, started);
  const GvisorPlan& g = *plan.gvisor;
  if (plan.tty) {
    return Failed(out, "gvisor", "run --tty is not available on gVisor in this version (the command's stdio are "
                                 "pipes)", 0, started);
  }

  auto resolved = linux::ResolvePlan(plan);
  if (!resolved.ok()) {
    return Failed(out, resolved.status().stage(), resolved.status().message(), resolved.status().err(), started);
  }
  out.enforcement.skipped = resolved->skipped;

  // The bundle: <runtime dir>/agentbox-gvisor-<pid>-XXXXXX, 0700.
  std::string dir = g.state_parent + "/" + kGvisorBundlePrefix + std::to_string(getpid()) + "-XXXXXX";
  if (!mkdtemp(dir.data())) return Failed(out, "gvisor", "mkdtemp " + dir + ": " + std::strerror(errno), errno, started);
  struct RemoveBundle {
    std::string dir;
    ~RemoveBundle() { if (!getenv("AGENTBOX_DEBUG_KEEP_BUNDLE")) RemoveTree(dir); }
  } remove_bundle{dir};

  const std::vector<std::string> env = linux::BuildEnv(plan.env);
  auto spec = linux::BuildOciSpec(plan, *resolved, argv, env, dir);
  if (!spec.ok()) return Failed(out, spec.status().stage(), spec.status().message(), 0, started);
  std::optional<EgressNamespace> egress_ns;
  std::string netns;
  if (plan.network.proxy) {
    auto prepared = PrepareEgressNamespace(plan);
    if (!prepared.ok()) {
      return Failed(out, prepared.status().stage(), prepared.status().message(), prepared.status().err(), started);
    }
    egress_ns = std::move(*prepared);
    // A path runsc can open: this process's descriptor of the namespace.
    netns = "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(egress_ns->ns.get());
    linux::JoinNetworkNamespace(&*spec, netns);
  }
  if (Status s = linux::WriteBundle(*spec, dir); !s.ok()) return Failed(out, s.stage(), s.message(), s.err(), started);
  const std::string state = dir + "/state";
  const std::string log = dir + "/runsc.log";
  const std::string id = "agentbox-" + plan.nonce;
  const std::vector<std::string> runsc =
      linux::RunscRunArgv(g, dir, state, log, id, plan.seccomp.enabled, netns);

  auto made = MakeRunCgroup(plan);
  if (!made.ok()) return Failed(out, made.status().stage(), made.status().message(), made.status().err(), started);
  std::unique_ptr<linux::SandboxCgroup> cgroup = std::move(*made);
  auto opened = RunCgroupTaskFiles(cgroup.get());
  if (!opened.ok()) {
    return Failed(out, opened.status().stage(), opened.status().message(), opened.status().err(), started);
  }
  std::vector<linux::UniqueFd> task_files = std::move(*opened);

  ForwardedSignals sigfd(options.forward_signals);

  const bool scan = options.scan_stderr && !denial_signatures.empty();
  int err_pipe[2] = {-1, -1};
  if (scan && pipe2(err_pipe, O_CLOEXEC) != 0) return Failed(out, "gvisor", "pipe2", errno, started);
  linux::UniqueFd err_read(err_pipe[0]), err_write(err_pipe[1]);
  // runsc hands a regular file given as stdout to the sandbox with an
  // offset of its own, starting at 0: what the command writes would land
  // over what the file held. A pipe, relayed here, writes where we are.
  struct stat out_st {};
  const bool relay_out = fstat(1, &out_st) == 0 && S_ISREG(out_st.st_mode);
  int out_pipe[2] = {-1, -1};
  if (relay_out && pipe2(out_pipe, O_CLOEXEC) != 0) return Failed(out, "gvisor", "pipe2", errno, started);
  linux::UniqueFd out_read(out_pipe[0]), out_write(out_pipe[1]);
  struct stat err_st {};
  const bool relay_err = !err_write.valid() && fstat(options.stderr_fd, &err_st) == 0 && S_ISREG(err_st.st_mode);
  if (relay_err) {
    if (pipe2(err_pipe, O_CLOEXEC) != 0) return Failed(out, "gvisor", "pipe2", errno, started);
    err_read.reset(err_pipe[0]);
    err_write.reset(err_pipe[1]);
  }

  std::vector<char*> cargv;
  for (const auto& a : runsc) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return Failed(out, "gvisor", std::string("fork: ") + std::strerror(errno), errno, started);
  if (pid == 0) {
    // runsc dies with the supervisor; its attached sandbox with it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    for (auto& f : task_files) {
      if (write(f.get(), "0", 1) != 1) _exit(126);
    }
    if (out_write.valid()) dup2(out_write.get(), 1);
    if (err_write.valid()) dup2(err_write.get(), 2);
    if (options.stderr_fd != 2 && !err_write.valid()) dup2(options.stderr_fd, 2);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    close_range(3, ~0U, 0);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  task_files.clear();
  err_write.reset();
  out_write.reset();
  linux::UniqueFd pidfd(linux::PidfdOpen(pid));
  // The proxy on the namespace's listeners (after the fork: no thread of
  // its is copied into runsc's child); connections wait in their backlog.
  std::unique_ptr<Egress> egress;
  std::optional<Status> egress_error;
  if (egress_ns) {
    Egress::Fds fds;
    fds.http = std::move(egress_ns->listeners.http);
    fds.socks = std::move(egress_ns->listeners.socks);
    auto started_egress = Egress::Start(plan, options, std::move(fds));
    if (started_egress.ok()) {
      egress = std::move(*started_egress);
    } else {
      egress_error = started_egress.status();
      kill(pid, SIGKILL);
    }
  }

  DenialScanner scanner(denial_signatures);
  bool exited = false, stderr_open = err_read.valid(), stdout_open = out_read.valid(), timed_out = false,
       killed = false;
  std::optional<Clock::time_point> deadline, kill_at;
  if (plan.timeout_ms) deadline = started + std::chrono::milliseconds(*plan.timeout_ms);
  char buf[16384];
  while (!exited || stderr_open || stdout_open) {
    auto now = Clock::now();
    if (deadline && now >= *deadline && !timed_out) {
      // runsc forwards SIGTERM to the container's init; then the kill.
      timed_out = true;
      kill(pid, SIGTERM);
      kill_at = now + std::chrono::milliseconds(plan.kill_grace_ms);
    }
    if (kill_at && now >= *kill_at && !killed) {
      killed = true;
      kill(pid, SIGKILL);
      if (cgroup) cgroup->KillAll();
    }
    std::optional<Clock::time_point> wake;
    if (deadline && !timed_out) wake = deadline;
    if (kill_at && !killed) wake = kill_at;
    if (exited) wake = now + std::chrono::milliseconds(200);
    const int timeout_ms =
        wake ? static_cast<int>(std::max<std::int64_t>(
                   1, std::chrono::duration_cast<std::chrono::milliseconds>(*wake - now).count()))
             : -1;
    struct pollfd fds[4];
    int n = 0, i_pid = -1, i_err = -1, i_sig = -1, i_out = -1;
    if (!exited) fds[i_pid = n++] = {pidfd.get(), POLLIN, 0};
    if (stdout_open) fds[i_out = n++] = {out_read.get(), POLLIN, 0};
    if (stderr_open) fds[i_err = n++] = {err_read.get(), POLLIN, 0};
    if (sigfd.valid()) fds[i_sig = n++] = {sigfd.get(), POLLIN, 0};
    int r = poll(fds, static_cast<nfds_t>(n), timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 && exited) break;  // the sandbox's last writers are gone by now
    if (i_pid >= 0 && fds[i_pid].revents) exited = true;
    if (i_out >= 0 && fds[i_out].revents) {
      ssize_t got = read(out_read.get(), buf, sizeof(buf));
      if (got <= 0) {
        stdout_open = false;
      } else {
        WriteAll(1, buf, static_cast<size_t>(got));
      }
    }
    if (i_err >= 0 && fds[i_err].revents) {
      ssize_t got = read(err_read.get(), buf, sizeof(buf));
      if (got <= 0) {
        stderr_open = false;
      } else {
        WriteAll(options.stderr_fd, buf, static_cast<size_t>(got));
        if (scan) scanner.Feed(buf, static_cast<size_t>(got));
      }
    }
    if (i_sig >= 0 && fds[i_sig].revents) {
      struct signalfd_siginfo si {};
      while (read(sigfd.get(), &si, sizeof(si)) == sizeof(si)) {
        if (!exited) kill(pid, static_cast<int>(si.ssi_signo));
      }
    }
  }
  scanner.Finish();
  int wstatus = 0;
  struct rusage ru {};
  while (wait4(pid, &wstatus, 0, &ru) < 0 && errno == EINTR) {
  }
  out.usage.wall_ms = Ms(Clock::now() - started);
  FillRusage(ru, &out.usage);
  linux::CgroupStats cg_stats;
  if (cgroup) {
    cgroup->KillAll();  // the sandbox and gofer, should one outlive runsc
    cg_stats = cgroup->ReadStats();
  }
  FillUsage(plan, cgroup.get(), cg_stats, &out.usage);
  out.denials = std::move(scanner.denials());
  if (egress) {
    // Every connection's record is in once the proxy is stopped.
    egress->Stop();
    AddNetworkReport(egress->records(), &out);
    if (!options.network_log.empty()) {
      if (Status s = WriteNetworkLog(options.network_log, egress->records()); !s.ok()) {
        const std::string line = "agentbox: " + s.message() + "\n";
        WriteAll(options.stderr_fd, line.data(), line.size());
      }
    }
  }
  if (egress_error) return Failed(out, egress_error->stage(), egress_error->message(), egress_error->err(), started);

  const std::string runsc_error = linux::RunscError(ReadFile(log));
  if (timed_out) {
    out.kind = OutcomeKind::kTimedOut;
    out.error = ErrorInfo{"timeout", "wall clock of " + std::to_string(*plan.timeout_ms) + " ms reached", 0};
    return out;
  }
  if (cg_stats.oom_kills > 0) {
    out.kind = OutcomeKind::kOomKilled;
    out.error = ErrorInfo{"oom", std::to_string(cg_stats.oom_kills) + " process(es) of the gVisor sandbox killed by "
                                     "the kernel's OOM killer at the sandbox's memory limit of " +
                                     std::to_string(plan.limits.memory_max_bytes.value_or(0)) + " bytes", 0};
    out.denials.push_back(OomDenial(plan.limits.memory_max_bytes.value_or(0), cg_stats.oom_kills));
    return out;
  }
  if (!runsc_error.empty()) {
    // The command never started: not found (as a namespaces run says, 127),
    // or runsc itself failed (the sandbox, not the command).
    const bool not_found = runsc_error.find("failed to load ") != std::string::npos &&
                           runsc_error.find("no such file or directory") != std::string::npos;
    if (not_found) {
      out.kind = OutcomeKind::kExited;
      out.exit_code = 127;
      out.error = ErrorInfo{"exec", runsc_error + " — not found inside the sandbox (it may exist on the host but "
                                                  "not be mounted)", ENOENT};
      return out;
    }
    return Failed(out, "gvisor", "runsc: " + runsc_error, 0, started);
  }
  if (!WIFEXITED(wstatus)) {
    return Failed(out, "gvisor", "runsc ended by signal " + std::to_string(WTERMSIG(wstatus)) +
                                     " before reporting the command's exit", 0, started);
  }
  // runsc exits with the command's status; a command killed by signal N as
  // 128+N, the shell's convention.
  const int code = WEXITSTATUS(wstatus);
  if (code > 128 && code < 128 + 65) {
    out.signal = code - 128;
  } else {
    out.exit_code = code;
  }
  const bool failed = out.signal.has_value() || out.exit_code.value_or(0) != 0;
  if (failed && !out.denials.empty() && plan.denial_outcome) {
    out.kind = OutcomeKind::kSandboxDenied;
  } else {
    out.kind = out.signal ? OutcomeKind::kSignaled : OutcomeKind::kExited;
  }
  return out;
}

std::vector<std::string> CollectGvisorBundles(const std::string& parent) {
  return CollectDeadRunDirs(parent, kGvisorBundlePrefix);
}

}  // namespace agentbox::supervise
