// What a policy adds to the sandbox's view of the host beyond the
// workspace: filesystem.read_write trees, filesystem.caches, home.import
// dotfiles, read_only entries under the private home, env.pass patterns.
// Each on both backends: linux-namespaces and (forced) landlock-only.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "harness.h"

namespace agentbox::e2e {
namespace {

struct BackendCase {
  const char* name;
  std::vector<std::string> options;
};

void PrintTo(const BackendCase& c, std::ostream* os) { *os << c.name; }

class HostTreesTest : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
    if (landlock_only() && host_facts::LandlockAbi() < 2) {
      GTEST_SKIP() << "not applicable here: the kernel has no Landlock ABI 2 (the landlock-only backend needs it)";
    }
  }
  bool landlock_only() const { return !GetParam().options.empty(); }

  // Runs `script` under a policy file holding `policy`.
  RunResult Run(const Sandbox& box, const std::string& policy, const std::string& script,
                const std::vector<std::string>& extra_env = {}) const {
    WriteFile(box.scratch() + "/policy.yaml", "version: 1\n" + policy);
    std::vector<std::string> options = {"--policy", box.scratch() + "/policy.yaml"};
    options.insert(options.end(), GetParam().options.begin(), GetParam().options.end());
    return box.Sh(script, options, extra_env);
  }
};

std::string FilesystemNotes(const RunResult& r) {
  std::string out;
  if (!r.report) return out;
  for (const auto& n : (*r.report)["enforcement"]["facets"]["filesystem"].value("notes", nlohmann::json::array())) {
    out += n.get<std::string>() + "\n";
  }
  return out;
}

std::string Skipped(const RunResult& r) {
  std::string out;
  if (!r.report) return out;
  for (const auto& s : (*r.report)["enforcement"].value("skipped", nlohmann::json::array())) {
    out += s.get<std::string>() + "\n";
  }
  return out;
}

// A bare repository outside the workspace, listed in read_write, takes a
// push from the workspace; its sibling, not listed, takes nothing.
TEST_P(HostTreesTest, ReadWriteTakesAGitPushAndItsSiblingStaysUnwritable) {
  Sandbox box;
  const std::string remotes = box.scratch() + "/remotes";
  MakeDirs(remotes);
  ASSERT_EQ(box.Git({"init", "-q", "--bare", remotes + "/bare.git"}).status, 0);
  ASSERT_EQ(box.Git({"init", "-q", "--bare", remotes + "/sibling.git"}).status, 0);
  WriteFile(box.ws() + "/README", "hello\n");
  ASSERT_EQ(box.Git({"add", "README"}).status, 0);
  ASSERT_EQ(box.Git({"-c", "user.name=T", "-c", "user.email=t@example.com", "commit", "-qm", "one"}).status, 0);

  RunResult r = Run(box, "filesystem:\n  read_write: [" + remotes + "/bare.git]\n",
                    "git push -q " + remotes + "/bare.git HEAD:refs/heads/main; echo push=$?\n"
                    "git push -q " + remotes + "/sibling.git HEAD:refs/heads/main; echo sibling=$?\n"
                    "echo x > " + remotes + "/planted; echo planted=$?\n");
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "push=0")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "sibling=0")) << r.Describe();
  // Namespaces: the parent is the private /tmp's (a write there stays in
  // the sandbox); landlock-only: the host's, refused by Landlock.
  if (landlock_only()) { EXPECT_FALSE(Contains(r.out, "planted=0")) << r.Describe(); }
  // The host's view: the push landed, the sibling and the parent are untouched.
  RunResult pushed = box.Git({"rev-parse", "--verify", "-q", "refs/heads/main"}, remotes + "/bare.git");
  RunResult local = box.Git({"rev-parse", "HEAD"});
  EXPECT_EQ(pushed.status, 0) << pushed.Describe();
  EXPECT_EQ(pushed.out, local.out);
  EXPECT_NE(box.Git({"rev-parse", "--verify", "-q", "refs/heads/main"}, remotes + "/sibling.git").status, 0);
  EXPECT_FALSE(Exists(remotes + "/planted"));
  EXPECT_TRUE(Contains(FilesystemNotes(r), "filesystem.read_write, writable outside the workspace: " + remotes +
                                               "/bare.git"))
      << r.Describe();
}

