// Sessions on disk and in memory (session.h).
//
// State directory:
//   lock                     flock'd by the one process serving this state dir
//   sessions/<id>/session.json   the recipe: policy text, base workspace, layers, mode
//   sessions/<id>/log.jsonl      the durable log: call, then result (on disk before the result is returned)
//   sessions/<id>/upper, work    overlay mode: the session's own layer (with disk_gib
//                            it is on a tmpfs of that size instead, held by an fd)
//   sessions/<id>/spill/upper    that tmpfs layer, written here when the process stops
//   sessions/<id>/copy           copy mode: the session's full copy
//   snapshots/<id>/manifest.json, tree/    frozen changes (layers.h)
//   snapshots/<id>/owner.json    the session it was taken from, whether it outlives it
#include "session/session.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <deque>
#include <set>
#include <shared_mutex>
#include <thread>

#include <yaml-cpp/yaml.h>

#include "agentbox/confine.h"
#include "agentbox/host_caps.h"
#include "agentbox/outcome.h"
#include "agentbox/policy.h"
#include "confine/escalation.h"
#include "confine/layers.h"
#include "confine/paths.h"
#include "linux/fd.h"
#include "linux/git_repos.h"
#include "linux/random.h"
#include "linux/seccomp_notify.h"
#include "linux/user_dirs.h"
#include "mcp/tools.h"
#include "session/code_mode.h"
#include "session/durable_log.h"
#include "session/file_tools.h"
#include "session/layers.h"
#include "session/remote_world.h"
#include "k8s/client.h"
#include "k8s/render.h"
#include "session/port_bridge.h"
#include "session/services.h"
#include "session/tool_inputs.h"
#include "session/upper_image.h"
#include "net/proxy.h"
#include "net/rules.h"
#include "gateway/gateway.h"
#include "net/secrets.h"
#include "report/json_text.h"
#include "report/report_json.h"
#include "session/terminal.h"
#include "session/world.h"
#include "supervise/approver.h"
#include "supervise/denial_scanner.h"
#include "supervise/disk_limit.h"
#include "supervise/egress.h"
#include "supervise/resources.h"

