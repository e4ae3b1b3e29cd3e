// The seccomp layer's rules, as data. docs/seccomp.md gives the reason for
// every entry; keep the two in step.
//
// Denied calls fail with EPERM, a clear error for tools, and are reported by
// name: the runner answers them through the filter's user-notification fd.
// clone3 is the exception: its flags live in memory a filter cannot read, so
// every clone3 gets ENOSYS in the kernel and libc falls back to clone, whose
// flags the filter can read. That is not a denial and is not reported.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "confine/layers.h"

namespace agentbox {
namespace {

using Kind = SeccompArgCheck::Kind;

// Namespace flags that clone(2) takes (CLONE_NEWTIME does not fit in clone's flags).
constexpr std::uint64_t kCloneNamespaceFlags = 0x00020000 /*NEWNS*/ | 0x02000000 /*NEWCGROUP*/ |
                                               0x04000000 /*NEWUTS*/ | 0x08000000 /*NEWIPC*/ |
                                               0x10000000 /*NEWUSER*/ | 0x20000000 /*NEWPID*/ |
                                               0x40000000 /*NEWNET*/;
// personality(2) flags that weaken memory protection: READ_IMPLIES_EXEC,
// ADDR_NO_RANDOMIZE, MMAP_PAGE_ZERO. 0xffffffff only queries and stays allowed.
constexpr std::uint64_t kWeakPersonality = 0x0400000 | 0x0040000 | 0x0100000;
constexpr std::uint64_t kTiocsti = 0x5412, kTioclinux = 0x541C;
constexpr std::uint64_t kAfUnix = 1, kAfInet = 2, kAfInet6 = 10, kAfNetlink = 16, kAfMax = 46;
constexpr std::uint64_t kNetlinkRoute = 0;
constexpr std::uint64_t kSetIdBits = 06000;                 // S_ISUID | S_ISGID
constexpr std::uint64_t kOCreat = 0100, kOTmpfile = 020000000;  // O_CREAT, __O_TMPFILE
constexpr std::uint64_t kSockDgram = 2, kSockRaw = 3, kSockRdm = 4, kSockSeqpacket = 5, kSockDccp = 6,
                        kSockPacket = 10, kSockTypeMask = 0xf;
constexpr std::uint64_t kIpprotoTcp = 6;
constexpr std::uint64_t kMsgFastopen = 0x20000000;

struct Group {
  const char* why;
  std::vector<const char*> syscalls;
};

const std::vector<Group>& Groups() {
  static const std::vector<Group> groups = {
      {"debugging other processes reads and writes their memory",
       {"ptrace", "process_vm_readv", "process_vm_writev"}},
      {"mounts: the mount plan is final", {"mount", "umount2", "pivot_root", "move_mount", "fsopen",
                                           "fsmount", "fsconfig", "fspick", "open_tree", "mount_setattr"}},
      {"new namespaces: nested user namespaces are the way to most kernel attack surface",
       {"unshare", "setns"}},
      {"kernel attack surface with a history of exploits", {"bpf", "userfaultfd", "perf_event_open"}},
      {"kernel keyrings are not namespaced", {"keyctl", "add_key", "request_key"}},
      {"kernel modules", {"init_module", "finit_module", "delete_module"}},
      {"replacing or stopping the kernel", {"kexec_load", "kexec_file_load", "reboot"}},
      {"swap", {"swapon", "swapoff"}},
      {"clocks are not namespaced", {"settimeofday", "clock_settime", "clock_adjtime", "adjtimex"}},
      {"io_uring bypasses seccomp for the operations it submits",
       {"io_uring_setup", "io_uring_enter", "io_uring_register"}},
      {"process accounting and disk quotas are host-wide", {"acct", "quotactl", "quotactl_fd"}},
      {"file handles open files by inode, around the mount plan",
       {"name_to_handle_at", "open_by_handle_at"}},
  };
  return groups;
}

}  // namespace

namespace {

// The host's network (landlock-only): Landlock fences TCP ports and nothing
// else, so every other inet protocol is refused at socket(), listen() is
// mediated, and TCP Fast Open (which connects from sendto/sendmsg, past the
// connect() mediation) is refused.
void AddHostNetworkRules(SeccompPlan* sp) {
  for (std::uint64_t family : {kAfInet, kAfInet6}) {
    for (std::uint64_t type : {kSockDgram, kSockRdm, kSockSeqpacket, kSockDccp}) {
      SeccompArgCheck t{Kind::kLow32Equals, 0, 0, family};
      t.has_also = true;
      t.also_arg = 1;
      t.also_mask = kSockTypeMask;
      t.also_value = type;
      sp->rules.push_back({"socket", SeccompAction::kNotifyEperm, t,
                           "no network namespace: UDP, ICMP and the rest are not fenced by Landlock; only TCP "
                           "leaves, through the egress proxy"});
    }
    // SCTP and MPTCP come as SOCK_STREAM with a protocol of their own.
    SeccompArgCheck proto{Kind::kLow32NotIn, 2, 0, kIpprotoTcp + 1};
    proto.values = {0, kIpprotoTcp};
    proto.has_also = true;
    proto.also_arg = 0;
    proto.also_mask = 0xffffffff;
    proto.also_value = family;
    sp->rules.push_back({"socket", SeccompAction::kNotifyEperm, proto,
                         "no network namespace: inet protocols other than TCP are not fenced by Landlock"});
  }
}

// TCP Fast Open connects from sendto/sendmsg, past the connect() broker:
// on the host's network directly, and in a namespace of its own through a
// socket the broker installed (the host's) that a failed handshake left
// free to connect again.
void AddFastOpenRules(SeccompPlan* sp) {
  struct FlagsArg {
    const char* syscall;
    unsigned arg;
  };
  for (const FlagsArg& f : {FlagsArg{"sendto", 3}, FlagsArg{"sendmsg", 2}, FlagsArg{"sendmmsg", 3}}) {
    sp->rules.push_back({f.syscall, SeccompAction::kNotifyEperm, {Kind::kAnyBitSet, f.arg, kMsgFastopen},
                         "MSG_FASTOPEN connects without connect(), past the connect() broker"});
  }
}

}  // namespace

Status GrantSyscalls(const std::vector<std::string>& names, SeccompPlan* plan) {
  for (const std::string& name : names) {
    if (auto problem = SyscallGrantProblem(name)) return Status::Error("policy", "granted.syscalls: " + *problem);
    if (!plan->enabled) continue;
    auto& rules = plan->rules;
    rules.erase(std::remove_if(rules.begin(), rules.end(), [&](const SeccompRule& r) { return r.syscall == name; }),
                rules.end());
    if (std::find(plan->granted.begin(), plan->granted.end(), name) == plan->granted.end()) plan->granted.push_back(name);
  }
  return {};
}

SeccompPlan PlanSeccomp(bool host_has_seccomp, SocketScope scope) {
  SeccompPlan sp;
  if (!host_has_seccomp) return sp;
  sp.enabled = true;
  for (const auto& g : Groups()) {
    for (const char* name : g.syscalls) sp.rules.push_back({name, SeccompAction::kNotifyEperm, {}, g.why});
  }
  SeccompArgCheck clone_ns{Kind::kAnyBitSet, 0, kCloneNamespaceFlags};
  sp.rules.push_back({"clone", SeccompAction::kNotifyEperm, clone_ns, "new namespaces"});
  sp.rules.push_back({"clone3", SeccompAction::kErrnoEnosys, {},
                      "its flags are out of the filter's reach: libc falls back to clone"});
  SeccompArgCheck weak{Kind::kAnyBitSet, 0, kWeakPersonality, 0, true, 0xffffffff};
  sp.rules.push_back({"personality", SeccompAction::kNotifyEperm, weak,
                      "READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE, MMAP_PAGE_ZERO weaken memory protection"});
  for (std::uint64_t cmd : {kTiocsti, kTioclinux}) {
    SeccompArgCheck c{Kind::kLow32Equals, 1, 0, cmd};
    sp.rules.push_back({"ioctl", SeccompAction::kNotifyEperm, c,
                        cmd == kTiocsti ? "TIOCSTI pushes input into a terminal"
                                        : "TIOCLINUX reads and writes the console"});
  }
  SeccompArgCheck domain{Kind::kLow32NotIn, 0, 0, kAfMax};
  domain.values = {kAfUnix, kAfInet, kAfInet6, kAfNetlink};
  sp.rules.push_back({"socket", SeccompAction::kNotifyEperm, domain,
                      "socket families other than unix, inet, inet6 and netlink: rarely used, often buggy"});
  // Netlink: NETLINK_ROUTE alone, which getifaddrs (Node's
  // os.networkInterfaces, getaddrinfo's AI_ADDRCONFIG) reads interfaces and
  // addresses through. Without CAP_NET_ADMIN, which the sandbox never holds
  // (nor the runner that makes its connect()s), it can only read. The
  // kernel takes no other type than SOCK_RAW and SOCK_DGRAM for netlink
  // (ESOCKTNOSUPPORT). A protocol with high bits set is refused too: the
  // comparison is on all 64 bits.
  SeccompArgCheck netlink{Kind::kLow32NotIn, 2, 0, kNetlinkRoute + 1};
  netlink.values = {kNetlinkRoute};
  netlink.has_also = true;
  netlink.also_arg = 0;
  netlink.also_mask = 0xffffffff;
  netlink.also_value = kAfNetlink;
  sp.rules.push_back({"socket", SeccompAction::kNotifyEperm, netlink,
                      "netlink protocols other than NETLINK_ROUTE (audit, netfilter, sock_diag, uevents, generic, "
                      "...): kernel interfaces tools do not need"});
  // Set-id bits: a file the sandbox marks set-uid or set-gid stays so on
  // the host (the workspace is nosuid only inside), and as root it is owned
  // by root. Every call that sets a mode is filtered on the mode's set-id
  // bits: chmod and its kin, and the create modes of open, openat, creat,
  // mknod, mknodat, mkdir and mkdirat. openat2's mode is in memory the
  // filter cannot read: it answers ENOSYS (libc and most programs then use
  // openat). io_uring, which could open behind the filter's back, is denied.
  struct ModeArg {
    const char* syscall;
    unsigned mode_arg;
    int flags_arg;  // -1: no flags (the mode always applies)
  };
  for (const ModeArg& m : {ModeArg{"chmod", 1, -1}, ModeArg{"fchmod", 1, -1}, ModeArg{"fchmodat", 2, -1},
                           ModeArg{"fchmodat2", 2, -1}, ModeArg{"creat", 1, -1}, ModeArg{"mknod", 1, -1},
                           ModeArg{"mknodat", 2, -1}, ModeArg{"mkdir", 1, -1}, ModeArg{"mkdirat", 2, -1},
                           ModeArg{"open", 2, 1}, ModeArg{"openat", 3, 2}}) {
    if (m.flags_arg < 0) {
      sp.rules.push_back({m.syscall, SeccompAction::kNotifyEperm, {Kind::kAnyBitSet, m.mode_arg, kSetIdBits},
                          "set-uid or set-gid bits would stay on the file on the host"});
      continue;
    }
    // The mode counts only with O_CREAT or O_TMPFILE: otherwise it is noise.
    for (std::uint64_t create : {kOCreat, kOTmpfile}) {
      SeccompArgCheck c{Kind::kAnyBitSet, m.mode_arg, kSetIdBits};
      c.has_also = true;
      c.also_arg = static_cast<unsigned>(m.flags_arg);
      c.also_mask = create;
      c.also_value = create;
      sp.rules.push_back({m.syscall, SeccompAction::kNotifyEperm, c,
                          "set-uid or set-gid bits would stay on the file on the host"});
    }
  }
  sp.rules.push_back({"openat2", SeccompAction::kErrnoEnosys, {},
                      "its create mode is out of the filter's reach: callers fall back to openat"});
  // Unix datagram sockets send to any bound path, connected or not
  // (sendto/sendmsg carry the address in memory the filter cannot read):
  // none is made, so no datagram reaches a host service's socket.
  for (const char* call : {"socket", "socketpair"}) {
    SeccompArgCheck dgram{Kind::kLow32Equals, 0, 0, kAfUnix};
    dgram.has_also = true;
    dgram.also_arg = 1;
    dgram.also_mask = kSockTypeMask;
    dgram.also_value = kSockDgram;
    sp.rules.push_back({call, SeccompAction::kNotifyEperm, dgram,
                        "unix datagram sockets reach any bound path (host services' sockets) with each send"});
  }
  // connect(): the runner looks at every pathname unix socket the command
  // names and makes the connection itself (filesystem.unix_sockets).
  sp.rules.push_back({"connect", SeccompAction::kNotifyMediate, {},
                      "pathname unix sockets outside the sandbox are reached only when the policy names them"});
  // SOCK_RAW on the families the domain rule lets through, netlink's aside
  // (its datagrams are messages to the kernel, not packets).
  for (std::uint64_t family : {kAfUnix, kAfInet, kAfInet6}) {
    SeccompArgCheck raw{Kind::kMaskedEquals, 1, kSockTypeMask, kSockRaw};
    raw.has_also = true;
    raw.also_arg = 0;
    raw.also_mask = 0xffffffff;
    raw.also_value = family;
    sp.rules.push_back({"socket", SeccompAction::kNotifyEperm, raw, "SOCK_RAW: forged packets"});
  }
  SeccompArgCheck packet{Kind::kMaskedEquals, 1, kSockTypeMask, kSockPacket};
  sp.rules.push_back({"socket", SeccompAction::kNotifyEperm, packet, "SOCK_PACKET: forged packets"});
  if (scope == SocketScope::kHostNetwork) AddHostNetworkRules(&sp);
  AddFastOpenRules(&sp);
  // listen(): on the host's network an inet listener would take a port on
  // every interface; in a namespace of its own, on a socket the broker
  // installed (the host's) whose handshake failed, the same.
  sp.rules.push_back({"listen", SeccompAction::kNotifyMediate, {},
                      scope == SocketScope::kHostNetwork
                          ? "no network namespace: an inet listener would take a port on every host interface"
                          : "a socket the connect() broker installed is the host's: no listener on it"});
  return sp;
}

std::string Describe(const SeccompRule& r) {
  auto hex = [](std::uint64_t v) {
    char b[32];
    std::snprintf(b, sizeof(b), "0x%llx", static_cast<unsigned long long>(v));
    return std::string(b);
  };
  const SeccompArgCheck& w = r.when;
  std::string a = "arg" + std::to_string(w.arg);
  std::string cond;
  switch (w.kind) {
    case Kind::kAlways:
      break;
    case Kind::kAnyBitSet:
      cond = a + " & " + hex(w.mask) + " != 0";
      if (w.has_except) cond += " (except " + hex(w.except) + ")";
      break;
    case Kind::kLow32Equals:
      cond = "low 32 bits of " + a + " == " + hex(w.value);
      break;
    case Kind::kMaskedEquals:
      cond = a + " & " + hex(w.mask) + " == " + std::to_string(w.value);
      break;
    case Kind::kLow32NotIn: {
      std::string vs;
      for (auto v : w.values) vs += (vs.empty() ? "" : ", ") + std::to_string(v);
      cond = a + " not in {" + vs + "}";
      break;
    }
  }
  if (w.has_also) {
    cond += " and arg" + std::to_string(w.also_arg) + " & " + hex(w.also_mask) + " == " + std::to_string(w.also_value);
  }
  std::string out = r.syscall;
  if (!cond.empty()) out += " if " + cond;
  out += r.action == SeccompAction::kErrnoEnosys     ? " → ENOSYS"
         : r.action == SeccompAction::kNotifyMediate ? " → decided by the runner"
                                                     : " → EPERM, reported";
  return out + " (" + r.why + ")";
}

}  // namespace agentbox
