// The supervisor: launches the runner, waits for it under the wall clock,
// copies and scans the command's stderr, and classifies the outcome.
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "agentbox/run.h"
#include "confine/escalation.h"
#include "confine/layers.h"
#include "confine/paths.h"
#include "linux/compat.h"
#include "linux/descendants.h"
#include "linux/git_repos.h"
#include "linux/launch.h"
#include "linux/phases.h"
#include "linux/proxy_listeners.h"
#include "linux/seccomp_notify.h"
#include "linux/status_pipe.h"
#include "linux/upper_layer.h"
#include "net/proxy.h"
#include "supervise/credentials.h"
#include "supervise/denial_scanner.h"
#include "supervise/egress.h"
#include "supervise/private_dir.h"
#include "supervise/gvisor_run.h"
#include "supervise/microvm_run.h"
#include "supervise/resources.h"
#include "supervise/run_io.h"
#include "supervise/workspace_disk.h"
#include "supervise/workspace_overlay.h"

namespace agentbox {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kDrainAfterExitMs = 200;

using supervise::Ms;
using supervise::WriteAll;

// Repositories that appeared in the workspace during the run were not
// protected: once nothing of the sandbox runs any more, whatever in them
// would run code on the host is reported and quarantined. Returns whether
// anything was found.
bool AuditGitRepos(const Plan& plan, const std::set<std::string>& known, linux::ScanCaches* kept, Outcome* out) {
  if (!plan.confined || plan.backend != Backend::kNamespaces || !plan.workspace_writable ||
      plan.protect_git.empty()) {
    return false;
  }
  auto has = [&](const char* name) {
    return std::find(plan.protect_git.begin(), plan.protect_git.end(), name) != plan.protect_git.end();
  };
  auto found =
      linux::AuditGitRepos(plan.workspace_source, known, has("hooks"), has("config"), plan.scan_cache_dir, kept);
  if (!found.ok()) {
    // Not knowing is not clean: say so, as a denial.
    out->denials.push_back({"filesystem", "git-audit", plan.workspace_target,
                            "the end-of-run audit of git repositories failed: " + found.status().ToString(),
                            "git-audit", 0});
    return true;
  }
  for (const auto& f : *found) {
    std::string reason = f.reason;
    if (!f.quarantined.empty() && plan.workspace_target != plan.workspace_source) {
      reason += " (on the host)";
    }
    out->denials.push_back({"filesystem", f.op, paths::Rebase(f.host_path, plan.workspace_source, plan.workspace_target),
                            reason, "git-audit", 0});
  }
  return !found->empty();
}

// --workspace-overlay: how the run ended, for `--apply on-success`.
supervise::RunEnd EndOfRun(bool failed_sandbox, bool timed_out, std::uint64_t oom_kills,
                           const linux::RunnerMessage* exit_msg) {
  supervise::RunEnd end;
  if (failed_sandbox) {
    end.how = "the sandbox failed (sandbox_error)";
  } else if (timed_out) {
    end.how = "the run timed out";
  } else if (oom_kills > 0) {
    end.how = "a process of the run was OOM-killed";
  } else if (!exit_msg) {
    end.how = "the sandbox runner ended before reporting the command's exit";
  } else if (exit_msg->signal) {
    end.how = "the command was killed by signal " + std::to_string(exit_msg->signal);
  } else {
    end.how = "the command exited with " + std::to_string(exit_msg->exit_code);
    end.clean = exit_msg->exit_code == 0;
  }
  return end;
}

// --workspace-overlay, once nothing of the sandbox runs: the upper layer the
// runner sent is checked for a full cap (a disk_gib denial), diffed, and
// applied to the workspace or dropped (supervise/workspace_overlay.h).
// Protected paths were read-only during the run; a placeholder the runner
// made for one is never applied.
void SettleOverlay(const Plan& plan, const linux::Launched& child, const supervise::RunEnd& end, Outcome* out) {
  auto layer = linux::ReceiveUpperLayer(child.upper_layer.get());
  const int root = layer.ok() ? layer->get() : -1;
  if (auto full = supervise::WorkspaceOverlayFull(root, plan.workspace_overlay->tmpfs_bytes, plan.workspace_target)) {
    out->denials.push_back(std::move(*full));
  }
  std::set<std::string> skip;
  const std::string& ws = plan.workspace_source;
  for (const auto& m : child.resolved.mounts) {
    if (m.op.kind == MountKind::kProtect && paths::IsWithin(m.op.source, ws) && m.op.source != ws) {
      skip.insert(m.op.source.substr(ws == "/" ? 1 : ws.size() + 1));
    }
  }
  out->workspace_overlay = supervise::SettleWorkspaceOverlay(plan, root, end, skip);
  if (!layer.ok()) out->workspace_overlay->error = layer.status().ToString();
}

}  // namespace

