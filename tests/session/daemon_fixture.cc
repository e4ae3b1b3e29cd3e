#include "daemon_fixture.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

namespace agentbox::session_test {
namespace {

constexpr int kClientTimeoutMs = 120000;
constexpr int kStartTimeoutMs = 20000;

// The processes whose parent is `pid`, in pid order: from each process's
// stat (its parent's process id), not from the threads' `children` files,
// which miss a child while it is being moved to another thread of its
// parent (a worker thread of the daemon that ended).
std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long p = std::strtol(e->d_name, &end, 10);
    if (p <= 0 || *end != '\0') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/stat");
    std::string line;
    if (!std::getline(in, line)) continue;
    const auto paren = line.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(line.substr(paren + 1));
    char state = 0;
    long ppid = 0;
    if (rest >> state >> ppid && ppid == pid) out.push_back(static_cast<pid_t>(p));
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// Alive and not a zombie.
bool Alive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

}  // namespace

Daemon::Daemon() {
  state_dir_ = root_ / "state";
  socket_ = state_dir_ + "/agentbox.sock";
}

Daemon::~Daemon() {
  Stop();
  // Anything the daemon started that outlived it (a test that failed half
  // way): killed by pid.
  for (pid_t p : seen_) {
    if (Alive(p)) kill(p, SIGKILL);
  }
  WaitGone(std::vector<pid_t>(seen_.begin(), seen_.end()), 5000);
}

std::vector<std::string> Daemon::Env() const {
  std::vector<std::string> env = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home_.path(), "LANG=C.UTF-8"};
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  return env;
}

