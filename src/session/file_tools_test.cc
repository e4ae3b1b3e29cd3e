// File tools on temp directories, and their classification under the real
// mechanisms that deny: file permissions, a read-only bind mount (as for
// protected paths, in a child's own user and mount namespaces) and Landlock.
#include "session/file_tools.h"

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "confine/layers.h"
#include "linux/in_child.h"
#include "linux/landlock_ruleset.h"
#include "session/test_files.h"

namespace agentbox::session {
namespace {

namespace fs = std::filesystem;

using testing::Read;
using testing::Write;

// Reachable by the unprivileged user of the denial tests.
struct ToolsDir : testing::TempDir {
  ToolsDir() : testing::TempDir("filetools", 0755) {}
};

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  stat(path.c_str(), &st);
  return st.st_mode & 07777;
}

ino_t InodeOf(const std::string& path) {
  struct stat st {};
  stat(path.c_str(), &st);
  return st.st_ino;
}

class FileToolsTest : public ::testing::Test {
 protected:
  Json Run(const std::string& name, const Json& input) {
    Json r = RunFileTool(name, input, limits_);
    EXPECT_NO_THROW(r.dump()) << "the result must serialise";
    return r;
  }
  ToolsDir t_;
  FileToolLimits limits_{t_.path()};
};

using linux::testing::InChild;

// Becomes root of new user and mount namespaces (mapped to the caller), with
// mounts private to them; false when the host does not allow it.
bool EnterNamespaces() {
  const uid_t uid = getuid();
  const gid_t gid = getgid();
  if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return false;
  auto put = [](const char* file, const std::string& text) {
    int fd = open(file, O_WRONLY | O_CLOEXEC);
    bool ok = fd >= 0 && write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    if (fd >= 0) close(fd);
    return ok;
  };
  return put("/proc/self/setgroups", "deny") && put("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") &&
         put("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1") &&
         mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
}

// Binds `path` read-only onto itself, as a protected path is.
bool BindReadOnly(const std::string& path) {
  return mount(path.c_str(), path.c_str(), nullptr, MS_BIND | MS_REC, nullptr) == 0 &&
         mount(nullptr, path.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) == 0;
}

void ExpectDenied(const Json& r, const char* op, const std::string& target, const std::string& error_start) {
  EXPECT_EQ(r["kind"], "sandbox_denied") << r.dump(1);
  EXPECT_EQ(r["error"].get<std::string>().rfind(error_start, 0), 0u) << r.dump(1);
  EXPECT_EQ(r["output"], r["error"]);
  ASSERT_TRUE(r.contains("denials")) << r.dump(1);
  ASSERT_EQ(r["denials"].size(), 1u);
  EXPECT_EQ(r["denials"][0]["facet"], "filesystem");
  EXPECT_EQ(r["denials"][0]["op"], op);
  EXPECT_EQ(r["denials"][0]["target"], target);
  EXPECT_EQ(r["denials"][0]["source"], "file-tool");
}

// ------------------------------------------------------------------ read_file

TEST_F(FileToolsTest, ResolveDirStaysInsideTheWorkspace) {
  fs::create_directories(t_.path() + "/a/b");
  fs::create_symlink("a/b", t_.path() + "/in");
  fs::create_symlink("/", t_.path() + "/out");
  Write(t_.path() + "/file", "x");
  Json in = Run(kResolveDirTool, {{"path", "in"}});
  EXPECT_EQ(in["kind"], "ok") << in.dump();
  EXPECT_EQ(in["output"], fs::canonical(t_.path()).string() + "/a/b");
  EXPECT_EQ(Run(kResolveDirTool, {{"path", "a/../a/b"}})["kind"], "ok");
  EXPECT_EQ(Run(kResolveDirTool, {{"path", t_.path() + "/a"}})["kind"], "ok");
  for (const std::string bad : {"..", "a/../..", "/", "/tmp", "out", "out/tmp", "missing", "file"}) {
    Json r = Run(kResolveDirTool, {{"path", bad}});
    EXPECT_EQ(r["kind"], "tool_error") << bad << ": " << r.dump();
    EXPECT_NE(r.value("error", "").find(bad), std::string::npos) << r.dump();
  }
}

TEST_F(FileToolsTest, ReadWholeFileAndCountLines) {
  Write(t_ / "a.txt", "one\ntwo\nthree");
  Json r = Run("read_file", {{"path", "a.txt"}});
  EXPECT_EQ(r["kind"], "ok") << r.dump(1);
  EXPECT_EQ(r["output"], "one\ntwo\nthree");
  EXPECT_EQ(r["total_lines"], 3);
  EXPECT_FALSE(r["truncated"].get<bool>());
  EXPECT_FALSE(r.contains("error"));
  // An absolute path reads the same file.
  EXPECT_EQ(Run("read_file", {{"path", t_ / "a.txt"}})["output"], "one\ntwo\nthree");
}

TEST_F(FileToolsTest, ReadOffsetAndLimitInLines) {
  std::string text;
  for (int i = 1; i <= 10; ++i) text += "line " + std::to_string(i) + "\n";
  Write(t_ / "ten.txt", text);
  Json r = Run("read_file", {{"path", "ten.txt"}, {"offset", 3}, {"limit", 2}});
  EXPECT_EQ(r["output"], "line 3\nline 4\n");
  EXPECT_EQ(r["total_lines"], 10);
  EXPECT_EQ(Run("read_file", {{"path", "ten.txt"}, {"offset", 10}})["output"], "line 10\n");
  Json past = Run("read_file", {{"path", "ten.txt"}, {"offset", 11}});
  EXPECT_EQ(past["kind"], "tool_error");
  EXPECT_EQ(past["error"], "tool_error: read " + (t_ / "ten.txt") + ": offset 11 is past the end (10 lines)");
  EXPECT_EQ(Run("read_file", {{"path", "ten.txt"}, {"offset", 0}})["kind"], "tool_error");
  EXPECT_EQ(Run("read_file", {{"path", "ten.txt"}, {"limit", "2"}})["kind"], "tool_error");
}

TEST_F(FileToolsTest, ReadEmptyFile) {
  Write(t_ / "empty", "");
  Json r = Run("read_file", {{"path", "empty"}});
  EXPECT_EQ(r["kind"], "ok");
  EXPECT_EQ(r["output"], "");
  EXPECT_EQ(r["total_lines"], 0);
}

TEST_F(FileToolsTest, ReadMissingDirectoryAndBinaryAreToolErrors) {
  Json missing = Run("read_file", {{"path", "nope.txt"}});
  EXPECT_EQ(missing["kind"], "tool_error");
  EXPECT_EQ(missing["error"], "tool_error: read " + (t_ / "nope.txt") + ": No such file or directory");
  EXPECT_FALSE(missing.contains("denials"));

  fs::create_directories(t_ / "dir");
  Json dir = Run("read_file", {{"path", "dir"}});
  EXPECT_EQ(dir["kind"], "tool_error");
  EXPECT_NE(dir["error"].get<std::string>().find("is a directory"), std::string::npos);

  Write(t_ / "blob", std::string("ELF\0\1\2", 6) + std::string(100, 'x'));
  Json bin = Run("read_file", {{"path", "blob"}});
  EXPECT_EQ(bin["kind"], "tool_error");
  EXPECT_EQ(bin["error"], "tool_error: read " + (t_ / "blob") + ": binary file (106 bytes), not shown");
}

TEST_F(FileToolsTest, ReadCapCutsAtALineEndAndSaysSo) {
  limits_.max_read_bytes = 20;
  Write(t_ / "f", "1234567\nabcdefg\nXYZXYZX\nlast\n");
  Json r = Run("read_file", {{"path", "f"}});
  EXPECT_EQ(r["kind"], "ok");
  EXPECT_TRUE(r["truncated"].get<bool>());
  EXPECT_EQ(r["next_offset"], 3);
  EXPECT_EQ(r["total_lines"], 4);
  EXPECT_EQ(r["output"],
            "1234567\nabcdefg\n[truncated: lines 1-2 of 4 shown (output capped at 20 bytes); read on with offset=3]\n");
  Json rest = Run("read_file", {{"path", "f"}, {"offset", 3}});
  EXPECT_EQ(rest["output"], "XYZXYZX\nlast\n");
  EXPECT_FALSE(rest["truncated"].get<bool>());
}

TEST_F(FileToolsTest, ReadOneHugeLineIsCut) {
  limits_.max_read_bytes = 10;
  Write(t_ / "f", std::string(100, 'a') + "\nnext\n");
  Json r = Run("read_file", {{"path", "f"}});
  EXPECT_TRUE(r["truncated"].get<bool>());
  EXPECT_EQ(r["output"], "aaaaaaaaaa\n[truncated: line 1 cut at 10 bytes (output capped at 10 bytes); read on with offset=2]\n");
}

// Lines that span several of the reader's 64 KiB reads: whole under the
// cap, cut at it, and dropped whole when lines before them were shown.
TEST_F(FileToolsTest, ReadLinesLongerThanOneReadAreWholeOrCutAtTheCap) {
  std::string one_line;
  for (int i = 0; one_line.size() < 300000; ++i) one_line += std::to_string(i) + ",";
  Write(t_ / "minified", one_line);
  Json whole = Run("read_file", {{"path", "minified"}});
  EXPECT_FALSE(whole["truncated"].get<bool>());
  EXPECT_EQ(whole["total_lines"], 1);
  EXPECT_TRUE(whole["output"] == one_line) << "the 300 KB line did not come back whole";

  limits_.max_read_bytes = 200000;
  Json cut = Run("read_file", {{"path", "minified"}});
  EXPECT_TRUE(cut["truncated"].get<bool>());
  EXPECT_EQ(cut["output"], one_line.substr(0, 200000) +
                               "\n[truncated: line 1 cut at 200000 bytes (output capped at 200000 bytes); read on with "
                               "offset=2]\n");

  Write(t_ / "two", "short\n" + one_line + "\nafter\n");
  Json dropped = Run("read_file", {{"path", "two"}});
  EXPECT_TRUE(dropped["truncated"].get<bool>());
  EXPECT_EQ(dropped["output"],
            "short\n[truncated: lines 1-1 of 3 shown (output capped at 200000 bytes); read on with offset=2]\n");
  Json from_two = Run("read_file", {{"path", "two"}, {"offset", 3}});
  EXPECT_EQ(from_two["output"], "after\n");
}

TEST_F(FileToolsTest, ReadInvalidUtf8IsReplaced) {
  Write(t_ / "latin1", "caf\xe9\n");
  Json r = Run("read_file", {{"path", "latin1"}});
  EXPECT_EQ(r["kind"], "ok");
  EXPECT_EQ(r["output"], "caf\xef\xbf\xbd\n");
  EXPECT_TRUE(r["invalid_utf8"].get<bool>());
}

// ------------------------------------------------------------------ write_file

TEST_F(FileToolsTest, WriteCreatesWithTheShellsMode) {
  mode_t old = umask(022);
  Json r = Run("write_file", {{"path", "new.txt"}, {"content", "hello\n"}});
  umask(old);
  EXPECT_EQ(r["kind"], "ok") << r.dump(1);
  EXPECT_EQ(r["output"], "wrote 6 bytes to " + (t_ / "new.txt"));
  EXPECT_TRUE(r["created"].get<bool>());
  EXPECT_EQ(r["bytes"], 6);
  EXPECT_EQ(Read(t_ / "new.txt"), "hello\n");
  EXPECT_EQ(ModeOf(t_ / "new.txt"), 0644u);
}

TEST_F(FileToolsTest, WriteReplacesAtomicallyKeepingTheMode) {
  Write(t_ / "run.sh", "old\n", 0751);
  const ino_t before = InodeOf(t_ / "run.sh");
  Json r = Run("write_file", {{"path", "run.sh"}, {"content", "new\n"}});
  EXPECT_EQ(r["kind"], "ok") << r.dump(1);
  EXPECT_FALSE(r["created"].get<bool>());
  EXPECT_EQ(Read(t_ / "run.sh"), "new\n");
  EXPECT_EQ(ModeOf(t_ / "run.sh"), 0751u);
  EXPECT_NE(InodeOf(t_ / "run.sh"), before) << "a new file was renamed over the old one";
  int entries = 0;
  for (auto& e : fs::directory_iterator(t_.path())) entries += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(entries, 1) << "no temp file is left behind";
}

TEST_F(FileToolsTest, WriteNeedsTheParentDirectory) {
  Json r = Run("write_file", {{"path", "no/such/dir/f.txt"}, {"content", "x"}});
  EXPECT_EQ(r["kind"], "tool_error");
  EXPECT_EQ(r["error"], "tool_error: write " + (t_ / "no/such/dir/f.txt") + ": parent directory " +
                            (t_ / "no/such/dir") + " does not exist (create it first, e.g. with `mkdir -p " +
                            (t_ / "no/such/dir") + "`)");
  EXPECT_FALSE(fs::exists(t_ / "no"));
}

TEST_F(FileToolsTest, WriteGoesThroughSymlinksLikeTheShell) {
  Write(t_ / "real.txt", "old\n", 0600);
  fs::create_symlink("real.txt", t_ / "link");
  EXPECT_EQ(Run("write_file", {{"path", "link"}, {"content", "via link\n"}})["kind"], "ok");
  EXPECT_TRUE(fs::is_symlink(t_ / "link"));
  EXPECT_EQ(Read(t_ / "real.txt"), "via link\n");
  EXPECT_EQ(ModeOf(t_ / "real.txt"), 0600u);
  // A dangling symlink: the shell's `>` creates the target.
  fs::create_symlink("target.txt", t_ / "dangling");
  Json r = Run("write_file", {{"path", "dangling"}, {"content", "made\n"}});
  EXPECT_EQ(r["kind"], "ok") << r.dump(1);
  EXPECT_TRUE(r["created"].get<bool>());
  EXPECT_TRUE(fs::is_symlink(t_ / "dangling"));
  EXPECT_EQ(Read(t_ / "target.txt"), "made\n");
}

TEST_F(FileToolsTest, WriteKeepsHardLinksTogether) {
  Write(t_ / "a", "old\n");
  fs::create_hard_link(t_ / "a", t_ / "b");
  const ino_t before = InodeOf(t_ / "a");
  EXPECT_EQ(Run("write_file", {{"path", "a"}, {"content", "shared\n"}})["kind"], "ok");
  EXPECT_EQ(InodeOf(t_ / "a"), before);
  EXPECT_EQ(Read(t_ / "b"), "shared\n");
}

TEST_F(FileToolsTest, WriteRefusesDirectoriesAndOversizedContent) {
  fs::create_directories(t_ / "d");
  Json dir = Run("write_file", {{"path", "d"}, {"content", "x"}});
  EXPECT_EQ(dir["kind"], "tool_error");
  EXPECT_NE(dir["error"].get<std::string>().find("is a directory"), std::string::npos) << dir.dump();
  limits_.max_write_bytes = 4;
  Json big = Run("write_file", {{"path", "big"}, {"content", "12345"}});
  EXPECT_EQ(big["error"], "tool_error: write " + (t_ / "big") + ": content is 5 bytes, more than the limit of 4");
  EXPECT_FALSE(fs::exists(t_ / "big"));
  EXPECT_EQ(Run("write_file", {{"path", "x"}})["error"],
            "tool_error: write_file: input field \"content\" must be a string");
}

// ------------------------------------------------------------------ edit_file

TEST_F(FileToolsTest, EditReplacesTheOneOccurrence) {
  Write(t_ / "c.c", "int a;\nint b;\nint c;\n", 0640);
  Json r = Run("edit_file", {{"path", "c.c"}, {"old", "int b;"}, {"new", "long b;"}});
  EXPECT_EQ(r["kind"], "ok") << r.dump(1);
  EXPECT_EQ(r["line"], 2);
  EXPECT_EQ(r["output"], "edited " + (t_ / "c.c") + ": replaced 1 occurrence at line 2");
  EXPECT_EQ(Read(t_ / "c.c"), "int a;\nlong b;\nint c;\n");
  EXPECT_EQ(ModeOf(t_ / "c.c"), 0640u);
}

TEST_F(FileToolsTest, EditNeedsExactlyOneOccurrence) {
  Write(t_ / "f", "aaa\nxyz\nxyz\n");
  Json none = Run("edit_file", {{"path", "f"}, {"old", "nope"}, {"new", "x"}});
  EXPECT_EQ(none["error"], "tool_error: old text not found in " + (t_ / "f"));
  Json two = Run("edit_file", {{"path", "f"}, {"old", "xyz"}, {"new", "x"}});
  EXPECT_EQ(two["error"], "tool_error: old text occurs 2 times in " + (t_ / "f"));
  Json overlapping = Run("edit_file", {{"path", "f"}, {"old", "aa"}, {"new", "b"}});
  EXPECT_EQ(overlapping["error"], "tool_error: old text occurs 2 times in " + (t_ / "f"));
  EXPECT_EQ(Run("edit_file", {{"path", "f"}, {"old", ""}, {"new", "b"}})["kind"], "tool_error");
  EXPECT_EQ(Read(t_ / "f"), "aaa\nxyz\nxyz\n");
  EXPECT_EQ(Run("edit_file", {{"path", "missing"}, {"old", "a"}, {"new", "b"}})["error"],
            "tool_error: read " + (t_ / "missing") + ": No such file or directory");
}

// ------------------------------------------------------------------ list_dir

TEST_F(FileToolsTest, ListDirSortedWithTypes) {
  Write(t_ / "b.txt", "12345");
  fs::create_directories(t_ / "a_dir");
  fs::create_symlink("b.txt", t_ / "c_link");
  Json r = Run("list_dir", {{"path", "."}});
  EXPECT_EQ(r["kind"], "ok") << r.dump(1);
  EXPECT_EQ(r["output"], "a_dir/\nb.txt\nc_link\n");
  ASSERT_EQ(r["entries"].size(), 3u);
  EXPECT_EQ(r["entries"][0]["type"], "dir");
  EXPECT_EQ(r["entries"][1], (Json{{"name", "b.txt"}, {"type", "file"}, {"size", 5}}));
  EXPECT_EQ(r["entries"][2]["type"], "symlink");
  EXPECT_EQ(r["entries"][2]["target"], "b.txt");
  EXPECT_FALSE(r["truncated"].get<bool>());
  EXPECT_EQ(Run("list_dir", Json::object())["output"], "a_dir/\nb.txt\nc_link\n");  // default: the workspace
  EXPECT_EQ(Run("list_dir", {{"path", "a_dir"}})["output"], "(empty directory)\n");
}

TEST_F(FileToolsTest, ListDirErrorsAndCap) {
  EXPECT_EQ(Run("list_dir", {{"path", "nope"}})["error"],
            "tool_error: list " + (t_ / "nope") + ": No such file or directory");
  Write(t_ / "f", "");
  EXPECT_EQ(Run("list_dir", {{"path", "f"}})["error"], "tool_error: list " + (t_ / "f") + ": not a directory");
  for (int i = 0; i < 5; ++i) Write(t_ / ("d/" + std::to_string(i)), "");
  limits_.max_entries = 3;
  Json r = Run("list_dir", {{"path", "d"}});
  EXPECT_TRUE(r["truncated"].get<bool>());
  EXPECT_EQ(r["entries"].size(), 3u);
  EXPECT_EQ(r["output"], "0\n1\n2\n[truncated: first 3 entries shown]\n");
}

// ------------------------------------------------------------------ glob

class FileToolsGlob : public FileToolsTest {
 protected:
  void SetUp() override {
    for (const char* p : {"a.txt", "b.txt", "c.md", "sub/c.txt", "sub/deep/d.txt", ".hidden/e.txt", ".dot.txt"}) {
      Write(t_ / p, "x");
    }
  }
  std::string Glob(const std::string& pattern) {
    Json r = Run("glob", {{"pattern", pattern}});
    EXPECT_EQ(r["kind"], "ok") << r.dump(1);
    return r["output"];
  }
};

TEST_F(FileToolsGlob, StarStaysInOneDirectory) { EXPECT_EQ(Glob("*.txt"), "a.txt\nb.txt\n"); }

TEST_F(FileToolsGlob, DoubleStarCrossesDirectoriesButNotDotOnes) {
  EXPECT_EQ(Glob("**/*.txt"), "a.txt\nb.txt\nsub/c.txt\nsub/deep/d.txt\n");
  EXPECT_EQ(Glob("sub/**"), "sub\nsub/c.txt\nsub/deep\nsub/deep/d.txt\n");
  EXPECT_EQ(Glob("**/deep/*"), "sub/deep/d.txt\n");
}

TEST_F(FileToolsGlob, DotEntriesWhenNamed) {
  EXPECT_EQ(Glob(".hidden/*"), ".hidden/e.txt\n");
  EXPECT_EQ(Glob(".*.txt"), ".dot.txt\n");
  EXPECT_EQ(Glob("sub/c.txt"), "sub/c.txt\n");
}

TEST_F(FileToolsGlob, AbsolutePatternsGiveAbsolutePaths) {
  EXPECT_EQ(Glob(t_ / "sub/*.txt"), (t_ / "sub/c.txt") + "\n");
}

TEST_F(FileToolsGlob, NoMatchCapAndLoops) {
  Json none = Run("glob", {{"pattern", "*.rs"}});
  EXPECT_EQ(none["output"], "no paths match *.rs\n");
  EXPECT_EQ(none["count"], 0);
  fs::create_directory_symlink(".", t_ / "sub/loop");  // `**` does not follow it
  EXPECT_EQ(Glob("**/d.txt"), "sub/deep/d.txt\n");
  limits_.max_entries = 2;
  Json capped = Run("glob", {{"pattern", "**/*.txt"}});
  EXPECT_TRUE(capped["truncated"].get<bool>());
  EXPECT_EQ(capped["count"], 2);
  EXPECT_EQ(capped["output"], "a.txt\nb.txt\n[truncated: first 2 matches shown]\n");
}

TEST_F(FileToolsTest, UnknownToolAndMalformedInput) {
  Json r = Run("rm_rf", {{"path", "/"}});
  EXPECT_EQ(r["kind"], "tool_error");
  EXPECT_EQ(r["error"], "tool_error: unknown file tool \"rm_rf\" (read_file, write_file, edit_file, list_dir, glob)");
  EXPECT_EQ(Run("read_file", {{"path", 42}})["error"], "tool_error: read_file: input field \"path\" must be a string");
  EXPECT_EQ(Run("glob", Json::array())["kind"], "tool_error");
}

// ------------------------------------------------------------------ denials

// Permission bits: EACCES is sandbox_denied, as from the shell. Root ignores
// them, so the child drops to nobody first.
TEST_F(FileToolsTest, PermissionDeniedIsSandboxDenied) {
  Write(t_ / "secret", "s\n", 0000);
  fs::create_directories(t_ / "locked");
  chmod((t_ / "locked").c_str(), 0555);
  Json results = InChild([&] {
    if (geteuid() == 0 && (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
                           setresuid(65534, 65534, 65534) != 0)) {
      return Json{{"child", "could not drop to uid 65534"}};
    }
    return Json{{"read", RunFileTool("read_file", {{"path", "secret"}}, limits_)},
                {"write", RunFileTool("write_file", {{"path", "locked/new"}, {"content", "x"}}, limits_)},
                {"edit", RunFileTool("edit_file", {{"path", "secret"}, {"old", "s"}, {"new", "t"}}, limits_)}};
  });
  ASSERT_TRUE(results.contains("read")) << results.dump(1);
  ExpectDenied(results["read"], "read", t_ / "secret", "sandbox_denied: read " + (t_ / "secret") + ": Permission denied");
  ExpectDenied(results["write"], "write", t_ / "locked/new",
               "sandbox_denied: write " + (t_ / "locked/new") + ": Permission denied");
  ExpectDenied(results["edit"], "read", t_ / "secret", "sandbox_denied: read ");
  EXPECT_FALSE(fs::exists(t_ / "locked/new"));
}

// A read-only mount (a read-only workspace, a protected path): EROFS is
// sandbox_denied; reading still works.
TEST_F(FileToolsTest, ReadOnlyMountIsSandboxDenied) {
  Write(t_ / "ws/file.txt", "keep\n");
  limits_.workspace = t_ / "ws";
  Json results = InChild([&] {
    if (!EnterNamespaces()) return Json{{"skip", "not applicable here: no user and mount namespaces for this user"}};
    if (!BindReadOnly(t_ / "ws")) return Json{{"child", std::string("bind: ") + std::strerror(errno)}};
    return Json{{"write", RunFileTool("write_file", {{"path", "file.txt"}, {"content", "x"}}, limits_)},
                {"create", RunFileTool("write_file", {{"path", "new.txt"}, {"content", "x"}}, limits_)},
                {"edit", RunFileTool("edit_file", {{"path", "file.txt"}, {"old", "keep"}, {"new", "k"}}, limits_)},
                {"read", RunFileTool("read_file", {{"path", "file.txt"}}, limits_)}};
  });
  if (results.contains("skip")) GTEST_SKIP() << results["skip"].get<std::string>();
  ASSERT_TRUE(results.contains("write")) << results.dump(1);
  ExpectDenied(results["write"], "write", t_ / "ws/file.txt",
               "sandbox_denied: write " + (t_ / "ws/file.txt") +
                   ": Read-only file system (protected or read-only path)");
  ExpectDenied(results["create"], "write", t_ / "ws/new.txt", "sandbox_denied: write ");
  ExpectDenied(results["edit"], "write", t_ / "ws/file.txt", "sandbox_denied: write ");
  EXPECT_EQ(results["read"]["kind"], "ok");
  EXPECT_EQ(results["read"]["output"], "keep\n");
  EXPECT_EQ(Read(t_ / "ws/file.txt"), "keep\n");
}

// A protected file inside a writable directory (a read-only bind of the file
// itself, like .git/config): the write is denied as the shell's would be, not
// slipped in by renaming a new file over the mount point.
TEST_F(FileToolsTest, ProtectedFileInAWritableDirectory) {
  Write(t_ / "ws/.git/config", "[core]\n");
  Write(t_ / "ws/.git/other", "o\n");
  limits_.workspace = t_ / "ws";
  Json results = InChild([&] {
    if (!EnterNamespaces()) return Json{{"skip", "not applicable here: no user and mount namespaces for this user"}};
    if (!BindReadOnly(t_ / "ws/.git/config")) return Json{{"child", std::string("bind: ") + std::strerror(errno)}};
    return Json{{"config", RunFileTool("write_file", {{"path", ".git/config"}, {"content", "evil"}}, limits_)},
                {"other", RunFileTool("write_file", {{"path", ".git/other"}, {"content", "fine\n"}}, limits_)}};
  });
  if (results.contains("skip")) GTEST_SKIP() << results["skip"].get<std::string>();
  ASSERT_TRUE(results.contains("config")) << results.dump(1);
  ExpectDenied(results["config"], "write", t_ / "ws/.git/config",
               "sandbox_denied: write " + (t_ / "ws/.git/config") +
                   ": Read-only file system (protected or read-only path)");
  EXPECT_EQ(results["other"]["kind"], "ok");
  EXPECT_EQ(Read(t_ / "ws/.git/config"), "[core]\n");
  EXPECT_EQ(Read(t_ / "ws/.git/other"), "fine\n");
}

// Landlock granting only read on the workspace: writes are EACCES, denied.
TEST_F(FileToolsTest, LandlockReadOnlyIsSandboxDenied) {
  const int abi = linux::LandlockAbiVersion();
  if (abi < kMinLandlockAbi) GTEST_SKIP() << "not applicable here: Landlock ABI " << abi << ", the file tools test needs " << kMinLandlockAbi;
  Write(t_ / "ws/file.txt", "keep\n");
  Write(t_ / "elsewhere", "not granted\n");
  limits_.workspace = t_ / "ws";
  Json results = InChild([&] {
    LandlockPlan plan = PlanLandlockOnly({}, t_ / "ws", /*writable=*/false, abi, /*required=*/true);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return Json{{"child", "no_new_privs"}};
    auto applied = linux::ApplyLandlock(plan);
    if (!applied.ok() || !applied->enforced) return Json{{"child", "landlock not enforced"}};
    return Json{{"write", RunFileTool("write_file", {{"path", "file.txt"}, {"content", "x"}}, limits_)},
                {"read", RunFileTool("read_file", {{"path", "file.txt"}}, limits_)},
                {"outside", RunFileTool("read_file", {{"path", t_ / "elsewhere"}}, limits_)}};
  });
  ASSERT_TRUE(results.contains("write")) << results.dump(1);
  ExpectDenied(results["write"], "write", t_ / "ws/file.txt", "sandbox_denied: write " + (t_ / "ws/file.txt"));
  EXPECT_EQ(results["read"]["output"], "keep\n");
  ExpectDenied(results["outside"], "read", t_ / "elsewhere", "sandbox_denied: read ");
  EXPECT_EQ(Read(t_ / "ws/file.txt"), "keep\n");
}

}  // namespace
}  // namespace agentbox::session
