// Finding the files that `**/.env`-style deny globs match, at launch.
//
// A full walk reads every directory entry (getdents64, no stat per entry,
// no symlink followed). To keep the per-command cost from growing with the
// workspace, each directory's verdict — its subdirectories and its matches —
// is cached by the directory's identity, mtime and ctime: a directory whose
// entries changed has a new ctime (which, unlike the mtime, the command
// cannot set back), so an unchanged one need not be read again. A
// directory modified within a second of being read is never cached (the
// kernel's coarse timestamps could hide a later change in the same tick).
// The cache lives outside every tree the sandbox can write; a damaged or
// foreign cache file is ignored, never trusted.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "agentbox/plan.h"
#include "agentbox/status.h"

namespace agentbox::linux {

struct DenyMatch {
  std::string host_path;
  std::string target;  // inside
  bool is_dir = false;
};

struct ScanStats {
  std::size_t directories = 0;
  std::size_t directories_read = 0;  // not served from the cache
  std::size_t entries = 0;
};

// Scans `scan` (see GlobScan) and appends every match. `cache_dir` empty:
// no cache. `workspace_source/target` map symlink targets inside.
[[nodiscard]] Status ScanDenyGlobs(const GlobScan& scan, const std::string& workspace_source,
                                   const std::string& workspace_target, const std::string& cache_dir,
                                   std::vector<DenyMatch>* matches, ScanStats* stats);

}  // namespace agentbox::linux
