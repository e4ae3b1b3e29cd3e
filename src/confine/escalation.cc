// Escalation offers: one denial → at most one grant, held against the
// plan's ceiling. docs/report.md ("escalation") lists the shapes.
#include "confine/escalation.h"

#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <system_error>

#include <nlohmann/json.hpp>

#include "confine/paths.h"
#include "net/rules.h"
#include "policy/sha256.h"

namespace agentbox {
namespace {

constexpr std::uint64_t kGiB = 1ULL << 30;

bool StartsWith(const std::string& text, std::string_view prefix) { return text.rfind(prefix, 0) == 0; }

EscalationOffer Within(EscalationOffer offer) {
  offer.within_ceiling = true;
  return offer;
}

EscalationOffer Beyond(EscalationOffer offer, std::string why) {
  offer.within_ceiling = false;
  offer.why_not = std::move(why);
  return offer;
}

// "host:port" (an IPv6 host in brackets) → host and port.
bool SplitTarget(const std::string& target, std::string* host, std::uint16_t* port) {
  const std::size_t colon = target.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == target.size()) return false;
  unsigned value = 0;
  const char* begin = target.data() + colon + 1;
  const char* end = target.data() + target.size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr != end || value == 0 || value > 65535) return false;
  *host = target.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  *port = static_cast<std::uint16_t>(value);
  return true;
}

// network.allow: the host:port as denied. Refusals a network.allow entry
// does not lift (the address guard, an SNI mismatch, a bad request, L7
// rules) get no offer; a network.deny entry wins over any allow entry.
std::optional<EscalationOffer> NetworkOffer(const Denial& d, const EscalationPlan& e) {
  if (d.op != "connect") return std::nullopt;
  const bool liftable = StartsWith(d.reason, "not-allowed") || StartsWith(d.reason, "ask-denied") ||
                        StartsWith(d.reason, "ask-busy") || StartsWith(d.reason, "deny-rule");
  if (!liftable) return std::nullopt;
  std::string host;
  std::uint16_t port = 0;
  if (!SplitTarget(d.target, &host, &port)) return std::nullopt;
  Result<std::string> normalised = net::NormaliseHost(host);
  if (!normalised.ok()) return std::nullopt;
  EscalationOffer offer = MakeOffer("network.allow", d.target, std::nullopt);
  if (StartsWith(d.reason, "deny-rule")) {
    return Beyond(offer, d.target + " is refused by network.deny, which no grant overrides");
  }
  for (const std::string& entry : e.network) {
    Result<net::Rule> rule = net::ParseRule(entry, net::ListKind::kAllow);
    if (rule.ok() && net::Matches(*rule, *normalised, port)) return Within(offer);
  }
  if (e.network.empty()) {
    return Beyond(offer, "on_violation.max_grant.network is empty: no network grant is within the ceiling");
  }
  return Beyond(offer, "on_violation.max_grant.network does not cover " + d.target);
}

// Whether `path` (absolute) is `entry` or lies under it; `entry` absolute or
// relative to `workspace`, possibly a gitignore-style glob. A `**/` entry
// counts everywhere: a credential file outside the workspace is one too.
bool Under(const std::string& path, const std::string& entry, const std::string& workspace) {
  if (entry.empty()) return false;
  if (entry[0] == '/' && !paths::HasGlob(entry)) return paths::IsWithin(path, entry);
  std::string relative;
  if (entry[0] == '/') {
    relative = path.substr(1);  // GlobMatch keeps a leading '/' anchored
  } else if (!workspace.empty() && paths::IsWithin(path, workspace) && path != workspace) {
    relative = path.substr(workspace == "/" ? 1 : workspace.size() + 1);
  } else if (StartsWith(entry, "**/")) {
    relative = path.substr(1);
  } else {
    return false;
  }
  // Every prefix: a match on a directory covers what lies below it.
  for (std::size_t end = relative.find('/'); ; end = relative.find('/', end + 1)) {
    const std::string prefix = relative.substr(0, end);
    if (!prefix.empty() && GlobMatch(entry, prefix)) return true;
    if (end == std::string::npos) return false;
  }
}

std::optional<std::string> NeverEntry(const std::string& path, const Plan& plan) {
  for (const std::string& entry : plan.escalation.never) {
    if (Under(path, entry, plan.workspace_target)) return entry;
  }
  return std::nullopt;
}

