// `agentbox __world`: the supervisor of one session's sandbox (world.h).
//
// Launches the init, answers on the channel (fd 3), serves the egress proxy,
// and ends the world when the channel closes, when asked to stop, or when
// the init dies (then it reports how, with the cgroup's OOM-kill count).
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <map>
#include <string>

#include <nlohmann/json.hpp>
#include <openssl/crypto.h>

#include "agentbox/confine.h"
#include "agentbox/run.h"
#include "linux/compat.h"
#include "linux/graft.h"
#include "linux/launch.h"
#include "linux/proxy_listeners.h"
#include "linux/rlimits.h"
#include "linux/status_pipe.h"
#include "net/secrets.h"
#include "net/terminator.h"
#include "linux/runner.h"
#include "report/json_text.h"
#include "session/file_tools.h"
#include "session/layers.h"
#include "session/remote_world.h"
#include "session/secret_handover.h"
#include "session/world.h"
#include "session/world_channel.h"
#include "supervise/credentials.h"
#include "supervise/egress.h"
#include "supervise/resources.h"

namespace agentbox::session {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Runs in a process forked by the init, inside the sandbox.
linux::FileOpAnswer FileOp(std::string request, std::string raw) {
  const std::string_view header = linux::ControlRequestJson(request);
  const std::size_t header_size = header.size();
  json req = json::parse(header, nullptr, false);
  if (!req.is_object() || !req.contains("name") || !req["name"].is_string()) {
    return {json{{"kind", "tool_error"}, {"error", "malformed file tool request"}}.dump(), ""};
  }
  FileToolLimits limits;
  limits.workspace = req.value("workspace", std::string("/"));
  if (req.contains("max_read_bytes")) limits.max_read_bytes = req["max_read_bytes"].get<std::size_t>();
  json input = req.contains("input") ? std::move(req["input"]) : json::object();
  // An input field that came as it is, after the JSON (World::File): apart
  // already when the request came in a memfd, else moved out of the
  // request, in place.
  if (req.contains("raw") && req["raw"].is_string() && input.is_object()) {
    if (header_size < request.size()) {
      request.erase(0, header_size + 1);
      input[req["raw"].get<std::string>()] = std::move(request);
    } else if (!raw.empty()) {
      input[req["raw"].get<std::string>()] = std::move(raw);
    }
  }
  // The answer: one JSON line without "output", then the output's bytes as
  // they are (a 1 MiB file is not escaped here and parsed back there).
  json answer = RunFileTool(req["name"].get<std::string>(), input, limits);
  linux::FileOpAnswer out;
  if (answer.contains("output") && answer["output"].is_string()) {
    out.body = std::move(answer["output"].get_ref<std::string&>());
    answer.erase("output");
  }
  out.head = report::CompactJson(answer);
  out.head += '\n';
  return out;
}

}  // namespace

void Send(const json& message, int fd_to_pass) {
  const std::string text = message.dump(-1, ' ', false, json::error_handler_t::replace);
  struct iovec iov = {const_cast<char*>(text.data()), text.size()};
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (fd_to_pass >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd_to_pass, sizeof(int));
  }
  // Records are dropped rather than block the proxy when nobody reads.
  const int flags = message.value("t", "") == "net" ? MSG_DONTWAIT | MSG_NOSIGNAL : MSG_NOSIGNAL;
  while (sendmsg(kChannelFd, &msg, flags) < 0 && errno == EINTR) {
  }
}

namespace {

// The largest channel message: a rotation of a 64 KiB secret, hex-encoded.
constexpr std::size_t kSecretsMessageMax = 1 << 20;

}  // namespace

Status PrepareWorldCredentials(Plan* plan, std::shared_ptr<net::SecretStore>* secrets,
                               std::shared_ptr<net::Terminator>* terminator) {
  if (!plan->network.terminate || !plan->network.proxy) return {};
  if (!plan->network.credentials.secrets.empty()) {
    auto store = ReceiveSecrets(*plan);
    if (!store.ok()) return store.status();
    *secrets = std::move(*store);
  }
  auto prepared = supervise::PrepareCredentials(plan, *secrets);
  if (!prepared.ok()) return prepared.status();
  *terminator = std::move(*prepared);
  return {};
}

