// A session's changes leaving it, through the daemon: the diff with the
// workspace's ignore rules, the patch `git apply` takes for every kind of
// change (binary files, modes, symlinks, odd names), apply into the base
// (clean, conflict, protected), and file tools and the shell agreeing on a
// denied write.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <set>

#include "daemon_fixture.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;
using e2e::TempDir;

class ApplyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Git({"--version"}, "/").status != 0) GTEST_SKIP() << "not applicable here: git is not installed";
    ASSERT_TRUE(d_.Start()) << d_.error();
  }
  daemon::Client& c() { return d_.client(); }

  TempDir ws_{"agentbox-session-ws-"};
  Daemon d_;
};

// Every file and symlink below the current directory (.git and what the
// workspace's .gitignore leaves out): type, executable bit and SHA-256, or target. The same script
// runs inside the session and on the host, so both sides are read alike.
const char* kListing =
    "find . -path ./.git -prune -o -name node_modules -prune -o -name __pycache__ -prune -o -name .venv -prune -o"
    " \\( -type f -o -type l \\) -print | LC_ALL=C sort |"
    " while IFS= read -r p; do"
    "   if [ -L \"$p\" ]; then printf 'L %s -> %s\\n' \"$p\" \"$(readlink \"$p\")\";"
    "   else x=-; [ -x \"$p\" ] && x=x; printf 'F %s %s %s\\n' \"$p\" \"$x\" \"$(sha256sum < \"$p\" | cut -c1-64)\"; fi;"
    " done";

std::string HostListing(const std::string& dir) {
  e2e::Command cmd;
  cmd.argv = {"/bin/sh", "-c", std::string("cd \"$0\" && ") + kListing, dir};
  e2e::RunResult r = e2e::RunCommand(cmd);
  EXPECT_EQ(r.status, 0) << r.Describe();
  return r.out;
}

std::set<std::string> Paths(const json& diff) {
  std::set<std::string> paths;
  for (const auto& f : diff["files"]) paths.insert(f.value("path", ""));
  return paths;
}

// The workspace every test starts from: a committed repository with text,
// binary, executable and symlinked files, odd names and a .gitignore.
void MakeBase(const std::string& ws) {
  MakeRepo(ws, {{".gitignore", "node_modules/\n__pycache__/\n.venv/\n"},
                {"text.txt", "one\ntwo\nthree\n"},
                {"no-newline.txt", "last line without one"},
                {"gone.txt", "bye\n"},
                {"image.bin", std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16)},
                {"gone.bin", std::string("\0\1\2\3", 4)},
                {"run.sh", "#!/bin/sh\necho hi\n"},
                {"tool.sh", "#!/bin/sh\n"},
                {"dir/a.txt", "a\n"},
                {"dir/sub/b.txt", "b\n"},
                {"link", "placeholder\n"}});
  // link becomes a symlink in the base's history; tool.sh is executable there.
  e2e::Command cmd;
  cmd.argv = {"/bin/sh", "-c",
              "cd \"$0\" && rm link && ln -s text.txt link && chmod +x tool.sh && git add -A && "
              "git -c user.name=t -c user.email=t@example.com commit -qm links",
              ws};
  e2e::RunResult r = e2e::RunCommand(cmd);
  ASSERT_EQ(r.status, 0) << r.Describe();
}

// Every kind of change: edits with and without a trailing newline, binary
// files added, changed and deleted, mode changes both ways, symlinks added,
// retargeted and turned into files, a deleted directory, names with spaces,
// quotes, a backslash and non-ASCII bytes, and ignored directories.
const char* kEveryChange =
    "set -e;"
    "printf 'one\\n2\\nthree\\nfour' > text.txt;"
    "printf 'last line now ends\\n' > no-newline.txt;"
    "rm gone.txt gone.bin;"
    "printf '\\211PNG\\r\\n\\032\\n\\000\\000\\000\\rIHDR\\000changed\\377' > image.bin;"
    "head -c 20000 /dev/urandom > random.bin;"
    "chmod +x run.sh; chmod -x tool.sh;"
    "ln -s dir/a.txt new-link; rm link; ln -s no-newline.txt link;"
    "rm -r dir;"
    "printf 'spaced\\n' > 'with space.txt';"
    "printf 'quoted\\n' > 'q\"uote.txt';"
    "printf 'back\\n' > 'back\\\\slash.txt';"
    "printf 'caf\\303\\251\\n' > \"$(printf 'caf\\303\\251.txt')\";"
    "mkdir -p 'new dir/deeper' && printf 'deep\\n' > 'new dir/deeper/f.txt';"
    "printf '' > empty.txt;"
    "mkdir -p node_modules/pkg __pycache__ src/.venv && echo x > node_modules/pkg/i.js &&"
    " printf '\\000pyc' > __pycache__/m.pyc && echo v > src/.venv/cfg";

