#include "session/world.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "agentbox/confine.h"
#include "linux/compat.h"
#include "linux/host_program.h"
#include "net/secrets.h"
#include "report/json_text.h"
#include "session/secret_handover.h"

extern char** environ;

namespace agentbox::session {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using linux::UniqueFd;

constexpr std::size_t kInlineRequest = 16 * 1024;  // larger requests travel in a memfd
constexpr std::size_t kMaxConnectionsKept = 1000;
// How long a call's output is awaited after its exit when the pipe has not
// ended: what a relay still carries arrives within it.
constexpr auto kOutputEndGrace = std::chrono::milliseconds(100);
constexpr auto kConnectionsKeptFor = std::chrono::minutes(5);

int MsUntil(Clock::time_point t) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, 1 << 30));
}

std::uint64_t MsSince(Clock::time_point t) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

Status Pipe(UniqueFd* r, UniqueFd* w) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return Status::Errno("session", "pipe2");
  r->reset(p[0]);
  w->reset(p[1]);
  return {};
}

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// One SEQPACKET message from the supervisor, with at most one fd.
ssize_t ReceiveMessage(int fd, std::string* text, UniqueFd* passed, int flags) {
  char buf[65536];
  struct iovec iov = {buf, sizeof(buf)};
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = recvmsg(fd, &msg, flags | MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const int* p = reinterpret_cast<const int*>(CMSG_DATA(c));
    for (size_t i = 0; i < count; ++i) {
      if (passed && !passed->valid()) {
        passed->reset(p[i]);
      } else {
        close(p[i]);
      }
    }
  }
  text->assign(buf, static_cast<size_t>(n));
  return n;
}

Status StatusFromError(const json& m) {
  const std::string syscall = m.value("syscall", "");
  const int err = m.value("errno", 0);
  if (!syscall.empty() || err != 0) {
    return Status::Syscall(m.value("stage", "world"), syscall, m.value("path", ""), err);
  }
  return Status::Error(m.value("stage", "world"), m.value("message", "the session's sandbox failed"));
}

// Keeps the head and the tail of the output; a marker says what is between.
class CappedOutput {
 public:
  explicit CappedOutput(std::size_t cap) : head_cap_(cap / 4), tail_cap_(cap - cap / 4) {}
  void Add(const char* data, std::size_t n) {
    total_ += n;
    std::size_t to_head = std::min(n, head_cap_ - std::min(head_cap_, head_.size()));
    head_.append(data, to_head);
    data += to_head;
    n -= to_head;
    if (n == 0) return;
    tail_.append(data, n);
    if (tail_.size() > 2 * tail_cap_) tail_.erase(0, tail_.size() - tail_cap_);
  }
  std::string Take(bool* truncated) {
    if (total_ > head_.size() + tail_cap_) {
      const std::size_t dropped = total_ - head_.size() - tail_cap_;
      *truncated = true;
      return head_ + "\n[agentbox: output truncated: " + std::to_string(dropped) + " of " + std::to_string(total_) +
             " bytes omitted here; the first " + std::to_string(head_.size()) + " and the last " +
             std::to_string(tail_cap_) + " bytes are kept]\n" + tail_.substr(tail_.size() - tail_cap_);
    }
    *truncated = false;
    return head_ + tail_;
  }
  std::uint64_t total() const { return total_; }

 private:
  std::size_t head_cap_, tail_cap_;
  std::string head_, tail_;
  std::uint64_t total_ = 0;
};

}  // namespace

Plan WithResolvedEnv(const Plan& plan) {
  Plan out = plan;
  std::vector<std::pair<std::string, std::string>> set;
  auto overridden = [&](const std::string& name) {
    return std::any_of(plan.env.set.begin(), plan.env.set.end(), [&](const auto& kv) { return kv.first == name; });
  };
  if (plan.env.pass_all) {
    for (char** e = environ; *e; ++e) {
      const char* eq = std::strchr(*e, '=');
      if (!eq) continue;
      std::string name(*e, static_cast<size_t>(eq - *e));
      if (!overridden(name)) set.emplace_back(std::move(name), eq + 1);
    }
  } else {
    for (const auto& name : PassedNames(plan.env.pass, environ)) {
      if (const char* v = getenv(name.c_str()); v && !overridden(name)) set.emplace_back(name, v);
    }
  }
  set.insert(set.end(), plan.env.set.begin(), plan.env.set.end());
  out.env.set = std::move(set);
  out.env.pass.clear();
  out.env.pass_all = false;
  return out;
}

void RebaseWorkspace(Plan* plan, const std::string& to) {
  const std::string old = plan->workspace_source;
  auto rebase = [&](std::string& p) {
    if (p == old) {
      p = to;
    } else if (p.size() > old.size() && p.compare(0, old.size(), old) == 0 && p[old.size()] == '/') {
      p = to + p.substr(old.size());
    }
  };
  for (auto& m : plan->mounts) rebase(m.source);
  for (auto& g : plan->deny_globs) rebase(g.source_root);
  plan->workspace_source = to;
}

