#include "session/tool_inputs.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>

#include "agentbox/policy.h"
#include "confine/layers.h"
#include "linux/session_shell.h"
#include "session/session.h"

namespace agentbox::session {
namespace {

using Json = nlohmann::json;

const std::map<std::string, std::vector<ToolField>>& Table() {
  static const std::map<std::string, std::vector<ToolField>> table = {
      {"bash",
       {{"command", FieldType::kString, true, true},
        {"timeout", FieldType::kDuration},
        {"stdin", FieldType::kString},
        {"cwd", FieldType::kString, false, true},
        {"env", FieldType::kEnv}}},
      {"read_file",
       {{"path", FieldType::kString, true, true}, {"offset", FieldType::kCount}, {"limit", FieldType::kCount}}},
      {"write_file", {{"path", FieldType::kString, true, true}, {"content", FieldType::kString, true}}},
      {"edit_file",
       {{"path", FieldType::kString, true, true},
        {"old", FieldType::kString, true, true},
        {"new", FieldType::kString, true}}},
      {"list_dir", {{"path", FieldType::kString, false, true}}},  // none: the workspace
      {"glob", {{"pattern", FieldType::kString, true, true}}},
      {"run_code",
       {{"language", FieldType::kString, true, true},
        {"code", FieldType::kString, true, true},
        {"timeout", FieldType::kDuration}}},
  };
  return table;
}

Status CheckField(const std::string& tool, const ToolField& f, const Json& v) {
  const std::string where = tool + ": input." + f.name;
  switch (f.type) {
    case FieldType::kString:
      if (!v.is_string()) return Status::Error(kBadRequest, where + " must be a string");
      if (f.non_empty && v.get_ref<const std::string&>().empty()) {
        return Status::Error(kBadRequest, where + " must not be empty");
      }
      return {};
    case FieldType::kCount:
      // 3.0 is the integer 3, as JSON Schema counts it.
      if (!v.is_number() || v.get<double>() != std::floor(v.get<double>()) || v.get<double>() < 1 ||
          v.get<double>() > 9.0e15) {
        return Status::Error(kBadRequest, where + " must be an integer of at least 1");
      }
      return {};
    case FieldType::kDuration:
      if (v.is_number()) {
        if (!(v.get<double>() > 0)) return Status::Error(kBadRequest, where + " must be positive");
        if (!(v.get<double>() * 1000 <= static_cast<double>(kMaxDurationMs))) {
          return Status::Error(kBadRequest, where + " is longer than the maximum, 168h");
        }
        return {};
      }
      if (!v.is_string() || !ParseDurationMs(v.get<std::string>()).ok()) {
        return Status::Error(kBadRequest, where + " must be seconds or a duration like \"30s\"");
      }
      return {};
    case FieldType::kEnv:
      if (Status s = ValidateCallEnv(v); !s.ok()) return Status::Error(kBadRequest, tool + ": " + s.message());
      return {};
  }
  return {};
}

}  // namespace

const std::vector<ToolField>& ToolFields(const std::string& tool) {
  static const std::vector<ToolField> none;
  auto it = Table().find(tool);
  return it == Table().end() ? none : it->second;
}

Status ValidateToolInput(const std::string& tool, const Json& input) {
  if (!input.is_object()) return Status::Error(kBadRequest, tool + ": input must be a JSON object");
  const auto& fields = ToolFields(tool);
  for (const auto& [key, value] : input.items()) {
    auto f = std::find_if(fields.begin(), fields.end(), [&](const ToolField& tf) { return key == tf.name; });
    if (f == fields.end()) {
      std::string names;
      for (const auto& tf : fields) names += (names.empty() ? "" : ", ") + std::string(tf.name);
      return Status::Error(kBadRequest, tool + ": input." + key + " is not a field of " + tool + " (its fields: " +
                                            names + ")");
    }
    if (Status s = CheckField(tool, *f, value); !s.ok()) return s;
  }
  for (const auto& f : fields) {
    if (f.required && !input.contains(f.name)) {
      return Status::Error(kBadRequest, tool + ": input." + f.name + " is required");
    }
  }
  return {};
}

Status ValidateCallEnv(const Json& env) {
  if (!env.is_object()) return Status::Error(kBadRequest, "input.env must be an object of NAME: \"value\"");
  const auto& reserved = SandboxEnvNames();
  for (const auto& [name, value] : env.items()) {
    if (!linux::IsShellVariableName(name)) {
      return Status::Error(kBadRequest, "input.env." + name + ": not a variable name ([A-Za-z_][A-Za-z0-9_]*)");
    }
    if (std::find(reserved.begin(), reserved.end(), name) != reserved.end()) {
      return Status::Error(kBadRequest, "input.env." + name + ": agentbox sets " + name +
                                            " for the sandbox itself (its egress proxy or trust store); a call "
                                            "may not override it");
    }
    if (!value.is_string()) return Status::Error(kBadRequest, "input.env." + name + " must be a string");
    if (value.get_ref<const std::string&>().find('\0') != std::string::npos) {
      return Status::Error(kBadRequest, "input.env." + name + " holds a NUL byte, which no variable can carry");
    }
  }
  return {};
}

Json NormalizeToolInput(const std::string& tool, Json input) {
  Json out = std::move(input);
  for (const auto& f : ToolFields(tool)) {
    if (f.type == FieldType::kCount && out.contains(f.name) && out[f.name].is_number_float()) {
      out[f.name] = static_cast<std::uint64_t>(out[f.name].get<double>());
    }
  }
  return out;
}

std::uint64_t DurationFieldMs(const Json& value) {
  if (value.is_number()) return static_cast<std::uint64_t>(value.get<double>() * 1000);
  auto ms = ParseDurationMs(value.get<std::string>());
  return ms.ok() ? *ms : 0;
}

}  // namespace agentbox::session
