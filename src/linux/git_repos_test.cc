#include "linux/git_repos.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

namespace agentbox::linux {
namespace {

namespace fs = std::filesystem;
using Keys = std::vector<std::string>;

TEST(GitConfigKeys, ACleanConfigHasNone) {
  EXPECT_EQ(DangerousGitConfigKeys("[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"
                                   "[remote \"origin\"]\n\turl = /x\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n"
                                   "[branch \"main\"]\n\tremote = origin\n[user]\n\tname = a # hooksPath = x\n"),
            Keys{});
}

TEST(GitConfigKeys, TheNamedSettingsAreFoundInAnySpelling) {
  EXPECT_EQ(DangerousGitConfigKeys("[core]\n\thooksPath = /tmp\n"), Keys{"core.hookspath"});
  EXPECT_EQ(DangerousGitConfigKeys("[CORE] FSMonitor=/x\n"), Keys{"core.fsmonitor"});
  EXPECT_EQ(DangerousGitConfigKeys("\xEF\xBB\xBF[core]\nsshCommand = evil\n"), Keys{"core.sshcommand"});
  EXPECT_EQ(DangerousGitConfigKeys("[filter \"lfs\"]\n\tclean = x\n"), Keys{"filter.lfs.clean"});
  EXPECT_EQ(DangerousGitConfigKeys("[diff]\n\texternal = x\n"), Keys{"diff.external"});
  EXPECT_EQ(DangerousGitConfigKeys("[remote \"o\"]\n\tuploadpack = x\n\treceivepack = y\n"),
            (Keys{"remote.o.uploadpack", "remote.o.receivepack"}));
  EXPECT_EQ(DangerousGitConfigKeys("[include]\n\tpath = ../elsewhere\n"), Keys{"include.path"});
  EXPECT_EQ(DangerousGitConfigKeys("[includeIf \"gitdir:/\"]\n\tpath = x\n"), Keys{"includeif.gitdir:/.path"});
  EXPECT_EQ(DangerousGitConfigKeys("[remote.o]\n\tuploadpack = x\n"), Keys{"remote.o.uploadpack"});
}

TEST(GitConfigKeys, ContinuationLinesAndQuotesAreNotKeys) {
  EXPECT_EQ(DangerousGitConfigKeys("[user]\n\tname = a \\\nhooksPath = x\n"), Keys{});
  EXPECT_EQ(DangerousGitConfigKeys("[user]\n\tname = \"a ; b\" \n[core]\n\thooksPath\n"), Keys{"core.hookspath"});
}

class GitAuditTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/agentbox-git-audit-test.XXXXXX";
    ws_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(ws_); }
  void Write(const std::string& rel, const std::string& text, mode_t mode = 0644) {
    fs::create_directories(fs::path(ws_ + "/" + rel).parent_path());
    std::ofstream(ws_ + "/" + rel) << text;
    chmod((ws_ + "/" + rel).c_str(), mode);
  }
  void Repo(const std::string& git_dir) {
    Write(git_dir + "/HEAD", "ref: refs/heads/main\n");
    fs::create_directories(ws_ + "/" + git_dir + "/objects");
    fs::create_directories(ws_ + "/" + git_dir + "/refs");
    Write(git_dir + "/config", "[core]\n\tbare = false\n");
    Write(git_dir + "/hooks/pre-commit.sample", "#!/bin/sh\n", 0755);
  }
  std::string ws_;
};

TEST_F(GitAuditTest, FindsRepositoriesBareOnesSubmodulesAndGitFiles) {
  Repo(".git");
  Repo(".git/modules/a/b");
  Repo("sub/.git");
  Repo("store/bare.git");
  Write("wt/.git", "gitdir: ../store/bare.git\n");
  auto dirs = FindGitDirs(ws_, "");
  ASSERT_TRUE(dirs.ok()) << dirs.status().ToString();
  std::vector<std::string> got;
  for (const auto& d : *dirs) got.push_back(d.host_path.substr(ws_.size()) + (d.is_file ? " (file)" : ""));
  EXPECT_EQ(got, (std::vector<std::string>{"/.git", "/.git/modules/a/b", "/store/bare.git", "/sub/.git",
                                           "/wt/.git (file)"}));
}