Result<std::unique_ptr<World>> World::Start(const std::string& exe, const Plan& plan, int ready_timeout_ms,
                                            int upper_seed_fd, const std::map<std::string, net::LockedBytes>* rotated) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return Status::Errno("session", "socketpair");
  UniqueFd ours(sv[0]), theirs(sv[1]);

  // The plan travels in a memfd on fd 4, never in the environment (where it
  // would stay readable in /proc/PID/environ), and the supervisor starts with
  // an environment of SSL_CERT_FILE and SSL_CERT_DIR alone (paths, where the
  // daemon has them): the variables the plan passes are resolved here.
  // The secrets are read here, where their sources are (the daemon's
  // environment, files, commands), before anything is spawned: a missing one
  // fails the start. They are the world's first message on its channel.
  std::string secrets_message;
  struct WipeOnExit {
    std::string& s;
    ~WipeOnExit() { net::Wipe(s); }
  } wipe_secrets{secrets_message};
  if (plan.network.terminate && !plan.network.credentials.secrets.empty()) {
    std::vector<SecretSpec> from_sources;
    for (const auto& spec : plan.network.credentials.secrets) {
      if (rotated == nullptr || !rotated->count(spec.name)) {
        from_sources.push_back(spec);
      } else if (spec.from.kind == SecretSource::Kind::kEnv) {
        net::ScrubEnvironmentSource(spec.from.env);
      }
    }
    auto store = net::SecretStore::Create(from_sources);
    if (!store.ok()) return store.status();
    std::vector<std::string> copies;
    std::vector<std::pair<std::string, std::string_view>> values;
    copies.reserve(plan.network.credentials.secrets.size());
    Status read = (*store)->ForEachValue([&](const std::string& name, std::string_view value) {
      copies.emplace_back(value);
      values.emplace_back(name, std::string_view());
    });
    if (rotated != nullptr) {
      for (const auto& [name, value] : *rotated) {
        copies.emplace_back(value.view());
        values.emplace_back(name, std::string_view());
      }
    }
    for (std::size_t i = 0; i < values.size(); ++i) values[i].second = copies[i];
    if (read.ok()) secrets_message = SecretsMessage("secrets", values);
    for (auto& c : copies) net::Wipe(c);
    if (!read.ok()) return read;
  }
  Plan sent = WithResolvedEnv(plan);
  const bool upper_fs = sent.workspace_overlay && sent.workspace_overlay->upper_fs_bytes > 0;
  if (upper_fs) sent.workspace_overlay->upper_seeded = upper_seed_fd >= 0;
  const std::string plan_text = PlanToJson(sent);
  UniqueFd plan_fd(static_cast<int>(memfd_create("agentbox-plan", MFD_CLOEXEC)));
  if (!plan_fd.valid()) return Status::Errno("session", "memfd_create", "agentbox-plan");
  for (size_t off = 0; off < plan_text.size();) {
    ssize_t w = write(plan_fd.get(), plan_text.data() + off, plan_text.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Status::Errno("session", "write", "agentbox-plan");
    off += static_cast<size_t>(w);
  }
  // Nothing of the daemon's environment but where it takes its trust from:
  // the world's proxy verifies upstreams, and builds the sandbox's CA
  // bundle, with the same roots as the daemon.
  std::vector<std::string> trust;
  for (const char* name : {"SSL_CERT_FILE", "SSL_CERT_DIR"}) {
    if (const char* v = getenv(name); v != nullptr && *v) trust.push_back(std::string(name) + "=" + v);
  }
  // A remote world's supervisor runs the user's ssh client: it needs what
  // ssh reads of the environment (the agent's socket, HOME for ~/.ssh, PATH
  // to find ssh itself, the user's names). Nothing of it goes to the remote.
  if (plan.remote) {
    for (const char* name : {"HOME", "PATH", "SSH_AUTH_SOCK", "USER", "LOGNAME"}) {
      if (const char* v = getenv(name); v != nullptr && *v) trust.push_back(std::string(name) + "=" + v);
    }
  }
  std::vector<char*> envp;
  for (auto& t : trust) envp.push_back(t.data());
  envp.push_back(nullptr);
  std::string arg0 = "agentbox", arg1 = "__world";
  char* argv[] = {arg0.data(), arg1.data(), nullptr};

  // Each fd the child gets at a fixed number starts above those numbers, or
  // one dup2 would replace the source of the next (a caller whose fds 3-5
  // were free gets them from socketpair, memfd_create and open).
  auto above = [](UniqueFd* fd) {
    if (fd->get() >= 10) return true;
    UniqueFd high(fcntl(fd->get(), F_DUPFD_CLOEXEC, 10));
    *fd = std::move(high);  // closes the low one
    return fd->valid();
  };
  UniqueFd seed;
  if (upper_fs && upper_seed_fd >= 0) seed.reset(fcntl(upper_seed_fd, F_DUPFD_CLOEXEC, 10));
  if (!above(&theirs) || !above(&plan_fd) || (upper_fs && upper_seed_fd >= 0 && !seed.valid())) {
    return Status::Errno("session", "fcntl(F_DUPFD_CLOEXEC)", "the world's channel, plan or upper layer");
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, theirs.get(), 3);
  posix_spawn_file_actions_adddup2(&actions, plan_fd.get(), kWorldPlanFd);
  if (seed.valid()) posix_spawn_file_actions_adddup2(&actions, seed.get(), kWorldUpperSeedFd);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  // Nothing of the world may write on the caller's stdout (an MCP server's
  // protocol stream): its stdout is the caller's stderr.
  posix_spawn_file_actions_adddup2(&actions, 2, 1);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, linux::SpawnWithCleanSignals(&attr));
  pid_t pid = -1;
  int rc = posix_spawn(&pid, exe.c_str(), &actions, &attr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return Status::Syscall("session", "posix_spawn", exe, rc);
  theirs.reset();

  std::unique_ptr<World> w(new World());
  w->supervisor_pid_ = pid;
  w->supervisor_pidfd_.reset(linux::PidfdOpen(pid));
  w->channel_ = std::move(ours);
  if (!secrets_message.empty() &&
      send(w->channel_.get(), secrets_message.data(), secrets_message.size(), MSG_NOSIGNAL) < 0) {
    Status s = Status::Errno("session", "send", "the secrets to the session's supervisor");
    w->Stop(0);
    return s;
  }

  const auto deadline = Clock::now() + std::chrono::milliseconds(ready_timeout_ms);
  for (;;) {
    struct pollfd p = {w->channel_.get(), POLLIN, 0};
    int r = poll(&p, 1, MsUntil(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      w->Stop(0);
      return Status::Error("session", "the session's sandbox was not ready within " +
                                          std::to_string(ready_timeout_ms) + " ms");
    }
    std::string text;
    UniqueFd control;
    ssize_t n = ReceiveMessage(w->channel_.get(), &text, &control, 0);
    if (n <= 0) {
      w->Stop(0);
      return Status::Error("session", "the session's supervisor (" + exe + " __world) ended before the sandbox was ready");
    }
    json m = json::parse(text, nullptr, false);
    const std::string t = m.is_object() ? m.value("t", "") : "";
    if (t == "error") {
      Status s = StatusFromError(m);
      w->Stop(0);
      return s;
    }
    if (t == "exited") {  // a machine of its own that ended before it was ready says how
      w->Stop(0);
      return Status::Error("session", "the session's sandbox ended before it was ready: " + m.value("how", "?"));
    }
    if (t == "ready" && control.valid()) {
      w->control_ = std::move(control);
      // The init sent its upper filesystem before it reported ready.
      if (upper_fs) {
        std::string upper_text;
        ssize_t got = ReceiveMessage(w->control_.get(), &upper_text, &w->upper_fs_, MSG_DONTWAIT);
        json u = got > 0 ? json::parse(upper_text, nullptr, false) : json();
        if (!u.is_object() || u.value("t", "") != "upper" || !w->upper_fs_.valid()) {
          w->Stop(0);
          return Status::Error("session", "the session's sandbox did not hand over its workspace's upper layer "
                                          "(disk_gib)");
        }
      }
      w->cgroup_mechanism_ = m.value("cgroup", "");
      w->rlimits_.nofile_soft = m.value("nofile", std::uint64_t{0});
      if (m.contains("fsize")) w->rlimits_.fsize = m.value("fsize", std::uint64_t{0});
      if (m.contains("nproc")) w->rlimits_.nproc = m.value("nproc", std::uint64_t{0});
      if (m.contains("skipped") && m["skipped"].is_array()) {
        for (const auto& e : m["skipped"]) {
          if (e.is_string()) w->skipped_.push_back(e.get<std::string>());
        }
      }
      return w;
    }
    // A remote world's plan and report, as the remote confined them (in a
    // memfd: they outgrow one message).
    if (t == "confined" && control.valid()) {
      std::string confined_text;
      char buf[65536];
      off_t off = 0;
      for (ssize_t r; (r = pread(control.get(), buf, sizeof(buf), off)) > 0; off += r) {
        confined_text.append(buf, static_cast<std::size_t>(r));
      }
      json c = json::parse(confined_text, nullptr, false);
      if (!c.is_object()) {
        w->Stop(0);
        return Status::Error("session", "the remote world's confined plan is not JSON");
      }
      w->remote_confined_ = std::make_shared<const json>(std::move(c));
      continue;
    }
    // Before ready: what the runner found short of the plan (Landlock under
    // require: partial), for the calls' reports.
    if (t == "note" && m.contains("facet")) {
      w->short_of_plan_.push_back({m.value("facet", ""), m.value("message", "")});
    }
  }
}

World::~World() { Stop(0); }

bool World::Alive() {
  if (dead_) return false;
  struct pollfd p = {supervisor_pidfd_.get(), POLLIN, 0};
  if (supervisor_pidfd_.valid() && poll(&p, 1, 0) > 0) {
    // Its last words first: how the world ended, and its OOM kills.
    if (channel_mu_.try_lock()) {
      PumpChannel(false, 0);
      channel_mu_.unlock();
    }
    dead_ = true;
    std::lock_guard<std::mutex> lock(state_mu_);
    if (death_.empty()) death_ = "the session's supervisor ended";
    return false;
  }
  if (channel_mu_.try_lock()) {
    PumpChannel(false, 0);
    channel_mu_.unlock();
  }
  return !dead_;
}

std::string World::death() const {
  std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(state_mu_));
  return death_;
}

