#include "gateway/upstream.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <pthread.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>


namespace agentbox::gateway {
namespace {

constexpr const char* kProtocol = "2025-06-18";
constexpr std::size_t kMaxLine = 8 * 1024 * 1024;  // one message from the server
constexpr std::size_t kStderrTail = 4096;

// The environment a server starts with: enough to run, nothing of the
// daemon's own (its secrets' sources, its tokens).
std::vector<std::string> BaseEnvironment(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (const char* name : {"PATH", "HOME", "LANG", "LC_ALL", "TZ"}) {
    if (const char* v = std::getenv(name)) env.push_back(std::string(name) + "=" + v);
  }
  if (!std::getenv("PATH")) env.push_back("PATH=/usr/local/bin:/usr/bin:/bin");
  for (const std::string& e : extra) {
    const std::string key = e.substr(0, e.find('=') + 1);
    std::erase_if(env, [&](const std::string& have) { return have.rfind(key, 0) == 0; });
    env.push_back(e);
  }
  return env;
}

std::string ReadTail(int fd) {
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0) return "";
  const off_t size = st.st_size;
  const off_t from = size > static_cast<off_t>(kStderrTail) ? size - static_cast<off_t>(kStderrTail) : 0;
  std::string text(static_cast<std::size_t>(size - from), '\0');
  const ssize_t n = pread(fd, text.data(), text.size(), from);
  text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

Result<std::unique_ptr<StdioUpstream>> StdioUpstream::Start(const std::string& name,
                                                            const std::vector<std::string>& argv,
                                                            const std::vector<std::string>& env,
                                                            std::chrono::milliseconds timeout) {
  if (argv.empty() || argv[0].empty()) return Status::Error(kUpstreamStage, "upstream " + name + ": no command");
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return Status::Errno(kUpstreamStage, "pipe2", "upstream " + name);
  linux::UniqueFd in_r(in[0]), in_w(in[1]);
  if (pipe2(out, O_CLOEXEC) != 0) return Status::Errno(kUpstreamStage, "pipe2", "upstream " + name);
  linux::UniqueFd out_r(out[0]), out_w(out[1]);
  // Its stderr: an unlinked file, so that a chatty server never blocks on it.
  linux::UniqueFd err(open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
  if (!err.valid()) return Status::Errno(kUpstreamStage, "open(O_TMPFILE)", "/tmp (upstream " + name + "'s stderr)");

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_r.get(), 0);
  posix_spawn_file_actions_adddup2(&actions, out_w.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, err.get(), 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::vector<std::string> environment = BaseEnvironment(env);
  std::vector<char*> envp;
  for (const auto& e : environment) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  // posix_spawnp searches the PATH of this process, as a shell started here would.
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, argv[0].c_str(), &actions, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return Status::Syscall(kUpstreamStage, "posix_spawnp", "upstream " + name + " (" + argv[0] + ")", rc);
  in_r.reset();
  out_w.reset();

  std::unique_ptr<StdioUpstream> up(new StdioUpstream(name, pid, std::move(in_w), std::move(out_r), std::move(err)));
  auto init = up->Request("initialize", InitializeParams(), timeout);
  if (!init.ok()) return init.status();
  up->server_info_ = init->value("serverInfo", Json::object());
  if (Status s = up->Send({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}}); !s.ok()) return s;
  return up;
}

StdioUpstream::StdioUpstream(std::string name, pid_t pid, linux::UniqueFd in, linux::UniqueFd out, linux::UniqueFd err)
    : Upstream(std::move(name)), pid_(pid), in_(std::move(in)), out_(std::move(out)), err_(std::move(err)) {
  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) == 0) {
    wake_r_.reset(wake[0]);
    wake_w_.reset(wake[1]);
  }
  reader_ = std::thread([this] { ReadLoop(); });
}

