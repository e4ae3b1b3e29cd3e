// The runner: pid 1 of the sandbox.
//
// One linear sequence of named steps, each returning a Status; the first
// failure is written to the status pipe (step, syscall, path, errno) and the
// runner exits, which kills everything in its pid namespace. Then it forks
// the command, reaps every orphan, forwards termination signals, and reports
// the command's exit on the status pipe.
#include "linux/runner.h"

#include <fcntl.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <map>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "linux/capabilities.h"
#include "linux/compat.h"
#include "linux/descendants.h"
#include "linux/graft.h"
#include "linux/landlock_ruleset.h"
#include "linux/mounts.h"
#include "linux/namespaces.h"
#include "linux/phases.h"
#include "linux/proxy_listeners.h"
#include "linux/pty.h"
#include "linux/seccomp_filter.h"
#include "linux/seccomp_notify.h"
#include "linux/session_shell.h"
#include "linux/status_pipe.h"

extern char** environ;

namespace agentbox::linux {
namespace {

// Signals the runner forwards to the command's process group.
constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

[[noreturn]] void Fail(int status_fd, const Status& s) {
  WriteMessage(status_fd, {RunnerMessage::Type::kSetupError, s});
  _exit(125);
}

// The parent may have died before PR_SET_PDEATHSIG took effect: the lifeline
// pipe (write end held only by the supervisor) tells.
Status TieToSupervisor(int lifeline_fd) {
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0) return Status::Errno("lifeline", "prctl(PR_SET_PDEATHSIG)");
  struct pollfd p = {lifeline_fd, POLLIN, 0};
  if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLIN))) {
    return Status::Error("lifeline", "the supervisor exited before the sandbox started");
  }
  return {};
}

// Keeps stdio, the status pipe, the lifeline and the channels the caller
// names (each -1 when there is none); closes every other inherited fd.
Status CloseInheritedFds(int* status_fd, int* lifeline_fd, int* proxy_fd, int* control_fd, int* seed_fd,
                         int* upper_fd) {
  // Move them out of the way first: any may already sit at 3 to 9.
  int s = fcntl(*status_fd, F_DUPFD_CLOEXEC, 10);
  int l = fcntl(*lifeline_fd, F_DUPFD_CLOEXEC, 10);
  int x = *proxy_fd >= 0 ? fcntl(*proxy_fd, F_DUPFD_CLOEXEC, 10) : -1;
  int c = *control_fd >= 0 ? fcntl(*control_fd, F_DUPFD_CLOEXEC, 10) : -1;
  int u = *seed_fd >= 0 ? fcntl(*seed_fd, F_DUPFD_CLOEXEC, 10) : -1;
  int w = *upper_fd >= 0 ? fcntl(*upper_fd, F_DUPFD_CLOEXEC, 10) : -1;
  if (s < 0 || l < 0 || (*proxy_fd >= 0 && x < 0) || (*control_fd >= 0 && c < 0) || (*seed_fd >= 0 && u < 0) ||
      (*upper_fd >= 0 && w < 0)) {
    return Status::Errno("fds", "fcntl(F_DUPFD_CLOEXEC)");
  }
  if (dup3(s, 3, O_CLOEXEC) < 0 || dup3(l, 4, O_CLOEXEC) < 0) return Status::Errno("fds", "dup3");
  *status_fd = 3;
  *lifeline_fd = 4;
  int next = 5;
  if (x >= 0) {
    if (dup3(x, next, O_CLOEXEC) < 0) return Status::Errno("fds", "dup3");
    *proxy_fd = next++;
  }
  if (c >= 0) {
    if (dup3(c, next, O_CLOEXEC) < 0) return Status::Errno("fds", "dup3");
    *control_fd = next++;
  }
  if (u >= 0) {
    if (dup3(u, next, O_CLOEXEC) < 0) return Status::Errno("fds", "dup3");
    *seed_fd = next++;
  }
  if (w >= 0) {
    if (dup3(w, next, O_CLOEXEC) < 0) return Status::Errno("fds", "dup3");
    *upper_fd = next++;
  }
  const unsigned first = static_cast<unsigned>(next);
  CloseFds(first);
  // A directory as stdin/stdout/stderr is a way out: openat(0, "..") walks
  // the host's tree whatever the mount namespace says.
  for (int fd = 0; fd <= 2; ++fd) {
    struct stat st {};
    if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
      return Status::Error("fds", "fd " + std::to_string(fd) +
                                      " is a directory: it would reach the host's filesystem "
                                      "from inside the sandbox; refusing");
    }
  }
  return {};
}

