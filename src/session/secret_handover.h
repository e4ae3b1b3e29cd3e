// Secrets from the daemon to a session's world: the daemon holds the
// sources (its environment, files, commands) and reads them; the world's
// proxy needs the values to inject them. They cross the world's channel
// (a socketpair) hex-encoded in one message, and every buffer that held
// them is zeroed on both sides.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agentbox/status.h"

namespace agentbox::session {

// {"op": op, "values": {name: hex}}: `op` is "secrets" (the world's first
// message) or "rotate". The caller wipes the text once it is sent.
std::string SecretsMessage(const std::string& op, const std::vector<std::pair<std::string, std::string_view>>& values);

// The values of such a message, decoded; the message's copies are zeroed.
Result<std::vector<std::pair<std::string, std::string>>> TakeSecrets(nlohmann::json& message);

}  // namespace agentbox::session