TEST_P(HostTreesTest, ReadWriteDenyInsideStillWins) {
  Sandbox box;
  const std::string tree = box.scratch() + "/shared";
  WriteFile(tree + "/open.txt", "open\n");
  WriteFile(tree + "/secret/key", "SECRET-" + RandomHex() + "\n");
  RunResult r = Run(box, "filesystem:\n  read_write: [" + tree + "]\n  deny: [" + tree + "/secret]\n",
                    "echo more >> " + tree + "/open.txt; echo open=$?\n"
                    "cat " + tree + "/secret/key; echo key=$?\n");
  if (landlock_only()) {
    // Landlock rules only add access: the report says the entry is not fenced.
    EXPECT_TRUE(Contains(MissingText(r), "filesystem.deny '" + tree + "/secret' is not fenced")) << r.Describe();
    return;
  }
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "open=0")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "SECRET-")) << r.Describe();
  EXPECT_EQ(ReadFile(tree + "/open.txt").value_or(""), "open\nmore\n");
}

TEST_P(HostTreesTest, ReadWriteProtectInsideStaysReadOnly) {
  Sandbox box;
  const std::string tree = box.scratch() + "/shared";
  WriteFile(tree + "/hooks/post", "#!/bin/sh\n");
  RunResult r = Run(box, "filesystem:\n  read_write: [" + tree + "]\n  protect: [" + tree + "/hooks]\n",
                    "echo evil > " + tree + "/hooks/post; echo write=$?\n"
                    "mv " + tree + "/hooks " + tree + "/moved; echo mv=$?\n"
                    "echo ok > " + tree + "/other; echo other=$?\n");
  if (landlock_only()) {
    // Landlock rules only add access: the report says the entry stays writable.
    EXPECT_TRUE(Contains(MissingText(r), "filesystem.protect '" + tree + "/hooks' stays writable")) << r.Describe();
    return;
  }
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "write=0")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "mv=0")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "other=0")) << r.Describe();
  EXPECT_EQ(ReadFile(tree + "/hooks/post").value_or(""), "#!/bin/sh\n");
}

TEST_P(HostTreesTest, ReadWriteMissingPathIsAnErrorNamingIt) {
  Sandbox box;
  const std::string missing = box.scratch() + "/not-there.git";
  RunResult r = Run(box, "filesystem:\n  read_write: [" + missing + "]\n", "echo ran");
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ran"));
  EXPECT_TRUE(Contains(r.err, missing + " does not exist")) << r.Describe();
  EXPECT_FALSE(Exists(missing));
}

// A cache written by one run is there for the next, kept in agentbox's own
// directory: the user's real ~/.npm is never touched.
TEST_P(HostTreesTest, CacheIsSharedAcrossRunsAndNotTheUsersOwn) {
  Sandbox box;
  const std::string marker = "cached-" + RandomHex();
  const std::string policy = "filesystem:\n  caches: {npm: ~/.npm}\n";
  RunResult first = Run(box, policy, "echo " + marker + " > ~/.npm/marker; echo wrote=$?");
  EXPECT_EQ(first.status, 0) << first.Describe();
  EXPECT_TRUE(Contains(first.out, "wrote=0")) << first.Describe();
  RunResult second = Run(box, policy, "cat ~/.npm/marker");
  EXPECT_EQ(second.status, 0) << second.Describe();
  EXPECT_EQ(second.out, marker + "\n") << second.Describe();

  const std::string backing = box.home() + "/.cache/agentbox/caches/npm";
  EXPECT_EQ(ReadFile(backing + "/marker").value_or(""), marker + "\n");
  struct stat st {};
  ASSERT_EQ(stat(backing.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_FALSE(Exists(box.home() + "/.npm")) << "the user's real ~/.npm was created";
  EXPECT_TRUE(Contains(FilesystemNotes(second), "filesystem.caches, writable and kept across runs: npm: ~/.npm from " +
                                                    backing))
      << second.Describe();
}

TEST_P(HostTreesTest, EnvPassPatternsTakeMatchingVariablesOnly) {
  Sandbox box;
  RunResult r = Run(box, "env:\n  pass: [PATH, NPM_CONFIG_*, \"*_proxy\"]\n", "env | sort",
                    {"NPM_CONFIG_REGISTRY=http://registry.invalid/", "NPM_CONFIG_CACHE=/c", "NPM_TOKEN=tok-secret",
                     "AGENTBOX_TEST_MARKER=x", "no_proxy=*", "other_proxy=kept"});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "NPM_CONFIG_REGISTRY=http://registry.invalid/\n")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "NPM_CONFIG_CACHE=/c\n")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "NPM_TOKEN")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "AGENTBOX_TEST_MARKER")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "other_proxy=kept\n")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "no_proxy=*")) << "a caller's no_proxy would route around the proxy: " << r.Describe();
}

