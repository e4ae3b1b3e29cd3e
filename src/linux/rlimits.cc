#include "linux/rlimits.h"

#include <sys/resource.h>

#include <algorithm>

namespace agentbox::linux {

RlimitsSet RlimitsFor(const ResourceLimits& limits) {
  RlimitsSet out;
  out.nofile_soft = limits.nofile;
  struct rlimit nofile {};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) out.nofile_soft = std::min<rlim_t>(nofile.rlim_max, limits.nofile);
  if (limits.fsize_bytes) {
    out.fsize = *limits.fsize_bytes;
    struct rlimit fsize {};
    if (getrlimit(RLIMIT_FSIZE, &fsize) == 0) {
      out.fsize = std::min<rlim_t>(fsize.rlim_cur, static_cast<rlim_t>(*limits.fsize_bytes));
    }
  }
  if (limits.nproc) {
    out.nproc = *limits.nproc;
    struct rlimit nproc {};
    if (getrlimit(RLIMIT_NPROC, &nproc) == 0) {
      out.nproc = std::min<rlim_t>(nproc.rlim_max, static_cast<rlim_t>(*limits.nproc));
    }
  }
  return out;
}

Status ApplyRlimits(const ResourceLimits& limits) {
  const RlimitsSet want = RlimitsFor(limits);
  struct rlimit none = {0, 0};
  if (setrlimit(RLIMIT_CORE, &none) != 0) return Status::Errno("rlimits", "setrlimit(RLIMIT_CORE)");
  struct rlimit nofile {};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    nofile.rlim_cur = static_cast<rlim_t>(want.nofile_soft);
    if (setrlimit(RLIMIT_NOFILE, &nofile) != 0) return Status::Errno("rlimits", "setrlimit(RLIMIT_NOFILE)");
  }
  if (want.fsize) {
    struct rlimit fsize {};
    if (getrlimit(RLIMIT_FSIZE, &fsize) == 0) {
      fsize.rlim_cur = static_cast<rlim_t>(*want.fsize);
      fsize.rlim_max = std::min(fsize.rlim_max, static_cast<rlim_t>(*want.fsize));
      if (setrlimit(RLIMIT_FSIZE, &fsize) != 0) return Status::Errno("rlimits", "setrlimit(RLIMIT_FSIZE)");
    }
  }
  if (want.nproc) {
    // Both limits: the command cannot raise the hard one (that needs
    // CAP_SYS_RESOURCE in the initial user namespace).
    struct rlimit nproc = {static_cast<rlim_t>(*want.nproc), static_cast<rlim_t>(*want.nproc)};
    if (setrlimit(RLIMIT_NPROC, &nproc) != 0) return Status::Errno("rlimits", "setrlimit(RLIMIT_NPROC)");
  }
  return {};
}

}  // namespace agentbox::linux
