#include "net/http_rules.h"

#include "net/http_text.h"
#include "net/rules.h"

namespace agentbox::net {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool IsUnreserved(int c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_' || c == '~';
}

// The path after its leading "/", split at "/": "/" is {""}, "/a/" {"a", ""}.
std::vector<std::string_view> PathSegments(std::string_view path) {
  std::vector<std::string_view> out;
  path.remove_prefix(1);
  while (true) {
    std::size_t slash = path.find('/');
    out.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) return out;
    path.remove_prefix(slash + 1);
  }
}

// The classic greedy wildcard match with one backtrack point: correct for a
// pattern whose only wildcard is a star and whose other elements each match
// exactly one text element, and O(pattern × text) at worst. Used twice:
// characters within a segment ('*'), and segments within a path ("**").
template <typename Pattern, typename Text, typename IsStar, typename Same>
bool GreedyMatch(const Pattern& pat, const Text& text, IsStar is_star, Same same) {
  std::size_t p = 0, t = 0;
  std::size_t star = std::string::npos, star_t = 0;
  while (t < text.size()) {
    if (p < pat.size() && is_star(pat[p])) {
      star = p++;
      star_t = t;
    } else if (p < pat.size() && same(pat[p], text[t])) {
      ++p;
      ++t;
    } else if (star != std::string::npos) {
      p = star + 1;
      t = ++star_t;
    } else {
      return false;
    }
  }
  while (p < pat.size() && is_star(pat[p])) ++p;
  return p == pat.size();
}

bool SegmentMatches(std::string_view pattern, std::string_view segment) {
  return GreedyMatch(pattern, segment, [](char c) { return c == '*'; }, [](char a, char b) { return a == b; });
}

}  // namespace

Result<std::string> NormaliseRequestPath(std::string_view target) {
  auto fail = [&](const std::string& why) -> Result<std::string> {
    return Status::Error("http", why + " in the path \"" + Printable(target, 200) + "\"");
  };
  if (target.empty() || target.front() != '/') return fail("not starting with /");
  std::string_view path = target.substr(0, target.find('?'));
  std::string out;
  out.reserve(path.size());
  for (std::size_t i = 0; i < path.size(); ++i) {
    auto c = static_cast<unsigned char>(path[i]);
    if (c >= 0x80) return fail("non-ASCII byte");
    if (c < 0x20 || c == 0x7f) return fail("control character");
    if (c == ' ') return fail("space");
    if (c == '\\') return fail("backslash");  // some servers read it as "/"
    if (c == '#') return fail("fragment");
    if (c != '%') {
      out += static_cast<char>(c);
      continue;
    }
    int hi = i + 2 < path.size() ? HexValue(path[i + 1]) : -1;
    int lo = hi >= 0 ? HexValue(path[i + 2]) : -1;
    if (lo < 0) return fail("bad percent-encoding");
    i += 2;
    int v = hi * 16 + lo;
    // Servers that decode before routing would see another path than ours.
    if (v == '/') return fail("encoded slash (%2F)");
    if (v == '\\') return fail("encoded backslash (%5C)");
    if (v == 0) return fail("encoded NUL (%00)");
    if (v < 0x20 || v == 0x7f) return fail("encoded control character");
    if (IsUnreserved(v)) {
      out += static_cast<char>(v);
    } else {
      constexpr char kHex[] = "0123456789ABCDEF";
      out += '%';
      out += kHex[v >> 4];
      out += kHex[v & 15];
    }
  }
  // Segment checks after decoding, so that "%2e%2e" is seen as "..".
  std::vector<std::string_view> segments = PathSegments(out);
  for (std::size_t i = 0; i < segments.size(); ++i) {
    std::string_view segment = segments[i];
    bool last = i + 1 == segments.size();
    if (segment.empty()) {
      if (!last) return fail("empty segment (//)");
      continue;
    }
    // Servlet containers drop ";params" before routing: "..;x" is "..".
    std::string_view bare = segment.substr(0, segment.find(';'));
    if (bare == "." || bare == "..") return fail("dot segment");
    if (bare.empty()) return fail("segment of only ;params");
  }
  return out;
}

Result<HttpRulePattern> ParseHttpRulePattern(std::string_view text) {
  auto fail = [&](const std::string& why) -> Result<HttpRulePattern> {
    return Status::Error("network", "network.http_rules: " + why + " in \"" + Printable(text, 200) + "\"");
  };
  std::size_t space = text.find(' ');
  if (space == std::string_view::npos) return fail("expected \"METHOD /path\"");
  HttpRulePattern pattern;
  pattern.text = std::string(text);
  pattern.method = std::string(text.substr(0, space));
  std::string_view path = text.substr(space + 1);
  if (pattern.method != "*" && !IsToken(pattern.method)) return fail("the method is not a token or *");
  if (path.find('?') != std::string_view::npos) return fail("a query (patterns match the path only)");
  auto normal = NormaliseRequestPath(path);
  if (!normal.ok()) return fail(normal.status().message());
  for (std::string_view segment : PathSegments(*normal)) {
    if (segment != "**" && segment.find("**") != std::string_view::npos) return fail("** not a whole segment");
    pattern.segments.emplace_back(segment);
  }
  return pattern;
}

bool HttpRulePattern::Matches(std::string_view request_method, std::string_view path) const {
  if (method != "*" && method != request_method) return false;
  if (path.empty() || path.front() != '/') return false;
  return GreedyMatch(
      segments, PathSegments(path), [](const std::string& s) { return s == "**"; },
      [](const std::string& pat, std::string_view segment) { return SegmentMatches(pat, segment); });
}

Result<HttpRuleSet> HttpRuleSet::Build(const std::vector<HttpRuleSpec>& specs) {
  HttpRuleSet set;
  for (const HttpRuleSpec& spec : specs) {
    auto host = NormaliseHost(spec.host);
    if (!host.ok()) return Status::Error("network", "network.http_rules: host: " + host.status().message());
    auto& patterns = set.rules_[*host];
    for (const std::string& text : spec.allow) {
      auto pattern = ParseHttpRulePattern(text);
      if (!pattern.ok()) return pattern.status();
      patterns.push_back(std::move(pattern).value());
    }
  }
  return set;
}

bool HttpRuleSet::Covers(const std::string& host) const { return rules_.count(host) != 0; }

HttpRuleVerdict HttpRuleSet::Check(const std::string& host, std::string_view method, const std::string& path) const {
  auto it = rules_.find(host);
  if (it == rules_.end()) return {true, "", ""};
  for (const HttpRulePattern& pattern : it->second) {
    if (pattern.Matches(method, path)) return {true, pattern.text, ""};
  }
  return {false, "network.http_rules[" + host + "]",
          std::string(method) + " " + path + " is not allowed on " + host + " by network.http_rules"};
}

std::vector<std::string> HttpRuleSet::hosts() const {
  std::vector<std::string> out;
  for (const auto& [host, patterns] : rules_) out.push_back(host);
  return out;
}

}  // namespace agentbox::net
