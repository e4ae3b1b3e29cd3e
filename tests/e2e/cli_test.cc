// The command line (DESIGN §2): wrap, check, policy validate/explain, and
// how `run` handles the command's stdio.
#include <gtest/gtest.h>

#include <memory>
#include <regex>
#include <string>

#include "harness.h"

namespace agentbox::e2e {
namespace {

const std::string kFixtures = FixturesDir();

RunResult Agentbox(const Sandbox& sb, const std::vector<std::string>& args) {
  return RunCommand(sb.AgentboxCommand(args));
}

// ------------------------------------------------------------ wrap

struct Wrapped {
  nlohmann::json j;
  Command command;  // the argv and env a harness would spawn
};

Wrapped Wrap(const Sandbox& sb, const std::vector<std::string>& cmd,
             const std::vector<std::string>& options = {}) {
  std::vector<std::string> args = {"wrap"};
  args.insert(args.end(), options.begin(), options.end());
  args.push_back("--");
  args.insert(args.end(), cmd.begin(), cmd.end());
  RunResult r = Agentbox(sb, args);
  Wrapped w;
  EXPECT_EQ(r.status, 0) << r.Describe();
  w.j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(w.j.is_discarded()) << "wrap must print JSON\n" << r.Describe();
  if (w.j.is_discarded() || !w.j["argv"].is_array()) return w;
  w.command.argv = w.j["argv"].get<std::vector<std::string>>();
  w.command.cwd = sb.ws();
  w.command.env = sb.Env({"SECRET_TOKEN=wrapped-secret"});
  if (w.j["env"].is_object()) {
    for (auto it = w.j["env"].begin(); it != w.j["env"].end(); ++it) {
      w.command.env.push_back(it.key() + "=" + it.value().get<std::string>());
    }
  }
  return w;
}

TEST(Wrap, PrintsTheConfinedCommand) {
  Sandbox sb;
  Wrapped w = Wrap(sb, {"sh", "-c", "exit 3"});
  ASSERT_FALSE(w.j.is_discarded());
  for (const char* key : {"argv", "env", "enforcement", "denial_signatures", "runner_failure_rules"}) {
    EXPECT_TRUE(w.j.contains(key)) << key << "\n" << w.j.dump(2);
  }
  ASSERT_TRUE(w.j["env"].contains("AGENTBOX_PLAN")) << w.j.dump(2);
  EXPECT_EQ(w.j["enforcement"]["level"], "full") << w.j.dump(2);
  ASSERT_FALSE(w.j["runner_failure_rules"].empty());
  ASSERT_FALSE(w.j["denial_signatures"].empty());
  // Every signature must be a valid ECMAScript regex.
  for (const char* list : {"denial_signatures", "runner_failure_rules"}) {
    for (const auto& s : w.j[list]) {
      EXPECT_NO_THROW(std::regex(s["pattern"].get<std::string>(), std::regex::ECMAScript))
          << list << ": " << s["pattern"];
    }
  }
  auto argv = w.j["argv"].get<std::vector<std::string>>();
  ASSERT_GE(argv.size(), 3u);
  EXPECT_EQ(std::vector<std::string>(argv.end() - 3, argv.end()),
            (std::vector<std::string>{"sh", "-c", "exit 3"}));
}

TEST(Wrap, SpawningTheWrappedArgvRunsConfined) {
  Sandbox sb;
  Wrapped w = Wrap(sb, {"sh", "-c", "cat /proc/1/comm; echo \"token=$SECRET_TOKEN\"; cat ~/.ssh/id_rsa; exit 3"});
  ASSERT_FALSE(w.command.argv.empty());
  RunResult r = RunCommand(w.command);
  EXPECT_EQ(r.status, 3) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "agentbox-init\n")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "token=\n")) << r.Describe();
  EXPECT_FALSE(Contains(r.out + r.err, "wrapped-secret")) << r.Describe();
  EXPECT_FALSE(Contains(r.out + r.err, sb.ssh_secret())) << r.Describe();
  // A denial signature recognises the refused read in stderr.
  bool matched = false;
  for (const auto& line : Lines(r.err)) {
    for (const auto& s : w.j["denial_signatures"]) {
      matched |= std::regex_search(line, std::regex(s["pattern"].get<std::string>(), std::regex::ECMAScript));
    }
  }
  EXPECT_TRUE(matched) << r.Describe();
}

