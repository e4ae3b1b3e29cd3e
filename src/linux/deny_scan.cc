#include "linux/deny_scan.h"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "confine/paths.h"
#include "linux/fd.h"
#include "policy/sha256.h"

namespace agentbox::linux {
namespace {

// A deny pattern, compiled for the common case: `**/NAME` (or a bare NAME,
// or `**/NAME/**`, which hides the same files as masking NAME itself) needs
// only the last component, which spares building a path per entry.
struct Matcher {
  std::string pattern;
  bool basename_only = false;
  bool literal = false;
  std::string name;

  explicit Matcher(const std::string& p) : pattern(p) {
    std::string q = p;
    if (!q.empty() && q.back() == '/') q.pop_back();
    if (q.size() > 3 && q.compare(q.size() - 3, 3, "/**") == 0) q.resize(q.size() - 3);
    if (q.rfind("**/", 0) == 0 && q.find('/', 3) == std::string::npos) {
      basename_only = true;
      name = q.substr(3);
    } else if (q.find('/') == std::string::npos) {
      basename_only = true;
      name = q;
    } else {
      pattern = q;
    }
    literal = basename_only && !paths::HasGlob(name);
  }
  bool MatchesName(const char* base) const {
    return literal ? name == base : fnmatch(name.c_str(), base, 0) == 0;
  }
};

struct LinuxDirent64 {
  ino64_t d_ino;
  off64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[];
};

// What one directory held, as far as the deny globs care.
struct DirVerdict {
  std::int64_t mtime_s = 0, mtime_ns = 0;
  // The command can set a directory's mtime back (utimensat) after adding an
  // entry; not its ctime, which every change moves to the current time.
  std::int64_t ctime_s = 0, ctime_ns = 0;
  std::uint64_t ino = 0, dev = 0;
  bool cacheable = false;
  bool visited = false;  // by this scan (not stored)
  std::vector<std::string> subdirs;
  std::vector<std::pair<char, std::string>> matches;  // 'd' dir, 'f' file, 'l' symlink
};

using Cache = std::unordered_map<std::string, DirVerdict>;

constexpr char kMagic[] = "agentbox-deny-scan-2\n";

// Binary, machine-local: length-prefixed fields, every length checked.
class Reader {
 public:
  explicit Reader(const std::string& data) : d_(data) {}
  bool U8(unsigned char* v) { return Raw(v, 1); }
  bool U32(std::uint32_t* v) { return Raw(v, 4); }
  bool U64(std::uint64_t* v) { return Raw(v, 8); }
  bool I64(std::int64_t* v) { return Raw(v, 8); }
  bool Str(std::string* s) {
    std::uint32_t n = 0;
    if (!U32(&n) || n > d_.size() - pos_) return false;
    s->assign(d_, pos_, n);
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == d_.size(); }