void World::PumpChannel(bool until_stats, int wait_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(wait_ms);
  if (until_stats) {
    std::lock_guard<std::mutex> lock(state_mu_);
    stats_fresh_ = false;
  }
  for (;;) {
    std::string text;
    ssize_t n = ReceiveMessage(channel_.get(), &text, nullptr, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      bool fresh;
      {
        std::lock_guard<std::mutex> lock(state_mu_);
        fresh = stats_fresh_;
      }
      if (!until_stats || fresh || dead_ || Clock::now() >= deadline) return;
      struct pollfd p = {channel_.get(), POLLIN, 0};
      poll(&p, 1, std::max(1, MsUntil(deadline)));
      continue;
    }
    if (n <= 0) {
      dead_ = true;
      std::lock_guard<std::mutex> lock(state_mu_);
      if (death_.empty()) death_ = "the session's supervisor closed its channel";
      return;
    }
    json m = json::parse(text, nullptr, false);
    const std::string t = m.is_object() ? m.value("t", "") : "";
    std::lock_guard<std::mutex> lock(state_mu_);
    if (t == "net" && m.contains("record")) {
      connections_.emplace_back(Clock::now(), std::move(m["record"]));
      while (connections_.size() > kMaxConnectionsKept ||
             (!connections_.empty() && Clock::now() - connections_.front().first > kConnectionsKeptFor)) {
        connections_.pop_front();
      }
    } else if (t == "rotated") {
      rotation_error_ = m.value("error", "");
    } else if (t == "network") {
      network_error_ = m.value("error", "");
    } else if (t == "graft" || t == "ungraft" || t == "memory") {
      grant_error_ = m.value("error", "");
      grant_status_ = grant_error_->empty() ? Status{} : StatusFromError(m);
    } else if (t == "stats") {
      oom_kills_ = m.value("oom_kills", std::uint64_t{0});
      stats_fresh_ = true;
    } else if (t == "exited" || t == "error") {
      dead_ = true;
      oom_kills_ = std::max(oom_kills_, m.value("oom_kills", std::uint64_t{0}));
      death_ = t == "error" ? StatusFromError(m).ToString() : m.value("how", "ended");
      if (m.value("oom_kills", 0) > 0) death_ += " (OOM kills in the session's cgroup: " + std::to_string(m.value("oom_kills", 0)) + ")";
      stats_fresh_ = true;
    }
  }
}

