#include "net/rules.h"

#include <arpa/inet.h>
#include <idn2.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "policy/checks.h"

namespace agentbox::net {
namespace {

std::string Quoted(std::string_view text) { return "\"" + std::string(text) + "\""; }

bool IsAscii(std::string_view text) {
  for (unsigned char c : text) {
    if (c >= 0x80) return false;
  }
  return true;
}

// Prefix test on the first `bits` bits.
bool InPrefix(const IpAddress& a, const IpAddress& net, int bits) {
  if (a.v6 != net.v6) return false;
  int full = bits / 8;
  if (std::memcmp(a.bytes.data(), net.bytes.data(), static_cast<std::size_t>(full)) != 0) return false;
  int rest = bits % 8;
  if (rest == 0) return true;
  std::uint8_t mask = static_cast<std::uint8_t>(0xff << (8 - rest));
  return (a.bytes[full] & mask) == (net.bytes[full] & mask);
}

IpAddress V6(std::initializer_list<std::uint8_t> head) {
  IpAddress a;
  a.v6 = true;
  std::size_t i = 0;
  for (std::uint8_t b : head) a.bytes[i++] = b;
  return a;
}

bool V4In(const IpAddress& a, std::uint8_t b0, std::uint8_t b1, int bits) {
  IpAddress net = IpAddress::V4((std::uint32_t{b0} << 24) | (std::uint32_t{b1} << 16));
  return InPrefix(a, net, bits);
}

AddressClass ClassifyV4(const IpAddress& a) {
  const auto& b = a.bytes;
  if (b[0] == 169 && b[1] == 254 && b[2] == 169 && b[3] == 254) return AddressClass::kMetadata;
  if (b[0] == 100 && b[1] == 100 && b[2] == 100 && b[3] == 200) return AddressClass::kMetadata;  // Alibaba
  if (b[0] == 0) return AddressClass::kUnspecified;
  if (b[0] == 127) return AddressClass::kLoopback;
  if (b[0] == 10 || V4In(a, 172, 16, 12) || V4In(a, 192, 168, 16)) return AddressClass::kPrivate;
  if (V4In(a, 169, 254, 16)) return AddressClass::kLinkLocal;
  if (V4In(a, 100, 64, 10)) return AddressClass::kCgnat;
  if (b[0] >= 224 && b[0] <= 239) return AddressClass::kMulticast;
  if (b[0] >= 240) return AddressClass::kReserved;  // 240/4 and 255.255.255.255
  if ((b[0] == 192 && b[1] == 0 && (b[2] == 0 || b[2] == 2)) ||  // IETF assignments, TEST-NET-1
      V4In(a, 198, 18, 15) ||                                    // benchmarking
      (b[0] == 198 && b[1] == 51 && b[2] == 100) || (b[0] == 203 && b[1] == 0 && b[2] == 113)) {
    return AddressClass::kReserved;
  }
  return AddressClass::kPublic;
}

IpAddress EmbeddedV4(const IpAddress& a, std::size_t offset) {
  IpAddress v4;
  std::memcpy(v4.bytes.data(), a.bytes.data() + offset, 4);
  return v4;
}

bool ValidName(std::string_view name, std::string* why) {
  if (name.empty()) {
    *why = "empty host name";
    return false;
  }
  if (name.size() > 253) {
    *why = "host name longer than 253 characters";
    return false;
  }
  std::size_t start = 0;
  std::string_view last;
  while (start <= name.size()) {
    std::size_t dot = name.find('.', start);
    if (dot == std::string_view::npos) dot = name.size();
    std::string_view label = name.substr(start, dot - start);
    if (label.empty()) {
      *why = "empty label in host name";
      return false;
    }
    if (label.size() > 63) {
      *why = "label longer than 63 characters";
      return false;
    }
    if (label.front() == '-' || label.back() == '-') {
      *why = "label starts or ends with '-'";
      return false;
    }
    for (char c : label) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
      if (!ok) {
        *why = std::string("character '") + c + "' is not allowed in a host name";
        return false;
      }
    }
    last = label;
    start = dot + 1;
  }
  bool numeric = true;
  for (char c : last) numeric = numeric && c >= '0' && c <= '9';
  // "127.1" and "2130706433" are IPv4 addresses to inet_aton and to every
  // resolver; as names they would slip past address entries.
  if (numeric || (last.size() > 2 && last[0] == '0' && last[1] == 'x')) {
    *why = "looks like an IPv4 address but is not a dotted quad";
    return false;
  }
  return true;
}

Result<std::string> ToALabels(std::string_view host) {
  std::string lower(host);
  if (IsAscii(host)) {
    for (char& c : lower) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    return lower;
  }
  if (!policy_internal::IsValidUtf8(host)) return Status::Error("network", "host name is not valid UTF-8");
  char* out = nullptr;
  int rc = idn2_to_ascii_8z(lower.c_str(), &out, IDN2_NFC_INPUT | IDN2_NONTRANSITIONAL);
  if (rc != IDN2_OK) {
    return Status::Error("network", std::string("not a valid internationalised name (") + idn2_strerror(rc) + ")");
  }
  std::unique_ptr<char, decltype(&idn2_free)> owned(out, &idn2_free);
  return std::string(out);
}

// Splits "host:port" / "[v6]:port" / "v6" into host and port text.
Result<std::pair<std::string_view, std::string_view>> SplitPort(std::string_view pattern) {
  std::string_view host = pattern;
  std::string_view port;
  if (!pattern.empty() && pattern.front() == '[') {
    std::size_t close = pattern.find(']');
    if (close == std::string_view::npos) return Status::Error("network", "missing ] in " + Quoted(pattern));
    host = pattern.substr(1, close - 1);
    std::string_view rest = pattern.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return Status::Error("network", "unexpected text after ] in " + Quoted(pattern));
      port = rest.substr(1);
      if (port.empty()) return Status::Error("network", "empty port in " + Quoted(pattern));
    }
  } else if (std::size_t colon = pattern.find(':');
             colon != std::string_view::npos && pattern.find(':', colon + 1) == std::string_view::npos) {
    host = pattern.substr(0, colon);
    port = pattern.substr(colon + 1);
    if (port.empty()) return Status::Error("network", "empty port in " + Quoted(pattern));
  }
  return std::pair{host, port};
}