TEST_F(GitAuditTest, QuarantinesOnlyWhatCouldRunAndOnlyInNewRepositories) {
  Repo("old/.git");
  Write("old/.git/hooks/pre-commit", "#!/bin/sh\n", 0755);
  Repo("new/.git");
  Write("new/.git/hooks/pre-commit", "#!/bin/sh\n", 0755);
  Write("new/.git/hooks/notes.txt", "not executable\n", 0644);
  Repo("tame/.git");
  Write("new/.git/config", "[core]\n\thooksPath = /tmp\n");
  auto found = AuditGitRepos(ws_, {ws_ + "/old/.git"}, true, true, "");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_EQ(found->size(), 2u);
  EXPECT_EQ((*found)[0].op, "git-hook");
  EXPECT_EQ((*found)[0].quarantined, ws_ + "/new/.git/hooks/pre-commit.agentbox-quarantine");
  EXPECT_EQ((*found)[1].op, "git-config");
  EXPECT_EQ((*found)[1].quarantined, ws_ + "/new/.git/config.agentbox-quarantine");
  struct stat st {};
  ASSERT_EQ(stat((*found)[0].quarantined.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0111, 0u);
  EXPECT_TRUE(fs::exists(ws_ + "/old/.git/hooks/pre-commit")) << "a repository protected at the start is left alone";
  EXPECT_TRUE(fs::exists(ws_ + "/new/.git/hooks/notes.txt"));
  EXPECT_TRUE(fs::exists(ws_ + "/new/.git/hooks/pre-commit.sample"));
  EXPECT_TRUE(fs::exists(ws_ + "/tame/.git/config"));
}

// The audit takes the cache the launch's search left in memory (a run's
// ScanCaches) instead of its file: a repository made after the launch, at
// the top or deep in directories the cache holds verdicts for, is audited
// all the same, and one made and audited again is audited again.
TEST_F(GitAuditTest, TheLaunchsKeptCacheNeverHidesARepositoryMadeAfterIt) {
  char tmpl[] = "/tmp/agentbox-git-cache-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string cache = tmpl;
  Repo("old/.git");
  fs::create_directories(ws_ + "/a/b/c");
  // Verdicts are kept only for directories unchanged for a second.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ScanCaches kept;
  auto launch = FindGitDirs(ws_, cache, nullptr, &kept);
  ASSERT_TRUE(launch.ok()) << launch.status().ToString();
  ASSERT_EQ(launch->size(), 1u);
  Repo("new/.git");
  Write("new/.git/hooks/pre-commit", "#!/bin/sh\n", 0755);
  Repo("a/b/c/deep/.git");
  Write("a/b/c/deep/.git/hooks/post-checkout", "#!/bin/sh\n", 0755);
  auto found = AuditGitRepos(ws_, {ws_ + "/old/.git"}, true, true, cache, &kept);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  std::vector<std::string> paths;
  for (const auto& f : *found) paths.push_back(f.host_path.substr(ws_.size()));
  std::sort(paths.begin(), paths.end());
  EXPECT_EQ(paths, (std::vector<std::string>{"/a/b/c/deep/.git/hooks/post-checkout", "/new/.git/hooks/pre-commit"}));
  Write("new/.git/hooks/pre-push", "#!/bin/sh\n", 0755);
  found = AuditGitRepos(ws_, {ws_ + "/old/.git"}, true, true, cache, &kept);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_EQ(found->size(), 1u);
  EXPECT_EQ((*found)[0].host_path, ws_ + "/new/.git/hooks/pre-push");
  fs::remove_all(cache);
}

TEST_F(GitAuditTest, ASymlinkedHookIsQuarantinedToo) {
  Repo("new/.git");
  Write("payload.sh", "#!/bin/sh\n", 0755);
  fs::create_symlink("../../../payload.sh", ws_ + "/new/.git/hooks/post-checkout");
  auto found = AuditGitRepos(ws_, {}, true, true, "");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_EQ(found->size(), 1u);
  EXPECT_TRUE(fs::is_symlink(ws_ + "/new/.git/hooks/post-checkout.agentbox-quarantine"));
  struct stat st {};
  ASSERT_EQ(stat((ws_ + "/payload.sh").c_str(), &st), 0);
  EXPECT_NE(st.st_mode & 0111, 0u) << "the link's target is the user's file, not touched";
}

// A git directory hidden where the walk does not look (inside another
// `.git`) is still found through the `.git` file that names it.
TEST_F(GitAuditTest, AGitDirectoryNamedByAGitFileIsAuditedWhereverItLies) {
  Repo("new/.git");
  Repo("new/.git/stash/x");
  Write("new/.git/stash/x/hooks/pre-commit", "#!/bin/sh\n", 0755);
  Write("wt/.git", "gitdir: ../new/.git/stash/x\n");
  auto found = AuditGitRepos(ws_, {}, true, true, "");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_EQ(found->size(), 1u);
  EXPECT_EQ((*found)[0].host_path, ws_ + "/new/.git/stash/x/hooks/pre-commit");
}

TEST_F(GitAuditTest, AHardLinkedHookIsRenamedAndTheOtherNameKeepsItsMode) {
  Repo("new/.git");
  Write("tools/build.sh", "#!/bin/sh\n", 0755);
  ASSERT_EQ(link((ws_ + "/tools/build.sh").c_str(), (ws_ + "/new/.git/hooks/pre-push").c_str()), 0);
  auto found = AuditGitRepos(ws_, {}, true, false, "");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_EQ(found->size(), 1u);
  EXPECT_FALSE(fs::exists(ws_ + "/new/.git/hooks/pre-push"));
  EXPECT_TRUE(fs::exists(ws_ + "/new/.git/hooks/pre-push.agentbox-quarantine"));
  struct stat st {};
  ASSERT_EQ(stat((ws_ + "/tools/build.sh").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u) << "the workspace's own script lost its mode";
}

// Each repository costs a few mounts: past the cap the run is refused,
// rather than some repositories left unprotected.
TEST_F(GitAuditTest, TooManyRepositoriesAreRefusedNotHalfProtected) {
  for (std::size_t i = 0; i <= kMaxGitDirs; ++i) fs::create_directories(ws_ + "/r" + std::to_string(i) + "/.git");
  auto dirs = FindGitDirs(ws_, "");
  ASSERT_FALSE(dirs.ok());
  EXPECT_EQ(dirs.status().stage(), "protect");
  EXPECT_NE(dirs.status().message().find("more than " + std::to_string(kMaxGitDirs)), std::string::npos)
      << dirs.status().ToString();
  fs::remove_all(ws_ + "/r0");
  EXPECT_TRUE(FindGitDirs(ws_, "").ok()) << "exactly the cap is allowed";
}

TEST_F(GitAuditTest, TheWorkspaceItselfAsABareRepositoryIsFound) {
  Repo("");
  auto dirs = FindGitDirs(ws_, "");
  ASSERT_TRUE(dirs.ok()) << dirs.status().ToString();
  ASSERT_EQ(dirs->size(), 1u);
  EXPECT_EQ((*dirs)[0].host_path, ws_);
}

}  // namespace
}  // namespace agentbox::linux
