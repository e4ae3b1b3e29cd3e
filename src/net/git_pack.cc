// The pack of a push, read just far enough to name its commits and their
// parents (gitformat-pack(5)). Two passes: the first walks every object
// header and inflates each object to find where the next one starts, keeping
// nothing but offsets; the second re-inflates the commits and resolves the
// delta chains rooted at them, depth first, so that only one chain of commit
// contents is held at a time (as index-pack does).
#include <openssl/evp.h>
#include <zlib.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <optional>

#include "net/git_push.h"

namespace agentbox::net {
namespace {

enum ObjectType : std::uint8_t {
  kCommit = 1,
  kTree = 2,
  kBlob = 3,
  kTag = 4,
  kOfsDelta = 6,
  kRefDelta = 7,
  kUnknownRoot = 8,  // the root of a delta chain is a REF_DELTA: its type is known only once resolved
};

constexpr std::uint32_t kNoIndex = UINT32_MAX;

Status PackError(const std::string& message) { return Status::Error("git-push", "pack: " + message); }

std::string BoundError(const char* bound, std::uint64_t value) {
  return "exceeds the bound " + std::string(bound) + " (" + std::to_string(value) + ")";
}

std::string HexOf(std::string_view raw) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(raw.size() * 2);
  for (unsigned char c : raw) {
    hex.push_back(kDigits[c >> 4]);
    hex.push_back(kDigits[c & 15]);
  }
  return hex;
}

const EVP_MD* DigestFor(std::size_t oid_hex_len) { return oid_hex_len == 64 ? EVP_sha256() : EVP_sha1(); }

// The raw digest of the concatenated parts.
Result<std::string> Digest(const EVP_MD* md, std::initializer_list<std::string_view> parts) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), md, nullptr) != 1) return PackError("cannot initialise the digest");
  for (std::string_view part : parts) {
    if (EVP_DigestUpdate(ctx.get(), part.data(), part.size()) != 1) return PackError("digest update failed");
  }
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx.get(), out, &len) != 1) return PackError("digest final failed");
  return std::string(reinterpret_cast<const char*>(out), len);
}

// Every inflated (and delta-expanded) byte is charged here, so that a small
// pack cannot make the proxy do unbounded work.
class Budget {
 public:
  explicit Budget(std::uint64_t max) : max_(max) {}
  Status Charge(std::uint64_t n) {
    if (n > max_ - used_) return PackError("inflated data " + BoundError("max_inflated_bytes", max_));
    used_ += n;
    return {};
  }
  std::uint64_t left() const { return max_ - used_; }

 private:
  std::uint64_t max_;
  std::uint64_t used_ = 0;
};

// Inflates the zlib stream at the start of `in`, which must produce exactly
// `size` bytes; appends them to `out` unless it is null. Returns how many
// bytes of `in` the stream took.
Result<std::size_t> Inflate(std::string_view in, std::uint64_t size, std::string* out, Budget& budget,
                            std::uint64_t offset) {
  auto fail = [offset](const std::string& what) {
    return PackError("object at offset " + std::to_string(offset) + what);
  };
  z_stream zs{};
  if (inflateInit(&zs) != Z_OK) return PackError("cannot initialise zlib");
  std::unique_ptr<z_stream, decltype(&inflateEnd)> guard(&zs, &inflateEnd);
  if (out) out->reserve(out->size() + size);
  unsigned char buf[64 * 1024];
  std::size_t fed = 0;
  std::uint64_t produced = 0;
  for (;;) {
    if (zs.avail_in == 0 && fed < in.size()) {
      std::size_t chunk = std::min<std::size_t>(in.size() - fed, UINT_MAX);
      zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data() + fed));
      zs.avail_in = static_cast<uInt>(chunk);
      fed += chunk;
    }
    zs.next_out = buf;
    zs.avail_out = sizeof buf;
    int rc = inflate(&zs, Z_NO_FLUSH);
    std::size_t n = sizeof buf - zs.avail_out;
    produced += n;
    if (produced > size) {
      return fail(" inflates past its declared size of " + std::to_string(size) + " bytes");
    }
    if (Status s = budget.Charge(n); !s.ok()) return s;
    if (out) out->append(reinterpret_cast<const char*>(buf), n);
    if (rc == Z_STREAM_END) break;
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0 && fed == in.size()) {
      return fail(": zlib stream truncated");
    }
    return fail(": bad zlib stream (" + (zs.msg ? std::string(zs.msg) : "error " + std::to_string(rc)) + ")");
  }
  if (produced != size) {
    return fail(" inflates to " + std::to_string(produced) + " bytes, not the declared " + std::to_string(size));
  }
  return fed - zs.avail_in;
}