// The runner is a clone of the supervisor: its argv area holds the
// supervisor's command line (the policy, report and workspace paths), which
// the command reads in /proc/1/cmdline (or /proc/$PPID/cmdline without a pid
// namespace). Overwritten in place, in the runner's copy-on-write copy
// (PR_SET_MM would need CAP_SYS_RESOURCE in the host's user namespace). The
// area's last byte is left non-zero: the kernel then reads the area as a
// setproctitle(3) title, up to the first NUL.
Status HideSupervisorArgv() {
  UniqueFd fd(open("/proc/self/stat", O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno("runner", "open", "/proc/self/stat");
  char buf[2048];
  ssize_t n = read(fd.get(), buf, sizeof(buf) - 1);
  if (n <= 0) return Status::Errno("runner", "read", "/proc/self/stat");
  buf[n] = 0;
  // Fields after the command name (which may hold spaces and parentheses):
  // state is field 3, arg_start and arg_end are fields 48 and 49.
  const char* p = strrchr(buf, ')');
  unsigned long arg_start = 0, arg_end = 0;
  for (int field = 2; p && *p && field < 49;) {
    p = strchr(p, ' ');
    if (!p) break;
    ++p;
    ++field;
    if (field == 48) arg_start = strtoul(p, nullptr, 10);
    if (field == 49) arg_end = strtoul(p, nullptr, 10);
  }
  if (arg_start == 0 || arg_end <= arg_start + 1) {
    return Status::Error("runner", "no argv area in /proc/self/stat (fields arg_start/arg_end)");
  }
  char* area = reinterpret_cast<char*>(arg_start);
  const size_t len = arg_end - arg_start;
  memset(area, 0, len);
  memcpy(area, kRunnerName, std::min(len - 2, strlen(kRunnerName)));  // a NUL stays before the last byte
  area[len - 1] = ' ';
  return {};
}

// The inherited session keyring would let the command use the caller's keys
// (possession grants access whatever the uid): start a fresh, empty one.
Status LeaveSessionKeyring() {
  constexpr long kKeyctlJoinSessionKeyring = 1;
  if (syscall(SYS_keyctl, kKeyctlJoinSessionKeyring, nullptr) < 0 && errno != ENOSYS) {
    return Status::Errno("keyring", "keyctl(KEYCTL_JOIN_SESSION_KEYRING)");
  }
  return {};
}

// The socket the workspace overlay's upper layer goes to the supervisor on
// (run --workspace-overlay), -1 when there is none.
int UpperChannel(const ResolvedPlan& resolved) {
  for (const auto& m : resolved.mounts) {
    if (m.op.kind == MountKind::kOverlay) return m.upper_channel;
  }
  return -1;
}

// `upper_fd`: the upper layer's channel as renumbered by CloseInheritedFds.
Status BuildRoot(const Plan& plan, const ResolvedPlan& resolved, UpperFs* upper_fs, int upper_fd) {
  if (Status s = MakeMountsPrivate(); !s.ok()) return s;
  if (Status s = PivotToStagingRoot(); !s.ok()) return s;
  for (const auto& resolved_mount : resolved.mounts) {
    ResolvedMount m = resolved_mount;
    if (m.op.kind == MountKind::kOverlay) m.upper_channel = upper_fd;
    if (Status s = ApplyMount(m, plan, upper_fs); !s.ok()) {
      return s.WithContext(std::string(ToString(m.op.kind)) + " " + m.op.target + " (" + m.op.why + ")");
    }
  }
  if (Status s = ReplaceHostFiles(plan.network.dns_address, plan.hostname); !s.ok()) return s;
  if (Status s = DetachOldRoot(); !s.ok()) return s;
  return SealRoot();
}

// The layers stacked on the namespaces, Landlock first: the seccomp filter
// may forbid Landlock's own syscalls. Both cover the runner and, through
// the vfork, the command; the thread that answers the filter's
// notifications starts in between, inside Landlock and outside the filter.
// Returns that responder (null: no filter). `filter`: the supervisor's
// compiled program (null: it had none to give, and the run is refused).
Result<std::unique_ptr<NotifyResponder>> ApplyLayers(const Plan& plan, int status_fd, const BpfProgram* filter,
                                                     int broker_fd) {
  if (plan.landlock.abi > 0) {
    auto ll = ApplyLandlock(plan.landlock);
    phases::Mark("runner: landlock");
    if (!ll.ok()) return ll.status();
    if (!ll->short_of_plan.empty()) {
      std::string what;
      for (const auto& s : ll->short_of_plan) what += (what.empty() ? "" : "; ") + s;
      if (plan.landlock.required) {
        return Status::Error("landlock", "Landlock on this kernel (ABI " + std::to_string(ll->abi) +
                                             ") is short of the plan (ABI " + std::to_string(plan.landlock.abi) +
                                             "): " + what + "; the policy requires full enforcement");
      }
      RunnerMessage m;
      m.type = RunnerMessage::Type::kLandlock;
      m.landlock_abi = ll->abi;
      m.short_of_plan = ll->short_of_plan;
      WriteMessage(status_fd, m);
    }
  }
  if (!plan.seccomp.enabled) return std::unique_ptr<NotifyResponder>();
  if (!filter) {
    return Status::Error("seccomp",
                         "the supervisor has no seccomp program for this sandbox; refusing to run "
                         "without the filter");
  }
  UnixConnectRules rules;
  rules.allowed = plan.unix_sockets;
  rules.private_netns = plan.backend == Backend::kNamespaces &&
                        std::find(plan.namespaces.begin(), plan.namespaces.end(), "net") != plan.namespaces.end();
  // Landlock-only: the host's network, where only the egress proxy's ports
  // on 127.0.0.1 may be reached (Landlock allows those ports on any address).
  InetConnectRules inet;
  inet.host_network = plan.backend == Backend::kLandlockOnly;
  if (inet.host_network && plan.network.proxy) {
    inet.loopback_ports = {plan.network.proxy->http_port, plan.network.proxy->socks_port};
  }
  if (plan.network.broker) inet.broker_fd = broker_fd;
  auto responder = NotifyResponder::Start(std::move(rules), std::move(inet));
  if (!responder.ok()) return responder.status();
  auto listener = InstallSeccomp(*filter);
  if (!listener.ok()) return listener.status();
  (*responder)->Serve(std::move(*listener));
  phases::Mark("runner: seccomp loaded");
  return std::move(*responder);
}

// Pid 1 of the sandbox's pid namespace, once its command has ended: every
// other process of the namespace (the command's leftovers, whatever was
// re-parented to us) is sent SIGKILL and reaped. kill(-1) from pid 1 reaches
// each of them and no new one can be forked past it (the kernel's own
// zap_pid_ns_processes does the same when pid 1 exits); all share our uid
// and none can have left it (one mapped id, no_new_privs). Then the usage
// of us and everything we reaped, for the report (what the supervisor's
// wait4 would say).
void EmptyPidNamespace(RunnerMessage* m) {
  kill(-1, SIGKILL);
  for (;;) {
    if (waitpid(-1, nullptr, __WALL) > 0) continue;
    if (errno == EINTR) continue;
    break;  // ECHILD: nothing of the sandbox is left but us
  }
  struct rusage self {}, children {};
  getrusage(RUSAGE_SELF, &self);
  getrusage(RUSAGE_CHILDREN, &children);
  auto us = [](const struct timeval& a, const struct timeval& b) {
    return static_cast<std::uint64_t>(a.tv_sec + b.tv_sec) * 1000000 + static_cast<std::uint64_t>(a.tv_usec + b.tv_usec);
  };
  m->sandbox_empty = true;
  m->cpu_user_us = us(self.ru_utime, children.ru_utime);
  m->cpu_sys_us = us(self.ru_stime, children.ru_stime);
  m->max_rss_kib = static_cast<std::uint64_t>(std::max(self.ru_maxrss, children.ru_maxrss));
}

// The seccomp denials so far, on the status pipe (before the exit message).
void ReportDenials(int status_fd, const DenialTally& tally) {
  if (tally.counts().empty()) return;
  RunnerMessage m;
  m.type = RunnerMessage::Type::kSeccompDenials;
  for (const auto& [name, count] : tally.counts()) m.denied.emplace_back(name, count);
  WriteMessage(status_fd, m);
}

}  // namespace

std::vector<std::string> BuildEnv(const EnvRules& rules) {
  std::vector<std::string> env;
  if (rules.pass_all) {
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
  } else {
    for (const auto& name : PassedNames(rules.pass, environ)) {
      if (const char* v = getenv(name.c_str())) env.push_back(name + "=" + v);
    }
  }
  for (const auto& [k, v] : rules.set) {
    std::string prefix = k + "=";
    for (auto it = env.begin(); it != env.end();) {
      it = it->rfind(prefix, 0) == 0 ? env.erase(it) : it + 1;
    }
    env.push_back(prefix + v);
  }
  return env;
}

namespace {


std::string EnvValue(const std::vector<std::string>& env, const std::string& name) {
  for (const auto& e : env) {
    if (e.size() > name.size() && e.compare(0, name.size(), name) == 0 && e[name.size()] == '=') {
      return e.substr(name.size() + 1);
    }
  }
  return "";
}

// Everything the command's process needs, prepared before the vfork: the
// child then makes syscalls only (it shares the runner's memory until exec).
struct ExecRequest {
  std::vector<std::string> env;
  std::vector<std::string> candidates;  // execve() targets, in PATH order
  std::vector<char*> cargv, cenv;
  char exec_error_prefix[512];          // the status line, up to the errno
  int signal_scope = -1;                // a Landlock ruleset the command restricts itself to (-1: none)
  int tty_fd = -1;                      // a pty's slave: the command's stdio and controlling terminal (-1: none)
  // A session call's own (run_code): a descriptor that becomes the
  // command's fd 3, a second seccomp filter stacked before the exec, and
  // whether what the command leaves running dies with it.
  int binding_fd = -1;
  const struct sock_fprog* extra_filter = nullptr;
  bool end_with_command = false;
};

// execvpe() searches the caller's PATH, not the new environment's: search
// the sandbox's PATH ourselves.
// `call_env` ("NAME=VALUE" entries, a session call's own) is added last,
// replacing the plan's value of the same name.
void PrepareExec(const Plan& plan, const std::vector<std::string>& argv, ExecRequest* req,
                 const std::vector<std::string>& call_env = {}) {
  req->env = BuildEnv(plan.env);
  for (const auto& entry : call_env) {
    const std::string prefix = entry.substr(0, entry.find('=') + 1);
    if (prefix.empty()) continue;
    std::erase_if(req->env, [&](const std::string& e) { return e.compare(0, prefix.size(), prefix) == 0; });
    req->env.push_back(entry);
  }
  for (const auto& a : argv) req->cargv.push_back(const_cast<char*>(a.c_str()));
  req->cargv.push_back(nullptr);
  for (const auto& e : req->env) req->cenv.push_back(const_cast<char*>(e.c_str()));
  req->cenv.push_back(nullptr);
  const std::string& file = argv[0];
  if (file.find('/') != std::string::npos) {
    req->candidates.push_back(file);
  } else {
    std::string path = EnvValue(req->env, "PATH");
    if (path.empty()) path = "/usr/bin:/bin";
    size_t start = 0;
    while (start <= path.size()) {
      size_t colon = path.find(':', start);
      if (colon == std::string::npos) colon = path.size();
      std::string dir = path.substr(start, colon - start);
      req->candidates.push_back((dir.empty() ? "." : dir) + "/" + file);
      start = colon + 1;
    }
  }
  // JSON-escape the command name once, here, for the exec error line.
  std::string name;
  for (char c : file.substr(0, 200)) {
    if (c == '"' || c == '\\') name += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    name += c;
  }
  std::snprintf(req->exec_error_prefix, sizeof(req->exec_error_prefix),
                "{\"t\":\"exec_error\",\"stage\":\"exec\",\"syscall\":\"execve\",\"path\":\"%s\",\"message\":\"\",\"errno\":",
                name.c_str());
}

// Sets one variable of a prepared request's environment (the pointers are
// built again: the strings may move).
void SetEnv(ExecRequest* req, const std::string& name, const std::string& value) {
  const std::string prefix = name + "=";
  bool found = false;
  for (auto& e : req->env) {
    if (e.compare(0, prefix.size(), prefix) == 0) {
      e = prefix + value;
      found = true;
    }
  }
  if (!found) req->env.push_back(prefix + value);
  req->cenv.clear();
  for (const auto& e : req->env) req->cenv.push_back(const_cast<char*>(e.c_str()));
  req->cenv.push_back(nullptr);
}

// The end of every command's process: default signals, the original mask,
// then exec along the PATH candidates; on failure one exec_error line on
// `report_fd` and exit 127 (not found) or 126. Syscalls only (vfork).
[[noreturn]] void ExecOrReport(const ExecRequest& req, int report_fd, const sigset_t& original_mask) {
  for (int sig : kForwarded) signal(sig, SIG_DFL);
  signal(SIGCHLD, SIG_DFL);
  signal(SIGPIPE, SIG_DFL);
  sigprocmask(SIG_SETMASK, &original_mask, nullptr);
  int saved = ENOENT;
  for (const auto& candidate : req.candidates) {
    execve(candidate.c_str(), req.cargv.data(), req.cenv.data());
    if (errno == EACCES || errno == ENOEXEC || errno == EPERM || req.candidates.size() == 1) saved = errno;
  }
  char line[600];
  int n = std::snprintf(line, sizeof(line), "%s%d}\n", req.exec_error_prefix, saved);
  if (n > 0) (void)!write(report_fd, line, static_cast<size_t>(std::min(n, static_cast<int>(sizeof(line)) - 1)));
  _exit(saved == ENOENT ? 127 : 126);
}

// The command's process: a new session (no controlling terminal to inject
// keystrokes into), default signals, then exec. No capability to drop: the
// runner dropped them all (bounding set and securebits included) before the
// vfork. Runs on the runner's memory: syscalls only, no allocation. Under
// the seccomp filter already, while the runner (the listener's holder)
// waits for the exec: none of these calls may be one the filter notifies.
[[noreturn]] void CommandChild(const ExecRequest& req, bool new_session, int status_fd,
                               const sigset_t& original_mask) {
  if ((new_session || req.tty_fd >= 0) && setsid() < 0) {
    static const char kMsg[] =
        "{\"t\":\"setup_error\",\"stage\":\"session\",\"syscall\":\"setsid\",\"path\":\"\",\"message\":\"\",\"errno\":1}\n";
    (void)!write(status_fd, kMsg, sizeof(kMsg) - 1);
    _exit(125);
  }
  // run --tty: the sandbox's own pty becomes the controlling terminal of
  // the command's new session (and its group the foreground one), so job
  // control and window sizes work; the caller's terminal is not reachable.
  if (req.tty_fd >= 0 &&
      (ioctl(req.tty_fd, TIOCSCTTY, 0) != 0 || dup2(req.tty_fd, STDIN_FILENO) < 0 ||
       dup2(req.tty_fd, STDOUT_FILENO) < 0 || dup2(req.tty_fd, STDERR_FILENO) < 0)) {
    static const char kMsg[] =
        "{\"t\":\"setup_error\",\"stage\":\"pty\",\"syscall\":\"ioctl(TIOCSCTTY)/dup2\",\"path\":\"/dev/pts\",\"message\":\"\",\"errno\":1}\n";
    (void)!write(status_fd, kMsg, sizeof(kMsg) - 1);
    _exit(125);
  }
  if (req.signal_scope >= 0 && RestrictSelfTo(req.signal_scope) != 0) {
    static const char kMsg[] =
        "{\"t\":\"setup_error\",\"stage\":\"landlock\",\"syscall\":\"landlock_restrict_self\",\"path\":\"\",\"message\":\"the command's signal scope\",\"errno\":1}\n";
    (void)!write(status_fd, kMsg, sizeof(kMsg) - 1);
    _exit(125);
  }
  ExecOrReport(req, status_fd, original_mask);
}

// vfork: the child borrows the runner's memory until it execs, which spares
// copying the page tables. Kept in a frame of its own that returns at once,
// so nothing of the caller's is live across the vfork.
__attribute__((noinline)) pid_t SpawnCommand(const ExecRequest& req, bool new_session, int status_fd,
                                             const sigset_t& mask) {
  pid_t pid = vfork();
  if (pid == 0) CommandChild(req, new_session, status_fd, mask);
  return pid;
}

// What the set-up leaves for the loop: the filter's responder (null: no
// filter), the signalfd, and the signal mask the command starts with.
struct SetUpResult {
  std::unique_ptr<NotifyResponder> responder;
  UniqueFd sigfd;
  sigset_t original;
  UniqueFd oom_score;  // a session's init: its own /proc/self/oom_score_adj (OomScoreForChild)
};

// A session call's processes (its keeper and what it starts, a file tool's
// process, the persistent shell's keeper) go first when the kernel's OOM
// killer must choose in the session's cgroup. A world's init is pid 1 of its
// own pid namespace only, which the killer does not exempt; with the
// memory held by files in a capped upper layer it scored as high as any
// call's process, and its death ended the whole world. The init raises its
// own score to 1000 for each fork of such a process, which keeps it, and
// lowers it to 0 again at once (no privilege is needed to go back to 0). It
// writes through a descriptor opened while it was still dumpable: after
// that its /proc files belong to root, which an unprivileged user's world
// does not map. No call's process holds that descriptor (each closes every
// descriptor it was not given).
class OomScoreForChild {
 public:
  explicit OomScoreForChild(int fd) : fd_(fd) { Write("1000"); }
  ~OomScoreForChild() { Write("0"); }
  OomScoreForChild(const OomScoreForChild&) = delete;
  OomScoreForChild& operator=(const OomScoreForChild&) = delete;

 private:
  void Write(const char* value) const {
    if (fd_ >= 0) (void)!write(fd_, value, std::strlen(value));
  }
  int fd_;
};

// fork() of a call's process by a session's init (`oom_score_fd`: its own
// score, or -1), with the score that puts it before the init (above).
pid_t ForkCallProcess(int oom_score_fd) {
  OomScoreForChild score(oom_score_fd);
  return fork();
}

// Every set-up step, in order; a failure is reported and ends the runner.
// `upper_fs`: a session's upper layer with a size of its own (null: none).
SetUpResult SetUpSandbox(const Plan& plan, const ResolvedPlan& resolved, int* status_fd, int* lifeline_fd,
                         const BpfProgram* filter, int* proxy_fd, int* control_fd, UpperFs* upper_fs) {
  // Step order matters: the id maps come first (nothing else is permitted
  // before them), procfs is mounted while the host root is still attached,
  // and the working directory is entered only once the final root exists.
  // The supervisor blocks the signals it forwards; start from a clean mask.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (Status s = TieToSupervisor(*lifeline_fd); !s.ok()) Fail(*status_fd, s);
  // (gVisor's procfs shows no argv area; its world's init runs agentbox's
  // own binary there, bound in, with nothing of the caller's in its argv.)
  if (!(plan.gvisor && plan.gvisor->inside)) {
    if (Status s = HideSupervisorArgv(); !s.ok()) Fail(*status_fd, s);
  }
  // Out of the supervisor's process group: a terminal's ^C reaches the
  // supervisor alone, which forwards it once.
  setpgid(0, 0);
  int no_seed = -1;
  int upper_fd = UpperChannel(resolved);
  if (Status s = CloseInheritedFds(status_fd, lifeline_fd, proxy_fd, control_fd,
                                   upper_fs ? &upper_fs->seed_fd : &no_seed, &upper_fd);
      !s.ok()) {
    Fail(*status_fd, s);
  }
  // Landlock-only: no namespaces, so no id maps, root, loopback or hostname.
  const bool namespaced = plan.confined && plan.backend == Backend::kNamespaces;
  phases::Mark("runner: fds");
  if (namespaced) {
    if (Status s = WriteIdMaps(plan.uid, plan.gid); !s.ok()) Fail(*status_fd, s);
    phases::Mark("runner: id maps");
  }
  // A session's init: its OOM score, opened while it may (OomScoreForChild).
  UniqueFd oom_score;
  if (upper_fs) oom_score.reset(open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC));
  // Nobody inside may ptrace us, read our memory or /proc/1/fd, or forge our
  // status pipe. (After the id maps: a non-dumpable process cannot open its
  // own /proc/self/uid_map.)
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) Fail(*status_fd, Status::Errno("runner", "prctl(PR_SET_DUMPABLE)"));
  if (plan.confined && !namespaced) {
    // Orphans re-parent to us rather than to the host's init, so that what
    // the command leaves running can be found and killed at the end.
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
      Fail(*status_fd, Status::Errno("runner", "prctl(PR_SET_CHILD_SUBREAPER)"));
    }
    if (Status s = LeaveSessionKeyring(); !s.ok()) Fail(*status_fd, s);
  }
  if (namespaced) {
    if (Status s = BuildRoot(plan, resolved, upper_fs, upper_fd); !s.ok()) Fail(*status_fd, s);
    phases::Mark("runner: mounts+pivot");
    // The earlier world's upper layer is copied: nothing here needs it again.
    if (upper_fs && upper_fs->seed_fd >= 0) {
      close(upper_fs->seed_fd);
      upper_fs->seed_fd = -1;
    }
    if (upper_fd >= 0) close(upper_fd);  // sent: the supervisor holds the layer now
    // A network namespace of the run's own starts with its loopback down
    // (without one, as in a microVM's guest, the loopback is the init's).
    if (std::find(plan.namespaces.begin(), plan.namespaces.end(), "net") != plan.namespaces.end()) {
      if (Status s = BringUpLoopback(); !s.ok()) Fail(*status_fd, s);
    }
    // The egress proxy's listeners, bound on this namespace's loopback and
    // handed to the supervisor; none stays open in here.
    if (*proxy_fd >= 0 && (plan.network.proxy || !plan.network.dns_address.empty())) {
      if (Status s = SendEgressListeners(*proxy_fd, plan.network); !s.ok()) Fail(*status_fd, s);
      // With the broker the same socket goes on carrying its requests.
      if (!plan.network.broker) {
        close(*proxy_fd);
        *proxy_fd = -1;
      }
    }
    // Empty when the probe found sethostname refused (the report says so).
    if (!plan.hostname.empty()) {
      if (Status s = SetHostname(plan.hostname); !s.ok()) Fail(*status_fd, s);
    }
    if (Status s = LeaveSessionKeyring(); !s.ok()) Fail(*status_fd, s);
  }
  // On both backends: the daemon knows a sandbox's processes by this name
  // above them (EnclosingRunner), and refuses them.
  phases::Mark("runner: net+hostname");
  if (plan.confined) prctl(PR_SET_NAME, kRunnerName, 0, 0, 0);
  if (chdir(plan.cwd.c_str()) != 0) Fail(*status_fd, Status::Errno("cwd", "chdir", plan.cwd));

  SetUpResult out;
  out.oom_score = std::move(oom_score);
  sigset_t mask;
  sigemptyset(&mask);
  for (int sig : kForwarded) sigaddset(&mask, sig);
  sigaddset(&mask, SIGCHLD);
  if (plan.tty) sigaddset(&mask, SIGWINCH);  // the caller's terminal was resized
  sigprocmask(SIG_BLOCK, &mask, &out.original);

  // Set-up is done: neither the runner nor the command needs any privilege
  // from here on. Dropped once, before the fork, so that both are covered.
  // DropAllCapabilities also sets no_new_privs, which Landlock and seccomp need.
  if (plan.confined) {
    if (Status s = DropAllCapabilities(); !s.ok()) Fail(*status_fd, s);
    phases::Mark("runner: caps");
    auto layers = ApplyLayers(plan, *status_fd, filter, *proxy_fd);
    if (!layers.ok()) Fail(*status_fd, layers.status());
    out.responder = std::move(*layers);
  }
  out.sigfd.reset(signalfd(-1, &mask, SFD_CLOEXEC));
  if (!out.sigfd.valid()) Fail(*status_fd, Status::Errno("runner", "signalfd"));
  return out;
}

}  // namespace