// What a write to `path` would touch that no grant lifts: a protect entry,
// a repository's protected names (.git/hooks, .git/config), or, for a
// rename or removal, an ancestor of one of them.
bool Protected(const std::string& path, const std::string& op, const Plan& plan) {
  const bool moves = op == "rename" || op == "remove";
  for (const std::string& p : plan.escalation.protect) {
    if (paths::IsWithin(path, p) || (moves && paths::IsWithin(p, path))) return true;
  }
  for (const std::string& name : plan.protect_git) {
    const std::string inner = "/.git/" + name;
    const std::size_t at = path.find(inner);
    if (at != std::string::npos && (at + inner.size() == path.size() || path[at + inner.size()] == '/')) return true;
  }
  if (moves && (path.size() >= 5 && path.compare(path.size() - 5, 5, "/.git") == 0)) return true;
  return false;
}

// filesystem.read / filesystem.read_write of the path denied.
std::optional<EscalationOffer> FilesystemOffer(const Denial& d, const Plan& plan, const PathExists& exists) {
  // The seccomp layer's filesystem denials are set-id bits and unix sockets;
  // the git audit's are planted hooks and configs: no grant lifts them.
  if (d.source == "seccomp" || d.source == "git-audit" || d.target.empty()) return std::nullopt;
  const bool read = d.op == "access" || d.op == "read";
  const bool write = d.op == "write" || d.op == "create" || d.op == "rename" || d.op == "remove";
  if (!read && !write) return std::nullopt;
  // A relative path, as a tool printed it, is taken from the workspace, where commands start.
  std::string path = d.target[0] == '/' ? d.target : paths::Join(plan.workspace_target, d.target);
  if (path.find("/../") != std::string::npos || path.find("/./") != std::string::npos ||
      (path.size() >= 3 && path.compare(path.size() - 3, 3, "/..") == 0)) {
    return std::nullopt;  // not a path to scope a grant to
  }
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (write && Protected(path, d.op, plan)) return std::nullopt;
  std::string granted = path;
  if (write) {
    while (granted != "/" && !exists(granted)) granted = paths::Parent(granted);
  }
  const char* key = read ? "filesystem.read" : "filesystem.read_write";
  EscalationOffer offer = MakeOffer(key, granted, std::nullopt);
  for (const std::string& p : {path, granted}) {
    if (auto entry = NeverEntry(p, plan)) {
      return Beyond(offer, p + " lies under \"" + *entry + "\" (filesystem.deny, a credential path or agentbox's "
                           "own), which no grant opens");
    }
  }
  const std::vector<std::string>& trees = read ? plan.escalation.filesystem_read : plan.escalation.filesystem_write;
  const char* list = read ? "on_violation.max_grant.filesystem_read" : "on_violation.max_grant.filesystem_write";
  for (const std::string& tree : trees) {
    if (paths::IsWithin(granted, tree)) return Within(offer);
  }
  if (trees.empty()) return Beyond(offer, std::string(list) + " is empty: no such grant is within the ceiling");
  return Beyond(offer, granted + " is not within " + list);
}

std::optional<EscalationOffer> SyscallOffer(const Denial& d, const EscalationPlan& e) {
  if (!SyscallDeniedOutright(d.op)) return std::nullopt;  // denied by its arguments: no grant names that
  EscalationOffer offer = MakeOffer("syscalls.allow", d.op, std::nullopt);
  if (auto problem = SyscallGrantProblem(d.op)) return Beyond(offer, *problem);
  if (std::find(e.syscalls.begin(), e.syscalls.end(), d.op) != e.syscalls.end()) return Within(offer);
  return Beyond(offer, "on_violation.max_grant.syscalls does not name " + d.op);
}

// resources.memory_gib: twice the limit in force, in whole GiB, at most the
// ceiling. Nothing to offer without a limit, or with one at the ceiling.
std::optional<EscalationOffer> MemoryOffer(const Plan& plan) {
  if (!plan.limits.memory_max_bytes || *plan.limits.memory_max_bytes == 0) return std::nullopt;
  const std::uint64_t limit = *plan.limits.memory_max_bytes;
  std::uint64_t gib = (2 * limit + kGiB - 1) / kGiB;
  const std::optional<std::uint64_t>& cap = plan.escalation.memory_max_bytes;
  if (!cap) {
    return Beyond(MakeOffer("resources.memory_gib", "", gib),
                  "on_violation.max_grant.memory_gib is not set: no memory grant is within the ceiling");
  }
  const std::uint64_t cap_gib = *cap / kGiB;
  gib = std::min(gib, cap_gib);
  if (gib * kGiB <= limit) return std::nullopt;  // already at the ceiling
  return Within(MakeOffer("resources.memory_gib", "", gib));
}

}  // namespace

EscalationOffer MakeOffer(const std::string& key, const std::string& text, std::optional<std::uint64_t> gib) {
  EscalationOffer offer;
  offer.grant_key = key;
  offer.grant_text = text;
  offer.grant_gib = gib;
  nlohmann::json grant = nlohmann::json::object();
  if (gib) {
    grant[key] = *gib;
  } else {
    grant[key] = text;
  }
  offer.grant_json = grant.dump();
  offer.id = "esc-" + Sha256Hex(offer.grant_json).substr(0, 12);
  return offer;
}

