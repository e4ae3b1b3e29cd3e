// Mode presets, command-line overrides and the YAML form of the effective
// policy. Parsing the file lives in parse.cc, units in units.cc.
#include "agentbox/policy.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>

#include "policy/checks.h"
#include "policy/sha256.h"

namespace agentbox {

using policy_internal::CredentialsInSandboxName;
using policy_internal::DomainList;
using policy_internal::DomainProblem;
using policy_internal::EnvNameProblem;
using policy_internal::EnvSecretProblem;
using policy_internal::EnvUse;
using policy_internal::FormatDurationMs;
using policy_internal::FormatNumber;
using policy_internal::FormatSize;
using policy_internal::SecretsModeProblem;

const char* ToString(Mode v) {
  switch (v) {
    case Mode::kReadOnly: return "read-only";
    case Mode::kWorkspaceWrite: return "workspace-write";
    case Mode::kDangerFullAccess: return "danger-full-access";
  }
  return "?";
}

const char* ToString(Isolation v) {
  switch (v) {
    case Isolation::kHost: return "host";
    case Isolation::kOs: return "os";
    case Isolation::kContainer: return "container";
    case Isolation::kMicrovm: return "microvm";
    case Isolation::kRemote: return "remote";
  }
  return "?";
}

const char* ToString(Requirement v) {
  switch (v) {
    case Requirement::kFull: return "full";
    case Requirement::kPartial: return "partial";
  }
  return "?";
}

const char* ToString(Access v) {
  switch (v) {
    case Access::kReadOnly: return "read-only";
    case Access::kReadWrite: return "read-write";
  }
  return "?";
}

const char* ToString(NetDefault v) {
  switch (v) {
    case NetDefault::kDeny: return "deny";
    case NetDefault::kAllow: return "allow";
  }
  return "?";
}

const char* ToString(UnknownDomain v) {
  switch (v) {
    case UnknownDomain::kDeny: return "deny";
    case UnknownDomain::kAsk: return "ask";
  }
  return "?";
}

const char* ToString(GitCredentials v) {
  switch (v) {
    case GitCredentials::kNone: return "none";
    case GitCredentials::kProxy: return "proxy";
  }
  return "?";
}

const char* ToString(ToolCredentials v) {
  switch (v) {
    case ToolCredentials::kNone: return "none";
    case ToolCredentials::kVaultProxy: return "vault_proxy";
  }
  return "?";
}

const char* ToString(ReportAs v) {
  switch (v) {
    case ReportAs::kSandboxDenial: return "sandbox_denial";
    case ReportAs::kTaskFailure: return "task_failure";
  }
  return "?";
}

const char* ToString(Escalation v) {
  switch (v) {
    case Escalation::kDeny: return "deny";
    case Escalation::kOneTimeApproval: return "one_time_approval";
  }
  return "?";
}

const char* ToString(ShellMode v) {
  switch (v) {
    case ShellMode::kFresh: return "fresh";
    case ShellMode::kPersistent: return "persistent";
  }
  return "?";
}

std::optional<Mode> ParseMode(const std::string& name) {
  for (Mode mode : {Mode::kReadOnly, Mode::kWorkspaceWrite, Mode::kDangerFullAccess}) {
    if (name == ToString(mode)) return mode;
  }
  return std::nullopt;
}

Policy PresetFor(Mode mode) {
  Policy p;
  p.mode = mode;
  if (mode == Mode::kDangerFullAccess) {
    // Confines nothing: the runtime also passes the whole environment.
    p.sandbox.isolation = Isolation::kHost;
    p.network.default_action = NetDefault::kAllow;
  } else {
    p.filesystem.workspace.access =
        mode == Mode::kReadOnly ? Access::kReadOnly : Access::kReadWrite;
    p.filesystem.read_only = {"/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"};
    // Where credentials usually live, plus the secrets files a project keeps.
    p.filesystem.deny = {"~/.ssh",   "~/.aws",   "~/.config/gcloud",   "~/.azure",
                         "~/.gnupg", "~/.netrc", "~/.git-credentials", "~/.docker/config.json",
                         "~/.kube",  "**/.env",  "/etc/shadow",        "/etc/gshadow"};
    // Writing these would run code outside the sandbox later (hooks) or
    // redirect where git talks to (config).
    p.filesystem.protect = {".git/hooks", ".git/config"};
    p.network.default_action = NetDefault::kDeny;
    p.env.pass = {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "SHELL"};
  }
  p.source = std::string("<preset ") + ToString(mode) + ">";
  // sha256 stays empty: PolicyDigest() derives it when a report needs it
  // (emitting YAML costs more than starting a sandbox).
  return p;
}

const std::vector<std::string>& NeverGrantedPaths() {
  static const std::vector<std::string> paths = PresetFor(Mode::kWorkspaceWrite).filesystem.deny;
  return paths;
}

namespace {

// The seccomp layer's outright denials (confine/seccomp_plan.cc), group by
// group, and whether a grant may lift them; seccomp_plan_test checks that
// the two lists stay in step.
struct DeniedGroup {
  const char* never;  // nullptr: a grant may allow them; else why not
  std::vector<std::string_view> syscalls;
};

const std::vector<DeniedGroup>& DeniedGroups() {
  static const std::vector<DeniedGroup> groups = {
      // Inside the sandbox's pid namespace these reach only its own processes.
      {nullptr, {"ptrace", "process_vm_readv", "process_vm_writev"}},
      {"its kernel code has a long record of privilege escalations, a way out of every namespace",
       {"bpf", "userfaultfd", "perf_event_open"}},
      {"mounts would change the mount plan the sandbox rests on",
       {"mount", "umount2", "pivot_root", "move_mount", "fsopen", "fsmount", "fsconfig", "fspick", "open_tree",
        "mount_setattr"}},
      {"new namespaces would leave the sandbox's own", {"unshare", "setns"}},
      {"kernel keyrings are not namespaced: they hold the host user's keys", {"keyctl", "add_key", "request_key"}},
      {"kernel modules change the host's kernel", {"init_module", "finit_module", "delete_module"}},
      {"it replaces or stops the host's kernel", {"kexec_load", "kexec_file_load", "reboot"}},
      {"swap is the host's", {"swapon", "swapoff"}},
      {"clocks are not namespaced: they are the host's",
       {"settimeofday", "clock_settime", "clock_adjtime", "adjtimex"}},
      {"io_uring would bypass the seccomp filter itself", {"io_uring_setup", "io_uring_enter", "io_uring_register"}},
      {"process accounting and disk quotas are host-wide", {"acct", "quotactl", "quotactl_fd"}},
      {"file handles open files by inode, around the mount plan", {"name_to_handle_at", "open_by_handle_at"}},
  };
  return groups;
}

const DeniedGroup* DeniedGroupOf(std::string_view name) {
  for (const DeniedGroup& g : DeniedGroups()) {
    if (std::find(g.syscalls.begin(), g.syscalls.end(), name) != g.syscalls.end()) return &g;
  }
  return nullptr;
}

}  // namespace

bool SyscallDeniedOutright(std::string_view name) { return DeniedGroupOf(name) != nullptr; }

std::optional<std::string> SyscallGrantProblem(std::string_view name) {
  const DeniedGroup* g = DeniedGroupOf(name);
  if (!g) {
    return std::string(name) + " is not a syscall the seccomp layer denies outright, so there is nothing to "
                               "grant (grantable: ptrace, process_vm_readv, process_vm_writev)";
  }
  if (!g->never) return std::nullopt;
  return std::string(name) + " is never granted: " + g->never;
}

std::string PolicyDigest(const Policy& policy) {
  if (!policy.sha256.empty()) return policy.sha256;
  // Granted syscalls are no policy key, so ToYaml leaves them out; a policy
  // with them is another policy all the same.
  std::string text = ToYaml(policy);
  for (const std::string& name : policy.granted.syscalls) text += "# granted syscall " + name + "\n";
  return Sha256Hex(text);
}

Result<Policy> ApplyOverrides(Policy policy, const PolicyOverrides& o, bool from_file) {
  auto flag_error = [](const std::string& flag, const std::string& what) {
    return Status::Error("policy", flag + ": " + what);
  };

  if (o.mode) {
    if (!from_file) {
      policy = PresetFor(*o.mode);
    } else {
      // The file's own settings stand; only what the mode itself implies
      // changes, and only in the narrowing direction for the workspace.
      policy.mode = *o.mode;
      if (*o.mode == Mode::kReadOnly) policy.filesystem.workspace.access = Access::kReadOnly;
      if (*o.mode == Mode::kDangerFullAccess) policy.sandbox.isolation = Isolation::kHost;
    }
    if (auto problem = SecretsModeProblem(policy.mode, policy.credentials)) return flag_error("--mode", *problem);
  }
  if (o.require) policy.sandbox.require = *o.require;

  for (const std::string& domain : o.allow_domains) {
    if (auto problem = DomainProblem(domain, DomainList::kAllow)) {
      return flag_error("--allow-domain", *problem);
    }
    auto& allow = policy.network.allow;
    if (std::find(allow.begin(), allow.end(), domain) == allow.end()) allow.push_back(domain);
  }

  ResourcesSpec& r = policy.resources;
  if (o.timeout_ms) {
    if (*o.timeout_ms == 0) return flag_error("--timeout", "must be > 0");
    if (*o.timeout_ms > kMaxDurationMs) return flag_error("--timeout", "is longer than the maximum, 168h");
    r.wall_clock_ms = *o.timeout_ms;
  }
  if (o.kill_grace_ms) {
    if (*o.kill_grace_ms == 0) return flag_error("--kill-grace", "must be > 0");
    if (*o.kill_grace_ms > kMaxDurationMs) return flag_error("--kill-grace", "is longer than the maximum, 168h");
    r.kill_grace_ms = *o.kill_grace_ms;
  }
  if (o.memory_bytes) {
    if (*o.memory_bytes == 0) return flag_error("--memory", "must be > 0");
    if (*o.memory_bytes > kMaxSizeBytes) return flag_error("--memory", "is larger than the maximum, 1024Ti");
    if (r.memory_guaranteed_bytes && *r.memory_guaranteed_bytes > *o.memory_bytes) {
      return flag_error("--memory", "must be ≥ the policy's guaranteed memory (" +
                                        FormatSize(*r.memory_guaranteed_bytes) + ")");
    }
    r.memory_limit_bytes = *o.memory_bytes;
  }
  if (o.max_processes) {
    if (*o.max_processes == 0) return flag_error("--max-processes", "must be ≥ 1");
    if (*o.max_processes > kMaxProcesses) {
      return flag_error("--max-processes", "is larger than the maximum, " + std::to_string(kMaxProcesses));
    }
    r.max_processes = *o.max_processes;
  }
  if (o.cpus) {
    if (!std::isfinite(*o.cpus) || *o.cpus <= 0) return flag_error("--cpus", "must be > 0");
    if (*o.cpus > kMaxCpus) return flag_error("--cpus", "is larger than the maximum, " + FormatNumber(kMaxCpus));
    if (r.cpu.guaranteed && *r.cpu.guaranteed > *o.cpus) {
      return flag_error("--cpus", "must be ≥ the policy's guaranteed cpu (" +
                                      FormatNumber(*r.cpu.guaranteed) + ")");
    }
    r.cpu.limit = *o.cpus;
  }

  for (const std::string& entry : o.env) {
    std::size_t eq = entry.find('=');
    std::string name = entry.substr(0, eq);
    if (auto problem = EnvNameProblem(name)) return flag_error("--env", *problem);
    // The file's own env was checked against its secrets when it was parsed.
    for (const SecretSpec& secret : policy.credentials.secrets) {
      EnvUse use = eq == std::string::npos ? EnvUse::kPass : EnvUse::kSet;
      if (auto problem = EnvSecretProblem(secret, policy.credentials.in_sandbox, name, use)) {
        return flag_error("--env", *problem);
      }
    }
    if (eq == std::string::npos) {
      auto& pass = policy.env.pass;
      if (std::find(pass.begin(), pass.end(), name) == pass.end()) pass.push_back(name);
      continue;
    }
    std::string value = entry.substr(eq + 1);
    auto& set = policy.env.set;
    auto it =
        std::find_if(set.begin(), set.end(), [&](const auto& kv) { return kv.first == name; });
    if (it != set.end()) {
      it->second = std::move(value);
    } else {
      set.emplace_back(std::move(name), std::move(value));
    }
  }

  // A file's digest names the text the user wrote; without a file, the
  // digest has to describe the effective policy, overrides included, and
  // PolicyDigest() derives it on demand.
  if (!from_file) policy.sha256.clear();
  return policy;
}

namespace {

// `quoted` keeps text exactly as it is where a plain scalar might not (argv).
void EmitList(YAML::Emitter& out, const char* key, const std::vector<std::string>& items, bool quoted = false) {
  out << YAML::Key << key << YAML::Value;
  if (items.empty()) {
    out << YAML::Flow;
  }
  out << YAML::BeginSeq;
  for (const std::string& item : items) {
    if (quoted) out << YAML::DoubleQuoted;
    out << item;
  }
  out << YAML::EndSeq;
}

// A secret as the file writes it: where its value comes from, never a value
// (the policy holds none).
void EmitSecret(YAML::Emitter& out, const SecretSpec& secret) {
  out << YAML::Key << secret.name << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "from" << YAML::Value << YAML::Flow << YAML::BeginMap;
  switch (secret.from.kind) {
    case SecretSource::Kind::kEnv: out << YAML::Key << "env" << YAML::Value << secret.from.env; break;
    case SecretSource::Kind::kFile: out << YAML::Key << "file" << YAML::Value << secret.from.file; break;
    case SecretSource::Kind::kCommand: EmitList(out, "command", secret.from.command, /*quoted=*/true); break;
  }
  out << YAML::EndMap;
  if (!secret.hosts.empty()) {  // none: a tools.upstream secret
    out << YAML::Key << "hosts" << YAML::Value << YAML::Flow << YAML::BeginSeq;
    for (const std::string& host : secret.hosts) out << host;
    out << YAML::EndSeq;
  }
  out << YAML::Key << "inject" << YAML::Value;
  const SecretInjection& inject = secret.inject;
  switch (inject.kind) {
    case SecretInjection::Kind::kHeader:
      out << YAML::Flow << YAML::BeginMap << YAML::Key << "header" << YAML::Value << inject.header << YAML::Key
          << "format" << YAML::Value << YAML::DoubleQuoted << inject.format << YAML::EndMap;
      break;
    case SecretInjection::Kind::kBasic:
      out << YAML::Flow << YAML::BeginMap << YAML::Key << "basic" << YAML::Value << YAML::BeginMap << YAML::Key
          << "username" << YAML::Value << YAML::DoubleQuoted << inject.username << YAML::EndMap << YAML::EndMap;
      break;
    case SecretInjection::Kind::kPlaceholder: out << "placeholder"; break;
  }
  if (!secret.placeholder_env.empty()) {
    out << YAML::Key << "placeholder_env" << YAML::Value << secret.placeholder_env;
  }
  out << YAML::EndMap;
}

void EmitCredentials(YAML::Emitter& out, const CredentialsSpec& c) {
  out << YAML::Key << "credentials" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "in_sandbox" << YAML::Value << CredentialsInSandboxName(c.in_sandbox);
  out << YAML::Key << "git" << YAML::Value;
  // The short form stands for a proxy without remotes, as the seed writes it.
  if (c.git_rules.remotes.empty()) {
    out << ToString(c.git);
  } else {
    out << YAML::BeginMap;
    EmitList(out, "remotes", c.git_rules.remotes);
    out << YAML::Key << "push" << YAML::Value << YAML::BeginMap;
    if (!c.git_rules.push.allow_refs.empty()) EmitList(out, "allow_refs", c.git_rules.push.allow_refs);
    out << YAML::Key << "deny_force" << YAML::Value << c.git_rules.push.deny_force;
    out << YAML::EndMap;
    out << YAML::EndMap;
  }
  out << YAML::Key << "tools" << YAML::Value << ToString(c.tools);
  out << YAML::Key << "secrets" << YAML::Value;
  if (c.secrets.empty()) out << YAML::Flow;
  out << YAML::BeginMap;
  for (const SecretSpec& secret : c.secrets) EmitSecret(out, secret);
  out << YAML::EndMap;
  out << YAML::EndMap;
}

// Durations with their units, so that they read back exactly.
void EmitSession(YAML::Emitter& out, const SessionSpec& s) {
  out << YAML::Key << "session" << YAML::Value << YAML::BeginMap;
  if (s.call_timeout_ms) out << YAML::Key << "call_timeout" << YAML::Value << FormatDurationMs(*s.call_timeout_ms);
  out << YAML::Key << "idle_timeout" << YAML::Value << FormatDurationMs(s.idle_timeout_ms);
  out << YAML::Key << "shell" << YAML::Value << ToString(s.shell);
  out << YAML::EndMap;
}

}  // namespace

std::string ToYaml(const Policy& p) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "version" << YAML::Value << p.version;
  out << YAML::Key << "mode" << YAML::Value << ToString(p.mode);