std::uint64_t World::QueryOomKills() {
  std::lock_guard<std::mutex> lock(channel_mu_);
  if (!dead_) {
    const std::string req = json{{"op", "stats"}}.dump();
    if (send(channel_.get(), req.data(), req.size(), MSG_NOSIGNAL) > 0) PumpChannel(true, 2000);
  }
  std::lock_guard<std::mutex> state(state_mu_);
  return oom_kills_;
}

// Sends `text` to the supervisor and waits for its answer in `*answer`
// ("" = done, else why not). The supervisor answers its channel in order:
// once a stats request sent after `text` is answered, so is `text`.
Status World::AskSupervisor(std::string text, std::optional<std::string>* answer, const std::string& what) {
  std::lock_guard<std::mutex> lock(channel_mu_);
  {
    std::lock_guard<std::mutex> state(state_mu_);
    answer->reset();
  }
  const bool sent = !dead_ && send(channel_.get(), text.data(), text.size(), MSG_NOSIGNAL) > 0;
  net::Wipe(text);
  if (!sent) return Status::Error(kWorldGone, "the session's sandbox is not running");
  const std::string stats = json{{"op", "stats"}}.dump();
  if (send(channel_.get(), stats.data(), stats.size(), MSG_NOSIGNAL) > 0) PumpChannel(true, 5000);
  std::lock_guard<std::mutex> state(state_mu_);
  if (!*answer) return Status::Error(kWorldGone, "the session's supervisor did not confirm " + what);
  if (!(*answer)->empty()) return Status::Error("supervisor", **answer);
  return {};
}

Status World::RotateSecret(const std::string& name, std::string_view value) {
  Status s = AskSupervisor(SecretsMessage("rotate", {{name, value}}), &rotation_error_, "the rotation of " + name);
  if (!s.ok() && s.stage() == "supervisor") return Status::Error("credentials", s.message());
  return s;
}

Status World::SetNetworkRules(const std::vector<std::string>& allow, const std::vector<std::string>& deny) {
  Status s = AskSupervisor(json{{"op", "network"}, {"allow", allow}, {"deny", deny}}.dump(), &network_error_,
                           "the network rules");
  if (!s.ok() && s.stage() == "supervisor") return Status::Error("network", s.message());
  return s;
}

