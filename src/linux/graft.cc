#include "linux/graft.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include "linux/compat.h"

namespace agentbox::linux {
namespace {

constexpr const char* kGraftStage = "graft";
constexpr char kNsMessage[] = "{\"t\":\"ns\"}";

// What a child reports: a Status, and whether it made the mountpoint.
struct ChildResult {
  Status status;
  bool made = false;
};

// Through a pipe: six fields separated by \x1f.
std::string Encode(const ChildResult& r) {
  const Status& s = r.status;
  return s.stage() + '\x1f' + s.syscall() + '\x1f' + s.path() + '\x1f' + std::to_string(s.err()) + '\x1f' +
         (s.syscall().empty() ? s.message() : std::string()) + '\x1f' + (r.made ? "1" : "0");
}

ChildResult Decode(const std::string& text) {
  std::vector<std::string> f(1);
  for (char c : text) {
    if (c == '\x1f') {
      f.emplace_back();
    } else {
      f.back() += c;
    }
  }
  if (f.size() != 6) return {Status::Error(kGraftStage, "the graft's child gave no result"), false};
  if (f[0].empty()) return {Status{}, f[5] == "1"};
  if (!f[1].empty()) return {Status::Syscall(f[0], f[1], f[2], std::stoi(f[3])), false};
  return {Status::Error(f[0], f[4]), false};
}

// Runs `body` in a forked child and returns its result. The child changes
// namespaces and its root, which nothing else of the supervisor may see.
template <typename Body>
ChildResult InForkedChild(Body body) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return {Status::Errno(kGraftStage, "pipe2"), false};
  UniqueFd r(p[0]), w(p[1]);
  const pid_t pid = fork();
  if (pid < 0) return {Status::Errno(kGraftStage, "fork"), false};
  if (pid == 0) {
    r.reset();
    const std::string out = Encode(body());
    (void)!write(w.get(), out.data(), out.size());
    _exit(0);
  }
  w.reset();
  std::string text;
  char buf[1024];
  for (;;) {
    ssize_t n = read(r.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  int ws = 0;
  while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
  }
  if (text.empty()) {
    return {
        Status::Error(kGraftStage, "the graft's child ended without a result (wait status " + std::to_string(ws) + ")"),
        false};
  }
  return Decode(text);
}

// Absolute, no empty, "." or ".." component, not "/" itself.
bool Normalized(const std::string& p) {
  if (p.size() < 2 || p[0] != '/' || p.back() == '/') return false;
  size_t start = 1;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string::npos) end = p.size();
    const std::string c = p.substr(start, end - start);
    if (c.empty() || c == "." || c == "..") return false;
    start = end + 1;
  }
  return true;
}

std::string ParentOf(const std::string& p) {
  const size_t slash = p.rfind('/');
  return slash == 0 ? "/" : p.substr(0, slash);
}

// Joins the world's user namespace, then its mount namespace, and takes its
// root as this process's. Before the mount namespace: `between` runs with
// the world's user namespace and a private copy of the host's mounts.
template <typename Between>
Status EnterWorld(const WorldNamespaces& ns, Between between) {
  if (setns(ns.user.get(), CLONE_NEWUSER) != 0) {
    return Status::Errno(kGraftStage, "setns(CLONE_NEWUSER)", "the world's user namespace");
  }
  if (Status s = between(); !s.ok()) return s;
  if (setns(ns.mnt.get(), CLONE_NEWNS) != 0) {
    return Status::Errno(kGraftStage, "setns(CLONE_NEWNS)", "the world's mount namespace");
  }
  if (fchdir(ns.root.get()) != 0) return Status::Errno(kGraftStage, "fchdir", "the world's root");
  if (chroot(".") != 0) return Status::Errno(kGraftStage, "chroot", "the world's root");
  if (chdir("/") != 0) return Status::Errno(kGraftStage, "chdir", "/");
  return {};
}

struct Where {
  std::uint64_t mnt_id = 0;
  bool exists = false;
  bool mount_root = false;
  mode_t mode = 0;
};

