#include "linux/seccomp_notify.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/seccomp.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <seccomp.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "linux/compat.h"
#include "linux/connect_broker.h"
#include "linux/descendants.h"

namespace agentbox::linux {

struct NotifyResponder::State {
  UnixConnectRules rules;
  InetConnectRules inet;
  // Broker requests sent and not yet answered, by notification id: where
  // the socket goes in the caller's table, and its close-on-exec flag.
  struct Pending {
    int fd = -1;
    bool cloexec = false;
  };
  std::mutex broker_mu;
  std::unordered_map<std::uint64_t, Pending> pending;
  // How a socket the broker installed (the host's) is told from one of the
  // sandbox's own: its network namespace's cookie (SO_NETNS_COOKIE, Linux
  // 5.14) is not the sandbox's. 0: no cookie on this kernel; then the
  // inodes of the sockets installed are remembered instead.
  std::uint64_t own_netns_cookie = 0;
  std::unordered_set<std::uint64_t> installed;
  // The thread that takes the supervisor's replies: started by the first
  // request (most sandboxes make none), from the answering thread, so
  // outside the filter too. Touched by that thread only.
  bool replies_started = false;
  UniqueFd ready;
  std::mutex mu;
  std::condition_variable cv;
  int listener = -1;
  std::vector<NotifyRecord> records;
  std::atomic<int> workers{0};
};

namespace {

constexpr const char kUnixConnectPrefix[] = "connect unix:";
constexpr const char kSetIdPrefix[] = "set-id ";
constexpr const char kNetworkPrefix[] = "net ";
// Records waiting for the runner's loop; past this a flood of denied calls
// is still denied, only no longer counted one by one.
constexpr std::size_t kMaxRecords = 1 << 16;
// Blocking connects in flight, each on a thread of its own.
constexpr int kMaxWorkers = 64;
// How long a connect still under way is waited for before it gets a thread.
constexpr int kInlineWaitMs = 2;

void Respond(int listener, std::uint64_t id, int error) {
  struct seccomp_notif_resp resp;
  std::memset(&resp, 0, sizeof(resp));
  resp.id = id;
  resp.error = error;
  // ENOENT: the caller was killed while waiting; nothing to answer.
  (void)ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, &resp);
}

void Record(NotifyResponder::State& st, pid_t pid, std::string denial) {
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.records.size() >= kMaxRecords) return;
    st.records.push_back({pid, getsid(pid), std::move(denial)});
  }
  const std::uint64_t one = 1;
  (void)!write(st.ready.get(), &one, sizeof(one));
}

std::string SyscallName(const struct seccomp_data& data) {
  std::string name;
  if (char* n = seccomp_syscall_resolve_num_arch(data.arch, data.nr)) {
    name = n;
    std::free(n);
  } else {
    name = "syscall " + std::to_string(data.nr);
  }
  return name;
}

// Where the kernel keeps an inode: its superblock's device (major, minor)
// and its inode number, as sock_diag reports a bound socket's. stat(2)
// will not do: overlayfs reports another filesystem's device and inode.
struct KernelInode {
  unsigned major = 0, minor = 0;
  std::uint64_t ino = 0;
  bool operator==(const KernelInode&) const = default;
};

std::optional<KernelInode> IdentityOf(int fd) {
  std::ifstream info("/proc/self/fdinfo/" + std::to_string(fd));
  std::string key;
  long mnt_id = -1;
  std::uint64_t ino = 0;
  bool have_ino = false;
  while (info >> key) {
    if (key == "mnt_id:") info >> mnt_id;
    else if (key == "ino:") have_ino = static_cast<bool>(info >> ino);
    else info.ignore(4096, '\n');
  }
  if (mnt_id < 0 || !have_ino) return std::nullopt;
  std::ifstream mounts("/proc/self/mountinfo");
  std::string line;
  while (std::getline(mounts, line)) {
    std::istringstream in(line);
    long id = -1, parent = -1;
    std::string dev;
    if (!(in >> id >> parent >> dev) || id != mnt_id) continue;
    unsigned major = 0, minor = 0;
    if (std::sscanf(dev.c_str(), "%u:%u", &major, &minor) != 2) return std::nullopt;
    return KernelInode{major, minor, ino};
  }
  return std::nullopt;
}

