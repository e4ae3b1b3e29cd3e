// JSON values of the report types, for code that composes larger documents.
#pragma once

#include <nlohmann/json.hpp>

#include "agentbox/outcome.h"
#include "agentbox/status.h"

namespace agentbox {

nlohmann::json ToJsonValue(const EnforcementReport& report);
nlohmann::json ToJsonValue(const Outcome& outcome);
nlohmann::json ToJsonValue(const Denial& denial);  // one element of `denials`

// The enforcement report back from ToJsonValue()'s form (`wrap` hands it to
// its `__exec` side, which writes the report `run` would). Facets come back
// in the object's (alphabetical) order; an error names the field.
Result<EnforcementReport> EnforcementFromJson(const nlohmann::json& j);

}  // namespace agentbox
