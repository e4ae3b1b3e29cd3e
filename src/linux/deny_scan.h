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
// The cache lives outside every tree the sandbox can write; a damaged
// (its checksum) or foreign cache file is ignored, never trusted. It lists
// the directories in the order the walk visits them, so that a walk of an
// unchanged tree finds each directory's verdict next in line.
//
// Revalidating an unchanged directory costs one statx(2) by its path below
// the scan's root, no open. That path may cross a symlink only if some
// directory above changed since it was cached, and the walk is top-down: a
// directory is looked at only when its parent's verdict, checked or read
// just before, lists it as a directory, and a parent whose entries changed
// (a rename, a symlink put in a subdirectory's place) has a new ctime, is
// read again with no symlink followed (openat2, RESOLVE_NO_SYMLINKS), and
// lists no such entry. A directory whose stamp does not match is read the
// same way. (Batching the statx calls through io_uring was measured slower:
// the kernel runs IORING_OP_STATX on its worker threads; docs/performance.md.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
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

// A directory's identity and times, as one look at it found them.
struct DirStamp {
  std::uint64_t ino = 0, dev = 0;
  std::int64_t mtime_s = 0, mtime_ns = 0, ctime_s = 0, ctime_ns = 0;
};

// The stamps one launch took of one tree, shared by the scans it makes of
// it (the deny globs, then the git repositories) so that each directory is
// looked at once per launch. Filled and read within one ResolvePlan, while
// nothing of the sandbox runs; never kept across runs (the end-of-run audit
// looks again). The first scan records, in the order it walks; a later one
// walks the same tree in nearly the same order, so a lookup is mostly a
// comparison with the next stamp recorded (an index is built only when the
// walks part, at a directory one of them does not enter).
class DirStampMemo {
 public:
  explicit DirStampMemo(std::string root) : root_(std::move(root)) {}
  const std::string& root() const { return root_; }
  // A scan starts: the first one records, a later one looks up.
  void BeginWalk() {
    recording_ = stamps_.empty();
    cursor_ = 0;
  }
  void EndWalk() { recording_ = false; }
  const DirStamp* Find(const std::string& rel);
  void Put(const std::string& rel, const DirStamp& s);

 private:
  std::string root_;
  std::deque<std::pair<std::string, DirStamp>> stamps_;      // in the order taken (stable addresses)
  std::unordered_map<std::string_view, std::size_t> index_;  // built at the first lookup out of order
  std::size_t cursor_ = 0;
  std::size_t last_found_ = SIZE_MAX;
  bool recording_ = true;
};

// The caches a process's scans loaded, kept for its later scans of the same
// tree (a run's end-of-run audit of git repositories, after the launch's
// search): each cache file read and parsed once per run. A scan takes its
// cache out while it runs and puts it back (thread-safe). What is kept is
// what the scan would have saved: its verdicts hold only while their
// directory's stamp matches, as on disk.
class ScanCaches {
 public:
  ScanCaches();
  ~ScanCaches();
  ScanCaches(const ScanCaches&) = delete;
  ScanCaches& operator=(const ScanCaches&) = delete;
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Scans `scan` (see GlobScan) and appends every match. `cache_dir` empty:
// no cache. `workspace_source/target` map symlink targets inside. `memo`
// (optional): stamps taken earlier in the same launch, used when its root
// is the scan's, and added to. `kept` (optional): the cache is taken from
// there when an earlier scan left it, else loaded, and left there after.
[[nodiscard]] Status ScanDenyGlobs(const GlobScan& scan, const std::string& workspace_source,
                                   const std::string& workspace_target, const std::string& cache_dir,
                                   std::vector<DenyMatch>* matches, ScanStats* stats, DirStampMemo* memo = nullptr,
                                   ScanCaches* kept = nullptr);

}  // namespace agentbox::linux
