#include "supervise/workspace_overlay.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include "linux/fd.h"
#include "linux/random.h"
#include "session/layers.h"

namespace agentbox::supervise {
namespace {

using linux::UniqueFd;

constexpr std::size_t kMaxPatchBytes = 1 << 20;  // the report's patch; files past it are listed only

std::string Join(const std::string& dir, const std::string& name) { return dir.empty() ? name : dir + "/" + name; }

bool IsWhiteout(const struct stat& st) { return S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0); }

bool IsOpaque(int dir_fd) {
  for (const char* name : {"user.overlay.opaque", "trusted.overlay.opaque"}) {
    char value[4];
    if (fgetxattr(dir_fd, name, value, sizeof(value)) == 1 && value[0] == 'y') return true;
  }
  return false;
}

Result<std::vector<std::string>> Names(int dir_fd, const std::string& path) {
  int dup = fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return Status::Errno("workspace-overlay", "fcntl(F_DUPFD_CLOEXEC)", path);
  DIR* d = fdopendir(dup);
  if (!d) {
    close(dup);
    return Status::Errno("workspace-overlay", "fdopendir", path);
  }
  rewinddir(d);
  std::vector<std::string> out;
  while (struct dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  closedir(d);
  return out;
}

// Removes `name` in `dir_fd` whatever it is (a directory with everything in
// it); absent is fine. Never follows a symlink.
Status RemoveAt(int dir_fd, const std::string& name, const std::string& path) {
  struct stat st {};
  if (fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno == ENOENT ? Status{} : Status::Errno("workspace-overlay", "fstatat", path);
  }
  if (S_ISDIR(st.st_mode)) {
    UniqueFd sub(openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!sub.valid()) return Status::Errno("workspace-overlay", "openat", path);
    auto names = Names(sub.get(), path);
    if (!names.ok()) return names.status();
    for (const auto& n : *names) {
      if (Status s = RemoveAt(sub.get(), n, Join(path, n)); !s.ok()) return s;
    }
    if (unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) != 0) return Status::Errno("workspace-overlay", "rmdir", path);
    return {};
  }
  if (unlinkat(dir_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
    return Status::Errno("workspace-overlay", "unlinkat", path);
  }
  return {};
}

// A temporary name beside the final one: written whole, then renamed over it.
std::string TempName() { return ".agentbox-apply-" + linux::RandomHex(6); }

Status ReplaceWithFile(int up_dir, int base_dir, const std::string& name, const struct stat& st,
                       const std::string& path) {
  UniqueFd in(openat(up_dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!in.valid()) return Status::Errno("workspace-overlay", "openat", "upper/" + path);
  const std::string temp = TempName();
  UniqueFd out(openat(base_dir, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!out.valid()) return Status::Errno("workspace-overlay", "openat(O_CREAT)", path);
  auto fail = [&](const char* call) {
    Status s = Status::Errno("workspace-overlay", call, path);
    unlinkat(base_dir, temp.c_str(), 0);
    return s;
  };
  off_t left = st.st_size;
  while (left > 0) {
    ssize_t n = copy_file_range(in.get(), nullptr, out.get(), nullptr, static_cast<size_t>(left), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP || errno == ENOSYS)) {
      char buf[1 << 16];
      ssize_t r = read(in.get(), buf, sizeof buf);
      if (r < 0) return fail("read");
      if (r == 0) break;
      for (ssize_t off = 0; off < r;) {
        ssize_t w = write(out.get(), buf + off, static_cast<size_t>(r - off));
        if (w < 0) return fail("write");
        off += w;
      }
      left -= r;
      continue;
    }
    if (n < 0) return fail("copy_file_range");
    if (n == 0) break;
    left -= n;
  }
  if (fchmod(out.get(), st.st_mode & 0777) != 0) return fail("fchmod");
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  futimens(out.get(), times);  // best effort: a time is not content
  struct stat old {};
  if (fstatat(base_dir, name.c_str(), &old, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(old.st_mode)) {
    if (Status s = RemoveAt(base_dir, name, path); !s.ok()) {
      unlinkat(base_dir, temp.c_str(), 0);
      return s;
    }
  }
  if (renameat(base_dir, temp.c_str(), base_dir, name.c_str()) != 0) return fail("renameat");
  return {};
}

Status ReplaceWithSymlink(int up_dir, int base_dir, const std::string& name, const std::string& path) {
  std::vector<char> target(PATH_MAX + 1);
  ssize_t n = readlinkat(up_dir, name.c_str(), target.data(), target.size());
  if (n < 0 || static_cast<size_t>(n) >= target.size()) {
    return Status::Errno("workspace-overlay", "readlinkat", "upper/" + path);
  }
  const std::string temp = TempName();
  if (symlinkat(std::string(target.data(), static_cast<size_t>(n)).c_str(), base_dir, temp.c_str()) != 0) {
    return Status::Errno("workspace-overlay", "symlinkat", path);
  }
  struct stat old {};
  if (fstatat(base_dir, name.c_str(), &old, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(old.st_mode)) {
    if (Status s = RemoveAt(base_dir, name, path); !s.ok()) {
      unlinkat(base_dir, temp.c_str(), 0);
      return s;
    }
  }
  if (renameat(base_dir, temp.c_str(), base_dir, name.c_str()) != 0) {
    Status s = Status::Errno("workspace-overlay", "renameat", path);
    unlinkat(base_dir, temp.c_str(), 0);
    return s;
  }
  return {};
}

Status ApplyDir(int up_dir, int base_dir, const std::string& rel, const std::set<std::string>& skip) {
  auto names = Names(up_dir, "upper/" + rel);
  if (!names.ok()) return names.status();
  for (const auto& name : *names) {
    const std::string path = Join(rel, name);
    if (skip.count(path)) continue;
    struct stat st {};
    if (fstatat(up_dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return Status::Errno("workspace-overlay", "fstatat", "upper/" + path);
    }
    Status s;
    if (IsWhiteout(st)) {
      s = RemoveAt(base_dir, name, path);
    } else if (S_ISDIR(st.st_mode)) {
      UniqueFd up(openat(up_dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!up.valid()) return Status::Errno("workspace-overlay", "openat", "upper/" + path);
      struct stat old {};
      const bool exists = fstatat(base_dir, name.c_str(), &old, AT_SYMLINK_NOFOLLOW) == 0;
      // Opaque: the run replaced the directory; anything else but a
      // directory there is replaced too.
      if (exists && (!S_ISDIR(old.st_mode) || IsOpaque(up.get()))) {
        if (Status r = RemoveAt(base_dir, name, path); !r.ok()) return r;
      }
      if (mkdirat(base_dir, name.c_str(), 0700) != 0 && errno != EEXIST) {
        return Status::Errno("workspace-overlay", "mkdirat", path);
      }
      UniqueFd base(openat(base_dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!base.valid()) return Status::Errno("workspace-overlay", "openat", path);
      if (fchmod(base.get(), st.st_mode & 07777) != 0) return Status::Errno("workspace-overlay", "fchmod", path);
      s = ApplyDir(up.get(), base.get(), path, skip);
    } else if (S_ISREG(st.st_mode)) {
      s = ReplaceWithFile(up_dir, base_dir, name, st, path);
    } else if (S_ISLNK(st.st_mode)) {
      s = ReplaceWithSymlink(up_dir, base_dir, name, path);
    }  // sockets, fifos, devices: not applied
    if (!s.ok()) return s;
  }
  return {};
}

}  // namespace

Status ApplyUpperLayer(int upper_dir_fd, const std::string& workspace, const std::set<std::string>& skip) {
  UniqueFd base(open(workspace.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!base.valid()) return Status::Errno("workspace-overlay", "open", workspace);
  return ApplyDir(upper_dir_fd, base.get(), "", skip);
}

WorkspaceOverlayResult SettleWorkspaceOverlay(const Plan& plan, int layer_root, const RunEnd& end,
                                              const std::set<std::string>& skip) {
  const WorkspaceOverlay& o = *plan.workspace_overlay;
  WorkspaceOverlayResult r;
  r.size_bytes = o.tmpfs_bytes;
  r.apply = ToString(o.apply);
  r.action = "none";
  if (layer_root < 0) {
    r.reason = "the sandbox never reached its workspace: nothing was written, nothing to apply";
    return r;
  }
  UniqueFd upper(openat(layer_root, o.upper.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!upper.valid()) {
    r.error = Status::Errno("workspace-overlay", "openat", "upper layer").ToString();
    r.reason = "the upper layer is gone: nothing applied";
    return r;
  }
  // The diff reads the layer by a path: our own descriptor's.
  session::LayerStack stack;
  stack.base = plan.workspace_source;
  stack.upper = "/proc/self/fd/" + std::to_string(upper.get());
  auto diff = session::ComputeDiff(stack, kMaxPatchBytes);
  if (diff.ok()) {
    r.diff_json = diff->dump();
  } else {
    r.error = diff.status().ToString();
  }
  bool apply = false;
  switch (o.apply) {
    case OverlayApply::kNever:
      r.reason = "--apply never: the changes are reported, not applied";
      break;
    case OverlayApply::kAlways:
      apply = true;
      r.reason = "--apply always (" + end.how + ")";
      break;
    case OverlayApply::kOnSuccess:
      apply = end.clean;
      r.reason = end.clean ? end.how : end.how + " (--apply on-success; --apply always keeps such changes)";
      break;
  }
  if (!apply) {
    r.action = "discarded";
    return r;
  }
  if (Status s = ApplyUpperLayer(upper.get(), plan.workspace_source, skip); !s.ok()) {
    r.action = "partly-applied";
    r.error = s.ToString();
    return r;
  }
  r.action = "applied";
  return r;
}

}  // namespace agentbox::supervise