TEST(Wrap, VanishedWorkspaceFailsWith125AndARunnerFailureLine) {
  Sandbox sb;
  auto workspace = std::make_unique<TempDir>("agentbox-e2e-vanishing-");
  Wrapped w = Wrap(sb, {"sh", "-c", "echo ran"}, {"--workspace", workspace->path()});
  ASSERT_FALSE(w.command.argv.empty());
  ASSERT_FALSE(w.j["runner_failure_rules"].empty());
  workspace.reset();  // the plan now names a workspace that no longer exists
  RunResult r = RunCommand(w.command);
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ran")) << r.Describe();
  std::regex rule(w.j["runner_failure_rules"][0]["pattern"].get<std::string>(), std::regex::ECMAScript);
  bool matched = false;
  for (const auto& line : Lines(r.err)) matched |= std::regex_search(line, rule);
  EXPECT_TRUE(matched) << "no stderr line matches " << w.j["runner_failure_rules"][0]["pattern"] << "\n"
                       << r.Describe();
}

TEST(Wrap, CorruptPlanFailsWith125) {
  Sandbox sb;
  Wrapped w = Wrap(sb, {"sh", "-c", "echo ran"});
  ASSERT_FALSE(w.command.argv.empty());
  for (auto& e : w.command.env) {
    if (e.rfind("AGENTBOX_PLAN=", 0) == 0) e = "AGENTBOX_PLAN={\"confined\": false}";
  }
  RunResult r = RunCommand(w.command);
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ran")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "sandbox error")) << r.Describe();
}

TEST(Wrap, CommandFailureDoesNotMatchTheRunnerFailureRule) {
  Sandbox sb;
  Wrapped w = Wrap(sb, {"sh", "-c", "echo 'agentbox: sandbox error [0000] stage=mount: fake' >&2; exit 125"});
  ASSERT_FALSE(w.command.argv.empty());
  RunResult r = RunCommand(w.command);
  EXPECT_EQ(r.status, 125) << r.Describe();
  std::regex rule(w.j["runner_failure_rules"][0]["pattern"].get<std::string>(), std::regex::ECMAScript);
  for (const auto& line : Lines(r.err)) {
    EXPECT_FALSE(std::regex_search(line, rule)) << "a command can forge the runner-failure line: " << line;
  }
}

// ------------------------------------------------------------ check / policy

TEST(Check, TextNamesTheKernelFacilities) {
  Sandbox sb;
  RunResult r = Agentbox(sb, {"check"});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "user namespaces")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "landlock")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "filesystem")) << r.Describe();
}

TEST(Check, JsonDescribesHostAndEnforcement) {
  Sandbox sb;
  RunResult r = Agentbox(sb, {"check", "--json"});
  EXPECT_EQ(r.status, 0) << r.Describe();
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.Describe();
  EXPECT_EQ(j["host"]["user_namespaces"]["available"], true) << r.out;
  EXPECT_TRUE(j["host"].contains("landlock_abi")) << r.out;
  EXPECT_EQ(j["enforcement"]["level"], "full") << r.out;
  EXPECT_EQ(j["enforcement"]["backend"], "linux-namespaces") << r.out;
  // The doctor has nothing to say where every facility works.
  ASSERT_TRUE(j["diagnosis"].is_array()) << r.out;
  EXPECT_TRUE(j["diagnosis"].empty()) << r.out;
}

