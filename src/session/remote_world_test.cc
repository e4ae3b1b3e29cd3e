// The pure parts of a remote world: the ssh command line, the install
// script the remote runs first (run here by /bin/sh against a directory of
// the test's), and the confined plan's trip over the stream.
#include "session/remote_world.h"

#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agentbox/confine.h"
#include "agentbox/outcome.h"
#include "agentbox/plan.h"
#include "agentbox/policy.h"
#include "confine/fake_host.h"
#include "policy/sha256.h"
#include "report/report_json.h"

extern char** environ;

namespace agentbox::session {
namespace {

using nlohmann::json;

// ---- SshArgv -------------------------------------------------------------------

// Whether `argv` holds `-o OPTION` as one pair.
bool HasOption(const std::vector<std::string>& argv, const std::string& option) {
  for (std::size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "-o" && argv[i + 1] == option) return true;
  }
  return false;
}

std::size_t IndexOf(const std::vector<std::string>& argv, const std::string& word) {
  return static_cast<std::size_t>(std::find(argv.begin(), argv.end(), word) - argv.begin());
}

TEST(SshArgv, NothingAsksNothingIsLearntAndNothingIsForwarded) {
  RemotePlan remote;
  remote.ssh = "agent@build-3";
  const std::vector<std::string> argv = SshArgv(remote, "sh -c 'true'");
  ASSERT_GE(argv.size(), 4u);
  EXPECT_EQ(argv.front(), "ssh");
  EXPECT_TRUE(HasOption(argv, "BatchMode=yes"));
  EXPECT_TRUE(HasOption(argv, "StrictHostKeyChecking=yes"));
  EXPECT_TRUE(HasOption(argv, "ForwardAgent=no"));
  EXPECT_TRUE(HasOption(argv, "ForwardX11=no"));
  EXPECT_TRUE(HasOption(argv, "ClearAllForwardings=yes"));
  EXPECT_TRUE(HasOption(argv, "PermitLocalCommand=no"));
  // No escape character: bytes of the stream are never ssh's commands.
  const std::size_t e = IndexOf(argv, "-e");
  ASSERT_LT(e + 1, argv.size());
  EXPECT_EQ(argv[e + 1], "none");
  // Nothing that would turn the forwarding or a terminal on.
  for (const char* flag : {"-A", "-X", "-Y", "-t", "-L", "-R", "-D", "-M"}) {
    EXPECT_EQ(IndexOf(argv, flag), argv.size()) << flag;
  }
  // The destination right after "--" (never read as an option), the command last.
  EXPECT_EQ(argv[argv.size() - 3], "--");
  EXPECT_EQ(argv[argv.size() - 2], "agent@build-3");
  EXPECT_EQ(argv.back(), "sh -c 'true'");
  EXPECT_EQ(std::count(argv.begin(), argv.end(), "--"), 1);
  // Without them given, ssh's own configuration file and port.
  EXPECT_EQ(IndexOf(argv, "-F"), argv.size());
  EXPECT_EQ(IndexOf(argv, "-p"), argv.size());
}

TEST(SshArgv, AConfigurationFileAndAPortComeBeforeTheDestination) {
  RemotePlan remote;
  remote.ssh = "2001:db8::1";
  remote.port = "2222";
  remote.ssh_config = "/home/u/.ssh/agentbox_config";
  const std::vector<std::string> argv = SshArgv(remote, "true");
  const std::size_t f = IndexOf(argv, "-F"), p = IndexOf(argv, "-p"), dashes = IndexOf(argv, "--");
  ASSERT_LT(f + 1, argv.size());
  ASSERT_LT(p + 1, argv.size());
  EXPECT_EQ(argv[f + 1], "/home/u/.ssh/agentbox_config");
  EXPECT_EQ(argv[p + 1], "2222");
  EXPECT_LT(f, dashes);
  EXPECT_LT(p, dashes);
  EXPECT_EQ(argv[dashes + 1], "2001:db8::1");
  EXPECT_TRUE(HasOption(argv, "StrictHostKeyChecking=yes")) << "a configuration file does not replace the options";
}

// ---- InstallScript, run by /bin/sh --------------------------------------------

std::string MachineHere() {
  struct utsname u {};
  uname(&u);
  return u.machine;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteAll(const std::string& path, const std::string& bytes, mode_t mode = 0600) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  chmod(path.c_str(), mode);
}

struct ScriptRun {
  int exit_code = -1;
  std::string out;
};

class InstallScriptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/agentbox-install-script-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // What the remote is sent: a program that says how it was started.
    binary_ = "#!/bin/sh\necho \"ran $*\"\n";
    digest_ = Sha256Hex(binary_);
    // The script execs what it installed: a directory mounted noexec cannot say anything here.
    const std::string probe = dir_ + "/probe";
    WriteAll(probe, "#!/bin/sh\nexit 0\n", 0700);
    if (RunProgram({probe}, "", {}).exit_code != 0) GTEST_SKIP() << "not applicable here: " << dir_ << " is noexec";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string cache() const { return dir_ + "/cache"; }
  std::string installed() const { return cache() + "/agentbox/bin/agentbox-" + digest_; }

