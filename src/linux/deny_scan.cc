#include "linux/deny_scan.h"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

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

// What one directory held, as far as the deny globs care: read in this walk.
struct DirVerdict {
  DirStamp stamp;
  bool cacheable = false;
  std::vector<std::string> subdirs;
  std::vector<std::pair<char, std::string>> matches;  // 'd' dir, 'f' file, 'l' symlink
};

// The cache file: the magic, a CRC-32 of the rest, the number of records,
// then one record per directory in the order the walk that wrote it
// visited them (a later walk of an unchanged tree visits them in the same
// order). A record: its path below the root, its stamp, its
// subdirectories' names, its matches (a type byte and a name). Binary,
// machine-local: every length is checked, and a file whose checksum does
// not match is not used at all (a verdict damaged in its names but not in
// its stamp would otherwise be trusted).
constexpr char kMagic[] = "agentbox-deny-scan-3\n";

void PutRaw(std::string* out, const void* p, size_t n) { out->append(static_cast<const char*>(p), n); }
void PutStr(std::string* out, std::string_view s) {
  auto n = static_cast<std::uint32_t>(s.size());
  PutRaw(out, &n, 4);
  out->append(s);
}

void PutRecord(std::string* out, const std::string& rel, const DirVerdict& v) {
  PutStr(out, rel);
  const std::int64_t times[4] = {v.stamp.mtime_s, v.stamp.mtime_ns, v.stamp.ctime_s, v.stamp.ctime_ns};
  PutRaw(out, times, sizeof times);
  PutRaw(out, &v.stamp.ino, 8);
  PutRaw(out, &v.stamp.dev, 8);
  auto nsub = static_cast<std::uint32_t>(v.subdirs.size());
  PutRaw(out, &nsub, 4);
  for (const auto& name : v.subdirs) PutStr(out, name);
  auto nmatch = static_cast<std::uint32_t>(v.matches.size());
  PutRaw(out, &nmatch, 4);
  for (const auto& [type, name] : v.matches) {
    PutRaw(out, &type, 1);
    PutStr(out, name);
  }
}

