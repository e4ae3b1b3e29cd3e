#include "linux/project_quota.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "linux/fd.h"
#include "session/test_files.h"

namespace agentbox::linux {
namespace {

using session::testing::TempDir;

// Project attributes kept per inode in memory; a project's use is the sum
// of its files' sizes.
class FakeKernel : public QuotaKernel {
 public:
  Result<ProjectAttr> Get(int fd, const std::string&) override { return attrs_[Ino(fd)]; }
  Status Set(int fd, const std::string& path, const ProjectAttr& attr) override {
    if (path == fail_on) return Status::Syscall("quota", "ioctl(FS_IOC_FSSETXATTR)", path, EPERM);
    struct stat st {};
    fstat(fd, &st);
    attrs_[st.st_ino] = attr;
    sizes_[st.st_ino] = S_ISREG(st.st_mode) ? static_cast<std::uint64_t>(st.st_size) : 4096;
    ++sets;
    return {};
  }
  Result<QuotaUsage> Usage(const std::string&, std::uint32_t projid) override {
    QuotaUsage u;
    for (const auto& [ino, a] : attrs_) {
      if (a.projid == projid) {
        u.used_bytes += sizes_[ino];
        ++u.inodes;
      }
    }
    u.limit_bytes = limits[projid];
    return u;
  }
  Status SetLimit(const std::string&, std::uint32_t projid, std::uint64_t bytes) override {
    limits[projid] = bytes;
    return {};
  }
  ProjectAttr Of(const std::string& path) {
    struct stat st {};
    lstat(path.c_str(), &st);
    return attrs_[st.st_ino];
  }
  void Put(const std::string& path, ProjectAttr a) {
    struct stat st {};
    lstat(path.c_str(), &st);
    attrs_[st.st_ino] = a;
  }
  std::map<std::uint32_t, std::uint64_t> limits;
  std::string fail_on;
  int sets = 0;

 private:
  static ino_t Ino(int fd) {
    struct stat st {};
    fstat(fd, &st);
    return st.st_ino;
  }
  std::map<ino_t, ProjectAttr> attrs_;
  std::map<ino_t, std::uint64_t> sizes_;
};

void Write(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

struct Tree {
  TempDir ws{"quota-ws"};
  TempDir state{"quota-state"};
  Tree() {
    Write(ws / "a.txt", std::string(1000, 'a'));
    Write(ws / "src/b.txt", std::string(500, 'b'));
    Write(ws / "src/deep/c.txt", "c");
    symlink("a.txt", (ws / "link").c_str());
  }
};

TEST(ProjectQuota, TagsEveryEntryLimitsTheGrowthAndRestoresAll) {
  Tree t;
  FakeKernel k;
  k.Put(t.ws / "src/b.txt", {7, false});  // someone's own project: kept
  auto q = WorkspaceQuota::Begin(&k, t.ws.path(), "/dev/fake", 1 << 20, t.state.path());
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  const std::uint32_t id = (*q)->projid();
  EXPECT_GE(id, 0x40000000u);
  EXPECT_EQ((*q)->tagged(), 6u);  // root, a.txt, src, b.txt, deep, c.txt (not the link)
  EXPECT_EQ(k.Of(t.ws.path()), (ProjectAttr{id, true}));
  EXPECT_EQ(k.Of(t.ws / "src/deep"), (ProjectAttr{id, true}));
  EXPECT_EQ(k.Of(t.ws / "src/deep/c.txt"), (ProjectAttr{id, false}));
  EXPECT_EQ(k.Of(t.ws / "src/b.txt"), (ProjectAttr{id, false}));
  // The limit: what the project held at the start, plus disk_gib.
  EXPECT_EQ((*q)->start_bytes(), 1000u + 500u + 1u + 3 * 4096u);
  EXPECT_EQ(k.limits[id], (*q)->start_bytes() + (1u << 20));
  EXPECT_TRUE(std::filesystem::exists(t.state / (std::to_string(id) + ".json")));

  // Written during the run: inherits the id (the kernel does that; here by hand).
  Write(t.ws / "src/new.txt", "new");
  k.Put(t.ws / "src/new.txt", {id, false});

  ASSERT_TRUE((*q)->End().ok());
  EXPECT_EQ(k.Of(t.ws.path()), ProjectAttr{});
  EXPECT_EQ(k.Of(t.ws / "a.txt"), ProjectAttr{});
  EXPECT_EQ(k.Of(t.ws / "src/new.txt"), ProjectAttr{});
  EXPECT_EQ(k.Of(t.ws / "src/b.txt"), (ProjectAttr{7, false}));
  EXPECT_EQ(k.limits[id], 0u);
  EXPECT_FALSE(std::filesystem::exists(t.state / (std::to_string(id) + ".json")));
}

TEST(ProjectQuota, AFailedSetUpUndoesWhatItTagged) {
  Tree t;
  FakeKernel k;
  k.fail_on = t.ws / "src/deep";
  auto q = WorkspaceQuota::Begin(&k, t.ws.path(), "/dev/fake", 1 << 20, t.state.path());
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.status().ToString().find("src/deep"), std::string::npos) << q.status().ToString();
  EXPECT_EQ(k.Of(t.ws.path()), ProjectAttr{});
  EXPECT_EQ(k.Of(t.ws / "a.txt"), ProjectAttr{});
  EXPECT_TRUE(std::filesystem::is_empty(t.state.path()));
}

TEST(ProjectQuota, GcRestoresWhatADeadSupervisorLeftAndOnlyThat) {
  Tree t;
  FakeKernel k;
  auto q = WorkspaceQuota::Begin(&k, t.ws.path(), "/dev/fake", 1 << 20, t.state.path());
  ASSERT_TRUE(q.ok());
  const std::uint32_t id = (*q)->projid();
  const std::string record = t.state / (std::to_string(id) + ".json");
  // Alive (this process): left alone.
  EXPECT_TRUE(CollectStaleProjectQuotas(&k, t.state.path()).empty());
  EXPECT_EQ(k.Of(t.ws / "a.txt"), (ProjectAttr{id, false}));
  // A dead owner: its record names a pid that is not running with that start time.
  std::ifstream in(record);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = text.find("\"owner\":\"");
  ASSERT_NE(at, std::string::npos) << text;
  const auto last = text.find('"', at + 9);
  const std::string owner = text.substr(at + 9, last - at - 9);
  const std::string dead = owner.substr(0, owner.rfind('-')) + "-1";  // same pid, another start time
  text.replace(at + 9, owner.size(), dead);
  std::ofstream(record, std::ios::trunc) << text;
  auto restored = CollectStaleProjectQuotas(&k, t.state.path());
  ASSERT_EQ(restored.size(), 1u);
  EXPECT_EQ(k.Of(t.ws / "a.txt"), ProjectAttr{});
  EXPECT_EQ(k.Of(t.ws.path()), ProjectAttr{});
  EXPECT_EQ(k.limits[id], 0u);
  EXPECT_FALSE(std::filesystem::exists(record));
}

}  // namespace
}  // namespace agentbox::linux
