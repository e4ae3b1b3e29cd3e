// Layers: diffs of hand-built layer stacks (whiteouts, opaque directories,
// type changes), of real overlay mounts (in a child in its own user and mount
// namespaces) applied with `git apply`, snapshots and their verification.
#include "session/layers.h"
#include "session/test_files.h"
#include "session/unified_diff.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>

namespace agentbox::session {
namespace {

namespace fs = std::filesystem;

using testing::Read;
using testing::Write;

struct LayersDir : testing::TempDir {
  LayersDir() : testing::TempDir("layers") {}
};

void Whiteout(const std::string& path) {
  fs::create_directories(fs::path(path).parent_path());
  ASSERT_EQ(mknod(path.c_str(), S_IFCHR, makedev(0, 0)), 0) << path << ": " << std::strerror(errno);
}

void MakeOpaque(const std::string& dir) {
  fs::create_directories(dir);
  ASSERT_EQ(setxattr(dir.c_str(), "user.overlay.opaque", "y", 1, 0), 0) << dir << ": " << std::strerror(errno);
}

// Runs a shell command; returns its exit status and sets *output to what it printed.
int Sh(const std::string& command, std::string* output = nullptr) {
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  int status = pclose(p);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

const char* kGit = "git -c user.name=t -c user.email=t@example.com -c commit.gpgsign=false -c init.defaultBranch=main";

void CommitAll(const std::string& dir) {
  std::string out;
  ASSERT_EQ(Sh(std::string(kGit) + " -C " + dir + " init -q && " + kGit + " -C " + dir + " add -A && " + kGit +
               " -C " + dir + " commit -q --allow-empty -m base",
               &out),
            0)
      << out;
}

// What git can carry of a tree: files (content, executable bit) and
// symlinks, by path; .git left out.
std::map<std::string, std::string> GitView(const std::string& root) {
  std::map<std::string, std::string> view;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    if (it->path().filename() == ".git") {
      it.disable_recursion_pending();
      continue;
    }
    std::string rel = it->path().lexically_relative(root).string();
    if (it->is_symlink()) {
      view[rel] = "link:" + fs::read_symlink(it->path()).string();
    } else if (it->is_regular_file()) {
      struct stat st {};
      stat(it->path().c_str(), &st);
      view[rel] = std::string((st.st_mode & S_IXUSR) ? "x:" : "f:") + Read(it->path());
    }
  }
  return view;
}

// Clones the git repository `base` into `clone`, applies `patch` there with
// git apply, and returns what git apply said (empty: success).
std::string GitApply(const std::string& base, const std::string& clone, const std::string& patch) {
  std::string out;
  if (Sh(std::string(kGit) + " clone -q " + base + " " + clone, &out) != 0) return "clone failed: " + out;
  const std::string patch_file = clone + ".patch";
  std::ofstream(patch_file, std::ios::binary) << patch;
  int rc = Sh(std::string(kGit) + " -C " + clone + " apply --whitespace=nowarn " + patch_file, &out);
  fs::remove(patch_file);
  return rc == 0 ? "" : "git apply failed: " + out;
}

std::map<std::string, std::string> Statuses(const Json& diff) {
  std::map<std::string, std::string> m;
  for (const Json& f : diff["files"]) m[f["path"]] = f["status"];
  return m;
}

Json Diff(const LayerStack& stack, std::size_t max_patch = 1 << 20) {
  auto d = ComputeDiff(stack, max_patch);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : Json();
}

// ------------------------------------------------------------------ hand-built stacks

TEST(LayersDiff, AddedModifiedDeletedInAHandBuiltUpper) {
  LayersDir t;
  Write(t / "base/keep.txt", "same\n");
  Write(t / "base/edit.txt", "one\ntwo\nthree\n");
  Write(t / "base/gone.txt", "bye\n");
  Write(t / "upper/edit.txt", "one\nTWO\nthree\n");
  Write(t / "upper/added.txt", "hello\n");
  Whiteout(t / "upper/gone.txt");
  Json d = Diff({t / "base", {}, t / "upper"});
  EXPECT_EQ(Statuses(d), (std::map<std::string, std::string>{
                             {"added.txt", "added"}, {"edit.txt", "modified"}, {"gone.txt", "deleted"}}));
  const std::string null_id(40, '0');
  EXPECT_EQ(d["patch"],
            "diff --git a/added.txt b/added.txt\nnew file mode 100644\nindex " + null_id + ".." +
                GitBlobId("hello\n") + "\n--- /dev/null\n+++ b/added.txt\n"
                "@@ -0,0 +1 @@\n+hello\n"
                "diff --git a/edit.txt b/edit.txt\nindex " + GitBlobId("one\ntwo\nthree\n") + ".." +
                GitBlobId("one\nTWO\nthree\n") + " 100644\n--- a/edit.txt\n+++ b/edit.txt\n"
                "@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"
                "diff --git a/gone.txt b/gone.txt\ndeleted file mode 100644\nindex " + GitBlobId("bye\n") + ".." +
                null_id + "\n--- a/gone.txt\n+++ /dev/null\n"
                "@@ -1 +0,0 @@\n-bye\n");
  EXPECT_FALSE(d["truncated"].get<bool>());
}

TEST(LayersDiff, CopiedUpButUnchangedIsNoChange) {
  LayersDir t;
  Write(t / "base/a/b.txt", "x\n");
  Write(t / "upper/a/b.txt", "x\n");  // overlay copies a file up when it is opened for writing
  Json d = Diff({t / "base", {}, t / "upper"});
  EXPECT_TRUE(d["files"].empty()) << d.dump(1);
  EXPECT_EQ(d["patch"], "");
}

TEST(LayersDiff, OpaqueDirectoryDeletesWhatWasBelow) {
  LayersDir t;
  Write(t / "base/docs/a.md", "a\n");
  Write(t / "base/docs/sub/b.md", "b\n");
  Write(t / "base/docs/kept.md", "same\n");
  MakeOpaque(t / "upper/docs");
  Write(t / "upper/docs/kept.md", "same\n");
  Write(t / "upper/docs/new.md", "n\n");
  Json d = Diff({t / "base", {}, t / "upper"});
  EXPECT_EQ(Statuses(d), (std::map<std::string, std::string>{
                             {"docs/a.md", "deleted"}, {"docs/new.md", "added"}, {"docs/sub/b.md", "deleted"}}));
}

TEST(LayersDiff, WhiteoutOfADirectoryDeletesEveryFileInIt) {
  LayersDir t;
  Write(t / "base/lib/x.c", "x\n");
  Write(t / "base/lib/deep/y.c", "y\n");
  Whiteout(t / "upper/lib");
  Json d = Diff({t / "base", {}, t / "upper"});
  EXPECT_EQ(Statuses(d),
            (std::map<std::string, std::string>{{"lib/deep/y.c", "deleted"}, {"lib/x.c", "deleted"}}));
}

TEST(LayersDiff, FileReplacedByDirectoryAndBack) {
  LayersDir t;
  Write(t / "base/was_file", "f\n");
  Write(t / "base/was_dir/in.txt", "i\n");
  MakeOpaque(t / "upper/was_file");  // overlay makes a directory created over a whiteout opaque
  Write(t / "upper/was_file/inside.txt", "new\n");
  Write(t / "upper/was_dir", "now a file\n");
  Json d = Diff({t / "base", {}, t / "upper"});
  EXPECT_EQ(Statuses(d), (std::map<std::string, std::string>{{"was_dir", "added"},
                                                              {"was_dir/in.txt", "deleted"},
                                                              {"was_file", "deleted"},
                                                              {"was_file/inside.txt", "added"}}));
  CommitAll(t / "base");
  EXPECT_EQ(GitApply(t / "base", t / "clone", d["patch"]), "");
  EXPECT_EQ(GitView(t / "clone"), (std::map<std::string, std::string>{{"was_dir", "f:now a file\n"},
                                                                      {"was_file/inside.txt", "f:new\n"}}));
}

TEST(LayersDiff, ModeOnlyChange) {
  LayersDir t;
  Write(t / "base/run.sh", "echo hi\n", 0644);
  Write(t / "upper/run.sh", "echo hi\n", 0755);
  Write(t / "base/private.txt", "p\n", 0644);
  Write(t / "upper/private.txt", "p\n", 0600);  // git carries the executable bit only
  Json d = Diff({t / "base", {}, t / "upper"});
  EXPECT_EQ(Statuses(d), (std::map<std::string, std::string>{{"run.sh", "modified"}}));
  EXPECT_EQ(d["patch"], "diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n");
}

TEST(LayersDiff, SymlinksAddedRetargetedAndTurnedIntoFiles) {
  LayersDir t;
  Write(t / "base/target.txt", "t\n");
  fs::create_symlink("target.txt", t / "base/old_link");
  fs::create_symlink("target.txt", t / "base/becomes_file");
  fs::create_directories(t / "upper");
  fs::create_symlink("target.txt", t / "upper/new_link");
  fs::create_symlink("elsewhere.txt", t / "upper/old_link");
  Write(t / "upper/becomes_file", "plain\n");
  Json d = Diff({t / "base", {}, t / "upper"});
  EXPECT_EQ(Statuses(d), (std::map<std::string, std::string>{
                             {"becomes_file", "modified"}, {"new_link", "added"}, {"old_link", "modified"}}));
  const std::string patch = d["patch"];
  EXPECT_NE(patch.find("diff --git a/new_link b/new_link\nnew file mode 120000\nindex " + std::string(40, '0') + ".." +
                       GitBlobId("target.txt") + "\n--- /dev/null\n+++ b/new_link\n"
                       "@@ -0,0 +1 @@\n+target.txt\n\\ No newline at end of file\n"),
            std::string::npos)
      << patch;
  CommitAll(t / "base");
  EXPECT_EQ(GitApply(t / "base", t / "clone", patch), "");
  EXPECT_EQ(GitView(t / "clone"), (std::map<std::string, std::string>{{"becomes_file", "f:plain\n"},
                                                                      {"new_link", "link:target.txt"},
                                                                      {"old_link", "link:elsewhere.txt"},
                                                                      {"target.txt", "f:t\n"}}));
}

TEST(LayersDiff, BinaryFilesAreGitBinaryPatchesThatGitApplies) {
  LayersDir t;
  Write(t / "base/blob.bin", std::string("a\0b", 3));
  Write(t / "base/gone.bin", std::string("\0gone", 5));
  std::string big;
  std::mt19937 rng(7);
  for (int i = 0; i < 5000; ++i) big.push_back(static_cast<char>(rng()));  // incompressible, many lines
  Write(t / "upper/blob.bin", std::string("a\0c", 3));
  Write(t / "upper/new.bin", std::string("\0\1\2", 3));
  Write(t / "upper/big.bin", big + std::string(1, '\0'));
  Whiteout(t / "upper/gone.bin");
  Json d = Diff({t / "base", {}, t / "upper"});
  ASSERT_EQ(d["files"].size(), 4u);
  EXPECT_EQ(d["files"][1], (Json{{"path", "blob.bin"}, {"status", "modified"}, {"binary", true}}));
  EXPECT_EQ(d["files"][3], (Json{{"path", "new.bin"}, {"status", "added"}, {"binary", true}}));
  const std::string patch = d["patch"];
  EXPECT_NE(patch.find("diff --git a/blob.bin b/blob.bin\nindex " + GitBlobId(std::string("a\0b", 3)) + ".." +
                       GitBlobId(std::string("a\0c", 3)) + " 100644\nGIT binary patch\nliteral 3\n"),
            std::string::npos)
      << patch;
  EXPECT_EQ(patch.find("Binary files"), std::string::npos) << patch;
  CommitAll(t / "base");
  EXPECT_EQ(GitApply(t / "base", t / "clone", patch), "");
  EXPECT_EQ(GitView(t / "clone"), (std::map<std::string, std::string>{
                                      {"big.bin", "f:" + big + std::string(1, '\0')},
                                      {"blob.bin", "f:" + std::string("a\0c", 3)},
                                      {"new.bin", "f:" + std::string("\0\1\2", 3)}}));
}

TEST(LayersDiff, BlobIdsAreGits) {
  LayersDir t;
  for (const std::string& content : {std::string(), std::string("x\n"), std::string("a\0b\xff", 4)}) {
    Write(t / "f", content);
    std::string out;
    ASSERT_EQ(Sh("git hash-object " + (t / "f"), &out), 0) << out;
    EXPECT_EQ(GitBlobId(content) + "\n", out);
  }
}

TEST(LayersDiff, LowerLayersStackUnderTheUpper) {
  LayersDir t;
  Write(t / "base/a.txt", "a\n");
  Write(t / "base/b.txt", "b\n");
  Write(t / "base/c.txt", "c\n");
  // Older snapshot: deletes a and b, adds s.
  Whiteout(t / "old/a.txt");
  Whiteout(t / "old/b.txt");
  Write(t / "old/s.txt", "s\n");
  // Newer snapshot: brings b back changed.
  Write(t / "new/b.txt", "B\n");
  // The session: deletes s, edits c.
  Whiteout(t / "upper/s.txt");
  Write(t / "upper/c.txt", "C\n");
  Json d = Diff({t / "base", {t / "new", t / "old"}, t / "upper"});
  EXPECT_EQ(Statuses(d), (std::map<std::string, std::string>{
                             {"a.txt", "deleted"}, {"b.txt", "modified"}, {"c.txt", "modified"}}));
}

TEST(LayersDiff, QuotedAndSpacedPathsApplyWithGit) {
  LayersDir t;
  Write(t / "base/with space.txt", "1\n2\n");
  Write(t / "base/tab\there.txt", "x\n");
  Write(t / "upper/with space.txt", "1\ntwo\n");
  Write(t / "upper/h\xc3\xa9llo \"q\".txt", "new\n");
  Whiteout(t / "upper/tab\there.txt");
  Json d = Diff({t / "base", {}, t / "upper"});
  const std::string patch = d["patch"];
  EXPECT_NE(patch.find("diff --git \"a/h\\303\\251llo \\\"q\\\".txt\" \"b/h\\303\\251llo \\\"q\\\".txt\"\n"),
            std::string::npos)
      << patch;
  EXPECT_NE(patch.find("--- a/with space.txt\t\n"), std::string::npos) << patch;
  CommitAll(t / "base");
  EXPECT_EQ(GitApply(t / "base", t / "clone", patch), "");
  EXPECT_EQ(GitView(t / "clone"), (std::map<std::string, std::string>{
                                      {"h\xc3\xa9llo \"q\".txt", "f:new\n"}, {"with space.txt", "f:1\ntwo\n"}}));
}

TEST(LayersDiff, GitMetadataIsLeftOut) {
  LayersDir t;
  Write(t / "base/.git/index", "old index");
  Write(t / "base/x.txt", "x\n");
  Write(t / "upper/.git/index", "new index");
  Write(t / "upper/sub/.git/HEAD", "ref\n");
  Write(t / "upper/x.txt", "y\n");
  Json d = Diff({t / "base", {}, t / "upper"});
  EXPECT_EQ(Statuses(d), (std::map<std::string, std::string>{{"x.txt", "modified"}}));
}

TEST(LayersDiff, PatchKeepsWholeSectionsUnderTheCap) {
  LayersDir t;
  Write(t / "upper/a.txt", "small\n");
  Write(t / "upper/b.txt", std::string(5000, 'x') + "\n");
  Write(t / "upper/c.txt", "small too\n");
  fs::create_directories(t / "base");
  Json d = Diff({t / "base", {}, t / "upper"}, 1000);
  EXPECT_EQ(d["files"].size(), 3u);  // all listed
  EXPECT_TRUE(d["truncated"].get<bool>());
  const std::string patch = d["patch"];
  EXPECT_NE(patch.find("+small\n"), std::string::npos);
  EXPECT_EQ(patch.find("b.txt"), std::string::npos) << patch;
  EXPECT_EQ(patch.find("c.txt"), std::string::npos) << patch;
}

TEST(LayersDiff, BigFilesAreComparedWithoutLoading) {
  LayersDir t;
  std::string big(3 << 20, 'a');
  Write(t / "base/same.dat", big);
  Write(t / "upper/same.dat", big);  // copied up, unchanged
  Write(t / "base/changed.dat", big);
  big[2 << 20] = 'b';
  Write(t / "upper/changed.dat", big);
  Json d = Diff({t / "base", {}, t / "upper"}, 1 << 20);
  EXPECT_EQ(Statuses(d), (std::map<std::string, std::string>{{"changed.dat", "modified"}}));
  EXPECT_TRUE(d["truncated"].get<bool>());
}

// Random trees and random edits in copy mode, applied by git: the patch
// carries the copy exactly (as far as git carries anything).
TEST(LayersDiff, CopyModeRandomEditsApplyWithGit) {
  std::mt19937 rng(4242);
  for (int round = 0; round < 6; ++round) {
    LayersDir t;
    const std::string base = t / "base", copy = t / "copy";
    std::vector<std::string> names;
    for (int i = 0; i < 40; ++i) {
      std::string dir = std::vector<std::string>{"", "src/", "src/deep/", "doc/"}[rng() % 4];
      std::string name = dir + "f" + std::to_string(i) + ".txt";
      std::string content;
      for (int l = 0, n = static_cast<int>(rng() % 30); l < n; ++l) content += "line " + std::to_string(rng() % 8) + "\n";
      if (rng() % 5 == 0 && !content.empty()) content.pop_back();
      Write(base + "/" + name, content, rng() % 4 == 0 ? 0755 : 0644);
      names.push_back(name);
    }
    CommitAll(base);
    ASSERT_TRUE(CopyTree(base, copy).ok());
    fs::remove_all(copy + "/.git");
    for (const std::string& name : names) {
      const std::string p = copy + "/" + name;
      switch (rng() % 6) {
        case 0: fs::remove(p); break;
        case 1: {
          std::string c = Read(p);
          c.insert(c.size() / 2, "inserted\n");
          Write(p, c);
          break;
        }
        case 2: chmod(p.c_str(), 0755); break;
        case 3: Write(p, Read(p) + "tail"); break;
        default: break;
      }
    }
    Write(copy + "/added/new.txt", "new\n");
    fs::remove_all(copy + "/doc");
    Write(copy + "/doc", "doc is a file now\n");
    Json d = Diff({base, {}, copy, /*copy_mode=*/true});
    ASSERT_EQ(GitApply(base, t / "clone", d["patch"]), "") << "round " << round;
    EXPECT_EQ(GitView(t / "clone"), GitView(copy)) << "round " << round;
  }
}


// ------------------------------------------------------------------ ignore rules and apply

TEST(LayersDiff, GitignoreFilesAndExcludeLeaveOutWhatTheySay) {
  LayersDir t;
  Write(t / "base/.gitignore", "node_modules/\n__pycache__/\n");
  Write(t / "base/src/a.py", "a\n");
  Write(t / "base/.git/info/exclude", "*.swp\n");
  Write(t / "upper/src/a.py", "A\n");
  Write(t / "upper/src/__pycache__/a.pyc", std::string("\0pyc", 4));
  Write(t / "upper/node_modules/x/index.js", "x\n");
  Write(t / "upper/src/.gitignore", "*.gen\n!keep.gen\n");
  Write(t / "upper/src/out.gen", "g\n");
  Write(t / "upper/src/keep.gen", "k\n");
  Write(t / "upper/notes.swp", "s\n");
  Write(t / "upper/secret.env", "s\n");
  DiffOptions options;
  options.max_patch_bytes = 1 << 20;
  options.exclude = {"*.env"};
  auto d = ComputeDiff({t / "base", {}, t / "upper"}, options);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(Statuses(*d), (std::map<std::string, std::string>{
                              {"src/.gitignore", "added"}, {"src/a.py", "modified"}, {"src/keep.gen", "added"}}));
  EXPECT_EQ((*d)["patch"].get<std::string>().find("node_modules"), std::string::npos);
  options.all = true;
  auto all = ComputeDiff({t / "base", {}, t / "upper"}, options);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(Statuses(*all).size(), 8u) << all->dump();
}

TEST(LayersDiff, CopyModeDeletedIgnoredDirectoryIsJudgedByTheBaseRules) {
  LayersDir t;
  Write(t / "base/pkg/.gitignore", "*.cache\n");
  Write(t / "base/pkg/a.txt", "a\n");
  Write(t / "base/pkg/x.cache", "c\n");
  Write(t / "base/keep.txt", "k\n");
  Write(t / "copy/keep.txt", "k\n");
  LayerStack stack{t / "base", {}, t / "copy", true};
  Json d = Diff(stack);
  EXPECT_EQ(Statuses(d), (std::map<std::string, std::string>{{"pkg/.gitignore", "deleted"}, {"pkg/a.txt", "deleted"}}));
}

// Every entry of a tree with its type, mode bits and content or target.
std::map<std::string, std::string> Tree(const std::string& root) {
  std::map<std::string, std::string> tree;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    struct stat st {};
    lstat(it->path().c_str(), &st);
    std::string rel = it->path().lexically_relative(root).string();
    char mode[16];
    std::snprintf(mode, sizeof(mode), "%o:", st.st_mode & 07777);
    if (S_ISLNK(st.st_mode)) {
      tree[rel] = "link:" + fs::read_symlink(it->path()).string();
    } else if (S_ISDIR(st.st_mode)) {
      tree[rel] = std::string("dir:") + mode;
    } else {
      tree[rel] = std::string("file:") + mode + Read(it->path());
    }
  }
  return tree;
}

struct ApplyFixture {
  LayersDir t;
  std::string record = t / "base.record";
  ApplyOptions Options() const {
    ApplyOptions o;
    o.base_record = record;
    return o;
  }
};

TEST(LayersApply, CleanApplyWritesEveryKindOfChangeAndOnlyThat) {
  ApplyFixture f;
  LayersDir& t = f.t;
  Write(t / "base/edit.txt", "one\n");
  Write(t / "base/gone.txt", "bye\n");
  Write(t / "base/dir/inner.txt", "in\n");
  Write(t / "base/run.sh", "#!/bin/sh\n");
  Write(t / "base/node_modules/x.js", "x\n");
  Write(t / "base/.gitignore", "node_modules/\n");
  fs::create_symlink("edit.txt", t / "base/link");
  ASSERT_TRUE(RecordBase(t / "base", f.record).ok());
  Write(t / "upper/edit.txt", "ONE\n");
  Whiteout(t / "upper/gone.txt");
  Whiteout(t / "upper/dir");
  Write(t / "upper/run.sh", "#!/bin/sh\n", 0755);
  Write(t / "upper/new dir/n\xc3\xa9w.bin", std::string("\0\1", 2), 0600);
  Write(t / "upper/node_modules/y.js", "ignored\n");
  fs::create_directories(t / "upper");
  fs::create_symlink("run.sh", t / "upper/link");
  auto r = ApplyChanges({t / "base", {}, t / "upper"}, f.Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["applied"], (Json{"dir/inner.txt", "edit.txt", "gone.txt", "link", "new dir/n\xc3\xa9w.bin", "run.sh"}))
      << r->dump();
  EXPECT_TRUE((*r)["conflicts"].empty());
  std::map<std::string, std::string> tree = Tree(t / "base");
  EXPECT_EQ(tree["edit.txt"], "file:644:ONE\n");
  EXPECT_EQ(tree.count("gone.txt"), 0u);
  EXPECT_EQ(tree.count("dir"), 0u);  // emptied, so removed
  EXPECT_EQ(tree["run.sh"], "file:755:#!/bin/sh\n");
  EXPECT_EQ(tree["link"], "link:run.sh");
  EXPECT_EQ(tree["new dir/n\xc3\xa9w.bin"], "file:600:" + std::string("\0\1", 2));
  EXPECT_EQ(tree.count("node_modules/y.js"), 0u);
  for (const auto& [path, what] : tree) EXPECT_EQ(path.find(".agentbox-apply"), std::string::npos) << path;
  // The base now holds the changes: the diff is empty, and a second apply
  // of later changes is not a conflict.
  EXPECT_TRUE(Diff({t / "base", {}, t / "upper"})["files"].empty());
  Write(t / "upper/edit.txt", "ONE more\n");
  auto again = ApplyChanges({t / "base", {}, t / "upper"}, f.Options());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)["applied"], (Json{"edit.txt"})) << again->dump();
  EXPECT_EQ(Read(t / "base/edit.txt"), "ONE more\n");
}

