#include "supervise/guest_egress.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "linux/loopback_peer.h"
#include "supervise/egress.h"

namespace agentbox::supervise {

Result<std::unique_ptr<GuestEgress>> GuestEgress::Start(const Plan& plan, const RunOptions& options,
                                                        std::shared_ptr<net::Terminator> terminator) {
  auto listeners = linux::BindHostProxyListeners();
  if (!listeners.ok()) return listeners.status();
  std::unique_ptr<GuestEgress> e(new GuestEgress());
  e->ports_ = listeners->ports;
  GuestEgress* self = e.get();
  auto admit = [self](int fd) {
    auto inode = linux::LoopbackPeerInode(fd);
    std::lock_guard<std::mutex> lock(self->mu_);
    return inode.ok() && self->dialled_.erase(*inode) > 0;
  };
  Egress::Fds fds;
  fds.http = std::move(listeners->http);
  fds.socks = std::move(listeners->socks);
  auto started = Egress::Start(plan, options, std::move(fds), 0, std::move(terminator), admit);
  if (!started.ok()) return started.status();
  e->proxy_ = std::move(*started);
  return e;
}

GuestEgress::~GuestEgress() = default;

linux::UniqueFd GuestEgress::Dial(char tag) {
  const std::uint16_t port = tag == 'h' ? ports_.http_port : tag == 's' ? ports_.socks_port : 0;
  if (port == 0) return {};
  linux::UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  struct stat st {};
  if (!fd.valid() || fstat(fd.get(), &st) != 0) return {};
  {
    std::lock_guard<std::mutex> lock(mu_);
    dialled_.insert(st.st_ino);
  }
  struct sockaddr_in a {};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    dialled_.erase(st.st_ino);
    return {};
  }
  return fd;
}

}  // namespace agentbox::supervise
