// End-to-end test harness: runs the real agentbox binary as a child process.
//
// Every test builds its own world (a temporary workspace, a fake HOME full of
// fake secrets, a directory for the report) and throws it away afterwards,
// even when an assertion fails. A child that hangs is killed after a timeout,
// so a hang fails the test instead of stalling CI.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "host_facts.h"

namespace agentbox::e2e {

// The agentbox binary under test: $AGENTBOX_BIN.
std::string AgentboxBin();

// The fixtures directory: $AGENTBOX_FIXTURES when set (a staged copy for the
// unprivileged run), else the source tree's.
std::string FixturesDir();

// The directory temporary files go into: $TMPDIR, else /tmp.
std::string TempRoot();

// A random lowercase hex string, for markers that must not appear by chance.
std::string RandomHex(size_t bytes = 8);

// A directory created with mkdtemp and removed recursively on destruction.
// Removal copes with what a sandboxed run may leave: mode-0000 files and
// directories without write or search permission.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "agentbox-e2e-");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + rel
  std::string operator/(const std::string& rel) const;

 private:
  std::string path_;
};

// Recursively removes a path (file, symlink or directory), fixing permissions
// on the way. Never follows symlinks. Returns false if something remained.
bool RemoveTree(const std::string& path);

// Writes `content` to `path` (creating parent directories) with `mode`.
void WriteFile(const std::string& path, const std::string& content, mode_t mode = 0644);
// The file's content, or std::nullopt if it cannot be read.
std::optional<std::string> ReadFile(const std::string& path);
// lstat() succeeds.
bool Exists(const std::string& path);
bool IsDir(const std::string& path);
void MakeDirs(const std::string& path, mode_t mode = 0755);

// What to run.
struct Command {
  std::vector<std::string> argv;               // argv[0] is a path, not searched
  std::string cwd;                             // empty: the test's cwd
  std::vector<std::string> env;                // NAME=VALUE, the whole environment
  std::string stdin_data;                      // fed through a pipe; /dev/null if empty
  int stdin_fd = -1;                           // if >= 0: the child's stdin (overrides stdin_data)
  int timeout_ms = 30000;                      // then SIGKILL to the process group
};

struct RunResult {
  int status = -1;           // exit code, or 128+N when killed by signal N
  std::string out;           // everything written to stdout
  std::string err;           // everything written to stderr
  bool timed_out = false;    // the harness killed it
  long elapsed_ms = 0;
  std::optional<nlohmann::json> report;  // the --report file, when it was parsed

  // For failure messages.
  std::string Describe() const;
};

// A started child. It runs in its own process group; the destructor kills
// that group (SIGKILL) and reaps the child if the test did not wait for it.
class Process {
 public:
  explicit Process(const Command& command);
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool started() const { return pid_ > 0; }
  const std::string& start_error() const { return start_error_; }

  // Pumps output until stdout contains `needle` or `timeout_ms` passes.
  bool WaitForStdout(const std::string& needle, int timeout_ms);
  // Pumps output until the child exits (and its pipes close or go quiet),
  // killing it when the command's timeout passes. Call once.
  RunResult Wait();

  const std::string& out() const { return result_.out; }
  const std::string& err() const { return result_.err; }

 private:
  // One round of poll(); returns false when nothing is left to wait for.
  bool Pump(int timeout_ms);
  void KillGroup();

  Command command_;
  pid_t pid_ = -1;
  int pidfd_ = -1;
  int out_fd_ = -1, err_fd_ = -1, in_fd_ = -1;
  size_t in_off_ = 0;
  bool exited_ = false;
  int wait_status_ = 0;
  long started_ms_ = 0;
  long exited_at_ms_ = 0;
  std::string start_error_;
  RunResult result_;
};

// Runs a command to completion.
RunResult RunCommand(const Command& command);

// Milliseconds on a monotonic clock.
long NowMs();

// Host pids whose /proc/PID/cmdline contains `marker` (NUL separators are
// read as spaces).
std::vector<pid_t> PidsWithCmdline(const std::string& marker);
// Polls until no process carries `marker`, or `timeout_ms` passes.
bool WaitUntilNoProcess(const std::string& marker, int timeout_ms);

using host_facts::CgroupControllerDelegated;
using host_facts::CgroupsExpected;
using host_facts::NprocCapsUserNamespace;

// A fake user: a workspace, a HOME with fake credentials, and a place for
// reports outside both. Runs `agentbox run` the way an agent harness would.
class Sandbox {
 public:
  enum class GitRepo { kInit, kNone };
  explicit Sandbox(GitRepo repo = GitRepo::kInit);

