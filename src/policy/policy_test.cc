#include "agentbox/policy.h"

#include <gtest/gtest.h>

#include <string>

#include "policy/sha256.h"

namespace agentbox {
namespace {

const std::string kFixtures = AGENTBOX_FIXTURES;

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
  EXPECT_EQ(p.env.pass,
            (std::vector<std::string>{"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ"}));
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

  o.mode = Mode::kDangerFullAccess;
  Result<Policy> danger = ApplyOverrides(*file, o, /*from_file=*/true);
  ASSERT_TRUE(danger.ok());
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
