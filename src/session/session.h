// Sessions: the execute(name, input) → string layer of DESIGN §5, shared by
// the daemon (HTTP), the MCP server and the CLI client.
//
// A session is a recipe (policy, base workspace, optional snapshot) plus a
// per-session upper layer and a durable log under the state directory. Its
// sandbox (a World: one long-lived confined init) is provisioned at the first
// call, and again after it dies; every tool call runs inside that one world.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "agentbox/status.h"

namespace agentbox::session {

class Terminal;
using Json = nlohmann::json;

struct ServiceSpec;  // services.h

// Status::stage() values that callers map to protocol errors. Anything else
// is an internal failure (HTTP 500).
inline constexpr const char* kNotFound = "not_found";      // 404: no such session or snapshot
inline constexpr const char* kBadRequest = "bad_request";  // 400: malformed input, unknown tool
inline constexpr const char* kBusy = "busy";               // 429: a daemon-wide cap is reached
inline constexpr const char* kConflict = "conflict";       // 409: e.g. the session is being removed

struct ManagerOptions {
  std::string state_dir;                 // absolute; created (0700) when missing
  std::size_t max_sessions = 256;        // live (not removed) sessions
  std::size_t max_concurrent_calls = 64; // execute calls in flight, daemon-wide
  std::size_t output_cap_bytes = 256 * 1024;  // bash output kept per call
  std::string workspace_mode = "auto";   // auto | overlay | copy
  // Where disk_gib puts an overlay session's upper layer: tmpfs (memory,
  // unprivileged), image (an ext4 image file loop-mounted under the state
  // directory: root only), or auto (image from 4 GiB when this process can
  // mount one, tmpfs otherwise). Chosen when the session is created.
  std::string upper_fs = "auto";
  std::string agentbox_exe;              // the binary that serves `__world` ("" = this process's own)
  int ready_timeout_ms = 30000;          // provisioning a sandbox takes at most this
  // Who decides escalation requests (supervise/approver.h DecideByCommand):
  // --approve-command's argv ({}: no one; every request is a deny, "no
  // approver is configured") and how long it may take to answer.
  std::vector<std::string> approve_command;
  std::chrono::milliseconds approve_timeout{60000};
  // --approve-api: requests wait (at most approve_timeout) for a decision
  // posted through DecideEscalation (a person's UI); exclusive with
  // approve_command.
  bool approve_api = false;
};

// An escalation request (POST /v1/sessions/{id}/escalations).
struct EscalationAsk {
  std::string offer_id;    // an offer one of the session's results carried (esc-...)
  std::string reason;      // the agent's words, shown to the approver
  std::string request_id;  // optional; the same again returns the recorded escalation ("replayed": true)
  std::string by;          // who asks: "api", "mcp" (for the log)
};

struct CreateRequest {
  std::string policy_yaml;    // a policy file's text ("" = the default policy)
  std::string mode;           // optional preset on top (read-only | workspace-write | ...)
  std::string workspace;      // host directory, absolute (the base, never written by a session)
  std::string from_snapshot;  // "" or a snapshot id
};

// Output as it comes (bash only), on the calling thread, before Execute returns.
using OutputSink = std::function<void(std::string_view chunk)>;

// The result of one call, as recorded in the log and returned by the API:
//   {
//     "call_id": "...",            // as given ("" when none)
//     "name": "bash",
//     "output": "...",             // THE string of execute(name, input) → string
//     "is_error": false,           // true: the call failed (any kind but ok/exited 0)
//     "kind": "exited",            // exited | signaled | timed_out | oom_killed | sandbox_denied
//                                  // | sandbox_error | ok | tool_error | interrupted | cancelled
//     "exit_code": 0,              // bash only, when it exited
//     "truncated": false,          // bash only: output was capped
//     "outcome": {...},            // bash: the full outcome report (docs/report.md);
//                                  // file tools: {"kind", "denials"?, "error"?}
//     "replayed": false,           // true: returned from the log, nothing ran
//     "duration_ms": 3
//   }
// The first line of "output" for a failure names the kind, e.g.
// "sandbox_denied: write to /work/.git/config: read-only (protected path)".

// Tool names and inputs (JSON objects):
//   bash       {command, timeout?, stdin?}   timeout: "30s" or seconds
//   read_file  {path, offset?, limit?}       offset/limit in lines (1-based offset)
//   write_file {path, content}
//   edit_file  {path, old, new}              `old` must occur exactly once
//   list_dir   {path}
//   glob       {pattern}                     relative to the workspace
//   run_code   {language, code, timeout?}    python | javascript (code_mode.h); offered
//                                            when the host has the interpreter
// Paths are resolved inside the session's world (relative ones against the
// workspace as the shell sees it).
const std::vector<std::string>& ToolNames();

class Manager {
 public:
  // Opens (or creates) the state directory and finds every session in it;
  // calls left in flight by a killed daemon are recorded as interrupted.
  static Result<std::unique_ptr<Manager>> Open(const ManagerOptions& options);
  ~Manager();

