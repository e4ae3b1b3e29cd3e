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
#include "policy/checks.h"

namespace agentbox::gateway {

// The stage that errors of an upstream (connection, TLS, handshake) are
// reported under.
inline constexpr const char* kUpstreamStage = "upstream";

using Json = nlohmann::json;

// What the gateway asks of an upstream, whatever its transport.
class Upstream {
 public:
  virtual ~Upstream() = default;

  // A JSON-RPC request: its result, or an error (stage "upstream") for an
  // error answer, no answer within `timeout`, or a server that is gone.
  virtual Result<Json> Request(const std::string& method, const Json& params, std::chrono::milliseconds timeout) = 0;
  // tools/list, every page: the Tool objects.
  Result<Json> ListTools(std::chrono::milliseconds timeout);
  // tools/call: the CallToolResult.
  Result<Json> CallTool(const std::string& tool, const Json& arguments, std::chrono::milliseconds timeout);

  // False once the server is gone (a stdio server exited, an HTTP server
  // ended its session): the gateway starts it again.
  virtual bool alive() const = 0;
  const Json& server_info() const { return server_info_; }

 protected:
  explicit Upstream(std::string name) : name_(std::move(name)) {}
  // The result of JSON-RPC `answer` to `method`, or the error it carries.
  Result<Json> AnswerResult(const std::string& method, const Json& answer) const;
  // The initialize request's parameters (the protocol revision asked for).
  static Json InitializeParams();
  static std::string Seconds(std::chrono::milliseconds d);  // "10 s", "250 ms"

  std::string name_;
  Json server_info_;
};

class StdioUpstream : public Upstream {
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

  Result<Json> Request(const std::string& method, const Json& params, std::chrono::milliseconds timeout) override;
  bool alive() const override;
  pid_t pid() const { return pid_; }

 private:
  StdioUpstream(std::string name, pid_t pid, linux::UniqueFd in, linux::UniqueFd out, linux::UniqueFd err);
  void ReadLoop();
  Status Send(const Json& message);
  // Why the server is gone, with its stderr's tail ("" while it runs).
  std::string GoneReason() const;

  pid_t pid_ = -1;
  linux::UniqueFd in_;   // its stdin
  linux::UniqueFd out_;  // its stdout, read by reader_
  linux::UniqueFd err_;  // a file with its stderr
  linux::UniqueFd wake_r_, wake_w_;  // the destructor's word to the reader

  mutable std::mutex mu_;
  std::condition_variable answered_;
  std::map<std::int64_t, Json> answers_;  // id → the response
  std::int64_t next_id_ = 1;
  bool gone_ = false;
  std::string gone_why_;
  std::mutex write_mu_;
  std::thread reader_;
};

// A Streamable HTTP server (MCP's HTTP transport, revision 2025-06-18): each
// message a POST to the endpoint, with the credential as an
// `Authorization: Bearer` header on every request, the session id the
// server gives (Mcp-Session-Id) and the protocol revision; an answer as one
// JSON body or as an event stream, read until the request's own response
// (pings the server sends on it are answered, other requests refused). A
// redirect is never followed (the credential stays with the URL the policy
// names); https verifies the server's certificate and name against the
// system's trust store (OpenSSL's default paths, SSL_CERT_FILE honoured).
// A 404 on the session marks the server gone, so the gateway starts a new
// session; the destructor ends it (DELETE).
class HttpUpstream : public Upstream {
 public:
  static Result<std::unique_ptr<HttpUpstream>> Start(const std::string& name, const std::string& url,
                                                     const std::string& bearer, std::chrono::milliseconds timeout);
  ~HttpUpstream() override;
  HttpUpstream(const HttpUpstream&) = delete;
  HttpUpstream& operator=(const HttpUpstream&) = delete;

  Result<Json> Request(const std::string& method, const Json& params, std::chrono::milliseconds timeout) override;
  bool alive() const override;

  using Url = policy_internal::UpstreamUrl;

  struct Reply;  // one exchange's outcome (http_upstream.cc)

 private:
  HttpUpstream(std::string name, Url url, std::string bearer);
  // POSTs `message` (DELETE when null) and reads until the response to
  // `id` (or, for a notification, the status alone).
  Reply Exchange(const Json* message, const Json& id, std::chrono::milliseconds timeout);
  // Answers what the server asked on an event stream (ping; others -32601).
  void AnswerServer(const Json& request);

  Url url_;
  std::string bearer_;
  mutable std::mutex mu_;
  std::string session_id_;       // Mcp-Session-Id, once the server gives one
  std::string protocol_;         // the revision initialize agreed
  bool gone_ = false;
  std::int64_t next_id_ = 1;
};

}  // namespace agentbox::gateway