std::optional<std::uint16_t> ParsePort(std::string_view text) {
  if (text.empty() || text.size() > 5) return std::nullopt;
  unsigned port = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    port = port * 10 + static_cast<unsigned>(c - '0');
  }
  if (port < 1 || port > 65535) return std::nullopt;
  return static_cast<std::uint16_t>(port);
}

std::string Target(const std::string& host, std::uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

}  // namespace

std::optional<IpAddress> IpAddress::Parse(std::string_view text) {
  if (text.empty() || text.size() > 64) return std::nullopt;
  std::string copy(text);
  IpAddress a;
  if (copy.find(':') == std::string::npos) {
    if (inet_pton(AF_INET, copy.c_str(), a.bytes.data()) != 1) return std::nullopt;
    return a;
  }
  if (inet_pton(AF_INET6, copy.c_str(), a.bytes.data()) != 1) return std::nullopt;
  a.v6 = true;
  return a;
}

IpAddress IpAddress::V4(std::uint32_t host_order) {
  IpAddress a;
  a.bytes[0] = static_cast<std::uint8_t>(host_order >> 24);
  a.bytes[1] = static_cast<std::uint8_t>(host_order >> 16);
  a.bytes[2] = static_cast<std::uint8_t>(host_order >> 8);
  a.bytes[3] = static_cast<std::uint8_t>(host_order);
  return a;
}

IpAddress IpAddress::Unmapped() const {
  static const IpAddress kMapped = V6({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff});
  if (v6 && InPrefix(*this, kMapped, 96)) return EmbeddedV4(*this, 12);
  return *this;
}

std::string IpAddress::ToString() const {
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(v6 ? AF_INET6 : AF_INET, bytes.data(), buf, sizeof buf);
  return buf;
}

