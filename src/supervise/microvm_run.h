// A run in a QEMU microVM (Backend::kMicrovm): see microvm_run.cc (host)
// and guest_init.cc (the guest's init).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "agentbox/confine.h"
#include "agentbox/outcome.h"
#include "agentbox/plan.h"
#include "agentbox/run.h"
#include "linux/fd.h"
#include "linux/microvm.h"
#include "supervise/world_machine.h"

namespace agentbox::net {
class Terminator;
}

namespace agentbox::supervise {

class Egress;

// A booted microVM: its run directory, one virtiofsd per share (each in a
// view of the plan's), QEMU, the guest's channel, and the host's end of the
// guest's egress. All of it ends with the object: QEMU killed, the helpers
// stopped, the directory removed.
class MicrovmVm final : public WorldMachine {
 public:
  // Boots the plan's VM and sends `request` once the guest's channel is
  // open; its plan, shares and proxy ports are filled in here. The plan's
  // credentials are prepared already (PrepareCredentials): `terminator`
  // ends TLS in the proxy serving the guest.
  static Result<std::unique_ptr<MicrovmVm>> Boot(const Plan& plan, const RunOptions& options,
                                                 linux::GuestRequest request,
                                                 std::shared_ptr<net::Terminator> terminator = nullptr);
  ~MicrovmVm();
  MicrovmVm(const MicrovmVm&) = delete;
  MicrovmVm& operator=(const MicrovmVm&) = delete;

  int channel() const override;
  int qemu_pidfd() const;
  // read_only entries absent on this host (the report's enforcement.skipped).
  const std::vector<std::string>& skipped() const override;
  // The proxy serving the guest's connections (null without egress), and a
  // connection to its listener for `tag` ('h' HTTP, 's' SOCKS).
  Egress* egress() override;
  linux::UniqueFd DialEgress(char tag) override;
  // An error naming `when` with QEMU's log and the guest console's tail.
  Status QemuFailed(const std::string& when);
  std::string ConsoleTail(std::size_t max) const;
  // Waits up to `grace` for QEMU to end (the guest powers off), then kills it.
  void ReapQemu(std::chrono::milliseconds grace);

  // A session's world (WorldMachine).
  int ended_fd() const override { return qemu_pidfd(); }
  void Reap(std::chrono::milliseconds grace) override { ReapQemu(grace); }
  std::string EndedHow(bool* oom) override;
  Status SetMemory(std::uint64_t bytes) override;
  std::string GraftRefusal() const override;
  const char* stage() const override { return "microvm"; }

  struct State;

 private:
  explicit MicrovmVm(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

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
// command's stdio and its outcome (or, for a session's world, runs
// `world_main`, the `__world` supervisor, and relays its channel and
// calls); then powers the VM off.
[[noreturn]] void GuestInitMain(int (*world_main)());

// The relay of a session's world in a gVisor sandbox (its init, agentbox
// bound in at kGvisorInsideBinary): the host's request on the stream that
// stdin and stdout are, then as a microVM's world does (`world_main` in a
// child, its channel and calls relayed), until it ends.
[[noreturn]] void GvisorInsideMain(int (*world_main)());

// The relay of a session's world on a remote host (`agentbox __world
// --stdio`, reached over ssh or a pod's exec): frames on stdin, frames out
// on stdout; `world_main` runs on `plan_json` (the remote's own plan) in a
// child and its channel and calls are relayed as a gVisor world's are,
// until either end goes. `frames` are what `reader` read past the request.
[[noreturn]] void RemoteRelayMain(const std::string& plan_json, int (*world_main)(), linux::FrameReader* reader,
                                  std::vector<linux::Frame> frames);

}  // namespace agentbox::supervise