// The socket inodes of the listening unix sockets bound to `node`, in this
// network namespace (sock_diag).
std::vector<std::uint32_t> ListenersBoundTo(const KernelInode& node) {
  std::vector<std::uint32_t> out;
  UniqueFd nl(socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!nl.valid()) return out;
  struct {
    struct nlmsghdr nlh;
    struct unix_diag_req req;
  } msg;
  std::memset(&msg, 0, sizeof(msg));
  msg.nlh.nlmsg_len = sizeof(msg);
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  msg.req.sdiag_family = AF_UNIX;
  msg.req.udiag_states = 1u << 10;  // TCP_LISTEN
  msg.req.udiag_show = UDIAG_SHOW_VFS;
  if (send(nl.get(), &msg, sizeof(msg), 0) != static_cast<ssize_t>(sizeof(msg))) return out;
  alignas(struct nlmsghdr) char buf[32768];
  for (;;) {
    ssize_t n = recv(nl.get(), buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return out;
    for (auto* h = reinterpret_cast<struct nlmsghdr*>(buf); NLMSG_OK(h, static_cast<unsigned>(n));
         h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) return out;
      auto* m = static_cast<struct unix_diag_msg*>(NLMSG_DATA(h));
      int len = static_cast<int>(h->nlmsg_len - NLMSG_LENGTH(sizeof(*m)));
      for (auto* a = reinterpret_cast<struct rtattr*>(m + 1); RTA_OK(a, len); a = RTA_NEXT(a, len)) {
        if (a->rta_type != UNIX_DIAG_VFS || RTA_PAYLOAD(a) < sizeof(struct unix_diag_vfs)) continue;
        struct unix_diag_vfs vfs;
        std::memcpy(&vfs, RTA_DATA(a), sizeof(vfs));
        // The kernel's own dev_t: 12 bits of major above 20 of minor.
        const KernelInode bound{vfs.udiag_vfs_dev >> 20, vfs.udiag_vfs_dev & 0xfffff, vfs.udiag_vfs_ino};
        if (bound == node) out.push_back(m->udiag_ino);
      }
    }
  }
}

// The decision on a connect() to the pathname socket `path`, looked up as
// the caller would: from its working directory, and from a root that must
// be ours. `node` receives the socket's inode to connect through.
struct Decision {
  int err = 0;          // non-zero: answer this errno (the lookup failed as the caller's would)
  bool refused = false; // outside the sandbox and not named by the policy
};

Decision DecideUnix(const UnixConnectRules& rules, pid_t pid, const std::string& path, UniqueFd* node) {
  const std::string proc = "/proc/" + std::to_string(pid);
  struct stat ours {}, theirs {};
  if (stat("/", &ours) != 0 || stat((proc + "/root").c_str(), &theirs) != 0 || ours.st_dev != theirs.st_dev ||
      ours.st_ino != theirs.st_ino) {
    return {0, true};  // a caller with a root of its own (or gone): nothing to look up safely
  }
  UniqueFd cwd(open((proc + "/cwd").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!cwd.valid()) return {0, true};
  // O_PATH opens nothing: a FIFO or a device is not touched.
  node->reset(openat(cwd.get(), path.c_str(), O_PATH | O_CLOEXEC));
  if (!node->valid()) return {errno, false};
  struct stat st {};
  if (fstat(node->get(), &st) != 0) return {errno, false};
  if (!S_ISSOCK(st.st_mode)) return {ECONNREFUSED, false};
  const auto id = IdentityOf(node->get());
  if (!id) return {0, true};
  for (const auto& allowed : rules.allowed) {
    UniqueFd a(open(allowed.c_str(), O_PATH | O_CLOEXEC));
    if (a.valid() && IdentityOf(a.get()) == id) return {};
  }
  const auto listeners = ListenersBoundTo(*id);
  // Landlock-only: a listener is the sandbox's when a process below the runner holds it.
  if (!listeners.empty() &&
      (rules.private_netns ||
       HeldByDescendant(getpid(), std::vector<std::uint64_t>(listeners.begin(), listeners.end())))) {
    return {};
  }
  return {0, true};
}

// A NUL-terminated string from the caller's memory, for the report only
// (what is denied is decided by the filter, not by this copy).
std::string ReadString(pid_t pid, std::uint64_t address) {
  std::string out;
  char buf[256];
  while (address != 0 && out.size() < 4096) {
    // Never across a page boundary in one read: the next page may be unmapped.
    const std::size_t room = 4096 - (address % 4096);
    const std::size_t want = std::min(sizeof(buf), room);
    struct iovec local = {buf, want};
    struct iovec remote = {reinterpret_cast<void*>(address), want};
    const ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n <= 0) break;
    const std::size_t len = strnlen(buf, static_cast<std::size_t>(n));
    out.append(buf, len);
    if (len < static_cast<std::size_t>(n)) break;
    address += static_cast<std::uint64_t>(n);
  }
  return out;
}

// "AF_INET SOCK_DGRAM", "AF_INET6 SOCK_STREAM protocol 132": an inet
// socket() as the report names it.
std::string InetSocketName(std::uint64_t family, std::uint64_t type, std::uint64_t protocol) {
  static const char* const kTypes[] = {"0", "SOCK_STREAM", "SOCK_DGRAM", "SOCK_RAW", "SOCK_RDM", "SOCK_SEQPACKET",
                                       "SOCK_DCCP", "7", "8", "9", "SOCK_PACKET"};
  const unsigned t = static_cast<unsigned>(type) & 0xf;
  std::string out = (static_cast<int>(family) == AF_INET6 ? "AF_INET6 " : "AF_INET ") +
                    std::string(t < std::size(kTypes) ? kTypes[t] : std::to_string(t).c_str());
  if (static_cast<int>(protocol) != 0) out += " protocol " + std::to_string(static_cast<int>(protocol));
  return out;
}

