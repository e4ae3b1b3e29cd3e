// Temporary trees for the session layer's unit tests.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace agentbox::session::testing {

// A directory under /tmp, removed with everything in it, however its modes
// were left (overlayfs leaves work/work at 0000; tests chmod files to 000).
class TempDir {
 public:
  explicit TempDir(const char* name, mode_t mode = 0700) {
    std::string tmpl = std::string("/tmp/agentbox-") + name + ".XXXXXX";
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
    chmod(path_.c_str(), mode);
  }
  ~TempDir() {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(path_, ec); it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (!it->is_symlink(ec)) fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ec);
    }
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

inline void Write(const std::string& path, const std::string& content, mode_t mode = 0644) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
  ASSERT_EQ(chmod(path.c_str(), mode), 0) << path;
}

inline std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

}  // namespace agentbox::session::testing
