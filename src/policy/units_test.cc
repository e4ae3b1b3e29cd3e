#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "agentbox/policy.h"

namespace agentbox {
namespace {

struct UnitCase {
  std::string text;
  std::uint64_t value;
};

TEST(ParseSizeTest, AcceptsSuffixes) {
  const UnitCase cases[] = {
      {"4096", 4096},
      {"100B", 100},
      {"1K", 1000},
      {"1KB", 1000},
      {"2M", 2'000'000},
      {"1.5G", 1'500'000'000},
      {"1GB", 1'000'000'000},
      {"3T", 3'000'000'000'000},
      {"1TB", 1'000'000'000'000},
      {"1Ki", 1024},
      {"1KiB", 1024},
      {"512Mi", 512ULL << 20},
      {"512MiB", 512ULL << 20},
      {"2Gi", 2ULL << 30},
      {"0.5Gi", 512ULL << 20},
      {"2GiB", 2ULL << 30},
      {"1Ti", 1ULL << 40},
      {"1TiB", 1ULL << 40},
      {"1024Ti", 1024ULL << 40},
  };
  for (const UnitCase& c : cases) {
    Result<std::uint64_t> r = ParseSize(c.text);
    ASSERT_TRUE(r.ok()) << c.text << ": " << r.status().ToString();
    EXPECT_EQ(*r, c.value) << c.text;
  }
}

TEST(ParseSizeTest, RejectsBadSizes) {
  const std::string hint =
      "(expected a number with an optional suffix K, M, G, T, Ki, Mi, Gi or Ti, e.g. 512Mi)";
  const std::pair<std::string, std::string> cases[] = {
      {"", "invalid size \"\" " + hint},
      {"Mi", "invalid size \"Mi\" " + hint},
      {"12Qi", "invalid size \"12Qi\" " + hint},
      {"512 Mi", "invalid size \"512 Mi\" " + hint},
      {"-1Mi", "invalid size \"-1Mi\" " + hint},
      {"1.", "invalid size \"1.\" " + hint},
      {".5G", "invalid size \".5G\" " + hint},
      {"1mi", "invalid size \"1mi\" " + hint},
      {"0", "size \"0\" must be > 0"},
      {"0.0Gi", "size \"0.0Gi\" must be > 0"},
      {"16777216Ti", "size \"16777216Ti\" is too large"},
      {"18446744073709551616", "size \"18446744073709551616\" is too large"},
      {"1000000000000000000000000000", "size \"1000000000000000000000000000\" is too large"},
  };
  for (const auto& [text, message] : cases) {
    Result<std::uint64_t> r = ParseSize(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().stage(), "policy");
    EXPECT_EQ(r.status().message(), message);
  }
}

TEST(ParseSizeTest, LargestValueFits) {
  Result<std::uint64_t> r = ParseSize("1024Ti");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, kMaxSizeBytes);
  r = ParseSize(std::to_string(kMaxSizeBytes));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, kMaxSizeBytes);
}

// Sizes that fit in 64 bits but no sandbox could mean are refused when
// parsed, not passed on to wrap in a limit (a file size past 2^63 made
// every write fail with SIGXFSZ).
TEST(ParseSizeTest, RefusesAboveTheMaximum) {
  for (const std::string& text : {std::to_string(kMaxSizeBytes + 1), std::string("1025Ti"),
                                 std::string("16000000000Gi"), std::string("18446744073709551615")}) {
    Result<std::uint64_t> r = ParseSize(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().message(), "size \"" + text + "\" is larger than the maximum, 1024Ti");
  }
}

TEST(ParseDurationMsTest, AcceptsUnits) {
  const UnitCase cases[] = {
      {"250ms", 250},   {"1s", 1000},      {"90s", 90'000},    {"1.5s", 1500},     {"5m", 300'000},
      {"0.5m", 30'000}, {"1h", 3'600'000}, {"0.25h", 900'000}, {"45m", 2'700'000},
  };
  for (const UnitCase& c : cases) {
    Result<std::uint64_t> r = ParseDurationMs(c.text);
    ASSERT_TRUE(r.ok()) << c.text << ": " << r.status().ToString();
    EXPECT_EQ(*r, c.value) << c.text;
  }
}

// A duration past the bound used to wrap in std::chrono's nanoseconds:
// --timeout 3000000h timed out after 30 ms.
TEST(ParseDurationMsTest, RefusesAboveTheMaximum) {
  Result<std::uint64_t> r = ParseDurationMs("168h");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, kMaxDurationMs);
  for (const std::string text : {"3000000h", "169h", "604800001ms", "10081m"}) {
    r = ParseDurationMs(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().message(), "duration \"" + text + "\" is longer than the maximum, 168h (7 days)");
  }
}

TEST(ParseDurationMsTest, RejectsBadDurations) {
  const std::string hint = "(expected a number with a unit ms, s, m or h, e.g. 90s)";
  const std::pair<std::string, std::string> cases[] = {
      {"90", "invalid duration \"90\" " + hint},
      {"", "invalid duration \"\" " + hint},
      {"s", "invalid duration \"s\" " + hint},
      {"10d", "invalid duration \"10d\" " + hint},
      {"1h30m", "invalid duration \"1h30m\" " + hint},
      {"-5s", "invalid duration \"-5s\" " + hint},
      {"0s", "duration \"0s\" must be > 0"},
      {"0.1ms", "duration \"0.1ms\" must be > 0"},
      {"9999999999999999h", "duration \"9999999999999999h\" is too long"},
  };
  for (const auto& [text, message] : cases) {
    Result<std::uint64_t> r = ParseDurationMs(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().message(), message);
  }
}

}  // namespace
}  // namespace agentbox
