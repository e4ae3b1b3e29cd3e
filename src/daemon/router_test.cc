#include <gtest/gtest.h>

#include "daemon/http.h"

namespace agentbox::daemon {
namespace {

// Records what the router answered.
class FakeReply : public Reply {
 public:
  void Send(Response r) override { response = std::move(r); }
  void Begin(int, std::string, Headers) override {}
  bool Write(std::string) override { return true; }
  void End() override {}
  bool Gone() const override { return false; }
  void Note(const std::string&, const std::string&) override {}
  void Upgrade(WebSocketHandler) override {}
  Response response;
};

Request Req(const std::string& method, const std::string& target) {
  Request r;
  r.method = method;
  r.target = target;
  EXPECT_TRUE(ParseTarget(target, &r.path, &r.query));
  return r;
}

TEST(Router, MatchesPlaceholdersAndDecodesThem) {
  Router router;
  std::vector<std::string> seen;
  router.Add("POST", "/v1/sessions/{id}/calls/{call_id}/cancel", [&](Request r, ReplyPtr reply) {
    seen = r.params;
    reply->Send(Response::NoContent());
  });
  auto reply = std::make_shared<FakeReply>();
  router.Dispatch(Req("POST", "/v1/sessions/abc/calls/a%2Fb%20c/cancel"), reply);
  EXPECT_EQ(reply->response.status, 204);
  EXPECT_EQ(seen, (std::vector<std::string>{"abc", "a/b c"}));
}

TEST(Router, WrongMethodIs405WithAllowAndUnknownPathIs404) {
  Router router;
  router.Add("GET", "/v1/sessions", [](Request, ReplyPtr r) { r->Send(Response::NoContent()); });
  router.Add("POST", "/v1/sessions", [](Request, ReplyPtr r) { r->Send(Response::NoContent()); });
  auto reply = std::make_shared<FakeReply>();
  router.Dispatch(Req("PATCH", "/v1/sessions"), reply);
  EXPECT_EQ(reply->response.status, 405);
  ASSERT_EQ(reply->response.headers.size(), 1u);
  EXPECT_EQ(reply->response.headers[0].second, "GET, POST");
  router.Dispatch(Req("GET", "/v1/sessions/x/y"), reply);
  EXPECT_EQ(reply->response.status, 404);
  // An empty placeholder segment does not match.
  router.Add("GET", "/v1/sessions/{id}", [](Request, ReplyPtr r) { r->Send(Response::NoContent()); });
  router.Dispatch(Req("GET", "/v1/sessions/"), reply);
  EXPECT_EQ(reply->response.status, 404);
}

TEST(Router, PrefixRoutesTakeEverythingUnderThem) {
  Router router;
  int calls = 0;
  router.AddPrefix("/mcp", [&](Request, ReplyPtr r) {
    ++calls;
    r->Send(Response::NoContent());
  });
  auto reply = std::make_shared<FakeReply>();
  router.Dispatch(Req("DELETE", "/mcp"), reply);
  router.Dispatch(Req("GET", "/mcp/stream?x=1"), reply);
  EXPECT_EQ(calls, 2);
  router.Dispatch(Req("GET", "/mcpx"), reply);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(reply->response.status, 404);
}

TEST(Router, TargetsAndQueries) {
  std::string path;
  std::map<std::string, std::string> q;
  ASSERT_TRUE(ParseTarget("/a/b?stream=1&format=patch&flag&x=a%20b+c", &path, &q));
  EXPECT_EQ(path, "/a/b");
  EXPECT_EQ(q["stream"], "1");
  EXPECT_EQ(q["format"], "patch");
  EXPECT_EQ(q.count("flag"), 1u);
  EXPECT_EQ(q["x"], "a b c");
  EXPECT_FALSE(ParseTarget("http://host/a", &path, &q));
  EXPECT_FALSE(ParseTarget("/a?x=%zz", &path, &q));
  EXPECT_FALSE(ParseTarget("/a?x=%4", &path, &q));
  Request r;
  r.query = {{"stream", "1"}, {"no", "0"}, {"bare", ""}};
  EXPECT_TRUE(r.QueryFlag("stream"));
  EXPECT_TRUE(r.QueryFlag("bare"));
  EXPECT_FALSE(r.QueryFlag("no"));
  EXPECT_FALSE(r.QueryFlag("absent"));
}

TEST(Router, ErrorBodiesHaveCodeAndMessage) {
  Response r = Response::Error(413, "payload_too_large", "too big");
  auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["error"]["code"], "payload_too_large");
  EXPECT_EQ(j["error"]["message"], "too big");
  EXPECT_EQ(r.content_type, "application/json");
  // Invalid UTF-8 from a command's output does not throw.
  Response bad = Response::Json(200, {{"output", std::string("\xff\xfe ok")}});
  EXPECT_NE(bad.body.find("ok"), std::string::npos);
}

}  // namespace
}  // namespace agentbox::daemon