// The tally name of a denied call: its syscall's; for a call that set
// set-id bits, SetIdDenial with the path it named; on the host's network,
// an inet socket() as a network denial.
std::string DenialName(const NotifyResponder::State& st, const struct seccomp_notif& req) {
  const std::string name = SyscallName(req.data);
  const pid_t pid = static_cast<pid_t>(req.pid);
  const auto& a = req.data.args;
  if (req.data.arch != seccomp_arch_native()) return name;
  const int family = static_cast<int>(a[0]);
  if (st.inet.host_network && name == "socket" && (family == AF_INET || family == AF_INET6)) {
    return NetworkDenialName("socket", InetSocketName(a[0], a[1], a[2]));
  }
  const bool chmod = name == "chmod" || name == "fchmod" || name == "fchmodat" || name == "fchmodat2";
  const bool create = name == "open" || name == "openat" || name == "creat" || name == "mknod" ||
                      name == "mknodat" || name == "mkdir" || name == "mkdirat";
  if (!chmod && !create) return name;
  std::string path;
  if (name == "fchmod") {
    char link[4096];
    const std::string fd = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(static_cast<int>(a[0]));
    const ssize_t n = readlink(fd.c_str(), link, sizeof(link));
    if (n > 0) path.assign(link, static_cast<std::size_t>(n));
  } else {
    const bool at = name == "fchmodat" || name == "fchmodat2" || name == "openat" || name == "mknodat" ||
                    name == "mkdirat";
    path = ReadString(pid, at ? a[1] : a[0]);
  }
  return SetIdDenial(chmod ? "chmod" : "create", path.empty() ? "(unknown path)" : path);
}

// Whether an inet connect() to `addr` may go ahead on the host's network:
// only to 127.0.0.1 (plain or IPv4-mapped) on one of the allowed ports, or
// AF_UNSPEC (which dissolves an association and reaches nothing). `target`
// receives the address as the report names it.
bool InetAllowed(const InetConnectRules& rules, const struct sockaddr_storage& addr, int len, std::string* target) {
  if (len >= static_cast<int>(sizeof(sa_family_t)) && addr.ss_family == AF_UNSPEC) return true;
  char text[INET6_ADDRSTRLEN] = "";
  std::uint16_t port = 0;
  bool loopback = false;
  if (addr.ss_family == AF_INET && len >= static_cast<int>(sizeof(struct sockaddr_in))) {
    const auto* in = reinterpret_cast<const struct sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    port = ntohs(in->sin_port);
    loopback = ntohl(in->sin_addr.s_addr) == INADDR_LOOPBACK;
    *target = std::string(text) + ":" + std::to_string(port);
  } else if (addr.ss_family == AF_INET6 && len >= static_cast<int>(sizeof(struct sockaddr_in6))) {
    const auto* in6 = reinterpret_cast<const struct sockaddr_in6*>(&addr);
    port = ntohs(in6->sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      // Named by the IPv4 address it carries, as the kernel routes it.
      inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], text, sizeof(text));
      loopback = std::string(text) == "127.0.0.1";
      *target = std::string(text) + ":" + std::to_string(port);
    } else {
      inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
      *target = "[" + std::string(text) + "]:" + std::to_string(port);
    }
  } else {
    *target = "(an address of family " + std::to_string(addr.ss_family) + ", " + std::to_string(len) + " bytes)";
    return false;
  }
  return loopback && std::find(rules.loopback_ports.begin(), rules.loopback_ports.end(), port) !=
                         rules.loopback_ports.end();
}

// The caller's descriptor `fd`, duplicated here (pidfd_getfd). Invalid
// once the notification is dealt with: answered with the error, or no
// longer pending (the caller was killed or interrupted: nothing to answer).
UniqueFd CallerFd(int listener, const struct seccomp_notif& req, int fd) {
  UniqueFd pidfd(OpenThreadPidfd(static_cast<pid_t>(req.pid)));
  int err = errno;
  UniqueFd copy;
  if (pidfd.valid()) {
    copy.reset(PidfdGetfd(pidfd.get(), fd));
    err = errno;
  }
  // The id may have been reused between the notification and the open:
  // the notification still pending proves the pidfd is the caller's.
  std::uint64_t id = req.id;
  if (ioctl(listener, SECCOMP_IOCTL_NOTIF_ID_VALID, &id) != 0) return {};
  if (!copy.valid()) Respond(listener, req.id, pidfd.valid() && err == EBADF ? -EBADF : -EPERM);
  return copy;
}

bool IsInetFamily(const struct sockaddr_storage& addr, int len) {
  return len >= static_cast<int>(sizeof(sa_family_t)) && (addr.ss_family == AF_INET || addr.ss_family == AF_INET6);
}

