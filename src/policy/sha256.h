// SHA-256 of a byte string, for the policy digest in outcome reports.
//
// Self-contained so that the policy layer needs no crypto library; it is not
// meant for anything secret (no constant-time guarantees).
#pragma once

#include <string>
#include <string_view>

namespace agentbox {

// Lowercase hex SHA-256 (FIPS 180-4) of `data`.
std::string Sha256Hex(std::string_view data);

}  // namespace agentbox
