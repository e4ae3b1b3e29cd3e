// The egress proxy's bridge into the sandbox: the runner creates the
// listening sockets inside the network namespace (127.0.0.1 there) and hands
// them to the supervisor over a Unix socketpair with SCM_RIGHTS. No process
// inside relays anything; the supervisor's proxy accepts on them directly.
#pragma once

#include <utility>

#include "agentbox/plan.h"
#include "agentbox/status.h"
#include "linux/fd.h"

namespace agentbox::linux {

// What the runner hands over: the proxy's two listeners (plans with a
// proxy) and the DNS's UDP socket and TCP listener (plans with a DNS
// address inside). Absent ones are invalid.
struct EgressListeners {
  UniqueFd http;
  UniqueFd socks;
  UniqueFd dns_udp;
  UniqueFd dns_tcp;
};

// Runner side: binds 127.0.0.1:http_port and 127.0.0.1:socks_port, and
// dns_address:53 over UDP and TCP (in the caller's network namespace; port
// 53 needs the namespace's CAP_NET_BIND_SERVICE, so before the capabilities
// go), sends them over `sock` in one message and closes them here. Errors
// carry the stage "network".
Status SendEgressListeners(int sock, const NetworkPlan& network);

// Landlock-only (no network namespace): the supervisor binds both
// listeners itself, on the host's 127.0.0.1, on ports the kernel picks
// (close-on-exec). Errors carry the stage "network".
struct HostProxyListeners {
  UniqueFd http;
  UniqueFd socks;
  ProxyPorts ports;
};
Result<HostProxyListeners> BindHostProxyListeners();

// Supervisor side: the one message SendEgressListeners sends. An orderly
// close without a message is an error too.
Result<EgressListeners> ReceiveEgressListeners(int sock);

}  // namespace agentbox::linux
