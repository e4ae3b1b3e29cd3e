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

#include "agentbox/policy.h"
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
  kOverlay,     // sessions: the workspace as an overlay (layers in Plan::workspace_overlay)
  kFile,        // a read-only file at target: `data`, then the host file `source` when set (public data only)
  kDir,         // an empty directory at target on the root tmpfs: an escalation ceiling, below which grants
                // are grafted into a running world (read_only: a filesystem_read ceiling)
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

// kLandlockOnly: a symlink the launcher makes in the per-run private home,
// so that a policy's `~/…` entry (read_only, read_write, a cache, an
// imported dotfile) is found at `~/…` although HOME is the private one.
struct HomeLink {
  std::string name;    // relative to the private home (".pyenv", ".cache/pip")
  std::string target;  // host path
  bool optional = false;  // a missing target is skipped and reported; else an error
  std::string why;
};

struct EnvRules {
  bool pass_all = false;     // danger-full-access only
  std::vector<std::string> pass;  // names and `*` patterns (EnvPatternMatch)
  std::vector<std::pair<std::string, std::string>> set;
};

// The variables of `envp` that `pass` takes, once each: names in the order
// given, each pattern's matches in the order of `envp`.
std::vector<std::string> PassedNames(const std::vector<std::string>& pass, char* const* envp);

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
  // RLIMIT_NPROC set inside the sandbox's own user namespace (from
  // max_processes, where no pids cgroup is ours to give): the kernel counts
  // tasks per user namespace and uid since 5.14, so this caps the sandbox's.
  std::optional<std::uint64_t> nproc;
  std::uint64_t nofile = 65536;                   // RLIMIT_NOFILE soft, at most the hard limit
  // Any limit that needs a cgroup: without one, no cgroup is created at all.
  bool NeedsCgroup() const {
    return memory_max_bytes || memory_low_bytes || cpu_max_cores || cpu_weight_cores || pids_max;
  }
};

// How the plan confines. kNamespaces: user, mount, pid and network
// namespaces with a fresh root, Landlock and seccomp on top. kLandlockOnly:
// for hosts without user namespaces; no namespaces and no mounts, Landlock
// rules on host paths, seccomp, no_new_privs and rlimits (partial by
// construction: docs/security-model.md says what is missing).
// kGvisor (sandbox.isolation: container): the command runs on gVisor's
// kernel (runsc), from an OCI spec made of the same mount plan.
// kMicrovm (sandbox.isolation: microvm): the command runs on a guest kernel
// of its own in a QEMU microVM, whose init applies the same plan again.
enum class Backend { kNamespaces, kLandlockOnly, kGvisor, kMicrovm };
// "linux-namespaces" | "landlock-only" | "gvisor" | "microvm": the report's enforcement.backend.
const char* ToString(Backend);

// Landlock, stacked on the mount plan. Rules name paths INSIDE the sandbox:
// the runner applies them after pivot_root. Access bits are the kernel's
// LANDLOCK_ACCESS_FS_* values (a stable ABI).
struct LandlockRule {
  std::string path;
  std::uint64_t access = 0;  // on a non-directory the runner keeps only the file rights
  bool optional = false;     // skipped when absent (an optional read_only entry missing on the host)
  std::string why;
};

struct LandlockPlan {
  int abi = 0;                      // the ABI the plan is written for; 0: no Landlock layer
  std::uint64_t handled_fs = 0;     // rights the ruleset restricts (everything this ABI knows)
  std::uint64_t scoped = 0;         // LANDLOCK_SCOPE_* (ABI >= 6)
  std::uint64_t handled_net = 0;    // LANDLOCK_ACCESS_NET_* (ABI >= 4); a port without a rule is refused
  // TCP ports connect() may reach (on any address: Landlock rules are per
  // port). Landlock-only: the egress proxy's two ports, once the supervisor
  // has bound them; the runner's connect() mediation narrows them to 127.0.0.1.
  std::vector<std::uint16_t> connect_tcp_ports;
  std::vector<LandlockRule> rules;
  std::vector<std::string> left_out;  // what this ABI cannot restrict that a newer one can
  bool required = true;             // enforcement short of the plan: refuse (true) or report (false)
};