TEST_F(ApplyTest, DiffOfEveryKindOfChangeAppliesWithGitToAnIdenticalTree) {
  MakeBase(ws_.path());
  std::string id = CreateSession(c(), ws_.path());
  json r = Bash(c(), id, kEveryChange);
  ASSERT_EQ(r.value("exit_code", -1), 0) << r.dump();
  json listing = Bash(c(), id, kListing);
  ASSERT_EQ(listing.value("exit_code", -1), 0) << listing.dump();
  const std::string session_view = Output(listing);

  Answer diff = Call(c(), "GET", "/v1/sessions/" + id + "/diff");
  ASSERT_EQ(diff.status, 200) << diff.text;
  const std::set<std::string> paths = Paths(diff.body);
  EXPECT_EQ(paths.count("node_modules/pkg/i.js"), 0u) << diff.text;
  EXPECT_EQ(paths.count("__pycache__/m.pyc"), 0u) << diff.text;
  EXPECT_EQ(paths.count("src/.venv/cfg"), 0u) << diff.text;
  EXPECT_EQ(paths.count("random.bin"), 1u) << diff.text;
  const std::string patch = diff.body.value("patch", "");
  EXPECT_TRUE(Contains(patch, "GIT binary patch\nliteral ")) << patch;
  EXPECT_FALSE(Contains(patch, "Binary files")) << patch;

  TempDir parent("agentbox-session-clone-");
  const std::string clone = parent / "clone";
  ASSERT_EQ(Git({"clone", "-q", ws_.path(), clone}, parent.path()).status, 0);
  e2e::WriteFile(parent / "session.patch", patch);
  auto check = Git({"apply", "--check", parent / "session.patch"}, clone);
  ASSERT_EQ(check.status, 0) << check.Describe();
  auto applied = Git({"apply", parent / "session.patch"}, clone);
  ASSERT_EQ(applied.status, 0) << applied.Describe();
  EXPECT_EQ(HostListing(clone), session_view);
  EXPECT_FALSE(e2e::Exists(clone + "/dir")) << "git apply leaves no emptied directory";

  // ?all=1 has the ignored files too.
  Answer all = Call(c(), "GET", "/v1/sessions/" + id + "/diff?all=1");
  ASSERT_EQ(all.status, 200) << all.text;
  EXPECT_EQ(Paths(all.body).count("node_modules/pkg/i.js"), 1u) << all.text;
  EXPECT_EQ(Paths(all.body).count("__pycache__/m.pyc"), 1u) << all.text;
}

// Copy mode (no overlayfs): the session works in a full copy of the base;
// the diff walks both trees, and apply checks the base the same way.
class ApplyCopyModeTest : public ApplyTest {
 protected:
  void SetUp() override {
    if (Git({"--version"}, "/").status != 0) GTEST_SKIP() << "not applicable here: git is not installed";
    ASSERT_TRUE(d_.Start({"--workspace-mode", "copy"})) << d_.error();
  }
};

TEST_F(ApplyCopyModeTest, EveryKindOfChangeDiffsAppliesWithGitAndApplies) {
  MakeBase(ws_.path());
  std::string id = CreateSession(c(), ws_.path());
  json r = Bash(c(), id, kEveryChange);
  ASSERT_EQ(r.value("exit_code", -1), 0) << r.dump();
  Answer described = Call(c(), "GET", "/v1/sessions/" + id);
  ASSERT_EQ(described.body.value("mode", ""), "copy") << described.text;
  const std::string session_view = Output(Bash(c(), id, kListing));

  auto patch = c().Call("GET", "/v1/sessions/" + id + "/diff?format=patch");
  ASSERT_TRUE(patch.ok()) << patch.status().ToString();
  TempDir parent("agentbox-session-clone-");
  const std::string clone = parent / "clone";
  ASSERT_EQ(Git({"clone", "-q", ws_.path(), clone}, parent.path()).status, 0);
  e2e::WriteFile(parent / "session.patch", patch->body);
  auto applied_by_git = Git({"apply", parent / "session.patch"}, clone);
  ASSERT_EQ(applied_by_git.status, 0) << applied_by_git.Describe() << "\n" << patch->body;
  EXPECT_EQ(HostListing(clone), session_view);

  Answer applied = Call(c(), "POST", "/v1/sessions/" + id + "/apply");
  ASSERT_EQ(applied.status, 200) << applied.text;
  EXPECT_EQ(HostListing(ws_.path()), session_view);
  Answer diff = Call(c(), "GET", "/v1/sessions/" + id + "/diff");
  EXPECT_TRUE(diff.body["files"].empty()) << diff.text;
}

