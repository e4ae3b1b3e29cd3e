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

// A deny pattern, compiled for the common case: `**/NAME` (or a bare NAME)
// needs only the last component, which spares a split per entry.
struct Matcher {
  std::string pattern;
  bool basename_only = false;
  bool literal = false;
  std::string name;

  explicit Matcher(const std::string& p) : pattern(p) {
    std::string q = p;
    if (!q.empty() && q.back() == '/') q.pop_back();
    if (q.rfind("**/", 0) == 0 && q.find('/', 3) == std::string::npos) {
      basename_only = true;
      name = q.substr(3);
    } else if (q.find('/') == std::string::npos) {
      basename_only = true;
      name = q;
    }
    literal = basename_only && !paths::HasGlob(name);
  }
  bool Matches(const char* base, const std::string& rel) const {
    if (literal) return name == base;
    if (basename_only) return fnmatch(name.c_str(), base, 0) == 0;
    return GlobMatch(pattern, rel);
  }
};

struct LinuxDirent64 {
  ino64_t d_ino;
  off64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[];
};

// Walks `scan.source_root` with getdents64 (no stat per entry, no symlinks
// followed) and masks every match.
Status ScanDenyGlobs(const Plan& plan, const GlobScan& scan, ResolvedPlan* rp,
                     std::vector<ResolvedMount>* masks) {
  std::vector<Matcher> matchers;
  for (const auto& p : scan.patterns) matchers.emplace_back(p);
  UniqueFd root(open(scan.source_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) {
    if (errno == ENOENT || errno == ENOTDIR) return {};
    return Status::Errno("deny-scan", "open", scan.source_root);
  }
  std::vector<std::string> pending = {""};
  alignas(8) static char buf[64 * 1024];
  while (!pending.empty()) {
    std::string rel = std::move(pending.back());
    pending.pop_back();
    UniqueFd dir(rel.empty() ? fcntl(root.get(), F_DUPFD_CLOEXEC, 0)
                             : openat(root.get(), rel.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir.valid()) continue;  // vanished or unreadable: nothing of it is visible either
    for (;;) {
      long n = syscall(SYS_getdents64, dir.get(), buf, sizeof(buf));
      if (n <= 0) break;
      for (long off = 0; off < n;) {
        auto* d = reinterpret_cast<LinuxDirent64*>(buf + off);
        off += d->d_reclen;
        const char* name = d->d_name;
        if (name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0))) continue;
        ++rp->scanned_entries;
        unsigned char type = d->d_type;
        if (type == DT_UNKNOWN) {
          struct stat st {};
          if (fstatat(dir.get(), name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
          type = S_ISDIR(st.st_mode) ? DT_DIR : S_ISLNK(st.st_mode) ? DT_LNK : DT_REG;
        }
        // The hot loop: a basename-only pattern needs no path string.
        bool hit = false;
        std::string child;
        for (const auto& m : matchers) {
          if (m.basename_only) {
            hit = m.Matches(name, "");
          } else {
            if (child.empty()) child = rel.empty() ? std::string(name) : rel + "/" + name;
            hit = m.Matches(name, scan.pattern_base.empty() ? child : scan.pattern_base + "/" + child);
          }
          if (hit) break;
        }
        if (!hit && type != DT_DIR) continue;
        if (child.empty()) child = rel.empty() ? std::string(name) : rel + "/" + name;
        if (hit) {
          std::string host = paths::Join(scan.source_root, child);
          std::string target = paths::Rebase(host, scan.source_root, scan.target_root);
          bool is_dir = type == DT_DIR;
          if (type == DT_LNK) {
            // A link named like a secret: mask what it points at, when that is visible inside.
            char* real = realpath(host.c_str(), nullptr);
            if (!real) continue;
            std::string resolved(real);
            free(real);
            if (!paths::IsWithin(resolved, plan.workspace_source)) continue;
            struct stat st {};
            if (stat(resolved.c_str(), &st) != 0) continue;
            is_dir = S_ISDIR(st.st_mode);
            host = resolved;
            target = paths::Rebase(resolved, plan.workspace_source, plan.workspace_target);
          }
          masks->push_back({MountOp{MountKind::kMask, host, target, true, true, "",
                                    "filesystem.deny: " + scan.patterns.front()},
                            is_dir});
          ++rp->glob_matches;
          continue;
        }
        if (type == DT_DIR) pending.push_back(std::move(child));
      }
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
          return Status::Errno(op.optional ? "mount" : "workspace", "lstat", op.source);
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
        break;
      }
      default:
        break;
    }
    rp.mounts.push_back(std::move(rm));
  }

  std::vector<ResolvedMount> masks;
  for (const auto& scan : plan.deny_globs) {
    if (Status s = ScanDenyGlobs(plan, scan, &rp, &masks); !s.ok()) return s;
  }
  rp.mounts.insert(rp.mounts.end(), masks.begin(), masks.end());
  // Parents before children, so that a mask inside a pinned or protected
  // directory is mounted after (on top of) that directory's own bind.
  std::stable_sort(rp.mounts.begin() + 1, rp.mounts.end(),
                   [](const ResolvedMount& a, const ResolvedMount& b) {
                     return paths::Depth(a.op.target) < paths::Depth(b.op.target);
                   });
  return rp;
}

}  // namespace agentbox::linux
