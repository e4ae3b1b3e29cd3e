#include "session/layers.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "linux/compat.h"
#include "linux/fd.h"
#include "policy/sha256.h"
#include "report/json_text.h"
#include "session/file_tools.h"
#include "session/gitignore.h"
#include "session/unified_diff.h"

namespace agentbox::session {
namespace {

using linux::UniqueFd;
using linux::OpenBeneath;

constexpr const char* kOpaqueXattr = "user.overlay.opaque";
constexpr const char* kTrustedOpaqueXattr = "trusted.overlay.opaque";
constexpr const char* kManifestName = "manifest.json";
constexpr const char* kTreeName = "tree";

std::string Join(const std::string& dir, const std::string& rel) {
  if (rel.empty()) return dir;
  if (dir.empty()) return rel;
  return dir.back() == '/' ? dir + rel : dir + "/" + rel;
}

std::string Octal(mode_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

// Whether `s` is well-formed UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing past U+10FFFF), which is what JSON text can carry.
bool IsUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t len = p[i] < 0x80 ? 1 : report::Utf8SequenceLength(p, i, s.size());
    if (len == 0) return false;
    i += len;
  }
  return true;
}

// `s` with every byte that is not part of well-formed UTF-8 replaced by
// U+FFFD: readable, not exact (exact bytes travel as hex beside it).
std::string Utf8Lossy(std::string_view s) {
  if (IsUtf8(s)) return std::string(s);
  std::string out;
  for (std::size_t i = 0; i < s.size();) {
    std::size_t len = 1;
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0xc2 && c <= 0xf4) {
      const std::size_t want = c <= 0xdf ? 2 : c <= 0xef ? 3 : 4;
      if (i + want <= s.size() && IsUtf8(s.substr(i, want))) len = want;
    }
    if (len == 1 && c >= 0x80) {
      out += "\xEF\xBF\xBD";
    } else {
      out.append(s.substr(i, len));
    }
    i += len;
  }
  return out;
}

std::string Hex(std::string_view bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    out.push_back(kDigits[u >> 4]);
    out.push_back(kDigits[u & 15]);
  }
  return out;
}

std::optional<std::string> Unhex(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  std::string out;
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int h = digit(hex[i]), l = digit(hex[i + 1]);
    if (h < 0 || l < 0) return std::nullopt;
    out.push_back(static_cast<char>(h * 16 + l));
  }
  return out;
}

// File names and symlink targets are bytes; JSON strings are UTF-8. A value
// that is not UTF-8 is stored as "<key>_hex" (lowercase hex of the bytes)
// instead of "<key>", so it round-trips exactly.
void PutBytes(Json& object, const std::string& key, const std::string& value) {
  if (IsUtf8(value)) {
    object[key] = value;
  } else {
    object[key + "_hex"] = Hex(value);
  }
}

// The value PutBytes stored, or nullopt when neither form is there (or the
// hex is malformed).
std::optional<std::string> GetBytes(const Json& object, const std::string& key) {
  if (!object.is_object()) return std::nullopt;
  auto plain = object.find(key);
  auto hex = object.find(key + "_hex");
  if (plain != object.end() && hex == object.end()) {
    if (!plain->is_string()) return std::nullopt;
    return plain->get<std::string>();
  }
  if (hex != object.end() && plain == object.end() && hex->is_string()) {
    return Unhex(hex->get_ref<const std::string&>());
  }
  return std::nullopt;
}

// Every path walked or written here, root included, fits in PATH_MAX like
// any path a process can name: a tree nested deeper (built with *at calls)
// is refused with its path, so no walk recurses without bound and whatever
// was written can be removed by path.
constexpr std::size_t kMaxPath = PATH_MAX - 1;

bool TooLong(const std::string& root, const std::string& rel) { return Join(root, rel).size() > kMaxPath; }

Status PathTooLong(const char* stage, const std::string& root, const std::string& rel) {
  return Status::Error(kPathTooLong, std::string(stage) + ": " + Utf8Lossy(Join(root, rel.substr(0, 256))) +
                                         "...: path longer than " + std::to_string(kMaxPath) +
                                         " bytes (directories nested too deep)");
}

// The permission bits a copy keeps: set-user-ID and set-group-ID never (a
// layer is written by the sandbox, whose root may be the host's), the
// sticky bit on directories only.
mode_t KeptMode(const struct stat& st) {
  return st.st_mode & (S_ISDIR(st.st_mode) ? 01777 : 0777);
}

bool IsWhiteout(const struct stat& st) { return S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0); }

// Needs an fd opened for reading (xattr calls refuse O_PATH fds).
bool IsOpaque(int dir_fd) {
  for (const char* name : {kOpaqueXattr, kTrustedOpaqueXattr}) {
    char value[4];
    ssize_t n = fgetxattr(dir_fd, name, value, sizeof(value));
    if (n == 1 && value[0] == 'y') return true;
  }
  return false;
}

// The names in the directory `dir_fd` (not "." or ".."), sorted.
Result<std::vector<std::string>> ListNames(int dir_fd, const std::string& path, const char* stage) {
  // A fresh open file description: readdir's position is its own.
  int fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::Errno(stage, "open", path);
  DIR* dir = fdopendir(fd);
  if (dir == nullptr) {
    Status s = Status::Errno(stage, "fdopendir", path);
    close(fd);
    return s;
  }
  std::vector<std::string> names;
  errno = 0;
  while (struct dirent* e = readdir(dir)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
    errno = 0;
  }
  int err = errno;
  closedir(dir);
  if (err != 0) return Status::Syscall(stage, "readdir", path, err);
  std::sort(names.begin(), names.end());
  return names;
}

Result<std::string> ReadLinkAt(int dir_fd, const std::string& name, const std::string& path, const char* stage) {
  std::string buf(256, '\0');
  for (;;) {
    ssize_t n = readlinkat(dir_fd, name.c_str(), buf.data(), buf.size());
    if (n < 0) return Status::Errno(stage, "readlink", path);
    if (static_cast<std::size_t>(n) < buf.size()) {
      buf.resize(static_cast<std::size_t>(n));
      return buf;
    }
    buf.resize(buf.size() * 2);
  }
}

// Reads at most `limit` bytes of `fd` from its current offset.
Result<std::string> ReadUpTo(int fd, std::size_t limit, const std::string& path, const char* stage) {
  std::string data;
  char buf[1 << 16];
  while (data.size() < limit) {
    ssize_t n = read(fd, buf, std::min(sizeof(buf), limit - data.size()));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Errno(stage, "read", path);
    }
    if (n == 0) break;
    data.append(buf, static_cast<std::size_t>(n));
  }
  return data;
}

// SHA-256 of a file nobody else writes (a snapshot's own copy): mapped, so
// the file is hashed without a second copy in memory.
Result<std::string> Sha256OfFile(int fd, std::size_t size, const std::string& path, const char* stage) {
  if (size == 0) return Sha256Hex("");
  void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) return Status::Errno(stage, "mmap", path);
  std::string hex = Sha256Hex(std::string_view(static_cast<const char*>(p), size));
  munmap(p, size);
  return hex;
}

// Copies the data of `in` to the empty file `out`: a reflink when the
// filesystem shares extents (btrfs, xfs), else an in-kernel copy, else
// read/write.
Status CopyData(int in, int out, const std::string& path, const char* stage) {
  if (ioctl(out, FICLONE, in) == 0) return {};
  for (;;) {
    ssize_t n = copy_file_range(in, nullptr, out, nullptr, std::size_t{1} << 30, 0);
    if (n > 0) continue;
    if (n == 0) return {};
    if (errno == EINTR) continue;
    // Not between these files: read/write from the offsets reached so far.
    if (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP || errno == ENOSYS) break;
    return Status::Errno(stage, "copy_file_range", path);
  }
  char buf[1 << 16];
  for (;;) {
    ssize_t n = read(in, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Errno(stage, "read", path);
    }
    if (n == 0) return {};
    for (ssize_t done = 0; done < n;) {
      ssize_t w = write(out, buf + done, static_cast<std::size_t>(n - done));
      if (w < 0) {
        if (errno == EINTR) continue;
        return Status::Errno(stage, "write", path);
      }
      done += w;
    }
  }
}

Status FsyncPath(const std::string& path, const char* stage) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno(stage, "open", path);
  if (fsync(fd.get()) != 0) return Status::Errno(stage, "fsync", path);
  return {};
}