AddressClass Classify(const IpAddress& a) {
  if (!a.v6) return ClassifyV4(a);
  static const IpAddress kZero = V6({});
  static const IpAddress kMapped = V6({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff});
  static const IpAddress kNat64 = V6({0, 0x64, 0xff, 0x9b});
  static const IpAddress k6to4 = V6({0x20, 0x02});
  static const IpAddress kMetadataAws = *IpAddress::Parse("fd00:ec2::254");
  if (a == kZero) return AddressClass::kUnspecified;
  IpAddress loop = kZero;
  loop.bytes[15] = 1;
  if (a == loop) return AddressClass::kLoopback;
  if (a == kMetadataAws) return AddressClass::kMetadata;
  if (InPrefix(a, kMapped, 96) || InPrefix(a, kNat64, 96)) return ClassifyV4(EmbeddedV4(a, 12));
  if (InPrefix(a, k6to4, 16)) return ClassifyV4(EmbeddedV4(a, 2));
  if (InPrefix(a, kZero, 96)) return AddressClass::kReserved;  // deprecated IPv4-compatible
  const auto& b = a.bytes;
  if (b[0] == 0xff) return AddressClass::kMulticast;
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) return AddressClass::kLinkLocal;
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) return AddressClass::kPrivate;  // site-local
  if ((b[0] & 0xfe) == 0xfc) return AddressClass::kUniqueLocal;
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x0d && b[3] == 0xb8) return AddressClass::kReserved;  // docs
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0) return AddressClass::kReserved;        // Teredo
  if (b[0] == 0x01 && b[1] == 0 && b[2] == 0 && b[3] == 0 && b[4] == 0 && b[5] == 0 && b[6] == 0 &&
      b[7] == 0) {
    return AddressClass::kReserved;  // discard-only 100::/64
  }
  if ((b[0] & 0xe0) != 0x20) return AddressClass::kReserved;  // outside 2000::/3, the global unicast space
  return AddressClass::kPublic;
}

const char* ToString(AddressClass c) {
  switch (c) {
    case AddressClass::kPublic: return "public";
    case AddressClass::kLoopback: return "loopback";
    case AddressClass::kPrivate: return "private";
    case AddressClass::kLinkLocal: return "link-local";
    case AddressClass::kCgnat: return "cgnat";
    case AddressClass::kUniqueLocal: return "unique-local";
    case AddressClass::kMetadata: return "metadata";
    case AddressClass::kUnspecified: return "unspecified";
    case AddressClass::kMulticast: return "multicast";
    case AddressClass::kReserved: return "reserved";
  }
  return "?";
}

const char* ToString(Verdict v) {
  switch (v) {
    case Verdict::kAllow: return "allow";
    case Verdict::kDeny: return "deny";
    case Verdict::kUnknown: return "unknown";
  }
  return "?";
}

const char* ToString(DenyReason r) {
  switch (r) {
    case DenyReason::kNone: return "";
    case DenyReason::kDenyRule: return "deny-rule";
    case DenyReason::kNotAllowed: return "not-allowed";
    case DenyReason::kAddressGuard: return "address-guard";
    case DenyReason::kAskDenied: return "ask-denied";
    case DenyReason::kAskBusy: return "ask-busy";
    case DenyReason::kSniMismatch: return "sni-mismatch";
    case DenyReason::kBadRequest: return "bad-request";
    case DenyReason::kPlaceholder: return "placeholder";
    case DenyReason::kPlainHttp: return "plain-http";
    case DenyReason::kNotTls: return "not-tls";
  }
  return "?";
}

std::string TargetText(const std::string& host, std::uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

bool IsLocalhostName(std::string_view host) { return host == "localhost" || host.ends_with(".localhost"); }

Result<std::string> NormaliseHost(std::string_view host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    auto v6 = IpAddress::Parse(host.substr(1, host.size() - 2));
    if (!v6 || !v6->v6) return Status::Error("network", "bad IPv6 literal " + Quoted(host));
    return v6->ToString();
  }
  if (auto ip = IpAddress::Parse(host)) return ip->ToString();
  if (host.size() > 1024) return Status::Error("network", "host name too long");
  if (!host.empty() && host.back() == '.') host.remove_suffix(1);
  Result<std::string> ascii = ToALabels(host);
  if (!ascii.ok()) return ascii.status();
  std::string name = std::move(ascii).value();
  if (!name.empty() && name.back() == '.') name.pop_back();  // IDNA may map a full-width dot
  std::string why;
  if (!ValidName(name, &why)) return Status::Error("network", why + " in " + Quoted(host));
  return name;
}

