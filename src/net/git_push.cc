// Smart-HTTP git requests, the receive-pack request grammar, the push policy
// and the report that refuses a push. The pack itself is read in git_pack.cc.
#include "net/git_push.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <unordered_set>

#include "net/http_request.h"
#include "net/http_text.h"
#include "net/rules.h"

namespace agentbox::net {
namespace {

Status RequestError(const std::string& message) { return Status::Error("git-push", message); }

char AsciiLower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool IEndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && IEquals(s.substr(s.size() - suffix.size()), suffix);
}

std::string_view TrimSlashes(std::string_view s) {
  while (!s.empty() && s.front() == '/') s.remove_prefix(1);
  while (!s.empty() && s.back() == '/') s.remove_suffix(1);
  return s;
}

// Text a user will read in one line of git's output.
std::string OneLine(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  return out;
}

std::vector<std::string_view> Segments(std::string_view s) {
  std::vector<std::string_view> parts;
  for (;;) {
    std::size_t slash = s.find('/');
    parts.push_back(s.substr(0, slash));
    if (slash == std::string_view::npos) return parts;
    s.remove_prefix(slash + 1);
  }
}

// `*` matches any run within the segment: greedy with one backtrack point,
// O(|pattern| × |text|) at worst.
bool SegmentMatch(std::string_view p, std::string_view t) {
  std::size_t pi = 0, ti = 0, star = std::string_view::npos, mark = 0;
  while (ti < t.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = ti;
    } else if (pi < p.size() && p[pi] == t[ti]) {
      ++pi;
      ++ti;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      ti = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

int HexDigit(char c) {
  c = AsciiLower(c);
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

// The percent-decoded value of the only `name` parameter; nullopt when it is
// absent, repeated or badly encoded.
std::optional<std::string> QueryParameter(std::string_view query, std::string_view name) {
  std::optional<std::string> found;
  for (std::size_t start = 0; start <= query.size();) {
    std::size_t amp = std::min(query.find('&', start), query.size());
    std::string_view part = query.substr(start, amp - start);
    start = amp + 1;
    std::size_t eq = part.find('=');
    if (part.substr(0, eq) != name) continue;
    if (found) return std::nullopt;
    std::string_view raw = eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1);
    std::string value;
    for (std::size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '%') {
        value.push_back(raw[i] == '+' ? ' ' : raw[i]);
        continue;
      }
      if (i + 2 >= raw.size() || HexDigit(raw[i + 1]) < 0 || HexDigit(raw[i + 2]) < 0) return std::nullopt;
      value.push_back(static_cast<char>(HexDigit(raw[i + 1]) * 16 + HexDigit(raw[i + 2])));
      i += 2;
    }
    found = std::move(value);
  }
  return found;
}

// A repository path pattern against a repository path: slashes at the ends
// ignored, ".git" optional on the last segment of either.
bool RepoPathMatches(std::string_view pattern, std::string_view repo_path) {
  auto strip_git = [](std::string_view s) {
    s = TrimSlashes(s);
    std::size_t last = s.rfind('/');
    std::string_view tail = last == std::string_view::npos ? s : s.substr(last + 1);
    if (tail.size() > 4 && tail.substr(tail.size() - 4) == ".git") s.remove_suffix(4);
    return s;
  };
  return SegmentGlobMatch(strip_git(pattern), strip_git(repo_path));
}

// --- the receive-pack request -------------------------------------------

constexpr std::size_t kMaxPktLine = 65520;  // LARGE_PACKET_MAX, the 4 length digits included

struct Pkt {
  bool flush = false;
  std::string_view payload;  // one trailing LF removed, as git's reader does
};

// pkt-lines over the body; `rest()` is what follows the last one read.
class PktReader {
 public:
  explicit PktReader(std::string_view body) : body_(body) {}

  Result<Pkt> Next() {
    auto where = [this] { return "pkt-line at offset " + std::to_string(pos_); };
    if (body_.size() - pos_ < 4) return RequestError("truncated " + where() + " (body ends inside its length)");
    std::size_t len = 0;
    for (std::size_t i = 0; i < 4; ++i) {
      int v = HexDigit(body_[pos_ + i]);
      if (v < 0) {
        return RequestError("bad " + where() + ": length \"" + OneLine(body_.substr(pos_, 4)) + "\" is not hex");
      }
      len = len * 16 + static_cast<std::size_t>(v);
    }
    if (len == 0) {
      pos_ += 4;
      return Pkt{true, {}};
    }
    if (len < 4)
      return RequestError("bad " + where() + ": a delimiter or response-end packet (" + std::to_string(len) + ")");
    if (len == 4) return RequestError("bad " + where() + ": empty pkt-line");
    if (len > kMaxPktLine) return RequestError("bad " + where() + ": length " + std::to_string(len) + " over 65520");
    if (len > body_.size() - pos_) {
      return RequestError("truncated " + where() + ": " + std::to_string(len) + " bytes declared, " +
                          std::to_string(body_.size() - pos_) + " left");
    }
    std::string_view payload = body_.substr(pos_ + 4, len - 4);
    pos_ += len;
    if (payload.back() == '\n') payload.remove_suffix(1);
    return Pkt{false, payload};
  }

  std::string_view rest() const { return body_.substr(pos_); }

 private:
  std::string_view body_;
  std::size_t pos_ = 0;
};

bool IsLowerHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// git check-ref-format's rules, and "refs/" in front (receive-pack refuses
// other names). A name git would refuse is refused here too, so that no
// spelling can slip past the allow_refs globs.
std::optional<std::string> RefNameProblem(std::string_view ref) {
  if (ref.substr(0, 5) != "refs/") return "does not start with refs/";
  if (ref.find("..") != std::string_view::npos) return "contains \"..\"";
  if (ref.find("@{") != std::string_view::npos) return "contains \"@{\"";
  for (char c : ref) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || std::string_view(" ~^:?*[\\").find(c) != std::string_view::npos) {
      return "contains a control character, space or one of ~^:?*[\\";
    }
  }
  if (ref.back() == '/' || ref.back() == '.') return "ends with / or .";
  for (std::string_view part : Segments(ref)) {
    if (part.empty()) return "has an empty component";
    if (part.front() == '.') return "has a component starting with .";
    if (part.size() >= 5 && part.substr(part.size() - 5) == ".lock") return "has a component ending with .lock";
  }
  return std::nullopt;
}

