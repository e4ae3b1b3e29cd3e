// Git smart-HTTP requests as the egress proxy sees them once it terminates
// TLS, and `git push` limited by ref (credentials.git.push).
//
// Pure: no sockets, no files, no global state; every function is
// thread-compatible and a PackIndex is immutable once built. The proxy
//   1. classifies each request (ClassifyGitRequest) and gives credentials only
//      to repositories credentials.git.remotes names (RemoteMatches);
//   2. for POST …/git-receive-pack, holds the whole body (de-chunked, bounded,
//      without Content-Encoding: git does not compress pushes, and a
//      compressed body fails to parse, which refuses it), parses it
//      (ParseReceivePack) and asks CheckPush;
//   3. forwards the body unchanged when the verdict allows it, and otherwise
//      answers itself, without contacting the server, with status 200,
//      Content-Type application/x-git-receive-pack-result and
//      RefusalResponseBody. Nothing of a refused push reaches the server.
//
// Fast-forwards are proven from the pack alone (the proxy never asks the
// server for history), so a fast-forward whose commits the server already has
// (pushing an existing commit to a branch, or history that runs through
// commits other refs hold) is not proven, and deny_force refuses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "agentbox/policy.h"
#include "agentbox/status.h"

namespace agentbox::net {

enum class GitService { kNone, kUploadPack, kReceivePack };

struct GitRequest {
  GitService service = GitService::kNone;
  bool advertisement = false;  // GET …/info/refs?service=git-… (else POST …/git-upload-pack | git-receive-pack)
  std::string repo_path;       // the path before "/info/refs" or "/git-…-pack", e.g. "/acme/app.git"; may be ""
};

// `path`: the normalised path without the query; `query`: the raw query
// string (may be empty). The endpoint names and the method are compared
// without regard to case and trailing slashes are ignored, so that no
// spelling a server might accept as a push escapes CheckPush. A GET of
// info/refs without exactly one service=git-upload-pack|git-receive-pack
// parameter (the dumb protocol) is kNone.
GitRequest ClassifyGitRequest(std::string_view method, std::string_view path, std::string_view query);

// Whether "https://host[:port]" + repo_path matches one of `remotes`
// ("https://github.com/acme/*"): `*` within one path segment, a `**` segment
// any number of segments; a trailing ".git" is optional on both sides; port
// 443 implied. `host` is normalised (net/rules.h NormaliseHost); a remote
// entry that is not an https URL with a host and no userinfo, query or
// fragment matches nothing.
bool RemoteMatches(const std::vector<std::string>& remotes, std::string_view host, std::uint16_t port,
                   std::string_view repo_path);

// Glob over '/'-separated names (ref names, repository paths): `*` and
// literal characters within one segment, a segment that is exactly `**` any
// number of segments (none included). Work is bounded by the product of the
// lengths.
bool SegmentGlobMatch(std::string_view pattern, std::string_view name);

struct RefUpdate {
  std::string old_oid, new_oid, ref;  // lower-case hex (40 for SHA-1, 64 for SHA-256); a full ref name
  bool operator==(const RefUpdate&) const = default;
};

struct ReceivePackRequest {
  std::vector<RefUpdate> updates;         // in request order; empty for git's 4-byte "0000" probe
  std::vector<std::string> capabilities;  // from the first command line, after NUL
  std::size_t oid_hex_len = 40;           // 64 with capability object-format=sha256
  std::string_view pack;                  // what follows the commands (and push options); points into the body,
                                          // which must outlive the request
  bool push_options = false;              // capability push-options: a section of options preceded the pack