Result<Rule> ParseRule(std::string_view text, ListKind list) {
  auto fail = [&](const std::string& what) -> Result<Rule> {
    return Status::Error("network", (list == ListKind::kAllow ? "network.allow: " : "network.deny: ") + what);
  };
  if (auto problem = policy_internal::DomainProblem(
          text, list == ListKind::kAllow ? policy_internal::DomainList::kAllow : policy_internal::DomainList::kDeny)) {
    return fail(*problem);
  }
  auto split = SplitPort(text);
  if (!split.ok()) return fail(split.status().message());
  auto [host, port_text] = *split;
  Rule rule;
  rule.text = std::string(text);
  if (!port_text.empty()) {
    auto port = ParsePort(port_text);
    if (!port) return fail("bad port " + Quoted(port_text) + " (expected 1-65535)");
    rule.port = *port;
  }

  if (host == "*") {
    rule.kind = RuleKind::kAnyHost;
    return rule;
  }
  if (std::size_t slash = host.find('/'); slash != std::string_view::npos) {
    auto net = IpAddress::Parse(host.substr(0, slash));
    std::string_view bits = host.substr(slash + 1);
    int max = net && net->v6 ? 128 : 32;
    int prefix = -1;
    if (!bits.empty() && bits.size() <= 3) {
      prefix = 0;
      for (char c : bits) prefix = (c >= '0' && c <= '9' && prefix >= 0) ? prefix * 10 + (c - '0') : -1;
    }
    if (!net || prefix < 0 || prefix > max) return fail("bad CIDR " + Quoted(host));
    if (list == ListKind::kAllow && prefix == 0) {
      return fail(Quoted(text) + " would allow every address (use network.default: allow instead)");
    }
    rule.kind = RuleKind::kAddress;
    rule.prefix = prefix;
    // Clear host bits, so that 10.1.2.3/8 means 10.0.0.0/8.
    for (int i = 0; i < 16; ++i) {
      int keep = std::min(8, std::max(0, prefix - i * 8));
      net->bytes[i] &= static_cast<std::uint8_t>(keep == 0 ? 0 : 0xff << (8 - keep));
    }
    rule.network = *net;
    rule.host = net->ToString() + "/" + std::to_string(prefix);
    return rule;
  }
  if (auto ip = IpAddress::Parse(host)) {
    rule.kind = RuleKind::kAddress;
    rule.network = *ip;
    rule.prefix = ip->v6 ? 128 : 32;
    rule.host = ip->ToString();
    return rule;
  }
  bool wildcard = host.size() > 2 && host[0] == '*' && host[1] == '.';
  auto name = NormaliseHost(wildcard ? host.substr(2) : host);
  if (!name.ok()) return fail(name.status().message());
  rule.host = std::move(name).value();
  if (wildcard) {
    // Checked again after IDNA: "*.ＣＯＭ" is "*.com".
    if (list == ListKind::kAllow && rule.host.find('.') == std::string::npos) {
      return fail(Quoted(text) + " is too broad (a wildcard needs at least two labels, e.g. \"*.example.com\")");
    }
    rule.kind = RuleKind::kSuffix;
  } else {
    rule.kind = rule.host == "localhost" ? RuleKind::kLocalhost : RuleKind::kExactHost;
  }
  return rule;
}

bool Matches(const Rule& rule, const std::string& host, std::uint16_t port) {
  if (rule.port != 0 && rule.port != port) return false;
  switch (rule.kind) {
    case RuleKind::kAnyHost: return true;
    case RuleKind::kExactHost:
    case RuleKind::kLocalhost: return host == rule.host;
    case RuleKind::kSuffix:
      return host.size() > rule.host.size() + 1 && host.ends_with(rule.host) &&
             host[host.size() - rule.host.size() - 1] == '.';
    case RuleKind::kAddress: {
      auto ip = IpAddress::Parse(host);
      return ip && Contains(rule, *ip, port);
    }
  }
  return false;
}

bool Contains(const Rule& rule, const IpAddress& address, std::uint16_t port) {
  if (rule.port != 0 && rule.port != port) return false;
  if (rule.kind == RuleKind::kAnyHost) return true;
  if (rule.kind != RuleKind::kAddress) return false;
  IpAddress a = address.Unmapped();
  IpAddress net = rule.network.Unmapped();
  int prefix = rule.prefix;
  if (rule.network.v6 && !net.v6) prefix -= 96;  // ::ffff:10.0.0.0/104 → 10.0.0.0/8
  return prefix >= 0 && InPrefix(a, net, prefix);
}

