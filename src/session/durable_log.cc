#include "session/durable_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace agentbox::session {

Status DurableLog::Open(const std::string& path) {
  linux::UniqueFd fd(open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid()) return Status::Errno("session", "open", path);
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return Status::Errno("session", "fstat", path);
  std::lock_guard<std::mutex> lock(mu_);
  path_ = path;
  fd_ = std::move(fd);
  // What a process before this one wrote is treated as not yet on disk:
  // the first Sync covers it too.
  written_ = static_cast<std::uint64_t>(st.st_size);
  durable_ = 0;
  sync_errno_ = 0;
  return {};
}

void DurableLog::Close() {
  std::unique_lock<std::mutex> lock(mu_);
  synced_.wait(lock, [&] { return !syncing_; });  // the fdatasync running uses the fd
  fd_.reset();
}

Result<std::uint64_t> DurableLog::Append(std::string_view line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!fd_.valid()) return Status::Syscall("session", "write", path_, EBADF);
  // Under the lock: the lines of concurrent callers never interleave, and
  // written_ is the offset this line ends at.
  std::size_t off = 0;
  while (off < line.size()) {
    ssize_t w = write(fd_.get(), line.data() + off, line.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int err = errno;
      written_ += off;  // a torn line: readers skip a line that does not parse
      return Status::Syscall("session", "write", path_, err);
    }
    off += static_cast<std::size_t>(w);
  }
  written_ += line.size();
  return written_;
}

Status DurableLog::Sync(std::uint64_t end) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (sync_errno_ != 0) return Status::Syscall("session", "fdatasync", path_, sync_errno_);
    if (durable_ >= end) return {};
    if (!fd_.valid()) return Status::Syscall("session", "fdatasync", path_, EBADF);
    if (syncing_) {
      // The running fdatasync may have begun before our line was written:
      // wait for it, then look again (it, or the next one, covers us).
      synced_.wait(lock);
      continue;
    }
    syncing_ = true;
    const std::uint64_t target = written_;  // every line written so far
    const int fd = fd_.get();
    lock.unlock();
    const int r = fdatasync(fd);
    const int err = errno;
    lock.lock();
    syncing_ = false;
    ++syncs_;
    if (r == 0) {
      durable_ = std::max(durable_, target);
    } else if (sync_errno_ == 0) {
      sync_errno_ = err;
    }
    synced_.notify_all();
  }
}

std::uint64_t DurableLog::written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return written_;
}

std::uint64_t DurableLog::syncs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return syncs_;
}

}  // namespace agentbox::session
