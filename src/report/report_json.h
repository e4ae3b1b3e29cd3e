// JSON values of the report types, for code that composes larger documents.
#pragma once

#include <nlohmann/json.hpp>

#include "agentbox/outcome.h"

namespace agentbox {

nlohmann::json ToJsonValue(const EnforcementReport& report);
nlohmann::json ToJsonValue(const Outcome& outcome);

}  // namespace agentbox
