#include "linux/deny_scan.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>

#include <algorithm>
#include <filesystem>
#include <fstream>

namespace agentbox::linux {
namespace {

namespace fs = std::filesystem;

class DenyScanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/agentbox-scan-test.XXXXXX";
    root_ = mkdtemp(tmpl);
    ws_ = root_ + "/ws";
    cache_ = root_ + "/cache/agentbox/deny-scan";
    fs::create_directories(ws_ + "/a/b");
    fs::create_directories(ws_ + "/c");
    Touch(ws_ + "/.env");
    Touch(ws_ + "/a/b/.env");
    Touch(ws_ + "/a/b/keep.txt");
    Touch(ws_ + "/c/.envrc");
  }
  void TearDown() override { fs::remove_all(root_); }

  static void Touch(const std::string& p) { std::ofstream(p) << "x"; }

  // Directories changed in the last second are never cached: age them.
  void AgeAllDirectories() {
    struct timespec old[2] = {{1600000000, 0}, {1600000000, 0}};
    utimensat(AT_FDCWD, ws_.c_str(), old, AT_SYMLINK_NOFOLLOW);
    for (const auto& e : fs::recursive_directory_iterator(ws_)) {
      if (e.is_directory() && !e.is_symlink()) utimensat(AT_FDCWD, e.path().c_str(), old, AT_SYMLINK_NOFOLLOW);
    }
    // Setting the mtime moved the ctime to now, which cannot be set back:
    // wait until it counts as settled (older than the last whole second).
    const time_t changed = time(nullptr);
    while (time(nullptr) < changed + 2) usleep(100 * 1000);
  }

  std::vector<std::string> Scan(const std::vector<std::string>& patterns, const std::string& cache,
                                ScanStats* stats) {
    std::vector<DenyMatch> matches;
    GlobScan scan{ws_, "/inside", "", patterns};
    Status s = ScanDenyGlobs(scan, ws_, "/inside", cache, &matches, stats);
    EXPECT_TRUE(s.ok()) << s.ToString();
    std::vector<std::string> targets;
    for (const auto& m : matches) targets.push_back(m.target);
    std::sort(targets.begin(), targets.end());
    return targets;
  }

  std::string root_, ws_, cache_;
};

TEST_F(DenyScanTest, FindsEveryMatchAtAnyDepthAndNothingElse) {
  ScanStats stats;
  EXPECT_EQ(Scan({"**/.env"}, "", &stats), (std::vector<std::string>{"/inside/.env", "/inside/a/b/.env"}));
  EXPECT_EQ(stats.directories, 4u);
  EXPECT_EQ(stats.entries, 7u);
}

TEST_F(DenyScanTest, DirectoryPatternsMaskTheDirectory) {
  fs::create_directories(ws_ + "/x/secrets/deep");
  Touch(ws_ + "/x/secrets/deep/key");
  ScanStats stats;
  EXPECT_EQ(Scan({"**/secrets/**"}, "", &stats), (std::vector<std::string>{"/inside/x/secrets"}));
}

TEST_F(DenyScanTest, AnchoredPatternsMatchTheirPathOnly) {
  ScanStats stats;
  EXPECT_EQ(Scan({"a/*/.env"}, "", &stats), (std::vector<std::string>{"/inside/a/b/.env"}));
}

TEST_F(DenyScanTest, ASymlinkNamedLikeASecretMasksItsTarget) {
  fs::create_directories(ws_ + "/real");
  Touch(ws_ + "/real/secret.txt");
  fs::create_symlink(ws_ + "/real/secret.txt", ws_ + "/c/.env");
  fs::create_symlink("/etc/hostname", ws_ + "/a/.env");  // outside: not visible inside anyway
  ScanStats stats;
  EXPECT_EQ(Scan({"**/.env"}, "", &stats),
            (std::vector<std::string>{"/inside/.env", "/inside/a/b/.env", "/inside/real/secret.txt"}));
}

TEST_F(DenyScanTest, CacheServesUnchangedDirectoriesWithoutReadingThem) {
  AgeAllDirectories();
  ScanStats first, second;
  auto a = Scan({"**/.env"}, cache_, &first);
  EXPECT_EQ(first.directories_read, 4u);
  auto b = Scan({"**/.env"}, cache_, &second);
  EXPECT_EQ(a, b);
  EXPECT_EQ(second.directories, 4u);
  EXPECT_EQ(second.directories_read, 0u);
}