void RunnerMain(const Plan& plan, const ResolvedPlan& resolved, const std::vector<std::string>& argv, int status_fd,
                int lifeline_fd, const BpfProgram* filter, int proxy_fd) {
  int no_control = -1;
  SetUpResult set_up = SetUpSandbox(plan, resolved, &status_fd, &lifeline_fd, filter, &proxy_fd, &no_control, nullptr);
  const bool namespaced = plan.confined && plan.backend == Backend::kNamespaces;
  NotifyResponder* responder = set_up.responder.get();
  UniqueFd& sigfd = set_up.sigfd;
  const sigset_t& original = set_up.original;

  ExecRequest request;
  PrepareExec(plan, argv, &request);
  // Landlock-only: no pid namespace makes the runner the command's init, and
  // a command that could kill it would leave the runner's tree (and with it
  // what the daemon knows a sandbox by). The command gets a nested domain
  // that scopes its signals: the runner is outside it.
  UniqueFd signal_scope;
  if (plan.confined && !namespaced && plan.landlock.abi >= 6) {
    auto scope = SignalScopeRuleset();
    if (!scope.ok()) Fail(status_fd, scope.status());
    signal_scope = std::move(*scope);
    request.signal_scope = signal_scope.get();
  }
  // run --tty: a pty of the sandbox's own devpts, opened here (after the
  // root is built, under the layers: /dev/ptmx and /dev/pts are device
  // rules of the Landlock plan); the runner relays it to its own stdio.
  PtyPair pty;
  std::optional<PtyRelay> relay;
  if (plan.tty) {
    auto opened = OpenPty();
    if (!opened.ok()) Fail(status_fd, opened.status());
    pty = std::move(*opened);
    request.tty_fd = pty.slave.get();
    relay.emplace(pty.master.get(), STDIN_FILENO, STDOUT_FILENO);
    // A reader of our stdout that went away ends the relay's output, not
    // the runner (the command gets SIG_DFL back before its exec).
    signal(SIGPIPE, SIG_IGN);
  }
  phases::Mark("runner: spawn");
  pid_t child = SpawnCommand(request, plan.confined, status_fd, original);
  phases::Mark("runner: exec'd");
  if (child < 0) Fail(status_fd, Status::Errno("fork", "vfork"));
  pty.slave.reset();  // the command's now: its last holder's exit ends the master's output
  // Reap everything; forward termination signals to the command's group;
  // answer the filter's notifications (the callers wait for us).
  DenialTally tally;
  auto count_records = [&] {
    if (!responder) return;
    for (const auto& r : responder->Take()) tally.Count(r.denial);
  };
  std::vector<struct pollfd> fds;
  for (;;) {
    fds.assign({{sigfd.get(), POLLIN, 0}, {responder ? responder->ready_fd() : -1, POLLIN, 0}});
    if (relay) relay->AddPollFds(&fds);
    if (poll(fds.data(), fds.size(), -1) < 0) continue;
    if (fds[1].revents & POLLIN) count_records();
    if (relay) relay->Handle(&fds[2]);
    if (!(fds[0].revents & POLLIN)) continue;
    struct signalfd_siginfo info {};
    if (read(sigfd.get(), &info, sizeof(info)) != sizeof(info)) continue;
    const int sig = static_cast<int>(info.ssi_signo);
    if (sig == SIGWINCH) {
      if (relay) relay->Resize();
      continue;
    }
    if (sig != SIGCHLD) {
      if (kill(-child, sig) != 0) kill(child, sig);
      continue;
    }
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      if (pid != child) continue;
      phases::Mark("runner: command reaped");
      // The command's calls were all recorded before they were answered.
      count_records();
      if (relay) relay->Drain();
      // No pid namespace to end with us: kill what the command left running.
      if (plan.confined && !namespaced) KillDescendants(getpid());
      ReportDenials(status_fd, tally);
      RunnerMessage m;
      m.type = RunnerMessage::Type::kExit;
      if (WIFEXITED(status)) m.exit_code = WEXITSTATUS(status);
      if (WIFSIGNALED(status)) m.signal = WTERMSIG(status);
      // The init of a pid namespace of its own: what the command left
      // running is killed and reaped here, before the exit is reported, so
      // that the report's end is the sandbox's. The supervisor can then
      // finish without waiting for the kernel to release the namespaces
      // after us (agentbox/run.h, RunnerTeardown).
      if (getpid() == 1) {
        EmptyPidNamespace(&m);
        // The stderr pipe and every other descriptor but the status pipe
        // end now, not once the kernel has released our namespaces
        // (descriptors left to exit are closed after that); this message
        // is the status pipe's last. The supervisor then has all it needs
        // without waiting for us to run again.
        CloseFds(0, static_cast<unsigned>(status_fd) - 1);
        CloseFds(static_cast<unsigned>(status_fd) + 1);
      }
      WriteMessage(status_fd, m);
      // Leaving pid 1 kills whatever the command left running.
      _exit(0);
    }
  }
}

