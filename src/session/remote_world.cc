// sandbox.isolation: remote over SSH (remote_world.h): both ends.
#include "session/remote_world.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include <openssl/evp.h>

#include "agentbox/host_caps.h"
#include "agentbox/outcome.h"
#include "agentbox/policy.h"
#include "k8s/client.h"
#include "linux/compat.h"
#include "linux/fd.h"
#include "linux/host_program.h"
#include "linux/microvm.h"
#include "linux/random.h"
#include "linux/session_shell.h"
#include "linux/user_dirs.h"
#include "report/report_json.h"
#include "session/layers.h"
#include "session/world.h"
#include "session/world_channel.h"
#include "supervise/microvm_run.h"
#include "supervise/run_dirs.h"
#include "supervise/world_machine.h"

extern char** environ;

namespace agentbox::session {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr const char* kLinePrefix = "agentbox-remote: ";
// From the connection to the world's confined plan: ssh's handshake, the
// binary's copy on first use, the remote's copy of the workspace.
constexpr auto kProvisionTimeout = std::chrono::minutes(5);

using linux::ShellQuote;

int MsLeft(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, 1 << 30));
}

Result<std::string> Sha256OfFile(const std::string& path, std::string* bytes) {
  linux::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno(kRemoteStage, "open", path);
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::Errno(kRemoteStage, "read", path);
    if (n == 0) break;
    bytes->append(buf, static_cast<std::size_t>(n));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(bytes->data(), bytes->size(), md, &len, EVP_sha256(), nullptr) != 1) {
    return Status::Error(kRemoteStage, "sha256 of " + path + " failed");
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

// The caller's side of a remote world's stream: over ssh, or a pod's exec.
class RemoteMachine : public supervise::WorldMachine {
 public:
  supervise::Egress* egress() override { return nullptr; }
  linux::UniqueFd DialEgress(char) override { return {}; }
  const std::vector<std::string>& skipped() const override { return skipped_; }
  Status SetMemory(std::uint64_t) override {
    return Status::Error(kRemoteStage, "a remote world's memory limit is set by the remote agentbox");
  }
  std::string GraftRefusal() const override {
    return "a path of the daemon's host cannot be grafted into a remote world (" + where() +
           "): its files are the remote's; grant the path there in the policy";
  }
  const char* stage() const override { return kRemoteStage; }
  // "over ssh to agent@build-3", "in pod P of claim C (namespace N)".
  virtual std::string where() const = 0;
  // "present": the remote had this binary; "installed": it was copied now;
  // "image": the pod's own.
  virtual std::string binary_state() const = 0;

 private:
  std::vector<std::string> skipped_;
};

// The host's side of the stream to a remote world: the `ssh` process, whose
// stdin and stdout are one socket of ours, and a thread that keeps the
// tail of its stderr (the remote's and ssh's own words) for errors.
class SshMachine : public RemoteMachine {
 public:
  ~SshMachine() override { Reap(std::chrono::milliseconds(0)); }

  static Result<std::unique_ptr<SshMachine>> Connect(const RemotePlan& remote, Clock::time_point deadline,
                                                     const std::string& command = "__world --stdio");

  int channel() const override { return stream_.get(); }
  int ended_fd() const override { return pidfd_.get(); }
  void Reap(std::chrono::milliseconds grace) override {
    if (pid_ <= 0 || reaped_) return;
    struct pollfd p = {pidfd_.get(), POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(grace.count())) <= 0) {
      kill(pid_, SIGTERM);
      if (poll(&p, 1, 1000) <= 0) kill(pid_, SIGKILL);
    }
    while (waitpid(pid_, &wait_status_, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
  }
  std::string EndedHow(bool* oom) override {
    *oom = false;
    std::string how = "the connection to the remote world (" + destination_ + ") ended";
    if (reaped_) how += ": ssh " + linux::DescribeWaitStatus(wait_status_);
    if (const std::string tail = StderrTail(); !tail.empty()) how += " (" + tail + ")";
    return how;
  }
  std::string where() const override { return "over ssh to " + destination_; }
  std::string binary_state() const override { return binary_state_; }
  // The last lines ssh wrote on its stderr (ssh's errors, the remote's).
  std::string StderrTail() {
    std::string t;
    {
      std::unique_lock<std::mutex> lock(stderr_->mu);
      // Once ssh ended, its last words are waited for a moment.
      if (reaped_) stderr_->cv.wait_for(lock, std::chrono::milliseconds(500), [this] { return stderr_->done; });
      t = stderr_->tail;
    }
    while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
    // The last few lines, one line of text.
    std::size_t lines = 0, at = t.size();
    while (at > 0 && lines < 3) {
      at = t.rfind('\n', at - 1);
      if (at == std::string::npos) {
        at = 0;
        break;
      }
      ++lines;
    }
    t = t.substr(at == 0 ? 0 : at + 1);
    std::replace(t.begin(), t.end(), '\n', ';');
    std::replace(t.begin(), t.end(), '\r', ' ');
    return t;
  }

 private:
  SshMachine() = default;
  Status Install(const std::string& binary, Clock::time_point deadline);
  Result<std::string> ReadLine(Clock::time_point deadline);

  std::string destination_;
  pid_t pid_ = -1;
  linux::UniqueFd pidfd_;
  linux::UniqueFd stream_;
  bool reaped_ = false;
  int wait_status_ = 0;
  std::string binary_state_;
  // Shared with the thread that reads ssh's stderr, which is detached: a
  // process ssh started (a ProxyCommand) may hold the pipe past ssh itself.
  struct TailBuffer {
    std::mutex mu;
    std::condition_variable cv;
    std::string tail;
    bool done = false;
  };
  std::shared_ptr<TailBuffer> stderr_ = std::make_shared<TailBuffer>();
};

Result<std::unique_ptr<SshMachine>> SshMachine::Connect(const RemotePlan& remote, Clock::time_point deadline,
                                                        const std::string& command) {
  std::string binary;
  auto digest = Sha256OfFile(remote.binary, &binary);
  if (!digest.ok()) return digest.status();
  struct utsname u {};
  uname(&u);
  const std::vector<std::string> argv =
      SshArgv(remote, "sh -c " + ShellQuote(InstallScript(*digest, binary.size(), u.machine, command)));
  const char* path = getenv("PATH");
  const std::string ssh = linux::FindOnPath("/", path ? path : "/usr/bin:/bin", "ssh");
  if (ssh.empty()) {
    return Status::Error(kRemoteStage, "no ssh client on this host's PATH (sandbox.remote.ssh needs the system's "
                                       "ssh: Debian's openssh-client)");
  }
  int sv[2], err[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return Status::Errno(kRemoteStage, "socketpair", "the stream to " + remote.ssh);
  }
  linux::UniqueFd ours(sv[0]), theirs(sv[1]);
  if (pipe2(err, O_CLOEXEC) != 0) return Status::Errno(kRemoteStage, "pipe2", "ssh's stderr");
  linux::UniqueFd err_r(err[0]), err_w(err[1]);

  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, theirs.get(), 0);
  posix_spawn_file_actions_adddup2(&actions, theirs.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, err_w.get(), 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, linux::SpawnWithCleanSignals(&attr));
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, ssh.c_str(), &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return Status::Syscall(kRemoteStage, "posix_spawn", ssh, rc);
  theirs.reset();
  err_w.reset();

  std::unique_ptr<SshMachine> m(new SshMachine());
  m->destination_ = remote.ssh + (remote.port.empty() ? "" : ":" + remote.port);
  m->pid_ = pid;
  m->pidfd_.reset(linux::PidfdOpen(pid));
  m->stream_ = std::move(ours);
  if (!m->pidfd_.valid()) return Status::Errno(kRemoteStage, "pidfd_open", "ssh");
  std::thread([tail = m->stderr_, fd = std::move(err_r)]() {
    char buf[4096];
    for (;;) {
      const ssize_t n = read(fd.get(), buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      std::lock_guard<std::mutex> lock(tail->mu);
      if (n <= 0) {
        tail->done = true;
        tail->cv.notify_all();
        return;
      }
      tail->tail.append(buf, static_cast<std::size_t>(n));
      if (tail->tail.size() > 8192) tail->tail.erase(0, tail->tail.size() - 8192);
    }
  }).detach();
  if (Status s = m->Install(binary, deadline); !s.ok()) return s;
  return m;
}

// One line the install script wrote, read a byte at a time: what follows
// its last line is the world's frames, which must stay in the socket.
Result<std::string> SshMachine::ReadLine(Clock::time_point deadline) {
  std::string line;
  for (;;) {
    struct pollfd p = {stream_.get(), POLLIN, 0};
    const int r = poll(&p, 1, MsLeft(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      return Status::Error(kRemoteStage, "no answer from " + destination_ + " in time" +
                                             (StderrTail().empty() ? "" : " (ssh: " + StderrTail() + ")"));
    }
    char c = 0;
    const ssize_t n = read(stream_.get(), &c, 1);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) {
      Reap(std::chrono::milliseconds(2000));
      const std::string tail = StderrTail();
      return Status::Error(kRemoteStage, "ssh to " + destination_ + " ended before the remote agentbox started: " +
                                             linux::DescribeWaitStatus(wait_status_) +
                                             (tail.empty() ? "" : ": " + tail));
    }
    if (c == '\n') return line;
    if (line.size() < 4096) line += c;
  }
}

Status SshMachine::Install(const std::string& binary, Clock::time_point deadline) {
  for (int lines = 0; lines < 1000; ++lines) {
    auto line = ReadLine(deadline);
    if (!line.ok()) return line.status();
    // Whatever a login shell's start-up files print comes before the script's words.
    if (line->rfind(kLinePrefix, 0) != 0) continue;
    const std::string word = line->substr(std::strlen(kLinePrefix));
    if (word == "have") {
      binary_state_ = binary_state_.empty() ? "present" : binary_state_;
      return {};
    }
    if (word == "installed") {
      binary_state_ = "installed";
      return {};
    }
    if (word == "need") {
      for (std::size_t off = 0; off < binary.size();) {
        struct pollfd p = {stream_.get(), POLLOUT, 0};
        if (poll(&p, 1, MsLeft(deadline)) <= 0) {
          return Status::Error(kRemoteStage, "copying agentbox to " + destination_ + " stalled");
        }
        const ssize_t w = send(stream_.get(), binary.data() + off, binary.size() - off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (w < 0) return Status::Errno(kRemoteStage, "send", "agentbox's binary to " + destination_);
        off += static_cast<std::size_t>(w);
      }
      binary_state_ = "installed";
      continue;
    }
    if (word.rfind("machine ", 0) == 0) {
      struct utsname u {};
      uname(&u);
      return Status::Error(kRemoteStage, destination_ + " is a " + word.substr(8) + " machine; this agentbox is built "
                                         "for " + u.machine + ": install agentbox there for its own machine");
    }
    return Status::Error(kRemoteStage, destination_ + ": " + word);
  }
  return Status::Error(kRemoteStage, destination_ + " printed too much before the remote agentbox started");
}

// The pod of the session's SandboxClaim (kubernetes-sigs/agent-sandbox;
// the daemon claims it and holds it for the session's life), whose
// `agentbox __world --stdio` is reached through the API server's exec
// subresource (k8s/client.h). A world that ends leaves the pod as it is.
class K8sMachine : public RemoteMachine {
 public:
  ~K8sMachine() override { Reap(std::chrono::milliseconds(0)); }

  // Runs `command` (agentbox's world by default) in the claimed pod.
  static Result<std::unique_ptr<K8sMachine>> Connect(
      const RemotePlan& remote, Clock::time_point deadline,
      const std::vector<std::string>& command = {"agentbox", "__world", "--stdio"}) {
    if (remote.k8s_pod.empty()) return Status::Error(kRemoteStage, "no claimed pod to run the world in");
    auto config = k8s::LoadKubeconfig(remote.k8s_kubeconfig, remote.k8s_context);
    if (!config.ok()) return config.status();
    auto api = k8s::ApiClient::Create(std::move(*config));
    if (!api.ok()) return api.status();
    std::unique_ptr<K8sMachine> m(new K8sMachine());
    m->api_ = std::move(*api);
    m->remote_ = remote;
    m->ended_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!m->ended_.valid()) return Status::Errno(kRemoteStage, "eventfd", "the exec stream's end");
    K8sMachine* raw = m.get();
    k8s::ExecCallbacks callbacks;
    callbacks.on_stderr = [raw](std::string_view line) {
      std::lock_guard<std::mutex> lock(raw->mu_);
      raw->stderr_tail_ = std::string(line.substr(0, 2000));
    };
    callbacks.on_end = [raw](const k8s::ExecOutcome& outcome) {
      {
        std::lock_guard<std::mutex> lock(raw->mu_);
        raw->outcome_ = outcome.message.empty() ? outcome.reason : outcome.reason + ": " + outcome.message;
      }
      const std::uint64_t one = 1;
      (void)!write(raw->ended_.get(), &one, sizeof(one));
    };
    auto exec = m->api_->Exec(remote.k8s_namespace, remote.k8s_pod, "", command, callbacks,
                              std::chrono::milliseconds(std::min(MsLeft(deadline), 30000)));
    if (!exec.ok()) return exec.status();
    m->exec_ = std::move(*exec);
    m->stream_ = m->exec_->TakeStream();
    return m;
  }

  int channel() const override { return stream_.get(); }
  int ended_fd() const override { return ended_.get(); }
  void Reap(std::chrono::milliseconds) override {
    stream_.reset();
    if (exec_) exec_->Stop();  // joins the relay: no callback after this
  }
  std::string EndedHow(bool* oom) override {
    *oom = false;
    std::lock_guard<std::mutex> lock(mu_);
    std::string how = "the exec stream to the remote world (" + where() + ") ended";
    if (!outcome_.empty()) how += ": " + outcome_;
    if (!stderr_tail_.empty()) how += " (" + stderr_tail_ + ")";
    return how;
  }
  std::string where() const override {
    return "in pod " + remote_.k8s_pod + " of claim " + remote_.k8s_claim + " (namespace " + remote_.k8s_namespace +
           ")";
  }
  std::string binary_state() const override { return "image"; }

 private:
  K8sMachine() = default;
  std::unique_ptr<k8s::ApiClient> api_;
  RemotePlan remote_;
  std::unique_ptr<k8s::ExecStream> exec_;
  linux::UniqueFd stream_;
  linux::UniqueFd ended_;
  std::mutex mu_;
  std::string outcome_;
  std::string stderr_tail_;
};

Isolation LevelNamed(const std::string& name, bool* ok) {
  *ok = true;
  if (name == "os") return Isolation::kOs;
  if (name == "container") return Isolation::kContainer;
  if (name == "microvm") return Isolation::kMicrovm;
  *ok = false;
  return Isolation::kOs;
}

bool ValidSessionId(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  });
}

