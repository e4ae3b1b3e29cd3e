#include "session/unified_diff.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <unordered_map>

#include <openssl/evp.h>
#include <zlib.h>

namespace agentbox::session {
namespace {

// Myers' search over two sequences of line ids, marking in `keep_a` /
// `keep_b` the lines of a longest common subsequence. Recursive on the middle
// snake (the bisection of diff-match-patch, which follows the paper's
// linear-space refinement).
class Myers {
 public:
  // The search depth past which a split is taken where the search stands
  // (as xdiff does), bounding the work on large, very different texts.
  static constexpr long kMaxCost = 1024;

  Myers(const std::vector<int>& a, const std::vector<int>& b, std::vector<char>* keep_a,
        std::vector<char>* keep_b)
      : a_(a), b_(b), keep_a_(*keep_a), keep_b_(*keep_b) {}

  void Run() { Compare(0, a_.size(), 0, b_.size()); }

 private:
  void Compare(std::size_t a_lo, std::size_t a_hi, std::size_t b_lo, std::size_t b_hi) {
    // Common prefix and suffix are kept as they are.
    while (a_lo < a_hi && b_lo < b_hi && a_[a_lo] == b_[b_lo]) {
      keep_a_[a_lo++] = 1;
      keep_b_[b_lo++] = 1;
    }
    while (a_lo < a_hi && b_lo < b_hi && a_[a_hi - 1] == b_[b_hi - 1]) {
      keep_a_[--a_hi] = 1;
      keep_b_[--b_hi] = 1;
    }
    if (a_lo == a_hi || b_lo == b_hi) return;  // the rest of the other side changed
    std::size_t x = 0, y = 0;
    if (!Bisect(a_lo, a_hi, b_lo, b_hi, &x, &y)) return;  // nothing in common
    Compare(a_lo, a_lo + x, b_lo, b_lo + y);
    Compare(a_lo + x, a_hi, b_lo + y, b_hi);
  }

  // Finds where a shortest path through the edit graph of a[a_lo, a_hi) and
  // b[b_lo, b_hi) crosses its middle; false when the ranges share no line.
  // The split is never a corner, so both halves are smaller.
  bool Bisect(std::size_t a_lo, std::size_t a_hi, std::size_t b_lo, std::size_t b_hi,
              std::size_t* split_x, std::size_t* split_y) {
    const long n = static_cast<long>(a_hi - a_lo);
    const long m = static_cast<long>(b_hi - b_lo);
    const int* a = a_.data() + a_lo;
    const int* b = b_.data() + b_lo;
    // Diagonals beyond ±kMaxCost are never reached (the search stops there).
    const long max_d = std::min((n + m + 1) / 2, kMaxCost + 1);
    const long offset = max_d;
    const long length = 2 * max_d + 2;
    std::vector<long> v1(length, -1), v2(length, -1);
    v1[offset + 1] = 0;
    v2[offset + 1] = 0;
    const long delta = n - m;
    // With an odd delta the forward paths meet the reverse ones; with an
    // even delta the reverse paths meet the forward ones.
    const bool front = (delta % 2) != 0;
    long k1start = 0, k1end = 0, k2start = 0, k2end = 0;
    for (long d = 0; d < max_d; ++d) {
      for (long k1 = -d + k1start; k1 <= d - k1end; k1 += 2) {
        const long k1o = offset + k1;
        long x1 = (k1 == -d || (k1 != d && v1[k1o - 1] < v1[k1o + 1])) ? v1[k1o + 1] : v1[k1o - 1] + 1;
        long y1 = x1 - k1;
        while (x1 < n && y1 < m && a[x1] == b[y1]) {
          ++x1;
          ++y1;
        }
        v1[k1o] = x1;
        if (x1 > n) {
          k1end += 2;  // ran off the right of the graph
        } else if (y1 > m) {
          k1start += 2;  // ran off the bottom
        } else if (front) {
          const long k2o = offset + delta - k1;
          if (k2o >= 0 && k2o < length && v2[k2o] != -1 && x1 >= n - v2[k2o]) {
            return Split(x1, y1, n, m, split_x, split_y);
          }
        }
      }
      if (d >= kMaxCost) {
        // Too costly to be exact (large, very different texts): split at
        // the forward path that got furthest. Correct, maybe not minimal.
        long best_x = -1, best_y = -1;
        for (long k1 = -d + k1start; k1 <= d - k1end; k1 += 2) {
          const long x = v1[offset + k1], y = x - k1;
          if (x >= 0 && x <= n && y >= 0 && y <= m && x + y > best_x + best_y) {
            best_x = x;
            best_y = y;
          }
        }
        return best_x >= 0 && Split(best_x, best_y, n, m, split_x, split_y);
      }
      for (long k2 = -d + k2start; k2 <= d - k2end; k2 += 2) {
        const long k2o = offset + k2;
        long x2 = (k2 == -d || (k2 != d && v2[k2o - 1] < v2[k2o + 1])) ? v2[k2o + 1] : v2[k2o - 1] + 1;
        long y2 = x2 - k2;
        while (x2 < n && y2 < m && a[n - x2 - 1] == b[m - y2 - 1]) {
          ++x2;
          ++y2;
        }
        v2[k2o] = x2;
        if (x2 > n) {
          k2end += 2;
        } else if (y2 > m) {
          k2start += 2;
        } else if (!front) {
          const long k1o = offset + delta - k2;
          if (k1o >= 0 && k1o < length && v1[k1o] != -1) {
            const long x1 = v1[k1o];
            const long y1 = offset + x1 - k1o;
            if (x1 >= n - x2) return Split(x1, y1, n, m, split_x, split_y);
          }
        }
      }
    }
    return false;
  }

