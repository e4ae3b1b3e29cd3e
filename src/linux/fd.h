// RAII for file descriptors, and the one way a path the sandbox controls
// is opened.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <utility>

#include "linux/compat.h"

namespace agentbox::linux {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// Opens `rel` below the directory `root_fd` with openat2(RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS): no symlink is followed on
// the way and nothing outside `root_fd` is reached ("..", absolute paths,
// a directory swapped for a link meanwhile). A symlink as the last
// component fails with ELOOP, or with O_PATH is opened itself (O_NOFOLLOW).
// "" opens `root_fd` itself. Always O_CLOEXEC. Invalid with errno set on
// failure.
inline UniqueFd OpenBeneath(int root_fd, const std::string& rel, int flags) {
  OpenHow how{};
  how.flags = static_cast<std::uint64_t>(flags) | O_CLOEXEC | O_NOFOLLOW;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  return UniqueFd(Openat2(root_fd, rel.empty() ? "." : rel.c_str(), &how));
}

}  // namespace agentbox::linux
