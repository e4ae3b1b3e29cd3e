// The plan: what the Linux backend will do, as data.
//
// Built by Confine() from a Policy and HostCaps with no syscalls, printed by
// `agentbox policy explain`, serialised into the argv/env of `agentbox wrap`,
// and applied in one place (the runner). Paths called `source` are host
// paths; `target` and the `inner_*` paths are paths inside the sandbox.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agentbox/status.h"

namespace agentbox {

enum class MountKind {
  kTmpfs,       // a fresh tmpfs at target (`data` holds its options)
  kBind,        // bind `source` (recursively) at target
  kProc,        // a new procfs for the sandbox's pid namespace
  kDevpts,      // a new devpts instance
  kDevice,      // bind one host device node
  kSymlink,     // a symlink at target pointing to `source`
  kMask,        // hide target (a file or directory inside a mounted tree)
  kProtect,     // bind target onto itself read-only (inside a writable tree)
  kPin,         // bind target onto itself unchanged, so it cannot be renamed away
  kReadOnly,    // make an existing mount at target read-only (e.g. /proc/sys)
};
const char* ToString(MountKind);

struct MountOp {
  MountKind kind = MountKind::kBind;
  std::string source;
  std::string target;
  bool read_only = false;
  bool optional = false;   // skipped, and reported, when the source is missing
  std::string data;        // filesystem options (tmpfs size and mode)
  std::string why;         // the policy entry this comes from, for explain and errors
};

// `**/.env`-style deny globs: matched in a mounted tree at launch time, every
// match masked.
struct GlobScan {
  std::string source_root;   // host directory to scan
  std::string target_root;   // where it appears inside
  std::string pattern_base;  // source_root relative to the patterns' root ("" = same)
  std::vector<std::string> patterns;  // gitignore-style, relative to the patterns' root
};

struct EnvRules {
  bool pass_all = false;     // danger-full-access only
  std::vector<std::string> pass;
  std::vector<std::pair<std::string, std::string>> set;
};

// Resource limits (policy `resources`), in the units the kernel takes them.
// The cgroup-backed ones are set only where the host can enforce them
// (AssessEnforcement says which); the launcher then creates one cgroup per
// run, nested under its own, and the runner sets the rlimits.
struct ResourceLimits {
  std::optional<std::uint64_t> memory_max_bytes;  // memory.max / limit_in_bytes; swap off
  std::optional<std::uint64_t> memory_low_bytes;  // memory.low / soft_limit_in_bytes
  std::optional<double> cpu_max_cores;            // cpu.max / cfs quota
  std::optional<double> cpu_weight_cores;         // cpu.weight / shares, proportional to it
  std::optional<std::uint64_t> pids_max;          // pids.max
  std::optional<std::uint64_t> fsize_bytes;       // RLIMIT_FSIZE (from disk_gib)
  std::uint64_t nofile = 65536;                   // RLIMIT_NOFILE soft, at most the hard limit
  // Any limit that needs a cgroup: without one, no cgroup is created at all.
  bool NeedsCgroup() const {
    return memory_max_bytes || memory_low_bytes || cpu_max_cores || cpu_weight_cores || pids_max;
  }
};

struct Plan {
  bool confined = true;      // false: danger-full-access, run as is
  std::vector<std::string> argv;
  std::string cwd;           // inside
  std::string hostname = "agentbox";
  std::vector<std::string> namespaces;  // user, mnt, pid, net, ipc, uts, cgroup
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<MountOp> mounts;          // in the order they are applied
  std::vector<GlobScan> deny_globs;
  std::string scan_cache_dir;           // host dir caching deny-glob scans ("" = none)
  std::vector<std::string> absent;      // deny entries that are absent by construction
  EnvRules env;
  std::string home;                     // HOME inside
  std::string workspace_source;
  std::string workspace_target;
  bool workspace_writable = true;
  ResourceLimits limits;                // cgroup settings and rlimits
  std::optional<std::uint64_t> timeout_ms;
  bool denial_outcome = true;           // false: on_violation.report_as task_failure
  std::uint64_t kill_grace_ms = 2000;
  std::string nonce;                    // marks this run's runner-failure lines
  std::string policy_sha256;
};

std::string PlanToJson(const Plan& plan, int indent = -1);
Result<Plan> PlanFromJson(const std::string& text);

// Gitignore-style match of a relative path against one pattern: `**` spans
// directories, `*`/`?`/`[...]` stay within one component, and a pattern
// without a slash matches at any depth.
bool GlobMatch(const std::string& pattern, const std::string& relative_path);

}  // namespace agentbox
