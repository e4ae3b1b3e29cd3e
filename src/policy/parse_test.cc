#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "agentbox/policy.h"
#include "policy/policy_testing.h"
#include "policy/sha256.h"

namespace agentbox {
namespace {

using policy_testing::kFixtures;
using policy_testing::MustParse;

bool Contains(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

// ---- Valid files -----------------------------------------------------------

TEST(ParsePolicyTest, SeedPolicyLoadsVerbatim) {
  const std::string path = kFixtures + "/seed_policy.yaml";
  Result<Policy> r = LoadPolicyFile(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Policy& p = *r;
  EXPECT_EQ(p.source, path);
  EXPECT_EQ(p.mode, Mode::kWorkspaceWrite);
  EXPECT_EQ(p.sandbox.isolation, Isolation::kMicrovm);
  EXPECT_EQ(p.sandbox.image, "agent-base:2026-09");
  EXPECT_TRUE(p.sandbox.snapshot_on_exit);
  EXPECT_EQ(p.filesystem.workspace.path, "/workspace");
  EXPECT_EQ(p.filesystem.read_only, (std::vector<std::string>{"/usr", "/opt/toolchains"}));
  EXPECT_EQ(p.filesystem.deny,
            (std::vector<std::string>{"~/.ssh", "~/.aws", "~/.config/gcloud", "**/.env"}));
  EXPECT_TRUE(Contains(p.filesystem.deny, "**/.env"));
  EXPECT_EQ(p.network.allow.size(), 4u);
  EXPECT_EQ(p.network.allow[3], "api.internal.example.com:443");
  EXPECT_EQ(p.network.on_unknown_domain, UnknownDomain::kAsk);
  EXPECT_EQ(p.credentials.git, GitCredentials::kProxy);
  EXPECT_EQ(p.credentials.tools, ToolCredentials::kVaultProxy);
  EXPECT_EQ(p.resources.cpu.guaranteed, 2.0);
  EXPECT_EQ(p.resources.cpu.limit, 4.0);
  EXPECT_EQ(p.resources.memory_guaranteed_bytes, 4ULL << 30);
  EXPECT_EQ(p.resources.memory_limit_bytes, 12ULL << 30);
  EXPECT_EQ(p.resources.disk_bytes, 20ULL << 30);
  EXPECT_EQ(p.resources.wall_clock_ms, 45ULL * 60 * 1000);
  EXPECT_EQ(p.resources.max_processes, 512u);
  EXPECT_EQ(p.on_violation.escalation, Escalation::kOneTimeApproval);
  // Keys the seed leaves out keep the workspace-write preset.
  EXPECT_EQ(p.env.pass, PresetFor(Mode::kWorkspaceWrite).env.pass);
  EXPECT_EQ(p.filesystem.protect,
            (std::vector<std::string>{"/workspace/.git/hooks", "/workspace/.git/config"}));
}

TEST(ParsePolicyTest, DesignPolicyLoads) {
  Result<Policy> r = LoadPolicyFile(kFixtures + "/design_policy.yaml");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Policy& p = *r;
  EXPECT_EQ(p.version, 1);
  EXPECT_EQ(p.sandbox.isolation, Isolation::kOs);
  EXPECT_EQ(p.sandbox.image, "host");
  EXPECT_TRUE(p.network.egress_proxy);
  EXPECT_EQ(p.network.allow[1], "*.githubusercontent.com");
  EXPECT_TRUE(p.network.deny.empty());
  EXPECT_EQ(p.resources.memory_guaranteed_bytes, 512ULL << 20);
  EXPECT_EQ(p.resources.memory_limit_bytes, 2ULL << 30);
  EXPECT_EQ(p.resources.disk_bytes, 4ULL << 30);
  EXPECT_EQ(p.env.pass, (std::vector<std::string>{"PATH", "LANG", "TERM"}));
  ASSERT_EQ(p.env.set.size(), 1u);
  EXPECT_EQ(p.env.set[0], (std::pair<std::string, std::string>{"CI", "1"}));
  // DESIGN §3's credentials example, verbatim.
  const CredentialsSpec& c = p.credentials;
  EXPECT_EQ(c.in_sandbox, CredentialsInSandbox::kNone);
  EXPECT_EQ(c.git, GitCredentials::kProxy);
  EXPECT_EQ(c.git_rules.remotes, std::vector<std::string>{"https://github.com/acme/*"});
  EXPECT_EQ(c.git_rules.push.allow_refs, std::vector<std::string>{"refs/heads/agent/*"});
  EXPECT_TRUE(c.git_rules.push.deny_force);
  EXPECT_EQ(c.tools, ToolCredentials::kNone);
  ASSERT_EQ(c.secrets.size(), 1u);
  EXPECT_EQ(c.secrets[0].name, "github");
  EXPECT_EQ(c.secrets[0].from.kind, SecretSource::Kind::kEnv);
  EXPECT_EQ(c.secrets[0].from.env, "GH_TOKEN");
  EXPECT_EQ(c.secrets[0].hosts, std::vector<std::string>{"github.com"});
  EXPECT_EQ(c.secrets[0].inject.kind, SecretInjection::Kind::kHeader);
  EXPECT_EQ(c.secrets[0].inject.header, "Authorization");
  EXPECT_EQ(c.secrets[0].inject.format, "Bearer {}");
  EXPECT_EQ(c.secrets[0].placeholder_env, "GITHUB_TOKEN");
}

TEST(ParsePolicyTest, DigestIsOfTheExactText) {
  const std::string text = "version: 1\n";
  Policy p = MustParse(text);
  EXPECT_EQ(p.sha256, Sha256Hex(text));
  EXPECT_EQ(p.source, "policy.yaml");
}

TEST(ParsePolicyTest, MinimalFileIsTheWorkspaceWritePreset) {
  EXPECT_EQ(ToYaml(MustParse("version: 1\n")), ToYaml(PresetFor(Mode::kWorkspaceWrite)));
}

TEST(ParsePolicyTest, ModeSelectsThePresetWhereverItAppears) {
  Policy p = MustParse("filesystem: {read_only: [/opt]}\nmode: danger-full-access\n");
  EXPECT_EQ(p.mode, Mode::kDangerFullAccess);
  EXPECT_EQ(p.sandbox.isolation, Isolation::kHost);
  EXPECT_EQ(p.network.default_action, NetDefault::kAllow);
  EXPECT_EQ(p.filesystem.read_only, std::vector<std::string>{"/opt"});
  EXPECT_TRUE(p.filesystem.deny.empty());

  Policy ro = MustParse("mode: read-only\n");
  EXPECT_EQ(ToYaml(ro), ToYaml(PresetFor(Mode::kReadOnly)));
}

TEST(ParsePolicyTest, ListsReplaceThePresetAndMapsMergeKeyByKey) {
  Policy p =
      MustParse("filesystem:\n  read_only: [/opt]\n  deny: []\nnetwork: {egress_proxy: true}\n");
  EXPECT_EQ(p.filesystem.read_only, std::vector<std::string>{"/opt"});
  EXPECT_TRUE(p.filesystem.deny.empty());
  EXPECT_EQ(p.filesystem.protect, PresetFor(Mode::kWorkspaceWrite).filesystem.protect);
  EXPECT_TRUE(p.network.egress_proxy);
  EXPECT_EQ(p.network.default_action, NetDefault::kDeny);
}

TEST(ParsePolicyTest, ResourceUnits) {
  Policy p = MustParse(
      "resources:\n"
      "  cpu: {guaranteed: 0.5, limit: 1.5}\n"
      "  memory_gib: {guaranteed: 512Mi, limit: 1.5}\n"
      "  disk_gib: 1.5G\n"
      "  wall_clock_min: 90s\n"
      "  max_processes: 64\n");
  EXPECT_EQ(p.resources.cpu.guaranteed, 0.5);
  EXPECT_EQ(p.resources.cpu.limit, 1.5);
  EXPECT_EQ(p.resources.memory_guaranteed_bytes, 512ULL << 20);
  EXPECT_EQ(p.resources.memory_limit_bytes, 1536ULL << 20);
  EXPECT_EQ(p.resources.disk_bytes, 1'500'000'000u);
  EXPECT_EQ(p.resources.wall_clock_ms, 90'000u);
  EXPECT_EQ(p.resources.max_processes, 64u);
  EXPECT_FALSE(p.resources.kill_grace_ms.has_value());

  Policy grace = MustParse("resources: {kill_grace: 5s}\n");
  EXPECT_EQ(grace.resources.kill_grace_ms, 5'000u);
  EXPECT_EQ(ToYaml(MustParse(ToYaml(grace))), ToYaml(grace));
  Result<Policy> unitless = ParsePolicy("resources: {kill_grace: 5}\n", "policy.yaml");
  ASSERT_FALSE(unitless.ok());
  EXPECT_NE(unitless.status().message().find("policy.yaml:1:25: resources.kill_grace:"), std::string::npos)
      << unitless.status().message();

  Policy minutes = MustParse("resources: {wall_clock_min: 0.5, memory_gib: {limit: \"2Gi\"}}\n");
  EXPECT_EQ(minutes.resources.wall_clock_ms, 30'000u);
  EXPECT_EQ(minutes.resources.memory_limit_bytes, 2ULL << 30);
  EXPECT_FALSE(minutes.resources.memory_guaranteed_bytes.has_value());
  EXPECT_FALSE(minutes.resources.cpu.requested());
}

// A size where a number of GiB is expected, and memory_gib given alone as
// its limit.
TEST(ParsePolicyTest, MemoryGibAloneIsTheLimitAsASizeOrGiB) {
  Policy sized = MustParse("resources:\n  memory_gib: 512Mi\n  disk_gib: 2Gi\n");
  EXPECT_EQ(sized.resources.memory_limit_bytes, 512ULL << 20);
  EXPECT_FALSE(sized.resources.memory_guaranteed_bytes.has_value());
  EXPECT_EQ(sized.resources.disk_bytes, 2ULL << 30);
  Policy gib = MustParse("resources:\n  memory_gib: 0.5\n");
  EXPECT_EQ(gib.resources.memory_limit_bytes, 512ULL << 20);
  auto bad = ParsePolicy("resources:\n  memory_gib: 2Qi\n", "policy.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("policy.yaml:2:15: resources.memory_gib: invalid size \"2Qi\""),
            std::string::npos)
      << bad.status().message();
  // The round trip writes the map form, which reads back the same.
  Policy back = MustParse(ToYaml(sized));
  EXPECT_EQ(back.resources.memory_limit_bytes, 512ULL << 20);
}

TEST(ParsePolicyTest, PathsAreNormalisedAndTildeKept) {
  Policy p = MustParse(
      "filesystem:\n"
      "  workspace: {path: /work//space/}\n"
      "  read_only: [//usr//lib/, ~, ~/, ~/.local/bin/]\n"
      "  deny: [secrets/, \"**/*.pem\", \"[ab].key\"]\n"
      "  protect: [.git/hooks/]\n");
  EXPECT_EQ(p.filesystem.workspace.path, "/work/space");
  EXPECT_EQ(p.filesystem.read_only,
            (std::vector<std::string>{"/usr/lib", "~", "~", "~/.local/bin"}));
  EXPECT_EQ(p.filesystem.deny, (std::vector<std::string>{"secrets", "**/*.pem", "[ab].key"}));
  EXPECT_EQ(p.filesystem.protect, std::vector<std::string>{".git/hooks"});
}

TEST(ParsePolicyTest, UnixSocketsAreAbsoluteOrHomePathsAndDefaultEmpty) {
  EXPECT_TRUE(MustParse("version: 1\n").filesystem.unix_sockets.empty());
  Policy p = MustParse("filesystem:\n  unix_sockets: [~/.ssh/agent.sock, //run/user/1000//bus]\n");
  EXPECT_EQ(p.filesystem.unix_sockets, (std::vector<std::string>{"~/.ssh/agent.sock", "/run/user/1000/bus"}));
  Result<Policy> relative = ParsePolicy("filesystem:\n  unix_sockets: [agent.sock]\n", "p.yaml");
  ASSERT_FALSE(relative.ok());
  EXPECT_NE(relative.status().message().find("p.yaml:2:"), std::string::npos) << relative.status().message();
  EXPECT_FALSE(ParsePolicy("filesystem:\n  unix_sockets: [\"/run/*.sock\"]\n", "p.yaml").ok());
}

TEST(ParsePolicyTest, NetworkPatterns) {
  Policy p = MustParse(
      "network:\n"
      "  allow: [example.com, \"*.example.com:443\", 10.0.0.0/8, \"[::1]:8080\", \"fd00::/8\"]\n"
      "  deny: [\"*\", \"*.com\"]\n");
  EXPECT_EQ(p.network.allow.size(), 5u);
  EXPECT_EQ(p.network.deny, (std::vector<std::string>{"*", "*.com"}));
}

TEST(ParsePolicyTest, TlsSniCheckDefaultsOnForPort443) {
  Policy p = MustParse("network:\n  allow: [example.com]\n");
  EXPECT_TRUE(p.network.tls_sni_check);
  EXPECT_EQ(p.network.tls_sni_ports, std::vector<std::uint16_t>{443});
}

TEST(ParsePolicyTest, TlsSniCheckSwitchAndPorts) {
  Policy off = MustParse("network:\n  tls_sni_check: false\n");
  EXPECT_FALSE(off.network.tls_sni_check);
  Policy ports = MustParse("network:\n  tls_sni_check: true\n  tls_sni_ports: [443, 8443]\n");
  EXPECT_TRUE(ports.network.tls_sni_check);
  EXPECT_EQ(ports.network.tls_sni_ports, (std::vector<std::uint16_t>{443, 8443}));
}

TEST(ParsePolicyTest, InspectTlsIsTrueFalseOrHosts) {
  Policy none = MustParse("network:\n  allow: [example.com]\n");
  EXPECT_FALSE(none.network.inspect_tls_all);
  EXPECT_TRUE(none.network.inspect_tls.empty());
  Policy all = MustParse("network:\n  inspect_tls: true\n");
  EXPECT_TRUE(all.network.inspect_tls_all);
  EXPECT_TRUE(all.network.inspect_tls.empty());
  Policy off = MustParse("network:\n  inspect_tls: false\n");
  EXPECT_FALSE(off.network.inspect_tls_all);
  EXPECT_TRUE(off.network.inspect_tls.empty());
  // Host names are normalised as secrets' hosts are.
  Policy hosts = MustParse("network:\n  inspect_tls: [Example.COM., \"*.cdn.example.net\"]\n");
  EXPECT_FALSE(hosts.network.inspect_tls_all);
  EXPECT_EQ(hosts.network.inspect_tls, (std::vector<std::string>{"example.com", "*.cdn.example.net"}));
}

TEST(ParsePolicyTest, EnvSetKeepsFileOrderAndTextAsWritten) {
  Policy p =
      MustParse("env:\n  pass: [HOME]\n  set: {ZED: 1, ALPHA: true, MID: 0.50, T: ~, E: \"\"}\n");
  EXPECT_EQ(p.env.pass, std::vector<std::string>{"HOME"});
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"ZED", "1"}, {"ALPHA", "true"}, {"MID", "0.50"}, {"T", "~"}, {"E", ""}};
  EXPECT_EQ(p.env.set, expected);
}

TEST(ParsePolicyTest, EveryIsolationParses) {
  // Refusing what this host cannot provide is the runtime's job. `remote`
  // needs sandbox.remote, and the others refuse it (remote_parse_test.cc).
  for (const char* name : {"host", "os", "container", "microvm", "remote"}) {
    const std::string remote = std::string(name) == "remote" ? ", remote: {ssh: build-3}" : "";
    Policy p = MustParse(std::string("sandbox: {isolation: ") + name + ", require: partial" + remote + "}\n");
    EXPECT_STREQ(ToString(p.sandbox.isolation), name);
    EXPECT_EQ(p.sandbox.require, Requirement::kPartial);
  }
}

// ---- Credentials and HTTP rules --------------------------------------------

TEST(ParseCredentialsTest, SeedShortFormKeepsLoading) {
  Policy p = MustParse("credentials: { in_sandbox: none, git: proxy, tools: vault_proxy }\n");
  EXPECT_EQ(p.credentials.in_sandbox, CredentialsInSandbox::kNone);
  EXPECT_EQ(p.credentials.git, GitCredentials::kProxy);
  EXPECT_TRUE(p.credentials.git_rules.remotes.empty());
  EXPECT_TRUE(p.credentials.git_rules.push.allow_refs.empty());
  EXPECT_FALSE(p.credentials.git_rules.push.deny_force);
  EXPECT_EQ(p.credentials.tools, ToolCredentials::kVaultProxy);
  EXPECT_TRUE(p.credentials.secrets.empty());
  EXPECT_EQ(MustParse("credentials: {git: none}\n").credentials.git, GitCredentials::kNone);
}

TEST(ParseCredentialsTest, InSandboxAllow) {
  EXPECT_EQ(MustParse("credentials: {in_sandbox: allow}\n").credentials.in_sandbox, CredentialsInSandbox::kAllow);
  EXPECT_EQ(MustParse("version: 1\n").credentials.in_sandbox, CredentialsInSandbox::kNone);
}

TEST(ParseCredentialsTest, GitMappingMeansProxyWithRules) {
  Policy p = MustParse(
      "credentials:\n"
      "  git:\n"
      "    remotes: [\"HTTPS://GitHub.COM./acme/*\", \"https://git.localhost:08443/acme/**\", "
      "\"https://example.com/v*/repo.git\", \"https://gitlab.example.com:443/g/**/p\"]\n"
      "    push: { allow_refs: [\"refs/heads/agent/*\", refs/tags/v1, \"refs/heads/agent/**\"], deny_force: true }\n");
  EXPECT_EQ(p.credentials.git, GitCredentials::kProxy);
  // Scheme, host and port normalised; the path is kept as written.
  EXPECT_EQ(p.credentials.git_rules.remotes,
            (std::vector<std::string>{"https://github.com/acme/*", "https://git.localhost:8443/acme/**",
                                      "https://example.com/v*/repo.git", "https://gitlab.example.com/g/**/p"}));
  EXPECT_EQ(p.credentials.git_rules.push.allow_refs,
            (std::vector<std::string>{"refs/heads/agent/*", "refs/tags/v1", "refs/heads/agent/**"}));
  EXPECT_TRUE(p.credentials.git_rules.push.deny_force);

  Policy bare = MustParse("credentials:\n  git: {remotes: [\"https://github.com/acme/*\"]}\n");
  EXPECT_EQ(bare.credentials.git, GitCredentials::kProxy);
  EXPECT_TRUE(bare.credentials.git_rules.push.allow_refs.empty());  // any ref
  EXPECT_FALSE(bare.credentials.git_rules.push.deny_force);
}

TEST(ParseCredentialsTest, SecretSourcesInFileOrder) {
  Policy p = MustParse(
      "credentials:\n"
      "  secrets:\n"
      "    zed: {from: {env: ZED_TOKEN}, hosts: [zed.example.com]}\n"
      "    a_file: {from: {file: ~/.config//tokens/a/}, hosts: [a.example.com]}\n"
      "    abs-file: {from: {file: /run/secrets/b}, hosts: [b.example.com]}\n"
      "    cmd: {from: {command: [pass, show, \"\", \"~\", null]}, hosts: [c.example.com]}\n");
  const auto& s = p.credentials.secrets;
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].name, "zed");
  EXPECT_EQ(s[0].from.kind, SecretSource::Kind::kEnv);
  EXPECT_EQ(s[0].from.env, "ZED_TOKEN");
  EXPECT_EQ(s[1].name, "a_file");
  EXPECT_EQ(s[1].from.kind, SecretSource::Kind::kFile);
  EXPECT_EQ(s[1].from.file, "~/.config/tokens/a");  // ~ is expanded where $HOME is known
  EXPECT_EQ(s[2].from.file, "/run/secrets/b");
  EXPECT_EQ(s[3].from.kind, SecretSource::Kind::kCommand);
  EXPECT_EQ(s[3].from.command, (std::vector<std::string>{"pass", "show", "", "~", "null"}));
  for (const SecretSpec& secret : s) {
    EXPECT_TRUE(secret.placeholder_env.empty());
    EXPECT_EQ(secret.inject.kind, SecretInjection::Kind::kHeader);  // inject left out
    EXPECT_EQ(secret.inject.header, "Authorization");
    EXPECT_EQ(secret.inject.format, "Bearer {}");
  }
}

TEST(ParseCredentialsTest, EveryInjectionForm) {
  Policy p = MustParse(
      "credentials:\n"
      "  secrets:\n"
      "    header_only: {from: {env: A}, hosts: [a.example.com], inject: {header: X-Api-Key}}\n"
      "    both: {from: {env: B}, hosts: [b.example.com], inject: {header: PRIVATE-TOKEN, format: \"token {} x\"}}\n"
      "    format_only: {from: {env: C}, hosts: [c.example.com], inject: {format: \"token {}\"}}\n"
      "    basic_word: {from: {env: D}, hosts: [d.example.com], inject: basic}\n"
      "    basic_user: {from: {env: E}, hosts: [e.example.com], inject: {basic: {username: oauth2}}}\n"
      "    basic_empty: {from: {env: F}, hosts: [f.example.com], inject: {basic: {}}}\n"
      "    basic_null:\n"
      "      from: {env: G}\n"
      "      hosts: [g.example.com]\n"
      "      inject:\n"
      "        basic:\n"
      "    placeholder: {from: {env: H}, hosts: [h.example.com], inject: placeholder, placeholder_env: H_TOKEN}\n"
      "    header_with_placeholder: {from: {env: I}, hosts: [i.example.com], placeholder_env: I_TOKEN}\n");
  const auto& s = p.credentials.secrets;
  ASSERT_EQ(s.size(), 9u);
  using Kind = SecretInjection::Kind;
  EXPECT_EQ(s[0].inject.kind, Kind::kHeader);
  EXPECT_EQ(s[0].inject.header, "X-Api-Key");
  EXPECT_EQ(s[0].inject.format, "{}");  // a header alone carries the bare value
  EXPECT_EQ(s[1].inject.header, "PRIVATE-TOKEN");
  EXPECT_EQ(s[1].inject.format, "token {} x");
  EXPECT_EQ(s[2].inject.kind, Kind::kHeader);
  EXPECT_EQ(s[2].inject.header, "Authorization");
  EXPECT_EQ(s[2].inject.format, "token {}");
  for (int i : {3, 5, 6}) {
    EXPECT_EQ(s[i].inject.kind, Kind::kBasic) << s[i].name;
    EXPECT_EQ(s[i].inject.username, "x-access-token") << s[i].name;
  }
  EXPECT_EQ(s[4].inject.kind, Kind::kBasic);
  EXPECT_EQ(s[4].inject.username, "oauth2");
  EXPECT_EQ(s[7].inject.kind, Kind::kPlaceholder);
  EXPECT_EQ(s[7].placeholder_env, "H_TOKEN");
  EXPECT_EQ(s[8].inject.kind, Kind::kHeader);
  EXPECT_EQ(s[8].inject.format, "Bearer {}");
  EXPECT_EQ(s[8].placeholder_env, "I_TOKEN");
}

TEST(ParseCredentialsTest, SecretHostsAreNormalised) {
  Policy p = MustParse(
      "credentials:\n"
      "  secrets:\n"
      "    gh: {from: {env: GH}, hosts: [GitHub.com., \"*.GitHubUserContent.com\", my_host.example.com, "
      "xn--bcher-kva.example]}\n");
  EXPECT_EQ(p.credentials.secrets[0].hosts,
            (std::vector<std::string>{"github.com", "*.githubusercontent.com", "my_host.example.com",
                                      "xn--bcher-kva.example"}));
}

TEST(ParseCredentialsTest, InSandboxAllowLetsTheSourceIntoTheEnvironment) {
  Policy p = MustParse(
      "env: {pass: [PATH, GH_TOKEN]}\n"
      "credentials:\n"
      "  in_sandbox: allow\n"
      "  secrets: {gh: {from: {env: GH_TOKEN}, hosts: [github.com]}}\n");
  EXPECT_EQ(p.env.pass, (std::vector<std::string>{"PATH", "GH_TOKEN"}));
  // A placeholder is still the runtime's to set.
  EXPECT_FALSE(ParsePolicy("env: {set: {GH: x}}\n"
                           "credentials:\n"
                           "  in_sandbox: allow\n"
                           "  secrets: {gh: {from: {env: T}, hosts: [github.com], placeholder_env: GH}}\n",
                           "p.yaml")
                   .ok());
}

TEST(ParseCredentialsTest, SecretsOnlyInConfinedModes) {
  for (const char* mode : {"read-only", "workspace-write"}) {
    Policy p = MustParse(std::string("mode: ") + mode + "\ncredentials: {secrets: {gh: {from: {env: GH}, hosts: [github.com]}}}\n");
    EXPECT_EQ(p.credentials.secrets.size(), 1u);
  }
  EXPECT_TRUE(MustParse("mode: danger-full-access\ncredentials: {secrets: {}}\n").credentials.secrets.empty());
}

TEST(ParseHttpRulesTest, HostsAndPatterns) {
  Policy p = MustParse(
      "network:\n"
      "  http_rules:\n"
      "    - host: API.GitHub.com.\n"
      "      allow: [\"GET /repos/acme/**\", \"POST /repos/acme/*/pulls\", \"* /v*/x\", \"DELETE /\", "
      "\"PROPFIND /dav/%20x/\", \"GET /a/**/b\", \"GET /a;v=1/%41/.x/\"]\n"
      "    - {host: uploads.github.com, allow: [\"PUT /**\"]}\n");
  ASSERT_EQ(p.network.http_rules.size(), 2u);
  EXPECT_EQ(p.network.http_rules[0].host, "api.github.com");
  EXPECT_EQ(p.network.http_rules[0].allow,
            (std::vector<std::string>{"GET /repos/acme/**", "POST /repos/acme/*/pulls", "* /v*/x", "DELETE /",
                                      "PROPFIND /dav/%20x/", "GET /a/**/b", "GET /a;v=1/%41/.x/"}));
  EXPECT_EQ(p.network.http_rules[1].host, "uploads.github.com");
  EXPECT_TRUE(MustParse("version: 1\n").network.http_rules.empty());
  EXPECT_TRUE(MustParse("network: {http_rules: []}\n").network.http_rules.empty());
}

TEST(ParsePolicyTest, SessionSectionAndItsDefaults) {
  Policy preset = MustParse("version: 1\n");
  EXPECT_FALSE(preset.session.call_timeout_ms.has_value());
  EXPECT_EQ(preset.session.idle_timeout_ms, 30u * 60 * 1000);
  EXPECT_EQ(preset.session.shell, ShellMode::kFresh);
  Policy p = MustParse("version: 1\nsession:\n  call_timeout: 90s\n  idle_timeout: 2h\n  shell: persistent\n");
  EXPECT_EQ(p.session.call_timeout_ms, 90000u);
  EXPECT_EQ(p.session.idle_timeout_ms, 2u * 60 * 60 * 1000);
  EXPECT_EQ(p.session.shell, ShellMode::kPersistent);
  // Written back with its units, it reads the same; the digest follows it.
  Policy back = MustParse(ToYaml(p));
  EXPECT_EQ(ToYaml(back), ToYaml(p));
  EXPECT_EQ(back.session.call_timeout_ms, 90000u);
  Policy other = p;
  other.session.idle_timeout_ms += 1000;
  other.sha256.clear();
  p.sha256.clear();
  EXPECT_NE(PolicyDigest(other), PolicyDigest(p));
}

TEST(ParsePolicyTest, TrailingEmptyDocumentIsFine) {
  EXPECT_EQ(MustParse("version: 1\n---\n").version, 1);
}

TEST(ParsePolicyTest, ReadWriteCachesAndHomeImport) {
  Policy p = MustParse(
      "filesystem:\n"
      "  read_write: [~/repos/bare.git/, /srv//cache]\n"
      "  caches:\n"
      "    npm: ~/.npm\n"
      "    pip: {path: ~/.cache/pip, host: ~/.cache/pip}\n"
      "    go-build.v1: /go-cache\n"
      "home:\n"
      "  import: [.gitconfig, .config/git/ignore]\n");
  EXPECT_EQ(p.filesystem.read_write, (std::vector<std::string>{"~/repos/bare.git", "/srv/cache"}));
  ASSERT_EQ(p.filesystem.caches.size(), 3u);
  EXPECT_EQ(p.filesystem.caches[0].name, "npm");
  EXPECT_EQ(p.filesystem.caches[0].path, "~/.npm");
  EXPECT_EQ(p.filesystem.caches[0].host, "");
  EXPECT_EQ(p.filesystem.caches[1].host, "~/.cache/pip");
  EXPECT_EQ(p.filesystem.caches[2].name, "go-build.v1");
  EXPECT_EQ(p.home.import, (std::vector<std::string>{".gitconfig", ".config/git/ignore"}));
  // The effective policy reads back the same.
  Policy again = MustParse(ToYaml(p));
  EXPECT_EQ(again.filesystem.read_write, p.filesystem.read_write);
  ASSERT_EQ(again.filesystem.caches.size(), 3u);
  EXPECT_EQ(again.filesystem.caches[1].host, "~/.cache/pip");
  EXPECT_EQ(again.home.import, p.home.import);
  // Left out, they are not written: the digest of older policies stays.
  EXPECT_EQ(ToYaml(PresetFor(Mode::kWorkspaceWrite)).find("read_write"), std::string::npos);
  EXPECT_EQ(ToYaml(PresetFor(Mode::kWorkspaceWrite)).find("home:"), std::string::npos);
}

TEST(ParsePolicyTest, EnvPassTakesPatterns) {
  Policy p = MustParse("env:\n  pass: [PATH, NPM_CONFIG_*, \"*_PROXY\"]\n");
  EXPECT_EQ(p.env.pass, (std::vector<std::string>{"PATH", "NPM_CONFIG_*", "*_PROXY"}));
  EXPECT_TRUE(EnvPatternMatch("NPM_CONFIG_*", "NPM_CONFIG_REGISTRY"));
  EXPECT_TRUE(EnvPatternMatch("NPM_CONFIG_*", "NPM_CONFIG_"));
  EXPECT_FALSE(EnvPatternMatch("NPM_CONFIG_*", "NPM_CONFIGX"));
  EXPECT_TRUE(EnvPatternMatch("*_PROXY", "GOPROXY_PROXY"));
  // The proxy variables agentbox sets (or that would route around it) never come in by a pattern.
  for (const char* proxy : {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "no_proxy", "https_proxy"}) {
    EXPECT_FALSE(EnvPatternMatch("*", proxy)) << proxy;
    EXPECT_FALSE(EnvPatternMatch("*_PROXY", proxy)) << proxy;
  }
  EXPECT_TRUE(EnvPatternMatch("A*B*C", "AxxBxxBxC"));
  EXPECT_FALSE(EnvPatternMatch("A*B*C", "AxxBxxBx"));
  EXPECT_TRUE(EnvPatternMatch("*", "HOME"));
  // agentbox's own variables never come in by a pattern; by name they do.
  EXPECT_FALSE(EnvPatternMatch("*", "AGENTBOX_PLAN"));
  EXPECT_FALSE(EnvPatternMatch("AGENTBOX_*", "AGENTBOX_PLAN"));
  EXPECT_TRUE(EnvPatternMatch("PATH", "PATH"));
  EXPECT_FALSE(EnvPatternMatch("PATH", "PATHX"));
}

TEST(ParsePolicyTest, EnvPassPatternsKeepSecretSourcesOut) {
  const std::string secrets =
      "credentials:\n  secrets:\n    npm: {from: {env: NPM_TOKEN}, hosts: [registry.npmjs.org]}\n";
  Result<Policy> r = ParsePolicy(secrets + "env:\n  pass: [PATH, NPM_*]\n", "policy.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "policy.yaml:5:16: env.pass[1]: the pattern \"NPM_*\" matches NPM_TOKEN: NPM_TOKEN is the source of "
            "credentials.secrets.npm; with credentials.in_sandbox: none it never enters the sandbox");
  // A pattern that matches no secret's variable is fine.
  EXPECT_TRUE(ParsePolicy(secrets + "env:\n  pass: [NPM_CONFIG_*]\n", "policy.yaml").ok());
}

TEST(ValidatePolicyTest, ReportsEveryIndependentError) {
  const std::string text =
      "version: 1\n"
      "sandbox:\n"
      "  isolation: vm\n"
      "filesystem:\n"
      "  caches: {NPM: ~/.npm}\n"
      "  read_write: [relative/path]\n"
      "netwrk: {}\n";
  std::vector<Status> errors = ValidatePolicy(text, "policy.yaml");
  std::vector<std::string> messages;
  for (const auto& e : errors) messages.push_back(e.message());
  EXPECT_EQ(messages,
            (std::vector<std::string>{
                "policy.yaml:3:14: sandbox.isolation: unknown value \"vm\" (expected one of: host, os, container, "
                "microvm, remote)",
                "policy.yaml:5:12: filesystem.caches.NPM: invalid cache name \"NPM\" (expected [a-z0-9][a-z0-9_.-]*, "
                "at most 64 characters)",
                "policy.yaml:6:16: filesystem.read_write[0]: must be an absolute path or start with ~/ "
                "(\"relative/path\")",
                "policy.yaml:7:1: netwrk: unknown key (expected one of: version, mode, sandbox, filesystem, "
                "network, credentials, resources, env, home, on_violation, diff, session, tools)"}));
  // Loading still stops at the first.
  Result<Policy> r = ParsePolicy(text, "policy.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), messages.front());
  // A valid policy has none; a syntax error is the one error.
  EXPECT_TRUE(ValidatePolicy("version: 1\n", "policy.yaml").empty());
  EXPECT_EQ(ValidatePolicy("a: [\n", "policy.yaml").size(), 1u);
}

// ---- Invalid files: every error names file:line:column and the key --------

struct BadCase {
  const char* name;
  std::string yaml;
  std::string message;  // the whole Status::message()
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class BadPolicyTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadPolicyTest, ReportsExactError) {
  Result<Policy> r = ParsePolicy(GetParam().yaml, "policy.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().stage(), "policy");
  EXPECT_EQ(r.status().message(), GetParam().message);
}

TEST(PolicyParse, MaxGrantParsesAndRoundTrips) {
  auto r = ParsePolicy(
      "version: 1\n"
      "on_violation:\n"
      "  escalation: one_time_approval\n"
      "  max_grant:\n"
      "    network: [\"registry.example:443\", \"*.npmjs.org:443\"]\n"
      "    filesystem_read: [\"~/src\", /opt/data/]\n"
      "    filesystem_write: [\"~/src\"]\n"
      "    syscalls: [ptrace]\n"
      "    memory_gib: 8\n",
      "policy.yaml");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const MaxGrantSpec& g = r->on_violation.max_grant;
  EXPECT_EQ(r->on_violation.escalation, Escalation::kOneTimeApproval);
  EXPECT_EQ(g.network, (std::vector<std::string>{"registry.example:443", "*.npmjs.org:443"}));
  EXPECT_EQ(g.filesystem_read, (std::vector<std::string>{"~/src", "/opt/data"}));
  EXPECT_EQ(g.filesystem_write, (std::vector<std::string>{"~/src"}));
  EXPECT_EQ(g.syscalls, (std::vector<std::string>{"ptrace"}));
  ASSERT_TRUE(g.memory_bytes.has_value());
  EXPECT_EQ(*g.memory_bytes, 8ULL << 30);
  auto again = ParsePolicy(ToYaml(*r), "again.yaml");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << ToYaml(*r);
  EXPECT_EQ(ToYaml(*again), ToYaml(*r));
  EXPECT_EQ(again->on_violation.max_grant.network, g.network);
  EXPECT_EQ(again->on_violation.max_grant.memory_bytes, g.memory_bytes);
  // Left out: nothing is within the ceiling, and the YAML (so the digest) of
  // a policy without it is unchanged.
  auto none = ParsePolicy("version: 1\n", "p.yaml");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->on_violation.max_grant.network.empty());
  EXPECT_FALSE(none->on_violation.max_grant.memory_bytes.has_value());
  EXPECT_EQ(ToYaml(*none).find("max_grant"), std::string::npos);
}

TEST(PolicyParse, MaxGrantPathsBesideDenyEntriesAreFine) {
  // A tree holding a denied path is a ceiling, not a grant: the offer for a
  // path under ~/.ssh is refused when it is made.
  auto r = ParsePolicy("on_violation:\n  max_grant:\n    filesystem_read: [~/src, ~/.sshkeys, /etc/ssl]\n",
                       "policy.yaml");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

TEST(SyscallGrantTest, PtraceIsGrantableAndWhatUndoesTheSandboxIsNot) {
  for (const char* name : {"ptrace", "process_vm_readv", "process_vm_writev"}) {
    EXPECT_FALSE(SyscallGrantProblem(name).has_value()) << name;
  }
  for (const char* name : {"mount", "umount2", "pivot_root", "unshare", "setns", "init_module", "finit_module",
                           "kexec_load", "reboot", "io_uring_setup", "keyctl", "open_by_handle_at", "clock_settime",
                           "bpf", "userfaultfd", "perf_event_open"}) {
    auto problem = SyscallGrantProblem(name);
    ASSERT_TRUE(problem.has_value()) << name;
    EXPECT_NE(problem->find("is never granted"), std::string::npos) << *problem;
  }
}

TEST(PolicyParse, DiffExcludeKeepsItsPatternsAndRoundTrips) {
  auto r = ParsePolicy("version: 1\ndiff:\n  exclude: [\"*.log\", \"!keep.log\", /build/, \"**/tmp\"]\n",
                       "policy.yaml");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->diff.exclude, (std::vector<std::string>{"*.log", "!keep.log", "/build/", "**/tmp"}));
  auto again = ParsePolicy(ToYaml(*r), "again.yaml");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << ToYaml(*r);
  EXPECT_EQ(again->diff.exclude, r->diff.exclude);
  EXPECT_TRUE(ParsePolicy("version: 1\n", "p.yaml")->diff.exclude.empty());
}

TEST(PolicyParse, ToolsUpstreamKeepsItsServersAndRoundTrips) {
  const std::string text =
      "version: 1\n"
      "credentials:\n"
      "  secrets:\n"
      "    tracker_token: { from: { env: TRACKER_TOKEN } }\n"
      "tools:\n"
      "  upstream:\n"
      "    - name: tracker\n"
      "      command: [tracker-mcp, --stdio]\n"
      "      secret: tracker_token\n"
      "      secret_env: TRACKER_TOKEN\n"
      "      allow: [search_issues, get_issue]\n"
      "      timeout: 5s\n"
      "    - { name: docs, command: [docs-mcp], allow: [lookup] }\n";
  auto r = ParsePolicy(text, "policy.yaml");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tools.upstream.size(), 2u);
  const UpstreamSpec& t = r->tools.upstream[0];
  EXPECT_EQ(t.name, "tracker");
  EXPECT_EQ(t.command, (std::vector<std::string>{"tracker-mcp", "--stdio"}));
  EXPECT_EQ(t.secret, "tracker_token");
  EXPECT_EQ(t.secret_env, "TRACKER_TOKEN");
  EXPECT_EQ(t.allow, (std::vector<std::string>{"search_issues", "get_issue"}));
  EXPECT_EQ(t.timeout_ms, 5000u);
  EXPECT_EQ(r->tools.upstream[1].secret_env, "MCP_TOKEN");
  EXPECT_EQ(r->tools.upstream[1].timeout_ms, 30000u);
  // A secret only an upstream uses needs no hosts.
  EXPECT_TRUE(r->credentials.secrets[0].hosts.empty());
  auto again = ParsePolicy(ToYaml(*r), "again.yaml");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << ToYaml(*r);
  EXPECT_EQ(again->tools.upstream[0].command, t.command);
  EXPECT_EQ(again->tools.upstream[0].allow, t.allow);
  EXPECT_EQ(again->tools.upstream[0].timeout_ms, t.timeout_ms);
}

TEST(PolicyParse, ToolsUpstreamMistakesAreNamed) {
  auto error = [](const std::string& tail) {
    auto r = ParsePolicy("version: 1\n" + tail, "policy.yaml");
    return r.ok() ? std::string("(accepted)") : r.status().message();
  };
  EXPECT_EQ(error("tools:\n  upstream:\n    - { name: Tracker, command: [x], allow: [a] }\n"),
            "policy.yaml:4:15: tools.upstream[0].name: \"Tracker\" is not a name: a lower-case letter, then letters, "
            "digits, _ or -, at most 32 (its tools are NAME.TOOL)");
  EXPECT_NE(error("tools:\n  upstream:\n    - { name: t, allow: [a] }\n").find("give exactly one of command"),
            std::string::npos);
  EXPECT_NE(error("tools:\n  upstream:\n    - { name: t, command: [x] }\n").find("allow"), std::string::npos);
  EXPECT_NE(error("tools:\n  upstream:\n    - { name: t, command: [x], allow: [] }\n").find("empty list"),
            std::string::npos);
  EXPECT_NE(error("tools:\n  upstream:\n    - { name: t, command: [x], allow: [a], secret: nope }\n")
                .find("\"nope\" is not one of credentials.secrets"),
            std::string::npos);
  EXPECT_NE(error("tools:\n  upstream:\n    - { name: t, command: [x], allow: [a] }\n    - { name: t, command: [y], allow: [b] }\n")
                .find("a second upstream named t"),
            std::string::npos);
  EXPECT_NE(error("tools:\n  upstream:\n    - { name: t, url: \"ftp://127.0.0.1:9/mcp\", allow: [a] }\n")
                .find("\"ftp://127.0.0.1:9/mcp\" is not an http:// or https:// URL"),
            std::string::npos);
  EXPECT_NE(error("tools:\n  upstream:\n    - { name: t, url: \"http://me:pw@127.0.0.1:9/mcp\", allow: [a] }\n")
                .find("user info in the URL is refused"),
            std::string::npos);
  EXPECT_NE(error("tools:\n  upstream:\n    - { name: t, url: \"http://127.0.0.1:70000/mcp\", allow: [a] }\n")
                .find("port '70000' is not 1-65535"),
            std::string::npos);
  EXPECT_NE(error("tools:\n  upstream:\n    - { name: t, url: \"http://127.0.0.1:9/mcp\", secret_env: T, allow: [a] }\n")
                .find("secret_env is for a stdio server"),
            std::string::npos);
  EXPECT_NE(error("tools:\n  upstream:\n    - { name: t, url: \"http://127.0.0.1:9/mcp\", command: [x], allow: [a] }\n")
                .find("give exactly one of command"),
            std::string::npos);
  // A secret with no hosts that no upstream uses would go nowhere: an error.
  EXPECT_NE(error("credentials:\n  secrets:\n    lost: { from: { env: X } }\n")
                .find("credentials.secrets.lost: missing key \"hosts\""),
            std::string::npos);
}

TEST(PolicyParse, ToolsRunCodeBindsBashOnlyWhenAskedAndRoundTrips) {
  auto plain = ParsePolicy("version: 1\n", "policy.yaml");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->tools.run_code.bash);
  EXPECT_EQ(ToYaml(*plain).find("run_code"), std::string::npos);
  auto r = ParsePolicy("version: 1\ntools:\n  run_code:\n    bash: true\n", "policy.yaml");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->tools.run_code.bash);
  auto again = ParsePolicy(ToYaml(*r), "again.yaml");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << ToYaml(*r);
  EXPECT_TRUE(again->tools.run_code.bash);
  auto bad = ParsePolicy("version: 1\ntools:\n  run_code:\n    network: true\n", "policy.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("network"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("bash"), std::string::npos) << bad.status().message();
}

const std::string kTopKeys =
    "(expected one of: version, mode, sandbox, filesystem, network, credentials, resources, env, home, "
    "on_violation, diff, session, tools)";
const std::string kEnvHint = "(expected [A-Za-z_][A-Za-z0-9_]*)";

const BadCase kBadCases[] = {
    {"SessionDurationWithoutUnit", "version: 1\nsession:\n  call_timeout: 10\n",
     "policy.yaml:3:17: session.call_timeout: invalid duration \"10\" (expected a number with a unit ms, s, m or h, "
     "e.g. 90s)"},
    {"SessionIdleTimeoutZero", "session: {idle_timeout: 0s}\n",
     "policy.yaml:1:25: session.idle_timeout: duration \"0s\" must be > 0"},
    {"SessionUnknownShell", "session:\n  shell: forever\n",
     "policy.yaml:2:10: session.shell: unknown value \"forever\" (expected one of: fresh, persistent)"},
    {"SessionUnknownKey", "session:\n  idle: 5m\n",
     "policy.yaml:2:3: session.idle: unknown key (expected one of: call_timeout, idle_timeout, shell)"},
    {"UnknownTopLevelKey", "version: 1\nnetwrk: {}\n",
     "policy.yaml:2:1: netwrk: unknown key " + kTopKeys},
    {"UnknownNestedKey", "network:\n  alow: [example.com]\n",
     "policy.yaml:2:3: network.alow: unknown key (expected one of: default, egress_proxy, allow, "
     "deny, on_unknown_domain, tls_sni_check, tls_sni_ports, inspect_tls, http_rules)"},
    {"UnknownResourceKey", "resources:\n  cpu: {guaranteed: 1, max: 2}\n",
     "policy.yaml:2:24: resources.cpu.max: unknown key (expected one of: guaranteed, limit)"},
    {"StringWhereBoolExpected", "sandbox:\n  fresh_per_task: yes\n",
     "policy.yaml:2:19: sandbox.fresh_per_task: expected true or false, got \"yes\""},
    {"ListWhereBoolExpected", "network: {egress_proxy: [true]}\n",
     "policy.yaml:1:25: network.egress_proxy: expected true or false, got a list"},
    {"ScalarWhereListExpected", "filesystem:\n  read_only: /usr\n",
     "policy.yaml:2:14: filesystem.read_only: expected a list, got \"/usr\""},
    {"MapWhereListExpected", "network:\n  allow: {github.com: 443}\n",
     "policy.yaml:2:10: network.allow: expected a list, got a map"},
    {"NothingWhereListExpected", "filesystem:\n  deny:\nnetwork: {}\n",
     "policy.yaml:2:3: filesystem.deny: expected a list, got nothing"},
    {"ScalarWhereMapExpected", "sandbox: os\n",
     "policy.yaml:1:10: sandbox: expected a map, got \"os\""},
    {"BadIsolation", "sandbox:\n  isolation: vm\n",
     "policy.yaml:2:14: sandbox.isolation: unknown value \"vm\" (expected one of: host, os, "
     "container, microvm, remote)"},
    {"BadMode", "version: 1\nmode: yolo\n",
     "policy.yaml:2:7: mode: unknown value \"yolo\" (expected one of: read-only, workspace-write, "
     "danger-full-access)"},
    {"BadWorkspaceMode", "filesystem: {workspace: {mode: rw}}\n",
     "policy.yaml:1:32: filesystem.workspace.mode: unknown value \"rw\" (expected one of: "
     "read-write, read-only)"},
    {"BadCredentials", "credentials: {in_sandbox: env}\n",
     "policy.yaml:1:27: credentials.in_sandbox: unknown value \"env\" (expected one of: none, allow)"},
    {"BadEscalation", "on_violation:\n  escalation: ask\n",
     "policy.yaml:2:15: on_violation.escalation: unknown value \"ask\" (expected one of: deny, "
     "one_time_approval)"},
    {"VersionTwo", "version: 2\n", "policy.yaml:1:10: version: unsupported version 2 (expected 1)"},
    {"VersionNotInteger", "version: 1.0\n",
     "policy.yaml:1:10: version: expected an integer, got \"1.0\""},
    {"RelativeReadOnlyPath", "filesystem:\n  read_only: [/usr, /bin, usr/lib]\n",
     "policy.yaml:2:27: filesystem.read_only[2]: must be an absolute path or start with ~/ "
     "(\"usr/lib\")"},
    {"RelativeWorkspacePath", "filesystem:\n  workspace: {path: ws}\n",
     "policy.yaml:2:21: filesystem.workspace.path: must be an absolute path (\"ws\")"},
    {"DotDotComponent", "filesystem:\n  deny:\n    - src/../secrets\n",
     "policy.yaml:3:7: filesystem.deny[0]: \"..\" components are not allowed (\"src/../secrets\")"},
    {"DotDotAtEnd", "filesystem: {read_only: [/usr/..]}\n",
     "policy.yaml:1:26: filesystem.read_only[0]: \"..\" components are not allowed (\"/usr/..\")"},
    {"DiffExcludeNotAList", "diff:\n  exclude: node_modules\n",
     "policy.yaml:2:12: diff.exclude: expected a list, got \"node_modules\""},
    {"DiffExcludeEmpty", "diff:\n  exclude: [build/, \"  \"]\n",
     "policy.yaml:2:21: diff.exclude[1]: empty pattern"},
    {"DiffExcludeComment", "diff:\n  exclude:\n    - \"#x\"\n",
     "policy.yaml:3:7: diff.exclude[0]: a pattern starting with '#' is a comment in gitignore syntax (write \\# "
     "for a literal '#')"},
    {"DiffUnknownKey", "diff: {include: [x]}\n",
     "policy.yaml:1:8: diff.include: unknown key (expected one of: exclude)"},
    {"EmptyPath", "filesystem:\n  protect: [\"\"]\n",
     "policy.yaml:2:13: filesystem.protect[0]: empty path"},
    {"EmptyWorkspacePath", "filesystem: {workspace: {path: \"\"}}\n",
     "policy.yaml:1:32: filesystem.workspace.path: empty path"},
    {"ReadOnlyRoot", "filesystem:\n  read_only: [/usr, //]\n",
     "policy.yaml:2:21: filesystem.read_only[1]: \"/\" would bind the host's whole root into the sandbox: "
     "every user's files, and every unix socket on the host (a read-only mount does not stop connect() to a "
     "daemon's socket); list the directories the command needs instead"},
    {"GlobInReadOnly", "filesystem:\n  read_only: [\"/opt/*\"]\n",
     "policy.yaml:2:15: filesystem.read_only[0]: globs are not allowed here (\"/opt/*\")"},
    {"GlobInProtect", "filesystem:\n  protect: [\".git/hook?\"]\n",
     "policy.yaml:2:13: filesystem.protect[0]: globs are not allowed here (\".git/hook?\")"},
    {"UnterminatedBracketInDeny", "filesystem:\n  deny: [\"[ab.key\"]\n",
     "policy.yaml:2:10: filesystem.deny[0]: unterminated [ in \"[ab.key\""},
    {"TildeUser", "filesystem:\n  deny: [~bob/.ssh]\n",
     "policy.yaml:2:10: filesystem.deny[0]: only ~ and ~/... are supported, not ~user "
     "(\"~bob/.ssh\")"},
    {"TildeInProtect", "filesystem:\n  protect: [~/.bashrc]\n",
     "policy.yaml:2:13: filesystem.protect[0]: ~ is not allowed here (\"~/.bashrc\")"},
    {"ControlCharacterInPath", "filesystem:\n  deny: [\"a\\tb\"]\n",
     "policy.yaml:2:10: filesystem.deny[0]: contains a control character"},
    {"MemoryGuaranteedAboveLimit", "resources:\n  memory_gib: { guaranteed: 0.5, limit: 256Mi }\n",
     "policy.yaml:2:41: resources.memory_gib.limit: must be ≥ guaranteed (0.5)"},
    {"CpuGuaranteedAboveLimit", "resources:\n  cpu:\n    guaranteed: 2\n    limit: 1\n",
     "policy.yaml:4:12: resources.cpu.limit: must be ≥ guaranteed (2)"},
    {"ZeroCpu", "resources:\n  cpu: {limit: 0}\n",
     "policy.yaml:2:16: resources.cpu.limit: must be > 0"},
    {"NegativeDisk", "resources:\n  disk_gib: -1\n",
     "policy.yaml:2:13: resources.disk_gib: must be > 0"},
    {"ZeroWallClock", "resources:\n  wall_clock_min: 0\n",
     "policy.yaml:2:19: resources.wall_clock_min: must be > 0"},
    {"CpuNotANumber", "resources:\n  cpu: {limit: many}\n",
     "policy.yaml:2:16: resources.cpu.limit: expected a number, got \"many\""},
    {"ZeroMaxProcesses", "resources:\n  max_processes: 0\n",
     "policy.yaml:2:18: resources.max_processes: must be ≥ 1"},
    {"FractionalMaxProcesses", "resources:\n  max_processes: 1.5\n",
     "policy.yaml:2:18: resources.max_processes: expected a whole number ≥ 1, got \"1.5\""},
    {"HugeMemory", "resources:\n  memory_gib: {limit: 1e12}\n",
     "policy.yaml:2:23: resources.memory_gib.limit: is larger than the maximum, 1048576 GiB (1024Ti)"},
    {"HugeDisk", "resources:\n  disk_gib: 16000000000\n",
     "policy.yaml:2:13: resources.disk_gib: is larger than the maximum, 1048576 GiB (1024Ti)"},
    {"HugeDiskWithUnit", "resources:\n  disk_gib: 2048Ti\n",
     "policy.yaml:2:13: resources.disk_gib: size \"2048Ti\" is larger than the maximum, 1024Ti"},
    {"HugeWallClock", "resources:\n  wall_clock_min: 1000000\n",
     "policy.yaml:2:19: resources.wall_clock_min: is longer than the maximum, 10080 minutes (168h)"},
    {"HugeWallClockWithUnit", "resources:\n  wall_clock_min: 3000000h\n",
     "policy.yaml:2:19: resources.wall_clock_min: duration \"3000000h\" is longer than the maximum, 168h (7 days)"},
    {"HugeKillGrace", "resources:\n  kill_grace: 200h\n",
     "policy.yaml:2:15: resources.kill_grace: duration \"200h\" is longer than the maximum, 168h (7 days)"},
    {"HugeMaxProcesses", "resources:\n  max_processes: 4194305\n",
     "policy.yaml:2:18: resources.max_processes: is larger than the maximum, 4194304"},
    {"MaxProcessesPast64Bits", "resources:\n  max_processes: 99999999999999999999999\n",
     "policy.yaml:2:18: resources.max_processes: is larger than the maximum, 4194304"},
    {"HugeCpu", "resources:\n  cpu: {limit: 1e9}\n",
     "policy.yaml:2:16: resources.cpu.limit: is larger than the maximum, 4096"},
    {"BadSizeSuffix", "resources:\n  memory_gib: {limit: 2Qi}\n",
     "policy.yaml:2:23: resources.memory_gib.limit: invalid size \"2Qi\" (expected a number with "
     "an optional suffix K, M, G, T, Ki, Mi, Gi or Ti, e.g. 512Mi)"},
    {"BadDuration", "resources:\n  wall_clock_min: 10x\n",
     "policy.yaml:2:19: resources.wall_clock_min: invalid duration \"10x\" (expected a number "
     "with a unit ms, s, m or h, e.g. 90s)"},
    {"BadEnvPassName", "env:\n  pass: [PATH, 1BAD]\n",
     "policy.yaml:2:16: env.pass[1]: invalid variable name \"1BAD\" " + kEnvHint},
    {"BadEnvSetName", "env:\n  set:\n    BAD-NAME: x\n",
     "policy.yaml:3:5: env.set: invalid variable name \"BAD-NAME\" " + kEnvHint},
    {"EnvSetValueNotScalar", "env:\n  set: {A: [1]}\n",
     "policy.yaml:2:12: env.set.A: expected a string, got a list"},
    {"OverBroadWildcardInAllow", "network:\n  allow: [\"*.com\"]\n",
     "policy.yaml:2:11: network.allow[0]: \"*.com\" is too broad (a wildcard needs at least two "
     "labels, e.g. \"*.example.com\")"},
    {"StarInAllow", "network:\n  allow: [\"*\"]\n",
     "policy.yaml:2:11: network.allow[0]: \"*\" would allow every host (use network.default: "
     "allow instead)"},
    {"InnerWildcard", "network:\n  allow: [\"api*.example.com\"]\n",
     "policy.yaml:2:11: network.allow[0]: \"*\" may only stand for whole leading labels, as in "
     "\"*.example.com\" (got \"api*.example.com\")"},
    {"WhitespaceInDomain", "network:\n  deny: [\"evil .com\"]\n",
     "policy.yaml:2:10: network.deny[0]: contains whitespace or a control character"},
    {"EmptyDomain", "network:\n  allow: [\"\"]\n",
     "policy.yaml:2:11: network.allow[0]: empty entry"},
    {"BadPort", "network:\n  allow: [example.com:99999]\n",
     "policy.yaml:2:11: network.allow[0]: bad port \"99999\" (expected 1-65535)"},
    {"SniCheckNotABool", "network:\n  tls_sni_check: on\n",
     "policy.yaml:2:18: network.tls_sni_check: expected true or false, got \"on\""},
    {"SniPortOutOfRange", "network:\n  tls_sni_ports: [443, 70000]\n",
     "policy.yaml:2:24: network.tls_sni_ports[1]: expected a port (1-65535), got \"70000\""},
    {"SniPortNotANumber", "network:\n  tls_sni_ports: [https]\n",
     "policy.yaml:2:19: network.tls_sni_ports[0]: expected a port (1-65535), got \"https\""},
    {"SniPortDuplicate", "network:\n  tls_sni_ports: [443, 443]\n",
     "policy.yaml:2:24: network.tls_sni_ports[1]: duplicate port 443"},
    {"SniPortsEmpty", "network:\n  tls_sni_ports: []\n",
     "policy.yaml:2:18: network.tls_sni_ports: empty list (to turn the check off, use tls_sni_check: false)"},
    {"SniPortsScalar", "network:\n  tls_sni_ports: 443\n",
     "policy.yaml:2:18: network.tls_sni_ports: expected a list, got \"443\""},
    {"InspectTlsNumber", "network:\n  inspect_tls: 1\n",
     "policy.yaml:2:16: network.inspect_tls: expected true, false or a list of hosts, got \"1\""},
    {"InspectTlsMap", "network:\n  inspect_tls: {example.com: true}\n",
     "policy.yaml:2:16: network.inspect_tls: expected true, false or a list of hosts, got a map"},
    {"InspectTlsEmpty", "network:\n  inspect_tls: []\n",
     "policy.yaml:2:16: network.inspect_tls: empty list (to inspect no host, use inspect_tls: false)"},
    {"InspectTlsPort", "network:\n  inspect_tls: [\"example.com:443\"]\n",
     "policy.yaml:2:17: network.inspect_tls[0]: no port here (\"example.com:443\")"},
    {"InspectTlsCidr", "network:\n  inspect_tls: [10.0.0.0/8]\n",
     "policy.yaml:2:17: network.inspect_tls[0]: \"10.0.0.0/8\" is not a host name"},
    {"InspectTlsAddress", "network:\n  inspect_tls: [10.0.0.1]\n",
     "policy.yaml:2:17: network.inspect_tls[0]: \"10.0.0.1\" is, or reads as, an IP address: a host name is "
     "required here"},
    {"InspectTlsTooBroad", "network:\n  inspect_tls: [\"*.com\"]\n",
     "policy.yaml:2:17: network.inspect_tls[0]: \"*.com\" is too broad (a wildcard needs at least two labels, "
     "e.g. \"*.example.com\")"},
    {"InspectTlsDuplicate", "network:\n  inspect_tls: [example.com, EXAMPLE.com]\n",
     "policy.yaml:2:30: network.inspect_tls[1]: duplicate host \"example.com\""},
    {"InspectTlsWithoutSniCheck", "network:\n  inspect_tls: [example.com]\n  tls_sni_check: false\n",
     "policy.yaml:2:16: network.inspect_tls: inspect_tls keeps the SNI check, which tls_sni_check: false "
     "turns off"},
    {"InspectTlsAllWithoutSniCheck", "network:\n  tls_sni_check: false\n  inspect_tls: true\n",
     "policy.yaml:3:16: network.inspect_tls: inspect_tls keeps the SNI check, which tls_sni_check: false "
     "turns off"},
    {"EmptyImage", "sandbox: {image: \"\"}\n",
     "policy.yaml:1:18: sandbox.image: must not be empty"},
    {"DuplicateTopLevelKey", "version: 1\nversion: 1\n", "policy.yaml:2:1: version: duplicate key"},
    {"DuplicateNestedKey", "sandbox:\n  image: a\n  image: b\n",
     "policy.yaml:3:3: sandbox.image: duplicate key"},
    {"DuplicateEnvName", "env: {set: {A: 1, A: 2}}\n",
     "policy.yaml:1:19: env.set.A: duplicate key"},
    {"NonStringKey", "sandbox:\n  [a]: 1\n",
     "policy.yaml:2:3: sandbox: keys must be strings, got a list"},
    {"YamlSyntaxError", "sandbox:\n  image: [a, b\n",
     "policy.yaml:3:1: YAML syntax error: end of sequence flow not found"},
    {"TabIndentation", "sandbox:\n\timage: x\n",
     "policy.yaml:2:7: YAML syntax error: illegal map value"},
    {"Garbage", "}{\x01 ::: [\n", "policy.yaml:1:1: YAML syntax error: illegal flow end"},
    {"EmptyDocument", "",
     "policy.yaml:1:1: empty document (expected a map, at least \"version: 1\")"},
    {"CommentsOnly", "# nothing here\n",
     "policy.yaml:1:1: empty document (expected a map, at least \"version: 1\")"},
    // yaml-cpp 0.7's LoadAll loops forever on this (found by fuzz/policy_fuzz).
    {"AnchorThenStrayComma", "&a,\n",
     "policy.yaml:1:1: empty document (expected a map, at least \"version: 1\")"},
    {"TopLevelList", "- version: 1\n",
     "policy.yaml:1:1: expected a map at the top level, got a list"},
    {"TopLevelScalar", "hello\n",
     "policy.yaml:1:1: expected a map at the top level, got \"hello\""},
    {"TwoDocuments", "version: 1\n---\nversion: 1\n",
     "policy.yaml:3:1: more than one YAML document"},
    {"InvalidUtf8", "sandbox: {image: \"a\xff\"}\n",
     "policy.yaml:1:18: sandbox.image: not valid UTF-8"},
    // ---- credentials and network.http_rules
    {"CredentialsUnknownKey", "credentials:\n  vault: x\n",
     "policy.yaml:2:3: credentials.vault: unknown key (expected one of: in_sandbox, git, tools, secrets)"},
    {"GitUnknownValue", "credentials: {git: vault}\n",
     "policy.yaml:1:20: credentials.git: unknown value \"vault\" (expected one of: none, proxy)"},
    {"GitList", "credentials: {git: [proxy]}\n",
     "policy.yaml:1:20: credentials.git: expected none, proxy or a map (remotes, push), got a list"},
    {"GitNothing", "credentials:\n  git:\n",
     "policy.yaml:2:3: credentials.git: expected none, proxy or a map (remotes, push), got nothing"},
    {"GitMapUnknownKey", "credentials:\n  git: {remotes: [\"https://github.com/a/*\"], pull: {}}\n",
     "policy.yaml:2:46: credentials.git.pull: unknown key (expected one of: remotes, push)"},
    {"GitMapWithoutRemotes", "credentials:\n  git:\n    push: {deny_force: true}\n",
     "policy.yaml:2:3: credentials.git: missing key \"remotes\""},
    {"GitRemotesEmpty", "credentials:\n  git: {remotes: []}\n",
     "policy.yaml:2:18: credentials.git.remotes: empty list (for no git credentials, use git: none)"},
    {"GitRemotePlainHttp", "credentials:\n  git:\n    remotes: [\"http://github.com/acme/*\"]\n",
     "policy.yaml:3:15: credentials.git.remotes[0]: credentials are never sent over plain HTTP: use https:// (\"http://github.com/acme/*\")"},
    {"GitRemoteSsh", "credentials:\n  git:\n    remotes: [\"git@github.com:acme/x.git\"]\n",
     "policy.yaml:3:15: credentials.git.remotes[0]: must be an https:// URL, e.g. \"https://github.com/acme/*\" (got \"git@github.com:acme/x.git\")"},
    {"GitRemoteNoPath", "credentials:\n  git:\n    remotes: [\"https://github.com\"]\n",
     "policy.yaml:3:15: credentials.git.remotes[0]: needs a path after the host, e.g. \"https://github.com/acme/*\" (got \"https://github.com\")"},
    {"GitRemoteRootPath", "credentials:\n  git:\n    remotes: [\"https://github.com/\"]\n",
     "policy.yaml:3:15: credentials.git.remotes[0]: needs a path after the host, e.g. \"https://github.com/acme/*\" (got \"https://github.com/\")"},
    {"GitRemoteUserInfo", "credentials:\n  git:\n    remotes: [\"https://me:pw@github.com/acme/*\"]\n",
     "policy.yaml:3:15: credentials.git.remotes[0]: no user name or password in a remote: they come from credentials.secrets (\"https://me:pw@github.com/acme/*\")"},
    {"GitRemoteBadPort", "credentials:\n  git:\n    remotes: [\"https://github.com:0/acme/*\"]\n",
     "policy.yaml:3:15: credentials.git.remotes[0]: bad port \"0\" (expected 1-65535) in \"https://github.com:0/acme/*\""},
    {"GitRemoteIpHost", "credentials:\n  git:\n    remotes: [\"https://127.0.0.1:8443/acme/*\"]\n",
     "policy.yaml:3:15: credentials.git.remotes[0]: \"127.0.0.1\" is, or reads as, an IP address: a host name is required here"},
    {"GitRemoteV6Host", "credentials:\n  git:\n    remotes: [\"https://[::1]:8443/acme/*\"]\n",
     "policy.yaml:3:15: credentials.git.remotes[0]: \"[::1]:8443\" is an IP address: a host name is required here"},
    {"GitRemoteWildcardHost", "credentials:\n  git:\n    remotes: [\"https://*.github.com/acme/*\"]\n",
     "policy.yaml:3:15: credentials.git.remotes[0]: no wildcard here: an exact host name (got \"*.github.com\")"},
    {"GitRemoteQuery", "credentials:\n  git:\n    remotes: [\"https://github.com/acme/x?service=git-upload-pack\"]\n",
     "policy.yaml:3:15: credentials.git.remotes[0]: no query (\"?\") here: a rule matches the path alone (\"/acme/x?service=git-upload-pack\")"},
    {"GitRemotePartialDoubleStar", "credentials:\n  git:\n    remotes: [\"https://github.com/acme/x**\"]\n",
     "policy.yaml:3:15: credentials.git.remotes[0]: \"**\" must be a whole segment, as in \"/a/**\" (got \"/acme/x**\")"},
    {"GitRemoteDuplicate", "credentials:\n  git:\n    remotes: [\"https://github.com/a/*\", \"https://GitHub.com/a/*\"]\n",
     "policy.yaml:3:41: credentials.git.remotes[1]: duplicate remote \"https://github.com/a/*\""},
    {"GitPushUnknownKey", "credentials:\n  git: {remotes: [\"https://github.com/a/*\"], push: {force: false}}\n",
     "policy.yaml:2:53: credentials.git.push.force: unknown key (expected one of: allow_refs, deny_force)"},
    {"GitDenyForceNotBool", "credentials:\n  git: {remotes: [\"https://github.com/a/*\"], push: {deny_force: yes}}\n",
     "policy.yaml:2:65: credentials.git.push.deny_force: expected true or false, got \"yes\""},
    {"GitRefNotFull", "credentials:\n  git:\n    remotes: [\"https://github.com/a/*\"]\n    push: {allow_refs: [\"heads/agent/*\"]}\n",
     "policy.yaml:4:25: credentials.git.push.allow_refs[0]: must be a full ref name starting with \"refs/\", e.g. \"refs/heads/agent/*\" (got \"heads/agent/*\")"},
    {"GitRefWhitespace", "credentials:\n  git:\n    remotes: [\"https://github.com/a/*\"]\n    push: {allow_refs: [\"refs/heads/a b\"]}\n",
     "policy.yaml:4:25: credentials.git.push.allow_refs[0]: contains whitespace or a control character (\"refs/heads/a b\")"},
    {"GitRefQuestionMark", "credentials:\n  git:\n    remotes: [\"https://github.com/a/*\"]\n    push: {allow_refs: [\"refs/heads/v?\"]}\n",
     "policy.yaml:4:25: credentials.git.push.allow_refs[0]: \"*\" is the only glob character (got \"refs/heads/v?\")"},
    {"GitRefDotDot", "credentials:\n  git:\n    remotes: [\"https://github.com/a/*\"]\n    push: {allow_refs: [\"refs/heads/../x\"]}\n",
     "policy.yaml:4:25: credentials.git.push.allow_refs[0]: not a git ref name: \"..\", \"//\", \"@{\" and a trailing \"/\" are refused (\"refs/heads/../x\")"},
    {"GitRefColon", "credentials:\n  git:\n    remotes: [\"https://github.com/a/*\"]\n    push: {allow_refs: [\"refs/heads/a:refs/heads/b\"]}\n",
     "policy.yaml:4:25: credentials.git.push.allow_refs[0]: ':' is not allowed in a git ref name (\"refs/heads/a:refs/heads/b\")"},
    {"GitRefPartialDoubleStar", "credentials:\n  git:\n    remotes: [\"https://github.com/a/*\"]\n    push: {allow_refs: [\"refs/heads/a**\"]}\n",
     "policy.yaml:4:25: credentials.git.push.allow_refs[0]: \"**\" must be a whole segment, as in \"refs/heads/agent/**\" (got \"refs/heads/a**\")"},
    {"GitRemoteDefaultPortDuplicate", "credentials:\n  git:\n    remotes: [\"https://github.com/a/*\", \"https://github.com:443/a/*\"]\n",
     "policy.yaml:3:41: credentials.git.remotes[1]: duplicate remote \"https://github.com/a/*\""},
    {"GitRefsEmpty", "credentials:\n  git:\n    remotes: [\"https://github.com/a/*\"]\n    push: {allow_refs: []}\n",
     "policy.yaml:4:24: credentials.git.push.allow_refs: empty list (to allow pushing any ref, leave allow_refs out)"},
    {"GitRefDuplicate", "credentials:\n  git:\n    remotes: [\"https://github.com/a/*\"]\n    push: {allow_refs: [refs/heads/a, refs/heads/a]}\n",
     "policy.yaml:4:39: credentials.git.push.allow_refs[1]: duplicate ref \"refs/heads/a\""},
    {"SecretsNotAMap", "credentials:\n  secrets: [gh]\n",
     "policy.yaml:2:12: credentials.secrets: expected a map, got a list"},
    {"SecretNameStartsWithDigit", "credentials:\n  secrets:\n    1gh: {from: {env: GH}, hosts: [github.com]}\n",
     "policy.yaml:3:5: credentials.secrets: invalid secret name \"1gh\" (expected [A-Za-z_][A-Za-z0-9_-]{0,63})"},
    {"SecretNameWithDot", "credentials:\n  secrets:\n    g.h: {from: {env: GH}, hosts: [github.com]}\n",
     "policy.yaml:3:5: credentials.secrets: invalid secret name \"g.h\" (expected [A-Za-z_][A-Za-z0-9_-]{0,63})"},
    {"SecretNameTooLong", "credentials:\n  secrets:\n    aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa: {from: {env: GH}, hosts: [github.com]}\n",
     "policy.yaml:3:5: credentials.secrets: invalid secret name \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\" (expected [A-Za-z_][A-Za-z0-9_-]{0,63})"},
    {"SecretNotAMap", "credentials:\n  secrets:\n    gh: GH_TOKEN\n",
     "policy.yaml:3:9: credentials.secrets.gh: expected a map, got \"GH_TOKEN\""},
    {"SecretUnknownKey", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], value: abc}\n",
     "policy.yaml:3:48: credentials.secrets.gh.value: unknown key (expected one of: from, hosts, inject, placeholder_env)"},
    {"SecretWithoutFrom", "credentials:\n  secrets:\n    gh: {hosts: [github.com]}\n",
     "policy.yaml:3:5: credentials.secrets.gh: missing key \"from\""},
    {"SecretWithoutHosts", "credentials:\n  secrets:\n    gh:\n      from: {env: GH}\n",
     "policy.yaml:3:5: credentials.secrets.gh: missing key \"hosts\" (the hosts the secret is sent to; only a "
     "secret that a tools.upstream entry uses may leave it out)"},
    {"SecretFromEmpty", "credentials:\n  secrets:\n    gh: {from: {}, hosts: [github.com]}\n",
     "policy.yaml:3:16: credentials.secrets.gh.from: expected one of env, file, command"},
    {"SecretFromTwoSources", "credentials:\n  secrets:\n    gh: {from: {env: GH, file: /run/gh}, hosts: [github.com]}\n",
     "policy.yaml:3:26: credentials.secrets.gh.from.file: give only one of env, file, command"},
    {"SecretFromValue", "credentials:\n  secrets:\n    gh: {from: {value: hunter2}, hosts: [github.com]}\n",
     "policy.yaml:3:17: credentials.secrets.gh.from.value: unknown key (expected one of: env, file, command)"},
    {"SecretFromScalar", "credentials:\n  secrets:\n    gh: {from: GH_TOKEN, hosts: [github.com]}\n",
     "policy.yaml:3:16: credentials.secrets.gh.from: expected a map, got \"GH_TOKEN\""},
    {"SecretFromBadEnvName", "credentials:\n  secrets:\n    gh: {from: {env: GH-TOKEN}, hosts: [github.com]}\n",
     "policy.yaml:3:22: credentials.secrets.gh.from.env: invalid variable name \"GH-TOKEN\" (expected [A-Za-z_][A-Za-z0-9_]*)"},
    {"SecretFromRelativeFile", "credentials:\n  secrets:\n    gh: {from: {file: tokens/gh}, hosts: [github.com]}\n",
     "policy.yaml:3:23: credentials.secrets.gh.from.file: must be an absolute path or start with ~/ (\"tokens/gh\")"},
    {"SecretFromRootFile", "credentials:\n  secrets:\n    gh: {from: {file: /}, hosts: [github.com]}\n",
     "policy.yaml:3:23: credentials.secrets.gh.from.file: must name a file, not a directory (\"/\")"},
    {"SecretFromHomeDir", "credentials:\n  secrets:\n    gh: {from: {file: \"~/\"}, hosts: [github.com]}\n",
     "policy.yaml:3:23: credentials.secrets.gh.from.file: must name a file, not a directory (\"~/\")"},
    {"SecretFromFileGlob", "credentials:\n  secrets:\n    gh: {from: {file: \"/run/*.tok\"}, hosts: [github.com]}\n",
     "policy.yaml:3:23: credentials.secrets.gh.from.file: globs are not allowed here (\"/run/*.tok\")"},
    {"SecretFromTildeUser", "credentials:\n  secrets:\n    gh: {from: {file: \"~bob/tok\"}, hosts: [github.com]}\n",
     "policy.yaml:3:23: credentials.secrets.gh.from.file: only ~ and ~/... are supported, not ~user (\"~bob/tok\")"},
    {"SecretFromCommandEmpty", "credentials:\n  secrets:\n    gh: {from: {command: []}, hosts: [github.com]}\n",
     "policy.yaml:3:26: credentials.secrets.gh.from.command: empty list (expected the program and its arguments)"},
    {"SecretFromCommandScalar", "credentials:\n  secrets:\n    gh: {from: {command: \"pass show gh\"}, hosts: [github.com]}\n",
     "policy.yaml:3:26: credentials.secrets.gh.from.command: expected a list, got \"pass show gh\""},
    {"SecretFromCommandEmptyProgram", "credentials:\n  secrets:\n    gh: {from: {command: [\"\", x]}, hosts: [github.com]}\n",
     "policy.yaml:3:27: credentials.secrets.gh.from.command[0]: empty program name"},
    {"SecretFromCommandNul", "credentials:\n  secrets:\n    gh: {from: {command: [pass, \"a\\0b\"]}, hosts: [github.com]}\n",
     "policy.yaml:3:33: credentials.secrets.gh.from.command[1]: contains a NUL character"},
    {"SecretFromCommandNested", "credentials:\n  secrets:\n    gh: {from: {command: [pass, [x]]}, hosts: [github.com]}\n",
     "policy.yaml:3:33: credentials.secrets.gh.from.command[1]: expected a string, got a list"},
    {"SecretHostsEmpty", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: []}\n",
     "policy.yaml:3:34: credentials.secrets.gh.hosts: empty list (the hosts the secret is sent to)"},
    {"SecretHostsScalar", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: github.com}\n",
     "policy.yaml:3:34: credentials.secrets.gh.hosts: expected a list, got \"github.com\""},
    {"SecretHostWithPort", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [\"github.com:443\"]}\n",
     "policy.yaml:3:35: credentials.secrets.gh.hosts[0]: no port here (\"github.com:443\")"},
    {"SecretHostIpv4", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [140.82.112.3]}\n",
     "policy.yaml:3:35: credentials.secrets.gh.hosts[0]: \"140.82.112.3\" is, or reads as, an IP address: a host name is required here"},
    {"SecretHostNumeric", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [\"example.123\"]}\n",
     "policy.yaml:3:35: credentials.secrets.gh.hosts[0]: \"example.123\" is, or reads as, an IP address: a host name is required here"},
    {"SecretHostIpv6", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [\"::1\"]}\n",
     "policy.yaml:3:35: credentials.secrets.gh.hosts[0]: \"::1\" is an IP address: a host name is required here"},
    {"SecretHostBracketed", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [\"[::1]\"]}\n",
     "policy.yaml:3:35: credentials.secrets.gh.hosts[0]: \"[::1]\" is an IP address: a host name is required here"},
    {"SecretHostCidr", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [10.0.0.0/8]}\n",
     "policy.yaml:3:35: credentials.secrets.gh.hosts[0]: \"10.0.0.0/8\" is not a host name"},
    {"SecretHostStar", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [\"*\"]}\n",
     "policy.yaml:3:35: credentials.secrets.gh.hosts[0]: \"*\" would match every host"},
    {"SecretHostTooBroad", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [\"*.com\"]}\n",
     "policy.yaml:3:35: credentials.secrets.gh.hosts[0]: \"*.com\" is too broad (a wildcard needs at least two labels, e.g. \"*.example.com\")"},
    {"SecretHostInnerStar", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [\"api*.github.com\"]}\n",
     "policy.yaml:3:35: credentials.secrets.gh.hosts[0]: \"*\" may only stand for whole leading labels, as in \"*.example.com\" (got \"api*.github.com\")"},
    {"SecretHostUrl", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [\"https://github.com\"]}\n",
     "policy.yaml:3:35: credentials.secrets.gh.hosts[0]: a host name, not a URL (\"https://github.com\")"},
    {"SecretHostNotAscii", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [\"bücher.example\"]}\n",
     "policy.yaml:3:35: credentials.secrets.gh.hosts[0]: \"bücher.example\" is not ASCII: write an internationalised name in its A-label form (xn--...)"},
    {"SecretHostEmptyLabel", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [\"github..com\"]}\n",
     "policy.yaml:3:35: credentials.secrets.gh.hosts[0]: empty label in \"github..com\""},
    {"SecretHostDashLabel", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [\"-github.com\"]}\n",
     "policy.yaml:3:35: credentials.secrets.gh.hosts[0]: label starts or ends with '-' in \"-github.com\""},
    {"SecretHostBadCharacter", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [\"git!hub.com\"]}\n",
     "policy.yaml:3:35: credentials.secrets.gh.hosts[0]: character '!' is not allowed in a host name (\"git!hub.com\")"},
    {"SecretHostEmpty", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [\"\"]}\n",
     "policy.yaml:3:35: credentials.secrets.gh.hosts[0]: empty host name"},
    {"SecretHostWhitespace", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [\"git hub.com\"]}\n",
     "policy.yaml:3:35: credentials.secrets.gh.hosts[0]: contains whitespace or a control character"},
    {"SecretHostDuplicate", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com, GitHub.com.]}\n",
     "policy.yaml:3:47: credentials.secrets.gh.hosts[1]: duplicate host \"github.com\""},
    {"InjectUnknownWord", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: bearer}\n",
     "policy.yaml:3:56: credentials.secrets.gh.inject: unknown value \"bearer\" (expected basic, placeholder, {header: NAME, format: \"... {} ...\"} or {basic: {username: NAME}})"},
    {"InjectList", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: [basic]}\n",
     "policy.yaml:3:56: credentials.secrets.gh.inject: expected basic, placeholder, {header: NAME, format: \"... {} ...\"} or {basic: {username: NAME}}, got a list"},
    {"InjectEmptyMap", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: {}}\n",
     "policy.yaml:3:56: credentials.secrets.gh.inject: empty map (expected basic, placeholder, {header: NAME, format: \"... {} ...\"} or {basic: {username: NAME}})"},
    {"InjectUnknownKey", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: {header: X, prefix: Bearer}}\n",
     "policy.yaml:3:68: credentials.secrets.gh.inject.prefix: unknown key (expected one of: header, format, basic)"},
    {"InjectHeaderWithSpace", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: {header: \"X Token\"}}\n",
     "policy.yaml:3:65: credentials.secrets.gh.inject.header: not an HTTP header name (RFC 9110 token): \"X Token\""},
    {"InjectHeaderWithColon", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: {header: \"Authorization:\"}}\n",
     "policy.yaml:3:65: credentials.secrets.gh.inject.header: not an HTTP header name (RFC 9110 token): \"Authorization:\""},
    {"InjectHeaderHost", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: {header: host}}\n",
     "policy.yaml:3:65: credentials.secrets.gh.inject.header: \"host\" frames or routes the request; it cannot carry a secret"},
    {"InjectHeaderContentLength", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: {header: Content-Length}}\n",
     "policy.yaml:3:65: credentials.secrets.gh.inject.header: \"Content-Length\" frames or routes the request; it cannot carry a secret"},
    {"InjectFormatWithoutBraces", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: {header: Authorization, format: Bearer}}\n",
     "policy.yaml:3:88: credentials.secrets.gh.inject.format: must hold \"{}\" (where the secret goes) exactly once (got \"Bearer\")"},
    {"InjectFormatTwice", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: {format: \"{}{}\"}}\n",
     "policy.yaml:3:65: credentials.secrets.gh.inject.format: must hold \"{}\" (where the secret goes) exactly once (got \"{}{}\")"},
    {"InjectFormatCrLf", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: {format: \"Bearer {}\\r\\nX-Evil: 1\"}}\n",
     "policy.yaml:3:65: credentials.secrets.gh.inject.format: contains a control character (CR, LF, NUL, tab, ...)"},
    {"InjectFormatNul", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: {format: \"{}\\0\"}}\n",
     "policy.yaml:3:65: credentials.secrets.gh.inject.format: contains a control character (CR, LF, NUL, tab, ...)"},
    {"InjectBasicAndHeader", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: {header: Authorization, basic: {}}}\n",
     "policy.yaml:3:80: credentials.secrets.gh.inject.basic: basic and header/format are two ways to inject; give one"},
    {"InjectHeaderAfterBasic", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: {basic: {}, format: \"{}\"}}\n",
     "policy.yaml:3:68: credentials.secrets.gh.inject.format: basic and header/format are two ways to inject; give one"},
    {"InjectBasicUnknownKey", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: {basic: {user: x}}}\n",
     "policy.yaml:3:65: credentials.secrets.gh.inject.basic.user: unknown key (expected one of: username)"},
    {"InjectBasicScalar", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: {basic: x}}\n",
     "policy.yaml:3:64: credentials.secrets.gh.inject.basic: expected a map, got \"x\""},
    {"InjectBasicUsernameColon", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: {basic: {username: \"a:b\"}}}\n",
     "policy.yaml:3:75: credentials.secrets.gh.inject.basic.username: must not contain \":\" (it ends the user name in user:password)"},
    {"InjectBasicUsernameEmpty", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: {basic: {username: \"\"}}}\n",
     "policy.yaml:3:75: credentials.secrets.gh.inject.basic.username: must not be empty"},
    {"InjectBasicUsernameNewline", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], inject: {basic: {username: \"a\\nb\"}}}\n",
     "policy.yaml:3:75: credentials.secrets.gh.inject.basic.username: contains a control character"},
    {"PlaceholderWithoutEnv", "credentials:\n  secrets:\n    npm:\n      from: {env: NPM}\n      hosts: [registry.npmjs.org]\n      inject: placeholder\n",
     "policy.yaml:6:15: credentials.secrets.npm.inject: placeholder needs placeholder_env: the variable in which the sandbox finds the placeholder the proxy replaces"},
    {"PlaceholderEnvBadName", "credentials:\n  secrets:\n    gh: {from: {env: GH}, hosts: [github.com], placeholder_env: 1X}\n",
     "policy.yaml:3:65: credentials.secrets.gh.placeholder_env: invalid variable name \"1X\" (expected [A-Za-z_][A-Za-z0-9_]*)"},
    {"PlaceholderEnvTwice", "credentials:\n  secrets:\n    a: {from: {env: A}, hosts: [a.example.com], placeholder_env: TOKEN}\n    b: {from: {env: B}, hosts: [b.example.com], placeholder_env: TOKEN}\n",
     "policy.yaml:4:66: credentials.secrets.b.placeholder_env: TOKEN is already the placeholder_env of credentials.secrets.a"},
    {"SourceInEnvPass", "env:\n  pass: [PATH, GH_TOKEN]\ncredentials:\n  secrets:\n    github: {from: {env: GH_TOKEN}, hosts: [github.com]}\n",
     "policy.yaml:2:16: env.pass[1]: GH_TOKEN is the source of credentials.secrets.github; with credentials.in_sandbox: none it never enters the sandbox"},
    {"SourceInEnvPassBeforeOrAfter", "credentials:\n  in_sandbox: none\n  secrets:\n    github: {from: {env: GH_TOKEN}, hosts: [github.com]}\nenv: {pass: [GH_TOKEN]}\n",
     "policy.yaml:5:14: env.pass[0]: GH_TOKEN is the source of credentials.secrets.github; with credentials.in_sandbox: none it never enters the sandbox"},
    {"SourceInEnvSet", "env:\n  set:\n    CI: 1\n    GH_TOKEN: dummy\ncredentials:\n  secrets:\n    github: {from: {env: GH_TOKEN}, hosts: [github.com]}\n",
     "policy.yaml:4:5: env.set.GH_TOKEN: GH_TOKEN is the source of credentials.secrets.github; with credentials.in_sandbox: none it never enters the sandbox"},
    {"SourceInPresetEnvPass", "credentials:\n  secrets:\n    tz: {from: {env: TZ}, hosts: [time.example.com]}\n",
     "policy.yaml:3:22: credentials.secrets.tz.from.env: in the preset's env.pass: TZ is the source of credentials.secrets.tz; with credentials.in_sandbox: none it never enters the sandbox"},
    {"PlaceholderInEnvSet", "env: {set: {GITHUB_TOKEN: x}}\ncredentials:\n  secrets:\n    github: {from: {env: GH_TOKEN}, hosts: [github.com], placeholder_env: GITHUB_TOKEN}\n",
     "policy.yaml:1:13: env.set.GITHUB_TOKEN: GITHUB_TOKEN is credentials.secrets.github.placeholder_env: a value here would replace the placeholder"},
    {"PlaceholderInEnvPass", "env: {pass: [GITHUB_TOKEN]}\ncredentials:\n  secrets:\n    github: {from: {env: GH_TOKEN}, hosts: [github.com], placeholder_env: GITHUB_TOKEN}\n",
     "policy.yaml:1:14: env.pass[0]: GITHUB_TOKEN is credentials.secrets.github.placeholder_env: the sandbox gets the placeholder there, not the caller's value"},
    {"PlaceholderInPresetEnvPass", "credentials:\n  secrets:\n    github: {from: {env: GH_TOKEN}, hosts: [github.com], placeholder_env: TERM}\n",
     "policy.yaml:3:75: credentials.secrets.github.placeholder_env: in the preset's env.pass: TERM is credentials.secrets.github.placeholder_env: the sandbox gets the placeholder there, not the caller's value"},
    {"SecretsInDangerFullAccess", "mode: danger-full-access\ncredentials:\n  secrets:\n    github: {from: {env: GH_TOKEN}, hosts: [github.com]}\n",
     "policy.yaml:4:5: credentials.secrets: secrets are refused with mode: danger-full-access: the command runs on the host with the caller's environment, and nothing keeps a secret out of it"},
    {"HttpRulesNotAList", "network:\n  http_rules: {host: api.github.com}\n",
     "policy.yaml:2:15: network.http_rules: expected a list, got a map"},
    {"HttpRuleNotAMap", "network:\n  http_rules: [api.github.com]\n",
     "policy.yaml:2:16: network.http_rules[0]: expected a map, got \"api.github.com\""},
    {"HttpRuleUnknownKey", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET /\"], deny: []}\n",
     "policy.yaml:3:48: network.http_rules[0].deny: unknown key (expected one of: host, allow)"},
    {"HttpRuleWithoutHost", "network:\n  http_rules:\n    - allow: [\"GET /\"]\n",
     "policy.yaml:3:7: network.http_rules[0]: missing key \"host\""},
    {"HttpRuleWithoutAllow", "network:\n  http_rules:\n    - host: api.github.com\n",
     "policy.yaml:3:7: network.http_rules[0]: missing key \"allow\""},
    {"HttpRuleHostWithPort", "network:\n  http_rules:\n    - {host: \"api.github.com:443\", allow: [\"GET /\"]}\n",
     "policy.yaml:3:14: network.http_rules[0].host: no port here (\"api.github.com:443\")"},
    {"HttpRuleHostWildcard", "network:\n  http_rules:\n    - {host: \"*.github.com\", allow: [\"GET /\"]}\n",
     "policy.yaml:3:14: network.http_rules[0].host: no wildcard here: an exact host name (got \"*.github.com\")"},
    {"HttpRuleHostIp", "network:\n  http_rules:\n    - {host: 127.0.0.1, allow: [\"GET /\"]}\n",
     "policy.yaml:3:14: network.http_rules[0].host: \"127.0.0.1\" is, or reads as, an IP address: a host name is required here"},
    {"HttpRuleHostDuplicate", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET /\"]}\n    - {host: API.github.com., allow: [\"POST /\"]}\n",
     "policy.yaml:4:14: network.http_rules[1].host: duplicate host \"api.github.com\" (also in network.http_rules[0]): give each host one entry"},
    {"HttpRuleAllowEmpty", "network:\n  http_rules:\n    - {host: api.github.com, allow: []}\n",
     "policy.yaml:3:37: network.http_rules[0].allow: empty list (to refuse every request to the host, leave it out of network.allow)"},
    {"HttpRuleNoSpace", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: expected \"METHOD /path\", e.g. \"GET /repos/**\" (got \"GET\")"},
    {"HttpRulePathOnly", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"/repos/**\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: expected \"METHOD /path\", e.g. \"GET /repos/**\" (got \"/repos/**\")"},
    {"HttpRuleLowerCaseMethod", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"get /repos\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: the method must be upper case (got \"get\")"},
    {"HttpRulePartialStarMethod", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"P* /repos\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: \"*\" stands alone for any method (got \"P*\")"},
    {"HttpRuleBadMethodCharacter", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GE(T /repos\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: not an HTTP method: \"GE(T\""},
    {"HttpRuleRelativePath", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET repos/**\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: a path must start with \"/\" (got \"repos/**\")"},
    {"HttpRuleTwoSpaces", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET  /repos\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: a path must start with \"/\" (got \" /repos\")"},
    {"HttpRuleQuery", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET /search?q=x\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: no query (\"?\") here: a rule matches the path alone (\"/search?q=x\")"},
    {"HttpRuleFragment", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET /a#b\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: no fragment (\"#\") here: requests do not carry one (\"/a#b\")"},
    {"HttpRuleWhitespaceInPath", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET /a b\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: contains whitespace or a control character (\"/a b\")"},
    {"HttpRulePartialDoubleStar", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET /repos/**x\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: \"**\" must be a whole segment, as in \"/a/**\" (got \"/repos/**x\")"},
    {"HttpRuleDotDot", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET /repos/../admin\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: \".\" and \"..\" segments are not allowed (\"/repos/../admin\")"},
    {"HttpRuleNotAscii", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET /bücher\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: contains a character that is not ASCII: write it percent-encoded (\"/bücher\")"},
    {"HttpRuleBackslash", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET /a\\\\b\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: no backslash (some servers read it as \"/\") in \"/a\\b\""},
    {"HttpRuleEmptySegment", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET /a//b\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: empty segment (\"//\") in \"/a//b\""},
    {"HttpRuleBadEscape", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET /%zz\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: bad percent-encoding in \"/%zz\""},
    {"HttpRuleEncodedSlash", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET /a%2Fb\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: no encoded slash or backslash (%2F, %5C) in \"/a%2Fb\""},
    {"HttpRuleEncodedControl", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET /a%0a\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: no encoded control character in \"/a%0a\""},
    {"HttpRuleEncodedDotDot", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET /a/%2e%2E/b\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: \".\" and \"..\" segments are not allowed (\"/a/%2e%2E/b\")"},
    {"HttpRuleDotDotWithParams", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET /a/..;x/b\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: \".\" and \"..\" segments are not allowed (\"/a/..;x/b\")"},
    {"HttpRuleOnlyParams", "network:\n  http_rules:\n    - {host: api.github.com, allow: [\"GET /a/;x/b\"]}\n",
     "policy.yaml:3:38: network.http_rules[0].allow[0]: a segment of only ;params in \"/a/;x/b\""},
    {"HttpRuleDuplicate", "network:\n  http_rules:\n    - host: api.github.com\n      allow:\n        - GET /\n        - GET /\n",
     "policy.yaml:6:11: network.http_rules[0].allow[1]: duplicate rule \"GET /\""},
    {"ReadWriteRoot", "filesystem:\n  read_write: [/]\n",
     "policy.yaml:2:16: filesystem.read_write[0]: \"/\" would make the host's whole root writable from the "
     "sandbox; name the directories the command writes"},
    {"ReadWriteWholeHome", "filesystem:\n  read_write: [\"~\"]\n",
     "policy.yaml:2:16: filesystem.read_write[0]: \"~\" would make the caller's whole home writable from the "
     "sandbox; name the directories the command writes"},
    {"ReadWriteGlob", "filesystem:\n  read_write: [/srv/*]\n",
     "policy.yaml:2:16: filesystem.read_write[0]: globs are not allowed here (\"/srv/*\")"},
    {"CacheBadName", "filesystem:\n  caches:\n    ../x: ~/.x\n",
     "policy.yaml:3:5: filesystem.caches.../x: invalid cache name \"../x\" (expected [a-z0-9][a-z0-9_.-]*, at "
     "most 64 characters)"},
    {"CacheLeadingDot", "filesystem:\n  caches:\n    .npm: ~/.npm\n",
     "policy.yaml:3:5: filesystem.caches..npm: invalid cache name \".npm\" (expected [a-z0-9][a-z0-9_.-]*, at "
     "most 64 characters)"},
    {"CacheRelativePath", "filesystem:\n  caches:\n    npm: .npm\n",
     "policy.yaml:3:10: filesystem.caches.npm: must be an absolute path or start with ~/ (\".npm\")"},
    {"CacheUnknownKey", "filesystem:\n  caches:\n    npm: {path: ~/.npm, hots: ~/.npm}\n",
     "policy.yaml:3:25: filesystem.caches.npm.hots: unknown key (expected one of: path, host)"},
    {"CacheWithoutPath", "filesystem:\n  caches:\n    npm: {host: ~/.npm}\n",
     "policy.yaml:3:5: filesystem.caches.npm: missing key \"path\""},
    {"CacheSamePath", "filesystem:\n  caches:\n    a: ~/.npm\n    b: ~/.npm/\n",
     "policy.yaml:4:8: filesystem.caches.b: the same path as filesystem.caches.a (~/.npm)"},
    {"HomeImportAbsolute", "home:\n  import: [/etc/passwd]\n",
     "policy.yaml:2:12: home.import[0]: must be relative to the home directory, not absolute (\"/etc/passwd\")"},
    {"HomeImportDotDot", "home:\n  import: [../other/.gitconfig]\n",
     "policy.yaml:2:12: home.import[0]: \"..\" components are not allowed (\"../other/.gitconfig\")"},
    {"HomeImportTilde", "home:\n  import: [~/.gitconfig]\n",
     "policy.yaml:2:12: home.import[0]: relative to the home directory already: write \".gitconfig\" without ~/"},
    {"HomeImportDot", "home:\n  import: [.]\n",
     "policy.yaml:2:12: home.import[0]: \".\" components are not allowed (\".\"): name a file or directory in the "
     "home"},
    {"HomeUnknownKey", "home:\n  imports: [.gitconfig]\n",
     "policy.yaml:2:3: home.imports: unknown key (expected one of: import)"},
    {"MaxGrantNeverGrantedSyscall", "on_violation:\n  max_grant:\n    syscalls: [ptrace, init_module]\n",
     "policy.yaml:3:24: on_violation.max_grant.syscalls[1]: init_module is never granted: kernel modules change "
     "the host's kernel"},
    {"MaxGrantSyscallThatLeavesTheNamespaces", "on_violation:\n  max_grant:\n    syscalls: [setns]\n",
     "policy.yaml:3:16: on_violation.max_grant.syscalls[0]: setns is never granted: new namespaces would leave "
     "the sandbox's own"},
    {"MaxGrantSyscallNotDenied", "on_violation:\n  max_grant:\n    syscalls: [read]\n",
     "policy.yaml:3:16: on_violation.max_grant.syscalls[0]: read is not a syscall the seccomp layer denies "
     "outright, so there is nothing to grant (grantable: ptrace, process_vm_readv, process_vm_writev)"},
    {"MaxGrantDuplicateSyscall", "on_violation:\n  max_grant:\n    syscalls: [ptrace, ptrace]\n",
     "policy.yaml:3:24: on_violation.max_grant.syscalls[1]: duplicate syscall \"ptrace\""},
    {"MaxGrantReadOfSsh", "on_violation:\n  max_grant:\n    filesystem_read: [~/src, ~/.ssh]\n",
     "policy.yaml:3:30: on_violation.max_grant.filesystem_read[1]: \"~/.ssh\" is never granted: the built-in "
     "credential path \"~/.ssh\" covers it"},
    {"MaxGrantWriteUnderAws", "on_violation:\n  max_grant:\n    filesystem_write: [~/.aws/cli]\n",
     "policy.yaml:3:24: on_violation.max_grant.filesystem_write[0]: \"~/.aws/cli\" is never granted: the built-in "
     "credential path \"~/.aws\" covers it"},
    {"MaxGrantDotEnv", "on_violation:\n  max_grant:\n    filesystem_read: [/srv/app/.env]\n",
     "policy.yaml:3:23: on_violation.max_grant.filesystem_read[0]: \"/srv/app/.env\" is never granted: the "
     "built-in credential path \"**/.env\" hides it"},
    {"MaxGrantUnderThePolicysDeny",
     "on_violation:\n  max_grant:\n    filesystem_read: [/srv/secrets/db]\nfilesystem:\n  deny: [/srv/secrets]\n",
     "policy.yaml:3:23: on_violation.max_grant.filesystem_read[0]: \"/srv/secrets/db\" is never granted: "
     "filesystem.deny \"/srv/secrets\" covers it"},
    {"MaxGrantMemoryZero", "on_violation:\n  max_grant:\n    memory_gib: 0\n",
     "policy.yaml:3:17: on_violation.max_grant.memory_gib: must be > 0"},
    {"MaxGrantUnknownKey", "on_violation:\n  max_grant: {disk_gib: 4}\n",
     "policy.yaml:2:15: on_violation.max_grant.disk_gib: unknown key (expected one of: network, filesystem_read, "
     "filesystem_write, syscalls, memory_gib)"},
    {"MaxGrantNotAMap", "on_violation:\n  max_grant: all\n",
     "policy.yaml:2:14: on_violation.max_grant: expected a map, got \"all\""},
    {"EnvPassBadPattern", "env:\n  pass: [\"NPM-*\"]\n",
     "policy.yaml:2:10: env.pass[0]: invalid variable pattern \"NPM-*\" (expected [A-Za-z_][A-Za-z0-9_]* with * "
     "as the only wildcard)"},
};

INSTANTIATE_TEST_SUITE_P(Errors, BadPolicyTest, ::testing::ValuesIn(kBadCases),
                         [](const auto& info) { return std::string(info.param.name); });

// ---- Files -------------------------------------------------------------------

TEST(LoadPolicyFileTest, MissingFileNamesPathAndErrno) {
  Result<Policy> r = LoadPolicyFile("/nonexistent/agentbox/policy.yaml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().stage(), "policy");
  EXPECT_EQ(r.status().syscall(), "open");
  EXPECT_EQ(r.status().err(), ENOENT);
  EXPECT_EQ(r.status().message(),
            "open(/nonexistent/agentbox/policy.yaml): No such file or directory");
}

TEST(LoadPolicyFileTest, DirectoryIsAReadError) {
  Result<Policy> r = LoadPolicyFile(kFixtures);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().syscall(), "read");
  EXPECT_EQ(r.status().err(), EISDIR);
}

}  // namespace
}  // namespace agentbox
