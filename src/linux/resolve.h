// Settling a plan against the host filesystem, just before launch.
//
// Runs in the supervisor (host side): decides which optional mounts exist,
// turns host symlinks into symlinks, expands deny globs into masks, and makes
// protected paths exist (a placeholder where they are missing, removed after
// the run). The result is what the runner applies, verbatim.
#pragma once

#include <sys/types.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "agentbox/plan.h"
#include "agentbox/status.h"
#include "linux/fd.h"

namespace agentbox::linux {

struct ResolvedMount {
  MountOp op;
  bool is_dir = true;
  // A protected path missing from an overlay workspace: the runner creates
  // its placeholder in the merged view (so in the session's upper layer),
  // never in the base.
  bool placeholder_inside = false;
  // The workspace overlay of `run --workspace-overlay`: the socket the
  // runner sends its upper layer's tmpfs on (set by Launch; runner side).
  int upper_channel = -1;
};

// An empty mode-0000 file created where a protected path was missing, so
// that the runner has something to mount over. Held with a shared flock for
// the run; the last holder removes it (see resolve.cc for the protocol).
class Placeholder {
 public:
  Placeholder(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  Placeholder(Placeholder&&) = default;
  Placeholder& operator=(Placeholder&&) = default;
  ~Placeholder();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  UniqueFd fd_;
};

// The most paths the deny globs may match: each is masked by a mount.
inline constexpr std::size_t kMaxGlobMasks = 1024;

class ScanCaches;  // linux/deny_scan.h

struct ResolvedPlan {
  std::vector<ResolvedMount> mounts;
  std::vector<std::string> skipped;        // optional entries absent on this host
  std::vector<Placeholder> placeholders;
  std::set<std::string> git_dirs;          // repositories protected at launch (host paths)
  // The git search's cache as the launch left it, for the end-of-run audit
  // (AuditGitRepos): not read from its file a second time.
  std::shared_ptr<ScanCaches> scan_caches;
  std::size_t glob_matches = 0;
  std::size_t scanned_entries = 0;
};

[[nodiscard]] Result<ResolvedPlan> ResolvePlan(const Plan& plan);

}  // namespace agentbox::linux
