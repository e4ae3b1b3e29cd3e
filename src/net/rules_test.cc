#include "net/rules.h"

#include <gtest/gtest.h>

namespace agentbox::net {
namespace {

RuleSet Rules(std::vector<std::string> allow, std::vector<std::string> deny = {},
              NetDefault def = NetDefault::kDeny) {
  auto r = RuleSet::Build(allow, deny, def);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r.value() : RuleSet();
}

std::string Norm(std::string_view host) {
  auto r = NormaliseHost(host);
  return r.ok() ? r.value() : "ERROR: " + r.status().message();
}

IpAddress Ip(const char* text) { return *IpAddress::Parse(text); }

TEST(NormaliseHost, CaseTrailingDotAndIdna) {
  EXPECT_EQ(Norm("GitHub.COM"), "github.com");
  EXPECT_EQ(Norm("github.com."), "github.com");
  EXPECT_EQ(Norm("bücher.example"), "xn--bcher-kva.example");
  EXPECT_EQ(Norm("BÜCHER.example."), "xn--bcher-kva.example");
  EXPECT_EQ(Norm("faß.de"), "xn--fa-hia.de");  // non-transitional: ß is kept, not "fass"
  EXPECT_EQ(Norm("[::1]"), "::1");
  EXPECT_EQ(Norm("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(Norm("0:0::1"), "::1");
}

TEST(NormaliseHost, RefusesWhatResolversMisread) {
  for (const char* bad : {"127.1", "2130706433", "0x7f.0.0.1", "foo..bar", "", ".", "-a.com", "a b.com",
                          "a\x01.com", "evil.com/", "user@host"}) {
    EXPECT_FALSE(NormaliseHost(bad).ok()) << bad;
  }
  EXPECT_FALSE(NormaliseHost(std::string(300, 'a')).ok());
  EXPECT_FALSE(NormaliseHost(std::string(64, 'a') + ".com").ok());
  EXPECT_FALSE(NormaliseHost("\xff\xfe.com").ok());  // not UTF-8
}

TEST(ParseRule, Forms) {
  struct Case {
    const char* text;
    RuleKind kind;
    const char* host;
    int port;
  } cases[] = {
      {"github.com", RuleKind::kExactHost, "github.com", 0},
      {"GitHub.com.:443", RuleKind::kExactHost, "github.com", 443},
      {"*.githubusercontent.com", RuleKind::kSuffix, "githubusercontent.com", 0},
      {"*.Example.COM:8443", RuleKind::kSuffix, "example.com", 8443},
      {"localhost", RuleKind::kLocalhost, "localhost", 0},
      {"localhost:5432", RuleKind::kLocalhost, "localhost", 5432},
      {"10.1.2.3", RuleKind::kAddress, "10.1.2.3", 0},
      {"10.1.2.3:22", RuleKind::kAddress, "10.1.2.3", 22},
      {"10.9.9.9/8", RuleKind::kAddress, "10.0.0.0/8", 0},
      {"fd00::/8", RuleKind::kAddress, "fd00::/8", 0},
      {"[fd00::1]:443", RuleKind::kAddress, "fd00::1", 443},
      {"::1", RuleKind::kAddress, "::1", 0},
      {"bücher.example", RuleKind::kExactHost, "xn--bcher-kva.example", 0},
  };
  for (const auto& c : cases) {
    auto r = ParseRule(c.text, ListKind::kAllow);
    ASSERT_TRUE(r.ok()) << c.text << ": " << r.status().ToString();
    EXPECT_EQ(r->kind, c.kind) << c.text;
    EXPECT_EQ(r->host, c.host) << c.text;
    EXPECT_EQ(r->port, c.port) << c.text;
    EXPECT_EQ(r->text, c.text);
  }
}

TEST(ParseRule, OverBroadAndMalformed) {
  for (const char* bad : {"*", "*.com", "*.ＣＯＭ", "0.0.0.0/0", "::/0", "*.*.example.com", "foo.*.com", "a*.com",
                          "github.com:0", "github.com:65536", "github.com:x", "10.0.0.0/33", "fd00::/129",
                          "127.1", "[::1", "exa mple.com", ""}) {
    EXPECT_FALSE(ParseRule(bad, ListKind::kAllow).ok()) << bad;
  }
  // Deny lists may be as broad as they like.
  EXPECT_TRUE(ParseRule("*", ListKind::kDeny).ok());
  EXPECT_TRUE(ParseRule("*.com", ListKind::kDeny).ok());
  EXPECT_TRUE(ParseRule("0.0.0.0/0", ListKind::kDeny).ok());
  auto r = ParseRule("*.com", ListKind::kAllow);
  EXPECT_NE(r.status().message().find("too broad"), std::string::npos) << r.status().message();
}

TEST(RuleSet, DecideTable) {
  RuleSet rules = Rules({"github.com", "*.githubusercontent.com", "api.internal.example.com:443", "10.0.0.0/8",
                         "localhost:8080"},
                        {"gist.githubusercontent.com", "*.evil.githubusercontent.com", "10.6.6.6"});
  struct Case {
    const char* host;
    int port;
    Verdict verdict;
    const char* rule;
  } cases[] = {
      {"github.com", 443, Verdict::kAllow, "github.com"},
      {"github.com", 22, Verdict::kAllow, "github.com"},
      {"www.github.com", 443, Verdict::kUnknown, "network.default: deny"},  // exact means exact
      {"raw.githubusercontent.com", 443, Verdict::kAllow, "*.githubusercontent.com"},
      {"a.b.githubusercontent.com", 443, Verdict::kAllow, "*.githubusercontent.com"},
      {"githubusercontent.com", 443, Verdict::kUnknown, "network.default: deny"},  // strict subdomains
      {"xgithubusercontent.com", 443, Verdict::kUnknown, "network.default: deny"},
      {"gist.githubusercontent.com", 443, Verdict::kDeny, "gist.githubusercontent.com"},  // deny wins
      {"x.evil.githubusercontent.com", 443, Verdict::kDeny, "*.evil.githubusercontent.com"},
      {"api.internal.example.com", 443, Verdict::kAllow, "api.internal.example.com:443"},
      {"api.internal.example.com", 80, Verdict::kUnknown, "network.default: deny"},
      {"10.1.2.3", 5432, Verdict::kAllow, "10.0.0.0/8"},
      {"10.6.6.6", 5432, Verdict::kDeny, "10.6.6.6"},
      {"11.0.0.1", 80, Verdict::kUnknown, "network.default: deny"},
      {"localhost", 8080, Verdict::kAllow, "localhost:8080"},
      {"localhost", 8081, Verdict::kUnknown, "network.default: deny"},
  };
  for (const auto& c : cases) {
    Decision d = rules.Decide(c.host, static_cast<std::uint16_t>(c.port));
    EXPECT_EQ(d.verdict, c.verdict) << c.host << ":" << c.port;
    EXPECT_EQ(d.rule, c.rule) << c.host << ":" << c.port;
  }
}

TEST(RuleSet, DefaultAllowAndDenyStar) {
  RuleSet open = Rules({}, {"*.ads.example"}, NetDefault::kAllow);
  EXPECT_EQ(open.Decide("anything.example", 443).verdict, Verdict::kAllow);
  EXPECT_EQ(open.Decide("anything.example", 443).rule, "network.default: allow");
  EXPECT_EQ(open.Decide("x.ads.example", 443).verdict, Verdict::kDeny);

  RuleSet closed = Rules({"github.com"}, {"*"});
  Decision d = closed.Decide("github.com", 443);
  EXPECT_EQ(d.verdict, Verdict::kDeny);
  EXPECT_EQ(d.reason, DenyReason::kDenyRule);
  EXPECT_NE(d.message.find("github.com:443"), std::string::npos);
}

TEST(Classify, Table) {
  struct Case {
    const char* ip;
    AddressClass cls;
  } cases[] = {
      {"8.8.8.8", AddressClass::kPublic},
      {"127.0.0.1", AddressClass::kLoopback},
      {"127.255.0.9", AddressClass::kLoopback},
      {"10.0.0.1", AddressClass::kPrivate},
      {"172.16.0.1", AddressClass::kPrivate},
      {"172.31.255.255", AddressClass::kPrivate},
      {"172.32.0.1", AddressClass::kPublic},
      {"192.168.1.1", AddressClass::kPrivate},
      {"169.254.1.1", AddressClass::kLinkLocal},
      {"169.254.169.254", AddressClass::kMetadata},
      {"100.100.100.200", AddressClass::kMetadata},
      {"100.64.0.1", AddressClass::kCgnat},
      {"100.127.255.255", AddressClass::kCgnat},
      {"100.128.0.1", AddressClass::kPublic},
      {"0.0.0.0", AddressClass::kUnspecified},
      {"0.1.2.3", AddressClass::kUnspecified},
      {"224.0.0.1", AddressClass::kMulticast},
      {"255.255.255.255", AddressClass::kReserved},
      {"240.0.0.1", AddressClass::kReserved},
      {"192.0.2.1", AddressClass::kReserved},
      {"198.18.0.1", AddressClass::kReserved},
      {"::", AddressClass::kUnspecified},
      {"::1", AddressClass::kLoopback},
      {"fe80::1", AddressClass::kLinkLocal},
      {"fec0::1", AddressClass::kPrivate},
      {"fc00::1", AddressClass::kUniqueLocal},
      {"fd12:3456::1", AddressClass::kUniqueLocal},
      {"fd00:ec2::254", AddressClass::kMetadata},
      {"ff02::1", AddressClass::kMulticast},
      {"::ffff:127.0.0.1", AddressClass::kLoopback},
      {"::ffff:169.254.169.254", AddressClass::kMetadata},
      {"::ffff:8.8.8.8", AddressClass::kPublic},
      {"64:ff9b::a00:1", AddressClass::kPrivate},     // NAT64 of 10.0.0.1
      {"2002:7f00:1::", AddressClass::kLoopback},     // 6to4 of 127.0.0.1
      {"::7f00:1", AddressClass::kReserved},          // IPv4-compatible
      {"2001:db8::1", AddressClass::kReserved},
      {"2606:4700::1111", AddressClass::kPublic},
  };
  for (const auto& c : cases) {
    auto ip = IpAddress::Parse(c.ip);
    ASSERT_TRUE(ip) << c.ip;
    EXPECT_EQ(Classify(*ip), c.cls) << c.ip << " is " << ToString(Classify(*ip));
  }
}

TEST(CheckAddress, GuardAdmitsNonPublicOnlyThroughAddressEntries) {
  RuleSet rules = Rules({"svc.test", "db.test", "10.0.0.0/8", "localhost", "169.254.0.0/16", "fd00:ec2::254"},
                        {"10.6.0.0/16"});
  Decision by_name = rules.Decide("svc.test", 443);
  ASSERT_EQ(by_name.verdict, Verdict::kAllow);
  // Public: the name's decision stands.
  EXPECT_EQ(rules.CheckAddress("svc.test", by_name, Ip("93.184.216.34"), 443).verdict, Verdict::kAllow);
  // Loopback by name only: refused (the classic rebinding target).
  Decision loop = rules.CheckAddress("svc.test", by_name, Ip("127.0.0.1"), 443);
  EXPECT_EQ(loop.verdict, Verdict::kDeny);
  EXPECT_EQ(loop.reason, DenyReason::kAddressGuard);
  EXPECT_NE(loop.message.find("loopback"), std::string::npos) << loop.message;
  EXPECT_EQ(rules.CheckAddress("svc.test", by_name, Ip("::ffff:127.0.0.1"), 443).verdict, Verdict::kDeny);
  EXPECT_EQ(rules.CheckAddress("svc.test", by_name, Ip("192.168.0.1"), 443).verdict, Verdict::kDeny);
  EXPECT_EQ(rules.CheckAddress("svc.test", by_name, Ip("100.64.1.1"), 443).verdict, Verdict::kDeny);
  // Private inside an allowed CIDR: admitted, and the CIDR is the rule.
  Decision in_cidr = rules.CheckAddress("db.test", rules.Decide("db.test", 5432), Ip("10.1.1.1"), 5432);
  EXPECT_EQ(in_cidr.verdict, Verdict::kAllow);
  EXPECT_EQ(in_cidr.rule, "10.0.0.0/8");
  // Address deny entries apply to resolved addresses and win.
  Decision denied = rules.CheckAddress("db.test", rules.Decide("db.test", 5432), Ip("10.6.1.1"), 5432);
  EXPECT_EQ(denied.verdict, Verdict::kDeny);
  EXPECT_EQ(denied.reason, DenyReason::kDenyRule);
  // Metadata: a CIDR covering it is not enough, the exact literal is.
  EXPECT_EQ(rules.CheckAddress("svc.test", by_name, Ip("169.254.169.254"), 80).verdict, Verdict::kDeny);
  EXPECT_EQ(rules.CheckAddress("svc.test", by_name, Ip("169.254.1.1"), 80).verdict, Verdict::kAllow);
  EXPECT_EQ(rules.CheckAddress("svc.test", by_name, Ip("fd00:ec2::254"), 80).verdict, Verdict::kAllow);
  // localhost admits loopback for the name localhost only.
  Decision lh = rules.Decide("localhost", 8080);
  EXPECT_TRUE(lh.via_localhost);
  EXPECT_EQ(rules.CheckAddress("localhost", lh, Ip("127.0.0.1"), 8080).verdict, Verdict::kAllow);
  EXPECT_EQ(rules.CheckAddress("localhost", lh, Ip("::1"), 8080).verdict, Verdict::kAllow);
  EXPECT_EQ(rules.CheckAddress("localhost", lh, Ip("10.0.0.1"), 8080).verdict, Verdict::kAllow);  // via CIDR
  EXPECT_EQ(rules.CheckAddress("localhost", lh, Ip("192.168.1.1"), 8080).verdict, Verdict::kDeny);
}

TEST(CheckAddress, OpenNetworkStillGuards) {
  RuleSet open = Rules({}, {}, NetDefault::kAllow);
  Decision d = open.Decide("anything.test", 80);
  EXPECT_EQ(open.CheckAddress("anything.test", d, Ip("1.1.1.1"), 80).verdict, Verdict::kAllow);
  EXPECT_EQ(open.CheckAddress("anything.test", d, Ip("127.0.0.1"), 80).verdict, Verdict::kDeny);
  EXPECT_EQ(open.CheckAddress("anything.test", d, Ip("169.254.169.254"), 80).verdict, Verdict::kDeny);
  // An IP literal target allowed by an IP entry passes the guard.
  RuleSet lit = Rules({"127.0.0.1"});
  Decision ld = lit.Decide("127.0.0.1", 9);
  EXPECT_EQ(lit.CheckAddress("127.0.0.1", ld, Ip("127.0.0.1"), 9).verdict, Verdict::kAllow);
}

}  // namespace
}  // namespace agentbox::net