  // Returns the new id at once; nothing runs until the first Execute.
  Result<std::string> Create(const CreateRequest& request);

  // {id, workspace, mode (overlay|copy), created, provisioned, calls, snapshot?}
  Result<Json> Describe(const std::string& id) const;
  std::vector<std::string> List() const;

  // Runs one tool call (see above). With a call_id already in the log, the
  // recorded result comes back with "replayed": true and nothing runs.
  // Fails (Status) only for a bad request, an unknown session or a cap; a
  // failing command is a result, not a Status.
  // Setting *cancel to true ends a running bash call (its processes are
  // killed) with kind "cancelled".
  Result<Json> Execute(const std::string& id, const std::string& name, Json input, const std::string& call_id = "",
                       const OutputSink& sink = nullptr, const std::atomic<bool>* cancel = nullptr);

  // The session's upstream tools (policy tools.upstream, gateway/gateway.h):
  // {"tools": [{name: "NAME.TOOL", description, inputSchema, ...}],
  // "errors": [{upstream, error}]}, the servers started as needed. Execute
  // calls them by those names.
  Result<Json> ListUpstreamTools(const std::string& id);
  // run_code in this session: {"languages": [{language, interpreter}],
  // "absent": [{language, why}], "bindings": [{name, description,
  // inputSchema}]} (what a program's `tools` module holds).
  Result<Json> CodeMode(const std::string& id);

  // A new value for one of the session's credentials.secrets (by name):
  // the running world's proxy uses it from its next request, and every
  // later world of the session instead of the secret's source. The value
  // is held in locked memory and never logged.
  Status RotateSecret(const std::string& id, const std::string& name, const std::string& value);

  // PATCH /v1/sessions/{id}/policy: a partial policy (YAML) that changes
  // the running session. In this version: network.allow and network.deny,
  // tightening only (a list given replaces the session's). Persisted with
  // the session, in force in its running world before this returns (open
  // proxy connections to a now-denied target are closed), logged with
  // `by`. Returns {"network": {allow, deny}, "applied": "live" |
  // "next_world" | "world_stopped"}.
  Result<Json> PatchPolicy(const std::string& id, const std::string& yaml, const std::string& by);

  // Escalations (on_violation.escalation: one_time_approval; docs/daemon.md
  // "Escalations"). Asks for the grant of an offer one of the session's
  // results carried, and waits for the decision: an offer beyond the
  // ceiling is refused without asking anyone; otherwise the approver
  // (approve_command, approve_api, or none: a deny) decides within
  // approve_timeout (none in time: a deny). An approved grant is applied
  // before this returns: `once` for the session's next call, `session` for
  // the rest of it. Two requests for one offer while the first is pending
  // share its decision. Returns the escalation:
  //   {id (eg-N), session, offer_id, grant, reason, by, request_id, state
  //    (pending | granted | denied), decision (once | session | deny),
  //    decided_by, decision_reason, asked, applied (live | new_world |
  //    next_world), created, decided, replayed}
  Result<Json> RequestEscalation(const std::string& id, const EscalationAsk& ask);
  // The API's decision for a pending escalation (approve_api): `decision`
  // once | session | deny. A decided one is a conflict, naming its decision.
  Result<Json> DecideEscalation(const std::string& id, const std::string& escalation_id, const std::string& decision,
                                const std::string& by, const std::string& reason);
  // {"escalations": [...]}: the session's, oldest first.
  Result<Json> ListEscalations(const std::string& id) const;
  // Every escalation (of any session) that changed after sequence number
  // `after`, waiting at most `wait_ms` for one: {"escalations": [{seq,
  // escalation}], "next": N} (pass N as `after` next time). For a UI's stream.
  Json EscalationChanges(std::uint64_t after, int wait_ms) const;

