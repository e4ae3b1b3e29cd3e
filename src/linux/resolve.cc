#include "linux/resolve.h"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <map>
#include <set>

#include "confine/paths.h"
#include "linux/deny_scan.h"
#include "linux/git_repos.h"

namespace agentbox::linux {
namespace {

// Placeholders are empty, regular, mode 0400 files owned by the caller: the
// marker that lets a later run recognise (and clean) one left by a killed run.
constexpr mode_t kPlaceholderMode = 0400;

bool IsPlaceholder(const struct stat& st) {
  return S_ISREG(st.st_mode) && (st.st_mode & 07777) == kPlaceholderMode && st.st_size == 0 &&
         st.st_uid == geteuid();
}

// Creates, or joins, the placeholder `name` in `dirfd`. Returns an invalid
// fd (and no error) when a real file is there after all.
//
// Protocol: every run that relies on a placeholder holds LOCK_SH on it for
// the whole run. At the end, a run that gets LOCK_EX without waiting is the
// last one and unlinks it. A joiner that finds its locked inode unlinked
// (nlink 0) starts over, so no run ever mounts over a dying placeholder.
Result<UniqueFd> CreateOrJoinPlaceholder(int dirfd, const std::string& name, const std::string& path) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    UniqueFd fd(openat(dirfd, name.c_str(), O_RDONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                       kPlaceholderMode));
    if (!fd.valid()) {
      if (errno != EEXIST) return Status::Errno("protect", "openat(O_CREAT)", path);
      struct stat st {};
      if (fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;  // removed meanwhile: create it again
        return Status::Errno("protect", "fstatat", path);
      }
      if (!IsPlaceholder(st)) return UniqueFd();  // a real file appeared: protect that
      fd.reset(openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (!fd.valid()) {
        if (errno == ENOENT) continue;
        return Status::Errno("protect", "openat", path);
      }
    }
    if (flock(fd.get(), LOCK_SH) != 0) return Status::Errno("protect", "flock", path);
    struct stat st {};
    if (fstat(fd.get(), &st) != 0) return Status::Errno("protect", "fstat", path);
    if (st.st_nlink == 0) continue;  // the last user removed it while we waited
    return fd;
  }
  return Status::Error("protect", "could not settle placeholder " + path + " (contended)");
}

std::string ReadLink(const std::string& path) {
  char buf[PATH_MAX];
  ssize_t n = readlink(path.c_str(), buf, sizeof(buf) - 1);
  if (n < 0) return "";
  return std::string(buf, static_cast<size_t>(n));
}

std::vector<std::string> Components(const std::string& rel) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < rel.size()) {
    size_t slash = rel.find('/', start);
    if (slash == std::string::npos) slash = rel.size();
    if (slash > start) out.push_back(rel.substr(start, slash - start));
    start = slash + 1;
  }
  return out;
}

struct ProtectResolution {
  MountOp op;             // what to mount (may be a placeholder now)
  bool is_dir = false;
  bool placeholder_inside = false;
  std::string drop_below; // pins at or below this host path are dropped (missing)
};

