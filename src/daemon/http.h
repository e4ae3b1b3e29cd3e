// The daemon's HTTP vocabulary, free of any networking library: what a route
// handler receives (Request), how it answers (Reply: once, or as a stream),
// and how routes are found (Router).
//
// Handlers run on the server's event loop thread and must not block; work
// that blocks (a command, a snapshot) goes to Server::RunBlocking, and the
// Reply may be answered from that worker thread.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace agentbox::daemon {

using Headers = std::vector<std::pair<std::string, std::string>>;

// Who is at the other end, established when the connection was accepted.
struct Peer {
  enum class Transport { kUnix, kTcp };
  Transport transport = Transport::kUnix;
  uid_t uid = static_cast<uid_t>(-1);  // unix socket: from SO_PEERCRED
  pid_t pid = 0;                       // unix socket: from SO_PEERCRED
  pid_t runner = 0;                    // unix socket: the agentbox sandbox the peer runs in (0: none)
  std::string address;                 // "unix" or "127.0.0.1:PORT"
};

struct Request {
  std::string method;                         // "GET", "POST", ...
  std::string target;                         // as sent: "/v1/sessions/ID/execute?stream=1"
  std::string path;                           // target without the query, as sent
  std::map<std::string, std::string> query;   // decoded; a key without '=' maps to ""
  Headers headers;                            // names lowercased, in arrival order
  std::string body;
  Peer peer;
  std::vector<std::string> params;            // the route's {placeholders}, in order, percent-decoded
  bool websocket = false;                     // it asks for a WebSocket (Upgrade: websocket, RFC 6455)

  // The first header with this (lowercase) name, or "".
  std::string Header(std::string_view name) const;
  // A query flag: present as "", "1", "true" or "yes".
  bool QueryFlag(const std::string& key) const;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  Headers headers;

  static Response Json(int status, const nlohmann::json& body);
  // {"error": {"code": CODE, "message": MESSAGE}}
  static Response Error(int status, std::string code, std::string message);
  static Response NoContent();
};

// A WebSocket a route accepted (Reply::Upgrade). Thread-safe: Send and
// Close queue their frames on the server's event loop.
class WebSocket {
 public:
  virtual ~WebSocket() = default;
  // A text or binary message; dropped once the socket is closing. A client
  // that lets more than 8 MiB queue up is disconnected.
  virtual void Send(std::string data, bool binary) = 0;
  // A normal closure (1000) with `reason`, after what is queued.
  virtual void Close(std::string reason) = 0;
  virtual bool Closed() const = 0;
};

struct WebSocketHandler {
  // On the event loop thread; none may block.
  std::function<void(std::shared_ptr<WebSocket>)> on_open;        // the handshake is done
  std::function<void(std::string data, bool binary)> on_message;  // a whole message
  std::function<void()> on_close;                                 // once, however it closed
};

// The answer to one request: either Send() once, or Begin() once, then any
// number of Write(), then End(). Thread-safe. If the last reference goes
// without an answer, the client gets a 500 naming the route.
class Reply {
 public:
  virtual ~Reply() = default;
  virtual void Send(Response response) = 0;
  // Starts a streamed response (chunked transfer encoding).
  virtual void Begin(int status, std::string content_type, Headers headers = {}) = 0;
  // Queues a chunk; false once the client is gone (the data is dropped).
  // Called off the event loop thread, it blocks while more than 1 MiB is
  // queued (back-pressure for a slow client); on that thread it never blocks.
  virtual bool Write(std::string data) = 0;
  virtual void End() = 0;
  // The client went away (a write failed or the connection was closed).
  virtual bool Gone() const = 0;
  // Adds a field (e.g. "session", "call_id") to this request's log line.
  virtual void Note(const std::string& key, const std::string& value) = 0;
  // Takes the connection over as a WebSocket (101 Switching Protocols);
  // only for a request whose `websocket` is set (else a 400 goes out).
  virtual void Upgrade(WebSocketHandler handler) = 0;
};

using ReplyPtr = std::shared_ptr<Reply>;
using Handler = std::function<void(Request request, ReplyPtr reply)>;

// Routes by method and path. Patterns are literal segments and "{name}"
// placeholders that match one non-empty segment ("/v1/sessions/{id}/diff").
// A prefix route takes every method and every path under it ("/mcp" matches
// "/mcp" and "/mcp/..."), for a protocol that does its own dispatching.
class Router {
 public:
  void Add(const std::string& method, const std::string& pattern, Handler handler);
  void AddPrefix(const std::string& prefix, Handler handler);

  // Calls the matching handler; else answers 405 (path known, method not;
  // with Allow) or 404.
  void Dispatch(Request request, ReplyPtr reply) const;

 private:
  struct Route {
    std::string method;
    std::vector<std::string> segments;
    Handler handler;
  };
  struct Prefix {
    std::string prefix;
    Handler handler;
  };
  std::vector<Route> routes_;
  std::vector<Prefix> prefixes_;
};

// Splits a request target into its path (as sent) and decoded query; false
// when the percent-encoding is malformed or the target is not origin-form.
bool ParseTarget(const std::string& target, std::string* path, std::map<std::string, std::string>* query);
// Decodes %XX escapes (and nothing else); false when an escape is malformed.
bool PercentDecode(std::string_view in, std::string* out);

}  // namespace agentbox::daemon
