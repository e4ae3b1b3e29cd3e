// The microVM guest's init: agentbox's own static binary, /init of the
// initramfs. It is pid 1 of a kernel that runs nothing else.
//
//  1. devtmpfs, procfs and sysfs; the virtio modules the initramfs carries
//     (virtio-mmio devices are named on the kernel's command line, which
//     modprobe would hand to the module: here the init does);
//  2. the virtio-serial port named "agentbox", and the request on it;
//  3. a tmpfs root with the request's virtiofs shares ("/" read-only, each
//     writable tree at its host path), /dev, /proc, /sys and /tmp, then a
//     switch into it;
//  4. the request's plan run as a namespaces run (RunPlan) in a child whose
//     stdio are pipes relayed as frames; signals from the host forwarded;
//     connections to the proxy ports (egress) accepted on the guest's
//     loopback and carried over the channel to the host's proxy;
//  5. the outcome as the last frame, with the kernel's OOM-kill count;
//     sync, power off.
// A session's world (request.world) instead of 4 and 5: the world's
// supervisor (the host's `__world` code, world_main) runs on the plan in a
// child, and its channel and the calls' control requests are relayed over
// the port (RelayWorld) until it ends; then the power-off.
// A failure before the request is run is a kFailure frame (or, with no
// port, a line on the console), then the power-off.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "agentbox/run.h"
#include "linux/compat.h"
#include "linux/fd.h"
#include "linux/microvm.h"
#include "linux/namespaces.h"
#include "linux/runner.h"
#include "linux/stream_mux.h"
#include "report/report_json.h"
#include "supervise/microvm_run.h"
#include "supervise/run_io.h"