// One argument condition of a seccomp rule (libseccomp allows at most one
// comparison per argument in a rule, so richer conditions expand into
// several rules when compiled).
struct SeccompArgCheck {
  enum class Kind {
    kAlways,        // every call
    kAnyBitSet,     // (arg & mask) != 0, unless the low 32 bits equal `except` (when has_except)
    kLow32Equals,   // (arg & 0xffffffff) == value: the kernel reads an int, high bits are noise
    kMaskedEquals,  // (arg & mask) == value
    kLow32NotIn,    // low 32 bits not in `values`; anything >= `value` is denied too
  };
  Kind kind = Kind::kAlways;
  unsigned arg = 0;
  std::uint64_t mask = 0;
  std::uint64_t value = 0;
  bool has_except = false;
  std::uint64_t except = 0;
  std::vector<std::uint64_t> values;
  // A second condition that must hold too: (arg `also_arg` & also_mask) == also_value.
  bool has_also = false;
  unsigned also_arg = 0;
  std::uint64_t also_mask = 0;
  std::uint64_t also_value = 0;
};

enum class SeccompAction {
  kNotifyEperm,  // the runner answers -EPERM through the user-notification fd and records the call
  kErrnoEnosys,  // answered in the kernel: -ENOSYS (so that libc falls back; not a denial)
  kNotifyMediate,  // the runner decides and makes the call itself (connect: unix sockets)
};

struct SeccompRule {
  std::string syscall;
  SeccompAction action = SeccompAction::kNotifyEperm;
  SeccompArgCheck when;
  std::string why;
};

struct SeccompPlan {
  bool enabled = false;
  std::vector<SeccompRule> rules;
  // x32 and i386 calls from an x86_64 process (and any other foreign
  // architecture) fail with EPERM: a filter written for one syscall table
  // says nothing about another.
  bool refuse_foreign_arches = true;
  // Host dir where the compiled program is memoised ("" = compile every run).
  std::string cache_dir;
  // Syscalls an approved escalation grant took out of the rules (policy
  // `granted.syscalls`), for the report and explain.
  std::vector<std::string> granted;
};

// "read_file, read_dir, execute", for explain and errors.
std::string LandlockAccessNames(std::uint64_t access);
// "socket: domain not in {1, 2, 10} → EPERM (reported)", for explain.
std::string Describe(const SeccompRule& rule);

// The egress proxy's listeners, and the rules the supervisor's proxy decides
// with (a copy of the policy's network section). Namespaces backend: the
// runner binds these ports on the namespace's 127.0.0.1. Landlock-only: the
// supervisor binds two ephemeral ports on the host's 127.0.0.1 per run and
// writes them here (0 until then; AdoptProxyPorts).
struct ProxyPorts {
  std::uint16_t http_port = 3128;
  std::uint16_t socks_port = 1080;
};

struct NetworkPlan {
  std::optional<ProxyPorts> proxy;  // set: the runner hands listeners to the supervisor's proxy
  std::vector<std::string> allow;
  std::vector<std::string> deny;
  bool default_allow = false;
  bool ask_unknown = false;
  bool sni_check = true;                      // CONNECT to these ports: TLS SNI must name the target
  std::vector<std::uint16_t> sni_ports{443};
  // The TLS terminator (net/terminator.h): on when a host gets credentials or
  // L7 rules. Secret sources only: no value is ever part of a plan.
  bool terminate = false;
  CredentialsSpec credentials;
  std::vector<HttpRuleSpec> http_rules;
  // Inside the sandbox: the per-run CA with the roots the supervisor trusts
  // (a kFile mount, or a file in the private directory on landlock-only).
  std::string ca_bundle;
  // Transparent egress: every inet connect() of the sandbox is decided by
  // the supervisor (the seccomp broker), which opens allowed connections
  // from the host side and installs them in place of the caller's socket;
  // on the namespaces backend the supervisor also serves DNS inside, at
  // dns_address port 53 (UDP and TCP), and /etc/resolv.conf points there.
  bool broker = false;
  std::string dns_address;  // empty: no DNS served inside (landlock-only)
  // network.inspect_tls: brokered connections to these hosts (or all) go
  // through the relay with its SNI check rather than directly.
  bool inspect_tls_all = false;
  std::vector<std::string> inspect_tls;
};

// For explain: that connections the broker installs directly carry no SNI
// check, and which hosts keep the relay and the check (network.inspect_tls).
// "" without a broker, or with the SNI check off everywhere.
std::string DescribeBrokeredTls(const NetworkPlan& network);