// The sandbox's own namespace: its loopback (127/8, ::1, and those as
// v4-mapped) and the unspecified address, which means the local host.
bool IsOwnLoopback(const struct sockaddr_storage& addr, int len) {
  if (addr.ss_family == AF_INET && len >= static_cast<int>(sizeof(struct sockaddr_in))) {
    const std::uint32_t a = ntohl(reinterpret_cast<const struct sockaddr_in*>(&addr)->sin_addr.s_addr);
    return (a >> 24) == 127 || a == 0;
  }
  if (addr.ss_family == AF_INET6 && len >= static_cast<int>(sizeof(struct sockaddr_in6))) {
    const auto& a6 = reinterpret_cast<const struct sockaddr_in6*>(&addr)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&a6) || IN6_IS_ADDR_UNSPECIFIED(&a6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&a6)) return a6.s6_addr[12] == 127 || (a6.s6_addr[12] | a6.s6_addr[13] | a6.s6_addr[14] | a6.s6_addr[15]) == 0;
  }
  return false;
}

enum class InetRoute {
  kHere,          // made here, on the caller's socket, as asked
  kBroker,        // decided by the supervisor, which opens the connection
  kUnreachable,   // UDP (or another datagram protocol) past the sandbox's own loopback
  kNotSupported,  // disconnecting a socket the broker installed
  kIsConnected,   // a socket the broker connected, connected again: EISCONN
  kAlready,       // the same, its handshake still under way: EALREADY
  kRefuse,        // the host's network, no broker: only the proxy's ports; or the host's loopback
};

// Whether `sock` is the host's (one the broker installed) rather than one of
// the sandbox's own namespace.
bool IsHostSocket(NotifyResponder::State& st, int sock) {
  if (st.own_netns_cookie != 0) {
    std::uint64_t cookie = 0;
    socklen_t cl = sizeof(cookie);
    return getsockopt(sock, SOL_SOCKET, SO_NETNS_COOKIE, &cookie, &cl) != 0 || cookie != st.own_netns_cookie;
  }
  struct stat sst {};
  if (fstat(sock, &sst) != 0) return true;
  std::lock_guard<std::mutex> lock(st.broker_mu);
  return st.installed.count(sst.st_ino) > 0;
}

// TCP's state of `sock` (TCP_CLOSE when it cannot be read).
int TcpState(int sock) {
  struct tcp_info info {};
  socklen_t il = sizeof(info);
  return getsockopt(sock, IPPROTO_TCP, TCP_INFO, &info, &il) == 0 ? static_cast<int>(info.tcpi_state) : static_cast<int>(TCP_CLOSE);
}

// Where an inet connect() goes.
//
// A socket the broker installed belongs to the host's network. Connected
// or connecting, it is answered here as the kernel would answer (EISCONN,
// EALREADY), never by a connect() on it, whose handshake could fail
// meanwhile and leave it free to go elsewhere; never disconnected
// (AF_UNSPEC); never sent to a loopback address, which would be the
// host's. One whose handshake failed (TCP_CLOSE) gets a new connection,
// decided. On the host's network every socket is the host's, Landlock
// fences the runner's own connect()s, and a connected or connecting socket
// is left to the kernel's answer.
InetRoute ChooseInet(NotifyResponder::State& st, int sock, const struct sockaddr_storage& addr, int len) {
  if (st.inet.broker_fd >= 0 && !st.inet.host_network && IsHostSocket(st, sock)) {
    if (!IsInetFamily(addr, len)) return InetRoute::kNotSupported;
    const int state = TcpState(sock);
    if (state == TCP_SYN_SENT) return InetRoute::kAlready;
    if (state != TCP_CLOSE) return InetRoute::kIsConnected;
    if (IsOwnLoopback(addr, len)) return InetRoute::kRefuse;
    return InetRoute::kBroker;
  }
  if (st.inet.broker_fd >= 0 && st.inet.host_network && IsInetFamily(addr, len) && TcpState(sock) != TCP_CLOSE) {
    return InetRoute::kHere;
  }
  if (!IsInetFamily(addr, len)) return InetRoute::kHere;  // AF_UNSPEC: a disconnect; anything else: the kernel's EAFNOSUPPORT
  // Too short for its family: the kernel's EINVAL, on the caller's own socket.
  if (len < static_cast<int>(addr.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6))) {
    return InetRoute::kHere;
  }
  if (st.inet.host_network) {
    std::string ignored;
    if (InetAllowed(st.inet, addr, len, &ignored)) return InetRoute::kHere;
    if (st.inet.broker_fd < 0) return InetRoute::kRefuse;
  } else if (st.inet.broker_fd < 0 || IsOwnLoopback(addr, len)) {
    return InetRoute::kHere;
  }
  int type = 0;
  socklen_t tl = sizeof(type);
  if (getsockopt(sock, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM) {
    // Only TCP is brokered; UDP leaves the sandbox as DNS to the
    // supervisor alone (getaddrinfo's address sorting connects UDP sockets
    // to every answer, so this is no denial of its own).
    return st.inet.host_network ? InetRoute::kRefuse : InetRoute::kUnreachable;
  }
  return InetRoute::kBroker;
}

