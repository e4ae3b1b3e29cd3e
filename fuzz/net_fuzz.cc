// Fuzzes what the egress proxy reads from a sandboxed client before it
// decides anything: HTTP proxy request heads (fed in pieces, as they arrive
// from a socket), SOCKS5 greetings and requests, TLS ClientHello SNI, and the
// host normalisation/rule matching the targets then go through. The first
// byte picks the parser; the second, for HTTP, the piece size.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "net/http_request.h"
#include "net/rules.h"
#include "net/socks5.h"
#include "net/tls_sni.h"

namespace {

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "net_fuzz: %s\n", what);
  std::abort();
}

void FuzzHttp(std::string_view data, std::size_t piece) {
  agentbox::net::HttpRequestParser parser(4096);
  for (std::size_t end = piece; ; end += piece) {
    std::size_t n = end < data.size() ? end : data.size();
    auto r = parser.Parse(data.substr(0, n));
    if (r.state == agentbox::net::ParseState::kError) {
      if (r.status != 400 && r.status != 431) Die("unexpected error status");
      return;
    }
    if (r.state == agentbox::net::ParseState::kDone) {
      if (r.request.head_size == 0 || r.request.head_size > n) Die("head size outside the input");
      if (r.request.port == 0 || r.request.host.empty()) Die("done without a target");
      (void)agentbox::net::NormaliseHost(r.request.host).ok();
      return;
    }
    if (n == data.size()) return;
  }
}

void FuzzSocks(std::string_view data) {
  auto g = agentbox::net::ParseSocksGreeting(data);
  if (g.state != agentbox::net::SocksState::kDone) return;
  if (g.size > data.size()) Die("greeting size outside the input");
  auto r = agentbox::net::ParseSocksRequest(data.substr(g.size));
  if (r.state == agentbox::net::SocksState::kDone) {
    if (r.size > data.size() - g.size) Die("request size outside the input");
    (void)agentbox::net::NormaliseHost(r.host).ok();
  }
}

void FuzzRules(std::string_view data) {
  std::size_t nl = data.find('\n');
  std::string entry(data.substr(0, nl));
  std::string host(nl == std::string_view::npos ? std::string_view() : data.substr(nl + 1));
  auto set = agentbox::net::RuleSet::Build({entry}, {entry}, agentbox::NetDefault::kDeny);
  auto h = agentbox::net::NormaliseHost(host);
  if (!h.ok()) return;
  // Idempotent: a normalised name normalises to itself.
  auto again = agentbox::net::NormaliseHost(*h);
  if (!again.ok() || *again != *h) Die("NormaliseHost is not idempotent");
  if (set.ok()) {
    auto d = set->Decide(*h, 443);
    // The same entry in both lists: deny must win whenever it matches.
    if (d.verdict == agentbox::net::Verdict::kAllow) Die("allow despite an identical deny entry");
  }
  if (auto ip = agentbox::net::IpAddress::Parse(*h)) (void)agentbox::net::Classify(*ip);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  switch (data[0] % 4) {
    case 0: FuzzHttp(rest, 1 + data[1] % 64); break;
    case 1: FuzzSocks(rest); break;
    case 2: (void)agentbox::net::ParseClientHelloSni(rest, 4096); break;
    case 3: FuzzRules(rest); break;
  }
  return 0;
}
