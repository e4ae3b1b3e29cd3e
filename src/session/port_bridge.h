// A port of a session's sandbox, exposed on the host's loopback.
//
// The bridge listens on 127.0.0.1 (an ephemeral port, nothing else, ever)
// and, per connection it accepts, asks the world's init for a fresh TCP
// socket made in the sandbox's network namespace (World::OpenInsideSocket),
// connects it here to 127.0.0.1:<inside port> (the sandbox's loopback) and
// relays both ways (splice). No process runs inside for it, and nothing
// inside holds either end: a process in the sandbox can reach the host
// through it no more than without it, and a client on the host reaches the
// one port, never another inside.
//
// It ends with its world: once the world is gone (stopped, died, replaced)
// it stops listening and closes its connections.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "agentbox/status.h"
#include "linux/fd.h"
#include "session/world.h"

namespace agentbox::session {

class PortBridge {
 public:
  static Result<std::unique_ptr<PortBridge>> Start(std::weak_ptr<World> world, int inside_port);
  ~PortBridge();  // Stop()
  PortBridge(const PortBridge&) = delete;
  PortBridge& operator=(const PortBridge&) = delete;

  int inside_port() const { return inside_port_; }
  int host_port() const { return host_port_; }
  const std::string& host() const { return host_; }
  // False once it stopped (asked to, or its world ended).
  bool active() const { return active_; }
  std::uint64_t connections() const { return connections_; }
  // The world it serves is `w` (a session's current world).
  bool Serves(const World* w) const;
  // Stops listening, closes every connection and joins its threads. Idempotent.
  void Stop();

 private:
  PortBridge() = default;
  void AcceptLoop();
  void Relay(linux::UniqueFd client);
  struct Connection;

  std::weak_ptr<World> world_;
  const World* world_raw_ = nullptr;
  int inside_port_ = 0;
  int host_port_ = 0;
  std::string host_ = "127.0.0.1";
  linux::UniqueFd listener_;
  linux::UniqueFd wake_;  // an eventfd: Stop() wakes the accept loop
  std::atomic<bool> active_{true};
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> connections_{0};
  std::thread acceptor_;
  std::mutex mu_;
  std::list<std::shared_ptr<Connection>> open_;
};

}  // namespace agentbox::session