Status World::GraftPath(const std::string& source, const std::string& target, bool writable) {
  Status s = AskSupervisor(json{{"op", "graft"}, {"source", source}, {"target", target}, {"writable", writable}}.dump(),
                           &grant_error_, "the graft of " + source + " at " + target);
  if (!s.ok() && s.stage() == "supervisor") {
    std::lock_guard<std::mutex> state(state_mu_);
    return grant_status_;
  }
  return s;
}

Status World::UngraftPath(const std::string& target) {
  Status s = AskSupervisor(json{{"op", "ungraft"}, {"target", target}}.dump(), &grant_error_,
                           "the removal of the graft at " + target);
  if (!s.ok() && s.stage() == "supervisor") {
    std::lock_guard<std::mutex> state(state_mu_);
    return grant_status_;
  }
  return s;
}

Status World::SetMemoryLimit(std::uint64_t bytes) {
  Status s = AskSupervisor(json{{"op", "memory"}, {"bytes", bytes}}.dump(), &grant_error_,
                           "the memory limit of " + std::to_string(bytes) + " bytes");
  if (!s.ok() && s.stage() == "supervisor") {
    std::lock_guard<std::mutex> state(state_mu_);
    return grant_status_;
  }
  return s;
}

Status World::SendControl(const json& request, const std::vector<int>& fds, const std::string* raw) {
  std::string text = report::CompactJson(request);
  // The field's bytes, if any, follow the JSON after a newline (linux/runner.h).
  const std::size_t whole = text.size() + (raw ? 1 + raw->size() : 0);
  UniqueFd memfd;
  std::vector<int> all = fds;
  if (whole > kInlineRequest) {
    memfd.reset(static_cast<int>(memfd_create("agentbox-request", MFD_CLOEXEC)));
    if (!memfd.valid()) return Status::Errno("session", "memfd_create");
    // Each part written from where it is: a write_file's content is not
    // copied behind the JSON first.
    const bool written = linux::WriteAll(memfd.get(), text) &&
                         (!raw || (linux::WriteAll(memfd.get(), "\n") && linux::WriteAll(memfd.get(), *raw)));
    if (!written) {
      return Status::Errno("session", "write", "memfd");
    }
    text = "@";
    all.insert(all.begin(), memfd.get());
  } else if (raw) {
    text += '\n';
    text += *raw;
  }
  struct iovec iov = {text.data(), text.size()};
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
  if (!all.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * all.size());
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * all.size());
    std::memcpy(CMSG_DATA(c), all.data(), sizeof(int) * all.size());
  }
  std::lock_guard<std::mutex> lock(send_mu_);
  for (;;) {
    if (sendmsg(control_.get(), &msg, MSG_NOSIGNAL) >= 0) return {};
    if (errno == EINTR) continue;
    if (errno == EPIPE || errno == ECONNRESET || errno == ECONNREFUSED || errno == ENOTCONN) {
      // The init is gone: nothing was started; the caller may start afresh.
      dead_ = true;
      return Status::Error(kWorldGone, "the session's sandbox ended before the call was sent");
    }
    return Status::Errno("session", "sendmsg", "the session's control socket");
  }
}

Result<WorldTerminal> World::OpenTerminal(const WorldTerminalSpec& spec) {
  if (!Alive()) return Status::Error(kWorldGone, "the session's sandbox is not running: " + death());
  UniqueFd res_r, res_w;
  if (Status s = Pipe(&res_r, &res_w); !s.ok()) return s;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return Status::Errno("session", "socketpair");
  UniqueFd answer_r(sv[0]), answer_w(sv[1]);
  WorldTerminal out;
  out.id = next_id_++;
  json req = {{"op", "pty"}, {"id", out.id}, {"argv", spec.argv}, {"cwd", spec.cwd},
              {"cols", spec.cols}, {"rows", spec.rows}, {"term", spec.term}};
  if (Status s = SendControl(req, {answer_w.get(), res_w.get()}); !s.ok()) return s;
  answer_w.reset();
  res_w.reset();
  // The master comes back on the socket; an error (or nothing: the init
  // went away) on the result pipe.
  char text[64];
  struct iovec iov = {text, sizeof(text)};
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  struct msghdr msg {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  struct pollfd p = {answer_r.get(), POLLIN, 0};
  if (poll(&p, 1, 10000) <= 0) return Status::Error("pty", "the sandbox's init did not answer the terminal request");
  ssize_t n = recvmsg(answer_r.get(), &msg, MSG_CMSG_CLOEXEC);
  struct cmsghdr* c = n > 0 ? CMSG_FIRSTHDR(&msg) : nullptr;
  if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int))) {
    int fd;
    std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
    out.master.reset(fd);
  }
  if (!out.master.valid()) {
    std::string line;
    char buf[4096];
    ssize_t got;
    while ((got = read(res_r.get(), buf, sizeof(buf))) > 0) line.append(buf, static_cast<size_t>(got));
    json e = json::parse(line, nullptr, false);
    if (e.is_object() && e.value("t", "") == "exec_error") {
      return Status::Syscall(e.value("stage", "pty"), e.value("syscall", ""), e.value("path", ""), e.value("errno", 0));
    }
    return Status::Error("pty", "the sandbox's init gave no terminal" + (Alive() ? std::string() : ": " + death()));
  }
  out.result = std::move(res_r);
  return out;
}

