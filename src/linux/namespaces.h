// Namespace set-up steps run by the runner inside its new namespaces.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "agentbox/status.h"

namespace agentbox::linux {

// clone flags for the namespace names of a plan ("user", "mnt", ...).
unsigned long NamespaceFlags(const std::vector<std::string>& names);

// Maps the invoking uid/gid to themselves. Written by the process itself,
// first thing after clone.
[[nodiscard]] Status WriteIdMaps(uid_t uid, gid_t gid);

// Brings `lo` up in the new network namespace: the only interface there is.
[[nodiscard]] Status BringUpLoopback();

[[nodiscard]] Status SetHostname(const std::string& name);

}  // namespace agentbox::linux