namespace {

// The session's upper filesystem, to the caller: {"t":"upper"} with its root.
Status SendUpperFs(int control_fd, int root_fd) {
  static const char kText[] = "{\"t\":\"upper\"}";
  if (!SendWithFds(control_fd, kText, sizeof(kText) - 1, &root_fd, 1)) {
    return Status::Errno("runner", "sendmsg(SCM_RIGHTS)", "the workspace's upper layer");
  }
  return {};
}

// A session call in flight: a command's keeper (CallKeeper: the leader of
// the call's session, sid == its pid) or a file tool's forked process.
struct SessionCall {
  long id = 0;
  bool command = false;
  bool shell = false;  // the persistent shell's keeper: `id` and `result` are its current call's (-1, none: idle)
  UniqueFd result;   // the caller reads the call's end here (exit line, or the tool's JSON)
  DenialTally tally;
};

void WriteFully(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t w = write(fd, data.data() + off, data.size() - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;
    }
    off += static_cast<size_t>(w);
  }
}

// A command of a session: stdio from the caller, its own process group in
// its keeper's session, its own signal scope, then exec.
// Runs on the keeper's memory (vfork): syscalls only.
[[noreturn]] void SessionCommandChild(const ExecRequest& req, const char* cwd, int in_fd, int out_fd,
                                      int result_fd, const sigset_t& original_mask) {
  if (setpgid(0, 0) < 0 || dup2(in_fd, STDIN_FILENO) < 0 || dup2(out_fd, STDOUT_FILENO) < 0 ||
      dup2(out_fd, STDERR_FILENO) < 0) {
    static const char kMsg[] =
        "{\"t\":\"exec_error\",\"stage\":\"session\",\"syscall\":\"setpgid/dup2\",\"path\":\"\",\"message\":\"\",\"errno\":1}\n";
    (void)!write(result_fd, kMsg, sizeof(kMsg) - 1);
    _exit(125);
  }
  if (req.tty_fd >= 0) {
    // Into the terminal's foreground, as a shell puts its job there. From
    // a background group that would stop us (SIGTTOU) but for the mask;
    // ExecOrReport sets the original one again.
    sigset_t ttou;
    sigemptyset(&ttou);
    sigaddset(&ttou, SIGTTOU);
    sigprocmask(SIG_BLOCK, &ttou, nullptr);
    if (tcsetpgrp(STDIN_FILENO, getpid()) != 0) {
      static const char kMsg[] =
          "{\"t\":\"exec_error\",\"stage\":\"pty\",\"syscall\":\"tcsetpgrp\",\"path\":\"/dev/pts\",\"message\":\"\",\"errno\":1}\n";
      (void)!write(result_fd, kMsg, sizeof(kMsg) - 1);
      _exit(125);
    }
  }
  if (cwd[0] != 0 && chdir(cwd) != 0) {
    static const char kMsg[] =
        "{\"t\":\"exec_error\",\"stage\":\"cwd\",\"syscall\":\"chdir\",\"path\":\"\",\"message\":\"\",\"errno\":2}\n";
    (void)!write(result_fd, kMsg, sizeof(kMsg) - 1);
    _exit(125);
  }
  if (req.signal_scope >= 0 && RestrictSelfTo(req.signal_scope) != 0) {
    static const char kMsg[] =
        "{\"t\":\"exec_error\",\"stage\":\"landlock\",\"syscall\":\"landlock_restrict_self\",\"path\":\"\",\"message\":\"the command's signal scope\",\"errno\":1}\n";
    (void)!write(result_fd, kMsg, sizeof(kMsg) - 1);
    _exit(125);
  }
  if (req.extra_filter && syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, req.extra_filter) != 0) {
    static const char kMsg[] =
        "{\"t\":\"exec_error\",\"stage\":\"seccomp\",\"syscall\":\"seccomp(SECCOMP_SET_MODE_FILTER)\",\"path\":\"\",\"message\":\"the call's no-network filter\",\"errno\":1}\n";
    (void)!write(result_fd, kMsg, sizeof(kMsg) - 1);
    _exit(125);
  }
  if (req.binding_fd >= 0) {
    // The binding becomes fd 3, inherited; the result pipe moves off 3 first.
    if (result_fd == 3) result_fd = fcntl(3, F_DUPFD_CLOEXEC, 4);
    const int moved = req.binding_fd == 3 ? fcntl(3, F_SETFD, 0) : dup2(req.binding_fd, 3);
    if (result_fd < 0 || moved < 0) {
      static const char kMsg[] =
          "{\"t\":\"exec_error\",\"stage\":\"session\",\"syscall\":\"dup2\",\"path\":\"\",\"message\":\"the call's binding descriptor\",\"errno\":9}\n";
      if (result_fd >= 0) (void)!write(result_fd, kMsg, sizeof(kMsg) - 1);
      _exit(125);
    }
  }
  ExecOrReport(req, result_fd, original_mask);
}

