// The policy: plain, validated, immutable data (DESIGN §3).
//
// A Policy is built once, from a mode preset, then a YAML file, then command
// line overrides, and never changes afterwards. Nothing here makes a syscall
// except reading the policy file itself.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agentbox/status.h"

namespace agentbox {

enum class Mode { kReadOnly, kWorkspaceWrite, kDangerFullAccess };
enum class Isolation { kHost, kOs, kContainer, kMicrovm, kRemote };
enum class Requirement { kFull, kPartial };
enum class Access { kReadOnly, kReadWrite };
enum class NetDefault { kDeny, kAllow };
enum class UnknownDomain { kDeny, kAsk };
enum class CredentialsInSandbox { kNone, kAllow };
enum class GitCredentials { kNone, kProxy };
enum class ToolCredentials { kNone, kVaultProxy };
enum class ReportAs { kSandboxDenial, kTaskFailure };
enum class Escalation { kDeny, kOneTimeApproval };
enum class ShellMode { kFresh, kPersistent };

// sandbox.remote.kubernetes: a sandbox claimed from a cluster running
// kubernetes-sigs/agent-sandbox (docs/kubernetes.md).
struct KubernetesRemoteSpec {
  std::string namespace_name;  // "namespace": the claims' and the template's namespace
  std::string template_name;   // "template": the SandboxTemplate claimed from
  std::string context;         // the kubeconfig context ("" = its current-context)
  std::string kubeconfig;      // "" = $KUBECONFIG, else ~/.kube/config; absolute or ~/...
};

// sandbox.remote: where `isolation: remote` runs a session's world.
// Exactly one of `ssh` and `kubernetes` is set.
struct RemoteSpec {
  // "[user@]host[:port]" or a Host alias of the ssh configuration; the
  // system's ssh client connects with strict host key checking.
  std::string ssh;
  std::string ssh_config;      // "" = ssh's own default; absolute or ~/...
  // What the remote agentbox applies to each call: os | container | microvm.
  Isolation level = Isolation::kOs;
  // The workspace's directory on the remote ("" = the session's workspace
  // path, taken as a path on the remote).
  std::string workspace;
  std::optional<KubernetesRemoteSpec> kubernetes;
};

struct SandboxSpec {
  Isolation isolation = Isolation::kOs;
  Requirement require = Requirement::kFull;
  std::string image = "host";
  bool fresh_per_task = true;
  bool snapshot_on_exit = false;
  // Set exactly when isolation is remote.
  std::optional<RemoteSpec> remote;
};

struct WorkspaceSpec {
  // Where the workspace appears inside the sandbox; empty = same as on the host.
  std::string path;
  Access access = Access::kReadWrite;
};

// filesystem.caches.NAME: a directory shared by every run and session of
// the user, mounted writable at `path`. Its backing directory is agentbox's
// own (the launcher's cache root + "/caches/" + NAME, created 0700) unless
// `host` names one explicitly.
struct CacheSpec {
  std::string name;  // [a-z0-9][a-z0-9_.-]*
  std::string path;  // inside: absolute, or ~/... (the sandbox's home)
  std::string host;  // "" = agentbox's; else absolute or ~/... (the caller's home), which must exist
};

struct FilesystemSpec {
  WorkspaceSpec workspace;
  // Absolute paths (after `~` expansion), bound read-only; missing ones are skipped.
  std::vector<std::string> read_only;
  // Absolute or `~/…`, bound writable at the same path; a missing one is an
  // error (a writable tree asked for never silently vanishes). deny entries
  // inside are masked as they are elsewhere.
  std::vector<std::string> read_write;
  std::vector<CacheSpec> caches;  // in file order
  // Absent inside the sandbox. Absolute, `~/…`, or relative to the workspace;
  // may hold gitignore-style globs (`**/.env`).
  std::vector<std::string> deny;
  // Read-only inside a writable workspace. Absolute or relative to the workspace.
  std::vector<std::string> protect;
  // Pathname unix sockets outside the sandbox that it may connect to
  // (absolute or `~/…`). Every other socket bound outside the sandbox is
  // refused, on every backend: a same-uid service behind a socket (a session
  // bus, an ssh agent, docker.sock, agentbox's own daemon) is a way out.
  std::vector<std::string> unix_sockets;
};

// network.http_rules[]: on `host` (exact, normalised), only requests whose
// "METHOD /path" matches one of `allow` pass; `*` spans one path segment,
// `**` any number, and a method `*` any method.
struct HttpRuleSpec {
  std::string host;
  std::vector<std::string> allow;
};

struct NetworkSpec {
  NetDefault default_action = NetDefault::kDeny;
  bool egress_proxy = false;
  std::vector<std::string> allow;
  std::vector<std::string> deny;
  UnknownDomain on_unknown_domain = UnknownDomain::kDeny;
  // CONNECT (HTTP or SOCKS) to one of these ports: a TLS ClientHello whose
  // SNI names another host than the target closes the tunnel.
  bool tls_sni_check = true;
  std::vector<std::uint16_t> tls_sni_ports{443};
  // L7 rules on hosts whose TLS agentbox terminates (network.http_rules).
  std::vector<HttpRuleSpec> http_rules;
  // network.inspect_tls: connections the connect() broker opens to these
  // hosts (or to every host: inspect_tls_all) keep the supervisor's relay
  // and its SNI check instead of being handed over directly.
  bool inspect_tls_all = false;
  std::vector<std::string> inspect_tls;
};

// Where the supervisor reads a secret's value from (exactly one is set).
struct SecretSource {
  enum class Kind { kEnv, kFile, kCommand };
  Kind kind = Kind::kEnv;
  std::string env;                   // kEnv: a variable of the supervisor's environment
  std::string file;                  // kFile: an absolute path (`~` expanded)
  std::vector<std::string> command;  // kCommand: argv; its stdout, one trailing newline removed
};

// How a secret reaches the requests to its hosts.
struct SecretInjection {
  enum class Kind {
    kHeader,       // `header` set to `format` with "{}" replaced by the value
    kBasic,        // Authorization: Basic base64(username:value) (git over HTTPS)
    kPlaceholder,  // the secret's placeholder, where the request carries it, replaced by the value
  };
  Kind kind = Kind::kHeader;
  std::string header = "Authorization";  // kHeader
  std::string format = "Bearer {}";      // kHeader: holds "{}" exactly once
  std::string username = "x-access-token";  // kBasic
};

// credentials.secrets.NAME. Held by the supervisor, never inside the sandbox.
struct SecretSpec {
  std::string name;                  // the key under credentials.secrets
  SecretSource from;
  std::vector<std::string> hosts;    // normalised host names (exact; "*.example.com" for strict subdomains)
  SecretInjection inject;
  std::string placeholder_env;       // "" = none: the sandbox sees NAME=<placeholder>, never the value
};

struct GitPushSpec {
  std::vector<std::string> allow_refs;  // globs over full ref names ("refs/heads/agent/*"); empty = any ref
  bool deny_force = false;              // refuse non-fast-forward updates and deletions
};

struct GitCredentialsSpec {
  // "https://github.com/acme/*": repositories whose smart-HTTP requests get
  // credentials; `*` spans one path segment, `**` any number.
  std::vector<std::string> remotes;
  GitPushSpec push;
};

struct CredentialsSpec {
  CredentialsInSandbox in_sandbox = CredentialsInSandbox::kNone;
  GitCredentials git = GitCredentials::kNone;
  ToolCredentials tools = ToolCredentials::kNone;
  std::vector<SecretSpec> secrets;   // in file order
  // credentials.git as a mapping (the short form `git: proxy` leaves it empty).
  GitCredentialsSpec git_rules;
};

// A guaranteed share and a hard ceiling; either may be absent.
struct Range {
  std::optional<double> guaranteed;
  std::optional<double> limit;
  bool requested() const { return guaranteed.has_value() || limit.has_value(); }
};

struct ResourcesSpec {
  Range cpu;                                   // cores, fractions allowed
  std::optional<std::uint64_t> memory_guaranteed_bytes;
  std::optional<std::uint64_t> memory_limit_bytes;
  std::optional<std::uint64_t> disk_bytes;
  std::optional<std::uint64_t> wall_clock_ms;
  // After SIGTERM at the deadline, how long before everything is killed.
  std::optional<std::uint64_t> kill_grace_ms;
  std::optional<std::uint64_t> max_processes;
};

struct EnvSpec {
  // Names copied from the caller; an entry holding `*` is a pattern over
  // the caller's variables (EnvPatternMatch).
  std::vector<std::string> pass;
  std::vector<std::pair<std::string, std::string>> set;   // fixed values, in file order
};

// home: what of the caller's real home the sandbox's private home gets.
struct HomeSpec {
  // Paths relative to the real home (".gitconfig", ".config/git/config"),
  // given read-only at the same place in the sandbox's home; missing ones
  // are skipped and reported.
  std::vector<std::string> import;
};

// on_violation.max_grant: the ceiling an escalation offer is held against
// (docs/policy.md). An empty list, or no memory_gib, means no grant of that
// kind is within it. Whatever it says, some grants are always beyond it:
// danger-full-access, a path under filesystem.deny or a built-in credential
// path (NeverGrantedPaths), a syscall SyscallGrantProblem refuses.
struct MaxGrantSpec {
  std::vector<std::string> network;           // host[:port] patterns, as network.allow takes them
  std::vector<std::string> filesystem_read;   // trees a read grant may open (absolute or ~/...)
  std::vector<std::string> filesystem_write;  // trees a read_write grant may mount
  std::vector<std::string> syscalls;          // syscalls a grant may allow
  std::optional<std::uint64_t> memory_bytes;  // memory_gib: the largest memory limit a grant may set
};

struct OnViolationSpec {
  ReportAs report_as = ReportAs::kSandboxDenial;
  Escalation escalation = Escalation::kDeny;
  MaxGrantSpec max_grant;
};

// What approved escalation grants added that no policy-file key holds
// (confine/escalation.h ApplyGrant sets it; a policy file never does):
// syscalls the seccomp layer would otherwise deny outright. Network,
// filesystem and memory grants go into network.allow, filesystem.*,
// resources.memory_limit_bytes themselves.
struct GrantedSpec {
  std::vector<std::string> syscalls;
};

// diff: what a session's diff and apply leave out, on top of the
// workspace's .gitignore files (docs/sessions.md).
struct DiffSpec {
  // Gitignore-style patterns, relative to the workspace root.
  std::vector<std::string> exclude;
};
// tools.upstream: MCP servers behind the daemon's tool gateway
// (docs/tools.md). A session offers each allowed tool as NAME.TOOL; the
// daemon starts or reaches the server outside every sandbox and holds its
// credential. `run` has no tool calls and ignores them.
struct UpstreamSpec {
  std::string name;                      // [a-z][a-z0-9_-]{0,31}: tools appear as NAME.TOOL
  std::vector<std::string> command;      // stdio: argv, started by the daemon (PATH searched)
  std::string url;                       // or Streamable HTTP: http://HOST:PORT/PATH
  std::string secret;                    // a credentials.secrets name; "" = none
  std::string secret_env = "MCP_TOKEN";  // stdio: the variable the server finds the value in
  std::vector<std::string> allow;        // the tools exposed, by the upstream's names; the others do not exist
  std::uint64_t timeout_ms = 30000;      // a call's bound (and the server's start)
};
// run_code (code mode): what its programs' `tools` module offers besides
// the file tools and the upstream tools.
struct RunCodeSpec {
  bool bash = false;  // a `bash` binding (a program's shell commands run as bash calls do, with their network)
};
struct ToolsSpec {
  std::vector<UpstreamSpec> upstream;  // in file order
  RunCodeSpec run_code;
};

// Defaults for a session's calls (agentbox serve, agentbox mcp); `run`
// ignores them.
struct SessionSpec {
  // A bash call without a timeout of its own: this, else
  // resources.wall_clock_min, else kDefaultCallTimeoutMs.
  std::optional<std::uint64_t> call_timeout_ms;
  // This long without a call (none in flight), the session's world is
  // stopped, its state kept; the next call provisions a new one.
  std::uint64_t idle_timeout_ms = 30ULL * 60 * 1000;
  // fresh: a new bash per call; persistent: one bash per session (cd and
  // export carry over between calls).
  ShellMode shell = ShellMode::kFresh;
};
inline constexpr std::uint64_t kDefaultCallTimeoutMs = 10ULL * 60 * 1000;

struct Policy {
  int version = 1;
  Mode mode = Mode::kWorkspaceWrite;
  SandboxSpec sandbox;
  FilesystemSpec filesystem;
  NetworkSpec network;
  CredentialsSpec credentials;
  ResourcesSpec resources;
  EnvSpec env;
  HomeSpec home;
  OnViolationSpec on_violation;
  GrantedSpec granted;
  DiffSpec diff;
  SessionSpec session;
  ToolsSpec tools;

