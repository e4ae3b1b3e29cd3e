// Host paths mounted into a running world's mount namespace, and taken out
// again: how a filesystem grant reaches a session without a new world.
//
// The world's init hands its supervisor three descriptors once its root is
// built (SendWorldNamespaces): its user and mount namespaces and its root.
// The init is not dumpable, so /proc/PID/ns/* and setns(pidfd) are refused
// to an unprivileged supervisor; descriptors the init opened itself are not.
//
// Each graft runs in a forked, single-threaded child of the supervisor (a
// process with threads cannot join a user namespace), which joins the
// world's user namespace, takes a copy of the host's mount view there
// (unshare(CLONE_NEWNS): a mount namespace the world's user namespace owns,
// so open_tree is allowed without privilege on the host), clones the source
// tree, enters the world's mount namespace and attaches it.
#pragma once

#include <string>

#include "agentbox/status.h"
#include "linux/fd.h"

namespace agentbox::linux {

// What the supervisor holds to reach a running world's mounts.
struct WorldNamespaces {
  UniqueFd user;  // /proc/self/ns/user of the init
  UniqueFd mnt;   // /proc/self/ns/mnt of the init
  UniqueFd root;  // the init's "/" (O_PATH): the pivoted root
  bool valid() const { return user.valid() && mnt.valid() && root.valid(); }
};

// In the init, after its root is built: {"t":"ns"} with the three
// descriptors on `sock`.
[[nodiscard]] Status SendWorldNamespaces(int sock);
// In the supervisor: the message SendWorldNamespaces sent (it must be the
// next one on `sock`; MSG_DONTWAIT).
[[nodiscard]] Result<WorldNamespaces> ReceiveWorldNamespaces(int sock);

enum class GraftAccess { kReadOnly, kWritable };

// What becomes of a graft's mountpoint when it is ungrafted: removed when
// the graft made it, kept when it was there (a ceiling's directory).
enum class Mountpoint { kKeep, kRemove };

// Binds the host path `source` (a directory or a file; absolute, no symlink
// on the way) recursively at `target` (absolute, normalized) inside the
// world: read-only unless kWritable, always nosuid and nodev. The
// mountpoint and its missing parents are made on the world's root tmpfs,
// whose read-only seal is lifted for that moment and put back whatever
// happens. A target that is a mountpoint already, or lies inside any mount
// but the root tmpfs (a bound /usr, the private /tmp), is refused: only a
// new world can put something there. Errors have stage "graft" and name
// the syscall and path. The world's processes are untouched. Returns what
// UngraftFromWorld is to do with the mountpoint.
[[nodiscard]] Result<Mountpoint> GraftIntoWorld(const WorldNamespaces& ns, const std::string& source, const std::string& target,
                                    GraftAccess access);

// Detaches what is mounted at `target` inside the world (umount2
// MNT_DETACH, with what is beneath it), and with kRemove its mountpoint
// from the root tmpfs. `target` must be a mount directly on the root
// tmpfs; the caller names only what it grafted.
[[nodiscard]] Status UngraftFromWorld(const WorldNamespaces& ns, const std::string& target, Mountpoint mountpoint);

}  // namespace agentbox::linux
