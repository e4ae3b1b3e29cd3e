#include "linux/proxy_listeners.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

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

Result<UniqueFd> BindDns(const std::string& address, int type) {
  const std::string where = address + ":53 (" + (type == SOCK_DGRAM ? "UDP" : "TCP") + ")";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(53);
  if (inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1) {
    return Status::Error("network", "not an IPv4 address for DNS: " + address);
  }
  // A fresh namespace: nothing of an earlier run can hold the port.
  UniqueFd fd(socket(AF_INET, type | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::Errno("network", "socket", where);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return Status::Errno("network", "bind", where);
  }
  if (type == SOCK_STREAM && listen(fd.get(), 128) != 0) return Status::Errno("network", "listen", where);
  return fd;
}

// The message's one byte says what it carries, in this order.
constexpr char kHasProxy = 1;
constexpr char kHasDns = 2;

Status SendEgressListeners(int sock, const NetworkPlan& network) {
  std::vector<UniqueFd> held;
  char tag = 0;
  if (network.proxy) {
    auto http = Listen(network.proxy->http_port);
    if (!http.ok()) return http.status();
    auto socks = Listen(network.proxy->socks_port);
    if (!socks.ok()) return socks.status();
    held.push_back(std::move(*http));
    held.push_back(std::move(*socks));
    tag |= kHasProxy;
  }
  if (!network.dns_address.empty()) {
    auto udp = BindDns(network.dns_address, SOCK_DGRAM);
    if (!udp.ok()) return udp.status();
    auto tcp = BindDns(network.dns_address, SOCK_STREAM);
    if (!tcp.ok()) return tcp.status();
    held.push_back(std::move(*udp));
    held.push_back(std::move(*tcp));
    tag |= kHasDns;
  }
  std::vector<int> fds;
  for (const auto& f : held) fds.push_back(f.get());
  if (!SendWithFds(sock, &tag, 1, fds.data(), fds.size())) {
    return Status::Errno("network", "sendmsg(SCM_RIGHTS)", "egress listeners");
  }
  return {};  // ours close here; the supervisor's copies stay open
}

Result<EgressListeners> ReceiveEgressListeners(int sock) {
  char tag = 0;
  std::vector<UniqueFd> fds;
  bool truncated = false;
  const ssize_t n = RecvWithFds(sock, &tag, 1, 0, &fds, &truncated);
  if (n < 0) return Status::Errno("network", "recvmsg(SCM_RIGHTS)", "egress listeners");
  const std::size_t want = ((tag & kHasProxy) ? 2 : 0) + ((tag & kHasDns) ? 2 : 0);
  if (n == 0 || fds.size() != want || truncated) {
    return Status::Error("network", "the sandbox runner did not hand over the egress listeners");
  }
  EgressListeners out;
  std::size_t i = 0;
  if (tag & kHasProxy) {
    out.http = std::move(fds[i++]);
    out.socks = std::move(fds[i++]);
  }
  if (tag & kHasDns) {
    out.dns_udp = std::move(fds[i++]);
    out.dns_tcp = std::move(fds[i++]);
  }
  return out;
}

}  // namespace agentbox::linux