Result<Where> Look(const std::string& path) {
  struct statx stx {};
  Where w;
  if (statx(AT_FDCWD, path.c_str(), AT_SYMLINK_NOFOLLOW, STATX_MNT_ID | STATX_TYPE, &stx) != 0) {
    if (errno == ENOENT) return w;
    return Status::Errno(kGraftStage, "statx", path);
  }
  if (!(stx.stx_mask & STATX_MNT_ID)) return Status::Error(kGraftStage, "statx gives no mount id for " + path);
  w.exists = true;
  w.mnt_id = stx.stx_mnt_id;
  w.mount_root = (stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) && (stx.stx_attributes & STATX_ATTR_MOUNT_ROOT);
  w.mode = stx.stx_mode;
  return w;
}

// A writable view of the world's root tmpfs for this process alone: a
// detached clone of the root mount (the same tmpfs) with its read-only flag
// cleared on the clone. The world's own root mount stays sealed throughout,
// so nothing running in the world can write there while a mountpoint is
// made; the clone goes with its descriptor. Paths are absolute in the
// world, resolved beneath the clone with no symlink and no mount crossing.
class WritableRoot {
 public:
  static Result<WritableRoot> Open() {
    WritableRoot w;
    w.fd_.reset(OpenTree(AT_FDCWD, "/", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC));
    if (!w.fd_.valid()) return Status::Errno(kGraftStage, "open_tree(OPEN_TREE_CLONE)", "the world's root");
    MountAttr attr{};
    attr.attr_clr = MOUNT_ATTR_RDONLY;
    if (MountSetattr(w.fd_.get(), "", AT_EMPTY_PATH, &attr) != 0) {
      return Status::Errno(kGraftStage, "mount_setattr(clear RDONLY) on a private clone", "the world's root");
    }
    return w;
  }
  Status MakeDir(const std::string& path) const {
    return AtParent(path, [](int dir, const char* name) { return mkdirat(dir, name, 0755); }, "mkdirat");
  }
  Status MakeFile(const std::string& path) const {
    return AtParent(path, [](int dir, const char* name) {
      int fd = openat(dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
      if (fd >= 0) close(fd);
      return fd >= 0 ? 0 : -1;
    }, "openat(O_CREAT|O_EXCL)");
  }
  Status Remove(const std::string& path, bool is_dir) const {
    return AtParent(path, [is_dir](int dir, const char* name) { return unlinkat(dir, name, is_dir ? AT_REMOVEDIR : 0); },
                    is_dir ? "unlinkat(AT_REMOVEDIR)" : "unlinkat");
  }

 private:
  template <typename Op>
  Status AtParent(const std::string& path, Op op, const char* what) const {
    const std::string parent = ParentOf(path);
    UniqueFd dir = OpenBeneath(fd_.get(), parent.substr(1), O_PATH | O_DIRECTORY);
    if (!dir.valid()) return Status::Errno(kGraftStage, "openat2(RESOLVE_NO_SYMLINKS)", parent);
    const std::string name = path.substr(path.rfind('/') + 1);
    if (op(dir.get(), name.c_str()) != 0) return Status::Errno(kGraftStage, what, path);
    return {};
  }
  UniqueFd fd_;
};

// Checks that `target` can take a graft: it is on the root tmpfs (so are
// its existing ancestors), no mountpoint, and of the source's kind. Fills
// `missing` with the components to make, outermost first.
Status CheckTarget(const std::string& target, bool is_dir, std::vector<std::string>* missing) {
  auto root = Look("/");
  if (!root.ok()) return root.status();
  std::string p = target;
  for (;;) {
    auto w = Look(p);
    if (!w.ok()) return w.status();
    if (!w->exists) {
      missing->insert(missing->begin(), p);
      p = ParentOf(p);
      continue;
    }
    if (w->mnt_id != root->mnt_id || w->mount_root) {
      return Status::Error(kGraftStage, "cannot graft at " + target + ": " +
                                            (p == target ? target + " is a mountpoint or inside a mount"
                                                         : p + " is a mountpoint or inside a mount") +
                                            " other than the world's root tmpfs (only a new world can put it there)");
    }
    if (p == target) {
      if (is_dir ? !S_ISDIR(w->mode) : !S_ISREG(w->mode)) {
        return Status::Error(kGraftStage, "cannot graft at " + target + ": it exists inside the world and is not a " +
                                              (is_dir ? "directory" : "regular file") + " as the source is");
      }
    } else if (!S_ISDIR(w->mode)) {
      return Status::Error(kGraftStage,
                           "cannot graft at " + target + ": " + p + " is not a directory inside the world");
    }
    return {};
  }
}

ChildResult GraftChild(const WorldNamespaces& ns, const std::string& source, const std::string& target,
                       GraftAccess access) {
  UniqueFd tree;
  bool is_dir = false;
  Status entered = EnterWorld(ns, [&]() -> Status {
    // A mount namespace of the world's user namespace, copied from the
    // host's: open_tree needs CAP_SYS_ADMIN over the namespace the source
    // is in, which this one gives without privilege on the host.
    if (unshare(CLONE_NEWNS) != 0)
      return Status::Errno(kGraftStage, "unshare(CLONE_NEWNS)", "a copy of the host's mounts");
    // The source exactly as named: no symlink may point the grant elsewhere.
    UniqueFd host_root(open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!host_root.valid()) return Status::Errno(kGraftStage, "open", "/");
    UniqueFd src = OpenBeneath(host_root.get(), source.substr(1), O_PATH);
    if (!src.valid()) return Status::Errno(kGraftStage, "openat2(RESOLVE_NO_SYMLINKS)", source);
    struct stat st {};
    if (fstat(src.get(), &st) != 0) return Status::Errno(kGraftStage, "fstat", source);
    if (S_ISLNK(st.st_mode)) return Status::Syscall(kGraftStage, "openat2(RESOLVE_NO_SYMLINKS)", source, ELOOP);
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
      return Status::Error(kGraftStage, "cannot graft " + source + ": not a directory or a regular file");
    }
    is_dir = S_ISDIR(st.st_mode);
    tree.reset(OpenTree(src.get(), "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH | AT_RECURSIVE));
    if (!tree.valid()) return Status::Errno(kGraftStage, "open_tree(OPEN_TREE_CLONE|AT_RECURSIVE)", source);
    return {};
  });
  if (!entered.ok()) return {entered};
  // The detached copy gets its flags before it is visible anywhere.
  MountAttr attr{};
  attr.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (access == GraftAccess::kWritable ? 0 : MOUNT_ATTR_RDONLY);
  if (MountSetattr(tree.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr) != 0) {
    return {Status::Errno(
        kGraftStage,
        "mount_setattr(NOSUID|NODEV" + std::string(access == GraftAccess::kWritable ? "" : "|RDONLY") + ")", source)};
  }
  std::vector<std::string> missing;
  if (Status s = CheckTarget(target, is_dir, &missing); !s.ok()) return {s};
  auto root = WritableRoot::Open();
  if (!root.ok()) return {root.status()};
  std::vector<std::string> made;  // removed again when the graft fails
  auto undo = [&](Status s) {
    for (auto it = made.rbegin(); it != made.rend(); ++it) {
      (void)root->Remove(*it, !(*it == target && !is_dir));
    }
    return ChildResult{s};
  };
  for (const auto& p : missing) {
    const bool file = p == target && !is_dir;
    if (Status st = file ? root->MakeFile(p) : root->MakeDir(p); !st.ok()) return undo(st);
    made.push_back(p);
  }
  // Nothing in the world could write to its root meanwhile: the target is
  // what was checked and made, with no symlink on the way.
  UniqueFd at = OpenBeneath(ns.root.get(), target.substr(1), O_PATH | (is_dir ? O_DIRECTORY : 0));
  if (!at.valid()) return undo(Status::Errno(kGraftStage, "openat2(RESOLVE_NO_SYMLINKS)", target));
  if (MoveMount(tree.get(), "", at.get(), "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) != 0) {
    return undo(Status::Errno(kGraftStage, "move_mount", target));
  }
  return {Status{}, !missing.empty() && missing.back() == target};
}

Status UngraftChild(const WorldNamespaces& ns, const std::string& target, Mountpoint mountpoint) {
  if (Status s = EnterWorld(ns, [] { return Status{}; }); !s.ok()) return s;
  auto root = Look("/");
  if (!root.ok()) return root.status();
  auto at = Look(target);
  if (!at.ok()) return at.status();
  auto parent = Look(ParentOf(target));
  if (!parent.ok()) return parent.status();
  if (!at->exists || !at->mount_root || parent->mnt_id != root->mnt_id) {
    return Status::Error(kGraftStage,
                         "nothing is grafted at " + target + " (no mount there on the world's root tmpfs)");
  }
  const bool is_dir = S_ISDIR(at->mode);
  if (umount2(target.c_str(), MNT_DETACH) != 0) return Status::Errno(kGraftStage, "umount2(MNT_DETACH)", target);
  if (mountpoint == Mountpoint::kKeep) return {};
  // The mountpoint goes too (its parents may be shared with other grafts).
  auto writable = WritableRoot::Open();
  if (!writable.ok()) return writable.status();
  Status removed = writable->Remove(target, is_dir);
  if (!removed.ok() && removed.err() != ENOENT) return removed;
  return {};
}

}  // namespace

Status SendWorldNamespaces(int sock) {
  UniqueFd user(open("/proc/self/ns/user", O_RDONLY | O_CLOEXEC));
  if (!user.valid()) return Status::Errno("runner", "open", "/proc/self/ns/user");
  UniqueFd mnt(open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC));
  if (!mnt.valid()) return Status::Errno("runner", "open", "/proc/self/ns/mnt");
  UniqueFd root(open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return Status::Errno("runner", "open", "/");
  const int fds[3] = {user.get(), mnt.get(), root.get()};
  if (!SendWithFds(sock, kNsMessage, sizeof(kNsMessage) - 1, fds, 3)) {
    return Status::Errno("runner", "sendmsg(SCM_RIGHTS)", "the world's namespaces");
  }
  return {};
}

Result<WorldNamespaces> ReceiveWorldNamespaces(int sock) {
  char buf[64];
  std::vector<UniqueFd> fds;
  const ssize_t n = RecvWithFds(sock, buf, sizeof(buf), MSG_DONTWAIT, &fds);
  if (n < 0) return Status::Errno("world", "recvmsg", "the init's namespaces");
  if (std::string(buf, static_cast<size_t>(n)) != kNsMessage || fds.size() != 3) {
    return Status::Error("world", "the init did not hand over its namespaces first");
  }
  WorldNamespaces ns;
  ns.user = std::move(fds[0]);
  ns.mnt = std::move(fds[1]);
  ns.root = std::move(fds[2]);
  return ns;
}

Result<Mountpoint> GraftIntoWorld(const WorldNamespaces& ns, const std::string& source, const std::string& target,
                                  GraftAccess access) {
  if (!ns.valid()) return Status::Error(kGraftStage, "the world's namespaces are not held (no live grafts)");
  if (!Normalized(source))
    return Status::Error(kGraftStage, "the source " + source + " is not an absolute, normalized path");
  if (!Normalized(target))
    return Status::Error(kGraftStage, "the target " + target + " is not an absolute, normalized path");
  ChildResult r = InForkedChild([&] { return GraftChild(ns, source, target, access); });
  if (!r.status.ok()) return r.status;
  return r.made ? Mountpoint::kRemove : Mountpoint::kKeep;
}

Status UngraftFromWorld(const WorldNamespaces& ns, const std::string& target, Mountpoint mountpoint) {
  if (!ns.valid()) return Status::Error(kGraftStage, "the world's namespaces are not held (no live grafts)");
  if (!Normalized(target))
    return Status::Error(kGraftStage, "the target " + target + " is not an absolute, normalized path");
  return InForkedChild([&] { return ChildResult{UngraftChild(ns, target, mountpoint)}; }).status;
}

}  // namespace agentbox::linux
