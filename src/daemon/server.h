// The daemon's HTTP/1.1 server: listeners (unix socket, loopback TCP),
// authentication, limits, routing, worker threads and graceful shutdown.
//
// One event loop thread (Boost.Asio) owns every connection; route handlers
// run on it and must not block. Blocking work goes to RunBlocking: a thread
// per task, bounded, whose result is posted back through the Reply.
//
// Who may talk:
//   unix socket  only peers whose SO_PEERCRED uid is the daemon's own, or
//                root; others get 403 (and a log line) whatever the socket's
//                mode says.
//   TCP          every request needs "Authorization: Bearer <token>",
//                compared in constant time; else 401.
//
// Extra routes (e.g. an MCP endpoint) register on router() before Run().
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "agentbox/status.h"
#include "daemon/http.h"
#include "daemon/log.h"
#include "linux/fd.h"

namespace agentbox::daemon {

struct ServerOptions {
  linux::UniqueFd unix_listener;     // from ListenUnix, or invalid
  std::string unix_path;             // for logs
  linux::UniqueFd tcp_listener;      // from ListenTcp, or invalid
  std::string token;                 // required with a TCP listener

  std::size_t max_body_bytes = 32u << 20;     // larger bodies: 413
  std::size_t max_header_bytes = 16u << 10;   // larger header blocks: 431
  int read_timeout_ms = 30000;       // a request (header, then body) must arrive within this
  int idle_timeout_ms = 120000;      // a keep-alive connection may stay silent this long
  int write_timeout_ms = 60000;      // each write to the client
  std::size_t max_connections = 512; // past it: 503 and close
  std::size_t max_workers = 128;     // RunBlocking tasks at once
  int grace_ms = 10000;              // on SIGTERM/SIGINT: calls in flight get this long
};

class Server {
 public:
  // Takes the listeners; nothing is accepted before Run().
  static Result<std::unique_ptr<Server>> Create(ServerOptions options, Logger& log);
  ~Server();

  Router& router();
  Logger& log();

  // Runs `work` on a new thread. false (nothing runs) when max_workers tasks
  // are running or the server is shutting down: answer 429 / 503.
  [[nodiscard]] bool RunBlocking(std::function<void()> work);

  // Serves until SIGTERM or SIGINT (or Stop()), then shuts down gracefully:
  //   1. stop accepting; close idle connections; later requests get 503;
  //   2. wait up to grace_ms for RunBlocking tasks to finish;
  //   3. call `drain(grace_ms)` on a separate thread (e.g. stop sandboxes, so
  //      that the remaining calls end), and wait for the tasks again;
  //   4. let the last responses go out, close every connection, return.
  // Returns the number of tasks still running at the end (0 normally).
  std::size_t Run(const std::function<void(int grace_ms)>& drain);

  // Starts the shutdown as a signal would. Thread-safe.
  void Stop();

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace agentbox::daemon