  static bool Split(long x, long y, long n, long m, std::size_t* split_x, std::size_t* split_y) {
    // A corner would not shrink the problem; the caller then treats the
    // ranges as wholly changed (correct, if not minimal; not seen in practice
    // after the prefix and suffix are stripped).
    if ((x == 0 && y == 0) || (x == n && y == m)) return false;
    *split_x = static_cast<std::size_t>(x);
    *split_y = static_cast<std::size_t>(y);
    return true;
  }

  const std::vector<int>& a_;
  const std::vector<int>& b_;
  std::vector<char>& keep_a_;
  std::vector<char>& keep_b_;
};

void AppendNumber(std::string* out, std::size_t n) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), n);
  (void)ec;
  out->append(buf, end);
}

// "-a,b" / "+c,d" of a hunk header; ",1" is left out as diff does, and an
// empty side names the line before it.
void AppendRange(std::string* out, char sign, std::size_t first_index, std::size_t count) {
  out->push_back(sign);
  AppendNumber(out, count == 0 ? first_index : first_index + 1);
  if (count != 1) {
    out->push_back(',');
    AppendNumber(out, count);
  }
}

void AppendLine(std::string* out, char prefix, std::string_view line) {
  out->push_back(prefix);
  if (!line.empty() && line.back() == '\n') {
    out->append(line);
  } else {
    out->append(line);
    out->append("\n\\ No newline at end of file\n");
  }
}

bool ParseNumber(std::string_view s, std::size_t* out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size();
}

// "-a,b" or "-a" (count 1).
bool ParseRange(std::string_view s, char sign, std::size_t* start, std::size_t* count) {
  if (s.empty() || s[0] != sign) return false;
  s.remove_prefix(1);
  std::size_t comma = s.find(',');
  if (comma == std::string_view::npos) {
    *count = 1;
    return ParseNumber(s, start);
  }
  return ParseNumber(s.substr(0, comma), start) && ParseNumber(s.substr(comma + 1), count);
}

}  // namespace

std::vector<std::string_view> SplitLines(std::string_view text) {
  std::vector<std::string_view> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t nl = text.find('\n', start);
    std::size_t end = nl == std::string_view::npos ? text.size() : nl + 1;
    lines.push_back(text.substr(start, end - start));
    start = end;
  }
  return lines;
}