std::string CanonicalPath(const std::string& p) {
  char* r = realpath(p.c_str(), nullptr);
  if (r == nullptr) return "";
  std::string out(r);
  free(r);
  return out;
}

std::string HostName() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// The remote's confinement of the caller's request, with its own host's
// enforcement, and its copy of the workspace for a fresh_per_task session.
Result<ConfinedCommand> ConfineHere(const json& req) {
  const std::string where = "on " + HostName();
  if (!req.is_object()) return Status::Error(kRemoteStage, "the request is not a JSON object");
  const std::string yaml = req.value("policy_yaml", "");
  const std::string workspace = req.value("workspace", "");
  const std::string session = req.value("session", "");
  bool level_ok = false;
  const Isolation level = LevelNamed(req.value("level", ""), &level_ok);
  if (!level_ok) return Status::Error(kRemoteStage, "level '" + req.value("level", "") + "' is not os, container or microvm");
  if (!ValidSessionId(session)) return Status::Error(kRemoteStage, "the session id '" + session + "' is malformed");
  auto policy = ParsePolicy(yaml, "the session's policy");
  if (!policy.ok()) return policy.status();
  policy->sandbox.isolation = level;
  policy->sandbox.remote.reset();
  if (workspace.empty() || workspace[0] != '/') {
    return Status::Error(kRemoteStage, "the workspace '" + workspace + "' is not an absolute path");
  }
  const std::string real = CanonicalPath(workspace);
  struct stat st {};
  if (real.empty() || stat(real.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::Error(kRemoteStage, "the workspace " + workspace + " is not a directory " + where);
  }
  std::string home = linux::HomeDir();
  if (!home.empty() && !CanonicalPath(home).empty()) home = CanonicalPath(home);
  const std::string state = linux::StateDir();
  if (state.empty()) return Status::Error(kRemoteStage, "no state directory " + where + " (neither $XDG_STATE_HOME nor $HOME)");
  const std::string dir = state + "/remote/" + session;
  std::string copy;
  if (policy->sandbox.fresh_per_task) {
    for (const std::string& d : {state.substr(0, state.rfind('/')), state, state + "/remote", dir}) {
      if (mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) return Status::Errno(kRemoteStage, "mkdir", d);
    }
    // The session's copy of the workspace, made once: a world provisioned
    // again after a dropped connection finds the session's changes.
    copy = dir + "/copy";
    if (stat(copy.c_str(), &st) != 0) {
      // What apply checks the base against (as a local session's base.record).
      if (Status b = RecordBase(real, dir + "/base.record", linux::OwnDirs(home)); !b.ok()) return b;
      supervise::RemoveTree(copy + ".tmp");
      if (Status c = CopyTree(real, copy + ".tmp"); !c.ok()) return c;
      if (rename((copy + ".tmp").c_str(), copy.c_str()) != 0) return Status::Errno(kRemoteStage, "rename", copy);
    }
  }
  Invocation inv;
  inv.workspace = real;
  inv.cwd = real;
  inv.home = home;
  inv.self_exe = CanonicalPath("/proc/self/exe");
  inv.cache_dir = linux::CacheDir(home);
  inv.own_dirs = linux::OwnDirs(home);
  inv.nonce = linux::RandomHex(8);
  inv.backend = level == Isolation::kOs ? BackendChoice::kNamespaces : BackendChoice::kAuto;
  inv.session = true;
  inv.wrapped_command = false;
  auto confined = Confine({"true"}, *policy, ProbeHostFor(*policy), inv);
  if (!confined.ok()) return confined.status().WithContext("the remote (" + HostName() + ") refuses");
  Plan& plan = confined->plan;
  if (!plan.confined) return Status::Error(kRemoteStage, "sessions run confined: the plan " + where + " confines nothing");
  plan.timeout_ms.reset();
  plan.policy_sha256 = req.value("policy_sha256", plan.policy_sha256);
  if (!copy.empty()) RebaseWorkspace(&plan, copy);
  return confined;
}

Result<ConfinedCommand> ConfinedFromJsonChecked(const json& j);

json FailureText(const Status& s) {
  return {{"stage", s.stage()}, {"message", s.message()}, {"errno", s.err()}};
}

}  // namespace

