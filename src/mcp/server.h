// The MCP server core: JSON-RPC 2.0 messages in, responses and notifications
// out, for one MCP session bound to one agentbox session. It knows no
// transport: `agentbox mcp` feeds it lines from stdin (mcp/stdio.h), the
// daemon feeds it HTTP bodies (mcp/http.h).
//
// Protocol revision 2025-06-18; `initialize` also accepts 2025-03-26 and
// 2024-11-05 (answering the client's revision when supported, else the
// latest). Methods: initialize, ping, tools/list, tools/call; notifications
// in: notifications/initialized, notifications/cancelled; notifications out:
// notifications/progress (bash calls whose request carried
// _meta.progressToken). See docs/mcp.md for the error codes and decisions.
//
// Thread-safety: Handle may be called from several threads at once (a tool
// call must not hold up ping or a cancellation); the transport decides which
// messages run on which thread (MayRunLong).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "agentbox/status.h"
#include "mcp/tools.h"
#include "session/session.h"

namespace agentbox::mcp {

inline constexpr const char* kProtocolLatest = "2025-06-18";
// Every revision `initialize` accepts, oldest first.
const std::vector<std::string>& SupportedProtocols();

// A message longer than this is answered with kInvalidRequest unread.
inline constexpr std::size_t kMaxMessageBytes = 4 * 1024 * 1024;

// JSON-RPC error codes.
inline constexpr int kParseError = -32700;
inline constexpr int kInvalidRequest = -32600;
inline constexpr int kMethodNotFound = -32601;
inline constexpr int kInvalidParams = -32602;
inline constexpr int kInternalError = -32603;
// A request other than initialize or ping before initialize (the code LSP
// uses for the same case; JSON-RPC leaves -32000..-32099 to servers).
inline constexpr int kNotInitialized = -32002;

// The one agentbox session behind an MCP session, as the server calls it.
class SessionTools {
 public:
  virtual ~SessionTools() = default;
  // session::Manager::Execute for this session.
  virtual Result<Json> Execute(const std::string& name, const Json& input, const session::OutputSink& sink,
                               const std::atomic<bool>* cancel) = 0;
  virtual Result<std::string> Snapshot() = 0;
  virtual Result<Json> Diff() = 0;
  // session::Manager::RequestEscalation for this session, asked by "mcp":
  // blocks until the offer is decided; returns the escalation object.
  virtual Result<Json> RequestEscalation(const std::string& offer_id, const std::string& reason) = 0;
  // session::Manager::ListUpstreamTools for this session: the upstream
  // tools (NAME.TOOL) next to the session's own; none by default.
  virtual Result<Json> UpstreamTools() { return Json{{"tools", Json::array()}, {"errors", Json::array()}}; }
  // session::Manager::CodeMode for this session (run_code's languages and
  // bindings); none by default: no run_code.
  virtual Result<Json> CodeMode() { return Json::object(); }
};

// SessionTools over a Manager (not owned; must outlive this).
class ManagerTools final : public SessionTools {
 public:
  ManagerTools(session::Manager& manager, std::string session_id)
      : manager_(manager), id_(std::move(session_id)) {}
  Result<Json> Execute(const std::string& name, const Json& input, const session::OutputSink& sink,
                       const std::atomic<bool>* cancel) override {
    return manager_.Execute(id_, name, input, /*call_id=*/"", sink, cancel);
  }
  Result<std::string> Snapshot() override { return manager_.Snapshot(id_); }
  Result<Json> Diff() override { return manager_.Diff(id_); }
  Result<Json> RequestEscalation(const std::string& offer_id, const std::string& reason) override {
    return manager_.RequestEscalation(id_, session::EscalationAsk{offer_id, reason, "", "mcp"});
  }
  Result<Json> UpstreamTools() override { return manager_.ListUpstreamTools(id_); }
  Result<Json> CodeMode() override { return manager_.CodeMode(id_); }
  const std::string& session_id() const { return id_; }

 private:
  session::Manager& manager_;
  std::string id_;
};

struct ServerOptions {
  std::string version = "0";           // serverInfo.version
  std::size_t output_cap_bytes = 64 * 1024;  // text of one tool result
  std::chrono::milliseconds progress_interval{1000};
  // One line per event (initialize, each call and its end); nullptr: silent.
  std::function<void(const std::string& line)> log;
};

// Sends one notification to the client. May be called from any thread, also
// concurrently for different requests; the transport serialises writes.
using Notify = std::function<void(const Json& notification)>;

class Server {
 public:
  Server(SessionTools& tools, ServerOptions options);  // `tools` not owned
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Handles one message (its text, or already parsed) and returns the
  // response to send, if any: none for a notification, for a response, or
  // for a request the client cancelled. Progress notifications for the
  // message go to `notify` before Handle returns, never after.
  std::optional<Json> Handle(std::string_view text, const Notify& notify);
  std::optional<Json> Handle(const Json& message, const Notify& notify);

  // True for a message that may take long to answer (a tools/call, or a
  // batch): a transport runs it off its reader thread.
  static bool MayRunLong(const Json& message);
  // The answer to a message of `bytes` bytes that was too large to read.
  static Json TooLarge(std::size_t bytes);
  // A JSON-RPC error response.
  static Json Error(const Json& id, int code, const std::string& message);

  // Cancels every call in flight, and every call that would start later
  // (the transport is closing).
  void CancelAll();
  bool initialized() const;
  // The negotiated revision ("" before initialize).
  std::string protocol() const;
  const std::vector<ToolSpec>& tools() const { return specs_; }

 private:
  std::optional<Json> HandleOne(const Json& message, const Notify& notify);
  Json Initialize(const Json& id, const Json& params);
  std::optional<Json> CallTool(const Json& id, const Json& params, const Notify& notify);
  // The CallToolResult; a Status only when the session refused the input.
  Result<Json> RunTool(const ToolSpec& tool, const Json& arguments, const Json& progress_token, const Notify& notify,
               const std::atomic<bool>* cancel);
  void Cancel(const Json& request_id);
  void Log(const std::string& line) const;

  SessionTools& session_;
  const ServerOptions options_;
  const std::vector<ToolSpec> specs_;
  // The session's upstream tools as last listed (tools/list, or a call of
  // one not listed yet); mu_.
  std::vector<ToolSpec> upstream_specs_;
  std::map<std::string, std::string> upstream_errors_;  // NAME → why its tools could not be listed (mu_)
  // Lists them again; the spec named `name`, if any.
  std::optional<ToolSpec> RefreshUpstream(const std::string& name);
  // run_code as this session offers it now (its bindings listed), or none.
  std::optional<ToolSpec> RunCodeSpec();

  mutable std::mutex mu_;
  std::string protocol_;  // guarded by mu_
  std::string client_;    // "name version", guarded by mu_
  // Requests in flight by their id's JSON text, and ids cancelled before
  // their request was seen (a transport may hand the two to different
  // threads); guarded by mu_.
  std::map<std::string, std::shared_ptr<std::atomic<bool>>> in_flight_;
  std::deque<std::string> early_cancels_;
  bool closing_ = false;  // guarded by mu_
};

}  // namespace agentbox::mcp
