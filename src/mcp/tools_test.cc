#include "mcp/tools.h"

#include <gtest/gtest.h>

#include <set>

#include "session/session.h"
#include "session/tool_inputs.h"

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

Json NetworkDenial(const std::string& target, Json escalation) {
  Json d = {{"facet", "network"}, {"op", "connect"}, {"target", target},
            {"reason", "not-allowed: " + target + " is not in network.allow"}, {"source", "proxy"}};
  if (!escalation.is_null()) d["escalation"] = std::move(escalation);
  return d;
}

// A denial with an offer tells the model how to ask for it, or why it
// cannot; once per offer, and never lost to the output cap.
TEST(RenderResult, AnEscalationOfferAddsALineTheModelCanActOn) {
  const Json within = {{"id", "esc-11a87832d6f9"}, {"grant", {{"network.allow", "api.test:443"}}}, {"within_ceiling", true}};
  const Json beyond = {{"id", "esc-222222222222"},
                       {"grant", {{"network.allow", "evil.test:443"}}},
                       {"within_ceiling", false},
                       {"why_not", "on_violation.max_grant.network does not cover evil.test:443"}};
  Json r = Outcome("sandbox_denied", {{"denials",
                                       {NetworkDenial("api.test:443", within), NetworkDenial("api.test:443", within),
                                        NetworkDenial("evil.test:443", beyond), NetworkDenial("x.test:443", nullptr)}}});
  const std::string text = RenderResult("bash", r, 1024)["content"][0]["text"];
  const std::string ask =
      "to retry with this permission (network.allow api.test:443), call request_escalation with offer_id "
      "esc-11a87832d6f9";
  EXPECT_NE(text.find(ask), std::string::npos) << text;
  EXPECT_EQ(text.find(ask), text.rfind(ask)) << "once per offer: " << text;
  EXPECT_NE(text.find("no escalation: on_violation.max_grant.network does not cover evil.test:443"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("esc-222222222222"), std::string::npos) << "a refused offer is not offered: " << text;
  EXPECT_EQ(text.rfind("sandbox_denied: network egress to api.test:443", 0), 0u) << text;

  r["output"] = std::string(5000, 'x');
  const Json cut = RenderResult("bash", r, 1024);
  EXPECT_EQ(cut["structuredContent"]["truncated"], true);
  const std::string cut_text = cut["content"][0]["text"];
  EXPECT_NE(cut_text.find(ask), std::string::npos) << "the line survives the cap";
  EXPECT_EQ(cut["structuredContent"]["output"], cut_text);

  // Without offers, nothing is added.
  Json plain = Outcome("sandbox_denied", {{"denials", {NetworkDenial("x.test:443", nullptr)}}});
  EXPECT_EQ(RenderResult("bash", plain, 1024)["content"][0]["text"].get<std::string>().find("escalation"),
            std::string::npos);
}

TEST(RenderEscalation, SaysTheDecisionInWords) {
  Json e = {{"offer_id", "esc-11a87832d6f9"}, {"grant", {{"filesystem.read", "/opt/sdk"}}}, {"state", "granted"},
            {"decision", "once"}};
  EXPECT_EQ(RenderEscalation(e)["content"][0]["text"], "granted once: filesystem.read /opt/sdk — the next call may use it");
  e["decision"] = "session";
  EXPECT_EQ(RenderEscalation(e)["content"][0]["text"],
            "granted for the session: filesystem.read /opt/sdk — every later call may use it");
  e["state"] = "denied";
  e["decision"] = "deny";
  e["decision_reason"] = "beyond the ceiling";
  EXPECT_EQ(RenderEscalation(e)["content"][0]["text"], "denied: beyond the ceiling");
  EXPECT_EQ(RenderEscalation(e)["structuredContent"], e);
  EXPECT_EQ(RenderEscalation(e)["isError"], false);
  Json memory = {{"grant", {{"resources.memory_gib", 4}}}, {"state", "granted"}, {"decision", "once"}};
  EXPECT_EQ(RenderEscalation(memory)["content"][0]["text"], "granted once: resources.memory_gib 4 — the next call may use it");
}

TEST(Tools, RequestEscalationTakesAnOfferIdAndAReason) {
  const auto tools = Tools(64 * 1024);
  const ToolSpec* t = FindTool(tools, "request_escalation");
  ASSERT_NE(t, nullptr);
  EXPECT_NE(t->description.find("offer_id"), std::string::npos);
  EXPECT_NE(t->description.find("granted once"), std::string::npos);
  EXPECT_NE(t->description.find("denied"), std::string::npos);
  EXPECT_EQ(Validate({{"offer_id", "esc-0123456789ab"}, {"reason", "r"}}, t->input_schema), "");
  EXPECT_NE(Validate({{"offer_id", "esc-0123456789AB"}, {"reason", "r"}}, t->input_schema), "");
  EXPECT_NE(Validate({{"offer_id", "esc-0123456789abc"}, {"reason", "r"}}, t->input_schema), "");
  EXPECT_NE(Validate({{"offer_id", "x esc-0123456789ab"}, {"reason", "r"}}, t->input_schema), "");
  EXPECT_NE(Validate({{"offer_id", "esc-0123456789ab"}, {"reason", "r"}, {"grant", "x"}}, t->input_schema), "");
  // Every tool that refuses a call can say how to ask.
  EXPECT_NE(FindTool(tools, "bash")->description.find("request_escalation"), std::string::npos);
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
    for (const auto& name : t.input_schema.value("required", Json::array())) {
      // A field with a pattern takes a value of that pattern's shape.
      const bool patterned = t.input_schema["properties"][name.get<std::string>()].contains("pattern");
      args[name.get<std::string>()] = patterned ? "esc-0123456789ab" : "x";
    }
    EXPECT_EQ(Validate(args, t.input_schema), "") << t.name;
    if (t.name == "bash" || t.name == "read_file") {
      EXPECT_NE(t.description.find("capped at 64 KiB"), std::string::npos) << t.name;
    }
  }
}

