// The mount steps of the runner: a new root on a tmpfs, the plan's mounts,
// then the host's root detached. Runs inside the new user+mount namespaces.
#pragma once

#include "agentbox/plan.h"
#include "agentbox/status.h"
#include "linux/fd.h"
#include "linux/resolve.h"

namespace agentbox::linux {

// Stops our mounts from propagating to the host (and the host's to us).
[[nodiscard]] Status MakeMountsPrivate();

// Mounts the staging tmpfs and pivots into it; the host root stays reachable
// at /oldroot until DetachOldRoot(). Also prepares the empty mask sources.
[[nodiscard]] Status PivotToStagingRoot();

// A session's upper layer on a filesystem of its own (disk_gib,
// WorkspaceOverlay::upper_fs_bytes): what the overlay step is given, and
// what it leaves for the session's init to hand to its caller.
struct UpperFs {
  // An earlier world's upper filesystem (its root), whose upper layer is
  // copied into the new one before the overlay is mounted; -1: none.
  int seed_fd = -1;
  // Copies the contents of one upper layer directory into another, keeping
  // whiteouts and opaque marks (the session layer's copier: linux/ does not
  // know layers).
  Status (*copy_upper)(int from_dir, int to_dir) = nullptr;
  // Out: the new filesystem's root. Holding it keeps the filesystem, and
  // with it the session's changes, after the world that mounted it ends.
  UniqueFd root;
};

// One mount step. Host sources are read through /oldroot. `upper_fs`: for a
// kOverlay mount whose upper layer has a size of its own (sessions only).
[[nodiscard]] Status ApplyMount(const ResolvedMount& mount, const Plan& plan, UpperFs* upper_fs = nullptr);

// Binds per-sandbox random values over the host's identifiers where they
// show inside the new root: /proc/sys/kernel/random/boot_id, /etc/machine-id
// and /var/lib/dbus/machine-id; and, with a `dns_address`, a resolv.conf
// naming the supervisor's DNS there alone over /etc/resolv.conf and an
// /etc/hosts with localhost and `hostname` only (the connect() broker knows
// a name's addresses when its DNS handed them out). Absent files stay
// absent: a resolver without resolv.conf asks 127.0.0.1, where the DNS
// listens. After the plan's mounts (procfs, /etc).
[[nodiscard]] Status ReplaceHostFiles(const std::string& dns_address, const std::string& hostname);

// Detaches the host root: after this nothing of the host is reachable except
// what was bound. procfs must be mounted before (the kernel checks that a
// fully visible procfs exists in the namespace).
[[nodiscard]] Status DetachOldRoot();

// Makes the new root itself read-only (its mounts keep their own flags).
[[nodiscard]] Status SealRoot();

}  // namespace agentbox::linux