std::uint32_t Checksum(std::string_view bytes) {
  return static_cast<std::uint32_t>(
      crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

// One record of a loaded cache, as views into the file's bytes.
struct Record {
  std::string_view rel;
  DirStamp stamp;
  std::uint32_t nsub = 0, nmatch = 0;
  const char* subs = nullptr;     // nsub × (u32 length, name)
  const char* matches = nullptr;  // nmatch × (type, u32 length, name)
  std::string_view bytes;         // the whole record, to write it again as it is
};

// Walks a record's list of names: `typed` lists carry a type byte first.
// Every length was checked when the file was loaded.
template <typename F>
void ForEachName(const char* p, std::uint32_t n, bool typed, F&& f) {
  for (std::uint32_t i = 0; i < n; ++i) {
    char type = 0;
    if (typed) type = *p++;
    std::uint32_t len;
    std::memcpy(&len, p, 4);
    p += 4;
    f(type, std::string_view(p, len));
    p += len;
  }
}

// A cache as loaded (or as a scan left it): its bytes and its records, with
// the lookup a walk makes in order.
class Verdicts {
 public:
  Verdicts() = default;
  // Takes a file's bytes; a damaged or foreign file is an empty cache.
  explicit Verdicts(std::string bytes) : bytes_(std::move(bytes)) {
    if (!Parse()) {
      records_.clear();
      bytes_.clear();
    }
  }
  Verdicts(Verdicts&&) = default;
  Verdicts& operator=(Verdicts&&) = default;

  std::size_t size() const { return records_.size(); }
  const Record& at(std::size_t i) const { return records_[i]; }
  // The record of `rel`, or null. The next record in the file is tried
  // first; an index is built only when the walk leaves the file's order.
  const Record* Find(std::string_view rel) {
    if (cursor_ < records_.size() && records_[cursor_].rel == rel) return &records_[cursor_++];
    if (records_.empty()) return nullptr;
    if (index_.empty()) {
      index_.reserve(records_.size());
      for (std::size_t i = 0; i < records_.size(); ++i) index_.emplace(records_[i].rel, i);
    }
    auto it = index_.find(rel);
    if (it == index_.end()) return nullptr;
    cursor_ = it->second + 1;
    return &records_[it->second];
  }
  void Rewind() { cursor_ = 0; }

 private:
  bool Parse() {
    const std::size_t magic = sizeof(kMagic) - 1;
    if (bytes_.size() < magic + 8 || bytes_.compare(0, magic, kMagic) != 0) return false;
    const char* p = bytes_.data() + magic;
    const char* const end = bytes_.data() + bytes_.size();
    std::uint32_t sum;
    std::memcpy(&sum, p, 4);
    p += 4;
    if (sum != Checksum(std::string_view(p, static_cast<std::size_t>(end - p)))) return false;
    std::uint32_t count;
    std::memcpy(&count, p, 4);
    p += 4;
    if (count > bytes_.size() / 64) return false;  // a record takes more than 64 bytes
    records_.reserve(count);
    auto u32 = [&](std::uint32_t* v) {
      if (end - p < 4) return false;
      std::memcpy(v, p, 4);
      p += 4;
      return true;
    };
    auto skip = [&](std::uint32_t n) {
      if (static_cast<std::size_t>(end - p) < n) return false;
      p += n;
      return true;
    };
    for (std::uint32_t r = 0; r < count; ++r) {
      Record rec;
      const char* begin = p;
      std::uint32_t n;
      if (!u32(&n) || static_cast<std::size_t>(end - p) < n) return false;
      rec.rel = std::string_view(p, n);
      p += n;
      if (end - p < 48) return false;
      std::int64_t times[4];
      std::memcpy(times, p, sizeof times);
      std::memcpy(&rec.stamp.ino, p + 32, 8);
      std::memcpy(&rec.stamp.dev, p + 40, 8);
      p += 48;
      rec.stamp.mtime_s = times[0];
      rec.stamp.mtime_ns = times[1];
      rec.stamp.ctime_s = times[2];
      rec.stamp.ctime_ns = times[3];
      if (!u32(&rec.nsub)) return false;
      rec.subs = p;
      for (std::uint32_t i = 0; i < rec.nsub; ++i) {
        if (!u32(&n) || !skip(n)) return false;
      }
      if (!u32(&rec.nmatch)) return false;
      rec.matches = p;
      for (std::uint32_t i = 0; i < rec.nmatch; ++i) {
        if (!skip(1) || !u32(&n) || !skip(n)) return false;
      }
      rec.bytes = std::string_view(begin, static_cast<std::size_t>(p - begin));
      records_.push_back(rec);
    }
    return p == end;
  }

  std::string bytes_;  // never small: the views below stay valid when it moves
  std::vector<Record> records_;
  std::unordered_map<std::string_view, std::size_t> index_;
  std::size_t cursor_ = 0;
};

// The cache file whole, or "" (a missing or unreadable file is an empty cache).
std::string ReadCacheFile(const std::string& path) {
  std::string data;
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return data;
  struct stat st {};
  if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (256 << 20)) return data;
  // What fstat gave, and one byte more: a file that grew while read is not trusted.
  data.resize(static_cast<size_t>(st.st_size) + 1);
  size_t got = 0;
  while (got < data.size()) {
    ssize_t n = read(fd.get(), data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  data.resize(got);
  if (data.size() > static_cast<size_t>(st.st_size)) return {};  // it grew while read: not trusted
  return data;
}

void SaveCache(const std::string& dir, const std::string& path, const std::string& out) {
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

bool SameStamp(const DirStamp& a, const DirStamp& b) {
  return a.ino == b.ino && a.dev == b.dev && a.mtime_s == b.mtime_s && a.mtime_ns == b.mtime_ns &&
         a.ctime_s == b.ctime_s && a.ctime_ns == b.ctime_ns;
}

std::int64_t NowSeconds() {
  struct timespec ts {};
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec;
}

// One match of a directory, as the sandbox will see it (appended to `out`).
void AddMatch(const GlobScan& scan, const std::string& rel, char type, std::string_view name,
              const std::string& workspace_source, const std::string& workspace_target, std::vector<DenyMatch>* out) {
  std::string child = rel;
  if (!child.empty()) child += '/';
  child.append(name);
  std::string host = paths::Join(scan.source_root, child);
  DenyMatch m{host, paths::Rebase(host, scan.source_root, scan.target_root), type == 'd'};
  if (type == 'l') {
    // A link named like a secret: mask what it points at, when that is visible inside.
    char* real = realpath(host.c_str(), nullptr);
    if (!real) return;
    std::string resolved(real);
    free(real);
    if (!paths::IsWithin(resolved, workspace_source)) return;
    struct stat ts {};
    if (stat(resolved.c_str(), &ts) != 0) return;
    m = {resolved, paths::Rebase(resolved, workspace_source, workspace_target), S_ISDIR(ts.st_mode)};
  }
  out->push_back(std::move(m));
}

void PushChild(std::vector<std::string>* pending, const std::string& rel, std::string_view name) {
  std::string& child = pending->emplace_back();
  child.reserve(rel.size() + 1 + name.size());
  if (!rel.empty()) {
    child = rel;
    child += '/';
  }
  child.append(name);
}

}  // namespace

const DirStamp* DirStampMemo::Find(const std::string& rel) {
  last_found_ = SIZE_MAX;
  if (recording_ || stamps_.empty()) return nullptr;
  std::size_t at = SIZE_MAX;
  if (cursor_ < stamps_.size() && stamps_[cursor_].first == rel) {
    at = cursor_;
  } else {
    if (index_.empty()) {
      index_.reserve(stamps_.size());
      for (std::size_t i = 0; i < stamps_.size(); ++i) index_.emplace(stamps_[i].first, i);
    }
    auto it = index_.find(rel);
    if (it == index_.end()) return nullptr;
    at = it->second;
  }
  cursor_ = at + 1;
  last_found_ = at;
  return &stamps_[at].second;
}

void DirStampMemo::Put(const std::string& rel, const DirStamp& s) {
  if (last_found_ < stamps_.size() && stamps_[last_found_].first == rel) {
    stamps_[last_found_].second = s;
    return;
  }
  stamps_.emplace_back(rel, s);
  if (!index_.empty()) index_.emplace(stamps_.back().first, stamps_.size() - 1);
}

struct ScanCaches::Impl {
  std::mutex mu;
  std::unordered_map<std::string, Verdicts> by_path;
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
  Verdicts cache;
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
    if (!taken) cache = Verdicts(ReadCacheFile(cache_path));
    cache.Rewind();
  }
  // What this walk found, in the order it went, for the next one: each
  // directory a record of the cache as it was (unchanged) or one written
  // anew into `fresh` (read again). Only when something changed is a new
  // file put together.
  struct Visit {
    const Record* old;  // or null: fresh[offset, offset + size)
    std::size_t offset = 0, size = 0;
  };
  std::vector<Visit> visits;
  visits.reserve(cache.size() + 16);
  std::string fresh;
  std::size_t reused = 0;
  // Left uninitialised: getdents64 writes what is read. Zeroing it touched
  // all 16 of its pages, a page fault each, in every scan of every run,
  // where a scan of unchanged directories reads none.
  std::unique_ptr<DirentBuffer> buffer;
  bool changed = false;
  // A directory changed in the last second may change again within the same
  // timestamp tick without its mtime moving: read it again next time.
  const std::int64_t settled_before = NowSeconds() - 1;

  if (memo && memo->root() != scan.source_root) memo = nullptr;
  if (memo) memo->BeginWalk();
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
    const Record* hit = cache_path.empty() ? nullptr : cache.Find(rel);
    if (hit && SameStamp(hit->stamp, stamp)) {
      if (memo && !seen) memo->Put(rel, stamp);
      visits.push_back({hit});
      ++reused;
      ForEachName(hit->matches, hit->nmatch, true, [&](char type, std::string_view name) {
        AddMatch(scan, rel, type, name, workspace_source, workspace_target, matches);
      });
      ForEachName(hit->subs, hit->nsub, false, [&](char, std::string_view name) { PushChild(&pending, rel, name); });
      continue;
    }
    DirVerdict v;
    struct stat st {};
    UniqueFd dir = OpenBeneath(root.get(), rel, O_RDONLY | O_DIRECTORY);
    if (!dir.valid() || fstat(dir.get(), &st) != 0) continue;  // unreadable: not visible inside either
    ++stats->directories_read;
    v.stamp = StampOf(st);
    if (memo) memo->Put(rel, v.stamp);
    v.cacheable = st.st_mtim.tv_sec < settled_before && st.st_ctim.tv_sec < settled_before;
    if (!buffer) buffer = std::make_unique_for_overwrite<DirentBuffer>();
    ReadDir(dir.get(), rel, scan, matchers, buffer.get(), &v, stats);
    // The file changes only if what it would hold changes.
    if (v.cacheable || hit) changed = true;
    if (v.cacheable && !cache_path.empty()) {
      const std::size_t offset = fresh.size();
      PutRecord(&fresh, rel, v);
      visits.push_back({nullptr, offset, fresh.size() - offset});
    }
    for (const auto& [type, name] : v.matches) {
      AddMatch(scan, rel, type, name, workspace_source, workspace_target, matches);
    }
    for (const auto& name : v.subdirs) PushChild(&pending, rel, name);
  }
  if (memo) memo->EndWalk();
  if (cache_path.empty()) return {};
  // Directories that went away drop out of the file too.
  if (reused != cache.size()) changed = true;
  if (changed) {
    std::string out(kMagic);
    const std::size_t sum_at = out.size();
    const auto count = static_cast<std::uint32_t>(visits.size());
    PutRaw(&out, &count, 4);  // the checksum's place
    PutRaw(&out, &count, 4);
    for (const auto& visit : visits) {
      if (visit.old) {
        out.append(visit.old->bytes);
      } else {
        out.append(fresh, visit.offset, visit.size);
      }
    }
    const std::uint32_t sum = Checksum(std::string_view(out).substr(sum_at + 4));
    std::memcpy(out.data() + sum_at, &sum, 4);
    SaveCache(cache_dir, cache_path, out);
    if (kept) cache = Verdicts(std::move(out));
  }
  if (kept) {
    std::lock_guard<std::mutex> lock(kept->impl().mu);
    kept->impl().by_path[cache_path] = std::move(cache);
  }
  return {};
}

}  // namespace agentbox::linux
