#include "supervise/broker.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <utility>

#include "linux/connect_broker.h"

namespace agentbox::supervise {

namespace asio = boost::asio;
using boost::system::error_code;
using linux::BrokerReply;
using linux::BrokerRequest;
using linux::UniqueFd;

namespace {

std::string Target(const std::string& host, std::uint16_t port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// The options a program sets before connect() that shape the connection:
// copied from its own socket onto the one opened for it, where they differ
// from a fresh socket's (so that nothing the kernel picked is pinned).
struct IntOption {
  int level, name;
  bool halved;  // the kernel reports twice what was set (SO_RCVBUF, SO_SNDBUF)
};
constexpr IntOption kIntOptions[] = {
    {SOL_SOCKET, SO_KEEPALIVE, false},      {SOL_SOCKET, SO_RCVBUF, true},
    {SOL_SOCKET, SO_SNDBUF, true},          {SOL_SOCKET, SO_PRIORITY, false},
    {SOL_SOCKET, SO_RCVLOWAT, false},       {SOL_SOCKET, SO_OOBINLINE, false},
    {SOL_SOCKET, SO_REUSEADDR, false},      {IPPROTO_TCP, TCP_NODELAY, false},
    {IPPROTO_TCP, TCP_KEEPIDLE, false},     {IPPROTO_TCP, TCP_KEEPINTVL, false},
    {IPPROTO_TCP, TCP_KEEPCNT, false},      {IPPROTO_TCP, TCP_USER_TIMEOUT, false},
    {IPPROTO_TCP, TCP_MAXSEG, false},       {IPPROTO_TCP, TCP_CORK, false},
    {IPPROTO_TCP, TCP_SYNCNT, false},       {IPPROTO_TCP, TCP_WINDOW_CLAMP, false},
    {IPPROTO_TCP, TCP_NOTSENT_LOWAT, false}, {IPPROTO_TCP, TCP_FASTOPEN_CONNECT, false},
    {IPPROTO_TCP, TCP_QUICKACK, false},
};
constexpr IntOption kV4Options[] = {{IPPROTO_IP, IP_TOS, false}, {IPPROTO_IP, IP_TTL, false}};
constexpr IntOption kV6Options[] = {{IPPROTO_IPV6, IPV6_V6ONLY, false},
                                    {IPPROTO_IPV6, IPV6_TCLASS, false},
                                    {IPPROTO_IPV6, IPV6_UNICAST_HOPS, false}};

void CopyIntOptions(int from, int fresh, int to, const IntOption* opts, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    int mine = 0, theirs = 0;
    socklen_t l1 = sizeof(mine), l2 = sizeof(theirs);
    if (getsockopt(from, opts[i].level, opts[i].name, &theirs, &l1) != 0) continue;
    if (getsockopt(fresh, opts[i].level, opts[i].name, &mine, &l2) == 0 && mine == theirs) continue;
    int value = opts[i].halved ? theirs / 2 : theirs;
    (void)setsockopt(to, opts[i].level, opts[i].name, &value, sizeof(value));
  }
}

void CopySocketOptions(int from, int to, int domain) {
  UniqueFd fresh(socket(domain, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fresh.valid()) return;
  CopyIntOptions(from, fresh.get(), to, kIntOptions, std::size(kIntOptions));
  if (domain == AF_INET) CopyIntOptions(from, fresh.get(), to, kV4Options, std::size(kV4Options));
  if (domain == AF_INET6) CopyIntOptions(from, fresh.get(), to, kV6Options, std::size(kV6Options));
  for (int name : {SO_RCVTIMEO, SO_SNDTIMEO}) {
    struct timeval tv {};
    socklen_t l = sizeof(tv);
    if (getsockopt(from, SOL_SOCKET, name, &tv, &l) == 0 && (tv.tv_sec || tv.tv_usec)) {
      (void)setsockopt(to, SOL_SOCKET, name, &tv, sizeof(tv));
    }
  }
  struct linger lg {};
  socklen_t l = sizeof(lg);
  if (getsockopt(from, SOL_SOCKET, SO_LINGER, &lg, &l) == 0 && lg.l_onoff) {
    (void)setsockopt(to, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
  }
  char cc[32] = {}, fresh_cc[32] = {};
  socklen_t c1 = sizeof(cc), c2 = sizeof(fresh_cc);
  if (getsockopt(from, IPPROTO_TCP, TCP_CONGESTION, cc, &c1) == 0 &&
      getsockopt(fresh.get(), IPPROTO_TCP, TCP_CONGESTION, fresh_cc, &c2) == 0 && std::strcmp(cc, fresh_cc) != 0) {
    (void)setsockopt(to, IPPROTO_TCP, TCP_CONGESTION, cc, static_cast<socklen_t>(strnlen(cc, sizeof(cc))));
  }
}

// The target of a request as an address and a port; nullopt for anything
// but a complete sockaddr_in / sockaddr_in6.
std::optional<std::pair<net::IpAddress, std::uint16_t>> TargetOf(const BrokerRequest& r) {
  if (r.addr.ss_family == AF_INET && r.addr_len >= sizeof(sockaddr_in)) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&r.addr);
    return std::make_pair(net::IpAddress::V4(ntohl(in->sin_addr.s_addr)), ntohs(in->sin_port));
  }
  if (r.addr.ss_family == AF_INET6 && r.addr_len >= sizeof(sockaddr_in6)) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&r.addr);
    net::IpAddress a;
    a.v6 = true;
    std::memcpy(a.bytes.data(), &in6->sin6_addr, 16);
    return std::make_pair(a.Unmapped(), ntohs(in6->sin6_port));
  }
  return std::nullopt;
}

}  // namespace

