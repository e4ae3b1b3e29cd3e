// Sizes ("512Mi", "1.5G") and durations ("90s", "5m"), shared by the policy
// file and the command line. Errors carry only what is wrong with the text;
// callers prefix where it came from (a file location or a flag name).
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "agentbox/policy.h"

namespace agentbox {
namespace {

// An exact decimal `digits / 10^scale`. 128-bit arithmetic keeps "1.5G" and
// "0.25h" exact instead of going through a double.
struct Decimal {
  unsigned __int128 digits = 0;
  unsigned __int128 scale = 1;
};

// More digits than this cannot make a meaningful uint64 and could overflow.
constexpr int kMaxDigits = 24;

// Reads `[0-9]+(\.[0-9]+)?` from the front of `text`; the rest is the unit.
bool SplitNumber(std::string_view text, Decimal& number, std::string_view& unit, bool& too_long) {
  std::size_t i = 0;
  int count = 0;
  bool seen_point = false;
  bool digit_before = false;
  bool digit_after = false;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (c >= '0' && c <= '9') {
      if (++count > kMaxDigits) {
        too_long = true;
        return false;
      }
      number.digits = number.digits * 10 + static_cast<unsigned>(c - '0');
      if (seen_point) {
        number.scale *= 10;
        digit_after = true;
      } else {
        digit_before = true;
      }
    } else if (c == '.' && !seen_point) {
      seen_point = true;
    } else {
      break;
    }
  }
  unit = text.substr(i);
  return digit_before && (!seen_point || digit_after);
}

// digits * multiplier / scale, rounded to nearest; false when it exceeds uint64.
bool Scale(const Decimal& number, std::uint64_t multiplier, std::uint64_t& out) {
  // digits < 10^24 (< 2^80) and multiplier <= 2^40 keep the product below 2^128.
  unsigned __int128 product = number.digits * multiplier;
  unsigned __int128 value = (product + number.scale / 2) / number.scale;
  if (value > std::numeric_limits<std::uint64_t>::max()) return false;
  out = static_cast<std::uint64_t>(value);
  return true;
}

Status UnitsError(std::string message) { return Status::Error("policy", std::move(message)); }

static_assert(kMaxSizeBytes == 1024ULL << 40 && kMaxDurationMs == 168ULL * 60 * 60 * 1000,
              "the texts below name the bounds");
constexpr std::string_view kMaxSizeText = "1024Ti";
constexpr std::string_view kMaxDurationText = "168h (7 days)";

}  // namespace

Result<std::uint64_t> ParseSize(const std::string& text) {
  const std::string bad = "invalid size \"" + text +
                          "\" (expected a number with an optional suffix K, M, G, T, Ki, Mi, Gi "
                          "or Ti, e.g. 512Mi)";
  Decimal number;
  std::string_view unit;
  bool too_long = false;
  if (!SplitNumber(text, number, unit, too_long)) {
    return UnitsError(too_long ? "size \"" + text + "\" is too large" : bad);
  }
  struct Suffix {
    std::string_view name;
    std::uint64_t multiplier;
  };
  static constexpr Suffix kSuffixes[] = {
      {"", 1},
      {"B", 1},
      {"K", 1000},
      {"KB", 1000},
      {"M", 1000'000},
      {"MB", 1000'000},
      {"G", 1000'000'000},
      {"GB", 1000'000'000},
      {"T", 1000'000'000'000},
      {"TB", 1000'000'000'000},
      {"Ki", 1ULL << 10},
      {"KiB", 1ULL << 10},
      {"Mi", 1ULL << 20},
      {"MiB", 1ULL << 20},
      {"Gi", 1ULL << 30},
      {"GiB", 1ULL << 30},
      {"Ti", 1ULL << 40},
      {"TiB", 1ULL << 40},
  };
  for (const Suffix& suffix : kSuffixes) {
    if (unit != suffix.name) continue;
    std::uint64_t bytes = 0;
    if (!Scale(number, suffix.multiplier, bytes)) {
      return UnitsError("size \"" + text + "\" is too large");
    }
    if (bytes == 0) return UnitsError("size \"" + text + "\" must be > 0");
    if (bytes > kMaxSizeBytes) {
      return UnitsError("size \"" + text + "\" is larger than the maximum, " + std::string(kMaxSizeText));
    }
    return bytes;
  }
  return UnitsError(bad);
}

Result<std::uint64_t> ParseDurationMs(const std::string& text) {
  const std::string bad =
      "invalid duration \"" + text + "\" (expected a number with a unit ms, s, m or h, e.g. 90s)";
  Decimal number;
  std::string_view unit;
  bool too_long = false;
  if (!SplitNumber(text, number, unit, too_long)) {
    return UnitsError(too_long ? "duration \"" + text + "\" is too long" : bad);
  }
  std::uint64_t multiplier = 0;
  if (unit == "ms") {
    multiplier = 1;
  } else if (unit == "s") {
    multiplier = 1000;
  } else if (unit == "m") {
    multiplier = 60 * 1000;
  } else if (unit == "h") {
    multiplier = 60 * 60 * 1000;
  } else {
    return UnitsError(bad);
  }
  std::uint64_t ms = 0;
  if (!Scale(number, multiplier, ms)) return UnitsError("duration \"" + text + "\" is too long");
  if (ms == 0) return UnitsError("duration \"" + text + "\" must be > 0");
  if (ms > kMaxDurationMs) {
    return UnitsError("duration \"" + text + "\" is longer than the maximum, " + std::string(kMaxDurationText));
  }
  return ms;
}

}  // namespace agentbox
