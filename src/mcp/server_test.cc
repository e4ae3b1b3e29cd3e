#include "mcp/server.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

namespace agentbox::mcp {
namespace {

using namespace std::chrono_literals;

// A session whose bash either answers at once or, for "block", waits until
// cancelled; every call is recorded.
class FakeSession : public SessionTools {
 public:
  Result<Json> Execute(const std::string& name, const Json& input, const session::OutputSink& sink,
                       const std::atomic<bool>* cancel) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      calls.push_back({name, input});
      started = true;
    }
    cv.notify_all();
    if (name == "bash" && input.value("command", "") == "block") {
      while (!cancel || !cancel->load()) std::this_thread::sleep_for(1ms);
      return Json{{"output", ""}, {"is_error", true}, {"kind", "cancelled"}};
    }
    if (name == "bash" && input.value("command", "") == "chatty") {
      // Output until the client has seen three progress notifications (or 10 s).
      for (int i = 0; i < 200 && !(progress_seen && progress_seen() >= 3); ++i) {
        if (sink) sink("line " + std::to_string(i) + "\n");
        std::this_thread::sleep_for(50ms);
      }
      return Json{{"output", "line 0\n...\n"}, {"is_error", false}, {"kind", "exited"}, {"exit_code", 0}};
    }
    if (name == "bash" && input.value("command", "") == "flood") {
      // 100 KiB at once, then a line of its own once the first went out.
      if (sink) sink(std::string(100 * 1024, 'x'));
      for (int i = 0; i < 200 && !(progress_seen && progress_seen() >= 1); ++i) std::this_thread::sleep_for(10ms);
      if (sink) sink("tail\n");
      return Json{{"output", "x...tail\n"}, {"is_error", false}, {"kind", "exited"}, {"exit_code", 0}};
    }
    if (name == "bash" && input.value("command", "") == "refuse") {
      return Status::Error(session::kBadRequest, "bash: timeout 0 is not a duration");
    }
    if (name == "bash" && input.value("command", "") == "gone") {
      return Status::Error(session::kNotFound, "no session s-1");
    }
    return next_result;
  }
  Result<std::string> Snapshot() override { return std::string("snap-7"); }
  Result<Json> RequestEscalation(const std::string& offer_id, const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      escalation_asks.push_back({offer_id, reason});
    }
    if (!escalation_error.ok()) return escalation_error;
    Json e = next_escalation;
    e["offer_id"] = offer_id;
    e["reason"] = reason;
    return e;
  }
  Result<Json> Diff() override {
    if (direct) return Status::Error(session::kBadRequest, "session s-1 works on its workspace directly");
    return Json{{"files", Json::array()}, {"patch", ""}};
  }

  void WaitStarted() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return started; });
  }

  std::mutex mu;
  std::condition_variable cv;
  bool started = false;
  std::vector<std::pair<std::string, Json>> calls;
  std::function<std::size_t()> progress_seen;
  bool direct = false;  // a session without a diff
  std::vector<std::pair<std::string, std::string>> escalation_asks;  // offer_id, reason
  Status escalation_error;  // not ok: RequestEscalation fails with it
  Json next_escalation = {{"id", "eg-1"},          {"session", "s-1"},    {"grant", {{"network.allow", "api.test:443"}}},
                          {"by", "mcp"},           {"state", "granted"},  {"decision", "once"},
                          {"decided_by", "approve-command /bin/ok"}, {"decision_reason", ""},
                          {"asked", true},         {"applied", "live"},   {"replayed", false}};
  Json next_result = {{"output", "hi\n"}, {"is_error", false}, {"kind", "exited"}, {"exit_code", 0}};
};

Json Request(int id, const std::string& method, Json params = Json::object()) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}};
}

Json Init(const std::string& version = "2025-06-18") {
  return Request(1, "initialize",
                 {{"protocolVersion", version}, {"capabilities", Json::object()},
                  {"clientInfo", {{"name", "test"}, {"version", "1"}}}});
}

Json Call(int id, const std::string& tool, Json arguments) {
  return Request(id, "tools/call", {{"name", tool}, {"arguments", arguments}});
}

int ErrorCode(const std::optional<Json>& r) {
  if (!r || !r->contains("error")) return 0;
  return (*r)["error"]["code"].get<int>();
}

class ServerTest : public ::testing::Test {
 protected:
  std::optional<Json> Send(const Json& m) { return server.Handle(m, notify); }
  std::optional<Json> SendText(const std::string& t) { return server.Handle(std::string_view(t), notify); }
  void Initialize(const std::string& version = "2025-06-18") {
    auto r = Send(Init(version));
    ASSERT_TRUE(r && r->contains("result")) << (r ? r->dump() : "no response");
  }