TEST(LayersApply, ConflictRefusesNamingThePathsAndChangesNothing) {
  ApplyFixture f;
  LayersDir& t = f.t;
  Write(t / "base/a.txt", "a\n");
  Write(t / "base/b.txt", "b\n");
  ASSERT_TRUE(RecordBase(t / "base", f.record).ok());
  Write(t / "upper/a.txt", "session a\n");
  Write(t / "upper/b.txt", "session b\n");
  Write(t / "upper/c.txt", "session c\n");
  // Meanwhile, on the host: a.txt edited, c.txt created.
  Write(t / "base/a.txt", "host a\n");
  Write(t / "base/c.txt", "host c\n");
  const auto before = Tree(t / "base");
  auto r = ApplyChanges({t / "base", {}, t / "upper"}, f.Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["conflicts"], (Json{"a.txt", "c.txt"})) << r->dump();
  EXPECT_TRUE((*r)["applied"].empty());
  EXPECT_EQ(Tree(t / "base"), before);
}

TEST(LayersApply, ProtectedPathsAndBareRepositoryHooksAreRefused) {
  ApplyFixture f;
  LayersDir& t = f.t;
  Write(t / "base/ok.txt", "ok\n");
  Write(t / "base/repo.git/HEAD", "ref: refs/heads/main\n");
  fs::create_directories(t / "base/repo.git/objects");
  fs::create_directories(t / "base/repo.git/refs");
  ASSERT_TRUE(RecordBase(t / "base", f.record).ok());
  Write(t / "upper/ok.txt", "changed\n");
  Write(t / "upper/ci/deploy.yml", "evil\n");
  Write(t / "upper/repo.git/hooks/post-checkout", "#!/bin/sh\nevil\n", 0755);
  Write(t / "upper/repo.git/config", "[core]\n\thooksPath = /tmp\n");
  const auto before = Tree(t / "base");
  ApplyOptions options = f.Options();
  options.protect = {"ci"};
  auto r = ApplyChanges({t / "base", {}, t / "upper"}, options);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["protected"], (Json{"ci/deploy.yml", "repo.git/config", "repo.git/hooks/post-checkout"})) << r->dump();
  EXPECT_TRUE((*r)["applied"].empty());
  EXPECT_EQ(Tree(t / "base"), before);
}