std::vector<LineOp> DiffLines(const std::vector<std::string_view>& all_old,
                              const std::vector<std::string_view>& all_new) {
  // The common head and tail are equal lines; only the middle is searched.
  std::size_t head = 0;
  while (head < all_old.size() && head < all_new.size() && all_old[head] == all_new[head]) ++head;
  std::size_t tail = 0;
  while (tail < all_old.size() - head && tail < all_new.size() - head &&
         all_old[all_old.size() - 1 - tail] == all_new[all_new.size() - 1 - tail]) {
    ++tail;
  }
  const std::vector<std::string_view> old_lines(all_old.begin() + head, all_old.end() - tail);
  const std::vector<std::string_view> new_lines(all_new.begin() + head, all_new.end() - tail);

  // Lines become small integers; lines that occur on one side only are
  // changes whatever the script, so the search runs without them.
  std::unordered_map<std::string_view, int> ids;
  ids.reserve(old_lines.size() + new_lines.size());
  std::vector<int> id_a(old_lines.size()), id_b(new_lines.size());
  std::vector<std::size_t> count_a, count_b;
  auto intern = [&](std::string_view line) {
    auto [it, inserted] = ids.try_emplace(line, static_cast<int>(ids.size()));
    if (inserted) {
      count_a.push_back(0);
      count_b.push_back(0);
    }
    return it->second;
  };
  for (std::size_t i = 0; i < old_lines.size(); ++i) ++count_a[id_a[i] = intern(old_lines[i])];
  for (std::size_t j = 0; j < new_lines.size(); ++j) ++count_b[id_b[j] = intern(new_lines[j])];

  std::vector<int> a, b;                   // the lines with a match on the other side
  std::vector<std::size_t> a_index, b_index;  // their positions in the full texts
  for (std::size_t i = 0; i < id_a.size(); ++i) {
    if (count_b[id_a[i]] > 0) {
      a.push_back(id_a[i]);
      a_index.push_back(i);
    }
  }
  for (std::size_t j = 0; j < id_b.size(); ++j) {
    if (count_a[id_b[j]] > 0) {
      b.push_back(id_b[j]);
      b_index.push_back(j);
    }
  }
  std::vector<char> keep_a_short(a.size(), 0), keep_b_short(b.size(), 0);
  Myers(a, b, &keep_a_short, &keep_b_short).Run();
  std::vector<char> keep_a(old_lines.size(), 0), keep_b(new_lines.size(), 0);
  for (std::size_t i = 0; i < a.size(); ++i) keep_a[a_index[i]] = keep_a_short[i];
  for (std::size_t j = 0; j < b.size(); ++j) keep_b[b_index[j]] = keep_b_short[j];

  // The kept lines of both sides pair up in order (they are one common
  // subsequence), so the script is a merge of the two marks.
  std::vector<LineOp> ops(head, LineOp::kEqual);
  ops.reserve(all_old.size() + all_new.size());
  std::size_t i = 0, j = 0;
  while (i < old_lines.size() || j < new_lines.size()) {
    if (i < old_lines.size() && !keep_a[i]) {
      ops.push_back(LineOp::kDelete);
      ++i;
    } else if (j < new_lines.size() && !keep_b[j]) {
      ops.push_back(LineOp::kInsert);
      ++j;
    } else {
      ops.push_back(LineOp::kEqual);
      ++i;
      ++j;
    }
  }
  ops.insert(ops.end(), tail, LineOp::kEqual);
  return ops;
}