  // Where it came from: a file name, or "<mode preset>".
  std::string source;
  // sha256 of the file's text; empty for presets and overridden presets,
  // whose digest PolicyDigest() derives from the effective policy.
  std::string sha256;
};

// The preset a mode starts from. danger-full-access confines nothing.
Policy PresetFor(Mode mode);

// Parses policy YAML. `source_name` is used in error messages, which read
// "<source_name>:<line>:<column>: <key.path>: <what is wrong>". Keys missing
// from the text keep the value of the preset for the file's `mode` (default
// workspace-write); a list given in the file replaces the preset's list.
Result<Policy> ParsePolicy(const std::string& text, const std::string& source_name);

// Reads and parses a file; a read error names the path and errno.
Result<Policy> LoadPolicyFile(const std::string& path);

// `agentbox policy validate`: every error in the text, in the form
// ParsePolicy gives the first; empty when the policy is valid. A key with
// an error is skipped and the next one checked, so independent mistakes
// are all listed; checks across sections run only when every key parsed.
std::vector<Status> ValidatePolicy(const std::string& text, const std::string& source_name);
std::vector<Status> ValidatePolicyFile(const std::string& path);

// Command-line overrides, applied after the file (DESIGN §2: flags override).
struct PolicyOverrides {
  std::optional<Mode> mode;
  std::optional<Requirement> require;
  std::vector<std::string> allow_domains;
  std::optional<std::uint64_t> timeout_ms;
  std::optional<std::uint64_t> kill_grace_ms;
  std::optional<std::uint64_t> memory_bytes;
  std::optional<std::uint64_t> max_processes;
  std::optional<double> cpus;
  std::vector<std::string> env;   // NAME (pass) or NAME=VALUE (set)
};
// Applies overrides. A mode given here re-bases on that mode's preset only
// when no policy file was given; with a file, it changes the mode key alone.
Result<Policy> ApplyOverrides(Policy policy, const PolicyOverrides& overrides, bool from_file);

// The policy's digest for reports: the file's sha256, or that of ToYaml().
std::string PolicyDigest(const Policy& policy);

// The largest values the policy file and the command line accept, checked
// when the text is parsed. Beyond them a number is a typo, not a wish, and
// would wrap further on: a 3000000h timeout overflowed std::chrono's
// nanoseconds and fired after 30 ms; a disk size past 2^63 made every write
// fail with SIGXFSZ; pids.max refuses more than PID_MAX_LIMIT.
inline constexpr std::uint64_t kMaxDurationMs = 7ULL * 24 * 60 * 60 * 1000;  // 7 days ("168h")
inline constexpr std::uint64_t kMaxSizeBytes = 1ULL << 50;                   // 1 PiB ("1024Ti")
inline constexpr std::uint64_t kMaxProcesses = 4194304;                      // PID_MAX_LIMIT
inline constexpr double kMaxCpus = 4096;

// Units shared by the file and the command line. Both refuse 0 and values
// above kMaxSizeBytes / kMaxDurationMs; the error says which bound.
Result<std::uint64_t> ParseSize(const std::string& text);       // "512Mi", "2Gi", "1.5G", "4096"
Result<std::uint64_t> ParseDurationMs(const std::string& text);  // "30s", "5m", "1h", "250ms"

// Whether the env.pass entry `pattern` (a name, or a pattern with `*`
// spanning any run of characters) takes the variable `name`. A pattern
// never matches AGENTBOX_* (agentbox's own variables) nor the proxy
// variables (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY, NO_PROXY, lower-case too);
// a name matches itself.
bool EnvPatternMatch(std::string_view pattern, std::string_view name);

// Why no escalation grant may ever allow the syscall `name`, or nothing
// when one may: ptrace, process_vm_readv and process_vm_writev, which the
// seccomp layer denies outright and which reach only the sandbox's own
// processes (its pid namespace). Everything else that layer denies outright
// (mounts, namespaces, modules, kexec, io_uring, bpf, ...) would undo the
// sandbox, reach the host or open kernel code with a record of privilege
// escalations; a name it does not deny outright has nothing to grant.
std::optional<std::string> SyscallGrantProblem(std::string_view name);
// Whether the seccomp layer denies `name` whatever its arguments (a grant
// could name it, allowed or not); calls denied by their arguments (clone
// with namespace flags, socket families, set-id modes) are not.
bool SyscallDeniedOutright(std::string_view name);

// Paths no grant ever opens, whatever on_violation.max_grant says: the
// credential paths every confined preset denies (`~/.ssh`, `~/.aws`, ...,
// `**/.env`, /etc/shadow), as the preset writes them (`~` unexpanded).
const std::vector<std::string>& NeverGrantedPaths();

// Names, for reports and errors.
const char* ToString(Mode);
const char* ToString(Isolation);
const char* ToString(Requirement);
const char* ToString(Access);
const char* ToString(NetDefault);
const char* ToString(UnknownDomain);
const char* ToString(GitCredentials);
const char* ToString(ToolCredentials);
const char* ToString(ReportAs);
const char* ToString(Escalation);
const char* ToString(ShellMode);
std::optional<Mode> ParseMode(const std::string& name);

// The effective policy as YAML that ParsePolicy accepts again (round trip).
std::string ToYaml(const Policy& policy);

}  // namespace agentbox