// A session's workspace: overlayfs with the base workspace (`source` of the
// kOverlay mount) at the bottom, snapshot layers above it, and the session's
// own upper layer on top. Host paths, all of them.
//
// `agentbox run --workspace-overlay` uses the same mount with no lowers
// above the base and `tmpfs_bytes` set: the runner makes the upper and work
// directories on a fresh tmpfs of that size (the cap on what the run may
// write), hands the supervisor a descriptor of it, and the supervisor
// applies the upper layer to the workspace when the run ends (or discards
// it: `apply`). `upper` and `work` are then names inside that tmpfs.
enum class OverlayApply {
  kOnSuccess,  // only when the command exited 0 (and the outcome is `exited`)
  kAlways,     // whatever the outcome, as long as the layer exists
  kNever,      // a dry run: the diff is reported, nothing is applied
};
const char* ToString(OverlayApply);  // "on-success" | "always" | "never"
std::optional<OverlayApply> ParseOverlayApply(const std::string& text);

struct WorkspaceOverlay {
  std::vector<std::string> lowers;  // snapshot trees, newest first (above the base)
  std::string upper;
  std::string work;                 // overlay's work dir, same filesystem as upper
  // disk_gib: > 0 puts upper and work on a tmpfs of this size that the
  // session's init mounts (in its own namespaces) instead of the host
  // directories named above; their last components name them on it.
  std::uint64_t upper_fs_bytes = 0;
  // With upper_fs_bytes: the world is handed an earlier world's upper
  // filesystem (its root) to copy into the new one first (world.h).
  bool upper_seeded = false;
  std::uint64_t tmpfs_bytes = 0;    // run --workspace-overlay: the upper's tmpfs size (0: host dirs)
  OverlayApply apply = OverlayApply::kOnSuccess;
};

// disk_gib on the host workspace through a project quota (linux/
// project_quota.h): set up by the supervisor before the launch, removed
// after the run.
struct WorkspaceQuotaPlan {
  std::string device;        // the workspace's block device, for quotactl()
  std::uint64_t bytes = 0;   // what the run may add: the limit is the use at the start plus this
};

// on_violation, as the supervisor needs it once a run's denials are known
// (confine/escalation.h): whether a denial carries an escalation offer,
// and the ceiling the offer is held against. Paths are absolute, `~`
// expanded against the invoking user's home. Filled only with `offers`.
struct EscalationPlan {
  bool offers = false;                        // on_violation.escalation: one_time_approval
  std::vector<std::string> network;           // max_grant.network (host[:port] patterns)
  std::vector<std::string> filesystem_read;   // max_grant.filesystem_read
  std::vector<std::string> filesystem_write;  // max_grant.filesystem_write
  std::vector<std::string> syscalls;          // max_grant.syscalls
  std::optional<std::uint64_t> memory_max_bytes;  // max_grant.memory_gib
  // Always beyond the ceiling: filesystem.deny, the built-in credential
  // paths and agentbox's own directories. Absolute, or relative to the
  // workspace (inside); gitignore-style globs as filesystem.deny has them.
  std::vector<std::string> never;
  // No offer at all: what no grant lifts (filesystem.protect, absolute inside).
  std::vector<std::string> protect;
};

// How runsc is run (Backend::kGvisor).
struct GvisorPlan {
  std::string runsc;            // the program
  std::string version;          // for the report
  std::string platform = "ptrace";
  bool rootless = false;        // --rootless: the caller is not root
  std::string state_parent;     // where per-run bundles and runsc's state go (the runtime dir)
  // The plan of a session's world as its supervisor runs it inside the
  // sandbox (plan.confined false there): the Sentry is the fence, and the
  // world's init forks each call with the plan's environment.
  bool inside = false;
};

// A session's world on another host (sandbox.isolation: remote), as the
// caller's side holds it. The remote agentbox confines the policy with its
// own host's enforcement (session/remote_world.h): this is what reaches it,
// not a plan of the remote's.
struct RemotePlan {
  std::string ssh;         // the destination as ssh takes it: [user@]host (a port apart)
  std::string port;        // "" = ssh's (its configuration's) port
  std::string ssh_config;  // "" = ssh's default; else an absolute path
  std::string level;       // what the remote applies: os | container | microvm
  std::string workspace;   // the workspace's directory on the remote
  std::string session;     // the session's id: names its copy of the workspace there
  // The effective policy as YAML, with env.pass resolved into env.set here
  // (the remote's environment is not the caller's).
  std::string policy_yaml;
  std::string binary;      // this host's agentbox, installed on the remote by digest
  // A sandbox claimed from a Kubernetes cluster instead (ssh empty): the
  // policy's sandbox.remote.kubernetes, its kubeconfig path expanded.
  std::string k8s_namespace;
  std::string k8s_template;
  std::string k8s_context;
  std::string k8s_kubeconfig;
  // The session's claimed sandbox (the daemon claims it and holds it for
  // the session's life): its pod is where the world is exec'd.
  std::string k8s_claim;
  std::string k8s_pod;
};