// Walks a protected path from the workspace root without following any
// symlink; creates a placeholder at the first missing component.
Result<ProtectResolution> ResolveProtect(const Plan& plan, const MountOp& op, ResolvedPlan* rp) {
  const std::string& ws = plan.workspace_source;
  std::string rel = op.source.substr(ws == "/" ? 1 : ws.size() + 1);
  UniqueFd dir(open(ws.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return Status::Errno("workspace", "open", ws);
  std::string host = ws;
  std::vector<std::string> parts = Components(rel);
  for (size_t i = 0; i < parts.size(); ++i) {
    host = paths::Join(host, parts[i]);
    struct stat st {};
    bool found = fstatat(dir.get(), parts[i].c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (!found && errno != ENOENT) return Status::Errno("protect", "fstatat", host);
    if (!found && plan.workspace_overlay) {
      // Sessions never write into their base: the runner creates this
      // placeholder in the merged view, which lands in the upper layer.
      ProtectResolution r;
      r.op = op;
      r.op.source = host;
      r.op.target = paths::Rebase(host, ws, plan.workspace_target);
      r.op.why = op.why + " (missing: placeholder in the session's layer)";
      r.placeholder_inside = true;
      r.drop_below = host;
      return r;
    }
    // A placeholder (ours for another protected path, a concurrent run's, or
    // one left by a killed run) counts as missing: join it.
    if (!found || IsPlaceholder(st)) {
      // Missing: block its creation with a placeholder (needs a real dir fd).
      UniqueFd parent(openat(dir.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (!parent.valid()) return Status::Errno("protect", "open", paths::Parent(host));
      auto fd = CreateOrJoinPlaceholder(parent.get(), parts[i], host);
      if (!fd.ok()) return fd.status();
      if (!fd->valid()) {
        --i;  // a real entry appeared between the checks: look again
        host = paths::Parent(host);
        continue;
      }
      rp->placeholders.emplace_back(host, std::move(*fd));
      ProtectResolution r;
      r.op = op;
      r.op.source = host;
      r.op.target = paths::Rebase(host, ws, plan.workspace_target);
      r.op.why = op.why + " (missing: placeholder " + host + ")";
      r.drop_below = host;
      return r;
    }
    if (S_ISLNK(st.st_mode)) {
      return Status::Error("protect", op.why + ": '" + host +
                                          "' is a symlink; refusing, since a symlink could "
                                          "redirect the protection");
    }
    if (i + 1 == parts.size()) {
      ProtectResolution r;
      r.op = op;
      r.is_dir = S_ISDIR(st.st_mode);
      return r;
    }
    if (!S_ISDIR(st.st_mode)) {
      // A file where a directory is expected decides what the rest would
      // mean: `.git` as a file (a worktree or submodule) names the git dir,
      // hooks included. Protecting it keeps it from being pointed elsewhere.
      ProtectResolution r;
      r.op = op;
      r.op.source = host;
      r.op.target = paths::Rebase(host, ws, plan.workspace_target);
      r.op.why = op.why + " (via the file " + host + ")";
      r.is_dir = false;
      r.drop_below = host;
      return r;
    }
    UniqueFd next(openat(dir.get(), parts[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next.valid()) return Status::Errno("protect", "openat", host);
    dir = std::move(next);
  }
  return Status::Error("protect", op.why + ": empty path");
}

// Every other repository of the workspace gets the root's protection:
// `<git dir>/NAME` read-only for each NAME in plan.protect_git, its
// ancestors pinned. A `.git` file is protected (and pinned) itself.
Status ProtectGitRepos(const Plan& plan, ResolvedPlan* rp, std::set<std::string>* protected_targets,
                       DirStampMemo* memo) {
  if (plan.protect_git.empty() || !plan.workspace_writable) return {};
  const std::string& ws = plan.workspace_source;
  rp->scan_caches = std::make_shared<ScanCaches>();
  auto dirs = FindGitDirs(ws, plan.scan_cache_dir, memo, rp->scan_caches.get());
  if (!dirs.ok()) return dirs.status();
  std::set<std::string> pinned;
  for (const auto& m : rp->mounts) {
    if (m.op.kind == MountKind::kPin) pinned.insert(m.op.source);
  }
  std::vector<std::string> masked;
  for (const auto& m : rp->mounts) {
    if (m.op.kind == MountKind::kMask && !m.op.source.empty()) masked.push_back(m.op.source);
  }
  const std::string root_git = paths::Join(ws, ".git");
  for (const auto& d : *dirs) {
    rp->git_dirs.insert(d.host_path);
    if (d.host_path == root_git) continue;  // the policy's own entries
    auto hidden = [&](const std::string& p) {
      return std::any_of(masked.begin(), masked.end(), [&](const std::string& m) { return paths::IsWithin(p, m); });
    };
    if (hidden(d.host_path)) continue;  // filesystem.deny hides it whole: nothing to bind
    std::vector<std::string> names;
    if (d.is_file) {
      names.push_back("");
    } else {
      names = plan.protect_git;
    }
    for (const auto& name : names) {
      MountOp op{MountKind::kProtect, name.empty() ? d.host_path : d.host_path + "/" + name, "", true, false, "",
                 "filesystem.protect: .git/" + (name.empty() ? plan.protect_git.front() : name) + " (repository " +
                     d.host_path + ")"};
      op.target = paths::Rebase(op.source, ws, plan.workspace_target);
      if (hidden(op.source)) continue;  // masked, so read-only and empty already
      auto r = ResolveProtect(plan, op, rp);
      if (!r.ok()) return r.status();
      if (!protected_targets->insert(r->op.target).second) continue;
      for (std::string a = paths::Parent(r->op.source); a != ws && paths::IsWithin(a, ws); a = paths::Parent(a)) {
        if (!r->drop_below.empty() && paths::IsWithin(a, r->drop_below)) continue;
        if (!pinned.insert(a).second) continue;
        rp->mounts.push_back({MountOp{MountKind::kPin, a, paths::Rebase(a, ws, plan.workspace_target), false, false,
                                      "", "ancestor of protected " + r->op.source},
                              true});
      }
      ResolvedMount rm{r->op, r->is_dir};
      rm.placeholder_inside = r->placeholder_inside;
      rp->mounts.push_back(std::move(rm));
    }
  }
  return {};
}

// filesystem.caches backed by agentbox: each directory and every missing
// parent made 0700 (the caches of one user are that user's alone).
Status MakeCacheDirs(const Plan& plan) {
  for (const auto& dir : plan.cache_dirs) {
    for (std::size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
      const std::string part = dir.substr(0, slash);
      if (mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) return Status::Errno("mount", "mkdir", part);
      if (slash == std::string::npos) break;
    }
    struct stat st {};
    if (lstat(dir.c_str(), &st) != 0) return Status::Errno("mount", "lstat", dir);
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid()) {
      return Status::Error("mount", "cache directory " + dir + " is not a directory of uid " +
                                        std::to_string(geteuid()) + "; refusing to mount it");
    }
  }
  return {};
}

// Landlock-only: the paths a rule must find (a read_write tree, a cache)
// exist, and the private home holds the plan's links. A link's parents are
// made in the private home without following symlinks: the command may
// have left none there yet, but a link made through one would land outside.
Status SettleLandlockOnly(const Plan& plan, ResolvedPlan* rp) {
  for (const auto& rule : plan.landlock.rules) {
    struct stat st {};
    if (rule.optional || stat(rule.path.c_str(), &st) == 0) continue;
    if (errno != ENOENT) return Status::Errno("mount", "stat", rule.path);
    return Status::Error("mount", rule.why + ": " + rule.path + " does not exist (a writable path the policy "
                                                                "names is never left out)");
  }
  if (plan.home_links.empty()) return {};
  if (plan.private_dir.empty()) return Status::Error("mount", "home links planned without a private directory");
  for (const auto& link : plan.home_links) {
    struct stat st {};
    if (lstat(link.target.c_str(), &st) != 0) {
      if (errno == ENOENT && link.optional) {
        rp->skipped.push_back(link.target + " (" + link.why + "): absent on this host");
        continue;
      }
      return Status::Errno("mount", "lstat", link.target);
    }
    UniqueFd dir(open(plan.home.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir.valid()) return Status::Errno("mount", "open", plan.home);
    std::vector<std::string> parts = Components(link.name);
    std::string at = plan.home;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      at = paths::Join(at, parts[i]);
      if (mkdirat(dir.get(), parts[i].c_str(), 0700) != 0 && errno != EEXIST) {
        return Status::Errno("mount", "mkdirat", at);
      }
      UniqueFd next(openat(dir.get(), parts[i].c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!next.valid()) return Status::Errno("mount", "openat", at);
      dir = std::move(next);
    }
    if (symlinkat(link.target.c_str(), dir.get(), parts.back().c_str()) != 0) {
      return Status::Errno("mount", "symlinkat", paths::Join(plan.home, link.name));
    }
  }
  return {};
}

}  // namespace

Placeholder::~Placeholder() {
  if (!fd_.valid()) return;
  if (flock(fd_.get(), LOCK_EX | LOCK_NB) == 0) {
    struct stat held {}, now {};
    if (fstat(fd_.get(), &held) == 0 && lstat(path_.c_str(), &now) == 0 && held.st_dev == now.st_dev &&
        held.st_ino == now.st_ino && IsPlaceholder(now)) {
      unlink(path_.c_str());
    }
  }
  // Closing releases the lock.
}

Result<ResolvedPlan> ResolvePlan(const Plan& plan) {
  ResolvedPlan rp;
  if (!plan.confined) return rp;

  struct stat ws {};
  if (stat(plan.workspace_source.c_str(), &ws) != 0) {
    return Status::Errno("workspace", "stat", plan.workspace_source);
  }
  if (!S_ISDIR(ws.st_mode)) {
    return Status::Syscall("workspace", "stat", plan.workspace_source, ENOTDIR);
  }
  if (Status s = MakeCacheDirs(plan); !s.ok()) return s;
  if (plan.backend == Backend::kLandlockOnly) {  // nothing to mount
    if (Status s = SettleLandlockOnly(plan, &rp); !s.ok()) return s;
    return rp;
  }

  // Protected paths first: they decide which pins exist.
  std::map<std::string, ProtectResolution> protects;
  std::vector<std::string> dropped;
  for (const auto& op : plan.mounts) {
    if (op.kind != MountKind::kProtect) continue;
    auto r = ResolveProtect(plan, op, &rp);
    if (!r.ok()) return r.status();
    if (!r->drop_below.empty()) dropped.push_back(r->drop_below);
    protects.emplace(op.source, std::move(*r));
  }
  auto is_dropped = [&](const std::string& p) {
    return std::any_of(dropped.begin(), dropped.end(),
                       [&](const std::string& d) { return paths::IsWithin(p, d); });
  };

  std::set<std::string> protected_targets;
  for (const auto& op : plan.mounts) {
    ResolvedMount rm{op, true};
    switch (op.kind) {
      case MountKind::kBind: {
        struct stat st {};
        if (lstat(op.source.c_str(), &st) != 0) {
          if (op.optional && (errno == ENOENT || errno == ENOTDIR)) {
            rp.skipped.push_back(op.source + " (" + op.why + "): absent on this host");
            continue;
          }
          if (op.source != plan.workspace_source && errno == ENOENT) {
            return Status::Error("mount", op.why + ": " + op.source + " does not exist (a path the policy makes "
                                                                      "writable or protects is never left out)");
          }
          return Status::Errno(op.optional ? "mount" : "workspace", "lstat", op.source);
        }
        if (S_ISLNK(st.st_mode) && !op.read_only && !op.optional && op.source != plan.workspace_source) {
          // A writable tree given as a link would come in as the link alone.
          return Status::Error("mount", op.why + ": " + op.source + " is a symlink; name the directory it points to");
        }
        if (S_ISLNK(st.st_mode) && op.why.rfind("filesystem.protect", 0) == 0) {
          return Status::Error("protect", op.why + ": '" + op.source + "' is a symlink; refusing");
        }
        if (S_ISLNK(st.st_mode)) {
          // Keep the link as a link: its target is mounted (or not) on its own terms.
          rm.op.kind = MountKind::kSymlink;
          rm.op.source = ReadLink(op.source);
          break;
        }
        rm.is_dir = S_ISDIR(st.st_mode);
        break;
      }
      case MountKind::kSymlink: {
        if (!op.source.empty()) break;
        struct stat st {};
        if (lstat(op.target.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) continue;
        rm.op.source = ReadLink(op.target);
        break;
      }
      case MountKind::kMask: {
        if (op.source.empty()) break;  // inside-only paths (/proc/...): settled by the runner
        struct stat st {};
        if (stat(op.source.c_str(), &st) != 0) continue;  // absent: nothing to hide
        rm.is_dir = S_ISDIR(st.st_mode);
        break;
      }
      case MountKind::kPin: {
        if (is_dropped(op.source)) continue;
        struct stat st {};
        if (lstat(op.source.c_str(), &st) != 0) continue;  // created as a placeholder below it
        if (S_ISLNK(st.st_mode)) {
          return Status::Error("protect", op.why + ": '" + op.source + "' is a symlink; refusing");
        }
        break;
      }
      case MountKind::kProtect: {
        const ProtectResolution& r = protects.at(op.source);
        if (!protected_targets.insert(r.op.target).second) continue;
        rm.op = r.op;
        rm.is_dir = r.is_dir;
        rm.placeholder_inside = r.placeholder_inside;
        break;
      }
      default:
        break;
    }
    rp.mounts.push_back(std::move(rm));
  }

  // The deny globs and the git repositories are found by walks of the
  // same tree: each directory is looked at once for both.
  DirStampMemo memo(plan.workspace_source);
  for (const auto& scan : plan.deny_globs) {
    std::vector<DenyMatch> matches;
    ScanStats stats;
    if (Status s = ScanDenyGlobs(scan, plan.workspace_source, plan.workspace_target, plan.scan_cache_dir,
                                 &matches, &stats, &memo);
        !s.ok()) {
      return s;
    }
    rp.scanned_entries += stats.entries;
    rp.glob_matches += matches.size();
    // Each match is a mount: thousands of them slow every launch and press
    // on the kernel's mount limits. Past the cap the run is refused, not
    // started with some secrets left visible.
    if (rp.glob_matches > kMaxGlobMasks) {
      return Status::Error("deny-scan", "filesystem.deny globs match at least " + std::to_string(rp.glob_matches) +
                                            " paths in the workspace; at most " + std::to_string(kMaxGlobMasks) +
                                            " can be masked (one mount each): narrow the globs or move the files");
    }
    for (auto& m : matches) {
      rp.mounts.push_back({MountOp{MountKind::kMask, m.host_path, m.target, true, true, "",
                                   "filesystem.deny: " + scan.patterns.front()},
                           m.is_dir});
    }
  }
  // After the masks: a repository inside a masked directory is hidden
  // whole, and there is nothing to bind in it.
  if (Status s = ProtectGitRepos(plan, &rp, &protected_targets, &memo); !s.ok()) return s;
  // Parents before children, so that a mask inside a pinned or protected
  // directory is mounted after (on top of) that directory's own bind.
  std::stable_sort(rp.mounts.begin() + 1, rp.mounts.end(),
                   [](const ResolvedMount& a, const ResolvedMount& b) {
                     return paths::Depth(a.op.target) < paths::Depth(b.op.target);
                   });
  return rp;
}

}  // namespace agentbox::linux
