// What each tool of execute(name, input) takes: one table, the one the
// session checks every call's input against (and the MCP schemas are tested
// to agree with). A field not in it is refused, naming the field, as an
// unknown field of any request is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agentbox/status.h"

namespace agentbox::session {

enum class FieldType {
  kString,    // non_empty: "" is refused too
  kCount,     // an integer >= 1 (lines)
  kDuration,  // seconds (a number > 0) or a duration string ("30s"), at most 168h
  kEnv,       // an object of NAME → string (see ValidateCallEnv)
};

struct ToolField {
  const char* name;
  FieldType type;
  bool required = false;
  bool non_empty = false;
};

// The fields of `tool` (empty for a name that is not a tool).
const std::vector<ToolField>& ToolFields(const std::string& tool);

// Checks `input` against the tool's fields: an object, every required field
// present, each of the right type, nothing else. The error (stage
// bad_request) names the tool and the field: "bash: input.cwdd is not a
// field of bash (its fields: command, timeout, stdin, cwd, env)".
Status ValidateToolInput(const std::string& tool, const nlohmann::json& input);

// A bash call's `env`: names as the shell takes them ([A-Za-z_][A-Za-z0-9_]*),
// string values without NUL, and none of the variables agentbox sets for
// the sandbox itself (the proxy and trust-store variables: they are how its
// egress works).
Status ValidateCallEnv(const nlohmann::json& env);

// `input` (valid) with counts as integers (3.0 → 3): as the tools and the
// log take them.
nlohmann::json NormalizeToolInput(const std::string& tool, nlohmann::json input);

// A duration field's value in milliseconds (after ValidateToolInput).
std::uint64_t DurationFieldMs(const nlohmann::json& value);

}  // namespace agentbox::session
