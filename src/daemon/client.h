// A small HTTP/1.1 client for the daemon, over its unix socket or loopback
// TCP with a bearer token: used by `agentbox session` and the benchmarks.
// Keeps one connection open across calls. Not thread-safe: one per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "agentbox/status.h"

namespace agentbox::daemon {

struct Endpoint {
  std::string unix_socket;  // either this...
  std::string host;         // ...or loopback host and port, with a token
  uint16_t port = 0;
  std::string token;
  // Refuse a unix socket that is not private to this user (see
  // CheckSocketIsPrivate). Only tests turn this off, to reach the daemon's
  // own check.
  bool check_socket = true;
  // Each send and each receive gives up after this long (0: never). The CLI
  // waits as long as a command runs; tests set it so that a hang fails.
  int timeout_ms = 0;

  // "http://127.0.0.1:PORT" (a trailing slash allowed; nothing else).
  static Result<Endpoint> FromUrl(const std::string& url);
  std::string Describe() const;
};

struct HttpResponse {
  int status = 0;
  std::string content_type;
  std::string body;  // empty when the body went to a chunk callback

  // {"error": {"code", "message"}}'s message, else the body, else the status.
  std::string ErrorMessage() const;
};

// Body bytes of a chunked response as they arrive.
using ChunkCallback = std::function<void(std::string_view chunk)>;

class Client {
 public:
  explicit Client(Endpoint endpoint);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // One request. Transport failures are a Status (stage "connect" or
  // "http"); any HTTP status is a response. With `on_chunk`, a chunked
  // body is passed on as it comes instead of being kept.
  Result<HttpResponse> Call(const std::string& method, const std::string& target, const std::string& body = "",
                            const ChunkCallback& on_chunk = nullptr);

  // Call() with a JSON body, and the reply parsed; a non-2xx status becomes
  // a Status (stage "http") carrying the daemon's message.
  Result<nlohmann::json> CallJson(const std::string& method, const std::string& target,
                                  const nlohmann::json& body = nullptr);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Server-Sent Events, fed in arbitrary pieces: calls `on_event(event, data)`
// for each complete event ("message" when it names none).
class SseParser {
 public:
  using EventCallback = std::function<void(const std::string& event, const std::string& data)>;
  explicit SseParser(EventCallback on_event) : on_event_(std::move(on_event)) {}
  void Feed(std::string_view bytes);

 private:
  EventCallback on_event_;
  std::string pending_;
};

}  // namespace agentbox::daemon