// The keeper's signal to end its call: everything the call started dies.
constexpr int kEndCallSignal = SIGUSR1;

// What a background process may write to the session's background log
// before the rest is dropped (one marker line says so).
constexpr off_t kBackgroundLogCap = 64 << 20;

// Writes all of `data` to a non-blocking `fd`, waiting for room; false when
// the reader is gone.
bool WriteAllWaiting(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, data, n);
    if (w > 0) {
      data += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) {
      struct pollfd p = {fd, POLLOUT, 0};
      poll(&p, 1, -1);
      continue;
    }
    return false;
  }
  return true;
}

// What a call left running writes after the call's end: drained from the
// call's output pipe into the session's background log (-1: dropped) until
// the last writer closes it. A process of the init's (a fork of the keeper,
// outside the command's signal scope), so nothing inside can stop it and
// wedge a background process on a full pipe.
[[noreturn]] void DrainBackground(int pipe_fd, int log_fd) {
  char buf[65536];
  bool capped = false;
  for (;;) {
    ssize_t r = read(pipe_fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (log_fd < 0 || capped) continue;
    struct stat st {};
    if (fstat(log_fd, &st) == 0 && st.st_size >= kBackgroundLogCap) {
      static const char kMarker[] = "\n[agentbox: background log full (64 MiB); later output dropped]\n";
      (void)!write(log_fd, kMarker, sizeof(kMarker) - 1);
      capped = true;
      continue;
    }
    (void)!write(log_fd, buf, static_cast<size_t>(r));
  }
  _exit(0);
}

// The world's init runs in a gVisor sandbox (GvisorPlan::inside).
bool g_inside_gvisor = false;

// A session call's keeper: a process of the init's (outside the command's
// signal scope, so the command cannot stop or kill it) that leads the call's
// session and is a child subreaper, so every process the call starts stays
// below it however it forks, double-forks or leaves the session. The
// command's stdout and stderr are a pipe of the keeper's, relayed to the
// caller's. It forwards the init's signals to the command's group.
//
// When the command exits, the call ends at once with the command's status
// and the output it wrote up to its exit: what it started in the background
// lives on (re-parented to the init when the keeper exits), and what that
// writes later goes to the session's background log (DrainBackground), not
// to the caller. A call ended from outside (kEndCallSignal: a cancel, a
// timeout's kill; or a terminating signal: a timeout's SIGTERM, the world's
// stop) SIGKILLs everything below it, stopped processes included. Runs in a
// forked copy of the init, with the init's signals (kForwarded, SIGCHLD)
// blocked.
[[noreturn]] void CallKeeper(const ExecRequest& req, const char* cwd, int in_fd, int out_fd, int result_fd,
                             int log_fd, const sigset_t& original_mask) {
  // Nothing of the init's or of the other calls' descriptors (their answer
  // pipes: a file tool's caller waits for the end of its pipe) stays open
  // here: stdio (/dev/null), this call's pipes, its log and the signal scope.
  {
    auto close_from_to = [](unsigned first, unsigned last) { CloseFds(first, last); };
    int keep[] = {0, 1, 2, in_fd, out_fd, result_fd, log_fd, req.signal_scope, req.binding_fd};
    std::sort(std::begin(keep), std::end(keep));
    unsigned next = 0;
    for (int fd : keep) {
      if (fd < 0 || static_cast<unsigned>(fd) < next) continue;
      if (static_cast<unsigned>(fd) > next) close_from_to(next, static_cast<unsigned>(fd) - 1);
      next = static_cast<unsigned>(fd) + 1;
    }
    close_from_to(next, ~0U);
  }
  auto fail = [&](const char* stage, const char* syscall_name) {
    WriteFully(result_fd, std::string("{\"t\":\"exec_error\",\"stage\":\"") + stage + "\",\"syscall\":\"" +
                              syscall_name + "\",\"path\":\"\",\"message\":\"\",\"errno\":" + std::to_string(errno) +
                              "}\n");
    _exit(125);
  };
  if (setsid() < 0) fail("session", "setsid");
  // gVisor's kernel (2022) has no child subreaper: there, what a call
  // double-forks re-parents to the sandbox's init instead, and ends with
  // the sandbox (docs/isolation.md).
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 && !(g_inside_gvisor && errno == EINVAL)) {
    fail("session", "prctl(PR_SET_CHILD_SUBREAPER)");
  }
  // A terminal: the pty is the controlling terminal of the call's session
  // (the keeper leads it) and the command's stdio, with no relay; the
  // command's group takes the foreground.
  const bool terminal = req.tty_fd >= 0;
  if (terminal && ioctl(req.tty_fd, TIOCSCTTY, 0) != 0) fail("pty", "ioctl(TIOCSCTTY)");
  sigset_t wait_for;
  sigemptyset(&wait_for);
  for (int sig : kForwarded) sigaddset(&wait_for, sig);
  sigaddset(&wait_for, SIGCHLD);
  UniqueFd sigfd(signalfd(-1, &wait_for, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!sigfd.valid()) fail("session", "signalfd");
  signal(SIGPIPE, SIG_IGN);  // a caller gone mid-call: its output is dropped, the call goes on (the command resets it)
  int output[2] = {-1, -1};
  UniqueFd relay;
  if (!terminal) {
    if (pipe2(output, O_CLOEXEC) != 0) fail("session", "pipe2");
    relay.reset(output[0]);
    fcntl(out_fd, F_SETFL, fcntl(out_fd, F_GETFL) | O_NONBLOCK);
  }
  const pid_t command = vfork();
  if (command == 0) SessionCommandChild(req, cwd, in_fd, terminal ? out_fd : output[1], result_fd, original_mask);
  const int vfork_errno = errno;
  if (!terminal) close(output[1]);
  if (req.binding_fd >= 0) close(req.binding_fd);  // the command's alone: its end is the caller's EOF
  if (command < 0) {
    errno = vfork_errno;
    fail("fork", "vfork");
  }
  // The command's pid, as the sandbox sees it (a service's status).
  WriteFully(result_fd, "{\"t\":\"started\",\"pid\":" + std::to_string(command) + "}\n");
  char buf[65536];
  // Relays what the pipe holds (at most `limit` bytes); false at its end.
  auto relay_some = [&](size_t limit) {
    ssize_t r = read(relay.get(), buf, std::min(limit, sizeof(buf)));
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) return true;
    if (r <= 0) return false;
    (void)WriteAllWaiting(out_fd, buf, static_cast<size_t>(r));
    return true;
  };
  int status = 0;
  // A terminal's end is its session's: what it left running dies with it.
  bool ended = false, kill_all = terminal || req.end_with_command, relay_open = !terminal;
  while (!ended) {
    struct pollfd fds[2] = {{sigfd.get(), POLLIN, 0}, {relay.get(), POLLIN, 0}};
    if (poll(fds, relay_open ? 2 : 1, -1) < 0) continue;
    if (relay_open && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) relay_open = relay_some(sizeof(buf));
    if (!(fds[0].revents & POLLIN)) continue;
    struct signalfd_siginfo info {};
    while (read(sigfd.get(), &info, sizeof(info)) == sizeof(info)) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD) {
        int ws = 0;
        pid_t pid;
        while ((pid = waitpid(-1, &ws, WNOHANG)) > 0) {
          if (pid == command) {
            status = ws;
            ended = true;
          }
        }
      } else if (sig == kEndCallSignal) {
        status = SIGKILL;  // as if the command had been SIGKILLed
        kill(-command, SIGKILL);
        ended = kill_all = true;
      } else {
        if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT) kill_all = true;
        if (kill(-command, sig) != 0) kill(command, sig);
        kill(-command, SIGCONT);
      }
    }
  }
  if (kill_all) {
    KillDescendants(getpid());
    // What they wrote before they died; a writer outside the call's tree
    // (handed the pipe over a socket) is not waited for.
    fcntl(relay.get(), F_SETFL, fcntl(relay.get(), F_GETFL) | O_NONBLOCK);
    while (relay_open) {
      ssize_t r = read(relay.get(), buf, sizeof(buf));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      (void)WriteAllWaiting(out_fd, buf, static_cast<size_t>(r));
    }
  } else {
    // What the command wrote before it exited is in the pipe now: that much
    // is the call's output; the rest is the background's.
    int pending = 0;
    if (relay_open && ioctl(relay.get(), FIONREAD, &pending) == 0) {
      size_t left = static_cast<size_t>(pending);
      fcntl(relay.get(), F_SETFL, fcntl(relay.get(), F_GETFL) | O_NONBLOCK);
      while (left > 0) {
        ssize_t r = read(relay.get(), buf, std::min(left, sizeof(buf)));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        left -= static_cast<size_t>(r);
        (void)WriteAllWaiting(out_fd, buf, static_cast<size_t>(r));
      }
      fcntl(relay.get(), F_SETFL, fcntl(relay.get(), F_GETFL) & ~O_NONBLOCK);
    }
    // Someone still holds the pipe's write end: drain it into the log.
    struct pollfd p = {relay.get(), POLLIN, 0};
    const bool writers = relay_open && !(poll(&p, 1, 0) > 0 && (p.revents & POLLHUP) && !(p.revents & POLLIN));
    if (writers) {
      const pid_t drainer = fork();
      if (drainer == 0) {
        close(out_fd);
        close(result_fd);
        close(in_fd);
        DrainBackground(relay.get(), log_fd);
      }
    }
  }
  close(out_fd);
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    signal(sig, SIG_DFL);
    sigset_t just;
    sigemptyset(&just);
    sigaddset(&just, sig);
    sigprocmask(SIG_UNBLOCK, &just, nullptr);
    kill(getpid(), sig);
    _exit(128 + sig);
  }
  _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 125);
}