TEST(Check, ReportsAPolicyItCannotEnforce) {
  Sandbox sb;
  RunResult r = Agentbox(sb, {"check", "--json", "--policy", kFixtures + "/design_policy.yaml"});
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.Describe();
  const auto& e = j["enforcement"];
  bool resources_missing = false;
  // (disk_gib for the workspace depends on its filesystem, not on cgroups:
  // workspace_disk_test.cc covers it.)
  for (const auto& m : e["missing"]) {
    resources_missing |= m.value("facet", "") == "resources" && m.value("reason", "").rfind("disk_gib:", 0) != 0;
  }
  // The design policy limits cpu, memory and processes: this host can give
  // them only with those cgroup controllers (checked without agentbox).
  if (!CgroupsExpected({"cpu", "memory", "pids"})) {
    EXPECT_NE(e["level"], "full") << r.out;
    EXPECT_TRUE(resources_missing) << "the resources this host cannot limit are not named\n" << r.out;
  } else {
    EXPECT_FALSE(resources_missing) << "this host delegates cpu, memory and pids\n" << r.out;
  }
  // Whatever the host: the exit status and the missing list agree with the level.
  if (e["level"] == "full") {
    EXPECT_EQ(r.status, 0) << r.Describe();
    EXPECT_TRUE(e["missing"].empty()) << r.out;
  } else {
    EXPECT_NE(r.status, 0) << "check must not succeed for a policy this host cannot fully enforce\n"
                           << r.Describe();
    EXPECT_FALSE(e["missing"].empty()) << r.out;
  }
}

// An isolation this host does not offer: `check` fails and names the same
// reason `policy explain` gives (and `run` refuses with).
TEST(Check, NamesTheRefusalExplainGives) {
  Sandbox sb;
  for (const char* isolation : {"microvm", "container", "remote"}) {
    const std::string file = sb.scratch() + "/" + isolation + ".yaml";
    WriteFile(file, std::string("version: 1\nsandbox:\n  isolation: ") + isolation + "\n");
    RunResult e = Agentbox(sb, {"policy", "explain", "--json", "--policy", file});
    auto ej = nlohmann::json::parse(e.out, nullptr, false);
    ASSERT_FALSE(ej.is_discarded()) << e.Describe();
    // This version offers only `os`: the others are refused, never downgraded.
    EXPECT_EQ(ej["would_run"], false) << e.Describe();
    ASSERT_TRUE(ej["refusal"].is_string()) << e.Describe();
    const std::string refusal = ej["refusal"].get<std::string>();
    EXPECT_TRUE(Contains(refusal, std::string("sandbox.isolation: ") + isolation)) << refusal;

    RunResult t = Agentbox(sb, {"check", "--policy", file});
    EXPECT_EQ(t.status, 1) << t.Describe();
    EXPECT_TRUE(Contains(t.out + t.err, refusal)) << isolation << ": check does not say why\n" << t.Describe();
    RunResult j = Agentbox(sb, {"check", "--json", "--policy", file});
    EXPECT_EQ(j.status, 1) << j.Describe();
    auto jj = nlohmann::json::parse(j.out, nullptr, false);
    ASSERT_FALSE(jj.is_discarded()) << j.Describe();
    EXPECT_EQ(jj.value("refusal", ""), refusal) << j.Describe();
  }
}

TEST(Policy, ValidateAcceptsTheSeedPolicy) {
  Sandbox sb;
  RunResult r = Agentbox(sb, {"policy", "validate", kFixtures + "/seed_policy.yaml"});
  EXPECT_EQ(r.status, 0) << r.Describe();
  RunResult d = Agentbox(sb, {"policy", "validate", kFixtures + "/design_policy.yaml"});
  EXPECT_EQ(d.status, 0) << d.Describe();
}

TEST(Policy, ValidateReportsFileLineColumn) {
  Sandbox sb;
  const std::string file = sb.scratch() + "/bad.yaml";
  WriteFile(file, "version: 1\nmode: workspace-write\nnetwork:\n  default: sometimes\n");
  RunResult r = Agentbox(sb, {"policy", "validate", file});
  EXPECT_EQ(r.status, 1) << r.Describe();
  EXPECT_TRUE(std::regex_search(r.out + r.err, std::regex(std::regex_replace(file, std::regex("[.]"), "\\.") +
                                                          ":4:[0-9]+: ")))
      << r.Describe();

  WriteFile(file, "version: 1\nfilesystem:\n  read_only: [/usr]\n  unknown_key: 3\n");
  RunResult u = Agentbox(sb, {"policy", "validate", file});
  EXPECT_EQ(u.status, 1) << u.Describe();
  EXPECT_TRUE(Contains(u.out + u.err, file + ":4:")) << u.Describe();
  EXPECT_TRUE(Contains(u.out + u.err, "unknown_key")) << u.Describe();
}

