// The command line (DESIGN §2): wrap, check, policy validate/explain, and
// how `run` handles the command's stdio.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

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

// The seccomp program is compiled by the supervisor before the sandbox
// exists; one that cannot be compiled leaves the runner nothing to load,
// and the run is refused before the command starts, naming the cause.
TEST(Wrap, AFilterThatCannotBeCompiledRefusesTheRunBeforeTheCommand) {
  Sandbox sb;
  const std::string marker = sb.ws() + "/ran";
  Wrapped w = Wrap(sb, {"sh", "-c", "touch " + marker + "; echo ran"});
  ASSERT_FALSE(w.command.argv.empty());
  bool doctored = false;
  for (auto& e : w.command.env) {
    if (e.rfind("AGENTBOX_PLAN=", 0) != 0) continue;
    auto plan = nlohmann::json::parse(e.substr(sizeof("AGENTBOX_PLAN=") - 1), nullptr, false);
    ASSERT_TRUE(plan.is_object()) << e;
    ASSERT_TRUE(plan["seccomp"]["enabled"].get<bool>()) << plan["seccomp"].dump();
    plan["seccomp"]["rules"].push_back(
        {{"syscall", "no_such_syscall_here"}, {"action", "notify_eperm"}, {"why", "test"}});
    e = "AGENTBOX_PLAN=" + plan.dump();
    doctored = true;
  }
  ASSERT_TRUE(doctored) << "no AGENTBOX_PLAN in the wrapped env";
  RunResult r = RunCommand(w.command);
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ran")) << r.Describe();
  EXPECT_FALSE(Exists(marker)) << "the command ran without its filter\n" << r.Describe();
  EXPECT_TRUE(Contains(r.err, "stage=seccomp")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "unknown syscall no_such_syscall_here")) << r.Describe();
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

// ------------------------------------------------------------ wrap --report / --report-fd

nlohmann::json ParseReport(const std::string& path) {
  auto text = ReadFile(path);
  if (!text) return nlohmann::json();
  return nlohmann::json::parse(*text, nullptr, false);
}

// What a harness compares: the outcome, the codes, what was enforced, which
// policy, what was denied.
void ExpectSameReport(const nlohmann::json& run, const nlohmann::json& wrapped) {
  ASSERT_TRUE(run.is_object()) << run.dump();
  ASSERT_TRUE(wrapped.is_object()) << wrapped.dump();
  for (const char* key : {"outcome", "exit_code", "signal", "enforcement", "policy_sha256", "error"}) {
    EXPECT_EQ(run[key], wrapped[key]) << key << "\nrun:     " << run[key].dump() << "\nwrapped: " << wrapped[key].dump();
  }
  auto targets = [](const nlohmann::json& r) {
    std::vector<std::string> out;
    for (const auto& d : r["denials"]) out.push_back(d["op"].get<std::string>() + " " + d["target"].get<std::string>());
    return out;
  };
  EXPECT_EQ(targets(run), targets(wrapped));
}

// The argv's flags between "__exec" and "--".
std::vector<std::string> ExecFlags(const Wrapped& w) {
  std::vector<std::string> flags;
  const auto& argv = w.command.argv;
  for (size_t i = 2; i < argv.size() && argv[i] != "--"; ++i) flags.push_back(argv[i]);
  return flags;
}

// `sh -c 'exec "$@" 7>"$R"'`: the wrapped argv (or agentbox) with fd 7 open on R.
Command WithFd7(Command c, const std::string& file) {
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$@\" 7>\"$R\"", "sh"};
  argv.insert(argv.end(), c.argv.begin(), c.argv.end());
  c.argv = argv;
  c.env.push_back("R=" + file);
  return c;
}

const char* const kDeniedScript = "cat .env; echo out; exit 3";

// ------------------------------------------------------------ agentbox-core

// agentbox-core, the binary the demo builds first (CMakeLists.txt): the
// same sandbox, supervisor and report from the same objects, without the
// services. It is built beside agentbox (and staged beside it for the
// unprivileged run).
std::string CoreBin() {
  const std::string bin = AgentboxBin();
  return bin.substr(0, bin.rfind('/') + 1) + "agentbox-core";
}

