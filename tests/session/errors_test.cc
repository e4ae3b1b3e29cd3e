// Bad input and limits: every refusal is a 4xx with a JSON message naming
// what was wrong, and the daemon keeps serving afterwards.
#include <gtest/gtest.h>

#include <thread>

#include "daemon_fixture.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;
using e2e::TempDir;

class ErrorsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(d_.Start({"--read-timeout", "1s"})) << d_.error(); }
  void TearDown() override {
    // After every refusal the daemon still answers.
    Answer health = Call(d_.client(), "GET", "/v1/health");
    EXPECT_EQ(health.status, 200) << "the daemon stopped serving: " << health.text << "\n" << d_.output();
  }
  daemon::Client& c() { return d_.client(); }

  TempDir ws_{"agentbox-session-ws-"};  // outlives the daemon
  Daemon d_;
};

TEST_F(ErrorsTest, MalformedJsonNamesTheParseErrorPosition) {
  auto r = c().Call("POST", "/v1/sessions", "{\"workspace\": \"/tmp\",");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400) << r->body;
  auto body = json::parse(r->body);
  EXPECT_EQ(body["error"]["code"], "malformed_json");
  const std::string message = body["error"]["message"];
  EXPECT_TRUE(Contains(message, "line 1, column 22")) << message;

  std::string id = CreateSession(c(), ws_.path());
  r = c().Call("POST", "/v1/sessions/" + id + "/execute", "{\"name\": bash}");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_TRUE(Contains(r->body, "column")) << r->body;
}

// A number past a double's range is bad JSON like any other (nlohmann
// throws out_of_range for it, not parse_error), and a large body that is
// not valid JSON is named as a small one is.
TEST_F(ErrorsTest, AnOverflowingNumberAndALargeBrokenBodyAreMalformedJson) {
  auto r = c().Call("POST", "/v1/sessions", "{\"workspace\": \"/tmp\", \"x\": 1e400}");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400) << r->body;
  auto body = json::parse(r->body);
  EXPECT_EQ(body["error"]["code"], "malformed_json") << r->body;
  EXPECT_TRUE(Contains(body["error"]["message"].get<std::string>(), "1e400")) << r->body;

  std::string id = CreateSession(c(), ws_.path());
  const std::string content(200000, 'x');
  r = c().Call("POST", "/v1/sessions/" + id + "/execute",
               "{\"name\": \"write_file\", \"input\": {\"path\": \"a.txt\", \"content\": \"" + content + "\"}");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400) << r->body.substr(0, 300);
  EXPECT_TRUE(Contains(r->body, "malformed_json")) << r->body.substr(0, 300);
  EXPECT_TRUE(Contains(r->body, "byte 200")) << r->body.substr(0, 300);
  // The same body made whole is taken, its content written as sent.
  r = c().Call("POST", "/v1/sessions/" + id + "/execute",
               "{\"name\": \"write_file\", \"input\": {\"path\": \"a.txt\", \"content\": \"" + content + "\\u00e9\"}}");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200) << r->body.substr(0, 300);
  // A session works on its own layer: read back through the session.
  Answer back = Call(c(), "POST", "/v1/sessions/" + id + "/execute",
                     {{"name", "bash"}, {"input", {{"command", "wc -c < a.txt; tail -c 2 a.txt | od -An -tx1"}}}});
  EXPECT_TRUE(Contains(back.text, "200002")) << back.text;
  EXPECT_TRUE(Contains(back.text, "c3 a9")) << back.text;
}

TEST_F(ErrorsTest, WrongShapesNameTheField) {
  Answer array = Call(c(), "POST", "/v1/sessions", json::array({1, 2}));
  EXPECT_EQ(array.status, 400);
  EXPECT_TRUE(Contains(array.message(), "object")) << array.text;

  Answer unknown = Call(c(), "POST", "/v1/sessions", {{"workspace", ws_.path()}, {"worksapce", "/x"}});
  EXPECT_EQ(unknown.status, 400);
  EXPECT_TRUE(Contains(unknown.message(), "worksapce")) << unknown.text;

  Answer missing = Call(c(), "POST", "/v1/sessions", json::object());
  EXPECT_EQ(missing.status, 400);
  EXPECT_TRUE(Contains(missing.message(), "workspace")) << missing.text;

  Answer relative = Call(c(), "POST", "/v1/sessions", {{"workspace", "some/dir"}});
  EXPECT_EQ(relative.status, 400);
  EXPECT_TRUE(Contains(relative.message(), "some/dir")) << relative.text;

  Answer type = Call(c(), "POST", "/v1/sessions", {{"workspace", 42}});
  EXPECT_EQ(type.status, 400);
  EXPECT_TRUE(Contains(type.message(), "workspace")) << type.text;

  std::string id = CreateSession(c(), ws_.path());
  Answer input = Call(c(), "POST", "/v1/sessions/" + id + "/execute", {{"name", "bash"}, {"input", "echo hi"}});
  EXPECT_EQ(input.status, 400);
  EXPECT_TRUE(Contains(input.message(), "input")) << input.text;
}

