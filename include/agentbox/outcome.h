// The outcome report (DESIGN §4) and the exit status it maps to (DESIGN §2).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace agentbox {

enum class Level { kFull, kPartial, kNone };
const char* ToString(Level);

struct FacetReport {
  std::string name;                      // filesystem, network, syscalls, processes, resources, credentials
  bool requested = false;                // does the policy ask for this facet?
  Level level = Level::kNone;
  std::vector<std::string> mechanisms;   // "mount-namespace", "network-namespace", ...
  std::vector<std::string> notes;        // what is and is not covered, in words
};

struct MissingFacet {
  std::string facet;
  std::string reason;
};

struct EnforcementReport {
  Level level = Level::kNone;
  std::string backend;                   // "linux-namespaces", "landlock-only", or "none"
  std::string backend_reason;            // why this backend ("" for none)
  // The kernel the command talks to when it is not this host's
  // (sandbox.isolation container, microvm): "runsc 0.0~20221219.0 (platform
  // ptrace, rootless)". Empty: the host's own kernel.
  std::string runtime;
  std::vector<FacetReport> facets;
  std::vector<MissingFacet> missing;
  std::vector<std::string> skipped;      // read_only entries absent on this host
  std::vector<std::string> notes;        // policy values honoured differently than named, and why
};

// Adds `missing` to the report, lowering its facet and the report's level
// from full: what a run finds short of the plan after planning.
void AddMissing(EnforcementReport* report, MissingFacet missing);

// An escalation offer (on_violation.escalation: one_time_approval): the
// one grant that would have allowed a denial, scoped to what was denied,
// and whether on_violation.max_grant lets it be given. Listing an offer
// asks nobody and grants nothing.
struct EscalationOffer {
  std::string id;         // "esc-" + the first 12 hex digits of sha256(grant_json)
  std::string grant_key;  // network.allow | filesystem.read | filesystem.read_write | syscalls.allow | resources.memory_gib
  std::string grant_text;                  // host:port, a path, a syscall ("" for memory)
  std::optional<std::uint64_t> grant_gib;  // resources.memory_gib: whole GiB
  std::string grant_json;  // the grant's canonical JSON: {"network.allow":"host:port"}
  bool within_ceiling = false;
  std::string why_not;     // when not within: what puts it beyond
};

struct Denial {
  std::string facet;                     // filesystem, network, syscalls
  std::string op;                        // read, write, connect, ...
  std::string target;                    // the path or host
  std::string reason;
  std::string source;                    // "stderr-signature", "proxy", "seccomp"
  std::uint64_t count = 0;               // seccomp: how many calls were denied (0: not counted)
  std::optional<EscalationOffer> escalation;  // report key `escalation`
};

struct ErrorInfo {
  std::string stage;
  std::string message;
  int err = 0;
};

enum class OutcomeKind { kExited, kSignaled, kTimedOut, kOomKilled, kSandboxDenied, kSandboxError };
const char* ToString(OutcomeKind);

// The limits that were in force for a run, as applied (not as asked).
struct LimitsInForce {
  std::string cgroup;                              // "cgroup-v2", "cgroup-v1", "cgroup-v1+v2", "" = none
  std::optional<std::uint64_t> memory_max_bytes;
  std::optional<std::uint64_t> memory_low_bytes;
  std::optional<double> cpu_max_cores;
  std::optional<double> cpu_weight_cores;
  std::optional<std::uint64_t> pids_max;
  std::optional<std::uint64_t> fsize_bytes;        // RLIMIT_FSIZE
  std::optional<std::uint64_t> nproc;              // RLIMIT_NPROC in the sandbox's user namespace
  std::optional<std::uint64_t> nofile;             // RLIMIT_NOFILE soft ceiling
  bool core_dumps = true;                          // false: RLIMIT_CORE 0
  std::optional<std::uint64_t> wall_clock_ms;
};

struct Usage {
  std::uint64_t wall_ms = 0;
  std::uint64_t cpu_user_ms = 0;
  std::uint64_t cpu_sys_ms = 0;
  std::optional<std::uint64_t> peak_memory_bytes;
  std::optional<std::uint64_t> peak_processes;     // pids.peak, where the kernel keeps it
  std::string source = "rusage";                   // "cgroup": figures from the sandbox's cgroup
  std::optional<std::uint64_t> oom_kills;          // the cgroup's OOM-kill counter, when it has one
  LimitsInForce limits;
};

// What went through the egress proxy (runs with a proxy only).
struct NetworkConnections {
  std::uint64_t allowed = 0;
  std::uint64_t denied = 0;
  std::uint64_t errors = 0;
  std::uint64_t bytes_up = 0;    // sandbox → upstream
  std::uint64_t bytes_down = 0;  // upstream → sandbox
};

// One use of a secret by the TLS terminator (report key `credentials.uses`):
// which secret went to which request, or why a request that would have
// carried one was refused. Never the value.
struct CredentialUse {
  std::string secret;
  std::string host;
  std::string method;
  std::string path;
  std::string decision;  // allow | deny | error
  std::uint64_t count = 1;
};

// `agentbox run --workspace-overlay`: what became of the run's changes to
// the workspace (report key `workspace.overlay`).
struct WorkspaceOverlayResult {
  std::uint64_t size_bytes = 0;  // the upper layer's tmpfs: the cap on what the run could write
  std::string apply;             // on-success | always | never (--apply)
  std::string action;            // applied | discarded | partly-applied | none
  std::string reason;            // why that action ("the command exited with 0", ...)
  std::string diff_json;         // the changes as JSON ({files, patch, truncated, files_truncated}); "" if unknown
  std::string error;             // the diff or the apply failed: the step, path and errno
};

struct Outcome {
  OutcomeKind kind = OutcomeKind::kSandboxError;
  std::optional<int> exit_code;          // the command's own code, when it exited
  std::optional<int> signal;             // the signal that ended it, when it was signaled
  EnforcementReport enforcement;
  std::vector<Denial> denials;
  std::optional<ErrorInfo> error;
  Usage usage;
  std::optional<NetworkConnections> network;  // set when the run had the egress proxy
  std::vector<CredentialUse> credential_uses; // report key credentials.uses (the TLS terminator)
  std::optional<WorkspaceOverlayResult> workspace_overlay;  // set for run --workspace-overlay
  std::string policy_sha256;

  // The exit status of `agentbox run` (DESIGN §2): the command's code,
  // 128+N for a signal, 124 timed out, 125 sandbox failure, 137 OOM kill.
  int ExitStatus() const;
};

// JSON text of the report (pretty-printed when `indent` >= 0).
std::string ToJson(const Outcome& outcome, int indent = 2);
std::string ToJson(const EnforcementReport& report, int indent = 2);
// One denial as the report lists it (an element of `denials`).
std::string ToJson(const Denial& denial, int indent = -1);

// The running version, as reported in `agentbox_version`.
const char* Version();

}  // namespace agentbox