Result<RuleSet> RuleSet::Build(const NetworkSpec& spec) {
  return Build(spec.allow, spec.deny, spec.default_action);
}

Result<RuleSet> RuleSet::Build(const std::vector<std::string>& allow, const std::vector<std::string>& deny,
                               NetDefault default_action) {
  RuleSet set;
  set.default_ = default_action;
  for (const auto& text : allow) {
    auto rule = ParseRule(text, ListKind::kAllow);
    if (!rule.ok()) return rule.status();
    set.allow_.push_back(std::move(rule).value());
  }
  for (const auto& text : deny) {
    auto rule = ParseRule(text, ListKind::kDeny);
    if (!rule.ok()) return rule.status();
    set.deny_.push_back(std::move(rule).value());
  }
  return set;
}

namespace {

// Allowed by `rule`; a `localhost` entry also admits loopback addresses.
Decision AllowedBy(const Rule& rule) {
  Decision d = Decision::Allow(rule.text);
  d.via_localhost = rule.kind == RuleKind::kLocalhost;
  return d;
}

// No entry matched `target`: `default: allow` allows, else the caller asks
// or refuses (kUnknown).
Decision NoEntry(NetDefault default_action, const std::string& target) {
  if (default_action == NetDefault::kAllow) return Decision::Allow("network.default: allow");
  Decision d = Decision::Deny(DenyReason::kNotAllowed, "network.default: deny", target + " is not in network.allow");
  d.verdict = Verdict::kUnknown;
  return d;
}

}  // namespace

Decision RuleSet::Decide(const std::string& host, std::uint16_t port) const {
  const std::string target = Target(host, port);
  if (port == 0) return Decision::Deny(DenyReason::kBadRequest, "", target + ": port 0");
  for (const auto& rule : deny_) {
    if (Matches(rule, host, port)) {
      return Decision::Deny(DenyReason::kDenyRule, rule.text,
                            target + " is denied by network.deny entry " + Quoted(rule.text));
    }
  }
  for (const auto& rule : allow_) {
    if (Matches(rule, host, port)) {
      return AllowedBy(rule);
    }
  }
  return NoEntry(default_, target);
}

Decision RuleSet::DecideName(const std::string& host) const {
  for (const auto& rule : deny_) {
    if (rule.port == 0 && Matches(rule, host, 1)) {
      return Decision::Deny(DenyReason::kDenyRule, rule.text, host + " is denied by network.deny entry " + Quoted(rule.text));
    }
  }
  for (const auto& rule : allow_) {
    if (rule.kind != RuleKind::kAddress && Matches(rule, host, rule.port == 0 ? 1 : rule.port)) {
      return AllowedBy(rule);
    }
  }
  return NoEntry(default_, host);
}

Decision RuleSet::CheckAddress(const std::string& host, const Decision& by_name, const IpAddress& address,
                               std::uint16_t port) const {
  const IpAddress a = address.Unmapped();
  const std::string shown = a.ToString();
  for (const auto& rule : deny_) {
    if (Contains(rule, a, port)) {
      return Decision::Deny(DenyReason::kDenyRule, rule.text,
                            host + " resolves to " + shown + ", denied by network.deny entry " + Quoted(rule.text));
    }
  }
  AddressClass cls = Classify(a);
  if (cls == AddressClass::kPublic) return by_name;
  for (const auto& rule : allow_) {
    if (!Contains(rule, a, port)) continue;
    // A CIDR is a statement about a network; the metadata endpoint is
    // admitted only when named exactly.
    if (cls == AddressClass::kMetadata && !rule.IsSingleAddress()) continue;
    return Decision::Allow(rule.text);
  }
  if (cls == AddressClass::kLoopback && by_name.via_localhost) return by_name;
  std::string how = host == shown ? shown + " is a " : host + " resolves to " + shown + ", a ";
  return Decision::Deny(DenyReason::kAddressGuard, by_name.rule,
                        how + ToString(cls) + " address; only an IP or CIDR entry in network.allow admits it");
}

}  // namespace agentbox::net
