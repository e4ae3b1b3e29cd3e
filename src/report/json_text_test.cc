#include "report/json_text.h"

#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <string>
#include <vector>

namespace agentbox::report {
namespace {

using nlohmann::json;

std::string Reference(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

TEST(CompactJson, ScalarsAndContainersAsNlohmannDumpsThem) {
  const json cases[] = {
      nullptr, true, false, 0, -1, 42, std::numeric_limits<std::int64_t>::min(),
      std::numeric_limits<std::uint64_t>::max(), 1.5, -0.0, 1e300, 0.1, "", "plain",
      json::array(), json::object(), json::array({1, "two", nullptr, json::object({{"k", json::array()}})}),
      json::object({{"b", 1}, {"a", json::object({{"z", "x"}, {"y", false}})}, {"", ""}}),
  };
  for (const json& v : cases) EXPECT_EQ(CompactJson(v), Reference(v)) << Reference(v);
}

TEST(CompactJson, EscapesEveryControlCharacterQuoteAndBackslash) {
  std::string all;
  for (int c = 0; c < 0x80; ++c) all.push_back(static_cast<char>(c));
  EXPECT_EQ(CompactJson(all), Reference(all));
  EXPECT_EQ(CompactJson(json::object({{all, all}})), Reference(json::object({{all, all}})));
}

TEST(CompactJson, KeepsValidUtf8AndReplacesInvalidAsNlohmannDoes) {
  const std::string samples[] = {
      "caf\xc3\xa9", "\xe2\x82\xac 100", "\xf0\x9f\x98\x80 emoji", "\xed\x9f\xbf", "\xf4\x8f\xbf\xbf",
      "\xc3", "\xc0\xaf", "\xe0\x80\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "ok\xffok", "\x80", "a\xe2\x82",
  };
  for (const std::string& s : samples) {
    EXPECT_EQ(CompactJson(s), Reference(s)) << Reference(s);
    EXPECT_EQ(CompactJson(json::object({{s, json::array({s})}})), Reference(json::object({{s, json::array({s})}})));
  }
}

TEST(CompactJson, RandomBytesAndRandomUtf8) {
  std::mt19937 rng(7);
  for (int round = 0; round < 2000; ++round) {
    std::string s;
    const int len = static_cast<int>(rng() % 64);
    for (int i = 0; i < len; ++i) {
      switch (rng() % 4) {
        case 0: s.push_back(static_cast<char>(rng() % 256)); break;   // anything
        case 1: s.push_back(static_cast<char>(rng() % 0x80)); break;  // ASCII
        case 2: s += "\xc3\xa9"; break;
        default: s += "\xf0\x9f\x98\x80"; break;
      }
    }
    ASSERT_EQ(CompactJson(s), Reference(s)) << Reference(s);
  }
}

// Plain ASCII is looked at eight bytes at a time: a byte that needs escaping
// or checking is found at every offset of such a word, and past the last one.
TEST(CompactJson, ASpecialByteIsFoundAtEveryOffsetOfALongPlainRun) {
  std::vector<std::string> specials;
  for (int c = 0; c < 0x20; ++c) specials.emplace_back(1, static_cast<char>(c));
  for (const char* t : {"\"", "\\", "\x7f", "~", " ", "\x80", "\xff", "\xc3\xa9", "\xe2\x82\xac",
                        "\xf0\x9f\x98\x80", "\xc3", "\xed\xa0\x80"}) {
    specials.emplace_back(t);
  }
  for (const std::string& special : specials) {
    for (std::size_t at = 0; at <= 24; ++at) {
      const std::string s = std::string(at, 'a') + special + std::string(24 - at + at % 3, 'z');
      ASSERT_EQ(CompactJson(s), Reference(s)) << Reference(s);
    }
  }
}

TEST(CompactJson, RandomMostlyPlainText) {
  std::mt19937 rng(11);
  for (int round = 0; round < 3000; ++round) {
    std::string s;
    const int len = static_cast<int>(rng() % 300);
    for (int i = 0; i < len; ++i) {
      const unsigned r = rng() % 100;
      if (r < 90) {
        s.push_back(static_cast<char>(0x20 + rng() % 0x5f));  // printable ASCII
      } else if (r < 95) {
        s.push_back(static_cast<char>(rng() % 0x20));
      } else if (r < 98) {
        s += "\xc3\xa9";
      } else {
        s.push_back(static_cast<char>(0x80 + rng() % 0x80));  // mostly not valid UTF-8
      }
    }
    ASSERT_EQ(CompactJson(s), Reference(s)) << Reference(s);
  }
}

TEST(CompactJson, AMebibyteOfTextIsTheSameText) {
  std::string text;
  while (text.size() < (1u << 20)) text += "line with \"quotes\", a tab\t and caf\xc3\xa9\n";
  const json result = {{"output", text}, {"kind", "ok"}, {"total_lines", 12345}};
  EXPECT_EQ(CompactJson(result), Reference(result));
}

}  // namespace
}  // namespace agentbox::report
