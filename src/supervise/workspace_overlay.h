// `agentbox run --workspace-overlay`, the supervisor's half: once the
// sandbox is gone, the run's upper layer (on the tmpfs the runner handed
// over, linux/upper_layer.h) is compared with the workspace, and applied to
// it or dropped as `--apply` says. The tmpfs goes when its descriptor closes.
//
// What is applied: regular files (whole, by a temporary name and rename, with
// their mode and modification time), directories (created, their mode set;
// an opaque one replaces what the workspace had there), symlinks (as links,
// never followed), and deletions (overlay whiteouts). Sockets, fifos and
// devices are not. Paths in `skip` (the policy's protected paths, read-only
// during the run, and their placeholders) are never touched.
#pragma once

#include <set>
#include <string>

#include "agentbox/outcome.h"
#include "agentbox/plan.h"
#include "agentbox/status.h"

namespace agentbox::supervise {

// Applies the upper layer `upper_dir_fd` (an overlay upper directory: its
// whiteouts are deletions) to the host directory `workspace`. Resolves
// everything one component at a time from opened directories without
// following symlinks. Stops at the first error, which names the path and
// the syscall; what was applied before it stays applied.
Status ApplyUpperLayer(int upper_dir_fd, const std::string& workspace, const std::set<std::string>& skip);

// How the run ended, as far as `--apply on-success` cares: clean is the
// command's exit 0 with nothing of the sandbox's failing, no timeout and no
// OOM kill; `how` says what happened otherwise ("the command exited with 3").
struct RunEnd {
  bool clean = false;
  std::string how;
};

// The whole settlement for one run: the diff (for the report), the decision
// (plan.workspace_overlay->apply against how the run ended) and the apply.
// `layer_root` is the tmpfs root the runner sent (-1: none came, so the run
// never reached its workspace). `skip` as for ApplyUpperLayer.
WorkspaceOverlayResult SettleWorkspaceOverlay(const Plan& plan, int layer_root, const RunEnd& end,
                                              const std::set<std::string>& skip);

}  // namespace agentbox::supervise