void World::KillCall(long id, int sig) { (void)SendControl(json{{"op", "kill"}, {"id", id}, {"signal", sig}}, {}); }

Result<WorldExecResult> World::Exec(const WorldExec& exec, const OutputSink& sink, const std::atomic<bool>* cancel) {
  WorldExecResult out;
  const auto started = Clock::now();
  if (!Alive()) return Status::Error(kWorldGone, "the session's sandbox is not running: " + death());
  std::uint64_t oom_before;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    oom_before = oom_kills_;
  }
  UniqueFd out_r, out_w, res_r, res_w, in_r, in_w;
  if (Status s = Pipe(&out_r, &out_w); !s.ok()) return s;
  if (Status s = Pipe(&res_r, &res_w); !s.ok()) return s;
  if (exec.stdin_data) {
    if (Status s = Pipe(&in_r, &in_w); !s.ok()) return s;
    SetNonBlocking(in_w.get());
  } else {
    in_r.reset(open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!in_r.valid()) return Status::Errno("session", "open", "/dev/null");
  }
  SetNonBlocking(out_r.get());
  const long id = next_id_++;
  json req = exec.shell_command ? json{{"op", "shell"}, {"id", id}, {"command", *exec.shell_command},
                                       {"cwd", exec.cwd}, {"stdin", exec.stdin_data.has_value()}}
                                 : json{{"op", "exec"}, {"id", id}, {"argv", exec.argv}, {"cwd", exec.cwd}};
  if (!exec.env.empty()) req["env"] = exec.env;
  std::vector<int> passed = {in_r.get(), out_w.get(), res_w.get()};
  if (exec.background_log_fd >= 0) passed.push_back(exec.background_log_fd);
  if (exec.no_network) req["net"] = "none";
  if (exec.binding_fd >= 0 && !exec.shell_command) {
    req["binding"] = true;
    passed.push_back(exec.binding_fd);
  }
  if (Status s = SendControl(req, passed); !s.ok()) return s;
  in_r.reset();
  out_w.reset();
  res_w.reset();

  CappedOutput output(exec.output_cap);
  std::string result_buf;
  std::size_t stdin_off = 0;
  bool exited = false, out_open = true, res_open = true;
  std::optional<Clock::time_point> deadline, kill_at;
  if (exec.timeout_ms) deadline = started + std::chrono::milliseconds(*exec.timeout_ms);
  auto send_kill = [&](int sig) {
    (void)SendControl(json{{"op", "kill"}, {"id", id}, {"signal", sig}}, {});
  };
  char buf[65536];
  auto keep = [&](size_t got) {  // output read into buf
    output.Add(buf, got);
    if (sink) sink(std::string_view(buf, got));
  };
  while (!exited && (res_open || out_open)) {
    if (cancel && cancel->load() && !out.cancelled) {
      out.cancelled = true;
      send_kill(SIGKILL);
    }
    const auto now = Clock::now();
    if (exec.stop && exec.stop->load() && !out.stopped && !out.timed_out && !out.cancelled) {
      out.stopped = true;
      send_kill(SIGTERM);
      kill_at = now + std::chrono::milliseconds(exec.kill_grace_ms);
    }
    if (deadline && now >= *deadline && !out.timed_out && !out.stopped) {
      out.timed_out = true;
      send_kill(SIGTERM);
      kill_at = now + std::chrono::milliseconds(exec.kill_grace_ms);
    }
    if (kill_at && now >= *kill_at) {
      send_kill(SIGKILL);
      kill_at.reset();
    }
    int timeout = -1;
    for (const auto& t : {deadline, kill_at}) {
      if (t && *t > now) timeout = timeout < 0 ? MsUntil(*t) + 1 : std::min(timeout, MsUntil(*t) + 1);
    }
    if (deadline && out.timed_out && !kill_at) timeout = timeout < 0 ? 1000 : timeout;
    if (cancel || exec.stop) timeout = timeout < 0 ? 50 : std::min(timeout, 50);

    struct pollfd fds[5];
    int n = 0, i_out = -1, i_res = -1, i_in = -1, i_chan = -1, i_sup = -1;
    if (out_open) fds[i_out = n++] = {out_r.get(), POLLIN, 0};
    if (res_open) fds[i_res = n++] = {res_r.get(), POLLIN, 0};
    if (in_w.valid()) fds[i_in = n++] = {in_w.get(), POLLOUT, 0};
    fds[i_chan = n++] = {channel_.get(), POLLIN, 0};
    fds[i_sup = n++] = {supervisor_pidfd_.get(), POLLIN, 0};
    int r = poll(fds, static_cast<nfds_t>(n), timeout);
    if (r < 0 && errno != EINTR) return Status::Errno("session", "poll");
    if (r <= 0) continue;
    if (i_out >= 0 && fds[i_out].revents) {
      ssize_t got = read(out_r.get(), buf, sizeof(buf));
      if (got > 0) {
        keep(static_cast<size_t>(got));
      } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        out_open = false;
      }
    }
    if (i_res >= 0 && fds[i_res].revents) {
      ssize_t got = read(res_r.get(), buf, sizeof(buf));
      if (got > 0) {
        result_buf.append(buf, static_cast<size_t>(got));
        size_t nl;
        while ((nl = result_buf.find('\n')) != std::string::npos) {
          json m = json::parse(result_buf.substr(0, nl), nullptr, false);
          result_buf.erase(0, nl + 1);
          const std::string t = m.is_object() ? m.value("t", "") : "";
          if (t == "started") {
            out.pid = m.value("pid", 0);
            if (exec.on_started) exec.on_started(*out.pid);
          } else if (t == "exec_error") {
            out.exec_error = StatusFromError(m);
          } else if (t == "exit") {
            exited = true;
            const int sig = m.value("signal", 0);
            if (sig) {
              out.signal = sig;
            } else {
              out.exit_code = m.value("code", -1);
            }
            if (m.contains("cpu_user_us")) {
              struct rusage ru {};
              auto us = [&](const char* key, struct timeval* tv) {
                const std::uint64_t v = m.value(key, std::uint64_t{0});
                tv->tv_sec = static_cast<time_t>(v / 1000000);
                tv->tv_usec = static_cast<suseconds_t>(v % 1000000);
              };
              us("cpu_user_us", &ru.ru_utime);
              us("cpu_sys_us", &ru.ru_stime);
              ru.ru_maxrss = static_cast<long>(m.value("maxrss_kb", std::uint64_t{0}));
              out.rusage = ru;
            }
            if (m.contains("shell") && m["shell"].is_object()) out.shell = m["shell"];
            if (m.contains("denied") && m["denied"].is_array()) {
              for (const auto& d : m["denied"]) {
                out.seccomp.emplace_back(d.value("syscall", ""), d.value("count", std::uint64_t{0}));
              }
            }
          }
        }
      } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        res_open = false;
      }
    }
    if (i_in >= 0 && fds[i_in].revents) {
      const std::string& data = *exec.stdin_data;
      if (fds[i_in].revents & (POLLERR | POLLHUP)) {
        in_w.reset();
      } else {
        ssize_t w = write(in_w.get(), data.data() + stdin_off, data.size() - stdin_off);
        if (w > 0) stdin_off += static_cast<size_t>(w);
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || stdin_off >= data.size()) in_w.reset();
      }
    }
    if (fds[i_chan].revents && channel_mu_.try_lock()) {
      PumpChannel(false, 0);
      channel_mu_.unlock();
    }
    if (fds[i_sup].revents) {
      // The supervisor is gone: what it said last (how the world ended,
      // its OOM kills) is still in the channel.
      if (channel_mu_.try_lock()) {
        PumpChannel(false, 0);
        channel_mu_.unlock();
      }
      dead_ = true;
    }
    if (dead_ && !exited) {
      // The init (or its supervisor) is gone: nothing more will come.
      if (!res_open || fds[i_sup].revents) break;
    }
    if (!res_open && !exited) break;  // the init closed the call without an exit: it died
  }
  // Whatever the command (or what it left running) wrote up to now. A
  // relayed world's output can still be in flight behind its exit line, so
  // after an exit the pipe is read until its end, for a short grace when
  // something the command left running still holds it.
  const auto drain_until = Clock::now() + kOutputEndGrace;
  for (;;) {
    int wait_ms = 0;
    if (exited && out_open) wait_ms = std::max(0, MsUntil(drain_until));
    struct pollfd pfd = {out_r.get(), POLLIN, 0};
    if (poll(&pfd, 1, wait_ms) <= 0) break;
    ssize_t got = read(out_r.get(), buf, sizeof(buf));
    if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (got <= 0) break;
    keep(static_cast<size_t>(got));
  }
  out.output = output.Take(&out.truncated);
  out.output_bytes = output.total();
  if (!exited) out.world_died = true;
  const std::uint64_t oom_after = QueryOomKills();
  out.oom_kills = oom_after > oom_before ? oom_after - oom_before : 0;
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    for (const auto& [at, record] : connections_) {
      if (at >= started) out.connections.push_back(record);
    }
  }
  out.wall_ms = MsSince(started);
  return out;
}