BrokerDecision DecideConnect(const net::RuleSet& rules, const net::AddressBook& book,
                             const std::unordered_set<std::string>& approved, const net::IpAddress& address,
                             std::uint16_t port) {
  using net::Decision;
  using net::DenyReason;
  using net::Verdict;
  const net::IpAddress a = address.Unmapped();
  std::optional<BrokerDecision> refusal;
  for (const auto& name : book.NamesFor(a)) {
    Decision d = rules.Decide(name, port);
    if (d.verdict == Verdict::kUnknown && approved.count(name)) d = Decision::Allow("on_unknown_domain: ask");
    if (d.verdict == Verdict::kAllow) {
      Decision c = rules.CheckAddress(name, d, a, port);
      if (c.verdict == Verdict::kAllow) return {c, name};
      if (!refusal) refusal = BrokerDecision{c, name};
    } else if (!refusal) {
      d.verdict = Verdict::kDeny;
      refusal = BrokerDecision{d, name};
    }
  }
  // An IP or CIDR entry speaks for the address whatever name it came by.
  const std::string literal = a.ToString();
  Decision d = rules.Decide(literal, port);
  if (d.verdict == Verdict::kAllow) {
    Decision c = rules.CheckAddress(literal, d, a, port);
    if (c.verdict == Verdict::kAllow || !refusal) return {c, literal};
  }
  if (refusal) return *refusal;
  if (d.verdict == Verdict::kUnknown) {
    d = Decision::Deny(DenyReason::kNotAllowed, d.rule,
                       Target(literal, port) + " is not in network.allow, and no name the sandbox resolved has "
                                               "this address");
  }
  return {d, literal};
}

struct ConnectBroker::Impl : std::enable_shared_from_this<ConnectBroker::Impl> {
  Impl(asio::io_context& io, UniqueFd channel, BrokerDeps deps)
      : io(io), channel(io), deps(std::move(deps)) {
    this->channel.assign(channel.release());
    this->channel.non_blocking(true);
  }

  void Read();
  void Handle(const BrokerRequest& r, UniqueFd caller);
  void Open(const BrokerRequest& r, UniqueFd caller, const BrokerDecision& d, const net::IpAddress& address,
            std::uint16_t port);
  void Reply(std::uint64_t id, int error, UniqueFd fd = {});
  void Flush();
  void RecordConnect(const BrokerDecision& d, const net::IpAddress& address, std::uint16_t port,
                     const std::string& decision, const std::string& reason, const std::string& message);

  void Preresolve();
  void Ready();

  asio::io_context& io;
  asio::posix::stream_descriptor channel;
  BrokerDeps deps;
  bool stopped = false;
  // Until the names in deps.preresolve are known, requests wait here.
  bool ready = true;
  std::size_t resolving = 0;
  std::deque<std::pair<BrokerRequest, UniqueFd>> waiting;
  std::unique_ptr<asio::steady_timer> preresolve_timer;
  bool writing = false;
  std::deque<std::pair<BrokerReply, UniqueFd>> out;
  // The direct connections handed over (oldest first, at most
  // kInstalledKept): the sandbox's sockets now, known by inode, so that a
  // change of the rules can end those it no longer allows (Revoke).
  struct Installed {
    std::uint64_t inode;
    std::string host;
    net::IpAddress address;
    std::uint16_t port;
  };
  std::deque<Installed> installed;
};

constexpr std::size_t kInstalledKept = 4096;

void ConnectBroker::Impl::Read() {
  channel.async_wait(asio::posix::stream_descriptor::wait_read, [self = shared_from_this()](error_code ec) {
    if (self->stopped || ec) return;
    for (;;) {
      BrokerRequest r;
      std::vector<UniqueFd> fds;
      const ssize_t n = linux::RecvWithFds(self->channel.native_handle(), &r, sizeof(r), MSG_DONTWAIT, &fds);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n <= 0) return;  // the runner is gone
      if (static_cast<std::size_t>(n) != sizeof(r)) continue;
      if (fds.size() != 1) {
        self->Reply(r.id, EBADF);  // never left waiting
        continue;
      }
      if (!self->ready) {
        self->waiting.emplace_back(r, std::move(fds[0]));
        continue;
      }
      self->Handle(r, std::move(fds[0]));
    }
    self->Read();
  });
}