// How the microVM is made (Backend::kMicrovm).
struct MicrovmPlan {
  std::string qemu;             // qemu-system-x86_64
  std::string virtiofsd;        // QEMU's virtiofsd
  std::string kernel;           // /boot/vmlinuz-RELEASE
  std::string initramfs;        // agentbox's guest image for that release
  std::string accel = "tcg";    // "kvm" with a usable /dev/kvm, else "tcg"
  std::uint64_t memory_mib = 1024;  // the VM's RAM: resources.memory_gib.limit
  unsigned vcpus = 1;           // resources.cpu.limit, rounded up
  bool rootless = false;        // the caller is not root: virtiofsd in a user namespace of ours
  std::string state_parent;     // where per-run directories go (the runtime dir)
};

struct Plan {
  bool confined = true;      // false: danger-full-access, run as is
  Backend backend = Backend::kNamespaces;
  std::vector<std::string> argv;
  std::string cwd;           // inside
  std::string hostname = "agentbox";
  std::vector<std::string> namespaces;  // user, mnt, pid, net, ipc, uts, cgroup
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<MountOp> mounts;          // in the order they are applied
  std::vector<GlobScan> deny_globs;
  std::string scan_cache_dir;           // host dir caching deny-glob scans ("" = none)
  // Names below every git directory of the workspace that protect covers
  // ("hooks", "config": from `.git/NAME` protect entries). Repositories found
  // at launch get them protected like the root's; ones that appear during
  // the run are audited at its end (linux/git_repos.h).
  std::vector<std::string> protect_git;
  std::vector<std::string> absent;      // deny entries that are absent by construction
  std::vector<std::string> unix_sockets;  // sockets outside the sandbox it may connect to, as paths inside
  // filesystem.caches backed by agentbox's own directories: host paths the
  // launcher creates (0700, parents too) before anything is mounted.
  std::vector<std::string> cache_dirs;
  std::vector<HomeLink> home_links;     // kLandlockOnly only
  EnvRules env;
  std::string home;                     // HOME inside
  std::string workspace_source;
  std::string workspace_target;
  bool workspace_writable = true;
  std::optional<WorkspaceOverlay> workspace_overlay;  // sessions in overlay mode; run --workspace-overlay
  std::optional<WorkspaceQuotaPlan> workspace_quota;  // disk_gib by a project quota on the workspace
  ResourceLimits limits;                // cgroup settings and rlimits
  LandlockPlan landlock;                // applied by the runner after the root is built
  NetworkPlan network;                  // egress through the supervisor's proxy, when set
  SeccompPlan seccomp;                  // applied after Landlock (it may forbid Landlock's syscalls)
  std::optional<std::uint64_t> timeout_ms;
  // run --tty: the command's stdio is a pty of the sandbox's own (its
  // controlling terminal), relayed by the runner to the caller's stdio.
  bool tty = false;
  bool denial_outcome = true;           // false: on_violation.report_as task_failure
  EscalationPlan escalation;            // on_violation.escalation and max_grant
  std::uint64_t kill_grace_ms = 2000;
  std::string nonce;                    // marks this run's runner-failure lines
  // kLandlockOnly: the supervisor creates a private 0700 directory under
  // `private_dir_parent` for each run (HOME and TMPDIR point into it) and
  // removes it afterwards; `private_dir` is that run's directory ("" before).
  std::string private_dir_parent;
  std::string private_dir;
  std::optional<GvisorPlan> gvisor;     // kGvisor only
  std::optional<MicrovmPlan> microvm;   // kMicrovm only
  std::optional<RemotePlan> remote;     // a remote world's caller side (nothing runs here)
  std::string policy_sha256;
};

std::string PlanToJson(const Plan& plan, int indent = -1);
Result<Plan> PlanFromJson(const std::string& text);

// Gitignore-style match of a relative path against one pattern: `**` spans
// directories, `*`/`?`/`[...]` stay within one component, and a pattern
// without a slash matches at any depth.
bool GlobMatch(const std::string& pattern, const std::string& relative_path);

}  // namespace agentbox