TEST_F(ErrorsTest, UnknownToolIsNamedAndTheToolsListed) {
  std::string id = CreateSession(c(), ws_.path());
  Answer a = Call(c(), "POST", "/v1/sessions/" + id + "/execute", {{"name", "rm_rf"}, {"input", json::object()}});
  EXPECT_EQ(a.status, 400) << a.text;
  EXPECT_EQ(a.code(), "unknown_tool");
  EXPECT_TRUE(Contains(a.message(), "rm_rf")) << a.text;
  for (const char* tool : {"bash", "read_file", "write_file", "edit_file", "list_dir", "glob"}) {
    EXPECT_TRUE(Contains(a.message(), tool)) << a.text;
  }
}

TEST_F(ErrorsTest, UnknownSessionIs404Everywhere) {
  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/v1/sessions/nope"},
           {"DELETE", "/v1/sessions/nope"},
           {"POST", "/v1/sessions/nope/snapshot"},
           {"GET", "/v1/sessions/nope/diff"},
           {"GET", "/v1/sessions/nope/log"}}) {
    Answer a = Call(c(), method, path);
    EXPECT_EQ(a.status, 404) << method << " " << path << ": " << a.text;
    EXPECT_TRUE(Contains(a.message(), "nope")) << a.text;
  }
  Answer exec = Call(c(), "POST", "/v1/sessions/nope/execute", {{"name", "bash"}, {"input", {{"command", "true"}}}});
  EXPECT_EQ(exec.status, 404) << exec.text;
}