  // Freezes the session's changes; returns the snapshot id. The snapshot
  // is removed with its session (Remove) unless `keep` (snapshot_on_exit's
  // always are), and unless something still needs it then (below).
  enum class SnapshotLife { kWithSession, kKeep };
  Result<std::string> Snapshot(const std::string& id, SnapshotLife life = SnapshotLife::kWithSession);
  // {"snapshots": [{id, session, parent, mode, created, keep, used_by: [session ids]}]}, oldest
  // first: every snapshot, or those taken from session `id` (which must exist).
  Result<Json> ListSnapshots(const std::string& session_id = "") const;
  // Deletes a snapshot. Refused (conflict, naming them) while a live session
  // was created from it (it is one of that session's layers) or another
  // snapshot has it as parent.
  Status DeleteSnapshot(const std::string& snapshot_id);
  // {"files": [{"path", "status": added|modified|deleted, "binary"}], "patch": "<git-style unified diff>"}
  // without what the workspace's .gitignore files and the policy's
  // diff.exclude leave out, unless `all` (layers.h ComputeDiff).
  Result<Json> Diff(const std::string& id, bool all = false);
  // Writes the changes Diff lists into the base workspace, all or nothing
  // (layers.h ApplyChanges): {"applied": [paths], "files", "conflicts",
  // "protected"}; nothing is written when "conflicts" (base entries changed
  // since the session was created) or "protected" is not empty.
  Result<Json> Apply(const std::string& id, bool all = false);
  // The durable JSONL log's path (for streaming it).
  Result<std::string> LogPath(const std::string& id) const;
  // Stops the sandbox and removes the session's state.
  Status Remove(const std::string& id);

  // Terminals: a command on a pty inside the session's world (terminal.h).
  // `input`: {command? (bash -c), argv?, cwd? (workspace-relative), cols?,
  // rows?, term?}; the default is an interactive bash. Provisions the world
  // when it is not running. Returns the terminal's Describe().
  Result<Json> OpenTerminal(const std::string& id, const Json& input);
  Result<std::shared_ptr<Terminal>> FindTerminal(const std::string& id, const std::string& terminal) const;
  Result<Json> ListTerminals(const std::string& id) const;
  // Kills it (everything it started) and forgets it.
  Status CloseTerminal(const std::string& id, const std::string& terminal);
  // What the session's calls left running wrote after their call ended
  // (STATE_DIR/sessions/ID/background.log).
  Result<std::string> BackgroundLogPath(const std::string& id) const;

  // Services (services.h): named long-running processes in the session's
  // world, provisioned if needed. Status JSON: {name, command, cwd, state
  // (starting|running|exited), pid?, started, exited?, exit_code?, signal?,
  // stopped?, error?, restarts}. `name` "" in ServiceStatus: {"services": [...]}.
  Result<Json> StartService(const std::string& id, const ServiceSpec& spec);
  Result<Json> ServiceStatus(const std::string& id, const std::string& name) const;
  Result<Json> RestartService(const std::string& id, const std::string& name);
  // `forget`: and it is no longer listed (its name is free again).
  Result<Json> StopService(const std::string& id, const std::string& name, bool forget);
  Result<std::string> ServiceLogPath(const std::string& id, const std::string& name) const;
  bool ServiceRunning(const std::string& id, const std::string& name) const;

  // Ports (port_bridge.h): a TCP port of the sandbox's loopback, exposed on
  // the host's loopback: {inside_port, host: "127.0.0.1", port (the host's), connections}.
  // An exposed one comes back as it is (*created false). They end with the world.
  Result<Json> ExposePort(const std::string& id, int port, bool* created);
  Status UnexposePort(const std::string& id, int port);
  Result<Json> Ports(const std::string& id) const;

  // Stops every sandbox (SIGTERM, then SIGKILL after `grace_ms`); sessions
  // stay on disk. Calls in flight end as interrupted.
  void Shutdown(int grace_ms);

  struct Impl;

 private:
  // A call made by a run_code program: logged as a child of the program's
  // call, inside that call's turn (its one-call grants, if any, hold).
  struct ParentCall {
    std::string call_id;
    std::uint64_t seq = 0;
  };
  Result<Json> ExecuteIn(const std::string& id, const std::string& name, Json input, const std::string& call_id,
                         const OutputSink& sink, const std::atomic<bool>* cancel, const ParentCall* parent);
  explicit Manager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace agentbox::session
