// The host's end of egress for a kernel of the world's own that has no
// network device of its use (a microVM's guest, a gVisor sandbox with no
// network): the proxy on listeners of the host's loopback, serving only
// the connections this process dials for the inside (their client sockets'
// inodes), which the stream mux then carries.
#pragma once

#include <sys/types.h>

#include <memory>
#include <mutex>
#include <set>

#include "agentbox/plan.h"
#include "agentbox/run.h"
#include "agentbox/status.h"
#include "linux/fd.h"
#include "linux/proxy_listeners.h"

namespace agentbox::net {
class Terminator;
}

namespace agentbox::supervise {

class Egress;

class GuestEgress {
 public:
  static Result<std::unique_ptr<GuestEgress>> Start(const Plan& plan, const RunOptions& options,
                                                    std::shared_ptr<net::Terminator> terminator);
  ~GuestEgress();
  // A connection to the proxy's listener for `tag` ('h' HTTP, 's' SOCKS).
  linux::UniqueFd Dial(char tag);
  Egress& proxy() { return *proxy_; }

 private:
  GuestEgress() = default;
  ProxyPorts ports_;
  std::mutex mu_;
  std::set<ino_t> dialled_;
  std::unique_ptr<Egress> proxy_;
};

}  // namespace agentbox::supervise