TEST_F(ErrorsTest, UnknownPathAndWrongMethod) {
  Answer path = Call(c(), "GET", "/v2/whatever");
  EXPECT_EQ(path.status, 404);
  EXPECT_EQ(path.code(), "not_found");
  Answer method = Call(c(), "PUT", "/v1/sessions");
  EXPECT_EQ(method.status, 405);
  EXPECT_EQ(method.code(), "method_not_allowed");
  EXPECT_TRUE(Contains(method.message(), "GET")) << method.text;
  EXPECT_TRUE(Contains(method.message(), "POST")) << method.text;
  std::string raw = RawExchange(d_.socket(), "DELETE /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(RawStatus(raw), 405) << raw;
  EXPECT_TRUE(Contains(raw, "Allow: GET")) << raw;
}

TEST_F(ErrorsTest, HugeBodyIs413WithoutBeingRead) {
  // Declared larger than the cap: refused on the header.
  const std::string body(33u << 20, 'x');
  std::string raw = RawExchange(d_.socket(),
                                "POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(RawStatus(raw), 413) << raw.substr(0, 300);
  EXPECT_TRUE(Contains(raw, "payload_too_large")) << raw.substr(0, 300);
  EXPECT_TRUE(Contains(raw, "33554432")) << "the limit is named: " << raw.substr(0, 300);
}

TEST_F(ErrorsTest, HugeChunkedBodyIs413) {
  // The daemon's default read timeout: 32 MiB read before the verdict can
  // take longer than the fixture's 1 s on a loaded machine (408, not 413).
  Daemon patient;
  ASSERT_TRUE(patient.Start({})) << patient.error();
  std::string request = "POST /v1/sessions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::string chunk(1u << 20, 'y');
  for (int i = 0; i < 34; ++i) request += "100000\r\n" + chunk + "\r\n";
  request += "0\r\n\r\n";
  std::string raw = RawExchange(patient.socket(), request);
  EXPECT_EQ(RawStatus(raw), 413) << raw.substr(0, 300);
}

TEST_F(ErrorsTest, OversizedHeadersAre431) {
  std::string raw = RawExchange(d_.socket(), "GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " +
                                                 std::string(20000, 'h') + "\r\n\r\n");
  EXPECT_EQ(RawStatus(raw), 431) << raw.substr(0, 300);
}

TEST_F(ErrorsTest, GarbageIs400) {
  std::string raw = RawExchange(d_.socket(), "HELLO THERE\r\n\r\n");
  EXPECT_EQ(RawStatus(raw), 400) << raw;
  EXPECT_TRUE(Contains(raw, "malformed HTTP request")) << raw;
}

TEST_F(ErrorsTest, SlowClientGets408) {
  // Half a request, then silence: the 1 s read timeout of this daemon ends it.
  std::string raw = RawExchange(d_.socket(), "POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
                                10000);
  EXPECT_EQ(RawStatus(raw), 408) << raw;
  EXPECT_TRUE(Contains(raw, "request_timeout")) << raw;
}

TEST_F(ErrorsTest, ExpectContinueIsHonoured) {
  const std::string body = json{{"workspace", ws_.path()}}.dump();
  std::string raw = RawExchange(d_.socket(),
                                "POST /v1/sessions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nConnection: close\r\n"
                                "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(RawStatus(raw), 100) << raw;
  EXPECT_TRUE(Contains(raw, "HTTP/1.1 201")) << raw;
}

TEST_F(ErrorsTest, SessionCapIs429) {
  Daemon small;
  ASSERT_TRUE(small.Start({"--max-sessions", "2"})) << small.error();
  CreateSession(small.client(), ws_.path());
  CreateSession(small.client(), ws_.path());
  Answer third = Call(small.client(), "POST", "/v1/sessions", {{"workspace", ws_.path()}});
  EXPECT_EQ(third.status, 429) << third.text;
  EXPECT_EQ(third.code(), "busy");
  EXPECT_EQ(Call(small.client(), "GET", "/v1/health").status, 200);
}

TEST_F(ErrorsTest, CallCapIs429) {
  Daemon small;
  ASSERT_TRUE(small.Start({"--max-calls", "1"})) << small.error();
  std::string id = CreateSession(small.client(), ws_.path());
  std::string other = CreateSession(small.client(), ws_.path());
  // One call holds the only slot until cancelled.
  std::atomic<bool> started{false};
  std::thread holder([&] {
    daemon::Client client(small.endpoint());
    daemon::SseParser sse([&](const std::string& event, const std::string&) {
      if (event == "output") started = true;
    });
    json body = {{"name", "bash"}, {"input", {{"command", "echo go; sleep 120"}}}, {"call_id", "holder"}};
    (void)client.Call("POST", "/v1/sessions/" + id + "/execute?stream=1", body.dump(),
                      [&](std::string_view chunk) { sse.Feed(chunk); });
  });
  for (int i = 0; i < 3000 && !started; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(started);
  Answer busy = Call(small.client(), "POST", "/v1/sessions/" + other + "/execute",
                     {{"name", "bash"}, {"input", {{"command", "true"}}}});
  EXPECT_EQ(busy.status, 429) << busy.text;
  EXPECT_EQ(Call(small.client(), "POST", "/v1/sessions/" + id + "/calls/holder/cancel").status, 202);
  holder.join();
  Answer after = Call(small.client(), "POST", "/v1/sessions/" + other + "/execute",
                      {{"name", "bash"}, {"input", {{"command", "echo free"}}}});
  EXPECT_EQ(after.status, 200) << after.text;
}

TEST_F(ErrorsTest, ASecondCallWithTheSameIdWhileTheFirstRunsIs409) {
  std::string id = CreateSession(c(), ws_.path());
  std::atomic<bool> started{false};
  std::thread first([&] {
    daemon::Client client(d_.endpoint());
    daemon::SseParser sse([&](const std::string& event, const std::string&) {
      if (event == "output") started = true;
    });
    json body = {{"name", "bash"}, {"input", {{"command", "echo go; sleep 120"}}}, {"call_id", "dup"}};
    (void)client.Call("POST", "/v1/sessions/" + id + "/execute?stream=1", body.dump(),
                      [&](std::string_view chunk) { sse.Feed(chunk); });
  });
  for (int i = 0; i < 3000 && !started; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  Answer dup = Call(c(), "POST", "/v1/sessions/" + id + "/execute",
                    {{"name", "bash"}, {"input", {{"command", "echo go; sleep 120"}}}, {"call_id", "dup"}});
  EXPECT_EQ(dup.status, 409) << dup.text;
  EXPECT_TRUE(Contains(dup.message(), "dup")) << dup.text;
  EXPECT_EQ(Call(c(), "POST", "/v1/sessions/" + id + "/calls/dup/cancel").status, 202);
  first.join();
}

}  // namespace
}  // namespace agentbox::session_test