std::string UnifiedHunks(std::string_view old_text, std::string_view new_text, int context) {
  if (old_text == new_text) return "";
  const std::size_t ctx = context < 0 ? 0 : static_cast<std::size_t>(context);
  std::vector<std::string_view> a = SplitLines(old_text);
  std::vector<std::string_view> b = SplitLines(new_text);
  std::vector<LineOp> ops = DiffLines(a, b);
  const std::size_t n = ops.size();

  // Line positions on each side before each op.
  std::vector<std::size_t> pos_a(n + 1), pos_b(n + 1);
  for (std::size_t k = 0; k < n; ++k) {
    pos_a[k + 1] = pos_a[k] + (ops[k] != LineOp::kInsert ? 1 : 0);
    pos_b[k + 1] = pos_b[k] + (ops[k] != LineOp::kDelete ? 1 : 0);
  }

  std::string out;
  std::size_t k = 0;
  while (k < n) {
    while (k < n && ops[k] == LineOp::kEqual) ++k;
    if (k == n) break;
    const std::size_t start = k >= ctx ? k - ctx : 0;
    std::size_t end = k;  // past the last change of the hunk
    for (;;) {
      while (end < n && ops[end] != LineOp::kEqual) ++end;
      std::size_t next = end;
      while (next < n && ops[next] == LineOp::kEqual) ++next;
      if (next < n && next - end <= 2 * ctx) {
        end = next;  // the next change's context would touch this one's
        continue;
      }
      break;
    }
    const std::size_t stop = std::min(n, end + ctx);

    out.append("@@ ");
    AppendRange(&out, '-', pos_a[start], pos_a[stop] - pos_a[start]);
    out.push_back(' ');
    AppendRange(&out, '+', pos_b[start], pos_b[stop] - pos_b[start]);
    out.append(" @@\n");
    for (std::size_t q = start; q < stop; ++q) {
      switch (ops[q]) {
        case LineOp::kEqual: AppendLine(&out, ' ', a[pos_a[q]]); break;
        case LineOp::kDelete: AppendLine(&out, '-', a[pos_a[q]]); break;
        case LineOp::kInsert: AppendLine(&out, '+', b[pos_b[q]]); break;
      }
    }
    k = stop;
  }
  return out;
}

Result<std::string> ApplyUnifiedHunks(std::string_view old_text, std::string_view hunks) {
  std::vector<std::string_view> old_lines = SplitLines(old_text);
  std::vector<std::string_view> patch = SplitLines(hunks);
  std::string out;
  std::size_t next_old = 0;  // index of the first old line not yet copied
  std::size_t p = 0;
  int hunk_number = 0;
  auto fail = [&](const std::string& why) {
    return Status::Error("patch", "hunk " + std::to_string(hunk_number) + " (patch line " +
                                      std::to_string(p + 1) + "): " + why);
  };
  while (p < patch.size()) {
    std::string_view header = patch[p];
    ++hunk_number;
    if (header.substr(0, 3) != "@@ ") return fail("expected a hunk header \"@@ -a,b +c,d @@\"");
    std::size_t close = header.find(" @@", 3);
    if (close == std::string_view::npos) return fail("unterminated hunk header");
    std::string_view ranges = header.substr(3, close - 3);
    std::size_t space = ranges.find(' ');
    std::size_t old_start = 0, old_count = 0, new_start = 0, new_count = 0;
    if (space == std::string_view::npos ||
        !ParseRange(ranges.substr(0, space), '-', &old_start, &old_count) ||
        !ParseRange(ranges.substr(space + 1), '+', &new_start, &new_count)) {
      return fail("malformed hunk ranges \"" + std::string(ranges) + "\"");
    }
    const std::size_t first = old_count == 0 ? old_start : old_start - 1;
    if (old_count > 0 && old_start == 0) return fail("hunk starts at line 0");
    if (first < next_old || first > old_lines.size()) return fail("hunk out of order or past the end");
    for (std::size_t i = next_old; i < first; ++i) out.append(old_lines[i]);
    next_old = first;
    ++p;

    std::size_t seen_old = 0, seen_new = 0;
    while (p < patch.size() && (seen_old < old_count || seen_new < new_count)) {
      std::string_view line = patch[p++];
      if (line.empty()) return fail("empty patch line");
      char prefix = line[0];
      if (prefix != ' ' && prefix != '-' && prefix != '+') return fail("unexpected line prefix");
      std::string body(line.substr(1));
      // "\ No newline at end of file" strips the '\n' of the line before.
      if (p < patch.size() && !patch[p].empty() && patch[p][0] == '\\') {
        if (!body.empty() && body.back() == '\n') body.pop_back();
        ++p;
      }
      if (prefix == ' ' || prefix == '-') {
        if (next_old >= old_lines.size() || old_lines[next_old] != body) {
          return fail("line " + std::to_string(next_old + 1) + " of the old text does not match");
        }
        ++next_old;
        ++seen_old;
      }
      if (prefix == ' ' || prefix == '+') {
        out.append(body);
        ++seen_new;
      }
    }
    if (seen_old != old_count || seen_new != new_count) return fail("hunk shorter than its header says");
  }
  for (std::size_t i = next_old; i < old_lines.size(); ++i) out.append(old_lines[i]);
  return out;
}

