// One upstream MCP server behind the tool gateway, as its client: started
// by the daemon outside every sandbox (a stdio server), initialized, asked
// for its tools and called. The session's sandboxes never see it: its
// process, its pipes and its credential stay on the daemon's side.
//
// A stdio server (MCP's stdio transport: one JSON-RPC message per line) is
// started with posix_spawnp in a process group of its own, with a minimal
// environment (PATH, HOME, LANG, plus what the caller adds: the credential,
// as MCP's authorization spec has stdio servers take it) and its stderr
// kept (the last 4 KiB name what went wrong). A reader thread takes its
// answers; a request the server does not answer in time is cancelled
// (notifications/cancelled) and an error naming the server and the method.
// Requests the server sends are refused (-32601), pings answered.
//
// Thread-safety: Request, ListTools and CallTool may be called from several
// threads at once.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "agentbox/status.h"
#include "linux/fd.h"

namespace agentbox::gateway {

using Json = nlohmann::json;

class StdioUpstream {
 public:
  // Starts `argv` (argv[0] looked up in PATH when it has no '/') with `env`
  // ("NAME=VALUE") over the minimal environment, and runs MCP's
  // initialize handshake within `timeout`. Errors name the server (`name`).
  static Result<std::unique_ptr<StdioUpstream>> Start(const std::string& name, const std::vector<std::string>& argv,
                                                      const std::vector<std::string>& env,
                                                      std::chrono::milliseconds timeout);
  ~StdioUpstream();  // closes its stdin, SIGTERM to its group, SIGKILL after 2 s; reaped
  StdioUpstream(const StdioUpstream&) = delete;
  StdioUpstream& operator=(const StdioUpstream&) = delete;

  // A JSON-RPC request: its result, or an error (stage "upstream") for an
  // error answer, no answer within `timeout`, or a server that is gone.
  Result<Json> Request(const std::string& method, const Json& params, std::chrono::milliseconds timeout);
  // tools/list, every page: the Tool objects.
  Result<Json> ListTools(std::chrono::milliseconds timeout);
  // tools/call: the CallToolResult.
  Result<Json> CallTool(const std::string& tool, const Json& arguments, std::chrono::milliseconds timeout);

  bool alive() const;
  pid_t pid() const { return pid_; }
  const Json& server_info() const { return server_info_; }

 private:
  StdioUpstream(std::string name, pid_t pid, linux::UniqueFd in, linux::UniqueFd out, linux::UniqueFd err);
  void ReadLoop();
  Status Send(const Json& message);
  // Why the server is gone, with its stderr's tail ("" while it runs).
  std::string GoneReason() const;

  std::string name_;
  pid_t pid_ = -1;
  linux::UniqueFd in_;   // its stdin
  linux::UniqueFd out_;  // its stdout, read by reader_
  linux::UniqueFd err_;  // a file with its stderr
  linux::UniqueFd wake_r_, wake_w_;  // the destructor's word to the reader
  Json server_info_;

  mutable std::mutex mu_;
  std::condition_variable answered_;
  std::map<std::int64_t, Json> answers_;  // id → the response
  std::int64_t next_id_ = 1;
  bool gone_ = false;
  std::string gone_why_;
  std::mutex write_mu_;
  std::thread reader_;
};

}  // namespace agentbox::gateway
