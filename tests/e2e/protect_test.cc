// filesystem.protect: .git/hooks and .git/config stay read-only inside a
// writable workspace, and cannot be swapped out by renames, symlinks or a
// freshly created directory. A planted hook would run outside the sandbox,
// the next time the user commits.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <set>
#include <string>

#include "harness.h"

namespace agentbox::e2e {
namespace {

bool IsSymlink(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

TEST(Protect, HooksDirectoryIsReadOnly) {
  Sandbox sb;
  ASSERT_TRUE(IsDir(sb.ws() + "/.git/hooks"));
  WriteFile(sb.ws() + "/.git/hooks/existing.sample", "#!/bin/sh\nexit 0\n", 0644);
  RunResult r = sb.Sh(
      "echo x > .git/hooks/pre-commit; echo \"plant=$?\";"
      "mv .git/hooks/existing.sample .git/hooks/pre-push; echo \"mv=$?\";"
      "chmod +x .git/hooks/existing.sample; echo \"chmod=$?\";"
      "echo evil >> .git/hooks/existing.sample; echo \"append=$?\"; exit 0");
  ASSERT_EQ(r.status, 0) << r.Describe();
  for (const char* op : {"plant=0", "mv=0", "chmod=0", "append=0"}) {
    EXPECT_FALSE(Contains(r.out, op)) << op << "\n" << r.Describe();
  }
  EXPECT_FALSE(Exists(sb.ws() + "/.git/hooks/pre-commit"));
  EXPECT_FALSE(Exists(sb.ws() + "/.git/hooks/pre-push"));
  EXPECT_EQ(ReadFile(sb.ws() + "/.git/hooks/existing.sample").value_or(""), "#!/bin/sh\nexit 0\n");
  struct stat st {};
  ASSERT_EQ(stat((sb.ws() + "/.git/hooks/existing.sample").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
}

TEST(Protect, PlantingAHookIsReportedAsDenial) {
  Sandbox sb;
  RunResult r = sb.Sh("echo x > .git/hooks/pre-commit");
  EXPECT_NE(r.status, 0) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  EXPECT_TRUE(HasDenial(r, ".git/hooks")) << r.Describe();
  EXPECT_FALSE(Exists(sb.ws() + "/.git/hooks/pre-commit"));
}

TEST(Protect, RenamingGitAwayFailsWithEbusy) {
  Sandbox sb;
  RunResult r = sb.Sh("mv .git .git2 && mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit");
  EXPECT_NE(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "Device or resource busy")) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  EXPECT_FALSE(Exists(sb.ws() + "/.git2"));
  EXPECT_TRUE(IsDir(sb.ws() + "/.git/objects")) << ".git should still be the original repository";
  EXPECT_FALSE(Exists(sb.ws() + "/.git/hooks/pre-commit"));
  EXPECT_EQ(sb.Git({"rev-parse", "--git-dir"}).out, ".git\n");
}

TEST(Protect, SymlinkSwapOfHooksFails) {
  Sandbox sb;
  RunResult r = sb.Sh(
      "mkdir -p /tmp/evil && echo evil > /tmp/evil/pre-commit;"
      "rm -rf .git/hooks; ln -s /tmp/evil .git/hooks; echo \"ln=$?\";"
      "mv .git/hooks .git/h2; echo \"mv=$?\";"
      "ln -sfn /tmp/evil .git/hooks; echo \"lnf=$?\"; exit 0");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ln=0")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "mv=0")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "lnf=0")) << r.Describe();
  EXPECT_FALSE(IsSymlink(sb.ws() + "/.git/hooks"));
  EXPECT_TRUE(IsDir(sb.ws() + "/.git/hooks"));
  EXPECT_FALSE(Exists(sb.ws() + "/.git/h2"));
}

TEST(Protect, RenamingAnAncestorOfAProtectedPathFails) {
  Sandbox sb(Sandbox::GitRepo::kNone);
  MakeDirs(sb.ws() + "/a");
  ASSERT_EQ(sb.Git({"init", "-q", "a"}).status, 0);
  ASSERT_TRUE(IsDir(sb.ws() + "/a/.git/hooks"));
  WriteFile(sb.scratch() + "/policy.yaml", "version: 1\nfilesystem:\n  protect: [a/.git/hooks]\n");
  RunResult r = sb.Sh("mv a b; echo \"a=$?\"; mv a/.git a/.git2; echo \"git=$?\";"
                      "echo evil > a/.git/hooks/pre-commit; echo \"plant=$?\"; exit 0",
                      {"--policy", sb.scratch() + "/policy.yaml"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "a=0")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "git=0")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "plant=0")) << r.Describe();
  EXPECT_TRUE(IsDir(sb.ws() + "/a/.git/hooks"));
  EXPECT_FALSE(Exists(sb.ws() + "/b"));
  EXPECT_FALSE(Exists(sb.ws() + "/a/.git2"));
  EXPECT_FALSE(Exists(sb.ws() + "/a/.git/hooks/pre-commit"));
}

TEST(Protect, GitConfigIsReadOnlyButCommitsWork) {
  Sandbox sb;
  const std::string config_before = ReadFile(sb.ws() + "/.git/config").value_or("<missing>");
  RunResult r = sb.Sh(
      "git config user.name x; echo \"config=$?\";"
      "echo '[core]' >> .git/config; echo \"append=$?\";"
      "ln .git/config cfg-link && echo '\thooksPath = /tmp' >> cfg-link; echo \"link=$?\";"
      "git -c user.name=t -c user.email=t@e commit -q --allow-empty -m e2e-commit-message; echo \"commit=$?\"");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "config=0")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "append=0")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "commit=0")) << "committing must still work\n" << r.Describe();
  EXPECT_EQ(ReadFile(sb.ws() + "/.git/config").value_or("<missing>"), config_before);
  RunResult log = sb.Git({"log", "--format=%s"});
  EXPECT_EQ(log.status, 0) << log.Describe();
  EXPECT_EQ(log.out, "e2e-commit-message\n") << log.Describe();
}

