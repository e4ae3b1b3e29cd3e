// Fuzzes what the egress proxy reads from a sandboxed client before it
// decides anything: HTTP proxy request heads (fed in pieces, as they arrive
// from a socket), SOCKS5 greetings and requests, TLS ClientHello SNI, the
// host normalisation/rule matching the targets then go through, and, behind
// the TLS terminator, the strict request head and the network.http_rules
// path matcher. The first byte picks the parser; the second, for the HTTP
// heads, the piece sizes.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "net/git_push.h"
#include "net/http_head.h"
#include "net/http_request.h"
#include "net/http_rules.h"
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

bool SameHead(const agentbox::net::RequestHead& a, const agentbox::net::RequestHead& b) {
  return a.method == b.method && a.target == b.target && a.version == b.version && a.fields == b.fields &&
         a.host == b.host && a.framing == b.framing && a.content_length == b.content_length;
}

// The terminated stream's head: fed in pieces of varying size (the second
// byte seeds them), it must give the same answer as in one piece; a head it
// accepts must serialise and parse back to itself, and keep refusing a
// value that would inject a field.
void FuzzTerminatedHead(std::string_view data, std::uint8_t seed) {
  using agentbox::net::ParseState;
  constexpr std::size_t kLimit = 4096;
  agentbox::net::RequestHeadParser parser(kLimit);
  agentbox::net::HeadParse r;
  std::uint32_t state = seed | 1u;
  for (std::size_t n = 0; n < data.size() && r.state == ParseState::kNeedMore;) {
    state = state * 1103515245u + 12345u;
    n = std::min(data.size(), n + 1 + (state >> 16) % 97);
    r = parser.Parse(data.substr(0, n));
  }
  auto whole = agentbox::net::ParseTerminatedRequestHead(data, kLimit);
  if (whole.state != r.state || whole.status != r.status || whole.reason != r.reason) {
    Die("pieces and one piece disagree");
  }
  if (r.state == ParseState::kError) {
    if (r.status != 400 && r.status != 431 && r.status != 501) Die("unexpected error status");
    if (r.reason.empty()) Die("error without a reason");
    return;
  }
  if (r.state != ParseState::kDone) return;
  const auto& head = r.head;
  if (!SameHead(head, whole.head) || head.head_size != whole.head.head_size) Die("pieces and one piece differ");
  if (head.head_size == 0 || head.head_size > data.size() || head.head_size > kLimit) Die("head size outside");
  if (head.target.empty() || head.target.front() != '/' || head.host.empty()) Die("done without a target");
  auto out = agentbox::net::SerialiseRequestHead(head);
  if (!out.ok()) Die("an accepted head does not serialise");
  auto again = agentbox::net::ParseTerminatedRequestHead(*out, out->size());
  if (again.state != ParseState::kDone || !SameHead(again.head, head)) Die("serialised head parses differently");
  // A value carrying whatever the input holds after the head, as a secret
  // of unknown shape would.
  auto changed = head;
  changed.Set("Authorization", std::string(data.substr(head.head_size, 64)));
  if (auto s = agentbox::net::SerialiseRequestHead(changed); s.ok()) {
    auto parsed = agentbox::net::ParseTerminatedRequestHead(*s, s->size());
    if (parsed.state != ParseState::kDone || parsed.head.fields.size() != changed.fields.size()) {
      Die("a changed head serialised into another head");
    }
  }
  auto path = agentbox::net::NormaliseRequestPath(head.target);
  if (path.ok()) {
    auto twice = agentbox::net::NormaliseRequestPath(*path);
    if (!twice.ok() || *twice != *path) Die("NormaliseRequestPath is not idempotent");
  }
}

// Reference matchers by dynamic programming, to check the greedy ones.
bool DpSegment(std::string_view p, std::string_view s) {
  std::vector<std::vector<char>> m(p.size() + 1, std::vector<char>(s.size() + 1, 0));
  m[p.size()][s.size()] = 1;
  for (std::size_t i = p.size(); i-- > 0;) {
    for (std::size_t j = s.size() + 1; j-- > 0;) {
      if (p[i] == '*') m[i][j] = m[i + 1][j] || (j < s.size() && m[i][j + 1]);
      else m[i][j] = j < s.size() && p[i] == s[j] && m[i + 1][j + 1];
    }
  }
  return m[0][0];
}