namespace agentbox::session {
namespace {

using Clock = std::chrono::steady_clock;
using linux::UniqueFd;

constexpr std::size_t kMaxPatchBytes = 8u << 20;
// The identity of the base's entries when the session was created (RecordBase).
constexpr const char* kBaseRecordName = "base.record";
// Beside a snapshot's manifest: {"session": the id it was taken from, "keep": bool, "taken_ns"}.
constexpr const char* kSnapshotOwnerFile = "owner.json";
// A snapshot kept on a remote (remote_world.h): its directory here holds
// this record (whose remote, taken how) and the owner file, no tree.
constexpr const char* kRemoteSnapshotFile = "remote.json";
constexpr int kFileToolTimeoutMs = 30000;  // a file tool's deadline: then timed_out, its process killed
// upper_fs auto: from this cap on, an image on disk rather than memory.
constexpr std::uint64_t kUpperImageFromBytes = 4ULL << 30;

const std::vector<std::string> kTools = {"bash", "read_file", "write_file", "edit_file", "list_dir", "glob"};

std::string RandomId(const char* prefix) { return prefix + linux::RandomHex(8); }

bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  return std::all_of(id.begin(), id.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-'; });
}

// agentbox's own directories, this Manager's state directory among them.
std::vector<std::string> OwnDirsWith(const std::string& state_dir) {
  auto dirs = linux::OwnDirs(linux::HomeDir());
  if (std::find(dirs.begin(), dirs.end(), state_dir) == dirs.end()) dirs.push_back(state_dir);
  return dirs;
}

std::string RealPath(const std::string& p) {
  char buf[PATH_MAX];
  return realpath(p.c_str(), buf) ? std::string(buf) : std::string();
}

Status WriteFileDurably(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) return Status::Errno("session", "open", tmp);
  size_t off = 0;
  while (off < data.size()) {
    ssize_t w = write(fd.get(), data.data() + off, data.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Status::Errno("session", "write", tmp);
    off += static_cast<size_t>(w);
  }
  if (fsync(fd.get()) != 0) return Status::Errno("session", "fsync", tmp);
  if (rename(tmp.c_str(), path.c_str()) != 0) return Status::Errno("session", "rename", path);
  const std::string dir = path.substr(0, path.rfind('/'));
  UniqueFd d(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.valid()) fsync(d.get());
  return {};
}

Result<std::string> ReadWholeFile(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno(errno == ENOENT ? kNotFound : "session", "open", path);
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t r = read(fd.get(), buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::Errno("session", "read", path);
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}

// Removes a tree the sandbox may have left unreadable to us (overlayfs's
// work directory is mode 0000): permissions are opened as it goes. Never
// follows a symlink.
void RemoveTreeAt(int parent, const char* name) {
  struct stat st {};
  if (fstatat(parent, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    fchmodat(parent, name, 0700, 0);
    int fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      DIR* dir = fdopendir(fd);
      if (dir) {
        std::vector<std::string> names;
        while (struct dirent* e = readdir(dir)) {
          if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
        }
        for (const auto& n : names) RemoveTreeAt(dirfd(dir), n.c_str());
        closedir(dir);
      } else {
        close(fd);
      }
    }
    unlinkat(parent, name, AT_REMOVEDIR);
  } else {
    unlinkat(parent, name, 0);
  }
}

void RemoveTree(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return;
  const std::string parent = slash == 0 ? "/" : path.substr(0, slash);
  UniqueFd p(open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (p.valid()) RemoveTreeAt(p.get(), path.substr(slash + 1).c_str());
}

Result<Policy> BuildPolicy(const std::string& yaml, const std::string& mode) {
  Result<Policy> base = yaml.empty() ? Result<Policy>(PresetFor(Mode::kWorkspaceWrite)) : ParsePolicy(yaml, "policy");
  if (!base.ok()) return Status::Error(kBadRequest, base.status().message());
  if (mode.empty()) return base;
  PolicyOverrides o;
  o.mode = ParseMode(mode);
  if (!o.mode) {
    return Status::Error(kBadRequest, "mode '" + mode + "' is not one of read-only, workspace-write, danger-full-access");
  }
  auto p = ApplyOverrides(std::move(*base), o, !yaml.empty());
  if (!p.ok()) return Status::Error(kBadRequest, p.status().message());
  p->sha256.clear();
  return p;
}

// A remote world's first provisioning connects, may copy agentbox there and
// copies the workspace there: it may take longer than a local world's.
constexpr int kRemoteReadyTimeoutMs = 300000;

// What a remote session (sandbox.isolation: remote) cannot have in this
// version, refused when it is created rather than at its first call.
Status CheckRemoteSession(const Policy& policy, const CreateRequest& request) {
  const RemoteSpec& r = *policy.sandbox.remote;
  if (!request.from_snapshot.empty() && r.kubernetes) {
    return Status::Error(kBadRequest, "from_snapshot: a Kubernetes session's snapshots would go with its claimed "
                                      "pod, so none are kept to start from");
  }
  if (policy.sandbox.snapshot_on_exit && r.kubernetes) {
    return Status::Error(kBadRequest, "sandbox.snapshot_on_exit: a Kubernetes world's workspace goes with its "
                                      "claimed pod, and a snapshot kept there would go with it");
  }
  return {};
}

// The remote's side of a remote session's world: the destination as ssh
// takes it ([user@]host, the port apart) and the policy as the remote gets
// it (env.pass resolved here: the remote's environment is not the caller's).
RemotePlan RemotePlanFor(const Policy& policy, const std::string& session, const std::string& workspace,
                         const std::string& exe) {
  const RemoteSpec& r = *policy.sandbox.remote;
  RemotePlan out;
  out.ssh = r.ssh;
  // host:port and [v6]:port carry a port, which ssh takes apart (-p).
  if (const auto open = out.ssh.find('['); open != std::string::npos) {
    const auto close = out.ssh.find(']');
    if (close != std::string::npos && close + 1 < out.ssh.size() && out.ssh[close + 1] == ':') {
      out.port = out.ssh.substr(close + 2);
      out.ssh.erase(close + 1);
    }
    if (out.ssh.back() == ']') out.ssh = out.ssh.substr(0, open) + out.ssh.substr(open + 1, out.ssh.size() - open - 2);
  } else if (std::count(out.ssh.begin(), out.ssh.end(), ':') == 1) {
    const auto colon = out.ssh.find(':');
    out.port = out.ssh.substr(colon + 1);
    out.ssh.erase(colon);
  }
  out.ssh_config = r.ssh_config;
  if (out.ssh_config.rfind("~/", 0) == 0) out.ssh_config = linux::HomeDir() + out.ssh_config.substr(1);
  if (r.kubernetes) {
    out.k8s_namespace = r.kubernetes->namespace_name;
    out.k8s_template = r.kubernetes->template_name;
    out.k8s_context = r.kubernetes->context;
    out.k8s_kubeconfig = r.kubernetes->kubeconfig;
    if (out.k8s_kubeconfig.rfind("~/", 0) == 0) out.k8s_kubeconfig = linux::HomeDir() + out.k8s_kubeconfig.substr(1);
  }
  // A pod's level is its runtime (gVisor, Kata: `agentbox k8s render`);
  // inside it, agentbox confines each call with namespaces.
  out.level = r.kubernetes ? ToString(Isolation::kOs) : ToString(r.level);
  out.workspace = workspace;
  out.session = session;
  Policy sent = policy;
  Plan env;
  env.env.pass = policy.env.pass;
  env.env.set = policy.env.set;
  sent.env.set = WithResolvedEnv(env).env.set;
  sent.env.pass.clear();
  out.policy_yaml = ToYaml(sent);
  out.binary = RemoteBinaryFor(exe);
  return out;
}

// A session's policy: its recipe's, widened by the session's grants
// (recipe "grants": approved escalations for the session, but network ones)
// and `extra` (one-call grants that need a world of their own), with what
// PATCH .../policy and network grants changed since (recipe "network_live":
// the network lists in force now).
Result<Policy> SessionPolicy(const Json& recipe, const std::vector<EscalationOffer>& extra = {}) {
  auto policy = BuildPolicy(recipe.value("policy_yaml", ""), recipe.value("mode", ""));
  if (!policy.ok()) return policy;
  if (recipe.contains("grants") && recipe["grants"].is_array()) {
    for (const Json& g : recipe["grants"]) {
      auto offer = OfferFromGrant(g.is_string() ? g.get<std::string>() : g.dump());
      if (!offer.ok()) return Status::Error("session", "session.json grants: " + offer.status().message());
      if (Status a = ApplyGrant(*offer, &*policy); !a.ok()) return a;
    }
  }
  for (const EscalationOffer& offer : extra) {
    if (Status a = ApplyGrant(offer, &*policy); !a.ok()) return a;
  }
  if (!recipe.contains("network_live")) return policy;
  const Json& live = recipe["network_live"];
  policy->network.allow = live.value("allow", std::vector<std::string>{});
  policy->network.deny = live.value("deny", std::vector<std::string>{});
  for (const EscalationOffer& offer : extra) {
    if (offer.grant_key == "network.allow") (void)ApplyGrant(offer, &*policy);
  }
  return policy;
}

// The record of a snapshot kept on a remote (kRemoteSnapshotFile), checked:
// not_found when `dir` holds none.
Result<Json> ReadRemoteSnapshotRecord(const std::string& dir) {
  const std::string path = dir + "/" + kRemoteSnapshotFile;
  auto text = ReadWholeFile(path);
  if (!text.ok()) return Status::Error(kNotFound, "no remote snapshot record at " + path);
  Json record = Json::parse(*text, nullptr, false);
  if (!record.is_object()) return Status::Error(kConflict, path + " is corrupt: not a JSON object");
  for (const char* key : {"policy_yaml", "mode", "session", "workspace", "created", "remote"}) {
    if (!record.contains(key) || !record[key].is_string()) {
      return Status::Error(kConflict, path + " is corrupt: \"" + key + "\" is not a string");
    }
  }
  return record;
}

// The connection to the remote a snapshot record names, as its session's was.
Result<RemotePlan> RemoteSnapshotPlan(const Json& record, const std::string& exe) {
  auto policy = BuildPolicy(record.value("policy_yaml", ""), record.value("mode", ""));
  if (!policy.ok()) return policy.status();
  if (!policy->sandbox.remote || policy->sandbox.remote->kubernetes) {
    return Status::Error(kConflict, "a remote snapshot's record names no ssh remote");
  }
  return RemotePlanFor(*policy, record.value("session", ""), record.value("workspace", ""), exe);
}

// Why a grant of `key` needs a world of its own.
std::string WhyNewWorld(const std::string& key) {
  if (key == "syscalls.allow") return "a seccomp filter cannot be loosened in a running world";
  if (key == "resources.memory_gib") {
    return "a one-call memory limit is not lowered again in a world that goes on: what the call left running "
           "would be killed";
  }
  return "a one-call mount is not taken back from a world that goes on: what the call left running could keep "
         "what it opened below it";
}

// The first line of a failed call's output names the kind.
std::string DenialLine(const Json& d) {
  const std::string facet = d.value("facet", "");
  if (facet == "network") return "network egress to " + d.value("target", "") + " refused: " + d.value("reason", "");
  if (facet == "syscalls") {
    return "syscall " + d.value("op", "") + " blocked by the seccomp filter (" + std::to_string(d.value("count", 0)) +
           " call(s))";
  }
  std::string line = d.value("op", "access") + " " + d.value("target", "");
  if (!d.value("reason", "").empty()) line += ": " + d.value("reason", "");
  return line;
}

// A file tool's failure that the shell's would be a denial: the same
// signatures (a protected path, a mask, a denied path) judge the line the
// shell would print for it, e.g. a write below .git/hooks where `.git` is
// the placeholder file (ENOTDIR, which the tool reports as a plain error).
std::optional<Json> FileToolDenial(const ConfinedCommand& confined, const std::string& name, const Json& input,
                                   const std::string& error) {
  if (name != "write_file" && name != "edit_file" && name != "read_file" && name != "list_dir") return std::nullopt;
  const std::string path = input.is_object() ? input.value("path", "") : "";
  if (path.empty()) return std::nullopt;
  const std::string target = path[0] == '/' ? path : paths::Join(confined.plan.workspace_target, path);
  // The errno text the shell would print for the tool's failure.
  std::string errno_text;
  if (error.find("Not a directory") != std::string::npos || error.find(" is not a directory") != std::string::npos) {
    errno_text = "Not a directory";
  } else if (error.find("No such file or directory") != std::string::npos ||
             error.find(" does not exist") != std::string::npos) {
    errno_text = "No such file or directory";
  } else {
    return std::nullopt;
  }
  supervise::DenialScanner scanner(confined.denial_signatures);
  const std::string line = "'" + target + "': " + errno_text + "\n";
  scanner.Feed(line.data(), line.size());
  scanner.Finish();
  if (scanner.denials().empty()) return std::nullopt;
  const Denial& d = scanner.denials().front();
  const bool writes = name == "write_file" || name == "edit_file";
  // With its escalation offer, as a bash call's denials get theirs.
  std::vector<Denial> denials = {Denial{d.facet, writes ? "write" : "read", target, d.reason, "file-tool", 0}};
  AttachOffers(confined.plan, &denials);
  return ToJsonValue(denials.front());
}

// Direct mode: the session works on its base, so a repository that a call
// created there is audited after the call, as `agentbox run` audits at its
// end (linux/git_repos.h): what could run code on the host is quarantined
// and the call is a sandbox denial.
void AuditGitAfterCall(const Plan& plan, const std::set<std::string>& known, Json* result) {
  auto has = [&](const char* name) {
    return std::find(plan.protect_git.begin(), plan.protect_git.end(), name) != plan.protect_git.end();
  };
  auto found = linux::AuditGitRepos(plan.workspace_source, known, has("hooks"), has("config"), plan.scan_cache_dir);
  Json denials = Json::array();
  if (!found.ok()) {
    denials.push_back({{"facet", "filesystem"}, {"op", "git-audit"}, {"target", plan.workspace_target},
                       {"reason", "the audit of git repositories after the call failed: " + found.status().ToString()},
                       {"source", "git-audit"}});
  } else {
    for (const auto& f : *found) {
      denials.push_back({{"facet", "filesystem"}, {"op", f.op},
                         {"target", paths::Rebase(f.host_path, plan.workspace_source, plan.workspace_target)},
                         {"reason", f.reason}, {"source", "git-audit"}});
    }
  }
  if (denials.empty()) return;
  Json& outcome = (*result)["outcome"];
  if (!outcome.is_object()) outcome = Json::object();
  if (!outcome["denials"].is_array()) outcome["denials"] = Json::array();
  for (const auto& d : denials) outcome["denials"].push_back(d);
  const std::string kind = result->value("kind", "");
  if (plan.denial_outcome && (kind == "exited" || kind == "signaled" || kind == "ok" || kind == "tool_error")) {
    (*result)["kind"] = "sandbox_denied";
    (*result)["is_error"] = true;
    if (outcome.contains("outcome")) outcome["outcome"] = "sandbox_denied";
    if (outcome.contains("kind")) outcome["kind"] = "sandbox_denied";
    (*result)["output"] = "sandbox_denied: " + DenialLine(denials[0]) + "\n" + result->value("output", "");
  }
}

// disk_gib in a session: the resources facet says what bounds the
// workspace. Overlay mode with its upper layer on a tmpfs or an image of
// that size: enforced (upper-tmpfs-size, upper-loop-image). A copy (copy mode) or the workspace itself
// (direct mode) is on the host's disk, unbounded: missing, and refused under
// require: full (fail closed), as Confine refuses what it cannot give.
Status ReportWorkspaceDisk(const std::string& ws_mode, const std::string& upper_kind, const Policy& policy,
                           EnforcementReport* report) {
  if (!policy.resources.disk_bytes) return {};
  auto facet = std::find_if(report->facets.begin(), report->facets.end(),
                            [](const FacetReport& f) { return f.name == "resources"; });
  if (facet == report->facets.end()) return {};
  // The run's words about the workspace do not hold for a session's: ours replace them.
  facet->notes.erase(std::remove_if(facet->notes.begin(), facet->notes.end(),
                                    [](const std::string& n) { return n.rfind("disk_gib:", 0) == 0; }),
                     facet->notes.end());
  const std::string tmp = "/tmp, HOME and /dev/shm are each a tmpfs of that size, and no file may grow past it "
                          "(RLIMIT_FSIZE)";
  if (ws_mode == "overlay" && upper_kind == "image") {
    for (auto& f : report->facets) {
      if (f.name != "filesystem") continue;
      f.notes.erase(std::remove_if(f.notes.begin(), f.notes.end(),
                                   [](const std::string& n) { return n.rfind("workspace is a host bind", 0) == 0; }),
                    f.notes.end());
    }
    facet->mechanisms.push_back("upper-loop-image");
    facet->notes.push_back(
        "disk_gib: the session's changes to the workspace (its overlay upper layer and overlayfs's work "
        "directory) are on an ext4 filesystem of that size, an image file under the state directory "
        "loop-mounted by agentbox: file data and all metadata (inodes, directories, symlinks, whiteouts, "
        "ext4's own journal and tables) count; the unchanged files of the base workspace and of snapshots below "
        "do not. A write past it fails with ENOSPC, reported as a resources denial. The image is sparse: the "
        "host's disk holds what the session wrote, at most that size. " + tmp);
    return {};
  }
  if (ws_mode == "overlay" && upper_kind == "tmpfs") {
    // Nor is the workspace a host bind of unlimited size any more.
    for (auto& f : report->facets) {
      if (f.name != "filesystem") continue;
      f.notes.erase(std::remove_if(f.notes.begin(), f.notes.end(),
                                   [](const std::string& n) { return n.rfind("workspace is a host bind", 0) == 0; }),
                    f.notes.end());
    }
    facet->mechanisms.push_back("upper-tmpfs-size");
    facet->notes.push_back(
        "disk_gib: the session's changes to the workspace (its overlay upper layer and overlayfs's work "
        "directory) are on a tmpfs of that size, mounted by the session's init in its own namespaces: file "
        "data, new directories, symlinks and whiteouts count (inodes too: at most one per 4 KiB of the size); "
        "the unchanged files of the base workspace and of snapshots below do not. A write past it fails with "
        "ENOSPC, reported as a resources denial. The layer is memory: its pages count toward memory_gib, and "
        "it lasts as long as the agentbox process serving the session (across the session's worlds, not "
        "across a restart of that process). " + tmp);
    return {};
  }
  facet->notes.push_back("disk_gib: " + tmp);
  const std::string reason =
      ws_mode == "copy" ? "disk_gib: the session's copy of the workspace (workspace_mode copy) is on the host's "
                          "disk: its size is not limited"
                        : ws_mode == "direct" ? "disk_gib: the session works on the workspace itself "
                                                "(fresh_per_task: false), on the host's disk: its size is not limited"
                                              : "disk_gib: the session was created before its upper layer could "
                                                "be capped: it is on the host's disk, not limited";
  AddMissing(report, {"resources", reason});
  if (policy.sandbox.require == Requirement::kFull) {
    return Status::Error("confine", "the policy requires full enforcement and this host/version cannot give it:\n"
                                    "  - resources: " + reason +
                                    "\n(use require: partial to run with what is available; the report lists "
                                    "what is missing)");
  }
  return {};
}

// A value as a message quotes it: JSON, cut short.
std::string Quoted(const Json& v) {
  std::string text = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

// How a request differs from the one recorded under its call_id ("" when
// it is the same): "with input.command \"ls\", not \"pwd\"".
std::string RequestDifference(const std::string& recorded_name, const Json& recorded, const std::string& name,
                              const Json& input) {
  if (recorded_name != name) return "for tool " + recorded_name + ", not " + name;
  if (recorded == input) return "";
  std::set<std::string> keys;
  for (const auto& [k, v] : recorded.items()) keys.insert(k);
  for (const auto& [k, v] : input.items()) keys.insert(k);
  for (const auto& k : keys) {
    const bool had = recorded.contains(k), has = input.contains(k);
    if (had && has && recorded[k] == input[k]) continue;
    if (!has) return "with input." + k + " " + Quoted(recorded[k]) + ", not without it";
    if (!had) return "without input." + k + ", not with " + Quoted(input[k]);
    return "with input." + k + " " + Quoted(recorded[k]) + ", not " + Quoted(input[k]);
  }
  return "with another input";
}

}  // namespace

const std::vector<std::string>& ToolNames() {
  // run_code when this host has an interpreter for it (found once).
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out = kTools;
    for (const auto& r : CodeRuntimes()) {
      if (!r.path.empty()) {
        out.push_back("run_code");
        break;
      }
    }
    return out;
  }();
  return names;
}

static Json PortJson(const PortBridge& b) {
  return {{"inside_port", b.inside_port()}, {"host", b.host()}, {"port", b.host_port()},
          {"connections", b.connections()}};
}

// ---------------------------------------------------------------------------

struct SessionState {
  std::string id;
  std::string dir;
  // The policy's tools.upstream behind the daemon's tool gateway, made at
  // the first call or listing that needs it (GatewayOf); null without any.
  std::shared_ptr<gateway::Gateway> gateway;
  bool gateway_made = false;  // mu
  Json recipe;              // session.json
  std::string workspace;    // base, host path
  std::string ws_mode;      // overlay | copy | direct
  std::vector<std::string> lowers;
  // disk_gib in overlay mode: the upper layer and the work directory are on
  // a filesystem of this size (0: the host directories under `dir`): a
  // tmpfs that the world's init mounts (upper_kind tmpfs), or an image file
  // mounted on the host at ImageMount() (image).
  std::uint64_t upper_fs_bytes = 0;
  std::string upper_kind = "disk";  // disk | tmpfs | image (recipe "upper_fs")

  std::mutex mu;            // log, results, counters, upper_fs
  // The tmpfs's root, handed over by the world that mounted it: it keeps the
  // session's changes after that world ends (the next world copies them);
  // Diff and Snapshot read them through it. Shared, so that a reader keeps
  // it open while a new world replaces it.
  std::shared_ptr<const UniqueFd> upper_fs;
  bool upper_lost = false;  // the process that held it ended (a restart): the changes are gone
  DurableLog log;           // appended under mu; synced without it (group commit)
  std::map<std::string, Json> results;  // call_id → recorded result
  std::map<std::string, std::pair<std::string, Json>> requests;  // call_id → (name, input) as recorded
  std::size_t active_calls = 0;         // execute calls in this session now (with or without call_id)
  Clock::time_point last_call_end = Clock::now();
  std::uint64_t idle_timeout_ms = 0;    // the policy's session.idle_timeout (0: not yet provisioned)
  // A bash call without a timeout of its own: the policy's session.call_timeout,
  // else its resources.wall_clock_min, else kDefaultCallTimeoutMs (set with the world).
  std::uint64_t call_timeout_ms = kDefaultCallTimeoutMs;
  // session.shell: persistent: every bash call runs in one shell of the
  // world's, one call at a time (shell_mu). `shell_world`: the supervisor of
  // the world whose shell the last call ran in (0: none yet), to say when a
  // new world means a new shell.
  bool persistent_shell = false;
  std::mutex shell_mu;
  pid_t shell_world = 0;

  // Escalations (docs/daemon.md "Escalations"), guarded by mu:
  // offers: every offer a result of this session carried, by id:
  //   {offer: {id, grant, within_ceiling, why_not}, denial, call_id, seq}.
  // escalations: the requests, "eg-N" at index N-1; request_ids: a
  // client's request_id → index. escalation_cv: one was decided.
  std::map<std::string, Json> offers;
  std::vector<Json> escalations;
  std::map<std::string, std::size_t> request_ids;
  std::condition_variable escalation_cv;
  // Approved one-call grants the next call takes (escalation ids).
  std::vector<std::string> once_pending;
  // Calls hold grant_mu shared; a call that takes one-call grants holds it
  // alone, so that no other call of the session runs under its grant.
  std::shared_mutex grant_mu;
  // One-call grants a world of their own carries (seccomp, a mount that
  // cannot be added live): the next world is provisioned with them and
  // stopped after that call (world_mu).
  std::vector<EscalationOffer> world_grants;
  bool stopped_idle = false;            // its world was stopped for idleness (world_mu)
  std::set<std::string> in_flight;
  std::uint64_t next_seq = 1;
  std::uint64_t calls = 0;
  bool removing = false;

  std::mutex world_mu;      // provisioning
  std::shared_ptr<World> world;
  // Values rotated through the API (RotateSecret), held in locked memory:
  // they replace the sources' for this session's worlds from then on.
  std::map<std::string, net::LockedBytes> rotated;
  std::shared_ptr<const ConfinedCommand> confined;
  // A remote world's: host, remote_pid, binary, level (world_mu); null otherwise.
  Json remote;
  // A Kubernetes session's SandboxClaim, held for the session's life (its
  // worlds come and go in the same pod); deleting it deletes the pod. world_mu.
  std::shared_ptr<k8s::ClaimedSandbox> claim;
  // A claim the log says was made and never released: agentbox stopped
  // holding it (killed, or stopped before its release was logged). Resumed
  // (ResumeClaim) before anything claims another. world_mu.
  std::string claim_left, claim_left_uid;
  // Direct mode: the repositories the world protects (audited after calls: the others).
  std::shared_ptr<const std::set<std::string>> git_known;
  std::uint64_t provisions = 0;
  // Terminals (ptys) by id; guarded by mu. They end with the world.
  std::map<std::string, std::shared_ptr<Terminal>> terminals;
  std::uint64_t next_terminal = 1;

  // What calls leave running writes here after their end (background.log).
  UniqueFd background_log;
  std::unique_ptr<Services> services;
  mutable std::mutex ports_mu;
  std::map<int, std::unique_ptr<PortBridge>> ports;  // inside port → its bridge

  // The ports whose bridge still serves the current world; the others
  // (their world ended) are stopped and dropped. Call with ports_mu held.
  void PrunePorts(const World* current) {
    for (auto it = ports.begin(); it != ports.end();) {
      if (it->second->Serves(current)) {
        ++it;
      } else {
        it->second->Stop();
        it = ports.erase(it);
      }
    }
  }
  // Every service and port ends (removal, shutdown), before the world does.
  void EndServicesAndPorts() {
    if (services) services->StopAll();
    std::lock_guard<std::mutex> lock(ports_mu);
    for (auto& [port, bridge] : ports) bridge->Stop();
    ports.clear();
  }

  // Whether something holds the session's world in use, so that it is not
  // stopped as idle: a call in flight, a running terminal, a running
  // service or an exposed port. Call with mu held.
  bool Busy() const {
    if (active_calls > 0) return true;
    for (const auto& [tid, t] : terminals) {
      if (t->Running()) return true;
    }
    if (services) {
      for (const auto& svc : services->List()) {
        if (svc.value("state", "") != "exited") return true;
      }
    }
    std::lock_guard<std::mutex> lock(ports_mu);
    return !ports.empty();
  }

  // Writes `entry` as a line of the log (in the file, and safe from a
  // SIGKILL of this process, from then on); the log's length after it, for
  // log.Sync.
  // `lent_key`/`lent`: a value the caller keeps (a call's input, its
  // result: megabytes), put in the line for its writing and given back.
  Result<std::uint64_t> WriteLog(Json entry, const char* lent_key = nullptr, Json* lent = nullptr) {
    if (lent) entry[lent_key] = std::move(*lent);
    entry["time"] = NowRfc3339();
    std::string line;
    report::AppendCompactJson(entry, &line);
    if (lent) *lent = std::move(entry[lent_key]);
    line += '\n';
    return log.Append(line);
  }
  // `sync`: also on disk before returning; lines that a later synced line
  // carries along (a call's line, its events: its result's sync) need not wait.
  Status AppendLog(Json entry, bool sync = true) {
    auto end = WriteLog(std::move(entry));
    if (!end.ok()) return end.status();
    return sync ? log.Sync(*end) : Status{};
  }

  // `*hold` keeps the upper filesystem named by the stack's path open.
  LayerStack Layers(std::shared_ptr<const UniqueFd>* hold) {
    LayerStack s;
    s.base = workspace;
    s.lowers = lowers;
    s.upper = ws_mode == "copy" ? dir + "/copy" : dir + "/upper";
    s.copy_mode = ws_mode == "copy";
    if (upper_kind == "image") s.upper = ImageMount() + "/upper";
    {
      std::lock_guard<std::mutex> lock(mu);
      *hold = upper_fs;
    }
    // Through the fd: the layer is in no mount namespace of ours. Without
    // one, the layer a stopped process left (or none: no changes).
    struct stat st {};
    if (*hold && (*hold)->valid()) {
      s.upper = "/proc/self/fd/" + std::to_string((*hold)->get()) + "/upper";
    } else if (upper_kind == "tmpfs" && stat((SpillDir() + "/upper").c_str(), &st) == 0) {
      s.upper = SpillDir() + "/upper";
    }
    return s;
  }

  // Keeps (and logs) the escalation offers `result`'s denials carry: the
  // ones RequestEscalation may be asked for. Call with mu held.
  void RecordOffers(const Json& result, std::uint64_t seq, const std::string& call_id) {
    const Json* denials = result.contains("outcome") && result["outcome"].is_object() &&
                                  result["outcome"].contains("denials")
                              ? &result["outcome"]["denials"]
                              : nullptr;
    if (!denials || !denials->is_array()) return;
    for (const Json& d : *denials) {
      if (!d.is_object() || !d.contains("escalation") || !d["escalation"].is_object()) continue;
      const Json& offer = d["escalation"];
      const std::string offer_id = offer.value("id", "");
      if (offer_id.empty()) continue;
      Json denial = {{"facet", d.value("facet", "")}, {"op", d.value("op", "")}, {"target", d.value("target", "")},
                     {"reason", d.value("reason", "")}, {"call_id", call_id}, {"seq", seq}};
      offers[offer_id] = {{"offer", offer}, {"denial", denial}};
      // On disk with the result's line (Execute syncs after this).
      (void)AppendLog({{"type", "event"}, {"event", "escalation_offered"}, {"seq", seq}, {"call_id", call_id},
                       {"offer", offer}, {"denial", denial}},
                      /*sync=*/false);
    }
  }

  // Where the capped upper layer is written when the process stops.
  std::string SpillDir() const { return dir + "/spill"; }
  // upper_fs image: the image file, and where it is mounted on the host.
  std::string ImageFile() const { return dir + "/upper.img"; }
  std::string ImageMount() const { return dir + "/upperfs"; }

  // Mounts the session's image when it is not (a restarted process, a
  // removal pending): its upper layer is then at ImageMount()/upper.
  Status EnsureImage() const {
    struct stat st {};
    const mode_t mode = stat(workspace.c_str(), &st) == 0 ? st.st_mode & 0777 : 0700;
    return EnsureUpperImage(ImageFile(), ImageMount(), upper_fs_bytes, mode);
  }

  // Any fd on the filesystem disk_gib caps (null: none), for statfs.
  std::shared_ptr<const UniqueFd> CappedFs() {
    if (upper_kind == "tmpfs") return UpperFs();
    if (upper_kind != "image") return nullptr;
    auto fd = std::make_shared<const UniqueFd>(open(ImageMount().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    return fd->valid() ? fd : nullptr;
  }

  std::shared_ptr<const UniqueFd> UpperFs() {
    std::lock_guard<std::mutex> lock(mu);
    return upper_fs;
  }
};

struct Manager::Impl {
  ManagerOptions options;
  UniqueFd lock;
  std::string exe;
  mutable std::mutex mu;
  std::map<std::string, std::shared_ptr<SessionState>> sessions;
  std::atomic<std::size_t> calls_in_flight{0};
  std::atomic<bool> shutting_down{false};
  bool overlay_available = false;

  // Every escalation change of every session, for EscalationChanges: the
  // record as it is then, numbered (the last kMaxChanges kept).
  mutable std::mutex changes_mu;
  mutable std::condition_variable changes_cv;
  std::uint64_t change_seq = 0;
  std::deque<std::pair<std::uint64_t, Json>> changes;
  static constexpr std::size_t kMaxChanges = 1024;
  void PublishEscalation(const Json& record) {
    {
      std::lock_guard<std::mutex> lock(changes_mu);
      changes.emplace_back(++change_seq, record);
      while (changes.size() > kMaxChanges) changes.pop_front();
    }
    changes_cv.notify_all();
  }
  // What an approved grant does to the session now (mu not held, world_mu
  // held by the caller): {applied: live | new_world | next_world | next_call, why?}.
  Result<Json> GrantNow(SessionState& s, const EscalationOffer& grant, bool session_scope);
  // The session's tool gateway (made once, from its policy's tools.upstream), or null.
  std::shared_ptr<gateway::Gateway> GatewayOf(SessionState& s);
  // An upstream tool's call (Execute's, once it holds its seq): logged as
  // every call is, and recorded for replay; a call the gateway refuses
  // (unknown tool, input its schema refuses) is an event in the log and a
  // Status, and its call_id stays free.
  Result<Json> CallUpstream(SessionState& s, gateway::Gateway& gw, const std::string& name, const Json& input,
                            const std::string& call_id, std::uint64_t seq, const ParentCall* parent = nullptr);
  // A session grant put in force in the running world (world_mu held, the
  // world alive): a path grafted below a ceiling's Landlock rule, a memory
  // limit written. An error with an empty message for a grant no running
  // world takes; otherwise its message says why this one could not.
  Result<bool> GrantLive(SessionState& s, const EscalationOffer& grant);
  // Puts live one-call grants (network ones) in force in `world` for one
  // call (each entry of *used says how, or its error), and takes them back.
  void OpenOnceGrants(SessionState& s, World& world,
                      const std::vector<std::pair<std::string, EscalationOffer>>& grants, Json* used);
  void CloseOnceGrants(SessionState& s, World& world,
                       const std::vector<std::pair<std::string, EscalationOffer>>& grants);
  // The plan a world of `s` would have under `policy` (Provision's Confine).
  Result<ConfinedCommand> PlanFor(const SessionState& s, const Policy& policy, const std::string& nonce) const;

  std::string SessionsDir() const { return options.state_dir + "/sessions"; }
  std::string SnapshotsDir() const { return options.state_dir + "/snapshots"; }

  std::shared_ptr<SessionState> Find(const std::string& id) const {
    std::lock_guard<std::mutex> lock(mu);
    auto it = sessions.find(id);
    return it == sessions.end() ? nullptr : it->second;
  }

  Status Load(const std::string& id);
  Result<std::vector<std::string>> SnapshotChain(const std::string& snapshot_id, std::string* mode);
  Status Provision(SessionState& s);
  // A remote world's (sandbox.isolation: remote): the remote confines.
  Status ProvisionRemote(SessionState& s, const Policy& policy);
  // The session's world, provisioned on first use and again when its
  // sandbox died (an event in the log either way); used without the
  // provisioning lock, so calls run side by side.
  struct LiveWorld {
    std::shared_ptr<World> world;
    std::shared_ptr<const ConfinedCommand> confined;
    std::shared_ptr<const std::set<std::string>> git_known;
  };
  Result<LiveWorld> EnsureWorld(SessionState& s);
  // A bash call's cwd, as the shell in `world` reaches it (file_tools.h
  // resolve_dir); bad_request when it leads outside the workspace.
  Result<std::string> ResolveCwd(World& world, const ConfinedCommand& confined, const std::string& cwd);
  // Stops the world of every session idle past its idle_timeout (state kept).
  void StopIdleWorlds();
  std::thread idle_reaper;
  std::mutex reaper_mu;
  std::condition_variable reaper_cv;
  bool reaper_stop = false;
  Json RunBash(SessionState& s, World& world, const ConfinedCommand& confined, const Json& input,
               const std::string& cwd, const OutputSink& sink, const std::atomic<bool>* cancel);
  // A command call's result (bash's, run_code's): `ran` judged as `run`
  // judges a run (kind, denials, usage, limits), `extra_denials` first
  // among the evidence.
  Json ExecResult(SessionState& s, World& world, const ConfinedCommand& confined, const WorldExec& exec,
                  Result<WorldExecResult>& ran, std::vector<Denial> extra_denials);
  // run_code (code_mode.h): one program in a fresh process of the world,
  // without network, its tool calls served as calls of the session (the
  // children of call `call_id`, seq `seq`).
  Json RunCode(SessionState& s, World& world, const ConfinedCommand& confined, const Json& input,
               const std::string& call_id, std::uint64_t seq, const std::atomic<bool>* cancel);
  Manager* self = nullptr;  // for RunCode's calls
  // What a run_code program's `tools` module binds in session `s`:
  // [{name, description, inputSchema}]: the file tools, bash when the policy
  // says tools.run_code.bash, and every upstream tool.
  Json CodeBindings(SessionState& s);
  Json RunFile(SessionState& s, World& world, const ConfinedCommand& confined, const std::string& name,
               const Json& input);
  Result<std::string> TakeSnapshot(SessionState& s, bool keep);
  Result<std::string> TakeRemoteSnapshot(SessionState& s, bool keep);
  // The session's world for a service or a port: provisioned when there is
  // none or it died (logged as a call's provisioning is).
  Result<ServiceWorld> ServiceWorldFor(SessionState& s);

  // Snapshots: taken, listed, deleted and started from under this lock, so
  // that none is deleted while a session is being created on it.
  mutable std::mutex snapshots_mu;
  // Every snapshot with a manifest, oldest first (snapshots_mu held).
  std::vector<Json> AllSnapshots() const;
  // What needs snapshot `id`: live sessions with it among their layers, and
  // snapshots whose parent it is ("" when nothing does).
  std::string SnapshotUsers(const std::string& id, const std::vector<Json>& all) const;
  Status DeleteSnapshotLocked(const std::string& id);
  // Remove's part: the session's own snapshots, but those kept or needed.
  void RemoveSnapshotsOf(const std::string& session_id);
};

Result<ServiceWorld> Manager::Impl::ServiceWorldFor(SessionState& s) {
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.removing) return Status::Error(kConflict, "session " + s.id + " is being removed");
  }
  if (shutting_down) return Status::Error(kConflict, "agentbox is shutting down");
  auto live = EnsureWorld(s);
  if (!live.ok()) return live.status();
  ServiceWorld w;
  w.world = live->world;
  w.cwd = live->confined->plan.cwd;
  w.kill_grace_ms = live->confined->plan.kill_grace_ms;
  w.background_log_fd = s.background_log.get();
  return w;
}

Status Manager::Impl::Load(const std::string& id) {
  auto s = std::make_shared<SessionState>();
  s->id = id;
  s->dir = SessionsDir() + "/" + id;
  auto text = ReadWholeFile(s->dir + "/session.json");
  if (!text.ok()) return text.status();
  s->recipe = Json::parse(*text, nullptr, false);
  if (!s->recipe.is_object()) return Status::Error("session", s->dir + "/session.json does not parse");
  s->workspace = s->recipe.value("workspace", "");
  s->ws_mode = s->recipe.value("workspace_mode", "overlay");
  s->lowers = s->recipe.value("lowers", std::vector<std::string>{});
  s->upper_kind = s->recipe.value("upper_fs", "disk");
  if (s->upper_kind != "disk") s->upper_fs_bytes = s->recipe.value("upper_fs_bytes", std::uint64_t{0});
  bool upper_in_memory = false;  // a world of this session held its upper layer in memory
  const std::string log_path = s->dir + "/log.jsonl";
  // Replay what the log holds: recorded results, and calls a killed
  // process left without one.
  std::map<std::uint64_t, Json> open_calls;
  if (auto log = ReadWholeFile(log_path); log.ok()) {
    size_t start = 0;
    while (start < log->size()) {
      size_t nl = log->find('\n', start);
      if (nl == std::string::npos) break;  // a torn last line: the call it began never reported
      Json e = Json::parse(log->substr(start, nl - start), nullptr, false);
      start = nl + 1;
      if (!e.is_object()) continue;
      const std::uint64_t seq = e.value("seq", std::uint64_t{0});
      s->next_seq = std::max(s->next_seq, seq + 1);
      const std::string type = e.value("type", "");
      const std::string event = type == "event" ? e.value("event", "") : "";
      if (event == "provisioned" || event == "reprovisioned") upper_in_memory = s->upper_kind == "tmpfs";
      if (event == "upper_lost" || event == "upper_spilled") upper_in_memory = false;
      s->upper_lost = s->upper_lost || event == "upper_lost";
      if (event == "claimed" || event == "claim_resumed") {
        s->claim_left = e.value("claim", "");
        s->claim_left_uid = e.value("uid", "");
      }
      if (event == "claim_released") s->claim_left.clear();
      if (type == "call") {
        open_calls[seq] = e;
        ++s->calls;
        const std::string call_id = e.value("call_id", "");
        if (!call_id.empty()) s->requests[call_id] = {e.value("name", ""), e.value("input", Json::object())};
      } else if (type == "result") {
        open_calls.erase(seq);
        const std::string call_id = e.value("call_id", "");
        if (!call_id.empty() && e.contains("result")) s->results[call_id] = e["result"];
      } else if (event == "escalation_offered" && e.contains("offer") && e["offer"].is_object()) {
        s->offers[e["offer"].value("id", "")] = {{"offer", e["offer"]}, {"denial", e.value("denial", Json::object())}};
      } else if ((event == "escalation_requested" || event == "escalation_decided") && e.contains("escalation") &&
                 e["escalation"].is_object()) {
        const Json& r = e["escalation"];
        const std::string eid = r.value("id", "");
        std::size_t n = 0;
        if (eid.rfind("eg-", 0) == 0) n = std::strtoull(eid.c_str() + 3, nullptr, 10);
        if (n == 0 || n > 1000000) continue;
        if (s->escalations.size() < n) s->escalations.resize(n, Json::object());
        s->escalations[n - 1] = r;
        if (!r.value("request_id", "").empty()) s->request_ids[r.value("request_id", "")] = n - 1;
        if (event == "escalation_decided" && r.value("decision", "") == "once" && r.value("state", "") == "granted") {
          s->once_pending.push_back(eid);
        }
      } else if (event == "grant_used") {
        const std::string eid = e.value("escalation", "");
        s->once_pending.erase(std::remove(s->once_pending.begin(), s->once_pending.end(), eid), s->once_pending.end());
      }
    }
  }
  if (Status st = s->log.Open(log_path); !st.ok()) return st;
  const std::string background_path = s->dir + "/background.log";
  s->background_log.reset(open(background_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600));
  if (!s->background_log.valid()) return Status::Errno("session", "open", background_path);
  s->services = std::make_unique<Services>(s->dir, [this, raw = s.get()] { return ServiceWorldFor(*raw); });
  // A tmpfs upper layer lives as long as the process holding it: a new
  // process on this state directory finds it gone, and says so once.
  if (upper_in_memory) {
    s->upper_lost = true;
    RemoveTree(s->SpillDir());  // older than what was lost: not the session's state either
    (void)s->AppendLog({{"type", "event"}, {"event", "upper_lost"},
                        {"reason", "the session's upper layer was on a tmpfs (disk_gib) held by the agentbox process "
                                   "that served it, which ended: the session's changes since its last snapshot are "
                                   "gone; the base workspace and snapshots are intact"}});
  }
  // A request a killed process left without a decision is denied.
  for (Json& r : s->escalations) {
    if (r.value("state", "") != "pending") continue;
    r["state"] = "denied";
    r["decision"] = "deny";
    r["decided_by"] = "none";
    r["decision_reason"] = "agentbox stopped before a decision was made";
    r["decided"] = NowRfc3339();
    (void)s->AppendLog({{"type", "event"}, {"event", "escalation_decided"}, {"escalation", r}});
  }
  for (const auto& [seq, call] : open_calls) {
    Json result = {{"call_id", call.value("call_id", "")},
                   {"name", call.value("name", "")},
                   {"output", "interrupted: the call was in flight when agentbox stopped; its effects, if any, are "
                              "in the workspace"},
                   {"is_error", true},
                   {"kind", "interrupted"},
                   {"outcome", {{"kind", "interrupted"}}},
                   {"replayed", false},
                   {"duration_ms", 0}};
    (void)s->AppendLog({{"type", "result"}, {"seq", seq}, {"call_id", call.value("call_id", "")}, {"result", result}});
    if (!call.value("call_id", "").empty()) s->results[call.value("call_id", "")] = result;
  }
  std::lock_guard<std::mutex> lock(mu);
  sessions[id] = std::move(s);
  return {};
}

Result<std::vector<std::string>> Manager::Impl::SnapshotChain(const std::string& snapshot_id, std::string* mode) {
  std::vector<std::string> chain;
  std::string id = snapshot_id;
  std::set<std::string> seen;
  while (!id.empty()) {
    if (!ValidId(id)) return Status::Error(kBadRequest, "snapshot id '" + id + "' is malformed");
    if (!seen.insert(id).second) return Status::Error("snapshot", "snapshot " + id + " is its own ancestor");
    const std::string dir = SnapshotsDir() + "/" + id;
    if (Status v = VerifySnapshot(dir); !v.ok()) {
      if (v.stage() == "not_found") return Status::Error(kNotFound, "no snapshot " + id + " (" + v.message() + ")");
      return Status::Error(kConflict, v.message());
    }
    auto manifest = ReadSnapshotManifest(dir);
    if (!manifest.ok()) return Status::Error(kConflict, manifest.status().message());
    const std::string m = manifest->value("mode", "overlay");
    if (mode->empty()) *mode = m;
    if (m != *mode) return Status::Error(kConflict, "snapshot " + id + " is in " + m + " mode, its child in " + *mode);
    chain.push_back(dir + "/tree");
    id = manifest->value("parent", "");
  }
  return chain;
}

Result<ConfinedCommand> Manager::Impl::PlanFor(const SessionState& s, const Policy& policy,
                                               const std::string& nonce) const {
  Invocation inv;
  inv.workspace = s.workspace;
  inv.cwd = s.workspace;
  inv.home = linux::HomeDir();
  if (!inv.home.empty() && !RealPath(inv.home).empty()) inv.home = RealPath(inv.home);
  inv.self_exe = exe;
  inv.cache_dir = linux::CacheDir(inv.home);
  inv.own_dirs = OwnDirsWith(options.state_dir);
  inv.nonce = nonce;
  // On the host's kernel a world needs namespaces (its init); a microVM's
  // world is on the guest's, where its init runs the same way.
  inv.backend = policy.sandbox.isolation == Isolation::kOs ? BackendChoice::kNamespaces : BackendChoice::kAuto;
  inv.session = true;
  inv.wrapped_command = false;  // a world spawns the plan itself
  return Confine({"true"}, policy, ProbeHostFor(policy), inv);
}

namespace {

// A Kubernetes session's claim after agentbox stopped holding it: the one
// its log names, resumed when it is still there and still agentbox's (its
// pod keeps the session's copy); else logged as released, and the caller
// claims another. world_mu held.
Status ResumeClaim(SessionState& s, const KubernetesRemoteSpec& spec) {
  if (s.claim || s.claim_left.empty()) return {};
  const std::string name = s.claim_left;
  auto resumed = k8s::ClaimedSandbox::Resume(spec, name, s.claim_left_uid,
                                             std::chrono::milliseconds(kRemoteReadyTimeoutMs));
  if (!resumed.ok() && resumed.status().stage() != kNotFound) return resumed.status();
  s.claim_left.clear();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!resumed.ok()) {
    (void)s.AppendLog({{"type", "event"}, {"event", "claim_released"}, {"claim", name},
                       {"reason", resumed.status().message()}});
    return {};
  }
  s.claim = std::move(*resumed);
  (void)s.AppendLog({{"type", "event"}, {"event", "claim_resumed"}, {"claim", name}, {"uid", s.claim->uid()},
                     {"sandbox", s.claim->sandbox()}, {"pod", s.claim->pod()}});
  return {};
}

}  // namespace

Status Manager::Impl::ProvisionRemote(SessionState& s, const Policy& policy) {
  // Nothing is confined here: the remote agentbox confines the policy with
  // its own host's enforcement and says what it enforced.
  Plan plan;
  plan.confined = true;
  plan.remote = RemotePlanFor(policy, s.id, s.workspace, exe);
  if (policy.sandbox.remote->kubernetes) {
    // The session's sandbox: claimed at its first world, kept for the next.
    if (Status r = ResumeClaim(s, *policy.sandbox.remote->kubernetes); !r.ok()) return r;
    if (!s.claim) {
      auto name = k8s::ClaimName(policy.sandbox.remote->kubernetes->template_name,
                                 s.id.substr(2) + "-" + linux::RandomHex(2));
      if (!name.ok()) return name.status();
      auto claimed = k8s::ClaimedSandbox::Claim(*policy.sandbox.remote->kubernetes, *name,
                                                std::chrono::milliseconds(kRemoteReadyTimeoutMs));
      if (!claimed.ok()) return claimed.status();
      s.claim = std::move(*claimed);
      std::lock_guard<std::mutex> lock(s.mu);
      // Synced: a claim agentbox made is one it can find again.
      (void)s.AppendLog({{"type", "event"}, {"event", "claimed"}, {"claim", s.claim->claim()},
                         {"uid", s.claim->uid()}, {"sandbox", s.claim->sandbox()}, {"pod", s.claim->pod()}});
    }
    plan.remote->k8s_claim = s.claim->claim();
    plan.remote->k8s_pod = s.claim->pod();
  }
  plan.policy_sha256 = PolicyDigest(policy);
  plan.kill_grace_ms = policy.resources.kill_grace_ms.value_or(plan.kill_grace_ms);
  // The secrets' values go from their sources here to the remote's memory,
  // over the stream only (World::Start sends them first).
  if (!policy.credentials.secrets.empty()) {
    plan.network.terminate = true;
    plan.network.credentials = policy.credentials;
  }
  auto world = World::Start(exe, plan, std::max(options.ready_timeout_ms, kRemoteReadyTimeoutMs), -1, &s.rotated);
  if (!world.ok()) {
    // A pod that took no world (gone, restarted, refusing): the next
    // provisioning claims another rather than trying it again.
    if (s.claim) {
      std::lock_guard<std::mutex> lock(s.mu);
      (void)s.AppendLog({{"type", "event"}, {"event", "claim_released"}, {"claim", s.claim->claim()},
                         {"reason", world.status().ToString()}},
                        /*sync=*/false);
      s.claim.reset();
    }
    return world.status();
  }
  auto given = (*world)->remote_confined();
  if (!given) return Status::Error("session", "the remote world was ready without its confined plan");
  auto confined = ConfinedFromJson(*given);
  if (!confined.ok()) return confined.status();
  EnforcementReport& e = confined->enforcement;
  e.backend_reason = "sandbox.isolation: remote " + given->value("host", std::string("?")) +
                     " (agentbox " + given->value("remote_version", std::string("?")) + " there: " +
                     e.backend_reason + ")";
  s.remote = {{"host", given->value("host", "")},
              {"remote_pid", given->value("remote_pid", 0)},
              {"binary", given->value("binary", "")},
              {"level", ToString(policy.sandbox.remote->level)}};
  s.world = std::shared_ptr<World>(std::move(*world));
  s.confined = std::make_shared<const ConfinedCommand>(std::move(*confined));
  ++s.provisions;
  return {};
}

Status Manager::Impl::Provision(SessionState& s) {
  auto policy = SessionPolicy(s.recipe, s.world_grants);
  if (!policy.ok()) return policy.status();
  s.idle_timeout_ms = policy->session.idle_timeout_ms;
  s.call_timeout_ms =
      policy->session.call_timeout_ms.value_or(policy->resources.wall_clock_ms.value_or(kDefaultCallTimeoutMs));
  s.persistent_shell = policy->session.shell == ShellMode::kPersistent;
  if (policy->sandbox.isolation == Isolation::kRemote) return ProvisionRemote(s, *policy);
  auto confined = PlanFor(s, *policy, RandomId(""));
  if (!confined.ok()) return confined.status();
  Plan& plan = confined->plan;
  if (!plan.confined) {
    return Status::Error(kBadRequest, "sessions run confined: a danger-full-access policy has no sandbox to keep");
  }
  if (plan.policy_sha256.empty()) plan.policy_sha256 = PolicyDigest(*policy);
  // The policy's timeout bounds each call, not the session.
  plan.timeout_ms.reset();
  if (s.ws_mode != "direct") {
    auto ws_op = std::find_if(plan.mounts.begin(), plan.mounts.end(), [&](const MountOp& m) {
      return m.kind == MountKind::kBind && m.source == plan.workspace_source && m.target == plan.workspace_target;
    });
    if (ws_op == plan.mounts.end()) {
      return Status::Error("session", "the plan has no workspace mount to layer (" + plan.workspace_source + ")");
    }
    if (s.ws_mode == "overlay" && s.upper_kind == "image") {
      // disk_gib on disk: the image, mounted on the host; the init stages
      // its upper and work like the host directories below.
      if (Status m = s.EnsureImage(); !m.ok()) return m;
      ws_op->kind = MountKind::kOverlay;
      plan.workspace_overlay = WorkspaceOverlay{s.lowers, s.ImageMount() + "/upper", s.ImageMount() + "/work"};
    } else if (s.ws_mode == "overlay" && s.upper_kind == "tmpfs") {
      // disk_gib: the init mounts upper and work on a tmpfs of that size
      // (mounts.cc) and gives the base's mode to the upper layer there.
      ws_op->kind = MountKind::kOverlay;
      plan.workspace_overlay = WorkspaceOverlay{s.lowers, s.dir + "/upper", s.dir + "/work"};
      plan.workspace_overlay->upper_fs_bytes = s.upper_fs_bytes;
    } else if (s.ws_mode == "overlay") {
      ws_op->kind = MountKind::kOverlay;
      mkdir((s.dir + "/upper").c_str(), 0700);
      mkdir((s.dir + "/work").c_str(), 0700);
      // The merged root takes the upper layer's mode: give it the base's
      // (the state directory above stays 0700).
      struct stat base_st {};
      if (stat(s.workspace.c_str(), &base_st) == 0) chmod((s.dir + "/upper").c_str(), base_st.st_mode & 0777);
      plan.workspace_overlay = WorkspaceOverlay{s.lowers, s.dir + "/upper", s.dir + "/work"};
    } else {  // copy: the workspace's host side is the session's copy
      const std::string copy = s.dir + "/copy";
      struct stat st {};
      if (stat(copy.c_str(), &st) != 0) {
        const std::string from = s.lowers.empty() ? s.workspace : s.lowers.front();
        if (Status c = CopyTree(from, copy + ".tmp"); !c.ok()) return c;
        if (rename((copy + ".tmp").c_str(), copy.c_str()) != 0) return Status::Errno("session", "rename", copy);
      }
      RebaseWorkspace(&plan, copy);
    }
  }
  s.git_known.reset();
  if (s.ws_mode == "direct" && plan.workspace_writable && !plan.protect_git.empty()) {
    auto found = linux::FindGitDirs(plan.workspace_source, plan.scan_cache_dir);
    if (!found.ok()) return found.status();
    auto known = std::make_shared<std::set<std::string>>();
    for (const auto& d : *found) known->insert(d.host_path);
    s.git_known = std::move(known);
  }
  if (Status d = ReportWorkspaceDisk(s.ws_mode, s.upper_kind, *policy, &confined->enforcement); !d.ok()) {
    return d;
  }
  // The earlier world's upper filesystem (disk_gib), if any: the new world
  // starts with its changes. Kept until the new one is ready, so a world
  // that fails to start loses nothing.
  // Or the one a stopped process wrote to the state directory.
  std::shared_ptr<const UniqueFd> seed = s.UpperFs();
  const bool from_spill = s.upper_kind == "tmpfs" && !seed;
  if (from_spill) {
    struct stat st {};
    if (stat((s.SpillDir() + "/upper").c_str(), &st) == 0) {
      UniqueFd spill(open(s.SpillDir().c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!spill.valid()) return Status::Errno("session", "open", s.SpillDir());
      seed = std::make_shared<const UniqueFd>(std::move(spill));
    }
  }
  auto world = World::Start(exe, plan, options.ready_timeout_ms, seed && seed->valid() ? seed->get() : -1, &s.rotated);
  if (!world.ok()) return world.status();
  if (UniqueFd fs = (*world)->TakeUpperFs(); fs.valid()) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.upper_fs = std::make_shared<const UniqueFd>(std::move(fs));
  }
  if (from_spill && seed) RemoveTree(s.SpillDir());  // the new world's tmpfs holds it now
  s.world = std::shared_ptr<World>(std::move(*world));
  s.confined = std::make_shared<const ConfinedCommand>(std::move(*confined));
  ++s.provisions;
  return {};
}

Result<std::string> Manager::Impl::ResolveCwd(World& world, const ConfinedCommand& confined, const std::string& cwd) {
  Json req = {{"name", kResolveDirTool}, {"input", {{"path", cwd}}}, {"workspace", confined.plan.workspace_target}};
  auto answer = world.File(req, kFileToolTimeoutMs);
  if (!answer.ok()) return answer.status();
  if (answer->value("kind", "") != "ok" || answer->value("invalid_utf8", false)) {
    std::string why = answer->value("error", "cwd " + cwd + " cannot be used");
    for (const char* kind : {"tool_error: ", "sandbox_denied: "}) {
      if (why.rfind(kind, 0) == 0) why = why.substr(std::strlen(kind));
    }
    return Status::Error(kBadRequest, "bash: input.cwd: " + why);
  }
  return answer->value("output", "");
}

void Manager::Impl::StopIdleWorlds() {
  std::vector<std::shared_ptr<SessionState>> all;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [id, s] : sessions) all.push_back(s);
  }
  const auto now = Clock::now();
  for (auto& s : all) {
    std::unique_lock<std::mutex> wl(s->world_mu, std::try_to_lock);
    if (!wl.owns_lock() || !s->world || !s->world->Alive() || s->idle_timeout_ms == 0) continue;
    {
      // Busy() is checked with world_mu held: a call that starts later
      // waits for it, and finds the world stopped (and provisions another).
      std::lock_guard<std::mutex> lock(s->mu);
      if (s->Busy() || s->removing || now - s->last_call_end < std::chrono::milliseconds(s->idle_timeout_ms)) continue;
    }
    s->world->Stop(0);
    s->stopped_idle = true;
    std::lock_guard<std::mutex> lock(s->mu);
    (void)s->AppendLog({{"type", "event"}, {"event", "idle_stopped"}, {"idle_timeout_ms", s->idle_timeout_ms}});
  }
}