std::vector<std::string> SplitCapabilities(std::string_view list) {
  std::vector<std::string> caps;
  std::size_t start = 0;
  while (start < list.size()) {
    std::size_t space = list.find(' ', start);
    if (space == std::string_view::npos) space = list.size();
    if (space > start) caps.emplace_back(list.substr(start, space - start));
    start = space + 1;
  }
  return caps;
}

Result<std::size_t> OidLength(const std::vector<std::string>& caps) {
  for (const std::string& cap : caps) {
    if (cap.rfind("object-format=", 0) != 0) continue;
    std::string_view format = std::string_view(cap).substr(14);
    if (format == "sha1") return std::size_t{40};
    if (format == "sha256") return std::size_t{64};
    return RequestError("unsupported object-format \"" + OneLine(format) + "\"");
  }
  return std::size_t{40};
}

// --- the policy -----------------------------------------------------------

// What the command says by itself; kNotProvenFastForward stands for "an
// update whose proof needs the pack".
UpdateKind KindWithoutPack(const RefUpdate& u) {
  auto zero = [](const std::string& oid) {
    return std::all_of(oid.begin(), oid.end(), [](char c) { return c == '0'; });
  };
  if (zero(u.new_oid)) return UpdateKind::kDelete;
  if (zero(u.old_oid)) return UpdateKind::kCreate;
  if (u.old_oid == u.new_oid) return UpdateKind::kFastForward;
  return UpdateKind::kNotProvenFastForward;
}

std::string PktLine(std::string_view payload) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::size_t len = payload.size() + 4;
  std::string out = {kDigits[(len >> 12) & 15], kDigits[(len >> 8) & 15], kDigits[(len >> 4) & 15], kDigits[len & 15]};
  out.append(payload);
  return out;
}

}  // namespace

GitRequest ClassifyGitRequest(std::string_view method, std::string_view path, std::string_view query) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  auto endpoint = [&](std::string_view suffix, GitService service, bool advertisement) {
    return GitRequest{service, advertisement, std::string(path.substr(0, path.size() - suffix.size()))};
  };
  if (IEquals(method, "GET") && IEndsWith(path, "/info/refs")) {
    std::optional<std::string> service = QueryParameter(query, "service");
    if (!service) return {};
    if (IEquals(*service, "git-upload-pack")) return endpoint("/info/refs", GitService::kUploadPack, true);
    if (IEquals(*service, "git-receive-pack")) return endpoint("/info/refs", GitService::kReceivePack, true);
    return {};
  }
  if (IEquals(method, "POST")) {
    if (IEndsWith(path, "/git-upload-pack")) return endpoint("/git-upload-pack", GitService::kUploadPack, false);
    if (IEndsWith(path, "/git-receive-pack")) return endpoint("/git-receive-pack", GitService::kReceivePack, false);
  }
  return {};
}

