// Gitignore rules: git's own answers (git check-ignore in a scratch
// repository) for the same files and patterns are the reference.
#include "session/gitignore.h"
#include "session/test_files.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

namespace agentbox::session {
namespace {

namespace fs = std::filesystem;

IgnoreRules RulesOf(const std::map<std::string, std::string>& files, const std::string& exclude = "",
                    const std::vector<std::string>& extra = {}) {
  return IgnoreRules(
      [files](const std::string& dir) -> std::optional<std::string> {
        auto it = files.find(dir.empty() ? ".gitignore" : dir + "/.gitignore");
        if (it == files.end()) return std::nullopt;
        return it->second;
      },
      exclude, extra);
}

TEST(Gitignore, SemanticsOfGitignoreFive) {
  IgnoreRules rules = RulesOf({{".gitignore",
                                "# comment\n"
                                "\n"
                                "node_modules/\n"
                                "*.log\n"
                                "!keep.log\n"
                                "/build\n"
                                "docs/**/*.tmp\n"
                                "trailing   \n"
                                "\\#hash\n"
                                "cache/**\n"
                                "!cache/keep\n"},
                               {"src/.gitignore", "gen.c\n/local.txt\n!/*.log\n"}});
  EXPECT_TRUE(rules.Ignored("node_modules", true));
  EXPECT_TRUE(rules.Ignored("node_modules/x/y.js", false));
  EXPECT_TRUE(rules.Ignored("a/node_modules", true));
  EXPECT_FALSE(rules.Ignored("node_modules", false));  // directory-only pattern, a file named so
  EXPECT_TRUE(rules.Ignored("x.log", false));
  EXPECT_TRUE(rules.Ignored("deep/er/x.log", false));
  EXPECT_FALSE(rules.Ignored("keep.log", false));       // negated
  EXPECT_TRUE(rules.Ignored("build", true));
  EXPECT_TRUE(rules.Ignored("build/out.o", false));
  EXPECT_FALSE(rules.Ignored("src/build", true));       // anchored to the root
  EXPECT_TRUE(rules.Ignored("docs/x.tmp", false));      // "/**/" is zero or more directories
  EXPECT_TRUE(rules.Ignored("docs/a/b/x.tmp", false));
  EXPECT_FALSE(rules.Ignored("x.tmp", false));
  EXPECT_TRUE(rules.Ignored("trailing", false));        // trailing spaces dropped
  EXPECT_TRUE(rules.Ignored("#hash", false));
  EXPECT_FALSE(rules.Ignored("cache", true));           // "x/**": what is inside, not x
  EXPECT_TRUE(rules.Ignored("cache/a", false));
  EXPECT_FALSE(rules.Ignored("cache/keep", false));     // re-included: cache itself is not excluded
  EXPECT_TRUE(rules.Ignored("src/gen.c", false));       // nested file, unanchored
  EXPECT_TRUE(rules.Ignored("src/sub/gen.c", false));
  EXPECT_FALSE(rules.Ignored("gen.c", false));          // a nested file's rules stay below it
  EXPECT_TRUE(rules.Ignored("src/local.txt", false));
  EXPECT_FALSE(rules.Ignored("src/sub/local.txt", false));
  EXPECT_FALSE(rules.Ignored("src/x.log", false));      // the deeper file overrides the root's
  EXPECT_TRUE(rules.Ignored("src/sub/x.log", false));
}

TEST(Gitignore, NothingBelowAnExcludedDirectoryComesBack) {
  IgnoreRules rules = RulesOf({{".gitignore", "out/\n!out/keep.txt\n"}});
  EXPECT_TRUE(rules.Ignored("out/keep.txt", false));
}

TEST(Gitignore, InfoExcludeIsLowestAndDiffExcludeHighest) {
  IgnoreRules rules = RulesOf({{".gitignore", "!*.bak\n"}}, "*.bak\n*.swp\n", {"*.secret", "!ok.secret"});
  EXPECT_FALSE(rules.Ignored("a.bak", false));  // the .gitignore re-includes what exclude excluded
  EXPECT_TRUE(rules.Ignored("a.swp", false));
  EXPECT_TRUE(rules.Ignored("d/a.secret", false));
  EXPECT_FALSE(rules.Ignored("ok.secret", false));
}

// Runs `command`, returning its exit status.
int Sh(const std::string& command) {
  int status = std::system((command + " >/dev/null 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Gitignore, AgreesWithGitCheckIgnore) {
  if (Sh("git --version") != 0) GTEST_SKIP() << "not applicable here: git is not installed";
  testing::TempDir t("gitignore");
  const std::map<std::string, std::string> ignores = {
      {".gitignore", "*.o\n!special.o\n/top\nlib/**/gen\n__pycache__/\n.venv\n[ab]?.txt\n"},
      {"lib/.gitignore", "*.tmp\n!keep.tmp\n/only-here\n"}};
  for (const auto& [path, text] : ignores) testing::Write(t / path, text);
  const std::vector<std::pair<std::string, bool>> paths = {
      {"x.o", false},         {"lib/x.o", false},          {"special.o", false},     {"top", false},
      {"lib/top", false},     {"lib/a/gen", false},        {"lib/gen", false},       {"gen", false},
      {"__pycache__", true},  {"pkg/__pycache__", true},   {"__pycache__", false},   {".venv", true},
      {"a1.txt", false},      {"c1.txt", false},           {"lib/x.tmp", false},     {"lib/keep.tmp", false},
      {"x.tmp", false},       {"lib/only-here", false},    {"lib/sub/only-here", false}};
  ASSERT_EQ(Sh("git init -q " + t.path()), 0);
  IgnoreRules rules = RulesOf(ignores);
  for (const auto& [path, is_dir] : paths) {
    if (is_dir) {
      fs::create_directories(t / path);
    } else {
      fs::remove_all(t / path);
      testing::Write(t / path, "x");
    }
    // check-ignore --no-index: by the rules alone, a trailing '/' naming a directory.
    const bool git_says = Sh("git -C " + t.path() + " check-ignore -q --no-index '" + path + (is_dir ? "/" : "") +
                             "'") == 0;
    EXPECT_EQ(rules.Ignored(path, is_dir), git_says) << path << (is_dir ? "/" : "");
    fs::remove_all(t / path);
  }
}

}  // namespace
}  // namespace agentbox::session
