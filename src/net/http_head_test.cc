// The terminated stream's request head: what Beast alone accepts, what the
// strict layer refuses on top of it, incremental feeding, the size limit,
// and serialising a changed head.
#include "net/http_head.h"

#include <gtest/gtest.h>

#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>

#include <chrono>
#include <limits>

namespace agentbox::net {
namespace {

constexpr std::size_t kLimit = 64 * 1024;
const std::string kLine = "GET /a HTTP/1.1\r\nHost: api.example\r\n";

HeadParse Parse(const std::string& text, std::size_t limit = kLimit) { return ParseTerminatedRequestHead(text, limit); }

// Beast on its own, configured as http_head.cc configures it.
bool BeastAccepts(const std::string& text) {
  namespace http = boost::beast::http;
  http::request_parser<http::empty_body> p;
  p.header_limit(std::numeric_limits<std::uint32_t>::max());
  p.body_limit(std::numeric_limits<std::uint64_t>::max());
  p.eager(false);
  boost::system::error_code ec;
  p.put(boost::asio::buffer(text.data(), text.size()), ec);
  return !ec && p.is_header_done();
}

struct Refusal {
  const char* what;
  std::string input;
  bool beast_accepts;  // what Beast 1.74 does with it on its own
  int status;
  const char* reason;
};

// One line per case; `beast_accepts` records why the strict layer exists.
std::vector<Refusal> Refusals() {
  return {
      {"obs-fold", kLine + "X-A: a\r\n b\r\n\r\n", true, 400, "smuggling: obs-fold in field X-A"},
      {"fold before the first field", "GET / HTTP/1.1\r\n Host: a\r\n\r\n", false, 400,
       "smuggling: whitespace before the first field"},
      {"bare LF lines", "GET / HTTP/1.1\nHost: a\n\n", false, 400, "bare LF"},
      {"bare LF in a field", kLine + "X: a\nY: b\r\n\r\n", false, 400, "bare LF"},
      {"bare CR in a value", kLine + "X: a\rb\r\n\r\n", false, 400, "bare CR"},
      {"CR CR LF", kLine + "X: a\r\r\n\r\n", false, 400, "bare CR"},
      {"NUL in a value", kLine + std::string("X: a\0b\r\n\r\n", 11), false, 400, "NUL in the head"},
      {"NUL in the target", std::string("GET /\0 HTTP/1.1\r\nHost: a\r\n\r\n", 29), false, 400, "NUL in the head"},
      {"control character", kLine + "X: a\x01z\r\n\r\n", false, 400, "bad field: control character in X"},
      {"DEL", kLine + "X: a\x7fz\r\n\r\n", false, 400, "bad field: control character in X"},
      {"space before the colon", kLine + "X-A : a\r\n\r\n", false, 400, "bad field: space before the colon in X-A"},
      {"tab before the colon", kLine + "X-A\t: a\r\n\r\n", false, 400, "bad field: space before the colon in X-A"},
      {"no colon", kLine + "X-A\r\n\r\n", false, 400, "bad field: no colon in X-A"},
      {"name not a token", kLine + "X(A): a\r\n\r\n", false, 400, "bad field: name is not a token: X(A)"},
      {"empty name", kLine + ": a\r\n\r\n", false, 400, "bad field: name is not a token: "},
      {"duplicate Content-Length, same value", kLine + "Content-Length: 5\r\nContent-Length: 5\r\n\r\n", true, 400,
       "smuggling: duplicate Content-Length"},
      {"duplicate Content-Length, other value", kLine + "Content-Length: 5\r\nContent-Length: 6\r\n\r\n", false, 400,
       "smuggling: duplicate Content-Length"},
      {"Content-Length list", kLine + "Content-Length: 5, 5\r\n\r\n", true, 400, "smuggling: Content-Length list"},
      {"Content-Length +5", kLine + "Content-Length: +5\r\n\r\n", false, 400, "bad Content-Length"},
      {"Content-Length -5", kLine + "Content-Length: -5\r\n\r\n", false, 400, "bad Content-Length"},
      {"Content-Length 5 5", kLine + "Content-Length: 5 5\r\n\r\n", false, 400, "bad Content-Length"},
      {"Content-Length 005", kLine + "Content-Length: 005\r\n\r\n", true, 400, "bad Content-Length"},
      {"Content-Length 0x5", kLine + "Content-Length: 0x5\r\n\r\n", false, 400, "bad Content-Length"},
      {"Content-Length empty", kLine + "Content-Length:\r\n\r\n", false, 400, "bad Content-Length"},
      {"Content-Length overflow", kLine + "Content-Length: 99999999999999999999\r\n\r\n", false, 400,
       "bad Content-Length"},
      {"Content-Length then chunked", kLine + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", false, 400,
       "smuggling: Content-Length with Transfer-Encoding"},
      {"chunked then Content-Length", kLine + "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", false, 400,
       "smuggling: Content-Length with Transfer-Encoding"},
      {"chunked, identity", kLine + "Transfer-Encoding: chunked, identity\r\n\r\n", true, 400,
       "smuggling: Transfer-Encoding other than chunked"},
      {"gzip, chunked", kLine + "Transfer-Encoding: gzip, chunked\r\n\r\n", true, 400,
       "smuggling: Transfer-Encoding other than chunked"},
      {"identity", kLine + "Transfer-Encoding: identity\r\n\r\n", true, 400,
       "smuggling: Transfer-Encoding other than chunked"},
      {"xchunked", kLine + "Transfer-Encoding: xchunked\r\n\r\n", true, 400,
       "smuggling: Transfer-Encoding other than chunked"},
      {"chunked twice", kLine + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", false, 400,
       "smuggling: duplicate Transfer-Encoding"},
      {"chunked in HTTP/1.0", "POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", true, 400,
       "smuggling: Transfer-Encoding in HTTP/1.0"},
      {"Connection names Content-Length", kLine + "Connection: close, Content-Length\r\nContent-Length: 1\r\n\r\n",
       true, 400, "smuggling: Connection names Content-Length"},
      {"missing Host", "GET / HTTP/1.1\r\n\r\n", true, 400, "missing Host"},
      {"duplicate Host", kLine + "host: other.example\r\n\r\n", true, 400, "duplicate Host"},
      {"empty Host", "GET / HTTP/1.1\r\nHost:\r\n\r\n", true, 400, "empty Host"},
      {"Host with userinfo", "GET / HTTP/1.1\r\nHost: u@a\r\n\r\n", true, 400, "bad Host"},
      {"Host with a space", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", true, 400, "bad Host"},
      {"Host with a bad port", "GET / HTTP/1.1\r\nHost: a:99999\r\n\r\n", true, 400, "bad Host"},
      {"absolute-form", "GET https://api.example/a HTTP/1.1\r\nHost: api.example\r\n\r\n", true, 400,
       "absolute-form target"},
      {"authority-form GET", "GET api.example:443 HTTP/1.1\r\nHost: api.example\r\n\r\n", true, 400,
       "request-target not in origin-form"},
      {"CONNECT", "CONNECT api.example:443 HTTP/1.1\r\nHost: api.example\r\n\r\n", true, 501, "CONNECT not supported"},
      {"asterisk-form", "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", true, 501, "asterisk-form target not supported"},
      {"fragment", "GET /a#b HTTP/1.1\r\nHost: a\r\n\r\n", true, 400, "fragment in request-target"},
      {"non-ASCII target", "GET /\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n", true, 400, "non-ASCII byte in request-target"},
      {"control character in the target", "GET /\x01 HTTP/1.1\r\nHost: a\r\n\r\n", false, 400, "bad request-target"},
      {"Upgrade", kLine + "Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n", true, 501, "upgrade not supported"},
      {"h2c upgrade", kLine + "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
       true, 501, "upgrade not supported"},
      {"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", false, 501, "upgrade not supported: HTTP/2 preface"},
      {"method not a token", "G(T / HTTP/1.1\r\nHost: a\r\n\r\n", false, 400, "bad method: not a token"},
      {"tab after the method", "GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n", false, 400, "bad method: not a token"},
      {"two spaces", "GET  / HTTP/1.1\r\nHost: a\r\n\r\n", false, 400, "bad request line"},
      {"HTTP/1.2", "GET / HTTP/1.2\r\nHost: a\r\n\r\n", false, 400, "bad HTTP version"},
      {"lower-case version", "GET / http/1.1\r\nHost: a\r\n\r\n", false, 400, "bad HTTP version"},
      {"space after the version", "GET / HTTP/1.1 \r\nHost: a\r\n\r\n", false, 400, "bad request line"},
      {"HTTP/0.9", "GET /\r\n\r\n", false, 400, "bad request line"},
      {"empty line first", "\r\n" + kLine + "\r\n", false, 400, "empty line before the request line"},
  };
}

TEST(ParseTerminatedRequestHead, BeastAloneAsRecorded) {
  // If this fails after a Boost upgrade, the table's beast_accepts is stale;
  // the strict layer's answers (next test) must not change.
  for (const auto& c : Refusals()) EXPECT_EQ(BeastAccepts(c.input), c.beast_accepts) << c.what;
}

TEST(ParseTerminatedRequestHead, RefusesEachCaseWithItsReason) {
  for (const auto& c : Refusals()) {
    auto r = Parse(c.input);
    EXPECT_EQ(r.state, ParseState::kError) << c.what;
    EXPECT_EQ(r.status, c.status) << c.what;
    EXPECT_EQ(r.reason, c.reason) << c.what;
  }
}

TEST(ParseTerminatedRequestHead, RefusesEachCaseFedByteByByte) {
  for (const auto& c : Refusals()) {
    RequestHeadParser p(kLimit);
    HeadParse r;
    for (std::size_t n = 1; n <= c.input.size() && r.state == ParseState::kNeedMore; ++n) {
      r = p.Parse(std::string_view(c.input).substr(0, n));
    }
    EXPECT_EQ(r.state, ParseState::kError) << c.what;
    EXPECT_EQ(r.reason, c.reason) << c.what;
  }
}

TEST(ParseTerminatedRequestHead, AcceptsPlainRequests) {
  const std::string text =
      "POST /repos/acme/x/issues?state=open HTTP/1.1\r\nHost: api.github.com\r\nUser-Agent: t\r\n"
      "X-Empty:\r\nAccept:\t */* \t\r\nContent-Length: 12\r\n\r\n{\"a\":\"body\"}";
  auto r = Parse(text);
  ASSERT_EQ(r.state, ParseState::kDone) << r.reason;
  const RequestHead& h = r.head;
  EXPECT_EQ(h.method, "POST");
  EXPECT_EQ(h.target, "/repos/acme/x/issues?state=open");
  EXPECT_EQ(h.version, 11);
  EXPECT_EQ(h.host, "api.github.com");
  EXPECT_EQ(h.framing, BodyFraming::kLength);
  EXPECT_EQ(h.content_length, 12u);
  EXPECT_EQ(h.head_size, text.size() - 12);
  std::vector<std::pair<std::string, std::string>> fields = {
      {"Host", "api.github.com"}, {"User-Agent", "t"}, {"X-Empty", ""}, {"Accept", "*/*"}, {"Content-Length", "12"}};
  EXPECT_EQ(h.fields, fields);

  auto chunked = Parse("PUT /x HTTP/1.1\r\nhost: a.test:8443\r\nTransfer-Encoding: Chunked\r\n\r\n5\r\nhello");
  ASSERT_EQ(chunked.state, ParseState::kDone) << chunked.reason;
  EXPECT_EQ(chunked.head.framing, BodyFraming::kChunked);
  EXPECT_EQ(chunked.head.host, "a.test:8443");

  auto old = Parse("GET / HTTP/1.0\r\nHost: [::1]\r\n\r\n");
  ASSERT_EQ(old.state, ParseState::kDone) << old.reason;
  EXPECT_EQ(old.head.version, 10);
  EXPECT_EQ(old.head.framing, BodyFraming::kNone);

  // OWS around a Content-Length is not part of the value; obs-text in a
  // value is allowed; a lower-case or unknown method is a token like any.
  auto ows = Parse(kLine + "Content-Length:   0  \r\nX-Name: caf\xc3\xa9\r\n\r\n");
  ASSERT_EQ(ows.state, ParseState::kDone) << ows.reason;
  EXPECT_EQ(ows.head.framing, BodyFraming::kLength);
  EXPECT_EQ(ows.head.content_length, 0u);
  EXPECT_EQ(*ows.head.Field("x-name"), "caf\xc3\xa9");
  EXPECT_EQ(Parse("get / HTTP/1.1\r\nHost: a\r\n\r\n").head.method, "get");
  EXPECT_EQ(Parse("PROPFIND / HTTP/1.1\r\nHost: a\r\n\r\n").state, ParseState::kDone);
  // Connection may name other fields; "Connection: keep-alive, Upgrade"
  // without an Upgrade field is harmless.
  EXPECT_EQ(Parse(kLine + "Connection: keep-alive, Upgrade, X-A\r\n\r\n").state, ParseState::kDone);
  auto big = Parse(kLine + "Content-Length: 18446744073709551615\r\n\r\n");
  ASSERT_EQ(big.state, ParseState::kDone) << big.reason;
  EXPECT_EQ(big.head.content_length, std::numeric_limits<std::uint64_t>::max());
}

TEST(ParseTerminatedRequestHead, IncrementalInEverySplit) {
  const std::string text = "GET /a?b=c HTTP/1.1\r\nHost: a\r\nX: y\r\n\r\nBODY";
  const std::size_t head = text.size() - 4;
  for (std::size_t split = 0; split <= text.size(); ++split) {
    RequestHeadParser p(kLimit);
    auto first = p.Parse(std::string_view(text).substr(0, split));
    if (split < head) {
      EXPECT_EQ(first.state, ParseState::kNeedMore) << split;
      auto second = p.Parse(text);
      ASSERT_EQ(second.state, ParseState::kDone) << split;
      EXPECT_EQ(second.head.head_size, head);
    } else {
      ASSERT_EQ(first.state, ParseState::kDone) << split;
      EXPECT_EQ(first.head.head_size, head);
    }
    // Finished: the same answer again, whatever is passed.
    EXPECT_EQ(p.Parse("garbage").head.head_size, head);
  }
  // A bare CR at the end of what arrived is decided by the next byte.
  RequestHeadParser p(kLimit);
  EXPECT_EQ(p.Parse("GET / HTTP/1.1\r").state, ParseState::kNeedMore);
  EXPECT_EQ(p.Parse("GET / HTTP/1.1\rX").reason, "bare CR");
}

TEST(ParseTerminatedRequestHead, LimitIsTheHeadSize) {
  const std::string text = kLine + "\r\n";
  EXPECT_EQ(Parse(text, text.size()).state, ParseState::kDone);
  EXPECT_EQ(Parse(text + "body", text.size()).state, ParseState::kDone);
  auto over = Parse(text, text.size() - 1);
  EXPECT_EQ(over.state, ParseState::kError);
  EXPECT_EQ(over.status, 431);
  EXPECT_EQ(over.reason, "header larger than the limit");
  EXPECT_EQ(Parse(text.substr(0, 10), text.size()).state, ParseState::kNeedMore);
}

TEST(ParseTerminatedRequestHead, MebibyteHeaderIsRefusedQuicklyInLinearTime) {
  // 1 MiB of one field, fed 512 bytes at a time as a socket would, with
  // the whole buffer passed each time: a parser that rescanned would do
  // ~1 GiB of work; this one looks at each byte once and stops at the limit.
  std::string data = kLine + "X-Big: " + std::string(1 << 20, 'a');
  auto start = std::chrono::steady_clock::now();
  for (std::size_t limit : {std::size_t{64 * 1024}, std::size_t{2 << 20}}) {
    RequestHeadParser p(limit);
    HeadParse r;
    std::size_t calls = 0;
    for (std::size_t n = 512; r.state == ParseState::kNeedMore; n += 512, ++calls) {
      r = p.Parse(std::string_view(data).substr(0, std::min(n, data.size())));
      if (n >= data.size()) break;
    }
    if (limit < data.size()) {
      EXPECT_EQ(r.status, 431);
      EXPECT_LE(calls, limit / 512 + 1);
    } else {
      EXPECT_EQ(r.state, ParseState::kNeedMore);  // under a 2 MiB limit it is still waiting
    }
  }
  // One call with everything: only `limit` bytes are scanned.
  EXPECT_EQ(Parse(data + std::string(64 << 20, 'b')).status, 431);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST(RequestHead, FieldSetRemove) {
  RequestHead h;
  h.fields = {{"Host", "a"}, {"X-A", "1"}, {"x-a", "2"}, {"Accept", "*/*"}};
  EXPECT_EQ(*h.Field("X-a"), "1");
  EXPECT_EQ(h.Field("Missing"), nullptr);
  h.Set("X-A", "3");
  std::vector<std::pair<std::string, std::string>> set = {{"Host", "a"}, {"X-A", "3"}, {"Accept", "*/*"}};
  EXPECT_EQ(h.fields, set);
  h.Set("Authorization", "Bearer t");
  EXPECT_EQ(h.fields.back(), (std::pair<std::string, std::string>{"Authorization", "Bearer t"}));
  h.Remove("accept");
  h.Remove("nothing");
  EXPECT_EQ(h.fields.size(), 3u);
  EXPECT_EQ(h.Field("Accept"), nullptr);
}

TEST(SerialiseRequestHead, RoundTripAndChanges) {
  const std::string text = "POST /x?y HTTP/1.1\r\nHost: a.test\r\nAuthorization: Bearer PLACEHOLDER\r\n"
                           "Content-Length: 3\r\n\r\n";
  auto r = Parse(text + "abc");
  ASSERT_EQ(r.state, ParseState::kDone) << r.reason;
  auto same = SerialiseRequestHead(r.head);
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ(*same, text);

  RequestHead h = r.head;
  h.Set("Authorization", "Bearer real-secret");
  h.Remove("Host");
  h.Set("Host", "a.test");
  h.version = 10;
  auto changed = SerialiseRequestHead(h);
  ASSERT_TRUE(changed.ok()) << changed.status().ToString();
  EXPECT_EQ(*changed,
            "POST /x?y HTTP/1.0\r\nAuthorization: Bearer real-secret\r\nContent-Length: 3\r\nHost: a.test\r\n\r\n");
}

TEST(SerialiseRequestHead, RefusesWhatWouldParseDifferentlyUpstream) {
  auto r = Parse("POST /x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n\r\n");
  ASSERT_EQ(r.state, ParseState::kDone);
  auto refused = [&](auto change, const char* fragment) {
    RequestHead h = r.head;
    change(h);
    auto s = SerialiseRequestHead(h);
    EXPECT_FALSE(s.ok()) << fragment;
    if (!s.ok()) {
      EXPECT_NE(s.status().message().find(fragment), std::string::npos) << s.status().message();
    }
  };
  // A secret with a line break must not become a second field.
  refused([](RequestHead& h) { h.Set("Authorization", "Bearer x\r\nX-Admin: 1"); }, "control character");
  refused([](RequestHead& h) { h.Set("Authorization", std::string("a\0b", 3)); }, "control character");
  refused([](RequestHead& h) { h.Set("Bad Name", "x"); }, "not a token");
  refused([](RequestHead& h) { h.method = "GET /y"; }, "not a token");
  refused([](RequestHead& h) { h.target = "/a b"; }, "target");
  refused([](RequestHead& h) { h.version = 20; }, "HTTP version");
  refused([](RequestHead& h) { h.fields.emplace_back("Host", "b.test"); }, "duplicate Host");
  refused([](RequestHead& h) { h.Remove("Host"); }, "missing Host");
  refused([](RequestHead& h) { h.Set("Transfer-Encoding", "chunked"); }, "Content-Length with Transfer-Encoding");
  // The body is relayed by head.framing/content_length: the fields must agree.
  refused([](RequestHead& h) { h.Set("Content-Length", "4"); }, "framing");
  refused([](RequestHead& h) { h.Remove("Content-Length"); }, "framing");
  RequestHead h = r.head;
  h.Set("Content-Length", "4");
  h.content_length = 4;
  EXPECT_TRUE(SerialiseRequestHead(h).ok());
}

}  // namespace
}  // namespace agentbox::net