  FakeSession session;
  ServerOptions options = [] {
    ServerOptions o;
    o.progress_interval = 50ms;
    return o;
  }();
  Server server{session, options};
  std::mutex notes_mu;
  std::vector<Json> notes;
  Notify notify = [this](const Json& n) {
    std::lock_guard<std::mutex> lock(notes_mu);
    notes.push_back(n);
  };
};

TEST_F(ServerTest, InitializeAnswersTheClientsRevisionWhenSupported) {
  for (const std::string v : {"2025-06-18", "2025-03-26", "2024-11-05"}) {
    FakeSession s;
    Server fresh(s, options);
    auto r = fresh.Handle(Init(v), notify);
    ASSERT_TRUE(r);
    EXPECT_EQ((*r)["result"]["protocolVersion"], v);
    EXPECT_EQ((*r)["result"]["capabilities"]["tools"]["listChanged"], false);
    EXPECT_EQ((*r)["result"]["serverInfo"]["name"], "agentbox");
    EXPECT_EQ(fresh.protocol(), v);
  }
}

TEST_F(ServerTest, InitializeAnswersTheLatestForAnUnknownRevision) {
  auto r = Send(Init("2099-01-01"));
  ASSERT_TRUE(r);
  EXPECT_EQ((*r)["result"]["protocolVersion"], kProtocolLatest);
}

TEST_F(ServerTest, InitializeWithoutAVersionIsBadParams) {
  auto r = Send(Request(1, "initialize", {{"capabilities", Json::object()}}));
  EXPECT_EQ(ErrorCode(r), kInvalidParams);
  EXPECT_FALSE(server.initialized());
}

TEST_F(ServerTest, SecondInitializeIsRefused) {
  Initialize();
  EXPECT_EQ(ErrorCode(Send(Init())), kInvalidRequest);
}

TEST_F(ServerTest, RequestsBeforeInitializeAreRefusedButPingIsAnswered) {
  auto list = Send(Request(2, "tools/list"));
  EXPECT_EQ(ErrorCode(list), kNotInitialized);
  EXPECT_EQ((*list)["id"], 2);
  EXPECT_EQ(ErrorCode(Send(Call(3, "bash", {{"command", "true"}}))), kNotInitialized);
  EXPECT_TRUE(session.calls.empty());
  auto ping = Send(Request(4, "ping"));
  ASSERT_TRUE(ping);
  EXPECT_EQ((*ping)["result"], Json::object());
}

TEST_F(ServerTest, MalformedJsonIsAParseErrorWithNullId) {
  Initialize();
  auto r = SendText("{\"jsonrpc\": \"2.0\", \"id\": 5, \"method\": ");
  EXPECT_EQ(ErrorCode(r), kParseError);
  EXPECT_TRUE((*r)["id"].is_null());
  EXPECT_NE((*r)["error"]["message"].get<std::string>().find("not valid JSON"), std::string::npos);
  EXPECT_TRUE(Send(Request(6, "ping"))->contains("result"));
}

TEST_F(ServerTest, DeeplyNestedJsonDoesNotCrash) {
  Initialize();
  std::string deep(1000000, '[');
  auto r = SendText(deep);
  EXPECT_EQ(ErrorCode(r), kParseError);
  deep += std::string(1000000, ']');
  EXPECT_EQ(ErrorCode(SendText(deep)), kInvalidRequest);  // valid JSON, not a message
  EXPECT_TRUE(Send(Request(7, "ping"))->contains("result"));
}

TEST_F(ServerTest, InvalidRequestsAreNamed) {
  Initialize();
  EXPECT_EQ(ErrorCode(SendText("5")), kInvalidRequest);
  EXPECT_EQ(ErrorCode(Send(Json{{"id", 1}, {"method", "ping"}})), kInvalidRequest);  // no jsonrpc
  EXPECT_EQ(ErrorCode(Send(Json{{"jsonrpc", "2.0"}, {"id", nullptr}, {"method", "ping"}})), kInvalidRequest);
  EXPECT_EQ(ErrorCode(Send(Json{{"jsonrpc", "2.0"}, {"id", 1.5}, {"method", "ping"}})), kInvalidRequest);
  EXPECT_EQ(ErrorCode(Send(Json{{"jsonrpc", "2.0"}, {"id", 1}, {"method", 7}})), kInvalidRequest);
  EXPECT_EQ(ErrorCode(Send(Json{{"jsonrpc", "2.0"}, {"id", 1}})), kInvalidRequest);
  EXPECT_EQ(ErrorCode(Send(Json{{"jsonrpc", "2.0"}, {"id", 1}, {"method", "ping"}, {"params", {1, 2}}})),
            kInvalidParams);
}

