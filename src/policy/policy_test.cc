#include "agentbox/policy.h"

#include <gtest/gtest.h>

#include <string>

#include "policy/policy_testing.h"
#include "policy/sha256.h"

namespace agentbox {
namespace {

using policy_testing::kFixtures;

// ToYaml covers every field, so equal YAML means equal policies.
void ExpectRoundTrip(const Policy& p) {
  const std::string yaml = ToYaml(p);
  Result<Policy> again = ParsePolicy(yaml, "roundtrip.yaml");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << yaml;
  EXPECT_EQ(ToYaml(*again), yaml);
}

TEST(ModeTest, NamesRoundTrip) {
  for (Mode mode : {Mode::kReadOnly, Mode::kWorkspaceWrite, Mode::kDangerFullAccess}) {
    EXPECT_EQ(ParseMode(ToString(mode)), mode);
  }
  EXPECT_STREQ(ToString(Mode::kWorkspaceWrite), "workspace-write");
  EXPECT_FALSE(ParseMode("full").has_value());
  EXPECT_FALSE(ParseMode("").has_value());
}

TEST(PresetTest, WorkspaceWrite) {
  Policy p = PresetFor(Mode::kWorkspaceWrite);
  EXPECT_EQ(p.mode, Mode::kWorkspaceWrite);
  EXPECT_EQ(p.sandbox.isolation, Isolation::kOs);
  EXPECT_EQ(p.sandbox.require, Requirement::kFull);
  EXPECT_EQ(p.filesystem.workspace.path, "");
  EXPECT_EQ(p.filesystem.workspace.access, Access::kReadWrite);
  EXPECT_EQ(p.filesystem.read_only,
            (std::vector<std::string>{"/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"}));
  EXPECT_EQ(p.filesystem.deny.size(), 12u);
  EXPECT_EQ(p.filesystem.deny.front(), "~/.ssh");
  EXPECT_EQ(p.filesystem.deny.back(), "/etc/gshadow");
  EXPECT_EQ(p.filesystem.protect, (std::vector<std::string>{".git/hooks", ".git/config"}));
  EXPECT_EQ(p.network.default_action, NetDefault::kDeny);
  EXPECT_FALSE(p.network.egress_proxy);
  EXPECT_TRUE(p.network.allow.empty());
  EXPECT_EQ(p.env.pass, (std::vector<std::string>{"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "SHELL"}));
  EXPECT_FALSE(p.resources.cpu.requested());
  EXPECT_FALSE(p.resources.wall_clock_ms.has_value());
  EXPECT_EQ(p.source, "<preset workspace-write>");
  EXPECT_EQ(PolicyDigest(p), Sha256Hex(ToYaml(p)));
}

TEST(PresetTest, ReadOnlyDiffersOnlyInWorkspaceAccess) {
  Policy ro = PresetFor(Mode::kReadOnly);
  Policy ww = PresetFor(Mode::kWorkspaceWrite);
  EXPECT_EQ(ro.filesystem.workspace.access, Access::kReadOnly);
  EXPECT_EQ(ro.filesystem.deny, ww.filesystem.deny);
  EXPECT_EQ(ro.env.pass, ww.env.pass);
  EXPECT_EQ(ro.source, "<preset read-only>");
  ww.mode = Mode::kReadOnly;
  ww.filesystem.workspace.access = Access::kReadOnly;
  EXPECT_EQ(ToYaml(ro), ToYaml(ww));
}

TEST(PresetTest, DangerFullAccessConfinesNothing) {
  Policy p = PresetFor(Mode::kDangerFullAccess);
  EXPECT_EQ(p.sandbox.isolation, Isolation::kHost);
  EXPECT_TRUE(p.filesystem.read_only.empty());
  EXPECT_TRUE(p.filesystem.deny.empty());
  EXPECT_TRUE(p.filesystem.protect.empty());
  EXPECT_EQ(p.network.default_action, NetDefault::kAllow);
  EXPECT_TRUE(p.env.pass.empty());
  EXPECT_EQ(p.source, "<preset danger-full-access>");
}

TEST(ToYamlTest, PresetsRoundTrip) {
  for (Mode mode : {Mode::kReadOnly, Mode::kWorkspaceWrite, Mode::kDangerFullAccess}) {
    ExpectRoundTrip(PresetFor(mode));
  }
}

TEST(ToYamlTest, FixturesRoundTrip) {
  for (const char* name : {"seed_policy.yaml", "design_policy.yaml"}) {
    Result<Policy> p = LoadPolicyFile(kFixtures + "/" + name);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    ExpectRoundTrip(*p);
  }
}

TEST(ToYamlTest, AwkwardValuesRoundTrip) {
  Policy p = PresetFor(Mode::kWorkspaceWrite);
  p.resources.cpu.guaranteed = 0.1;
  p.resources.cpu.limit = 1.0 / 3;
  p.resources.memory_guaranteed_bytes = 1234;      // no unit divides it
  p.resources.memory_limit_bytes = 1'500'000'000;  // decimal unit
  p.resources.disk_bytes = 3ULL << 40;
  p.resources.wall_clock_ms = 1;
  p.resources.max_processes = 1;
  p.filesystem.workspace.path = "/my workspace";
  p.filesystem.deny = {"**/.env", "*.pem", "[ab]?/x", "~"};
  p.sandbox.image = "null";
  p.env.set = {{"A", "~"},        {"B", "true"}, {"C", "line\nbreak"}, {"D", ""},
               {"E", "x: y # z"}, {"F", "0.50"}, {"G", "ünï"}};
  p.network.tls_sni_check = false;
  p.network.tls_sni_ports = {443, 8443};
  ExpectRoundTrip(p);

  Policy q = *ParsePolicy(ToYaml(p), "x");
  EXPECT_EQ(q.env.set, p.env.set);
  EXPECT_EQ(q.resources.cpu.limit, p.resources.cpu.limit);
  EXPECT_EQ(q.resources.memory_guaranteed_bytes, 1234u);
  EXPECT_FALSE(q.network.tls_sni_check);
  EXPECT_EQ(q.network.tls_sni_ports, (std::vector<std::uint16_t>{443, 8443}));
}

TEST(ToYamlTest, InspectTlsRoundTripsInEachForm) {
  Policy p = PresetFor(Mode::kWorkspaceWrite);
  ExpectRoundTrip(p);
  EXPECT_NE(ToYaml(p).find("inspect_tls: false\n"), std::string::npos) << ToYaml(p);

  p.network.inspect_tls_all = true;
  ExpectRoundTrip(p);
  Policy all = *ParsePolicy(ToYaml(p), "x");
  EXPECT_TRUE(all.network.inspect_tls_all);
  EXPECT_TRUE(all.network.inspect_tls.empty());

  p.network.inspect_tls_all = false;
  p.network.inspect_tls = {"example.com", "*.cdn.example.net"};
  ExpectRoundTrip(p);
  Policy hosts = *ParsePolicy(ToYaml(p), "x");
  EXPECT_FALSE(hosts.network.inspect_tls_all);
  EXPECT_EQ(hosts.network.inspect_tls, p.network.inspect_tls);
}

TEST(PolicyDigestTest, ChangesWithInspectTls) {
  Policy none = PresetFor(Mode::kWorkspaceWrite);
  Policy all = none;
  all.network.inspect_tls_all = true;
  Policy one = none;
  one.network.inspect_tls = {"example.com"};
  Policy other = none;
  other.network.inspect_tls = {"example.org"};
  EXPECT_NE(PolicyDigest(none), PolicyDigest(all));
  EXPECT_NE(PolicyDigest(none), PolicyDigest(one));
  EXPECT_NE(PolicyDigest(all), PolicyDigest(one));
  EXPECT_NE(PolicyDigest(one), PolicyDigest(other));
}

// Every field of the credentials section and network.http_rules, compared
// one by one (ExpectRoundTrip compares YAML, which would miss a field that
// ToYaml leaves out).
void ExpectSameCredentialsAndRules(const Policy& a, const Policy& b) {
  const CredentialsSpec& x = a.credentials;
  const CredentialsSpec& y = b.credentials;
  EXPECT_EQ(x.in_sandbox, y.in_sandbox);
  EXPECT_EQ(x.git, y.git);
  EXPECT_EQ(x.tools, y.tools);
  EXPECT_EQ(x.git_rules.remotes, y.git_rules.remotes);
  EXPECT_EQ(x.git_rules.push.allow_refs, y.git_rules.push.allow_refs);
  EXPECT_EQ(x.git_rules.push.deny_force, y.git_rules.push.deny_force);
  ASSERT_EQ(x.secrets.size(), y.secrets.size());
  for (std::size_t i = 0; i < x.secrets.size(); ++i) {
    const SecretSpec& s = x.secrets[i];
    const SecretSpec& t = y.secrets[i];
    EXPECT_EQ(s.name, t.name);
    EXPECT_EQ(s.from.kind, t.from.kind) << s.name;
    EXPECT_EQ(s.from.env, t.from.env) << s.name;
    EXPECT_EQ(s.from.file, t.from.file) << s.name;
    EXPECT_EQ(s.from.command, t.from.command) << s.name;
    EXPECT_EQ(s.hosts, t.hosts) << s.name;
    EXPECT_EQ(s.inject.kind, t.inject.kind) << s.name;
    EXPECT_EQ(s.inject.header, t.inject.header) << s.name;
    EXPECT_EQ(s.inject.format, t.inject.format) << s.name;
    EXPECT_EQ(s.inject.username, t.inject.username) << s.name;
    EXPECT_EQ(s.placeholder_env, t.placeholder_env) << s.name;
  }
  ASSERT_EQ(a.network.http_rules.size(), b.network.http_rules.size());
  for (std::size_t i = 0; i < a.network.http_rules.size(); ++i) {
    EXPECT_EQ(a.network.http_rules[i].host, b.network.http_rules[i].host);
    EXPECT_EQ(a.network.http_rules[i].allow, b.network.http_rules[i].allow);
  }
}

SecretSpec Secret(const std::string& name, SecretSource from, SecretInjection inject,
                  const std::string& placeholder_env = "") {
  SecretSpec s;
  s.name = name;
  s.from = std::move(from);
  s.hosts = {name + ".example.com"};
  s.inject = std::move(inject);
  s.placeholder_env = placeholder_env;
  return s;
}

// A policy with every credentials form and awkward text where text is free.
Policy EveryCredentialForm() {
  using Kind = SecretInjection::Kind;
  Policy p = PresetFor(Mode::kWorkspaceWrite);
  p.credentials.in_sandbox = CredentialsInSandbox::kAllow;
  p.credentials.tools = ToolCredentials::kVaultProxy;
  p.credentials.git = GitCredentials::kProxy;
  p.credentials.git_rules.remotes = {"https://github.com/acme/*", "https://git.localhost:8443/a/**/x.git"};
  p.credentials.git_rules.push.allow_refs = {"refs/heads/agent/*", "refs/tags/*"};
  p.credentials.git_rules.push.deny_force = true;
  SecretInjection header{Kind::kHeader, "X-Api-Key", "{}", "x-access-token"};
  SecretInjection odd_header{Kind::kHeader, "!#$%&'*+-.^_`|~0", "\"{}\" # x: y, [z]", "x-access-token"};
  SecretInjection basic{Kind::kBasic, "Authorization", "Bearer {}", "user name, [x] #y {}"};
  SecretInjection placeholder{Kind::kPlaceholder, "Authorization", "Bearer {}", "x-access-token"};
  p.credentials.secrets = {
      Secret("gh", {SecretSource::Kind::kEnv, "GH_TOKEN", "", {}}, SecretInjection{}, "GITHUB_TOKEN"),
      Secret("file", {SecretSource::Kind::kFile, "", "~/.config/a, b}/c #x", {}}, header),
      Secret("cmd", {SecretSource::Kind::kCommand, "", "", {"pass", "", "~", "null", "a: b", " x ", "ü"}}, basic),
      Secret("odd", {SecretSource::Kind::kEnv, "null", "", {}}, odd_header),
      Secret("true", {SecretSource::Kind::kEnv, "NPM", "", {}}, placeholder, "NPM_TOKEN"),
  };
  p.credentials.secrets[0].hosts = {"github.com", "*.githubusercontent.com"};
  p.network.http_rules = {{"api.github.com", {"GET /repos/acme/**", "* /**", "POST /v*/x"}},
                          {"uploads.github.com", {"PUT /"}}};
  return p;
}

TEST(ToYamlTest, CredentialsAndHttpRulesRoundTripEveryField) {
  Policy p = EveryCredentialForm();
  ExpectRoundTrip(p);
  Result<Policy> again = ParsePolicy(ToYaml(p), "roundtrip.yaml");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << ToYaml(p);
  ExpectSameCredentialsAndRules(p, *again);

  Result<Policy> design = LoadPolicyFile(kFixtures + "/design_policy.yaml");
  ASSERT_TRUE(design.ok());
  Result<Policy> design_again = ParsePolicy(ToYaml(*design), "roundtrip.yaml");
  ASSERT_TRUE(design_again.ok());
  ExpectSameCredentialsAndRules(*design, *design_again);
}

TEST(ToYamlTest, ShortGitFormPrintsAsBefore) {
  Result<Policy> seed = LoadPolicyFile(kFixtures + "/seed_policy.yaml");
  ASSERT_TRUE(seed.ok());
  const std::string yaml = ToYaml(*seed);
  EXPECT_NE(yaml.find("credentials:\n  in_sandbox: none\n  git: proxy\n  tools: vault_proxy\n  secrets: {}\n"),
            std::string::npos)
      << yaml;
  EXPECT_NE(yaml.find("  http_rules: []\n"), std::string::npos) << yaml;
  EXPECT_NE(ToYaml(PresetFor(Mode::kReadOnly)).find("  git: none\n"), std::string::npos);
}

TEST(ToYamlTest, SecretsPrintTheirSourceAndNothingElse) {
  Result<Policy> p = ParsePolicy(
      "credentials:\n"
      "  secrets:\n"
      "    gh: {from: {env: GH_TOKEN}, hosts: [github.com], placeholder_env: GITHUB_TOKEN}\n"
      "    f: {from: {file: ~/.tokens/f}, hosts: [f.example.com], inject: {header: X-Key}}\n"
      "    c: {from: {command: [pass, show, c]}, hosts: [c.example.com], inject: basic}\n"
      "    n: {from: {env: NPM}, hosts: [registry.npmjs.org], inject: placeholder, placeholder_env: NPM_TOKEN}\n",
      "p.yaml");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::string yaml = ToYaml(*p);
  const std::string expected =
      "  secrets:\n"
      "    gh:\n"
      "      from: {env: GH_TOKEN}\n"
      "      hosts: [github.com]\n"
      "      inject: {header: Authorization, format: \"Bearer {}\"}\n"
      "      placeholder_env: GITHUB_TOKEN\n"
      "    f:\n"
      "      from: {file: ~/.tokens/f}\n"
      "      hosts: [f.example.com]\n"
      "      inject: {header: X-Key, format: \"{}\"}\n"
      "    c:\n"
      "      from: {command: [\"pass\", \"show\", \"c\"]}\n"
      "      hosts: [c.example.com]\n"
      "      inject: {basic: {username: \"x-access-token\"}}\n"
      "    n:\n"
      "      from: {env: NPM}\n"
      "      hosts: [registry.npmjs.org]\n"
      "      inject: placeholder\n"
      "      placeholder_env: NPM_TOKEN\n";
  EXPECT_NE(yaml.find(expected), std::string::npos) << yaml;
}

TEST(PolicyDigestTest, ChangesWithEveryCredentialAndRuleField) {
  const Policy base = EveryCredentialForm();
  const std::string digest = PolicyDigest(base);
  EXPECT_EQ(digest, PolicyDigest(EveryCredentialForm()));
  using Mutation = void (*)(Policy&);
  const std::pair<const char*, Mutation> mutations[] = {
      {"in_sandbox", [](Policy& p) { p.credentials.in_sandbox = CredentialsInSandbox::kNone; }},
      {"remotes", [](Policy& p) { p.credentials.git_rules.remotes.pop_back(); }},
      {"allow_refs", [](Policy& p) { p.credentials.git_rules.push.allow_refs.pop_back(); }},
      {"deny_force", [](Policy& p) { p.credentials.git_rules.push.deny_force = false; }},
      {"secret name", [](Policy& p) { p.credentials.secrets[0].name = "gh2"; }},
      {"secret order", [](Policy& p) { std::swap(p.credentials.secrets[0], p.credentials.secrets[1]); }},
      {"from.env", [](Policy& p) { p.credentials.secrets[0].from.env = "GH_PAT"; }},
      {"from.kind", [](Policy& p) { p.credentials.secrets[0].from.kind = SecretSource::Kind::kFile;
                                    p.credentials.secrets[0].from.file = "/run/gh"; }},
      {"from.file", [](Policy& p) { p.credentials.secrets[1].from.file = "/run/other"; }},
      {"from.command", [](Policy& p) { p.credentials.secrets[2].from.command.push_back("--quiet"); }},
      {"hosts", [](Policy& p) { p.credentials.secrets[0].hosts.pop_back(); }},
      {"inject.kind", [](Policy& p) { p.credentials.secrets[0].inject.kind = SecretInjection::Kind::kBasic; }},
      {"inject.header", [](Policy& p) { p.credentials.secrets[1].inject.header = "X-Other"; }},
      {"inject.format", [](Policy& p) { p.credentials.secrets[1].inject.format = "token {}"; }},
      {"inject.username", [](Policy& p) { p.credentials.secrets[2].inject.username = "oauth2"; }},
      {"placeholder_env", [](Policy& p) { p.credentials.secrets[0].placeholder_env = "GH_PLACEHOLDER"; }},
      {"http_rules.host", [](Policy& p) { p.network.http_rules[1].host = "api.example.com"; }},
      {"http_rules.allow", [](Policy& p) { p.network.http_rules[0].allow.pop_back(); }},
      {"http_rules", [](Policy& p) { p.network.http_rules.pop_back(); }},
  };
  for (const auto& [name, mutate] : mutations) {
    Policy p = EveryCredentialForm();
    mutate(p);
    EXPECT_NE(PolicyDigest(p), digest) << name;
  }
  // The short form and the mapping differ too.
  Policy short_form = PresetFor(Mode::kWorkspaceWrite);
  short_form.credentials.git = GitCredentials::kProxy;
  Policy mapping = short_form;
  mapping.credentials.git_rules.remotes = {"https://github.com/acme/*"};
  EXPECT_NE(PolicyDigest(short_form), PolicyDigest(mapping));
}

TEST(ToYamlTest, OmitsUnsetResources) {
  Policy p = PresetFor(Mode::kWorkspaceWrite);
  p.resources.cpu.limit = 2;
  const std::string yaml = ToYaml(p);
  EXPECT_NE(yaml.find("cpu:\n    limit: 2\n"), std::string::npos) << yaml;
  EXPECT_EQ(yaml.find("guaranteed"), std::string::npos) << yaml;
  EXPECT_EQ(yaml.find("memory_gib"), std::string::npos) << yaml;
  EXPECT_NE(ToYaml(PresetFor(Mode::kReadOnly)).find("resources: {}"), std::string::npos);
}

TEST(ApplyOverridesTest, NoOverridesChangeNothing) {
  Policy p = PresetFor(Mode::kWorkspaceWrite);
  Result<Policy> r = ApplyOverrides(p, {}, /*from_file=*/false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(ToYaml(*r), ToYaml(p));
  EXPECT_EQ(PolicyDigest(*r), PolicyDigest(p));
}

TEST(ApplyOverridesTest, ModeWithoutFileRebasesOnPreset) {
  PolicyOverrides o;
  o.mode = Mode::kDangerFullAccess;
  Result<Policy> r = ApplyOverrides(PresetFor(Mode::kWorkspaceWrite), o, /*from_file=*/false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(ToYaml(*r), ToYaml(PresetFor(Mode::kDangerFullAccess)));
  EXPECT_EQ(r->source, "<preset danger-full-access>");
}

TEST(ApplyOverridesTest, ModeWithFileChangesOnlyTheModeKey) {
  Result<Policy> file = LoadPolicyFile(kFixtures + "/design_policy.yaml");
  ASSERT_TRUE(file.ok());
  PolicyOverrides o;
  o.mode = Mode::kReadOnly;
  Result<Policy> r = ApplyOverrides(*file, o, /*from_file=*/true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->mode, Mode::kReadOnly);
  EXPECT_EQ(r->filesystem.workspace.access, Access::kReadOnly);
  EXPECT_EQ(r->filesystem.read_only, file->filesystem.read_only);
  EXPECT_EQ(r->network.allow, file->network.allow);
  EXPECT_EQ(r->sha256, file->sha256);  // the digest names the file's text

  // The file holds a secret, which danger-full-access could not keep out
  // of the command (ApplyOverridesTest.DangerModeRefusesSecrets).
  o.mode = Mode::kDangerFullAccess;
  Policy no_secrets = *file;
  no_secrets.credentials.secrets.clear();
  Result<Policy> danger = ApplyOverrides(no_secrets, o, /*from_file=*/true);
  ASSERT_TRUE(danger.ok()) << danger.status().ToString();
  EXPECT_EQ(danger->sandbox.isolation, Isolation::kHost);
  EXPECT_EQ(danger->filesystem.deny, file->filesystem.deny);
}

TEST(ApplyOverridesTest, FlagsOverrideValues) {
  PolicyOverrides o;
  o.require = Requirement::kPartial;
  o.allow_domains = {"example.com", "*.example.org:443", "example.com"};
  o.timeout_ms = 30'000;
  o.memory_bytes = 512ULL << 20;
  o.max_processes = 32;
  o.cpus = 1.5;
  Result<Policy> r = ApplyOverrides(PresetFor(Mode::kWorkspaceWrite), o, /*from_file=*/false);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->sandbox.require, Requirement::kPartial);
  EXPECT_EQ(r->network.allow, (std::vector<std::string>{"example.com", "*.example.org:443"}));
  EXPECT_EQ(r->resources.wall_clock_ms, 30'000u);
  EXPECT_EQ(r->resources.memory_limit_bytes, 512ULL << 20);
  EXPECT_EQ(r->resources.max_processes, 32u);
  EXPECT_EQ(r->resources.cpu.limit, 1.5);
  // Without a file the digest describes the effective policy.
  EXPECT_EQ(PolicyDigest(*r), Sha256Hex(ToYaml(*r)));
  EXPECT_NE(PolicyDigest(*r), PolicyDigest(PresetFor(Mode::kWorkspaceWrite)));
}

TEST(ApplyOverridesTest, AllowDomainAppendsToFileList) {
  Result<Policy> file = LoadPolicyFile(kFixtures + "/seed_policy.yaml");
  ASSERT_TRUE(file.ok());
  PolicyOverrides o;
  o.allow_domains = {"github.com"};
  Result<Policy> r = ApplyOverrides(*file, o, /*from_file=*/true);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->network.allow.size(), 5u);
  EXPECT_EQ(r->network.allow.back(), "github.com");
}

TEST(ApplyOverridesTest, EnvPassAndSet) {
  Policy base = PresetFor(Mode::kWorkspaceWrite);
  base.env.set = {{"CI", "1"}};
  PolicyOverrides o;
  o.env = {"HOME", "PATH", "CI=true", "EMPTY=", "EQ=a=b"};
  Result<Policy> r = ApplyOverrides(base, o, /*from_file=*/true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->env.pass.back(), "HOME");
  EXPECT_EQ(std::count(r->env.pass.begin(), r->env.pass.end(), "PATH"), 1);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"CI", "true"}, {"EMPTY", ""}, {"EQ", "a=b"}};
  EXPECT_EQ(r->env.set, expected);
}

TEST(ApplyOverridesTest, InvalidFlagsNameTheFlag) {
  struct Case {
    PolicyOverrides overrides;
    std::string message;
  };
  PolicyOverrides broad, star, env, env_value, cpus, zero_timeout, zero_procs;
  broad.allow_domains = {"*.com"};
  star.allow_domains = {"*"};
  env.env = {"1X"};
  env_value.env = {"A-B=1"};
  cpus.cpus = 0;
  zero_timeout.timeout_ms = 0;
  zero_procs.max_processes = 0;
  const Case cases[] = {
      {broad,
       "--allow-domain: \"*.com\" is too broad (a wildcard needs at least two labels, e.g. "
       "\"*.example.com\")"},
      {star, "--allow-domain: \"*\" would allow every host (use network.default: allow instead)"},
      {env, "--env: invalid variable name \"1X\" (expected [A-Za-z_][A-Za-z0-9_]*)"},
      {env_value, "--env: invalid variable name \"A-B\" (expected [A-Za-z_][A-Za-z0-9_]*)"},
      {cpus, "--cpus: must be > 0"},
      {zero_timeout, "--timeout: must be > 0"},
      {zero_procs, "--max-processes: must be ≥ 1"},
  };
  for (const Case& c : cases) {
    Result<Policy> r = ApplyOverrides(PresetFor(Mode::kWorkspaceWrite), c.overrides, false);
    ASSERT_FALSE(r.ok()) << c.message;
    EXPECT_EQ(r.status().stage(), "policy");
    EXPECT_EQ(r.status().message(), c.message);
  }
}

TEST(ApplyOverridesTest, EnvFlagsAreCheckedAgainstSecrets) {
  Result<Policy> file = ParsePolicy(
      "credentials:\n"
      "  secrets: {github: {from: {env: GH_TOKEN}, hosts: [github.com], placeholder_env: GITHUB_TOKEN}}\n",
      "p.yaml");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const std::pair<std::string, std::string> cases[] = {
      {"GH_TOKEN",
       "--env: GH_TOKEN is the source of credentials.secrets.github; with credentials.in_sandbox: none it never "
       "enters the sandbox"},
      {"GH_TOKEN=x",
       "--env: GH_TOKEN is the source of credentials.secrets.github; with credentials.in_sandbox: none it never "
       "enters the sandbox"},
      {"GITHUB_TOKEN=x",
       "--env: GITHUB_TOKEN is credentials.secrets.github.placeholder_env: a value here would replace the "
       "placeholder"},
      {"GITHUB_TOKEN",
       "--env: GITHUB_TOKEN is credentials.secrets.github.placeholder_env: the sandbox gets the placeholder there, "
       "not the caller's value"},
  };
  for (const auto& [flag, message] : cases) {
    PolicyOverrides o;
    o.env = {flag};
    Result<Policy> r = ApplyOverrides(*file, o, /*from_file=*/true);
    ASSERT_FALSE(r.ok()) << flag;
    EXPECT_EQ(r.status().message(), message);
  }
  PolicyOverrides other;
  other.env = {"OTHER", "CI=1"};
  EXPECT_TRUE(ApplyOverrides(*file, other, true).ok());

  // With in_sandbox: allow the source may be passed; the placeholder stays the runtime's.
  Policy allow = *file;
  allow.credentials.in_sandbox = CredentialsInSandbox::kAllow;
  PolicyOverrides source;
  source.env = {"GH_TOKEN"};
  EXPECT_TRUE(ApplyOverrides(allow, source, true).ok());
  PolicyOverrides placeholder;
  placeholder.env = {"GITHUB_TOKEN=x"};
  EXPECT_FALSE(ApplyOverrides(allow, placeholder, true).ok());
}

TEST(ApplyOverridesTest, DangerModeRefusesSecrets) {
  Result<Policy> file = LoadPolicyFile(kFixtures + "/design_policy.yaml");
  ASSERT_TRUE(file.ok());
  PolicyOverrides o;
  o.mode = Mode::kDangerFullAccess;
  Result<Policy> r = ApplyOverrides(*file, o, /*from_file=*/true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "--mode: secrets are refused with mode: danger-full-access: the command runs on the host with the "
            "caller's environment, and nothing keeps a secret out of it");
  // Without a file the preset has no secrets.
  EXPECT_TRUE(ApplyOverrides(*file, o, /*from_file=*/false).ok());
  o.mode = Mode::kReadOnly;
  EXPECT_TRUE(ApplyOverrides(*file, o, /*from_file=*/true).ok());
}

TEST(ApplyOverridesTest, LimitBelowFileGuaranteeIsAnError) {
  Result<Policy> file = LoadPolicyFile(kFixtures + "/seed_policy.yaml");
  ASSERT_TRUE(file.ok());
  PolicyOverrides cpus;
  cpus.cpus = 1;
  Result<Policy> r = ApplyOverrides(*file, cpus, true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "--cpus: must be ≥ the policy's guaranteed cpu (2)");

  PolicyOverrides memory;
  memory.memory_bytes = 1ULL << 30;
  r = ApplyOverrides(*file, memory, true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "--memory: must be ≥ the policy's guaranteed memory (4Gi)");
}

}  // namespace
}  // namespace agentbox