Result<json> World::File(json req, int timeout_ms) {
  if (!Alive()) return Status::Error(kWorldGone, "the session's sandbox is not running: " + death());
  UniqueFd res_r, res_w;
  if (Status s = Pipe(&res_r, &res_w); !s.ok()) return s;
  // Room for a whole answer of the usual size (1 MiB, the kernel's default
  // pipe-max-size): the tool writes it in one go and this end takes it in
  // one read, where 64 KiB at a time cost two wake-ups per 64 KiB. Refused
  // (a user past pipe-user-pages-soft), the pipe keeps its size.
  (void)fcntl(res_r.get(), F_SETPIPE_SZ, 1 << 20);
  req["op"] = "file";
  req["id"] = next_id_++;
  // write_file's content travels as it is, after the request's JSON: the
  // init and the tool read the JSON only. Not to a remote agentbox, which
  // may be of a version before it.
  std::string raw;
  const bool raw_content = !remote_confined_ && req.value("name", "") == "write_file" && req.contains("input") &&
                           req["input"].is_object() && req["input"].contains("content") &&
                           req["input"]["content"].is_string();
  if (raw_content) {
    raw = std::move(req["input"]["content"].get_ref<std::string&>());
    req["input"].erase("content");
    req["raw"] = "content";
  }
  if (Status s = SendControl(req, {res_w.get()}, raw_content ? &raw : nullptr); !s.ok()) return s;
  res_w.reset();
  std::string answer;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    struct pollfd fds[2] = {{res_r.get(), POLLIN, 0}, {supervisor_pidfd_.get(), POLLIN, 0}};
    int r = poll(fds, 2, MsUntil(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      (void)SendControl(json{{"op", "kill"}, {"id", req["id"]}, {"signal", SIGKILL}}, {});
      return Status::Error(kFileToolTimedOut, "the file tool did not answer within " + std::to_string(timeout_ms) +
                                                  " ms; its process was killed");
    }
    if (fds[0].revents) {
      // What the pipe holds, read into the answer in place (64 KiB when it
      // says nothing: its end, or an error, is then read as such).
      int ready = 0;
      if (ioctl(res_r.get(), FIONREAD, &ready) != 0 || ready <= 0) ready = 65536;
      const size_t had = answer.size();
      answer.resize(had + static_cast<size_t>(ready));
      const ssize_t got = read(res_r.get(), answer.data() + had, static_cast<size_t>(ready));
      answer.resize(had + static_cast<size_t>(std::max<ssize_t>(got, 0)));
      if (got > 0) continue;
      if (got < 0 && errno == EINTR) continue;
      break;
    }
    if (fds[1].revents) {
      dead_ = true;
      break;
    }
  }
  // A JSON line, then the output's raw bytes (world_main.cc).
  const size_t nl = answer.find('\n');
  json parsed = json::parse(std::string_view(answer).substr(0, nl), nullptr, false);
  if (parsed.is_object() && nl != std::string::npos) {
    answer.erase(0, nl + 1);  // in place: a read_file's output is the file
    parsed["output"] = std::move(answer);
  }
  if (!parsed.is_object()) {
    Alive();
    return Status::Error("session", answer.empty() ? "the file tool ended without an answer (the session's sandbox: " +
                                                         (death().empty() ? std::string("running") : death()) + ")"
                                                   : "the file tool's answer is not JSON");
  }
  return parsed;
}