// The caller's descriptor flags (FD_CLOEXEC): fdinfo's "flags:" carries
// O_CLOEXEC for it.
bool CallerCloexec(pid_t pid, int fd) {
  std::ifstream info("/proc/" + std::to_string(pid) + "/fdinfo/" + std::to_string(fd));
  std::string key;
  while (info >> key) {
    if (key == "flags:") {
      std::string octal;
      info >> octal;
      return (std::strtoul(octal.c_str(), nullptr, 8) & O_CLOEXEC) != 0;
    }
    info.ignore(4096, '\n');
  }
  return false;
}

void BrokerReplies(std::shared_ptr<NotifyResponder::State> st);

// Sends the connect() to the supervisor; its reply (BrokerReplies) answers
// the call. The caller's socket goes along for its options.
void Broker(const std::shared_ptr<NotifyResponder::State>& st, int listener, const struct seccomp_notif& req,
            int sock, int domain, const struct sockaddr_storage& addr, int len) {
  if (!st->replies_started) {
    try {
      std::thread(BrokerReplies, st).detach();
      st->replies_started = true;
    } catch (const std::system_error&) {
      return Respond(listener, req.id, -EAGAIN);  // at the process limit, as a fork there
    }
  }
  BrokerRequest r;
  r.id = req.id;
  r.pid = static_cast<std::int32_t>(req.pid);
  r.domain = domain;
  const int flags = fcntl(sock, F_GETFL);
  if (flags < 0) return Respond(listener, req.id, -errno);
  r.nonblock = (flags & O_NONBLOCK) != 0;
  r.addr_len = static_cast<std::uint32_t>(len);
  std::memcpy(&r.addr, &addr, static_cast<std::size_t>(len));
  const int target = static_cast<int>(req.data.args[0]);
  {
    std::lock_guard<std::mutex> lock(st->broker_mu);
    st->pending[req.id] = {target, CallerCloexec(static_cast<pid_t>(req.pid), target)};
  }
  if (!SendWithFds(st->inet.broker_fd, &r, sizeof(r), &sock, 1)) {
    {
      std::lock_guard<std::mutex> lock(st->broker_mu);
      st->pending.erase(req.id);
    }
    Respond(listener, req.id, -ENETUNREACH);
  }
}

// The supervisor's answers to Broker(), on a thread of their own: a socket
// comes installed in the caller's table (in place of its own, at the same
// number) before connect() returns.
void BrokerReplies(std::shared_ptr<NotifyResponder::State> st) {
  int listener;
  {
    std::unique_lock<std::mutex> lock(st->mu);
    st->cv.wait(lock, [&] { return st->listener >= 0; });
    listener = st->listener;
  }
  for (;;) {
    BrokerReply reply;
    std::vector<UniqueFd> fds;
    const ssize_t n = RecvWithFds(st->inet.broker_fd, &reply, sizeof(reply), 0, &fds);
    if (n <= 0) return;  // the supervisor is gone, and with it the sandbox
    if (static_cast<std::size_t>(n) != sizeof(reply)) continue;
    NotifyResponder::State::Pending where;
    {
      std::lock_guard<std::mutex> lock(st->broker_mu);
      auto it = st->pending.find(reply.id);
      if (it == st->pending.end()) continue;
      where = it->second;
      st->pending.erase(it);
    }
    int error = reply.error;
    if (reply.has_fd && !fds.empty()) {
      struct seccomp_notif_addfd add;
      std::memset(&add, 0, sizeof(add));
      add.id = reply.id;
      add.flags = SECCOMP_ADDFD_FLAG_SETFD;
      add.srcfd = static_cast<std::uint32_t>(fds[0].get());
      add.newfd = static_cast<std::uint32_t>(where.fd);
      add.newfd_flags = where.cloexec ? O_CLOEXEC : 0;
      struct stat sst {};
      if (st->own_netns_cookie == 0 && fstat(fds[0].get(), &sst) == 0) {
        // Remembered before it is installed: the caller may connect it again
        // the moment it holds it.
        std::lock_guard<std::mutex> lock(st->broker_mu);
        st->installed.insert(sst.st_ino);
      }
      if (ioctl(listener, SECCOMP_IOCTL_NOTIF_ADDFD, &add) < 0) {
        if (errno == ENOENT) continue;  // the caller is gone or was interrupted
        error = ECONNABORTED;
      }
    }
    Respond(listener, reply.id, -error);
  }
}

