#include "supervise/disk_limit.h"

#include <sys/statfs.h>

#include <cerrno>
#include <cstdio>
#include <utility>

namespace agentbox::supervise {

std::uint64_t DiskFullSlack(std::uint64_t cap_bytes) {
  return cap_bytes / 100 > kDiskFullSlackBytes ? cap_bytes / 100 : kDiskFullSlackBytes;
}

std::string DiskFullReason(std::uint64_t cap_bytes, const char* errno_name) {
  char size[64];
  if (cap_bytes >= (1ULL << 30)) {
    std::snprintf(size, sizeof(size), "%.4g GiB", static_cast<double>(cap_bytes) / (1ULL << 30));
  } else {
    std::snprintf(size, sizeof(size), "%.4g MiB", static_cast<double>(cap_bytes) / (1ULL << 20));
  }
  return std::string("disk_gib: the workspace's ") + size + " is full (" + errno_name + ")";
}

std::optional<Denial> DiskFullDenial(int capped_fs_fd, std::uint64_t cap_bytes, std::string target) {
  struct statfs st {};
  int rc;
  while ((rc = fstatfs(capped_fs_fd, &st)) != 0 && errno == EINTR) {
  }
  if (rc != 0) return std::nullopt;
  const std::uint64_t free_bytes = static_cast<std::uint64_t>(st.f_bavail) * static_cast<std::uint64_t>(st.f_bsize);
  const bool no_inode = st.f_files > 0 && st.f_ffree == 0;
  if (free_bytes >= DiskFullSlack(cap_bytes) && !no_inode) return std::nullopt;
  return Denial{"resources", "write", std::move(target), DiskFullReason(cap_bytes), "statfs", 0};
}

std::optional<Denial> DiskFullDenialFromOutput(std::string_view output, std::uint64_t cap_bytes, std::string target) {
  if (output.find(kNoSpaceSignature) == std::string_view::npos) return std::nullopt;
  return Denial{"resources", "write", std::move(target), DiskFullReason(cap_bytes), "stderr-signature", 0};
}

}  // namespace agentbox::supervise
