// `agentbox run --workspace-overlay`: the capped upper layer travels from the
// runner to the supervisor. The runner mounts a fresh tmpfs of the plan's
// size inside the sandbox's mount namespace, creates the overlay's upper and
// work directories in it and sends a descriptor of its root over a Unix
// socketpair (SCM_RIGHTS). That descriptor keeps the tmpfs alive after the
// sandbox and its namespace are gone, so the supervisor can read the layer
// then, apply it to the workspace or drop it; closing it frees the memory.
#pragma once

#include "agentbox/status.h"
#include "linux/fd.h"

namespace agentbox::linux {

// Runner side: sends `layer_root` (an O_DIRECTORY descriptor) over `sock`.
// Errors carry the stage "mount".
Status SendUpperLayer(int sock, int layer_root);

// Supervisor side, once the runner is gone: the descriptor it sent, or an
// invalid UniqueFd when it sent none (it failed before mounting the
// workspace, and said why on its status pipe). Never blocks.
Result<UniqueFd> ReceiveUpperLayer(int sock);

}  // namespace agentbox::linux