std::optional<EscalationOffer> OfferFor(const Denial& denial, const Plan& plan, const PathExists& exists) {
  if (!plan.escalation.offers || !plan.confined) return std::nullopt;
  // A run_code program has no network whatever the policy allows: no grant gives it one.
  if (denial.source == "run_code") return std::nullopt;
  if (denial.facet == "network") return NetworkOffer(denial, plan.escalation);
  if (denial.facet == "filesystem") return FilesystemOffer(denial, plan, exists);
  if (denial.facet == "syscalls") return SyscallOffer(denial, plan.escalation);
  if (denial.facet == "resources" && denial.op == "memory") return MemoryOffer(plan);
  return std::nullopt;  // disk_gib and the rest: no grant in this version
}

Status ApplyGrant(const EscalationOffer& grant, Policy* policy) {
  auto add = [](std::vector<std::string>* list, const std::string& entry) {
    if (std::find(list->begin(), list->end(), entry) == list->end()) list->push_back(entry);
  };
  const std::string& key = grant.grant_key;
  if (key == "resources.memory_gib") {
    if (!grant.grant_gib || *grant.grant_gib == 0) return Status::Error("grant", key + " needs a whole number of GiB");
    policy->resources.memory_limit_bytes = *grant.grant_gib * kGiB;
    policy->sha256.clear();
    return {};
  }
  if (grant.grant_text.empty()) return Status::Error("grant", key + " needs a value");
  if (key == "network.allow") {
    add(&policy->network.allow, grant.grant_text);
  } else if (key == "filesystem.read") {
    add(&policy->filesystem.read_only, grant.grant_text);
  } else if (key == "filesystem.read_write") {
    add(&policy->filesystem.read_write, grant.grant_text);
  } else if (key == "syscalls.allow") {
    add(&policy->granted.syscalls, grant.grant_text);
  } else {
    return Status::Error("grant", "'" + key + "' is not a grant (network.allow, filesystem.read, "
                                  "filesystem.read_write, syscalls.allow, resources.memory_gib)");
  }
  policy->sha256.clear();  // the file's digest no longer names what is in force
  return {};
}

Result<EscalationOffer> OfferFromGrant(const std::string& grant_json) {
  nlohmann::json grant = nlohmann::json::parse(grant_json, nullptr, false);
  if (!grant.is_object() || grant.size() != 1) return Status::Error("grant", "a grant is one key and its value");
  const std::string key = grant.begin().key();
  const nlohmann::json& value = grant.begin().value();
  if (key == "resources.memory_gib") {
    if (!value.is_number_unsigned() || value.get<std::uint64_t>() == 0) {
      return Status::Error("grant", key + " needs a whole number of GiB");
    }
    return MakeOffer(key, "", value.get<std::uint64_t>());
  }
  if (key != "network.allow" && key != "filesystem.read" && key != "filesystem.read_write" && key != "syscalls.allow") {
    return Status::Error("grant", "'" + key + "' is not a grant");
  }
  if (!value.is_string() || value.get<std::string>().empty()) return Status::Error("grant", key + " needs a value");
  return MakeOffer(key, value.get<std::string>(), std::nullopt);
}

void AttachOffers(const Plan& plan, std::vector<Denial>* denials) {
  if (!plan.escalation.offers) return;
  const PathExists exists = [&plan](const std::string& path) {
    std::string host = path;
    if (!plan.workspace_target.empty() && paths::IsWithin(path, plan.workspace_target)) {
      host = paths::Rebase(path, plan.workspace_target, plan.workspace_source);
    }
    struct stat st {};
    return lstat(host.c_str(), &st) == 0;
  };
  auto mounted = [&plan](const std::string& path) {
    for (const MountOp& m : plan.mounts) {
      if (m.target == "/" || m.kind == MountKind::kSymlink || m.kind == MountKind::kFile) continue;
      if (m.kind == MountKind::kDir) continue;  // a ceiling tree's empty directory mounts nothing
      if (paths::IsWithin(path, m.target)) return true;
    }
    return false;
  };
  denials->erase(std::remove_if(denials->begin(), denials->end(),
                                [&](const Denial& d) {
                                  if (d.reason != kNotMountedReason || d.target.empty()) return false;
                                  const std::string path =
                                      d.target[0] == '/' ? d.target : paths::Join(plan.workspace_target, d.target);
                                  return mounted(path) || !exists(path);
                                }),
                 denials->end());
  for (Denial& d : *denials) d.escalation = OfferFor(d, plan, exists);
}

}  // namespace agentbox