pid_t SpawnCallKeeper(const ExecRequest& req, const char* cwd, int in_fd, int out_fd, int result_fd, int log_fd,
                      const sigset_t& mask, int oom_score_fd) {
  pid_t pid = ForkCallProcess(oom_score_fd);
  if (pid == 0) CallKeeper(req, cwd, in_fd, out_fd, result_fd, log_fd, mask);
  return pid;
}

// Reads `n` bytes at `off` into `dst`; the count read (short at the end).
size_t PreadFully(int fd, char* dst, size_t n, off_t off) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = pread(fd, dst + got, n - got, off + static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

// A request that came in a memfd (at most `cap` bytes of it): its JSON
// line into `json`, and what follows the line (a write_file's content) into
// `raw`, sized once from the file's size and read in place. A 1 MiB
// content grown by appends was copied five times over, a fresh mapping
// faulted in each time.
void ReadRequestFrom(int fd, size_t cap, std::string* json, std::string* raw) {
  struct stat st {};
  const size_t size = fstat(fd, &st) == 0 ? std::min(static_cast<size_t>(st.st_size), cap + 1) : 0;
  char buf[65536];
  off_t off = 0;
  for (;;) {
    const size_t got = PreadFully(fd, buf, sizeof(buf), off);
    if (got == 0) return;
    const char* nl = static_cast<const char*>(std::memchr(buf, '\n', got));
    json->append(buf, nl ? static_cast<size_t>(nl - buf) : got);
    off += static_cast<off_t>(nl ? static_cast<size_t>(nl - buf) + 1 : got);
    if (json->size() > cap) return;
    if (nl) break;
  }
  const size_t at = static_cast<size_t>(off);
  if (size > at) {
    raw->resize(size - at);
    raw->resize(PreadFully(fd, raw->data(), raw->size(), off));
    off += static_cast<off_t>(raw->size());
  }
  // A file that grew after fstat, or one without a size: the rest in chunks.
  while (json->size() + raw->size() <= cap) {
    const size_t got = PreadFully(fd, buf, sizeof(buf), off);
    if (got == 0) break;
    raw->append(buf, got);
    off += static_cast<off_t>(got);
  }
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\u%04x", c);
      out += b;
    } else {
      out += c;
    }
  }
  return out;
}

// A command call's end, as the caller reads it: its status, its rusage
// (none for a call of the persistent shell: the shell reaps its children),
// the syscalls denied to it, and `extra` members ("key":value,...).
std::string ExitLine(int code, int sig, const struct rusage* ru, const DenialTally& tally, const std::string& extra = "") {
  std::string line = "{\"t\":\"exit\",\"code\":" + std::to_string(code) + ",\"signal\":" + std::to_string(sig);
  if (ru) {
    line += ",\"cpu_user_us\":" + std::to_string(ru->ru_utime.tv_sec * 1000000L + ru->ru_utime.tv_usec) +
            ",\"cpu_sys_us\":" + std::to_string(ru->ru_stime.tv_sec * 1000000L + ru->ru_stime.tv_usec) +
            ",\"maxrss_kb\":" + std::to_string(ru->ru_maxrss);
  }
  line += ",\"denied\":[";
  bool first = true;
  for (const auto& [name, count] : tally.counts()) {
    line += std::string(first ? "" : ",") + "{\"syscall\":\"" + JsonEscape(name) + "\",\"count\":" + std::to_string(count) + "}";
    first = false;
  }
  line += "]" + (extra.empty() ? std::string() : "," + extra) + "}\n";
  return line;
}

// op "socket": a fresh TCP socket in the sandbox's network namespace, to
// the caller on `answer_fd` ({"t":"socket"} with it, or {"t":"error"} with
// the errno). The caller connects it to a port on this namespace's loopback
// (a port bridge): nothing inside holds or sees it.
void AnswerSocketRequest(int answer_fd) {
  UniqueFd s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) {
    WriteFully(answer_fd, "{\"t\":\"error\",\"errno\":" + std::to_string(errno) + "}");
    return;
  }
  static const char kText[] = "{\"t\":\"socket\"}";
  const int fd = s.get();
  (void)SendWithFds(answer_fd, kText, sizeof(kText) - 1, &fd, 1);
}

}  // namespace