Outcome RefusedOutcome(const Status& why, const EnforcementReport& enforcement,
                       const std::string& policy_sha256) {
  Outcome out;
  out.kind = OutcomeKind::kSandboxError;
  out.enforcement = enforcement;
  out.error = ErrorInfo{why.stage(), why.message(), why.err()};
  out.policy_sha256 = policy_sha256;
  return out;
}

// What the runner handed over, and the channel that goes on as the
// broker's (closed here when there is no broker).
static supervise::Egress::Fds EgressFds(const Plan& plan, linux::EgressListeners& l, linux::Launched* child) {
  supervise::Egress::Fds fds{std::move(l.http), std::move(l.socks), std::move(l.dns_udp), std::move(l.dns_tcp), {}};
  if (plan.network.broker) {
    fds.broker = std::move(child->proxy_listeners);
  } else {
    child->proxy_listeners.reset();
  }
  return fds;
}

// `host_proxy`: the landlock-only backend's proxy listeners, bound on the
// host's loopback before the launch (the plan names their ports); served
// once the runner is started (no proxy thread may exist when the runner is
// cloned: it does not exec, and would inherit a lock held by one).
static Outcome RunPrepared(const Plan& plan, const std::vector<std::string>& argv,
                           const std::vector<Signature>& denial_signatures, const RunOptions& options,
                           std::optional<linux::HostProxyListeners> host_proxy,
                           std::shared_ptr<net::Terminator> terminator) {
  Outcome out;
  out.policy_sha256 = plan.policy_sha256;
  const auto started = Clock::now();

  // Signals arrive through a signalfd; blocked before the launch so none is
  // lost (SIGWINCH too with a pty: the runner resizes the sandbox's).
  supervise::ForwardedSignals sigfd(options.forward_signals, plan.tty ? SIGWINCH : 0);

  // With a pty the command's stderr is the pty: nothing to scan.
  const bool scan = options.scan_stderr && !denial_signatures.empty() && !plan.tty;
  // The run's cgroup (none without cgroup-backed limits); removed, with
  // anything left in it, when this function returns.
  auto made = supervise::MakeRunCgroup(plan);
  if (!made.ok()) {
    out.kind = OutcomeKind::kSandboxError;
    out.error = ErrorInfo{made.status().stage(), made.status().message(), made.status().err()};
    out.usage.wall_ms = Ms(Clock::now() - started);
    return out;
  }
  std::unique_ptr<linux::SandboxCgroup> cgroup = std::move(*made);
  linux::phases::Mark("cgroup");
  // disk_gib by a project quota on the workspace: tagged before the launch,
  // restored when this function returns (and by gc, should we be killed).
  auto quota = supervise::StartWorkspaceQuota(plan);
  if (!quota.ok()) {
    out.kind = OutcomeKind::kSandboxError;
    out.error = ErrorInfo{quota.status().stage(), quota.status().message(), quota.status().err()};
    out.usage.wall_ms = Ms(Clock::now() - started);
    return out;
  }
  const bool proxied = plan.confined && plan.network.proxy.has_value();
  if (proxied) {
    // Four fds per tunnel: as many as the hard limit allows. (The runner
    // sets the sandbox's own limit from the plan.)
    struct rlimit nofile {};
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
      nofile.rlim_cur = nofile.rlim_max;
      setrlimit(RLIMIT_NOFILE, &nofile);
    }
  }
  auto launched = linux::Launch(plan, argv, scan ? linux::StderrMode::kCapture : linux::StderrMode::kInherit,
                                cgroup.get());
  if (!launched.ok()) {
    out.kind = OutcomeKind::kSandboxError;
    out.error = ErrorInfo{launched.status().stage(), launched.status().message(), launched.status().err()};
    out.usage.wall_ms = Ms(Clock::now() - started);
    return out;
  }
  linux::Launched& child = *launched;
  out.enforcement.skipped = child.resolved.skipped;

  supervise::DenialScanner scanner(denial_signatures);
  // The egress proxy starts once the runner has handed over its listeners.
  std::unique_ptr<supervise::Egress> egress;
  std::optional<Status> proxy_error;
  // Landlock-only: no listeners come from the runner; the channel, if
  // any, is the broker's from the start.
  const bool landlock_only = plan.confined && plan.backend == Backend::kLandlockOnly;
  bool proxy_open = child.proxy_listeners.valid() && !landlock_only;
  if (landlock_only && (host_proxy || plan.network.broker)) {
    supervise::Egress::Fds fds;
    if (host_proxy) {
      fds.http = std::move(host_proxy->http);
      fds.socks = std::move(host_proxy->socks);
    }
    if (plan.network.broker) fds.broker = std::move(child.proxy_listeners);
    auto started_proxy = supervise::Egress::Start(plan, options, std::move(fds), child.pid, terminator);
    if (started_proxy.ok()) {
      egress = std::move(*started_proxy);
    } else {
      proxy_error = started_proxy.status();
    }
  }
  // The runner's listeners and the broker's channel, until the first of
  // them has something to serve.
  std::optional<supervise::Egress::Fds> idle_egress;
  std::vector<linux::RunnerMessage> messages;
  linux::StatusReader status;
  bool status_open = true, stderr_open = child.stderr_pipe.valid(), exited = false;
  bool timed_out = false, killed = false;
  std::optional<Clock::time_point> deadline, kill_at, drain_until;
  if (plan.timeout_ms) deadline = started + std::chrono::milliseconds(*plan.timeout_ms);

  // RunnerTeardown::kLeaveToExit: whether this run may, and did, end
  // without waiting for the runner's namespaces to be released.
  const bool leave_runner = options.runner_teardown == RunnerTeardown::kLeaveToExit && !cgroup && !quota->quota &&
                            !(plan.confined && plan.workspace_overlay);
  bool runner_left = false;

  char buf[16384];
  while (status_open || stderr_open || !exited) {
    if (proxy_error && !killed) {
      // The sandbox would have no working egress: end it, report why.
      killed = true;
      if (cgroup) cgroup->KillAll();
      linux::PidfdSendSignal(child.pidfd.get(), SIGKILL);
    }
    auto now = Clock::now();
    if (deadline && now >= *deadline && !timed_out) {
      // Deadline: ask politely (the runner forwards SIGTERM to the command), then kill pid 1.
      timed_out = true;
      linux::PidfdSendSignal(child.pidfd.get(), SIGTERM);
      if (cgroup) {
        // Every process, not only the command's group; stopped ones are
        // continued so that they can act on it.
        cgroup->SignalAll(SIGTERM, child.pid);
        cgroup->SignalAll(SIGCONT, child.pid);
      }
      kill_at = now + std::chrono::milliseconds(plan.kill_grace_ms);
    }
    if (kill_at && now >= *kill_at && !killed) {
      killed = true;
      if (cgroup) cgroup->KillAll();  // cgroup.kill where the kernel has it
      // No pid namespace: the runner (a subreaper) holds every descendant; kill them before it.
      if (plan.confined && plan.backend == Backend::kLandlockOnly) linux::KillDescendants(child.pid);
      linux::PidfdSendSignal(child.pidfd.get(), SIGKILL);
    }
    if (exited && drain_until && now >= *drain_until) break;

    std::optional<Clock::time_point> wake;
    for (const auto& t : {deadline, kill_at, drain_until}) {
      if (t && *t > now && (!wake || *t < *wake)) wake = t;
    }
    if (timed_out && deadline) wake = kill_at && !killed ? kill_at : drain_until;
    int timeout_ms = wake ? static_cast<int>(std::max<std::int64_t>(
                                1, std::chrono::duration_cast<std::chrono::milliseconds>(*wake - now).count()))
                          : -1;

    struct pollfd fds[10];
    int n = 0;
    int i_status = -1, i_err = -1, i_pid = -1, i_sig = -1, i_proxy = -1;
    if (proxy_open) fds[i_proxy = n++] = {child.proxy_listeners.get(), POLLIN, 0};
    const int idle_begin = n;
    if (idle_egress) {
      for (const linux::UniqueFd* f : {&idle_egress->http, &idle_egress->socks, &idle_egress->dns_udp,
                                       &idle_egress->dns_tcp, &idle_egress->broker}) {
        if (f->valid()) fds[n++] = {f->get(), POLLIN, 0};
      }
    }
    const int idle_end = n;
    if (status_open) fds[i_status = n++] = {child.status.get(), POLLIN, 0};
    if (stderr_open) fds[i_err = n++] = {child.stderr_pipe.get(), POLLIN, 0};
    if (!exited) fds[i_pid = n++] = {child.pidfd.get(), POLLIN, 0};
    if (sigfd.valid()) fds[i_sig = n++] = {sigfd.get(), POLLIN, 0};
    int r = poll(fds, static_cast<nfds_t>(n), timeout_ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      break;
    }
    // Something to serve: a connection, a query, a request. The channel's
    // hang-up when the runner ends is not.
    bool start_egress = false, runner_gone = false;
    for (int i = idle_begin; i < idle_end; ++i) {
      runner_gone = runner_gone || (fds[i].revents & (POLLHUP | POLLERR));
      start_egress = start_egress || (fds[i].revents & POLLIN);
    }
    if (runner_gone || exited) {
      idle_egress.reset();  // nothing to serve any more
    } else if (start_egress) {
      auto started_proxy = supervise::Egress::Start(plan, options, std::move(*idle_egress), 0, terminator);
      idle_egress.reset();
      if (started_proxy.ok()) {
        egress = std::move(*started_proxy);
      } else {
        proxy_error = started_proxy.status();
      }
    }
    if (i_proxy >= 0 && fds[i_proxy].revents) {
      proxy_open = false;
      auto listeners = linux::ReceiveEgressListeners(child.proxy_listeners.get());
      // Served from the first connection, query or connect() on: a sandbox
      // that uses none starts no egress thread at all.
      if (listeners.ok()) idle_egress = EgressFds(plan, *listeners, &child);
      // Nothing received: the runner failed before, and says why on the status pipe.
    }
    if (i_status >= 0 && fds[i_status].revents) {
      status_open = status.Read(child.status.get(), &messages);
      linux::phases::Mark("status read");
      if (!exited && leave_runner && !messages.empty() && messages.back().type == linux::RunnerMessage::Type::kExit &&
          messages.back().sandbox_empty) {
        // Nothing of the sandbox runs but the runner's own exit, and this
        // is the last the runner says.
        exited = runner_left = true;
        status_open = false;
        drain_until = Clock::now() + std::chrono::milliseconds(kDrainAfterExitMs);
      }
    }
    if (i_err >= 0 && fds[i_err].revents) {
      ssize_t got = read(child.stderr_pipe.get(), buf, sizeof(buf));
      if (got <= 0) {
        stderr_open = false;
      } else {
        WriteAll(options.stderr_fd, buf, static_cast<size_t>(got));
        scanner.Feed(buf, static_cast<size_t>(got));
      }
    }
    if (i_pid >= 0 && fds[i_pid].revents) {
      exited = true;
      // Pid 1 is gone, so is everything in its namespace; pipes close at once.
      // Unconfined children may leave holders behind: bound the wait.
      drain_until = Clock::now() + std::chrono::milliseconds(kDrainAfterExitMs);
    }
    if (i_sig >= 0 && fds[i_sig].revents) {
      struct signalfd_siginfo si {};
      while (read(sigfd.get(), &si, sizeof(si)) == sizeof(si)) {
        if (!exited) linux::PidfdSendSignal(child.pidfd.get(), static_cast<int>(si.ssi_signo));
      }
    }
  }
  scanner.Finish();

  int wstatus = 0;
  struct rusage ru {};
  linux::phases::Mark("loop done");
  const linux::RunnerMessage* end = nullptr;
  for (const auto& m : messages) {
    if (m.type == linux::RunnerMessage::Type::kExit) end = &m;
  }
  if (runner_left && wait4(child.pid, &wstatus, WNOHANG, &ru) <= 0) {
    // Still releasing its namespaces: its usage is the one it reported.
    ru.ru_utime = {static_cast<time_t>(end->cpu_user_us / 1000000), static_cast<suseconds_t>(end->cpu_user_us % 1000000)};
    ru.ru_stime = {static_cast<time_t>(end->cpu_sys_us / 1000000), static_cast<suseconds_t>(end->cpu_sys_us % 1000000)};
    ru.ru_maxrss = static_cast<long>(end->max_rss_kib);
  } else {
    while (wait4(child.pid, &wstatus, 0, &ru) < 0 && errno == EINTR) {
    }
  }
  linux::phases::Mark("reaped");
  out.usage.wall_ms = Ms(Clock::now() - started);
  supervise::FillRusage(ru, &out.usage);
  // Pid 1 is reaped: its namespace is empty. Read the counters before the
  // cgroup goes (KillAll first: an unconfined plan's stragglers).
  linux::CgroupStats cg_stats;
  if (cgroup) {
    cgroup->KillAll();
    cg_stats = cgroup->ReadStats();
  }
  supervise::FillUsage(plan, cgroup.get(), cg_stats, &out.usage);
  out.denials = std::move(scanner.denials());

  const linux::RunnerMessage* setup_error = nullptr;
  const linux::RunnerMessage* exec_error = nullptr;
  const linux::RunnerMessage* exit_msg = nullptr;
  for (const auto& m : messages) {
    if (m.type == linux::RunnerMessage::Type::kSetupError && !setup_error) setup_error = &m;
    if (m.type == linux::RunnerMessage::Type::kExecError && !exec_error) exec_error = &m;
    if (m.type == linux::RunnerMessage::Type::kExit) exit_msg = &m;
    if (m.type == linux::RunnerMessage::Type::kLandlock) {
      std::string what;
      for (const auto& s : m.short_of_plan) what += (what.empty() ? "" : "; ") + s;
      out.enforcement.missing.push_back(
          {"filesystem", "Landlock on this kernel (ABI " + std::to_string(m.landlock_abi) +
                             ") is short of the plan (ABI " + std::to_string(plan.landlock.abi) + "): " + what});
    }
    if (m.type == linux::RunnerMessage::Type::kSeccompDenials) {
      // First, so that a flood of stderr lines cannot crowd them out.
      std::vector<Denial> seccomp;
      for (const auto& [name, count] : m.denied) {
        seccomp.push_back(linux::SeccompDenial(name, count));
      }
      out.denials.insert(out.denials.begin(), seccomp.begin(), seccomp.end());
    }
  }

  if (quota->quota) {
    if (auto full = supervise::WorkspaceQuotaFull(*quota->quota, plan.workspace_quota->bytes, plan.workspace_target)) {
      out.denials.push_back(std::move(*full));
    }
    if (Status s = quota->quota->End(); !s.ok()) {
      // The record stays; `agentbox gc` tries again.
      const std::string line = "agentbox: disk_gib: restoring the workspace's project ids failed (agentbox gc "
                               "retries): " + s.ToString() + "\n";
      WriteAll(options.stderr_fd, line.data(), line.size());
    }
  }
  if (plan.confined && plan.workspace_overlay && plan.workspace_overlay->tmpfs_bytes) {
    // Before the git audit: what is applied is what it audits.
    SettleOverlay(plan, child,
                  EndOfRun(setup_error || proxy_error, timed_out, cg_stats.oom_kills, exit_msg), &out);
  }
  linux::phases::Mark("counters");
  const bool git_denied = AuditGitRepos(plan, child.resolved.git_dirs, child.resolved.scan_caches.get(), &out);
  linux::phases::Mark("git audit");

  // The runner is gone: close the proxy (every connection's record is in),
  // before the report is built.
  if (egress) {
    egress->Stop();
    supervise::AddNetworkReport(egress->records(), &out);
    if (!options.network_log.empty()) {
      if (Status s = supervise::WriteNetworkLog(options.network_log, egress->records()); !s.ok()) {
        const std::string line = "agentbox: " + s.message() + "\n";
        WriteAll(options.stderr_fd, line.data(), line.size());
      }
    }
  } else if (proxied || plan.network.broker) {
    out.network = NetworkConnections{};
  }
  if (proxy_error) {
    out.kind = OutcomeKind::kSandboxError;
    out.error = ErrorInfo{proxy_error->stage(), proxy_error->message(), proxy_error->err()};
    return out;
  }

  // Classification order (DESIGN §4): infrastructure first, then the clock,
  // then denials, then the command's own ending.
  if (setup_error) {
    out.kind = OutcomeKind::kSandboxError;
    out.error = ErrorInfo{setup_error->status.stage(), setup_error->status.message(), setup_error->status.err()};
    // The runner only knows that no program came; the supervisor knows why.
    if (setup_error->status.stage() == "seccomp" && !child.filter_error.ok()) {
      out.error = ErrorInfo{"seccomp", child.filter_error.message(), child.filter_error.err()};
    }
    return out;
  }
  if (timed_out) {
    out.kind = OutcomeKind::kTimedOut;
    if (exit_msg && exit_msg->signal) out.signal = exit_msg->signal;
    if (exit_msg && !exit_msg->signal) out.exit_code = exit_msg->exit_code;
    out.error = ErrorInfo{"timeout", "wall clock of " + std::to_string(*plan.timeout_ms) + " ms reached", 0};
    return out;
  }
  // From the cgroup's own counter, never guessed from a SIGKILL: an OOM
  // kill anywhere in the sandbox (a pipeline's first stage, or pid 1 itself)
  // counts, whatever the top process did afterwards.
  if (cg_stats.oom_kills > 0) {
    out.kind = OutcomeKind::kOomKilled;
    if (exit_msg && exit_msg->signal) out.signal = exit_msg->signal;
    if (exit_msg && !exit_msg->signal) out.exit_code = exit_msg->exit_code;
    out.error = ErrorInfo{"oom", std::to_string(cg_stats.oom_kills) + " process(es) killed by the kernel's OOM "
                                     "killer at the sandbox's memory limit of " +
                                     std::to_string(plan.limits.memory_max_bytes.value_or(0)) + " bytes", 0};
    out.denials.push_back(supervise::OomDenial(plan.limits.memory_max_bytes.value_or(0), cg_stats.oom_kills));
    return out;
  }
  if (!exit_msg) {
    out.kind = OutcomeKind::kSandboxError;
    std::string how = WIFSIGNALED(wstatus) ? "killed by signal " + std::to_string(WTERMSIG(wstatus))
                                           : "exited with " + std::to_string(WEXITSTATUS(wstatus));
    out.error = ErrorInfo{"runner", "the sandbox runner ended before reporting the command's exit (" + how + ")", 0};
    return out;
  }
  if (exit_msg->signal) {
    out.signal = exit_msg->signal;
  } else {
    out.exit_code = exit_msg->exit_code;
  }
  if (exec_error) {
    std::string msg = exec_error->status.message();
    if (exec_error->status.err() == ENOENT) {
      msg += " — not found inside the sandbox (it may exist on the host but not be mounted)";
    }
    out.error = ErrorInfo{"exec", msg, exec_error->status.err()};
  }
  const bool failed = out.signal.has_value() || out.exit_code.value_or(0) != 0;
  // A repository's hook or config written during the run is a denial even
  // when the command succeeded: it was planted, and is now quarantined.
  if (((failed && !out.denials.empty()) || git_denied) && plan.denial_outcome) {
    out.kind = OutcomeKind::kSandboxDenied;
  } else {
    out.kind = out.signal ? OutcomeKind::kSignaled : OutcomeKind::kExited;
  }
  return out;
}

