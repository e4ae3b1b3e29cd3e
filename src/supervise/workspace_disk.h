// disk_gib and the host workspace of `agentbox run`: telling that a run
// filled the workspace's cap. A write past it fails inside the sandbox
// (ENOSPC on the overlay's tmpfs, EDQUOT under a project quota); the
// supervisor reports it as a `resources` denial naming disk_gib, read from
// the cap itself after the run, never guessed from the command's output.
//
// (Sessions' capped upper layers have their own detection in
// supervise/disk_limit.h; the denial has the same shape.)
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "agentbox/outcome.h"

namespace agentbox::supervise {

// What counts as full: less than this left (or 1% of the cap, when more).
// A writer stops at the first failed write, which leaves up to one write's
// worth of room (a buffer, usually well under a MiB).
inline constexpr std::uint64_t kFullSlackBytes = 1ull << 20;

// The denial for a full cap: facet resources, op write, `target` (the
// workspace as the command saw it), reason "disk_gib: the workspace's
// <size> is full (<errno name>)", `source` (statfs, quota).
Denial WorkspaceDiskFullDenial(const std::string& target, std::uint64_t cap_bytes, const char* errno_name,
                               const char* source);

// --workspace-overlay: the upper layer's tmpfs (`layer_root`, its root
// directory) is full after the run. statfs on the tmpfs.
std::optional<Denial> WorkspaceOverlayFull(int layer_root, std::uint64_t cap_bytes, const std::string& target);

}  // namespace agentbox::supervise
