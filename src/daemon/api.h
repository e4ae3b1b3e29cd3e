// The v1 HTTP API (DESIGN §5) over a session::Manager:
//
//   GET    /v1/health                                   {ok, version, sessions}
//   POST   /v1/sessions                                 {policy?, mode?, workspace, from_snapshot?} → 201 {id}
//   GET    /v1/sessions                                 {sessions: [Describe...]}
//   GET    /v1/sessions/{id}                            Describe
//   POST   /v1/sessions/{id}/execute[?stream=1]         {name, input, call_id?} → result (or SSE)
//   POST   /v1/sessions/{id}/calls/{call_id}/cancel     202: a running call is being cancelled
//   POST   /v1/sessions/{id}/snapshot                   201 {snapshot_id}
//   GET    /v1/sessions/{id}/diff[?format=patch][&all=1] diff JSON, or the raw patch (text/x-diff)
//   POST   /v1/sessions/{id}/apply[?all=1]              {applied, files, conflicts, protected}; 409 / 403
//   GET    /v1/sessions/{id}/log                        the JSONL log (application/x-ndjson)
//   GET    /v1/sessions/{id}/background/log             what calls left running wrote after them (text/plain)
//   POST   /v1/sessions/{id}/services                   {name, command, cwd?, env?} → 201 status
//   GET    /v1/sessions/{id}/services[/{name}]          {services: [status...]} or one status
//   GET    /v1/sessions/{id}/services/{name}/logs[?follow=1]  its output (text/plain)
//   POST   /v1/sessions/{id}/services/{name}/restart|stop     status
//   DELETE /v1/sessions/{id}/services/{name}            stopped and forgotten: its last status
//   POST   /v1/sessions/{id}/ports                      {port} → 201 {host: "127.0.0.1", port, inside_port}
//   GET    /v1/sessions/{id}/ports                      {ports: [...]}
//   DELETE /v1/sessions/{id}/ports/{port}               204
//   DELETE /v1/sessions/{id}                            204
//
// Every Manager call runs on a worker thread (Server::RunBlocking): any of
// them may wait on disk or on a session's lock. docs/daemon.md has the rest.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "daemon/server.h"
#include "session/session.h"

namespace agentbox::daemon {

// Registers the routes; `manager` must outlive the server's Run().
void RegisterApi(Server& server, session::Manager& manager);

// The terminal routes (terminals.cc), registered by RegisterApi:
//   POST   /v1/sessions/{id}/ptys                    {command?|argv?, cwd?, cols?, rows?, term?} → 201 terminal
//   GET    /v1/sessions/{id}/ptys                    {ptys: [terminal...]}
//   GET    /v1/sessions/{id}/ptys/{pty}              the terminal; with Upgrade: websocket, attaches
//   POST   /v1/sessions/{id}/ptys/{pty}/resize       {cols, rows}
//   POST   /v1/sessions/{id}/ptys/{pty}/input        {data}
//   DELETE /v1/sessions/{id}/ptys/{pty}              204: killed, with everything it started
void RegisterTerminalApi(Server& server, session::Manager& manager);

// Shared by the route files.
// The response for a Manager's Status (its stage names the HTTP status).
Response ErrorFor(const Status& s);
Response Busy();
// The body as a JSON object ("" counts as {}); else a 400 naming the problem.
bool ParseObject(const Request& req, nlohmann::json* out, Response* error);
// Checks that `obj` has only `allowed` keys and that each present key in
// `strings` is a string; names the first offender.
bool CheckFields(const nlohmann::json& obj, const std::vector<std::string>& allowed,
                 const std::vector<std::string>& strings, Response* error);

// The SSE framing of a streamed execute:
//   "event: output\ndata: <JSON string>\n\n" per chunk of output, then
//   "event: result\ndata: <result JSON>\n\n" (or "event: error" with {"error"}).
std::string SseEvent(const std::string& event, const nlohmann::json& data);

// The log endpoint's body: the file `fd` from its current offset up to
// `limit` bytes (its size when the request came), whole lines only, in
// chunks through `write` (false: stop). What is appended meanwhile is not
// sent, so a log that grows faster than it is read still ends.
void SendLogPrefix(int fd, std::uint64_t limit, const std::function<bool(std::string)>& write);

// Splits `bytes` at the end of its last complete UTF-8 sequence: the part
// returned goes out now, `*tail` (at most 3 bytes) waits for the next chunk.
std::string TakeCompleteUtf8(std::string bytes, std::string* tail);

}  // namespace agentbox::daemon
