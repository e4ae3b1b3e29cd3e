#include "linux/mounts.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "confine/paths.h"
#include "linux/compat.h"
#include "linux/fd.h"
#include "linux/random.h"
#include "linux/upper_layer.h"

namespace agentbox::linux {
namespace {

constexpr const char* kOldRoot = "/oldroot";
constexpr const char* kMaskDir = "/.agentbox-mask/dir";
constexpr const char* kMaskFile = "/.agentbox-mask/file";
constexpr const char* kIdsDir = "/.agentbox-ids";
constexpr const char* kLayersDir = "/.agentbox-layers";

std::string Host(const std::string& path) { return std::string(kOldRoot) + (path == "/" ? "" : path); }

// Creates `target` (and missing parents) in the new root for a mount point.
// Tries the target first: its parent usually exists, so this costs one call.
Status EnsureTarget(const std::string& target, bool is_dir) {
  auto create = [&]() -> int {
    if (is_dir) return mkdir(target.c_str(), 0755) == 0 || errno == EEXIST ? 0 : -1;
    int fd = open(target.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) {
      close(fd);
      return 0;
    }
    return errno == EEXIST || errno == EISDIR ? 0 : -1;
  };
  if (create() == 0) return {};
  if (errno != ENOENT || target == "/") {
    return Status::Errno("mount", is_dir ? "mkdir" : "open(O_CREAT)", target);
  }
  if (Status s = EnsureTarget(paths::Parent(target), /*is_dir=*/true); !s.ok()) return s;
  if (create() != 0) return Status::Errno("mount", is_dir ? "mkdir" : "open(O_CREAT)", target);
  return {};
}

// Clones the mount tree at `source_fd`/`source`, applies `attrs` to the
// detached copy (so it is never visible without them), and attaches it.
Status AttachClone(int source_dirfd, const char* source, unsigned tree_flags, std::uint64_t attrs,
                   int target_dirfd, const char* target, const std::string& what) {
  UniqueFd tree(OpenTree(source_dirfd, source, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | tree_flags));
  if (!tree.valid()) return Status::Errno("mount", "open_tree", what);
  if (attrs != 0) {
    MountAttr attr{};
    attr.attr_set = attrs;
    if (MountSetattr(tree.get(), "", AT_EMPTY_PATH | (tree_flags & AT_RECURSIVE), &attr) != 0) {
      return Status::Errno("mount", "mount_setattr", what);
    }
  }
  unsigned move_flags = MOVE_MOUNT_F_EMPTY_PATH | (target[0] == 0 ? MOVE_MOUNT_T_EMPTY_PATH : 0);
  if (MoveMount(tree.get(), "", target_dirfd, target, move_flags) != 0) {
    return Status::Errno("mount", "move_mount", what);
  }
  return {};
}

Status BindPath(const std::string& source, const std::string& target, std::uint64_t attrs, bool recursive,
                bool is_dir) {
  if (Status s = EnsureTarget(target, is_dir); !s.ok()) return s;
  return AttachClone(AT_FDCWD, source.c_str(), recursive ? AT_RECURSIVE : 0, attrs, AT_FDCWD,
                     target.c_str(), target);
}

// Opens `rel` below `root` refusing every symlink on the way and at the
// end: protected paths and their pins must land exactly where the policy says.
Result<UniqueFd> OpenInWorkspace(const std::string& root, const std::string& rel) {
  UniqueFd dir(open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return Status::Errno("protect", "open", root);
  UniqueFd fd = OpenBeneath(dir.get(), rel, O_PATH);
  struct stat st {};
  if (fd.valid() && fstat(fd.get(), &st) == 0 && S_ISLNK(st.st_mode)) {
    fd.reset();
    errno = ELOOP;
  }
  if (!fd.valid()) return Status::Errno("protect", "openat2(RESOLVE_NO_SYMLINKS)", paths::Join(root, rel));
  return fd;
}

// Binds a workspace path onto itself (read-only for protect), resolving both
// ends without symlinks. Over an overlay workspace the source is the merged
// view itself: a bind of the base would let writes through to the base.
Status BindInPlace(const ResolvedMount& m, const Plan& plan, std::uint64_t attrs) {
  const std::string& ws = plan.workspace_source;
  std::string rel = m.op.source.substr(ws == "/" ? 1 : ws.size() + 1);
  auto src = OpenInWorkspace(plan.workspace_overlay ? plan.workspace_target : Host(ws), rel);
  if (!src.ok()) return src.status();
  auto dst = OpenInWorkspace(plan.workspace_target, rel);
  if (!dst.ok()) return dst.status();
  return AttachClone(src->get(), "", AT_EMPTY_PATH | AT_RECURSIVE, attrs, dst->get(), "", m.op.target);
}

// A protected path missing from an overlay workspace: an empty, mode-0400
// file created in the merged view (the session's upper layer, never the
// base), so that there is something to mount read-only over. One already
// there (from an earlier world of the session) is protected as it is.
Status CreatePlaceholderInside(const ResolvedMount& m, const Plan& plan) {
  const std::string& ws = plan.workspace_source;
  std::string rel = m.op.source.substr(ws == "/" ? 1 : ws.size() + 1);
  const std::string parent = rel.find('/') == std::string::npos ? "." : rel.substr(0, rel.rfind('/'));
  const std::string name = rel.substr(rel.rfind('/') + 1);
  auto dir = OpenInWorkspace(plan.workspace_target, parent);
  if (!dir.ok()) return dir.status();
  UniqueFd fd(openat(dir->get(), name.c_str(), O_RDONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0400));
  if (!fd.valid() && errno != EEXIST) return Status::Errno("protect", "openat(O_CREAT)", m.op.target);
  return {};
}

// The overlay's options show in /proc/self/mountinfo as given: host paths
// there would tell the command the state directory and the session's id.
// Each layer is first bound at a neutral name in the staging root and the
// overlay is mounted with paths relative to it ("lowerdir=l0:l1,upperdir=
// rw/upper,workdir=rw/work"); the overlay keeps its own references to the
// layers, so the staging binds go again at once. Upper and work share the
// bound directory: overlayfs wants them on one mount. The names that remain
// are the last components of upper and work, which the option string
// separates with ',' and ':' and escapes with '\\': such names are refused.
// An overlay's upper and work directories (`upper`, `work`: names) on a
// fresh tmpfs of `bytes`, mounted at `at` in the staging root, so that it
// shows nowhere inside once the staging names go. nr_inodes is bounded too
// (one per 4 KiB of the size): tmpfs does not count inodes in its size, and
// empty files would otherwise cost memory unbounded. The upper directory
// gets the mode of `base` (the merged root shows the upper root's). Returns
// the tmpfs's root; `at` goes to `staged` once mounted.
Result<UniqueFd> MountSizedUpper(const std::string& at, std::uint64_t bytes, const std::string& base,
                                 const std::string& upper, const std::string& work,
                                 std::vector<std::string>* staged) {
  if (mkdir(at.c_str(), 0700) != 0) return Status::Errno("mount", "mkdir", at);
  const std::uint64_t inodes = std::max<std::uint64_t>(1024, bytes / 4096);
  const std::string data = "size=" + std::to_string(bytes) + ",nr_inodes=" + std::to_string(inodes) + ",mode=0700";
  if (mount("tmpfs", at.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, data.c_str()) != 0) {
    const int err = errno;
    rmdir(at.c_str());
    return Status::Syscall("mount", "mount(tmpfs, " + data + ")", "the workspace's upper layer (disk_gib)", err);
  }
  staged->push_back(at);
  UniqueFd root(open(at.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return Status::Errno("mount", "open", at);
  if (mkdirat(root.get(), upper.c_str(), 0700) != 0) return Status::Errno("mount", "mkdir", at + "/" + upper);
  if (mkdirat(root.get(), work.c_str(), 0700) != 0) return Status::Errno("mount", "mkdir", at + "/" + work);
  UniqueFd up(openat(root.get(), upper.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!up.valid()) return Status::Errno("mount", "open", at + "/" + upper);
  struct stat st {};
  if (stat(base.c_str(), &st) != 0) return Status::Errno("mount", "stat", base);
  if (fchmod(up.get(), st.st_mode & 07777) != 0) return Status::Errno("mount", "fchmod", at + "/" + upper);
  return root;
}

// disk_gib for a session: the upper layer is held by the session's init
// (`out`); an earlier world's upper layer is copied in first (the new
// filesystem has the same size, so it fits).
Status MountSessionUpper(const std::string& at, const MountOp& op, const WorkspaceOverlay& o,
                         const std::string& upper, const std::string& work, UpperFs* out,
                         std::vector<std::string>* staged) {
  if (out == nullptr) {
    return Status::Error("mount", "the workspace's upper layer has a size (disk_gib) but no session init holds it");
  }
  auto root = MountSizedUpper(at, o.upper_fs_bytes, Host(op.source), upper, work, staged);
  if (!root.ok()) return root.status();
  if (out->seed_fd >= 0) {
    if (out->copy_upper == nullptr) return Status::Error("mount", "an upper layer to carry over, and no copier");
    UniqueFd from(openat(out->seed_fd, upper.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!from.valid() && errno != ENOENT) return Status::Errno("mount", "open", "the earlier world's upper layer");
    UniqueFd up(openat(root->get(), upper.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!up.valid()) return Status::Errno("mount", "open", at + "/" + upper);
    if (from.valid()) {
      if (Status s = out->copy_upper(from.get(), up.get()); !s.ok()) return s;
    }
  }
  out->root = std::move(*root);
  return {};
}

// `run --workspace-overlay`: the tmpfs's root goes to the supervisor over
// `channel` before anything is written to it (linux/upper_layer.h).
Status MountRunUpper(const std::string& at, const MountOp& op, const WorkspaceOverlay& o, const std::string& upper,
                     const std::string& work, int channel, std::vector<std::string>* staged) {
  if (channel < 0) return Status::Error("mount", "overlay on a tmpfs without a channel to the supervisor");
  auto root = MountSizedUpper(at, o.tmpfs_bytes, Host(op.source), upper, work, staged);
  if (!root.ok()) return root.status();
  return SendUpperLayer(channel, root->get());
}

Status MountOverlay(const MountOp& op, const Plan& plan, UpperFs* upper_fs, int upper_channel) {
  if (!plan.workspace_overlay) return Status::Error("mount", "overlay mount without overlay layers in the plan");
  const WorkspaceOverlay& o = *plan.workspace_overlay;
  const std::string rw = paths::Parent(o.upper);
  if (paths::Parent(o.work) != rw) {
    return Status::Error("mount", "overlay upper " + o.upper + " and work " + o.work + " are not in one directory");
  }
  const std::string upper = o.upper.substr(o.upper.rfind('/') + 1), work = o.work.substr(o.work.rfind('/') + 1);
  for (const auto& name : {upper, work}) {
    if (name.find_first_of(",:\\") != std::string::npos) {
      return Status::Error("mount", "overlay layer name " + name + " holds ',', ':' or '\\', which overlayfs options cannot carry");
    }
  }
  if (mkdir(kLayersDir, 0700) != 0) return Status::Errno("mount", "mkdir", kLayersDir);
  std::vector<std::string> staged;
  // Unbinds and removes the staging names whatever happens below.
  struct Unstage {
    std::vector<std::string>* names;
    ~Unstage() {
      for (const auto& n : *names) {
        umount2(n.c_str(), MNT_DETACH);
        rmdir(n.c_str());
      }
      rmdir(kLayersDir);
    }
  } unstage{&staged};
  auto stage = [&](const std::string& host, const std::string& name) -> Status {
    const std::string at = std::string(kLayersDir) + "/" + name;
    if (Status s = BindPath(Host(host), at, 0, /*recursive=*/false, /*is_dir=*/true); !s.ok()) {
      rmdir(at.c_str());
      return s;
    }
    staged.push_back(at);
    return {};
  };
  std::vector<std::string> lowers = o.lowers;
  lowers.push_back(op.source);
  std::string lowerdir;
  for (size_t i = 0; i < lowers.size(); ++i) {
    const std::string name = "l" + std::to_string(i);
    if (Status s = stage(lowers[i], name); !s.ok()) return s;
    lowerdir += (i == 0 ? "" : ":") + name;
  }
  if (o.upper_fs_bytes) {
    if (Status s = MountSessionUpper(std::string(kLayersDir) + "/rw", op, o, upper, work, upper_fs, &staged);
        !s.ok()) {
      return s;
    }
  } else if (o.tmpfs_bytes) {
    if (Status s = MountRunUpper(std::string(kLayersDir) + "/rw", op, o, upper, work, upper_channel, &staged);
        !s.ok()) {
      return s;
    }
  } else if (Status s = stage(rw, "rw"); !s.ok()) {
    return s;
  }
  const std::string options =
      "lowerdir=" + lowerdir + ",upperdir=rw/" + upper + ",workdir=rw/" + work + ",userxattr";
  if (Status s = EnsureTarget(op.target, true); !s.ok()) return s;
  // Relative layer paths resolve against the working directory.
  if (chdir(kLayersDir) != 0) return Status::Errno("mount", "chdir", kLayersDir);
  const int rc = mount("overlay", op.target.c_str(), "overlay", MS_NOSUID | MS_NODEV, options.c_str());
  const int err = errno;
  if (chdir("/") != 0) return Status::Errno("mount", "chdir", "/");
  if (rc != 0) return Status::Syscall("mount", "mount(overlay)", op.target, err);
  return {};
}

// The mask goes on the target itself, never where a symlink put there
// since the scan points (O_NOFOLLOW: a link is masked as the link).
Status Mask(const ResolvedMount& m) {
  UniqueFd target(open(m.op.target.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!target.valid()) {
    if (m.op.optional && errno == ENOENT) return {};
    return Status::Errno("mount", "open(O_NOFOLLOW)", m.op.target);
  }
  bool is_dir = m.is_dir;
  if (m.op.source.empty()) {  // an inside path: look at it now
    struct stat st {};
    if (fstat(target.get(), &st) != 0) return Status::Errno("mount", "fstat", m.op.target);
    is_dir = S_ISDIR(st.st_mode);
  }
  return AttachClone(AT_FDCWD, is_dir ? kMaskDir : kMaskFile, 0,
                     MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                     target.get(), "", m.op.target);
}

// A file with `content` in the staging root, bound read-only over `target`
// (resolved from the new root, which is already the process's root: a
// symlink there, such as /var/lib/dbus/machine-id -> /etc/machine-id,
// resolves inside it).
// Absent targets are left absent. The file is unlinked at once: the mount
// keeps it.
Status BindContentOver(const std::string& target, const std::string& content) {
  UniqueFd root(open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return Status::Errno("ids", "open", "/");
  OpenHow how{};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_NO_MAGICLINKS;
  UniqueFd dst(Openat2(root.get(), target.c_str() + 1, &how));
  if (!dst.valid()) return errno == ENOENT ? Status{} : Status::Errno("ids", "openat2", target);
  struct stat st {};
  if (fstat(dst.get(), &st) != 0) return Status::Errno("ids", "fstat", target);
  if (!S_ISREG(st.st_mode)) return {};
  const std::string source = std::string(kIdsDir) + "/id";
  UniqueFd fd(open(source.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444));
  if (!fd.valid()) return Status::Errno("ids", "open(O_CREAT)", source);
  if (write(fd.get(), content.data(), content.size()) != static_cast<ssize_t>(content.size())) {
    return Status::Errno("ids", "write", source);
  }
  Status s = AttachClone(AT_FDCWD, source.c_str(), 0,
                         MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC, dst.get(), "",
                         target);
  unlink(source.c_str());
  return s;
}

}  // namespace

Status ReplaceHostFiles(const std::string& dns_address, const std::string& hostname) {
  if (mkdir(kIdsDir, 0700) != 0) return Status::Errno("ids", "mkdir", kIdsDir);
  std::string boot = RandomHex(16);
  boot[12] = '4';  // a version-4 uuid, as the kernel's
  boot[16] = "89ab"[boot[16] % 4];
  boot = boot.substr(0, 8) + "-" + boot.substr(8, 4) + "-" + boot.substr(12, 4) + "-" + boot.substr(16, 4) + "-" +
         boot.substr(20);
  const std::string machine = RandomHex(16);
  Status s = BindContentOver("/proc/sys/kernel/random/boot_id", boot + "\n");
  for (const char* path : {"/etc/machine-id", "/var/lib/dbus/machine-id"}) {
    if (s.ok()) s = BindContentOver(path, machine + "\n");
  }
  // Nothing but the supervisor's DNS: no search domains of the host's, no
  // second server to fall back on.
  if (s.ok() && !dns_address.empty()) {
    s = BindContentOver("/etc/resolv.conf", "nameserver " + dns_address + "\noptions edns0\n");
    // The host's own names stay the host's: a name in its /etc/hosts would
    // be resolved without asking, and refused (or let through) by its
    // address alone, with no word of the name.
    std::string hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n";
    if (!hostname.empty()) hosts += "127.0.1.1\t" + hostname + "\n";
    if (s.ok()) s = BindContentOver("/etc/hosts", hosts);
  }
  rmdir(kIdsDir);
  return s;
}

Status MakeMountsPrivate() {
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return Status::Errno("root", "mount(MS_REC|MS_PRIVATE)", "/");
  }
  return {};
}

Status PivotToStagingRoot() {
  // The staging tmpfs goes over /tmp of our private mount namespace; once it
  // is the root, the host's /tmp shows again below /oldroot/tmp.
  constexpr const char* kStage = "/tmp";
  if (mount("tmpfs", kStage, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m") != 0) {
    return Status::Errno("root", "mount(tmpfs)", kStage);
  }
  if (mkdir("/tmp/oldroot", 0700) != 0) return Status::Errno("root", "mkdir", "/tmp/oldroot");
  if (syscall(SYS_pivot_root, kStage, "/tmp/oldroot") != 0) {
    return Status::Errno("root", "pivot_root", kStage);
  }
  if (chdir("/") != 0) return Status::Errno("root", "chdir", "/");
  // Empty, mode-0000 sources for masks: reads of a masked path fail with EACCES.
  if (mkdir("/.agentbox-mask", 0700) != 0) return Status::Errno("root", "mkdir", "/.agentbox-mask");
  if (mkdir(kMaskDir, 0) != 0) return Status::Errno("root", "mkdir", kMaskDir);
  int fd = open(kMaskFile, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0);
  if (fd < 0) return Status::Errno("root", "open(O_CREAT)", kMaskFile);
  close(fd);
  return {};
}

// A file made in the new root: `data`, then the host file `source` (read
// through the old root) when one is named, then bound onto itself
// read-only so that nothing inside can change or replace it.
Status WriteReadOnlyFile(const MountOp& op) {
  if (Status s = EnsureTarget(paths::Parent(op.target), true); !s.ok()) return s;
  UniqueFd out(open(op.target.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0444));
  if (!out.valid()) return Status::Errno("mount", "open(O_CREAT)", op.target);
  auto write_all = [&](const char* p, std::size_t n) -> Status {
    while (n > 0) {
      ssize_t w = write(out.get(), p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return Status::Errno("mount", "write", op.target);
      p += w;
      n -= static_cast<std::size_t>(w);
    }
    return {};
  };
  if (Status s = write_all(op.data.data(), op.data.size()); !s.ok()) return s;
  if (!op.source.empty()) {
    UniqueFd in(open(Host(op.source).c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
    if (!in.valid()) {
      if (!op.optional) return Status::Errno("mount", "open", op.source);
    } else {
      char buf[16384];
      while (true) {
        ssize_t n = read(in.get(), buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return Status::Errno("mount", "read", op.source);
        if (n == 0) break;
        if (Status s = write_all(buf, static_cast<std::size_t>(n)); !s.ok()) return s;
      }
    }
  }
  out.reset();
  return BindPath(op.target, op.target, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC | MOUNT_ATTR_RDONLY,
                  false, false);
}

Status ApplyMount(const ResolvedMount& m, const Plan& plan, UpperFs* upper_fs) {
  const MountOp& op = m.op;
  constexpr std::uint64_t kSafe = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  switch (op.kind) {
    case MountKind::kTmpfs:
      if (op.target == "/") return {};  // the staging root itself
      if (Status s = EnsureTarget(op.target, true); !s.ok()) return s;
      if (mount("tmpfs", op.target.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, op.data.c_str()) != 0) {
        return Status::Errno("mount", "mount(tmpfs)", op.target);
      }
      return {};
    case MountKind::kBind:
      return BindPath(Host(op.source), op.target, kSafe | (op.read_only ? MOUNT_ATTR_RDONLY : 0),
                      /*recursive=*/true, m.is_dir);
    case MountKind::kDevice:
      return BindPath(Host(op.source), op.target, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
                      /*recursive=*/false, /*is_dir=*/false);
    case MountKind::kDevpts:
      if (Status s = EnsureTarget(op.target, true); !s.ok()) return s;
      if (mount("devpts", op.target.c_str(), "devpts", MS_NOSUID | MS_NOEXEC, op.data.c_str()) != 0) {
        return Status::Errno("mount", "mount(devpts)", op.target);
      }
      return {};
    case MountKind::kSymlink:
      if (Status s = EnsureTarget(paths::Parent(op.target), true); !s.ok()) return s;
      if (symlink(op.source.c_str(), op.target.c_str()) != 0) {
        return Status::Errno("mount", "symlink", op.target);
      }
      return {};
    case MountKind::kProc:
      if (Status s = EnsureTarget(op.target, true); !s.ok()) return s;
      if (mount("proc", op.target.c_str(), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
        return Status::Errno("mount", "mount(proc)", op.target);
      }
      return {};
    case MountKind::kReadOnly:
      return BindPath(op.target, op.target, kSafe | MOUNT_ATTR_NOEXEC | MOUNT_ATTR_RDONLY, true, true);
    case MountKind::kMask:
      return Mask(m);
    case MountKind::kProtect:
      if (m.placeholder_inside) {
        if (Status s = CreatePlaceholderInside(m, plan); !s.ok()) return s;
      }
      return BindInPlace(m, plan, kSafe | MOUNT_ATTR_RDONLY);
    case MountKind::kPin:
      return BindInPlace(m, plan, kSafe);
    case MountKind::kOverlay:
      return MountOverlay(op, plan, upper_fs, m.upper_channel);
    case MountKind::kFile:
      return WriteReadOnlyFile(op);
    case MountKind::kDir:
      // On the root tmpfs, before SealRoot: nothing inside can add to it.
      return EnsureTarget(op.target, true);
  }
  return Status::Error("mount", "unknown mount kind");
}

Status DetachOldRoot() {
  if (umount2(kOldRoot, MNT_DETACH) != 0) return Status::Errno("root", "umount2(MNT_DETACH)", kOldRoot);
  if (rmdir(kOldRoot) != 0) return Status::Errno("root", "rmdir", kOldRoot);
  // The masks keep their (now nameless) sources alive.
  unlink(kMaskFile);
  rmdir(kMaskDir);
  rmdir("/.agentbox-mask");
  return {};
}

Status SealRoot() {
  MountAttr attr{};
  attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  if (MountSetattr(AT_FDCWD, "/", 0, &attr) != 0) return Status::Errno("root", "mount_setattr(RDONLY)", "/");
  return {};
}

}  // namespace agentbox::linux
