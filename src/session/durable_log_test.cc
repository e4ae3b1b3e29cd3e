#include "session/durable_log.h"
#include "session/test_files.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace agentbox::session {
namespace {

class TempLog {
 public:
  std::string path() const { return dir_ / "log.jsonl"; }
  std::string Read() const { return session::testing::Read(path()); }

 private:
  session::testing::TempDir dir_{"durable-log"};
};

TEST(DurableLog, AppendReturnsTheLengthAndSyncCoversIt) {
  TempLog t;
  DurableLog log;
  ASSERT_TRUE(log.Open(t.path()).ok());
  auto a = log.Append("{\"a\":1}\n");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, 8u);
  auto b = log.Append("{\"b\":2}\n");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, 16u);
  // Written is readable before any sync (a SIGKILL of the writer keeps it).
  EXPECT_EQ(t.Read(), "{\"a\":1}\n{\"b\":2}\n");
  // One fdatasync covers every line written before it began: syncing the
  // first line puts the second on disk too.
  EXPECT_TRUE(log.Sync(*a).ok());
  EXPECT_EQ(log.syncs(), 1u);
  EXPECT_TRUE(log.Sync(*b).ok());
  EXPECT_EQ(log.syncs(), 1u);
  auto c = log.Append("{\"c\":3}\n");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(log.Sync(*c).ok());
  EXPECT_EQ(log.syncs(), 2u);
}

TEST(DurableLog, ReopenedContinuesAtTheEndAndSyncsWhatWasThere) {
  TempLog t;
  {
    DurableLog log;
    ASSERT_TRUE(log.Open(t.path()).ok());
    ASSERT_TRUE(log.Append("first\n").ok());
  }
  DurableLog log;
  ASSERT_TRUE(log.Open(t.path()).ok());
  EXPECT_EQ(log.written(), 6u);
  auto end = log.Append("second\n");
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(*end, 13u);
  EXPECT_TRUE(log.Sync(6).ok());  // the earlier process's line needs a sync of this one too
  EXPECT_EQ(log.syncs(), 1u);
  EXPECT_EQ(t.Read(), "first\nsecond\n");
}

TEST(DurableLog, ConcurrentWritersNeverInterleaveAndEachSyncHolds) {
  TempLog t;
  DurableLog log;
  ASSERT_TRUE(log.Open(t.path()).ok());
  constexpr int kThreads = 8, kLines = 50;
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < kLines; ++i) {
        // Long enough that a torn write would show.
        const std::string line = "t" + std::to_string(k) + "-" + std::to_string(i) + " " + std::string(3000, 'x') + "\n";
        auto end = log.Append(line);
        ASSERT_TRUE(end.ok());
        ASSERT_TRUE(log.Sync(*end).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  const std::string text = t.Read();
  std::set<std::string> seen;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto space = line.find(' ');
    ASSERT_NE(space, std::string::npos) << line.substr(0, 40);
    EXPECT_EQ(line.substr(space + 1), std::string(3000, 'x')) << "a line was torn: " << line.substr(0, 40);
    seen.insert(line.substr(0, space));
  }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(kThreads * kLines));
  EXPECT_EQ(log.written(), text.size());
  // Never more fdatasyncs than syncs asked for (how many writers shared one
  // depends on how long the filesystem takes; a tmpfs takes no time).
  EXPECT_LE(log.syncs(), static_cast<std::uint64_t>(kThreads * kLines));
  EXPECT_GE(log.syncs(), 1u);
}

TEST(DurableLog, ClosedLogRefusesWrites) {
  TempLog t;
  DurableLog log;
  ASSERT_TRUE(log.Open(t.path()).ok());
  auto end = log.Append("x\n");
  ASSERT_TRUE(end.ok());
  log.Close();
  EXPECT_FALSE(log.Append("y\n").ok());
  EXPECT_FALSE(log.Sync(*end).ok());
  EXPECT_EQ(t.Read(), "x\n");
}

}  // namespace
}  // namespace agentbox::session
