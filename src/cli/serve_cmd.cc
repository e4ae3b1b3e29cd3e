// `agentbox serve`: the session daemon (DESIGN §5, docs/daemon.md).
//
// Start-up is one linear sequence; each step refuses with a message naming
// the path or address concerned, and nothing is listening until every check
// has passed:
//   1. the state directory, made absolute and created (0700);
//   2. the log (stderr, or --log-file);
//   3. the state directory's lock: one daemon per directory;
//   4. the limits, the approver (--approve-command, --approve-timeout), and
//      TCP: a loopback address and a private token file, all checked;
//   5. the unix socket (0600; a stale one replaced);
//   6. the session manager, which finds the sessions on disk;
//   7. the HTTP server, until SIGTERM/SIGINT; then calls in flight get the
//      grace period, sandboxes are stopped, sessions stay on disk.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "agentbox/outcome.h"
#include "agentbox/policy.h"
#include "cli/subcommand.h"
#include "daemon/api.h"
#include "daemon/heap.h"
#include "daemon/listen.h"
#include "daemon/log.h"
#include "daemon/server.h"
#include "mcp/http.h"
#include "session/session.h"

namespace agentbox::cli {
namespace {

struct ServeFlags {
  std::string state_dir;
  std::string socket;
  std::string listen;
  std::string token_file;
  std::size_t max_sessions = 256;
  std::size_t max_calls = 64;
  std::string log_file;
  std::string grace = "10s";
  std::string workspace_mode = "auto";
  std::string max_body = "32Mi";
  std::string read_timeout = "30s";
  std::string approve_command;
  std::string approve_timeout = "60s";
  bool approve_api = false;
};

int ServeFail(const std::string& message) {
  std::fprintf(stderr, "agentbox serve: %s\n", message.c_str());
  return 1;
}

std::string Absolute(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char cwd[PATH_MAX];
  if (!getcwd(cwd, sizeof(cwd))) return path;
  return std::string(cwd) + "/" + path;
}

// --approve-command: a path is made absolute (the daemon may be started
// from anywhere; requests come later) and must be an executable file now; a
// bare name is looked up in PATH at each request, as posix_spawnp does.
Result<std::vector<std::string>> ApproveCommand(const std::string& prog) {
  if (prog.empty()) return std::vector<std::string>{};
  if (prog.find('/') == std::string::npos) return std::vector<std::string>{prog};
  const std::string path = std::filesystem::path(Absolute(prog)).lexically_normal().string();
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return Status::Errno("serve", "stat", path);
  if (!S_ISREG(st.st_mode)) return Status::Error("serve", path + " is not a regular file");
  if (access(path.c_str(), X_OK) != 0) return Status::Errno("serve", "access(X_OK)", path);
  return std::vector<std::string>{path};
}

// mkdir -p, each missing level 0700.
Status MakeDirs(const std::string& dir) {
  for (std::size_t slash = 1; slash != std::string::npos;) {
    slash = dir.find('/', slash + 1);
    std::string prefix = dir.substr(0, slash);
    if (mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) return Status::Errno("state", "mkdir", prefix);
  }
  return Status();
}

int RunServe(const ServeFlags& f) {
  daemon::KeepCallBuffersResident();
  // 1. State directory.
  std::string state_dir = Absolute(f.state_dir.empty() ? daemon::DefaultStateDir() : f.state_dir);
  if (state_dir.empty()) return ServeFail("no --state-dir given and no home directory to default to");
  if (Status s = MakeDirs(state_dir); !s.ok()) return ServeFail(s.message());

  // 2. Log.
  std::unique_ptr<daemon::Logger> log;
  if (f.log_file.empty()) {
    log = std::make_unique<daemon::Logger>();
  } else {
    auto l = daemon::Logger::ToFile(Absolute(f.log_file));
    if (!l.ok()) return ServeFail(l.status().message());
    log = std::move(*l);
  }

  // 3. One daemon per state directory.
  auto lock = daemon::LockStateDir(state_dir);
  if (!lock.ok()) return ServeFail(lock.status().message());

  // 4. Limits and TCP, all checked before anything listens.
  auto grace = ParseDurationMs(f.grace);
  if (!grace.ok()) return ServeFail("--grace: " + grace.status().message());
  auto max_body = ParseSize(f.max_body);
  if (!max_body.ok()) return ServeFail("--max-body: " + max_body.status().message());
  auto read_timeout = ParseDurationMs(f.read_timeout);
  if (!read_timeout.ok() || *read_timeout == 0) {
    return ServeFail("--read-timeout: " +
                     (read_timeout.ok() ? std::string("must be positive") : read_timeout.status().message()));
  }
  auto approve_timeout = ParseDurationMs(f.approve_timeout);
  if (!approve_timeout.ok()) return ServeFail("--approve-timeout: " + approve_timeout.status().message());
  auto approve_command = ApproveCommand(f.approve_command);
  if (!approve_command.ok()) return ServeFail("--approve-command: " + approve_command.status().message());
  if (f.approve_api && !approve_command->empty()) {
    return ServeFail("--approve-api and --approve-command: one approver decides, give one of them");
  }
  if (f.workspace_mode != "auto" && f.workspace_mode != "overlay" && f.workspace_mode != "copy") {
    return ServeFail("--workspace-mode: '" + f.workspace_mode + "' is not auto, overlay or copy");
  }
  daemon::ServerOptions options;
  options.grace_ms = static_cast<int>(*grace);
  options.max_body_bytes = *max_body;
  options.read_timeout_ms = static_cast<int>(*read_timeout);
  options.max_workers = f.max_calls + 64;  // the manager caps calls; this caps threads
  if (!f.listen.empty() || !f.token_file.empty()) {
    if (f.listen.empty()) return ServeFail("--token-file is for --listen; give both");
    if (f.token_file.empty()) {
      return ServeFail("--listen " + f.listen + " needs --token-file FILE: TCP requests must carry a bearer token");
    }
    auto address = daemon::ParseLoopbackAddress(f.listen);
    if (!address.ok()) return ServeFail(address.status().message());
    auto token = daemon::ReadTokenFile(Absolute(f.token_file));
    if (!token.ok()) return ServeFail(token.status().message());
    auto tcp = daemon::ListenTcp(*address);
    if (!tcp.ok()) return ServeFail(tcp.status().message());
    options.tcp_listener = std::move(*tcp);
    options.token = std::move(*token);
  }

  // 5. The unix socket.
  const std::string socket_path = Absolute(f.socket.empty() ? daemon::SocketIn(state_dir) : f.socket);
  auto unix_listener = daemon::ListenUnix(socket_path);
  if (!unix_listener.ok()) return ServeFail(unix_listener.status().message());
  options.unix_listener = std::move(*unix_listener);
  options.unix_path = socket_path;
  struct stat socket_stat{};
  stat(socket_path.c_str(), &socket_stat);
  struct RemoveSocket {
    std::string path;
    ino_t ino;
    void Now() {
      // Only the socket we made: a newer daemon may have replaced it.
      struct stat st{};
      if (!path.empty() && lstat(path.c_str(), &st) == 0 && st.st_ino == ino) unlink(path.c_str());
      path.clear();
    }
    ~RemoveSocket() { Now(); }
  } remove_socket{socket_path, socket_stat.st_ino};

  // 6. Sessions.
  session::ManagerOptions mo;
  mo.state_dir = state_dir;
  mo.max_sessions = f.max_sessions;
  mo.max_concurrent_calls = f.max_calls;
  mo.workspace_mode = f.workspace_mode;
  mo.approve_command = *approve_command;
  mo.approve_timeout = std::chrono::milliseconds(*approve_timeout);
  mo.approve_api = f.approve_api;
  auto manager = session::Manager::Open(mo);
  if (!manager.ok()) return ServeFail(manager.status().ToString());
  log->Log(daemon::Level::kInfo, "sessions_loaded",
           {{"state_dir", state_dir}, {"sessions", (*manager)->List().size()}});
  log->Log(daemon::Level::kInfo, "approver",
           {{"command", mo.approve_command.empty() ? nlohmann::json(nullptr) : nlohmann::json(mo.approve_command[0])},
            {"api", mo.approve_api}, {"timeout_ms", mo.approve_timeout.count()}});

  // 7. Serve.
  auto server = daemon::Server::Create(std::move(options), *log);
  if (!server.ok()) return ServeFail(server.status().message());
  daemon::RegisterApi(**server, **manager);
  mcp::RegisterHttp(**server, **manager);
  std::size_t still_running = (*server)->Run([&](int grace_ms) { (*manager)->Shutdown(grace_ms); });
  if (still_running > 0) {
    // Threads still inside the manager: destroying it under them is worse
    // than leaving now; the sessions are on disk either way.
    log->Log(daemon::Level::kWarn, "exit_with_calls_running", {{"calls", still_running}});
    remove_socket.Now();
    _exit(0);
  }
  return 0;
}

}  // namespace

Subcommand AddServeCommand(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand("serve", "run the session daemon: HTTP/JSON on a unix socket (and loopback TCP)");
  cmd->add_option("--state-dir", f->state_dir,
                  "sessions, snapshots and logs (default: $XDG_STATE_HOME/agentbox or ~/.local/state/agentbox)");
  cmd->add_option("--socket", f->socket, "unix socket path (default: STATE_DIR/agentbox.sock), created 0600");
  cmd->add_option("--listen", f->listen, "also listen on loopback TCP, e.g. 127.0.0.1:7070 (needs --token-file)");
  cmd->add_option("--token-file", f->token_file, "bearer token for --listen (a file only you can read)");
  cmd->add_option("--max-sessions", f->max_sessions, "live sessions at most (default 256); past it: 429");
  cmd->add_option("--max-calls", f->max_calls, "execute calls in flight at most (default 64); past it: 429");
  cmd->add_option("--log-file", f->log_file, "JSON lines log (default: stderr)");
  cmd->add_option("--grace", f->grace, "on SIGTERM, calls in flight get this long (default 10s)");
  cmd->add_option("--workspace-mode", f->workspace_mode, "auto | overlay | copy (default auto)");
  cmd->add_option("--max-body", f->max_body, "request body limit (default 32Mi); past it: 413");
  cmd->add_option("--read-timeout", f->read_timeout, "a request must arrive within this (default 30s); else 408");
  cmd->add_option("--approve-command", f->approve_command,
                  "decides escalation requests: run PROG per request ({\"type\":\"escalation\",...} on stdin; "
                  "answers once, session or deny); without it (or --approve-api) every request is denied");
  cmd->add_flag("--approve-api", f->approve_api,
                "escalation requests wait for a decision posted to "
                "/v1/sessions/{id}/escalations/{eid}/decision (a person's UI; pending ones stream from "
                "/v1/escalations/stream)");
  cmd->add_option("--approve-timeout", f->approve_timeout,
                  "an escalation request unanswered this long is a deny (default 60s)");
  return {cmd, [f](const std::vector<std::string>&) { return RunServe(*f); }};
}

}  // namespace agentbox::cli