// `read_only: ["/"]` is refused where the policy is read, with the key and
// its place, rather than validating and then failing every run.
TEST(Policy, ReadOnlyRootIsRejectedWithTheReason) {
  Sandbox sb;
  const std::string file = sb.scratch() + "/root.yaml";
  WriteFile(file, "version: 1\nfilesystem:\n  read_only: [\"/\"]\n");
  RunResult v = Agentbox(sb, {"policy", "validate", file});
  EXPECT_EQ(v.status, 1) << v.Describe();
  EXPECT_TRUE(Contains(v.out + v.err, file + ":3:15: filesystem.read_only[0]: \"/\" would bind the host's whole root"))
      << v.Describe();
  RunResult e = Agentbox(sb, {"policy", "explain", "--policy", file});
  EXPECT_NE(e.status, 0) << e.Describe();
  EXPECT_TRUE(Contains(e.out + e.err, file + ":3:15: filesystem.read_only[0]")) << e.Describe();
  RunResult r = sb.Sh("echo ran", {"--policy", file});
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ran")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, file + ":3:15: filesystem.read_only[0]")) << r.Describe();
}

TEST(Policy, ValidateRejectsBrokenYaml) {
  Sandbox sb;
  const std::string file = sb.scratch() + "/broken.yaml";
  WriteFile(file, "version: 1\nsandbox: [unclosed\n");
  RunResult r = Agentbox(sb, {"policy", "validate", file});
  EXPECT_EQ(r.status, 1) << r.Describe();
  EXPECT_TRUE(Contains(r.out + r.err, file + ":")) << r.Describe();
}

TEST(Policy, ExplainShowsThePlan) {
  Sandbox sb;
  RunResult r = Agentbox(sb, {"policy", "explain"});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "pivot_root")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "protect")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, ".git/hooks")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "/proc")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, sb.ws())) << "the workspace mount should be listed\n" << r.Describe();
}

TEST(Policy, ExplainSaysWhenRunWouldRefuse) {
  Sandbox sb;
  RunResult r = Agentbox(sb, {"policy", "explain", "--policy", kFixtures + "/seed_policy.yaml"});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "microvm")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "refuse")) << r.Describe();
}

// ------------------------------------------------------------ stdio of `run`

TEST(RunStdio, StdinReachesTheCommand) {
  Sandbox sb;
  Command c = sb.AgentboxCommand({"run", "--", "sh", "-c", "tr a-z A-Z"});
  c.stdin_data = "hello from stdin\n";
  RunResult r = RunCommand(c);
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(r.out, "HELLO FROM STDIN\n") << r.Describe();
}

TEST(RunStdio, LargeStdoutAndStderrArriveWhole) {
  Sandbox sb;
  RunResult r = sb.Sh("head -c 3000000 /dev/zero | tr '\\0' o; head -c 2000000 /dev/zero | tr '\\0' e >&2");
  EXPECT_EQ(r.status, 0) << r.Describe().substr(0, 2000);
  EXPECT_EQ(r.out.size(), 3000000u);
  EXPECT_EQ(r.out.find_first_not_of('o'), std::string::npos);
  // stderr passes through the supervisor's scanner: nothing may be lost.
  size_t es = 0;
  for (char ch : r.err) es += ch == 'e';
  EXPECT_EQ(es, 2000000u);
}

TEST(RunStdio, QuietPrintsNothingOfItsOwn) {
  Sandbox sb;
  RunResult ok = sb.Sh("echo out", {"--quiet"});
  EXPECT_EQ(ok.status, 0) << ok.Describe();
  EXPECT_EQ(ok.out, "out\n");
  EXPECT_EQ(ok.err, "") << ok.Describe();
  WriteFile(sb.ws() + "/.env", "S\n");
  RunResult denied = sb.Sh("cat .env 2>/dev/null; exit 4", {"--quiet"});
  EXPECT_EQ(denied.status, 4) << denied.Describe();
  EXPECT_EQ(denied.err, "") << denied.Describe();
}