// A little-endian base-128 number (delta headers). False on overflow or end.
bool ReadDeltaSize(std::string_view delta, std::size_t& pos, std::uint64_t& value) {
  value = 0;
  for (int shift = 0; pos < delta.size(); shift += 7) {
    if (shift > 63) return false;
    unsigned char c = static_cast<unsigned char>(delta[pos++]);
    value |= static_cast<std::uint64_t>(c & 0x7f) << shift;
    if (!(c & 0x80)) return true;
  }
  return false;
}

// git's delta format: base size, result size, then copy and insert
// instructions. Every bound is checked before the byte is touched.
Result<std::string> ApplyDelta(std::string_view base, std::string_view delta, std::uint64_t max_result,
                               std::uint64_t offset) {
  auto where = [offset] { return "delta at offset " + std::to_string(offset); };
  std::size_t pos = 0;
  std::uint64_t base_size = 0, result_size = 0;
  if (!ReadDeltaSize(delta, pos, base_size) || !ReadDeltaSize(delta, pos, result_size)) {
    return PackError(where() + ": bad delta header");
  }
  if (base_size != base.size()) return PackError(where() + ": base size does not match its base");
  if (result_size > max_result) return PackError(where() + ": commit " + BoundError("max_commit_bytes", max_result));
  std::string out;
  out.reserve(result_size);
  while (pos < delta.size()) {
    unsigned char op = static_cast<unsigned char>(delta[pos++]);
    if (op & 0x80) {
      std::uint64_t copy_offset = 0, copy_size = 0;
      for (int i = 0; i < 7; ++i) {
        if (!(op & (1u << i))) continue;
        if (pos >= delta.size()) return PackError(where() + ": truncated copy instruction");
        std::uint64_t byte = static_cast<unsigned char>(delta[pos++]);
        if (i < 4) {
          copy_offset |= byte << (8 * i);
        } else {
          copy_size |= byte << (8 * (i - 4));
        }
      }
      if (copy_size == 0) copy_size = 0x10000;
      if (copy_offset > base.size() || copy_size > base.size() - copy_offset) {
        return PackError(where() + ": copy outside its base");
      }
      if (copy_size > result_size - out.size()) return PackError(where() + ": result larger than declared");
      out.append(base.substr(copy_offset, copy_size));
    } else if (op != 0) {
      if (op > delta.size() - pos) return PackError(where() + ": truncated insert instruction");
      if (op > result_size - out.size()) return PackError(where() + ": result larger than declared");
      out.append(delta.substr(pos, op));
      pos += op;
    } else {
      return PackError(where() + ": reserved delta instruction 0");
    }
  }
  if (out.size() != result_size) return PackError(where() + ": result smaller than declared");
  return out;
}

bool IsHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); });
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'F') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// The parents as git's parse_commit_buffer reads them: a "tree" line first,
// then consecutive "parent" lines; a "parent" anywhere else is not one. A
// commit git would refuse to parse gets no parents: it proves nothing.
std::vector<std::string> CommitParents(std::string_view content, std::size_t hex_len) {
  std::vector<std::string> parents;
  const std::size_t tree_len = 5 + hex_len;
  if (content.size() <= tree_len + 1 || content.substr(0, 5) != "tree " || !IsHex(content.substr(5, hex_len)) ||
      content[tree_len] != '\n') {
    return {};
  }
  std::size_t pos = tree_len + 1;
  const std::size_t parent_len = 7 + hex_len;
  while (pos + parent_len < content.size() && content.substr(pos, 7) == "parent ") {
    std::string_view hex = content.substr(pos + 7, hex_len);
    if (!IsHex(hex) || content[pos + parent_len] != '\n') return {};
    parents.push_back(Lower(hex));
    pos += parent_len + 1;
  }
  return parents;
}

struct Entry {
  std::uint64_t offset = 0;              // of the object header
  std::uint64_t data = 0;                // of the zlib stream
  std::uint64_t size = 0;                // inflated size (the delta's own size for deltas)
  std::uint8_t type = 0;                 // as in the header
  std::uint8_t root = 0;                 // the type at the root of its delta chain (kUnknownRoot for REF_DELTA)
  bool resolved = false;                 // a delta resolved to a commit
  std::uint32_t first_child = kNoIndex;  // OFS_DELTA children that may be commits
  std::uint32_t next_sibling = kNoIndex;
};

struct Scan {
  std::vector<Entry> entries;
  std::unordered_map<std::string, std::vector<std::uint32_t>> ref_children;  // base oid (hex) → REF_DELTAs
};

