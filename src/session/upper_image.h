// A session's upper layer on an image file (disk_gib, root only): an ext4
// filesystem of the cap's size in a sparse file under the session's state
// directory, loop-mounted on the host at a directory beside it. Unlike the
// tmpfs upper layer it is not memory, and it outlives the agentbox process
// (the image stays on disk; it is mounted again when needed).
//
// Needs CAP_SYS_ADMIN in the initial user namespace (mount(2) of ext4 and
// the loop devices) and mkfs.ext4. Thread-compatible: the caller serializes
// calls for one session.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "agentbox/status.h"

namespace agentbox::session {

// Whether this process can mount upper images at all (root, mkfs.ext4 and
// loop-control present): the Manager chooses the image only then.
bool UpperImageAvailable();

// Makes sure `mount_dir` holds the mounted image `image` (created, sized
// `bytes` and formatted when missing), with the directories `upper` (mode
// `upper_mode`) and `work` at its root. Idempotent.
Status EnsureUpperImage(const std::string& image, const std::string& mount_dir, std::uint64_t bytes,
                        mode_t upper_mode);

// Unmounts `mount_dir` when it is mounted (its loop device goes with it:
// autoclear). The image stays.
Status UnmountUpperImage(const std::string& mount_dir);

}  // namespace agentbox::session