  // Runs `argv` with `input` as stdin and `env` as its whole environment.
  ScriptRun RunProgram(const std::vector<std::string>& argv, const std::string& input,
                       const std::vector<std::string>& env) {
    const std::string in = dir_ + "/stdin", out = dir_ + "/stdout";
    WriteAll(in, input);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, in.c_str(), O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    std::vector<char*> args, envp;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    pid_t pid = -1;
    ScriptRun r;
    if (posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(), envp.data()) == 0) {
      int status = 0;
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    posix_spawn_file_actions_destroy(&actions);
    r.out = ReadAll(out);
    return r;
  }

  // The script as the remote's shell runs it, with XDG_CACHE_HOME (or only HOME).
  ScriptRun Run(const std::string& input, const std::string& machine, bool xdg = true) {
    const std::string script = dir_ + "/install.sh";
    WriteAll(script, InstallScript(digest_, binary_.size(), machine));
    std::vector<std::string> env = {"PATH=/usr/bin:/bin", "HOME=" + dir_ + "/home"};
    if (xdg) env.push_back("XDG_CACHE_HOME=" + cache());
    return RunProgram({"/bin/sh", script}, input, env);
  }

  std::string dir_;
  std::string binary_;
  std::string digest_;
};

TEST_F(InstallScriptTest, AnAbsentBinaryIsAskedForCheckedInstalledAndExecedAsWorldStdio) {
  const ScriptRun r = Run(binary_, MachineHere());
  EXPECT_EQ(r.out, "agentbox-remote: need\nagentbox-remote: installed\nran __world --stdio\n");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(ReadAll(installed()), binary_);
  struct stat st {};
  ASSERT_EQ(stat(installed().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  ASSERT_EQ(stat((cache() + "/agentbox/bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u) << "the binary's directory is open to others";

  // Found again by its digest: nothing is asked, nothing read from the stream.
  const ScriptRun again = Run("", MachineHere());
  EXPECT_EQ(again.out, "agentbox-remote: have\nran __world --stdio\n");
  EXPECT_EQ(again.exit_code, 0);
}

TEST_F(InstallScriptTest, WithoutXdgCacheHomeTheBinaryGoesUnderHomesCache) {
  const ScriptRun r = Run(binary_, MachineHere(), /*xdg=*/false);
  EXPECT_EQ(r.out, "agentbox-remote: need\nagentbox-remote: installed\nran __world --stdio\n");
  EXPECT_EQ(ReadAll(dir_ + "/home/.cache/agentbox/bin/agentbox-" + digest_), binary_);
}

TEST_F(InstallScriptTest, AFileUnderTheNameWithAnotherDigestIsNeverRunButReplaced) {
  std::filesystem::create_directories(cache() + "/agentbox/bin");
  WriteAll(installed(), "#!/bin/sh\necho tampered\n", 0700);
  const ScriptRun r = Run(binary_, MachineHere());
  EXPECT_EQ(r.out.find("tampered"), std::string::npos) << r.out;
  EXPECT_EQ(r.out, "agentbox-remote: need\nagentbox-remote: installed\nran __world --stdio\n");
  EXPECT_EQ(ReadAll(installed()), binary_);
}

TEST_F(InstallScriptTest, BytesThatDoNotHaveTheDigestAreNeitherInstalledNorRun) {
  // As long as the binary, and not it.
  std::string forged = "#!/bin/sh\necho forged\n";
  forged.resize(binary_.size(), '#');
  ASSERT_NE(Sha256Hex(forged), digest_);
  const ScriptRun r = Run(forged, MachineHere());
  EXPECT_EQ(r.out,
            "agentbox-remote: need\nagentbox-remote: the copied binary does not have the digest it was sent with\n");
  EXPECT_EQ(r.exit_code, 6);
  EXPECT_FALSE(std::filesystem::exists(installed()));
  // No temporary copy is left behind either.
  for (const auto& e : std::filesystem::directory_iterator(cache() + "/agentbox/bin")) {
    ADD_FAILURE() << "left behind: " << e.path();
  }
}

TEST_F(InstallScriptTest, BinariesNoConnectionUsedForTwoWeeksArePrunedTheOthersKept) {
  const std::string bin = cache() + "/agentbox/bin";
  std::filesystem::create_directories(bin);
  auto aged = [](const std::string& path, int days) {
    const time_t when = time(nullptr) - days * 86400;
    struct timespec times[2] = {{when, 0}, {when, 0}};
    return utimensat(AT_FDCWD, path.c_str(), times, 0) == 0;
  };
  WriteAll(bin + "/agentbox-0ld", "an older version", 0700);
  WriteAll(bin + "/agentbox-0ld.tmp.123", "an install cut short", 0600);
  WriteAll(bin + "/agentbox-recent", "another daemon's version", 0700);
  WriteAll(bin + "/unrelated", "not agentbox's", 0600);
  ASSERT_TRUE(aged(bin + "/agentbox-0ld", 30));
  ASSERT_TRUE(aged(bin + "/agentbox-0ld.tmp.123", 30));
  ASSERT_TRUE(aged(bin + "/agentbox-recent", 3));
  ASSERT_TRUE(aged(bin + "/unrelated", 30));
  const ScriptRun r = Run(binary_, MachineHere());
  EXPECT_EQ(r.out, "agentbox-remote: need\nagentbox-remote: installed\nran __world --stdio\n");
  EXPECT_FALSE(std::filesystem::exists(bin + "/agentbox-0ld"));
  EXPECT_FALSE(std::filesystem::exists(bin + "/agentbox-0ld.tmp.123"));
  EXPECT_TRUE(std::filesystem::exists(bin + "/agentbox-recent"));
  EXPECT_TRUE(std::filesystem::exists(bin + "/unrelated"));
  // The one in use is never pruned, however old its file: each use renews it.
  ASSERT_TRUE(aged(installed(), 60));
  const ScriptRun again = Run("", MachineHere());
  EXPECT_EQ(again.out, "agentbox-remote: have\nran __world --stdio\n");
  EXPECT_TRUE(std::filesystem::exists(installed()));
  struct stat st {};
  ASSERT_EQ(stat(installed().c_str(), &st), 0);
  EXPECT_GT(st.st_mtime, time(nullptr) - 3600) << "its use did not renew it";
}

TEST_F(InstallScriptTest, AnotherMachineTypeIsRefusedBeforeAnythingIsWrittenOrRead) {
  const ScriptRun r = Run(binary_, "not-" + MachineHere());
  EXPECT_EQ(r.out, "agentbox-remote: machine " + MachineHere() + "\n");
  EXPECT_EQ(r.exit_code, 4);
  EXPECT_FALSE(std::filesystem::exists(cache())) << "the cache directory was made on a machine refused";
}

// ---- The confined plan over the stream -------------------------------------------

ConfinedCommand AConfinedCommand() {
  Policy policy = PresetFor(Mode::kWorkspaceWrite);
  policy.network.allow = {"github.com"};
  policy.network.egress_proxy = true;
  auto c = Confine({"true"}, policy, agentbox::testing::FakeHost(), agentbox::testing::FakeInvocation());
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  ConfinedCommand out = c.ok() ? *c : ConfinedCommand{};
  out.enforcement.backend_reason = "user namespaces available";
  out.enforcement.notes.push_back("a note of the remote's");
  AddMissing(&out.enforcement, {"resources", "no writable cgroup for this user"});
  return out;
}

TEST(ConfinedJson, TheRemotesPlanReportAndSignaturesSurviveTheTrip) {
  const ConfinedCommand c = AConfinedCommand();
  ASSERT_FALSE(c.plan.mounts.empty());
  ASSERT_FALSE(c.denial_signatures.empty());
  ASSERT_FALSE(c.runner_failure_rules.empty());
  // As text, as it travels in a frame.
  auto back = ConfinedFromJson(json::parse(ConfinedToJson(c).dump()));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(PlanToJson(back->plan), PlanToJson(c.plan));
  EXPECT_EQ(back->plan.mounts.size(), c.plan.mounts.size());
  EXPECT_EQ(back->plan.network.allow, std::vector<std::string>{"github.com"});
  EXPECT_EQ(ToJson(back->enforcement, -1), ToJson(c.enforcement, -1));
  EXPECT_EQ(back->enforcement.level, Level::kPartial);
  EXPECT_EQ(back->enforcement.backend_reason, "user namespaces available");
  ASSERT_EQ(back->enforcement.missing.size(), 1u);
  EXPECT_EQ(back->enforcement.missing[0].reason, "no writable cgroup for this user");
  ASSERT_EQ(back->denial_signatures.size(), c.denial_signatures.size());
  for (std::size_t i = 0; i < c.denial_signatures.size(); ++i) {
    EXPECT_EQ(back->denial_signatures[i].pattern, c.denial_signatures[i].pattern);
    EXPECT_EQ(back->denial_signatures[i].meaning, c.denial_signatures[i].meaning);
  }
  ASSERT_EQ(back->runner_failure_rules.size(), c.runner_failure_rules.size());
  for (std::size_t i = 0; i < c.runner_failure_rules.size(); ++i) {
    EXPECT_EQ(back->runner_failure_rules[i].pattern, c.runner_failure_rules[i].pattern);
    EXPECT_EQ(back->runner_failure_rules[i].meaning, c.runner_failure_rules[i].meaning);
  }
}

TEST(ConfinedJson, MalformedInputIsAnErrorNotACrash) {
  const json good = ConfinedToJson(AConfinedCommand());
  json no_plan = good;
  no_plan.erase("plan");
  json no_enforcement = good;
  no_enforcement.erase("enforcement");
  json plan_not_object = good;
  plan_not_object["plan"] = 7;
  json plan_missing_field = good;
  plan_missing_field["plan"].erase("confined");
  json plan_wrong_type = good;
  plan_wrong_type["plan"]["confined"] = "yes";
  json enforcement_not_object = good;
  enforcement_not_object["enforcement"] = "full";
  json bad_level = good;
  bad_level["enforcement"]["level"] = "most";
  const std::vector<std::pair<const char*, json>> cases = {
      {"null", json()},
      {"array", json::array({good})},
      {"string", json("confined")},
      {"empty object", json::object()},
      {"no plan", no_plan},
      {"no enforcement", no_enforcement},
      {"plan not an object", plan_not_object},
      {"plan without confined", plan_missing_field},
      {"plan.confined a string", plan_wrong_type},
      {"enforcement not an object", enforcement_not_object},
      {"enforcement.level unknown", bad_level},
  };
  for (const auto& [name, j] : cases) {
    EXPECT_NO_THROW({
      auto r = ConfinedFromJson(j);
      EXPECT_FALSE(r.ok()) << name;
      if (!r.ok()) {
        EXPECT_FALSE(r.status().message().empty()) << name;
      }
    }) << name;
  }
}

// The caller's daemon reads the remote's answer: a signature of the wrong
// shape must come back as an error, never as an exception through it.
TEST(ConfinedJson, ASignatureWhosePatternIsNotTextIsAnErrorNotACrash) {
  for (const char* key : {"denial_signatures", "runner_failure_rules"}) {
    json j = ConfinedToJson(AConfinedCommand());
    j[key] = json::array({{{"pattern", 5}, {"meaning", "x"}}});
    EXPECT_NO_THROW({
      auto r = ConfinedFromJson(j);
      EXPECT_FALSE(r.ok()) << key;
    }) << key;
  }
}

}  // namespace
}  // namespace agentbox::session
