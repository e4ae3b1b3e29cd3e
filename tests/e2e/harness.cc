#include "harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace agentbox::e2e {
namespace {

constexpr const char* kPath = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";
// After the child exits, how long to keep reading pipes that something else
// (an escaped grandchild) still holds open.
constexpr long kDrainAfterExitMs = 1000;

// Writing to a child's stdin after it exited must fail with EPIPE, not kill
// the test binary. Children get the default back before exec.
struct IgnoreSigpipe {
  IgnoreSigpipe() { signal(SIGPIPE, SIG_IGN); }
} ignore_sigpipe;

[[noreturn]] void Fatal(const std::string& what) {
  throw std::runtime_error(what + ": " + std::strerror(errno));
}

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

int PidfdOpen(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

}  // namespace

long NowMs() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

std::string AgentboxBin() {
  const char* bin = getenv("AGENTBOX_BIN");
  if (!bin || !*bin) throw std::runtime_error("AGENTBOX_BIN is not set (path to the agentbox binary)");
  return bin;
}

std::string TempRoot() {
  const char* t = getenv("TMPDIR");
  std::string root = t && *t == '/' ? t : "/tmp";
  char buf[PATH_MAX];
  if (realpath(root.c_str(), buf)) return buf;
  return root;
}

std::string RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  if (getrandom(raw.data(), bytes, 0) != static_cast<ssize_t>(bytes)) Fatal("getrandom");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

// ---------------------------------------------------------------- files

TempDir::TempDir(const std::string& prefix) {
  std::string tmpl = TempRoot() + "/" + prefix + "XXXXXX";
  if (!mkdtemp(tmpl.data())) Fatal("mkdtemp " + tmpl);
  char buf[PATH_MAX];
  path_ = realpath(tmpl.c_str(), buf) ? buf : tmpl;
}

TempDir::~TempDir() {
  if (!path_.empty()) RemoveTree(path_);
}

std::string TempDir::operator/(const std::string& rel) const { return path_ + "/" + rel; }

namespace {

// Removes `name` below the directory `parent`, relative all the way down: a
// tree deeper than PATH_MAX (a session's, say) goes as well.
bool RemoveAt(int parent, const char* name) {
  struct stat st {};
  if (fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT;
  if (!S_ISDIR(st.st_mode)) return unlinkat(parent, name, 0) == 0 || errno == ENOENT;
  // A masked or locked-down directory: make it listable and writable first.
  fchmodat(parent, name, 0700, 0);
  bool ok = true;
  int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    if (DIR* d = fdopendir(fd)) {
      std::vector<std::string> names;
      while (struct dirent* e = readdir(d)) {
        std::string n = e->d_name;
        if (n != "." && n != "..") names.push_back(n);
      }
      for (const auto& n : names) ok = RemoveAt(dirfd(d), n.c_str()) && ok;
      closedir(d);
    } else {
      close(fd);
    }
  }
  return unlinkat(parent, name, AT_REMOVEDIR) == 0 && ok;
}

}  // namespace

bool RemoveTree(const std::string& path) { return RemoveAt(AT_FDCWD, path.c_str()); }

void MakeDirs(const std::string& path, mode_t mode) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos == path.size() || path[pos] == '/') {
      std::string cur = path.substr(0, pos);
      if (mkdir(cur.c_str(), mode) != 0 && errno != EEXIST) Fatal("mkdir " + cur);
    }
  }
}

void WriteFile(const std::string& path, const std::string& content, mode_t mode) {
  auto slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) MakeDirs(path.substr(0, slash));
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) Fatal("open " + path);
  size_t off = 0;
  while (off < content.size()) {
    ssize_t w = write(fd, content.data() + off, content.size() - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      close(fd);
      Fatal("write " + path);
    }
    off += static_cast<size_t>(w);
  }
  fchmod(fd, mode);
  close(fd);
}

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool Exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}

