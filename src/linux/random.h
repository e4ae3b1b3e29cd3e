// Random identifiers: session ids, snapshot ids, per-run nonces.
#pragma once

#include <cstddef>
#include <string>

namespace agentbox::linux {

// `bytes` random bytes from getrandom(2), as lower-case hex. Without an
// entropy source (never on a supported kernel) the bytes come from the
// clock and the pid: still unique enough to mark a run, never a secret.
std::string RandomHex(std::size_t bytes);

}  // namespace agentbox::linux