// The daemon's first message when the plan has secrets (world.cc).
Result<std::shared_ptr<net::SecretStore>> ReceiveSecrets(const Plan& plan) {
  linux::RecvBuffer buf(kSecretsMessageMax);
  struct pollfd p = {kChannelFd, POLLIN, 0};
  int ready = 0;
  while ((ready = poll(&p, 1, 30000)) < 0 && errno == EINTR) {
  }
  if (ready <= 0) return Status::Error("credentials", "the secrets did not arrive from the daemon within 30 s");
  ssize_t got = 0;
  while ((got = recv(kChannelFd, buf.data(), buf.size(), 0)) < 0 && errno == EINTR) {
  }
  if (got <= 0) return Status::Errno("credentials", "recv", "the secrets from the daemon");
  json message = json::parse(std::string_view(buf.data(), static_cast<size_t>(got)), nullptr, false);
  OPENSSL_cleanse(buf.data(), static_cast<size_t>(got));
  if (!message.is_object() || message.value("op", "") != "secrets") {
    return Status::Error("credentials", "the daemon's first message is not the secrets");
  }
  auto values = TakeSecrets(message);
  if (!values.ok()) return values.status();
  return net::SecretStore::WithValues(plan.network.credentials.secrets, *values);
}

namespace {

}  // namespace

