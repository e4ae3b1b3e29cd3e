// Tests' fake cgroupfs: a temp directory holding /proc/self files and cgroup
// directories of plain files, and the mountinfo and /proc/self/cgroup texts
// of the pure-v2 and the hybrid layout.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace agentbox::linux::fake_cgroupfs {

class FakeRoot {
 public:
  FakeRoot() {
    char tmpl[] = "/tmp/agentbox-cgfake.XXXXXX";
    root_ = mkdtemp(tmpl);
    std::filesystem::create_directories(root_ + "/proc/self/ns");
    std::filesystem::create_symlink("pid:[4026531836]", root_ + "/proc/self/ns/pid");
  }
  ~FakeRoot() { std::filesystem::remove_all(root_); }
  FakeRoot(const FakeRoot&) = delete;
  FakeRoot& operator=(const FakeRoot&) = delete;

  void Put(const std::string& path, const std::string& text) {
    std::filesystem::create_directories(std::filesystem::path(root_ + path).parent_path());
    std::ofstream(root_ + path) << text;
  }
  std::string Get(const std::string& path) {
    std::ifstream in(root_ + path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  bool Has(const std::string& path) { return std::filesystem::exists(root_ + path); }
  void Dir(const std::string& path) { std::filesystem::create_directories(root_ + path); }
  // A delegated directory as setup-delegation leaves it: owned by `uid`.
  void Owned(const std::string& path, uid_t uid) {
    Dir(path);
    ASSERT_EQ(chown((root_ + path).c_str(), uid, uid), 0);
  }
  uid_t Owner(const std::string& path) {
    struct stat st {};
    return lstat((root_ + path).c_str(), &st) == 0 ? st.st_uid : static_cast<uid_t>(-1);
  }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

inline constexpr const char* kV2Mountinfo =
    "25 30 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n";
inline constexpr const char* kHybridMountinfo =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
inline constexpr const char* kHybridSelf = "8:pids:/\n4:memory:/process_api/abc\n2:cpuacct:/\n1:cpu:/\n0::/\n";

}  // namespace agentbox::linux::fake_cgroupfs