TEST(LayersApply, AFailurePartWayUndoesEveryStep) {
  ApplyFixture f;
  LayersDir& t = f.t;
  Write(t / "base/a.txt", "a\n");
  Write(t / "base/z/keep/ignored.o", "o\n");
  Write(t / "base/.gitignore", "*.o\n");
  Write(t / "base/z/file.txt", "z\n");
  ASSERT_TRUE(RecordBase(t / "base", f.record).ok());
  Write(t / "upper/a.txt", "A\n");
  Write(t / "upper/b/new.txt", "new\n");
  // z was a directory with an ignored file in it; the session made it a
  // file: the directory cannot go, so the file cannot take its place.
  Write(t / "upper/z", "now a file\n");
  const auto before = Tree(t / "base");
  auto r = ApplyChanges({t / "base", {}, t / "upper"}, f.Options());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("z"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(Tree(t / "base"), before);
}

// A base directory swapped for a symlink after the record (to send the
// write elsewhere) is a conflict: nothing is written, least of all there.
TEST(LayersApply, ADirectorySwappedForASymlinkIsRefusedNotFollowed) {
  ApplyFixture f;
  LayersDir& t = f.t;
  Write(t / "base/d/old.txt", "old\n");
  fs::create_directories(t / "outside");
  ASSERT_TRUE(RecordBase(t / "base", f.record).ok());
  Write(t / "upper/d/new.txt", "planted\n");
  fs::remove_all(t / "base/d");
  fs::create_symlink(t / "outside", t / "base/d");
  auto r = ApplyChanges({t / "base", {}, t / "upper"}, f.Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["conflicts"], (Json{"d", "d/new.txt"})) << r->dump();
  EXPECT_TRUE(fs::is_empty(t / "outside"));
  // Recorded after the swap, the symlink is the base's own, but a path
  // below it cannot be reached without following it: refused all the same.
  ASSERT_TRUE(RecordBase(t / "base", f.record).ok());
  auto again = ApplyChanges({t / "base", {}, t / "upper"}, f.Options());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)["conflicts"], (Json{"d/new.txt"})) << again->dump();
  EXPECT_TRUE(fs::is_empty(t / "outside"));
  EXPECT_TRUE(fs::is_symlink(t / "base/d"));
}