Json Manager::Impl::RunBash(SessionState& s, World& world, const ConfinedCommand& confined, const Json& input,
                            const std::string& cwd, const OutputSink& sink, const std::atomic<bool>* cancel) {
  const Plan& plan = confined.plan;
  WorldExec exec;
  // One shell for the session: its calls take turns, and the state one
  // leaves (cwd, variables, functions) is the next one's.
  std::unique_lock<std::mutex> shell_turn(s.shell_mu, std::defer_lock);
  if (s.persistent_shell) {
    shell_turn.lock();
    exec.shell_command = input["command"].get<std::string>();
    exec.cwd = cwd;  // "": where the last call left the shell
  } else {
    exec.argv = {"bash", "-c", input["command"].get<std::string>()};
    exec.cwd = cwd.empty() ? plan.cwd : cwd;
  }
  if (input.contains("stdin")) exec.stdin_data = input["stdin"].get<std::string>();
  if (input.contains("env")) {
    for (const auto& [k, v] : input["env"].items()) exec.env.push_back(k + "=" + v.get<std::string>());
  }
  exec.output_cap = options.output_cap_bytes;
  exec.kill_grace_ms = plan.kill_grace_ms;
  exec.background_log_fd = s.background_log.get();
  // The call's timeout, else the session's (call_timeout_ms): no call runs unbounded.
  exec.timeout_ms = input.contains("timeout") ? DurationFieldMs(input["timeout"]) : s.call_timeout_ms;

  auto ran = world.Exec(exec, sink, cancel);
  Json result = ExecResult(s, world, confined, exec, ran, {});
  if (!ran.ok()) return result;
  if (s.persistent_shell) {
    WorldExecResult& r = *ran;
    std::string output = result["output"].get<std::string>();
    // Said in the result whenever the shell the call ran in is not the one
    // the last call left: its cwd, variables and functions are gone.
    Json shell = r.shell.value_or(Json::object());
    shell["mode"] = "persistent";
    if (!shell.value("restarted", false) && s.shell_world != 0 && s.shell_world != world.supervisor_pid()) {
      shell["restarted"] = true;
      shell["previous"] = "the session's sandbox was started again (an idle stop or a sandbox error ended the last one)";
    }
    s.shell_world = world.supervisor_pid();
    if (shell.value("restarted", false)) {
      output = "[persistent shell: this call ran in a new shell, with the cwd, variables and functions reset: " +
               shell.value("previous", std::string("the previous shell ended")) + "]\n" + output;
    }
    if (shell.value("ended", false)) {
      if (!output.empty() && output.back() != '\n') output += '\n';
      output += "[persistent shell: " + shell.value("why", std::string("the shell ended")) +
                "; the next call starts a new shell]";
    }
    result["output"] = output;
    result["shell"] = shell;
  }
  return result;
}

