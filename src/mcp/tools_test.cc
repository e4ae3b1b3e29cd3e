#include "mcp/tools.h"

#include <gtest/gtest.h>

namespace agentbox::mcp {
namespace {

Json Outcome(const std::string& kind, Json extra = Json::object()) {
  Json r = {{"output", "out\n"}, {"is_error", true}, {"kind", kind}, {"outcome", extra}};
  return r;
}

TEST(Headline, NamesTheKindAndTheLimit) {
  EXPECT_EQ(Headline(Outcome("timed_out", {{"usage", {{"limits", {{"wall_clock_ms", 30000u}}}}}})),
            "timed_out after 30s");
  EXPECT_EQ(Headline(Outcome("timed_out", {{"usage", {{"limits", {{"wall_clock_ms", 1500u}}}}}})),
            "timed_out after 1.5s");
  EXPECT_EQ(Headline(Outcome("timed_out")), "timed_out");
  EXPECT_EQ(Headline(Outcome("oom_killed", {{"usage", {{"limits", {{"memory_max_bytes", 512u << 20}}}}}})),
            "oom_killed at 512 MiB");
  EXPECT_EQ(Headline(Outcome("oom_killed", {{"usage", {{"limits", {{"memory_max_bytes", 2ull << 30}}}}}})),
            "oom_killed at 2 GiB");
  EXPECT_EQ(Headline(Outcome("sandbox_error", {{"error", {{"stage", "mount"}, {"message", "mount(/usr): EPERM"}}}})),
            "sandbox_error: mount: mount(/usr): EPERM");
  Json exited = Outcome("exited");
  exited["exit_code"] = 2;
  EXPECT_EQ(Headline(exited), "exited with code 2");
  exited["is_error"] = false;
  exited["exit_code"] = 0;
  EXPECT_EQ(Headline(exited), "");
}

TEST(Headline, ADenialNamesWhatWasRefused) {
  Json net = Outcome("sandbox_denied", {{"denials",
                                         {{{"facet", "network"},
                                           {"op", "connect"},
                                           {"target", "evil.example:443"},
                                           {"reason", "not in allowlist"},
                                           {"source", "proxy"}}}}});
  EXPECT_EQ(Headline(net), "sandbox_denied: network egress to evil.example:443 not in allowlist");
  Json two = net;
  two["outcome"]["denials"].push_back(
      {{"facet", "filesystem"}, {"op", "write"}, {"target", "/w/.git/config"}, {"reason", "read-only"}});
  EXPECT_EQ(Headline(two), "sandbox_denied: network egress to evil.example:443 not in allowlist (and 1 more)");
  Json fs = Outcome("sandbox_denied", {{"denials",
                                        {{{"facet", "filesystem"},
                                          {"op", "write"},
                                          {"target", "/w/.git/config"},
                                          {"reason", "read-only (protected path)"}}}}});
  EXPECT_EQ(Headline(fs), "sandbox_denied: write /w/.git/config: read-only (protected path)");
}

TEST(RenderResult, PutsTheKindFirstUnlessTheSessionDid) {
  Json r = Outcome("timed_out", {{"usage", {{"limits", {{"wall_clock_ms", 30000u}}}}}});
  Json out = RenderResult("bash", r, 1024);
  EXPECT_EQ(out["isError"], true);
  EXPECT_EQ(out["content"][0]["text"], "timed_out after 30s\nout\n");
  EXPECT_EQ(out["structuredContent"]["outcome"], r["outcome"]);
  EXPECT_EQ(out["structuredContent"]["name"], "bash");

  Json already = {{"output", "sandbox_denied: write to /w/.git/config: read-only (protected path)"},
                  {"is_error", true},
                  {"kind", "sandbox_denied"}};
  EXPECT_EQ(RenderResult("write_file", already, 1024)["content"][0]["text"], already["output"]);

  Json tool_error = {{"output", "`old` occurs 2 times in a.txt"}, {"is_error", true}, {"kind", "tool_error"}};
  EXPECT_EQ(RenderResult("edit_file", tool_error, 1024)["content"][0]["text"],
            "tool_error: `old` occurs 2 times in a.txt");
}

TEST(RenderResult, EmptyOutputSaysSo) {
  Json ok = {{"output", ""}, {"is_error", false}, {"kind", "exited"}, {"exit_code", 0}};
  EXPECT_EQ(RenderResult("bash", ok, 1024)["content"][0]["text"], "(no output)");
}

TEST(RenderResult, LongOutputIsCutWithANote) {
  Json big = {{"output", std::string(5000, 'x')}, {"is_error", false}, {"kind", "ok"}};
  Json out = RenderResult("read_file", big, 1000);
  const std::string text = out["content"][0]["text"];
  EXPECT_LT(text.size(), 1200u);
  EXPECT_EQ(text.substr(0, 1000), std::string(1000, 'x'));
  EXPECT_NE(text.find("[output truncated: 1000 of 5000 bytes shown; use offset and limit"), std::string::npos);
  EXPECT_EQ(out["structuredContent"]["truncated"], true);
  EXPECT_EQ(out["structuredContent"]["output"], text);
  EXPECT_EQ(out["structuredContent"]["output_bytes"], 5000);
}

TEST(Cap, NeverSplitsAUtf8Sequence) {
  const std::string text = std::string(9, 'a') + "\xC3\xA9" + "bbbb";  // é straddles byte 10
  auto cut = Cap(text, 10, "[cut]");
  ASSERT_TRUE(cut);
  EXPECT_EQ(*cut, std::string(9, 'a') + "\n[cut]");
  EXPECT_FALSE(Cap("short", 10, "[cut]"));
}

TEST(Serialize, ReplacesInvalidUtf8InsteadOfThrowing) {
  Json m = {{"text", std::string("ok \xFF\xFE end")}};
  const std::string line = Serialize(m);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_NE(line.find("end"), std::string::npos);
  EXPECT_FALSE(Json::parse(line, nullptr, false).is_discarded());
}

TEST(Validate, TheToolSchemasSubset) {
  const Json schema = {{"type", "object"},
                       {"properties",
                        {{"s", {{"type", "string"}}},
                         {"n", {{"type", "integer"}, {"minimum", 1}}},
                         {"either", {{"type", {"integer", "string"}}}},
                         {"list", {{"type", "array"}, {"items", {{"type", "string"}}}}}}},
                       {"required", {"s"}},
                       {"additionalProperties", false}};
  EXPECT_EQ(Validate(Json{{"s", "x"}}, schema), "");
  EXPECT_EQ(Validate(Json{{"s", "x"}, {"n", 3.0}}, schema), "");  // 3.0 is an integer
  EXPECT_EQ(Validate(Json{{"s", "x"}, {"n", 3.5}}, schema), "arguments.n: expected integer, got number");
  EXPECT_EQ(Validate(Json{{"s", "x"}, {"either", true}}, schema),
            "arguments.either: expected integer or string, got boolean");
  EXPECT_EQ(Validate(Json{{"s", "x"}, {"list", {"a", 1}}}, schema), "arguments.list[1]: expected string, got integer");
  EXPECT_EQ(Validate(Json::array(), schema), "arguments: expected object, got array");
  EXPECT_EQ(Validate(Json{{"s", "x"}, {"zz", 1}}, schema), "arguments.zz: unknown field (allowed: either, list, n, s)");
}

TEST(Tools, EverySchemaValidatesAMinimalCall) {
  for (const auto& t : Tools(64 * 1024)) {
    Json args = Json::object();
    for (const auto& name : t.input_schema.value("required", Json::array())) args[name.get<std::string>()] = "x";
    EXPECT_EQ(Validate(args, t.input_schema), "") << t.name;
    if (t.name == "bash" || t.name == "read_file") {
      EXPECT_NE(t.description.find("capped at 64 KiB"), std::string::npos) << t.name;
    }
  }
}

}  // namespace
}  // namespace agentbox::mcp
