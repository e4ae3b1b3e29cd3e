#include "linux/upper_layer.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace agentbox::linux {

Status SendUpperLayer(int sock, int layer_root) {
  const char tag = 'U';
  if (!SendWithFds(sock, &tag, 1, &layer_root, 1)) {
    return Status::Errno("mount", "sendmsg(SCM_RIGHTS)", "workspace upper layer");
  }
  return {};
}

Result<UniqueFd> ReceiveUpperLayer(int sock) {
  char tag = 0;
  iovec iov{&tag, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return UniqueFd();
  if (n < 0) return Status::Errno("workspace-overlay", "recvmsg(SCM_RIGHTS)", "workspace upper layer");
  UniqueFd out;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
      out.reset(fd);
    }
  }
  return out;
}

}  // namespace agentbox::linux
