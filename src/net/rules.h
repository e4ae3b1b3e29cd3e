// Egress rules: the network.allow / network.deny entries compiled into a
// matcher, and the resolved-address guard.
//
// Pure data and pure functions (no sockets, no resolver): the proxy asks
// Decide() about the name a client asked for, resolves the name itself, and
// then asks CheckAddress() about every address before it dials exactly that
// address. Thread-compatible: a RuleSet is immutable once built.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agentbox/policy.h"
#include "agentbox/status.h"

namespace agentbox::net {

// An IPv4 or IPv6 address. IPv4 lives in bytes[0..3].
struct IpAddress {
  bool v6 = false;
  std::array<std::uint8_t, 16> bytes{};

  static std::optional<IpAddress> Parse(std::string_view text);  // strict dotted quad or RFC 4291 text
  static IpAddress V4(std::uint32_t host_order);
  // ::ffff:a.b.c.d → a.b.c.d; everything else unchanged. The proxy dials the
  // unmapped form so that the address it checked is the address it dials.
  IpAddress Unmapped() const;
  std::string ToString() const;  // "10.0.0.1", "fd00::1"
  bool operator==(const IpAddress&) const = default;
};

enum class AddressClass {
  kPublic,
  kLoopback,     // 127/8, ::1
  kPrivate,      // RFC 1918, fec0::/10
  kLinkLocal,    // 169.254/16, fe80::/10
  kCgnat,        // 100.64/10
  kUniqueLocal,  // fc00::/7
  kMetadata,     // cloud instance metadata: 169.254.169.254, fd00:ec2::254, 100.100.100.200
  kUnspecified,  // 0.0.0.0/8, ::
  kMulticast,    // 224/4, ff00::/8
  kReserved,     // documentation, benchmarking, 240/4, broadcast, IETF-reserved v6 ranges
};
// IPv4-mapped, NAT64 (64:ff9b::/96) and 6to4 addresses are classified by the
// IPv4 address they carry.
AddressClass Classify(const IpAddress& address);
const char* ToString(AddressClass c);

// Host names as compared everywhere: lower case, one trailing dot removed,
// IDNA (UTS #46, non-transitional) to A-labels, LDH labels (underscore
// tolerated), at most 253 characters. A name whose last label is all digits
// ("127.1", "2130706433") is refused: resolvers read those as IPv4 numbers.
// IP literals are returned in canonical text ("[::1]" → "::1").
Result<std::string> NormaliseHost(std::string_view host);

// "localhost" and every name under it (RFC 6761 §6.3): loopback, which
// is never asked of a resolver.
bool IsLocalhostName(std::string_view host);

// "host:port", with an IPv6 literal in brackets ("[::1]:443"), as messages
// and connection keys name a destination.
std::string TargetText(const std::string& host, std::uint16_t port);

enum class RuleKind {
  kAnyHost,    // "*" (deny list only)
  kExactHost,  // "github.com"
  kSuffix,     // "*.githubusercontent.com": strict subdomains only
  kLocalhost,  // "localhost": also admits loopback addresses
  kAddress,    // an IP literal or CIDR; admits non-public addresses it contains
};

struct Rule {
  std::string text;    // the entry as written, for reports
  RuleKind kind = RuleKind::kExactHost;
  std::string host;    // normalised host, or the suffix without "*."
  IpAddress network;   // kAddress: the network (host bits cleared)
  int prefix = 0;      // kAddress: prefix length (32/128 for a literal)
  std::uint16_t port = 0;  // 0 = any port

  bool IsSingleAddress() const { return kind == RuleKind::kAddress && prefix == (network.v6 ? 128 : 32); }
};

enum class ListKind { kAllow, kDeny };
// Parses one entry. Errors name the entry and what is wrong; over-broad
// allow entries ("*", "*.com") are refused, "*" is fine in the deny list.
Result<Rule> ParseRule(std::string_view text, ListKind list);

enum class Verdict { kAllow, kDeny, kUnknown };
const char* ToString(Verdict v);

// Why a connection was refused; also the value of the X-Agentbox-Denied header.
enum class DenyReason {
  kNone,
  kDenyRule,      // matched a network.deny entry
  kNotAllowed,    // no allow entry, default deny, nobody said yes
  kAddressGuard,  // resolved to a non-public address not admitted by an IP entry
  kAskDenied,     // the person or --ask-command said no, or did not answer in time
  kAskBusy,       // too many questions open already: refused without asking
  kSniMismatch,   // TLS SNI names another host than the CONNECT target
  kBadRequest,    // unusable target (bad name, port 0)
  kPlaceholder,   // a secret's placeholder in a request to a host that is not the secret's
  kPlainHttp,     // plain HTTP to a host whose TLS agentbox terminates (credentials, http_rules)
  kNotTls,        // a tunnel to such a host that does not start with TLS
};
const char* ToString(DenyReason r);

struct Decision {
  Verdict verdict = Verdict::kUnknown;
  DenyReason reason = DenyReason::kNone;
  std::string rule;     // the entry that decided ("github.com", "network.default: allow", ...)
  std::string message;  // one line for people: "evil.example:443 is not in network.allow"
  bool via_localhost = false;  // allowed by a `localhost` entry

  static Decision Allow(std::string rule) { return {Verdict::kAllow, DenyReason::kNone, std::move(rule), "", false}; }
  static Decision Deny(DenyReason reason, std::string rule, std::string message) {
    return {Verdict::kDeny, reason, std::move(rule), std::move(message), false};
  }
};

class RuleSet {
 public:
  // Compiles the network section. Every entry is parsed; the first bad one
  // is the error (policy validation has normally caught it already).
  static Result<RuleSet> Build(const NetworkSpec& spec);
  static Result<RuleSet> Build(const std::vector<std::string>& allow, const std::vector<std::string>& deny,
                               NetDefault default_action);

  // The verdict for a requested target (a name or an IP literal) before
  // resolution. Deny entries win over allow entries; with no match the
  // verdict is kAllow under `default: allow`, else kUnknown (the caller asks
  // or denies). `host` must come from NormaliseHost.
  Decision Decide(const std::string& host, std::uint16_t port) const;

  // Whether `address` (one result of resolving `host`) may be dialled, given
  // the allowing decision for the name. Deny entries that are addresses
  // apply; a non-public address is admitted only by an allow entry that is an
  // IP literal/CIDR containing it (metadata addresses: only the exact
  // literal), or, for loopback, when the name was allowed by `localhost`.
  Decision CheckAddress(const std::string& host, const Decision& by_name, const IpAddress& address,
                        std::uint16_t port) const;

  // Whether `host` may be resolved at all (DNS inside the sandbox): allowed
  // when an allow entry names it on any port, denied by a deny entry for
  // every port; kUnknown otherwise (the caller asks or refuses). The ports
  // are decided when the sandbox connects.
  Decision DecideName(const std::string& host) const;

  const std::vector<Rule>& allow() const { return allow_; }
  const std::vector<Rule>& deny() const { return deny_; }
  NetDefault default_action() const { return default_; }

 private:
  std::vector<Rule> allow_;
  std::vector<Rule> deny_;
  NetDefault default_ = NetDefault::kDeny;
};

// Whether `rule` matches a normalised host (name or IP literal) and port.
bool Matches(const Rule& rule, const std::string& host, std::uint16_t port);
// Whether an address rule contains `address` and admits `port`.
bool Contains(const Rule& rule, const IpAddress& address, std::uint16_t port);

}  // namespace agentbox::net
