// `agentbox mcp`: opens a session Manager in this process, creates (or
// resumes) one session on the workspace and serves it over MCP's stdio
// transport until EOF on stdin.
//
// stdout carries the protocol and nothing else: fd 1 is duplicated away for
// the protocol at start and then pointed at stderr, so a stray write by any
// code in the process (or an inherited fd 1) cannot corrupt the stream.
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>

#include "agentbox/outcome.h"
#include "cli/subcommand.h"
#include "daemon/heap.h"
#include "linux/fd.h"
#include "linux/user_dirs.h"
#include "mcp/server.h"
#include "mcp/stdio.h"
#include "session/session.h"

namespace agentbox::cli {
namespace {

using linux::UniqueFd;

struct McpFlags {
  std::string policy_file;
  std::string mode;
  std::string workspace;
  std::string state_dir;
  std::string session;
  std::string log_file;
  std::size_t output_cap = 64 * 1024;
  std::size_t workers = 16;
};

constexpr int kShutdownGraceMs = 2000;
// Default state directories: DEFAULT/mcp/1 .. DEFAULT/mcp/kSlots. A state
// directory serves one process at a time, and an MCP client may start
// several servers at once (one per window or task).
constexpr int kSlots = 64;

// The write end of the self-pipe the signal handler writes the signal
// number to (a handler can do nothing else safely).
int g_stop_pipe = -1;

void OnStopSignal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_stop_pipe, &b, 1);
  errno = saved;
}


// $XDG_STATE_HOME/agentbox/mcp, else ~/.local/state/agentbox/mcp.
std::string DefaultSlotsDir() {
  const std::string state = linux::StateDir();
  return state.empty() ? "" : state + "/mcp";
}

// mkdir -p (0700 for the directories created).
void MakePrivateDirs(const std::string& dir) {
  for (std::size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    ::mkdir(dir.substr(0, slash).c_str(), 0700);
    if (slash == std::string::npos) break;
  }
}

struct OpenedState {
  std::unique_ptr<session::Manager> manager;
  std::string dir;
};

// The Manager on `dir` (made when missing).
Result<OpenedState> OpenState(const std::string& dir, std::size_t output_cap) {
  MakePrivateDirs(dir);
  session::ManagerOptions options;
  options.state_dir = dir;
  options.output_cap_bytes = output_cap;
  auto manager = session::Manager::Open(options);
  if (!manager.ok()) return manager.status();
  return OpenedState{std::move(*manager), dir};
}

// Without --state-dir: the first slot no other process holds, or, to resume
// `session`, the slot that has it.
Result<OpenedState> OpenSlot(const std::string& slots, const std::string& session, std::size_t output_cap) {
  Status last;
  for (int i = 1; i <= kSlots; ++i) {
    auto opened = OpenState(slots + "/" + std::to_string(i), output_cap);
    if (!opened.ok()) {
      last = opened.status();
      if (last.stage() == session::kConflict) continue;  // in use by another process
      return last;
    }
    if (session.empty() || opened->manager->Describe(session).ok()) return opened;
  }
  if (!session.empty()) {
    return Status::Error(session::kNotFound, "no session " + session + " in a free state directory under " + slots +
                                                 " (one in use by another process cannot be resumed)");
  }
  return Status::Error(session::kBusy, "every state directory under " + slots + " (" + std::to_string(kSlots) +
                                           ") is in use; last: " + last.ToString());
}

// Log lines with a UTC timestamp, to stderr or a file, from any thread.
class Logger {
 public:
  explicit Logger(int fd) : fd_(fd) {}
  void operator()(const std::string& line) {
    char stamp[32];
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
    const std::string text = std::string(stamp) + " agentbox mcp: " + line + "\n";
    std::lock_guard<std::mutex> lock(mu_);
    [[maybe_unused]] ssize_t n = ::write(fd_, text.data(), text.size());
  }

 private:
  int fd_;
  std::mutex mu_;
};

void McpError(const std::string& msg) { std::fprintf(stderr, "agentbox mcp: %s\n", msg.c_str()); }

