// Dropping every capability before the command runs.
#pragma once

#include "agentbox/status.h"

namespace agentbox::linux {

// Clears the bounding, ambient, inheritable, permitted and effective sets and
// locks the securebits so that exec as uid 0 grants nothing back. Sets
// no_new_privs. Irreversible for the calling process.
[[nodiscard]] Status DropAllCapabilities();

}  // namespace agentbox::linux
