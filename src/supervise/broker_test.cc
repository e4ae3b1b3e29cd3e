#include "supervise/broker.h"

#include <gtest/gtest.h>

namespace agentbox::supervise {
namespace {

using net::AddressBook;
using net::IpAddress;
using net::RuleSet;
using net::Verdict;

RuleSet Rules(std::vector<std::string> allow, std::vector<std::string> deny = {},
              NetDefault d = NetDefault::kDeny) {
  auto r = RuleSet::Build(allow, deny, d);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return *r;
}

IpAddress Ip(const char* text) { return *IpAddress::Parse(text); }

TEST(DecideConnect, AnAddressTheDnsHandedOutIsDecidedAsItsName) {
  AddressBook book;
  book.Add("api.example.com", {Ip("93.184.216.34")});
  const RuleSet rules = Rules({"api.example.com:443"});
  auto d = DecideConnect(rules, book, {}, Ip("93.184.216.34"), 443);
  EXPECT_EQ(d.decision.verdict, Verdict::kAllow);
  EXPECT_EQ(d.host, "api.example.com");
  EXPECT_EQ(d.decision.rule, "api.example.com:443");
}

TEST(DecideConnect, AnAllowedNamesAddressOnAnotherPortIsRefused) {
  AddressBook book;
  book.Add("api.example.com", {Ip("93.184.216.34")});
  const RuleSet rules = Rules({"api.example.com:443"});
  auto d = DecideConnect(rules, book, {}, Ip("93.184.216.34"), 22);
  EXPECT_EQ(d.decision.verdict, Verdict::kDeny);
  EXPECT_EQ(d.host, "api.example.com");
  EXPECT_NE(d.decision.message.find("api.example.com:22"), std::string::npos) << d.decision.message;
}

TEST(DecideConnect, AnAddressNoNameCameWithIsALiteral) {
  AddressBook book;
  const RuleSet rules = Rules({"api.example.com"});
  auto d = DecideConnect(rules, book, {}, Ip("93.184.216.34"), 443);
  EXPECT_EQ(d.decision.verdict, Verdict::kDeny);
  EXPECT_EQ(d.host, "93.184.216.34");
  EXPECT_NE(d.decision.message.find("no name the sandbox resolved"), std::string::npos) << d.decision.message;
}

TEST(DecideConnect, IpAndCidrEntriesAdmitLiterals) {
  AddressBook book;
  const RuleSet rules = Rules({"10.1.0.0/16:5432", "2001:db8::5"});
  EXPECT_EQ(DecideConnect(rules, book, {}, Ip("10.1.2.3"), 5432).decision.verdict, Verdict::kAllow);
  EXPECT_EQ(DecideConnect(rules, book, {}, Ip("10.1.2.3"), 5433).decision.verdict, Verdict::kDeny);
  EXPECT_EQ(DecideConnect(rules, book, {}, Ip("10.2.0.1"), 5432).decision.verdict, Verdict::kDeny);
  EXPECT_EQ(DecideConnect(rules, book, {}, Ip("::ffff:10.1.2.3"), 5432).decision.verdict, Verdict::kAllow);
}

TEST(DecideConnect, ANameAllowedToAPrivateAddressStillNeedsAnAddressEntry) {
  // The proxy's address guard: a public name resolving into a private
  // network does not open that network.
  AddressBook book;
  book.Add("intranet.example.com", {Ip("10.0.0.5")});
  EXPECT_EQ(DecideConnect(Rules({"intranet.example.com"}), book, {}, Ip("10.0.0.5"), 443).decision.verdict,
            Verdict::kDeny);
  EXPECT_EQ(DecideConnect(Rules({"intranet.example.com", "10.0.0.5"}), book, {}, Ip("10.0.0.5"), 443)
                .decision.verdict,
            Verdict::kAllow);
}

TEST(DecideConnect, DenyEntriesWinForNamesAndAddresses) {
  AddressBook book;
  book.Add("cdn.example.com", {Ip("93.184.216.34")});
  EXPECT_EQ(DecideConnect(Rules({"*.example.com"}, {"cdn.example.com"}), book, {}, Ip("93.184.216.34"), 443)
                .decision.verdict,
            Verdict::kDeny);
  EXPECT_EQ(DecideConnect(Rules({"*.example.com"}, {"93.184.216.0/24"}), book, {}, Ip("93.184.216.34"), 443)
                .decision.verdict,
            Verdict::kDeny);
}

TEST(DecideConnect, ANameApprovedWhenTheDnsAskedIsAllowedOnAnyPort) {
  AddressBook book;
  book.Add("new.example.org", {Ip("93.184.216.35")});
  const RuleSet rules = Rules({});
  EXPECT_EQ(DecideConnect(rules, book, {}, Ip("93.184.216.35"), 443).decision.verdict, Verdict::kDeny);
  EXPECT_EQ(DecideConnect(rules, book, {"new.example.org"}, Ip("93.184.216.35"), 443).decision.verdict,
            Verdict::kAllow);
}

TEST(DecideConnect, DefaultAllowAdmitsPublicAddressesOnly) {
  AddressBook book;
  const RuleSet rules = Rules({}, {}, NetDefault::kAllow);
  EXPECT_EQ(DecideConnect(rules, book, {}, Ip("93.184.216.34"), 443).decision.verdict, Verdict::kAllow);
  EXPECT_EQ(DecideConnect(rules, book, {}, Ip("169.254.169.254"), 80).decision.verdict, Verdict::kDeny);
  EXPECT_EQ(DecideConnect(rules, book, {}, Ip("192.168.1.1"), 80).decision.verdict, Verdict::kDeny);
}

}  // namespace
}  // namespace agentbox::supervise