TEST_F(ServerTest, UnknownMethodIsMethodNotFoundAndUnknownNotificationIsIgnored) {
  Initialize();
  auto r = Send(Request(9, "resources/list"));
  EXPECT_EQ(ErrorCode(r), kMethodNotFound);
  EXPECT_NE((*r)["error"]["message"].get<std::string>().find("resources/list"), std::string::npos);
  EXPECT_FALSE(Send(Json{{"jsonrpc", "2.0"}, {"method", "notifications/whatever"}}));
  // A response from the client (this server sends no requests) is dropped.
  EXPECT_FALSE(Send(Json{{"jsonrpc", "2.0"}, {"id", 3}, {"result", Json::object()}}));
}

TEST_F(ServerTest, ToolsListHasEveryToolWithAClosedSchema) {
  Initialize();
  auto r = Send(Request(2, "tools/list"));
  ASSERT_TRUE(r);
  const Json& tools = (*r)["result"]["tools"];
  std::vector<std::string> names;
  for (const auto& t : tools) {
    names.push_back(t["name"]);
    EXPECT_EQ(t["inputSchema"]["type"], "object") << t["name"];
    EXPECT_EQ(t["inputSchema"]["additionalProperties"], false) << t["name"];
    EXPECT_EQ(t["outputSchema"]["type"], "object") << t["name"];
    EXPECT_GT(t["description"].get<std::string>().size(), 100u) << t["name"];
  }
  EXPECT_EQ(names, (std::vector<std::string>{"bash", "read_file", "write_file", "edit_file", "list_dir", "glob",
                                             "diff", "snapshot", "request_escalation"}));
  EXPECT_NE(tools[0]["description"].get<std::string>().find("sandbox_denied"), std::string::npos);
}

TEST_F(ServerTest, BadToolArgumentsAreInvalidParamsNamingTheField) {
  Initialize();
  struct Case {
    std::string tool;
    Json args;
    std::string expect;
  };
  for (const Case& c : std::vector<Case>{
           {"nope", Json::object(), "unknown tool \"nope\""},
           {"bash", Json::object(), "arguments.command: required"},
           {"bash", {{"command", 5}}, "arguments.command: expected string, got integer"},
           {"bash", {{"command", "x"}, {"timeout", "soon"}}, "arguments.timeout: expected number, got string; or does not match"},
           {"bash", {{"command", "x"}, {"timeout", 0}}, "arguments.timeout: must be more than 0"},
           {"bash", {{"command", "x"}, {"env", {{"A", 1}}}}, "arguments.env.A: expected string, got integer"},
           {"bash", {{"command", "x"}, {"env", {{"1A", "v"}}}}, "arguments.env name \"1A\": does not match"},
           {"bash", {{"command", ""}}, "arguments.command: must not be empty"},
           {"read_file", {{"path", "a"}, {"lines", 3}}, "arguments.lines: unknown field"},
           {"edit_file", {{"path", "a"}, {"old", "x"}}, "arguments.new: required"},
           {"diff", {{"x", 1}}, "arguments.x: unknown field"},
           {"request_escalation", {{"reason", "r"}}, "arguments.offer_id: required"},
           {"request_escalation", {{"offer_id", "esc-0123456789ab"}}, "arguments.reason: required"},
           {"request_escalation", {{"offer_id", "esc-0123"}, {"reason", "r"}}, "arguments.offer_id: does not match"},
           {"request_escalation", {{"offer_id", "eg-1"}, {"reason", "r"}}, "arguments.offer_id: does not match"},
           {"request_escalation", {{"offer_id", "esc-0123456789ab"}, {"reason", ""}}, "arguments.reason: must not be empty"},
       }) {
    auto r = Send(Call(4, c.tool, c.args));
    ASSERT_EQ(ErrorCode(r), kInvalidParams) << c.tool << " " << c.args.dump();
    EXPECT_NE((*r)["error"]["message"].get<std::string>().find(c.expect), std::string::npos)
        << (*r)["error"]["message"];
  }
  EXPECT_EQ(ErrorCode(Send(Request(5, "tools/call", {{"arguments", Json::object()}}))), kInvalidParams);
  EXPECT_EQ(ErrorCode(Send(Request(6, "tools/call", {{"name", "bash"}, {"arguments", "ls"}}))), kInvalidParams);
  EXPECT_TRUE(session.calls.empty());
  EXPECT_TRUE(session.escalation_asks.empty());
}