Json Manager::Impl::ExecResult(SessionState& s, World& world, const ConfinedCommand& confined, const WorldExec& exec,
                               Result<WorldExecResult>& ran, std::vector<Denial> extra_denials) {
  const Plan& plan = confined.plan;
  Outcome o;
  o.enforcement = confined.enforcement;
  o.enforcement.skipped = world.skipped();  // as `run` reports them, from the world's set-up
  for (const auto& m : world.short_of_plan()) AddMissing(&o.enforcement, m);
  o.policy_sha256 = plan.policy_sha256;
  if (!ran.ok()) {
    o.kind = OutcomeKind::kSandboxError;
    o.error = ErrorInfo{ran.status().stage(), ran.status().message(), ran.status().err()};
    Json outcome = Json::parse(ToJson(o, -1));
    return {{"output", "sandbox_error: " + ran.status().ToString()}, {"is_error", true}, {"kind", "sandbox_error"},
            {"outcome", outcome}, {"world_gone", ran.status().stage() == kWorldGone}};
  }
  WorldExecResult& r = *ran;
  // Usage and limits by the same code as `run`'s: the rlimits the session's
  // runner set, the session's cgroup, the wall clock this call ran under.
  o.usage.wall_ms = r.wall_ms;
  if (r.rusage) supervise::FillRusage(*r.rusage, &o.usage);
  o.usage.limits = supervise::LimitsFor(plan, world.cgroup_mechanism(), world.rlimits());
  o.usage.limits.wall_clock_ms = exec.timeout_ms;
  if (plan.microvm) {  // the VM is the memory and CPU limit, as for `run`
    o.usage.limits.memory_max_bytes = plan.microvm->memory_mib << 20;
    o.usage.limits.cpu_max_cores = static_cast<double>(plan.microvm->vcpus);
    o.usage.limits.pids_max = plan.limits.pids_max;
  }
  if (r.oom_kills) o.usage.oom_kills = r.oom_kills;
  // Evidence: the network's (proxy, broker, DNS) first, then seccomp's,
  // then what the output says.
  for (const auto& [name, count] : r.seccomp) {
    o.denials.push_back(linux::SeccompDenial(name, count));
  }
  if (!r.connections.empty() || plan.network.proxy || plan.network.broker) {
    // The world's records, summed and named as `run` names them.
    std::vector<net::ConnectionRecord> records;
    for (const auto& c : r.connections) {
      if (auto rec = net::ConnectionRecord::FromJson(c.dump())) records.push_back(std::move(*rec));
    }
    supervise::AddNetworkReport(records, &o);
  }
  // disk_gib: a workspace found full after the call, or a command that says
  // it hit ENOSPC (and freed space before it ended).
  if (const auto upper_fs = s.CappedFs(); upper_fs && upper_fs->valid()) {
    std::optional<Denial> full = supervise::DiskFullDenial(upper_fs->get(), s.upper_fs_bytes, plan.workspace_target);
    if (!full) full = supervise::DiskFullDenialFromOutput(r.output, s.upper_fs_bytes, plan.workspace_target);
    if (full) o.denials.push_back(std::move(*full));
  }
  for (auto& d : extra_denials) o.denials.push_back(std::move(d));
  supervise::DenialScanner scanner(confined.denial_signatures);
  scanner.Feed(r.output.data(), r.output.size());
  scanner.Finish();
  for (auto& d : scanner.denials()) o.denials.push_back(std::move(d));
  if (r.exit_code) o.exit_code = r.exit_code;
  if (r.signal) o.signal = r.signal;

  // The offers, before the kind: the denials AttachOffers drops were
  // missing files, not denials.
  AttachOffers(plan, &o.denials);
  std::string kind;
  std::string headline;
  if (r.cancelled) {
    kind = "cancelled";
    o.kind = OutcomeKind::kSignaled;
    headline = "cancelled: the call was cancelled and its processes killed";
  } else if (r.timed_out) {
    kind = "timed_out";
    o.kind = OutcomeKind::kTimedOut;
    o.error = ErrorInfo{"timeout", "wall clock of " + std::to_string(*exec.timeout_ms) + " ms reached", 0};
    headline = "timed_out after " + std::to_string(*exec.timeout_ms / 1000.0).substr(0, std::to_string(*exec.timeout_ms / 1000.0).find('.') + 2) + "s";
  } else if (r.oom_kills > 0) {
    kind = "oom_killed";
    o.kind = OutcomeKind::kOomKilled;
    // A microVM's limit is its RAM (the guest kernel's OOM killer).
    const std::uint64_t limit = plan.microvm ? plan.microvm->memory_mib << 20 : plan.limits.memory_max_bytes.value_or(0);
    o.error = ErrorInfo{"oom", std::to_string(r.oom_kills) + " process(es) killed by the " +
                                   std::string(plan.microvm ? "guest kernel's OOM killer in the VM's memory" :
                                                              "kernel's OOM killer at the session's memory limit") +
                                   " of " + std::to_string(limit) + " bytes", 0};
    headline = "oom_killed at " + std::to_string(limit / (1024 * 1024)) + " MiB";
    o.denials.push_back(supervise::OomDenial(limit, r.oom_kills));
  } else if (r.world_died) {
    kind = "sandbox_error";
    o.kind = OutcomeKind::kSandboxError;
    const std::string why = world.death().empty() ? "the session's sandbox ended during the call" : world.death();
    o.error = ErrorInfo{"session", why, 0};
    headline = "sandbox_error: " + why + " (the next call starts a fresh sandbox from the same recipe)";
  } else {
    const bool failed = o.signal.has_value() || o.exit_code.value_or(0) != 0;
    if (r.exec_error) {
      std::string msg = r.exec_error->message();
      if (r.exec_error->err() == ENOENT) msg += " — not found inside the sandbox";
      o.error = ErrorInfo{"exec", msg, r.exec_error->err()};
    }
    if (failed && !o.denials.empty() && plan.denial_outcome) {
      kind = "sandbox_denied";
      o.kind = OutcomeKind::kSandboxDenied;
      Json d = Json::parse(ToJson(o, -1))["denials"][0];
      headline = "sandbox_denied: " + DenialLine(d);
    } else {
      o.kind = o.signal ? OutcomeKind::kSignaled : OutcomeKind::kExited;
      kind = ToString(o.kind);
    }
  }
  if (kind == "oom_killed") AttachOffers(plan, &o.denials);  // the OOM denial's offer
  Json outcome = Json::parse(ToJson(o, -1));
  if (kind == "cancelled") outcome["kind"] = "cancelled";
  std::string output = r.output;
  if (!headline.empty()) output = headline + "\n" + output;
  if (kind == "exited" && o.exit_code.value_or(0) != 0) {
    if (!output.empty() && output.back() != '\n') output += '\n';
    output += "[exit code " + std::to_string(*o.exit_code) + "]";
  } else if (kind == "signaled") {
    if (!output.empty() && output.back() != '\n') output += '\n';
    output += "[killed by signal " + std::to_string(o.signal.value_or(0)) + "]";
  }
  Json result = {{"output", output},
                 {"is_error", !(kind == "exited" && o.exit_code.value_or(1) == 0)},
                 {"kind", kind},
                 {"truncated", r.truncated},
                 {"output_bytes", r.output_bytes},
                 {"outcome", outcome}};
  if (o.exit_code) result["exit_code"] = *o.exit_code;
  if (o.signal) result["signal"] = *o.signal;
  return result;
}

// A run_code program may make this many tool calls.
static constexpr std::size_t kMaxProgramCalls = 10000;
// The file tools a program's `tools` module always has.
static const std::set<std::string> kCodeFileTools = {"read_file", "write_file", "edit_file", "list_dir", "glob"};

static Json ToolErrorResult(const std::string& message) {
  return {{"output", "tool_error: " + message},
          {"is_error", true},
          {"kind", "tool_error"},
          {"outcome", {{"kind", "tool_error"}, {"error", message}}}};
}

Json Manager::Impl::CodeBindings(SessionState& s) {
  auto policy = SessionPolicy(s.recipe);
  const bool bash_bound = policy.ok() && policy->tools.run_code.bash;
  Json specs = Json::array();
  for (const auto& t : mcp::Tools(options.output_cap_bytes)) {
    if (!kCodeFileTools.count(t.name) && !(bash_bound && t.name == "bash")) continue;
    specs.push_back({{"name", t.name}, {"description", t.description}, {"inputSchema", t.input_schema}});
  }
  if (auto gw = GatewayOf(s)) {
    const Json listed = gw->Tools();
    for (const Json& t : listed["tools"]) {
      specs.push_back({{"name", t.value("name", "")}, {"description", t.value("description", "")},
                       {"inputSchema", t.value("inputSchema", Json::object())}});
    }
  }
  return specs;
}

Json Manager::Impl::RunCode(SessionState& s, World& world, const ConfinedCommand& confined, const Json& input,
                            const std::string& call_id, std::uint64_t seq, const std::atomic<bool>* cancel) {
  const Plan& plan = confined.plan;
  const std::string language = input["language"].get<std::string>();
  auto runtime = FindCodeRuntime(language);
  if (!runtime) return ToolErrorResult("run_code: language must be python or javascript, not '" + language + "'");
  if (runtime->path.empty()) return ToolErrorResult("run_code: " + language + " is not available here: " + runtime->why_absent);
  if (!plan.confined) {
    return ToolErrorResult("run_code: this session's sandbox is not confined (danger-full-access), so a program's "
                           "network could not be taken away; no program runs");
  }
  const Json specs = CodeBindings(s);
  std::set<std::string> bound;
  for (const Json& t : specs) bound.insert(t["name"].get<std::string>());
  std::string names;
  for (const auto& n : bound) names += (names.empty() ? "" : ", ") + n;
  std::atomic<std::uint64_t> children{0};
  auto dispatch = [&](const std::string& name, const Json& in, const std::atomic<bool>* stop) -> Json {
    if (!bound.count(name)) {
      std::string why = "no tool '" + name + "' in run_code's tools module (it has: " + names + ")";
      if (name == "bash") why += "; bash is bound only when the policy says tools.run_code.bash: true";
      if (name == "run_code") why += "; a program cannot start another";
      return ToolErrorResult(why);
    }
    const std::string child = call_id.empty() ? "" : call_id + "#" + std::to_string(++children);
    const ParentCall parent{call_id, seq};
    auto r = self->ExecuteIn(s.id, name, in, child, nullptr, stop, &parent);
    return r.ok() ? *r : ToolErrorResult(r.status().message());
  };
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    return {{"output", "sandbox_error: socketpair: " + std::string(std::strerror(errno))},
            {"is_error", true},
            {"kind", "sandbox_error"},
            {"outcome", {{"kind", "sandbox_error"}, {"error", "socketpair failed"}}}};
  }
  UniqueFd ours(pair[0]), theirs(pair[1]);
  Json program = {{"t", "program"}, {"language", language}, {"code", input["code"]}, {"tools", specs}};
  BindingServer server(std::move(ours), std::move(program), dispatch, kMaxProgramCalls);
  WorldExec exec;
  exec.argv = PreludeArgv(language, runtime->path);
  exec.cwd = plan.cwd;
  exec.output_cap = options.output_cap_bytes;
  exec.kill_grace_ms = plan.kill_grace_ms;
  exec.timeout_ms = input.contains("timeout") ? DurationFieldMs(input["timeout"]) : s.call_timeout_ms;
  exec.binding_fd = theirs.get();
  exec.no_network = true;
  auto ran = world.Exec(exec, nullptr, cancel);
  theirs.reset();
  const ProgramReport report = server.Finish();

  std::vector<Denial> denials;
  for (const Json& d : report.denials) {
    denials.push_back({"network", d.value("op", ""), d.value("target", ""),
                       "run_code programs have no network; a program reaches the outside only through its tools "
                       "bindings",
                       "run_code", 0});
  }
  Json result = ExecResult(s, world, confined, exec, ran, std::move(denials));
  if (!ran.ok()) return result;
  std::string output = result["output"].get<std::string>();
  if (report.value && !report.value->is_null()) {
    std::string text = report.value->is_string() ? report.value->get<std::string>()
                                                 : report.value->dump(-1, ' ', false, Json::error_handler_t::replace);
    if (text.size() > options.output_cap_bytes) {
      const std::size_t whole = text.size();
      text.resize(options.output_cap_bytes);
      text += "\n[result truncated: " + std::to_string(whole) + " bytes, the first " +
              std::to_string(options.output_cap_bytes) + " kept]";
      result["truncated"] = true;
    } else {
      result["result"] = *report.value;
    }
    if (!output.empty() && output.back() != '\n') output += '\n';
    output += text;
  }
  if (report.error) result["error"] = *report.error;
  if (!report.protocol_error.empty()) {
    if (!output.empty() && output.back() != '\n') output += '\n';
    output += "[run_code: the program's tools channel was closed: " + report.protocol_error + "]";
    result["protocol_error"] = report.protocol_error;
  }
  result["output"] = output;
  result["language"] = language;
  result["tool_calls"] = report.calls;
  return result;
}

Json Manager::Impl::RunFile(SessionState& s, World& world, const ConfinedCommand& confined, const std::string& name,
                            const Json& input) {
  Json req = {{"name", name}, {"input", input}, {"workspace", confined.plan.workspace_target}};
  auto answer = world.File(std::move(req), kFileToolTimeoutMs);
  if (!answer.ok() && answer.status().stage() == kFileToolTimedOut) {
    const std::string error = answer.status().message();
    return {{"output", "timed_out: " + error},
            {"is_error", true},
            {"kind", "timed_out"},
            {"outcome", {{"kind", "timed_out"}, {"error", error}}}};
  }
  if (!answer.ok()) {
    return {{"output", "sandbox_error: " + answer.status().ToString()},
            {"is_error", true},
            {"kind", "sandbox_error"},
            {"outcome", {{"kind", "sandbox_error"}, {"error", answer.status().ToString()}}},
            {"world_gone", answer.status().stage() == kWorldGone}};
  }
  Json& a = *answer;
  const std::string kind = a.value("kind", "tool_error");
  std::string output;  // moved out of the answer: a read_file's is the file
  if (auto it = a.find("output"); it != a.end()) {
    if (it->is_string()) output = std::move(it->get_ref<std::string&>());
    a.erase(it);
  }
  if (kind != "ok") {
    std::string error = a.value("error", "");
    // The tools' messages already begin with their kind.
    output = error.rfind(kind, 0) == 0 ? error : kind + ": " + error;
  }
  Json outcome = a;
  // A write the workspace's cap refused (ENOSPC from the tool) is disk_gib's
  // denial, naming the file.
  const auto upper_fs = s.CappedFs();
  const bool no_space = a.value("error", "").find(supervise::kNoSpaceSignature) != std::string::npos;
  if (kind == "tool_error" && upper_fs && no_space) {
    const std::string path = input.value("path", "");
    const std::string target =
        !path.empty() && path[0] == '/' ? path : paths::Join(confined.plan.workspace_target, path);
    std::optional<Denial> d = supervise::DiskFullDenial(upper_fs->get(), s.upper_fs_bytes, target);
    if (!d) d = Denial{"resources", "write", target, supervise::DiskFullReason(s.upper_fs_bytes), "file-tool", 0};
    const Json denial = {{"facet", d->facet}, {"op", d->op}, {"target", d->target}, {"reason", d->reason},
                         {"source", d->source}};
    outcome["denials"] = Json::array({denial});
    if (confined.plan.denial_outcome) {
      outcome["kind"] = "sandbox_denied";
      return {{"output", "sandbox_denied: " + DenialLine(denial)}, {"is_error", true}, {"kind", "sandbox_denied"},
              {"outcome", outcome}};
    }
  }
  if (kind == "tool_error") {
    if (std::optional<Json> denial = FileToolDenial(confined, name, input, a.value("error", ""))) {
      outcome["denials"] = Json::array({*denial});
      if (confined.plan.denial_outcome) {
        outcome["kind"] = "sandbox_denied";
        return {{"output", "sandbox_denied: " + DenialLine(*denial)}, {"is_error", true}, {"kind", "sandbox_denied"},
                {"outcome", outcome}};
      }
    }
  }
  return {{"output", std::move(output)}, {"is_error", kind != "ok"}, {"kind", kind}, {"outcome", std::move(outcome)}};
}

namespace {

// A capped upper layer lives on a tmpfs that this process holds: written to
// the state directory (at most disk_gib of it) so that the next process on
// it starts the session's next world with it. Once: the fd goes after.
void SpillUpperLayer(SessionState& s) {
  auto fs = s.UpperFs();
  if (!fs || !fs->valid()) return;
  const std::string tmp = s.dir + "/spill.tmp";
  RemoveTree(tmp);
  Status done = mkdir(tmp.c_str(), 0700) == 0 ? Status() : Status::Errno("session", "mkdir", tmp);
  if (done.ok()) done = CopyUpperTree("/proc/self/fd/" + std::to_string(fs->get()) + "/upper", tmp + "/upper");
  if (done.ok()) {
    RemoveTree(s.SpillDir());
    if (rename(tmp.c_str(), s.SpillDir().c_str()) != 0) done = Status::Errno("session", "rename", s.SpillDir());
    UniqueFd d(open(s.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (d.valid()) fsync(d.get());
  }
  if (!done.ok()) RemoveTree(tmp);
  std::lock_guard<std::mutex> lock(s.mu);
  s.upper_fs.reset();
  if (done.ok()) {
    (void)s.AppendLog({{"type", "event"}, {"event", "upper_spilled"}});
  } else {
    s.upper_lost = true;
    (void)s.AppendLog({{"type", "event"}, {"event", "upper_lost"},
                       {"reason", "the session's upper layer (a tmpfs: disk_gib) could not be written to the state "
                                  "directory as agentbox stopped: " + done.ToString()}});
  }
}

}  // namespace

namespace {

// A remote session's diff, apply or snapshot, done by the remote agentbox
// on its copy of the workspace: over ssh, or by exec in the session's
// claimed pod.
Result<Json> RemoteLayersOf(SessionState& s, const std::string& exe, Json request) {
  auto policy = SessionPolicy(s.recipe);
  if (!policy.ok()) return policy.status();
  if (!policy->sandbox.remote) return Status::Error("session", "session " + s.id + " has no remote");
  if (!policy->sandbox.fresh_per_task) {
    return Status::Error(kBadRequest, "session " + s.id + " works on the remote's workspace directly "
                                      "(fresh_per_task: false): there are no session changes apart from it");
  }
  RemotePlan plan = RemotePlanFor(*policy, s.id, s.workspace, exe);
  if (policy->sandbox.remote->kubernetes) {
    std::lock_guard<std::mutex> wl(s.world_mu);
    if (Status r = ResumeClaim(s, *policy->sandbox.remote->kubernetes); !r.ok()) return r;
    if (!s.claim) {
      // No call has run: no pod, so no copy and no changes.
      const std::string op = request.value("op", "");
      if (op == "diff") {
        return Json{{"files", Json::array()}, {"patch", ""}, {"truncated", false}, {"files_truncated", false}};
      }
      if (op == "apply") {
        return Json{{"applied", Json::array()}, {"files", Json::array()}, {"conflicts", Json::array()},
                    {"protected", Json::array()}};
      }
      return Status::Error(kConflict, "session " + s.id + " has no claimed pod yet (no call has run)");
    }
    plan.k8s_claim = s.claim->claim();
    plan.k8s_pod = s.claim->pod();
  }
  return RemoteLayers(plan, std::move(request));
}

}  // namespace

Result<std::string> Manager::Impl::TakeSnapshot(SessionState& s, bool keep) {
  std::lock_guard<std::mutex> snapshots_lock(snapshots_mu);
  if (s.ws_mode == "remote") return TakeRemoteSnapshot(s, keep);
  if (s.ws_mode == "direct") {
    return Status::Error(kBadRequest, "session " + s.id + " works on its workspace directly (fresh_per_task: false): "
                                      "there are no session changes to snapshot");
  }
  const std::string snap = RandomId("snap-");
  const std::string dest = SnapshotsDir() + "/" + snap;
  if (s.upper_kind == "image" && s.ws_mode == "overlay") {
    if (Status m = s.EnsureImage(); !m.ok()) return m;
  }
  std::shared_ptr<const UniqueFd> hold;
  LayerStack stack = s.Layers(&hold);
  struct stat st {};
  if (stat(stack.upper.c_str(), &st) != 0) mkdir(stack.upper.c_str(), 0700);  // nothing ran yet: no changes
  if (s.ws_mode == "copy" && stat(stack.upper.c_str(), &st) == 0 && !s.confined) {
    // A copy session that never ran holds an empty dir: snapshot the base it would copy.
    stack.upper = s.lowers.empty() ? s.workspace : s.lowers.front();
  }
  Result<Json> manifest = Status::Error("snapshot", "not taken");
  try {
    manifest = CreateSnapshot(stack, s.ws_mode == "copy" ? "" : s.recipe.value("from_snapshot", ""), dest);
  } catch (const std::exception& e) {  // never past this point: a session must stay usable
    RemoveTree(dest);
    return Status::Error("snapshot", "snapshot of session " + s.id + " failed: " + e.what());
  }
  if (!manifest.ok()) return manifest.status();
  // Whose it is, beside the manifest: a snapshot without it (an older one,
  // or one whose owner file never got written) is never removed but by name.
  // taken_ns orders snapshots taken within a file timestamp's granularity.
  const std::int64_t taken_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::system_clock::now().time_since_epoch()).count();
  if (Status o = WriteFileDurably(dest + "/" + kSnapshotOwnerFile,
                                  Json{{"session", s.id}, {"keep", keep}, {"taken_ns", taken_ns}}.dump());
      !o.ok()) {
    return o;
  }
  std::lock_guard<std::mutex> lock(s.mu);
  (void)s.AppendLog({{"type", "event"}, {"event", "snapshot"}, {"snapshot_id", snap}, {"keep", keep}});
  return snap;
}

// A remote session's snapshot: its tree kept on the remote (remote_world.h),
// its record here, listed and deleted as the others are; a session on the
// same remote may start from it.
Result<std::string> Manager::Impl::TakeRemoteSnapshot(SessionState& s, bool keep) {
  auto policy = SessionPolicy(s.recipe);
  if (!policy.ok()) return policy.status();
  if (policy->sandbox.remote && policy->sandbox.remote->kubernetes) {
    return Status::Error(kBadRequest, "session " + s.id + " runs in a claimed Kubernetes pod: a snapshot kept there "
                                      "would go with the claim, so none is taken");
  }
  const std::string snap = RandomId("snap-");
  auto taken = RemoteLayersOf(s, exe, {{"op", "snapshot"}, {"snapshot", snap}});
  if (!taken.ok()) return taken.status();
  const std::string dest = SnapshotsDir() + "/" + snap;
  const std::int64_t taken_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::system_clock::now().time_since_epoch()).count();
  const Json record = {{"policy_yaml", s.recipe.value("policy_yaml", "")},
                       {"mode", s.recipe.value("mode", "")},
                       {"session", s.id},
                       {"workspace", s.workspace},
                       {"created", taken->value("created", NowRfc3339())},
                       {"entries", taken->value("entries", 0)},
                       {"remote", policy->sandbox.remote->ssh}};
  Status written = mkdir(SnapshotsDir().c_str(), 0700) != 0 && errno != EEXIST
                       ? Status::Errno("snapshot", "mkdir", SnapshotsDir())
                   : mkdir(dest.c_str(), 0700) != 0 ? Status::Errno("snapshot", "mkdir", dest)
                                                    : Status();
  if (written.ok()) {
    written = WriteFileDurably(dest + "/" + kSnapshotOwnerFile,
                               Json{{"session", s.id}, {"keep", keep}, {"taken_ns", taken_ns}}.dump());
  }
  // The record last: a directory without it is no snapshot.
  if (written.ok()) written = WriteFileDurably(dest + "/" + kRemoteSnapshotFile, record.dump(2));
  if (!written.ok()) {
    RemoveTree(dest);
    (void)RemoteLayersOf(s, exe, {{"op", "drop_snapshot"}, {"snapshot", snap}});
    return written;
  }
  std::lock_guard<std::mutex> lock(s.mu);
  (void)s.AppendLog({{"type", "event"}, {"event", "snapshot"}, {"snapshot_id", snap}, {"keep", keep},
                     {"on_remote", true}});
  return snap;
}

