#include "linux/proxy_listeners.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

namespace agentbox::linux {
namespace {

Result<UniqueFd> Listen(std::uint16_t port) {
  const std::string where = "127.0.0.1:" + std::to_string(port);
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::Errno("network", "socket", where);
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return Status::Errno("network", "bind", where);
  }
  if (listen(fd.get(), 1024) != 0) return Status::Errno("network", "listen", where);
  return fd;
}

std::uint16_t BoundPort(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  return ntohs(addr.sin_port);
}

}  // namespace

Result<HostProxyListeners> BindHostProxyListeners() {
  HostProxyListeners out;
  auto http = Listen(0);
  if (!http.ok()) return http.status();
  auto socks = Listen(0);
  if (!socks.ok()) return socks.status();
  out.ports.http_port = BoundPort(http->get());
  out.ports.socks_port = BoundPort(socks->get());
  if (out.ports.http_port == 0 || out.ports.socks_port == 0) {
    return Status::Errno("network", "getsockname", "proxy listeners on 127.0.0.1");
  }
  out.http = std::move(*http);
  out.socks = std::move(*socks);
  return out;
}

Status SendProxyListeners(int sock, const ProxyPorts& ports) {
  auto http = Listen(ports.http_port);
  if (!http.ok()) return http.status();
  auto socks = Listen(ports.socks_port);
  if (!socks.ok()) return socks.status();
  int fds[2] = {http->get(), socks->get()};
  const char tag = 'L';
  if (!SendWithFds(sock, &tag, 1, fds, 2)) return Status::Errno("network", "sendmsg(SCM_RIGHTS)", "proxy listeners");
  return {};  // ours close here; the supervisor's copies stay open
}

Result<std::pair<UniqueFd, UniqueFd>> ReceiveProxyListeners(int sock) {
  char tag = 0;
  std::vector<UniqueFd> fds;
  bool truncated = false;
  const ssize_t n = RecvWithFds(sock, &tag, 1, 0, &fds, &truncated);
  if (n < 0) return Status::Errno("network", "recvmsg(SCM_RIGHTS)", "proxy listeners");
  if (n == 0 || fds.size() != 2 || truncated) {
    return Status::Error("network", "the sandbox runner did not hand over the proxy listeners");
  }
  return std::make_pair(std::move(fds[0]), std::move(fds[1]));
}

}  // namespace agentbox::linux