// How long requests wait for the names of network.allow to be resolved.
constexpr std::chrono::seconds kPreresolveWait{5};

void ConnectBroker::Impl::Preresolve() {
  if (deps.preresolve.empty() || !deps.resolver) return;
  ready = false;
  resolving = deps.preresolve.size();
  preresolve_timer = std::make_unique<asio::steady_timer>(io, kPreresolveWait);
  preresolve_timer->async_wait([self = shared_from_this()](error_code ec) {
    if (!ec) self->Ready();
  });
  for (const auto& name : deps.preresolve) {
    deps.resolver->Resolve(name, [self = shared_from_this(), name](Result<std::vector<net::IpAddress>> r) {
      if (r.ok()) self->deps.book->Add(name, *r);
      if (self->resolving > 0 && --self->resolving == 0) self->Ready();
    });
  }
}

void ConnectBroker::Impl::Ready() {
  if (ready) return;
  ready = true;
  if (preresolve_timer) preresolve_timer->cancel();
  while (!waiting.empty() && !stopped) {
    auto [r, fd] = std::move(waiting.front());
    waiting.pop_front();
    Handle(r, std::move(fd));
  }
}

void ConnectBroker::Impl::RecordConnect(const BrokerDecision& d, const net::IpAddress& address, std::uint16_t port,
                                        const std::string& decision, const std::string& reason,
                                        const std::string& message) {
  if (!deps.sink) return;
  net::ConnectionRecord rec;
  rec.protocol = "connect";
  rec.host = d.host;
  rec.port = port;
  rec.address = address.ToString();
  rec.decision = decision;
  rec.rule = d.decision.rule;
  rec.reason = reason;
  rec.message = message;
  deps.sink->Record(rec);
}

std::vector<std::uint64_t> ConnectBroker::Revoke() {
  std::vector<std::uint64_t> out;
  auto& list = impl_->installed;
  for (auto it = list.begin(); it != list.end();) {
    const BrokerDecision d = DecideConnect(*impl_->deps.rules, *impl_->deps.book, *impl_->deps.approved, it->address,
                                           it->port);
    if (d.decision.verdict == net::Verdict::kAllow) {
      ++it;
      continue;
    }
    out.push_back(it->inode);
    it = list.erase(it);
  }
  return out;
}

void ConnectBroker::Impl::Handle(const BrokerRequest& r, UniqueFd caller) {
  const auto target = TargetOf(r);
  if (!target || (r.domain != AF_INET && r.domain != AF_INET6)) return Reply(r.id, EAFNOSUPPORT);
  const auto& [address, port] = *target;
  BrokerDecision d = DecideConnect(*deps.rules, *deps.book, *deps.approved, address, port);
  if (d.decision.verdict != net::Verdict::kAllow) {
    RecordConnect(d, address, port, "deny", ToString(d.decision.reason), d.decision.message);
    return Reply(r.id, ECONNREFUSED);
  }
  Open(r, std::move(caller), d, address, port);
}