namespace {

// git's base85 alphabet (base85.c).
constexpr char kBase85[] =
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~";

// zlib's format (a header, deflate, adler32) at the default level, as git
// deflates. Memory is the only way it fails, which throws as any allocation.
std::string Deflate(std::string_view data) {
  z_stream z{};
  if (deflateInit(&z, Z_DEFAULT_COMPRESSION) != Z_OK) throw std::bad_alloc();
  std::string out(deflateBound(&z, static_cast<uLong>(data.size())), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) throw std::bad_alloc();
  return out;
}

// One hunk: "literal <size>", the base85 lines, an empty line.
void AppendBinaryHunk(std::string* out, std::string_view content) {
  out->append("literal ");
  AppendNumber(out, content.size());
  out->push_back('\n');
  const std::string deflated = Deflate(content);
  for (std::size_t at = 0; at < deflated.size(); at += 52) {
    const std::size_t bytes = std::min<std::size_t>(52, deflated.size() - at);
    out->push_back(bytes <= 26 ? static_cast<char>('A' + bytes - 1) : static_cast<char>('a' + bytes - 27));
    for (std::size_t group = 0; group < bytes; group += 4) {
      std::uint32_t acc = 0;
      for (std::size_t k = 0; k < 4; ++k) {
        const unsigned char c = group + k < bytes ? static_cast<unsigned char>(deflated[at + group + k]) : 0;
        acc |= static_cast<std::uint32_t>(c) << (24 - 8 * k);
      }
      char five[5];
      for (int k = 4; k >= 0; --k) {
        five[k] = kBase85[acc % 85];
        acc /= 85;
      }
      out->append(five, 5);
    }
    out->push_back('\n');
  }
  out->push_back('\n');
}

}  // namespace

// Files too large for memory never get here (the diff caps what it loads),
// so a 32-bit zlib length is enough; larger ones still fail closed.
std::string GitBinaryPatch(std::string_view old_content, std::string_view new_content) {
  if (old_content.size() > 0xffffffffu || new_content.size() > 0xffffffffu) throw std::length_error("binary patch");
  std::string out = "GIT binary patch\n";
  AppendBinaryHunk(&out, new_content);
  AppendBinaryHunk(&out, old_content);
  return out;
}

std::string GitBlobId(std::string_view content) {
  std::string header = "blob " + std::to_string(content.size());
  header.push_back('\0');
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (!ctx) throw std::bad_alloc();
  bool ok = EVP_DigestInit_ex(ctx, EVP_sha1(), nullptr) == 1 &&
            EVP_DigestUpdate(ctx, header.data(), header.size()) == 1 &&
            EVP_DigestUpdate(ctx, content.data(), content.size()) == 1 &&
            EVP_DigestFinal_ex(ctx, digest, &length) == 1;
  EVP_MD_CTX_free(ctx);
  if (!ok) throw std::runtime_error("SHA-1 of a blob failed (OpenSSL)");
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
}

}  // namespace agentbox::session
