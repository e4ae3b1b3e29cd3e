// The compiled-filter cache: a memo of CompileSeccomp, never a second source.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "confine/layers.h"
#include "linux/seccomp_filter.h"

namespace agentbox::linux {
namespace {

namespace fs = std::filesystem;

class SeccompCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/agentbox-seccomp-cache.XXXXXX";
    root_ = mkdtemp(tmpl);
    plan_ = PlanSeccomp(true);
    plan_.cache_dir = root_ + "/agentbox/seccomp";
  }
  void TearDown() override { fs::remove_all(root_); }

  static bool Same(const BpfProgram& a, const BpfProgram& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
  }
  fs::path OnlyFile() const {
    for (const auto& e : fs::directory_iterator(plan_.cache_dir)) return e.path();
    return {};
  }

  std::string root_;
  SeccompPlan plan_;
};

TEST_F(SeccompCacheTest, CachedProgramIsTheCompiledProgram) {
  auto direct = CompileSeccomp(plan_);
  ASSERT_TRUE(direct.ok()) << direct.status().ToString();
  auto first = CompileSeccompCached(plan_);
  ASSERT_TRUE(first.ok());
  ASSERT_FALSE(OnlyFile().empty()) << "nothing was cached";
  EXPECT_EQ(fs::status(OnlyFile()).permissions() & fs::perms::all, fs::perms::owner_read | fs::perms::owner_write);
  auto second = CompileSeccompCached(plan_);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(Same(*direct, *first));
  EXPECT_TRUE(Same(*direct, *second));
}

TEST_F(SeccompCacheTest, ADifferentPlanHasADifferentEntry) {
  ASSERT_TRUE(CompileSeccompCached(plan_).ok());
  SeccompPlan other = plan_;
  other.rules.pop_back();
  auto compiled = CompileSeccompCached(other);
  ASSERT_TRUE(compiled.ok());
  EXPECT_TRUE(Same(*compiled, *CompileSeccomp(other)));
  EXPECT_EQ(std::distance(fs::directory_iterator(plan_.cache_dir), fs::directory_iterator{}), 2);
}

TEST_F(SeccompCacheTest, TruncatedOrWritableByOthersIsIgnored) {
  ASSERT_TRUE(CompileSeccompCached(plan_).ok());
  const fs::path file = OnlyFile();
  auto direct = CompileSeccomp(plan_);
  // A torn write: not a whole number of instructions.
  fs::resize_file(file, fs::file_size(file) - 3);
  auto a = CompileSeccompCached(plan_);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(Same(*a, *direct));
  // Someone else could have written it: not trusted, recompiled.
  { std::ofstream(file, std::ios::binary | std::ios::trunc) << std::string(8, '\0'); }
  chmod(file.c_str(), 0666);
  auto b = CompileSeccompCached(plan_);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(Same(*b, *direct));
}

}  // namespace
}  // namespace agentbox::linux
