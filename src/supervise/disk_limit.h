// disk_gib on a workspace: telling a write stopped by the cap (ENOSPC on a
// filesystem of the cap's size) from any other failure, and reporting it as
// a resources denial that names disk_gib.
//
//   Denial{facet "resources", op "write", target <the workspace as the
//          sandbox sees it, or the file when known>,
//          reason "disk_gib: the workspace's 1 GiB is full (ENOSPC)",
//          source "statfs" | "stderr-signature"}
//
// Two kinds of evidence: the capped filesystem itself, measured after the
// call (statfs: full), and, when the command freed space again before it
// ended, the kernel's message in what it wrote. Thread-safe; no state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "agentbox/outcome.h"

namespace agentbox::supervise {

// strerror(ENOSPC), as programs print it.
inline constexpr std::string_view kNoSpaceSignature = "No space left on device";

// Below this much free space (or 1% of the cap, when more; or with no free
// inode) a capped filesystem counts as full: a write that failed there
// failed for want of space. A writer stops at its first failed write, which
// leaves up to one write's worth of room.
inline constexpr std::uint64_t kDiskFullSlackBytes = 1 << 20;
std::uint64_t DiskFullSlack(std::uint64_t cap_bytes);

// "disk_gib: the workspace's 1 GiB is full (ENOSPC)"; `errno_name` EDQUOT
// for a project quota.
std::string DiskFullReason(std::uint64_t cap_bytes, const char* errno_name = "ENOSPC");

// A denial when the filesystem of `capped_fs_fd` (any fd on it) is full, by
// fstatfs after the call; none when it has room, or fstatfs fails.
std::optional<Denial> DiskFullDenial(int capped_fs_fd, std::uint64_t cap_bytes, std::string target);

// A denial when `output` holds kNoSpaceSignature (source stderr-signature):
// for a command that failed on a full workspace and freed space before it
// ended. The message may also come from another full filesystem of disk_gib's
// size (the sandbox's /tmp): the reason says disk_gib either way.
std::optional<Denial> DiskFullDenialFromOutput(std::string_view output, std::uint64_t cap_bytes, std::string target);

}  // namespace agentbox::supervise
