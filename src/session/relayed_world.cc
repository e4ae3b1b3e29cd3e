// `agentbox __world` for a plan on a kernel of its own: a microVM
// (sandbox.isolation: microvm) or a gVisor sandbox (container).
//
// The world is one long-lived machine (supervise/world_machine.h). The
// relay inside it runs the same world supervisor as a host does
// (world_main.cc) on that kernel (guest_init.cc). This process sits between
// the caller and the machine:
//  - the caller's channel (fd 3): messages both ways as kWorld frames, but
//    what only the host can do is answered here (network rules: the proxy is
//    this host's; a rotation: the values stay here; memory: the machine's)
//    or refused with the reason (grafts);
//  - the control socket handed to the caller with "ready": each request
//    goes over as a kControl frame, and each descriptor it passes (a call's
//    stdin, output and result pipes, the background log, a binding socket)
//    is carried by the stream mux under an id of this side's;
//  - the inside's egress, as for a run (GuestEgress).
// A terminal or an inside socket would need the inside's descriptor on this
// host: they are refused. The machine ends with this process.
// A remote world (RelayMode::kRemote, remote_world.cc) is relayed the same
// way, but its agentbox owns its egress, rotations and memory limit: those
// messages pass through both ways.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <openssl/crypto.h>

#include "agentbox/run.h"
#include "linux/fd.h"
#include "linux/microvm.h"
#include "linux/runner.h"
#include "linux/stream_mux.h"
#include "session/world_channel.h"
#include "net/terminator.h"
#include "session/secret_handover.h"
#include "supervise/credentials.h"
#include "supervise/egress.h"
#include "supervise/gvisor_world.h"
#include "supervise/microvm_run.h"