 private:
  bool Raw(void* out, size_t n) {
    if (d_.size() - pos_ < n) return false;
    std::memcpy(out, d_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  const std::string& d_;
  size_t pos_ = 0;
};

void PutRaw(std::string* out, const void* p, size_t n) { out->append(static_cast<const char*>(p), n); }
void PutStr(std::string* out, const std::string& s) {
  auto n = static_cast<std::uint32_t>(s.size());
  PutRaw(out, &n, 4);
  out->append(s);
}

// The cache file whole, or "" (a missing or unreadable file is an empty cache).
std::string ReadCacheFile(const std::string& path) {
  std::string data;
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return data;
  char chunk[64 * 1024];
  for (;;) {
    ssize_t n = read(fd.get(), chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    data.append(chunk, static_cast<size_t>(n));
  }
  return data;
}

Cache LoadCache(const std::string& path) {
  Cache cache;
  std::string data = ReadCacheFile(path);
  if (data.compare(0, sizeof(kMagic) - 1, kMagic) != 0) return cache;
  data.erase(0, sizeof(kMagic) - 1);
  Reader r(data);
  while (!r.done()) {
    std::string rel;
    DirVerdict v;
    unsigned char cacheable = 0;
    std::uint32_t nsub = 0, nmatch = 0;
    if (!r.Str(&rel) || !r.I64(&v.mtime_s) || !r.I64(&v.mtime_ns) || !r.I64(&v.ctime_s) || !r.I64(&v.ctime_ns) ||
        !r.U64(&v.ino) || !r.U64(&v.dev) ||
        !r.U8(&cacheable) || !r.U32(&nsub)) {
      return {};
    }
    v.cacheable = cacheable != 0;
    for (std::uint32_t i = 0; i < nsub; ++i) {
      std::string s;
      if (!r.Str(&s)) return {};
      v.subdirs.push_back(std::move(s));
    }
    if (!r.U32(&nmatch)) return {};
    for (std::uint32_t i = 0; i < nmatch; ++i) {
      unsigned char type = 0;
      std::string s;
      if (!r.U8(&type) || !r.Str(&s)) return {};
      v.matches.emplace_back(static_cast<char>(type), std::move(s));
    }
    cache.emplace(std::move(rel), std::move(v));
  }
  return cache;
}

void SaveCache(const std::string& dir, const std::string& path, const Cache& cache) {
  std::string out(kMagic);
  for (const auto& [rel, v] : cache) {
    if (!v.cacheable) continue;
    PutStr(&out, rel);
    PutRaw(&out, &v.mtime_s, 8);
    PutRaw(&out, &v.mtime_ns, 8);
    PutRaw(&out, &v.ctime_s, 8);
    PutRaw(&out, &v.ctime_ns, 8);
    PutRaw(&out, &v.ino, 8);
    PutRaw(&out, &v.dev, 8);
    unsigned char one = 1;
    PutRaw(&out, &one, 1);
    auto nsub = static_cast<std::uint32_t>(v.subdirs.size());
    PutRaw(&out, &nsub, 4);
    for (const auto& s : v.subdirs) PutStr(&out, s);
    auto nmatch = static_cast<std::uint32_t>(v.matches.size());
    PutRaw(&out, &nmatch, 4);
    for (const auto& [type, name] : v.matches) {
      PutRaw(&out, &type, 1);
      PutStr(&out, name);
    }
  }
  // Best effort: a cache that cannot be written only costs the next run time.
  std::string parent = paths::Parent(dir);
  mkdir(paths::Parent(parent).c_str(), 0700);
  mkdir(parent.c_str(), 0700);
  mkdir(dir.c_str(), 0700);
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  bool ok = write(fd, out.data(), out.size()) == static_cast<ssize_t>(out.size());
  close(fd);
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) unlink(tmp.c_str());
}

// getdents64's buffer, one per scan (scans run on several threads at once
// in the daemon).
struct DirentBuffer {
  alignas(8) char bytes[64 * 1024];
};

// Reads one directory's entries and settles its verdict.
void ReadDir(int dirfd, const std::string& rel, const GlobScan& scan, const std::vector<Matcher>& matchers,
             DirentBuffer* buffer, DirVerdict* v, ScanStats* stats) {
  char* buf = buffer->bytes;
  for (;;) {
    long n = syscall(SYS_getdents64, dirfd, buf, sizeof(buffer->bytes));
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      auto* d = reinterpret_cast<LinuxDirent64*>(buf + off);
      off += d->d_reclen;
      const char* name = d->d_name;
      if (name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0))) continue;
      ++stats->entries;
      unsigned char type = d->d_type;
      if (type == DT_UNKNOWN) {
        struct stat st {};
        if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        type = S_ISDIR(st.st_mode) ? DT_DIR : S_ISLNK(st.st_mode) ? DT_LNK : DT_REG;
      }
      // The hot loop: a basename-only pattern needs no path string.
      bool hit = false;
      for (const auto& m : matchers) {
        if (m.basename_only) {
          hit = m.MatchesName(name);
        } else {
          std::string child = rel.empty() ? std::string(name) : rel + "/" + name;
          hit = GlobMatch(m.pattern, scan.pattern_base.empty() ? child : scan.pattern_base + "/" + child);
        }
        if (hit) break;
      }
      if (hit) {
        v->matches.emplace_back(type == DT_DIR ? 'd' : type == DT_LNK ? 'l' : 'f', name);
      } else if (type == DT_DIR) {
        v->subdirs.emplace_back(name);
      }
    }
  }
}

DirStamp StampOf(const struct stat& st) {
  return {st.st_ino, st.st_dev, st.st_mtim.tv_sec, st.st_mtim.tv_nsec, st.st_ctim.tv_sec, st.st_ctim.tv_nsec};
}

// One statx of `rel` below `root` (see the header on why its path walk is
// safe). False: gone, or not a directory.
bool StatDir(int root, const std::string& rel, DirStamp* out) {
  struct statx sx {};
  const int flags = AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | (rel.empty() ? AT_EMPTY_PATH : 0);
  if (statx(root, rel.c_str(), flags, STATX_TYPE | STATX_INO | STATX_MTIME | STATX_CTIME, &sx) != 0) return false;
  if (!S_ISDIR(sx.stx_mode)) return false;
  *out = {sx.stx_ino, makedev(sx.stx_dev_major, sx.stx_dev_minor), sx.stx_mtime.tv_sec, sx.stx_mtime.tv_nsec,
          sx.stx_ctime.tv_sec, sx.stx_ctime.tv_nsec};
  return true;
}

bool Matches(const DirVerdict& v, const DirStamp& s) {
  return v.cacheable && v.ino == s.ino && v.dev == s.dev && v.mtime_s == s.mtime_s && v.mtime_ns == s.mtime_ns &&
         v.ctime_s == s.ctime_s && v.ctime_ns == s.ctime_ns;
}

std::int64_t NowSeconds() {
  struct timespec ts {};
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec;
}

}  // namespace

