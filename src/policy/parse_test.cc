#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "agentbox/policy.h"
#include "policy/sha256.h"

namespace agentbox {
namespace {

const std::string kFixtures = AGENTBOX_FIXTURES;

Policy MustParse(const std::string& text) {
  Result<Policy> r = ParsePolicy(text, "policy.yaml");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : Policy{};
}

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

TEST(ParsePolicyTest, EnvSetKeepsFileOrderAndTextAsWritten) {
  Policy p =
      MustParse("env:\n  pass: [HOME]\n  set: {ZED: 1, ALPHA: true, MID: 0.50, T: ~, E: \"\"}\n");
  EXPECT_EQ(p.env.pass, std::vector<std::string>{"HOME"});
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"ZED", "1"}, {"ALPHA", "true"}, {"MID", "0.50"}, {"T", "~"}, {"E", ""}};
  EXPECT_EQ(p.env.set, expected);
}

TEST(ParsePolicyTest, EveryIsolationParses) {
  // Refusing what this host cannot provide is the runtime's job.
  for (const char* name : {"host", "os", "container", "microvm", "remote"}) {
    Policy p = MustParse(std::string("sandbox: {isolation: ") + name + ", require: partial}\n");
    EXPECT_STREQ(ToString(p.sandbox.isolation), name);
    EXPECT_EQ(p.sandbox.require, Requirement::kPartial);
  }
}

TEST(ParsePolicyTest, TrailingEmptyDocumentIsFine) {
  EXPECT_EQ(MustParse("version: 1\n---\n").version, 1);
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

const std::string kTopKeys =
    "(expected one of: version, mode, sandbox, filesystem, network, credentials, resources, env, "
    "on_violation)";
const std::string kEnvHint = "(expected [A-Za-z_][A-Za-z0-9_]*)";

const BadCase kBadCases[] = {
    {"UnknownTopLevelKey", "version: 1\nnetwrk: {}\n",
     "policy.yaml:2:1: netwrk: unknown key " + kTopKeys},
    {"UnknownNestedKey", "network:\n  alow: [example.com]\n",
     "policy.yaml:2:3: network.alow: unknown key (expected one of: default, egress_proxy, allow, "
     "deny, on_unknown_domain, tls_sni_check, tls_sni_ports)"},
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
     "policy.yaml:1:27: credentials.in_sandbox: unknown value \"env\" (expected one of: none)"},
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