TEST(LayersApply, WithoutARecordItIsAConflict) {
  LayersDir t;
  Write(t / "base/a.txt", "a\n");
  Write(t / "upper/a.txt", "b\n");
  ApplyOptions options;
  options.base_record = t / "missing.record";
  auto r = ApplyChanges({t / "base", {}, t / "upper"}, options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().stage(), "conflict");
  EXPECT_EQ(Read(t / "base/a.txt"), "a\n");
}

// ------------------------------------------------------------------ real overlays

// Runs `body` in a forked child in new user and mount namespaces (root
// inside, mapped to the caller); the namespaces and every mount in them go
// away with the child. Returns the child's exit status.
int InNamespaces(const std::function<int()>& body) {
  const uid_t uid = getuid();
  const gid_t gid = getgid();
  pid_t pid = fork();
  if (pid == 0) {
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) _exit(90);
    auto put = [](const char* file, const std::string& text) {
      int fd = open(file, O_WRONLY | O_CLOEXEC);
      bool ok = fd >= 0 && write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
      if (fd >= 0) close(fd);
      return ok;
    };
    if (!put("/proc/self/setgroups", "deny") || !put("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") ||
        !put("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1")) {
      _exit(91);
    }
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) _exit(92);
    _exit(body());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

constexpr int kNoOverlay = 93;