struct ScanCaches::Impl {
  std::mutex mu;
  std::unordered_map<std::string, Cache> by_path;
};

ScanCaches::ScanCaches() : impl_(std::make_unique<Impl>()) {}
ScanCaches::~ScanCaches() = default;

Status ScanDenyGlobs(const GlobScan& scan, const std::string& workspace_source, const std::string& workspace_target,
                     const std::string& cache_dir, std::vector<DenyMatch>* matches, ScanStats* stats,
                     DirStampMemo* memo, ScanCaches* kept) {
  std::vector<Matcher> matchers;
  for (const auto& p : scan.patterns) matchers.emplace_back(p);
  UniqueFd root(open(scan.source_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) {
    if (errno == ENOENT || errno == ENOTDIR) return {};
    return Status::Errno("deny-scan", "open", scan.source_root);
  }

  std::string cache_path;
  // Updated in place: what this scan reads replaces what it held, and what
  // it never reached is dropped at the end.
  Cache cache;
  if (!cache_dir.empty()) {
    std::string key = scan.source_root + '\0' + scan.pattern_base;
    for (const auto& p : scan.patterns) key += '\0' + p;
    cache_path = cache_dir + "/" + Sha256Hex(key).substr(0, 32);
    bool taken = false;
    if (kept) {
      std::lock_guard<std::mutex> lock(kept->impl().mu);
      auto& by_path = kept->impl().by_path;
      if (auto it = by_path.find(cache_path); it != by_path.end()) {
        cache = std::move(it->second);
        by_path.erase(it);
        taken = true;
      }
    }
    if (!taken) cache = LoadCache(cache_path);
  }
  // Left uninitialised: getdents64 writes what is read. Zeroing it touched
  // all 16 of its pages, a page fault each, in every scan of every run,
  // where a scan of unchanged directories reads none.
  auto buffer = std::make_unique_for_overwrite<DirentBuffer>();
  bool changed = false;
  // A directory changed in the last second may change again within the same
  // timestamp tick without its mtime moving: read it again next time.
  const std::int64_t settled_before = NowSeconds() - 1;

  if (memo && memo->root() != scan.source_root) memo = nullptr;
  std::vector<std::string> pending = {""};
  while (!pending.empty()) {
    std::string rel = std::move(pending.back());
    pending.pop_back();
    // An unchanged directory costs one statx, no open and no read (none
    // when this launch looked at it already). The workspace is the
    // sandbox's: a directory swapped for a symlink since its parent was
    // read must not lead the scan out of it (see the header).
    DirStamp stamp;
    const DirStamp* seen = memo ? memo->Find(rel) : nullptr;
    if (seen) {
      stamp = *seen;
    } else if (!StatDir(root.get(), rel, &stamp)) {
      continue;  // vanished, or no longer a directory: nothing of it is visible either
    }
    ++stats->directories;
    auto hit = cache.find(rel);
    DirVerdict* verdict = nullptr;  // the cache's node (stable while the walk goes on)
    if (hit != cache.end() && Matches(hit->second, stamp)) {
      verdict = &hit->second;
      if (memo && !seen) memo->Put(rel, stamp);
    } else {
      DirVerdict v;
      struct stat st {};
      UniqueFd dir = OpenBeneath(root.get(), rel, O_RDONLY | O_DIRECTORY);
      if (!dir.valid() || fstat(dir.get(), &st) != 0) continue;  // unreadable: not visible inside either
      ++stats->directories_read;
      if (memo) memo->Put(rel, StampOf(st));
      v.ino = st.st_ino;
      v.dev = st.st_dev;
      v.mtime_s = st.st_mtim.tv_sec;
      v.mtime_ns = st.st_mtim.tv_nsec;
      v.ctime_s = st.st_ctim.tv_sec;
      v.ctime_ns = st.st_ctim.tv_nsec;
      v.cacheable = st.st_mtim.tv_sec < settled_before && st.st_ctim.tv_sec < settled_before;
      ReadDir(dir.get(), rel, scan, matchers, buffer.get(), &v, stats);
      // The file changes only if what it would hold changes.
      if (v.cacheable || (hit != cache.end() && hit->second.cacheable)) changed = true;
      if (hit != cache.end()) {
        hit->second = std::move(v);
        verdict = &hit->second;
      } else {
        verdict = &cache.emplace(rel, std::move(v)).first->second;
      }
    }
    verdict->visited = true;
    for (const auto& [type, name] : verdict->matches) {
      std::string host = paths::Join(scan.source_root, rel.empty() ? name : rel + "/" + name);
      DenyMatch m{host, paths::Rebase(host, scan.source_root, scan.target_root), type == 'd'};
      if (type == 'l') {
        // A link named like a secret: mask what it points at, when that is visible inside.
        char* real = realpath(host.c_str(), nullptr);
        if (!real) continue;
        std::string resolved(real);
        free(real);
        if (!paths::IsWithin(resolved, workspace_source)) continue;
        struct stat ts {};
        if (stat(resolved.c_str(), &ts) != 0) continue;
        m = {resolved, paths::Rebase(resolved, workspace_source, workspace_target), S_ISDIR(ts.st_mode)};
      }
      matches->push_back(std::move(m));
    }
    for (const auto& s : verdict->subdirs) pending.push_back(rel.empty() ? s : rel + "/" + s);
  }
  // Directories that went away drop out of the file too.
  for (auto it = cache.begin(); it != cache.end();) {
    if (it->second.visited) {
      ++it;
      continue;
    }
    changed = changed || it->second.cacheable;
    it = cache.erase(it);
  }
  if (!cache_path.empty() && changed) {
    SaveCache(cache_dir, cache_path, cache);
  }
  if (kept && !cache_path.empty()) {
    for (auto& entry : cache) entry.second.visited = false;
    std::lock_guard<std::mutex> lock(kept->impl().mu);
    kept->impl().by_path[cache_path] = std::move(cache);
  }
  return {};
}

}  // namespace agentbox::linux