void SessionInitMain(const Plan& plan, const ResolvedPlan& resolved, int status_fd, int lifeline_fd,
                     const BpfProgram* filter, int proxy_fd, int control_fd, int upper_seed_fd,
                     const SessionHooks& hooks) {
  g_inside_gvisor = plan.gvisor && plan.gvisor->inside;
  UpperFs upper_fs;
  upper_fs.seed_fd = upper_seed_fd;
  upper_fs.copy_upper = hooks.copy_upper;
  SetUpResult set_up =
      SetUpSandbox(plan, resolved, &status_fd, &lifeline_fd, filter, &proxy_fd, &control_fd, &upper_fs);
  // The world's namespaces and root go to the supervisor first thing on
  // the control socket (it reads them before handing the socket on): a
  // grant is mounted into this world from there (linux/graft.h).
  // (Unconfined, in a gVisor sandbox: nothing is grafted into it.)
  if (plan.confined) {
    if (Status s = SendWorldNamespaces(control_fd); !s.ok()) Fail(status_fd, s);
  }
  // An upper layer with a size of its own goes to the caller next
  // on the control socket, before "ready": the caller keeps it, so that the
  // session's changes outlive this world (its diff, snapshots, the next
  // world's copy). Nothing of it stays open in here.
  if (upper_fs.root.valid()) {
    if (Status s = SendUpperFs(control_fd, upper_fs.root.get()); !s.ok()) Fail(status_fd, s);
    upper_fs.root.reset();
  }
  NotifyResponder* responder = set_up.responder.get();
  const int oom_score_fd = set_up.oom_score.get();
  UniqueFd& sigfd = set_up.sigfd;
  const sigset_t& original = set_up.original;
  // The init's own stdio is its caller's (a daemon's log, an MCP server's
  // stderr): no call may reach it, so the init keeps none of it. Every call
  // brings its own.
  {
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; fd <= 2; ++fd) {
      if (null >= 0 ? dup2(null, fd) < 0 : close(fd) != 0) Fail(status_fd, Status::Errno("runner", "dup2", "/dev/null"));
    }
    if (null > 2) close(null);
  }
  // Every command restricts itself to a nested Landlock domain that scopes
  // its signals (ABI 6 and later): it cannot stop or kill the init, a file
  // tool or its own call's keeper, nor another call's processes.
  UniqueFd signal_scope;
  if (plan.confined) {
    auto scope = SignalScopeRuleset();
    if (!scope.ok()) Fail(status_fd, scope.status());
    signal_scope = std::move(*scope);
  }
  {
    RunnerMessage ready;
    ready.type = RunnerMessage::Type::kReady;
    WriteMessage(status_fd, ready);
  }
  std::map<pid_t, SessionCall> calls;
  bool terminating = false;
  auto find_by_id = [&](long id) -> std::pair<const pid_t, SessionCall>* {
    for (auto& entry : calls) {
      if (entry.second.id == id) return &entry;
    }
    return nullptr;
  };
  // A record belongs to the call whose process made it, or whose session
  // it was in when it made it (a command's children are in its session).
  auto count_records = [&] {
    if (!responder) return;
    for (const auto& r : responder->Take()) {
      auto it = calls.find(r.pid);
      if (it == calls.end() && r.sid > 0) it = calls.find(r.sid);
      if (it != calls.end()) it->second.tally.Count(r.denial);
    }
  };

  // A no-network call's nested Landlock domain and seccomp filter (built once).
  bool no_network_ready = false;
  UniqueFd no_network_scope;
  BpfProgram no_network_program;
  struct sock_fprog no_network_fprog {};

  // The persistent shell (session.shell: persistent), started with its first call.
  pid_t shell_pid = -1;
  UniqueFd shell_sock;
  ShellHooks shell_hooks;
  shell_hooks.start_shell = [&plan, &signal_scope, &original](int script_fd, int report_fd) -> pid_t {
    ExecRequest exec;
    PrepareExec(plan, {"bash"}, &exec);
    exec.signal_scope = signal_scope.valid() ? signal_scope.get() : -1;
    UniqueFd null(open("/dev/null", O_RDWR | O_CLOEXEC));
    if (!null.valid()) return -1;
    const pid_t pid = fork();
    if (pid == 0) SessionCommandChild(exec, plan.cwd.c_str(), script_fd, null.get(), report_fd, original);
    return pid;
  };
  shell_hooks.drain = [](int fifo_fd, int log_fd) { DrainBackground(fifo_fd, log_fd); };
  shell_hooks.write_all = WriteAllWaiting;
  auto shell_call = [&]() -> SessionCall* {
    auto it = shell_pid > 0 ? calls.find(shell_pid) : calls.end();
    return it == calls.end() ? nullptr : &it->second;
  };
  // What the shell's keeper says: the shell's pid at a call's start, the call's end.
  auto read_shell = [&] {
    char text[65536];
    std::vector<UniqueFd> ignored;
    ssize_t n = RecvWithFds(shell_sock.get(), text, sizeof text, MSG_DONTWAIT, &ignored);
    if (n == 0) shell_sock.reset();  // it is gone: its SIGCHLD ends its call
    SessionCall* c = shell_call();
    if (n <= 0 || !c || !c->result.valid()) return;
    nlohmann::json m = nlohmann::json::parse(std::string_view(text, static_cast<size_t>(n)), nullptr, false);
    const std::string t = m.is_object() ? m.value("t", "") : "";
    if (t == "started") {
      WriteFully(c->result.get(), "{\"t\":\"started\",\"pid\":" + std::to_string(m.value("pid", 0)) + "}\n");
    } else if (t == "done") {
      if (m.contains("exec_error") && m["exec_error"].is_object()) WriteFully(c->result.get(), m["exec_error"].dump() + "\n");
      count_records();
      WriteFully(c->result.get(), ExitLine(m.value("code", -1), m.value("signal", 0), nullptr, c->tally,
                                           "\"shell\":" + m.value("shell", nlohmann::json::object()).dump()));
      c->result.reset();
      c->tally = DenialTally();
      c->id = -1;
    }
  };

  for (;;) {
    struct pollfd fds[4] = {{sigfd.get(), POLLIN, 0},
                            {control_fd, POLLIN, 0},
                            {responder ? responder->ready_fd() : -1, POLLIN, 0},
                            {shell_sock.get(), POLLIN, 0}};
    if (poll(fds, 4, -1) < 0) continue;
    if (fds[2].revents & POLLIN) count_records();
    if (fds[3].revents & (POLLIN | POLLHUP | POLLERR)) read_shell();

    if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      char payload[32768];
      struct iovec iov = {payload, sizeof(payload) - 1};
      alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
      struct msghdr msg {};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      ssize_t n = recvmsg(control_fd, &msg, MSG_CMSG_CLOEXEC);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
        // The caller is gone: so is the session's sandbox.
        for (auto& [pid, call] : calls) kill(call.command ? -pid : pid, SIGKILL);
        _exit(0);
      }
      std::vector<UniqueFd> received;
      for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const int* p = reinterpret_cast<const int*>(CMSG_DATA(c));
        for (size_t i = 0; i < count; ++i) received.emplace_back(p[i]);
      }
      if (n > 0 && !(msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        std::string text(payload, static_cast<size_t>(n));
        std::string raw;  // what followed the request's JSON line in its memfd
        size_t first_io = 0;
        if (text == "@" && !received.empty()) {  // the request is in a memfd
          text.clear();
          ReadRequestFrom(received[0].get(), 256u << 20, &text, &raw);
          first_io = 1;
        }
        nlohmann::json req = nlohmann::json::parse(ControlRequestJson(text), nullptr, false);
        const std::string op = req.is_object() ? req.value("op", "") : "";
        const long id = req.is_object() ? req.value("id", 0L) : 0L;
        const size_t io = received.size() - first_io;
        // exec: stdin, output, result, optionally the background log, and
        // with "binding": true the command's fd 3 last.
        const bool binding = op == "exec" && req.value("binding", false) && io >= 4;
        const size_t exec_io = binding ? io - 1 : io;
        // "net": "none" (run_code): a nested Landlock domain without TCP and
        // a second seccomp filter without sockets, made at the first such call.
        const bool no_network = op == "exec" && req.value("net", "") == "none";
        std::optional<std::string> no_network_error;
        if (no_network && !no_network_ready) {
          auto ruleset = NoNetworkRuleset();
          auto filter = NoNetworkFilter();
          if (!ruleset.ok() || !filter.ok()) {
            no_network_error = (!ruleset.ok() ? ruleset.status() : filter.status()).ToString();
          } else {
            no_network_scope = std::move(*ruleset);
            no_network_program = std::move(*filter);
            no_network_fprog.len = static_cast<unsigned short>(no_network_program.size());
            no_network_fprog.filter = no_network_program.data();
            no_network_ready = true;
          }
        }
        if (op == "exec" && no_network_error && exec_io >= 3) {
          WriteFully(received[first_io + 2].get(), "{\"t\":\"exec_error\",\"stage\":\"seccomp\",\"syscall\":\"\",\"path\":\"\",\"message\":\"" +
                                                       JsonEscape(*no_network_error) + "\",\"errno\":0}\n");
        } else if (op == "exec" && (exec_io == 3 || exec_io == 4) && req.contains("argv") && req["argv"].is_array() && !req["argv"].empty()) {
          std::vector<std::string> argv;
          for (const auto& a : req["argv"]) argv.push_back(a.is_string() ? a.get<std::string>() : a.dump());
          const std::string cwd = req.value("cwd", "");
          std::vector<std::string> call_env;
          if (req.contains("env") && req["env"].is_array()) {
            for (const auto& e : req["env"]) {
              if (e.is_string()) call_env.push_back(e.get<std::string>());
            }
          }
          ExecRequest exec;
          PrepareExec(plan, argv, &exec, call_env);
          int in = received[first_io].get(), out = received[first_io + 1].get(), res = received[first_io + 2].get();
          const int log = exec_io == 4 ? received[first_io + 3].get() : -1;
          exec.signal_scope = signal_scope.valid() ? signal_scope.get() : -1;
          if (binding) exec.binding_fd = received[first_io + exec_io].get();
          if (no_network) {
            // The nested domain scopes signals too: it replaces the signal scope.
            if (no_network_scope.valid()) exec.signal_scope = no_network_scope.get();
            exec.extra_filter = &no_network_fprog;
            exec.end_with_command = true;
          }
          pid_t child = terminating ? -1 : SpawnCallKeeper(exec, cwd.c_str(), in, out, res, log, original, oom_score_fd);
          if (child > 0) {
            SessionCall call;
            call.id = id;
            call.command = true;
            call.result = std::move(received[first_io + 2]);
            calls.emplace(child, std::move(call));
          } else {
            WriteFully(res, "{\"t\":\"exec_error\",\"stage\":\"fork\",\"syscall\":\"fork\",\"path\":\"\",\"message\":\"\",\"errno\":" +
                                std::to_string(terminating ? ESHUTDOWN : errno) + "}\n");
          }
        } else if (op == "file" && io == 1 && hooks.file_op) {
          pid_t child = terminating ? -1 : ForkCallProcess(oom_score_fd);
          if (child == 0) {
            // As the init: not traceable, its memory and /proc files closed
            // to the session's commands (inherited across fork; said again).
            prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
            for (int sig : kForwarded) signal(sig, SIG_DFL);
            signal(SIGCHLD, SIG_DFL);
            sigprocmask(SIG_SETMASK, &original, nullptr);
            // Nothing of the init's but the answer's pipe: not the control
            // socket, the filter's listener or the signalfd, which a path
            // like /proc/self/fd/N would otherwise reopen.
            const int answer_fd = fcntl(received[first_io].get(), F_DUPFD_CLOEXEC, 3);
            if (answer_fd < 0 || dup3(answer_fd, 3, O_CLOEXEC) < 0) _exit(125);
            CloseFds(4);
            FileOpAnswer answer = hooks.file_op(std::move(text), std::move(raw));
            WriteFully(3, answer.head);
            WriteFully(3, answer.body);
            _exit(0);
          }
          if (child > 0) {
            SessionCall call;
            call.id = id;
            call.result = std::move(received[first_io]);
            calls.emplace(child, std::move(call));
          } else {
            WriteFully(received[first_io].get(), "{\"kind\":\"sandbox_error\",\"error\":\"fork: " +
                                                     JsonEscape(std::strerror(terminating ? ESHUTDOWN : errno)) + "\"}");
          }
        } else if (op == "pty" && io == 2 && req.contains("argv") && req["argv"].is_array() && !req["argv"].empty()) {
          // A terminal: {"op":"pty","id","argv","cwd","cols","rows","term"}
          // with the answer's socket and the result's pipe. The pty is the
          // sandbox's own; its master goes back over the socket, its slave
          // to the command (stdio and controlling terminal).
          const int answer = received[first_io].get(), res = received[first_io + 1].get();
          struct winsize size {};
          size.ws_col = static_cast<unsigned short>(std::clamp(req.value("cols", 80), 1, 1000));
          size.ws_row = static_cast<unsigned short>(std::clamp(req.value("rows", 24), 1, 1000));
          auto pty = terminating ? Result<PtyPair>(Status::Syscall("pty", "fork", "", ESHUTDOWN)) : OpenPty(&size);
          if (!pty.ok()) {
            WriteFully(res, "{\"t\":\"exec_error\",\"stage\":\"pty\",\"syscall\":\"" +
                                JsonEscape(pty.status().syscall()) + "\",\"path\":\"/dev/ptmx\",\"message\":\"\",\"errno\":" +
                                std::to_string(pty.status().err()) + "}\n");
          } else {
            std::vector<std::string> argv;
            for (const auto& a : req["argv"]) argv.push_back(a.is_string() ? a.get<std::string>() : a.dump());
            const std::string cwd = req.value("cwd", "");
            ExecRequest exec;
            PrepareExec(plan, argv, &exec);
            const std::string term = req.value("term", "");
            if (!term.empty()) SetEnv(&exec, "TERM", term);
            exec.signal_scope = signal_scope.valid() ? signal_scope.get() : -1;
            exec.tty_fd = pty->slave.get();
            const int master = pty->master.get();
            pid_t child =
                SpawnCallKeeper(exec, cwd.c_str(), exec.tty_fd, exec.tty_fd, res, -1, original, oom_score_fd);
            static const char kPty[] = "{\"t\":\"pty\"}";
            if (child > 0 && SendWithFds(answer, kPty, sizeof(kPty) - 1, &master, 1)) {
              SessionCall call;
              call.id = id;
              call.command = true;
              call.result = std::move(received[first_io + 1]);
              calls.emplace(child, std::move(call));
            } else if (child > 0) {
              kill(child, kEndCallSignal);  // nobody holds its master: end it
              SessionCall call;
              call.id = id;
              call.command = true;
              calls.emplace(child, std::move(call));
            } else {
              WriteFully(res, "{\"t\":\"exec_error\",\"stage\":\"fork\",\"syscall\":\"fork\",\"path\":\"\",\"message\":\"\",\"errno\":" +
                                  std::to_string(errno) + "}\n");
            }
          }
        } else if (op == "shell" && (io == 3 || io == 4) && req.contains("command") && req["command"].is_string()) {
          // A call of the persistent shell: {"op":"shell","id","command","cwd","env","stdin"}
          // with stdin, output, result and optionally the background log.
          const int res = received[first_io + 2].get();
          auto refuse = [&](const char* call_name, int err) {
            WriteFully(res, std::string("{\"t\":\"exec_error\",\"stage\":\"shell\",\"syscall\":\"") + call_name +
                                "\",\"path\":\"\",\"message\":\"the session's persistent shell\",\"errno\":" +
                                std::to_string(err) + "}\n" + ExitLine(125, 0, nullptr, DenialTally()));
          };
          SessionCall* current = shell_call();
          if (terminating) {
            refuse("fork", ESHUTDOWN);
          } else if (current && current->result.valid()) {
            refuse("", EBUSY);
          } else {
            if (!current) {
              int pair[2];
              if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
                refuse("socketpair", errno);
                continue;
              }
              UniqueFd ours(pair[0]), theirs(pair[1]);
              const pid_t keeper = ForkCallProcess(oom_score_fd);
              if (keeper == 0) {
                ours.reset();
                ShellKeeperMain(theirs.get(), signal_scope.valid() ? signal_scope.get() : -1, shell_hooks);
              }
              if (keeper < 0) {
                refuse("fork", errno);
                continue;
              }
              shell_pid = keeper;
              shell_sock = std::move(ours);
              SessionCall entry;
              entry.command = entry.shell = true;
              entry.id = -1;
              current = &calls.emplace(keeper, std::move(entry)).first->second;
            }
            UniqueFd text(memfd_create("agentbox-shell-command", MFD_CLOEXEC));
            const std::string command = req["command"].get<std::string>();
            if (!text.valid() || pwrite(text.get(), command.data(), command.size(), 0) != static_cast<ssize_t>(command.size())) {
              refuse("memfd_create", errno);
              continue;
            }
            nlohmann::json call = {{"op", "call"}, {"id", id}, {"cwd", req.value("cwd", "")},
                                   {"stdin", req.value("stdin", false)}};
            if (req.contains("env")) call["env"] = req["env"];
            const std::string message = call.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
            std::vector<int> pass = {text.get(), received[first_io].get(), received[first_io + 1].get()};
            if (io == 4) pass.push_back(received[first_io + 3].get());
            if (!SendWithFds(shell_sock.get(), message.data(), message.size(), pass.data(), pass.size())) {
              refuse("sendmsg", errno);
              continue;
            }
            // Denials between calls (what earlier calls left running) are
            // nobody's: the call's tally starts now.
            count_records();
            current->tally = DenialTally();
            current->id = id;
            current->result = std::move(received[first_io + 2]);
          }
        } else if (op == "socket" && io == 1) {
          AnswerSocketRequest(received[first_io].get());
        } else if (op == "kill") {
          if (auto* entry = find_by_id(id)) {
            const int sig = req.value("signal", SIGKILL);
            if (entry->second.shell) {
              // The shell's keeper signals what the call started, not the shell.
              const std::string m = "{\"op\":\"kill\",\"signal\":" + std::to_string(sig) + "}";
              (void)send(shell_sock.get(), m.data(), m.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
            } else if (entry->second.command) {
              // The keeper forwards the signal to the command's group; a
              // SIGKILL ends the call and everything it started.
              kill(entry->first, sig == SIGKILL ? kEndCallSignal : sig);
            } else {
              kill(entry->first, sig);
            }
          }
        }
        // Anything else is not ours to answer: its fds close here, which the
        // caller reads as end of file without a result.
      }
    }

    if (!(fds[0].revents & POLLIN)) continue;
    struct signalfd_siginfo info {};
    if (read(sigfd.get(), &info, sizeof(info)) != sizeof(info)) continue;
    const int sig = static_cast<int>(info.ssi_signo);
    // Only the supervisor (outside this pid namespace: sender pid 0 here)
    // may stop the session; a command signalling pid 1 changes nothing.
    if (sig != SIGCHLD && info.ssi_pid != 0) continue;
    if (sig != SIGCHLD) {
      for (auto& [pid, call] : calls) {
        if (call.command) kill(pid, sig);  // the keeper forwards it
      }
      if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP) terminating = true;
      if (terminating && calls.empty()) _exit(0);
      continue;
    }
    int status = 0;
    pid_t pid;
    struct rusage ru {};
    while ((pid = wait4(-1, &status, WNOHANG, &ru)) > 0) {
      auto it = calls.find(pid);
      if (it == calls.end()) continue;  // an orphan of some command: reaped, nothing to say
      if (it->second.command) {
        // The command's calls were all recorded before they were answered.
        count_records();
        WriteFully(it->second.result.get(),
                   ExitLine(WIFEXITED(status) ? WEXITSTATUS(status) : -1, WIFSIGNALED(status) ? WTERMSIG(status) : 0,
                            it->second.shell ? nullptr : &ru, it->second.tally));
      }
      if (it->second.shell) {
        shell_pid = -1;
        shell_sock.reset();
      }
      calls.erase(it);
    }
    if (terminating && calls.empty()) _exit(0);
  }
}

}  // namespace agentbox::linux