int MountOverlay(const std::vector<std::string>& lowers, const std::string& upper, const std::string& work,
                 const std::string& merged) {
  std::string lowerdir;
  for (const std::string& l : lowers) lowerdir += (lowerdir.empty() ? "" : ":") + l;
  std::string options = "lowerdir=" + lowerdir + ",upperdir=" + upper + ",workdir=" + work + ",userxattr";
  if (mount("overlay", merged.c_str(), "overlay", 0, options.c_str()) != 0) {
    std::fprintf(stderr, "mount overlay %s: %s\n", options.c_str(), std::strerror(errno));
    return kNoOverlay;
  }
  return 0;
}

// Moves a directory as mv does on overlayfs: rename refuses (EXDEV, no
// redirects with userxattr), so copy and delete.
bool MoveDir(const std::string& from, const std::string& to) {
  if (rename(from.c_str(), to.c_str()) == 0) return true;
  if (errno != EXDEV) return false;
  if (!CopyTree(from, to).ok()) return false;
  std::error_code ec;
  fs::remove_all(from, ec);
  return !ec;
}

// A small repository as the base.
void MakeBase(const std::string& base) {
  std::string readme;
  for (int i = 1; i <= 50; ++i) readme += "README line " + std::to_string(i) + "\n";
  Write(base + "/README.md", readme);
  Write(base + "/delete_me.txt", "delete me\n");
  Write(base + "/old_name.txt", "renamed content\n");
  Write(base + "/docs/guide.md", "guide\n");
  Write(base + "/docs/sub/deep.md", "deep\n");
  Write(base + "/script.sh", "#!/bin/sh\necho hi\n");
  Write(base + "/was_file", "a file\n");
  Write(base + "/was_dir/one.txt", "1\n");
  Write(base + "/was_dir/two.txt", "2\n");
  Write(base + "/lib/a/b/c.txt", "c\n");
  Write(base + "/lib/a/b/keep.txt", "keep\n");
  Write(base + "/nonl.txt", "first\nno newline");
  Write(base + "/tools/build.sh", "make\n", 0755);
  Write(base + "/tools/lint.sh", "lint\n", 0755);
  Write(base + "/untouched.txt", "untouched\n");
  Write(base + "/empty_old.txt", "");
  Write(base + "/with space.txt", "a\nb\n");
  fs::create_symlink("README.md", base + "/old_link");
  CommitAll(base);
}

// The session's changes, made through the merged view as a shell would.
int ChangeWorkspace(const std::string& m) {
  std::string readme = Read(m + "/README.md");
  readme.replace(readme.find("README line 10\n"), 15, "README line ten\n");
  readme += "appended\n";
  std::ofstream(m + "/README.md", std::ios::trunc) << readme;
  std::ofstream(m + "/new.txt") << "new file\n";
  fs::create_directories(m + "/src/new_dir");
  std::ofstream(m + "/src/new_dir/deep.txt") << "deep new\n";
  fs::remove(m + "/delete_me.txt");
  fs::rename(m + "/old_name.txt", m + "/new_name.txt");
  fs::remove_all(m + "/docs");
  fs::create_directories(m + "/docs");
  std::ofstream(m + "/docs/only.md") << "only this\n";
  if (chmod((m + "/script.sh").c_str(), 0755) != 0) return 10;
  fs::remove(m + "/was_file");
  fs::create_directories(m + "/was_file");
  std::ofstream(m + "/was_file/inside.txt") << "inside\n";
  fs::remove_all(m + "/was_dir");
  std::ofstream(m + "/was_dir") << "was a dir\n";
  fs::create_symlink("README.md", m + "/link");
  fs::remove(m + "/old_link");
  fs::create_symlink("new.txt", m + "/old_link");
  fs::remove(m + "/lib/a/b/c.txt");
  std::ofstream(m + "/nonl.txt", std::ios::trunc) << "first\nstill no newline";
  if (!MoveDir(m + "/tools", m + "/tools2")) return 11;
  { std::ofstream(m + "/untouched.txt", std::ios::app); }  // opened for writing: copied up, not changed
  std::ofstream(m + "/empty.txt") << "";
  fs::remove(m + "/empty_old.txt");
  std::ofstream(m + "/with space.txt", std::ios::trunc) << "a\nB\n";
  std::ofstream(m + "/h\xc3\xa9llo.txt") << "unicode name\n";
  return 0;
}

TEST(LayersOverlay, RealOverlayDiffAppliesWithGit) {
  LayersDir t;
  MakeBase(t / "base");
  for (const char* d : {"upper", "work", "merged"}) fs::create_directories(t / d);
  int rc = InNamespaces([&] {
    if (int m = MountOverlay({t / "base"}, t / "upper", t / "work", t / "merged"); m != 0) return m;
    if (int c = ChangeWorkspace(t / "merged"); c != 0) return c;
    return CopyTree(t / "merged", t / "expected").ok() ? 0 : 12;
  });
  if (rc == kNoOverlay) GTEST_SKIP() << "not applicable here: overlayfs with userxattr cannot be mounted in a user namespace";
  ASSERT_EQ(rc, 0);
  // The kernel marked the recreated directory opaque and left whiteouts.
  char value[4] = {};
  EXPECT_EQ(getxattr((t / "upper/docs").c_str(), "user.overlay.opaque", value, sizeof(value)), 1);
  struct stat st {};
  ASSERT_EQ(lstat((t / "upper/delete_me.txt").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0));

  Json d = Diff({t / "base", {}, t / "upper"});
  auto statuses = Statuses(d);
  EXPECT_EQ(statuses["README.md"], "modified");
  EXPECT_EQ(statuses["delete_me.txt"], "deleted");
  EXPECT_EQ(statuses["old_name.txt"], "deleted");
  EXPECT_EQ(statuses["new_name.txt"], "added");
  EXPECT_EQ(statuses["docs/guide.md"], "deleted");
  EXPECT_EQ(statuses["docs/sub/deep.md"], "deleted");
  EXPECT_EQ(statuses["docs/only.md"], "added");
  EXPECT_EQ(statuses["script.sh"], "modified");
  EXPECT_EQ(statuses["tools/build.sh"], "deleted");
  EXPECT_EQ(statuses["tools2/build.sh"], "added");
  EXPECT_EQ(statuses["empty.txt"], "added");
  EXPECT_EQ(statuses["empty_old.txt"], "deleted");
  EXPECT_EQ(statuses.count("untouched.txt"), 0u);
  EXPECT_EQ(statuses.count("lib/a/b/keep.txt"), 0u);

  EXPECT_EQ(GitApply(t / "base", t / "clone", d["patch"]), "") << d["patch"].get<std::string>();
  EXPECT_EQ(GitView(t / "clone"), GitView(t / "expected"));
}

