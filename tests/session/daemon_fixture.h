// End-to-end fixture for the session daemon: a real `agentbox serve` on a
// temporary state directory, talked to over its unix socket (or TCP).
//
// The daemon runs in its own process group with stdout/stderr in a file;
// the destructor stops it (SIGTERM, then SIGKILL by pid), kills whatever it
// left behind (its descendants, recorded while it ran) and removes the
// temporary directories, even when an assertion failed.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/client.h"
#include "harness.h"

namespace agentbox::session_test {

using nlohmann::json;

class Daemon {
 public:
  Daemon();
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Starts `agentbox serve --state-dir S --socket P --log-file L` plus
  // `extra`, and waits until /v1/health answers. false: see error().
  bool Start(const std::vector<std::string>& extra = {});
  // Starts and expects it to refuse: its exit status (-1: it ran); error()
  // holds what it printed.
  int StartExpectingFailure(const std::vector<std::string>& extra);
  const std::string& error() const { return error_; }

  // Listen on `path` instead of the state directory's socket (before Start).
  void UseSocket(const std::string& path) { socket_ = path; }

  void Signal(int sig);
  // The exit status (code, or 128+signal); -1 if still running after `timeout_ms`.
  int WaitExit(int timeout_ms);
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  const std::string& state_dir() const { return state_dir_; }
  const std::string& socket() const { return socket_; }
  const std::string& root() const { return root_.path(); }
  std::string log_path() const { return root_ / "daemon.log"; }
  std::string output() const;  // stdout+stderr of the daemon
  std::vector<json> LogEvents() const;
  // The first log event named `event`, or null.
  json LogEvent(const std::string& event) const;

  // A client on this daemon's socket (one per thread; this one for the test's).
  daemon::Client& client();
  daemon::Endpoint endpoint() const;

  // Processes the daemon started (all its threads' children), now.
  std::vector<pid_t> Children() const;
  // Every descendant, now; also remembered for clean-up.
  std::vector<pid_t> Descendants();
  // Waits until none of `pids` exists (zombies count as gone).
  static bool WaitGone(const std::vector<pid_t>& pids, int timeout_ms);

  // Environment for agentbox commands (PATH, HOME, LANG).
  std::vector<std::string> Env() const;
  // Variables added to the daemon's environment (set before Start).
  std::vector<std::string> extra_env;

 private:
  void Stop();

  e2e::TempDir root_{"agentbox-session-"};
  e2e::TempDir home_{"agentbox-session-home-"};
  std::string state_dir_;
  std::string socket_;
  pid_t pid_ = -1;
  std::string error_;
  int start_exit_ = -1;
  std::unique_ptr<daemon::Client> client_;
  std::set<pid_t> seen_;  // descendants ever seen, killed at the end if left
};

// --- Calls -----------------------------------------------------------------

struct Answer {
  int status = 0;     // HTTP status; 0 when the transport failed
  json body;          // parsed JSON, or null
  std::string text;   // the raw body (or the transport error)

  std::string code() const;     // error.code
  std::string message() const;  // error.message
};

Answer Call(daemon::Client& c, const std::string& method, const std::string& target, const json& body = nullptr);
// POST /v1/sessions; the id, or "" (with a test failure).
std::string CreateSession(daemon::Client& c, const std::string& workspace, const json& extra = json::object());
// POST .../execute {name, input, call_id?}; the result JSON (or the error answer's body).
json Execute(daemon::Client& c, const std::string& id, const std::string& name, const json& input,
             const std::string& call_id = "");
json Bash(daemon::Client& c, const std::string& id, const std::string& command, const std::string& call_id = "");

// A call's result's "output" ("" when it has none).
inline std::string Output(const json& result) { return result.value("output", ""); }

// Sends `bytes` on a fresh connection to the unix socket and returns what
// comes back until the daemon closes or `timeout_ms` passes. `as_uid` >= 0:
// from a child that switched to that uid (root only).
std::string RawExchange(const std::string& socket, const std::string& bytes, int timeout_ms = 10000,
                        int as_uid = -1);
// The status code of a raw HTTP response, or 0.
int RawStatus(const std::string& response);

// Runs host git with a neutral configuration.
e2e::RunResult Git(const std::vector<std::string>& args, const std::string& dir);
// A git repository at `dir` with `files` committed.
void MakeRepo(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& files);

// A daemon and one session on a fresh workspace: the fixture of the tests
// of one session's resources (terminals, services, ports).
class OneSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(d_.Start()) << d_.error();
    id_ = CreateSession(c(), ws_.path());
    ASSERT_FALSE(id_.empty());
  }
  daemon::Client& c() { return d_.client(); }

  e2e::TempDir ws_{"agentbox-session-ws-"};  // outlives the daemon
  Daemon d_;
  std::string id_;
};

}  // namespace agentbox::session_test