// Pass 1: headers, ends of objects, the delta graph; the trailing checksum.
Result<Scan> ScanPack(std::string_view pack, std::size_t hex_len, const PackLimits& limits, Budget& budget) {
  const std::size_t raw_len = hex_len / 2;
  if (pack.size() < 12 + raw_len) return PackError("shorter than a pack header and checksum");
  if (pack.substr(0, 4) != "PACK") return PackError("no PACK signature");
  auto be32 = [&](std::size_t at) {
    return static_cast<std::uint32_t>(static_cast<unsigned char>(pack[at])) << 24 |
           static_cast<std::uint32_t>(static_cast<unsigned char>(pack[at + 1])) << 16 |
           static_cast<std::uint32_t>(static_cast<unsigned char>(pack[at + 2])) << 8 |
           static_cast<std::uint32_t>(static_cast<unsigned char>(pack[at + 3]));
  };
  std::uint32_t version = be32(4);
  if (version != 2 && version != 3) return PackError("unsupported version " + std::to_string(version));
  std::uint32_t count = be32(8);
  if (count > limits.max_objects) {
    return PackError("declares " + std::to_string(count) + " objects, which " +
                     BoundError("max_objects", limits.max_objects));
  }
  const std::size_t end = pack.size() - raw_len;  // where the checksum starts
  // Each object takes at least 3 bytes (a header byte and a minimal zlib
  // stream is more), so a count the data cannot hold is refused before any
  // allocation sized by it.
  if (count > (end - 12) / 3) return PackError("declares more objects than it has bytes for");

  Scan scan;
  scan.entries.reserve(count);
  std::size_t pos = 12;
  for (std::uint32_t i = 0; i < count; ++i) {
    Entry e;
    e.offset = pos;
    auto where = [&] { return "object " + std::to_string(i) + " at offset " + std::to_string(e.offset); };
    if (pos >= end) return PackError("truncated before " + where());
    unsigned char c = static_cast<unsigned char>(pack[pos++]);
    e.type = (c >> 4) & 7;
    e.size = c & 15;
    for (int shift = 4; c & 0x80; shift += 7) {
      if (pos >= end) return PackError(where() + ": truncated header");
      if (shift > 57) return PackError(where() + ": size overflows");
      c = static_cast<unsigned char>(pack[pos++]);
      e.size |= static_cast<std::uint64_t>(c & 0x7f) << shift;
    }
    if (e.size > budget.left())
      return PackError(where() + ": size " + BoundError("max_inflated_bytes", limits.max_inflated_bytes));
    std::uint32_t index = static_cast<std::uint32_t>(scan.entries.size());
    switch (e.type) {
      case kCommit:
        if (e.size > limits.max_commit_bytes) {
          return PackError(where() + ": commit " + BoundError("max_commit_bytes", limits.max_commit_bytes));
        }
        [[fallthrough]];
      case kTree:
      case kBlob:
      case kTag:
        e.root = e.type;
        break;
      case kOfsDelta: {
        if (pos >= end) return PackError(where() + ": truncated delta offset");
        c = static_cast<unsigned char>(pack[pos++]);
        std::uint64_t distance = c & 0x7f;
        while (c & 0x80) {
          if (pos >= end) return PackError(where() + ": truncated delta offset");
          if (distance >= (UINT64_MAX >> 7) - 1) return PackError(where() + ": delta offset overflows");
          c = static_cast<unsigned char>(pack[pos++]);
          distance = ((distance + 1) << 7) | (c & 0x7f);
        }
        if (distance == 0 || distance > e.offset) return PackError(where() + ": delta base outside the pack");
        std::uint64_t base_offset = e.offset - distance;
        auto it = std::lower_bound(scan.entries.begin(), scan.entries.end(), base_offset,
                                   [](const Entry& x, std::uint64_t off) { return x.offset < off; });
        if (it == scan.entries.end() || it->offset != base_offset) {
          return PackError(where() + ": delta base offset " + std::to_string(base_offset) + " starts no object");
        }
        e.root = it->root;
        if (e.root == kCommit || e.root == kUnknownRoot) {
          e.next_sibling = it->first_child;
          it->first_child = index;
        }
        break;
      }
      case kRefDelta: {
        if (end - pos < raw_len) return PackError(where() + ": truncated delta base name");
        scan.ref_children[HexOf(pack.substr(pos, raw_len))].push_back(index);
        pos += raw_len;
        e.root = kUnknownRoot;
        break;
      }
      default:
        return PackError(where() + ": invalid object type " + std::to_string(e.type));
    }
    e.data = pos;
    Result<std::size_t> used = Inflate(pack.substr(pos, end - pos), e.size, nullptr, budget, e.offset);
    if (!used.ok()) return used.status();
    pos += *used;
    scan.entries.push_back(e);
  }
  if (pos != end) return PackError(std::to_string(end - pos) + " bytes between the last object and the checksum");
  Result<std::string> sum = Digest(DigestFor(hex_len), {pack.substr(0, end)});
  if (!sum.ok()) return sum.status();
  if (*sum != pack.substr(end)) return PackError("checksum mismatch");
  return scan;
}

}  // namespace

