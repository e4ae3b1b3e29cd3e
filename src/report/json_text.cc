#include "report/json_text.h"

#include <rapidjson/encodedstream.h>
#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

namespace agentbox::report {

// The length of the well-formed UTF-8 sequence at s[i] (s[i] >= 0x80), or
// 0: no overlong forms, no surrogates, nothing past U+10FFFF.
std::size_t Utf8SequenceLength(const unsigned char* s, std::size_t i, std::size_t n) {
  const unsigned char c = s[i];
  std::size_t len = 0;
  unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  }
  if (len == 0 || i + len > n) return 0;
  if (s[i + 1] < lo || s[i + 1] > hi) return 0;
  for (std::size_t k = 2; k < len; ++k) {
    if (s[i + k] < 0x80 || s[i + k] > 0xbf) return 0;
  }
  return len;
}

bool WellFormedUtf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    while (i + 8 <= n) {
      std::uint64_t x;
      std::memcpy(&x, s + i, sizeof x);
      if ((x & 0x8080808080808080ULL) != 0) break;
      i += 8;
    }
    if (i >= n) break;
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    const std::size_t len = Utf8SequenceLength(s, i, n);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

namespace {

using nlohmann::json;

// The bytes that end a run copied as it is: what JSON escapes, and the
// lead bytes of multi-byte UTF-8 (checked, then copied too).
constexpr std::array<bool, 256> kSpecial = [] {
  std::array<bool, 256> t{};
  for (int c = 0; c < 256; ++c) t[c] = c < 0x20 || c == '"' || c == '\\' || c >= 0x80;
  return t;
}();

// Whether any of the eight bytes at `p` is special (kSpecial): a control
// character, '"', '\\' or a byte >= 0x80. The zero-byte test below (the
// bit-twiddling classic) can report a byte that is not special, never miss
// one that is: a false alarm costs a look at the bytes one by one.
inline bool AnySpecial8(const unsigned char* p) {
  std::uint64_t x;
  std::memcpy(&x, p, sizeof x);
  constexpr std::uint64_t kOnes = 0x0101010101010101ULL, kHigh = 0x8080808080808080ULL;
  auto has_zero = [](std::uint64_t v) { return (v - kOnes) & ~v & kHigh; };
  const std::uint64_t below_space = (x - kOnes * 0x20) & ~x & kHigh;  // a byte < 0x20
  return ((x & kHigh) | below_space | has_zero(x ^ (kOnes * '"')) | has_zero(x ^ (kOnes * '\\'))) != 0;
}

// `text` as a JSON string, escaped as nlohmann escapes it (ensure_ascii
// off); false, with nothing appended, when it is not valid UTF-8.
bool AppendString(const std::string& text, std::string* out) {
  const std::size_t start = out->size();
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  out->reserve(start + n + 2);
  out->push_back('"');
  std::size_t run = 0;  // where the bytes not yet appended begin
  std::size_t i = 0;
  while (i < n) {
    while (i + 8 <= n && !AnySpecial8(s + i)) i += 8;  // the common case: plain ASCII
    if (i >= n) break;
    const unsigned char c = s[i];
    if (!kSpecial[c]) {
      ++i;
      continue;
    }
    if (c >= 0x80) {
      const std::size_t len = Utf8SequenceLength(s, i, n);
      if (len == 0) {
        out->resize(start);
        return false;
      }
      i += len;
      continue;
    }
    out->append(text, run, i - run);
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default: {
        char u[8];
        std::snprintf(u, sizeof(u), "\\u%04x", static_cast<unsigned>(c));
        out->append(u, 6);
      }
    }
    run = ++i;
  }
  out->append(text, run, n - run);
  out->push_back('"');
  return true;
}

void AppendStringOrReplaced(const std::string& text, std::string* out) {
  if (!AppendString(text, out)) out->append(json(text).dump(-1, ' ', false, json::error_handler_t::replace));
}

// From this size on a text is read by rapidjson first (below it, nlohmann's
// lexer is quick enough, and small requests keep exactly their old path).
constexpr std::size_t kFastParseFrom = 16 * 1024;

