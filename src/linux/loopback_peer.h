// Who is at the other end of a TCP connection accepted on loopback: the
// client socket's inode, from the kernel's table of inet sockets
// (sock_diag), so that the process holding it can be looked for. The
// landlock-only backend's egress proxy listens on the host's 127.0.0.1,
// where any local process can connect; it serves the sandbox's alone.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "agentbox/status.h"

namespace agentbox::linux {

// The inode of the client socket of `accepted_fd` (an IPv4 TCP connection
// whose both ends are on this host, in this network namespace). Errors
// carry the stage "network".
[[nodiscard]] Result<std::uint64_t> LoopbackPeerInode(int accepted_fd);

// Whether the client of `accepted_fd` is a socket that a process below
// `root` holds. Any failure to find out is a no.
bool LoopbackPeerBelow(pid_t root, int accepted_fd);

}  // namespace agentbox::linux
