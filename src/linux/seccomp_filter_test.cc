// The compiled filter, installed for real in a forked child (it cannot be
// taken off again), with the responder answering its notifications as the
// runner's does.
#include "linux/seccomp_filter.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "confine/layers.h"
#include "linux/fd.h"
#include "linux/in_child.h"
#include "linux/seccomp_notify.h"

namespace agentbox::linux {
namespace {

using Json = nlohmann::json;

// Runs `body` in a forked child under the filter of `plan`, and returns
// the JSON it produced.
Json UnderFilter(const SeccompPlan& plan, const std::function<Json(NotifyResponder&)>& body) {
  return testing::InChild([&]() -> Json {
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return Json{{"child", "no_new_privs"}};
    auto program = CompileSeccomp(plan);
    if (!program.ok()) return Json{{"child", program.status().ToString()}};
    // The responder's thread first: it stays outside the filter.
    auto responder = NotifyResponder::Start(UnixConnectRules{});
    if (!responder.ok()) return Json{{"child", responder.status().ToString()}};
    auto listener = InstallSeccomp(*program);
    if (!listener.ok()) return Json{{"child", listener.status().ToString()}};
    (*responder)->Serve(std::move(*listener));
    return body(**responder);
  });
}

// 0 when the socket was made, else the errno.
int SocketErrno(int domain, int type, int protocol) {
  UniqueFd fd(socket(domain, type, protocol));
  return fd.valid() ? 0 : errno;
}

// An RTM_GETLINK dump over `fd`: the number of links it listed, or -errno.
int DumpLinks(int fd) {
  struct {
    struct nlmsghdr header;
    struct ifinfomsg info;
  } request{};
  request.header.nlmsg_len = sizeof(request);
  request.header.nlmsg_type = RTM_GETLINK;
  request.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  request.header.nlmsg_seq = 1;
  request.info.ifi_family = AF_UNSPEC;
  struct sockaddr_nl kernel {};
  kernel.nl_family = AF_NETLINK;
  if (sendto(fd, &request, sizeof(request), 0, reinterpret_cast<struct sockaddr*>(&kernel), sizeof(kernel)) < 0) {
    return -errno;
  }
  int links = 0;
  alignas(struct nlmsghdr) char buf[16384];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0) return -errno;
    int left = static_cast<int>(n);
    for (auto* h = reinterpret_cast<struct nlmsghdr*>(buf); NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
      if (h->nlmsg_type == NLMSG_DONE) return links;
      if (h->nlmsg_type == NLMSG_ERROR) return -EPROTO;
      if (h->nlmsg_type == RTM_NEWLINK) ++links;
    }
  }
}

// os.networkInterfaces() in Node reads the interfaces through getifaddrs,
// over a NETLINK_ROUTE socket: that one is made and read, other netlink
// protocols stay refused, and each refusal is reported as a `socket` denial.
TEST(SeccompFilter, NetlinkRouteIsReadableAndOtherNetlinkRefused) {
  for (SocketScope scope : {SocketScope::kOwnNamespace, SocketScope::kHostNetwork}) {
    const std::string where = scope == SocketScope::kHostNetwork ? "host network" : "own namespace";
    Json r = UnderFilter(PlanSeccomp(true, scope), [](NotifyResponder& responder) {
      Json out;
      UniqueFd route(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE));
      out["route_errno"] = route.valid() ? 0 : errno;
      out["links"] = route.valid() ? DumpLinks(route.get()) : 0;
      out["route_dgram"] = SocketErrno(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE);
      out["audit"] = SocketErrno(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_AUDIT);
      out["sock_diag"] = SocketErrno(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
      out["netfilter"] = SocketErrno(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
      // Any other type is the kernel's to refuse, not the filter's.
      out["route_stream"] = SocketErrno(AF_NETLINK, SOCK_STREAM | SOCK_CLOEXEC, NETLINK_ROUTE);
      int socket_denials = 0;
      for (const NotifyRecord& record : responder.Take()) socket_denials += record.denial == "socket";
      out["socket_denials"] = socket_denials;
      return out;
    });
    ASSERT_FALSE(r.contains("child")) << where << ": " << r.dump();
    EXPECT_EQ(r["route_errno"], 0) << where << ": " << std::strerror(r["route_errno"].get<int>());
    EXPECT_GE(r["links"].get<int>(), 1) << where << ": RTM_GETLINK dump: " << r.dump();
    EXPECT_EQ(r["route_dgram"], 0) << where << ": " << r.dump();
    EXPECT_EQ(r["audit"], EPERM) << where << ": " << r.dump();
    EXPECT_EQ(r["sock_diag"], EPERM) << where << ": " << r.dump();
    EXPECT_EQ(r["netfilter"], EPERM) << where << ": " << r.dump();
    EXPECT_EQ(r["route_stream"], ESOCKTNOSUPPORT) << where << ": " << r.dump();
    EXPECT_EQ(r["socket_denials"], 3) << where << ": " << r.dump();
  }
}

}  // namespace
}  // namespace agentbox::linux
