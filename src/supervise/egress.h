// Egress in the supervisor, on one io_context run on one background thread:
// the proxy serving the listeners the runner created inside the sandbox's
// network namespace, the DNS served there, and the connect() broker; one
// rule engine, one record sink, one report for all three.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agentbox/outcome.h"
#include "agentbox/plan.h"
#include "agentbox/run.h"
#include "agentbox/status.h"
#include "linux/fd.h"

namespace agentbox::net {
struct ConnectionRecord;
class Terminator;
}

namespace agentbox::supervise {

class Egress {
 public:
  // Takes both listeners; starts the proxy's thread. The rules come from
  // plan.network; --ask-command answers questions (none: deny).
  // `served_root` > 0 (landlock-only: listeners on the host's loopback, where
  // any local process may connect): only connections whose client socket a
  // process below that pid (the runner) holds are served; others are closed.
  // `admit` (when set, and served_root is 0): whether to serve a connection
  // accepted on the proxy's listeners (its fd), for listeners on the host's
  // loopback that only the supervisor's own relay should reach.
  // `terminator` (from PrepareCredentials, may be null) ends TLS for the
  // hosts it covers; used on the proxy's thread from here on.
  // `fds`: the proxy's listeners (absent: no proxy variables inside), the
  // DNS's socket and listener (absent: no DNS served), and the broker's
  // channel (absent: no connect() broker).
  struct Fds {
    linux::UniqueFd http, socks, dns_udp, dns_tcp, broker;
  };
  static Result<std::unique_ptr<Egress>> Start(const Plan& plan, const RunOptions& options, Fds fds,
                                               pid_t served_root = 0,
                                               std::shared_ptr<net::Terminator> terminator = nullptr,
                                               std::function<bool(int)> admit = nullptr);
  ~Egress();  // Stop()

  // Closes the listeners and every connection (each delivers its record),
  // then joins the thread. Idempotent.
  void Stop();

  // Replaces the allow and deny lists (the plan's default stays): new
  // connections, names asked of the DNS inside and the connect() broker's
  // decisions follow them at once, and every connection through the proxy
  // to a target they no longer allow is closed, before this returns; so is
  // every direct connection the broker handed over to such a target that
  // `sandbox_root` (> 0) or a process below it holds. An entry that does
  // not parse is refused, naming it, and nothing changes.
  Status SetRules(const std::vector<std::string>& allow, const std::vector<std::string>& deny,
                  pid_t sandbox_root = 0);

  // After Stop: every record, in the order the connections ended.
  const std::vector<net::ConnectionRecord>& records() const;

  struct State;

 private:
  Egress() = default;
  std::unique_ptr<State> state_;
};

// Network denials for the report (one per target and reason, counted), and
// the summary of all connections.
void AddNetworkReport(const std::vector<net::ConnectionRecord>& records, Outcome* out);

// Every record as one JSON line.
Status WriteNetworkLog(const std::string& path, const std::vector<net::ConnectionRecord>& records);

}  // namespace agentbox::supervise