Result<PackIndex> PackIndex::Build(std::string_view pack, std::size_t oid_hex_len, const PackLimits& limits) {
  if (oid_hex_len != 40 && oid_hex_len != 64) {
    return PackError("object names of " + std::to_string(oid_hex_len) + " hex digits (40 or 64 expected)");
  }
  Budget budget(limits.max_inflated_bytes);
  Result<Scan> scanned = ScanPack(pack, oid_hex_len, limits, budget);
  if (!scanned.ok()) return scanned.status();
  Scan& scan = *scanned;
  const EVP_MD* md = DigestFor(oid_hex_len);

  PackIndex index;
  index.objects_ = static_cast<std::uint32_t>(scan.entries.size());

  // A commit's content is known: name it, keep its parents, and return the
  // deltas based on it (those by offset, then those by name, each once).
  auto name_commit = [&](std::uint32_t at, const std::string& content, std::vector<std::uint32_t>& children) -> Status {
    std::string header = "commit " + std::to_string(content.size());
    Result<std::string> raw = Digest(md, {header, std::string_view("\0", 1), content});
    if (!raw.ok()) return raw.status();
    std::string oid = HexOf(*raw);
    index.parents_.try_emplace(oid, CommitParents(content, oid_hex_len));
    children.clear();
    for (std::uint32_t c = scan.entries[at].first_child; c != kNoIndex; c = scan.entries[c].next_sibling) {
      if (!scan.entries[c].resolved) children.push_back(c);
    }
    if (auto node = scan.ref_children.extract(oid)) {
      for (std::uint32_t c : node.mapped()) {
        if (!scan.entries[c].resolved) children.push_back(c);
      }
    }
    return {};
  };

  struct Frame {
    std::string content;
    std::vector<std::uint32_t> children;
    std::size_t next = 0;
  };
  std::vector<Frame> chain;  // the delta chain being resolved, root first
  for (std::uint32_t root = 0; root < scan.entries.size(); ++root) {
    const Entry& r = scan.entries[root];
    if (r.type != kCommit) continue;
    chain.clear();
    chain.emplace_back();
    Result<std::size_t> used = Inflate(pack.substr(r.data), r.size, &chain.back().content, budget, r.offset);
    if (!used.ok()) return used.status();
    if (Status s = name_commit(root, chain.back().content, chain.back().children); !s.ok()) return s;
    std::uint64_t held = chain.back().content.size();
    while (!chain.empty()) {
      Frame& top = chain.back();
      if (top.next == top.children.size()) {
        held -= top.content.size();
        chain.pop_back();
        continue;
      }
      std::uint32_t at = top.children[top.next++];
      Entry& e = scan.entries[at];
      if (e.resolved) continue;
      if (chain.size() > limits.max_delta_depth) {
        return PackError("delta chain at offset " + std::to_string(e.offset) + " " +
                         BoundError("max_delta_depth", limits.max_delta_depth));
      }
      if (e.size > limits.max_commit_bytes) {
        return PackError("commit delta at offset " + std::to_string(e.offset) + " " +
                         BoundError("max_commit_bytes", limits.max_commit_bytes));
      }
      std::string delta;
      used = Inflate(pack.substr(e.data), e.size, &delta, budget, e.offset);
      if (!used.ok()) return used.status();
      Result<std::string> content = ApplyDelta(top.content, delta, limits.max_commit_bytes, e.offset);
      if (!content.ok()) return content.status();
      if (Status s = budget.Charge(content->size()); !s.ok()) return s;
      held += content->size();
      if (held > limits.max_held_bytes) {
        return PackError("commit contents held while resolving deltas " +
                         BoundError("max_held_bytes", limits.max_held_bytes));
      }
      e.resolved = true;
      ++index.resolved_deltas_;
      Frame next;
      next.content = std::move(*content);
      if (Status s = name_commit(at, next.content, next.children); !s.ok()) return s;
      chain.push_back(std::move(next));  // `top` is not used past this point
    }
  }
  for (const Entry& e : scan.entries) {
    if ((e.type == kOfsDelta || e.type == kRefDelta) && e.root == kUnknownRoot && !e.resolved) {
      ++index.unresolved_deltas_;
    }
  }
  return index;
}

const std::vector<std::string>* PackIndex::Parents(std::string_view oid) const {
  auto it = parents_.find(std::string(oid));
  return it == parents_.end() ? nullptr : &it->second;
}

}  // namespace agentbox::net