bool SegmentGlobMatch(std::string_view pattern, std::string_view name) {
  std::vector<std::string_view> p = Segments(pattern), n = Segments(name);
  // match[i][j]: p[i..] matches n[j..]; filled from the ends.
  const std::size_t cols = n.size() + 1;
  std::vector<char> match((p.size() + 1) * cols, 0);
  auto at = [&](std::size_t i, std::size_t j) -> char& { return match[i * cols + j]; };
  at(p.size(), n.size()) = 1;
  for (std::size_t i = p.size(); i-- > 0;) {
    for (std::size_t j = n.size() + 1; j-- > 0;) {
      if (p[i] == "**") {
        at(i, j) = at(i + 1, j) || (j < n.size() && at(i, j + 1));
      } else {
        at(i, j) = j < n.size() && at(i + 1, j + 1) && SegmentMatch(p[i], n[j]);
      }
    }
  }
  return at(0, 0);
}

bool RemoteMatches(const std::vector<std::string>& remotes, std::string_view host, std::uint16_t port,
                   std::string_view repo_path) {
  constexpr std::string_view kScheme = "https://";
  for (std::string_view remote : remotes) {
    if (remote.size() < kScheme.size() || !IEquals(remote.substr(0, kScheme.size()), kScheme)) continue;
    remote.remove_prefix(kScheme.size());
    std::size_t slash = remote.find('/');
    std::string_view authority = remote.substr(0, slash);
    std::string_view path = slash == std::string_view::npos ? std::string_view() : remote.substr(slash);
    if (authority.find('@') != std::string_view::npos || path.find_first_of("?#") != std::string_view::npos) continue;
    auto split = SplitAuthority(authority, 443);
    if (!split || split->second != port) continue;
    Result<std::string> normal = NormaliseHost(split->first);
    if (!normal.ok() || *normal != host) continue;
    if (RepoPathMatches(path, repo_path)) return true;
  }
  return false;
}

bool ReceivePackRequest::HasCapability(std::string_view name) const {
  return std::find(capabilities.begin(), capabilities.end(), name) != capabilities.end();
}

Result<ReceivePackRequest> ParseReceivePack(std::string_view body) {
  if (body.empty()) return RequestError("empty receive-pack request");
  PktReader reader(body);
  ReceivePackRequest request;
  std::vector<std::string_view> shallow;
  std::unordered_set<std::string_view> refs;
  // The commands, after any shallow lines, up to the flush-pkt.
  for (;;) {
    Result<Pkt> pkt = reader.Next();
    if (!pkt.ok()) return pkt.status();
    if (pkt->flush) break;
    std::string_view line = pkt->payload;
    const bool first = request.updates.empty();
    if (first && line.substr(0, 8) == "shallow ") {
      shallow.push_back(line.substr(8));
      continue;
    }
    if (line.substr(0, line.find('\0')) == "push-cert") {
      return RequestError("signed pushes (push-cert) are not supported: unsign the push (git push --no-signed)");
    }
    std::size_t nul = line.find('\0');
    if (nul != std::string_view::npos) {
      if (!first) return RequestError("capabilities on a command other than the first");
      request.capabilities = SplitCapabilities(line.substr(nul + 1));
      Result<std::size_t> len = OidLength(request.capabilities);
      if (!len.ok()) return len.status();
      request.oid_hex_len = *len;
      line = line.substr(0, nul);
    }
    const std::size_t hex = request.oid_hex_len;
    if (line.size() < 2 * hex + 3 || line[hex] != ' ' || line[2 * hex + 1] != ' ' ||
        line.find(' ', 2 * hex + 2) != std::string_view::npos) {
      return RequestError("malformed command \"" + OneLine(line.substr(0, 200)) +
                          "\": expected <old-oid> <new-oid> <ref> with " + std::to_string(hex) + "-digit oids");
    }
    RefUpdate update{std::string(line.substr(0, hex)), std::string(line.substr(hex + 1, hex)),
                     std::string(line.substr(2 * hex + 2))};
    if (!IsLowerHex(update.old_oid) || !IsLowerHex(update.new_oid)) {
      return RequestError("command for " + OneLine(update.ref) + ": oids are not lower-case hex");
    }
    if (std::optional<std::string> problem = RefNameProblem(update.ref)) {
      return RequestError("ref name \"" + OneLine(update.ref) + "\" " + *problem);
    }
    if (!refs.insert(line.substr(2 * hex + 2)).second) {
      return RequestError("two commands for " + update.ref);
    }
    request.updates.push_back(std::move(update));
  }
  for (std::string_view oid : shallow) {
    if (oid.size() != request.oid_hex_len || !IsLowerHex(oid)) {
      return RequestError("malformed shallow line \"" + OneLine(oid.substr(0, 100)) + "\"");
    }
  }
  if (request.updates.empty()) {
    // git's probe before a large chunked request is the flush-pkt alone.
    if (!shallow.empty() || !reader.rest().empty()) return RequestError("data after an empty command list");
    return request;
  }
  request.push_options = request.HasCapability("push-options");
  if (request.push_options) {
    for (;;) {
      Result<Pkt> pkt = reader.Next();
      if (!pkt.ok()) return pkt.status().WithContext("push options");
      if (pkt->flush) break;
    }
  }
  request.pack = reader.rest();
  return request;
}