StdioUpstream::~StdioUpstream() {
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    in_.reset();  // EOF: a stdio server ends on it
  }
  // Its group: the server and what it started, killed while the server's
  // pid (the group's id) is still unreaped and so cannot be reused.
  bool exited = false;
  for (int i = 0; i < 40 && !exited; ++i) {
    exited = waitpid(pid_, nullptr, WNOHANG) == pid_;
    if (!exited) {
      if (i == 10) kill(-pid_, SIGTERM);
      usleep(50 * 1000);
    }
  }
  if (!exited) {
    kill(-pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  } else {
    kill(-pid_, SIGKILL);  // what it left in its group (the group id may still be held by them)
  }
  // A process it left outside its group may still hold its stdout: the
  // reader stops on the wake-up, not on an EOF that may never come.
  if (wake_w_.valid()) (void)!write(wake_w_.get(), "x", 1);
  if (reader_.joinable()) reader_.join();
}

bool StdioUpstream::alive() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !gone_;
}

std::string StdioUpstream::GoneReason() const {
  std::string why = "upstream " + name_ + " is gone (" + gone_why_ + ")";
  const std::string tail = ReadTail(err_.get());
  if (!tail.empty()) why += "; its stderr ends: " + tail;
  return why;
}

Status StdioUpstream::Send(const Json& message) {
  const std::string line = message.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
  std::lock_guard<std::mutex> lock(write_mu_);
  if (!in_.valid()) return Status::Error(kUpstreamStage, "upstream " + name_ + " is closed");
  // A pipe write has no MSG_NOSIGNAL: a server that is gone raises SIGPIPE,
  // whose default action would end the daemon. It is blocked in this thread
  // for the write and the one raised is discarded; EPIPE says it is gone.
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  Status result;
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = write(in_.get(), line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      result = Status::Errno(kUpstreamStage, "write", "upstream " + name_ + "'s stdin");
      timespec zero{0, 0};
      while (sigtimedwait(&pipe_set, nullptr, &zero) == SIGPIPE) {
      }
      break;
    }
    done += static_cast<std::size_t>(n);
  }
  if (!sigismember(&old, SIGPIPE)) pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return result;
}

void StdioUpstream::ReadLoop() {
  std::string buffer;
  char chunk[65536];
  std::string why = "its stdout closed";
  // The server's exit, seen while a process it left behind still holds its stdout open.
  auto exited = [this] {
    siginfo_t info{};
    return waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_;
  };
  for (;;) {
    struct pollfd p[2] = {{out_.get(), POLLIN, 0}, {wake_r_.get(), POLLIN, 0}};
    const int ready = poll(p, wake_r_.valid() ? 2 : 1, 500);
    if (ready < 0 && errno == EINTR) continue;
    if (ready > 0 && (p[1].revents & POLLIN)) {
      why = "agentbox closed it";
      break;
    }
    if (ready == 0) {
      if (exited()) {
        why = "it exited, and a process it left holds its stdout";
        break;
      }
      continue;
    }
    const ssize_t n = read(out_.get(), chunk, sizeof chunk);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;
    buffer.append(chunk, static_cast<std::size_t>(n));
    std::size_t nl;
    while ((nl = buffer.find('\n')) != std::string::npos) {
      std::string line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      Json m = Json::parse(line, nullptr, false);
      if (m.is_discarded() || !m.is_object()) continue;  // not ours to judge; stderr-style noise on stdout
      if (m.contains("method")) {
        // A request of the server's: a ping is answered, the rest refused.
        if (m.contains("id")) {
          Json answer = {{"jsonrpc", "2.0"}, {"id", m["id"]}};
          if (m.value("method", "") == "ping") {
            answer["result"] = Json::object();
          } else {
            answer["error"] = {{"code", -32601}, {"message", "the agentbox gateway serves no client methods"}};
          }
          (void)Send(answer);
        }
        continue;
      }
      if (!m.contains("id") || !m["id"].is_number_integer()) continue;
      const std::int64_t id = m["id"].get<std::int64_t>();
      std::lock_guard<std::mutex> lock(mu_);
      answers_[id] = std::move(m);
      answered_.notify_all();
    }
    if (buffer.size() > kMaxLine) {
      why = "it sent a line of more than " + std::to_string(kMaxLine) + " bytes";
      break;
    }
  }
  // The exit status, when it came with the end of its output.
  // (WNOWAIT: the destructor reaps it, while its pid still names its group.)
  for (int i = 0; i < 20; ++i) {
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_) {
      why += info.si_code == CLD_EXITED ? ", it exited with status " + std::to_string(info.si_status)
                                        : ", it was killed by signal " + std::to_string(info.si_status);
      break;
    }
    usleep(10 * 1000);
  }
  std::lock_guard<std::mutex> lock(mu_);
  gone_ = true;
  gone_why_ = why;
  answered_.notify_all();
}