namespace agentbox::session {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
// The background log's size limit, as the init keeps it on a host
// (runner.cc): in a guest the log is a pipe, so this side keeps it.
constexpr off_t kBackgroundLogCap = 64 << 20;
// More queued for the guest than an honest one can cause (the mux's
// windows, stdin held back, control requests) is a protocol violation.
constexpr std::size_t kToGuestMax = 32u << 20;

json Refusal(const char* t, const char* stage, const std::string& why) {
  return {{"t", t}, {"error", why}, {"stage", stage}, {"message", why}, {"errno", 0}, {"syscall", ""}, {"path", ""}};
}

// The way a passed descriptor's bytes go for the world's init.
char WayOf(int fd) {
  struct stat st {};
  if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) return 's';
  return (fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDONLY ? 'r' : 'w';
}

void WriteLine(int fd, const std::string& text) {
  std::size_t off = 0;
  while (off < text.size()) {
    const ssize_t w = write(fd, text.data() + off, text.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    off += static_cast<std::size_t>(w);
  }
}

// Starts the world's machine for the prepared plan, with `request` for
// the relay inside.
using StartMachine = Result<std::unique_ptr<supervise::WorldMachine>> (*)(
    const Plan& plan, const RunOptions& options, linux::GuestRequest request,
    std::shared_ptr<net::Terminator> terminator);

int RelayedWorldMain(const Plan& given, StartMachine start, const char* noun) {
  linux::UniqueFd sigfd = BlockStopSignals();

  // Credentials, http_rules: the values come first from the caller and
  // stay in this process (the proxy that serves the guest); the guest gets
  // the CA's certificate and placeholders only.
  Plan plan = given;
  std::shared_ptr<net::SecretStore> secrets;
  std::shared_ptr<net::Terminator> terminator;
  if (Status s = PrepareWorldCredentials(&plan, &secrets, &terminator); !s.ok()) {
    Send(ErrorMessage(s));
    return 125;
  }

  RunOptions options;
  options.ask_on_terminal = false;
  options.on_connection = [](const std::string& record) {
    Send(json{{"t", "net"}, {"record", json::parse(record, nullptr, false)}});
  };
  linux::GuestRequest request;
  request.world = true;
  request.env = linux::BuildEnv(plan.env);
  request.pids_max = plan.limits.pids_max.value_or(0);
  auto booted = start(plan, options, std::move(request), terminator);
  if (!booted.ok()) {
    Send(ErrorMessage(booted.status()));
    return 125;
  }
  linux::FrameReader reader;
  return RelayWorldLoop(**booted, plan, secrets.get(), noun, RelayMode::kHostEgress, std::move(sigfd), &reader, {});
}

}  // namespace

int RelayWorldLoop(supervise::WorldMachine& vm, const Plan& plan, net::SecretStore* secrets, const char* noun,
                   RelayMode mode, linux::UniqueFd sigfd, linux::FrameReader* reader_ptr,
                   std::vector<linux::Frame> pending) {
  const bool remote = mode == RelayMode::kRemote;
  const int channel = vm.channel();
  fcntl(channel, F_SETFL, fcntl(channel, F_GETFL) | O_NONBLOCK);
  linux::FrameReader& reader = *reader_ptr;

  // What goes to the guest is queued and written as the channel takes it
  // (this end never blocks on the guest, which may block on its writes).
  std::string to_guest;
  auto send = [&](linux::FrameType type, std::string_view payload) {
    linux::AppendFrame(&to_guest, type, payload);
    return true;
  };
  linux::StreamMux mux(send, [&](char tag) { return vm.DialEgress(tag); });
  std::uint32_t next_id = 0;
  linux::UniqueFd control;  // ours; the caller has the other end
  bool ready = false;
  std::optional<Clock::time_point> kill_at;
  std::vector<linux::Frame> frames = std::move(pending);
  linux::RecvBuffer in(1 << 20);

  // The caller's control requests: the descriptors to the mux, the request
  // to the guest.
  auto relay_control = [&]() -> bool {
    std::vector<linux::UniqueFd> passed;
    const ssize_t n = linux::RecvWithFds(control.get(), in.data(), in.size(), MSG_DONTWAIT, &passed);
    if (n == 0 || (n < 0 && errno != EAGAIN)) return false;
    if (n < 0) return true;
    linux::ControlFrame frame;
    frame.text.assign(in.data(), static_cast<std::size_t>(n));
    if (frame.text == "@" && !passed.empty()) {  // a long request, in a memfd (world.cc)
      frame.text.clear();
      // Sized once from the memfd: a 1 MiB write_file grown by appends went
      // through fresh mappings of up to 2 MiB, each faulted in and copied.
      struct stat st {};
      if (fstat(passed[0].get(), &st) == 0 && st.st_size > 0) frame.text.reserve(static_cast<std::size_t>(st.st_size));
      char buf[65536];
      off_t off = 0;
      for (ssize_t r; (r = pread(passed[0].get(), buf, sizeof(buf), off)) > 0; off += r) {
        frame.text.append(buf, static_cast<std::size_t>(r));
      }
      passed.erase(passed.begin());
    }
    const json req = json::parse(linux::ControlRequestJson(frame.text), nullptr, false);
    const std::string op = req.is_object() ? req.value("op", "") : "";
    if (op == "pty" && passed.size() >= 2) {
      WriteLine(passed[1].get(), json{{"t", "exec_error"}, {"stage", "pty"}, {"syscall", std::string("a terminal in ") + noun + " session"},
                                      {"path", "not available in this version"}, {"errno", EOPNOTSUPP}}
                                     .dump());
      return true;
    }
    if (op == "socket" && !passed.empty()) {
      const std::string text = json{{"errno", EOPNOTSUPP}}.dump();
      (void)!::send(passed[0].get(), text.data(), text.size(), MSG_NOSIGNAL);
      return true;
    }
    // A call's result keeps its order behind its output on this side too;
    // a regular file (the background log) is written up to its cap.
    const bool ordered = op == "exec" || op == "shell";
    std::vector<std::uint32_t> written;
    for (auto& fd : passed) {
      const char way = WayOf(fd.get());
      const std::uint32_t id = linux::kMuxAttached | ++next_id;
      const auto flow = way == 'r' ? linux::MuxFlow::kOut : way == 'w' ? linux::MuxFlow::kIn : linux::MuxFlow::kBoth;
      linux::StreamMux::AttachOptions o;
      if (way == 'w') {
        if (ordered && written.size() == 1) o.after = written[0];
        written.push_back(id);
        struct stat st {};
        if (fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode)) {
          o.write_cap = st.st_size >= kBackgroundLogCap ? 0 : static_cast<std::uint64_t>(kBackgroundLogCap - st.st_size);
        }
      }
      if (!mux.Attach(id, std::move(fd), flow, o)) {
        // Too many at once: what was attached of this request ends, the
        // rest closes here, and the caller sees the call's descriptors end.
        for (const auto& d : frame.fds) mux.Drop(d.id);
        return true;
      }
      frame.fds.push_back({id, way});
    }
    linux::AppendControlFrames(&to_guest, frame);
    return true;
  };

