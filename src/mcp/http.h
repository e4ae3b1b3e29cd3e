// MCP's Streamable HTTP transport (revision 2025-06-18) at /mcp on the
// daemon: the same tools as `agentbox mcp`, one agentbox session per MCP
// session.
//
//   POST   /mcp   one JSON-RPC message (or a 2025-03-26 batch). A request is
//                 answered with application/json, or with text/event-stream
//                 when it is a tools/call carrying _meta.progressToken and the
//                 client accepts event streams (progress events, then the
//                 response). Notifications and responses alone: 202.
//   DELETE /mcp   ends the MCP session (calls in flight are cancelled): 204.
//   GET    /mcp   405: the server offers no stream of its own.
//
// Sessions: `initialize` (sent without Mcp-Session-Id) opens one and the
// response carries its Mcp-Session-Id; every later request must carry it
// (missing: 400; unknown or ended: 404, the client then initializes again).
// The agentbox session behind it comes from the query string of the
// initialize request:
//   ?session=ID                    an existing session (POST /v1/sessions);
//                                  the MCP session only borrows it
//   ?workspace=DIR[&policy=FILE][&mode=M]   a new session on DIR (absolute),
//                                  with the policy file (absolute) or the
//                                  default policy; it stays in the daemon
//                                  after the MCP session ends (DELETE
//                                  /v1/sessions/ID removes it)
// The initialize result names it in _meta["agentbox/session"].
//
// Authentication is the daemon's, before any of this (unix socket peer
// check; bearer token on TCP). A request with an Origin header that is not
// a loopback origin is refused (403): DNS rebinding protection.
#pragma once

#include <chrono>
#include <cstddef>

#include "daemon/server.h"
#include "session/session.h"

namespace agentbox::mcp {

struct HttpOptions {
  std::size_t max_sessions = 64;                  // MCP sessions held at once
  std::chrono::minutes idle_expiry{60};           // an idle MCP session past this is dropped
  std::size_t output_cap_bytes = 64 * 1024;       // text of one tool result
};

// Registers /mcp on the daemon's router; `manager` must outlive the server.
void RegisterHttp(daemon::Server& server, session::Manager& manager, HttpOptions options = {});

}  // namespace agentbox::mcp
