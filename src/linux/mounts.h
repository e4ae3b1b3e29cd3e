// The mount steps of the runner: a new root on a tmpfs, the plan's mounts,
// then the host's root detached. Runs inside the new user+mount namespaces.
#pragma once

#include "agentbox/plan.h"
#include "agentbox/status.h"
#include "linux/resolve.h"

namespace agentbox::linux {

// Stops our mounts from propagating to the host (and the host's to us).
[[nodiscard]] Status MakeMountsPrivate();

// Mounts the staging tmpfs and pivots into it; the host root stays reachable
// at /oldroot until DetachOldRoot(). Also prepares the empty mask sources.
[[nodiscard]] Status PivotToStagingRoot();

// One mount step. Host sources are read through /oldroot.
[[nodiscard]] Status ApplyMount(const ResolvedMount& mount, const Plan& plan);

// Binds per-sandbox random values over the host's identifiers where they
// show inside the new root: /proc/sys/kernel/random/boot_id, /etc/machine-id
// and /var/lib/dbus/machine-id. After the plan's mounts (procfs, /etc).
[[nodiscard]] Status ReplaceHostIds();

// Detaches the host root: after this nothing of the host is reachable except
// what was bound. procfs must be mounted before (the kernel checks that a
// fully visible procfs exists in the namespace).
[[nodiscard]] Status DetachOldRoot();

// Makes the new root itself read-only (its mounts keep their own flags).
[[nodiscard]] Status SealRoot();

}  // namespace agentbox::linux
