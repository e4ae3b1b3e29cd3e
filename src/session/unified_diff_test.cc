// Line diffs: exact hunks for the edge cases, minimality against a
// quadratic LCS, round trips through our applier and through GNU patch.
#include "session/unified_diff.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace agentbox::session {
namespace {

namespace fs = std::filesystem;

std::string Lines(int from, int to) {  // "from\n" ... "to\n"
  std::string s;
  for (int i = from; i <= to; ++i) s += std::to_string(i) + "\n";
  return s;
}

void ExpectRoundTrip(const std::string& a, const std::string& b) {
  std::string hunks = UnifiedHunks(a, b);
  auto applied = ApplyUnifiedHunks(a, hunks);
  ASSERT_TRUE(applied.ok()) << applied.status().ToString() << "\nhunks:\n" << hunks;
  EXPECT_EQ(*applied, b) << "hunks:\n" << hunks;
}

// The length of a longest common subsequence, the slow and obvious way.
std::size_t Lcs(const std::vector<std::string_view>& a, const std::vector<std::string_view>& b) {
  std::vector<std::vector<std::size_t>> t(a.size() + 1, std::vector<std::size_t>(b.size() + 1, 0));
  for (std::size_t i = a.size(); i-- > 0;) {
    for (std::size_t j = b.size(); j-- > 0;) {
      t[i][j] = a[i] == b[j] ? t[i + 1][j + 1] + 1 : std::max(t[i + 1][j], t[i][j + 1]);
    }
  }
  return t[0][0];
}

// A random text of lines from a small vocabulary (so that lines repeat and
// the alignment is not obvious), sometimes without a final newline.
std::string RandomText(std::mt19937& rng, int max_lines) {
  static const char* kWords[] = {"a", "b", "c", "{", "}", "", "return x;", "int y = 0;"};
  std::uniform_int_distribution<int> count(0, max_lines);
  std::uniform_int_distribution<int> word(0, 7);
  std::string s;
  int n = count(rng);
  for (int i = 0; i < n; ++i) s += std::string(kWords[word(rng)]) + "\n";
  if (!s.empty() && rng() % 4 == 0) s.pop_back();
  return s;
}

// `text` after a few random line edits.
std::string Mutate(std::mt19937& rng, const std::string& text) {
  std::vector<std::string> lines;
  for (auto l : SplitLines(text)) lines.emplace_back(l);
  int edits = static_cast<int>(rng() % 5);
  for (int e = 0; e < edits; ++e) {
    std::size_t at = lines.empty() ? 0 : rng() % (lines.size() + 1);
    switch (rng() % 3) {
      case 0: lines.insert(lines.begin() + at, "new " + std::to_string(rng() % 3) + "\n"); break;
      case 1: if (at < lines.size()) lines.erase(lines.begin() + at); break;
      default: if (at < lines.size()) lines[at] = "changed\n"; break;
    }
  }
  std::string out;
  for (auto& l : lines) out += l;
  if (!out.empty() && rng() % 5 == 0) out.pop_back();
  return out;
}

TEST(UnifiedDiff, SplitLinesKeepsNewlines) {
  EXPECT_TRUE(SplitLines("").empty());
  EXPECT_EQ(SplitLines("a"), (std::vector<std::string_view>{"a"}));
  EXPECT_EQ(SplitLines("a\nb\n"), (std::vector<std::string_view>{"a\n", "b\n"}));
  EXPECT_EQ(SplitLines("a\n\nb"), (std::vector<std::string_view>{"a\n", "\n", "b"}));
}

TEST(UnifiedDiff, EqualTextsHaveNoHunks) {
  EXPECT_EQ(UnifiedHunks("", ""), "");
  EXPECT_EQ(UnifiedHunks("a\nb\n", "a\nb\n"), "");
}

TEST(UnifiedDiff, FromAndToEmpty) {
  EXPECT_EQ(UnifiedHunks("", "a\nb\n"), "@@ -0,0 +1,2 @@\n+a\n+b\n");
  EXPECT_EQ(UnifiedHunks("a\nb\n", ""), "@@ -1,2 +0,0 @@\n-a\n-b\n");
  EXPECT_EQ(UnifiedHunks("", "x"), "@@ -0,0 +1 @@\n+x\n\\ No newline at end of file\n");
}

TEST(UnifiedDiff, NoNewlineAtEndOfFile) {
  EXPECT_EQ(UnifiedHunks("a\nb", "a\nc"),
            "@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n");
  // Adding the final newline changes the last line.
  EXPECT_EQ(UnifiedHunks("a", "a\n"), "@@ -1 +1 @@\n-a\n\\ No newline at end of file\n+a\n");
  EXPECT_EQ(UnifiedHunks("a\n", "a"), "@@ -1 +1 @@\n-a\n+a\n\\ No newline at end of file\n");
  // An unchanged last line without newline, as context.
  EXPECT_EQ(UnifiedHunks("x\nlast", "y\nlast"),
            "@@ -1,2 +1,2 @@\n-x\n+y\n last\n\\ No newline at end of file\n");
  ExpectRoundTrip("a\nb", "a\nc");
  ExpectRoundTrip("a", "a\n");
  ExpectRoundTrip("x\nlast", "y\nlast");
}

TEST(UnifiedDiff, ThreeLinesOfContext) {
  std::string a = Lines(1, 20);
  std::string b = a;
  b.replace(b.find("10\n"), 3, "ten\n");
  EXPECT_EQ(UnifiedHunks(a, b), "@@ -7,7 +7,7 @@\n 7\n 8\n 9\n-10\n+ten\n 11\n 12\n 13\n");
  EXPECT_EQ(UnifiedHunks(a, b, 0), "@@ -10 +10 @@\n-10\n+ten\n");
}

TEST(UnifiedDiff, CloseChangesShareAHunkDistantOnesDoNot) {
  std::string a = Lines(1, 30);
  // Six unchanged lines between two changes: the contexts touch, one hunk.
  std::string b = a;
  b.replace(b.find("\n5\n") + 1, 2, "five\n");
  b.replace(b.find("\n12\n") + 1, 3, "twelve\n");
  EXPECT_EQ(UnifiedHunks(a, b), "@@ -2,14 +2,14 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n 9\n 10\n 11\n-12\n"
                                "+twelve\n 13\n 14\n 15\n");
  // Seven: two hunks.
  std::string c = a;
  c.replace(c.find("\n5\n") + 1, 2, "five\n");
  c.replace(c.find("\n13\n") + 1, 3, "thirteen\n");
  std::string hunks = UnifiedHunks(a, c);
  EXPECT_EQ(std::count(hunks.begin(), hunks.end(), '@'), 8) << hunks;
  EXPECT_NE(hunks.find("@@ -2,7 +2,7 @@\n"), std::string::npos) << hunks;
  EXPECT_NE(hunks.find("@@ -10,7 +10,7 @@\n"), std::string::npos) << hunks;
  ExpectRoundTrip(a, b);
  ExpectRoundTrip(a, c);
}

TEST(UnifiedDiff, EverythingChanged) {
  std::string a = Lines(1, 500);
  std::string b;
  for (int i = 1; i <= 400; ++i) b += "other " + std::to_string(i) + "\n";
  std::string hunks = UnifiedHunks(a, b);
  EXPECT_EQ(hunks.substr(0, hunks.find('\n')), "@@ -1,500 +1,400 @@");
  EXPECT_EQ(std::count(hunks.begin(), hunks.end(), '\n'), 1 + 500 + 400);
  ExpectRoundTrip(a, b);
}

TEST(UnifiedDiff, LargeFileWithFewChanges) {
  std::string a = Lines(1, 200000);
  std::string b = a;
  b.replace(b.find("\n1000\n") + 1, 5, "one thousand\n");
  b.insert(b.find("\n100000\n") + 1, "inserted\n");
  b.erase(b.find("\n199990\n") + 1, 7);
  std::string hunks = UnifiedHunks(a, b);
  EXPECT_EQ(std::count(hunks.begin(), hunks.end(), '@'), 12) << hunks;  // three hunks
  EXPECT_NE(hunks.find("@@ -997,7 +997,7 @@\n"), std::string::npos) << hunks;
  EXPECT_NE(hunks.find("@@ -99997,6 +99997,7 @@\n"), std::string::npos) << hunks;
  EXPECT_NE(hunks.find("@@ -199987,7 +199988,6 @@\n"), std::string::npos) << hunks;
  ExpectRoundTrip(a, b);
}

TEST(UnifiedDiff, RepeatedLinesAlignMinimally) {
  // A classic: the script must not trade a few moves for a long rewrite.
  std::vector<std::string_view> a = {"a\n", "b\n", "c\n", "a\n", "b\n", "b\n", "a\n"};
  std::vector<std::string_view> b = {"c\n", "b\n", "a\n", "b\n", "a\n", "c\n"};
  std::vector<LineOp> ops = DiffLines(a, b);
  std::size_t edits = std::count_if(ops.begin(), ops.end(), [](LineOp op) { return op != LineOp::kEqual; });
  EXPECT_EQ(edits, 5u);  // the paper's example: D = 5
}

TEST(UnifiedDiff, PropertyMinimalScriptAndRoundTrip) {
  std::mt19937 rng(12345);
  for (int round = 0; round < 3000; ++round) {
    std::string a = RandomText(rng, 40);
    std::string b = round % 3 == 0 ? RandomText(rng, 40) : Mutate(rng, a);
    auto la = SplitLines(a);
    auto lb = SplitLines(b);
    std::vector<LineOp> ops = DiffLines(la, lb);
    // The script is consistent: it walks both texts exactly, equal lines match.
    std::size_t i = 0, j = 0, equal = 0;
    for (LineOp op : ops) {
      if (op == LineOp::kEqual) {
        ASSERT_LT(i, la.size());
        ASSERT_LT(j, lb.size());
        ASSERT_EQ(la[i], lb[j]) << "round " << round;
        ++i, ++j, ++equal;
      } else if (op == LineOp::kDelete) {
        ++i;
      } else {
        ++j;
      }
    }
    ASSERT_EQ(i, la.size());
    ASSERT_EQ(j, lb.size());
    // And minimal: its equal lines are a longest common subsequence.
    ASSERT_EQ(equal, Lcs(la, lb)) << "round " << round;
    ExpectRoundTrip(a, b);
    if (HasFatalFailure()) return;
  }
}

// Two long texts over a two-line alphabet differ everywhere and match
// everywhere: an exact search would cost O(N·D) ≈ 10^10 steps. The bounded
// search still produces a correct script.
TEST(UnifiedDiff, PathologicalInputsStayCorrect) {
  std::mt19937 rng(99);
  std::string a, b;
  for (int i = 0; i < 100000; ++i) a += rng() % 2 ? "x\n" : "y\n";
  for (int i = 0; i < 100000; ++i) b += rng() % 2 ? "x\n" : "y\n";
  ExpectRoundTrip(a, b);
}

TEST(UnifiedDiff, ApplyRefusesWhatDoesNotMatch) {
  std::string hunks = UnifiedHunks("a\nb\nc\n", "a\nB\nc\n");
  auto applied = ApplyUnifiedHunks("a\nx\nc\n", hunks);
  ASSERT_FALSE(applied.ok());
  EXPECT_EQ(applied.status().stage(), "patch");
  EXPECT_NE(applied.status().message().find("line 2 of the old text does not match"), std::string::npos)
      << applied.status().message();
  EXPECT_FALSE(ApplyUnifiedHunks("a\n", "@@ nonsense\n").ok());
}

// GNU patch, not our applier, agrees with the hunks.
TEST(UnifiedDiff, GnuPatchAppliesTheHunks) {
  ASSERT_EQ(access("/usr/bin/patch", X_OK), 0) << "GNU patch is missing (scripts/install-deps.sh installs it)";
  char tmpl[] = "/tmp/agentbox-udiff.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::mt19937 rng(777);
  for (int round = 0; round < 40; ++round) {
    std::string a = RandomText(rng, 30);
    std::string b = Mutate(rng, a);
    if (a == b) continue;
    std::ofstream(dir + "/old", std::ios::binary | std::ios::trunc) << a;
    std::ofstream(dir + "/diff", std::ios::binary | std::ios::trunc) << "--- old\n+++ new\n" << UnifiedHunks(a, b);
    std::string cmd = "/usr/bin/patch --quiet --force -o " + dir + "/new " + dir + "/old < " + dir +
                      "/diff > " + dir + "/log 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << "round " << round;
    std::ifstream in(dir + "/new", std::ios::binary);
    std::string got((std::istreambuf_iterator<char>(in)), {});
    EXPECT_EQ(got, b) << "round " << round << "\n" << UnifiedHunks(a, b);
    fs::remove(dir + "/new");
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace agentbox::session