linux::UniqueFd BlockStopSignals() {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  linux::UniqueFd sigfd(signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  return sigfd;
}

json ErrorMessage(const Status& s) {
  return {{"t", "error"}, {"stage", s.stage()}, {"message", s.message()}, {"errno", s.err()},
          {"syscall", s.syscall()}, {"path", s.path()}};
}

namespace {

// The answer to a grant's op ("graft", "ungraft", "memory"): "error" as
// the network op has it ("" = done), with the Status's parts beside it.
json GrantAnswer(const char* t, const Status& s) {
  if (s.ok()) return {{"t", t}, {"error", ""}};
  return {{"t", t}, {"error", s.message()}, {"stage", s.stage()}, {"message", s.message()},
          {"errno", s.err()}, {"syscall", s.syscall()}, {"path", s.path()}};
}

bool IsString(const json& req, const char* key) { return req.contains(key) && req[key].is_string(); }

}  // namespace

int WorldMain() {
  // The plan is in a memfd on fd 4 (world.cc), which nothing below inherits.
  std::string plan_text;
  {
    char buf[65536];
    off_t off = 0;
    for (;;) {
      ssize_t r = pread(kWorldPlanFd, buf, sizeof(buf), off);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      plan_text.append(buf, static_cast<size_t>(r));
      off += r;
    }
    close(kWorldPlanFd);
  }
  if (plan_text.empty()) {
    Send(ErrorMessage(Status::Error("world", "no plan on fd " + std::to_string(kWorldPlanFd))));
    return 125;
  }
  auto parsed = PlanFromJson(plan_text);
  if (!parsed.ok()) {
    Send(ErrorMessage(parsed.status()));
    return 125;
  }
  Plan plan = std::move(*parsed);
  if (plan.remote) return RemoteWorldMain(plan);
  if (plan.confined && plan.backend == Backend::kMicrovm) return MicrovmWorldMain(plan);
  if (plan.confined && plan.backend == Backend::kGvisor) return GvisorWorldMain(plan);
  // In a gVisor sandbox (its relay forked this process): the Sentry is the
  // fence, and its kernel has no pidfds: the init is watched by its status
  // pipe and signalled by pid (a child of this process's, reaped only here).
  const bool inside_gvisor = !plan.confined && plan.gvisor && plan.gvisor->inside;
  if (!inside_gvisor && (!plan.confined || plan.backend != Backend::kNamespaces)) {
    Send(ErrorMessage(Status::Error("world", "sessions need the namespaces, gvisor or microvm backend (a long-lived "
                                             "init of their own); this plan is " +
                                                 std::string(plan.confined ? ToString(plan.backend) : "unconfined"))));
    return 125;
  }
  // SIGTERM: stop gracefully. The channel's end is the other way to stop.
  linux::UniqueFd sigfd = BlockStopSignals();

  auto made = supervise::MakeRunCgroup(plan);
  if (!made.ok()) {
    Send(ErrorMessage(made.status()));
    return 125;
  }
  std::unique_ptr<linux::SandboxCgroup> cgroup = std::move(*made);
  // The TLS terminator, before the launch (the init is a copy of this
  // process): the daemon sends the secrets' values first thing (world.cc).
  std::shared_ptr<net::SecretStore> secrets;
  std::shared_ptr<net::Terminator> terminator;
  if (Status s = PrepareWorldCredentials(&plan, &secrets, &terminator); !s.ok()) {
    Send(ErrorMessage(s));
    return 125;
  }
  if (plan.network.proxy) {
    struct rlimit nofile {};
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
      nofile.rlim_cur = nofile.rlim_max;
      setrlimit(RLIMIT_NOFILE, &nofile);
    }
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    Send(ErrorMessage(Status::Errno("world", "socketpair")));
    return 125;
  }
  linux::UniqueFd ours(sv[0]), theirs(sv[1]);
  linux::SessionLaunch session;
  session.control_fd = theirs.get();
  session.hooks.file_op = &FileOp;
  session.hooks.copy_upper = &CopyUpperLayer;
  if (plan.workspace_overlay && plan.workspace_overlay->upper_seeded) session.upper_seed_fd = kWorldUpperSeedFd;
  auto launched = linux::Launch(plan, {}, linux::StderrMode::kInherit, cgroup.get(), &session);
  theirs.reset();
  // The init has its copy (it copies the earlier upper layer and closes it):
  // held here, it would keep that filesystem's memory for this world's life.
  if (session.upper_seed_fd >= 0) close(session.upper_seed_fd);
  if (!launched.ok()) {
    Send(ErrorMessage(launched.status()));
    return 125;
  }
  linux::Launched& child = *launched;

  RunOptions options;
  options.ask_on_terminal = false;  // on_unknown_domain: ask is a deny in a session (no one to ask)
  options.on_connection = [](const std::string& record) {
    Send(json{{"t", "net"}, {"record", json::parse(record, nullptr, false)}});
  };
  std::unique_ptr<supervise::Egress> egress;
  bool proxy_open = child.proxy_listeners.valid();
  bool ready = false, status_open = true;
  linux::StatusReader status;
  std::optional<Clock::time_point> kill_at;
  std::optional<Status> failure;
  // The init's namespaces and root (linux/graft.h), and what was grafted
  // through them: only that can be ungrafted.
  linux::WorldNamespaces world_ns;
  std::map<std::string, linux::Mountpoint> grafted;

  auto signal_init = [&](int sig) {
    if (child.pidfd.valid()) {
      linux::PidfdSendSignal(child.pidfd.get(), sig);
    } else if (inside_gvisor) {
      kill(child.pid, sig);
    }
  };
  auto end_world = [&](const std::string& how) {
    if (cgroup) cgroup->KillAll();
    signal_init(SIGKILL);
    int ws = 0;
    while (waitpid(child.pid, &ws, 0) < 0 && errno == EINTR) {
    }
    linux::CgroupStats stats;
    if (cgroup) stats = cgroup->ReadStats();
    if (egress) egress->Stop();
    if (failure) {
      Send(ErrorMessage(*failure));
    } else {
      Send(json{{"t", "exited"}, {"how", how}, {"oom_kills", stats.oom_kills}});
    }
  };

  for (;;) {
    const auto now = Clock::now();
    if (kill_at && now >= *kill_at) {
      end_world("stopped");
      return 0;
    }
    int timeout = kill_at ? static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(*kill_at - now).count()) + 1
                          : -1;
    struct pollfd fds[5];
    int n = 0, i_proxy = -1, i_status = -1, i_pid = -1, i_chan = -1, i_sig = -1;
    if (proxy_open) fds[i_proxy = n++] = {child.proxy_listeners.get(), POLLIN, 0};
    if (status_open) fds[i_status = n++] = {child.status.get(), POLLIN, 0};
    fds[i_pid = n++] = {child.pidfd.get(), POLLIN, 0};
    fds[i_chan = n++] = {kChannelFd, POLLIN, 0};
    fds[i_sig = n++] = {sigfd.get(), POLLIN, 0};
    if (poll(fds, static_cast<nfds_t>(n), timeout) < 0) continue;

    if (i_proxy >= 0 && fds[i_proxy].revents) {
      proxy_open = false;
      auto listeners = linux::ReceiveEgressListeners(child.proxy_listeners.get());
      if (listeners.ok()) {
        supervise::Egress::Fds fds{std::move(listeners->http), std::move(listeners->socks),
                                   std::move(listeners->dns_udp), std::move(listeners->dns_tcp), {}};
        // With the broker the channel goes on carrying its requests.
        if (plan.network.broker) {
          fds.broker = std::move(child.proxy_listeners);
        } else {
          child.proxy_listeners.reset();
        }
        auto started = supervise::Egress::Start(plan, options, std::move(fds), 0, terminator);
        if (started.ok()) {
          egress = std::move(*started);
        } else {
          failure = started.status();
          end_world("proxy");
          return 125;
        }
      }
    }
    if (i_status >= 0 && fds[i_status].revents) {
      std::vector<linux::RunnerMessage> messages;
      status_open = status.Read(child.status.get(), &messages);
      for (const auto& m : messages) {
        if (m.type == linux::RunnerMessage::Type::kSetupError) {
          Status s = m.status;
          if (s.stage() == "seccomp" && !child.filter_error.ok()) s = child.filter_error;
          failure = s;
        } else if (m.type == linux::RunnerMessage::Type::kLandlock) {
          std::string what;
          for (const auto& s : m.short_of_plan) what += (what.empty() ? "" : "; ") + s;
          Send(json{{"t", "note"},
                    {"facet", "filesystem"},
                    {"message", "Landlock on this kernel (ABI " + std::to_string(m.landlock_abi) +
                                    ") is short of the plan (ABI " + std::to_string(plan.landlock.abi) +
                                    "): " + what}});
        } else if (m.type == linux::RunnerMessage::Type::kReady && !ready) {
          ready = true;
          // The init sent its namespaces on the control socket before it
          // reported ready; they are read before the socket is handed on.
          if (plan.confined) {
            auto ns = linux::ReceiveWorldNamespaces(ours.get());
            if (!ns.ok()) {
              failure = ns.status();
              end_world("setup");
              return 125;
            }
            world_ns = std::move(*ns);
          }
          // The cgroup the calls run in and the rlimits the runner set (it
          // was cloned from this process), for their reports' limits.
          const linux::RlimitsSet rl = linux::RlimitsFor(plan.limits);
          json ready = {{"t", "ready"}, {"skipped", child.resolved.skipped},
                        {"cgroup", cgroup ? cgroup->Mechanism() : ""}, {"nofile", rl.nofile_soft}};
          if (rl.fsize) ready["fsize"] = *rl.fsize;
          if (rl.nproc) ready["nproc"] = *rl.nproc;
          Send(ready, ours.get());
          ours.reset();
        }
      }
    }
    if (fds[i_pid].revents || (!child.pidfd.valid() && !status_open)) {
      if (!failure && !ready) failure = Status::Error("runner", "the session's init ended before it was ready");
      end_world("the session's sandbox (its init) ended");
      return failure ? 125 : 0;
    }
    if (fds[i_chan].revents) {
      // Big enough for a rotated secret (64 KiB, hex-encoded); zeroed after.
      static linux::RecvBuffer in(kSecretsMessageMax);
      ssize_t got = recv(kChannelFd, in.data(), in.size(), MSG_DONTWAIT);
      if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
        end_world("closed");  // the caller is gone
        return 0;
      }
      if (got > 0) {
        json req = json::parse(std::string_view(in.data(), static_cast<size_t>(got)), nullptr, false);
        OPENSSL_cleanse(in.data(), static_cast<size_t>(got));
        const std::string op = req.is_object() ? req.value("op", "") : "";
        if (op == "rotate") {
          auto values = TakeSecrets(req);
          for (auto& [name, value] : values.ok() ? *values : std::vector<std::pair<std::string, std::string>>{}) {
            Status rotated = secrets ? secrets->Rotate(name, value)
                                     : Status::Error("credentials", "this session has no secrets");
            net::Wipe(value);
            Send(json{{"t", "rotated"}, {"name", name}, {"error", rotated.ok() ? "" : rotated.message()}});
          }
        }
        if (op == "network" && req.contains("allow") && req["allow"].is_array() && req.contains("deny") &&
            req["deny"].is_array()) {
          std::vector<std::string> allow, deny;
          for (const auto& e : req["allow"]) allow.push_back(e.is_string() ? e.get<std::string>() : e.dump());
          for (const auto& e : req["deny"]) deny.push_back(e.is_string() ? e.get<std::string>() : e.dump());
          Status set = egress ? egress->SetRules(allow, deny, child.pid)
                              : Status::Error("network", "this session's sandbox has no egress (its network is off)");
          Send(json{{"t", "network"}, {"error", set.ok() ? "" : set.message()}});
        }
        if (op == "graft" && IsString(req, "source") && IsString(req, "target")) {
          const std::string target = req["target"].get<std::string>();
          const auto access = req.value("writable", false) ? linux::GraftAccess::kWritable : linux::GraftAccess::kReadOnly;
          Status done;
          if (grafted.count(target)) {
            done = Status::Error("graft", "something is grafted at " + target + " already; ungraft it first");
          } else if (auto made = linux::GraftIntoWorld(world_ns, req["source"].get<std::string>(), target, access);
                     made.ok()) {
            grafted[target] = *made;
          } else {
            done = made.status();
          }
          Send(GrantAnswer("graft", done));
        }
        if (op == "ungraft" && IsString(req, "target")) {
          const std::string target = req["target"].get<std::string>();
          Status done = !grafted.count(target) ? Status::Error("graft", "nothing was grafted at " + target)
                                               : linux::UngraftFromWorld(world_ns, target, grafted[target]);
          if (done.ok()) grafted.erase(target);
          Send(GrantAnswer("ungraft", done));
        }
        if (op == "memory" && req.contains("bytes") && req["bytes"].is_number_unsigned()) {
          Status done = cgroup ? cgroup->SetMemoryMax(req["bytes"].get<std::uint64_t>())
                               : Status::Error("cgroup", "this session's sandbox runs without a cgroup: its memory "
                                                         "limit cannot be set");
          Send(GrantAnswer("memory", done));
        }
        if (op == "stats") {
          linux::CgroupStats stats;
          if (cgroup) stats = cgroup->ReadStats();
          Send(json{{"t", "stats"}, {"oom_kills", stats.oom_kills}});
        } else if (op == "stop" && !kill_at) {
          const int grace = req.value("grace_ms", 0);
          signal_init(SIGTERM);
          if (cgroup) {
            cgroup->SignalAll(SIGTERM, child.pid);
            cgroup->SignalAll(SIGCONT, child.pid);
          }
          kill_at = Clock::now() + std::chrono::milliseconds(grace);
        }
      }
    }
    if (fds[i_sig].revents) {
      struct signalfd_siginfo si {};
      while (read(sigfd.get(), &si, sizeof(si)) == sizeof(si)) {
        if (!kill_at) {
          signal_init(SIGTERM);
          kill_at = Clock::now() + std::chrono::milliseconds(plan.kill_grace_ms);
        }
      }
    }
  }
}

}  // namespace agentbox::session
