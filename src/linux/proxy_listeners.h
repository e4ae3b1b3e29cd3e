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

// Runner side: binds 127.0.0.1:http_port and 127.0.0.1:socks_port (in the
// caller's network namespace), listens, sends both over `sock` and closes
// them here. Errors carry the stage "network".
Status SendProxyListeners(int sock, const ProxyPorts& ports);

// Landlock-only (no network namespace): the supervisor binds both
// listeners itself, on the host's 127.0.0.1, on ports the kernel picks
// (close-on-exec). Errors carry the stage "network".
struct HostProxyListeners {
  UniqueFd http;
  UniqueFd socks;
  ProxyPorts ports;
};
Result<HostProxyListeners> BindHostProxyListeners();

// Supervisor side: one message with the two listeners (HTTP first, then
// SOCKS5). An orderly close without a message is an error too.
Result<std::pair<UniqueFd, UniqueFd>> ReceiveProxyListeners(int sock);

}  // namespace agentbox::linux