TEST(RunStdio, DeniedRunSaysSoOnStderr) {
  Sandbox sb;
  WriteFile(sb.ws() + "/.env", "S\n");
  RunResult r = sb.Sh("cat .env");
  EXPECT_EQ(r.status, 1) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "sandbox_denied")) << r.Describe();
}

// DESIGN §2: `run [OPTIONS] -- COMMAND [ARG...]`. A repeatable option right
// before `--` must not swallow the separator.
TEST(Cli, RepeatableOptionBeforeDoubleDash) {
  Sandbox sb;
  RunResult r = sb.Sh("echo \"foo=$FOO\"", {"--require", "partial", "--allow-domain", "example.com"});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(r.out, "foo=\n") << r.Describe();
  RunResult w = RunCommand(sb.AgentboxCommand({"wrap", "--env", "FOO=bar", "--", "sh", "-c", "echo $FOO"}));
  EXPECT_EQ(w.status, 0) << w.Describe();
}

// --env and --allow-domain take one value each and are repeated for more:
// without `--`, the first word after their value is the command's, not a
// second value (it used to be swallowed, and the run had no command).
TEST(Cli, RepeatedFlagsLeaveTheCommandAloneWithoutDoubleDash) {
  Sandbox sb;
  RunResult r = RunCommand(sb.AgentboxCommand({"run", "--require", "partial", "--env", "FOO=1", "--env", "BAR=2",
                                               "--allow-domain", "a.example", "--allow-domain", "b.example", "printenv",
                                               "FOO", "BAR"}));
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(r.out, "1\n2\n") << r.Describe();
  RunResult w = RunCommand(sb.AgentboxCommand({"wrap", "--env", "FOO=bar", "true"}));
  EXPECT_EQ(w.status, 0) << w.Describe();
  EXPECT_TRUE(Contains(w.out, "\"true\"")) << w.Describe();
}

// Durations and sizes past their bound are refused naming the flag, before
// anything runs (125, as for any bad flag value): --timeout 3000000h used to
// wrap and time the command out after 30 ms.
TEST(Cli, HugeDurationsAndSizesAreRefusedByFlag) {
  Sandbox sb;
  const std::pair<std::string, std::string> flags[] = {
      {"--timeout", "3000000h"}, {"--kill-grace", "200h"}, {"--memory", "2048Ti"}, {"--max-processes", "99999999"}};
  for (const auto& [flag, value] : flags) {
    RunResult r = sb.Sh("sleep 0.2; echo ran", {flag, value});
    EXPECT_EQ(r.status, 125) << r.Describe();
    EXPECT_FALSE(Contains(r.out, "ran")) << r.Describe();
    EXPECT_TRUE(Contains(r.err, flag)) << r.Describe();
    EXPECT_TRUE(Contains(r.err, "maximum")) << r.Describe();
  }
  RunResult ask = sb.Sh("echo ran", {"--ask-timeout", "3000000h"});
  EXPECT_NE(ask.status, 0) << ask.Describe();
  EXPECT_FALSE(Contains(ask.out, "ran")) << ask.Describe();
  EXPECT_TRUE(Contains(ask.err, "--ask-timeout")) << ask.Describe();
}

TEST(Cli, VersionAndUsage) {
  Sandbox sb;
  RunResult v = Agentbox(sb, {"--version"});
  EXPECT_EQ(v.status, 0) << v.Describe();
  EXPECT_TRUE(Contains(v.out, "agentbox")) << v.Describe();
  RunResult none = Agentbox(sb, {"run"});
  EXPECT_NE(none.status, 0) << none.Describe();
  EXPECT_NE(none.status, 125) << "a usage error is not a sandbox error\n" << none.Describe();
  RunResult mode = Agentbox(sb, {"run", "--mode", "yolo", "--", "true"});
  EXPECT_NE(mode.status, 0) << mode.Describe();
  EXPECT_TRUE(Contains(mode.err, "yolo")) << mode.Describe();
}

}  // namespace
}  // namespace agentbox::e2e