namespace agentbox::supervise {
namespace {

using nlohmann::json;

std::string Slurp(const std::string& path) {
  linux::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  std::string out;
  if (!fd.valid()) return out;
  char buf[4096];
  for (ssize_t n; (n = read(fd.get(), buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

// In a gVisor sandbox, or on a remote host (`__world --stdio`), the relay
// is a process, not a kernel's init: its end is an exit (runsc then ends
// the sandbox; ssh its session), and what it forks gets /dev/null for
// stdout, which is the stream.
bool g_in_gvisor = false;

[[noreturn]] void PowerOff() {
  if (g_in_gvisor) _exit(0);
  sync();
  reboot(RB_POWER_OFF);
  for (;;) pause();
}

int g_port = -1;  // frames come in here
int g_out = -1;   // and go out here: the same descriptor but on a remote host's stdio

[[noreturn]] void Die(const Status& why) {
  const std::string text =
      json{{"stage", why.stage()}, {"message", why.message()}, {"errno", why.err()}}.dump();
  if (g_out >= 0) {
    (void)linux::WriteFrame(g_out, linux::FrameType::kFailure, text);
  } else {
    std::fprintf(stderr, "agentbox guest: %s\n", why.ToString().c_str());
  }
  PowerOff();
}

std::uint64_t OomKills() {
  const std::string vmstat = Slurp("/proc/vmstat");
  const auto at = vmstat.find("\noom_kill ");
  return at == std::string::npos ? 0 : std::strtoull(vmstat.c_str() + at + 10, nullptr, 10);
}

// The non-empty pieces of `text` between any of `delims`.
std::vector<std::string> Split(const std::string& text, const char* delims) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i <= text.size()) {
    std::size_t j = text.find_first_of(delims, i);
    if (j == std::string::npos) j = text.size();
    if (j > i) out.push_back(text.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

void LoadModules() {
  // virtio_mmio.device=... entries from the command line, as modprobe passes them.
  std::string mmio;
  for (const auto& word : Split(Slurp("/proc/cmdline"), " \n")) {
    if (word.rfind("virtio_mmio.", 0) == 0) mmio += (mmio.empty() ? "" : " ") + word.substr(12);
  }
  for (const auto& path : Split(Slurp("/modules.order"), "\n")) {
    linux::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) Die(Status::Errno("guest", "open module", path));
    const std::string params = path.find("/virtio_mmio.ko") != std::string::npos ? mmio : "";
    if (syscall(SYS_finit_module, fd.get(), params.c_str(), 0) != 0 && errno != EEXIST) {
      Die(Status::Errno("guest", "load module", path));
    }
  }
}

// The port's device: /sys/class/virtio-ports/vportNpM/name is "agentbox".
// Ports appear once the host's QEMU has announced them: waits a while.
int OpenPort() {
  for (int tries = 0; tries < 2000; ++tries) {
    if (DIR* d = opendir("/sys/class/virtio-ports")) {
      while (dirent* e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        std::string name = Slurp(std::string("/sys/class/virtio-ports/") + e->d_name + "/name");
        while (!name.empty() && name.back() == '\n') name.pop_back();
        if (name != linux::kGuestPortName) continue;
        const std::string dev = std::string("/dev/") + e->d_name;
        closedir(d);
        for (int t = 0; t < 500; ++t) {
          int fd = open(dev.c_str(), O_RDWR | O_CLOEXEC);
          if (fd >= 0) return fd;
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        Die(Status::Errno("guest", "open", dev));
      }
      closedir(d);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  Die(Status::Error("guest", std::string("no virtio-serial port named ") + linux::kGuestPortName + " in 10 s"));
}

void MountOrDie(const char* source, const std::string& target, const char* type, unsigned long flags,
                const char* data) {
  mkdir(target.c_str(), 0755);
  if (mount(source, target.c_str(), type, flags, data) != 0) {
    Die(Status::Errno("guest", std::string("mount ") + type + " " + source + " at", target));
  }
}

void MountShares(const linux::GuestRequest& request) {
  std::vector<linux::GuestShare> shares = request.shares;
  std::stable_sort(shares.begin(), shares.end(),
                   [](const linux::GuestShare& a, const linux::GuestShare& b) { return a.path.size() < b.path.size(); });
  if (shares.empty() || shares.front().path != "/") Die(Status::Error("guest", "the request has no root share"));
  // The root share, then the guest's own /dev, /proc and /sys, then the
  // writable trees at the mount points the host made for them there.
  auto mount_share = [](const linux::GuestShare& s) {
    const std::string at = s.path == "/" ? "/newroot" : "/newroot" + s.path;
    if (s.path != "/") {
      // Its mount point: in the root share (made there by the host), or
      // below one of the guest's own tmpfs mounts.
      for (std::size_t i = 1; i <= at.size(); ++i) {
        if (i == at.size() || at[i] == '/') mkdir(at.substr(0, i).c_str(), 0755);
      }
    }
    unsigned long flags = MS_NOSUID | MS_NODEV | (s.writable ? 0 : MS_RDONLY);
    if (mount(s.tag.c_str(), at.c_str(), "virtiofs", flags, nullptr) != 0) {
      Die(Status::Errno("guest", "mount virtiofs " + s.tag + " at", s.path));
    }
  };
  mount_share(shares.front());
  MountOrDie("devtmpfs", "/newroot/dev", "devtmpfs", MS_NOSUID, "mode=0755");
  MountOrDie("proc", "/newroot/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  MountOrDie("sysfs", "/newroot/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, nullptr);
  // No tmpfs of the init's own over /tmp or /run: the plan's sources below
  // them (a read-only tree in /tmp, resolv.conf's target in /run) are in the
  // root share there. The runner gives the command its private /tmp.
  for (std::size_t i = 1; i < shares.size(); ++i) mount_share(shares[i]);
  // The switch: the initramfs stays below, unreachable.
  if (chdir("/newroot") != 0) Die(Status::Errno("guest", "chdir", "/newroot"));
  if (mount(".", "/", nullptr, MS_MOVE, nullptr) != 0) Die(Status::Errno("guest", "move root", "/newroot"));
  if (chroot(".") != 0 || chdir("/") != 0) Die(Status::Errno("guest", "chroot", "/newroot"));
}

// A listener on the guest's 127.0.0.1:port, for the proxy variables' port.
linux::UniqueFd ListenLoopback(std::uint16_t port) {
  linux::UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) Die(Status::Errno("guest", "socket", "egress listener"));
  const int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  struct sockaddr_in a {};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd.get(), 128) != 0) {
    Die(Status::Errno("guest", "listen", "127.0.0.1:" + std::to_string(port)));
  }
  return fd;
}

// Writes `text` to a fresh memfd: invalid when it could not be written whole.
linux::UniqueFd MemfdWith(const char* name, const std::string& text) {
  linux::UniqueFd fd(static_cast<int>(memfd_create(name, MFD_CLOEXEC)));
  if (!fd.valid()) return fd;
  WriteAll(fd.get(), text.data(), text.size());
  struct stat st {};
  if (fstat(fd.get(), &st) != 0 || static_cast<std::size_t>(st.st_size) != text.size()) fd.reset();
  return fd;
}

// The child that becomes the run's or the world's supervisor: OOM-killable,
// in the pids cgroup, with the request's environment, none of the init's
// descriptors but those `keep` dup2s into place.
template <typename Keep>
pid_t ForkSupervisor(const linux::GuestRequest& request, const std::string& run_cgroup, Keep keep) {
  const pid_t child = fork();
  if (child != 0) return child;
  // The kernel's OOM killer may choose this process (pid 1 is exempt).
  if (int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC); fd >= 0) {
    (void)!write(fd, "0", 1);
    close(fd);
  }
  if (!run_cgroup.empty()) {
    linux::UniqueFd procs(open((run_cgroup + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
    if (!procs.valid() || write(procs.get(), "0", 1) != 1) _exit(125);
  }
  clearenv();
  for (const auto& e : request.env) putenv(const_cast<char*>(e.c_str()));
  keep();
  return 0;
}

// A session's world: `world_main` (the `__world` supervisor) in a child,
// its channel on fd 3 and the plan on fd 4 as on a host. What it says on
// its channel goes to the host as kWorld frames, with the guest kernel's
// OOM-kill count in "stats" and "exited" when that kernel is the world's
// own (`own_kernel`: a microVM's guest, a gVisor Sentry; not a remote host
// or pod, whose /proc/vmstat counts every OOM kill of the machine, and
// where the world's cgroup, when its policy sets limits, gives the count
// as on this host); the host's kWorld frames go to
// it. Its control socket comes with "ready": each kControl request is
// sent on it with a local pipe (or socket pair) for each descriptor the
// host's caller passed, whose other end the mux carries under the
// request's id. Egress connections are accepted as for a run.
[[noreturn]] void RelayWorld(const linux::GuestRequest& request, int (*world_main)(), const std::string& run_cgroup,
                             bool own_kernel, linux::UniqueFd http_listener, linux::UniqueFd socks_listener,
                             linux::FrameReader* reader, std::vector<linux::Frame> frames) {
  constexpr int kChannel = 3, kPlan = 4;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) Die(Status::Errno("guest", "socketpair", "world channel"));
  linux::UniqueFd channel(sv[0]), theirs(sv[1]);
  linux::UniqueFd plan = MemfdWith("agentbox-plan", request.plan_json);
  if (!plan.valid()) Die(Status::Errno("guest", "memfd", "the world's plan"));
  const std::uint64_t oom_before = own_kernel ? OomKills() : 0;
  const pid_t child = ForkSupervisor(request, run_cgroup, [&] {
    dup2(theirs.get(), kChannel);
    dup2(plan.get(), kPlan);
    linux::CloseFds(kPlan + 1);
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    // In gVisor, stdout is the stream too (and stays open in the relay:
    // the Sentry ends a host socket with its last descriptor).
    if (g_in_gvisor) dup2(null, 1);
    close(null);
    _exit(world_main());
  });
  if (child < 0) Die(Status::Errno("guest", "fork", "the world's supervisor"));
  theirs.reset();
  plan.reset();
  signal(SIGPIPE, SIG_IGN);

  linux::UniqueFd control;  // the world's init's, from "ready"
  linux::StreamMux mux([](linux::FrameType type, std::string_view payload) {
    return linux::WriteFrame(g_out, type, payload).ok();
  });
  std::string parts;  // kControlPart text waiting for its kControl
  auto send_control = [&](const linux::ControlFrame& c) {
    // The init's descriptors, each with its other end carried by the mux.
    // A call's result keeps its order behind its output (an exec's second
    // written descriptor behind its first): its end never overtakes them.
    const json req = json::parse(linux::ControlRequestJson(c.text), nullptr, false);
    const std::string op = req.is_object() ? req.value("op", "") : "";
    const bool ordered = op == "exec" || op == "shell";
    std::vector<std::uint32_t> written;
    std::vector<linux::UniqueFd> passed;
    std::size_t attached = 0;
    for (const auto& d : c.fds) {
      int p[2];
      const bool ok = d.way == 's' ? socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) == 0 : pipe2(p, O_CLOEXEC) == 0;
      if (!ok) break;
      linux::UniqueFd a(p[0]), b(p[1]);
      bool done = false;
      if (d.way == 'r') {  // the init reads the read end; what comes is written to the write end
        done = mux.Attach(d.id, std::move(b), linux::MuxFlow::kIn);
        passed.push_back(std::move(a));
      } else if (d.way == 'w') {
        linux::StreamMux::AttachOptions o;
        if (ordered && written.size() == 1) o.after = written[0];
        done = mux.Attach(d.id, std::move(a), linux::MuxFlow::kOut, o);
        written.push_back(d.id);
        passed.push_back(std::move(b));
      } else {
        done = mux.Attach(d.id, std::move(a), linux::MuxFlow::kBoth);
        passed.push_back(std::move(b));
      }
      if (!done) break;
      ++attached;
    }
    if (attached < c.fds.size() || !control.valid()) {
      // The request cannot be made whole: every one of its ids ends, so the
      // caller sees its descriptors end instead of waiting on them.
      for (std::size_t i = 0; i < c.fds.size(); ++i) {
        if (i < attached) {
          mux.Drop(c.fds[i].id);
        } else {
          std::string id(4, '\0');
          for (int k = 0; k < 4; ++k) id[k] = static_cast<char>((c.fds[i].id >> (8 * k)) & 0xff);
          (void)linux::WriteFrame(g_out, linux::FrameType::kConnAbort, id);
        }
      }
      return;
    }
    std::string text = c.text;
    linux::UniqueFd memfd;
    if (text.size() > 16 * 1024) {  // the init takes a longer request in a memfd
      memfd = MemfdWith("agentbox-request", text);
      if (!memfd.valid()) {
        for (const auto& d : c.fds) mux.Drop(d.id);
        return;
      }
      text = "@";
    }
    std::vector<int> fds;
    if (memfd.valid()) fds.push_back(memfd.get());
    for (const auto& f : passed) fds.push_back(f.get());
    const bool sent = linux::SendWithFds(control.get(), text.data(), text.size(), fds.data(), fds.size());
    if (!sent) {
      for (const auto& d : c.fds) mux.Drop(d.id);
    }
  };
  auto handle = [&](const linux::Frame& f) {
    if (mux.Handle(f)) return;
    if (f.type == linux::FrameType::kWorld) {
      while (send(channel.get(), f.payload.data(), f.payload.size(), MSG_NOSIGNAL) < 0 && errno == EINTR) {
      }
    } else if (f.type == linux::FrameType::kControlPart) {
      parts.append(f.payload);
    } else if (f.type == linux::FrameType::kControl) {
      linux::ControlFrame c;
      if (linux::ParseControlFrame(f.payload, std::move(parts), &c)) send_control(c);
      parts.clear();
    }
  };
  for (const auto& f : frames) handle(f);
  frames.clear();
  linux::RecvBuffer in(1 << 20);
  std::vector<struct pollfd> fds;
  for (;;) {
    fds.clear();
    fds.push_back({g_port, POLLIN, 0});
    fds.push_back({channel.get(), POLLIN, 0});
    const int i_http = http_listener.valid() ? (fds.push_back({http_listener.get(), POLLIN, 0}), int(fds.size() - 1)) : -1;
    const int i_socks = socks_listener.valid() ? (fds.push_back({socks_listener.get(), POLLIN, 0}), int(fds.size() - 1)) : -1;
    const std::size_t i_mux = fds.size();
    mux.AppendPollFds(&fds);
    if (poll(fds.data(), static_cast<nfds_t>(fds.size()), 1000) < 0 && errno != EINTR) break;
    mux.Service(fds.data() + i_mux, fds.size() - i_mux);
    for (auto [i, listener, tag] : {std::tuple{i_http, http_listener.get(), 'h'}, std::tuple{i_socks, socks_listener.get(), 's'}}) {
      if (i < 0 || !fds[i].revents) continue;
      linux::UniqueFd conn(accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (conn.valid()) mux.Accept(std::move(conn), tag);
    }
    if (fds[1].revents) {
      std::vector<linux::UniqueFd> got;
      const ssize_t n = linux::RecvWithFds(channel.get(), in.data(), in.size(), MSG_DONTWAIT, &got);
      if (n == 0 || (n < 0 && errno != EAGAIN)) break;  // the world's supervisor ended
      if (n > 0) {
        if (!got.empty()) control = std::move(got.front());  // "ready" hands over the init's control socket
        std::string text(in.data(), static_cast<std::size_t>(n));
        json m = json::parse(text, nullptr, false);
        const std::string t = m.is_object() ? m.value("t", "") : "";
        if (own_kernel && (t == "stats" || t == "exited")) {
          m["oom_kills"] = std::max(m.value("oom_kills", std::uint64_t{0}), OomKills() - oom_before);
          text = m.dump();
        }
        (void)linux::WriteFrame(g_out, linux::FrameType::kWorld, text);
      }
    }
    if (fds[0].revents) {
      if (!reader->Read(g_port, &frames)) break;  // the host is gone
      for (const auto& f : frames) handle(f);
      frames.clear();
    }
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
  }
  kill(child, SIGKILL);
  PowerOff();
}

// The host's request: the channel's first frame (the frames after it stay
// in `frames`).
Result<linux::GuestRequest> ReadRequest(linux::FrameReader* reader, std::vector<linux::Frame>* frames) {
  while (frames->empty()) {
    if (!reader->Read(g_port, frames)) {
      Die(Status::Error("guest", "the channel closed before a request came" +
                                     (reader->error().empty() ? "" : ": " + reader->error())));
    }
  }
  if (frames->front().type != linux::FrameType::kRequest) Die(Status::Error("guest", "the first frame is not a request"));
  auto request = linux::GuestRequestFromJson(frames->front().payload);
  if (!request.ok()) Die(request.status());
  frames->erase(frames->begin());
  return request;
}

bool WriteFrameOrNote(linux::FrameType type, const char* p, std::size_t n) {
  return linux::WriteFrame(g_out, type, std::string_view(p, n)).ok();
}

}  // namespace

[[noreturn]] void GuestInitMain(int (*world_main)()) {
  // No console node may be there before devtmpfs: stdio first.
  mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
  for (int fd = open("/dev/console", O_RDWR); fd >= 0 && fd < 2; fd = open("/dev/console", O_RDWR)) {
  }
  MountOrDie("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  MountOrDie("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
  if (Slurp("/proc/cmdline").find(linux::kGuestTrialArg) != std::string::npos) {
    // A trial boot (the host probe's): the kernel ran its init; that is all.
    std::fprintf(stderr, "%s\n", linux::kGuestTrialReady);
    PowerOff();
  }
  LoadModules();
  g_port = OpenPort();
  g_out = g_port;

  linux::FrameReader reader;
  std::vector<linux::Frame> frames;
  auto request = ReadRequest(&reader, &frames);
  auto plan = PlanFromJson(request->plan_json);
  if (!plan.ok()) Die(plan.status());
  MountShares(*request);
  // Egress: the proxy's ports on the guest's loopback; the command's
  // variables name them, and every connection goes to the host's proxy.
  linux::UniqueFd http_listener, socks_listener;
  if (request->proxy_http_port || request->proxy_socks_port) {
    if (Status s = linux::BringUpLoopback(); !s.ok()) Die(s);
    if (request->proxy_http_port) http_listener = ListenLoopback(request->proxy_http_port);
    if (request->proxy_socks_port) socks_listener = ListenLoopback(request->proxy_socks_port);
  }

  int in_pipe[2], out_pipe[2], err_pipe[2], result_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0 || pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0 ||
      pipe2(result_pipe, O_CLOEXEC) != 0) {
    Die(Status::Errno("guest", "pipe2", "stdio"));
  }
  // max_processes: the guest's command runs as the guest kernel's root,
  // which RLIMIT_NPROC does not hold: a pids cgroup does.
  std::string run_cgroup;
  if (request->pids_max > 0) {
    MountOrDie("cgroup2", "/sys/fs/cgroup", "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
    auto put = [](const std::string& path, const std::string& value) {
      linux::UniqueFd fd(open(path.c_str(), O_WRONLY | O_CLOEXEC));
      if (!fd.valid() || write(fd.get(), value.data(), value.size()) != static_cast<ssize_t>(value.size())) {
        Die(Status::Errno("guest", "write " + value + " to", path));
      }
    };
    put("/sys/fs/cgroup/cgroup.subtree_control", "+pids");
    run_cgroup = "/sys/fs/cgroup/run";
    if (mkdir(run_cgroup.c_str(), 0755) != 0) Die(Status::Errno("guest", "mkdir", run_cgroup));
    put(run_cgroup + "/pids.max", std::to_string(request->pids_max));
  }
  if (request->world) {
    RelayWorld(*request, world_main, run_cgroup, /*own_kernel=*/true, std::move(http_listener),
               std::move(socks_listener), &reader, std::move(frames));
  }
  const std::uint64_t oom_before = OomKills();
  const pid_t child = ForkSupervisor(*request, run_cgroup, [] {});
  if (child < 0) Die(Status::Errno("guest", "fork", "runner"));
  if (child == 0) {
    dup2(in_pipe[0], 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1], result_pipe[0], g_port}) {
      close(fd);
    }
    http_listener.reset();
    socks_listener.reset();
    if (!request->stdin_open) {
      int null = open("/dev/null", O_RDONLY);
      dup2(null, 0);
      close(null);
    }
    RunOptions options;
    options.scan_stderr = false;  // the host scans the relayed stderr with the policy's signatures
    options.ask_on_terminal = false;
    Outcome outcome = RunPlan(*plan, request->argv, {}, options);
    const std::string text = ToJsonValue(outcome).dump();
    WriteAll(result_pipe[1], text.data(), text.size());
    _exit(0);
  }
  close(in_pipe[0]);
  close(out_pipe[1]);
  close(err_pipe[1]);
  close(result_pipe[1]);
  int stdin_w = in_pipe[1];
  if (!request->stdin_open) {
    close(stdin_w);
    stdin_w = -1;
  }
  std::string result;
  bool out_open = true, err_open = true, result_open = true, port_open = true;
  linux::StreamMux mux([](linux::FrameType type, std::string_view payload) {
    return linux::WriteFrame(g_out, type, payload).ok();
  });
  auto handle = [&](const linux::Frame& f) {
    if (mux.Handle(f)) return;
    if (f.type == linux::FrameType::kStdin && stdin_w >= 0) {
      WriteAll(stdin_w, f.payload.data(), f.payload.size());
    } else if (f.type == linux::FrameType::kStdinEnd && stdin_w >= 0) {
      close(stdin_w);
      stdin_w = -1;
    } else if (f.type == linux::FrameType::kSignal) {
      const int sig = std::atoi(f.payload.c_str());
      if (sig > 0 && sig < 65) kill(child, sig);
    }
  };
  for (const auto& f : frames) handle(f);
  frames.clear();
  signal(SIGPIPE, SIG_IGN);
  char buf[1 << 16];
  std::vector<struct pollfd> fds;
  while (out_open || err_open || result_open) {
    fds.clear();
    int i_out = -1, i_err = -1, i_res = -1, i_port = -1, i_http = -1, i_socks = -1;
    auto add = [&](int fd) {
      fds.push_back({fd, POLLIN, 0});
      return static_cast<int>(fds.size() - 1);
    };
    if (out_open) i_out = add(out_pipe[0]);
    if (err_open) i_err = add(err_pipe[0]);
    if (result_open) i_res = add(result_pipe[0]);
    if (port_open) i_port = add(g_port);
    if (port_open && http_listener.valid()) i_http = add(http_listener.get());
    if (port_open && socks_listener.valid()) i_socks = add(socks_listener.get());
    const std::size_t i_mux = fds.size();
    if (port_open) mux.AppendPollFds(&fds);
    if (poll(fds.data(), static_cast<nfds_t>(fds.size()), 1000) < 0 && errno != EINTR) break;
    if (port_open) mux.Service(fds.data() + i_mux, fds.size() - i_mux);
    for (auto [i, listener, tag] : {std::tuple{i_http, http_listener.get(), 'h'}, std::tuple{i_socks, socks_listener.get(), 's'}}) {
      if (i < 0 || !fds[i].revents) continue;
      linux::UniqueFd conn(accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (conn.valid()) mux.Accept(std::move(conn), tag);
    }
    // Orphans of the run (none should outlive its pid namespace) are reaped.
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    if (i_out >= 0 && fds[i_out].revents) {
      ssize_t got = read(out_pipe[0], buf, sizeof(buf));
      if (got <= 0) out_open = false;
      else WriteFrameOrNote(linux::FrameType::kStdout, buf, static_cast<std::size_t>(got));
    }
    if (i_err >= 0 && fds[i_err].revents) {
      ssize_t got = read(err_pipe[0], buf, sizeof(buf));
      if (got <= 0) err_open = false;
      else WriteFrameOrNote(linux::FrameType::kStderr, buf, static_cast<std::size_t>(got));
    }
    if (i_res >= 0 && fds[i_res].revents) {
      ssize_t got = read(result_pipe[0], buf, sizeof(buf));
      if (got <= 0) result_open = false;
      else result.append(buf, static_cast<std::size_t>(got));
    }
    if (i_port >= 0 && fds[i_port].revents) {
      if (!reader.Read(g_port, &frames)) {
        port_open = false;  // the host is gone: nothing more comes, the run goes on to its end
      }
      for (const auto& f : frames) handle(f);
      frames.clear();
    }
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  json j = json::parse(result, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    j = json::object();
    j["runner_status"] = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  }
  j["guest_oom_kills"] = OomKills() - oom_before;
  (void)linux::WriteFrame(g_out, linux::FrameType::kResult, j.dump());
  PowerOff();
}

[[noreturn]] void GvisorInsideMain(int (*world_main)()) {
  // stdin and stdout are one socket to the host (gvisor_world.cc): the
  // channel. Both stay open here: the Sentry shuts a host socket down when
  // one of its imports is closed. What is forked from here gets /dev/null
  // for both (RelayWorld); stderr is the bundle's log.
  g_in_gvisor = true;
  g_port = 0;
  g_out = 0;
  linux::FrameReader reader;
  std::vector<linux::Frame> frames;
  auto request = ReadRequest(&reader, &frames);
  if (!request->world) Die(Status::Error("gvisor", "the request is not a session's world"));
  // Egress: the proxy's ports on the Sentry's loopback (up already).
  linux::UniqueFd http_listener, socks_listener;
  if (request->proxy_http_port) http_listener = ListenLoopback(request->proxy_http_port);
  if (request->proxy_socks_port) socks_listener = ListenLoopback(request->proxy_socks_port);
  RelayWorld(*request, world_main, "", /*own_kernel=*/true, std::move(http_listener), std::move(socks_listener),
             &reader, std::move(frames));
}

[[noreturn]] void RemoteRelayMain(const std::string& plan_json, int (*world_main)(), linux::FrameReader* reader,
                                  std::vector<linux::Frame> frames) {
  g_in_gvisor = true;
  g_port = 0;
  g_out = 1;
  linux::GuestRequest request;
  request.world = true;
  request.plan_json = plan_json;
  // The world's supervisor starts as a host's does (world.cc): with where
  // its proxy takes its trust from, and nothing else of this environment.
  for (const char* name : {"SSL_CERT_FILE", "SSL_CERT_DIR"}) {
    if (const char* v = getenv(name); v != nullptr && *v) request.env.push_back(std::string(name) + "=" + v);
  }
  RelayWorld(request, world_main, "", /*own_kernel=*/false, {}, {}, reader, std::move(frames));
}

}  // namespace agentbox::supervise