TEST(Protect, MissingHooksDirectoryCannotBeCreatedAndLeavesNoTrace) {
  Sandbox sb;
  ASSERT_TRUE(RemoveTree(sb.ws() + "/.git/hooks"));
  RunResult r = sb.Sh("mkdir .git/hooks; echo \"mkdir=$?\"; mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit;"
                      "echo \"plant=$?\"; exit 0");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "mkdir=0")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "plant=0")) << r.Describe();
  EXPECT_FALSE(Exists(sb.ws() + "/.git/hooks")) << "no placeholder (or planted directory) may remain";
}

TEST(Protect, PlaceholderSurvivesWhileAnotherRunStillNeedsIt) {
  Sandbox sb;
  ASSERT_TRUE(RemoveTree(sb.ws() + "/.git/hooks"));
  Command first = sb.AgentboxCommand(
      {"run", "--", "sh", "-c", "echo ready; while [ ! -e go ]; do sleep 0.05; done; mkdir .git/hooks; echo \"late=$?\""});
  Process a(first);
  ASSERT_TRUE(a.WaitForStdout("ready\n", 15000)) << a.out() << a.err();
  RunResult second = sb.Sh("true");
  EXPECT_EQ(second.status, 0) << second.Describe();
  EXPECT_FALSE(IsDir(sb.ws() + "/.git/hooks")) << "a directory appeared while the first run is still going";
  WriteFile(sb.ws() + "/go", "");
  RunResult r = a.Wait();
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "late=")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "late=0")) << "the first run lost its protection when the second ended\n"
                                           << r.Describe();
  EXPECT_FALSE(Exists(sb.ws() + "/.git/hooks"));
}

TEST(Protect, WorkspaceWithoutGitRunsAndCannotPlantARepository) {
  Sandbox sb(Sandbox::GitRepo::kNone);
  RunResult ok = sb.Sh("echo plain-workspace");
  EXPECT_EQ(ok.status, 0) << "a workspace that is not a git repository must run\n" << ok.Describe();
  EXPECT_EQ(ok.out, "plain-workspace\n") << ok.Describe();
  EXPECT_EQ(OutcomeOf(ok), "exited") << ok.Describe();
  EXPECT_FALSE(Exists(sb.ws() + "/.git")) << "no placeholder may remain after the run";

  RunResult plant = sb.Sh("mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit; exit 0");
  EXPECT_FALSE(Exists(sb.ws() + "/.git/hooks/pre-commit")) << plant.Describe();
}