Result<UniqueFd> World::OpenInsideSocket(int timeout_ms) {
  if (!Alive()) return Status::Error(kWorldGone, "the session's sandbox is not running: " + death());
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return Status::Errno("session", "socketpair");
  UniqueFd ours(sv[0]), theirs(sv[1]);
  if (Status s = SendControl(json{{"op", "socket"}, {"id", next_id_++}}, {theirs.get()}); !s.ok()) return s;
  theirs.reset();
  struct pollfd p = {ours.get(), POLLIN, 0};
  int r;
  while ((r = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {
  }
  if (r == 0) return Status::Error("session", "the session's init did not hand over a socket within " +
                                                   std::to_string(timeout_ms) + " ms");
  std::string text;
  UniqueFd socket;
  if (ReceiveMessage(ours.get(), &text, &socket, 0) <= 0 || !socket.valid()) {
    json m = json::parse(text, nullptr, false);
    if (m.is_object() && m.value("errno", 0) != 0) {
      return Status::Syscall("session", "socket(AF_INET, SOCK_STREAM)", "inside the session's sandbox", m.value("errno", 0));
    }
    return Status::Error("session", "the session's init did not hand over a socket (" +
                                        (death().empty() ? std::string("it is running") : death()) + ")");
  }
  return socket;
}

void World::Stop(int grace_ms) {
  if (stopped_) return;
  stopped_ = true;
  if (channel_.valid() && !dead_) {
    const std::string req = json{{"op", "stop"}, {"grace_ms", grace_ms}}.dump();
    (void)send(channel_.get(), req.data(), req.size(), MSG_NOSIGNAL);
  }
  control_.reset();
  if (supervisor_pid_ > 0) {
    // The supervisor kills the init after the grace; give it that plus a margin.
    struct pollfd p = {supervisor_pidfd_.get(), POLLIN, 0};
    if (supervisor_pidfd_.valid() && poll(&p, 1, grace_ms + 5000) == 0) kill(supervisor_pid_, SIGKILL);
    channel_.reset();
    int ws;
    while (waitpid(supervisor_pid_, &ws, 0) < 0 && errno == EINTR) {
    }
    supervisor_pid_ = -1;
  }
  channel_.reset();
  dead_ = true;
}

}  // namespace agentbox::session