// A value the session takes for a field of this type.
Json Sample(session::FieldType type) {
  switch (type) {
    case session::FieldType::kString: return "x";
    case session::FieldType::kCount: return 2;
    case session::FieldType::kDuration: return 5;
    case session::FieldType::kEnv: return Json{{"NAME", "value"}};
  }
  return nullptr;
}

// Every session tool's schema says what the session accepts: the same
// fields, the same required ones, absent optional fields fine, undeclared
// fields refused by both. (A schema that declared a field optional which
// the session then refused would fail a model's call it was told is fine.)
// run_code as a session with both interpreters lists it.
ToolSpec RunCodeWithBoth() {
  auto spec = RunCodeTool({{"languages", {{{"language", "python"}}, {{"language", "javascript"}}}},
                           {"bindings", Json::array()}},
                          64 * 1024);
  return spec ? *spec : ToolSpec{};
}

TEST(Tools, SchemasAgreeWithWhatTheSessionAccepts) {
  std::size_t session_tools = 0;
  std::vector<ToolSpec> all = Tools(64 * 1024);
  all.push_back(RunCodeWithBoth());
  // run_code's language is one of its enum; the session's table says string.
  auto Sample = [](session::FieldType type, const std::string& field = "") -> Json {
    if (field == "language") return "python";
    return ::agentbox::mcp::Sample(type);
  };
  for (const auto& t : all) {
    const auto& fields = session::ToolFields(t.name);
    const Json& props = t.input_schema["properties"];
    EXPECT_EQ(t.input_schema.value("additionalProperties", true), false) << t.name;
    if (t.name == "request_escalation") continue;  // MCP's own, not a session tool (its own test below)
    if (fields.empty()) {
      // diff and snapshot: MCP's own, without arguments.
      EXPECT_TRUE(props.empty()) << t.name;
      continue;
    }
    ++session_tools;
    std::set<std::string> declared, required_in_schema, known, required;
    for (const auto& [name, _] : props.items()) declared.insert(name);
    for (const auto& r : t.input_schema.value("required", Json::array())) required_in_schema.insert(r.get<std::string>());
    for (const auto& f : fields) {
      known.insert(f.name);
      if (f.required) required.insert(f.name);
    }
    EXPECT_EQ(declared, known) << t.name;
    EXPECT_EQ(required_in_schema, required) << t.name;

    Json minimal = Json::object();
    for (const auto& f : fields) {
      if (f.required) minimal[f.name] = Sample(f.type, f.name);
    }
    EXPECT_EQ(Validate(minimal, t.input_schema), "") << t.name << " " << minimal.dump();
    EXPECT_TRUE(session::ValidateToolInput(t.name, minimal).ok()) << t.name << " " << minimal.dump();
    for (const auto& f : fields) {
      Json with = minimal;
      if (f.required) {
        with.erase(f.name);
        EXPECT_NE(Validate(with, t.input_schema), "") << t.name << " without " << f.name;
        EXPECT_FALSE(session::ValidateToolInput(t.name, with).ok()) << t.name << " without " << f.name;
      } else {
        with[f.name] = Sample(f.type, f.name);
        EXPECT_EQ(Validate(with, t.input_schema), "") << t.name << " " << with.dump();
        EXPECT_TRUE(session::ValidateToolInput(t.name, with).ok()) << t.name << " " << with.dump();
      }
      // An empty string where the session wants one that is not.
      if (f.type == session::FieldType::kString) {
        Json empty = minimal;
        empty[f.name] = "";
        EXPECT_EQ(Validate(empty, t.input_schema).empty(), session::ValidateToolInput(t.name, empty).ok())
            << t.name << "." << f.name << " = \"\"";
      }
    }
    Json undeclared = minimal;
    undeclared["undeclared"] = "x";
    EXPECT_NE(Validate(undeclared, t.input_schema), "") << t.name;
    const Status refused = session::ValidateToolInput(t.name, undeclared);
    EXPECT_FALSE(refused.ok()) << t.name;
    EXPECT_NE(refused.message().find("input.undeclared"), std::string::npos) << refused.message();
  }
  // Every tool a session may offer (run_code only where an interpreter is).
  EXPECT_GE(session_tools, session::ToolNames().size());
  EXPECT_EQ(session_tools, session::ToolNames().size() + (std::find(session::ToolNames().begin(), session::ToolNames().end(),
                                                                     "run_code") == session::ToolNames().end()));
}