  // One message of the caller's: the host's ops answered here, the rest to the guest.
  auto from_caller = [&](json& req, const std::string& text) {
    const std::string op = req.is_object() ? req.value("op", "") : "";
    if (remote && op != "graft" && op != "ungraft") {
      // The remote agentbox's proxy, secrets and cgroup: its ops go there
      // (a rotation's values over the stream, held in its memory).
      if (op == "stop" && !kill_at) kill_at = Clock::now() + std::chrono::milliseconds(req.value("grace_ms", 0) + 5000);
      send(linux::FrameType::kWorld, text);
      return;
    }
    if (op == "network" && req.contains("allow") && req["allow"].is_array() && req.contains("deny") &&
        req["deny"].is_array()) {
      std::vector<std::string> allow, deny;
      for (const auto& e : req["allow"]) allow.push_back(e.is_string() ? e.get<std::string>() : e.dump());
      for (const auto& e : req["deny"]) deny.push_back(e.is_string() ? e.get<std::string>() : e.dump());
      supervise::Egress* egress = vm.egress();
      Status set = egress ? egress->SetRules(allow, deny)
                          : Status::Error("network", "this session's sandbox has no egress (its network is off)");
      Send(json{{"t", "network"}, {"error", set.ok() ? "" : set.message()}});
    } else if (op == "rotate") {
      // The values stay here: never forwarded to the guest.
      auto values = TakeSecrets(req);
      for (auto& [name, value] : values.ok() ? *values : std::vector<std::pair<std::string, std::string>>{}) {
        Status rotated = secrets ? secrets->Rotate(name, value)
                                 : Status::Error("credentials", "this session has no secrets");
        net::Wipe(value);
        Send(json{{"t", "rotated"}, {"name", name}, {"error", rotated.ok() ? std::string() : rotated.message()}});
      }
    } else if (op == "graft" || op == "ungraft") {
      Send(Refusal(op.c_str(), vm.stage(), vm.GraftRefusal()));
    } else if (op == "memory") {
      Status done = req.contains("bytes") && req["bytes"].is_number_unsigned()
                        ? vm.SetMemory(req["bytes"].get<std::uint64_t>())
                        : Status::Error("memory", "the request names no bytes");
      if (done.ok()) {
        Send(json{{"t", "memory"}, {"error", ""}});
      } else {
        Send(Refusal("memory", vm.stage(), done.message()));
      }
    } else {
      if (op == "stop" && !kill_at) {
        // The inside's supervisor stops the world; the machine ends after the
        // grace and a margin for its power-off, should it not.
        kill_at = Clock::now() + std::chrono::milliseconds(req.value("grace_ms", 0) + 5000);
      }
      send(linux::FrameType::kWorld, text);
    }
  };

  // How the machine ended when its process or its channel did.
  auto vm_ended = [&]() {
    vm.Reap(std::chrono::milliseconds(1000));
    bool oom = false;
    const std::string how = vm.EndedHow(&oom);
    Send(json{{"t", "exited"}, {"how", how}, {"oom_kills", oom ? 1 : 0}});
    return 0;
  };

