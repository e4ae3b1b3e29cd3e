// Compact JSON text of a value: the text of
//   value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
// byte for byte, made without nlohmann's per-byte escaper for strings that
// are valid UTF-8 (a call's output, a file's content: megabytes in a
// result, its log line and its HTTP answer). A string with invalid UTF-8
// goes through nlohmann's own (its replacement characters).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace agentbox::report {

// The length of the well-formed UTF-8 sequence (RFC 3629) that starts with
// the byte s[i] >= 0x80 and ends before s[n]; 0 when there is none there.
std::size_t Utf8SequenceLength(const unsigned char* s, std::size_t i, std::size_t n);
// Whether all of `text` is well-formed UTF-8 (ASCII is checked eight bytes
// at a time).
bool WellFormedUtf8(std::string_view text);

std::string CompactJson(const nlohmann::json& value);
// Appends the text to `*out`.
void AppendCompactJson(const nlohmann::json& value, std::string* out);

// nlohmann::json::parse(text): the same value, and for a text it refuses
// the same nlohmann::json::parse_error. A large text (a file's content in a
// write_file call) is read by rapidjson first: nlohmann's lexer takes ~8 ms
// a MiB of string here, rapidjson well under one. Its value is taken only
// when rapidjson accepts the whole text (RFC 8259, no extensions) and every
// string and key is well-formed UTF-8 (no surrogate, escaped or not);
// otherwise nlohmann reads it as before, its errors included.
nlohmann::json ParseJson(std::string_view text);
// The same, as json::parse(text, nullptr, false): a discarded value for a
// text that is not JSON.
nlohmann::json ParseJsonOrDiscarded(std::string_view text);

}  // namespace agentbox::report