// rapidjson's events, built into an nlohmann::json without recursion: the
// open containers on a stack, each value put into the innermost one (an
// object's duplicate key: the last one wins, as with nlohmann).
class Builder : public rapidjson::BaseReaderHandler<rapidjson::UTF8<>, Builder> {
 public:
  bool Null() { return Put(nullptr); }
  bool Bool(bool b) { return Put(b); }
  // rapidjson reports a number without fraction or exponent as unsigned
  // when it is not negative, as nlohmann types it.
  bool Int(int i) { return Put(static_cast<std::int64_t>(i)); }
  bool Uint(unsigned u) { return Put(static_cast<std::uint64_t>(u)); }
  bool Int64(std::int64_t i) { return Put(i); }
  bool Uint64(std::uint64_t u) { return Put(u); }
  bool Double(double d) { return Put(d); }
  bool String(const char* s, rapidjson::SizeType n, bool) {
    return WellFormedUtf8(std::string_view(s, n)) && Put(std::string(s, n));
  }
  bool Key(const char* s, rapidjson::SizeType n, bool) {
    if (!WellFormedUtf8(std::string_view(s, n))) return false;
    key_.assign(s, n);
    return true;
  }
  bool StartObject() { return Open(json::object()); }
  bool EndObject(rapidjson::SizeType) { return Close(); }
  bool StartArray() { return Open(json::array()); }
  bool EndArray(rapidjson::SizeType) { return Close(); }

  json Take() { return std::move(root_); }

 private:
  json* Place(json&& v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& top = *open_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();  // nothing else goes into `top` while this value is open
    }
    json& slot = top[key_];
    slot = std::move(v);
    return &slot;
  }
  template <class T>
  bool Put(T&& v) {
    Place(json(std::forward<T>(v)));
    return true;
  }
  bool Open(json&& container) {
    open_.push_back(Place(std::move(container)));
    return true;
  }
  bool Close() {
    open_.pop_back();
    return true;
  }

  json root_;
  std::vector<json*> open_;
  std::string key_;
};

std::optional<json> ParseLarge(std::string_view text) {
  // rapidjson takes a NUL byte for the end of the text: a text holding one
  // (never valid JSON) is nlohmann's to refuse.
  if (text.size() < kFastParseFrom || std::memchr(text.data(), '\0', text.size()) != nullptr) return std::nullopt;
  rapidjson::MemoryStream bytes(text.data(), text.size());
  rapidjson::EncodedInputStream<rapidjson::UTF8<>, rapidjson::MemoryStream> in(bytes);
  Builder builder;
  rapidjson::Reader reader;
  // No kParseValidateEncodingFlag: every string and key is checked by the
  // builder (WellFormedUtf8, stricter, and a few times quicker), and outside
  // them a byte that is not ASCII is a syntax error anyway.
  constexpr unsigned kFlags = rapidjson::kParseIterativeFlag | rapidjson::kParseFullPrecisionFlag;
  if (reader.Parse<kFlags>(in, builder).IsError()) return std::nullopt;
  return builder.Take();
}

}  // namespace

json ParseJson(std::string_view text) {
  if (auto fast = ParseLarge(text)) return std::move(*fast);
  return json::parse(text);
}

json ParseJsonOrDiscarded(std::string_view text) {
  if (auto fast = ParseLarge(text)) return std::move(*fast);
  return json::parse(text, nullptr, /*allow_exceptions=*/false);
}

void AppendCompactJson(const json& value, std::string* out) {
  switch (value.type()) {
    case json::value_t::object: {
      out->push_back('{');
      bool first = true;
      for (auto it = value.begin(); it != value.end(); ++it) {
        if (!first) out->push_back(',');
        first = false;
        AppendStringOrReplaced(it.key(), out);
        out->push_back(':');
        AppendCompactJson(it.value(), out);
      }
      out->push_back('}');
      return;
    }
    case json::value_t::array: {
      out->push_back('[');
      bool first = true;
      for (const auto& element : value) {
        if (!first) out->push_back(',');
        first = false;
        AppendCompactJson(element, out);
      }
      out->push_back(']');
      return;
    }
    case json::value_t::string:
      AppendStringOrReplaced(value.get_ref<const std::string&>(), out);
      return;
    case json::value_t::boolean:
      out->append(value.get<bool>() ? "true" : "false");
      return;
    case json::value_t::null:
      out->append("null");
      return;
    case json::value_t::number_integer:
      out->append(std::to_string(value.get<std::int64_t>()));
      return;
    case json::value_t::number_unsigned:
      out->append(std::to_string(value.get<std::uint64_t>()));
      return;
    default:  // floats (nlohmann's own format), binary, discarded
      out->append(value.dump(-1, ' ', false, json::error_handler_t::replace));
      return;
  }
}

std::string CompactJson(const json& value) {
  std::string out;
  AppendCompactJson(value, &out);
  return out;
}

}  // namespace agentbox::report