std::vector<Json> Manager::Impl::AllSnapshots() const {
  std::vector<Json> all;
  DIR* d = opendir(SnapshotsDir().c_str());
  if (!d) return all;
  std::vector<std::string> ids;
  while (struct dirent* e = readdir(d)) {
    if (ValidId(e->d_name)) ids.emplace_back(e->d_name);
  }
  closedir(d);
  std::vector<std::pair<std::int64_t, std::string>> order;  // beside `all`
  for (const auto& id : ids) {
    const std::string dir = SnapshotsDir() + "/" + id;
    Json snap;
    if (auto record = ReadRemoteSnapshotRecord(dir); record.ok()) {
      snap = {{"id", id},     {"parent", ""},   {"mode", "remote"},        {"created", record->value("created", "")},
              {"session", ""}, {"keep", true}, {"remote", record->value("remote", "")}};
    } else {
      auto manifest = ReadSnapshotManifest(dir);
      if (!manifest.ok()) continue;  // being written, or an interrupted copy
      snap = {{"id", id},
              {"parent", manifest->value("parent", "")},
              {"mode", manifest->value("mode", "overlay")},
              {"created", manifest->value("created", "")},
              {"session", ""},
              {"keep", true}};
    }
    // Oldest first: when it was taken (owner.json), else when its manifest
    // (written last) was.
    struct stat mst {};
    std::int64_t taken_ns = stat((dir + "/manifest.json").c_str(), &mst) == 0
                                ? static_cast<std::int64_t>(mst.st_mtim.tv_sec) * 1000000000 + mst.st_mtim.tv_nsec
                                : 0;
    if (auto owner = ReadWholeFile(dir + "/" + kSnapshotOwnerFile); owner.ok()) {
      Json o = Json::parse(*owner, nullptr, false);
      if (o.is_object()) {
        snap["session"] = o.value("session", "");
        snap["keep"] = o.value("keep", true);
        taken_ns = o.value("taken_ns", taken_ns);
      }
    }
    order.emplace_back(taken_ns, id);
    all.push_back(std::move(snap));
  }
  std::vector<std::size_t> index(all.size());
  for (std::size_t i = 0; i < index.size(); ++i) index[i] = i;
  std::sort(index.begin(), index.end(), [&](std::size_t a, std::size_t b) { return order[a] < order[b]; });
  std::vector<Json> sorted;
  for (std::size_t i : index) sorted.push_back(std::move(all[i]));
  all = std::move(sorted);
  std::vector<std::shared_ptr<SessionState>> live;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [sid, st] : sessions) live.push_back(st);
  }
  for (Json& snap : all) {
    const std::string tree = SnapshotsDir() + "/" + snap.value("id", "") + "/tree";
    Json used = Json::array();
    for (const auto& st : live) {
      if (std::find(st->lowers.begin(), st->lowers.end(), tree) != st->lowers.end()) used.push_back(st->id);
    }
    snap["used_by"] = used;
  }
  return all;
}

std::string Manager::Impl::SnapshotUsers(const std::string& id, const std::vector<Json>& all) const {
  std::string users;
  for (const Json& snap : all) {
    if (snap.value("id", "") == id) {
      for (const auto& sid : snap["used_by"]) users += (users.empty() ? "" : ", ") + ("session " + sid.get<std::string>());
    }
    if (snap.value("parent", "") == id) users += (users.empty() ? "" : ", ") + ("snapshot " + snap.value("id", ""));
  }
  return users;
}

Status Manager::Impl::DeleteSnapshotLocked(const std::string& id) {
  const std::string dir = SnapshotsDir() + "/" + id;
  if (auto record = ReadRemoteSnapshotRecord(dir); record.ok()) {
    // The tree on the remote first: a remote that cannot be reached keeps
    // the record, and the caller may delete it again.
    auto plan = RemoteSnapshotPlan(*record, exe);
    if (!plan.ok()) return plan.status();
    auto dropped = RemoteLayers(*plan, {{"op", "drop_snapshot"}, {"snapshot", id}});
    if (!dropped.ok()) {
      return Status::Error(dropped.status().stage(), "snapshot " + id + " is kept on " + record->value("remote", "") +
                                                         ", which could not remove it: " + dropped.status().message());
    }
    if (unlink((dir + "/" + kRemoteSnapshotFile).c_str()) != 0) {
      return Status::Errno("snapshot", "unlink", dir + "/" + kRemoteSnapshotFile);
    }
    RemoveTree(dir);
    return {};
  }
  if (!ReadSnapshotManifest(dir).ok()) return Status::Error(kNotFound, "no snapshot " + id);
  const std::string users = SnapshotUsers(id, AllSnapshots());
  if (!users.empty()) {
    return Status::Error(kConflict, "snapshot " + id + " is in use by " + users +
                                        ": remove those first (a session's snapshots are layers of it)");
  }
  // The manifest goes first: a half-removed snapshot is no snapshot.
  if (unlink((dir + "/manifest.json").c_str()) != 0) return Status::Errno("snapshot", "unlink", dir + "/manifest.json");
  RemoveTree(dir);
  return {};
}

void Manager::Impl::RemoveSnapshotsOf(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(snapshots_mu);
  // Newest first: a child goes before its parent, which it would keep.
  std::vector<Json> all = AllSnapshots();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->value("session", "") != session_id || it->value("keep", true)) continue;
    (void)DeleteSnapshotLocked(it->value("id", ""));  // one still needed stays, as a kept one
  }
}

// ---------------------------------------------------------------------------

Manager::Manager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Manager::~Manager() {
  if (impl_) Shutdown(0);
}

Result<Manager::Impl::LiveWorld> Manager::Impl::EnsureWorld(SessionState& s) {
  std::unique_lock<std::mutex> wl(s.world_mu);
  if (!s.world || !s.world->Alive()) {
    std::string event = "provisioned";
    Json extra;
    if (s.stopped_idle) {
      event = "reprovisioned";
      extra["reason"] = "the session was idle and its sandbox stopped";
    } else if (s.world) {
      event = "reprovisioned";
      extra["reason"] = s.world->death();
    }
    if (s.world) s.world->Stop(0);
    s.world.reset();
    s.stopped_idle = false;
    Status p = Provision(s);
    std::lock_guard<std::mutex> lock(s.mu);
    if (!p.ok()) {
      (void)s.AppendLog({{"type", "event"}, {"event", "provision_failed"}, {"error", p.ToString()}});
      return p;
    }
    Json e = {{"type", "event"}, {"event", event}, {"sandbox_pid", s.world->supervisor_pid()}};
    if (!extra.is_null()) e.update(extra);
    (void)s.AppendLog(e);
  }
  return LiveWorld{s.world, s.confined, s.git_known};
}

Result<std::unique_ptr<Manager>> Manager::Open(const ManagerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (options.state_dir.empty() || options.state_dir[0] != '/') {
    return Status::Error(kBadRequest, "the state directory must be an absolute path (got '" + options.state_dir + "')");
  }
  if (mkdir(options.state_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Status::Errno("session", "mkdir", options.state_dir);
  }
  impl->options.state_dir = RealPath(options.state_dir);
  const std::string& dir = impl->options.state_dir;
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return Status::Errno("session", "stat", dir);
  if (st.st_uid != geteuid()) {
    return Status::Error("session", "state directory " + dir + " belongs to uid " + std::to_string(st.st_uid) +
                                        ", not to this process's uid " + std::to_string(geteuid()));
  }
  if (st.st_mode & 077) chmod(dir.c_str(), st.st_mode & 0700);
  impl->lock.reset(open((dir + "/lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!impl->lock.valid()) return Status::Errno("session", "open", dir + "/lock");
  if (flock(impl->lock.get(), LOCK_EX | LOCK_NB) != 0) {
    return Status::Error(kConflict, "state directory " + dir + " is in use by another agentbox process");
  }
  mkdir(impl->SessionsDir().c_str(), 0700);
  mkdir(impl->SnapshotsDir().c_str(), 0700);
  // Every sandbox of this user's hides it (linux::OwnDirs).
  linux::RegisterStateDir(dir);
  impl->exe = options.agentbox_exe.empty() ? RealPath("/proc/self/exe") : options.agentbox_exe;
  if (access(impl->exe.c_str(), X_OK) != 0) return Status::Errno("session", "access(X_OK)", impl->exe);
  if (auto fs = ReadWholeFile("/proc/filesystems"); fs.ok()) {
    impl->overlay_available = fs->find("\toverlay\n") != std::string::npos;
  }
  if (DIR* d = opendir(impl->SessionsDir().c_str())) {
    while (struct dirent* e = readdir(d)) {
      if (!ValidId(e->d_name)) continue;
      if (Status s = impl->Load(e->d_name); !s.ok()) {
        std::fprintf(stderr, "agentbox: session %s not loaded: %s\n", e->d_name, s.ToString().c_str());
      }
    }
    closedir(d);
  }
  // Idle sessions' worlds are stopped (session.idle_timeout), checked a
  // few times a second: the timeouts are minutes, or seconds in tests.
  Impl* raw = impl.get();
  impl->idle_reaper = std::thread([raw] {
    std::unique_lock<std::mutex> lock(raw->reaper_mu);
    while (!raw->reaper_stop) {
      raw->reaper_cv.wait_for(lock, std::chrono::milliseconds(250));
      if (raw->reaper_stop) break;
      lock.unlock();
      raw->StopIdleWorlds();
      lock.lock();
    }
  });
  Manager* manager = new Manager(std::move(impl));
  raw->self = manager;
  return std::unique_ptr<Manager>(manager);
}

Result<std::string> Manager::Create(const CreateRequest& request) {
  Impl& m = *impl_;
  if (m.shutting_down) return Status::Error(kConflict, "agentbox is shutting down");
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.sessions.size() >= m.options.max_sessions) {
      return Status::Error(kBusy, "the limit of " + std::to_string(m.options.max_sessions) + " sessions is reached");
    }
  }
  if (request.workspace.empty() || request.workspace[0] != '/') {
    return Status::Error(kBadRequest, "workspace must be an absolute path (got '" + request.workspace + "')");
  }
  auto policy = BuildPolicy(request.policy_yaml, request.mode);
  if (!policy.ok()) return policy.status();
  if (policy->mode == Mode::kDangerFullAccess) {
    return Status::Error(kBadRequest, "sessions run confined: a danger-full-access policy has no sandbox to keep");
  }
  // A remote world's workspace is a directory of the remote's, which the
  // remote agentbox checks (and copies, for fresh_per_task) when the world
  // is first provisioned: nothing of it is here.
  const bool remote = policy->sandbox.isolation == Isolation::kRemote;
  std::string workspace = request.workspace;
  if (remote) {
    if (Status r = CheckRemoteSession(*policy, request); !r.ok()) return r;
    if (!policy->sandbox.remote->workspace.empty()) workspace = policy->sandbox.remote->workspace;
  } else {
    workspace = RealPath(request.workspace);
    struct stat st {};
    if (workspace.empty() || stat(workspace.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return Status::Error(kBadRequest, "workspace " + request.workspace + " is not a directory");
    }
    // A session on agentbox's own state would hand the sandbox the daemon's
    // socket, other sessions' logs and layers.
    for (const auto& own : OwnDirsWith(m.options.state_dir)) {
      if (paths::IsWithin(workspace, own)) {
        return Status::Error(kBadRequest, "workspace " + workspace + " is inside agentbox's own state directory " +
                                              own + ": no session may work on it");
      }
    }
  }
  std::string ws_mode, mode_reason;
  if (remote) {
    ws_mode = "remote";
    const RemoteSpec& r = *policy->sandbox.remote;
    const std::string where = r.kubernetes ? "a pod claimed from SandboxTemplate " + r.kubernetes->template_name +
                                                 " in namespace " + r.kubernetes->namespace_name
                                           : r.ssh;
    mode_reason = policy->sandbox.fresh_per_task
                      ? "sandbox.isolation: remote (the session's copy of the workspace is on the remote, " + where +
                            ")"
                      : "sandbox.isolation: remote, fresh_per_task false (the session works on the remote's "
                        "workspace itself, " + where + ")";
  } else if (!policy->sandbox.fresh_per_task) {
    ws_mode = "direct";
    mode_reason = "the policy's sandbox.fresh_per_task is false: the session works on the workspace itself";
  } else if (m.options.workspace_mode == "copy") {
    ws_mode = "copy";
    mode_reason = "asked for (workspace_mode copy)";
  } else if (policy->sandbox.isolation == Isolation::kMicrovm || policy->sandbox.isolation == Isolation::kContainer) {
    // The guest sees host directories through virtiofs shares, gVisor
    // through its gofer's binds: the session's copy is one; an overlay of
    // the host's layers is not.
    const bool vm = policy->sandbox.isolation == Isolation::kMicrovm;
    if (m.options.workspace_mode == "overlay") {
      return Status::Error(kBadRequest, std::string("workspace_mode overlay: ") +
                                            (vm ? "a microVM's workspace is a share" : "a gVisor sandbox's workspace "
                                                                                      "is a bind") +
                                            " of the session's copy (the host's overlay layers do not reach it); use "
                                            "copy");
    }
    ws_mode = "copy";
    mode_reason = vm ? "sandbox.isolation: microvm (the guest's workspace is a share of the session's copy)"
                     : "sandbox.isolation: container (the gVisor sandbox's workspace is a bind of the session's copy)";
  } else if (!m.overlay_available) {
    if (m.options.workspace_mode == "overlay") {
      return Status::Error("session", "overlayfs is not available on this host and workspace_mode is overlay");
    }
    ws_mode = "copy";
    mode_reason = "overlayfs is not available on this host";
  } else if ((workspace + m.options.state_dir).find_first_of(",:\\") != std::string::npos) {
    if (m.options.workspace_mode == "overlay") {
      return Status::Error(kBadRequest, "overlayfs cannot take a layer path holding ',', ':' or '\\' (" + workspace +
                                            " or " + m.options.state_dir + ")");
    }
    ws_mode = "copy";
    mode_reason = "the workspace or state path holds ',', ':' or '\\', which overlayfs options cannot carry";
  } else {
    ws_mode = "overlay";
    mode_reason = "overlayfs";
  }
  std::vector<std::string> lowers;
  // Until the session is in the list (Load): its snapshot cannot go meanwhile.
  std::unique_lock<std::mutex> snapshots_lock(m.snapshots_mu);
  // A remote session's snapshot, the tree on its remote: the new session's
  // copy there is made from it before the session is listed.
  std::string seed_from;
  if (!request.from_snapshot.empty()) {
    if (ws_mode == "direct" || !policy->sandbox.fresh_per_task) {
      return Status::Error(kBadRequest, "from_snapshot needs a fresh_per_task session");
    }
    if (!ValidId(request.from_snapshot)) {
      return Status::Error(kBadRequest, "snapshot id '" + request.from_snapshot + "' is malformed");
    }
    auto record = ReadRemoteSnapshotRecord(m.SnapshotsDir() + "/" + request.from_snapshot);
    if (!record.ok() && record.status().stage() != kNotFound) return record.status();
    if (record.ok() != (ws_mode == "remote")) {
      if (!record.ok() && !ReadSnapshotManifest(m.SnapshotsDir() + "/" + request.from_snapshot).ok()) {
        return Status::Error(kNotFound, "no snapshot " + request.from_snapshot);
      }
      return Status::Error(kConflict, "snapshot " + request.from_snapshot +
                                          (record.ok() ? " is kept on the remote " + record->value("remote", "") +
                                                             "; this session's world is local (" + ws_mode + " mode)"
                                                       : " is kept here; a remote session starts only from a "
                                                         "snapshot kept on its remote"));
    }
  }
  if (!request.from_snapshot.empty() && ws_mode == "remote") {
    auto record = ReadRemoteSnapshotRecord(m.SnapshotsDir() + "/" + request.from_snapshot);
    auto theirs = RemoteSnapshotPlan(*record, m.exe);
    if (!theirs.ok()) return theirs.status();
    const RemotePlan ours = RemotePlanFor(*policy, "", workspace, m.exe);
    if (theirs->ssh != ours.ssh || theirs->port != ours.port) {
      return Status::Error(kConflict, "snapshot " + request.from_snapshot + " is kept on " +
                                          record->value("remote", "") + "; this session's world is on " +
                                          policy->sandbox.remote->ssh);
    }
    seed_from = request.from_snapshot;
  } else if (!request.from_snapshot.empty()) {
    std::string snap_mode;
    auto chain = m.SnapshotChain(request.from_snapshot, &snap_mode);
    if (!chain.ok()) return chain.status();
    if (snap_mode != ws_mode) {
      return Status::Error(kConflict, "snapshot " + request.from_snapshot + " was taken in " + snap_mode +
                                          " mode; this session would be in " + ws_mode + " mode");
    }
    lowers = ws_mode == "copy" ? std::vector<std::string>{chain->front()} : *chain;
  }
  const std::string id = RandomId("s-");
  const std::string dir = m.SessionsDir() + "/" + id;
  if (mkdir(dir.c_str(), 0700) != 0) return Status::Errno("session", "mkdir", dir);
  Json recipe = {{"id", id},
                 {"created", NowRfc3339()},
                 {"workspace", workspace},
                 {"policy_yaml", request.policy_yaml},
                 {"mode", request.mode},
                 {"from_snapshot", request.from_snapshot},
                 {"lowers", lowers},
                 {"workspace_mode", ws_mode},
                 {"workspace_mode_reason", mode_reason},
                 {"snapshot_on_exit", policy->sandbox.snapshot_on_exit}};
  // disk_gib bounds an overlay session's own layer: a tmpfs or an image of that size.
  if (ws_mode == "overlay" && policy->resources.disk_bytes) {
    const std::uint64_t bytes = *policy->resources.disk_bytes;
    std::string kind = m.options.upper_fs;
    if (kind == "auto") kind = bytes >= kUpperImageFromBytes && UpperImageAvailable() ? "image" : "tmpfs";
    if (kind == "image" && !UpperImageAvailable()) {
      RemoveTree(dir);
      return Status::Error(kBadRequest, "upper_fs image needs root, /dev/loop-control and mkfs.ext4; this process "
                                        "has not all of them (use upper_fs tmpfs)");
    }
    recipe["upper_fs"] = kind;
    recipe["upper_fs_bytes"] = bytes;
  } else {
    recipe["upper_fs"] = "disk";
  }
  if (ws_mode != "direct" && ws_mode != "remote") {
    // What apply checks the base against (BaseRecordPath).
    if (Status s = RecordBase(workspace, dir + "/" + kBaseRecordName, OwnDirsWith(m.options.state_dir)); !s.ok()) {
      RemoveTree(dir);
      return s;
    }
  }
  if (Status s = WriteFileDurably(dir + "/session.json", recipe.dump(2)); !s.ok()) {
    RemoveTree(dir);
    return s;
  }
  if (!seed_from.empty()) {
    const RemotePlan plan = RemotePlanFor(*policy, id, workspace, m.exe);
    auto seeded = RemoteLayers(plan, {{"op", "seed"}, {"snapshot", seed_from}});
    if (!seeded.ok()) {
      (void)ForgetRemoteSession(plan);  // what the seed left there
      RemoveTree(dir);
      return seeded.status().WithContext("from_snapshot " + seed_from);
    }
  }
  if (Status s = m.Load(id); !s.ok()) {
    RemoveTree(dir);
    return s;
  }
  auto session = m.Find(id);
  std::lock_guard<std::mutex> lock(session->mu);
  (void)session->AppendLog({{"type", "event"}, {"event", "created"}, {"workspace", workspace},
                            {"workspace_mode", ws_mode}, {"from_snapshot", request.from_snapshot}},
                           /*sync=*/false);
  return id;
}

Result<Json> Manager::Describe(const std::string& id) const {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  Json d = {{"id", id},
            {"workspace", s->workspace},
            {"mode", s->ws_mode},
            {"mode_reason", s->recipe.value("workspace_mode_reason", "")},
            {"created", s->recipe.value("created", "")},
            {"from_snapshot", s->recipe.value("from_snapshot", "")},
            {"upper_fs", s->recipe.value("upper_fs", "disk")}};
  if (s->upper_fs_bytes) d["upper_fs_bytes"] = s->upper_fs_bytes;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->upper_lost) d["upper_lost"] = true;
    d["calls"] = s->calls;
    d["calls_in_flight"] = s->in_flight.size();
    Json terminals = Json::array();
    for (const auto& [tid, t] : s->terminals) terminals.push_back(t->Describe());
    d["terminals"] = terminals;
  }
  {
    std::unique_lock<std::mutex> lock(s->world_mu, std::try_to_lock);
    d["provisioned"] = lock.owns_lock() ? (s->world && s->world->Alive()) : true;
    d["provisions"] = s->provisions;
    if (lock.owns_lock() && !s->remote.is_null()) d["remote"] = s->remote;
    if (lock.owns_lock() && s->confined) {
      d["enforcement"] = Json::parse(ToJson(s->confined->enforcement, -1));
      d["sandbox_pid"] = s->world ? s->world->supervisor_pid() : -1;
    }
  }
  d["services"] = s->services ? s->services->List() : Json::array();
  d["ports"] = Json::array();
  {
    std::unique_lock<std::mutex> wl(s->world_mu, std::try_to_lock);
    std::lock_guard<std::mutex> lock(s->ports_mu);
    if (wl.owns_lock()) s->PrunePorts(s->world.get());
    for (const auto& [port, bridge] : s->ports) {
      if (bridge->active()) d["ports"].push_back(PortJson(*bridge));
    }
  }
  return d;
}

std::vector<std::string> Manager::List() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<std::string> ids;
  for (const auto& [id, s] : impl_->sessions) ids.push_back(id);
  return ids;
}

