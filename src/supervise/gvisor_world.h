// A session's world on gVisor (sandbox.isolation: container): one
// long-lived sandbox whose init is agentbox's own static binary, bound in
// read-only, running the world's supervisor on the Sentry's kernel. Its
// stdin and stdout are one socket to this host, the stream the world's
// channel, its calls and its egress are carried on (relayed_world.cc,
// guest_init.cc). The sandbox has no network (--network=none): egress is
// the host's proxy, reached through the stream, as in a microVM.
#pragma once

#include <memory>

#include "agentbox/plan.h"
#include "agentbox/run.h"
#include "linux/microvm.h"
#include "supervise/world_machine.h"

namespace agentbox::net {
class Terminator;
}

namespace agentbox::supervise {

// Where the sandbox sees agentbox's binary, and the argument that makes it
// the world's relay there.
inline constexpr const char* kGvisorInsideBinary = "/.agentbox/agentbox";
inline constexpr const char* kGvisorInsideArg = "__gvisor-world";

class GvisorSandbox final : public WorldMachine {
 public:
  // Starts the plan's sandbox in the run's cgroup and sends `request` (the
  // plan the inside runs is made here, as are the proxy ports it listens
  // on). The plan's credentials are prepared already: `terminator` ends
  // TLS in the proxy serving the sandbox.
  static Result<std::unique_ptr<GvisorSandbox>> Start(const Plan& plan, const RunOptions& options,
                                                      linux::GuestRequest request,
                                                      std::shared_ptr<net::Terminator> terminator);
  ~GvisorSandbox() override;
  GvisorSandbox(const GvisorSandbox&) = delete;
  GvisorSandbox& operator=(const GvisorSandbox&) = delete;

  int channel() const override;
  int ended_fd() const override;
  const std::vector<std::string>& skipped() const override;
  Egress* egress() override;
  linux::UniqueFd DialEgress(char tag) override;
  void Reap(std::chrono::milliseconds grace) override;
  std::string EndedHow(bool* oom) override;
  Status SetMemory(std::uint64_t bytes) override;
  std::string GraftRefusal() const override;
  const char* stage() const override { return "gvisor"; }

  struct State;

 private:
  explicit GvisorSandbox(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

// The plan the world's supervisor runs inside the sandbox: unconfined
// there (gVisor's kernel offers no namespaces, Landlock or seccomp of its
// own to a second fence), the same environment and workspace; egress on
// the ports the inside's relay listens on.
Plan GvisorInsidePlan(const Plan& plan);

}  // namespace agentbox::supervise
