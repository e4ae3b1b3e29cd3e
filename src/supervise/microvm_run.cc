// A run in a QEMU microVM (sandbox.isolation: microvm), host side.
//
// Per run, in <runtime dir>/agentbox-microvm-<pid>-XXXXXX:
//  - one virtiofsd per share, each in a mount namespace of its own whose
//    view is the plan's (linux::PrepareShareView): the read-only system at
//    "/", each writable tree of the plan at its host path, masks bound over
//    from the host side too;
//  - QEMU's microvm machine with the guest kernel, agentbox's initramfs,
//    the shares and one virtio-serial port, no network device;
//  - the request on the port; then the command's stdio as frames, the
//    host's signals forwarded, the outcome as the last frame;
//  - egress (a plan with the proxy): the guest has no network device; its
//    init listens on the proxy ports of the guest's loopback and carries
//    each connection over the port (linux/stream_mux.h) to this process,
//    which hands it to the egress proxy on listeners of the host's loopback
//    that serve only the connections it dialled itself.
// Every process started here dies with the supervisor (PR_SET_PDEATHSIG);
// `agentbox gc` removes a directory whose supervisor is gone.
#include "supervise/microvm_run.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <mutex>
#include <netinet/in.h>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include "linux/compat.h"
#include "linux/fd.h"
#include "linux/loopback_peer.h"
#include "linux/microvm.h"
#include "linux/proxy_listeners.h"
#include "linux/stream_mux.h"
#include "linux/resolve.h"
#include "linux/runner.h"
#include "supervise/denial_scanner.h"
#include "supervise/credentials.h"
#include "supervise/egress.h"
#include "supervise/guest_egress.h"
#include "supervise/resources.h"
#include "supervise/run_dirs.h"
#include "supervise/run_io.h"