TEST(LayersOverlay, SnapshotIsALayerToStartFrom) {
  LayersDir t;
  MakeBase(t / "base");
  for (const char* d : {"upper1", "work1", "merged1", "upper2", "work2", "merged2", "snaps"}) {
    fs::create_directories(t / d);
  }
  // First session: changes, then a snapshot of its upper layer.
  int rc = InNamespaces([&] {
    if (int m = MountOverlay({t / "base"}, t / "upper1", t / "work1", t / "merged1"); m != 0) return m;
    if (int c = ChangeWorkspace(t / "merged1"); c != 0) return c;
    return CopyTree(t / "merged1", t / "expected1").ok() ? 0 : 12;
  });
  if (rc == kNoOverlay) GTEST_SKIP() << "not applicable here: overlayfs with userxattr cannot be mounted in a user namespace";
  ASSERT_EQ(rc, 0);
  auto manifest = CreateSnapshot({t / "base", {}, t / "upper1"}, "", t / "snaps/s1");
  ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
  ASSERT_TRUE(VerifySnapshot(t / "snaps/s1").ok()) << VerifySnapshot(t / "snaps/s1").ToString();

  // Second session from the snapshot: it sees the first one's workspace,
  // then changes it further.
  rc = InNamespaces([&] {
    if (int m = MountOverlay({t / "snaps/s1/tree", t / "base"}, t / "upper2", t / "work2", t / "merged2"); m != 0) {
      return m;
    }
    if (!CopyTree(t / "merged2", t / "restored").ok()) return 20;
    const std::string m = t / "merged2";
    fs::remove(m + "/new.txt");                        // added by the snapshot, deleted now
    std::ofstream(m + "/docs/only.md", std::ios::app) << "more\n";
    fs::remove_all(m + "/src");                        // a directory only the snapshot has
    std::ofstream(m + "/delete_me.txt") << "back\n";  // deleted by the snapshot, re-created
    return CopyTree(m, t / "expected2").ok() ? 0 : 21;
  });
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(GitView(t / "restored"), GitView(t / "expected1"));

  Json d = Diff({t / "base", {t / "snaps/s1/tree"}, t / "upper2"});
  auto statuses = Statuses(d);
  EXPECT_EQ(statuses.count("new.txt"), 0u);             // never in the base, gone again
  EXPECT_EQ(statuses.count("src/new_dir/deep.txt"), 0u);
  EXPECT_EQ(statuses["delete_me.txt"], "modified");
  EXPECT_EQ(statuses["docs/only.md"], "added");
  EXPECT_EQ(GitApply(t / "base", t / "clone", d["patch"]), "") << d["patch"].get<std::string>();
  EXPECT_EQ(GitView(t / "clone"), GitView(t / "expected2"));
}

// ------------------------------------------------------------------ snapshots

TEST(LayersSnapshot, ManifestDescribesTheUpperLayer) {
  LayersDir t;
  fs::create_directories(t / "base");
  Write(t / "upper/a.txt", "hello\n", 0640);
  Whiteout(t / "upper/gone.txt");
  MakeOpaque(t / "upper/docs");
  Write(t / "upper/docs/x.md", "x\n");
  fs::create_symlink("a.txt", t / "upper/link");
  ASSERT_EQ(mkfifo((t / "upper/fifo").c_str(), 0600), 0);  // not content: left out
  auto m = CreateSnapshot({t / "base", {}, t / "upper"}, "parent-id", t / "snap");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)["version"], kSnapshotVersion);
  EXPECT_EQ((*m)["parent"], "parent-id");
  EXPECT_EQ((*m)["mode"], "overlay");
  Json entries = (*m)["entries"];
  ASSERT_EQ(entries.size(), 5u) << entries.dump(1);
  EXPECT_EQ(entries[0], (Json{{"path", "a.txt"}, {"type", "file"}, {"mode", "0640"}, {"size", 6},
                              {"sha256", "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"}}));
  EXPECT_EQ(entries[1], (Json{{"path", "docs"}, {"type", "dir"}, {"mode", "0755"}, {"opaque", true}}));
  EXPECT_EQ(entries[2]["path"], "docs/x.md");
  EXPECT_EQ(entries[3], (Json{{"path", "gone.txt"}, {"type", "whiteout"}}));
  EXPECT_EQ(entries[4], (Json{{"path", "link"}, {"type", "symlink"}, {"target", "a.txt"}}));
  // The manifest on disk is the one returned; the tree holds the markers.
  EXPECT_EQ(Json::parse(Read(t / "snap/manifest.json")), *m);
  char value[4] = {};
  EXPECT_EQ(getxattr((t / "snap/tree/docs").c_str(), "user.overlay.opaque", value, sizeof(value)), 1);
  struct stat st {};
  ASSERT_EQ(lstat((t / "snap/tree/gone.txt").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0));
  EXPECT_FALSE(fs::exists(fs::symlink_status(t / "snap/tree/fifo")));
  EXPECT_TRUE(VerifySnapshot(t / "snap").ok());
}

TEST(LayersSnapshot, OneCorruptByteIsFoundAndNamed) {
  LayersDir t;
  fs::create_directories(t / "base");
  Write(t / "upper/src/main.c", "int main() { return 0; }\n");
  Write(t / "upper/other.txt", "other\n");
  ASSERT_TRUE(CreateSnapshot({t / "base", {}, t / "upper"}, "", t / "snap").ok());
  ASSERT_TRUE(VerifySnapshot(t / "snap").ok());
  {
    std::fstream f(t / "snap/tree/src/main.c", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4);
    f.put('X');
  }
  Status s = VerifySnapshot(t / "snap");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.stage(), "snapshot");
  EXPECT_EQ(s.message(), "snapshot " + (t / "snap") + " is corrupt: src/main.c: checksum mismatch");
}

TEST(LayersSnapshot, MissingExtraAndChangedEntriesAreNamed) {
  LayersDir t;
  fs::create_directories(t / "base");
  Write(t / "upper/a.txt", "a\n");
  Write(t / "upper/b.txt", "b\n");
  fs::create_symlink("a.txt", t / "upper/l");
  ASSERT_TRUE(CreateSnapshot({t / "base", {}, t / "upper"}, "", t / "snap").ok());

  fs::remove(t / "snap/tree/b.txt");
  EXPECT_NE(VerifySnapshot(t / "snap").message().find("is corrupt: b.txt: missing"), std::string::npos);
  Write(t / "snap/tree/b.txt", "b\n");
  EXPECT_TRUE(VerifySnapshot(t / "snap").ok()) << VerifySnapshot(t / "snap").ToString();

  Write(t / "snap/tree/intruder", "x");
  EXPECT_NE(VerifySnapshot(t / "snap").message().find("is corrupt: intruder: not in the manifest"),
            std::string::npos);
  fs::remove(t / "snap/tree/intruder");

  Write(t / "snap/tree/a.txt", "a\nlonger\n");
  EXPECT_NE(VerifySnapshot(t / "snap").message().find("a.txt: size 9, the manifest says 2"), std::string::npos);
  Write(t / "snap/tree/a.txt", "a\n", 0600);
  EXPECT_NE(VerifySnapshot(t / "snap").message().find("a.txt: mode 0600, the manifest says 0644"),
            std::string::npos);
  Write(t / "snap/tree/a.txt", "a\n");

  fs::remove(t / "snap/tree/l");
  fs::create_symlink("b.txt", t / "snap/tree/l");
  EXPECT_NE(VerifySnapshot(t / "snap").message().find("l: symlink target differs"), std::string::npos);
}

TEST(LayersSnapshot, MissingSnapshotOrManifestIsNotFound) {
  LayersDir t;
  Status s = VerifySnapshot(t / "nope");
  EXPECT_EQ(s.stage(), "not_found");
  EXPECT_NE(s.message().find(t / "nope"), std::string::npos);
  fs::create_directories(t / "half/tree");  // interrupted before the manifest
  s = VerifySnapshot(t / "half");
  EXPECT_EQ(s.stage(), "not_found");
  EXPECT_NE(s.message().find("has no manifest.json"), std::string::npos) << s.message();
  Write(t / "half/manifest.json", "{\"version\": 1, \"entries\": [");
  s = VerifySnapshot(t / "half");
  EXPECT_EQ(s.stage(), "snapshot");
  EXPECT_NE(s.message().find("is corrupt: manifest.json: not valid JSON"), std::string::npos) << s.message();
  Write(t / "half/manifest.json", R"({"version": 1, "parent": "", "mode": "overlay", "created": "",
                                      "entries": [{"path": "x", "type": "file"}]})");
  s = VerifySnapshot(t / "half");
  EXPECT_NE(s.message().find("malformed entry for x"), std::string::npos) << s.message();
}

