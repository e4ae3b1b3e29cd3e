// The one seam: every caller — CLI, daemon, MCP server — goes through
// Confine(). It is pure: it reads no files and makes no syscalls.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agentbox/host_caps.h"
#include "agentbox/outcome.h"
#include "agentbox/plan.h"
#include "agentbox/policy.h"
#include "agentbox/status.h"

namespace agentbox {

// Which backend the caller asks for (CLI `--backend`).
enum class BackendChoice { kAuto, kNamespaces, kLandlock };

struct BackendSelection {
  Backend backend = Backend::kNamespaces;
  std::string why;  // "user namespaces available", "user namespaces unavailable: ..."
};

// kAuto: namespaces where user namespaces are usable, else landlock-only
// where Landlock ABI >= 2 and seccomp filters exist, else an error. A
// forced choice the host cannot give is an error, never a downgrade.
Result<BackendSelection> SelectBackend(const HostCaps& host, BackendChoice choice);

// The filesystem under the workspace, as far as disk_gib is concerned: can
// agentbox bound what a run writes there with a project quota? Probed at
// invocation time (linux/project_quota.h); planning only reads it.
struct WorkspaceFs {
  bool known = false;          // probed; false: the workspace is not known yet
  std::string fstype;          // "ext4", "xfs", "tmpfs", ...
  bool project_quota = false;  // a project quota can bound it, and this process may set one
  std::string device;          // the block device quotactl() takes (with project_quota)
  std::string why_not;         // when not: the fact ("without project quotas", "needs CAP_SYS_ADMIN ...")
};

// Who is asking, from where: the facts of the invocation that planning needs.
struct Invocation {
  std::string workspace;   // host path, absolute and canonical
  std::string cwd;         // host path, absolute
  std::string home;        // the invoking user's $HOME ("" if unknown)
  std::string self_exe;    // the agentbox binary, for wrapped argv
  std::string nonce;       // random, marks this run's runner-failure lines
  std::string cache_dir;   // host dir for agentbox's caches ("" = none)
  std::string runtime_dir; // host dir for landlock-only per-run directories ("" = /tmp)
  BackendChoice backend = BackendChoice::kAuto;
  bool session = false;    // a session's sandbox (sessions honour snapshot_on_exit, fresh_per_task)
  // agentbox's own directories (state, caches, daemons' and MCP servers'
  // state dirs): absent from the sandbox whatever the policy says, and a
  // workspace inside one is refused. Host paths, absolute.
  std::vector<std::string> own_dirs;
  WorkspaceFs workspace_fs;  // for disk_gib (settled only when the workspace is writable)
  // `run --workspace-overlay`: the run writes into a capped upper layer over
  // the workspace, applied at the end as `apply` says (namespaces backend only).
  std::optional<OverlayApply> workspace_overlay;
  // Whether ConfinedCommand::argv and env (the wrapped command a harness
  // spawns, the plan serialised into it) are wanted. `run`, `explain` and
  // sessions use the plan itself and say no: serialising it costs a run
  // more than its network set-up does.
  bool wrapped_command = true;
};

// A stderr classifier: an ECMAScript regex and what a match means. Group 1,
// when present, captures the path or host concerned.
struct Signature {
  std::string pattern;
  std::string meaning;
};

struct ConfinedCommand {
  // What a harness spawns: the wrapped argv, with `env` added to its
  // environment (empty unless Invocation::wrapped_command).
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  EnforcementReport enforcement;
  // Recognise a working sandbox denying something.
  std::vector<Signature> denial_signatures;
  // Recognise the sandbox runner itself failing. Check these first.
  std::vector<Signature> runner_failure_rules;
  Plan plan;
};

// What the policy would get on this host, facet by facet, for this
// invocation: where the workspace and HOME lie decides which deny and
// protect entries a backend can fence (the landlock-only backend cannot hide
// a path inside a tree it grants). Every facet's level follows from what is
// fenced: a facet named in `missing` is never `full`. Never fails.
EnforcementReport AssessEnforcement(const Policy& policy, const HostCaps& host, const Invocation& invocation);
// The same without an invocation (`check`, refusals before one is known): the
// workspace and HOME are unknown, so entries relative to the workspace count
// as inside it and `~` entries are left out of the per-entry list.
EnforcementReport AssessEnforcement(const Policy& policy, const HostCaps& host,
                                    BackendChoice backend = BackendChoice::kAuto, bool session = false);

// Asks of the policy that no host of this version can give, whatever the
// backend and `require` (sandbox.isolation other than os, an image other
// than host): the refusal `run` gives, for `check` and `explain` to show.
Status CheckAvailable(const Policy& policy);

// Confines argv under the policy, or refuses (stage "confine") when the
// policy cannot be enforced at the level it requires. Never a silent downgrade.
Result<ConfinedCommand> Confine(const std::vector<std::string>& argv, const Policy& policy,
                                const HostCaps& host, const Invocation& invocation);

// The environment variable that carries the plan to `agentbox __exec`.
inline constexpr const char* kPlanEnv = "AGENTBOX_PLAN";

}  // namespace agentbox
