// L7 rules (network.http_rules): on a host whose TLS the proxy terminates,
// only requests whose method and path match one of the host's allow
// patterns pass.
//
// Pure data and pure functions. Paths are compared in one strict normal form
// (NormaliseRequestPath), and every form that servers disagree about (an
// encoded slash, a dot segment, "//", a backslash, "..;") is refused before
// any rule is consulted, so that the path a rule matched is the path the real
// host serves. Thread-compatible: an HttpRuleSet is immutable once built.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "agentbox/policy.h"
#include "agentbox/status.h"

namespace agentbox::net {

// The path of an origin-form request-target, for matching. The query
// ("?...") is cut off; percent-encoded unreserved characters (A-Z a-z 0-9
// - . _ ~) are decoded, every other escape is kept with upper-case hex
// ("%3a" → "%3A"; "%25" stays, so nothing is decoded twice). Refused, each
// with a named reason: a target not starting with "/", %2F or %5C (encoded
// slash or backslash), %00 or any other control character (encoded or not),
// a space, a literal backslash, a fragment, non-ASCII bytes, bad escapes,
// "." and ".." segments (also as %2e, and with ";params" after them as some
// servers strip those), a segment that is only ";params", and empty segments
// ("//") except a final one: a trailing slash is kept and is significant.
Result<std::string> NormaliseRequestPath(std::string_view target);

// One allow entry, "METHOD /seg/seg": METHOD a token or "*" (any method);
// the path normalised as above, then split into segments. A segment "**"
// matches zero or more whole segments; "*" inside a segment matches any run
// of characters within that one segment (never "/"), the empty run too. A
// "*" in a pattern is always a wildcard. "/a/b" and "/a/b/" are different
// paths: the trailing slash is an empty last segment, so "/a/b" does not
// match "/a/b/", "/a/*" matches "/a/" but not "/a/b/", and "/a/**" matches
// "/a", "/a/" and everything below.
struct HttpRulePattern {
  std::string text;                   // as written, for reports
  std::string method;                 // a token, or "*"
  std::vector<std::string> segments;  // the path after its leading "/", split at "/"

  // `method` as sent (case-sensitive), `path` from NormaliseRequestPath.
  // Linear in segments × segment length in the worst case: no backtracking
  // blow-up whatever the sandbox sends.
  bool Matches(std::string_view method, std::string_view path) const;
};
Result<HttpRulePattern> ParseHttpRulePattern(std::string_view text);

struct HttpRuleVerdict {
  bool allowed = false;
  std::string rule;     // allowed: the pattern that allowed it ("" for a host without rules);
                        // refused: "network.http_rules[host]"
  std::string message;  // refused: "DELETE /repos/acme/x is not allowed on api.github.com by network.http_rules"
};

class HttpRuleSet {
 public:
  // Hosts go through NormaliseHost; entries naming the same host are merged
  // (the allow lists add up). The first bad host or pattern is the error.
  static Result<HttpRuleSet> Build(const std::vector<HttpRuleSpec>& specs);

  // Whether a normalised host has rules. A host without rules is not
  // restricted by them (Check allows everything there).
  bool Covers(const std::string& host) const;

  // `host` normalised, `method` as sent (methods are case-sensitive), `path`
  // from NormaliseRequestPath.
  HttpRuleVerdict Check(const std::string& host, std::string_view method, const std::string& path) const;

  std::vector<std::string> hosts() const;  // sorted

 private:
  std::map<std::string, std::vector<HttpRulePattern>> rules_;
};

}  // namespace agentbox::net