// listen() on the host's network: refused on an inet socket (its autobind
// would take a port on every interface; Landlock checks bind() only), made
// here on the caller's socket otherwise.
void Listen(const std::shared_ptr<NotifyResponder::State>& st, int listener, const struct seccomp_notif& req) {
  const pid_t pid = static_cast<pid_t>(req.pid);
  UniqueFd sock = CallerFd(listener, req, static_cast<int>(req.data.args[0]));
  if (!sock.valid()) return;
  int domain = 0;
  socklen_t dlen = sizeof(domain);
  if (getsockopt(sock.get(), SOL_SOCKET, SO_DOMAIN, &domain, &dlen) != 0) return Respond(listener, req.id, -errno);
  bool refused = st->inet.host_network && (domain == AF_INET || domain == AF_INET6);
  if (!refused && st->inet.broker_fd >= 0 && (domain == AF_INET || domain == AF_INET6)) {
    refused = IsHostSocket(*st, sock.get());
  }
  if (refused) {
    Record(*st, pid, NetworkDenialName("listen", domain == AF_INET ? "AF_INET" : "AF_INET6"));
    return Respond(listener, req.id, -EACCES);
  }
  const int rc = listen(sock.get(), static_cast<int>(req.data.args[1]));
  Respond(listener, req.id, rc == 0 ? 0 : -errno);
}

void Connect(const std::shared_ptr<NotifyResponder::State>& st, int listener, const struct seccomp_notif& req) {
  const pid_t pid = static_cast<pid_t>(req.pid);
  const int fd = static_cast<int>(req.data.args[0]);
  // The kernel reads the length as an int and refuses more than a sockaddr_storage.
  const int len = static_cast<int>(req.data.args[2]);
  if (len < 0 || static_cast<std::size_t>(len) > sizeof(struct sockaddr_storage)) {
    return Respond(listener, req.id, -EINVAL);
  }
  struct sockaddr_storage addr;
  std::memset(&addr, 0, sizeof(addr));
  if (len > 0) {
    struct iovec local = {&addr, static_cast<std::size_t>(len)};
    struct iovec remote = {reinterpret_cast<void*>(req.data.args[1]), static_cast<std::size_t>(len)};
    const ssize_t got = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got < 0 && (errno == EPERM || errno == EACCES)) {
      // A caller that made itself non-dumpable cannot be looked at, and
      // letting its call through unseen would let anyone do the same.
      Record(*st, pid, "connect");
      return Respond(listener, req.id, -EPERM);
    }
    if (got != len) return Respond(listener, req.id, -EFAULT);
  }
  UniqueFd sock = CallerFd(listener, req, fd);
  if (!sock.valid()) return;
  int domain = 0;
  socklen_t dlen = sizeof(domain);
  if (getsockopt(sock.get(), SOL_SOCKET, SO_DOMAIN, &domain, &dlen) != 0) {
    return Respond(listener, req.id, -errno);
  }
  if (domain == AF_INET || domain == AF_INET6) {
    switch (ChooseInet(*st, sock.get(), addr, len)) {
      case InetRoute::kHere:
        break;
      case InetRoute::kBroker:
        return Broker(st, listener, req, sock.get(), domain, addr, len);
      case InetRoute::kUnreachable:
        return Respond(listener, req.id, -ENETUNREACH);  // what the sandbox's own namespace answers
      case InetRoute::kNotSupported:
        return Respond(listener, req.id, -EOPNOTSUPP);
      case InetRoute::kIsConnected:
        return Respond(listener, req.id, -EISCONN);
      case InetRoute::kAlready:
        return Respond(listener, req.id, -EALREADY);
      case InetRoute::kRefuse: {
        std::string target;
        (void)InetAllowed(st->inet, addr, len, &target);
        Record(*st, pid, NetworkDenialName("connect", target));
        return Respond(listener, req.id, -EACCES);  // what Landlock answers, had the call reached it
      }
    }
  }
  socklen_t addr_len = static_cast<socklen_t>(len);
  UniqueFd node;
  auto* un = reinterpret_cast<struct sockaddr_un*>(&addr);
  constexpr std::size_t kPathOffset = offsetof(struct sockaddr_un, sun_path);
  if (domain == AF_UNIX && static_cast<std::size_t>(len) > kPathOffset && addr.ss_family == AF_UNIX &&
      un->sun_path[0] != '\0') {
    const std::string path(un->sun_path, strnlen(un->sun_path, static_cast<std::size_t>(len) - kPathOffset));
    const Decision d = DecideUnix(st->rules, pid, path, &node);
    if (d.refused) {
      Record(*st, pid, UnixConnectDenial(path));
      return Respond(listener, req.id, -EACCES);
    }
    if (d.err != 0) return Respond(listener, req.id, -d.err);
    // Through the inode that was checked, whatever the path names by now.
    std::memset(&addr, 0, sizeof(addr));
    un->sun_family = AF_UNIX;
    const int n = std::snprintf(un->sun_path, sizeof(un->sun_path), "/proc/self/fd/%d", node.get());
    addr_len = static_cast<socklen_t>(kPathOffset + static_cast<std::size_t>(n) + 1);
  }
  const int flags = fcntl(sock.get(), F_GETFL);
  if (flags < 0) return Respond(listener, req.id, -errno);
  if (flags & O_NONBLOCK) {
    const int rc = connect(sock.get(), reinterpret_cast<struct sockaddr*>(&addr), addr_len);
    return Respond(listener, req.id, rc == 0 ? 0 : -errno);
  }
  // A blocking socket: tried without blocking first (loopback and unix
  // connects finish at once, and a thread per call costs more than the
  // call). The flag is the description's, back as it was before we answer.
  (void)fcntl(sock.get(), F_SETFL, flags | O_NONBLOCK);
  const int rc = connect(sock.get(), reinterpret_cast<struct sockaddr*>(&addr), addr_len);
  const int err = errno;
  (void)fcntl(sock.get(), F_SETFL, flags);
  if (rc == 0) return Respond(listener, req.id, 0);
  if (err != EINPROGRESS && err != EAGAIN) return Respond(listener, req.id, -err);
  if (err == EINPROGRESS) {
    // A TCP handshake over loopback (the egress proxy) completes within
    // microseconds but not within the call: a brief wait here is cheaper
    // than a thread.
    struct pollfd p = {sock.get(), POLLOUT, 0};
    if (poll(&p, 1, kInlineWaitMs) == 1) {
      int so_error = 0;
      socklen_t el = sizeof(so_error);
      if (getsockopt(sock.get(), SOL_SOCKET, SO_ERROR, &so_error, &el) != 0) so_error = errno;
      return Respond(listener, req.id, -so_error);
    }
  }
  // Still under way (TCP: EINPROGRESS) or a full backlog (unix: EAGAIN):
  // waited for on a thread of its own, so that other calls are answered
  // meanwhile, for as long as the socket's send timeout lets a blocking
  // connect wait.
  if (st->workers.fetch_add(1) >= kMaxWorkers) {
    st->workers.fetch_sub(1);
    return Respond(listener, req.id, -EAGAIN);
  }
  auto wait = [st, listener, id = req.id, s = std::move(sock), n = std::move(node), addr, addr_len, err]() {
    int result = 0;
    if (err == EAGAIN) {
      result = connect(s.get(), reinterpret_cast<const struct sockaddr*>(&addr), addr_len) == 0 ? 0 : -errno;
    } else {
      struct timeval tv {};
      socklen_t tl = sizeof(tv);
      const bool timed = getsockopt(s.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, &tl) == 0 && (tv.tv_sec || tv.tv_usec);
      const int ms = timed ? static_cast<int>(tv.tv_sec * 1000 + tv.tv_usec / 1000) : -1;
      struct pollfd p = {s.get(), POLLOUT, 0};
      int n_ready;
      do {
        n_ready = poll(&p, 1, ms);
      } while (n_ready < 0 && errno == EINTR);
      if (n_ready == 0) {
        result = -EINPROGRESS;  // what a blocking connect answers when its send timeout passes
      } else {
        int so_error = 0;
        socklen_t el = sizeof(so_error);
        if (getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &so_error, &el) != 0) so_error = errno;
        result = -so_error;
      }
    }
    Respond(listener, id, result);
    st->workers.fetch_sub(1);
  };
  // At the sandbox's process limit (pids.max, RLIMIT_NPROC: both count
  // threads) there is no thread to be had: the call fails as a fork there does.
  try {
    std::thread(std::move(wait)).detach();
  } catch (const std::system_error&) {
    st->workers.fetch_sub(1);
    Respond(listener, req.id, -EAGAIN);
  }
}