TEST_F(ApplyTest, PolicyDiffExcludeLeavesOutItsPatterns) {
  MakeRepo(ws_.path(), {{"keep.txt", "k\n"}});
  std::string id = CreateSession(c(), ws_.path(),
                                 {{"policy", "version: 1\ndiff:\n  exclude: [\"*.secret\", \"out/\", \"!out.md\"]\n"}});
  ASSERT_FALSE(id.empty());
  json r = Bash(c(), id, "echo s > a.secret && mkdir out && echo o > out/x && echo m > out.md && echo k2 > keep.txt");
  ASSERT_EQ(r.value("exit_code", -1), 0) << r.dump();
  Answer diff = Call(c(), "GET", "/v1/sessions/" + id + "/diff");
  ASSERT_EQ(diff.status, 200) << diff.text;
  EXPECT_EQ(Paths(diff.body), (std::set<std::string>{"keep.txt", "out.md"})) << diff.text;
  Answer all = Call(c(), "GET", "/v1/sessions/" + id + "/diff?all=1");
  EXPECT_EQ(Paths(all.body), (std::set<std::string>{"a.secret", "keep.txt", "out.md", "out/x"})) << all.text;

  Answer bad = Call(c(), "POST", "/v1/sessions",
                    {{"workspace", ws_.path()}, {"policy", "version: 1\ndiff:\n  exclude: [\"\"]\n"}});
  EXPECT_EQ(bad.status, 400) << bad.text;
  EXPECT_TRUE(Contains(bad.message(), "diff.exclude[0]")) << bad.text;
}

TEST_F(ApplyTest, ApplyWritesTheSessionsChangesIntoTheBase) {
  MakeBase(ws_.path());
  std::string id = CreateSession(c(), ws_.path());
  json r = Bash(c(), id, kEveryChange);
  ASSERT_EQ(r.value("exit_code", -1), 0) << r.dump();
  const std::string session_view = Output(Bash(c(), id, kListing));

  Answer applied = Call(c(), "POST", "/v1/sessions/" + id + "/apply", json::object());
  ASSERT_EQ(applied.status, 200) << applied.text;
  std::set<std::string> paths;
  for (const auto& p : applied.body["applied"]) paths.insert(p.get<std::string>());
  EXPECT_EQ(paths.count("random.bin"), 1u) << applied.text;
  EXPECT_EQ(paths.count("dir/sub/b.txt"), 1u) << applied.text;
  EXPECT_EQ(paths.count("node_modules/pkg/i.js"), 0u) << applied.text;
  EXPECT_EQ(HostListing(ws_.path()), session_view);
  EXPECT_FALSE(e2e::Exists(ws_ / "dir"));
  EXPECT_FALSE(e2e::Exists(ws_ / "node_modules")) << "an ignored directory was applied";
  for (const auto& e : std::filesystem::directory_iterator(ws_.path())) {
    EXPECT_FALSE(Contains(e.path().filename().string(), "agentbox-apply")) << e.path();
  }
  // Nothing left to apply: the session and its base agree.
  Answer diff = Call(c(), "GET", "/v1/sessions/" + id + "/diff");
  EXPECT_TRUE(diff.body["files"].empty()) << diff.text;
  e2e::RunResult cli = e2e::RunCommand([&] {
    e2e::Command cmd;
    cmd.argv = {e2e::AgentboxBin(), "session", "--socket", d_.socket(), "apply", id};
    cmd.env = d_.Env();
    return cmd;
  }());
  EXPECT_EQ(cli.status, 0) << cli.Describe();
  EXPECT_EQ(cli.out, "") << cli.Describe();
}

