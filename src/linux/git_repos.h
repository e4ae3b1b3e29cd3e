// Git repositories anywhere in the workspace.
//
// A repository's hooks and some of its config settings run programs on the
// host the next time a person uses git there. `filesystem.protect` names
// them for the workspace root (`.git/hooks`, `.git/config`); the same names
// are protected in every repository found at launch (FindGitDirs, on the
// deny scan's cache), and every repository that appears during the run is
// audited when it ends (AuditGitRepos): what could run code is reported
// and quarantined.
#pragma once

#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include "agentbox/status.h"
#include "linux/deny_scan.h"

namespace agentbox::linux {

// More repositories than this in one workspace: the run is refused (each
// costs a few mounts), rather than leaving some unprotected.
constexpr std::size_t kMaxGitDirs = 1024;

struct GitDir {
  std::string host_path;  // the git directory, or the `.git` file naming one
  bool is_file = false;   // a `.git` file (`gitdir: ...`: a worktree or submodule)
};

// Every git directory below `workspace` (the root's `.git` included): each
// `.git` (directory or file; a symlink named `.git` resolved when it stays
// in the workspace), each bare repository (a directory holding a HEAD file,
// objects/ and refs/), and the submodules' git directories under
// `<git dir>/modules`. `cache_dir` is the deny scan's cache ("" = none).
// A directory named `.git` or `HEAD` is not searched further. `memo`: the
// launch's stamps of the workspace (deny_scan.h), or null. `kept`: where an
// earlier search of the run left its cache (deny_scan.h), or null.
[[nodiscard]] Result<std::vector<GitDir>> FindGitDirs(const std::string& workspace, const std::string& cache_dir,
                                                      DirStampMemo* memo = nullptr, ScanCaches* kept = nullptr);

// The settings in git config text that make git run a program or read
// another file (core.hooksPath, core.fsmonitor, core.sshCommand, filter.*,
// diff.external, remote.*.uploadpack/receivepack, include.path, includeIf.*,
// and the like), as "section.key" in git's lowercase spelling.
std::vector<std::string> DangerousGitConfigKeys(const std::string& text);

struct GitFinding {
  std::string op;           // "git-hook" | "git-config"
  std::string host_path;    // what was found
  std::string quarantined;  // where it is now ("" if it could not be moved)
  std::string reason;
};

// Audits the git directories below `workspace` that are not in `known`
// (the ones protected at launch): in hooks/ every executable file or
// symlink (`*.sample` aside, which git never runs) is made non-executable
// and renamed to NAME.agentbox-quarantine; a config holding a dangerous
// setting (or a symlink) is renamed to config.agentbox-quarantine. Paths
// are opened beneath the workspace with no symlink followed. `kept`: the
// launch's search cache (ResolvedPlan::scan_caches), or null.
[[nodiscard]] Result<std::vector<GitFinding>> AuditGitRepos(const std::string& workspace,
                                                            const std::set<std::string>& known, bool hooks, bool config,
                                                            const std::string& cache_dir, ScanCaches* kept = nullptr);

}  // namespace agentbox::linux