TEST_F(ServerTest, RequestEscalationAsksTheSessionAndSaysWhatWasDecided) {
  Initialize();
  const Json args = {{"offer_id", "esc-0123456789ab"}, {"reason", "the build fetches its dependencies from api.test"}};
  auto r = Send(Call(4, "request_escalation", args));
  ASSERT_TRUE(r && r->contains("result")) << (r ? r->dump() : "");
  ASSERT_EQ(session.escalation_asks.size(), 1u);
  EXPECT_EQ(session.escalation_asks[0].first, "esc-0123456789ab");
  EXPECT_EQ(session.escalation_asks[0].second, "the build fetches its dependencies from api.test");
  EXPECT_TRUE(session.calls.empty()) << "not a session tool call";
  const Json& result = (*r)["result"];
  EXPECT_EQ(result["isError"], false);
  EXPECT_EQ(result["content"][0]["text"], "granted once: network.allow api.test:443 — the next call may use it");
  EXPECT_EQ(result["structuredContent"]["state"], "granted");
  EXPECT_EQ(result["structuredContent"]["offer_id"], "esc-0123456789ab");
  EXPECT_EQ(Validate(result["structuredContent"], FindTool(server.tools(), "request_escalation")->output_schema), "");

  session.next_escalation["decision"] = "session";
  r = Send(Call(5, "request_escalation", args));
  EXPECT_EQ((*r)["result"]["content"][0]["text"],
            "granted for the session: network.allow api.test:443 — every later call may use it");

  session.next_escalation["state"] = "denied";
  session.next_escalation["decision"] = "deny";
  session.next_escalation["decision_reason"] = "approve-command /bin/ok did not answer within 60 s (killed)";
  session.next_escalation["applied"] = nullptr;
  r = Send(Call(6, "request_escalation", args));
  EXPECT_EQ((*r)["result"]["isError"], false) << "a decision, not a failure of the call";
  EXPECT_EQ((*r)["result"]["content"][0]["text"], "denied: approve-command /bin/ok did not answer within 60 s (killed)");
  EXPECT_EQ(Validate((*r)["result"]["structuredContent"], FindTool(server.tools(), "request_escalation")->output_schema),
            "");
}

TEST_F(ServerTest, AnEscalationTheSessionRefusesIsAToolError) {
  Initialize();
  session.escalation_error = Status::Error(session::kBadRequest, "no offer esc-0123456789ab in this session's results");
  auto r = Send(Call(4, "request_escalation", {{"offer_id", "esc-0123456789ab"}, {"reason", "needed"}}));
  ASSERT_TRUE(r && r->contains("result")) << (r ? r->dump() : "");
  EXPECT_EQ((*r)["result"]["isError"], true);
  EXPECT_EQ((*r)["result"]["content"][0]["text"], "tool_error: no offer esc-0123456789ab in this session's results");
  // Its output schema is the escalation's: no structuredContent for a failure.
  EXPECT_FALSE((*r)["result"].contains("structuredContent"));

  session.escalation_error = Status::Error(session::kNotFound, "no session s-1");
  r = Send(Call(5, "request_escalation", {{"offer_id", "esc-0123456789ab"}, {"reason", "needed"}}));
  EXPECT_EQ((*r)["result"]["content"][0]["text"].get<std::string>().rfind("sandbox_error: ", 0), 0u);
}

TEST_F(ServerTest, ASessionRefusalOfTheInputIsInvalidParams) {
  Initialize();
  auto r = Send(Call(4, "bash", {{"command", "refuse"}}));
  EXPECT_EQ(ErrorCode(r), kInvalidParams);
  EXPECT_NE((*r)["error"]["message"].get<std::string>().find("timeout 0"), std::string::npos);
}

TEST_F(ServerTest, ALostSessionIsASandboxErrorResult) {
  Initialize();
  auto r = Send(Call(4, "bash", {{"command", "gone"}}));
  ASSERT_TRUE(r && r->contains("result"));
  EXPECT_EQ((*r)["result"]["isError"], true);
  EXPECT_EQ((*r)["result"]["content"][0]["text"].get<std::string>().rfind("sandbox_error: ", 0), 0u);
}

