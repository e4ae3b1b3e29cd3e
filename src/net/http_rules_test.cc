#include "net/http_rules.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>

namespace agentbox::net {
namespace {

std::string Path(std::string_view target) {
  auto r = NormaliseRequestPath(target);
  return r.ok() ? r.value() : "ERROR: " + r.status().message();
}

HttpRuleSet Rules(std::vector<HttpRuleSpec> specs) {
  auto r = HttpRuleSet::Build(specs);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : HttpRuleSet();
}

bool Allowed(const HttpRuleSet& set, std::string_view method, std::string_view target,
             const std::string& host = "api.github.com") {
  auto path = NormaliseRequestPath(target);
  EXPECT_TRUE(path.ok()) << target;
  return path.ok() && set.Check(host, method, *path).allowed;
}

TEST(NormaliseRequestPath, DecodesUnreservedAndCutsTheQuery) {
  EXPECT_EQ(Path("/"), "/");
  EXPECT_EQ(Path("/repos/acme/x?per_page=100&q=a/b"), "/repos/acme/x");
  EXPECT_EQ(Path("/?x"), "/");
  EXPECT_EQ(Path("/%61%62%2D%2e%5f%7E"), "/ab-._~");
  EXPECT_EQ(Path("/a%3ab%3A%20%25%c3%a9"), "/a%3Ab%3A%20%25%C3%A9");
  EXPECT_EQ(Path("/%252e%252e"), "/%252e%252e");  // decoded once only: %25 stays
  EXPECT_EQ(Path("/a/b/"), "/a/b/");                // trailing slash kept
  EXPECT_EQ(Path("/a;b=c/d@e:f+!$&'()*,="), "/a;b=c/d@e:f+!$&'()*,=");
  EXPECT_EQ(Path("/.a/a./...x"), "/.a/a./...x");  // only exactly "." and ".." are dot segments
}

TEST(NormaliseRequestPath, RefusesAmbiguousForms) {
  struct Case {
    std::string target;
    const char* reason;
  } cases[] = {
      {"", "not starting with /"},
      {"a/b", "not starting with /"},
      {"https://h/a", "not starting with /"},
      {"*", "not starting with /"},
      {"/a%2Fb", "encoded slash (%2F)"},
      {"/a%2fb", "encoded slash (%2F)"},
      {"/a%5Cb", "encoded backslash (%5C)"},
      {"/a%5cb", "encoded backslash (%5C)"},
      {"/a\\b", "backslash"},
      {"/a%00", "encoded NUL (%00)"},
      {"/a%0a", "encoded control character"},
      {"/a%7F", "encoded control character"},
      {std::string("/a\0b", 4), "control character"},
      {"/a\tb", "control character"},
      {"/a b", "space"},
      {"/caf\xc3\xa9", "non-ASCII byte"},
      {"/a#b", "fragment"},
      {"/a%", "bad percent-encoding"},
      {"/a%4", "bad percent-encoding"},
      {"/a%zz", "bad percent-encoding"},
      {"/a/./b", "dot segment"},
      {"/a/../b", "dot segment"},
      {"/..", "dot segment"},
      {"/a/.", "dot segment"},
      {"/a/%2e%2E/b", "dot segment"},
      {"/a/.%2e", "dot segment"},
      {"/a/..;x/b", "dot segment"},
      {"/a/.;/b", "dot segment"},
      {"/a/;x/b", "segment of only ;params"},
      {"//a", "empty segment (//)"},
      {"/a//b", "empty segment (//)"},
      {"/a//", "empty segment (//)"},
  };
  for (const auto& c : cases) {
    auto r = NormaliseRequestPath(c.target);
    ASSERT_FALSE(r.ok()) << c.target << " → " << r.value();
    EXPECT_EQ(r.status().message().rfind(c.reason, 0), 0u) << c.target << ": " << r.status().message();
  }
  // The query is cut before anything is checked in it.
  EXPECT_EQ(Path("/a?x=%2F&y=..//\\"), "/a");
}

TEST(HttpRulePattern, Parse) {
  auto p = ParseHttpRulePattern("GET /repos/*/x/**");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->method, "GET");
  EXPECT_EQ(p->segments, (std::vector<std::string>{"repos", "*", "x", "**"}));
  EXPECT_EQ(p->text, "GET /repos/*/x/**");
  auto any = ParseHttpRulePattern("* /%7euser/");
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(any->segments, (std::vector<std::string>{"~user", ""}));

  for (const char* bad : {"GET", "/x", "GET x", "GET  /x", "G(T /x", "GET /x y", "GET /a?b", "GET /a/**b",
                          "GET /***", "GET /a//b", "GET /a/../b", "GET /a%2Fb", "GET /a\\b", "", " /x", "GET\t/x"}) {
    auto r = ParseHttpRulePattern(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().message().rfind("network.http_rules: ", 0), 0u) << r.status().message();
    }
  }
}