Result<Json> Manager::Execute(const std::string& id, const std::string& name, Json given, const std::string& call_id,
                              const OutputSink& sink, const std::atomic<bool>* cancel) {
  return ExecuteIn(id, name, std::move(given), call_id, sink, cancel, nullptr);
}

Result<Json> Manager::ExecuteIn(const std::string& id, const std::string& name, Json given, const std::string& call_id,
                                const OutputSink& sink, const std::atomic<bool>* cancel, const ParentCall* parent) {
  Impl& m = *impl_;
  auto s = m.Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  // NAME.TOOL: an upstream's tool, through the session's tool gateway.
  std::shared_ptr<gateway::Gateway> gw = name.find('.') != std::string::npos ? m.GatewayOf(*s) : nullptr;
  const bool upstream = gw && gw->Routes(name);
  const auto& tool_names = ToolNames();
  if (!upstream && std::find(tool_names.begin(), tool_names.end(), name) == tool_names.end()) {
    std::string names;
    for (const auto& t : tool_names) names += (names.empty() ? "" : ", ") + t;
    std::string why;
    if (name == "run_code") {
      for (const auto& r : CodeRuntimes()) why += "; " + r.why_absent;
      why = " (run_code is not offered here" + why + ")";
    }
    return Status::Error(kBadRequest, "unknown tool '" + name + "'; the tools are: " + names +
                                          (gw ? " and the upstream tools (ListUpstreamTools)" : "") + why);
  }
  if (!upstream) {
    if (Status st = ValidateToolInput(name, given); !st.ok()) return st;
  }
  // Moved, not copied: a write_file's content is megabytes.
  Json input = upstream ? std::move(given) : NormalizeToolInput(name, std::move(given));

  std::uint64_t seq = 0;
  std::optional<Json> replay;
  std::uint64_t replay_end = 0;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->removing) return Status::Error(kConflict, "session " + id + " is being removed");
    if (!call_id.empty()) {
      // A call_id names one request: the same again is a replay, another is a mistake.
      if (auto req = s->requests.find(call_id); req != s->requests.end()) {
        const std::string diff = RequestDifference(req->second.first, req->second.second, name, input);
        if (!diff.empty()) return Status::Error(kConflict, "call_id " + call_id + " was recorded " + diff);
      }
      auto it = s->results.find(call_id);
      if (it != s->results.end()) {
        replay = it->second;
        (*replay)["replayed"] = true;
        replay_end = s->log.written();
      } else if (s->in_flight.count(call_id)) {
        return Status::Error(kConflict, "call " + call_id + " is running in session " + id);
      }
    }
    if (!replay) {
      if (m.shutting_down) return Status::Error(kConflict, "agentbox is shutting down");
      if (m.calls_in_flight.fetch_add(1) >= m.options.max_concurrent_calls) {
        m.calls_in_flight.fetch_sub(1);
        return Status::Error(kBusy, "the limit of " + std::to_string(m.options.max_concurrent_calls) +
                                        " concurrent calls is reached");
      }
      // From here the session is busy (Busy()): never stopped as idle.
      ++s->active_calls;
      seq = s->next_seq++;
      if (!call_id.empty()) {
        s->in_flight.insert(call_id);
        s->requests[call_id] = {name, input};
      }
    }
  }
  if (replay) {
    // Its first answer may still be waiting for the sync of its line: no
    // answer goes out before the result it carries is on disk.
    if (Status st = s->log.Sync(replay_end); !st.ok()) return st;
    return *replay;
  }
  struct Release {
    Impl& m;
    SessionState& s;
    ~Release() {
      m.calls_in_flight.fetch_sub(1);
      std::lock_guard<std::mutex> lock(s.mu);
      --s.active_calls;
      s.last_call_end = Clock::now();
    }
  } release{m, *s};
  if (upstream) return m.CallUpstream(*s, *gw, name, input, call_id, seq, parent);
  // One-call grants: this call takes those approved since the last one,
  // and runs alone in the session while they are in force (grant_mu). A
  // program's call runs in its program's turn.
  std::shared_lock<std::shared_mutex> shared_turn(s->grant_mu, std::defer_lock);
  std::unique_lock<std::shared_mutex> own_turn(s->grant_mu, std::defer_lock);
  std::vector<std::pair<std::string, EscalationOffer>> once;  // escalation id, grant
  if (!parent) {
    bool pending;
    {
      std::lock_guard<std::mutex> lock(s->mu);
      pending = !s->once_pending.empty();
    }
    if (pending) {
      own_turn.lock();
    } else {
      shared_turn.lock();
    }
    std::lock_guard<std::mutex> lock(s->mu);
    for (const std::string& eid : s->once_pending) {
      auto e = std::find_if(s->escalations.begin(), s->escalations.end(),
                            [&](const Json& r) { return r.value("id", "") == eid; });
      if (e == s->escalations.end()) continue;
      if (auto g = OfferFromGrant((*e)["grant"].dump()); g.ok()) once.emplace_back(eid, *g);
    }
    s->once_pending.clear();
  }
  // A call refused before it ran leaves no trace: its call_id is free again,
  // and the one-call grants it took wait for the next call.
  auto refuse = [&](Status st) -> Status {
    std::lock_guard<std::mutex> lock(s->mu);
    if (!call_id.empty()) {
      s->in_flight.erase(call_id);
      s->requests.erase(call_id);
    }
    for (auto it = once.rbegin(); it != once.rend(); ++it) s->once_pending.insert(s->once_pending.begin(), it->first);
    once.clear();
    return st;
  };
  // Which of them the running world takes as it is, and which need a world
  // of their own for this call (seccomp; a mount that cannot be added live).
  std::vector<std::pair<std::string, EscalationOffer>> live_once, world_once;
  Json grants_used = Json::array();
  if (!once.empty()) {
    std::lock_guard<std::mutex> world_lock(s->world_mu);
    for (const auto& [eid, g] : once) {
      const std::string why = g.grant_key == "network.allow" ? "" : WhyNewWorld(g.grant_key);
      Json used = {{"escalation", eid}, {"grant", Json::parse(g.grant_json)}, {"scope", "once"}};
      if (why.empty()) {
        live_once.emplace_back(eid, g);
        used["applied"] = "live";
      } else {
        world_once.emplace_back(eid, g);
        used["applied"] = "new_world";
        used["why"] = why;
        s->world_grants.push_back(g);
      }
      grants_used.push_back(used);
    }
    if (!world_once.empty() && s->world) s->world->Stop(0);  // the next world carries them
  }
  World* grants_world = nullptr;  // the world the live one-call grants are in force in
  std::shared_ptr<World> grants_world_hold;
  bool logged = false;
  auto log_call = [&]() -> Status {
    if (logged) return {};
    std::lock_guard<std::mutex> lock(s->mu);
    ++s->calls;
    logged = true;
    Json line = {{"type", "call"}, {"seq", seq}, {"call_id", call_id}, {"name", name}};
    if (parent) line["parent"] = {{"call_id", parent->call_id}, {"seq", parent->seq}};
    // Written, not synced: from here a SIGKILL of this process leaves it in
    // the file (a restart records the call as interrupted); the result's
    // sync puts it on disk with the result (one fdatasync per call).
    auto written = s->WriteLog(std::move(line), "input", &input);
    return written.ok() ? Status{} : written.status();
  };

  const auto started = Clock::now();
  Json result;
  std::shared_ptr<World> ran_in;  // the world the call was sent to
  std::string cwd;  // a bash call's cwd, resolved inside its world
  // A world found dead when the call is sent ran nothing: provision afresh
  // and send it again, once.
  for (int attempt = 0; attempt < 2 && (result.is_null() || result.value("world_gone", false)); ++attempt) {
    result = Json();
    auto live = m.EnsureWorld(*s);
    if (!live.ok()) {
      const Status& p = live.status();
      result = {{"output", "sandbox_error: " + p.ToString()},
                {"is_error", true},
                {"kind", "sandbox_error"},
                {"outcome",
                 {{"kind", "sandbox_error"},
                  {"error", {{"stage", p.stage()}, {"message", p.message()}, {"errno", p.err()}}}}}};
      break;
    }
    std::shared_ptr<World> world = live->world;
    std::shared_ptr<const ConfinedCommand> confined = live->confined;
    std::shared_ptr<const std::set<std::string>> git_known = live->git_known;
    if (name == "bash" && input.contains("cwd") && cwd.empty()) {
      auto resolved = m.ResolveCwd(*world, *confined, input["cwd"].get<std::string>());
      if (!resolved.ok() && resolved.status().stage() == kWorldGone) {
        result = {{"output", "sandbox_error: " + resolved.status().ToString()}, {"is_error", true},
                  {"kind", "sandbox_error"}, {"outcome", {{"kind", "sandbox_error"}, {"error", resolved.status().ToString()}}},
                  {"world_gone", true}};
        continue;
      }
      if (!resolved.ok()) {
        if (logged) {  // a fresh world that disagrees with the first: recorded, as any failure
          result = {{"output", "tool_error: " + resolved.status().message()}, {"is_error", true},
                    {"kind", "tool_error"}, {"outcome", {{"kind", "tool_error"}, {"error", resolved.status().message()}}}};
          break;
        }
        return refuse(resolved.status());
      }
      cwd = *resolved;
    }
    // The call line is on disk before anything of the call runs.
    if (Status st = log_call(); !st.ok()) return refuse(st);
    if (!live_once.empty() && grants_world != world.get()) {
      grants_world = world.get();
      grants_world_hold = world;
      m.OpenOnceGrants(*s, *world, live_once, &grants_used);
    }
    // The world is used without the provisioning lock: calls run side by side.
    ran_in = world;
    if (name == "bash") {
      result = m.RunBash(*s, *world, *confined, input, cwd, sink, cancel);
    } else if (name == "run_code") {
      result = m.RunCode(*s, *world, *confined, input, call_id, seq, cancel);
    } else {
      result = m.RunFile(*s, *world, *confined, name, input);
    }
    if (git_known && !result.value("world_gone", false)) AuditGitAfterCall(confined->plan, *git_known, &result);
  }
  if (Status st = log_call(); !st.ok()) return refuse(st);
  result.erase("world_gone");
  // One-call grants end with the call: the live ones are taken back, a
  // world given for them is stopped (the next call gets one without).
  if (grants_world_hold) m.CloseOnceGrants(*s, *grants_world_hold, live_once);
  if (!world_once.empty()) {
    std::lock_guard<std::mutex> world_lock(s->world_mu);
    s->world_grants.clear();
    if (s->world) s->world->Stop(0);
  }
  if (!grants_used.empty()) {
    result["grants"] = grants_used;
    std::lock_guard<std::mutex> lock(s->mu);
    for (const Json& g : grants_used) {  // on disk with the result's line, below
      (void)s->AppendLog({{"type", "event"}, {"event", "grant_used"}, {"seq", seq}, {"call_id", call_id},
                          {"escalation", g.value("escalation", "")}, {"grant", g["grant"]}, {"applied", g["applied"]}},
                         /*sync=*/false);
      (void)s->AppendLog({{"type", "event"}, {"event", "grant_expired"}, {"seq", seq},
                          {"escalation", g.value("escalation", "")}, {"grant", g["grant"]},
                          {"why", "a one-call grant ends with its call"}},
                         /*sync=*/false);
    }
  }
  if (m.shutting_down && result.value("kind", "") == "sandbox_error") {
    result["kind"] = "interrupted";
    result["output"] = "interrupted: agentbox stopped during the call";
  } else if (s->ws_mode == "remote" && ran_in && result.value("kind", "") == "sandbox_error" && !ran_in->Alive()) {
    // The connection (or the remote's world) went during the call: what it
    // did there is unknown, so it is not sent again; the next call gets a
    // world provisioned afresh from the recipe, on the same remote copy.
    // What the call wrote before is kept, below the headline that replaces
    // the sandbox_error one.
    std::string before = result.value("output", "");
    if (before.rfind("sandbox_error:", 0) == 0) {
      const auto nl = before.find('\n');
      before = nl == std::string::npos ? "" : before.substr(nl + 1);
    }
    result["kind"] = "interrupted";
    result["output"] = "interrupted: " + ran_in->death() +
                       " during the call; it is not run again (its effects, if any, stay in the remote's "
                       "workspace), and the next call provisions the remote world again\n" + before;
    if (result.contains("outcome") && result["outcome"].is_object()) result["outcome"]["kind"] = "interrupted";
  }
  result["call_id"] = call_id;
  result["name"] = name;
  result["replayed"] = false;
  result["duration_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count();
  std::uint64_t logged_to = 0;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    Json line = {{"type", "result"}, {"seq", seq}, {"call_id", call_id}};
    if (parent) line["parent"] = {{"call_id", parent->call_id}, {"seq", parent->seq}};
    (void)s->WriteLog(std::move(line), "result", &result);
    if (!call_id.empty()) {
      s->results[call_id] = result;
      s->in_flight.erase(call_id);
    }
    s->RecordOffers(result, seq, call_id);
    logged_to = s->log.written();
  }
  // Group commit, without the session's lock: the calls of the session that
  // end meanwhile share this fdatasync. The result goes out once it (with
  // the call's line and events) is on disk.
  (void)s->log.Sync(logged_to);
  return result;
}

Result<std::string> Manager::Snapshot(const std::string& id, SnapshotLife life) {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  return impl_->TakeSnapshot(*s, life == SnapshotLife::kKeep);
}

Result<Json> Manager::ListSnapshots(const std::string& session_id) const {
  if (!session_id.empty() && !impl_->Find(session_id)) return Status::Error(kNotFound, "no session " + session_id);
  std::lock_guard<std::mutex> lock(impl_->snapshots_mu);
  Json list = Json::array();
  for (Json& snap : impl_->AllSnapshots()) {
    if (session_id.empty() || snap.value("session", "") == session_id) list.push_back(std::move(snap));
  }
  return Json{{"snapshots", list}};
}

Status Manager::DeleteSnapshot(const std::string& snapshot_id) {
  if (!ValidId(snapshot_id)) return Status::Error(kBadRequest, "snapshot id '" + snapshot_id + "' is malformed");
  std::lock_guard<std::mutex> lock(impl_->snapshots_mu);
  return impl_->DeleteSnapshotLocked(snapshot_id);
}

Status Manager::RotateSecret(const std::string& id, const std::string& name, const std::string& value) {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  auto policy = SessionPolicy(s->recipe);
  if (!policy.ok()) return policy.status();
  const auto& secrets = policy->credentials.secrets;
  if (std::none_of(secrets.begin(), secrets.end(), [&](const SecretSpec& spec) { return spec.name == name; })) {
    return Status::Error(kBadRequest, "session " + id + " has no credentials.secrets." + name);
  }
  if (value.empty() || value.size() > 64 * 1024) {
    return Status::Error(kBadRequest, "credentials.secrets." + name + ": a value of 1 byte to 64 KiB is needed");
  }
  for (unsigned char c : value) {
    if (c < 0x20 || c == 0x7f) {
      return Status::Error(kBadRequest, "credentials.secrets." + name +
                                            ": the value holds a control character, which no header may carry");
    }
  }
  auto locked = net::LockedBytes::Copy(value);
  if (!locked.ok()) return locked.status();
  std::lock_guard<std::mutex> lock(s->world_mu);
  s->rotated[name] = std::move(*locked);
  if (s->world && s->world->Alive()) return s->world->RotateSecret(name, value);
  return {};  // the next world starts with it
}

namespace {

// The offer a recorded one stands for ({id, grant, within_ceiling, why_not}).
Result<EscalationOffer> RecordedOffer(const Json& offer) {
  auto o = OfferFromGrant(offer.value("grant", Json::object()).dump());
  if (!o.ok()) return o.status();
  o->within_ceiling = offer.value("within_ceiling", false);
  o->why_not = offer.value("why_not", "");
  return o;
}

Json GrantJson(const EscalationOffer& g) { return Json::parse(g.grant_json); }

std::optional<supervise::ApprovalAnswer> ParseAnswer(const std::string& word) {
  if (word == "once") return supervise::ApprovalAnswer::kOnce;
  if (word == "session") return supervise::ApprovalAnswer::kSession;
  if (word == "deny") return supervise::ApprovalAnswer::kDeny;
  return std::nullopt;
}

std::string Seconds(std::chrono::milliseconds ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(ms.count()) / 1000.0);
  return std::string(buf) + " s";
}

}  // namespace

namespace {

// The network lists and memory limit a session's world has without its
// one-call grants.
struct WorldBaseline {
  std::vector<std::string> allow, deny;
  std::optional<std::uint64_t> memory;
};
Result<WorldBaseline> BaselineOf(const SessionState& s) {
  auto policy = SessionPolicy(s.recipe, s.world_grants);
  if (!policy.ok()) return policy.status();
  return WorldBaseline{policy->network.allow, policy->network.deny, policy->resources.memory_limit_bytes};
}

}  // namespace

void Manager::Impl::OpenOnceGrants(SessionState& s, World& world,
                                   const std::vector<std::pair<std::string, EscalationOffer>>& grants, Json* used) {
  std::lock_guard<std::mutex> world_lock(s.world_mu);
  auto base = BaselineOf(s);
  auto note = [&](const std::string& eid, const std::string& error) {
    for (Json& u : *used) {
      if (u.value("escalation", "") == eid && !error.empty()) {
        u["applied"] = "failed";
        u["error"] = error;
      }
    }
  };
  if (!base.ok()) {
    for (const auto& [eid, g] : grants) note(eid, base.status().ToString());
    return;
  }
  std::vector<std::string> allow = base->allow;
  std::vector<std::string> network_eids;
  for (const auto& [eid, g] : grants) {
    if (g.grant_key == "network.allow") {
      if (std::find(allow.begin(), allow.end(), g.grant_text) == allow.end()) allow.push_back(g.grant_text);
      network_eids.push_back(eid);
    }
  }
  if (!network_eids.empty()) {
    Status st = world.SetNetworkRules(allow, base->deny);
    for (const auto& eid : network_eids) note(eid, st.ok() ? "" : st.ToString());
  }
}

void Manager::Impl::CloseOnceGrants(SessionState& s, World& world,
                                    const std::vector<std::pair<std::string, EscalationOffer>>& grants) {
  if (!world.Alive()) return;  // nothing of it is left to take back
  std::lock_guard<std::mutex> world_lock(s.world_mu);
  auto base = BaselineOf(s);
  const bool network = std::any_of(grants.begin(), grants.end(),
                                   [](const auto& e) { return e.second.grant_key == "network.allow"; });
  // A grant that cannot be taken back must not outlive its call: the world goes.
  if (network && (!base.ok() || !world.SetNetworkRules(base->allow, base->deny).ok())) world.Stop(0);
}