UpdateKind Classify(const RefUpdate& update, const PackIndex& pack) {
  UpdateKind kind = KindWithoutPack(update);
  if (kind != UpdateKind::kNotProvenFastForward) return kind;
  const std::vector<std::string>* start = pack.Parents(update.new_oid);
  if (!start) return kind;
  // Breadth first over the commits of the pack; each is visited once.
  std::unordered_set<std::string_view> seen{update.new_oid};
  std::deque<const std::vector<std::string>*> queue{start};
  while (!queue.empty()) {
    const std::vector<std::string>* parents = queue.front();
    queue.pop_front();
    for (const std::string& parent : *parents) {
      if (parent == update.old_oid) return UpdateKind::kFastForward;
      if (!seen.insert(parent).second) continue;
      if (const std::vector<std::string>* next = pack.Parents(parent)) queue.push_back(next);
    }
  }
  return kind;
}

PushVerdict CheckPush(const GitPushSpec& spec, const ReceivePackRequest& request, const PackLimits& limits) {
  PushVerdict verdict;
  std::optional<Result<PackIndex>> pack;  // built on the first update that needs it
  for (const RefUpdate& update : request.updates) {
    auto refuse = [&](std::string reason) { verdict.refused.push_back({update, OneLine(reason)}); };
    if (!spec.allow_refs.empty() &&
        std::none_of(spec.allow_refs.begin(), spec.allow_refs.end(),
                     [&](const std::string& glob) { return SegmentGlobMatch(glob, update.ref); })) {
      refuse("push to " + update.ref + " refused by policy");
      continue;
    }
    if (!spec.deny_force) continue;
    UpdateKind kind = KindWithoutPack(update);
    if (kind == UpdateKind::kDelete) {
      refuse("deletion of " + update.ref + " refused by policy");
      continue;
    }
    if (kind != UpdateKind::kNotProvenFastForward) continue;
    if (!pack) pack.emplace(PackIndex::Build(request.pack, request.oid_hex_len, limits));
    if (!pack->ok()) {
      refuse("update of " + update.ref + " refused by policy: " + pack->status().message());
    } else if (Classify(update, **pack) != UpdateKind::kFastForward) {
      refuse("forced update of " + update.ref + " refused by policy");
    }
  }
  return verdict;
}

std::string RefusalResponseBody(const ReceivePackRequest& request, const PushVerdict& verdict) {
  const bool sideband64 = request.HasCapability("side-band-64k");
  const bool sideband = sideband64 || request.HasCapability("side-band");
  const bool report = request.HasCapability("report-status") || request.HasCapability("report-status-v2");

  std::string status;
  if (report) {
    status += PktLine("unpack ok\n");
    for (const RefUpdate& update : request.updates) {
      auto refused = std::find_if(verdict.refused.begin(), verdict.refused.end(),
                                  [&](const RefusedUpdate& r) { return r.update.ref == update.ref; });
      std::string why =
          refused != verdict.refused.end() ? refused->reason : "not applied: another ref in this push was refused";
      status += PktLine("ng " + update.ref + " agentbox: " + OneLine(why) + "\n");
    }
    status += "0000";
  }
  if (!sideband) return status;

  // Band 2 is printed as "remote: …"; band 1 carries the report, cut to the
  // band's packet size (LARGE_PACKET_MAX, or 1000 for side-band).
  const std::size_t max_data = (sideband64 ? kMaxPktLine : 1000) - 5;
  std::string out;
  for (const RefusedUpdate& r : verdict.refused) {
    out += PktLine("\2agentbox: " + OneLine(r.reason).substr(0, max_data - 11) + "\n");
  }
  for (std::size_t at = 0; at < status.size(); at += max_data) {
    out += PktLine("\1" + status.substr(at, max_data));
  }
  out += "0000";
  return out;
}

}  // namespace agentbox::net