TEST(HttpRulePattern, SegmentsAndWildcards) {
  auto m = [](const char* pattern, const char* method, const char* path) {
    auto p = ParseHttpRulePattern(pattern);
    EXPECT_TRUE(p.ok()) << pattern;
    return p.ok() && p->Matches(method, path);
  };
  EXPECT_TRUE(m("GET /repos/acme/x", "GET", "/repos/acme/x"));
  EXPECT_FALSE(m("GET /repos/acme/x", "GET", "/repos/acme/x/"));  // trailing slash: another path
  EXPECT_FALSE(m("GET /repos/acme/x/", "GET", "/repos/acme/x"));
  EXPECT_TRUE(m("GET /repos/acme/x/", "GET", "/repos/acme/x/"));
  EXPECT_FALSE(m("GET /repos/acme/x", "get", "/repos/acme/x"));  // methods are case-sensitive
  EXPECT_FALSE(m("GET /repos/acme/x", "POST", "/repos/acme/x"));
  EXPECT_TRUE(m("* /repos/acme/x", "DELETE", "/repos/acme/x"));

  // `*` stays within one segment, matches the empty run too.
  EXPECT_TRUE(m("GET /repos/*/x", "GET", "/repos/acme/x"));
  EXPECT_FALSE(m("GET /repos/*/x", "GET", "/repos/acme/y/x"));
  EXPECT_TRUE(m("GET /a/*", "GET", "/a/"));
  EXPECT_FALSE(m("GET /a/*", "GET", "/a"));
  EXPECT_FALSE(m("GET /a/*", "GET", "/a/b/"));
  EXPECT_TRUE(m("GET /a/v*.tar.gz", "GET", "/a/v1.2.tar.gz"));
  EXPECT_FALSE(m("GET /a/v*.tar.gz", "GET", "/a/v1.2.tar.gz.sig"));
  EXPECT_TRUE(m("GET /a/*b*c*", "GET", "/a/xxbyyczz"));
  EXPECT_FALSE(m("GET /a/*b*c*", "GET", "/a/xxcyybzz"));

  // `**` spans zero or more whole segments.
  EXPECT_TRUE(m("GET /repos/acme/**", "GET", "/repos/acme"));
  EXPECT_TRUE(m("GET /repos/acme/**", "GET", "/repos/acme/"));
  EXPECT_TRUE(m("GET /repos/acme/**", "GET", "/repos/acme/x/issues/1"));
  EXPECT_FALSE(m("GET /repos/acme/**", "GET", "/repos/acmeco/x"));
  EXPECT_TRUE(m("GET /**/info/refs", "GET", "/acme/x.git/info/refs"));
  EXPECT_TRUE(m("GET /**/info/refs", "GET", "/info/refs"));
  EXPECT_FALSE(m("GET /**/info/refs", "GET", "/acme/x.git/info/refs/"));
  EXPECT_TRUE(m("POST /*/**/git-upload-pack", "POST", "/acme/x.git/git-upload-pack"));
  EXPECT_FALSE(m("POST /*/**/git-upload-pack", "POST", "/git-upload-pack"));
  EXPECT_TRUE(m("GET /**", "GET", "/"));
  EXPECT_TRUE(m("GET /", "GET", "/"));
  EXPECT_FALSE(m("GET /", "GET", "/a"));

  // Patterns are normalised like paths: escapes of unreserved characters
  // match their plain form; other escapes stay distinct from the character.
  EXPECT_TRUE(m("GET /%7Euser", "GET", "/~user"));
  EXPECT_TRUE(m("GET /a%3ab", "GET", "/a%3Ab"));
  EXPECT_FALSE(m("GET /a%3Ab", "GET", "/a:b"));
  EXPECT_FALSE(m("GET /x", "GET", "x"));  // not a normalised path
}

// The obvious exponential matcher, as the reference for the greedy one.
bool SlowSegment(std::string_view p, std::string_view s) {
  if (p.empty()) return s.empty();
  if (p[0] == '*') return SlowSegment(p.substr(1), s) || (!s.empty() && SlowSegment(p, s.substr(1)));
  return !s.empty() && p[0] == s[0] && SlowSegment(p.substr(1), s.substr(1));
}
bool SlowPath(const std::vector<std::string>& p, std::size_t i, const std::vector<std::string>& s, std::size_t j) {
  if (i == p.size()) return j == s.size();
  if (p[i] == "**") return SlowPath(p, i + 1, s, j) || (j < s.size() && SlowPath(p, i, s, j + 1));
  return j < s.size() && SlowSegment(p[i], s[j]) && SlowPath(p, i + 1, s, j + 1);
}