TEST_F(DenyScanTest, CacheNoticesANewSecretInAnOldDirectory) {
  AgeAllDirectories();
  ScanStats s1, s2, s3;
  Scan({"**/.env"}, cache_, &s1);
  Touch(ws_ + "/c/.env");  // c's mtime moves
  auto after = Scan({"**/.env"}, cache_, &s2);
  EXPECT_EQ(after, (std::vector<std::string>{"/inside/.env", "/inside/a/b/.env", "/inside/c/.env"}));
  EXPECT_EQ(s2.directories_read, 1u);
  // A directory changed just now is read again on the next run too.
  Scan({"**/.env"}, cache_, &s3);
  EXPECT_EQ(s3.directories_read, 1u);
}

// The command can add an entry and set the directory's mtime back to what
// the cache holds: the ctime still moves, and gives it away.
TEST_F(DenyScanTest, CacheNoticesAnEntryHiddenBehindAnMtimeSetBack) {
  AgeAllDirectories();
  ScanStats s1, s2;
  Scan({"**/.env"}, cache_, &s1);
  struct stat before {};
  ASSERT_EQ(stat((ws_ + "/c").c_str(), &before), 0);
  Touch(ws_ + "/c/.env");
  struct timespec back[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(utimensat(AT_FDCWD, (ws_ + "/c").c_str(), back, AT_SYMLINK_NOFOLLOW), 0);
  auto after = Scan({"**/.env"}, cache_, &s2);
  EXPECT_NE(std::find(after.begin(), after.end(), "/inside/c/.env"), after.end());
}

TEST_F(DenyScanTest, CacheNoticesANewDirectoryHoldingASecret) {
  AgeAllDirectories();
  ScanStats s1, s2;
  Scan({"**/.env"}, cache_, &s1);
  fs::create_directories(ws_ + "/a/new");
  Touch(ws_ + "/a/new/.env");
  auto after = Scan({"**/.env"}, cache_, &s2);
  EXPECT_NE(std::find(after.begin(), after.end(), "/inside/a/new/.env"), after.end());
}

// A cached directory is revalidated by a statx of its path, which would
// follow a symlink put in place of an ancestor: the ancestor's parent
// changed with it, is read again, and never leads there.
TEST_F(DenyScanTest, CacheFollowsNoAncestorSwappedForASymlink) {
  AgeAllDirectories();
  ScanStats s1, s2;
  Scan({"**/.env"}, cache_, &s1);
  fs::rename(ws_ + "/a", ws_ + "/a2");
  fs::create_directory_symlink("a2", ws_ + "/a");
  EXPECT_EQ(Scan({"**/.env"}, cache_, &s2), (std::vector<std::string>{"/inside/.env", "/inside/a2/b/.env"}));
}

TEST_F(DenyScanTest, CacheFollowsNoDirectorySwappedForASymlinkOutside) {
  fs::create_directories(root_ + "/outside/b");
  Touch(root_ + "/outside/b/.env");
  AgeAllDirectories();
  ScanStats s1, s2;
  Scan({"**/.env"}, cache_, &s1);
  fs::rename(ws_ + "/a/b", ws_ + "/moved");
  fs::create_directory_symlink(root_ + "/outside/b", ws_ + "/a/b");
  EXPECT_EQ(Scan({"**/.env"}, cache_, &s2), (std::vector<std::string>{"/inside/.env", "/inside/moved/.env"}));
}

// Two scans of one launch share their stamps and find what each would alone.
TEST_F(DenyScanTest, ScansOfOneLaunchShareTheirStamps) {
  AgeAllDirectories();
  ScanStats s1, s2, s3, s4;
  Scan({"**/.env"}, cache_, &s1);
  Scan({"**/.envrc"}, cache_, &s2);
  DirStampMemo memo(ws_);
  for (const auto& [pattern, want] :
       std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"**/.env", {"/inside/.env", "/inside/a/b/.env"}}, {"**/.envrc", {"/inside/c/.envrc"}}}) {
    std::vector<DenyMatch> matches;
    ScanStats stats;
    GlobScan scan{ws_, "/inside", "", {pattern}};
    ASSERT_TRUE(ScanDenyGlobs(scan, ws_, "/inside", cache_, &matches, &stats, &memo).ok());
    std::vector<std::string> targets;
    for (const auto& m : matches) targets.push_back(m.target);
    std::sort(targets.begin(), targets.end());
    EXPECT_EQ(targets, want) << pattern;
    EXPECT_EQ(stats.directories_read, 0u) << pattern;
  }
  EXPECT_NE(memo.Find("a/b"), nullptr);
}

