// RAII for file descriptors, and the one way a path the sandbox controls
// is opened.
#pragma once

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

// A buffer for recv(2) whose pages are touched only as data arrives in them:
// a std::vector<char> of the same size is zeroed, which makes every page of
// it private to the process for as long as the buffer lives (1 MiB per idle
// session world, for a channel buffer sized for the largest message).
class RecvBuffer {
 public:
  explicit RecvBuffer(std::size_t size) : data_(new char[size]), size_(size) {}
  char* data() { return data_.get(); }
  std::size_t size() const { return size_; }

 private:
  std::unique_ptr<char[]> data_;
  std::size_t size_;
};

// Writes all of `data` to `fd`, retrying on EINTR and after short writes:
// true when all of it went, false with errno set when a write failed (EIO
// for a write that wrote nothing).
inline bool WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

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

// Sends `data` (at least one byte) with the descriptors `fds` attached
// (SCM_RIGHTS) in one sendmsg, retrying on EINTR: true when all of it went.
// Every descriptor-passing channel of the runner and the session init.
// At most kMaxPassedFds descriptors: what a session's call passes (a memfd,
// stdin, output, result, the background log, a binding socket) fits.
inline constexpr std::size_t kMaxPassedFds = 8;
inline bool SendWithFds(int sock, const void* data, std::size_t len, const int* fds, std::size_t n) {
  constexpr std::size_t kMaxFds = kMaxPassedFds;
  if (n > kMaxFds || len == 0) return false;
  iovec iov{const_cast<void*>(data), len};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (n > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * n);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
  }
  ssize_t sent;
  do {
    sent = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  return sent == static_cast<ssize_t>(len);
}

// Receives one message of at most `len` bytes into `data` with the
// descriptors attached to it (SCM_RIGHTS, CLOEXEC), at most kMaxFds, into
// `fds` (owned; extra ones are closed), retrying on EINTR. Returns what
// recvmsg returned (-1 with errno). `*truncated`: the kernel had more
// descriptors than fit.
inline ssize_t RecvWithFds(int sock, void* data, std::size_t len, int flags, std::vector<UniqueFd>* fds,
                           bool* truncated = nullptr) {
  constexpr std::size_t kMaxFds = kMaxPassedFds;
  iovec iov{data, len};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + sizeof(int) * i, sizeof fd);
      fds->emplace_back(fd);
    }
  }
  if (truncated) *truncated = (msg.msg_flags & MSG_CTRUNC) != 0;
  return n;
}

}  // namespace agentbox::linux
