// The channel between a session's caller (world.cc) and its supervisor,
// `agentbox __world` (world_main.cc), from the supervisor's side: fd 3, one
// JSON message per packet. Shared by the namespaces world and the microVM
// world (relayed_world.cc).
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "agentbox/plan.h"
#include "agentbox/status.h"
#include "linux/fd.h"
#include "linux/microvm.h"
#include "net/secrets.h"

namespace agentbox::net {
class Terminator;
}
namespace agentbox::supervise {
class WorldMachine;
}

namespace agentbox::session {

// The channel's descriptor in the world supervisor.
inline constexpr int kChannelFd = 3;

// One message to the caller, with `fd_to_pass` (>= 0) beside it. A "net"
// record is dropped rather than block when the caller does not read.
void Send(const nlohmann::json& message, int fd_to_pass = -1);

// A world supervisor's stop signals (SIGTERM, SIGINT, SIGHUP) blocked and
// delivered on the returned signalfd instead; SIGPIPE ignored.
linux::UniqueFd BlockStopSignals();

// {"t": "error", stage, message, errno, syscall, path} of `s`.
nlohmann::json ErrorMessage(const Status& s);

// The secrets' values, the caller's first message when the plan has
// secrets (world.cc), as a store of the plan's secrets; the buffer is wiped.
Result<std::shared_ptr<net::SecretStore>> ReceiveSecrets(const Plan& plan);

// A plan that ends TLS (credentials, http_rules): the secrets' values from
// the caller (ReceiveSecrets) and the terminator made with them
// (supervise::PrepareCredentials, which fills in the plan). Nothing for
// another plan.
Status PrepareWorldCredentials(Plan* plan, std::shared_ptr<net::SecretStore>* secrets,
                               std::shared_ptr<net::Terminator>* terminator);

// The supervisor of a session whose world is a microVM (or a gVisor
// sandbox): starts it with the inside's relay in world mode and relays
// between the caller and the machine's channel (relayed_world.cc).
// Returns the process's exit status.
int MicrovmWorldMain(const Plan& plan);
int GvisorWorldMain(const Plan& plan);

// Who answers the ops that need the host side of a world (network rules,
// rotations, memory): this process (a microVM's, a gVisor sandbox's proxy
// is this host's) or the far end (a remote agentbox owns all of them).
enum class RelayMode { kHostEgress, kRemote };

// Relays between the caller (fd 3) and a started machine's stream until
// either ends; `pending` are frames `reader` read from the stream before.
// `secrets` (may be null) answers rotations in kHostEgress mode. Returns
// the process's exit status.
int RelayWorldLoop(supervise::WorldMachine& vm, const Plan& plan, net::SecretStore* secrets, const char* noun,
                   RelayMode mode, linux::UniqueFd sigfd, linux::FrameReader* reader,
                   std::vector<linux::Frame> pending);

}  // namespace agentbox::session