Result<Json> Manager::Impl::GrantNow(SessionState& s, const EscalationOffer& grant, bool session_scope) {
  const std::string& key = grant.grant_key;
  const bool world_up = s.world && s.world->Alive();
  if (!session_scope) {
    // For the next call: live grants are put in force when it starts, the
    // others get a world of their own then.
    return Json{{"applied", "next_call"}};
  }
  Json recipe = s.recipe;
  if (key == "network.allow") {
    auto policy = SessionPolicy(s.recipe, {});
    if (!policy.ok()) return policy.status();
    std::vector<std::string> allow = policy->network.allow;
    if (std::find(allow.begin(), allow.end(), grant.grant_text) == allow.end()) allow.push_back(grant.grant_text);
    recipe["network_live"] = {{"allow", allow}, {"deny", policy->network.deny}};
    if (Status w = WriteFileDurably(s.dir + "/session.json", recipe.dump(2)); !w.ok()) return w;
    s.recipe = std::move(recipe);
    if (!world_up) return Json{{"applied", "next_world"}};
    if (Status live = s.world->SetNetworkRules(allow, policy->network.deny); !live.ok()) {
      s.world->Stop(0);
      return Json{{"applied", "new_world"}, {"why", "the running world did not take the rules: " + live.message()}};
    }
    return Json{{"applied", "live"}};
  }
  if (!recipe.contains("grants") || !recipe["grants"].is_array()) recipe["grants"] = Json::array();
  recipe["grants"].push_back(grant.grant_json);
  if (Status w = WriteFileDurably(s.dir + "/session.json", recipe.dump(2)); !w.ok()) return w;
  s.recipe = std::move(recipe);
  if (!world_up) return Json{{"applied", "next_world"}};
  // A path is grafted into the running world, a memory limit written to
  // its cgroup; the rest (seccomp, a path Landlock or the mount layout
  // cannot take live) needs a new world: this one is stopped, and the next
  // call's is set up with the grant.
  std::string why = WhyNewWorld(key);
  if (auto live = GrantLive(s, grant); live.ok()) {
    return Json{{"applied", "live"}};
  } else if (!live.status().message().empty()) {
    why = live.status().message();
  }
  s.world->Stop(0);
  return Json{{"applied", "new_world"}, {"why", why}};
}

Result<bool> Manager::Impl::GrantLive(SessionState& s, const EscalationOffer& grant) {
  const std::string& key = grant.grant_key;
  if (key == "resources.memory_gib") {
    if (!grant.grant_gib) return Status::Error("grant", "");
    if (Status st = s.world->SetMemoryLimit(*grant.grant_gib << 30); !st.ok()) {
      return Status::Error("grant", "the running world's cgroup did not take the limit: " + st.message());
    }
    return true;
  }
  if (key != "filesystem.read" && key != "filesystem.read_write") return Status::Error("grant", "");
  const bool writable = key == "filesystem.read_write";
  const std::string& path = grant.grant_text;
  if (!s.confined || !LandlockCovers(s.confined->plan.landlock, path, writable)) {
    return Status::Error("grant", "Landlock's rules are fixed when a world starts, and none of this world's covers " +
                                      path + " (it lies below no on_violation.max_grant tree)");
  }
  if (Status st = s.world->GraftPath(path, path, writable); !st.ok()) {
    return Status::Error("grant", "the path could not be mounted into the running world: " + st.message());
  }
  // The plan the session's calls are judged by mounts it now: a missing
  // file below it is a missing file, not a denial.
  auto confined = std::make_shared<ConfinedCommand>(*s.confined);
  confined->plan.mounts.push_back({MountKind::kBind, path, path, !writable, false, "",
                                   "granted (" + grant.grant_json + "), mounted into the running world"});
  s.confined = std::move(confined);
  return true;
}

std::shared_ptr<gateway::Gateway> Manager::Impl::GatewayOf(SessionState& s) {
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.gateway_made) return s.gateway;
  s.gateway_made = true;
  auto policy = SessionPolicy(s.recipe);
  if (!policy.ok() || policy->tools.upstream.empty()) return nullptr;
  // A secret's value: the one rotated through the API, else its source's,
  // read each time a server starts (never kept here).
  SessionState* state = &s;
  std::vector<SecretSpec> secrets = policy->credentials.secrets;
  auto value = [state, secrets](const std::string& name) -> Result<std::string> {
    {
      std::lock_guard<std::mutex> lock(state->mu);
      if (auto r = state->rotated.find(name); r != state->rotated.end()) return std::string(r->second.view());
    }
    auto spec = std::find_if(secrets.begin(), secrets.end(), [&](const SecretSpec& x) { return x.name == name; });
    if (spec == secrets.end()) return Status::Error("upstream", "no credentials.secrets." + name);
    auto store = net::SecretStore::Create({*spec});
    if (!store.ok()) return store.status();
    std::string out;
    if (Status st = (*store)->WithValue(0, [&](std::string_view v) { out.assign(v); }); !st.ok()) return st;
    return out;
  };
  s.gateway = std::make_shared<gateway::Gateway>(policy->tools.upstream, value, options.output_cap_bytes);
  return s.gateway;
}

Result<Json> Manager::Impl::CallUpstream(SessionState& s, gateway::Gateway& gw, const std::string& name,
                                         const Json& input, const std::string& call_id, std::uint64_t seq,
                                         const ParentCall* parent) {
  const auto started = Clock::now();
  auto result = gw.Call(name, input);
  if (!result.ok()) {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!call_id.empty()) {
      s.in_flight.erase(call_id);
      s.requests.erase(call_id);
    }
    (void)s.AppendLog({{"type", "event"}, {"event", "upstream_refused"}, {"seq", seq}, {"call_id", call_id},
                       {"name", name}, {"input", input}, {"why", result.status().message()}});
    return result.status();
  }
  Json r = std::move(*result);
  r["call_id"] = call_id;
  r["name"] = name;
  r["replayed"] = false;
  r["duration_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count();
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.calls;
  Json call_line = {{"type", "call"}, {"seq", seq}, {"call_id", call_id}, {"name", name}, {"input", input}};
  Json result_line = {{"type", "result"}, {"seq", seq}, {"call_id", call_id}, {"result", r}};
  if (parent) {
    call_line["parent"] = result_line["parent"] = {{"call_id", parent->call_id}, {"seq", parent->seq}};
  }
  Status logged = s.AppendLog(call_line, /*sync=*/false);  // on disk with the result's line
  if (logged.ok()) logged = s.AppendLog(result_line);
  if (!call_id.empty()) {
    s.in_flight.erase(call_id);
    if (logged.ok()) {
      s.results[call_id] = r;
    } else {
      s.requests.erase(call_id);
    }
  }
  if (!logged.ok()) return logged;
  return r;
}

Result<Json> Manager::CodeMode(const std::string& id) {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  Json languages = Json::array(), absent = Json::array();
  for (const auto& r : CodeRuntimes()) {
    if (r.path.empty()) {
      absent.push_back({{"language", r.language}, {"why", r.why_absent}});
    } else {
      languages.push_back({{"language", r.language}, {"interpreter", r.path}});
    }
  }
  return Json{{"languages", languages}, {"absent", absent}, {"bindings", impl_->CodeBindings(*s)}};
}

Result<Json> Manager::ListUpstreamTools(const std::string& id) {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  auto gw = impl_->GatewayOf(*s);
  if (!gw) return Json{{"tools", Json::array()}, {"errors", Json::array()}};
  return gw->Tools();
}

Result<Json> Manager::RequestEscalation(const std::string& id, const EscalationAsk& ask) {
  Impl& m = *impl_;
  auto s = m.Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  if (ask.offer_id.empty()) return Status::Error(kBadRequest, "offer_id is needed (an escalation offer's id, esc-...)");
  if (ask.reason.size() > 4096) return Status::Error(kBadRequest, "reason: at most 4096 bytes");
  std::unique_lock<std::mutex> lock(s->mu);
  if (!ask.request_id.empty()) {
    if (auto it = s->request_ids.find(ask.request_id); it != s->request_ids.end()) {
      Json& recorded = s->escalations[it->second];
      if (recorded.value("offer_id", "") != ask.offer_id) {
        return Status::Error(kConflict, "request_id " + ask.request_id + " was recorded for offer " +
                                            recorded.value("offer_id", ""));
      }
      // Never a new decision: the recorded one (waiting for it while pending).
      const std::size_t index = it->second;
      s->escalation_cv.wait(lock, [&] { return s->escalations[index].value("state", "") != "pending"; });
      Json replay = s->escalations[index];
      replay["replayed"] = true;
      return replay;
    }
  }
  auto offer_it = s->offers.find(ask.offer_id);
  if (offer_it == s->offers.end()) {
    return Status::Error(kNotFound, "session " + id + " has no escalation offer " + ask.offer_id +
                                        ": offers come with the denials in the session's results");
  }
  auto offer = RecordedOffer(offer_it->second["offer"]);
  if (!offer.ok()) return offer.status();
  const Json denial = offer_it->second.value("denial", Json::object());
  // One question per offer at a time: a second request shares the first's decision.
  for (std::size_t i = 0; i < s->escalations.size(); ++i) {
    if (s->escalations[i].value("offer_id", "") == ask.offer_id && s->escalations[i].value("state", "") == "pending") {
      if (!ask.request_id.empty()) s->request_ids[ask.request_id] = i;
      s->escalation_cv.wait(lock, [&] { return s->escalations[i].value("state", "") != "pending"; });
      Json shared = s->escalations[i];
      shared["replayed"] = false;
      shared["shared"] = true;
      return shared;
    }
  }
  const std::size_t index = s->escalations.size();
  Json record = {{"id", "eg-" + std::to_string(index + 1)},
                 {"session", id},
                 {"offer_id", ask.offer_id},
                 {"grant", GrantJson(*offer)},
                 {"denial", denial},
                 {"reason", ask.reason},
                 {"by", ask.by.empty() ? "api" : ask.by},
                 {"request_id", ask.request_id},
                 {"state", "pending"},
                 {"asked", false},
                 {"created", NowRfc3339()}};
  const bool beyond = !offer->within_ceiling;
  if (!beyond) {
    record["asked"] = true;
    record["approver"] = !m.options.approve_command.empty() ? "approve-command"
                         : m.options.approve_api        ? "api"
                                                        : "none";
  }
  s->escalations.push_back(record);
  if (!ask.request_id.empty()) s->request_ids[ask.request_id] = index;
  if (Status st = s->AppendLog({{"type", "event"}, {"event", "escalation_requested"}, {"escalation", record}});
      !st.ok()) {
    s->escalations.pop_back();
    if (!ask.request_id.empty()) s->request_ids.erase(ask.request_id);
    return st;
  }
  lock.unlock();
  m.PublishEscalation(record);

  // The decision: the ceiling first (nobody is asked beyond it), then the approver.
  supervise::ApprovalDecision decision;
  if (beyond) {
    decision.answer = supervise::ApprovalAnswer::kDeny;
    decision.by = "ceiling";
    decision.reason = "beyond on_violation.max_grant, so nobody was asked: " + offer->why_not;
  } else if (!m.options.approve_command.empty()) {
    supervise::ApprovalRequest request{id, ask.offer_id, denial.value("call_id", ""),
                                       ask.reason.empty() ? denial.value("reason", "") : ask.reason, GrantJson(*offer)};
    decision = supervise::DecideByCommand(m.options.approve_command, request, m.options.approve_timeout);
  } else if (m.options.approve_api) {
    lock.lock();
    const bool decided = s->escalation_cv.wait_for(lock, m.options.approve_timeout, [&] {
      return s->escalations[index].value("state", "") != "pending" || s->escalations[index].contains("api_decision");
    });
    Json& r = s->escalations[index];
    if (decided && r.contains("api_decision")) {
      decision.answer = *ParseAnswer(r["api_decision"].value("decision", "deny"));
      decision.by = r["api_decision"].value("by", "api");
      decision.reason = r["api_decision"].value("reason", "");
      r.erase("api_decision");
    } else {
      decision.answer = supervise::ApprovalAnswer::kDeny;
      decision.by = "timeout";
      decision.reason = "no decision came through the API within " + Seconds(m.options.approve_timeout);
    }
    lock.unlock();
  } else {
    decision = supervise::NoApprover();
  }

  // Applied before the answer; the record says how.
  Json applied;
  if (decision.answer != supervise::ApprovalAnswer::kDeny) {
    std::lock_guard<std::mutex> world_lock(s->world_mu);
    auto now = m.GrantNow(*s, *offer, decision.answer == supervise::ApprovalAnswer::kSession);
    if (!now.ok()) {
      decision.answer = supervise::ApprovalAnswer::kDeny;
      decision.reason = "approved, but the grant could not be applied: " + now.status().ToString();
    } else {
      applied = *now;
    }
  }
  lock.lock();
  Json& r = s->escalations[index];
  r["state"] = decision.answer == supervise::ApprovalAnswer::kDeny ? "denied" : "granted";
  r["decision"] = supervise::AnswerName(decision.answer);
  r["decided_by"] = decision.by.empty() ? "none" : decision.by;
  r["decision_reason"] = decision.reason;
  r["decided"] = NowRfc3339();
  if (!applied.is_null()) {
    r["applied"] = applied.value("applied", "");
    if (applied.contains("why")) r["applied_why"] = applied["why"];
  }
  if (decision.answer == supervise::ApprovalAnswer::kOnce) s->once_pending.push_back(r.value("id", ""));
  (void)s->AppendLog({{"type", "event"}, {"event", "escalation_decided"}, {"escalation", r}});
  if (decision.answer != supervise::ApprovalAnswer::kDeny) {
    (void)s->AppendLog({{"type", "event"}, {"event", "grant_applied"}, {"escalation", r.value("id", "")},
                        {"grant", r["grant"]}, {"scope", r["decision"]}, {"applied", r.value("applied", "")}});
  }
  Json answer = r;
  lock.unlock();
  s->escalation_cv.notify_all();
  m.PublishEscalation(answer);
  answer["replayed"] = false;
  return answer;
}

Result<Json> Manager::DecideEscalation(const std::string& id, const std::string& escalation_id,
                                       const std::string& decision, const std::string& by, const std::string& reason) {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  if (!ParseAnswer(decision)) {
    return Status::Error(kBadRequest, "decision '" + decision + "' is not one of once, session, deny");
  }
  if (!impl_->options.approve_api) {
    return Status::Error(kConflict, "this agentbox takes decisions from " +
                                        std::string(impl_->options.approve_command.empty()
                                                        ? "no one (no approver is configured)"
                                                        : "its --approve-command") +
                                        ", not from the API (start it with --approve-api)");
  }
  std::unique_lock<std::mutex> lock(s->mu);
  auto it = std::find_if(s->escalations.begin(), s->escalations.end(),
                         [&](const Json& e) { return e.value("id", "") == escalation_id; });
  if (it == s->escalations.end()) return Status::Error(kNotFound, "session " + id + " has no escalation " + escalation_id);
  if (it->value("state", "") != "pending" || it->contains("api_decision")) {
    return Status::Error(kConflict, "escalation " + escalation_id + " is already decided: " +
                                        it->value("decision", it->contains("api_decision") ? "being applied" : "?"));
  }
  if (!it->value("asked", false)) return Status::Error(kConflict, "escalation " + escalation_id + " is not asked");
  (*it)["api_decision"] = {{"decision", decision}, {"by", by.empty() ? "api" : "api: " + by}, {"reason", reason}};
  const std::size_t index = static_cast<std::size_t>(it - s->escalations.begin());
  lock.unlock();
  s->escalation_cv.notify_all();
  // The requester applies it; the answer is the record once decided.
  lock.lock();
  s->escalation_cv.wait_for(lock, std::chrono::seconds(30),
                            [&] { return s->escalations[index].value("state", "") != "pending"; });
  return s->escalations[index];
}

Result<Json> Manager::ListEscalations(const std::string& id) const {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  std::lock_guard<std::mutex> lock(s->mu);
  Json list = Json::array();
  for (Json e : s->escalations) {
    e.erase("api_decision");
    list.push_back(std::move(e));
  }
  return Json{{"escalations", list}};
}

Json Manager::EscalationChanges(std::uint64_t after, int wait_ms) const {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.changes_mu);
  m.changes_cv.wait_for(lock, std::chrono::milliseconds(std::max(wait_ms, 0)),
                        [&] { return m.change_seq > after || m.shutting_down.load(); });
  Json list = Json::array();
  for (const auto& [seq, record] : m.changes) {
    if (seq > after) list.push_back({{"seq", seq}, {"escalation", record}});
  }
  return Json{{"escalations", list}, {"next", m.change_seq}};
}

Result<Json> Manager::PatchPolicy(const std::string& id, const std::string& yaml, const std::string& by) {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  YAML::Node doc;
  try {
    doc = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return Status::Error(kBadRequest, "policy: " + std::string(e.what()));
  }
  if (!doc.IsMap()) return Status::Error(kBadRequest, "policy: a partial policy (a YAML mapping) is needed");
  const std::string can = "(network.allow, network.deny, filesystem.read_only, filesystem.read_write and "
                          "resources.memory_gib can)";
  auto list_of = [](const YAML::Node& node, const std::string& name) -> Result<std::vector<std::string>> {
    if (!node.IsSequence()) return Status::Error(kBadRequest, "policy: " + name + " must be a list");
    std::vector<std::string> list;
    for (const auto& item : node) {
      if (!item.IsScalar()) return Status::Error(kBadRequest, "policy: " + name + " holds a non-string entry");
      list.push_back(item.as<std::string>());
    }
    return list;
  };
  std::optional<std::vector<std::string>> allow, deny;
  std::vector<std::pair<std::string, std::string>> mounts;  // grant key, path
  std::optional<std::uint64_t> memory_gib;
  for (const auto& top : doc) {
    const std::string key = top.first.as<std::string>();
    if ((key != "network" && key != "filesystem" && key != "resources") || !top.second.IsMap()) {
      return Status::Error(kBadRequest, "policy: " + key + " cannot change in a running session " + can);
    }
    for (const auto& entry : top.second) {
      const std::string sub = entry.first.as<std::string>();
      const std::string name = key + "." + sub;
      if (name == "network.allow" || name == "network.deny") {
        auto list = list_of(entry.second, name);
        if (!list.ok()) return list.status();
        (sub == "allow" ? allow : deny) = std::move(*list);
      } else if (name == "filesystem.read_only" || name == "filesystem.read_write") {
        auto list = list_of(entry.second, name);
        if (!list.ok()) return list.status();
        for (std::string& path : *list) {
          path = paths::ExpandHome(path, linux::HomeDir());
          if (path.empty() || path[0] != '/') {
            return Status::Error(kBadRequest, "policy: " + name + " entries must be absolute or ~/...");
          }
          mounts.emplace_back(sub == "read_only" ? "filesystem.read" : "filesystem.read_write", path);
        }
      } else if (name == "resources.memory_gib") {
        if (!entry.second.IsScalar()) return Status::Error(kBadRequest, "policy: resources.memory_gib must be a number");
        try {
          memory_gib = entry.second.as<std::uint64_t>();
        } catch (const YAML::Exception&) {
          return Status::Error(kBadRequest, "policy: resources.memory_gib must be a whole number of GiB");
        }
      } else {
        return Status::Error(kBadRequest, "policy: " + name + " cannot change in a running session " + can);
      }
    }
  }
  if (!allow && !deny && mounts.empty() && !memory_gib) {
    return Status::Error(kBadRequest, "policy: nothing to change " + can);
  }

  std::lock_guard<std::mutex> lock(s->world_mu);
  auto policy = SessionPolicy(s->recipe);
  if (!policy.ok()) return policy.status();
  // A widening is held against the policy's ceiling as an escalation offer
  // for the same target is (on_violation.max_grant).
  Result<ConfinedCommand> planned = Status::Error("session", "");
  const Plan* plan = nullptr;
  if (s->confined) {
    plan = &s->confined->plan;
  } else {
    planned = impl_->PlanFor(*s, *policy, RandomId(""));
    if (!planned.ok()) return planned.status();
    plan = &planned->plan;
  }
  auto within = [&](Denial d, const std::string& what) -> Result<EscalationOffer> {
    const PathExists exists = [](const std::string& p) {
      struct stat st {};
      return lstat(p.c_str(), &st) == 0;
    };
    if (!plan->escalation.offers) {
      return Status::Error(kBadRequest, "policy: " + what + ": widening a running session needs "
                                        "on_violation.escalation: one_time_approval and its max_grant");
    }
    std::optional<EscalationOffer> offer = OfferFor(d, *plan, exists);
    if (!offer) return Status::Error(kBadRequest, "policy: " + what + ": no grant can give that");
    if (!offer->within_ceiling) return Status::Error(kBadRequest, "policy: " + what + ": " + offer->why_not);
    return *offer;
  };
  const std::vector<std::string> old_allow = policy->network.allow, old_deny = policy->network.deny;
  const std::vector<std::string> new_allow = allow.value_or(old_allow), new_deny = deny.value_or(old_deny);
  auto has = [](const std::vector<std::string>& v, const std::string& e) {
    return std::find(v.begin(), v.end(), e) != v.end();
  };
  for (const auto& e : new_allow) {
    if (has(old_allow, e)) continue;
    auto ok = within(Denial{"network", "connect", e, "not-allowed", "patch", 0, std::nullopt},
                     "network.allow gains \"" + e + "\"");
    if (!ok.ok()) {
      return Status::Error(kBadRequest, ok.status().message() +
                                            " (a widening takes exact host:port entries within "
                                            "on_violation.max_grant.network)");
    }
  }
  for (const auto& e : old_deny) {
    if (!has(new_deny, e)) {
      return Status::Error(kBadRequest, "policy: network.deny loses \"" + e + "\": no grant lifts a deny entry");
    }
  }
  std::vector<EscalationOffer> grants;
  for (const auto& [key, path] : mounts) {
    const bool write = key == "filesystem.read_write";
    auto ok = within(Denial{"filesystem", write ? "write" : "read", path, "patch", "patch", 0, std::nullopt},
                     (write ? "filesystem.read_write gains \"" : "filesystem.read_only gains \"") + path + "\"");
    if (!ok.ok()) return ok.status();
    if (ok->grant_text != path) {
      return Status::Error(kBadRequest, "policy: " + path + " does not exist (a grant mounts what is there)");
    }
    grants.push_back(*ok);
  }
  if (memory_gib) {
    const std::uint64_t gib = *memory_gib;
    const auto& cap = plan->escalation.memory_max_bytes;
    if (!plan->escalation.offers || !cap || gib * (1ULL << 30) > *cap) {
      return Status::Error(kBadRequest, "policy: resources.memory_gib " + std::to_string(gib) +
                                            " is beyond on_violation.max_grant.memory_gib");
    }
    if (!policy->resources.memory_limit_bytes || gib * (1ULL << 30) <= *policy->resources.memory_limit_bytes) {
      return Status::Error(kBadRequest, "policy: resources.memory_gib " + std::to_string(gib) +
                                            " does not raise the session's limit (lowering it is not available "
                                            "in a running session)");
    }
    grants.push_back(MakeOffer("resources.memory_gib", "", gib));
  }
  auto rules = net::RuleSet::Build(new_allow, new_deny, policy->network.default_action);
  if (!rules.ok()) return Status::Error(kBadRequest, "policy: " + rules.status().message());

  Json applied_each = Json::array();
  std::string applied = "next_world";
  if (allow || deny) {
    Json recipe = s->recipe;
    recipe["network_live"] = {{"allow", new_allow}, {"deny", new_deny}};
    if (Status w = WriteFileDurably(s->dir + "/session.json", recipe.dump(2)); !w.ok()) return w;
    s->recipe = std::move(recipe);
    // In force in the running world before the answer; a world that cannot
    // take the change is stopped (the next call starts one with it).
    if (s->world && s->world->Alive()) {
      Status live = s->world->SetNetworkRules(new_allow, new_deny);
      if (live.ok()) {
        applied = "live";
      } else {
        s->world->Stop(0);
        applied = "world_stopped";
      }
    }
    applied_each.push_back({{"network", {{"allow", new_allow}, {"deny", new_deny}}}, {"applied", applied}});
  }
  for (const EscalationOffer& g : grants) {
    auto now = impl_->GrantNow(*s, g, /*session_scope=*/true);
    if (!now.ok()) return now.status();
    Json one = *now;
    one["grant"] = Json::parse(g.grant_json);
    applied_each.push_back(one);
    applied = one.value("applied", "");
  }
  Json change = {{"type", "event"}, {"event", "policy_changed"}, {"by", by.empty() ? "api" : by},
                 {"network", {{"allow", new_allow}, {"deny", new_deny}}},
                 {"previous", {{"network", {{"allow", old_allow}, {"deny", old_deny}}}}}, {"applied", applied},
                 {"changes", applied_each}};
  {
    std::lock_guard<std::mutex> log_lock(s->mu);
    if (Status st = s->AppendLog(change); !st.ok()) return st;
  }
  return Json{{"network", {{"allow", new_allow}, {"deny", new_deny}}}, {"applied", applied}, {"changes", applied_each}};
}

