// A run in a QEMU microVM (Backend::kMicrovm): see microvm_run.cc (host)
// and guest_init.cc (the guest's init).
#pragma once

#include <string>
#include <vector>

#include "agentbox/confine.h"
#include "agentbox/outcome.h"
#include "agentbox/plan.h"
#include "agentbox/run.h"

namespace agentbox::supervise {

// Boots the plan's VM, has its init run `argv` under the same plan inside
// (as a namespaces run, the guest kernel's own Landlock and seccomp), and
// classifies the outcome: the guest's own classification, a timeout when
// the wall clock ends the VM, an OOM kill from the guest kernel's counter,
// QEMU's or the guest's failures as sandbox_error, stage "microvm".
Outcome RunMicrovm(const Plan& plan, const std::vector<std::string>& argv,
                   const std::vector<Signature>& denial_signatures, const RunOptions& options);

// Removes the run directories under `parent` whose supervisor is gone.
std::vector<std::string> CollectMicrovmDirs(const std::string& parent);

// A run directory: <parent>/agentbox-microvm-<supervisor pid>-XXXXXX.
inline constexpr const char* kMicrovmDirPrefix = "agentbox-microvm-";

// The guest's init (pid 1 of the VM, the initramfs's /init): loads the
// virtio modules, reads the request on the virtio-serial port, mounts the
// shares as the guest's root, runs the request's plan and relays the
// command's stdio and its outcome; then powers the VM off.
[[noreturn]] void GuestInitMain();

}  // namespace agentbox::supervise