// The values a duration, a count and an env field take or refuse, alike.
TEST(Tools, FieldValuesAgreeWithTheSession) {
  const auto tools = Tools(64 * 1024);
  const ToolSpec* bash = FindTool(tools, "bash");
  const ToolSpec* read = FindTool(tools, "read_file");
  ASSERT_TRUE(bash && read);
  const std::vector<Json> timeouts = {5, 0.5, "30s", "250ms", "2m", 0, -1, "30", "soon", true, 604800, 604801};
  for (const Json& timeout : timeouts) {
    const Json input = {{"command", "x"}, {"timeout", timeout}};
    EXPECT_EQ(Validate(input, bash->input_schema).empty(), session::ValidateToolInput("bash", input).ok())
        << "timeout " << timeout.dump();
  }
  const std::vector<Json> counts = {1, 3.0, 0, -2, 2.5, "3"};
  for (const Json& n : counts) {
    const Json input = {{"path", "x"}, {"offset", n}};
    EXPECT_EQ(Validate(input, read->input_schema).empty(), session::ValidateToolInput("read_file", input).ok())
        << "offset " << n.dump();
  }
  const std::vector<Json> envs = {Json::object(), Json{{"A_1", "v"}}, Json{{"1A", "v"}}, Json{{"A", 1}},
                                  Json{{"A-B", "v"}}, Json::array()};
  for (const Json& env : envs) {
    const Json input = {{"command", "x"}, {"env", env}};
    EXPECT_EQ(Validate(input, bash->input_schema).empty(), session::ValidateToolInput("bash", input).ok())
        << "env " << env.dump();
  }
}

}  // namespace
}  // namespace agentbox::mcp
