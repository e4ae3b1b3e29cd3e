#include "linux/session_shell.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "linux/compat.h"
#include "linux/descendants.h"
#include "linux/fd.h"

namespace agentbox::linux {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// The command's text, as the init hands it over.
constexpr std::size_t kCommandMax = 256u << 20;
// After a kill with SIGKILL, how long the shell has to come back to its
// prompt before it is taken for held by the command and ended with it.
constexpr auto kShellHeldGrace = std::chrono::milliseconds(1000);

// A process as it was when a call began: its pid and its start time (field
// 22 of /proc/PID/stat), so that a reused pid is not taken for it.
using ProcessId = std::pair<pid_t, unsigned long long>;

unsigned long long StartTime(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  UniqueFd fd(open(path, O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return 0;
  char buf[1024];
  ssize_t n = read(fd.get(), buf, sizeof buf - 1);
  if (n <= 0) return 0;
  buf[n] = 0;
  // The command name may hold spaces and parentheses: fields count from the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (!p) return 0;
  int field = 2;
  for (++p; *p && field < 22; ++p) {
    if (*p == ' ') ++field;
  }
  return std::strtoull(p, nullptr, 10);
}

std::set<ProcessId> Snapshot(pid_t root) {
  std::set<ProcessId> out;
  for (pid_t pid : Descendants(root)) out.emplace(pid, StartTime(pid));
  return out;
}

std::string ReadMemfd(int fd) {
  std::string out;
  char buf[65536];
  off_t off = 0;
  for (;;) {
    ssize_t r = pread(fd, buf, sizeof buf, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0 || out.size() > kCommandMax) break;
    out.append(buf, static_cast<size_t>(r));
    off += r;
  }
  return out;
}

bool WriteFile(const std::string& path, const std::string& data) {
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return false;
  size_t off = 0;
  while (off < data.size()) {
    ssize_t w = write(fd.get(), data.data() + off, data.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    off += static_cast<size_t>(w);
  }
  return true;
}

void SendMessage(int sock, const json& m) {
  const std::string text = m.dump(-1, ' ', false, json::error_handler_t::replace);
  while (send(sock, text.data(), text.size(), MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
}

// One call in the shell, from its line to its status.
struct Call {
  long id = 0;
  long n = 0;
  UniqueFd out;         // the caller's
  UniqueFd log;         // the session's background log (invalid: none)
  UniqueFd fifo_out;    // read end, non-blocking
  UniqueFd fifo_status; // read end, non-blocking
  std::string status_text;
  std::set<ProcessId> before;  // what was below the keeper when the call began
  std::optional<Clock::time_point> held_deadline;
  json shell = json::object();  // {"restarted", "ended", "why"}
};

}  // namespace

bool IsShellVariableName(std::string_view name) {
  if (name.empty() || !(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_')) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

std::string ShellQuote(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

int ShellAbortSignal() { return SIGRTMIN + 5; }

std::string ShellCallLine(const std::string& dir, long n, const std::string& cwd, const std::vector<std::string>& env,
                          bool stdin_file) {
  const std::string base = dir + "/" + std::to_string(n);
  const std::string abort = std::to_string(ShellAbortSignal());
  // The abort signal makes the shell return from the command's `source`
  // (the rest of the command does not run) and come back for the status.
  // `source` rather than `builtin source`: only the plain one exports the
  // NAME=value before it to the command's children; a function of that
  // name is removed first.
  std::string line = "builtin trap 'builtin return 143' " + abort + "; builtin unset -f source; { ";
  if (!cwd.empty()) line += "builtin cd -- " + ShellQuote(cwd) + " && ";
  // NAME=value before `source`: set for the command it runs, gone after.
  for (const auto& e : env) {
    const size_t eq = e.find('=');
    if (eq == std::string::npos || !IsShellVariableName(std::string_view(e).substr(0, eq))) continue;
    line += e.substr(0, eq) + "=" + ShellQuote(std::string_view(e).substr(eq + 1)) + " ";
  }
  line += "source -- " + ShellQuote(base + ".cmd") + "; } <" +
          (stdin_file ? ShellQuote(base + ".in") : std::string("/dev/null")) + " >" + ShellQuote(base + ".out") +
          " 2>&1; builtin printf '%s\\n' \"$?\" >" + ShellQuote(base + ".status") + "\n";
  return line;
}

[[noreturn]] void ShellKeeperMain(int sock, int keep_fd, const ShellHooks& hooks) {
  {
    // Nothing of the init's: stdio (/dev/null), the pair, the signal scope.
    int keep[] = {0, 1, 2, sock, keep_fd};
    std::sort(std::begin(keep), std::end(keep));
    unsigned next = 0;
    auto close_from_to = [](unsigned first, unsigned last) { CloseFds(first, last); };
    for (int fd : keep) {
      if (fd < 0 || static_cast<unsigned>(fd) < next) continue;
      if (static_cast<unsigned>(fd) > next) close_from_to(next, static_cast<unsigned>(fd) - 1);
      next = static_cast<unsigned>(fd) + 1;
    }
    close_from_to(next, ~0U);
  }
  if (setsid() < 0 || prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) _exit(125);
  sigset_t wait_for;
  sigemptyset(&wait_for);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD}) sigaddset(&wait_for, sig);
  sigprocmask(SIG_BLOCK, &wait_for, nullptr);
  UniqueFd sigfd(signalfd(-1, &wait_for, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!sigfd.valid()) _exit(125);
  signal(SIGPIPE, SIG_IGN);

  // The calls' FIFOs and texts: a directory of the keeper's own.
  std::string dir, dir_error;
  for (const char* parent : {"/dev/shm", "/tmp"}) {
    std::string t = std::string(parent) + "/.agentbox-shell-XXXXXX";
    if (mkdtemp(t.data())) {
      dir = t;
      break;
    }
    dir_error += std::string(dir_error.empty() ? "" : "; ") + parent + ": " + std::strerror(errno);
  }

  pid_t shell = -1;
  UniqueFd script;             // the shell's stdin
  UniqueFd report;             // its exec error, if it could not start
  bool had_shell = false;
  std::string last_end;        // how the last shell ended
  std::optional<Call> call;
  long calls = 0;

  auto remove_files = [&](long n) {
    for (const char* ext : {".cmd", ".out", ".in", ".status"}) {
      (void)unlink((dir + "/" + std::to_string(n) + ext).c_str());
    }
  };
  auto end_everything = [&](int code) {
    KillDescendants(getpid());
    if (call) remove_files(call->n);
    if (!dir.empty()) (void)rmdir(dir.c_str());
    _exit(code);
  };
  char buf[65536];
  auto relay_out = [&](size_t limit) {
    ssize_t r = read(call->fifo_out.get(), buf, std::min(limit, sizeof buf));
    if (r <= 0) return r;
    (void)hooks.write_all(call->out.get(), buf, static_cast<size_t>(r));
    return r;
  };
  // The call's end: its status (or the shell's), its output up to now, and
  // a drainer for what it left writing.
  auto finish = [&](int code, int sig, std::optional<json> exec_error) {
    Call& c = *call;
    int pending = 0;
    if (ioctl(c.fifo_out.get(), FIONREAD, &pending) == 0) {
      size_t left = static_cast<size_t>(pending);
      while (left > 0) {
        ssize_t r = relay_out(left);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        left -= static_cast<size_t>(r);
      }
    }
    struct pollfd p = {c.fifo_out.get(), POLLIN, 0};
    const bool writers = !(poll(&p, 1, 0) > 0 && (p.revents & POLLHUP) && !(p.revents & POLLIN));
    if (writers) {
      const pid_t drainer = fork();
      if (drainer == 0) {
        c.out.reset();
        fcntl(c.fifo_out.get(), F_SETFL, fcntl(c.fifo_out.get(), F_GETFL) & ~O_NONBLOCK);
        hooks.drain(c.fifo_out.get(), c.log.valid() ? c.log.get() : -1);
        _exit(0);
      }
    }
    remove_files(c.n);
    json done = {{"t", "done"}, {"id", c.id}, {"code", code}, {"signal", sig}, {"shell", c.shell}};
    if (exec_error) done["exec_error"] = *exec_error;
    call.reset();
    SendMessage(sock, done);
  };
  auto start_shell = [&]() -> std::optional<json> {
    int s[2], r[2];
    if (pipe2(s, O_CLOEXEC) != 0) return json{{"syscall", "pipe2"}, {"errno", errno}};
    if (pipe2(r, O_CLOEXEC) != 0) {
      close(s[0]);
      close(s[1]);
      return json{{"syscall", "pipe2"}, {"errno", errno}};
    }
    UniqueFd script_r(s[0]), report_w(r[1]);
    script.reset(s[1]);
    report.reset(r[0]);
    shell = hooks.start_shell(script_r.get(), report_w.get());
    if (shell < 0) return json{{"syscall", "fork"}, {"errno", errno}};
    return std::nullopt;
  };
  // Ends the processes the current call started, with `sig`.
  auto signal_call = [&](int sig) {
    for (pid_t pid : Descendants(getpid())) {
      if (pid == shell || call->before.count({pid, StartTime(pid)})) continue;
      kill(pid, sig);
    }
  };
  auto begin = [&](const json& req, std::vector<UniqueFd>& fds) {
    Call c;
    c.id = req.value("id", 0L);
    c.n = ++calls;
    std::string command = ReadMemfd(fds[0].get());
    UniqueFd in = std::move(fds[1]);
    c.out = std::move(fds[2]);
    if (fds.size() > 3) c.log = std::move(fds[3]);
    fcntl(c.out.get(), F_SETFL, fcntl(c.out.get(), F_GETFL) | O_NONBLOCK);
    auto refuse = [&](const std::string& stage, const std::string& syscall, const std::string& path, int err) {
      json done = {{"t", "done"}, {"id", c.id}, {"code", 125}, {"signal", 0}, {"shell", c.shell},
                   {"exec_error", {{"t", "exec_error"}, {"stage", stage}, {"syscall", syscall}, {"path", path},
                                   {"message", "the session's persistent shell"}, {"errno", err}}}};
      remove_files(c.n);
      SendMessage(sock, done);
    };
    if (dir.empty()) return refuse("shell", "mkdtemp", "/dev/shm, /tmp (" + dir_error + ")", EACCES);
    if (shell <= 0) {
      if (had_shell) c.shell = {{"restarted", true}, {"previous", last_end}};
      if (auto failed = start_shell()) return refuse("shell", failed->value("syscall", ""), "bash", failed->value("errno", 0));
      had_shell = true;
    }
    const std::string base = dir + "/" + std::to_string(c.n);
    if (!WriteFile(base + ".cmd", command)) return refuse("shell", "open", base + ".cmd", errno);
    for (const char* ext : {".out", ".status"}) {
      if (mkfifo((base + ext).c_str(), 0600) != 0) return refuse("shell", "mkfifo", base + ext, errno);
    }
    c.fifo_out.reset(open((base + ".out").c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    c.fifo_status.reset(open((base + ".status").c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    if (!c.fifo_out.valid() || !c.fifo_status.valid()) return refuse("shell", "open", base + ".out", errno);
    // The call's stdin is all there before the command starts: a file,
    // which the command reads to its end as from the caller's pipe.
    const bool stdin_file = req.value("stdin", false);
    if (stdin_file) {
      std::string data;
      for (;;) {
        ssize_t r = read(in.get(), buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0 || data.size() > kCommandMax) break;
        data.append(buf, static_cast<size_t>(r));
      }
      if (!WriteFile(base + ".in", data)) return refuse("shell", "open", base + ".in", errno);
    }
    in.reset();
    std::vector<std::string> env;
    if (req.contains("env") && req["env"].is_array()) {
      for (const auto& e : req["env"]) {
        if (e.is_string()) env.push_back(e.get<std::string>());
      }
    }
    c.before = Snapshot(getpid());
    const std::string line = ShellCallLine(dir, c.n, req.value("cwd", ""), env, stdin_file);
    // The shell waits at its prompt: its pipe has room for the line.
    size_t off = 0;
    while (off < line.size()) {
      ssize_t w = write(script.get(), line.data() + off, line.size() - off);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) break;
      off += static_cast<size_t>(w);
    }
    SendMessage(sock, json{{"t", "started"}, {"id", c.id}, {"pid", shell}});
    call = std::move(c);
    // A shell that is already gone: its SIGCHLD ends the call.
  };

  for (;;) {
    struct pollfd fds[4];
    int n = 0, i_sock = -1, i_sig = -1, i_out = -1, i_status = -1;
    fds[i_sock = n++] = {sock, POLLIN, 0};
    fds[i_sig = n++] = {sigfd.get(), POLLIN, 0};
    if (call) {
      fds[i_out = n++] = {call->fifo_out.get(), POLLIN, 0};
      fds[i_status = n++] = {call->fifo_status.get(), POLLIN, 0};
    }
    int timeout = -1;
    if (call && call->held_deadline) {
      timeout = static_cast<int>(std::max<long>(
          0, std::chrono::duration_cast<std::chrono::milliseconds>(*call->held_deadline - Clock::now()).count() + 1));
    }
    if (poll(fds, static_cast<nfds_t>(n), timeout) < 0 && errno != EINTR) end_everything(125);

    if (call && call->held_deadline && Clock::now() >= *call->held_deadline) {
      // The command holds the shell itself: it ends with it.
      call->held_deadline.reset();
      call->shell["ended"] = true;
      call->shell["why"] = "the shell was killed with the call: the command held it past the kill";
      if (shell > 0) kill(shell, SIGKILL);
    }
    if (i_out >= 0 && (fds[i_out].revents & POLLIN)) (void)relay_out(sizeof buf);
    if (i_status >= 0 && (fds[i_status].revents & (POLLIN | POLLHUP))) {
      ssize_t r = read(call->fifo_status.get(), buf, sizeof buf);
      if (r > 0) call->status_text.append(buf, static_cast<size_t>(r));
      if (call->status_text.find('\n') != std::string::npos) {
        finish(std::atoi(call->status_text.c_str()), 0, std::nullopt);
      } else if (r == 0) {
        // Written and closed without a status line: not the shell's line.
        call->fifo_status.reset(open((dir + "/" + std::to_string(call->n) + ".status").c_str(),
                                     O_RDONLY | O_NONBLOCK | O_CLOEXEC));
        if (!call->fifo_status.valid()) finish(125, 0, std::nullopt);
      }
    }

    if (fds[i_sock].revents & (POLLIN | POLLHUP | POLLERR)) {
      char payload[65536];
      std::vector<UniqueFd> received;
      ssize_t got = RecvWithFds(sock, payload, sizeof payload, 0, &received);
      if (got == 0 || (got < 0 && errno != EAGAIN)) end_everything(0);  // the init is gone
      if (got > 0) {
        json req = json::parse(std::string_view(payload, static_cast<size_t>(got)), nullptr, false);
        const std::string op = req.is_object() ? req.value("op", "") : "";
        if (op == "call" && !call && (received.size() == 3 || received.size() == 4)) {
          begin(req, received);
        } else if (op == "kill" && call) {
          const int sig = req.value("signal", SIGKILL);
          signal_call(sig);
          // The shell leaves the rest of the command and says its status.
          if (shell > 0) kill(shell, ShellAbortSignal());
          if (sig == SIGKILL && !call->held_deadline) call->held_deadline = Clock::now() + kShellHeldGrace;
        } else if (op == "call") {
          SendMessage(sock, json{{"t", "done"}, {"id", req.value("id", 0L)}, {"code", 125}, {"signal", 0},
                                 {"shell", json::object()},
                                 {"exec_error", {{"t", "exec_error"}, {"stage", "shell"}, {"syscall", ""},
                                                 {"path", ""}, {"message", "the persistent shell is running another call"},
                                                 {"errno", EBUSY}}}});
        }
      }
    }

    if (!(fds[i_sig].revents & POLLIN)) continue;
    struct signalfd_siginfo info {};
    while (read(sigfd.get(), &info, sizeof info) == sizeof info) {
      const int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT) end_everything(0);
      if (sig != SIGCHLD) continue;
      int ws = 0;
      pid_t pid;
      while ((pid = waitpid(-1, &ws, WNOHANG)) > 0) {
        if (pid != shell) continue;
        shell = -1;
        script.reset();
        const int code = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
        const int killed = WIFSIGNALED(ws) ? WTERMSIG(ws) : 0;
        last_end = killed ? "the previous shell was killed by signal " + std::to_string(killed)
                          : "the previous shell exited with status " + std::to_string(code);
        std::optional<json> exec_error;
        if (report.valid()) {
          char line[4096];
          ssize_t r = read(report.get(), line, sizeof line);
          json m = r > 0 ? json::parse(std::string_view(line, static_cast<size_t>(r)), nullptr, false) : json();
          if (m.is_object() && m.value("t", "") == "exec_error") exec_error = m;
          report.reset();
        }
        if (call) {
          if (!call->shell.contains("ended")) {
            call->shell["ended"] = true;
            call->shell["why"] = killed ? "the shell was killed by signal " + std::to_string(killed)
                                        : "the shell exited with status " + std::to_string(code);
          }
          finish(killed ? 0 : code, killed, exec_error);
        }
      }
    }
  }
}

}  // namespace agentbox::linux