TEST(CoreBinary, RunsTheSameSandboxAndReportsWhatAgentboxReports) {
  const std::string core = CoreBin();
  ASSERT_TRUE(Exists(core)) << core << " is missing: the build makes it beside " << AgentboxBin();
  Sandbox sb;
  WriteFile(sb.ws() + "/.env", "SECRET=1\n");
  RunResult full = sb.Sh(kDeniedScript);
  ASSERT_EQ(full.status, 3) << full.Describe();
  ASSERT_EQ(OutcomeOf(full), "sandbox_denied") << full.Describe();
  Command c = sb.AgentboxCommand({"run", "--report", sb.scratch() + "/core.json", "--", "sh", "-c", kDeniedScript});
  c.argv[0] = core;
  RunResult r = RunCommand(c);
  EXPECT_EQ(r.status, 3) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "out\n")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "SECRET=1")) << r.Describe();
  ExpectSameReport(*full.report, ParseReport(sb.scratch() + "/core.json"));
}

TEST(CoreBinary, TheServicesAreRefusedNamingTheBinaryThatHasThem) {
  const std::string core = CoreBin();
  ASSERT_TRUE(Exists(core)) << core << " is missing: the build makes it beside " << AgentboxBin();
  Sandbox sb;
  for (const char* sub : {"serve", "session", "mcp", "k8s"}) {
    Command c = sb.AgentboxCommand({sub});
    c.argv[0] = core;
    RunResult r = RunCommand(c);
    EXPECT_EQ(r.status, 2) << sub << "\n" << r.Describe();
    EXPECT_TRUE(Contains(r.err, "'" + std::string(sub) + "' is not in agentbox-core")) << r.Describe();
    EXPECT_TRUE(Contains(r.err, "the agentbox binary has them")) << r.Describe();
  }
  // A session's world is never started from it: its entry point refuses.
  Command world = sb.AgentboxCommand({"__world"});
  world.argv[0] = core;
  RunResult w = RunCommand(world);
  EXPECT_EQ(w.status, 125) << w.Describe();
  EXPECT_TRUE(Contains(w.err, "no sessions")) << w.Describe();
  // And `check` says so where it lists run_code's languages.
  Command check = sb.AgentboxCommand({"check", "--json"});
  check.argv[0] = core;
  RunResult ch = RunCommand(check);
  auto j = nlohmann::json::parse(ch.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << ch.Describe();
  ASSERT_TRUE(j["host"].contains("run_code")) << ch.out;
  const auto& run_code = j["host"]["run_code"];
  EXPECT_TRUE(run_code["languages"].empty()) << run_code.dump();
  EXPECT_TRUE(Contains(run_code.dump(), "no sessions")) << run_code.dump();
}

TEST(WrapReport, FileTravelsIntoTheArgvAndSaysWhatRunSays) {
  Sandbox sb;
  WriteFile(sb.ws() + "/.env", "SECRET=1\n");
  RunResult run = sb.Sh(kDeniedScript);
  ASSERT_EQ(run.status, 3) << run.Describe();
  ASSERT_EQ(OutcomeOf(run), "sandbox_denied") << run.Describe();

  // A relative FILE is the wrapping directory's: made absolute in the argv,
  // since the harness may spawn it from anywhere.
  Command wrap = sb.AgentboxCommand({"wrap", "--workspace", sb.ws(), "--report", "wrapped.json", "--", "sh", "-c",
                                     kDeniedScript});
  wrap.cwd = sb.scratch();
  RunResult wr = RunCommand(wrap);
  ASSERT_EQ(wr.status, 0) << wr.Describe();
  auto j = nlohmann::json::parse(wr.out, nullptr, false);
  ASSERT_TRUE(j.is_object() && j["argv"].is_array()) << wr.Describe();
  Wrapped w;
  w.j = j;
  w.command.argv = j["argv"].get<std::vector<std::string>>();
  w.command.cwd = sb.ws();
  w.command.env = sb.Env();
  for (auto it = j["env"].begin(); it != j["env"].end(); ++it) {
    w.command.env.push_back(it.key() + "=" + it.value().get<std::string>());
  }
  const std::string file = sb.scratch() + "/wrapped.json";
  EXPECT_EQ(ExecFlags(w), (std::vector<std::string>{"--report", file})) << wr.out;
  ASSERT_FALSE(Exists(file)) << "wrap only checks FILE; the run writes it";
  RunResult r = RunCommand(w.command);
  EXPECT_EQ(r.status, 3) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "out\n")) << r.Describe();
  ExpectSameReport(*run.report, ParseReport(file));
  struct stat st;
  ASSERT_EQ(lstat(file.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  // Nothing of the plan or of the report's context reaches the command.
  Wrapped env = Wrap(sb, {"sh", "-c", "env | grep -c '^AGENTBOX_' || true"}, {"--report", file});
  RunResult e = RunCommand(env.command);
  EXPECT_EQ(e.status, 0) << e.Describe();
  EXPECT_EQ(e.out, "0\n") << e.Describe();
}

TEST(WrapReport, FdTravelsIntoTheArgvAndSaysWhatRunSays) {
  Sandbox sb;
  WriteFile(sb.ws() + "/.env", "SECRET=1\n");
  // The command tries the report's descriptor: it never reaches the sandbox.
  const std::string script = std::string("echo forged >&7; ") + kDeniedScript;
  const std::string run_file = sb.scratch() + "/run.json";
  RunResult run = RunCommand(WithFd7(sb.AgentboxCommand({"run", "--report-fd", "7", "--", "sh", "-c", script}),
                                     run_file));
  ASSERT_EQ(run.status, 3) << run.Describe();
  const nlohmann::json run_report = ParseReport(run_file);
  ASSERT_TRUE(run_report.is_object()) << ReadFile(run_file).value_or("(no file)") << "\n" << run.Describe();
  EXPECT_EQ(run_report["outcome"], "sandbox_denied") << run_report.dump();
  EXPECT_FALSE(Contains(*ReadFile(run_file), "forged"));

  Wrapped w = Wrap(sb, {"sh", "-c", script}, {"--report-fd", "7"});
  ASSERT_FALSE(w.command.argv.empty());
  EXPECT_EQ(ExecFlags(w), (std::vector<std::string>{"--report-fd", "7"}));
  const std::string file = sb.scratch() + "/wrapped.json";
  RunResult r = RunCommand(WithFd7(w.command, file));
  EXPECT_EQ(r.status, 3) << r.Describe();
  EXPECT_FALSE(Contains(*ReadFile(file), "forged"));
  ExpectSameReport(run_report, ParseReport(file));
}

// A report that cannot be written refuses before anything runs, naming it:
// on run, at wrap time, and on the wrapped argv's side.
TEST(WrapReport, UnwritableFileIsRefusedBeforeTheCommandRuns) {
  Sandbox sb;
  const std::string missing = sb.scratch() + "/no-such-dir/r.json";
  RunResult run = RunCommand(sb.AgentboxCommand({"run", "--report", missing, "--", "sh", "-c", "echo ran"}));
  EXPECT_EQ(run.status, 125) << run.Describe();
  EXPECT_FALSE(Contains(run.out, "ran")) << run.Describe();
  EXPECT_TRUE(Contains(run.err, "--report " + missing)) << run.Describe();

  RunResult wrap = RunCommand(sb.AgentboxCommand({"wrap", "--report", missing, "--", "sh", "-c", "echo ran"}));
  EXPECT_EQ(wrap.status, 125) << wrap.Describe();
  EXPECT_EQ(wrap.out, "") << wrap.Describe();
  EXPECT_TRUE(Contains(wrap.err, "--report " + missing)) << wrap.Describe();

  // Writable when wrapped, gone when spawned.
  const std::string dir = sb.scratch() + "/reports";
  MakeDirs(dir);
  Wrapped w = Wrap(sb, {"sh", "-c", "echo ran"}, {"--report", dir + "/r.json"});
  ASSERT_FALSE(w.command.argv.empty());
  ASSERT_TRUE(RemoveTree(dir));
  RunResult r = RunCommand(w.command);
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ran")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "--report " + dir + "/r.json")) << r.Describe();
  std::regex rule(w.j["runner_failure_rules"][0]["pattern"].get<std::string>(), std::regex::ECMAScript);
  bool matched = false;
  for (const auto& line : Lines(r.err)) matched |= std::regex_search(line, rule);
  EXPECT_TRUE(matched) << "the refusal is the sandbox's, by the runner-failure rule\n" << r.Describe();
}

// A symlink at FILE is never followed: refused up front, and one planted
// during the run (here by the command, in the workspace) is replaced.
TEST(WrapReport, SymlinkAtTheFinalPathIsNeverFollowed) {
  Sandbox sb;
  const std::string victim = sb.scratch() + "/victim";
  WriteFile(victim, "untouched\n");
  const std::string link = sb.scratch() + "/link.json";
  ASSERT_EQ(symlink(victim.c_str(), link.c_str()), 0);
  RunResult run = RunCommand(sb.AgentboxCommand({"run", "--report", link, "--", "sh", "-c", "echo ran"}));
  EXPECT_EQ(run.status, 125) << run.Describe();
  EXPECT_FALSE(Contains(run.out, "ran")) << run.Describe();
  EXPECT_TRUE(Contains(run.err, "--report " + link + ": is a symlink")) << run.Describe();
  RunResult wrap = RunCommand(sb.AgentboxCommand({"wrap", "--report", link, "--", "true"}));
  EXPECT_EQ(wrap.status, 125) << wrap.Describe();
  EXPECT_TRUE(Contains(wrap.err, "is a symlink")) << wrap.Describe();

  // Planted after the check: by the sandboxed command, in its workspace.
  const std::string in_ws = sb.ws() + "/report.json";
  const std::string plant = "ln -s " + victim + " report.json && echo planted";
  RunResult planted = RunCommand(sb.AgentboxCommand({"run", "--report", in_ws, "--", "sh", "-c", plant}));
  EXPECT_EQ(planted.status, 0) << planted.Describe();
  EXPECT_TRUE(Contains(planted.out, "planted")) << planted.Describe();
  Wrapped w = Wrap(sb, {"sh", "-c", "rm -f report.json; " + plant}, {"--report", in_ws});
  RunResult wr = RunCommand(w.command);
  EXPECT_EQ(wr.status, 0) << wr.Describe();
  EXPECT_TRUE(Contains(wr.out, "planted")) << wr.Describe();
  EXPECT_EQ(ReadFile(victim).value_or(""), "untouched\n") << "the report was written through a planted symlink";
  struct stat st;
  ASSERT_EQ(lstat(in_ws.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode)) << "the planted symlink was not replaced";
  EXPECT_EQ(ParseReport(in_ws).value("outcome", ""), "exited");

  // A report replaced whole: a new file (0600) renamed over the old one.
  const std::string old_file = sb.scratch() + "/old.json";
  WriteFile(old_file, "old report\n", 0644);
  struct stat before;
  ASSERT_EQ(stat(old_file.c_str(), &before), 0);
  RunResult again = RunCommand(sb.AgentboxCommand({"run", "--report", old_file, "--", "true"}));
  EXPECT_EQ(again.status, 0) << again.Describe();
  ASSERT_EQ(stat(old_file.c_str(), &st), 0);
  EXPECT_NE(st.st_ino, before.st_ino);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(ParseReport(old_file).value("outcome", ""), "exited");
}

TEST(WrapReport, FdThatIsNotOpenIsRefusedBeforeTheCommandRuns) {
  Sandbox sb;
  RunResult run = RunCommand(sb.AgentboxCommand({"run", "--report-fd", "9", "--", "sh", "-c", "echo ran"}));
  EXPECT_EQ(run.status, 125) << run.Describe();
  EXPECT_FALSE(Contains(run.out, "ran")) << run.Describe();
  EXPECT_TRUE(Contains(run.err, "--report-fd 9: not an open file descriptor")) << run.Describe();
  // The wrapped argv checks it when it is spawned (without fd 9 here).
  Wrapped w = Wrap(sb, {"sh", "-c", "echo ran"}, {"--report-fd", "9"});
  ASSERT_FALSE(w.command.argv.empty());
  RunResult r = RunCommand(w.command);
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ran")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "stage=report: --report-fd 9: not an open file descriptor")) << r.Describe();
  // The command's own stdio is not a report's place; both flags at once are refused.
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"run", "--report-fd", "1", "--", "sh", "-c", "echo ran"},
           {"wrap", "--report-fd", "2", "--", "sh", "-c", "echo ran"},
           {"run", "--report", sb.scratch() + "/r.json", "--report-fd", "7", "--", "sh", "-c", "echo ran"},
           {"wrap", "--report", sb.scratch() + "/r.json", "--report-fd", "7", "--", "sh", "-c", "echo ran"}}) {
    RunResult bad = RunCommand(sb.AgentboxCommand(args));
    EXPECT_EQ(bad.status, 125) << bad.Describe();
    EXPECT_FALSE(Contains(bad.out, "ran")) << bad.Describe();
    EXPECT_TRUE(Contains(bad.err, "--report-fd")) << bad.Describe();
  }
  // A harness that adds --report to an argv wrapped without it: refused,
  // since the enforcement the report states did not travel.
  Wrapped plain = Wrap(sb, {"sh", "-c", "echo ran"});
  ASSERT_GE(plain.command.argv.size(), 2u);
  plain.command.argv.insert(plain.command.argv.begin() + 2, {"--report", sb.scratch() + "/late.json"});
  RunResult late = RunCommand(plain.command);
  EXPECT_EQ(late.status, 125) << late.Describe();
  EXPECT_FALSE(Contains(late.out, "ran")) << late.Describe();
  EXPECT_TRUE(Contains(late.err, "AGENTBOX_WRAP_REPORT is not set")) << late.Describe();
  EXPECT_EQ(ParseReport(sb.scratch() + "/late.json").value("outcome", ""), "sandbox_error");
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
  // (container and microvm are offered where runsc, QEMU and a guest image
  // are: tests/e2e/gvisor_test.cc, microvm_test.cc.)
  for (const char* isolation : {"remote"}) {
    const std::string file = sb.scratch() + "/" + isolation + ".yaml";
    // remote names where its world runs (a session's, never a command run here).
    WriteFile(file, std::string("version: 1\nsandbox:\n  isolation: ") + isolation +
                        "\n  remote: { ssh: agent@build-3, level: os }\n");
    RunResult e = Agentbox(sb, {"policy", "explain", "--json", "--policy", file});
    auto ej = nlohmann::json::parse(e.out, nullptr, false);
    ASSERT_FALSE(ej.is_discarded()) << e.Describe();
    // A command confined here is offered `os`, `container` and `microvm`:
    // `remote` is a session's world, refused here, never downgraded.
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

// ------------------------------------------------------------ PATH under HOME

// A toolchain user's PATH: shims and bin directories in the (temporary) HOME
// before the system's, each holding a tool the system does not have.
struct HomeToolchains {
  explicit HomeToolchains(const Sandbox& sb) : pyenv(sb.home() + "/.pyenv/shims"), cargo(sb.home() + "/.cargo/bin") {
    WriteFile(pyenv + "/agentbox-e2e-py", "#!/bin/sh\necho py-tool-ran\n", 0755);
    WriteFile(cargo + "/agentbox-e2e-cargo", "#!/bin/sh\necho cargo-tool-ran\n", 0755);
  }
  std::vector<std::string> Env(const Sandbox& sb) const {
    std::vector<std::string> env = sb.Env();
    for (auto& e : env) {
      if (e.rfind("PATH=", 0) == 0) e = "PATH=" + pyenv + ":" + cargo + ":" + e.substr(5);
    }
    return env;
  }
  std::string pyenv, cargo;
};

TEST(HomePath, ExplainNamesEachDirectoryAndTheReadOnlyEntries) {
  Sandbox sb;
  HomeToolchains tc(sb);
  Command c = sb.AgentboxCommand({"policy", "explain"});
  c.env = tc.Env(sb);
  RunResult r = RunCommand(c);
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "PATH directories under HOME are not mounted inside")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, tc.pyenv + ", " + tc.cargo)) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "filesystem.read_only: [/usr, ")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, ", ~/.pyenv, ~/.cargo]")) << r.Describe();

  // Covered by read_only: not mentioned.
  const std::string file = sb.scratch() + "/tools.yaml";
  WriteFile(file, "version: 1\nfilesystem:\n  read_only: [/usr, /bin, /sbin, /lib, /lib64, /etc, ~/.pyenv]\n");
  c.argv = {AgentboxBin(), "policy", "explain", "--json", "--policy", file};
  RunResult j = RunCommand(c);
  EXPECT_EQ(j.status, 0) << j.Describe();
  auto out = nlohmann::json::parse(j.out, nullptr, false);
  ASSERT_FALSE(out.is_discarded()) << j.Describe();
  EXPECT_EQ(out["path_under_home"]["not_mounted"], nlohmann::json::array({tc.cargo})) << j.out.substr(0, 2000);
  EXPECT_EQ(out["path_under_home"]["read_only"],
            nlohmann::json::array({"/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "~/.pyenv", "~/.cargo"}));

  // Nothing under HOME on PATH: nothing to say.
  RunResult plain = RunCommand(sb.AgentboxCommand({"policy", "explain"}));
  EXPECT_EQ(plain.status, 0) << plain.Describe();
  EXPECT_FALSE(Contains(plain.out, "PATH directories under HOME")) << plain.Describe();
}

// `run` says it where a command was not found, and the entry it suggests
// is the fix: with it the tool runs.
TEST(HomePath, RunSaysItWhenACommandIsNotFoundAndTheSuggestedEntryFixesIt) {
  Sandbox sb;
  HomeToolchains tc(sb);
  Command c = sb.AgentboxCommand({"run", "--", "agentbox-e2e-cargo"});
  c.env = tc.Env(sb);
  RunResult r = RunCommand(c);
  EXPECT_EQ(r.status, 127) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "agentbox: PATH directories under HOME are not mounted inside")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, tc.cargo)) << r.Describe();
  // The command's own shell not finding it is the same 127.
  c.argv = {AgentboxBin(), "run", "--", "sh", "-c", "agentbox-e2e-py"};
  RunResult sh = RunCommand(c);
  EXPECT_EQ(sh.status, 127) << sh.Describe();
  EXPECT_TRUE(Contains(sh.err, tc.pyenv)) << sh.Describe();
  EXPECT_TRUE(Contains(sh.err, "~/.pyenv, ~/.cargo]")) << sh.Describe();

  const std::string file = sb.scratch() + "/tools.yaml";
  WriteFile(file, "version: 1\nfilesystem:\n  read_only: [/usr, /bin, /sbin, /lib, /lib64, /etc, ~/.pyenv, ~/.cargo]\n");
  c.argv = {AgentboxBin(), "run", "--policy", file, "--", "sh", "-c", "agentbox-e2e-py; agentbox-e2e-cargo"};
  RunResult fixed = RunCommand(c);
  EXPECT_EQ(fixed.status, 0) << fixed.Describe();
  EXPECT_EQ(fixed.out, "py-tool-ran\ncargo-tool-ran\n") << fixed.Describe();
  // And nothing to say about a 127 once every directory is bound.
  c.argv = {AgentboxBin(), "run", "--policy", file, "--", "agentbox-e2e-no-such-tool"};
  RunResult none = RunCommand(c);
  EXPECT_EQ(none.status, 127) << none.Describe();
  EXPECT_FALSE(Contains(none.err, "PATH directories under HOME")) << none.Describe();
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