TEST_F(ApplyTest, ABaseChangedUnderneathIsAConflictAndNothingIsWritten) {
  MakeRepo(ws_.path(), {{"shared.txt", "base\n"}, {"mine.txt", "mine\n"}});
  std::string id = CreateSession(c(), ws_.path());
  ASSERT_EQ(Bash(c(), id, "echo session > shared.txt && echo session > mine.txt && echo new > new.txt")
                .value("exit_code", -1),
            0);
  // The host edits a file the session changed, and creates one it created.
  e2e::WriteFile(ws_ / "shared.txt", "edited on the host meanwhile\n");
  e2e::WriteFile(ws_ / "new.txt", "host's own\n");
  const std::string before = HostListing(ws_.path());

  Answer refused = Call(c(), "POST", "/v1/sessions/" + id + "/apply");
  EXPECT_EQ(refused.status, 409) << refused.text;
  EXPECT_EQ(refused.code(), "conflict") << refused.text;
  EXPECT_EQ(refused.body["error"]["conflicts"], (json{"new.txt", "shared.txt"})) << refused.text;
  EXPECT_TRUE(Contains(refused.message(), "shared.txt")) << refused.text;
  EXPECT_EQ(HostListing(ws_.path()), before) << "a refused apply changed the base";
  EXPECT_EQ(e2e::ReadFile(ws_ / "mine.txt").value_or(""), "mine\n");

  e2e::Command cmd;
  cmd.argv = {e2e::AgentboxBin(), "session", "--socket", d_.socket(), "apply", id};
  cmd.env = d_.Env();
  e2e::RunResult cli = e2e::RunCommand(cmd);
  EXPECT_NE(cli.status, 0) << cli.Describe();
  EXPECT_TRUE(Contains(cli.err, "shared.txt")) << cli.Describe();
}

TEST_F(ApplyTest, ProtectedPathsAreNeverWritten) {
  MakeRepo(ws_.path(), {{"ok.txt", "ok\n"}});
  std::string id = CreateSession(c(), ws_.path());
  // A bare repository made in the session: git would use its config and
  // hooks on the host.
  json r = Bash(c(), id,
                "mkdir -p r.git/objects r.git/refs && echo 'ref: refs/heads/main' > r.git/HEAD && "
                "printf '[core]\\n\\tbare = true\\n' > r.git/config && echo changed > ok.txt");
  ASSERT_EQ(r.value("exit_code", -1), 0) << r.dump();
  const std::string before = HostListing(ws_.path());
  Answer refused = Call(c(), "POST", "/v1/sessions/" + id + "/apply");
  EXPECT_EQ(refused.status, 403) << refused.text;
  EXPECT_EQ(refused.code(), "protected") << refused.text;
  EXPECT_EQ(refused.body["error"]["protected"], (json{"r.git/config"})) << refused.text;
  EXPECT_EQ(HostListing(ws_.path()), before);
  EXPECT_FALSE(e2e::Exists(ws_ / "r.git"));
}

TEST_F(ApplyTest, ApplyRefusesUnknownFields) {
  std::string id = CreateSession(c(), ws_.path());
  Answer bad = Call(c(), "POST", "/v1/sessions/" + id + "/apply", {{"force", true}});
  EXPECT_EQ(bad.status, 400) << bad.text;
  EXPECT_TRUE(Contains(bad.message(), "force")) << bad.text;
}

// A workspace without .git: the placeholder file stands for it, so a write
// below .git/hooks fails with ENOTDIR, from the shell as from the tool.
TEST_F(ApplyTest, FileToolsAndTheShellAgreeOnADeniedWriteBelowAMissingGit) {
  e2e::WriteFile(ws_ / "README", "x\n");
  std::string id = CreateSession(c(), ws_.path());
  json shell = Bash(c(), id, "echo evil > .git/hooks/pre-commit");
  EXPECT_EQ(shell.value("kind", ""), "sandbox_denied") << shell.dump();
  json tool = Execute(c(), id, "write_file", {{"path", ".git/hooks/pre-commit"}, {"content", "evil\n"}});
  EXPECT_EQ(tool.value("kind", ""), "sandbox_denied") << tool.dump();
  EXPECT_EQ(tool.value("is_error", false), true) << tool.dump();
  const std::string reason = "write to a protected path (filesystem.protect)";
  EXPECT_TRUE(Contains(Output(shell), reason)) << shell.dump();
  EXPECT_TRUE(Contains(Output(tool), reason)) << tool.dump();
  EXPECT_TRUE(Contains(Output(tool), "sandbox_denied: write ")) << tool.dump();
  ASSERT_TRUE(tool["outcome"]["denials"].is_array()) << tool.dump();
  EXPECT_EQ(tool["outcome"]["denials"][0].value("source", ""), "file-tool") << tool.dump();
  json edit = Execute(c(), id, "edit_file", {{"path", ".git/config"}, {"old", "a"}, {"new", "b"}});
  EXPECT_EQ(edit.value("kind", ""), "sandbox_denied") << edit.dump();
  // An ordinary missing directory stays a tool error.
  json missing = Execute(c(), id, "write_file", {{"path", "no/such/dir/f"}, {"content", "x"}});
  EXPECT_EQ(missing.value("kind", ""), "tool_error") << missing.dump();
  EXPECT_FALSE(e2e::Exists(ws_ / ".git"));
}

}  // namespace
}  // namespace agentbox::session_test
