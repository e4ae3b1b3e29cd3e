// The connect() broker's channel between the runner (which answers the
// seccomp notifications) and the supervisor (which decides, and opens the
// connections from the host's side): one SOCK_SEQPACKET socketpair, one
// message per request or reply, descriptors attached with SCM_RIGHTS.
//
//   runner → supervisor: BrokerRequest + the caller's socket (a duplicate,
//     for its options and its family; never connected by the supervisor);
//   supervisor → runner: BrokerReply [+ the socket to install in place of
//     the caller's, with SECCOMP_IOCTL_NOTIF_ADDFD and ADDFD_FLAG_SETFD].
//
// Both ends are this program: the messages are plain structs.
#pragma once

#include <sys/socket.h>

#include <cstdint>

namespace agentbox::linux {

struct BrokerRequest {
  std::uint64_t id = 0;       // the notification's id: the reply names it
  std::int32_t pid = 0;       // the calling thread (runner's pid namespace)
  std::int32_t domain = 0;    // the caller's socket: AF_INET or AF_INET6
  std::int32_t nonblock = 0;  // its file is O_NONBLOCK: answered at once (EINPROGRESS)
  std::uint32_t addr_len = 0;
  struct sockaddr_storage addr {};  // the runner's own copy of the target, as checked
};

struct BrokerReply {
  std::uint64_t id = 0;
  std::int32_t error = 0;   // what connect() returns: 0, EINPROGRESS, or the errno of a refusal/failure
  std::int32_t has_fd = 0;  // a socket is attached: installed before the answer
};

}  // namespace agentbox::linux