void ConnectBroker::Impl::Open(const BrokerRequest& r, UniqueFd caller, const BrokerDecision& d,
                               const net::IpAddress& address, std::uint16_t port) {
  const bool relay = deps.relay && deps.relay(d.host) && deps.proxy && deps.adopt_port;
  UniqueFd sock(socket(r.domain, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!sock.valid()) return Reply(r.id, errno);
  sockaddr_storage to = r.addr;
  socklen_t to_len = r.addr_len;
  if (relay) {
    // To the proxy's kAdopted listener, from a port announced first.
    sockaddr_storage local{};
    socklen_t local_len;
    if (r.domain == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(&local);
      in->sin_family = AF_INET;
      in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      local_len = sizeof(sockaddr_in);
    } else {
      int off = 0;
      (void)setsockopt(sock.get(), IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&local);
      in6->sin6_family = AF_INET6;
      inet_pton(AF_INET6, "::ffff:127.0.0.1", &in6->sin6_addr);
      local_len = sizeof(sockaddr_in6);
    }
    to = local;
    to_len = local_len;
    if (r.domain == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&to)->sin_port = htons(deps.adopt_port);
    } else {
      reinterpret_cast<sockaddr_in6*>(&to)->sin6_port = htons(deps.adopt_port);
    }
    if (bind(sock.get(), reinterpret_cast<sockaddr*>(&local), local_len) != 0) return Reply(r.id, errno);
    socklen_t got = sizeof(local);
    if (getsockname(sock.get(), reinterpret_cast<sockaddr*>(&local), &got) != 0) return Reply(r.id, errno);
    const std::uint16_t from = ntohs(r.domain == AF_INET ? reinterpret_cast<sockaddr_in*>(&local)->sin_port
                                                         : reinterpret_cast<sockaddr_in6*>(&local)->sin6_port);
    deps.proxy->Expect(from, net::AdoptedTarget{d.host, port, address, d.decision.rule});
    int one = 1;
    (void)setsockopt(sock.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  } else {
    CopySocketOptions(caller.get(), sock.get(), r.domain);
  }
  const int rc = connect(sock.get(), reinterpret_cast<sockaddr*>(&to), to_len);
  const int err = rc == 0 ? 0 : errno;
  if (err != 0 && err != EINPROGRESS) {
    if (!relay) RecordConnect(d, address, port, "error", "connect-failed", std::strerror(err));
    return Reply(r.id, err);
  }
  if (!relay) {
    RecordConnect(d, address, port, "allow", "", "");
    struct stat st {};
    if (fstat(sock.get(), &st) == 0) {
      installed.push_back({static_cast<std::uint64_t>(st.st_ino), d.host, address, port});
      if (installed.size() > kInstalledKept) installed.pop_front();
    }
  }
  if (err == 0 || r.nonblock) {
    // Non-blocking callers see what a connect of their own would: the
    // socket in progress, EINPROGRESS, and poll() for the rest.
    if (!r.nonblock) {
      const int flags = fcntl(sock.get(), F_GETFL);
      if (flags >= 0) (void)fcntl(sock.get(), F_SETFL, flags & ~O_NONBLOCK);
    }
    return Reply(r.id, err, std::move(sock));
  }
  // A blocking caller waits for the handshake; for as long as its send
  // timeout says, as its own connect would.
  struct timeval tv {};
  socklen_t tl = sizeof(tv);
  const bool timed = getsockopt(caller.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, &tl) == 0 && (tv.tv_sec || tv.tv_usec);
  auto wait = std::make_shared<asio::posix::stream_descriptor>(io, sock.release());
  auto timer = std::make_shared<asio::steady_timer>(io);
  if (timed) {
    timer->expires_after(std::chrono::seconds(tv.tv_sec) + std::chrono::microseconds(tv.tv_usec));
    timer->async_wait([wait](error_code ec) {
      if (!ec) wait->cancel();
    });
  }
  wait->async_wait(asio::posix::stream_descriptor::wait_write,
                   [self = shared_from_this(), wait, timer, id = r.id](error_code ec) {
                     timer->cancel();
                     UniqueFd fd(wait->release());
                     if (self->stopped) return;
                     if (ec) return self->Reply(id, EINPROGRESS);  // the send timeout passed, as connect(2) says
                     int so_error = 0;
                     socklen_t el = sizeof(so_error);
                     if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &el) != 0) so_error = errno;
                     if (so_error != 0) return self->Reply(id, so_error);
                     const int flags = fcntl(fd.get(), F_GETFL);
                     if (flags >= 0) (void)fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
                     self->Reply(id, 0, std::move(fd));
                   });
}

void ConnectBroker::Impl::Reply(std::uint64_t id, int error, UniqueFd fd) {
  BrokerReply reply;
  reply.id = id;
  reply.error = error;
  reply.has_fd = fd.valid();
  out.emplace_back(reply, std::move(fd));
  Flush();
}

void ConnectBroker::Impl::Flush() {
  while (!out.empty() && !writing) {
    auto& [reply, fd] = out.front();
    const int f = fd.get();
    if (!linux::SendWithFds(channel.native_handle(), &reply, sizeof(reply), &f, fd.valid() ? 1 : 0)) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        writing = true;
        channel.async_wait(asio::posix::stream_descriptor::wait_write, [self = shared_from_this()](error_code ec) {
          self->writing = false;
          if (!ec && !self->stopped) self->Flush();
        });
        return;
      }
      out.clear();  // the runner is gone
      return;
    }
    out.pop_front();
  }
}

ConnectBroker::ConnectBroker(asio::io_context& io, UniqueFd channel, BrokerDeps deps)
    : impl_(std::make_shared<Impl>(io, std::move(channel), std::move(deps))) {}

ConnectBroker::~ConnectBroker() { Stop(); }

void ConnectBroker::Start() {
  impl_->Preresolve();
  impl_->Read();
}

void ConnectBroker::Stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  error_code ec;
  impl_->channel.cancel(ec);
  impl_->channel.close(ec);
  impl_->out.clear();
  impl_->waiting.clear();
  if (impl_->preresolve_timer) impl_->preresolve_timer->cancel();
}

}  // namespace agentbox::supervise