TEST(LayersSnapshot, RefusesAnExistingDestination) {
  LayersDir t;
  fs::create_directories(t / "base");
  fs::create_directories(t / "upper");
  fs::create_directories(t / "snap");
  auto m = CreateSnapshot({t / "base", {}, t / "upper"}, "", t / "snap");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().err(), EEXIST);
  EXPECT_EQ(m.status().path(), t / "snap");
}

TEST(LayersSnapshot, CopyModeKeepsTheWholeCopy) {
  LayersDir t;
  Write(t / "copy/a/b/c.txt", "c\n");
  Write(t / "copy/top.txt", "t\n");
  auto m = CreateSnapshot({t / "base", {}, t / "copy", /*copy_mode=*/true}, "p", t / "snap");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)["mode"], "copy");
  EXPECT_EQ((*m)["entries"].size(), 4u);
  EXPECT_EQ(Read(t / "snap/tree/a/b/c.txt"), "c\n");
  EXPECT_TRUE(VerifySnapshot(t / "snap").ok());
}

// While a writer keeps rewriting files in the upper layer, every snapshot
// still verifies: the checksums describe the bytes copied.
TEST(LayersSnapshot, ConsistentWhileTheUpperChanges) {
  LayersDir t;
  fs::create_directories(t / "base");
  for (int i = 0; i < 20; ++i) Write(t / ("upper/f" + std::to_string(i)), std::string(4096, 'a'));
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    std::mt19937 rng(1);
    std::string data(8192, 'x');
    while (!stop) {
      const std::string p = t / ("upper/f" + std::to_string(rng() % 20));
      int fd = open(p.c_str(), O_WRONLY);
      if (fd < 0) continue;
      data[rng() % data.size()] = static_cast<char>('a' + rng() % 26);
      (void)!pwrite(fd, data.data(), rng() % data.size(), 0);
      (void)!ftruncate(fd, static_cast<off_t>(rng() % data.size()));
      close(fd);
      if (rng() % 8 == 0) {
        fs::remove(t / "upper/tmp");
        std::ofstream(t / "upper/tmp") << "t";
      }
    }
  });
  for (int i = 0; i < 20; ++i) {
    const std::string dest = t / ("snap" + std::to_string(i));
    auto m = CreateSnapshot({t / "base", {}, t / "upper"}, "", dest);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    Status s = VerifySnapshot(dest);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  stop = true;
  writer.join();
}

// ------------------------------------------------------------------ CopyTree