int RunMcp(const McpFlags& f) {
  daemon::KeepCallBuffersResident();
  // The protocol gets its own copies of fds 0 and 1 (close-on-exec, so no
  // sandboxed command inherits them); fd 1 then points at stderr and fd 0 at
  // /dev/null.
  UniqueFd proto_out(::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3));
  UniqueFd proto_in(::fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3));
  if (!proto_out.valid() || !proto_in.valid()) {
    McpError(std::string("cannot duplicate stdin/stdout: ") + std::strerror(errno));
    return kExitFailure;
  }
  std::fflush(stdout);
  if (::dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
    McpError(std::string("dup2(stderr, stdout): ") + std::strerror(errno));
    return kExitFailure;
  }
  if (UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC)); null.valid()) ::dup2(null.get(), STDIN_FILENO);

  UniqueFd log_fd;
  if (!f.log_file.empty()) {
    log_fd.reset(::open(f.log_file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600));
    if (!log_fd.valid()) {
      McpError("--log-file " + f.log_file + ": " + std::strerror(errno));
      return kExitUsage;
    }
  }
  Logger logger(log_fd.valid() ? log_fd.get() : STDERR_FILENO);
  auto log = [&logger](const std::string& line) { logger(line); };

  std::string workspace = RealPath(f.workspace.empty() ? "." : f.workspace);
  if (workspace.empty()) {
    McpError("--workspace " + (f.workspace.empty() ? std::string(".") : f.workspace) + ": " + std::strerror(errno));
    return kExitUsage;
  }
  std::string state_dir = f.state_dir;
  if (!state_dir.empty() && state_dir[0] != '/') state_dir = RealPath(".") + "/" + state_dir;
  std::string policy_yaml;
  if (!f.policy_file.empty()) {
    std::ifstream in(f.policy_file);
    if (!in) {
      McpError("--policy " + f.policy_file + ": " + std::strerror(errno));
      return kExitUsage;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    policy_yaml = ss.str();
  }

  // Signals end the server at once (calls in flight are cancelled); a
  // client that goes away makes writes fail instead of killing the process.
  int stop_pipe[2];
  if (::pipe2(stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    McpError(std::string("pipe2: ") + std::strerror(errno));
    return kExitFailure;
  }
  UniqueFd stop_read(stop_pipe[0]), stop_write(stop_pipe[1]);
  g_stop_pipe = stop_write.get();
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto open_state = [&]() -> Result<OpenedState> {
    if (!state_dir.empty()) return OpenState(state_dir, f.output_cap);
    const std::string slots = DefaultSlotsDir();
    if (slots.empty()) return Status::Error("state", "no state directory: set --state-dir, $XDG_STATE_HOME or $HOME");
    return OpenSlot(slots, f.session, f.output_cap);
  };
  Result<OpenedState> state = open_state();
  if (!state.ok()) {
    McpError("state directory " + (state_dir.empty() ? DefaultSlotsDir() + "/N" : state_dir) + ": " +
             state.status().ToString());
    return kExitFailure;
  }
  state_dir = state->dir;
  auto& manager = state->manager;
  std::string id = f.session;
  if (id.empty()) {
    session::CreateRequest request;
    request.policy_yaml = policy_yaml;
    request.mode = f.mode;
    request.workspace = workspace;
    auto created = manager->Create(request);
    if (!created.ok()) {
      McpError("cannot create a session on " + workspace +
               (f.policy_file.empty() ? std::string() : " with --policy " + f.policy_file) + ": " +
               created.status().ToString());
      return kExitUsage;
    }
    id = *created;
    log("session " + id + " on " + workspace + " (state dir " + state_dir + ")");
  } else {
    auto described = manager->Describe(id);
    if (!described.ok()) {
      McpError("--session " + id + ": " + described.status().ToString());
      return kExitUsage;
    }
    log("resuming session " + id + " (state dir " + state_dir + ")");
  }

  mcp::ManagerTools tools(*manager, id);
  mcp::ServerOptions server_options;
  server_options.version = Version();
  server_options.output_cap_bytes = f.output_cap;
  server_options.log = log;
  mcp::Server server(tools, server_options);
  mcp::StdioOptions stdio;
  stdio.in_fd = proto_in.get();
  stdio.out_fd = proto_out.get();
  stdio.stop_fd = stop_read.get();
  stdio.max_workers = f.workers;
  stdio.log = log;
  auto end = mcp::ServeStdio(server, stdio);

  manager->Shutdown(kShutdownGraceMs);
  log("session " + id + " kept in " + state_dir + " (resume with --session " + id + ")");
  if (!end.ok()) {
    log("stopped: " + end.status().ToString());
    return kExitFailure;
  }
  if (*end == mcp::StdioEnd::kStopped) {
    unsigned char sig = 0;
    [[maybe_unused]] ssize_t n = ::read(stop_read.get(), &sig, 1);
    log("stopped by signal " + std::to_string(sig));
    return 128 + sig;
  }
  log("stdin closed; shut down");
  return 0;
}

}  // namespace

Subcommand AddMcpCommand(CLI::App& app) {
  auto f = std::make_shared<McpFlags>();
  CLI::App* cmd = app.add_subcommand("mcp", "serve one sandbox session to an MCP client over stdio (JSON-RPC, one message a line)");
  cmd->add_option("--policy", f->policy_file, "policy file (YAML)");
  cmd->add_option("--mode", f->mode, "read-only | workspace-write | danger-full-access");
  cmd->add_option("--workspace", f->workspace, "workspace directory (default: current directory)");
  cmd->add_option("--state-dir", f->state_dir,
                  "sessions and snapshots (default: the first free one of $XDG_STATE_HOME/agentbox/mcp/N, "
                  "else ~/.local/state/agentbox/mcp/N)");
  cmd->add_option("--session", f->session, "resume this session (an id printed by an earlier run) instead of creating one");
  cmd->add_option("--log-file", f->log_file, "append logs to FILE instead of stderr");
  cmd->add_option("--output-cap", f->output_cap, "bytes of text one tool result may carry (default 65536)")
      ->check(CLI::Range(std::size_t{1024}, std::size_t{16} * 1024 * 1024));
  cmd->add_option("--max-calls", f->workers, "tool calls running at once (default 16; more wait)")
      ->check(CLI::Range(std::size_t{1}, std::size_t{64}));
  return {cmd, [f](const std::vector<std::string>&) { return RunMcp(*f); }};
}

}  // namespace agentbox::cli