void AnswerLoop(std::shared_ptr<NotifyResponder::State> st) {
  int listener;
  {
    std::unique_lock<std::mutex> lock(st->mu);
    st->cv.wait(lock, [&] { return st->listener >= 0; });
    listener = st->listener;
  }
  for (;;) {
    struct seccomp_notif req;
    std::memset(&req, 0, sizeof(req));  // the kernel insists on a zeroed buffer
    if (ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, &req) != 0) {
      if (errno == EINTR || errno == ENOENT) continue;  // ENOENT: the caller died meanwhile
      return;
    }
    if (static_cast<long>(req.data.nr) == SYS_connect && req.data.arch == seccomp_arch_native()) {
      Connect(st, listener, req);
      continue;
    }
    if (static_cast<long>(req.data.nr) == SYS_listen && req.data.arch == seccomp_arch_native() &&
        (st->inet.host_network || st->inet.broker_fd >= 0)) {
      Listen(st, listener, req);
      continue;
    }
    // Recorded before the answer: the caller cannot have exited unrecorded.
    Record(*st, static_cast<pid_t>(req.pid), DenialName(*st, req));
    Respond(listener, req.id, -EPERM);
  }
}

}  // namespace

Result<std::unique_ptr<NotifyResponder>> NotifyResponder::Start(UnixConnectRules rules, InetConnectRules inet) {
  auto st = std::make_shared<State>();
  st->rules = std::move(rules);
  st->inet = std::move(inet);
  st->ready.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!st->ready.valid()) return Status::Errno("seccomp", "eventfd");
  if (st->inet.broker_fd >= 0 && !st->inet.host_network) {
    UniqueFd probe(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    socklen_t cl = sizeof(st->own_netns_cookie);
    if (!probe.valid() || getsockopt(probe.get(), SOL_SOCKET, SO_NETNS_COOKIE, &st->own_netns_cookie, &cl) != 0) {
      st->own_netns_cookie = 0;
    }
  }
  try {
    std::thread(AnswerLoop, st).detach();
  } catch (const std::system_error& e) {
    return Status::Error("seccomp", std::string("starting the connect() responder thread: ") + e.what());
  }
  return std::unique_ptr<NotifyResponder>(new NotifyResponder(st));
}