TEST_F(DenyScanTest, ADamagedCacheIsIgnored) {
  AgeAllDirectories();
  ScanStats s1, s2;
  Scan({"**/.env"}, cache_, &s1);
  for (const auto& e : fs::directory_iterator(cache_)) {
    std::ofstream(e.path(), std::ios::binary | std::ios::trunc) << "agentbox-deny-scan-3\n\xff\xff\xff\xff garbage";
  }
  auto b = Scan({"**/.env"}, cache_, &s2);
  EXPECT_EQ(b, (std::vector<std::string>{"/inside/.env", "/inside/a/b/.env"}));
  EXPECT_EQ(s2.directories_read, 4u);
}

// A cache cut short anywhere (a full disk, a crash mid-write by hand) is
// ignored whole: every directory is read again and the matches are right.
// One with a byte changed anywhere serves a directory only where the
// directory's stamp still matches, so the matches are right either way.
TEST_F(DenyScanTest, ACacheCutShortOrWithAByteChangedNeverHidesAMatch) {
  AgeAllDirectories();
  ScanStats first;
  const std::vector<std::string> want = {"/inside/.env", "/inside/a/b/.env"};
  ASSERT_EQ(Scan({"**/.env"}, cache_, &first), want);
  std::string path, good;
  for (const auto& e : fs::directory_iterator(cache_)) path = e.path();
  {
    std::ifstream in(path, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(good.size(), 100u);
  auto put = [&](const std::string& bytes) { std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes; };
  for (std::size_t len = 0; len < good.size(); ++len) {
    put(good.substr(0, len));
    ScanStats s;
    ASSERT_EQ(Scan({"**/.env"}, cache_, &s), want) << "cut at " << len;
    ASSERT_EQ(s.directories_read, 4u) << "cut at " << len;
  }
  for (std::size_t at = 0; at < good.size(); ++at) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x5a);
    put(bad);
    ScanStats s;
    ASSERT_EQ(Scan({"**/.env"}, cache_, &s), want) << "byte " << at << " changed";
  }
}

// The cache lists directories in the order the last walk visited them; a
// walk that leaves that order (a directory added before the others) still
// finds every unchanged one in it, and reads only what changed.
TEST_F(DenyScanTest, AWalkOutOfTheCachesOrderStillUsesIt) {
  for (const char* d : {"d1", "d2", "d3", "d4"}) {
    fs::create_directories(ws_ + "/" + d + "/deep");
    Touch(ws_ + "/" + d + "/deep/.env");
  }
  AgeAllDirectories();
  ScanStats s1, s2, s3;
  Scan({"**/.env"}, cache_, &s1);
  EXPECT_EQ(s1.directories_read, 12u);
  fs::create_directories(ws_ + "/0first/deep");
  Touch(ws_ + "/0first/deep/.env");
  fs::create_directories(ws_ + "/zlast");
  AgeAllDirectories();
  auto after = Scan({"**/.env"}, cache_, &s2);
  EXPECT_EQ(after.size(), 7u);
  EXPECT_NE(std::find(after.begin(), after.end(), "/inside/0first/deep/.env"), after.end());
  // The root, every directory (aged again, so each has a new ctime) — and
  // then, with nothing changed, none.
  Scan({"**/.env"}, cache_, &s3);
  EXPECT_EQ(s3.directories, 15u);
  EXPECT_EQ(s3.directories_read, 0u);
}

TEST_F(DenyScanTest, DifferentPatternsDoNotShareACache) {
  AgeAllDirectories();
  ScanStats s1, s2;
  Scan({"**/.env"}, cache_, &s1);
  EXPECT_EQ(Scan({"**/.envrc"}, cache_, &s2), (std::vector<std::string>{"/inside/c/.envrc"}));
  EXPECT_EQ(s2.directories_read, 4u);
}

}  // namespace
}  // namespace agentbox::linux
