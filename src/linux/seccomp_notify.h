// The seccomp filter's user notifications, answered by a thread of the
// runner's that the filter does not cover.
//
// Two kinds of call reach it:
//  - calls the plan denies (kNotifyEperm): answered -EPERM and recorded (a
//    call refused for set-id bits with the path it named);
//  - connect() (kNotifyMediate): every pathname unix socket the command
//    names is checked, and the connect is made here, on the command's own
//    socket (pidfd_getfd), with the address as it was checked. Answering
//    "continue" instead would let another thread of the command rewrite the
//    address, or swap the descriptor, between the check and the kernel's
//    own read of them. A socket outside the sandbox is refused (EACCES)
//    unless the policy names it (filesystem.unix_sockets); a socket that a
//    process of the sandbox listens on is the sandbox's own and allowed.
//    Landlock-only (the host's network): an inet connect is allowed only to
//    127.0.0.1 on the egress proxy's ports, and refused (EACCES, a network
//    denial naming the address) anywhere else;
//  - listen() (landlock-only): refused on inet sockets, whose autobind would
//    take a port on every interface of the host (Landlock checks bind(),
//    not listen()), and made here on any other.
//
// The peer of a connection made here sees the runner's pid in
// SO_PEERCRED, with the command's uid and gid.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agentbox/outcome.h"
#include "agentbox/status.h"
#include "linux/fd.h"

namespace agentbox::linux {

// What the sandbox's connect()s to pathname unix sockets may reach.
struct UnixConnectRules {
  // Sockets outside the sandbox that the policy names, as paths inside.
  std::vector<std::string> allowed;
  // True: the sandbox has its own network namespace, and the sockets it
  // listens on are exactly the unix sockets of that namespace. False
  // (landlock-only): a listener is the sandbox's when one of the runner's
  // descendants holds it.
  bool private_netns = false;
};

// What the sandbox's inet sockets may reach.
struct InetConnectRules {
  // True (landlock-only): the sandbox shares the host's network; inet
  // connects are decided here and listen() is mediated. False: its own
  // namespace fences them, and inet connects are made as asked.
  bool host_network = false;
  // Ports on 127.0.0.1 (and ::ffff:127.0.0.1) that connect() may reach:
  // the egress proxy's.
  std::vector<std::uint16_t> loopback_ports;
  // The connect() broker's channel to the supervisor (connect_broker.h), or
  // -1. Set: a TCP connect() that leaves the sandbox (any address but the
  // sandbox's own loopback; on the host's network, any but the proxy's
  // ports) is decided by the supervisor, which opens the connection and
  // hands back the socket that replaces the caller's. Owned by the responder.
  int broker_fd = -1;
};

// One answered notification that the runner reports.
struct NotifyRecord {
  pid_t pid = 0;        // the calling thread, in the runner's pid namespace
  pid_t sid = 0;        // its session when it called (sessions attribute calls by it)
  std::string denial;   // a DenialTally name: the syscall, or UnixConnectDenial(path)
};

class NotifyResponder {
 public:
  // Starts the answering thread. Call after Landlock is in force (the
  // thread inherits the domain) and before the seccomp filter is installed
  // (the thread must stay outside it: it makes the calls the filter sends
  // it). `rules` are read by that thread alone from here on.
  [[nodiscard]] static Result<std::unique_ptr<NotifyResponder>> Start(UnixConnectRules rules,
                                                                      InetConnectRules inet = {});
  ~NotifyResponder();
  NotifyResponder(const NotifyResponder&) = delete;
  NotifyResponder& operator=(const NotifyResponder&) = delete;

  // Hands over the listener that InstallSeccomp returned; answering starts.
  void Serve(UniqueFd listener);
  // Readable (an eventfd, close-on-exec) while records are waiting.
  int ready_fd() const;
  // The records so far, oldest first. A call's record is queued before
  // the call is answered: once a process has exited, all of its are here.
  std::vector<NotifyRecord> Take();

  struct State;

 private:
  explicit NotifyResponder(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

// A seccomp notification names the calling thread (its id in the pid
// namespace of the process that received it), and pidfd_open refuses a
// thread that does not lead its thread group: a connect() from any thread
// but the main one would otherwise find no pidfd. This one reaches the
// thread's descriptors through pidfd_getfd: the thread's own pidfd
// (PIDFD_THREAD, Linux 6.9+; its own table, even one it unshared), else
// its thread group's (ThreadGroupOf). Invalid, with errno set, when
// neither can be had. `tid` may name another thread by the time this
// returns: the caller proves the pidfd is the one meant afterwards
// (SECCOMP_IOCTL_NOTIF_ID_VALID: a caller still waiting cannot have exited).
UniqueFd OpenThreadPidfd(pid_t tid);
// The thread group of the thread `tid` of our pid namespace (its leader's
// pid, "Tgid:" in /proc/TID/status); 0 when it is gone, or when /proc is
// not our pid namespace's (its numbers would name other processes).
pid_t ThreadGroupOf(pid_t tid);

// The tally name of a refused connect() to the unix socket at `path`, and
// back. Both supervisors turn such names into filesystem denials.
std::string UnixConnectDenial(const std::string& path);
// The tally name of a call refused for setting set-id bits: `op` is
// "chmod" (chmod and its kin) or "create" (a create mode with them).
std::string SetIdDenial(const std::string& op, const std::string& path);
std::optional<std::string> UnixConnectTarget(const std::string& tally_name);
// The tally name of a network call refused on the host's network
// (landlock-only): `op` is "connect" (target "127.0.0.1:80", "[::1]:22"),
// "socket" (target "AF_INET SOCK_DGRAM") or "listen" (target "AF_INET").
// SeccompDenial makes them network denials.
std::string NetworkDenialName(const std::string& op, const std::string& target);

// A tally entry (syscall name or UnixConnectDenial) as a report denial.
Denial SeccompDenial(const std::string& tally_name, std::uint64_t count);

}  // namespace agentbox::linux