// Writes `data` to `path` so that it is either absent or whole: a temp file
// beside it, fsync, rename, then fsync of the directory.
Status WriteFileDurably(const std::string& dir, const std::string& name, const std::string& data,
                        const char* stage) {
  const std::string path = Join(dir, name);
  const std::string temp = Join(dir, "." + name + ".tmp");
  UniqueFd fd(open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return Status::Errno(stage, "open", temp);
  for (std::size_t done = 0; done < data.size();) {
    ssize_t n = write(fd.get(), data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Errno(stage, "write", temp);
    }
    done += static_cast<std::size_t>(n);
  }
  if (fsync(fd.get()) != 0) return Status::Errno(stage, "fsync", temp);
  fd.reset();
  if (rename(temp.c_str(), path.c_str()) != 0) return Status::Errno(stage, "rename", path);
  return FsyncPath(dir, stage);
}

// ------------------------------------------------------------------ copying

// Copies a tree below opened directories, one component at a time, never
// following a symlink. Entries that vanish or change type while being copied
// (the session may be running) are skipped.
class TreeCopier {
 public:
  struct Options {
    const char* stage = "copy";
    bool overlay_markers = false;  // keep whiteouts and the opaque mark
    bool manifest = false;         // record entries with checksums of the copies
    bool chown = false;            // keep ownership (root only)
  };

  TreeCopier(Options options, std::string src_root, std::string dst_root)
      : o_(options), src_root_(std::move(src_root)), dst_root_(std::move(dst_root)) {}

  Status CopyContents(int src_dir, int dst_dir, const std::string& rel) {
    auto names = ListNames(src_dir, Join(src_root_, rel), o_.stage);
    if (!names.ok()) return names.status();
    for (const std::string& name : *names) {
      if (Status s = CopyEntry(src_dir, dst_dir, name, Join(rel, name)); !s.ok()) return s;
    }
    return {};
  }

  // Manifest entries with the exact path of each.
  std::vector<std::pair<std::string, Json>>& entries() { return entries_; }

 private:
  static bool Vanished(int err) { return err == ENOENT || err == ENOTDIR || err == ELOOP; }

  // Ownership, mode and times of a copied file or directory, after its
  // contents: chown first, times last. The mode loses its set-id bits
  // (KeptMode).
  Status Finish(int fd, const struct stat& st, const std::string& dst) {
    if (o_.chown && fchown(fd, st.st_uid, st.st_gid) != 0 && errno != EPERM && errno != EINVAL) {
      return Status::Errno(o_.stage, "fchown", dst);
    }
    if (fchmod(fd, KeptMode(st)) != 0) return Status::Errno(o_.stage, "fchmod", dst);
    struct timespec times[2] = {st.st_atim, st.st_mtim};
    if (futimens(fd, times) != 0) return Status::Errno(o_.stage, "futimens", dst);
    return {};
  }

  Status CopyEntry(int src_dir, int dst_dir, const std::string& name, const std::string& rel) {
    if (TooLong(src_root_, rel) || TooLong(dst_root_, rel)) return PathTooLong(o_.stage, src_root_, rel);
    const std::string src = Join(src_root_, rel);
    const std::string dst = Join(dst_root_, rel);
    struct stat st {};
    if (fstatat(src_dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return {};
      return Status::Errno(o_.stage, "lstat", src);
    }
    if (S_ISREG(st.st_mode)) return CopyFile(src_dir, dst_dir, name, rel, src, dst);
    if (S_ISDIR(st.st_mode)) return CopyDir(src_dir, dst_dir, name, rel, src, dst);
    if (S_ISLNK(st.st_mode)) {
      auto target = ReadLinkAt(src_dir, name, src, o_.stage);
      if (!target.ok()) return Vanished(target.status().err()) || target.status().err() == EINVAL
                                   ? Status()
                                   : target.status();
      if (symlinkat(target->c_str(), dst_dir, name.c_str()) != 0) return Status::Errno(o_.stage, "symlink", dst);
      if (o_.chown) (void)fchownat(dst_dir, name.c_str(), st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW);
      struct timespec times[2] = {st.st_atim, st.st_mtim};
      (void)utimensat(dst_dir, name.c_str(), times, AT_SYMLINK_NOFOLLOW);
      if (o_.manifest) {
        Json e = {{"type", "symlink"}};
        PutBytes(e, "path", rel);
        PutBytes(e, "target", *target);
        entries_.emplace_back(rel, std::move(e));
      }
      return {};
    }
    if (o_.overlay_markers && IsWhiteout(st)) {
      if (mknodat(dst_dir, name.c_str(), S_IFCHR, makedev(0, 0)) != 0) {
        return Status::Errno(o_.stage, "mknod (whiteout)", dst);
      }
      if (o_.manifest) {
        Json e = {{"type", "whiteout"}};
        PutBytes(e, "path", rel);
        entries_.emplace_back(rel, std::move(e));
      }
      return {};
    }
    return {};  // sockets, fifos, devices: not workspace content
  }

  Status CopyFile(int src_dir, int dst_dir, const std::string& name, const std::string& rel,
                  const std::string& src, const std::string& dst) {
    UniqueFd in(openat(src_dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
    if (!in.valid()) return Vanished(errno) ? Status() : Status::Errno(o_.stage, "open", src);
    struct stat st {};
    if (fstat(in.get(), &st) != 0) return Status::Errno(o_.stage, "fstat", src);
    if (!S_ISREG(st.st_mode)) return {};  // replaced meanwhile
    UniqueFd out(openat(dst_dir, name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!out.valid()) return Status::Errno(o_.stage, "create", dst);
    if (Status s = CopyData(in.get(), out.get(), src, o_.stage); !s.ok()) return s;
    if (Status s = Finish(out.get(), st, dst); !s.ok()) return s;
    if (o_.manifest) {
      // Measured on the copy: the source may have changed while it was read.
      struct stat copied {};
      if (fstat(out.get(), &copied) != 0) return Status::Errno(o_.stage, "fstat", dst);
      auto sha = Sha256OfFile(out.get(), static_cast<std::size_t>(copied.st_size), dst, o_.stage);
      if (!sha.ok()) return sha.status();
      Json e = {{"type", "file"},
                {"mode", Octal(copied.st_mode)},
                {"size", static_cast<std::uint64_t>(copied.st_size)},
                {"sha256", *sha}};
      PutBytes(e, "path", rel);
      entries_.emplace_back(rel, std::move(e));
    }
    return {};
  }

  Status CopyDir(int src_dir, int dst_dir, const std::string& name, const std::string& rel,
                 const std::string& src, const std::string& dst) {
    UniqueFd in(openat(src_dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!in.valid()) return Vanished(errno) ? Status() : Status::Errno(o_.stage, "open", src);
    struct stat st {};
    if (fstat(in.get(), &st) != 0) return Status::Errno(o_.stage, "fstat", src);
    if (mkdirat(dst_dir, name.c_str(), 0700) != 0) return Status::Errno(o_.stage, "mkdir", dst);
    UniqueFd out(openat(dst_dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!out.valid()) return Status::Errno(o_.stage, "open", dst);
    const bool opaque = o_.overlay_markers && IsOpaque(in.get());
    if (Status s = CopyContents(in.get(), out.get(), rel); !s.ok()) return s;
    if (opaque && fsetxattr(out.get(), kOpaqueXattr, "y", 1, 0) != 0) {
      return Status::Errno(o_.stage, std::string("setxattr ") + kOpaqueXattr, dst);
    }
    if (Status s = Finish(out.get(), st, dst); !s.ok()) return s;
    if (o_.manifest) {
      // The mode the copy has (KeptMode), not the source's.
      Json e = {{"type", "dir"}, {"mode", Octal(KeptMode(st))}, {"opaque", opaque}};
      PutBytes(e, "path", rel);
      entries_.emplace_back(rel, std::move(e));
    }
    return {};
  }

  Options o_;
  std::string src_root_;
  std::string dst_root_;
  std::vector<std::pair<std::string, Json>> entries_;
};

// Copies the contents of the directory `from` into the directory `to` (both
// exist), then gives `to` the mode and times of `from`.
Status CopyInto(const std::string& from, const std::string& to, const TreeCopier::Options& options,
                std::vector<std::pair<std::string, Json>>* entries) {
  UniqueFd src(open(from.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!src.valid()) return Status::Errno(options.stage, "open", from);
  UniqueFd dst(open(to.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dst.valid()) return Status::Errno(options.stage, "open", to);
  struct stat st {};
  if (fstat(src.get(), &st) != 0) return Status::Errno(options.stage, "fstat", from);
  TreeCopier copier(options, from, to);
  if (Status s = copier.CopyContents(src.get(), dst.get(), ""); !s.ok()) return s;
  if (fchmod(dst.get(), KeptMode(st)) != 0) return Status::Errno(options.stage, "fchmod", to);
  struct timespec times[2] = {st.st_atim, st.st_mtim};
  if (futimens(dst.get(), times) != 0) return Status::Errno(options.stage, "futimens", to);
  // One flush for the whole tree: a journal commit per file would cost
  // milliseconds each; syncfs writes every file and directory at once.
  if (syncfs(dst.get()) != 0) return Status::Errno(options.stage, "syncfs", to);
  if (entries != nullptr) *entries = std::move(copier.entries());
  return {};
}

// ------------------------------------------------------------------ the merged view

enum class Kind { kAbsent, kFile, kSymlink, kDir, kOther };

struct Node {
  Kind kind = Kind::kAbsent;
  int layer = -1;          // files and symlinks: the layer holding them
  struct stat st {};
};

// A stack of directory trees seen as overlayfs shows them (top first): the
// first layer with an entry decides, whiteouts hide, directories merge down
// to an opaque one. A single layer is a plain tree.
class LayeredView {
 public:
  static Result<LayeredView> Open(const std::vector<std::string>& roots) {
    LayeredView view;
    view.roots_ = roots;
    for (const std::string& root : roots) {
      UniqueFd fd(open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
      if (!fd.valid()) return Status::Errno("diff", "open", root);
      view.fds_.push_back(std::move(fd));
    }
    return view;
  }

  int layers() const { return static_cast<int>(roots_.size()); }
  int root_fd(int layer) const { return fds_[layer].get(); }
  const std::string& root(int layer) const { return roots_[layer]; }

  Node Lookup(const std::string& rel) {
    Node node;
    if (rel.empty()) {
      node.kind = Kind::kDir;
      return node;
    }
    std::size_t slash = rel.rfind('/');
    const std::vector<int>& parent = DirLayers(slash == std::string::npos ? "" : rel.substr(0, slash));
    bool is_dir = false;
    for (int layer : parent) {
      struct stat st {};
      if (!StatIn(layer, rel, &st)) continue;
      if (IsWhiteout(st)) break;  // hides what is below
      if (S_ISDIR(st.st_mode)) {
        is_dir = true;
        continue;  // DirLayers() has the merge
      }
      if (is_dir) break;  // a non-directory under a directory ends the stack
      node.layer = layer;
      node.st = st;
      node.kind = S_ISREG(st.st_mode) ? Kind::kFile : S_ISLNK(st.st_mode) ? Kind::kSymlink : Kind::kOther;
      return node;
    }
    if (is_dir) node.kind = Kind::kDir;
    return node;
  }

  // The layers whose directory `rel` makes up the merged directory, top
  // first; empty when `rel` is not a directory in the view.
  const std::vector<int>& DirLayers(const std::string& rel) {
    auto it = dirs_.find(rel);
    if (it != dirs_.end()) return it->second;
    std::vector<int> layers;
    if (rel.empty()) {
      for (int i = 0; i < this->layers(); ++i) layers.push_back(i);
    } else {
      std::size_t slash = rel.rfind('/');
      std::vector<int> parent = DirLayers(slash == std::string::npos ? "" : rel.substr(0, slash));
      for (int layer : parent) {
        struct stat st {};
        if (!StatIn(layer, rel, &st)) continue;
        if (!S_ISDIR(st.st_mode)) break;  // a whiteout or a non-directory ends the merge
        layers.push_back(layer);
        if (layer + 1 < this->layers() && OpaqueIn(layer, rel)) break;
      }
    }
    return dirs_.emplace(rel, std::move(layers)).first->second;
  }

  // Opens a file or symlink of the view (O_PATH for a symlink).
  int OpenNode(const Node& node, const std::string& rel) const {
    return OpenBeneath(fds_[node.layer].get(), rel,
                       node.kind == Kind::kSymlink ? O_PATH : O_RDONLY | O_NONBLOCK | O_NOCTTY)
        .release();
  }

 private:
  bool StatIn(int layer, const std::string& rel, struct stat* st) const {
    UniqueFd fd(OpenBeneath(fds_[layer].get(), rel, O_PATH));
    return fd.valid() && fstat(fd.get(), st) == 0;
  }
  bool OpaqueIn(int layer, const std::string& rel) const {
    UniqueFd fd(OpenBeneath(fds_[layer].get(), rel, O_RDONLY | O_DIRECTORY));
    return fd.valid() && IsOpaque(fd.get());
  }

  std::vector<std::string> roots_;
  std::vector<UniqueFd> fds_;
  std::unordered_map<std::string, std::vector<int>> dirs_;
};

// Whether a walk goes into directories named .git (repository metadata,
// which diffs leave out).
enum class GitDirs { kSkip, kInclude };

// Adds every path below `rel` of the tree `root_fd` (not `rel` itself) to
// `paths`, never following a symlink.
Status CollectPaths(int root_fd, const std::string& root, const std::string& rel, GitDirs git, const char* stage,
                    std::set<std::string>* paths, IgnoreRules* ignore = nullptr) {
  UniqueFd dir(OpenBeneath(root_fd, rel, O_RDONLY | O_DIRECTORY));
  if (!dir.valid()) {
    if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) return {};  // changed meanwhile
    return Status::Errno(stage, "open", Join(root, rel));
  }
  auto names = ListNames(dir.get(), Join(root, rel), stage);
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    if (git == GitDirs::kSkip && name == ".git") continue;
    std::string child = Join(rel, name);
    if (TooLong(root, child)) return PathTooLong(stage, root, child);
    struct stat st {};
    const bool is_dir = fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    if (ignore && ignore->Ignored(child, is_dir)) continue;
    paths->insert(child);
    if (is_dir) {
      if (Status s = CollectPaths(root_fd, root, child, git, stage, paths, ignore); !s.ok()) return s;
    }
  }
  return {};
}

// One side of a changed path, as git sees it.
struct Side {
  bool tracked = false;  // a file or a symlink
  bool symlink = false;
  unsigned git_mode = 0;  // 100644, 100755 or 120000 (octal)
  std::size_t size = 0;
  bool loaded = false;    // `content` holds the whole content
  bool binary = false;
  std::string content;
};

Result<Side> ReadSide(LayeredView& view, const Node& node, const std::string& rel, std::size_t max_load) {
  Side side;
  if (node.kind != Kind::kFile && node.kind != Kind::kSymlink) return side;
  const std::string path = Join(view.root(node.layer), rel);
  side.tracked = true;
  UniqueFd fd(view.OpenNode(node, rel));
  if (!fd.valid()) {
    // Removed or replaced since it was looked up (the session is running).
    if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) return Side();
    return Status::Errno("diff", "open", path);
  }
  if (node.kind == Kind::kSymlink) {
    side.symlink = true;
    side.git_mode = 0120000;
    auto target = ReadLinkAt(fd.get(), "", path, "diff");
    if (!target.ok()) return target.status();
    side.content = std::move(*target);
    side.size = side.content.size();
    side.loaded = true;
    return side;
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return Status::Errno("diff", "fstat", path);
  side.git_mode = (st.st_mode & S_IXUSR) ? 0100755 : 0100644;
  side.size = static_cast<std::size_t>(st.st_size);
  if (side.size <= max_load) {
    // The file may have grown since fstat (the sandbox can write it while
    // it is read): one byte past the cap tells, and a file that grew past
    // it is one over the cap, never read whole.
    const std::size_t limit = max_load < std::numeric_limits<std::size_t>::max() ? max_load + 1 : max_load;
    auto data = ReadUpTo(fd.get(), limit, path, "diff");
    if (!data.ok()) return data.status();
    side.binary = data->find('\0') < kBinaryProbeBytes;
    side.size = data->size();
    if (data->size() <= max_load) {
      side.content = std::move(*data);
      side.loaded = true;
    }
  } else {
    auto head = ReadUpTo(fd.get(), kBinaryProbeBytes, path, "diff");
    if (!head.ok()) return head.status();
    side.binary = head->find('\0') != std::string::npos;
  }
  return side;
}

// Whether two files too big to load have the same bytes.
Result<bool> SameContent(LayeredView& a_view, const Node& a, LayeredView& b_view, const Node& b,
                         const std::string& rel) {
  UniqueFd fa(a_view.OpenNode(a, rel));
  if (!fa.valid()) return Status::Errno("diff", "open", Join(a_view.root(a.layer), rel));
  UniqueFd fb(b_view.OpenNode(b, rel));
  if (!fb.valid()) return Status::Errno("diff", "open", Join(b_view.root(b.layer), rel));
  for (;;) {
    auto ca = ReadUpTo(fa.get(), 1 << 20, Join(a_view.root(a.layer), rel), "diff");
    if (!ca.ok()) return ca.status();
    auto cb = ReadUpTo(fb.get(), 1 << 20, Join(b_view.root(b.layer), rel), "diff");
    if (!cb.ok()) return cb.status();
    if (*ca != *cb) return false;
    if (ca->empty()) return true;
  }
}

// A path as git writes it in a patch: C-quoted (with the prefix inside the
// quotes) when it holds a quote, a backslash, a control or a non-ASCII byte.
std::string GitQuote(const std::string& prefix, const std::string& path) {
  std::string full = prefix + path;
  bool plain = std::all_of(full.begin(), full.end(), [](char c) {
    auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x7f && c != '"' && c != '\\';
  });
  if (plain) return full;
  std::string out = "\"";
  for (char c : full) {
    auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '\a': out += "\\a"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\v': out += "\\v"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      default:
        if (u < 0x20 || u >= 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\%03o", u);
          out += buf;
        } else {
          out.push_back(c);
        }
    }
  }
  return out + "\"";
}

std::string ModeText(unsigned mode) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%06o", mode);
  return buf;
}

// "--- a/p" / "+++ b/p": git ends a name holding a space with a tab.
std::string FileLine(const char* marker, const std::string& label) {
  std::string line = std::string(marker) + " " + label;
  if (label != "/dev/null" && label.find(' ') != std::string::npos) line += "\t";
  return line + "\n";
}

// One file's section of a git patch: `old_side` / `new_side` absent for an
// added / deleted file. Returns false when the content is not loaded.
bool AppendSection(std::string* out, const std::string& path, const Side* old_side, const Side* new_side) {
  if ((old_side && !old_side->loaded) || (new_side && !new_side->loaded)) return false;
  const std::string a = GitQuote("a/", path);
  const std::string b = GitQuote("b/", path);
  *out += "diff --git " + a + " " + b + "\n";
  if (!old_side) {
    *out += "new file mode " + ModeText(new_side->git_mode) + "\n";
  } else if (!new_side) {
    *out += "deleted file mode " + ModeText(old_side->git_mode) + "\n";
  } else if (old_side->git_mode != new_side->git_mode) {
    *out += "old mode " + ModeText(old_side->git_mode) + "\n";
    *out += "new mode " + ModeText(new_side->git_mode) + "\n";
  }
  static const std::string kNoContent;
  const std::string& before = old_side ? old_side->content : kNoContent;
  const std::string& after = new_side ? new_side->content : kNoContent;
  if (before == after) return true;  // a mode change, or an empty file added or deleted
  // Full object ids, as `git diff --full-index`: `git apply` needs them for
  // a binary section and checks the file it patches against them.
  static const std::string kNullId(40, '0');
  *out += "index " + (old_side ? GitBlobId(before) : kNullId) + ".." + (new_side ? GitBlobId(after) : kNullId);
  if (old_side && new_side && old_side->git_mode == new_side->git_mode) *out += " " + ModeText(old_side->git_mode);
  *out += "\n";
  const std::string a_label = old_side ? a : "/dev/null";
  const std::string b_label = new_side ? b : "/dev/null";
  if ((old_side && old_side->binary) || (new_side && new_side->binary)) {
    *out += GitBinaryPatch(before, after);
    return true;
  }
  *out += FileLine("---", a_label);
  *out += FileLine("+++", b_label);
  *out += UnifiedHunks(before, after, 3);
  return true;
}

// ------------------------------------------------------------------ snapshots

Result<Json> CreateSnapshotUnguarded(const LayerStack& stack, const std::string& parent_snapshot_id,
                                     const std::string& dest_dir) {
  const char* stage = "snapshot";
  if (mkdir(dest_dir.c_str(), 0700) != 0) return Status::Errno(stage, "mkdir", dest_dir);
  // A snapshot that fails half-way is removed: without a manifest it would
  // be taken for an interrupted one anyway, but it would hold the space.
  struct Cleanup {
    std::string dir;
    bool armed = true;
    ~Cleanup() {
      if (!armed) return;
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dest_dir};

  const std::string tree = Join(dest_dir, kTreeName);
  if (mkdir(tree.c_str(), 0700) != 0) return Status::Errno(stage, "mkdir", tree);
  TreeCopier::Options options;
  options.stage = stage;
  options.overlay_markers = !stack.copy_mode;
  options.manifest = true;
  options.chown = geteuid() == 0;
  std::vector<std::pair<std::string, Json>> copied;
  if (Status s = CopyInto(stack.upper, tree, options, &copied); !s.ok()) return s;
  std::sort(copied.begin(), copied.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  Json entries = Json::array();
  for (auto& [path, entry] : copied) entries.push_back(std::move(entry));

  Json manifest = {{"version", kSnapshotVersion},
                   {"created", NowRfc3339()},
                   {"parent", parent_snapshot_id},
                   {"mode", stack.copy_mode ? "copy" : "overlay"},
                   {"entries", std::move(entries)}};
  // Strict: every string in the manifest is UTF-8 (PutBytes), and one that
  // is not must fail the snapshot rather than be stored altered.
  std::string text;
  try {
    text = manifest.dump();
  } catch (const Json::exception& e) {
    return Status::Error(stage, "snapshot " + dest_dir + ": " + kManifestName + " cannot be written: " + e.what());
  }
  if (Status s = WriteFileDurably(dest_dir, kManifestName, text, stage); !s.ok()) return s;
  std::string parent_dir = std::filesystem::path(dest_dir).lexically_normal().parent_path().string();
  if (Status s = FsyncPath(parent_dir.empty() ? "." : parent_dir, stage); !s.ok()) return s;
  cleanup.armed = false;
  return manifest;
}

Result<Json> ReadSnapshotManifestUnguarded(const std::string& dir) {
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::Error("not_found", "snapshot " + dir + " not found");
  }
  const std::string path = Join(dir, kManifestName);
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) {
      return Status::Error("not_found", "snapshot " + dir + " has no " + kManifestName +
                                            " (not a snapshot, or one interrupted while it was taken)");
    }
    return Status::Errno("snapshot", "open", path);
  }
  auto text = ReadUpTo(fd.get(), static_cast<std::size_t>(-1), path, "snapshot");
  if (!text.ok()) return text.status();
  Json manifest = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  auto corrupt = [&](const std::string& why) {
    return Status::Error("snapshot", "snapshot " + dir + " is corrupt: " + kManifestName + ": " + why);
  };
  if (manifest.is_discarded()) return corrupt("not valid JSON");
  if (!manifest.is_object()) return corrupt("not a JSON object");
  auto version = manifest.find("version");
  if (version == manifest.end() || !version->is_number_integer() || *version != kSnapshotVersion) {
    return corrupt("version is not " + std::to_string(kSnapshotVersion));
  }
  auto entries = manifest.find("entries");
  if (entries == manifest.end() || !entries->is_array()) return corrupt("no \"entries\" array");
  for (const char* key : {"parent", "mode", "created"}) {
    auto it = manifest.find(key);
    if (it == manifest.end() || !it->is_string()) return corrupt(std::string("\"") + key + "\" is not a string");
  }
  for (const Json& e : *entries) {
    auto field = [&](const char* key) -> const Json* {
      auto it = e.find(key);
      return it == e.end() ? nullptr : &*it;
    };
    const std::optional<std::string> p = GetBytes(e, "path");
    const Json* t = e.is_object() ? field("type") : nullptr;
    if (!p || !t || !t->is_string()) return corrupt("an entry without path or type");
    const std::string& type = t->get_ref<const std::string&>();
    bool ok = true;
    if (type == "file") {
      const Json* size = field("size");
      const Json* sha = field("sha256");
      const Json* mode = field("mode");
      ok = size && size->is_number_unsigned() && sha && sha->is_string() && mode && mode->is_string();
    } else if (type == "dir") {
      const Json* mode = field("mode");
      const Json* opaque = field("opaque");
      ok = mode && mode->is_string() && opaque && opaque->is_boolean();
    } else if (type == "symlink") {
      ok = GetBytes(e, "target").has_value();
    } else {
      ok = type == "whiteout";
    }
    if (!ok) return corrupt("malformed entry for " + Utf8Lossy(*p));
  }
  return manifest;
}

Status VerifySnapshotUnguarded(const std::string& dir) {
  auto manifest = ReadSnapshotManifestUnguarded(dir);
  if (!manifest.ok()) return manifest.status();
  const std::string tree = Join(dir, kTreeName);
  std::vector<std::string> problems;
  auto problem = [&](const std::string& path, const std::string& why) {
    problems.push_back(Utf8Lossy(path) + ": " + why);
  };

  std::map<std::string, const Json*> expected;
  for (const Json& e : (*manifest)["entries"]) {
    const std::string path = *GetBytes(e, "path");  // checked by ReadSnapshotManifest
    if (!expected.emplace(path, &e).second) problem(path, "listed twice in the manifest");
  }

  UniqueFd root(open(tree.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!root.valid()) return Status::Error("snapshot", "snapshot " + dir + " is corrupt: " + kTreeName + ": missing");
  std::set<std::string> all;
  if (Status s = CollectPaths(root.get(), tree, "", GitDirs::kInclude, "snapshot", &all); !s.ok()) return s;

  for (const std::string& path : all) {
    if (expected.find(path) == expected.end()) problem(path, "not in the manifest");
  }
  for (const auto& [path, entry] : expected) {
    const Json& e = *entry;
    const std::string& type = e["type"].get_ref<const std::string&>();
    struct stat st {};
    UniqueFd fd(OpenBeneath(root.get(), path, O_PATH));
    if (!fd.valid() || fstat(fd.get(), &st) != 0) {
      problem(path, "missing");
      continue;
    }
    const char* actual = S_ISREG(st.st_mode)   ? "file"
                         : S_ISDIR(st.st_mode) ? "dir"
                         : S_ISLNK(st.st_mode) ? "symlink"
                         : IsWhiteout(st)      ? "whiteout"
                                               : "special file";
    if (type != actual) {
      problem(path, std::string("is a ") + actual + ", the manifest says " + type);
      continue;
    }
    if ((type == "file" || type == "dir") && Octal(st.st_mode) != e["mode"].get<std::string>()) {
      problem(path, "mode " + Octal(st.st_mode) + ", the manifest says " + e["mode"].get<std::string>());
      continue;
    }
    if (type == "file") {
      std::uint64_t size = e["size"].get<std::uint64_t>();
      if (static_cast<std::uint64_t>(st.st_size) != size) {
        problem(path, "size " + std::to_string(st.st_size) + ", the manifest says " + std::to_string(size));
        continue;
      }
      UniqueFd data(OpenBeneath(root.get(), path, O_RDONLY | O_NONBLOCK));
      if (!data.valid()) return Status::Errno("snapshot", "open", Join(tree, path));
      auto sha = Sha256OfFile(data.get(), static_cast<std::size_t>(st.st_size), Join(tree, path), "snapshot");
      if (!sha.ok()) return sha.status();
      if (*sha != e["sha256"].get<std::string>()) problem(path, "checksum mismatch");
    } else if (type == "dir") {
      UniqueFd d(OpenBeneath(root.get(), path, O_RDONLY | O_DIRECTORY));
      if (d.valid() && IsOpaque(d.get()) != e["opaque"].get<bool>()) {
        problem(path, e["opaque"].get<bool>() ? "opaque mark missing" : "unexpected opaque mark");
      }
    } else if (type == "symlink") {
      auto target = ReadLinkAt(fd.get(), "", Join(tree, path), "snapshot");
      if (!target.ok()) return target.status();
      if (*target != *GetBytes(e, "target")) problem(path, "symlink target differs from the manifest");
    }
  }
  if (problems.empty()) return {};
  std::sort(problems.begin(), problems.end());
  std::string message = "snapshot " + dir + " is corrupt: " + problems.front();
  if (problems.size() > 1) message += " (and " + std::to_string(problems.size() - 1) + " more)";
  return Status::Error("snapshot", message);
}

Status CopyTreeUnguarded(const std::string& from, const std::string& to) {
  if (mkdir(to.c_str(), 0700) != 0 && errno != EEXIST) return Status::Errno("copy", "mkdir", to);
  TreeCopier::Options options;
  options.stage = "copy";
  options.chown = geteuid() == 0;
  return CopyInto(from, to, options, nullptr);
}

// ------------------------------------------------------------------ diff

// A .gitignore or exclude file larger than this is refused, not truncated.
constexpr std::size_t kMaxIgnoreFileBytes = 1 << 20;

// The views a diff compares and the paths that can differ between them.
struct Candidates {
  // Held by pointer: the ignore rules' loader refers to them.
  std::unique_ptr<LayeredView> merged;
  std::unique_ptr<LayeredView> base;
  std::unique_ptr<IgnoreRules> ignore;
  std::set<std::string> paths;
};

// A small regular file of `view` ("" when it is not one). Read errors are
// thrown (the callers are Guarded): an unreadable .gitignore fails the diff
// rather than widen it.
std::string ReadSmallFile(LayeredView& view, const std::string& rel) {
  Node node = view.Lookup(rel);
  if (node.kind != Kind::kFile) return "";
  const std::string path = Join(view.root(node.layer), rel);
  UniqueFd fd(view.OpenNode(node, rel));
  if (!fd.valid()) {
    if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) return "";
    throw std::runtime_error(Status::Errno("diff", "open", path).message());
  }
  auto data = ReadUpTo(fd.get(), kMaxIgnoreFileBytes + 1, path, "diff");
  if (!data.ok()) throw std::runtime_error(data.status().message());
  if (data->size() > kMaxIgnoreFileBytes) {
    throw std::runtime_error(path + ": larger than " + std::to_string(kMaxIgnoreFileBytes) + " bytes");
  }
  return std::move(*data);
}

Result<Candidates> CollectCandidates(const LayerStack& stack, const DiffOptions& options) {
  Candidates c;
  std::vector<std::string> merged_roots;
  merged_roots.push_back(stack.upper);
  if (!stack.copy_mode) {
    merged_roots.insert(merged_roots.end(), stack.lowers.begin(), stack.lowers.end());
    merged_roots.push_back(stack.base);
  }
  auto merged = LayeredView::Open(merged_roots);
  if (!merged.ok()) return merged.status();
  c.merged = std::make_unique<LayeredView>(std::move(*merged));
  auto base = LayeredView::Open({stack.base});
  if (!base.ok()) return base.status();
  c.base = std::make_unique<LayeredView>(std::move(*base));
  LayeredView& m = *c.merged;
  LayeredView& b = *c.base;
  if (!options.all) {
    // The session's .gitignore files decide; a directory it deleted keeps
    // the base's, so that its deleted contents are judged as git would.
    auto loader = [&m, &b](const std::string& dir) -> std::optional<std::string> {
      LayeredView& view = m.Lookup(dir).kind == Kind::kDir ? m : b;
      return ReadSmallFile(view, Join(dir, ".gitignore"));
    };
    c.ignore = std::make_unique<IgnoreRules>(loader, ReadSmallFile(b, ".git/info/exclude"), options.exclude);
  }
  IgnoreRules* ignore = c.ignore.get();

  // The paths that can differ: everything in the layers above the base
  // (the copy, in copy mode, and the base too).
  std::set<std::string>& paths = c.paths;
  const int scanned = stack.copy_mode ? 1 : m.layers() - 1;
  for (int layer = 0; layer < scanned; ++layer) {
    Status s = CollectPaths(m.root_fd(layer), m.root(layer), "", GitDirs::kSkip, "diff", &paths, ignore);
    if (!s.ok()) return s;
  }
  if (stack.copy_mode) {
    Status s = CollectPaths(b.root_fd(0), b.root(0), "", GitDirs::kSkip, "diff", &paths, ignore);
    if (!s.ok()) return s;
  } else {
    // A base directory that the merged view no longer shows whole (deleted,
    // replaced, made opaque) loses what is below it: look there too.
    const int base_layer = m.layers() - 1;
    std::set<std::string> hidden;
    for (const std::string& path : paths) {
      if (b.Lookup(path).kind != Kind::kDir) continue;
      const std::vector<int>& layers = m.DirLayers(path);
      if (std::find(layers.begin(), layers.end(), base_layer) != layers.end()) continue;
      Status s = CollectPaths(b.root_fd(0), b.root(0), path, GitDirs::kSkip, "diff", &hidden, ignore);
      if (!s.ok()) return s;
    }
    paths.insert(hidden.begin(), hidden.end());
  }
  return c;
}

Result<Json> ComputeDiffUnguarded(const LayerStack& stack, const DiffOptions& options) {
  const std::size_t max_patch_bytes = options.max_patch_bytes;
  const std::size_t max_files = options.max_files;
  auto candidates = CollectCandidates(stack, options);
  if (!candidates.ok()) return candidates.status();
  LayeredView* merged = candidates->merged.get();
  LayeredView* base = candidates->base.get();
  const std::set<std::string>& paths = candidates->paths;

  Json files = Json::array();
  std::string patch;
  bool truncated = false;
  bool files_truncated = false;
  for (const std::string& path : paths) {
    Node after_node = merged->Lookup(path);
    Node before_node = base->Lookup(path);
    auto after = ReadSide(*merged, after_node, path, max_patch_bytes);
    if (!after.ok()) return after.status();
    auto before = ReadSide(*base, before_node, path, max_patch_bytes);
    if (!before.ok()) return before.status();
    if (!after->tracked && !before->tracked) continue;

    const char* status = nullptr;
    std::string section;
    bool complete = true;
    if (!before->tracked) {
      status = "added";
      complete = AppendSection(&section, path, nullptr, &*after);
    } else if (!after->tracked) {
      status = "deleted";
      complete = AppendSection(&section, path, &*before, nullptr);
    } else if (before->symlink != after->symlink) {
      // A file became a symlink or back: git writes a deletion and an addition.
      status = "modified";
      complete = AppendSection(&section, path, &*before, nullptr) && AppendSection(&section, path, nullptr, &*after);
    } else {
      bool same_content;
      if (before->loaded && after->loaded) {
        same_content = before->content == after->content;
      } else if (before->size != after->size) {
        same_content = false;
      } else {
        auto same = SameContent(*base, before_node, *merged, after_node, path);
        if (!same.ok()) return same.status();
        same_content = *same;
      }
      if (same_content && before->git_mode == after->git_mode) continue;  // copied up, not changed
      status = "modified";
      if (same_content) {
        // A mode change alone needs no content.
        Side b = *before, a = *after;
        b.content.clear();
        a.content.clear();
        b.loaded = a.loaded = true;
        AppendSection(&section, path, &b, &a);
      } else {
        complete = AppendSection(&section, path, &*before, &*after);
      }
    }
    // A path that is not UTF-8 is listed readable ("path", with U+FFFD for
    // the bytes that are not UTF-8) and exact ("path_hex").
    if (files.size() >= max_files) {  // one changed path too many: the rest is left out
      files_truncated = truncated = true;
      break;
    }
    Json file = {{"path", Utf8Lossy(path)}, {"status", status}, {"binary", before->binary || after->binary}};
    if (!IsUtf8(path)) file["path_hex"] = Hex(path);
    files.push_back(std::move(file));
    if (truncated) continue;
    if (!complete || patch.size() + section.size() > max_patch_bytes) {
      truncated = true;
      continue;
    }
    patch += section;
  }
  return Json{{"files", std::move(files)},
              {"patch", std::move(patch)},
              {"truncated", truncated},
              {"files_truncated", files_truncated}};
}

// ------------------------------------------------------------------ apply

// A base entry's identity: what tells that it changed since it was recorded.
struct BaseId {
  char type = 0;  // f file, l symlink, d directory, o anything else; 0 absent
  unsigned mode = 0;
  std::uint64_t size = 0, mtime_ns = 0, ctime_ns = 0, ino = 0;

  static BaseId Of(const struct stat& st) {
    BaseId id;
    id.type = S_ISREG(st.st_mode) ? 'f' : S_ISLNK(st.st_mode) ? 'l' : S_ISDIR(st.st_mode) ? 'd' : 'o';
    id.mode = st.st_mode & 07777;
    id.size = static_cast<std::uint64_t>(st.st_size);
    id.mtime_ns = static_cast<std::uint64_t>(st.st_mtim.tv_sec) * 1000000000u + st.st_mtim.tv_nsec;
    id.ctime_ns = static_cast<std::uint64_t>(st.st_ctim.tv_sec) * 1000000000u + st.st_ctim.tv_nsec;
    id.ino = st.st_ino;
    return id;
  }
  // A directory changes with every entry made in it: only its type counts.
  bool Same(const BaseId& o) const {
    if (type != o.type) return false;
    if (type == 'd' || type == 0) return true;
    return mode == o.mode && size == o.size && mtime_ns == o.mtime_ns && ctime_ns == o.ctime_ns && ino == o.ino;
  }
};

using BaseRecord = std::map<std::string, BaseId>;

// The base entry at `rel` now, without following a symlink on the way (a
// symlink in between is "o": it is not what the session saw).
BaseId CurrentId(int base_fd, const std::string& rel) {
  UniqueFd fd(OpenBeneath(base_fd, rel, O_PATH));
  struct stat st {};
  if (!fd.valid()) {
    BaseId id;
    if (errno != ENOENT && errno != ENOTDIR) id.type = 'o';
    return id;
  }
  if (fstat(fd.get(), &st) != 0) return BaseId{'o'};
  return BaseId::Of(st);
}

Status RecordWalk(int dir_fd, const std::string& root, const std::string& rel, const std::vector<std::string>& skip,
                  BaseRecord* out) {
  auto names = ListNames(dir_fd, Join(root, rel), "session");
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    if (name == ".git") continue;
    // agentbox's own state (a workspace that holds the home holds it):
    // never inside a sandbox, so never among a session's changes.
    if (std::find(skip.begin(), skip.end(), Join(root, Join(rel, name))) != skip.end()) continue;
    struct stat st {};
    if (fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      return Status::Errno("session", "fstatat", Join(root, Join(rel, name)));
    }
    const std::string child = Join(rel, name);
    (*out)[child] = BaseId::Of(st);
    if (S_ISDIR(st.st_mode)) {
      UniqueFd sub(openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      // One the user cannot open is one the sandbox cannot change either.
      if (!sub.valid() && errno == EACCES) continue;
      if (!sub.valid()) return Status::Errno("session", "open", Join(root, child));
      if (Status s = RecordWalk(sub.get(), root, child, skip, out); !s.ok()) return s;
    }
  }
  return {};
}

// One line per entry: "<type> <mode> <size> <mtime_ns> <ctime_ns> <ino> <hex path>".
std::string FormatRecord(const BaseRecord& record) {
  std::string out;
  char buf[128];
  for (const auto& [path, id] : record) {
    std::snprintf(buf, sizeof(buf), "%c %o %llu %llu %llu %llu ", id.type, id.mode,
                  static_cast<unsigned long long>(id.size), static_cast<unsigned long long>(id.mtime_ns),
                  static_cast<unsigned long long>(id.ctime_ns), static_cast<unsigned long long>(id.ino));
    out += buf;
    out += Hex(path);
    out += '\n';
  }
  return out;
}

Status WriteRecord(const std::string& dest_file, const BaseRecord& record) {
  const std::size_t slash = dest_file.rfind('/');
  if (slash == std::string::npos) return Status::Error("session", "base record " + dest_file + ": not absolute");
  return WriteFileDurably(slash == 0 ? "/" : dest_file.substr(0, slash), dest_file.substr(slash + 1),
                          FormatRecord(record), "session");
}

Status RecordBaseUnguarded(const std::string& base, const std::string& dest_file,
                           const std::vector<std::string>& skip) {
  UniqueFd root(open(base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return Status::Errno("session", "open", base);
  BaseRecord record;
  if (Status s = RecordWalk(root.get(), base, "", skip, &record); !s.ok()) return s;
  return WriteRecord(dest_file, record);
}

Result<BaseRecord> ReadRecord(const std::string& file) {
  UniqueFd fd(open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) {
      return Status::Error("conflict", "the session has no record of the base it started from (" + file +
                                           " is missing: sessions created before apply existed have none)");
    }
    return Status::Errno("apply", "open", file);
  }
  auto text = ReadUpTo(fd.get(), std::numeric_limits<std::size_t>::max(), file, "apply");
  if (!text.ok()) return text.status();
  BaseRecord record;
  std::size_t start = 0, line_no = 0;
  while (start < text->size()) {
    std::size_t nl = text->find('\n', start);
    if (nl == std::string::npos) nl = text->size();
    const std::string line = text->substr(start, nl - start);
    start = nl + 1;
    ++line_no;
    BaseId id;
    unsigned long long size = 0, mtime = 0, ctime = 0, ino = 0;
    char hex[PATH_MAX * 2 + 2];
    if (line.size() > sizeof(hex) + 100 ||
        std::sscanf(line.c_str(), "%c %o %llu %llu %llu %llu %8193s", &id.type, &id.mode, &size, &mtime, &ctime,
                    &ino, hex) != 7) {
      return Status::Error("apply", file + ":" + std::to_string(line_no) + ": malformed base record line");
    }
    auto path = Unhex(hex);
    if (!path) return Status::Error("apply", file + ":" + std::to_string(line_no) + ": malformed path");
    id.size = size;
    id.mtime_ns = mtime;
    id.ctime_ns = ctime;
    id.ino = ino;
    record[*path] = id;
  }
  return record;
}

bool Tracked(const Node& n) { return n.kind == Kind::kFile || n.kind == Kind::kSymlink; }

bool Below(const std::string& path, const std::string& dir) {
  return dir.empty() || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/');
}

// A bare repository as git finds one: HEAD, objects/ and refs/.
bool IsBareRepo(LayeredView& view, const std::string& dir) {
  return view.Lookup(Join(dir, "HEAD")).kind == Kind::kFile &&
         view.Lookup(Join(dir, "objects")).kind == Kind::kDir && view.Lookup(Join(dir, "refs")).kind == Kind::kDir;
}

bool IsProtected(const std::string& path, const std::vector<std::string>& protect, LayeredView& merged,
                 LayeredView& base) {
  for (const std::string& p : protect) {
    if (path == p || Below(path, p) || Below(p, path)) return true;
  }
  // The hooks and config of a bare repository (git runs them on the host).
  std::size_t at = 0;
  for (;;) {
    const std::string dir = at == 0 ? "" : path.substr(0, at - 1);
    const std::string rest = path.substr(at);
    if ((rest == "config" || rest.rfind("hooks/", 0) == 0) && (IsBareRepo(merged, dir) || IsBareRepo(base, dir))) {
      return true;
    }
    std::size_t slash = path.find('/', at);
    if (slash == std::string::npos) return false;
    at = slash + 1;
  }
}

struct Change {
  std::string path;
  const char* status = nullptr;
  Node after, before;
};

Result<bool> Unchanged(LayeredView& merged, const Node& after, LayeredView& base, const Node& before,
                       const std::string& rel) {
  if (after.kind != before.kind) return false;
  if (after.kind == Kind::kSymlink) {
    auto a = ReadSide(merged, after, rel, std::numeric_limits<std::size_t>::max());
    if (!a.ok()) return a.status();
    auto b = ReadSide(base, before, rel, std::numeric_limits<std::size_t>::max());
    if (!b.ok()) return b.status();
    return a->content == b->content;
  }
  if ((after.st.st_mode & S_IXUSR) != (before.st.st_mode & S_IXUSR)) return false;
  if (after.st.st_size != before.st.st_size) return false;
  return SameContent(base, before, merged, after, rel);
}

std::pair<std::string, std::string> SplitParent(const std::string& rel) {
  std::size_t slash = rel.rfind('/');
  if (slash == std::string::npos) return {"", rel};
  return {rel.substr(0, slash), rel.substr(slash + 1)};
}

// Steps taken on the base, undone in reverse when a later one fails.
class Undo {
 public:
  void Add(std::function<void()> step) { steps_.push_back(std::move(step)); }
  void Run() {
    for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) (*it)();
    steps_.clear();
  }
  void Forget() { steps_.clear(); }

 private:
  std::vector<std::function<void()>> steps_;
};

Result<Json> ApplyChangesUnguarded(const LayerStack& stack, const ApplyOptions& options) {
  const char* stage = "apply";
  auto record = ReadRecord(options.base_record);
  if (!record.ok()) return record.status();
  auto candidates = CollectCandidates(stack, options.diff);
  if (!candidates.ok()) return candidates.status();
  LayeredView& merged = *candidates->merged;
  LayeredView& base = *candidates->base;
  const int base_fd = base.root_fd(0);

  std::vector<Change> changes;
  std::vector<std::string> removed_dirs;  // base directories the merged view no longer has as directories
  for (const std::string& path : candidates->paths) {
    Change c{path, nullptr, merged.Lookup(path), base.Lookup(path)};
    if (c.before.kind == Kind::kDir && c.after.kind != Kind::kDir) removed_dirs.push_back(path);
    if (!Tracked(c.after) && !Tracked(c.before)) continue;
    if (Tracked(c.after) && Tracked(c.before)) {
      auto same = Unchanged(merged, c.after, base, c.before, path);
      if (!same.ok()) return same.status();
      if (*same) continue;
    }
    c.status = !Tracked(c.before) ? "added" : !Tracked(c.after) ? "deleted" : "modified";
    changes.push_back(std::move(c));
  }

  // Refusals first: nothing is written unless every change may be.
  std::set<std::string> conflicts, refused;
  auto check = [&](const std::string& rel) {
    auto it = record->find(rel);
    const BaseId then = it == record->end() ? BaseId{} : it->second;
    if (!then.Same(CurrentId(base_fd, rel))) conflicts.insert(rel);
  };
  for (const Change& c : changes) {
    if (IsProtected(c.path, options.protect, merged, base)) refused.insert(c.path);
    check(c.path);
    for (std::size_t slash = c.path.find('/'); slash != std::string::npos; slash = c.path.find('/', slash + 1)) {
      check(c.path.substr(0, slash));
    }
  }
  auto utf8_list = [](const std::set<std::string>& paths) {
    Json list = Json::array();
    for (const std::string& p : paths) list.push_back(Utf8Lossy(p));
    return list;
  };
  if (!conflicts.empty() || !refused.empty()) {
    return Json{{"applied", Json::array()},
                {"files", Json::array()},
                {"conflicts", utf8_list(conflicts)},
                {"protected", utf8_list(refused)}};
  }

  // Stage every new file and symlink beside the base.
  std::string stage_dir = Join(stack.base, ".agentbox-apply-XXXXXX");
  if (mkdtemp(stage_dir.data()) == nullptr) return Status::Errno(stage, "mkdtemp", stage_dir);
  UniqueFd stage_fd(open(stage_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct StageCleanup {
    const std::string& dir;
    int fd;
    ~StageCleanup() {
      if (fd >= 0) {
        auto names = ListNames(fd, dir, "apply");
        if (names.ok()) {
          for (const std::string& n : *names) unlinkat(fd, n.c_str(), 0);
        }
      }
      rmdir(dir.c_str());
    }
  } cleanup{stage_dir, stage_fd.get()};
  if (!stage_fd.valid()) return Status::Errno(stage, "open", stage_dir);
  const bool as_root = geteuid() == 0;
  // For syncfs at the end (the views' descriptors are O_PATH).
  UniqueFd base_dir(open(stack.base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!base_dir.valid()) return Status::Errno(stage, "open", stack.base);

  for (std::size_t i = 0; i < changes.size(); ++i) {
    const Change& c = changes[i];
    if (!Tracked(c.after)) continue;
    const std::string name = "n" + std::to_string(i);
    const std::string src_path = Join(merged.root(c.after.layer), c.path);
    UniqueFd src(merged.OpenNode(c.after, c.path));
    if (!src.valid()) return Status::Errno(stage, "open", src_path);
    if (c.after.kind == Kind::kSymlink) {
      auto target = ReadLinkAt(src.get(), "", src_path, stage);
      if (!target.ok()) return target.status();
      if (symlinkat(target->c_str(), stage_fd.get(), name.c_str()) != 0) {
        return Status::Errno(stage, "symlinkat", Join(stage_dir, name));
      }
      continue;
    }
    struct stat st {};
    if (fstat(src.get(), &st) != 0) return Status::Errno(stage, "fstat", src_path);
    UniqueFd out(openat(stage_fd.get(), name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!out.valid()) return Status::Errno(stage, "open", Join(stage_dir, name));
    if (Status s = CopyData(src.get(), out.get(), src_path, stage); !s.ok()) return s;
    if (fchmod(out.get(), st.st_mode & 0777) != 0) return Status::Errno(stage, "fchmod", Join(stage_dir, name));
    if (fdatasync(out.get()) != 0) return Status::Errno(stage, "fdatasync", Join(stage_dir, name));
  }

  Undo undo;
  auto fail = [&](Status s) {
    undo.Run();
    return s;
  };
  auto open_dir = [&](const std::string& rel) { return OpenBeneath(base_fd, rel, O_RDONLY | O_DIRECTORY); };

  // 1. Every base file or symlink replaced or deleted goes into the staging directory.
  for (std::size_t i = 0; i < changes.size(); ++i) {
    const Change& c = changes[i];
    if (!Tracked(c.before)) continue;
    auto [parent, leaf] = SplitParent(c.path);
    auto dir = std::make_shared<UniqueFd>(open_dir(parent));
    if (!dir->valid()) return fail(Status::Errno(stage, "open", Join(stack.base, parent)));
    const std::string backup = "b" + std::to_string(i);
    if (renameat(dir->get(), leaf.c_str(), stage_fd.get(), backup.c_str()) != 0) {
      return fail(Status::Errno(stage, "rename", Join(stack.base, c.path)));
    }
    undo.Add([dir, leaf, backup, sfd = stage_fd.get()] { renameat(sfd, backup.c_str(), dir->get(), leaf.c_str()); });
  }
  // 2. Directories the session removed or replaced, deepest first, when now
  // empty (ignored files may keep one).
  std::vector<std::string> dirs_removed;
  for (auto it = removed_dirs.rbegin(); it != removed_dirs.rend(); ++it) {
    auto [parent, leaf] = SplitParent(*it);
    auto dir = std::make_shared<UniqueFd>(open_dir(parent));
    if (!dir->valid()) continue;  // its parent went with it
    struct stat st {};
    if (fstatat(dir->get(), leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) continue;
    if (unlinkat(dir->get(), leaf.c_str(), AT_REMOVEDIR) != 0) {
      if (errno == ENOTEMPTY || errno == EEXIST) continue;
      return fail(Status::Errno(stage, "rmdir", Join(stack.base, *it)));
    }
    dirs_removed.push_back(*it);
    const mode_t mode = st.st_mode & 07777;
    const uid_t uid = st.st_uid;
    const gid_t gid = st.st_gid;
    undo.Add([dir, leaf, mode, uid, gid, as_root] {
      if (mkdirat(dir->get(), leaf.c_str(), mode) == 0 && as_root) {
        (void)fchownat(dir->get(), leaf.c_str(), uid, gid, AT_SYMLINK_NOFOLLOW);
      }
    });
  }
  // 3. New contents into place, creating the directories they need.
  std::vector<std::string> dirs_made;
  auto make_parents = [&](const std::string& rel) -> Status {
    std::size_t slash = 0;
    while ((slash = rel.find('/', slash)) != std::string::npos) {
      const std::string prefix = rel.substr(0, slash++);
      UniqueFd existing(open_dir(prefix));
      if (existing.valid()) continue;
      if (errno != ENOENT) return Status::Errno(stage, "open", Join(stack.base, prefix));
      auto [parent, leaf] = SplitParent(prefix);
      auto dir = std::make_shared<UniqueFd>(open_dir(parent));
      if (!dir->valid()) return Status::Errno(stage, "open", Join(stack.base, parent));
      mode_t mode = 0755;
      struct stat mst {};
      for (int layer : merged.DirLayers(prefix)) {
        UniqueFd fd(OpenBeneath(merged.root_fd(layer), prefix, O_PATH));
        if (fd.valid() && fstat(fd.get(), &mst) == 0) {
          mode = mst.st_mode & 0777;
          break;
        }
      }
      if (mkdirat(dir->get(), leaf.c_str(), mode) != 0) return Status::Errno(stage, "mkdir", Join(stack.base, prefix));
      undo.Add([dir, leaf] { unlinkat(dir->get(), leaf.c_str(), AT_REMOVEDIR); });
      dirs_made.push_back(prefix);
      struct stat pst {};
      if (as_root && fstat(dir->get(), &pst) == 0) (void)fchownat(dir->get(), leaf.c_str(), pst.st_uid, pst.st_gid, AT_SYMLINK_NOFOLLOW);
    }
    return {};
  };
  std::vector<std::string> applied;
  Json files = Json::array();
  for (std::size_t i = 0; i < changes.size(); ++i) {
    const Change& c = changes[i];
    applied.push_back(c.path);
    files.push_back({{"path", Utf8Lossy(c.path)}, {"status", c.status}});
    if (!Tracked(c.after)) continue;
    if (Status s = make_parents(c.path); !s.ok()) return fail(s);
    auto [parent, leaf] = SplitParent(c.path);
    auto dir = std::make_shared<UniqueFd>(open_dir(parent));
    if (!dir->valid()) return fail(Status::Errno(stage, "open", Join(stack.base, parent)));
    const std::string name = "n" + std::to_string(i);
    if (as_root) {
      // The owner of the file replaced, or of the directory it goes in.
      struct stat owner {};
      if (Tracked(c.before)) {
        owner = c.before.st;
      } else {
        fstat(dir->get(), &owner);
      }
      (void)fchownat(stage_fd.get(), name.c_str(), owner.st_uid, owner.st_gid, AT_SYMLINK_NOFOLLOW);
    }
    if (renameat2(stage_fd.get(), name.c_str(), dir->get(), leaf.c_str(), RENAME_NOREPLACE) != 0) {
      return fail(Status::Errno(stage, "rename", Join(stack.base, c.path)));
    }
    undo.Add([dir, leaf, name, sfd = stage_fd.get()] { renameat(dir->get(), leaf.c_str(), sfd, name.c_str()); });
  }
  undo.Forget();
  if (syncfs(base_dir.get()) != 0) {
    return Status::Error(stage, "the changes are in " + stack.base + " but flushing them failed: syncfs: " +
                                    std::strerror(errno));
  }

  // The base now holds these: later changes to them are based on this.
  for (const std::string& p : applied) {
    BaseId now = CurrentId(base_fd, p);
    if (now.type == 0) {
      record->erase(p);
    } else {
      (*record)[p] = now;
    }
  }
  for (const std::string& d : dirs_removed) record->erase(d);
  for (const std::string& d : dirs_made) (*record)[d] = CurrentId(base_fd, d);
  if (Status s = WriteRecord(options.base_record, *record); !s.ok()) return s;

  return Json{{"applied", utf8_list(std::set<std::string>(applied.begin(), applied.end()))},
              {"files", std::move(files)},
              {"conflicts", Json::array()},
              {"protected", Json::array()}};
}

// Runs `f`, turning any exception (a JSON error, memory exhausted) into an
// error of `stage` naming `what`: no exception leaves this module.
template <typename F>
auto Guarded(const char* stage, const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    return Status::Error(stage, Utf8Lossy(what) + ": " + e.what());
  }
}

}  // namespace

Result<Json> CreateSnapshot(const LayerStack& stack, const std::string& parent_snapshot_id,
                            const std::string& dest_dir) {
  return Guarded("snapshot", "snapshot " + dest_dir + " of " + stack.upper,
                 [&] { return CreateSnapshotUnguarded(stack, parent_snapshot_id, dest_dir); });
}

Result<Json> ReadSnapshotManifest(const std::string& dir) {
  return Guarded("snapshot", "snapshot " + dir, [&] { return ReadSnapshotManifestUnguarded(dir); });
}

Status VerifySnapshot(const std::string& dir) {
  return Guarded("snapshot", "snapshot " + dir, [&] { return VerifySnapshotUnguarded(dir); });
}

Status CopyTree(const std::string& from, const std::string& to) {
  return Guarded("copy", "copy of " + from + " to " + to, [&] { return CopyTreeUnguarded(from, to); });
}

Status CopyUpperTree(const std::string& from, const std::string& to) {
  return Guarded("copy", "copy of " + from + " to " + to, [&]() -> Status {
    if (mkdir(to.c_str(), 0700) != 0) return Status::Errno("copy", "mkdir", to);
    TreeCopier::Options options;
    options.stage = "copy";
    options.overlay_markers = true;
    options.chown = geteuid() == 0;
    return CopyInto(from, to, options, nullptr);
  });
}

Status CopyUpperLayer(int from_dir, int to_dir) {
  return Guarded("copy", "copy of the earlier world's upper layer", [&]() -> Status {
    TreeCopier::Options options;
    options.stage = "copy";
    options.overlay_markers = true;
    options.chown = true;  // inside the session's user namespace: the ids it maps
    TreeCopier copier(options, "upper", "upper");
    if (Status s = copier.CopyContents(from_dir, to_dir, ""); !s.ok()) return s;
    struct stat st {};
    if (fstat(from_dir, &st) != 0) return Status::Errno("copy", "fstat", "upper");
    if (IsOpaque(from_dir) && fsetxattr(to_dir, kOpaqueXattr, "y", 1, 0) != 0) {
      return Status::Errno("copy", std::string("setxattr ") + kOpaqueXattr, "upper");
    }
    if (fchmod(to_dir, KeptMode(st)) != 0) return Status::Errno("copy", "fchmod", "upper");
    struct timespec times[2] = {st.st_atim, st.st_mtim};
    if (futimens(to_dir, times) != 0) return Status::Errno("copy", "futimens", "upper");
    return {};
  });
}

Result<Json> ComputeDiff(const LayerStack& stack, const DiffOptions& options) {
  return Guarded("diff", stack.upper, [&] { return ComputeDiffUnguarded(stack, options); });
}

Result<Json> ComputeDiff(const LayerStack& stack, std::size_t max_patch_bytes, std::size_t max_files) {
  DiffOptions options;
  options.max_patch_bytes = max_patch_bytes;
  options.max_files = max_files;
  return ComputeDiff(stack, options);
}

Status RecordBase(const std::string& base, const std::string& dest_file, const std::vector<std::string>& skip) {
  return Guarded("session", base, [&] { return RecordBaseUnguarded(base, dest_file, skip); });
}

Result<Json> ApplyChanges(const LayerStack& stack, const ApplyOptions& options) {
  return Guarded("apply", stack.base, [&] { return ApplyChangesUnguarded(stack, options); });
}

std::string NowRfc3339() {
  std::time_t now = std::time(nullptr);
  struct tm tm {};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace agentbox::session