  bool HasCapability(std::string_view name) const;
};

// Parses update-requests (gitprotocol-pack(5)): shallow lines, the command
// list (capabilities after NUL on the first), the push-options section when
// that capability was asked for, and the pack that follows. Refused with an
// error naming what is malformed: a truncated or bad pkt-line, an oid of the
// wrong length or not lower-case hex, a ref name git would not accept, a
// second command for one ref, or a push certificate (signed pushes are not
// supported: their commands live inside the certificate). Work is linear in
// the body; `pack` is not examined.
Result<ReceivePackRequest> ParseReceivePack(std::string_view body);

// Bounds on the work PackIndex::Build does for one pack; exceeding one is an
// error that names it.
struct PackLimits {
  std::uint32_t max_objects = 1u << 20;           // objects the pack may declare
  std::uint64_t max_inflated_bytes = 1ull << 30;  // bytes inflated in all, re-inflations included
  std::uint64_t max_commit_bytes = 16ull << 20;   // one commit's content (also a commit delta's result)
  std::uint64_t max_held_bytes = 64ull << 20;     // commit contents held at once along one delta chain
  std::uint32_t max_delta_depth = 4095;           // commit delta chains (pack-objects' own ceiling)
};

// The commits of a pack, by oid → parents. Built once per request from the
// pack format (gitformat-pack(5), versions 2 and 3): each object is inflated
// to find its end; only commits are kept, named by hashing
// "commit <size>\0<content>" (SHA-1, or SHA-256 for 64-hex oids). Commit
// deltas (OFS_DELTA, and REF_DELTA on a commit of the pack) are resolved;
// deltas on bases outside the pack (a thin pack) are left unresolved, their
// commits absent. The trailing pack checksum is verified. Memory: the parent
// lists, plus one chain of commit contents while resolving deltas.
class PackIndex {
 public:
  static Result<PackIndex> Build(std::string_view pack, std::size_t oid_hex_len, const PackLimits& limits = {});

  // The commit's parents in order, or nullptr when the commit is not in the
  // pack (or was a delta that could not be resolved). A commit git itself
  // would not parse has no parents here.
  const std::vector<std::string>* Parents(std::string_view oid) const;
  std::size_t commit_count() const { return parents_.size(); }
  std::uint32_t object_count() const { return objects_; }
  std::uint32_t resolved_deltas() const { return resolved_deltas_; }  // commit deltas resolved
  // REF_DELTAs (and deltas on them) whose base is not a commit of the pack:
  // outside it (a thin pack) or of another type.
  std::uint32_t unresolved_deltas() const { return unresolved_deltas_; }

 private:
  std::unordered_map<std::string, std::vector<std::string>> parents_;
  std::uint32_t objects_ = 0;
  std::uint32_t resolved_deltas_ = 0;
  std::uint32_t unresolved_deltas_ = 0;
};

enum class UpdateKind { kCreate, kDelete, kFastForward, kNotProvenFastForward };

// kDelete when new_oid is zero, kCreate when old_oid is; otherwise a
// fast-forward is proven when old_oid is new_oid or is reached through the
// parent links of commits in the pack, starting from new_oid (the last link
// may leave the pack: the old commit is the server's). Anything else is
// kNotProvenFastForward. Linear in the pack's commits.
UpdateKind Classify(const RefUpdate& update, const PackIndex& pack);

struct RefusedUpdate {
  RefUpdate update;
  std::string reason;  // "push to refs/heads/main refused by policy", one line
};

struct PushVerdict {
  std::vector<RefusedUpdate> refused;  // in request order
  bool allowed() const { return refused.empty(); }
};

// spec.allow_refs (SegmentGlobMatch over full ref names; empty = any ref):
// an update to another ref is refused ("push to REF refused by policy").
// spec.deny_force: a deletion ("deletion of REF …") and an update not proven
// a fast-forward ("forced update of REF …") are refused. The pack is parsed
// only then, once, and only when some allowed ref needs it; a pack that
// cannot be read refuses those updates, naming the error.
PushVerdict CheckPush(const GitPushSpec& spec, const ReceivePackRequest& request, const PackLimits& limits = {});

// The response body that makes git print "remote: agentbox: <reason>" and
// "! [remote rejected] <ref> (agentbox: <reason>)" for each refused ref.
// Honours the client's capabilities: with side-band-64k (or side-band) the
// reasons go on band 2 and the report on band 1; with report-status (or
// report-status-v2) the report is "unpack ok", then "ng <ref> agentbox:
// <reason>" for each refused ref and, since none of the push is applied,
// "ng <ref> agentbox: not applied: another ref in this push was refused"
// for the others; then the flush-pkt(s). A client that asked for neither
// gets an empty body: answer it with an HTTP error instead.
std::string RefusalResponseBody(const ReceivePackRequest& request, const PushVerdict& verdict);

}  // namespace agentbox::net
