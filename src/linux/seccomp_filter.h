// seccomp: the filter compiled from the plan (libseccomp, in the supervisor),
// loaded in the runner, and the runner's answers to its notifications.
//
// The supervisor compiles it (or reads it from its cache) before it clones
// the runner, which inherits it and loads it with seccomp(2) right before
// the command. (Compiled after the clone, while the runner built the root,
// it cost 2-5x more: every page the supervisor wrote was then a
// copy-on-write fault, and on two cores the runner waited for it.)
#pragma once

#include <linux/filter.h>

#include <cstdint>
#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "agentbox/plan.h"
#include "agentbox/status.h"
#include "linux/fd.h"

namespace agentbox::linux {

using BpfProgram = std::vector<struct sock_filter>;

// Compiles the rules; foreign architectures (x32, i386) get EPERM.
[[nodiscard]] Result<BpfProgram> CompileSeccomp(const SeccompPlan& plan);

// A second filter, stacked on the plan's by a call that has no network at
// all (a run_code program): socket() of every family fails with EACCES,
// socketpair() gives stream pairs only, and the calls that take a socket
// from another process (pidfd_getfd, ptrace, process_vm_*) or open behind
// seccomp's back (io_uring_setup) fail with EPERM. Foreign architectures:
// EPERM. Answered in the kernel: no listener.
[[nodiscard]] Result<BpfProgram> NoNetworkFilter();

// CompileSeccomp, memoised in plan.cache_dir (when set) under a key made of
// every rule, the architecture and the libseccomp and agentbox versions:
// libseccomp's compilation costs about half a millisecond per run. A cache
// file that is not ours (owner, mode) or not a whole program is ignored and
// replaced. The cache directory is never one the sandbox can write.
[[nodiscard]] Result<BpfProgram> CompileSeccompCached(const SeccompPlan& plan);

// Loads the program into the calling thread (irreversible; needs
// no_new_privs) and returns the user-notification fd, close-on-exec. The
// holder must answer every notification and must never itself make a call
// the filter notifies about: the kernel would wait for its own answer.
[[nodiscard]] Result<UniqueFd> InstallSeccomp(const BpfProgram& program);

// Denied calls counted by name: a syscall's, or a refused unix socket's
// (UnixConnectDenial). NotifyResponder answers the calls.
class DenialTally {
 public:
  void Count(const std::string& name);
  // Name → how many calls were denied (at most kMaxNames names).
  const std::map<std::string, std::uint64_t>& counts() const { return counts_; }

  static constexpr std::size_t kMaxNames = 64;

 private:
  std::map<std::string, std::uint64_t> counts_;
};

}  // namespace agentbox::linux