std::string RemoteBinaryFor(const std::string& exe) {
  const std::string dir = exe.substr(0, exe.rfind('/'));
  const std::string prefix = dir.substr(0, dir.rfind('/'));
  for (const std::string& candidate : {dir + "/remote/agentbox", prefix + "/lib/agentbox/remote/agentbox"}) {
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return exe;
}

std::vector<std::string> SshArgv(const RemotePlan& remote, const std::string& remote_command) {
  std::vector<std::string> a = {"ssh",
                                // Nothing asks: no password, passphrase or host key prompt.
                                "-o", "BatchMode=yes",
                                // An unknown or changed host key is refused, never learnt.
                                "-o", "StrictHostKeyChecking=yes",
                                "-o", "ConnectTimeout=15",
                                // A dead peer is noticed: the world is then provisioned again.
                                "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3",
                                // Nothing of this host's goes to the remote: no agent, X11 or ports.
                                "-o", "ForwardAgent=no", "-o", "ForwardX11=no", "-o", "ClearAllForwardings=yes",
                                "-o", "PermitLocalCommand=no", "-o", "RequestTTY=no",
                                // A connection of its own: no master's, and none left behind.
                                "-o", "ControlMaster=no", "-o", "ControlPath=none",
                                "-T", "-e", "none"};
  if (!remote.ssh_config.empty()) {
    a.push_back("-F");
    a.push_back(remote.ssh_config);
  }
  if (!remote.port.empty()) {
    a.push_back("-p");
    a.push_back(remote.port);
  }
  a.push_back("--");
  a.push_back(remote.ssh);
  a.push_back(remote_command);
  return a;
}

// How long a binary no connection used stays in the remote's cache.
constexpr int kRemoteBinaryKeepDays = 14;

std::string InstallScript(const std::string& sha256_hex, std::uint64_t size, const std::string& machine,
                          const std::string& command) {
  const std::string p = kLinePrefix;
  return "set -u\n"
         "[ \"$(uname -m)\" = " + ShellQuote(machine) + " ] || { echo \"" + p + "machine $(uname -m)\"; exit 4; }\n"
         "d=\"${XDG_CACHE_HOME:-$HOME/.cache}/agentbox/bin\"; f=\"$d/agentbox-" + sha256_hex + "\"\n"
         "command -v sha256sum >/dev/null 2>&1 || { echo '" + p + "no sha256sum here (coreutils): the digest "
         "of the binary cannot be checked'; exit 7; }\n"
         "sum() { sha256sum < \"$1\" 2>/dev/null | cut -d' ' -f1; }\n"
         "if [ -x \"$f\" ] && [ \"$(sum \"$f\")\" = " + sha256_hex + " ]; then echo '" + p + "have'\n"
         "else\n"
         "  umask 077; mkdir -p \"$d\" || { echo \"" + p + "cannot make $d\"; exit 5; }\n"
         "  t=\"$f.tmp.$$\"; echo '" + p + "need'\n"
         "  head -c " + std::to_string(size) + " > \"$t\" && chmod 700 \"$t\" || { rm -f \"$t\"; echo \"" + p +
         "cannot write $t\"; exit 5; }\n"
         "  [ \"$(sum \"$t\")\" = " + sha256_hex + " ] || { rm -f \"$t\"; echo '" + p +
         "the copied binary does not have the digest it was sent with'; exit 6; }\n"
         "  mv -f \"$t\" \"$f\"; echo '" + p + "installed'\n"
         "fi\n"
         // Its last use, by which the others are pruned: a binary no
         // connection asked for in kRemoteBinaryKeepDays goes (a version
         // left by an upgrade, an install cut short).
         "touch \"$f\" 2>/dev/null\n"
         "find \"$d\" -name 'agentbox-*' ! -name \"agentbox-" + sha256_hex + "\" -mtime +" +
         std::to_string(kRemoteBinaryKeepDays) + " -exec rm -f {} + 2>/dev/null\n"
         "exec \"$f\" " + command + "\n";
}

json ConfinedToJson(const ConfinedCommand& c) {
  json sigs = json::array();
  for (const auto& s : c.denial_signatures) sigs.push_back({{"pattern", s.pattern}, {"meaning", s.meaning}});
  json rules = json::array();
  for (const auto& s : c.runner_failure_rules) rules.push_back({{"pattern", s.pattern}, {"meaning", s.meaning}});
  return {{"plan", json::parse(PlanToJson(c.plan))},
          {"enforcement", ToJsonValue(c.enforcement)},
          {"denial_signatures", sigs},
          {"runner_failure_rules", rules}};
}

Result<ConfinedCommand> ConfinedFromJson(const json& j) {
  // What the remote sends is checked, never trusted to have the types it
  // should: a malformed answer is an error here, not an exception.
  try {
    return ConfinedFromJsonChecked(j);
  } catch (const std::exception& e) {
    return Status::Error(kRemoteStage, std::string("the remote's confined plan is malformed: ") + e.what());
  }
}

namespace {

Result<ConfinedCommand> ConfinedFromJsonChecked(const json& j) {
  if (!j.is_object() || !j.contains("plan") || !j.contains("enforcement")) {
    return Status::Error(kRemoteStage, "the remote's confined plan is malformed");
  }
  ConfinedCommand c;
  auto plan = PlanFromJson(j["plan"].dump());
  if (!plan.ok()) return plan.status();
  c.plan = std::move(*plan);
  auto enforcement = EnforcementFromJson(j["enforcement"]);
  if (!enforcement.ok()) return enforcement.status();
  c.enforcement = std::move(*enforcement);
  for (const char* key : {"denial_signatures", "runner_failure_rules"}) {
    auto& out = std::strcmp(key, "denial_signatures") == 0 ? c.denial_signatures : c.runner_failure_rules;
    if (!j.contains(key) || !j[key].is_array()) continue;
    for (const auto& s : j[key]) {
      if (!s.is_object() || !s.contains("pattern") || !s["pattern"].is_string() ||
          (s.contains("meaning") && !s["meaning"].is_string())) {
        return Status::Error(kRemoteStage, std::string("the remote's confined plan has a malformed ") + key);
      }
      out.push_back({s["pattern"].get<std::string>(), s.value("meaning", "")});
    }
  }
  return c;
}

}  // namespace

namespace {

// Where the remote keeps sessions' state (remote/<session>) and the
// snapshots taken of them (remote-snapshots/<id>), which outlive their
// session as a local snapshot does.
std::string RemoteStateDir() { return linux::StateDir() + "/remote"; }
std::string RemoteSnapshotsDir() { return linux::StateDir() + "/remote-snapshots"; }

Status MakeDirs(const std::vector<std::string>& dirs) {
  for (const std::string& d : dirs) {
    if (mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) return Status::Errno(kRemoteStage, "mkdir", d);
  }
  return {};
}

Result<json> LayersHere(const json& req) {
  if (!req.is_object()) return Status::Error(kRemoteStage, "the request is not a JSON object");
  const std::string op = req.value("op", "");
  const std::string snapshot = req.value("snapshot", "");
  const bool names_snapshot = op == "snapshot" || op == "seed" || op == "drop_snapshot";
  if (names_snapshot && !ValidSessionId(snapshot)) {
    return Status::Error(kRemoteStage, "the snapshot id '" + snapshot + "' is malformed");
  }
  const std::string state = linux::StateDir();
  if (state.empty()) {
    return Status::Error(kRemoteStage, "no state directory on " + HostName() + " (neither $XDG_STATE_HOME nor $HOME)");
  }
  const std::string snap_dir = RemoteSnapshotsDir() + "/" + snapshot;
  if (op == "drop_snapshot") {
    // The manifest goes first: a half-removed snapshot is no snapshot.
    struct stat st {};
    const bool present = stat(snap_dir.c_str(), &st) == 0;
    if (present && unlink((snap_dir + "/manifest.json").c_str()) != 0 && errno != ENOENT) {
      return Status::Errno(kRemoteStage, "unlink", snap_dir + "/manifest.json");
    }
    if (present) supervise::RemoveTree(snap_dir);
    return json{{"dropped", present}};
  }
  const std::string session = req.value("session", "");
  if (!ValidSessionId(session)) return Status::Error(kRemoteStage, "the session id '" + session + "' is malformed");
  const std::string real = CanonicalPath(req.value("workspace", ""));
  struct stat st {};
  if (real.empty() || stat(real.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::Error(kRemoteStage, "the workspace " + req.value("workspace", "") + " is not a directory on " +
                                           HostName());
  }
  const std::string dir = RemoteStateDir() + "/" + session;
  LayerStack stack;
  stack.base = real;
  stack.upper = dir + "/copy";
  stack.copy_mode = true;
  const bool copied = stat(stack.upper.c_str(), &st) == 0;
  DiffOptions diff;
  diff.max_patch_bytes = req.value("max_patch_bytes", std::size_t{8u << 20});
  diff.all = req.value("all", false);
  diff.exclude = req.value("exclude", std::vector<std::string>{});
  if (op == "diff") {
    if (!copied) return json{{"files", json::array()}, {"patch", ""}, {"truncated", false}, {"files_truncated", false}};
    return ComputeDiff(stack, diff);
  }
  if (op == "apply") {
    if (!copied) {
      return json{{"applied", json::array()}, {"files", json::array()}, {"conflicts", json::array()},
                  {"protected", json::array()}};
    }
    ApplyOptions options;
    options.diff = diff;
    options.base_record = dir + "/base.record";
    options.protect = req.value("protect", std::vector<std::string>{});
    return ApplyChanges(stack, options);
  }
  if (op == "snapshot") {
    // A session that never ran has no copy: its snapshot is of the base it would copy.
    if (!copied) stack.upper = real;
    if (Status d = MakeDirs({state.substr(0, state.rfind('/')), state, RemoteSnapshotsDir()}); !d.ok()) return d;
    auto manifest = CreateSnapshot(stack, "", snap_dir);
    if (!manifest.ok()) return manifest.status();
    // What the caller keeps of it: the manifest stays here, with the tree.
    return json{{"snapshot", snapshot},
                {"created", manifest->value("created", "")},
                {"entries", (*manifest)["entries"].size()}};
  }
  if (op == "seed") {
    // A session started from a snapshot: its copy is the snapshot's tree,
    // made before its world is first provisioned (which then finds it),
    // and apply's base the workspace as it is now.
    if (copied) return Status::Error(kRemoteStage, "session " + session + " has a copy on " + HostName() + " already");
    if (Status v = VerifySnapshot(snap_dir); !v.ok()) {
      return Status::Error(kRemoteStage, "snapshot " + snapshot + " on " + HostName() + ": " + v.message());
    }
    if (Status d = MakeDirs({state.substr(0, state.rfind('/')), state, RemoteStateDir(), dir}); !d.ok()) return d;
    std::string home = linux::HomeDir();
    if (!home.empty() && !CanonicalPath(home).empty()) home = CanonicalPath(home);
    if (Status b = RecordBase(real, dir + "/base.record", linux::OwnDirs(home)); !b.ok()) return b;
    supervise::RemoveTree(stack.upper + ".tmp");
    if (Status c = CopyTree(snap_dir + "/tree", stack.upper + ".tmp"); !c.ok()) return c;
    if (rename((stack.upper + ".tmp").c_str(), stack.upper.c_str()) != 0) {
      return Status::Errno(kRemoteStage, "rename", stack.upper);
    }
    return json{{"seeded", snapshot}};
  }
  return Status::Error(kRemoteStage, "unknown op '" + op + "'");
}

}  // namespace

int RemoteLayersMain() {
  // One request frame (a Kubernetes v4 exec stream cannot end stdin alone).
  linux::FrameReader reader;
  std::vector<linux::Frame> frames;
  while (frames.empty()) {
    if (!reader.Read(0, &frames)) break;
  }
  Result<json> answer = Status::Error(kRemoteStage, "no request came" +
                                                        (reader.error().empty() ? "" : ": " + reader.error()));
  if (!frames.empty() && frames.front().type == linux::FrameType::kRequest) {
    answer = LayersHere(json::parse(frames.front().payload, nullptr, false));
  } else if (!frames.empty()) {
    answer = Status::Error(kRemoteStage, "the caller's first frame is not a request");
  }
  const json out = answer.ok() ? json{{"answer", *answer}}
                               : json{{"error", {{"stage", answer.status().stage()},
                                                 {"message", answer.status().message()},
                                                 {"errno", answer.status().err()}}}};
  const std::string line = out.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  return linux::WriteFrame(1, linux::FrameType::kResult, line).ok() ? 0 : 1;
}

Result<json> RemoteLayers(const RemotePlan& remote, json request) {
  request["session"] = remote.session;
  request["workspace"] = remote.workspace;
  const auto deadline = Clock::now() + kProvisionTimeout;
  std::unique_ptr<RemoteMachine> machine;
  if (remote.ssh.empty()) {
    auto k8s = K8sMachine::Connect(remote, deadline, {"agentbox", "__remote-layers"});
    if (!k8s.ok()) return k8s.status();
    machine = std::move(*k8s);
  } else {
    auto ssh = SshMachine::Connect(remote, deadline, "__remote-layers");
    if (!ssh.ok()) return ssh.status();
    machine = std::move(*ssh);
  }
  const std::string where = remote.ssh.empty() ? machine->where() : remote.ssh;
  const int fd = machine->channel();
  if (Status w = linux::WriteFrame(fd, linux::FrameType::kRequest, request.dump()); !w.ok()) {
    return w.WithContext("the request to " + where);
  }
  // The answer: kResult frames to the end of the stream (a payload past
  // one frame's size comes as several).
  linux::FrameReader reader;
  std::vector<linux::Frame> frames;
  std::string payload;
  bool answered = false;
  for (bool open = true; open;) {
    struct pollfd p = {fd, POLLIN, 0};
    const int r = poll(&p, 1, MsLeft(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return Status::Error(kRemoteStage, where + " did not answer in time");
    open = reader.Read(fd, &frames);
    for (const auto& f : frames) {
      if (f.type != linux::FrameType::kResult) continue;
      payload += f.payload;
      answered = true;
    }
    frames.clear();
  }
  bool oom = false;
  machine->Reap(std::chrono::milliseconds(2000));
  if (!answered) {
    return Status::Error(kRemoteStage, machine->EndedHow(&oom) + " without an answer" +
                                           (reader.error().empty() ? "" : ": " + reader.error()));
  }
  const json out = json::parse(payload, nullptr, false);
  if (!out.is_object()) return Status::Error(kRemoteStage, where + " answered with no JSON");
  if (out.contains("error")) {
    const json& e = out["error"];
    return Status::Error(e.value("stage", std::string(kRemoteStage)), where + ": " + e.value("message", ""));
  }
  return out.value("answer", json());
}

Status ForgetRemoteSession(const RemotePlan& remote) {
  if (!ValidSessionId(remote.session)) return Status::Error(kRemoteStage, "the session id is malformed");
  const std::string dir = "\"${XDG_STATE_HOME:-$HOME/.local/state}/agentbox/remote/" + remote.session + "\"";
  auto ran = linux::RunHostProgram(SshArgv(remote, "rm -rf -- " + dir), "", std::chrono::seconds(60), 64 * 1024);
  if (!ran.ok()) return ran.status();
  if (!WIFEXITED(ran->wait_status) || WEXITSTATUS(ran->wait_status) != 0) {
    return Status::Error(kRemoteStage, "removing the session's copy on " + remote.ssh + " failed: ssh " +
                                           linux::DescribeWaitStatus(ran->wait_status) + ": " + ran->output);
  }
  return {};
}

int RemoteStdioMain() {
  signal(SIGPIPE, SIG_IGN);
  // stdout is the stream: nothing else of this process may write on it.
  constexpr int kIn = 0, kOut = 1;
  if (!linux::WriteFrame(kOut, linux::FrameType::kWorld,
                         json{{"t", "hello"}, {"pid", getpid()}, {"version", Version()}}.dump())
           .ok()) {
    return 0;
  }
  linux::FrameReader reader;
  std::vector<linux::Frame> frames;
  while (frames.empty()) {
    if (!reader.Read(kIn, &frames)) return 0;  // the caller went away
  }
  auto fail = [&](const Status& s) {
    (void)linux::WriteFrame(kOut, linux::FrameType::kFailure, FailureText(s).dump());
    return 125;
  };
  if (frames.front().type != linux::FrameType::kRequest) {
    return fail(Status::Error(kRemoteStage, "the caller's first frame is not a request"));
  }
  const json req = json::parse(frames.front().payload, nullptr, false);
  frames.erase(frames.begin());
  auto confined = ConfineHere(req);
  if (!confined.ok()) return fail(confined.status());
  const std::string text = json{{"t", "confined"}, {"confined", ConfinedToJson(*confined)}}.dump();
  if (text.size() > linux::kMaxFrame) {
    return fail(Status::Error(kRemoteStage, "the confined plan is larger than one frame (" +
                                                std::to_string(text.size()) + " bytes)"));
  }
  if (!linux::WriteFrame(kOut, linux::FrameType::kWorld, text).ok()) return 0;
  supervise::RemoteRelayMain(PlanToJson(confined->plan), &WorldMain, &reader, std::move(frames));
}

int RemoteWorldMain(const Plan& plan) {
  linux::UniqueFd sigfd = BlockStopSignals();
  const RemotePlan& remote = *plan.remote;
  const auto deadline = Clock::now() + kProvisionTimeout;
  std::unique_ptr<RemoteMachine> connected;
  if (remote.ssh.empty()) {
    auto k8s = K8sMachine::Connect(remote, deadline);
    if (!k8s.ok()) {
      Send(ErrorMessage(k8s.status()));
      return 125;
    }
    connected = std::move(*k8s);
  } else {
    auto ssh = SshMachine::Connect(remote, deadline);
    if (!ssh.ok()) {
      Send(ErrorMessage(ssh.status()));
      return 125;
    }
    connected = std::move(*ssh);
  }
  RemoteMachine& machine = *connected;
  const int stream = machine.channel();
  linux::FrameReader reader;
  std::vector<linux::Frame> frames;
  json hello;
  std::optional<json> confined;
  bool request_sent = false;
  while (!confined) {
    struct pollfd fds[2] = {{stream, POLLIN, 0}, {sigfd.get(), POLLIN, 0}};
    const int r = poll(fds, 2, MsLeft(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 || fds[1].revents) {
      Send(ErrorMessage(Status::Error(kRemoteStage, r == 0 ? "the remote world " + machine.where() +
                                                                 " was not confined in time"
                                                           : "stopped while the remote world was provisioned")));
      return 125;
    }
    const bool open = reader.Read(stream, &frames);
    while (!frames.empty() && !confined) {
      linux::Frame f = std::move(frames.front());
      frames.erase(frames.begin());
      if (f.type == linux::FrameType::kFailure) {
        const json j = json::parse(f.payload, nullptr, false);
        Status s = Status::Error(j.is_object() ? j.value("stage", std::string(kRemoteStage)) : kRemoteStage,
                                 "the remote world " + machine.where() + ": " +
                                     (j.is_object() ? j.value("message", f.payload) : f.payload));
        Send(ErrorMessage(s));
        return 125;
      }
      if (f.type != linux::FrameType::kWorld) continue;
      json m = json::parse(f.payload, nullptr, false);
      const std::string t = m.is_object() ? m.value("t", "") : "";
      if (t == "hello" && !request_sent) {
        hello = m;
        json request = {{"policy_yaml", remote.policy_yaml}, {"level", remote.level},
                        {"workspace", remote.workspace},     {"session", remote.session},
                        {"policy_sha256", plan.policy_sha256}};
        if (Status w = linux::WriteFrame(stream, linux::FrameType::kRequest, request.dump()); !w.ok()) {
          Send(ErrorMessage(w));
          return 125;
        }
        request_sent = true;
      } else if (t == "confined" && m.contains("confined")) {
        confined = m["confined"];
      }
    }
    if (!open && !confined) {
      machine.Reap(std::chrono::milliseconds(1000));
      bool oom = false;
      Send(ErrorMessage(Status::Error(kRemoteStage, machine.EndedHow(&oom) + " before its world was confined" +
                                                        (reader.error().empty() ? "" : ": " + reader.error()))));
      return 125;
    }
  }
  // The remote's plan and report for the caller, in a memfd (they outgrow
  // one message of the channel).
  (*confined)["host"] = machine.where();
  (*confined)["remote_pid"] = hello.value("pid", 0);
  (*confined)["remote_version"] = hello.value("version", "");
  (*confined)["binary"] = machine.binary_state();
  const std::string text = confined->dump();
  linux::UniqueFd memfd(static_cast<int>(memfd_create("agentbox-confined", MFD_CLOEXEC)));
  if (!memfd.valid() || write(memfd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    Send(ErrorMessage(Status::Errno(kRemoteStage, "memfd", "the remote's confined plan")));
    return 125;
  }
  Send(json{{"t", "confined"}}, memfd.get());
  return RelayWorldLoop(machine, plan, nullptr, "a remote world", RelayMode::kRemote, std::move(sigfd), &reader,
                        std::move(frames));
}

}  // namespace agentbox::session