TEST_F(ServerTest, ToolCallPassesArgumentsAndRendersTheResult) {
  Initialize();
  auto r = Send(Call(4, "bash", {{"command", "echo hi"}, {"timeout", 5}}));
  ASSERT_TRUE(r && r->contains("result")) << r->dump();
  ASSERT_EQ(session.calls.size(), 1u);
  EXPECT_EQ(session.calls[0].first, "bash");
  EXPECT_EQ(session.calls[0].second, (Json{{"command", "echo hi"}, {"timeout", 5}}));
  const Json& result = (*r)["result"];
  EXPECT_EQ(result["isError"], false);
  EXPECT_EQ(result["content"][0]["type"], "text");
  EXPECT_EQ(result["content"][0]["text"], "hi\n");
  EXPECT_EQ(result["structuredContent"]["kind"], "exited");
  EXPECT_EQ(result["structuredContent"]["exit_code"], 0);
}

TEST_F(ServerTest, DiffAndSnapshotGoToTheSession) {
  Initialize();
  auto d = Send(Call(4, "diff", Json::object()));
  EXPECT_EQ((*d)["result"]["structuredContent"]["files"], Json::array());
  EXPECT_NE((*d)["result"]["content"][0]["text"].get<std::string>().find("no changes"), std::string::npos);
  auto s = Send(Request(5, "tools/call", {{"name", "snapshot"}}));  // arguments may be left out
  EXPECT_EQ((*s)["result"]["structuredContent"]["snapshot_id"], "snap-7");
}

TEST_F(ServerTest, NoDiffForTheSessionIsAToolErrorResult) {
  Initialize();
  session.direct = true;
  auto d = Send(Call(4, "diff", Json::object()));
  ASSERT_TRUE(d && d->contains("result")) << d->dump();
  EXPECT_EQ((*d)["result"]["isError"], true);
  EXPECT_EQ((*d)["result"]["content"][0]["text"], "tool_error: session s-1 works on its workspace directly");
  // The diff schema describes a diff: no structuredContent for the failure.
  EXPECT_FALSE((*d)["result"].contains("structuredContent"));
}

TEST_F(ServerTest, CancellationEndsTheCallWithoutAResponse) {
  Initialize();
  auto pending = std::async(std::launch::async, [&] { return Send(Call(11, "bash", {{"command", "block"}})); });
  session.WaitStarted();
  EXPECT_TRUE(Send(Request(12, "ping"))->contains("result"));  // not held up by the call
  EXPECT_FALSE(Send(Json{{"jsonrpc", "2.0"},
                         {"method", "notifications/cancelled"},
                         {"params", {{"requestId", 11}, {"reason", "user"}}}}));
  EXPECT_FALSE(pending.get());
}

TEST_F(ServerTest, ACancellationSeenBeforeItsRequestStillCancels) {
  Initialize();
  Send(Json{{"jsonrpc", "2.0"}, {"method", "notifications/cancelled"}, {"params", {{"requestId", "late"}}}});
  Json call = Call(0, "bash", {{"command", "block"}});
  call["id"] = "late";
  EXPECT_FALSE(Send(call));
  EXPECT_TRUE(session.calls.empty());
}

TEST_F(ServerTest, CancelAllEndsEveryCall) {
  Initialize();
  auto a = std::async(std::launch::async, [&] { return Send(Call(21, "bash", {{"command", "block"}})); });
  session.WaitStarted();
  server.CancelAll();
  EXPECT_FALSE(a.get());
}

TEST_F(ServerTest, ProgressNotificationsCarryTheTokenAndIncrease) {
  Initialize();
  session.progress_seen = [this] {
    std::lock_guard<std::mutex> lock(notes_mu);
    return notes.size();
  };
  Json call = Call(31, "bash", {{"command", "chatty"}});
  call["params"]["_meta"] = {{"progressToken", "tok-1"}};
  auto r = Send(call);
  ASSERT_TRUE(r && r->contains("result"));
  std::lock_guard<std::mutex> lock(notes_mu);
  ASSERT_GE(notes.size(), 3u);
  double last = 0;
  for (const auto& n : notes) {
    EXPECT_EQ(n["method"], "notifications/progress");
    EXPECT_EQ(n["params"]["progressToken"], "tok-1");
    EXPECT_GT(n["params"]["progress"].get<double>(), last);
    last = n["params"]["progress"].get<double>();
  }
  // The messages are the output, in order: joined, they begin as the session's output did.
  std::string joined;
  for (const auto& n : notes) joined += n["params"].value("message", "");
  std::string all;
  for (int i = 0; i < 200; ++i) all += "line " + std::to_string(i) + "\n";
  EXPECT_EQ(joined.rfind("line 0\n", 0), 0u) << joined;
  EXPECT_EQ(all.rfind(joined, 0), 0u) << "not the output, in order, each line once: " << joined;
}

