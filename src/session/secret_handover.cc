#include "session/secret_handover.h"

#include "net/secrets.h"

namespace agentbox::session {

std::string SecretsMessage(const std::string& op,
                           const std::vector<std::pair<std::string, std::string_view>>& values) {
  static const char kDigits[] = "0123456789abcdef";
  std::string text = "{\"op\":" + nlohmann::json(op).dump() + ",\"values\":{";
  bool first = true;
  for (const auto& [name, value] : values) {
    if (!first) text += ',';
    first = false;
    text += nlohmann::json(name).dump() + ":\"";
    for (unsigned char c : value) {
      text += kDigits[c >> 4];
      text += kDigits[c & 15];
    }
    text += '"';
  }
  text += "}}";
  return text;
}

Result<std::vector<std::pair<std::string, std::string>>> TakeSecrets(nlohmann::json& message) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!message.is_object() || !message.contains("values") || !message["values"].is_object()) {
    return Status::Error("credentials", "the secrets message has no values");
  }
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  Status bad;
  for (auto& [name, v] : message["values"].items()) {
    if (!v.is_string()) {
      bad = Status::Error("credentials", "the value of " + name + " is not a string");
      continue;
    }
    std::string& hex = v.get_ref<std::string&>();
    std::string value;
    value.reserve(hex.size() / 2);
    for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
      const int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
      if (hi < 0 || lo < 0) {
        bad = Status::Error("credentials", "the value of " + name + " is not hex");
        break;
      }
      value += static_cast<char>(hi << 4 | lo);
    }
    net::Wipe(hex);
    out.emplace_back(name, std::move(value));
  }
  if (!bad.ok()) {
    for (auto& [n, value] : out) net::Wipe(value);
    return bad;
  }
  return out;
}

}  // namespace agentbox::session
