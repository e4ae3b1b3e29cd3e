// The proxy's parsers on their own: HTTP request heads, SOCKS5 messages and
// the TLS ClientHello server_name.
#include <gtest/gtest.h>

#include "net/http_request.h"
#include "net/socks5.h"
#include "net/tls_sni.h"

namespace agentbox::net {
namespace {

HttpParseResult ParseAll(const std::string& text, std::size_t limit = 32 * 1024) {
  HttpRequestParser p(limit);
  return p.Parse(text);
}

TEST(HttpRequestParser, ConnectAndForward) {
  auto c = ParseAll("CONNECT Example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\nEXTRA");
  ASSERT_EQ(c.state, ParseState::kDone);
  EXPECT_EQ(c.request.kind, ProxyRequest::Kind::kConnect);
  EXPECT_EQ(c.request.host, "Example.com");
  EXPECT_EQ(c.request.port, 443);
  EXPECT_EQ(c.request.head_size, std::string("CONNECT Example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n").size());

  auto v6 = ParseAll("CONNECT [::1]:8443 HTTP/1.1\r\n\r\n");
  ASSERT_EQ(v6.state, ParseState::kDone);
  EXPECT_EQ(v6.request.host, "::1");

  auto f = ParseAll("GET http://example.com/a?b HTTP/1.1\r\nHost: other\r\nProxy-Connection: keep-alive\r\n"
                    "Accept: */*\r\n\r\n");
  ASSERT_EQ(f.state, ParseState::kDone);
  EXPECT_EQ(f.request.kind, ProxyRequest::Kind::kForward);
  EXPECT_EQ(f.request.port, 80);
  EXPECT_EQ(f.request.upstream_head,
            "GET /a?b HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\nConnection: close\r\n\r\n");
  auto bare = ParseAll("GET HTTP://example.com:8080 HTTP/1.0\r\n\r\n");
  ASSERT_EQ(bare.state, ParseState::kDone);
  EXPECT_EQ(bare.request.port, 8080);
  EXPECT_EQ(bare.request.upstream_head.rfind("GET / HTTP/1.0\r\nHost: example.com:8080\r\n", 0), 0u);
}

TEST(HttpRequestParser, IncrementalAndLimits) {
  const std::string head = "CONNECT a.test:443 HTTP/1.1\r\nUser-Agent: t\r\n\r\n";
  HttpRequestParser p(32 * 1024);
  for (std::size_t i = 1; i < head.size(); ++i) {
    EXPECT_EQ(p.Parse(head.substr(0, i)).state, ParseState::kNeedMore) << i;
  }
  EXPECT_EQ(p.Parse(head).state, ParseState::kDone);

  std::string big = "GET http://a.test/ HTTP/1.1\r\nX: " + std::string(40000, 'x');
  auto r = ParseAll(big);
  EXPECT_EQ(r.state, ParseState::kError);
  EXPECT_EQ(r.status, 431);
  for (const char* bad : {"\r\n\r\n", "GET\r\n\r\n", "GET / HTTP/1.1\r\n\r\n", "CONNECT a.test HTTP/1.1\r\n\r\n",
                          "CONNECT :443 HTTP/1.1\r\n\r\n", "CONNECT a:b:443 HTTP/1.1\r\n\r\n",
                          "GET ftp://a.test/ HTTP/1.1\r\n\r\n", "GET http:///x HTTP/1.1\r\n\r\n",
                          "GET http://a@b.test/ HTTP/1.1\r\n\r\n", "GET http://a.test/ HTTP/1.1\r\nBad Field: x\r\n\r\n"}) {
    EXPECT_EQ(ParseAll(bad).state, ParseState::kError) << bad;
  }
}

TEST(SimpleResponse, OneLineBodyAndHeader) {
  std::string r = SimpleResponse(403, "not-allowed", "agentbox: x.test:443 is not in network.allow\r\nInjected: 1");
  EXPECT_EQ(r.rfind("HTTP/1.1 403 Forbidden\r\n", 0), 0u);
  EXPECT_NE(r.find("\r\nX-Agentbox-Denied: not-allowed\r\n"), std::string::npos);
  std::string body = r.substr(r.find("\r\n\r\n") + 4);
  EXPECT_EQ(body, "agentbox: x.test:443 is not in network.allow  Injected: 1\n");
}

TEST(Socks5, GreetingAndRequest) {
  EXPECT_EQ(ParseSocksGreeting(std::string("\x05", 1)).state, SocksState::kNeedMore);
  auto g = ParseSocksGreeting(std::string("\x05\x02\x02\x00", 4));
  EXPECT_EQ(g.state, SocksState::kDone);
  EXPECT_TRUE(g.no_auth);
  EXPECT_EQ(g.size, 4u);
  EXPECT_EQ(ParseSocksGreeting(std::string("\x04\x01\x00", 3)).state, SocksState::kError);
  EXPECT_EQ(ParseSocksGreeting(std::string("\x05\x00", 2)).state, SocksState::kError);

  std::string req = std::string("\x05\x01\x00\x03\x08", 5) + "a.test.x" + std::string("\x01\xbb", 2);
  for (std::size_t i = 0; i < req.size(); ++i) {
    EXPECT_EQ(ParseSocksRequest(req.substr(0, i)).state, SocksState::kNeedMore) << i;
  }
  auto r = ParseSocksRequest(req + "tail");
  ASSERT_EQ(r.state, SocksState::kDone);
  EXPECT_EQ(r.host, "a.test.x");
  EXPECT_EQ(r.port, 443);
  EXPECT_EQ(r.size, req.size());
  auto v6 = ParseSocksRequest(std::string("\x05\x01\x00\x04", 4) + std::string(15, '\0') + "\x01" + std::string("\x00\x50", 2));
  ASSERT_EQ(v6.state, SocksState::kDone);
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(ParseSocksRequest(std::string("\x05\x01\x00\x07", 4)).reply, kSocksAddressTypeNotSupported);
  EXPECT_EQ(ParseSocksRequest(std::string("\x05\x01\x00\x03\x00\x00\x50", 7)).reply, kSocksGeneralFailure);
  EXPECT_EQ(ParseSocksRequest(std::string("\x05\x01\x01", 3)).state, SocksState::kError);  // RSV must be 0
}

std::string Hello(const std::string& sni) {
  std::string ext;
  if (!sni.empty()) {
    std::string name = std::string("\x00", 1) + char(sni.size() >> 8) + char(sni.size() & 0xff) + sni;
    std::string list = std::string() + char(name.size() >> 8) + char(name.size() & 0xff) + name;
    ext = std::string("\x00\x00", 2) + char(list.size() >> 8) + char(list.size() & 0xff) + list;
  }
  std::string body = std::string("\x03\x03", 2) + std::string(32, 'r') + std::string("\x00", 1) +
                     std::string("\x00\x02\x13\x01", 4) + std::string("\x01\x00", 2) + char(ext.size() >> 8) +
                     char(ext.size() & 0xff) + ext;
  std::string hs = std::string("\x01", 1) + char(0) + char(body.size() >> 8) + char(body.size() & 0xff) + body;
  return hs;
}

std::string Records(const std::string& hs, std::size_t fragment) {
  std::string out;
  for (std::size_t i = 0; i < hs.size(); i += fragment) {
    std::string part = hs.substr(i, fragment);
    out += std::string("\x16\x03\x01", 3) + char(part.size() >> 8) + char(part.size() & 0xff) + part;
  }
  return out;
}

TEST(ClientHelloSni, FoundAbsentFragmentedMalformed) {
  std::string one = Records(Hello("api.example.com"), 1 << 14);
  auto r = ParseClientHelloSni(one);
  EXPECT_EQ(r.state, SniState::kFound);
  EXPECT_EQ(r.server_name, "api.example.com");
  for (std::size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(ParseClientHelloSni(one.substr(0, i)).state, SniState::kNeedMore) << i;
  }
  // The handshake split over many records (as large post-quantum hellos are).
  auto frag = ParseClientHelloSni(Records(Hello("frag.example"), 7));
  EXPECT_EQ(frag.state, SniState::kFound);
  EXPECT_EQ(frag.server_name, "frag.example");
  EXPECT_EQ(ParseClientHelloSni(Records(Hello(""), 1 << 14)).state, SniState::kAbsent);
  EXPECT_EQ(ParseClientHelloSni("SSH-2.0-x\r\n").state, SniState::kNotTls);
  EXPECT_EQ(ParseClientHelloSni(std::string("\x16\x03\x01\x00\x00", 5)).state, SniState::kMalformed);
  EXPECT_EQ(ParseClientHelloSni(std::string("\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00", 10)).state,
            SniState::kMalformed);  // ServerHello, not ClientHello
  std::string truncated = Hello("x.test");
  truncated[3] = static_cast<char>(truncated[3] - 10);  // body length shorter than its content claims
  EXPECT_EQ(ParseClientHelloSni(Records(truncated.substr(0, truncated.size() - 10), 1 << 14)).state,
            SniState::kMalformed);
  // A handshake that claims more than the bound.
  EXPECT_EQ(ParseClientHelloSni(std::string("\x16\x03\x01\x00\x04\x01\xff\xff\xff", 9)).state, SniState::kMalformed);
}

}  // namespace
}  // namespace agentbox::net