Result<Json> StdioUpstream::Request(const std::string& method, const Json& params, std::chrono::milliseconds timeout) {
  std::int64_t id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (gone_) return Status::Error(kUpstreamStage, GoneReason());
    id = next_id_++;
  }
  if (Status s = Send({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}}); !s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    return Status::Error(kUpstreamStage, gone_ ? GoneReason() : s.message());
  }
  std::unique_lock<std::mutex> lock(mu_);
  const bool done = answered_.wait_for(lock, timeout, [&] { return gone_ || answers_.count(id) > 0; });
  auto it = answers_.find(id);
  if (it == answers_.end()) {
    if (gone_) return Status::Error(kUpstreamStage, GoneReason());
    lock.unlock();
    (void)done;
    (void)Send({{"jsonrpc", "2.0"},
                {"method", "notifications/cancelled"},
                {"params", {{"requestId", id}, {"reason", "no answer within " + Seconds(timeout)}}}});
    return Status::Error(kUpstreamStage,
                         "upstream " + name_ + " did not answer " + method + " within " + Seconds(timeout));
  }
  Json answer = std::move(it->second);
  answers_.erase(it);
  return AnswerResult(method, answer);
}

std::string Upstream::Seconds(std::chrono::milliseconds d) {
  const auto ms = d.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

Json Upstream::InitializeParams() {
  return {{"protocolVersion", kProtocol},
          {"capabilities", Json::object()},
          {"clientInfo", {{"name", "agentbox-gateway"}, {"version", "1"}}}};
}

Result<Json> Upstream::AnswerResult(const std::string& method, const Json& answer) const {
  if (answer.contains("error")) {
    const Json& e = answer["error"];
    return Status::Error(kUpstreamStage,
                         "upstream " + name_ + " refused " + method + ": " +
                             (e.is_object() ? e.value("message", e.dump()) : e.dump()) +
                             (e.is_object() && e.contains("code") ? " (" + e["code"].dump() + ")" : ""));
  }
  if (!answer.contains("result"))
    return Status::Error(kUpstreamStage, "upstream " + name_ + " answered " + method + " with no result");
  return answer["result"];
}

Result<Json> Upstream::ListTools(std::chrono::milliseconds timeout) {
  Json tools = Json::array();
  Json params = Json::object();
  for (int page = 0; page < 100; ++page) {
    auto r = Request("tools/list", params, timeout);
    if (!r.ok()) return r.status();
    if (r->contains("tools") && (*r)["tools"].is_array()) {
      for (auto& t : (*r)["tools"]) tools.push_back(std::move(t));
    }
    if (!r->contains("nextCursor") || !(*r)["nextCursor"].is_string()) return tools;
    params = {{"cursor", (*r)["nextCursor"]}};
  }
  return Status::Error(kUpstreamStage, "upstream " + name_ + " lists tools over more than 100 pages");
}

Result<Json> Upstream::CallTool(const std::string& tool, const Json& arguments, std::chrono::milliseconds timeout) {
  return Request("tools/call", {{"name", tool}, {"arguments", arguments}}, timeout);
}

}  // namespace agentbox::gateway