bool IsDir(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::string line;
  std::istringstream in(text);
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

std::string FindTool(const std::string& name) {
  for (const char* dir : {"/usr/bin", "/bin", "/usr/sbin", "/sbin"}) {
    std::string p = std::string(dir) + "/" + name;
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// ---------------------------------------------------------------- processes

namespace {
// The report without the per-facet detail, which is long and rarely the point.
std::string Compact(nlohmann::json j) {
  if (j.is_object() && j["enforcement"].is_object() && j["enforcement"].contains("facets")) {
    nlohmann::json levels = nlohmann::json::object();
    for (auto it = j["enforcement"]["facets"].begin(); it != j["enforcement"]["facets"].end(); ++it) {
      levels[it.key()] = it.value().value("level", "?");
    }
    j["enforcement"]["facets"] = levels;
  }
  return j.dump(1).substr(0, 6000);
}
}  // namespace

std::string RunResult::Describe() const {
  std::ostringstream s;
  s << "exit status " << status << (timed_out ? " (killed by the harness: timeout)" : "") << " after "
    << elapsed_ms << " ms\n--- stdout ---\n"
    << out.substr(0, 4000) << "\n--- stderr ---\n"
    << err.substr(0, 4000) << "\n--- report ---\n"
    << (report ? Compact(*report) : std::string("(none)")) << "\n";
  return s.str();
}

Process::Process(const Command& command) : command_(command) {
  int out[2], err[2], in[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) Fatal("pipe2");
  if (command.stdin_fd >= 0) {
    in[0] = fcntl(command.stdin_fd, F_DUPFD_CLOEXEC, 3);
    if (in[0] < 0) Fatal("dup stdin");
  } else if (!command.stdin_data.empty()) {
    if (pipe2(in, O_CLOEXEC) != 0) Fatal("pipe2");
  } else {
    in[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (in[0] < 0) Fatal("open /dev/null");
  }
  // Everything the child needs, built before fork (no allocation after it).
  std::vector<char*> argv, envp;
  for (const auto& a : command.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : command.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const char* cwd = command.cwd.empty() ? nullptr : command.cwd.c_str();

  started_ms_ = NowMs();
  pid_t pid = fork();
  if (pid < 0) Fatal("fork");
  if (pid == 0) {
    setpgid(0, 0);
    // A clean slate: default dispositions, nothing blocked.
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || dup2(err[1], 2) < 0) _exit(121);
    if (cwd && chdir(cwd) != 0) {
      const char msg[] = "harness: chdir failed\n";
      (void)!write(2, msg, sizeof(msg) - 1);
      _exit(122);
    }
    execve(argv[0], argv.data(), envp.data());
    const char msg[] = "harness: execve failed\n";
    (void)!write(2, msg, sizeof(msg) - 1);
    _exit(123);
  }
  setpgid(pid, pid);  // also here: no race with a kill of the group
  pid_ = pid;
  pidfd_ = PidfdOpen(pid);
  close(out[1]);
  close(err[1]);
  close(in[0]);
  out_fd_ = out[0];
  err_fd_ = err[0];
  in_fd_ = in[1];
  SetNonBlocking(out_fd_);
  SetNonBlocking(err_fd_);
  if (in_fd_ >= 0) SetNonBlocking(in_fd_);
}

Process::~Process() {
  if (pid_ > 0 && !exited_) {
    KillGroup();
    while (waitpid(pid_, &wait_status_, 0) < 0 && errno == EINTR) {
    }
    exited_ = true;
  }
  for (int fd : {out_fd_, err_fd_, in_fd_, pidfd_}) {
    if (fd >= 0) close(fd);
  }
}

void Process::KillGroup() {
  if (pid_ <= 0 || exited_) return;
  kill(-pid_, SIGKILL);
  kill(pid_, SIGKILL);
}

bool Process::Pump(int timeout_ms) {
  struct pollfd fds[4];
  int n = 0, i_out = -1, i_err = -1, i_in = -1, i_pid = -1;
  if (out_fd_ >= 0) fds[i_out = n++] = {out_fd_, POLLIN, 0};
  if (err_fd_ >= 0) fds[i_err = n++] = {err_fd_, POLLIN, 0};
  if (in_fd_ >= 0) fds[i_in = n++] = {in_fd_, POLLOUT, 0};
  if (!exited_ && pidfd_ >= 0) fds[i_pid = n++] = {pidfd_, POLLIN, 0};
  if (n == 0 && exited_) return false;
  // Without a pidfd, look at the child at least every 10 ms.
  if (!exited_ && pidfd_ < 0) timeout_ms = std::min(timeout_ms, 10);
  int r = poll(fds, static_cast<nfds_t>(n), std::max(timeout_ms, 0));
  if (r < 0 && errno != EINTR) Fatal("poll");
  char buf[65536];
  auto drain = [&](int& fd, std::string& into) {
    for (;;) {
      ssize_t got = read(fd, buf, sizeof(buf));
      if (got > 0) {
        into.append(buf, static_cast<size_t>(got));
        continue;
      }
      if (got < 0 && (errno == EAGAIN || errno == EINTR)) return;
      close(fd);
      fd = -1;
      return;
    }
  };
  if (r > 0) {
    if (i_out >= 0 && fds[i_out].revents) drain(out_fd_, result_.out);
    if (i_err >= 0 && fds[i_err].revents) drain(err_fd_, result_.err);
    if (i_in >= 0 && fds[i_in].revents) {
      const std::string& data = command_.stdin_data;
      ssize_t w = write(in_fd_, data.data() + in_off_, data.size() - in_off_);
      if (w > 0) in_off_ += static_cast<size_t>(w);
      if ((w < 0 && errno != EAGAIN && errno != EINTR) || in_off_ >= data.size() ||
          (fds[i_in].revents & (POLLERR | POLLHUP))) {
        close(in_fd_);
        in_fd_ = -1;
      }
    }
  }
  if (!exited_) {
    int st = 0;
    pid_t w = waitpid(pid_, &st, WNOHANG);
    if (w == pid_) {
      exited_ = true;
      wait_status_ = st;
      exited_at_ms_ = NowMs();
    }
  }
  return true;
}

bool Process::WaitForStdout(const std::string& needle, int timeout_ms) {
  const long deadline = NowMs() + timeout_ms;
  while (!Contains(result_.out, needle)) {
    long left = deadline - NowMs();
    if (left <= 0) return false;
    if (!Pump(static_cast<int>(std::min(left, 100L)))) return Contains(result_.out, needle);
    if (exited_ && out_fd_ < 0) return Contains(result_.out, needle);
  }
  return true;
}

RunResult Process::Wait() {
  const long deadline = started_ms_ + command_.timeout_ms;
  for (;;) {
    long now = NowMs();
    if (!exited_ && now >= deadline) {
      result_.timed_out = true;
      KillGroup();
    }
    if (exited_ && (out_fd_ < 0 && err_fd_ < 0)) break;
    if (exited_ && now - exited_at_ms_ > kDrainAfterExitMs) break;
    long wake = exited_ ? exited_at_ms_ + kDrainAfterExitMs : deadline;
    if (!Pump(static_cast<int>(std::clamp(wake - now, 1L, 200L)))) break;
  }
  for (int* fd : {&out_fd_, &err_fd_, &in_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
  result_.elapsed_ms = (exited_at_ms_ ? exited_at_ms_ : NowMs()) - started_ms_;
  if (WIFEXITED(wait_status_)) result_.status = WEXITSTATUS(wait_status_);
  if (WIFSIGNALED(wait_status_)) result_.status = 128 + WTERMSIG(wait_status_);
  return result_;
}

RunResult RunCommand(const Command& command) {
  Process p(command);
  return p.Wait();
}

std::vector<pid_t> PidsWithCmdline(const std::string& marker) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  const pid_t self = getpid();
  while (struct dirent* e = readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end != 0 || pid <= 0 || pid == self) continue;
    auto cmd = ReadFile(std::string("/proc/") + e->d_name + "/cmdline");
    if (!cmd) continue;
    std::replace(cmd->begin(), cmd->end(), '\0', ' ');
    if (Contains(*cmd, marker)) out.push_back(static_cast<pid_t>(pid));
  }
  closedir(d);
  return out;
}

bool WaitUntilNoProcess(const std::string& marker, int timeout_ms) {
  const long deadline = NowMs() + timeout_ms;
  for (;;) {
    if (PidsWithCmdline(marker).empty()) return true;
    if (NowMs() >= deadline) return false;
    usleep(20 * 1000);
  }
}

// ---------------------------------------------------------------- sandbox

Sandbox::Sandbox(GitRepo repo) {
  ssh_secret_ = "SSH-PRIVATE-" + RandomHex();
  aws_secret_ = "AWS-SECRET-" + RandomHex();
  WriteFile(home_ / ".ssh/id_rsa", "-----BEGIN OPENSSH PRIVATE KEY-----\n" + ssh_secret_ + "\n", 0600);
  WriteFile(home_ / ".aws/credentials", "[default]\naws_secret_access_key = " + aws_secret_ + "\n", 0600);
  WriteFile(home_ / "notes.txt", "an ordinary file in the real home\n");
  if (repo == GitRepo::kInit) {
    RunResult r = Git({"init", "-q", "."});
    if (r.status != 0) throw std::runtime_error("git init failed: " + r.Describe());
  }
}

std::vector<std::string> Sandbox::Env(const std::vector<std::string>& extra) const {
  std::vector<std::string> env = {std::string("PATH=") + kPath, "HOME=" + home(), "LANG=C", "LC_ALL=C"};
  // A delegation record given to the test run (tests/delegation/run.sh) stands
  // for the host's /run/agentbox/delegation: agentbox gets it too.
  if (const char* rec = getenv("AGENTBOX_DELEGATION_RECORD"); rec && *rec) {
    env.push_back(std::string("AGENTBOX_DELEGATION_RECORD=") + rec);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

Command Sandbox::AgentboxCommand(const std::vector<std::string>& args,
                                 const std::vector<std::string>& extra_env) const {
  Command c;
  c.argv = {AgentboxBin()};
  c.argv.insert(c.argv.end(), args.begin(), args.end());
  c.cwd = ws();
  c.env = Env(extra_env);
  return c;
}

RunResult Sandbox::RunArgv(const std::vector<std::string>& argv, const std::vector<std::string>& options,
                           const std::vector<std::string>& extra_env, int timeout_ms) const {
  unlink(report_path().c_str());  // never read a stale report
  std::vector<std::string> args = {"run", "--report", report_path()};
  args.insert(args.end(), options.begin(), options.end());
  args.push_back("--");
  args.insert(args.end(), argv.begin(), argv.end());
  Command c = AgentboxCommand(args, extra_env);
  c.timeout_ms = timeout_ms;
  RunResult r = RunCommand(c);
  if (auto text = ReadFile(report_path())) {
    auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) r.report = std::move(j);
  }
  return r;
}

RunResult Sandbox::Sh(const std::string& script, const std::vector<std::string>& options,
                      const std::vector<std::string>& extra_env, int timeout_ms) const {
  return RunArgv({"sh", "-c", script}, options, extra_env, timeout_ms);
}

RunResult Sandbox::Host(const std::vector<std::string>& argv) const {
  Command c;
  c.argv = argv;
  if (!c.argv.empty() && c.argv[0].find('/') == std::string::npos) {
    std::string found = FindTool(c.argv[0]);
    if (!found.empty()) c.argv[0] = found;
  }
  c.cwd = ws();
  c.env = Env({"GIT_CONFIG_NOSYSTEM=1"});
  return RunCommand(c);
}

RunResult Sandbox::Git(const std::vector<std::string>& args, const std::string& dir) const {
  std::vector<std::string> argv = {"git", "-c", "safe.directory=*", "-c", "init.defaultBranch=main"};
  if (!dir.empty()) {
    argv.push_back("-C");
    argv.push_back(dir);
  }
  argv.insert(argv.end(), args.begin(), args.end());
  return Host(argv);
}

std::string FixturesDir() {
  const char* env = std::getenv("AGENTBOX_FIXTURES");
  return env && *env ? env : AGENTBOX_FIXTURES;
}

HostServer::HostServer() {
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd_, 64) != 0) return;
  socklen_t len = sizeof a;
  getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  thread_ = std::thread([this] { Loop(); });
}

HostServer::~HostServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  close(fd_);
}

void HostServer::Loop() {
  while (!stop_) {
    pollfd p = {fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    std::string head;
    char buf[4096];
    while (head.find("\r\n\r\n") == std::string::npos) {
      pollfd q = {c, POLLIN, 0};
      if (poll(&q, 1, 5000) <= 0) break;
      ssize_t n = read(c, buf, sizeof buf);
      if (n <= 0) break;
      head.append(buf, static_cast<size_t>(n));
    }
    std::string resp = "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " +
                       std::to_string(std::string(kBody).size()) + "\r\nConnection: close\r\n\r\n" + kBody;
    // Counted before the answer leaves: a client that has it sees the count.
    ++served_;
    (void)!send(c, resp.data(), resp.size(), MSG_NOSIGNAL);
    close(c);
  }
}

}  // namespace agentbox::e2e