// Only the subcommand named first is built (main.cc): the help still lists
// every one, each one's own help and options work when it is built alone,
// and a name that is none of them is a usage error naming it.
TEST(Cli, EachSubcommandWorksWhenBuiltAloneAndTheHelpListsThemAll) {
  Sandbox sb;
  const std::vector<std::string> names = {
      "run", "wrap", "check", "gc", "policy", "serve", "session", "mcp", "setup-delegation", "k8s"};
  RunResult help = Agentbox(sb, {"--help"});
  EXPECT_EQ(help.status, 0) << help.Describe();
  for (const auto& name : names) {
    EXPECT_TRUE(Contains(help.out, "  " + name + " ")) << name << " missing from --help\n" << help.Describe();
    RunResult own = Agentbox(sb, {name, "--help"});
    EXPECT_EQ(own.status, 0) << own.Describe();
    EXPECT_TRUE(Contains(own.out, "Usage:") && Contains(own.out, name)) << own.Describe();
  }
  RunResult typo = Agentbox(sb, {"rnu", "--", "true"});
  EXPECT_NE(typo.status, 0) << typo.Describe();
  EXPECT_NE(typo.status, 125) << "a usage error is not a sandbox error\n" << typo.Describe();
  EXPECT_TRUE(Contains(typo.err + typo.out, "rnu")) << typo.Describe();
  RunResult explained = Agentbox(sb, {"policy", "explain", "--mode", "read-only"});
  EXPECT_EQ(explained.status, 0) << explained.Describe();
}

}  // namespace
}  // namespace agentbox::e2e