TEST(LayersCopyTree, KeepsModesAndSymlinksAndNeverFollowsThem) {
  LayersDir t;
  Write(t / "from/x.sh", "run\n", 0750);
  Write(t / "from/ro/f.txt", "f\n", 0444);
  chmod((t / "from/ro").c_str(), 0555);
  fs::create_symlink("/etc", t / "from/etc_link");
  fs::create_symlink("/etc/hostname", t / "from/file_link");
  fs::create_symlink("x.sh", t / "from/rel_link");
  ASSERT_TRUE(CopyTree(t / "from", t / "to").ok());
  struct stat st {};
  ASSERT_EQ(stat((t / "to/x.sh").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  ASSERT_EQ(stat((t / "to/ro").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0555u);
  EXPECT_TRUE(fs::is_symlink(t / "to/etc_link"));
  EXPECT_EQ(fs::read_symlink(t / "to/etc_link"), "/etc");
  EXPECT_TRUE(fs::is_symlink(t / "to/file_link"));
  EXPECT_EQ(fs::read_symlink(t / "to/rel_link"), "x.sh");
  chmod((t / "to/ro").c_str(), 0755);  // let the cleanup in
  chmod((t / "from/ro").c_str(), 0755);
}

TEST(LayersCopyTree, ErrorsNameThePath) {
  LayersDir t;
  Status s = CopyTree(t / "missing", t / "to");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.path(), t / "missing");
  EXPECT_EQ(s.err(), ENOENT);
}

// ------------------------------------------------------------------ hostile upper layers

// A name that is not UTF-8 (the sandbox can create any bytes but '/' and
// NUL) round-trips through the manifest exactly, and the diff lists it.
TEST(LayersHostile, NonUtf8NamesRoundTrip) {
  LayersDir t;
  fs::create_directories(t / "base");
  const std::string name = std::string("x") + '\xc3';           // a truncated two-byte sequence
  const std::string dir = std::string("d") + '\xff' + "\xed\xa0\x80";  // 0xff, then a UTF-16 surrogate
  const std::string target = std::string("t") + '\xfe';
  Write(t / ("upper/" + name), "hello\n");
  Write(t / ("upper/" + dir + "/f.txt"), "f\n");
  fs::create_symlink(target, t / "upper/link");
  Write(t / "upper/ok.txt", "ok\n");

  auto m = CreateSnapshot({t / "base", {}, t / "upper"}, "", t / "snap");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_NO_THROW((void)m->dump());  // strict: every string is UTF-8
  std::map<std::string, Json> by_hex;
  for (const Json& e : (*m)["entries"]) {
    if (e.contains("path_hex")) {
      EXPECT_FALSE(e.contains("path")) << e.dump();
      by_hex[e["path_hex"]] = e;
    }
  }
  ASSERT_EQ(by_hex.count("78c3"), 1u) << m->dump(1);                       // "x\xc3"
  EXPECT_EQ(by_hex["78c3"]["type"], "file");
  ASSERT_EQ(by_hex.count("64ffeda080"), 1u) << m->dump(1);                 // the directory
  EXPECT_EQ(by_hex.count("64ffeda0802f662e747874"), 1u) << m->dump(1);     // and the file in it
  bool link_seen = false;
  for (const Json& e : (*m)["entries"]) {
    if (e.value("path", "") == "link") {
      EXPECT_EQ(e.value("target_hex", ""), "74fe") << e.dump();
      EXPECT_FALSE(e.contains("target"));
      link_seen = true;
    }
  }
  EXPECT_TRUE(link_seen);
  EXPECT_EQ(Read(t / ("snap/tree/" + name)), "hello\n");
  EXPECT_EQ(fs::read_symlink(t / "snap/tree/link").string(), target);

  auto read = ReadSnapshotManifest(t / "snap");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, *m);
  Status v = VerifySnapshot(t / "snap");
  EXPECT_TRUE(v.ok()) << v.ToString();

  // Verification reads the hex: a changed byte in that file is found.
  Write(t / ("snap/tree/" + name), "hellO\n");
  v = VerifySnapshot(t / "snap");
  EXPECT_FALSE(v.ok());
  EXPECT_NE(v.message().find("checksum mismatch"), std::string::npos) << v.message();
  EXPECT_NO_THROW((void)Json(v.message()).dump());

  auto d = ComputeDiff({t / "base", {}, t / "upper"}, 1 << 20);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_NO_THROW((void)(*d)["files"].dump());
  std::set<std::string> hex_paths;
  for (const Json& f : (*d)["files"]) {
    if (f.contains("path_hex")) {
      hex_paths.insert(f["path_hex"].get<std::string>());
      EXPECT_NE(f["path"].get<std::string>().find("\xEF\xBF\xBD"), std::string::npos) << f.dump();
    }
    EXPECT_EQ(f["status"], "added");
  }
  EXPECT_EQ(hex_paths, (std::set<std::string>{"78c3", "64ffeda0802f662e747874"}));
  EXPECT_EQ((*d)["files"].size(), 4u) << (*d)["files"].dump(1);
  // git quotes the raw bytes in octal.
  EXPECT_NE((*d)["patch"].get<std::string>().find("\"b/x\\303\""), std::string::npos) << (*d)["patch"];
  EXPECT_EQ((*d)["truncated"], false);
}

// The list of files is capped as the patch is: a sandbox that touches
// ten thousand and more files gets a bounded answer, marked truncated.
TEST(LayersHostile, FileListIsCapped) {
  LayersDir t;
  fs::create_directories(t / "base");
  constexpr int kChanged = 10050;
  for (int i = 0; i < kChanged; ++i) Write(t / ("upper/f" + std::to_string(i)), "x\n");
  auto d = ComputeDiff({t / "base", {}, t / "upper"}, 1 << 20);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ((*d)["files"].size(), 10000u);
  EXPECT_EQ((*d)["files_truncated"], true);
  EXPECT_EQ((*d)["truncated"], true);
  const std::string patch = (*d)["patch"];
  std::size_t sections = 0;
  for (std::size_t at = patch.find("diff --git "); at != std::string::npos; at = patch.find("diff --git ", at + 1)) {
    ++sections;
  }
  EXPECT_LE(sections, 10000u);  // nothing in the patch that the list leaves out
}

// A big sparse file in the upper layer costs no memory: it is listed, left
// out of the patch, and the patch says it is truncated.
TEST(LayersHostile, FileOverTheCapIsNotLoaded) {
  LayersDir t;
  fs::create_directories(t / "base");
  Write(t / "upper/a.txt", "small\n");
  Write(t / "upper/big.bin", "");
  ASSERT_EQ(truncate((t / "upper/big.bin").c_str(), 64 << 20), 0);  // 64 MiB, sparse
  auto d = ComputeDiff({t / "base", {}, t / "upper"}, 4096);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(Statuses(*d), (std::map<std::string, std::string>{{"a.txt", "added"}, {"big.bin", "added"}}));
  EXPECT_EQ((*d)["truncated"], true);
  const std::string patch = (*d)["patch"];
  EXPECT_NE(patch.find("b/a.txt"), std::string::npos) << patch;
  EXPECT_EQ(patch.find("big.bin"), std::string::npos) << patch;
  for (const Json& f : (*d)["files"]) {
    if (f["path"] == "big.bin") {
      EXPECT_EQ(f["binary"], true);  // NULs in its first bytes
    }
  }

  // The same file in the base and the upper, both over the cap: compared by
  // streaming, no change.
  Write(t / "base/big.bin", "");
  ASSERT_EQ(truncate((t / "base/big.bin").c_str(), 64 << 20), 0);
  d = ComputeDiff({t / "base", {}, t / "upper"}, 4096);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(Statuses(*d), (std::map<std::string, std::string>{{"a.txt", "added"}}));
}

// A set-user-ID root binary in the upper layer (the sandbox's root can be
// the host's) is kept in a snapshot without its set-id bits.
TEST(LayersHostile, SnapshotDropsSetIdBits) {
  LayersDir t;
  fs::create_directories(t / "base");
  Write(t / "upper/bin/tool", "#!/bin/sh\n", 0755);
  ASSERT_EQ(chmod((t / "upper/bin/tool").c_str(), 04755), 0);
  Write(t / "upper/shared/f", "f\n");
  ASSERT_EQ(chmod((t / "upper/shared").c_str(), 03775), 0);  // setgid + sticky directory
  Write(t / "upper/sticky", "s\n");
  ASSERT_EQ(chmod((t / "upper/sticky").c_str(), 01644), 0);
  struct stat st {};
  ASSERT_EQ(stat((t / "upper/bin/tool").c_str(), &st), 0);
  ASSERT_EQ(st.st_mode & 07777, 04755u);  // the source really has the bit

  auto m = CreateSnapshot({t / "base", {}, t / "upper"}, "", t / "snap");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(stat((t / "snap/tree/bin/tool").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  ASSERT_EQ(stat((t / "snap/tree/shared").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 01775u);
  ASSERT_EQ(stat((t / "snap/tree/sticky").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  std::map<std::string, std::string> modes;
  for (const Json& e : (*m)["entries"]) {
    if (e.contains("mode")) modes[e["path"]] = e["mode"];
  }
  EXPECT_EQ(modes["bin/tool"], "0755");
  EXPECT_EQ(modes["shared"], "1775");
  EXPECT_EQ(modes["sticky"], "0644");
  Status v = VerifySnapshot(t / "snap");
  EXPECT_TRUE(v.ok()) << v.ToString();

  ASSERT_TRUE(CopyTree(t / "upper", t / "copy").ok());
  ASSERT_EQ(stat((t / "copy/bin/tool").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  ASSERT_EQ(stat((t / "copy/shared").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 01775u);
}

// A tree nested past PATH_MAX (built one directory at a time, as the
// sandbox can) is refused with its path by snapshot, copy and diff.
TEST(LayersHostile, TreeDeeperThanPathMaxIsAClearError) {
  LayersDir t;
  fs::create_directories(t / "base");
  fs::create_directories(t / "upper");
  const std::string component(200, 'd');
  std::vector<int> fds;
  fds.push_back(open((t / "upper").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_GE(fds.back(), 0);
  const int depth = PATH_MAX / 201 + 5;
  for (int i = 0; i < depth; ++i) {
    ASSERT_EQ(mkdirat(fds.back(), component.c_str(), 0755), 0) << std::strerror(errno);
    fds.push_back(openat(fds.back(), component.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_GE(fds.back(), 0);
  }
  int leaf = openat(fds.back(), "f", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(leaf, 0);
  close(leaf);
  // Removed bottom-up through the fds (paths are too long for remove_all).
  struct Remove {
    std::vector<int>& fds;
    std::string name;
    ~Remove() {
      if (!fds.empty()) unlinkat(fds.back(), "f", 0);
      for (std::size_t i = fds.size(); i-- > 0;) {
        if (i + 1 < fds.size()) unlinkat(fds[i], name.c_str(), AT_REMOVEDIR);
        close(fds[i]);
      }
    }
  } remove{fds, component};

  auto m = CreateSnapshot({t / "base", {}, t / "upper"}, "", t / "snap");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().stage(), kPathTooLong);
  EXPECT_EQ(m.status().message().rfind("snapshot: ", 0), 0u) << m.status().ToString();
  EXPECT_NE(m.status().message().find(t / "upper/" + component), std::string::npos) << m.status().ToString();
  EXPECT_NE(m.status().message().find("path longer than"), std::string::npos) << m.status().ToString();
  EXPECT_FALSE(fs::exists(t / "snap"));  // the half-made snapshot is removed

  auto d = ComputeDiff({t / "base", {}, t / "upper"}, 1 << 20);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().stage(), kPathTooLong);
  EXPECT_EQ(d.status().message().rfind("diff: ", 0), 0u) << d.status().ToString();
  EXPECT_NE(d.status().message().find("path longer than"), std::string::npos) << d.status().ToString();

  Status c = CopyTree(t / "upper", t / "copy");
  EXPECT_FALSE(c.ok());
  EXPECT_NE(c.message().find("path longer than"), std::string::npos) << c.ToString();
}

}  // namespace
}  // namespace agentbox::session