  out << YAML::Key << "sandbox" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "isolation" << YAML::Value << ToString(p.sandbox.isolation);
  out << YAML::Key << "require" << YAML::Value << ToString(p.sandbox.require);
  out << YAML::Key << "image" << YAML::Value << p.sandbox.image;
  out << YAML::Key << "fresh_per_task" << YAML::Value << p.sandbox.fresh_per_task;
  out << YAML::Key << "snapshot_on_exit" << YAML::Value << p.sandbox.snapshot_on_exit;
  if (p.sandbox.remote) {
    const RemoteSpec& r = *p.sandbox.remote;
    out << YAML::Key << "remote" << YAML::Value << YAML::BeginMap;
    if (!r.ssh.empty()) out << YAML::Key << "ssh" << YAML::Value << r.ssh;
    if (!r.ssh_config.empty()) out << YAML::Key << "ssh_config" << YAML::Value << r.ssh_config;
    out << YAML::Key << "level" << YAML::Value << ToString(r.level);
    if (!r.workspace.empty()) out << YAML::Key << "workspace" << YAML::Value << r.workspace;
    if (r.kubernetes) {
      out << YAML::Key << "kubernetes" << YAML::Value << YAML::BeginMap;
      out << YAML::Key << "namespace" << YAML::Value << r.kubernetes->namespace_name;
      out << YAML::Key << "template" << YAML::Value << r.kubernetes->template_name;
      if (!r.kubernetes->context.empty()) out << YAML::Key << "context" << YAML::Value << r.kubernetes->context;
      if (!r.kubernetes->kubeconfig.empty()) {
        out << YAML::Key << "kubeconfig" << YAML::Value << r.kubernetes->kubeconfig;
      }
      out << YAML::EndMap;
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;

  const FilesystemSpec& fs = p.filesystem;
  out << YAML::Key << "filesystem" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "workspace" << YAML::Value << YAML::BeginMap;
  // An empty path means "same as on the host", which the file expresses by
  // leaving the key out ("" is rejected as an empty path).
  if (!fs.workspace.path.empty()) out << YAML::Key << "path" << YAML::Value << fs.workspace.path;
  out << YAML::Key << "mode" << YAML::Value << ToString(fs.workspace.access);
  out << YAML::EndMap;
  EmitList(out, "read_only", fs.read_only);
  // Written only when given, so that the digest of a policy without them
  // stays what it was.
  if (!fs.read_write.empty()) EmitList(out, "read_write", fs.read_write);
  if (!fs.caches.empty()) {
    out << YAML::Key << "caches" << YAML::Value << YAML::BeginMap;
    for (const CacheSpec& cache : fs.caches) {
      out << YAML::Key << cache.name << YAML::Value;
      if (cache.host.empty()) {
        out << cache.path;
      } else {
        out << YAML::Flow << YAML::BeginMap << YAML::Key << "path" << YAML::Value << cache.path << YAML::Key
            << "host" << YAML::Value << cache.host << YAML::EndMap;
      }
    }
    out << YAML::EndMap;
  }
  EmitList(out, "deny", fs.deny);
  EmitList(out, "protect", fs.protect);
  EmitList(out, "unix_sockets", fs.unix_sockets);
  out << YAML::EndMap;

  const NetworkSpec& net = p.network;
  out << YAML::Key << "network" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "default" << YAML::Value << ToString(net.default_action);
  out << YAML::Key << "egress_proxy" << YAML::Value << net.egress_proxy;
  EmitList(out, "allow", net.allow);
  EmitList(out, "deny", net.deny);
  out << YAML::Key << "on_unknown_domain" << YAML::Value << ToString(net.on_unknown_domain);
  out << YAML::Key << "tls_sni_check" << YAML::Value << net.tls_sni_check;
  out << YAML::Key << "tls_sni_ports" << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (std::uint16_t port : net.tls_sni_ports) out << port;
  out << YAML::EndSeq;
  out << YAML::Key << "inspect_tls" << YAML::Value;
  if (net.inspect_tls_all || net.inspect_tls.empty()) {
    out << net.inspect_tls_all;
  } else {
    out << YAML::Flow << YAML::BeginSeq;
    for (const std::string& host : net.inspect_tls) out << host;
    out << YAML::EndSeq;
  }
  out << YAML::Key << "http_rules" << YAML::Value;
  if (net.http_rules.empty()) out << YAML::Flow;
  out << YAML::BeginSeq;
  for (const HttpRuleSpec& rule : net.http_rules) {
    out << YAML::BeginMap << YAML::Key << "host" << YAML::Value << rule.host;
    EmitList(out, "allow", rule.allow);
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
  out << YAML::EndMap;

  EmitCredentials(out, p.credentials);

  // Sizes and durations are written with units so that they read back
  // exactly; a bare number would mean GiB or minutes.
  const ResourcesSpec& r = p.resources;
  out << YAML::Key << "resources" << YAML::Value;
  bool any_resource = r.cpu.requested() || r.memory_guaranteed_bytes || r.memory_limit_bytes ||
                      r.disk_bytes || r.wall_clock_ms || r.kill_grace_ms || r.max_processes;
  if (!any_resource) out << YAML::Flow;
  out << YAML::BeginMap;
  if (r.cpu.requested()) {
    out << YAML::Key << "cpu" << YAML::Value << YAML::BeginMap;
    if (r.cpu.guaranteed) {
      out << YAML::Key << "guaranteed" << YAML::Value << FormatNumber(*r.cpu.guaranteed);
    }
    if (r.cpu.limit) out << YAML::Key << "limit" << YAML::Value << FormatNumber(*r.cpu.limit);
    out << YAML::EndMap;
  }
  if (r.memory_guaranteed_bytes || r.memory_limit_bytes) {
    out << YAML::Key << "memory_gib" << YAML::Value << YAML::BeginMap;
    if (r.memory_guaranteed_bytes) {
      out << YAML::Key << "guaranteed" << YAML::Value << FormatSize(*r.memory_guaranteed_bytes);
    }
    if (r.memory_limit_bytes) {
      out << YAML::Key << "limit" << YAML::Value << FormatSize(*r.memory_limit_bytes);
    }
    out << YAML::EndMap;
  }
  if (r.disk_bytes) out << YAML::Key << "disk_gib" << YAML::Value << FormatSize(*r.disk_bytes);
  if (r.wall_clock_ms) {
    out << YAML::Key << "wall_clock_min" << YAML::Value << FormatDurationMs(*r.wall_clock_ms);
  }
  if (r.kill_grace_ms) {
    out << YAML::Key << "kill_grace" << YAML::Value << FormatDurationMs(*r.kill_grace_ms);
  }
  if (r.max_processes) out << YAML::Key << "max_processes" << YAML::Value << *r.max_processes;
  out << YAML::EndMap;

  out << YAML::Key << "env" << YAML::Value << YAML::BeginMap;
  EmitList(out, "pass", p.env.pass);
  out << YAML::Key << "set" << YAML::Value;
  if (p.env.set.empty()) out << YAML::Flow;
  out << YAML::BeginMap;
  // Quoted so that `CI: "1"` reads as the string it is.
  for (const auto& [name, value] : p.env.set) {
    out << YAML::Key << name << YAML::Value << YAML::DoubleQuoted << value;
  }
  out << YAML::EndMap;
  out << YAML::EndMap;

  if (!p.home.import.empty()) {
    out << YAML::Key << "home" << YAML::Value << YAML::BeginMap;
    EmitList(out, "import", p.home.import);
    out << YAML::EndMap;
  }

  out << YAML::Key << "on_violation" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "report_as" << YAML::Value << ToString(p.on_violation.report_as);
  out << YAML::Key << "escalation" << YAML::Value << ToString(p.on_violation.escalation);
  // Only when given: the digests of policies without it stay as they were.
  const MaxGrantSpec& g = p.on_violation.max_grant;
  if (!g.network.empty() || !g.filesystem_read.empty() || !g.filesystem_write.empty() || !g.syscalls.empty() ||
      g.memory_bytes) {
    out << YAML::Key << "max_grant" << YAML::Value << YAML::BeginMap;
    if (!g.network.empty()) EmitList(out, "network", g.network, /*quoted=*/true);
    if (!g.filesystem_read.empty()) EmitList(out, "filesystem_read", g.filesystem_read);
    if (!g.filesystem_write.empty()) EmitList(out, "filesystem_write", g.filesystem_write);
    if (!g.syscalls.empty()) EmitList(out, "syscalls", g.syscalls);
    if (g.memory_bytes) out << YAML::Key << "memory_gib" << YAML::Value << FormatSize(*g.memory_bytes);
    out << YAML::EndMap;
  }
  out << YAML::EndMap;

  // Only when given: the digests of policies without it stay as they were.
  if (!p.diff.exclude.empty()) {
    out << YAML::Key << "diff" << YAML::Value << YAML::BeginMap;
    EmitList(out, "exclude", p.diff.exclude, /*quoted=*/true);
    out << YAML::EndMap;
  }
  EmitSession(out, p.session);
  // Only when given, as diff.
  if (!p.tools.upstream.empty() || p.tools.run_code.bash) {
    out << YAML::Key << "tools" << YAML::Value << YAML::BeginMap;
  }
  if (p.tools.run_code.bash) {
    out << YAML::Key << "run_code" << YAML::Value << YAML::BeginMap << YAML::Key << "bash" << YAML::Value << true
        << YAML::EndMap;
  }
  if (!p.tools.upstream.empty()) {
    out << YAML::Key << "upstream" << YAML::Value << YAML::BeginSeq;
    for (const UpstreamSpec& u : p.tools.upstream) {
      out << YAML::BeginMap << YAML::Key << "name" << YAML::Value << u.name;
      if (!u.command.empty()) EmitList(out, "command", u.command, /*quoted=*/true);
      if (!u.url.empty()) out << YAML::Key << "url" << YAML::Value << YAML::DoubleQuoted << u.url;
      if (!u.secret.empty()) {
        out << YAML::Key << "secret" << YAML::Value << u.secret;
        if (!u.command.empty()) out << YAML::Key << "secret_env" << YAML::Value << u.secret_env;
      }
      EmitList(out, "allow", u.allow, /*quoted=*/false);
      out << YAML::Key << "timeout" << YAML::Value << (std::to_string(u.timeout_ms) + "ms");
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
  }
  if (!p.tools.upstream.empty() || p.tools.run_code.bash) out << YAML::EndMap;

  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace agentbox