namespace {

// What the diff and apply of a session leave out: its policy's diff.exclude
// (and, unless `all`, the workspace's ignore files).
Result<DiffOptions> SessionDiffOptions(const SessionState& s, bool all) {
  auto policy = SessionPolicy(s.recipe);
  if (!policy.ok()) return policy.status();
  DiffOptions options;
  options.max_patch_bytes = kMaxPatchBytes;
  options.all = all;
  if (!all) options.exclude = policy->diff.exclude;
  return options;
}

// The session's layers, ready to read: its image mounted, an upper layer
// that was never made made (overlay), nullopt for a copy never made.
Result<std::optional<LayerStack>> ReadableLayers(SessionState& s, std::shared_ptr<const UniqueFd>* hold) {
  if (s.ws_mode == "remote") {
    return Status::Error(kBadRequest, "session " + s.id + " works on a remote's workspace (sandbox.isolation: "
                                      "remote): its diff and apply are not in this version");
  }
  if (s.ws_mode == "direct") {
    return Status::Error(kBadRequest, "session " + s.id + " works on its workspace directly (fresh_per_task: "
                                      "false): its changes are already in " + s.workspace);
  }
  if (s.upper_kind == "image" && s.ws_mode == "overlay") {
    if (Status m = s.EnsureImage(); !m.ok()) return m;
  }
  LayerStack stack = s.Layers(hold);
  struct stat st {};
  if (stat(stack.upper.c_str(), &st) != 0) {
    if (stack.copy_mode) return std::optional<LayerStack>();
    mkdir(stack.upper.c_str(), 0700);
  }
  return std::optional<LayerStack>(std::move(stack));
}

}  // namespace

Result<Json> Manager::Diff(const std::string& id, bool all) {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  auto options = SessionDiffOptions(*s, all);
  if (!options.ok()) return options.status();
  if (s->ws_mode == "remote") {
    return RemoteLayersOf(*s, impl_->exe,
                          {{"op", "diff"}, {"all", options->all}, {"exclude", options->exclude},
                           {"max_patch_bytes", options->max_patch_bytes}});
  }
  std::shared_ptr<const UniqueFd> hold;
  auto stack = ReadableLayers(*s, &hold);
  if (!stack.ok()) return stack.status();
  if (!*stack) return Json{{"files", Json::array()}, {"patch", ""}, {"truncated", false}, {"files_truncated", false}};
  try {
    return ComputeDiff(**stack, *options);
  } catch (const std::exception& e) {
    return Status::Error("session", "diff of session " + id + " failed: " + e.what());
  }
}

Result<Json> Manager::Apply(const std::string& id, bool all) {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  auto diff_options = SessionDiffOptions(*s, all);
  if (!diff_options.ok()) return diff_options.status();
  auto policy = SessionPolicy(s->recipe);
  if (!policy.ok()) return policy.status();
  ApplyOptions options;
  options.diff = *diff_options;
  options.base_record = s->dir + "/" + kBaseRecordName;
  // filesystem.protect, relative to the workspace (absolute entries name it
  // by its host path or by the path the sandbox sees it at).
  for (const std::string& entry : policy->filesystem.protect) {
    std::string rel = entry;
    for (const std::string& root : {s->workspace, policy->filesystem.workspace.path}) {
      if (!root.empty() && !entry.empty() && entry[0] == '/' && paths::IsWithin(entry, root)) {
        rel = entry.size() > root.size() ? entry.substr(root.size() + 1) : "";
        break;
      }
    }
    while (rel.rfind("./", 0) == 0) rel.erase(0, 2);
    while (!rel.empty() && rel.back() == '/') rel.pop_back();
    if (rel.empty() || rel[0] == '/') continue;  // outside the workspace: apply never writes there
    options.protect.push_back(rel);
  }
  if (s->ws_mode == "remote") {
    auto result = RemoteLayersOf(*s, impl_->exe,
                                 {{"op", "apply"}, {"all", options.diff.all}, {"exclude", options.diff.exclude},
                                  {"protect", options.protect}});
    if (!result.ok()) return result.status();
    std::lock_guard<std::mutex> log_lock(s->mu);
    (void)s->AppendLog({{"type", "event"}, {"event", "applied"}, {"applied", (*result)["applied"]},
                        {"conflicts", (*result)["conflicts"]}, {"protected", (*result)["protected"]},
                        {"on_remote", true}});
    return result;
  }
  std::shared_ptr<const UniqueFd> hold;
  auto stack = ReadableLayers(*s, &hold);
  if (!stack.ok()) return stack.status();
  if (!*stack) {
    return Json{{"applied", Json::array()}, {"files", Json::array()}, {"conflicts", Json::array()},
                {"protected", Json::array()}};
  }
  // One apply at a time: two would race on the same base and record.
  static std::mutex apply_mu;
  std::lock_guard<std::mutex> lock(apply_mu);
  auto result = ApplyChanges(**stack, options);
  if (!result.ok()) return result.status();
  std::lock_guard<std::mutex> log_lock(s->mu);
  (void)s->AppendLog({{"type", "event"}, {"event", "applied"}, {"applied", (*result)["applied"]},
                      {"conflicts", (*result)["conflicts"]}, {"protected", (*result)["protected"]}});
  return result;
}

Result<std::string> Manager::LogPath(const std::string& id) const {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  return s->dir + "/log.jsonl";
}

Status Manager::Remove(const std::string& id) {
  Impl& m = *impl_;
  auto s = m.Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  {
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->removing) return Status::Error(kConflict, "session " + id + " is being removed");
    s->removing = true;
  }
  if (s->recipe.value("snapshot_on_exit", false)) {
    auto snap = m.TakeSnapshot(*s, /*keep=*/true);
    if (!snap.ok()) {
      // Kept, and usable: the caller may fix what broke the snapshot and remove it again.
      std::lock_guard<std::mutex> lock(s->mu);
      s->removing = false;
      return Status::Error(kConflict, "snapshot_on_exit: " + snap.status().message() + " (session " + id +
                                          " kept; fix the cause and remove it again)");
    }
  }
  s->EndServicesAndPorts();
  {
    std::map<std::string, std::shared_ptr<Terminal>> terminals;
    {
      std::lock_guard<std::mutex> lock(s->mu);
      terminals.swap(s->terminals);
    }
    terminals.clear();  // each is killed and its reader joined
  }
  {
    std::lock_guard<std::mutex> wl(s->world_mu);
    if (s->world) s->world->Stop(0);
    s->world.reset();
    if (!s->claim && !s->claim_left.empty()) {
      // One agentbox stopped holding: found again to be deleted.
      auto policy = SessionPolicy(s->recipe);
      Status r = policy.ok() && policy->sandbox.remote && policy->sandbox.remote->kubernetes
                     ? ResumeClaim(*s, *policy->sandbox.remote->kubernetes)
                     : policy.status();
      if (!r.ok()) std::fprintf(stderr, "agentbox: session %s: %s\n", id.c_str(), r.ToString().c_str());
    }
    if (s->claim) {
      if (Status r = s->claim->Release(); !r.ok()) {
        std::fprintf(stderr, "agentbox: session %s: %s\n", id.c_str(), r.ToString().c_str());
      }
      s->claim.reset();
    }
  }
  if (s->ws_mode == "remote") {
    // The remote's copy of the workspace goes with the session. A remote
    // that cannot be reached keeps it; the daemon says so on its stderr.
    if (auto policy = SessionPolicy(s->recipe); policy.ok() && policy->sandbox.remote &&
                                                !policy->sandbox.remote->ssh.empty() &&
                                                policy->sandbox.fresh_per_task) {
      if (Status f = ForgetRemoteSession(RemotePlanFor(*policy, s->id, s->workspace, m.exe)); !f.ok()) {
        std::fprintf(stderr, "agentbox: session %s: %s\n", id.c_str(), f.ToString().c_str());
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->upper_fs.reset();  // the tmpfs goes with the last holder (a Diff may still read it)
  }
  if (Status u = UnmountUpperImage(s->ImageMount()); !u.ok()) {
    std::lock_guard<std::mutex> lock(s->mu);
    s->removing = false;
    return u;
  }
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.sessions.erase(id);
  }
  s->log.Close();
  RemoveTree(s->dir);
  m.RemoveSnapshotsOf(id);
  return {};
}

void Manager::Shutdown(int grace_ms) {
  Impl& m = *impl_;
  m.shutting_down = true;
  {
    std::lock_guard<std::mutex> lock(m.reaper_mu);
    m.reaper_stop = true;
  }
  m.reaper_cv.notify_all();
  if (m.idle_reaper.joinable()) m.idle_reaper.join();
  std::vector<std::shared_ptr<SessionState>> all;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    for (auto& [id, s] : m.sessions) all.push_back(s);
  }
  std::vector<std::thread> stoppers;
  for (auto& s : all) {
    stoppers.emplace_back([s, grace_ms] {
      {
        std::map<std::string, std::shared_ptr<Terminal>> terminals;
        {
          std::lock_guard<std::mutex> lock(s->mu);
          terminals.swap(s->terminals);
        }
      }
      s->EndServicesAndPorts();
      std::lock_guard<std::mutex> wl(s->world_mu);
      if (s->world) s->world->Stop(grace_ms);
      SpillUpperLayer(*s);
      // An image stays on disk; its mount goes with this process's service.
      if (s->upper_kind == "image") (void)UnmountUpperImage(s->ImageMount());
    });
  }
  for (auto& t : stoppers) t.join();
}

// Terminals ------------------------------------------------------------------

namespace {

constexpr std::size_t kMaxTerminals = 16;

// A terminal request's input: {command?, argv?, cwd?, cols?, rows?, term?}.
Result<WorldTerminalSpec> TerminalSpec(const Json& input, const Plan& plan) {
  if (!input.is_object()) return Status::Error(kBadRequest, "a terminal's request must be a JSON object");
  WorldTerminalSpec spec;
  spec.term = "xterm-256color";
  for (auto it = input.begin(); it != input.end(); ++it) {
    const std::string& key = it.key();
    const Json& v = it.value();
    if (key == "command") {
      if (!v.is_string() || v.get<std::string>().empty()) return Status::Error(kBadRequest, "command: a non-empty string");
      spec.argv = {"bash", "-c", v.get<std::string>()};
    } else if (key == "argv") {
      if (!v.is_array() || v.empty()) return Status::Error(kBadRequest, "argv: a non-empty array of strings");
      for (const auto& a : v) {
        if (!a.is_string()) return Status::Error(kBadRequest, "argv: a non-empty array of strings");
        spec.argv.push_back(a.get<std::string>());
      }
    } else if (key == "cwd") {
      if (!v.is_string()) return Status::Error(kBadRequest, "cwd: a string, relative to the workspace");
      const std::string cwd = v.get<std::string>();
      if (!cwd.empty() && cwd[0] == '/') return Status::Error(kBadRequest, "cwd: '" + cwd + "' is not relative to the workspace");
      for (size_t start = 0; start <= cwd.size();) {
        size_t slash = cwd.find('/', start);
        if (slash == std::string::npos) slash = cwd.size();
        if (cwd.compare(start, slash - start, "..") == 0 && slash - start == 2) {
          return Status::Error(kBadRequest, "cwd: '" + cwd + "' leaves the workspace");
        }
        start = slash + 1;
      }
      spec.cwd = cwd.empty() ? plan.cwd : plan.workspace_target + "/" + cwd;
    } else if (key == "cols" || key == "rows") {
      if (!v.is_number_integer() || v.get<long>() < 1 || v.get<long>() > 1000) {
        return Status::Error(kBadRequest, key + ": an integer from 1 to 1000");
      }
      (key == "cols" ? spec.cols : spec.rows) = v.get<int>();
    } else if (key == "term") {
      if (!v.is_string() || v.get<std::string>().empty() ||
          v.get<std::string>().find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-+._") !=
              std::string::npos) {
        return Status::Error(kBadRequest, "term: a terminal type such as xterm-256color");
      }
      spec.term = v.get<std::string>();
    } else {
      return Status::Error(kBadRequest, "unknown field '" + key +
                                            "' in a terminal's request (command, argv, cwd, cols, rows, term)");
    }
  }
  if (input.contains("command") && input.contains("argv")) {
    return Status::Error(kBadRequest, "command and argv: give one of them");
  }
  if (spec.argv.empty()) spec.argv = {"bash"};
  if (spec.cwd.empty()) spec.cwd = plan.cwd;
  return spec;
}

}  // namespace

Result<Json> Manager::OpenTerminal(const std::string& id, const Json& input) {
  Impl& m = *impl_;
  auto s = m.Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  if (m.shutting_down) return Status::Error(kConflict, "agentbox is shutting down");
  {
    std::lock_guard<std::mutex> lock(s->mu);
    if (s->removing) return Status::Error(kConflict, "session " + id + " is being removed");
    std::size_t running = 0;
    for (const auto& [tid, t] : s->terminals) running += t->Running() ? 1 : 0;
    if (running >= kMaxTerminals) {
      return Status::Error(kBusy, "session " + id + " has " + std::to_string(kMaxTerminals) +
                                      " running terminals, the most it may have");
    }
  }
  auto live = m.EnsureWorld(*s);
  if (!live.ok()) return live.status();
  if (live->confined->plan.microvm) {
    return Status::Error(kBadRequest, "session " + id + "'s sandbox is a microVM: terminals (a pty of the guest's "
                                      "on this host) are not available on it in this version; bash calls are");
  }
  if (live->confined->plan.gvisor) {
    return Status::Error(kBadRequest, "session " + id + "'s sandbox is a gVisor sandbox: terminals (a pty of the "
                                      "Sentry's on this host) are not available on it in this version; bash calls are");
  }
  auto spec = TerminalSpec(input, live->confined->plan);
  if (!spec.ok()) return spec.status();
  std::string tid;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    tid = "t" + std::to_string(s->next_terminal++);
  }
  auto terminal = Terminal::Open(live->world, tid, *spec);
  if (!terminal.ok()) return terminal.status();
  Json d = (*terminal)->Describe();
  std::lock_guard<std::mutex> lock(s->mu);
  s->terminals[tid] = *terminal;
  (void)s->AppendLog({{"type", "event"}, {"event", "terminal_opened"}, {"terminal", tid}, {"command", spec->argv}},
                     false);
  return d;
}

Result<std::shared_ptr<Terminal>> Manager::FindTerminal(const std::string& id, const std::string& terminal) const {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  std::lock_guard<std::mutex> lock(s->mu);
  auto it = s->terminals.find(terminal);
  if (it == s->terminals.end()) return Status::Error(kNotFound, "session " + id + " has no terminal " + terminal);
  return it->second;
}

Result<Json> Manager::ListTerminals(const std::string& id) const {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  std::lock_guard<std::mutex> lock(s->mu);
  Json list = Json::array();
  for (const auto& [tid, t] : s->terminals) list.push_back(t->Describe());
  return list;
}

Status Manager::CloseTerminal(const std::string& id, const std::string& terminal) {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  std::shared_ptr<Terminal> t;
  {
    std::lock_guard<std::mutex> lock(s->mu);
    auto it = s->terminals.find(terminal);
    if (it == s->terminals.end()) return Status::Error(kNotFound, "session " + id + " has no terminal " + terminal);
    t = std::move(it->second);
    s->terminals.erase(it);
    (void)s->AppendLog({{"type", "event"}, {"event", "terminal_closed"}, {"terminal", terminal}}, false);
  }
  t->Kill();
  return {};
}

// --- Services, ports, the background log ------------------------------------

Result<std::string> Manager::BackgroundLogPath(const std::string& id) const {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  return s->dir + "/background.log";
}

Result<Json> Manager::StartService(const std::string& id, const ServiceSpec& spec) {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  return s->services->Start(spec);
}

Result<Json> Manager::ServiceStatus(const std::string& id, const std::string& name) const {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  if (name.empty()) return Json{{"services", s->services->List()}};
  return s->services->Get(name);
}

Result<Json> Manager::RestartService(const std::string& id, const std::string& name) {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  return s->services->Restart(name);
}

Result<Json> Manager::StopService(const std::string& id, const std::string& name, bool forget) {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  return s->services->Stop(name, forget);
}

Result<std::string> Manager::ServiceLogPath(const std::string& id, const std::string& name) const {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  return s->services->LogPath(name);
}

bool Manager::ServiceRunning(const std::string& id, const std::string& name) const {
  auto s = impl_->Find(id);
  return s && s->services->Running(name);
}

Result<Json> Manager::ExposePort(const std::string& id, int port, bool* created) {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  if (port < 1 || port > 65535) return Status::Error(kBadRequest, "port " + std::to_string(port) + " is not 1 to 65535");
  auto w = impl_->ServiceWorldFor(*s);
  if (!w.ok()) return w.status();
  if (s->confined->plan.microvm) {
    return Status::Error(kBadRequest, "session " + id + "'s sandbox is a microVM, which has no network device: a "
                                      "port inside it cannot be exposed on the host in this version");
  }
  if (s->confined->plan.gvisor) {
    return Status::Error(kBadRequest, "session " + id + "'s sandbox is a gVisor sandbox with no network of its own "
                                      "(egress goes through its stream): a port inside it cannot be exposed on the "
                                      "host in this version");
  }
  if (std::find(s->confined->plan.namespaces.begin(), s->confined->plan.namespaces.end(), "net") ==
      s->confined->plan.namespaces.end()) {
    return Status::Error(kBadRequest, "session " + id + "'s sandbox has no network namespace of its own: its "
                                      "port " + std::to_string(port) + " is the host's already");
  }
  std::lock_guard<std::mutex> lock(s->ports_mu);
  s->PrunePorts(w->world.get());
  *created = false;
  if (auto it = s->ports.find(port); it != s->ports.end()) return PortJson(*it->second);
  auto bridge = PortBridge::Start(w->world, port);
  if (!bridge.ok()) return bridge.status();
  Json j = PortJson(**bridge);
  s->ports[port] = std::move(*bridge);
  *created = true;
  return j;
}

Status Manager::UnexposePort(const std::string& id, int port) {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  std::lock_guard<std::mutex> lock(s->ports_mu);
  auto it = s->ports.find(port);
  if (it == s->ports.end() || !it->second->active()) {
    if (it != s->ports.end()) s->ports.erase(it);
    return Status::Error(kNotFound, "session " + id + " exposes no port " + std::to_string(port));
  }
  it->second->Stop();
  s->ports.erase(it);
  return {};
}

Result<Json> Manager::Ports(const std::string& id) const {
  auto s = impl_->Find(id);
  if (!s) return Status::Error(kNotFound, "no session " + id);
  Json out = Json::array();
  std::lock_guard<std::mutex> lock(s->ports_mu);
  for (const auto& [port, bridge] : s->ports) {
    if (bridge->active()) out.push_back(PortJson(*bridge));
  }
  return Json{{"ports", out}};
}

}  // namespace agentbox::session
