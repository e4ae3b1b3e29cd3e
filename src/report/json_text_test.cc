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
  for (const char* t : {"\"", "\\", "\x7f", "~", " ", "\x80", "\xff", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
                        "\xc3", "\xed\xa0\x80"}) {
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

// ParseJson is json::parse: the same value for every text nlohmann takes,
// the same error for every text it refuses, large texts (read by rapidjson
// first) included.
void ExpectParsedAsNlohmannDoes(const std::string& text) {
  const json expected = json::parse(text, nullptr, false);
  const json got = ParseJsonOrDiscarded(text);
  ASSERT_EQ(got.is_discarded(), expected.is_discarded()) << text.substr(0, 200);
  if (expected.is_discarded()) {
    std::string want, have;
    try {
      const json parsed = json::parse(text);
      want = "parsed: " + parsed.dump();  // not expected: nlohmann refused it without exceptions
    } catch (const json::exception& e) {  // parse_error, or out_of_range for a number past double's range
      want = e.what();
    }
    try {
      const json parsed = ParseJson(text);
      have = "parsed: " + parsed.dump();
    } catch (const json::exception& e) {
      have = e.what();
    }
    EXPECT_FALSE(want.empty());
    EXPECT_EQ(have, want);
    return;
  }
  EXPECT_EQ(got, expected) << text.substr(0, 200);
  EXPECT_EQ(got.dump(), expected.dump()) << text.substr(0, 200);  // the types of numbers too
  EXPECT_EQ(ParseJson(text), expected);
}

TEST(ParseJson, LargeTextsParseAndFailAsNlohmannParsesThem) {
  const std::string pad(20000, 'x');
  const char* fragments[] = {
      "1",
      "-0",
      "0.5",
      "-1.25e-3",
      "1e400",
      "-1e400",
      "18446744073709551615",
      "18446744073709551616",
      "-9223372036854775808",
      "-9223372036854775809",
      "4294967296",
      "-2147483649",
      "true",
      "false",
      "null",
      "\"\\ud83d\\ude00\"",
      "\"\\ud800\"",
      "\"\\udc00\"",
      "\"\\ud800\\u0041\"",
      "\"\\u0000\"",
      "\"\\/\\b\\f\\n\\r\\t\"",
      "\"\xed\xa0\x80\"",
      "\"\xc0\xaf\"",
      "\"\xf4\x90\x80\x80\"",
      "\"\xc3\xa9\"",
      "\"\xff\"",
      "\"a\x01"
      "b\"",
      "\"a\x7f"
      "b\"",
      "[1,2,]",
      "[1,,2]",
      "{\"a\":1,\"a\":2}",
      "{\"a\" 1}",
      "{\"a\":1,}",
      "{1:2}",
      "01",
      "-",
      "1.",
      ".5",
      "+1",
      "[",
      "]",
      "\"\\x\"",
      "\"\\u12\"",
      "NaN",
      "Infinity",
      "[1]x",
      "tru",
      "nul",
      "[[[[[]]]]]",
      "{\"\\ud800\":1}",
      "{\"\xc3\xa9\":[{}]}",
      "\"unterminated",
  };
  for (const char* f : fragments) {
    ExpectParsedAsNlohmannDoes("{\"pad\":\"" + pad + "\",\"v\":" + f + "}");
    ExpectParsedAsNlohmannDoes(std::string("[") + f + ",\"" + pad + "\"]");
    ExpectParsedAsNlohmannDoes(std::string(f) + std::string(20000, ' '));
  }
  // A byte-order mark, a NUL after the value, whitespace alone, nothing but
  // nesting: each as nlohmann takes it.
  ExpectParsedAsNlohmannDoes("\xef\xbb\xbf{\"pad\":\"" + pad + "\"}");
  ExpectParsedAsNlohmannDoes("{\"pad\":\"" + pad + "\"}" + std::string(1, '\0') + "junk");
  ExpectParsedAsNlohmannDoes(std::string(30000, ' '));
  ExpectParsedAsNlohmannDoes(std::string(20000, '[') + std::string(20000, ']'));
  ExpectParsedAsNlohmannDoes(std::string(20000, '[') + std::string(19999, ']'));
}

TEST(ParseJson, RandomlyDamagedLargeTexts) {
  std::mt19937 rng(5);
  json v = {{"name", "write_file"},
            {"input", {{"path", "a/b.txt"}, {"content", std::string(30000, 'c') + "\xc3\xa9\n\t\"q\"\\"}}},
            {"n", {1, -2, 3.5, nullptr, true, json::object({{"k", "v"}})}}};
  const std::string good = v.dump();
  ExpectParsedAsNlohmannDoes(good);
  const std::string specials = "\"\\{}[],:-+.eE0u\x01\x80\xc3\xed\xff \n";
  for (int round = 0; round < 400; ++round) {
    std::string t = good;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      // Mostly around the structure (the ends, where the numbers and keys are).
      const std::size_t at = rng() % 2 ? rng() % 40 : t.size() - 1 - rng() % 120;
      const char c = specials[rng() % specials.size()];
      switch (rng() % 3) {
        case 0:
          t[at] = c;
          break;
        case 1:
          t.insert(t.begin() + static_cast<std::ptrdiff_t>(at), c);
          break;
        default:
          t.erase(at, 1);
          break;
      }
    }
    ExpectParsedAsNlohmannDoes(t);
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace agentbox::report