NotifyResponder::~NotifyResponder() = default;

void NotifyResponder::Serve(UniqueFd listener) {
  // Linux 6.6+: the caller's wake-up of this thread and ours of it happen on
  // one CPU, which takes most of a notification's round trip away (a
  // connect() costs one). Older kernels refuse the flag: nothing changes.
  std::uint64_t sync_wake_up = SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP;
  (void)ioctl(listener.get(), SECCOMP_IOCTL_NOTIF_SET_FLAGS, sync_wake_up);
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->listener = listener.release();
  state_->cv.notify_all();
}

int NotifyResponder::ready_fd() const { return state_->ready.get(); }

std::vector<NotifyRecord> NotifyResponder::Take() {
  std::uint64_t n;
  (void)!read(state_->ready.get(), &n, sizeof(n));
  std::lock_guard<std::mutex> lock(state_->mu);
  return std::exchange(state_->records, {});
}

UniqueFd OpenThreadPidfd(pid_t tid) {
  UniqueFd thread(PidfdOpen(tid, PIDFD_THREAD));
  // EINVAL: a kernel before 6.9, which knows no PIDFD_THREAD.
  if (thread.valid() || errno != EINVAL) return thread;
  const pid_t group = ThreadGroupOf(tid);
  if (group <= 0) {
    errno = ESRCH;
    return {};
  }
  return UniqueFd(PidfdOpen(group));
}

pid_t ThreadGroupOf(pid_t tid) {
  // /proc/self names us in the pid namespace of this /proc.
  char self[32];
  const ssize_t n = readlink("/proc/self", self, sizeof(self));
  if (n <= 0 || std::string(self, static_cast<std::size_t>(n)) != std::to_string(getpid())) return 0;
  std::ifstream status("/proc/" + std::to_string(tid) + "/status");
  std::string key;
  while (status >> key) {
    if (key == "Tgid:") {
      long tgid = 0;
      return status >> tgid ? static_cast<pid_t>(tgid) : 0;
    }
    status.ignore(4096, '\n');
  }
  return 0;
}

std::string UnixConnectDenial(const std::string& path) { return kUnixConnectPrefix + path; }

std::string SetIdDenial(const std::string& op, const std::string& path) { return kSetIdPrefix + op + ":" + path; }

std::optional<std::string> UnixConnectTarget(const std::string& tally_name) {
  const std::size_t n = sizeof(kUnixConnectPrefix) - 1;
  if (tally_name.compare(0, n, kUnixConnectPrefix) != 0) return std::nullopt;
  return tally_name.substr(n);
}

std::string NetworkDenialName(const std::string& op, const std::string& target) {
  return kNetworkPrefix + op + ":" + target;
}

Denial SeccompDenial(const std::string& tally_name, std::uint64_t count) {
  const std::size_t np = sizeof(kNetworkPrefix) - 1;
  if (tally_name.compare(0, np, kNetworkPrefix) == 0) {
    const std::size_t colon = tally_name.find(':', np);
    if (colon != std::string::npos) {
      const std::string op = tally_name.substr(np, colon - np);
      const char* why = op == "connect" ? "a direct connection the sandbox may not make: without a network namespace "
                                          "only the egress proxy (127.0.0.1, its ports) and what the connect() broker "
                                          "allows are reachable, and a socket the broker installed never reaches the "
                                          "host's loopback"
                        : op == "listen" ? "an inet listener would take a port on every interface of the host"
                                         : "only TCP leaves a sandbox without a network namespace, through the "
                                           "egress proxy";
      return {"network", op, tally_name.substr(colon + 1), why, "seccomp", count};
    }
  }
  if (auto path = UnixConnectTarget(tally_name)) {
    return {"filesystem", "connect", *path,
            "a unix socket outside the sandbox that filesystem.unix_sockets does not name", "seccomp", count};
  }
  const std::size_t n = sizeof(kSetIdPrefix) - 1;
  if (tally_name.compare(0, n, kSetIdPrefix) == 0) {
    const std::size_t colon = tally_name.find(':', n);
    if (colon != std::string::npos) {
      return {"filesystem", tally_name.substr(n, colon - n), tally_name.substr(colon + 1), "set-id bits", "seccomp",
              count};
    }
  }
  return {"syscalls", tally_name, "", "blocked by the seccomp filter", "seccomp", count};
}

}  // namespace agentbox::linux