  const std::string& ws() const { return ws_.path(); }
  const std::string& home() const { return home_.path(); }
  const std::string& scratch() const { return scratch_.path(); }
  std::string report_path() const { return scratch_ / "report.json"; }

  // Fake secrets planted in HOME (each is a unique random marker).
  const std::string& ssh_secret() const { return ssh_secret_; }
  const std::string& aws_secret() const { return aws_secret_; }

  // Environment for agentbox: PATH, HOME=home(), LANG plus `extra`.
  std::vector<std::string> Env(const std::vector<std::string>& extra = {}) const;

  // agentbox run --report R [options] -- sh -c script
  RunResult Sh(const std::string& script, const std::vector<std::string>& options = {},
               const std::vector<std::string>& extra_env = {}, int timeout_ms = 30000) const;
  // agentbox run --report R [options] -- argv...
  RunResult RunArgv(const std::vector<std::string>& argv, const std::vector<std::string>& options = {},
                    const std::vector<std::string>& extra_env = {}, int timeout_ms = 30000) const;
  // The full command for agentbox ARGS..., in the workspace, with Env(extra).
  Command AgentboxCommand(const std::vector<std::string>& args,
                          const std::vector<std::string>& extra_env = {}) const;
  // Runs a host command (argv[0] searched in /usr/bin:/bin) in the workspace.
  RunResult Host(const std::vector<std::string>& argv) const;
  // Runs host git in the workspace with a neutral configuration.
  RunResult Git(const std::vector<std::string>& args, const std::string& dir = "") const;

 private:
  TempDir ws_{"agentbox-e2e-ws-"};
  TempDir home_{"agentbox-e2e-home-"};
  TempDir scratch_{"agentbox-e2e-scratch-"};
  std::string ssh_secret_;
  std::string aws_secret_;
};

// HTTP/1.0 on the host's 127.0.0.1:<ephemeral>: every request gets kBody.
// Counts what it served; stops (and joins its thread) when destroyed.
class HostServer {
 public:
  static constexpr const char* kBody = "hello-from-the-host-listener";
  HostServer();
  ~HostServer();
  HostServer(const HostServer&) = delete;
  HostServer& operator=(const HostServer&) = delete;
  int port() const { return port_; }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string url() const { return "http://" + target() + "/"; }
  int served() const { return served_; }

 private:
  void Loop();
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> served_{0};
  std::thread thread_;
};

// Splits text into lines (without the newlines).
std::vector<std::string> Lines(const std::string& text);
// True if `text` contains `needle`.
inline bool Contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}
// Full path of an executable found in /usr/bin, /bin, /usr/sbin, /sbin ("" if none).
std::string FindTool(const std::string& name);
// Whether python3 is on PATH (the attack scripts' interpreter).
inline bool HavePython() { return !FindTool("python3").empty(); }

}  // namespace agentbox::e2e

namespace agentbox::e2e {

// Report accessors that read as assertions do ("" / -1 when absent).
inline std::string OutcomeOf(const RunResult& r) {
  return r.report && (*r.report)["outcome"].is_string() ? (*r.report)["outcome"].get<std::string>() : "";
}
inline int ReportInt(const RunResult& r, const char* key) {
  return r.report && (*r.report)[key].is_number_integer() ? (*r.report)[key].get<int>() : -1;
}
inline std::string ErrorStage(const RunResult& r) {
  if (!r.report || !(*r.report)["error"].is_object()) return "";
  const auto& s = (*r.report)["error"]["stage"];
  return s.is_string() ? s.get<std::string>() : "";
}
// The report's enforcement.missing entries, one JSON object a line ("" without a report).
inline std::string MissingText(const RunResult& r) {
  std::string out;
  if (!r.report) return out;
  for (const auto& m : (*r.report)["enforcement"]["missing"]) out += m.dump() + "\n";
  return out;
}

inline std::string EnforcementLevel(const RunResult& r) {
  if (!r.report || !(*r.report)["enforcement"].is_object()) return "";
  const auto& l = (*r.report)["enforcement"]["level"];
  return l.is_string() ? l.get<std::string>() : "";
}
// True if some denial's target contains `needle`.
inline bool HasDenial(const RunResult& r, const std::string& needle) {
  if (!r.report || !(*r.report)["denials"].is_array()) return false;
  for (const auto& d : (*r.report)["denials"]) {
    if (d["target"].is_string() && Contains(d["target"].get<std::string>(), needle)) return true;
  }
  return false;
}

}  // namespace agentbox::e2e
