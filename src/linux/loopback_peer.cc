#include "linux/loopback_peer.h"

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "linux/descendants.h"
#include "linux/fd.h"

namespace agentbox::linux {

Result<std::uint64_t> LoopbackPeerInode(int accepted_fd) {
  sockaddr_in local{}, peer{};
  socklen_t len = sizeof local;
  if (getsockname(accepted_fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
    return Status::Errno("network", "getsockname", "accepted proxy connection");
  }
  len = sizeof peer;
  if (getpeername(accepted_fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) {
    return Status::Errno("network", "getpeername", "accepted proxy connection");
  }
  if (local.sin_family != AF_INET || peer.sin_family != AF_INET) {
    return Status::Error("network", "accepted proxy connection is not IPv4");
  }
  UniqueFd nl(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!nl.valid()) return Status::Errno("network", "socket(AF_NETLINK, NETLINK_SOCK_DIAG)");
  // The client's socket: its source is our peer, its destination us. An
  // exact lookup (no NLM_F_DUMP) of that one socket.
  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } msg;
  std::memset(&msg, 0, sizeof msg);
  msg.nlh.nlmsg_len = sizeof msg;
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST;
  msg.req.sdiag_family = AF_INET;
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = ~0u;
  msg.req.id.idiag_sport = peer.sin_port;
  msg.req.id.idiag_dport = local.sin_port;
  msg.req.id.idiag_src[0] = peer.sin_addr.s_addr;
  msg.req.id.idiag_dst[0] = local.sin_addr.s_addr;
  msg.req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  if (send(nl.get(), &msg, sizeof msg, 0) != static_cast<ssize_t>(sizeof msg)) {
    return Status::Errno("network", "send(SOCK_DIAG_BY_FAMILY)");
  }
  alignas(nlmsghdr) char buf[8192];
  ssize_t n;
  do {
    n = recv(nl.get(), buf, sizeof buf, 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Status::Errno("network", "recv(SOCK_DIAG_BY_FAMILY)");
  for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, static_cast<unsigned>(n)); h = NLMSG_NEXT(h, n)) {
    if (h->nlmsg_type == NLMSG_ERROR) {
      const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
      return Status::Syscall("network", "SOCK_DIAG_BY_FAMILY", "proxy client socket", -e->error);
    }
    if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY) continue;
    const auto* m = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
    return static_cast<std::uint64_t>(m->idiag_inode);
  }
  return Status::Error("network", "SOCK_DIAG_BY_FAMILY: no answer for the proxy client socket");
}

bool LoopbackPeerBelow(pid_t root, int accepted_fd) {
  auto inode = LoopbackPeerInode(accepted_fd);
  return inode.ok() && *inode != 0 && HeldByDescendant(root, {*inode});
}

}  // namespace agentbox::linux