// A notification carries at most 16 KiB of output and says what it left
// out; what comes after is sent as it comes.
TEST_F(ServerTest, ProgressOutputIsCappedPerNotificationWithANote) {
  Initialize();
  session.progress_seen = [this] {
    std::lock_guard<std::mutex> lock(notes_mu);
    return notes.size();
  };
  Json call = Call(33, "bash", {{"command", "flood"}});
  call["params"]["_meta"] = {{"progressToken", 7}};
  ASSERT_TRUE(Send(call));
  std::lock_guard<std::mutex> lock(notes_mu);
  ASSERT_GE(notes.size(), 2u);
  const std::string first = notes[0]["params"].value("message", "");
  EXPECT_EQ(first.rfind(std::string(16 * 1024, 'x'), 0), 0u);
  EXPECT_NE(first.find("[" + std::to_string(100 * 1024 - 16 * 1024) + " bytes of output not shown here"),
            std::string::npos)
      << first.substr(16 * 1024);
  EXPECT_EQ(notes.back()["params"].value("message", ""), "tail\n");
}

TEST_F(ServerTest, NoProgressWithoutAToken) {
  Initialize();
  session.progress_seen = [] { return std::size_t{3}; };  // a short call
  ASSERT_TRUE(Send(Call(32, "bash", {{"command", "chatty"}})));
  std::lock_guard<std::mutex> lock(notes_mu);
  EXPECT_TRUE(notes.empty());
}

TEST_F(ServerTest, OlderRevisionsGetNoStructuredContentOrOutputSchema) {
  Initialize("2025-03-26");
  auto list = Send(Request(2, "tools/list"));
  for (const auto& t : (*list)["result"]["tools"]) {
    EXPECT_FALSE(t.contains("outputSchema")) << t["name"];
    EXPECT_TRUE(t.contains("inputSchema")) << t["name"];
  }
  auto r = Send(Call(3, "bash", {{"command", "echo hi"}}));
  EXPECT_FALSE((*r)["result"].contains("structuredContent"));
  EXPECT_EQ((*r)["result"]["content"][0]["text"], "hi\n");
}

TEST_F(ServerTest, BatchesOnlyUnderRevision20250326) {
  Initialize("2025-06-18");
  Json batch = Json::array({Request(40, "ping"), Request(41, "ping")});
  auto refused = Send(batch);
  EXPECT_EQ(ErrorCode(refused), kInvalidRequest);
  EXPECT_NE((*refused)["error"]["message"].get<std::string>().find("2025-06-18"), std::string::npos);

  FakeSession s;
  Server old(s, options);
  EXPECT_EQ(ErrorCode(old.Handle(batch, notify)), kInvalidRequest);  // not before initialize either
  ASSERT_TRUE(old.Handle(Init("2025-03-26"), notify));
  Json with_notification = batch;
  with_notification.push_back(Json{{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}});
  auto r = old.Handle(with_notification, notify);
  ASSERT_TRUE(r && r->is_array());
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0]["id"], 40);
  EXPECT_EQ((*r)[1]["id"], 41);
  EXPECT_EQ(ErrorCode(old.Handle(Json::array(), notify)), kInvalidRequest);
}

TEST_F(ServerTest, AnOversizedMessageIsRefusedUnread) {
  Initialize();
  std::string huge(kMaxMessageBytes + 1, ' ');
  auto r = SendText(huge);
  EXPECT_EQ(ErrorCode(r), kInvalidRequest);
  EXPECT_TRUE((*r)["id"].is_null());
  EXPECT_TRUE(Send(Request(50, "ping"))->contains("result"));
}

TEST(ServerStatic, MayRunLongOnlyForToolCallsAndBatches) {
  EXPECT_TRUE(Server::MayRunLong(Call(1, "bash", Json::object())));
  EXPECT_TRUE(Server::MayRunLong(Json::array()));
  EXPECT_FALSE(Server::MayRunLong(Request(1, "ping")));
  EXPECT_FALSE(Server::MayRunLong(Json{{"jsonrpc", "2.0"}, {"method", "tools/call"}}));  // a notification
}

}  // namespace
}  // namespace agentbox::mcp
