#include "gateway/gateway.h"

#include <algorithm>
#include <chrono>

#include "gateway/upstream.h"
#include "mcp/tools.h"

namespace agentbox::gateway {
namespace {

constexpr const char* kBadRequest = "bad_request";  // as session.h's

// The text of a CallToolResult's content, for a model: text items as they
// are, anything else named by its type and size.
std::string ContentText(const Json& content) {
  std::string out;
  if (!content.is_array()) return out;
  for (const Json& item : content) {
    if (!out.empty() && out.back() != '\n') out += "\n";
    const std::string type = item.is_object() ? item.value("type", "") : "";
    if (type == "text") {
      out += item.value("text", "");
    } else if (type == "resource" && item["resource"].is_object() && item["resource"].contains("text")) {
      out += item["resource"].value("text", "");
    } else {
      const std::size_t bytes = item.is_object() ? item.value("data", std::string()).size() : 0;
      out += "[" + (type.empty() ? std::string("item") : type) + (bytes ? ", " + std::to_string(bytes) + " bytes" : "") + "]";
    }
  }
  return out;
}

Json ErrorResult(const std::string& upstream, const std::string& tool, const std::string& why) {
  return {{"output", "tool_error: " + why}, {"is_error", true}, {"kind", "tool_error"}, {"truncated", false},
          {"output_bytes", 0}, {"upstream", {{"name", upstream}, {"tool", tool}}}};
}

}  // namespace

struct Gateway::Slot {
  UpstreamSpec spec;
  std::mutex mu;  // start and list
  std::shared_ptr<Upstream> running;
  bool listed = false;
  Json tools = Json::array();  // allowed and offered, the upstream's own names
};

Gateway::Gateway(std::vector<UpstreamSpec> upstreams, SecretValue secret, std::size_t output_cap)
    : secret_(std::move(secret)), output_cap_(output_cap) {
  for (auto& u : upstreams) {
    auto slot = std::make_unique<Slot>();
    slot->spec = std::move(u);
    slots_.push_back(std::move(slot));
  }
}

Gateway::~Gateway() = default;

bool Gateway::Routes(const std::string& name) const {
  const auto dot = name.find('.');
  if (dot == std::string::npos) return false;
  const std::string prefix = name.substr(0, dot);
  return std::any_of(slots_.begin(), slots_.end(), [&](const auto& s) { return s->spec.name == prefix; });
}

Result<std::shared_ptr<Upstream>> Gateway::Running(Slot& slot) {
  if (slot.running && slot.running->alive()) return slot.running;
  slot.running.reset();
  const UpstreamSpec& u = slot.spec;
  std::string secret;
  if (!u.secret.empty()) {
    auto value = secret_(u.secret);
    if (!value.ok()) return Status::Error("upstream", "upstream " + u.name + ": " + value.status().message());
    secret = std::move(*value);
  }
  const auto timeout = std::chrono::milliseconds(u.timeout_ms);
  if (!u.url.empty()) {
    auto started = HttpUpstream::Start(u.name, u.url, secret, timeout);
    std::fill(secret.begin(), secret.end(), '\0');
    if (!started.ok()) return started.status();
    slot.running = std::shared_ptr<Upstream>(std::move(*started));
    return slot.running;
  }
  std::vector<std::string> env;
  if (!u.secret.empty()) env.push_back(u.secret_env + "=" + secret);
  std::fill(secret.begin(), secret.end(), '\0');
  auto started = StdioUpstream::Start(u.name, u.command, env, timeout);
  for (std::string& e : env) std::fill(e.begin(), e.end(), '\0');
  if (!started.ok()) return started.status();
  slot.running = std::shared_ptr<Upstream>(std::move(*started));
  return slot.running;
}

Result<Json> Gateway::Listed(Slot& slot) {
  std::lock_guard<std::mutex> lock(slot.mu);
  auto up = Running(slot);
  if (!up.ok()) return up.status();
  if (slot.listed) return slot.tools;
  auto all = (*up)->ListTools(std::chrono::milliseconds(slot.spec.timeout_ms));
  if (!all.ok()) return all.status();
  Json tools = Json::array();
  for (const Json& t : *all) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) continue;
    const std::string name = t["name"];
    if (std::find(slot.spec.allow.begin(), slot.spec.allow.end(), name) == slot.spec.allow.end()) continue;
    tools.push_back(t);
  }
  slot.tools = std::move(tools);
  slot.listed = true;
  return slot.tools;
}