  for (;;) {
    if (to_guest.size() > kToGuestMax) {
      Send(ErrorMessage(Status::Error(vm.stage(), std::string("the inside broke the channel's protocol (more than ") +
                                                     std::to_string(kToGuestMax >> 20) + " MiB queued for it that it "
                                                     "does not take): " + noun + " is ended")));
      return 125;
    }
    const auto now = Clock::now();
    if (kill_at && now >= *kill_at) {
      Send(json{{"t", "exited"}, {"how", "stopped"}, {"oom_kills", 0}});
      return 0;
    }
    int timeout = kill_at ? static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(*kill_at - now).count()) + 1
                          : -1;
    if (!frames.empty()) timeout = 0;  // read before this loop (a remote's handshake)
    std::vector<struct pollfd> fds;
    fds.push_back({channel, static_cast<short>(POLLIN | (to_guest.empty() ? 0 : POLLOUT)), 0});
    fds.push_back({vm.ended_fd(), POLLIN, 0});
    fds.push_back({kChannelFd, POLLIN, 0});
    fds.push_back({sigfd.get(), POLLIN, 0});
    const int i_control = control.valid() ? (fds.push_back({control.get(), POLLIN, 0}), static_cast<int>(fds.size() - 1)) : -1;
    const std::size_t i_mux = fds.size();
    mux.AppendPollFds(&fds);
    if (poll(fds.data(), static_cast<nfds_t>(fds.size()), timeout) < 0) continue;
    mux.Service(fds.data() + i_mux, fds.size() - i_mux);
    if ((fds[0].revents & POLLOUT) && !to_guest.empty()) {
      const ssize_t sent = ::send(channel, to_guest.data(), to_guest.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (sent > 0) to_guest.erase(0, static_cast<std::size_t>(sent));
    }
    bool open = true;
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) open = reader.Read(channel, &frames);
    if (!frames.empty() || !open) {
      for (auto& f : frames) {
        if (mux.Handle(f)) continue;
        if (f.type == linux::FrameType::kFailure) {
          const json j = json::parse(f.payload, nullptr, false);
          Send(ErrorMessage(Status::Error(
              vm.stage(), "the inside's init: " + (j.is_object() ? j.value("stage", std::string("?")) + ": " +
                                                                      j.value("message", std::string("?"))
                                                                : f.payload))));
          return 125;
        }
        if (f.type != linux::FrameType::kWorld) continue;
        json m = json::parse(f.payload, nullptr, false);
        const std::string t = m.is_object() ? m.value("t", "") : "";
        if (t == "ready" && !ready) {
          ready = true;
          int sv[2];
          if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
            Send(ErrorMessage(Status::Errno("world", "socketpair", "the control socket")));
            return 125;
          }
          control.reset(sv[0]);
          linux::UniqueFd theirs(sv[1]);
          // What this host's resolution skipped (the shares' views follow
          // it); a remote's own resolution is the remote's to say.
          if (!remote) m["skipped"] = vm.skipped();
          Send(m, theirs.get());
        } else if (t == "exited" || t == "error") {
          Send(m);
          vm.Reap(std::chrono::milliseconds(3000));  // the inside syncs and ends
          return t == "error" ? 125 : 0;
        } else if (!remote && (t == "net" || t == "network" || t == "graft" || t == "ungraft" || t == "memory" ||
                               t == "rotated")) {
          // Answered here, never by the guest: its plan has no proxy, and
          // these ops are this process's. A guest that sends one is ignored.
        } else {
          Send(m);
        }
      }
      frames.clear();
      if (!open) return vm_ended();
    }
    if (fds[1].revents) return vm_ended();
    if (fds[2].revents) {
      const ssize_t got = recv(kChannelFd, in.data(), in.size(), MSG_DONTWAIT);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) return 0;  // the caller is gone: so is the machine
      if (got > 0) {
        std::string text(in.data(), static_cast<std::size_t>(got));
        OPENSSL_cleanse(in.data(), static_cast<std::size_t>(got));
        json req = json::parse(text, nullptr, false);
        // A message with values (a rotation) is answered here; nothing else
        // the caller sends holds one.
        from_caller(req, !remote && req.is_object() && req.value("op", "") == "rotate" ? std::string() : text);
        OPENSSL_cleanse(text.data(), text.size());
      }
    }
    if (fds[3].revents) {
      struct signalfd_siginfo si {};
      while (read(sigfd.get(), &si, sizeof(si)) == sizeof(si)) {
        json stop = {{"op", "stop"}, {"grace_ms", plan.kill_grace_ms}};
        from_caller(stop, stop.dump());
      }
    }
    if (i_control >= 0 && fds[i_control].revents && !relay_control()) control.reset();
  }
}

namespace {

// `start` (MicrovmVm::Boot, GvisorSandbox::Start) as a StartMachine.
template <auto start>
Result<std::unique_ptr<supervise::WorldMachine>> StartAs(const Plan& plan, const RunOptions& options,
                                                         linux::GuestRequest request,
                                                         std::shared_ptr<net::Terminator> terminator) {
  auto machine = start(plan, options, std::move(request), std::move(terminator));
  if (!machine.ok()) return machine.status();
  return std::unique_ptr<supervise::WorldMachine>(std::move(*machine));
}

}  // namespace

int MicrovmWorldMain(const Plan& plan) {
  return RelayedWorldMain(plan, &StartAs<&supervise::MicrovmVm::Boot>, "a microVM");
}

int GvisorWorldMain(const Plan& plan) {
  return RelayedWorldMain(plan, &StartAs<&supervise::GvisorSandbox::Start>, "a gVisor sandbox");
}

}  // namespace agentbox::session