// A .gitconfig imported from the real home gives git its identity; the
// import is read-only inside, and a missing one is skipped and reported.
TEST_P(HostTreesTest, HomeImportGivesGitItsIdentityReadOnly) {
  Sandbox box;
  const std::string gitconfig = "[user]\n\tname = Imported Name\n\temail = imported@example.com\n";
  WriteFile(box.home() + "/.gitconfig", gitconfig);
  const std::string script =
      "git commit -q --allow-empty -m inside; echo commit=$?\n"
      "git log -1 --format=%an/%ae\n"
      "echo '[alias] x = !evil' >> ~/.gitconfig; echo append=$?\n"
      "git config --global user.name Changed; echo config=$?\n";
  RunResult without = Run(box, "", "git commit -q --allow-empty -m inside; echo commit=$?");
  EXPECT_FALSE(Contains(without.out, "commit=0")) << "git had an identity without the import: " << without.Describe();

  RunResult r = Run(box, "home:\n  import: [.gitconfig, .npmrc]\n", script);
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "commit=0")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "Imported Name/imported@example.com")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "append=0")) << r.Describe();
  EXPECT_EQ(ReadFile(box.home() + "/.gitconfig").value_or(""), gitconfig);
  EXPECT_TRUE(Contains(Skipped(r), box.home() + "/.npmrc (home.import: .npmrc): absent on this host")) << r.Describe();
  EXPECT_TRUE(Contains(FilesystemNotes(r), "home.import, read-only in the sandbox's home")) << r.Describe();
}

TEST_P(HostTreesTest, HomeImportUnderADenyEntryIsRefused) {
  Sandbox box;
  WriteFile(box.home() + "/.ssh/config", "Host *\n");
  RunResult r = Run(box, "home:\n  import: [.ssh/config]\n", "cat ~/.ssh/config; echo ran");
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ran"));
  EXPECT_TRUE(Contains(r.err, "home.import '.ssh/config'")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "overlaps filesystem.deny '~/.ssh'")) << r.Describe();
}

// A read_only entry under ~ is found at ~/… with a private home.
TEST_P(HostTreesTest, ReadOnlyUnderThePrivateHome) {
  Sandbox box;
  WriteFile(box.home() + "/.pyenv/version", "3.12.1\n");
  RunResult r = Run(box, "filesystem:\n  read_only: [/usr, /bin, /sbin, /lib, /lib64, /etc, ~/.pyenv]\n",
                    "cat ~/.pyenv/version; echo x > ~/.pyenv/version; echo write=$?\n"
                    "cat ~/notes.txt; echo notes=$?\n");
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "3.12.1\n")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "write=0")) << r.Describe();
  // The rest of the real home stays out.
  EXPECT_FALSE(Contains(r.out, "notes=0")) << r.Describe();
  EXPECT_EQ(ReadFile(box.home() + "/.pyenv/version").value_or(""), "3.12.1\n");
}

INSTANTIATE_TEST_SUITE_P(Backends, HostTreesTest,
                         ::testing::Values(BackendCase{"Namespaces", {}},
                                           BackendCase{"LandlockOnly", {"--backend", "landlock", "--require",
                                                                        "partial"}}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(PolicyValidate, ListsEveryIndependentErrorOnItsOwnLine) {
  Sandbox box(Sandbox::GitRepo::kNone);
  const std::string file = box.scratch() + "/bad.yaml";
  WriteFile(file,
            "version: 1\n"
            "sandbox: {isolation: vm}\n"
            "filesystem:\n"
            "  caches: {Bad_Name: ~/.x}\n"
            "env:\n"
            "  pass: [\"1BAD\"]\n");
  RunResult r = RunCommand(box.AgentboxCommand({"policy", "validate", file}));
  EXPECT_EQ(r.status, 1) << r.Describe();
  std::vector<std::string> lines = Lines(r.err);
  ASSERT_EQ(lines.size(), 3u) << r.Describe();
  EXPECT_TRUE(Contains(lines[0], file + ":2:22: sandbox.isolation:")) << lines[0];
  EXPECT_TRUE(Contains(lines[1], file + ":4:12: filesystem.caches.Bad_Name: invalid cache name")) << lines[1];
  EXPECT_TRUE(Contains(lines[2], file + ":6:10: env.pass[0]:")) << lines[2];
}

}  // namespace
}  // namespace agentbox::e2e