Json Gateway::Tools() {
  Json tools = Json::array(), errors = Json::array();
  for (auto& slot : slots_) {
    auto listed = Listed(*slot);
    if (!listed.ok()) {
      errors.push_back({{"upstream", slot->spec.name}, {"error", listed.status().message()}});
      continue;
    }
    for (const Json& t : *listed) {
      Json entry = {{"name", slot->spec.name + "." + t.value("name", "")},
                    {"description", t.value("description", "")},
                    {"inputSchema", t.value("inputSchema", Json{{"type", "object"}})},
                    {"upstream", slot->spec.name}};
      if (t.contains("outputSchema")) entry["outputSchema"] = t["outputSchema"];
      if (t.contains("title")) entry["title"] = t["title"];
      tools.push_back(std::move(entry));
    }
  }
  return {{"tools", tools}, {"errors", errors}};
}

Result<Json> Gateway::Call(const std::string& name, const Json& input) {
  const auto dot = name.find('.');
  const std::string prefix = dot == std::string::npos ? "" : name.substr(0, dot);
  const std::string tool = dot == std::string::npos ? name : name.substr(dot + 1);
  auto it = std::find_if(slots_.begin(), slots_.end(), [&](const auto& s) { return s->spec.name == prefix; });
  if (it == slots_.end()) return Status::Error(kBadRequest, "unknown tool '" + name + "'");
  Slot& slot = **it;
  const std::vector<std::string>& allow = slot.spec.allow;
  if (std::find(allow.begin(), allow.end(), tool) == allow.end()) {
    std::string names;
    for (const auto& a : allow) names += (names.empty() ? "" : ", ") + prefix + "." + a;
    return Status::Error(kBadRequest, "unknown tool '" + name + "'; upstream " + prefix + " offers: " + names);
  }
  auto listed = Listed(slot);
  if (!listed.ok()) return ErrorResult(prefix, tool, listed.status().message());
  auto t = std::find_if(listed->begin(), listed->end(), [&](const Json& j) { return j.value("name", "") == tool; });
  if (t == listed->end()) {
    return Status::Error(kBadRequest, "unknown tool '" + name + "': upstream " + prefix + " does not offer " + tool);
  }
  if (!input.is_object()) return Status::Error(kBadRequest, name + ": input must be a JSON object");
  std::string problem;
  try {
    problem = mcp::Validate(input, t->value("inputSchema", Json::object()), name);
  } catch (const std::exception& e) {
    problem = name + ": the upstream's input schema could not be applied (" + e.what() + ")";
  }
  if (!problem.empty()) return Status::Error(kBadRequest, problem);

  std::shared_ptr<Upstream> up;
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    auto running = Running(slot);
    if (!running.ok()) return ErrorResult(prefix, tool, running.status().message());
    up = *running;
  }
  auto r = up->CallTool(tool, input, std::chrono::milliseconds(slot.spec.timeout_ms));
  if (!r.ok()) return ErrorResult(prefix, tool, r.status().message());
  std::string text = ContentText(r->value("content", Json::array()));
  const std::size_t bytes = text.size();
  const bool truncated = bytes > output_cap_;
  if (truncated) {
    text.resize(output_cap_);
    text += "\n[output truncated: " + std::to_string(bytes) + " bytes, the first " + std::to_string(output_cap_) + " kept]";
  }
  const bool is_error = r->value("isError", false);
  Json upstream = {{"name", prefix}, {"tool", tool}, {"content", r->value("content", Json::array())}};
  if (r->contains("structuredContent")) upstream["structuredContent"] = (*r)["structuredContent"];
  return Json{{"output", is_error ? "tool_error: " + text : text},
              {"is_error", is_error},
              {"kind", is_error ? "tool_error" : "ok"},
              {"truncated", truncated},
              {"output_bytes", bytes},
              {"upstream", upstream}};
}

}  // namespace agentbox::gateway