TEST(Protect, PlaceholderLeftByAKilledSupervisorIsCleanedByTheNextRun) {
  Sandbox sb;
  ASSERT_TRUE(RemoveTree(sb.ws() + "/.git/hooks"));
  {
    Process p(sb.AgentboxCommand({"run", "--", "sh", "-c", "echo ready; exec sleep 60"}));
    ASSERT_TRUE(p.WaitForStdout("ready\n", 15000)) << p.out() << p.err();
    ASSERT_EQ(kill(p.pid(), SIGKILL), 0);
    p.Wait();
  }
  RunResult r = sb.Sh("mkdir .git/hooks; echo \"mkdir=$?\"");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "mkdir=0")) << "the stale placeholder's path must still be protected\n"
                                           << r.Describe();
  EXPECT_FALSE(Exists(sb.ws() + "/.git/hooks")) << "the stale placeholder was not cleaned up";
}

// In a linked worktree or a submodule, `.git` is a file naming the git
// directory: rewriting it would point host git at planted hooks.
TEST(Protect, GitFileOfAWorktreeCannotBeRedirected) {
  Sandbox sb(Sandbox::GitRepo::kNone);
  const std::string gitfile = "gitdir: " + sb.scratch() + "/main/.git/worktrees/linked\n";
  WriteFile(sb.ws() + "/.git", gitfile);
  RunResult r = sb.Sh("mkdir -p evil/hooks && echo evil > evil/hooks/pre-commit;"
                      "echo 'gitdir: ./evil' > .git; echo \"write=$?\"; mv .git moved; echo \"mv=$?\";"
                      "rm -f .git; echo \"rm=$?\"; echo worktree-ran");
  ASSERT_EQ(r.status, 0) << "a linked worktree must run\n" << r.Describe();
  EXPECT_TRUE(Contains(r.out, "worktree-ran")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "write=0")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "mv=0")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "rm=0")) << r.Describe();
  EXPECT_EQ(ReadFile(sb.ws() + "/.git").value_or("<missing>"), gitfile);
}

TEST(Protect, SymlinkedHooksOnTheHostAreNotWritableThrough) {
  Sandbox sb;
  TempDir elsewhere("agentbox-e2e-hooks-");
  ASSERT_TRUE(RemoveTree(sb.ws() + "/.git/hooks"));
  ASSERT_EQ(symlink(elsewhere.path().c_str(), (sb.ws() + "/.git/hooks").c_str()), 0);
  RunResult r = sb.Sh("echo evil > .git/hooks/pre-commit; exit 0");
  EXPECT_FALSE(Exists(elsewhere / "pre-commit")) << "a hook was planted through a symlinked .git/hooks\n"
                                                 << r.Describe();
  if (r.status == 125) {
    EXPECT_EQ(OutcomeOf(r), "sandbox_error") << r.Describe();
    EXPECT_EQ(ErrorStage(r), "protect") << r.Describe();
  }
}


// A repository in a subfolder (a clone, a `git init`, a bare repository, a
// submodule's git directory) runs its hooks on the host as the root's do:
// the same protection, for every one present at the start.
TEST(Protect, RepositoriesInSubfoldersAreProtectedLikeTheRoot) {
  Sandbox sb;
  ASSERT_EQ(sb.Git({"init", "-q", "sub"}).status, 0);
  ASSERT_EQ(sb.Git({"clone", "-q", sb.ws() + "/sub", "deep/cloned"}).status, 0);
  ASSERT_EQ(sb.Git({"init", "-q", "--bare", "bare.git"}).status, 0);
  ASSERT_EQ(sb.Git({"init", "-q", "--bare", ".git/modules/lib"}).status, 0);
  ASSERT_TRUE(IsDir(sb.ws() + "/deep/cloned/.git/hooks"));
  const std::string config_before = ReadFile(sb.ws() + "/sub/.git/config").value_or("<missing>");
  RunResult r = sb.Sh(
      "for d in sub/.git deep/cloned/.git bare.git .git/modules/lib; do"
      "  echo evil > $d/hooks/pre-commit && echo \"planted=$d\";"
      "  echo '[core] hooksPath = /tmp' >> $d/config && echo \"configured=$d\";"
      "done;"
      "git -C sub config core.fsmonitor /tmp/evil && echo configured=git;"
      "mv sub/.git sub/.git2 && echo moved=sub; mv deep other && echo moved=deep; exit 0");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "planted=")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "configured=")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "moved=")) << r.Describe();
  for (const char* d : {"sub/.git", "deep/cloned/.git", "bare.git", ".git/modules/lib"}) {
    EXPECT_FALSE(Exists(sb.ws() + "/" + d + "/hooks/pre-commit")) << d;
    EXPECT_FALSE(Contains(ReadFile(sb.ws() + "/" + d + "/config").value_or(""), "hooksPath")) << d;
  }
  EXPECT_EQ(ReadFile(sb.ws() + "/sub/.git/config").value_or("<missing>"), config_before);
  EXPECT_TRUE(IsDir(sb.ws() + "/sub/.git/objects"));
  EXPECT_EQ(OutcomeOf(r), "exited") << "nothing was planted\n" << r.Describe();
}