TEST(HttpRulePattern, AgreesWithAReferenceMatcher) {
  std::mt19937 rng(7);
  auto pick = [&](std::string_view from, int max) {
    std::string out;
    for (int n = std::uniform_int_distribution<int>(0, max)(rng); n > 0; --n) {
      out += from[std::uniform_int_distribution<std::size_t>(0, from.size() - 1)(rng)];
    }
    return out;
  };
  for (int round = 0; round < 20000; ++round) {
    std::string pattern = "GET ", path;
    std::vector<std::string> pat_segments, path_segments;
    for (int n = std::uniform_int_distribution<int>(1, 4)(rng); n > 0; --n) {
      std::string seg = rng() % 4 == 0 ? "**" : pick("ab*", 4);
      if (seg != "**") {
        while (seg.find("**") != std::string::npos) seg.erase(seg.find("**"), 1);
        if (seg.empty() && n > 1) seg = "b";
      }
      pattern += "/" + seg;
      pat_segments.push_back(seg);
    }
    for (int n = std::uniform_int_distribution<int>(1, 5)(rng); n > 0; --n) {
      std::string seg = pick("ab", 3);
      if (seg.empty() && n > 1) seg = "a";  // only the last segment may be empty
      path += "/" + seg;
      path_segments.push_back(seg);
    }
    auto p = ParseHttpRulePattern(pattern);
    ASSERT_TRUE(p.ok()) << pattern;
    ASSERT_EQ(p->Matches("GET", path), SlowPath(pat_segments, 0, path_segments, 0)) << pattern << " vs " << path;
  }
}

TEST(HttpRulePattern, NoBacktrackingBlowUp) {
  auto p = ParseHttpRulePattern("GET /**/a/**/a/**/a/**/a/**/a/**/b/*a*a*a*a*a*a*a*a*b");
  ASSERT_TRUE(p.ok());
  std::string path;
  for (int i = 0; i < 2000; ++i) path += "/a";
  path += "/" + std::string(5000, 'a');
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(p->Matches("GET", path));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST(HttpRuleSet, CoversChecksAndNamesTheRule) {
  HttpRuleSet set = Rules({
      {"API.GitHub.com.", {"GET /repos/acme/**", "POST /repos/acme/*/issues"}},
      {"uploads.example", {}},
      {"api.github.com", {"* /user"}},  // merged with the first entry
  });
  EXPECT_EQ(set.hosts(), (std::vector<std::string>{"api.github.com", "uploads.example"}));
  EXPECT_TRUE(set.Covers("api.github.com"));
  EXPECT_FALSE(set.Covers("github.com"));

  auto ok = set.Check("api.github.com", "GET", "/repos/acme/x/pulls");
  EXPECT_TRUE(ok.allowed);
  EXPECT_EQ(ok.rule, "GET /repos/acme/**");
  EXPECT_EQ(set.Check("api.github.com", "PATCH", "/user").rule, "* /user");
  EXPECT_TRUE(Allowed(set, "POST", "/repos/acme/x/issues?x=1"));

  auto no = set.Check("api.github.com", "DELETE", "/repos/acme/x");
  EXPECT_FALSE(no.allowed);
  EXPECT_EQ(no.rule, "network.http_rules[api.github.com]");
  EXPECT_EQ(no.message, "DELETE /repos/acme/x is not allowed on api.github.com by network.http_rules");
  EXPECT_FALSE(Allowed(set, "POST", "/repos/acme/x/issues/"));
  EXPECT_FALSE(Allowed(set, "GET", "/repos/other/x"));
  EXPECT_FALSE(Allowed(set, "GET", "/anything", "uploads.example"));  // covered with no patterns: nothing passes

  // A host without rules is not restricted by them.
  auto free = set.Check("github.com", "DELETE", "/x");
  EXPECT_TRUE(free.allowed);
  EXPECT_EQ(free.rule, "");
  // What would escape /repos/acme/** on a server that normalises never
  // reaches Check: NormaliseRequestPath refuses it first.
  for (const char* sneaky : {"/repos/acme/../../user", "/repos/acme/%2e%2e/%2e%2e/user", "/repos/acme%2F..%2Fx",
                             "/repos/acme/..;/x", "/repos/acme//x", "/repos/acme\\..\\x"}) {
    EXPECT_FALSE(NormaliseRequestPath(sneaky).ok()) << sneaky;
  }
}

TEST(HttpRuleSet, BuildRefusesBadHostsAndPatterns) {
  for (const HttpRuleSpec& bad : std::vector<HttpRuleSpec>{{"*.github.com", {"GET /"}},
                                                           {"api.github.com:443", {"GET /"}},
                                                           {"", {"GET /"}},
                                                           {"api.github.com", {"GET /", "DELETE"}},
                                                           {"api.github.com", {"GET /a/../b"}}}) {
    auto r = HttpRuleSet::Build({bad});
    EXPECT_FALSE(r.ok()) << bad.host;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("network.http_rules"), std::string::npos);
    }
  }
  EXPECT_TRUE(HttpRuleSet::Build({}).ok());
}

}  // namespace
}  // namespace agentbox::net