bool DpPath(const std::vector<std::string>& p, const std::vector<std::string_view>& s) {
  std::vector<std::vector<char>> m(p.size() + 1, std::vector<char>(s.size() + 1, 0));
  m[p.size()][s.size()] = 1;
  for (std::size_t i = p.size(); i-- > 0;) {
    for (std::size_t j = s.size() + 1; j-- > 0;) {
      if (p[i] == "**") m[i][j] = m[i + 1][j] || (j < s.size() && m[i][j + 1]);
      else m[i][j] = j < s.size() && DpSegment(p[i], s[j]) && m[i + 1][j + 1];
    }
  }
  return m[0][0];
}

// "PATTERN\nMETHOD\nTARGET": the pattern parsed, the target normalised,
// Check against a reference matcher.
void FuzzHttpRules(std::string_view data) {
  std::size_t nl1 = data.find('\n');
  std::size_t nl2 = nl1 == std::string_view::npos ? nl1 : data.find('\n', nl1 + 1);
  if (nl2 == std::string_view::npos) return;
  std::string pattern(data.substr(0, nl1));
  std::string method(data.substr(nl1 + 1, nl2 - nl1 - 1));
  std::string_view target = data.substr(nl2 + 1);
  auto path = agentbox::net::NormaliseRequestPath(target);
  if (path.ok()) {
    if (path->empty() || path->front() != '/' || path->size() > target.size()) Die("odd normalised path");
    auto twice = agentbox::net::NormaliseRequestPath(*path);
    if (!twice.ok() || *twice != *path) Die("NormaliseRequestPath is not idempotent");
  }
  auto set = agentbox::net::HttpRuleSet::Build({{"api.example", {pattern}}});
  auto parsed = agentbox::net::ParseHttpRulePattern(pattern);
  if (set.ok() != parsed.ok()) Die("Build and ParseHttpRulePattern disagree");
  if (!set.ok() || !path.ok()) return;
  if (!set->Covers("api.example") || set->Covers("other.example")) Die("Covers is wrong");
  auto verdict = set->Check("api.example", method, *path);
  std::vector<std::string_view> segments;
  for (std::string_view rest = std::string_view(*path).substr(1);;) {
    std::size_t slash = rest.find('/');
    segments.push_back(rest.substr(0, slash));
    if (slash == std::string_view::npos) break;
    rest.remove_prefix(slash + 1);
  }
  // The reference is quadratic in memory and time: only for small inputs.
  if (pattern.size() * path->size() > 64 * 1024) return;
  bool expected = (parsed->method == "*" || parsed->method == method) && DpPath(parsed->segments, segments);
  if (verdict.allowed != expected) Die("Check disagrees with the reference matcher");
  if (verdict.allowed ? verdict.rule != pattern : verdict.message.empty()) Die("verdict without its rule");
  if (!set->Check("other.example", method, *path).allowed) Die("an uncovered host was restricted");
}

// A receive-pack request body (what `git push` POSTs): parsed; when it
// parses, the push is checked as deny_force would (walking the pack), and the
// refusal's report is built. Nothing may crash, and a refusal names a ref.
void FuzzGitPush(std::string_view body) {
  auto request = agentbox::net::ParseReceivePack(body);
  if (!request.ok()) return;
  agentbox::GitPushSpec spec;
  spec.allow_refs = {"refs/heads/agent/*"};
  spec.deny_force = true;
  agentbox::net::PackLimits limits;
  limits.max_objects = 4096;
  limits.max_inflated_bytes = 16 << 20;
  auto verdict = agentbox::net::CheckPush(spec, *request, limits);
  for (const auto& r : verdict.refused) {
    if (r.reason.empty() || r.update.ref.empty()) Die("a refusal without its ref or reason");
  }
  (void)agentbox::net::RefusalResponseBody(*request, verdict);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  switch (data[0] % 7) {
    case 0: FuzzHttp(rest, 1 + data[1] % 64); break;
    case 1: FuzzSocks(rest); break;
    case 2: (void)agentbox::net::ParseClientHelloSni(rest, 4096); break;
    case 3: FuzzRules(rest); break;
    case 4: FuzzTerminatedHead(rest, data[1]); break;
    case 5: FuzzHttpRules(rest); break;
    case 6: FuzzGitPush(rest); break;
  }
  return 0;
}