// A repository inside a denied directory is hidden whole: nothing of it
// to bind, and the run goes on.
TEST(Protect, ARepositoryInsideADeniedDirectoryStaysHidden) {
  Sandbox sb;
  ASSERT_EQ(sb.Git({"init", "-q", "secret/repo"}).status, 0);
  ASSERT_EQ(sb.Git({"init", "-q", "vendor"}).status, 0);
  WriteFile(sb.scratch() + "/policy.yaml", "mode: workspace-write\nfilesystem:\n  deny: [\"secret/\"]\n");
  RunResult r = sb.Sh("ls secret/repo/.git; echo \"ls=$?\"; echo x > vendor/.git/hooks/pre-commit; echo \"plant=$?\"",
                      {"--policy", sb.scratch() + "/policy.yaml"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "ls=")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ls=0")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "plant=")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "plant=0")) << r.Describe();
}

// A repository the command creates was not there to protect: at the end,
// its executable hooks and dangerous settings are reported and quarantined.
TEST(Protect, RepositoryCreatedDuringTheRunIsAuditedAndQuarantined) {
  Sandbox sb;
  RunResult r = sb.Sh(
      "git init -q fresh && printf '#!/bin/sh\necho pwned\n' > fresh/.git/hooks/pre-commit &&"
      " chmod +x fresh/.git/hooks/pre-commit && git -C fresh config core.hooksPath /tmp/evil &&"
      " git init -q --bare fresh-bare.git && printf '#!/bin/sh\n' > fresh-bare.git/hooks/post-update &&"
      " chmod 755 fresh-bare.git/hooks/post-update && git init -q tame && echo all-done");
  ASSERT_TRUE(Contains(r.out, "all-done")) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  ASSERT_TRUE(r.report) << r.Describe();
  std::set<std::string> ops;
  for (const auto& d : (*r.report)["denials"]) {
    const std::string target = d.value("target", "");
    if (Contains(target, "fresh/.git/hooks/pre-commit")) {
      ops.insert(d.value("op", "") + ":hook");
      EXPECT_TRUE(Contains(d.value("reason", ""), "pre-commit.agentbox-quarantine")) << d.dump();
    }
    if (Contains(target, "fresh/.git/config")) {
      ops.insert(d.value("op", "") + ":config");
      EXPECT_TRUE(Contains(d.value("reason", ""), "core.hookspath")) << d.dump();
      EXPECT_TRUE(Contains(d.value("reason", ""), "config.agentbox-quarantine")) << d.dump();
    }
    if (Contains(target, "fresh-bare.git/hooks/post-update")) ops.insert(d.value("op", "") + ":bare");
    EXPECT_FALSE(Contains(target, "tame")) << "a plain `git init` is not a denial: " << d.dump();
  }
  EXPECT_EQ(ops, (std::set<std::string>{"git-hook:hook", "git-config:config", "git-hook:bare"})) << r.Describe();
  const std::string hooks = sb.ws() + "/fresh/.git/hooks/";
  EXPECT_FALSE(Exists(hooks + "pre-commit"));
  struct stat st {};
  ASSERT_EQ(lstat((hooks + "pre-commit.agentbox-quarantine").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0111, 0u) << "the quarantined hook is still executable";
  EXPECT_FALSE(Exists(sb.ws() + "/fresh/.git/config"));
  EXPECT_TRUE(Contains(ReadFile(sb.ws() + "/fresh/.git/config.agentbox-quarantine").value_or(""), "hooksPath"));
  EXPECT_FALSE(Exists(sb.ws() + "/fresh-bare.git/hooks/post-update"));
  EXPECT_TRUE(Exists(sb.ws() + "/tame/.git/config")) << "a clean config stays";
  // A second run protects the quarantined repository like any other.
  RunResult again = sb.Sh("echo evil > fresh/.git/hooks/pre-commit; echo \"plant=$?\"; exit 0");
  EXPECT_FALSE(Contains(again.out, "plant=0")) << again.Describe();
  EXPECT_EQ(OutcomeOf(again), "exited") << again.Describe();
}

}  // namespace
}  // namespace agentbox::e2e
