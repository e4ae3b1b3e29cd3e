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
  std::vector<UniqueFd> fds;
  const ssize_t n = RecvWithFds(sock, &tag, 1, MSG_DONTWAIT, &fds);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return UniqueFd();
  if (n < 0) return Status::Errno("workspace-overlay", "recvmsg(SCM_RIGHTS)", "workspace upper layer");
  if (fds.empty()) return UniqueFd();
  return std::move(fds.back());
}

}  // namespace agentbox::linux