// The outcome of a run refused in preparation (nothing was launched).
static Outcome PrepareFailed(const Plan& plan, const Status& why) {
  Outcome out;
  out.policy_sha256 = plan.policy_sha256;
  out.kind = OutcomeKind::kSandboxError;
  out.error = ErrorInfo{why.stage(), why.message(), why.err()};
  return out;
}

Outcome RunPlan(const Plan& plan, const std::vector<std::string>& argv,
                const std::vector<Signature>& denial_signatures, const RunOptions& options) {
  if (plan.confined && plan.backend == Backend::kGvisor) {
    return supervise::RunGvisor(plan, argv, denial_signatures, options);
  }
  if (plan.confined && plan.backend == Backend::kMicrovm) {
    return supervise::RunMicrovm(plan, argv, denial_signatures, options);
  }
  if (!plan.confined || plan.backend != Backend::kLandlockOnly) {
    if (!plan.network.terminate) return RunPrepared(plan, argv, denial_signatures, options, std::nullopt, nullptr);
    // The CA and the placeholders exist from here on: before the runner is
    // cloned (it does not exec), and before any thread.
    Plan prepared = plan;
    auto terminator = supervise::PrepareCredentials(&prepared);
    if (!terminator.ok()) return PrepareFailed(plan, terminator.status());
    return RunPrepared(prepared, argv, denial_signatures, options, std::nullopt, std::move(*terminator));
  }
  // Landlock-only: a private directory for this run, removed (with whatever
  // is in it) once the runner and everything it left are gone.
  auto dir = supervise::PrivateDir::Create(plan.private_dir_parent.empty() ? "/tmp" : plan.private_dir_parent);
  if (!dir.ok()) {
    Outcome out;
    out.policy_sha256 = plan.policy_sha256;
    out.error = ErrorInfo{dir.status().stage(), dir.status().message(), dir.status().err()};
    return out;
  }
  Plan with_dir = plan;
  AdoptPrivateDir(&with_dir, (*dir)->path());
  if (!with_dir.network.proxy) return RunPrepared(with_dir, argv, denial_signatures, options, std::nullopt, nullptr);
  // No network namespace to put the proxy's listeners in: they are bound on
  // the host's loopback, on ports of this run, which the plan then allows
  // (Landlock's port rules, the runner's connect() mediation, the variables).
  auto listeners = linux::BindHostProxyListeners();
  if (!listeners.ok()) {
    Outcome out;
    out.policy_sha256 = plan.policy_sha256;
    out.kind = OutcomeKind::kSandboxError;
    out.error = ErrorInfo{listeners.status().stage(), listeners.status().message(), listeners.status().err()};
    return out;
  }
  AdoptProxyPorts(&with_dir, listeners->ports);
  auto terminator = supervise::PrepareCredentials(&with_dir);
  if (!terminator.ok()) return PrepareFailed(plan, terminator.status());
  return RunPrepared(with_dir, argv, denial_signatures, options, std::move(*listeners), std::move(*terminator));
}

Outcome Run(const ConfinedCommand& command, const RunOptions& options) {
  Outcome out = RunPlan(command.plan, command.plan.argv, command.denial_signatures, options);
  // Once every denial is in: the escalation offer of each (on_violation).
  // The denials it drops were missing files: with none left, the command
  // simply failed.
  AttachOffers(command.plan, &out.denials);
  if (out.kind == OutcomeKind::kSandboxDenied && out.denials.empty()) {
    out.kind = out.signal ? OutcomeKind::kSignaled : OutcomeKind::kExited;
  }
  std::vector<std::string> skipped = std::move(out.enforcement.skipped);
  std::vector<MissingFacet> found_at_run = std::move(out.enforcement.missing);
  std::vector<std::string> noted_at_run = std::move(out.enforcement.notes);
  out.enforcement = command.enforcement;
  out.enforcement.skipped = std::move(skipped);
  // What a microVM's guest found of its own second fence (its kernel's Landlock ABI).
  for (auto& n : noted_at_run) out.enforcement.notes.push_back(std::move(n));
  // What the runner found short of the plan lowers the facet and the level.
  for (auto& m : found_at_run) AddMissing(&out.enforcement, std::move(m));
  return out;
}

}  // namespace agentbox
