// Compact JSON text of a value: the text of
//   value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
// byte for byte, made without nlohmann's per-byte escaper for strings that
// are valid UTF-8 (a call's output, a file's content: megabytes in a
// result, its log line and its HTTP answer). A string with invalid UTF-8
// goes through nlohmann's own (its replacement characters).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace agentbox::report {

// The length of the well-formed UTF-8 sequence (RFC 3629) that starts with
// the byte s[i] >= 0x80 and ends before s[n]; 0 when there is none there.
std::size_t Utf8SequenceLength(const unsigned char* s, std::size_t i, std::size_t n);

std::string CompactJson(const nlohmann::json& value);
// Appends the text to `*out`.
void AppendCompactJson(const nlohmann::json& value, std::string* out);

}  // namespace agentbox::report
