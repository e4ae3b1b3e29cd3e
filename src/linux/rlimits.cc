#include "linux/rlimits.h"

#include <sys/resource.h>

#include <algorithm>

namespace agentbox::linux {

Status ApplyRlimits(const ResourceLimits& limits) {
  struct rlimit none = {0, 0};
  if (setrlimit(RLIMIT_CORE, &none) != 0) return Status::Errno("rlimits", "setrlimit(RLIMIT_CORE)");
  struct rlimit nofile {};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    nofile.rlim_cur = std::min<rlim_t>(nofile.rlim_max, limits.nofile);
    if (setrlimit(RLIMIT_NOFILE, &nofile) != 0) return Status::Errno("rlimits", "setrlimit(RLIMIT_NOFILE)");
  }
  if (limits.fsize_bytes) {
    struct rlimit fsize {};
    if (getrlimit(RLIMIT_FSIZE, &fsize) == 0) {
      rlim_t want = static_cast<rlim_t>(*limits.fsize_bytes);
      fsize.rlim_cur = std::min(fsize.rlim_cur, want);
      fsize.rlim_max = std::min(fsize.rlim_max, want);
      if (setrlimit(RLIMIT_FSIZE, &fsize) != 0) return Status::Errno("rlimits", "setrlimit(RLIMIT_FSIZE)");
    }
  }
  return {};
}

}  // namespace agentbox::linux