bool Daemon::Start(const std::vector<std::string>& extra) {
  error_.clear();
  client_.reset();
  std::vector<std::string> argv = {e2e::AgentboxBin(), "serve", "--state-dir", state_dir_, "--socket", socket_,
                                   "--log-file", log_path()};
  if (std::find(extra.begin(), extra.end(), "--grace") == extra.end()) {
    argv.insert(argv.end(), {"--grace", "5s"});
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  std::vector<char*> args, envp;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  std::vector<std::string> env = Env();
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string out = root_ / "daemon.out";
  int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    error_ = "open " + out + ": " + strerror(errno);
    return false;
  }
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  close(fd);
  if (pid < 0) {
    error_ = std::string("fork: ") + strerror(errno);
    return false;
  }
  setpgid(pid, pid);
  pid_ = pid;
  const long deadline = e2e::NowMs() + kStartTimeoutMs;
  while (e2e::NowMs() < deadline) {
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      start_exit_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      error_ = "the daemon exited at start (status " + std::to_string(start_exit_) + "): " + output();
      return false;
    }
    struct stat sb {};
    if (lstat(socket_.c_str(), &sb) == 0) {
      daemon::Client probe(endpoint());
      auto r = probe.Call("GET", "/v1/health");
      if (r.ok() && r->status == 200) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  error_ = "no answer on " + socket_ + " within " + std::to_string(kStartTimeoutMs) + " ms: " + output();
  return false;
}

int Daemon::StartExpectingFailure(const std::vector<std::string>& extra) {
  start_exit_ = -1;
  if (Start(extra)) return -1;
  return start_exit_;
}

void Daemon::Signal(int sig) {
  if (pid_ > 0) {
    Descendants();
    kill(pid_, sig);
  }
}

int Daemon::WaitExit(int timeout_ms) {
  if (pid_ <= 0) return -1;
  const long deadline = e2e::NowMs() + timeout_ms;
  for (;;) {
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      client_.reset();
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    if (e2e::NowMs() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void Daemon::Stop() {
  if (pid_ <= 0) return;
  Signal(SIGTERM);
  if (WaitExit(15000) < 0) {
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);
    WaitExit(10000);
  }
}

std::string Daemon::output() const { return e2e::ReadFile(root_ / "daemon.out").value_or(""); }

std::vector<json> Daemon::LogEvents() const {
  std::vector<json> out;
  for (const auto& line : e2e::Lines(e2e::ReadFile(log_path()).value_or(""))) {
    auto j = json::parse(line, nullptr, false);
    if (!j.is_discarded()) out.push_back(j);
  }
  return out;
}

json Daemon::LogEvent(const std::string& event) const {
  for (const auto& e : LogEvents()) {
    if (e.value("event", "") == event) return e;
  }
  return nullptr;
}

daemon::Endpoint Daemon::endpoint() const {
  daemon::Endpoint e;
  e.unix_socket = socket_;
  e.timeout_ms = kClientTimeoutMs;
  return e;
}

daemon::Client& Daemon::client() {
  if (!client_) client_ = std::make_unique<daemon::Client>(endpoint());
  return *client_;
}

std::vector<pid_t> Daemon::Children() const { return pid_ > 0 ? ChildrenOf(pid_) : std::vector<pid_t>{}; }

std::vector<pid_t> Daemon::Descendants() {
  std::vector<pid_t> out;
  if (pid_ <= 0) return out;
  std::vector<pid_t> todo = ChildrenOf(pid_);
  while (!todo.empty()) {
    pid_t p = todo.back();
    todo.pop_back();
    out.push_back(p);
    seen_.insert(p);
    for (pid_t c : ChildrenOf(p)) todo.push_back(c);
  }
  return out;
}

bool Daemon::WaitGone(const std::vector<pid_t>& pids, int timeout_ms) {
  const long deadline = e2e::NowMs() + timeout_ms;
  for (;;) {
    bool any = false;
    for (pid_t p : pids) any = any || Alive(p);
    if (!any) return true;
    if (e2e::NowMs() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// --- Calls -----------------------------------------------------------------

std::string Answer::code() const {
  return body.is_object() && body.contains("error") ? body["error"].value("code", "") : "";
}
std::string Answer::message() const {
  return body.is_object() && body.contains("error") ? body["error"].value("message", "") : "";
}

Answer Call(daemon::Client& c, const std::string& method, const std::string& target, const json& body) {
  Answer a;
  auto r = c.Call(method, target, body.is_null() ? "" : body.dump());
  if (!r.ok()) {
    a.text = r.status().ToString();
    return a;
  }
  a.status = r->status;
  a.text = r->body;
  a.body = json::parse(r->body, nullptr, false);
  if (a.body.is_discarded()) a.body = nullptr;
  return a;
}

std::string CreateSession(daemon::Client& c, const std::string& workspace, const json& extra) {
  json body = extra;
  body["workspace"] = workspace;
  Answer a = Call(c, "POST", "/v1/sessions", body);
  if (a.status != 201 || !a.body.is_object() || !a.body["id"].is_string()) {
    ADD_FAILURE() << "create failed: HTTP " << a.status << ": " << a.text;
    return "";
  }
  return a.body["id"];
}

json Execute(daemon::Client& c, const std::string& id, const std::string& name, const json& input,
             const std::string& call_id) {
  json body = {{"name", name}, {"input", input}};
  if (!call_id.empty()) body["call_id"] = call_id;
  Answer a = Call(c, "POST", "/v1/sessions/" + id + "/execute", body);
  if (a.status != 200) {
    ADD_FAILURE() << name << " " << input.dump() << " failed: HTTP " << a.status << ": " << a.text;
    return a.body.is_null() ? json{{"transport_error", a.text}} : a.body;
  }
  return a.body;
}

json Bash(daemon::Client& c, const std::string& id, const std::string& command, const std::string& call_id) {
  return Execute(c, id, "bash", {{"command", command}}, call_id);
}

std::string RawExchange(const std::string& socket, const std::string& bytes, int timeout_ms, int as_uid) {
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return "";
  // In a child so that a uid switch stays there; the answer comes back on a pipe.
  pid_t pid = fork();
  if (pid == 0) {
    close(pipefd[0]);
    if (as_uid >= 0) {
      gid_t gid = static_cast<gid_t>(as_uid);
      if (setgroups(0, nullptr) != 0 || setresgid(gid, gid, gid) != 0 ||
          setresuid(as_uid, as_uid, as_uid) != 0) {
        _exit(3);
      }
    }
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket.c_str(), sizeof(addr.sun_path) - 1);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      const std::string msg = std::string("CONNECT-FAILED ") + strerror(errno);
      (void)!write(pipefd[1], msg.data(), msg.size());
      _exit(4);
    }
    // Writing and reading at once: the daemon may answer (and stop reading)
    // before all of a large request is sent.
    fcntl(fd, F_SETFL, O_NONBLOCK);
    size_t off = 0;
    const long deadline = e2e::NowMs() + timeout_ms;
    bool write_open = true;
    char buf[65536];
    while (e2e::NowMs() < deadline) {
      pollfd p{fd, static_cast<short>(POLLIN | (write_open && off < bytes.size() ? POLLOUT : 0)), 0};
      if (poll(&p, 1, 50) < 0) break;
      if (p.revents & POLLIN) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0) break;
        (void)!write(pipefd[1], buf, static_cast<size_t>(n));
      }
      if (write_open && (p.revents & POLLOUT)) {
        ssize_t n = write(fd, bytes.data() + off, std::min<size_t>(bytes.size() - off, 1 << 16));
        if (n > 0) off += static_cast<size_t>(n);
        if (n < 0 && errno != EAGAIN) write_open = false;
      }
      if ((p.revents & (POLLHUP | POLLERR)) && !(p.revents & POLLIN)) break;
    }
    _exit(0);
  }
  close(pipefd[1]);
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = read(pipefd[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(pipefd[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  return out;
}

int RawStatus(const std::string& response) {
  // "HTTP/1.1 413 Payload Too Large"
  if (response.rfind("HTTP/1.1 ", 0) != 0 || response.size() < 12) return 0;
  return std::atoi(response.substr(9, 3).c_str());
}

e2e::RunResult Git(const std::vector<std::string>& args, const std::string& dir) {
  e2e::Command c;
  c.argv = {e2e::FindTool("git"), "-C", dir, "-c", "user.name=agentbox test", "-c", "user.email=test@agentbox.invalid",
            "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null"};
  c.argv.insert(c.argv.end(), args.begin(), args.end());
  c.env = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir, "GIT_CONFIG_NOSYSTEM=1", "LANG=C.UTF-8"};
  return e2e::RunCommand(c);
}

void MakeRepo(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& files) {
  for (const auto& [path, content] : files) e2e::WriteFile(dir + "/" + path, content);
  auto init = Git({"init", "-q"}, dir);
  ASSERT_EQ(init.status, 0) << init.Describe();
  ASSERT_EQ(Git({"add", "-A"}, dir).status, 0);
  auto commit = Git({"commit", "-q", "-m", "base"}, dir);
  ASSERT_EQ(commit.status, 0) << commit.Describe();
}

}  // namespace agentbox::session_test