namespace agentbox::supervise {
namespace {

using Clock = RunClock;
using nlohmann::json;

Outcome Failed(Outcome out, const std::string& message, int err, Clock::time_point started,
               const std::string& stage = "microvm") {
  out.kind = OutcomeKind::kSandboxError;
  out.error = ErrorInfo{stage, message, err};
  out.usage.wall_ms = Ms(Clock::now() - started);
  return out;
}

bool WriteIdMaps(uid_t uid, gid_t gid) {
  auto put = [](const char* path, const std::string& text) {
    linux::UniqueFd fd(open(path, O_WRONLY | O_CLOEXEC));
    return fd.valid() && write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size());
  };
  return put("/proc/self/setgroups", "deny") && put("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") &&
         put("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1");
}

// A started helper process (virtiofsd, QEMU) and its log.
struct Helper {
  pid_t pid = -1;
  linux::UniqueFd pidfd;
  std::string log;
  bool reaped = false;
  int wait_status = 0;
};

void StopHelper(Helper* h, int sig) {
  if (h->pid <= 0 || h->reaped) return;
  kill(h->pid, sig);
}

void ReapHelper(Helper* h, std::chrono::milliseconds grace) {
  if (h->pid <= 0 || h->reaped) return;
  const auto until = Clock::now() + grace;
  while (Clock::now() < until) {
    if (waitpid(h->pid, &h->wait_status, WNOHANG) == h->pid) {
      h->reaped = true;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  kill(h->pid, SIGKILL);
  while (waitpid(h->pid, &h->wait_status, 0) < 0 && errno == EINTR) {
  }
  h->reaped = true;
}

bool Exited(Helper* h) {
  if (h->reaped) return true;
  if (waitpid(h->pid, &h->wait_status, WNOHANG) == h->pid) h->reaped = true;
  return h->reaped;
}

// Forks `argv` with stdout and stderr to `log`, stdin /dev/null, dying
// with this process. `prepare` runs in the child first (a namespace, a
// view); its failure is written to the log and ends the child with 126.
template <typename Prepare>
Result<Helper> StartHelper(const std::vector<std::string>& argv, const std::string& log, Prepare prepare) {
  Helper h;
  h.log = log;
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  linux::UniqueFd log_fd(open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!log_fd.valid()) return Status::Errno("microvm", "create", log);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return Status::Errno("microvm", "fork", argv[0]);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    dup2(log_fd.get(), 1);
    dup2(log_fd.get(), 2);
    if (Status s = prepare(); !s.ok()) {
      const std::string line = "agentbox: " + s.ToString() + "\n";
      (void)!write(2, line.data(), line.size());
      _exit(126);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    close_range(3, ~0U, 0);
    execv(cargv[0], cargv.data());
    const std::string line = "agentbox: exec " + argv[0] + ": " + std::strerror(errno) + "\n";
    (void)!write(2, line.data(), line.size());
    _exit(127);
  }
  h.pid = pid;
  h.pidfd.reset(linux::PidfdOpen(pid));
  return h;
}

std::optional<OutcomeKind> KindFromString(const std::string& s) {
  for (OutcomeKind k : {OutcomeKind::kExited, OutcomeKind::kSignaled, OutcomeKind::kTimedOut, OutcomeKind::kOomKilled,
                        OutcomeKind::kSandboxDenied, OutcomeKind::kSandboxError}) {
    if (s == ToString(k)) return k;
  }
  return std::nullopt;
}

// The guest's outcome (ToJsonValue's form) into `out`; false when it is not one.
bool TakeGuestOutcome(const json& j, Outcome* out) {
  try {
    const auto kind = KindFromString(j.at("outcome").get<std::string>());
    if (!kind) return false;
    out->kind = *kind;
    if (!j.at("exit_code").is_null()) out->exit_code = j.at("exit_code").get<int>();
    if (!j.at("signal").is_null()) out->signal = j.at("signal").get<int>();
    if (j.contains("error") && j.at("error").is_object()) {
      const json& e = j.at("error");
      out->error = ErrorInfo{e.at("stage").get<std::string>(), e.at("message").get<std::string>(),
                             e.value("errno", 0)};
    }
    for (const auto& d : j.at("denials")) {
      Denial denial;
      denial.facet = d.value("facet", "");
      denial.op = d.value("op", "");
      denial.target = d.value("target", "");
      denial.reason = d.value("reason", "");
      denial.source = d.value("source", "");
      denial.count = d.value("count", std::uint64_t{0});
      out->denials.push_back(std::move(denial));
    }
    // The guest's Landlock is a second fence behind the VM and the shares'
    // host-side views: what its kernel lacks is said, not counted missing.
    if (const json& enf = j.at("enforcement"); enf.contains("missing")) {
      for (const auto& m : enf.at("missing")) {
        out->enforcement.notes.push_back("inside the guest (" + m.value("facet", std::string("?")) +
                                         ", second fence): " + m.value("reason", std::string("")));
      }
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// The plan the guest's init runs: the same mounts (host paths are where the
// shares put them), environment, rlimits, Landlock and seccomp, as a
// namespaces run. The VM is the memory and CPU limit (no cgroup inside);
// the clock is the guest's first, the host's as a backstop.
Plan GuestPlan(const Plan& plan) {
  Plan g = plan;
  g.backend = Backend::kNamespaces;
  g.microvm.reset();
  g.gvisor.reset();
  g.limits.memory_max_bytes.reset();
  g.limits.memory_low_bytes.reset();
  g.limits.cpu_max_cores.reset();
  g.limits.cpu_weight_cores.reset();
  g.limits.pids_max.reset();
  // Egress: the guest's own network namespace (loopback only, no device)
  // holds the proxy ports the guest's init listens on; the command's
  // variables name them. The proxy itself is this host's.
  // TLS that the policy's credentials or http_rules end is ended by that
  // proxy too: the guest's plan carries only the CA's certificate (in the
  // bundle's kFile mount, filled in on the host), never its key.
  g.network.terminate = false;
  if (g.network.proxy) {
    g.network.proxy.reset();
    std::erase(g.namespaces, std::string("net"));
  }
  g.scan_cache_dir.clear();
  g.cache_dirs.clear();
  g.workspace_quota.reset();
  // The guest kernel's Landlock ABI may be older than this host's: its
  // rules apply as far as it goes, and the report says how far.
  g.landlock.required = false;
  // The guest's init is root of the guest; the runner maps its own id only.
  // (Without root, virtiofsd shows the caller's files as root's: the same.)
  g.uid = 0;
  g.gid = 0;
  return g;
}

}  // namespace

struct MicrovmVm::State {
  std::string dir;
  std::vector<Helper> daemons;
  std::optional<Helper> qemu;
  linux::UniqueFd channel;
  std::unique_ptr<GuestEgress> egress;
  std::vector<std::string> skipped;
  ~State() {
    channel.reset();
    if (qemu) ReapHelper(&*qemu, std::chrono::milliseconds(0));
    egress.reset();
    for (auto& h : daemons) StopHelper(&h, SIGTERM);
    for (auto& h : daemons) ReapHelper(&h, std::chrono::milliseconds(500));
    if (!dir.empty() && !getenv("AGENTBOX_DEBUG_KEEP_BUNDLE")) RemoveTree(dir);
  }
  Status QemuFailed(const std::string& when) {
    std::string why = qemu ? FileTail(qemu->log) : "";
    const std::string console = FileTail(dir + "/console.log", 1500);
    if (!console.empty()) why += (why.empty() ? "" : "; ") + std::string("guest console: ") + console;
    return Status::Error("microvm", "QEMU " + when + (why.empty() ? "" : ": " + why));
  }
};

MicrovmVm::MicrovmVm(std::unique_ptr<State> state) : s_(std::move(state)) {}
MicrovmVm::~MicrovmVm() = default;
int MicrovmVm::channel() const { return s_->channel.get(); }
int MicrovmVm::qemu_pidfd() const { return s_->qemu->pidfd.get(); }
const std::vector<std::string>& MicrovmVm::skipped() const { return s_->skipped; }
Egress* MicrovmVm::egress() { return s_->egress ? &s_->egress->proxy() : nullptr; }
linux::UniqueFd MicrovmVm::DialEgress(char tag) { return s_->egress ? s_->egress->Dial(tag) : linux::UniqueFd(); }
Status MicrovmVm::QemuFailed(const std::string& when) { return s_->QemuFailed(when); }
std::string MicrovmVm::ConsoleTail(std::size_t max) const { return FileTail(s_->dir + "/console.log", max); }
void MicrovmVm::ReapQemu(std::chrono::milliseconds grace) {
  if (s_->qemu) ReapHelper(&*s_->qemu, grace);
}

// A guest out of memory with nothing left to kill stops the VM (panic),
// which its console says.
std::string MicrovmVm::EndedHow(bool* oom) {
  const std::string console = ConsoleTail(4000);
  *oom = console.find("Out of memory") != std::string::npos || console.find("oom-kill") != std::string::npos;
  return *oom ? std::string("the session's VM ran out of memory and stopped")
              : "the session's VM ended: " + QemuFailed("ended").message();
}

Status MicrovmVm::SetMemory(std::uint64_t) {
  return Status::Error("microvm", "a microVM's memory is its RAM, set when it boots (memory_gib.limit): it cannot be "
                                  "changed while it runs");
}

std::string MicrovmVm::GraftRefusal() const {
  return "a microVM's shares are set when it boots: a path cannot be grafted into a running one (start a new "
         "session with the path in the policy)";
}

Result<std::unique_ptr<MicrovmVm>> MicrovmVm::Boot(const Plan& plan, const RunOptions& options,
                                                   linux::GuestRequest request,
                                                   std::shared_ptr<net::Terminator> terminator) {
  if (!plan.microvm) return Status::Error("microvm", "the plan names no VM");
  const MicrovmPlan& vm = *plan.microvm;
  auto resolved = linux::ResolvePlan(plan);
  if (!resolved.ok()) return resolved.status();
  auto state = std::make_unique<State>();
  state->skipped = resolved->skipped;

  std::string dir = vm.state_parent + "/" + kMicrovmDirPrefix + std::to_string(getpid()) + "-XXXXXX";
  if (!mkdtemp(dir.data())) return Status::Errno("microvm", "mkdtemp", dir);
  state->dir = dir;
  const std::string empty_file = dir + "/mask-file", empty_dir = dir + "/mask-dir", staging = dir + "/root";
  {
    linux::UniqueFd f(open(empty_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0));
    if (!f.valid() || mkdir(empty_dir.c_str(), 0) != 0 || mkdir(staging.c_str(), 0755) != 0) {
      return Status::Errno("microvm", "preparing", dir);
    }
  }

  // The shares: "/" first, then each writable tree.
  std::vector<linux::GuestShare> shares = {{"ab0", "/", false}};
  for (const auto& w : linux::WritableSources(*resolved)) {
    const bool nested = std::any_of(shares.begin() + 1, shares.end(), [&](const linux::GuestShare& s) {
      return w.size() > s.path.size() && w.compare(0, s.path.size(), s.path) == 0 && w[s.path.size()] == '/';
    });
    if (!nested) shares.push_back({"ab" + std::to_string(shares.size()), w, true});
  }

  std::vector<Helper>& daemons = state->daemons;
  const uid_t uid = getuid();
  const gid_t gid = getgid();
  linux::QemuRun qemu_run{vm, dir + "/ctl.sock", {}, dir + "/console.log"};
  for (std::size_t i = 0; i < shares.size(); ++i) {
    const linux::GuestShare& share = shares[i];
    const std::string socket = dir + "/fs" + std::to_string(i) + ".sock";
    const std::string source = share.writable ? share.path : staging;
    auto started_fs = StartHelper(linux::VirtiofsdArgv(vm.virtiofsd, socket, source),
                                  dir + "/virtiofsd" + std::to_string(i) + ".log", [&]() -> Status {
                                    const int flags = CLONE_NEWNS | (vm.rootless ? CLONE_NEWUSER : 0);
                                    if (unshare(flags) != 0) return Status::Errno("microvm", "unshare", "virtiofsd");
                                    if (vm.rootless && !WriteIdMaps(uid, gid)) {
                                      return Status::Errno("microvm", "uid_map", "virtiofsd");
                                    }
                                    if (Status s = linux::PrepareShareView(*resolved, share, staging,
                                                                           empty_file, empty_dir);
                                        !s.ok()) {
                                      return s;
                                    }
                                    // virtiofsd writes a pid file in /run/virtiofsd, which is root's:
                                    // without root, a tmpfs of this namespace's takes its place.
                                    if (vm.rootless) {
                                      struct stat st {};
                                      const char* at = stat("/run/virtiofsd", &st) == 0 ? "/run/virtiofsd" : "/run";
                                      if (mount("tmpfs", at, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=64k") != 0) {
                                        return Status::Errno("microvm", "mount(tmpfs) for virtiofsd's pid file", at);
                                      }
                                    }
                                    return Status{};
                                  });
    if (!started_fs.ok()) return started_fs.status();
    daemons.push_back(std::move(*started_fs));
    qemu_run.fs_sockets.emplace_back(share.tag, socket);
  }
  // virtiofsd listens once its view is ready; QEMU connects at start.
  for (std::size_t i = 0; i < daemons.size(); ++i) {
    const std::string& socket = qemu_run.fs_sockets[i].second;
    const auto until = Clock::now() + std::chrono::seconds(10);
    struct stat st {};
    while (stat(socket.c_str(), &st) != 0) {
      if (Exited(&daemons[i]) || Clock::now() > until) {
        return Status::Error("microvm", "virtiofsd for " + shares[i].path + " did not start: " + FileTail(daemons[i].log));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  }

  linux::UniqueFd listener(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  struct sockaddr_un addr {};
  addr.sun_family = AF_UNIX;
  if (qemu_run.control_socket.size() >= sizeof(addr.sun_path)) {
    return Status::Error("microvm", "the run directory's path is too long for a socket: " + dir);
  }
  std::strcpy(addr.sun_path, qemu_run.control_socket.c_str());
  if (!listener.valid() || bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener.get(), 1) != 0) {
    return Status::Errno("microvm", "bind/listen", qemu_run.control_socket);
  }

  if (plan.network.proxy) {
    auto started_egress = GuestEgress::Start(plan, options, std::move(terminator));
    if (!started_egress.ok()) return started_egress.status();
    state->egress = std::move(*started_egress);
  }

  auto started_qemu = StartHelper(linux::QemuArgv(qemu_run), dir + "/qemu.log", []() -> Status { return {}; });
  if (!started_qemu.ok()) return started_qemu.status();
  state->qemu = std::move(*started_qemu);
  Helper& qemu = *state->qemu;

  // The guest's init connects through QEMU at boot.
  linux::UniqueFd& channel = state->channel;
  {
    const auto until = Clock::now() + std::chrono::seconds(60);
    while (!channel.valid()) {
      struct pollfd fds[2] = {{listener.get(), POLLIN, 0}, {qemu.pidfd.get(), POLLIN, 0}};
      poll(fds, 2, 100);
      if (fds[1].revents) {
        Exited(&qemu);
        return state->QemuFailed("ended before the guest's channel opened");
      }
      if (fds[0].revents) channel.reset(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (Clock::now() > until) return state->QemuFailed("did not open the guest's channel in 60 s");
    }
  }
  listener.reset();

  request.plan_json = PlanToJson(GuestPlan(plan));
  request.shares = shares;
  if (plan.network.proxy) {
    request.proxy_http_port = plan.network.proxy->http_port;
    request.proxy_socks_port = plan.network.proxy->socks_port;
  }
  if (Status s = linux::WriteFrame(channel.get(), linux::FrameType::kRequest, linux::GuestRequestToJson(request));
      !s.ok()) {
    return state->QemuFailed("took no request");
  }
  return std::unique_ptr<MicrovmVm>(new MicrovmVm(std::move(state)));
}

Outcome RunMicrovm(const Plan& plan, const std::vector<std::string>& argv,
                   const std::vector<Signature>& denial_signatures, const RunOptions& options) {
  Outcome out;
  out.policy_sha256 = plan.policy_sha256;
  const auto started = Clock::now();
  if (!plan.microvm) return Failed(out, "the plan names no VM", 0, started);
  const MicrovmPlan& vm = *plan.microvm;
  if (plan.tty) return Failed(out, "run --tty is not available on a microVM in this version", 0, started);

  // Credentials, http_rules: the run's CA and the secrets' placeholders,
  // here on the host, before the guest's plan and environment are made.
  Plan prepared = plan;
  auto terminator = PrepareCredentials(&prepared);
  if (!terminator.ok()) {
    return Failed(out, terminator.status().message(), terminator.status().err(), started, terminator.status().stage());
  }
  struct stat in_st {};
  const bool forward_stdin = fstat(0, &in_st) == 0 && (S_ISFIFO(in_st.st_mode) || S_ISREG(in_st.st_mode) ||
                                                       S_ISSOCK(in_st.st_mode));
  linux::GuestRequest request;
  request.argv = argv;
  request.stdin_open = forward_stdin;
  request.env = linux::BuildEnv(prepared.env);
  request.pids_max = plan.limits.pids_max.value_or(0);
  ForwardedSignals sigfd(options.forward_signals);
  auto booted = MicrovmVm::Boot(prepared, options, std::move(request), std::move(*terminator));
  if (!booted.ok()) {
    return Failed(out, booted.status().message(), booted.status().err(), started, booted.status().stage());
  }
  MicrovmVm& machine = **booted;
  out.enforcement.skipped = machine.skipped();
  const int channel = machine.channel();
  Egress* egress = machine.egress();

  DenialScanner scanner(denial_signatures);
  const bool scan = options.scan_stderr && !denial_signatures.empty();
  linux::FrameReader reader;
  std::vector<linux::Frame> frames;
  std::optional<json> result;
  std::optional<json> failure;
  bool stdin_open = forward_stdin, channel_open = true, timed_out = false;
  // The guest's own clock ends a run that is over its time (counted from
  // the command's start, after the boot); this one ends the VM should the
  // guest not.
  std::optional<Clock::time_point> deadline;
  if (plan.timeout_ms) {
    deadline = Clock::now() + std::chrono::milliseconds(*plan.timeout_ms + plan.kill_grace_ms + 5000);
  }
  // What goes to the guest is queued and written as the channel takes it:
  // this end never blocks on the channel, so the guest, which may block on
  // its own writes, is always read. An honest guest keeps what is queued
  // within the mux's windows; stdin is not read while more than kStdinHold
  // waits.
  std::string to_guest;
  constexpr std::size_t kStdinHold = 1u << 20;
  auto send = [&](linux::FrameType type, std::string_view payload) {
    linux::AppendFrame(&to_guest, type, payload);
    return true;
  };
  linux::StreamMux mux(
      send,
      [&](char tag) { return machine.DialEgress(tag); });
  std::vector<struct pollfd> fds;
  char buf[1 << 16];
  while (channel_open && !result && !failure) {
    // More queued than an honest guest can cause (the mux's windows, the
    // stdin hold) is a protocol violation: the VM is ended.
    if (to_guest.size() > kStdinHold + (32u << 20)) {
      machine.ReapQemu(std::chrono::milliseconds(0));
      return Failed(out, "the guest broke the channel's protocol (it does not take what is queued for it): the VM "
                         "was ended", 0, started);
    }
    const auto now = Clock::now();
    if (deadline && now >= *deadline) {
      timed_out = true;
      machine.ReapQemu(std::chrono::milliseconds(0));
      break;
    }
    const int timeout_ms =
        deadline ? static_cast<int>(std::max<std::int64_t>(
                       1, std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - now).count()))
                 : -1;
    fds.clear();
    int i_in = -1, i_sig = -1;
    auto add = [&](int fd) {
      fds.push_back({fd, POLLIN, 0});
      return static_cast<int>(fds.size() - 1);
    };
    const int i_ch = add(channel);
    if (!to_guest.empty()) fds[i_ch].events |= POLLOUT;
    if (stdin_open && to_guest.size() < kStdinHold) i_in = add(0);
    if (sigfd.valid()) i_sig = add(sigfd.get());
    const int i_vm = add(machine.qemu_pidfd());
    const std::size_t i_mux = fds.size();
    mux.AppendPollFds(&fds);
    int r = poll(fds.data(), static_cast<nfds_t>(fds.size()), timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    mux.Service(fds.data() + i_mux, fds.size() - i_mux);
    if ((fds[i_ch].revents & POLLOUT) && !to_guest.empty()) {
      const ssize_t sent = ::send(channel, to_guest.data(), to_guest.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (sent > 0) to_guest.erase(0, static_cast<std::size_t>(sent));
    }
    if (fds[i_ch].revents & (POLLIN | POLLHUP | POLLERR)) {
      channel_open = reader.Read(channel, &frames);
      for (auto& f : frames) {
        if (mux.Handle(f)) {
          continue;
        } else if (f.type == linux::FrameType::kStdout) {
          WriteAll(1, f.payload.data(), f.payload.size());
        } else if (f.type == linux::FrameType::kStderr) {
          WriteAll(options.stderr_fd, f.payload.data(), f.payload.size());
          if (scan) scanner.Feed(f.payload.data(), f.payload.size());
        } else if (f.type == linux::FrameType::kResult) {
          json j = json::parse(f.payload, nullptr, false);
          result = j.is_object() ? j : json::object();
        } else if (f.type == linux::FrameType::kFailure) {
          json j = json::parse(f.payload, nullptr, false);
          failure = j.is_object() ? j : json::object();
        }
      }
      frames.clear();
    }
    if (i_in >= 0 && fds[i_in].revents) {
      ssize_t got = read(0, buf, sizeof(buf));
      if (got <= 0) {
        stdin_open = false;
        send(linux::FrameType::kStdinEnd, "");
      } else {
        send(linux::FrameType::kStdin, std::string_view(buf, static_cast<std::size_t>(got)));
      }
    }
    if (i_sig >= 0 && fds[i_sig].revents) {
      struct signalfd_siginfo si {};
      while (read(sigfd.get(), &si, sizeof(si)) == sizeof(si)) {
        send(linux::FrameType::kSignal, std::to_string(si.ssi_signo));
      }
    }
    if (fds[i_vm].revents && !fds[i_ch].revents) {
      // QEMU is gone; what the channel still holds was read above.
      break;
    }
  }
  scanner.Finish();
  // Every connection's record is in once the proxy is stopped.
  auto network_report = [&]() {
    if (!egress) return;
    egress->Stop();
    AddNetworkReport(egress->records(), &out);
    if (!options.network_log.empty()) {
      if (Status s = WriteNetworkLog(options.network_log, egress->records()); !s.ok()) {
        const std::string line = "agentbox: " + s.message() + "\n";
        WriteAll(options.stderr_fd, line.data(), line.size());
      }
    }
  };
  // The guest powers off after its last frame.
  machine.ReapQemu(std::chrono::milliseconds(result ? 3000 : 0));
  out.usage.wall_ms = Ms(Clock::now() - started);
  out.usage.limits.memory_max_bytes = vm.memory_mib << 20;
  out.usage.limits.cpu_max_cores = static_cast<double>(vm.vcpus);
  out.usage.limits.pids_max = plan.limits.pids_max;
  out.usage.limits.nofile = plan.limits.nofile;
  out.usage.limits.fsize_bytes = plan.limits.fsize_bytes;
  out.usage.limits.core_dumps = false;
  out.usage.limits.wall_clock_ms = plan.timeout_ms;
  network_report();

  if (timed_out) {
    out.kind = OutcomeKind::kTimedOut;
    out.error = ErrorInfo{"timeout", "wall clock of " + std::to_string(*plan.timeout_ms) +
                                         " ms reached; the VM did not end the command itself and was killed", 0};
    return out;
  }
  if (failure) {
    return Failed(out, "the guest's init: " + failure->value("stage", std::string("?")) + ": " +
                           failure->value("message", std::string("?")),
                  failure->value("errno", 0), started);
  }
  if (!result) {
    // The guest kernel out of memory with nothing left to kill panics
    // (panic=-1 ends QEMU): that is the VM's memory limit, not a broken sandbox.
    const std::string console = machine.ConsoleTail(4000);
    if (console.find("Out of memory") != std::string::npos || console.find("oom-kill") != std::string::npos) {
      out.kind = OutcomeKind::kOomKilled;
      out.error = ErrorInfo{"oom", "the guest kernel ran out of memory in the VM's " +
                                       std::to_string(vm.memory_mib << 20) + " bytes and stopped the VM", 0};
      out.denials.push_back(OomDenial(vm.memory_mib << 20, 1));
      return out;
    }
    const Status why = machine.QemuFailed("ended before the guest reported the command's outcome");
    return Failed(out, why.message(), 0, started);
  }
  const std::uint64_t oom = result->value("guest_oom_kills", std::uint64_t{0});
  const bool known = TakeGuestOutcome(*result, &out);
  for (auto& d : scanner.denials()) out.denials.push_back(std::move(d));
  if (oom > 0) {
    out.kind = OutcomeKind::kOomKilled;
    out.error = ErrorInfo{"oom", std::to_string(oom) + " process(es) killed by the guest kernel's OOM killer in the "
                                 "VM's memory of " + std::to_string(vm.memory_mib << 20) + " bytes", 0};
    out.usage.oom_kills = oom;
    out.denials.push_back(OomDenial(vm.memory_mib << 20, oom));
    return out;
  }
  if (!known) {
    return Failed(out, "the guest's runner ended without an outcome (status " +
                           std::to_string(result->value("runner_status", -1)) + ")", 0, started);
  }
  if (out.kind == OutcomeKind::kExited || out.kind == OutcomeKind::kSignaled) {
    const bool failed = out.signal.has_value() || out.exit_code.value_or(0) != 0;
    if (failed && !out.denials.empty() && plan.denial_outcome) out.kind = OutcomeKind::kSandboxDenied;
  }
  return out;
}

std::vector<std::string> CollectMicrovmDirs(const std::string& parent) {
  return CollectDeadRunDirs(parent, kMicrovmDirPrefix);
}

}  // namespace agentbox::supervise
