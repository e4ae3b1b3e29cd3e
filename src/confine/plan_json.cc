// Plan <-> JSON, for `policy explain`, `wrap` and `agentbox __exec`.
#include <nlohmann/json.hpp>

#include "agentbox/plan.h"

namespace agentbox {
namespace {

using nlohmann::json;

constexpr std::pair<MountKind, const char*> kKinds[] = {
    {MountKind::kTmpfs, "tmpfs"},     {MountKind::kBind, "bind"},
    {MountKind::kProc, "proc"},       {MountKind::kDevpts, "devpts"},
    {MountKind::kDevice, "device"},   {MountKind::kSymlink, "symlink"},
    {MountKind::kMask, "mask"},       {MountKind::kProtect, "protect"},
    {MountKind::kPin, "pin"},         {MountKind::kReadOnly, "read-only"},
    {MountKind::kOverlay, "overlay"},  {MountKind::kFile, "file"},
    {MountKind::kDir, "dir"},
};

std::optional<MountKind> KindFromString(const std::string& s) {
  for (const auto& [k, n] : kKinds) {
    if (s == n) return k;
  }
  return std::nullopt;
}

using Kind = SeccompArgCheck::Kind;
constexpr std::pair<Kind, const char*> kCheckKinds[] = {
    {Kind::kAlways, "always"},         {Kind::kAnyBitSet, "any_bit_set"},
    {Kind::kLow32Equals, "low32_equals"}, {Kind::kMaskedEquals, "masked_equals"},
    {Kind::kLow32NotIn, "low32_not_in"},
};

// The terminator's part of the network plan: secret sources and rules,
// never a value.
json CredentialsToJson(const NetworkPlan& n) {
  const CredentialsSpec& c = n.credentials;
  json secrets = json::array();
  for (const auto& s : c.secrets) {
    const char* from = s.from.kind == SecretSource::Kind::kEnv    ? "env"
                       : s.from.kind == SecretSource::Kind::kFile ? "file"
                                                                  : "command";
    const char* inject = s.inject.kind == SecretInjection::Kind::kHeader  ? "header"
                         : s.inject.kind == SecretInjection::Kind::kBasic ? "basic"
                                                                          : "placeholder";
    secrets.push_back({{"name", s.name},
                       {"from", from},
                       {"env", s.from.env},
                       {"file", s.from.file},
                       {"command", s.from.command},
                       {"hosts", s.hosts},
                       {"inject", inject},
                       {"header", s.inject.header},
                       {"format", s.inject.format},
                       {"username", s.inject.username},
                       {"placeholder_env", s.placeholder_env}});
  }
  json rules = json::array();
  for (const auto& r : n.http_rules) rules.push_back({{"host", r.host}, {"allow", r.allow}});
  return {{"secrets", secrets},
          {"git_remotes", c.git_rules.remotes},
          {"git_allow_refs", c.git_rules.push.allow_refs},
          {"git_deny_force", c.git_rules.push.deny_force},
          {"http_rules", rules},
          {"ca_bundle", n.ca_bundle}};
}

void CredentialsFromJson(const json& j, NetworkPlan* n) {
  n->terminate = true;
  CredentialsSpec& c = n->credentials;
  for (const auto& o : j.at("secrets")) {
    SecretSpec s;
    s.name = o.at("name").get<std::string>();
    const std::string from = o.at("from").get<std::string>();
    s.from.kind = from == "env" ? SecretSource::Kind::kEnv
                  : from == "file" ? SecretSource::Kind::kFile
                                   : SecretSource::Kind::kCommand;
    s.from.env = o.value("env", "");
    s.from.file = o.value("file", "");
    s.from.command = o.value("command", std::vector<std::string>{});
    s.hosts = o.at("hosts").get<std::vector<std::string>>();
    const std::string inject = o.at("inject").get<std::string>();
    s.inject.kind = inject == "header" ? SecretInjection::Kind::kHeader
                    : inject == "basic" ? SecretInjection::Kind::kBasic
                                        : SecretInjection::Kind::kPlaceholder;
    s.inject.header = o.value("header", s.inject.header);
    s.inject.format = o.value("format", s.inject.format);
    s.inject.username = o.value("username", s.inject.username);
    s.placeholder_env = o.value("placeholder_env", "");
    c.secrets.push_back(std::move(s));
  }
  c.git_rules.remotes = j.value("git_remotes", std::vector<std::string>{});
  c.git_rules.push.allow_refs = j.value("git_allow_refs", std::vector<std::string>{});
  c.git_rules.push.deny_force = j.value("git_deny_force", false);
  for (const auto& r : j.at("http_rules")) {
    n->http_rules.push_back({r.at("host").get<std::string>(), r.at("allow").get<std::vector<std::string>>()});
  }
  n->ca_bundle = j.value("ca_bundle", "");
}

json LandlockToJson(const LandlockPlan& ll) {
  json rules = json::array();
  for (const auto& r : ll.rules) {
    json o = {{"path", r.path}, {"access", r.access}, {"why", r.why}};
    if (r.optional) o["optional"] = true;
    rules.push_back(o);
  }
  return {{"abi", ll.abi}, {"handled_fs", ll.handled_fs}, {"scoped", ll.scoped}, {"handled_net", ll.handled_net},
          {"connect_tcp_ports", ll.connect_tcp_ports}, {"rules", rules}, {"left_out", ll.left_out}, {"required", ll.required}};
}

LandlockPlan LandlockFromJson(const json& j) {
  LandlockPlan ll;
  ll.abi = j.at("abi").get<int>();
  ll.handled_fs = j.at("handled_fs").get<std::uint64_t>();
  ll.scoped = j.value("scoped", std::uint64_t{0});
  ll.handled_net = j.value("handled_net", std::uint64_t{0});
  ll.connect_tcp_ports = j.value("connect_tcp_ports", std::vector<std::uint16_t>{});
  for (const auto& o : j.at("rules")) {
    ll.rules.push_back({o.at("path").get<std::string>(), o.at("access").get<std::uint64_t>(),
                        o.value("optional", false), o.value("why", "")});
  }
  ll.left_out = j.value("left_out", std::vector<std::string>{});
  ll.required = j.value("required", true);
  return ll;
}

json SeccompToJson(const SeccompPlan& sp) {
  json rules = json::array();
  for (const auto& r : sp.rules) {
    const char* kind = "always";
    for (const auto& [k, n] : kCheckKinds) {
      if (k == r.when.kind) kind = n;
    }
    json o = {{"syscall", r.syscall},
              {"action", r.action == SeccompAction::kErrnoEnosys    ? "enosys"
                         : r.action == SeccompAction::kNotifyMediate ? "notify_mediate"
                                                                     : "notify_eperm"},
              {"why", r.why}};
    if (r.when.kind != Kind::kAlways) {
      o["when"] = {{"kind", kind}, {"arg", r.when.arg}, {"mask", r.when.mask}, {"value", r.when.value}};
      if (r.when.has_except) o["when"]["except"] = r.when.except;
      if (!r.when.values.empty()) o["when"]["values"] = r.when.values;
      if (r.when.has_also) {
        o["when"]["also"] = {{"arg", r.when.also_arg}, {"mask", r.when.also_mask}, {"value", r.when.also_value}};
      }
    }
    rules.push_back(o);
  }
  return {{"enabled", sp.enabled},
          {"refuse_foreign_arches", sp.refuse_foreign_arches},
          {"cache_dir", sp.cache_dir},
          {"rules", rules}};
}

Result<SeccompPlan> SeccompFromJson(const json& j) {
  SeccompPlan sp;
  sp.enabled = j.at("enabled").get<bool>();
  sp.refuse_foreign_arches = j.value("refuse_foreign_arches", true);
  sp.cache_dir = j.value("cache_dir", "");
  for (const auto& o : j.at("rules")) {
    SeccompRule r;
    r.syscall = o.at("syscall").get<std::string>();
    std::string action = o.at("action").get<std::string>();
    if (action != "enosys" && action != "notify_eperm" && action != "notify_mediate") {
      return Status::Error("plan", "unknown seccomp action " + action);
    }
    r.action = action == "enosys"           ? SeccompAction::kErrnoEnosys
               : action == "notify_mediate" ? SeccompAction::kNotifyMediate
                                            : SeccompAction::kNotifyEperm;
    r.why = o.value("why", "");
    if (o.contains("when")) {
      const json& w = o.at("when");
      std::string kind = w.at("kind").get<std::string>();
      bool known = false;
      for (const auto& [k, n] : kCheckKinds) {
        if (kind == n) {
          r.when.kind = k;
          known = true;
        }
      }
      if (!known) return Status::Error("plan", "unknown seccomp condition " + kind);
      r.when.arg = w.at("arg").get<unsigned>();
      r.when.mask = w.at("mask").get<std::uint64_t>();
      r.when.value = w.at("value").get<std::uint64_t>();
      if (w.contains("except")) {
        r.when.has_except = true;
        r.when.except = w.at("except").get<std::uint64_t>();
      }
      r.when.values = w.value("values", std::vector<std::uint64_t>{});
      if (w.contains("also")) {
        const json& a = w.at("also");
        r.when.has_also = true;
        r.when.also_arg = a.at("arg").get<unsigned>();
        r.when.also_mask = a.at("mask").get<std::uint64_t>();
        r.when.also_value = a.at("value").get<std::uint64_t>();
      }
    }
    sp.rules.push_back(std::move(r));
  }
  return sp;
}

}  // namespace

const char* ToString(Backend backend) {
  switch (backend) {
    case Backend::kNamespaces: return "linux-namespaces";
    case Backend::kLandlockOnly: return "landlock-only";
    case Backend::kGvisor: return "gvisor";
    case Backend::kMicrovm: return "microvm";
  }
  return "linux-namespaces";
}

const char* ToString(OverlayApply apply) {
  switch (apply) {
    case OverlayApply::kOnSuccess: return "on-success";
    case OverlayApply::kAlways: return "always";
    case OverlayApply::kNever: return "never";
  }
  return "?";
}

std::optional<OverlayApply> ParseOverlayApply(const std::string& text) {
  for (OverlayApply a : {OverlayApply::kOnSuccess, OverlayApply::kAlways, OverlayApply::kNever}) {
    if (text == ToString(a)) return a;
  }
  return std::nullopt;
}

const char* ToString(MountKind kind) {
  for (const auto& [k, n] : kKinds) {
    if (k == kind) return n;
  }
  return "?";
}

std::string PlanToJson(const Plan& plan, int indent) {
  json j;
  j["confined"] = plan.confined;
  j["backend"] = ToString(plan.backend);
  if (!plan.private_dir_parent.empty()) j["private_dir_parent"] = plan.private_dir_parent;
  if (!plan.private_dir.empty()) j["private_dir"] = plan.private_dir;
  j["argv"] = plan.argv;
  j["cwd"] = plan.cwd;
  j["hostname"] = plan.hostname;
  j["namespaces"] = plan.namespaces;
  j["uid"] = plan.uid;
  j["gid"] = plan.gid;
  json mounts = json::array();
  for (const auto& m : plan.mounts) {
    json o = {{"kind", ToString(m.kind)}, {"target", m.target}, {"why", m.why}};
    if (!m.source.empty()) o["source"] = m.source;
    if (m.read_only) o["read_only"] = true;
    if (m.optional) o["optional"] = true;
    if (!m.data.empty()) o["data"] = m.data;
    mounts.push_back(o);
  }
  j["mounts"] = mounts;
  json globs = json::array();
  for (const auto& g : plan.deny_globs) {
    globs.push_back({{"source_root", g.source_root},
                     {"target_root", g.target_root},
                     {"pattern_base", g.pattern_base},
                     {"patterns", g.patterns}});
  }
  j["deny_globs"] = globs;
  j["scan_cache_dir"] = plan.scan_cache_dir;
  j["protect_git"] = plan.protect_git;
  j["absent"] = plan.absent;
  j["unix_sockets"] = plan.unix_sockets;
  if (!plan.cache_dirs.empty()) j["cache_dirs"] = plan.cache_dirs;
  if (!plan.home_links.empty()) {
    json links = json::array();
    for (const auto& l : plan.home_links) {
      links.push_back({{"name", l.name}, {"target", l.target}, {"optional", l.optional}, {"why", l.why}});
    }
    j["home_links"] = links;
  }
  json set = json::array();
  for (const auto& [k, v] : plan.env.set) set.push_back({k, v});
  j["env"] = {{"pass_all", plan.env.pass_all}, {"pass", plan.env.pass}, {"set", set}};
  j["home"] = plan.home;
  j["workspace"] = {{"source", plan.workspace_source},
                    {"target", plan.workspace_target},
                    {"writable", plan.workspace_writable}};
  if (plan.workspace_overlay) {
    j["workspace"]["overlay"] = {{"lowers", plan.workspace_overlay->lowers},
                                 {"upper", plan.workspace_overlay->upper},
                                 {"work", plan.workspace_overlay->work}};
    if (plan.workspace_overlay->upper_fs_bytes) {
      j["workspace"]["overlay"]["upper_fs_bytes"] = plan.workspace_overlay->upper_fs_bytes;
      j["workspace"]["overlay"]["upper_seeded"] = plan.workspace_overlay->upper_seeded;
    }
    if (plan.workspace_overlay->tmpfs_bytes) {
      j["workspace"]["overlay"]["tmpfs_bytes"] = plan.workspace_overlay->tmpfs_bytes;
      j["workspace"]["overlay"]["apply"] = ToString(plan.workspace_overlay->apply);
    }
  }
  if (plan.workspace_quota) {
    j["workspace"]["quota"] = {{"device", plan.workspace_quota->device}, {"bytes", plan.workspace_quota->bytes}};
  }
  {
    const ResourceLimits& l = plan.limits;
    json lim = {{"nofile", l.nofile}};
    if (l.memory_max_bytes) lim["memory_max_bytes"] = *l.memory_max_bytes;
    if (l.memory_low_bytes) lim["memory_low_bytes"] = *l.memory_low_bytes;
    if (l.cpu_max_cores) lim["cpu_max_cores"] = *l.cpu_max_cores;
    if (l.cpu_weight_cores) lim["cpu_weight_cores"] = *l.cpu_weight_cores;
    if (l.pids_max) lim["pids_max"] = *l.pids_max;
    if (l.fsize_bytes) lim["fsize_bytes"] = *l.fsize_bytes;
    if (l.nproc) lim["nproc"] = *l.nproc;
    j["limits"] = lim;
  }
  j["landlock"] = LandlockToJson(plan.landlock);
  j["seccomp"] = SeccompToJson(plan.seccomp);
  {
    const NetworkPlan& n = plan.network;
    json net = {{"allow", n.allow},
                {"deny", n.deny},
                {"default", n.default_allow ? "allow" : "deny"},
                {"on_unknown_domain", n.ask_unknown ? "ask" : "deny"},
                {"tls_sni_check", n.sni_check},
                {"tls_sni_ports", n.sni_ports}};
    net["proxy"] = n.proxy ? json{{"http_port", n.proxy->http_port}, {"socks_port", n.proxy->socks_port}}
                           : json(nullptr);
    if (n.terminate) net["terminator"] = CredentialsToJson(n);
    net["broker"] = n.broker;
    net["dns_address"] = n.dns_address;
    net["inspect_tls_all"] = n.inspect_tls_all;
    net["inspect_tls"] = n.inspect_tls;
    j["network"] = net;
  }
  if (plan.timeout_ms) j["timeout_ms"] = *plan.timeout_ms;
  if (plan.tty) j["tty"] = true;
  j["denial_outcome"] = plan.denial_outcome;
  if (plan.escalation.offers) {
    const EscalationPlan& e = plan.escalation;
    json esc = {{"network", e.network},
                {"filesystem_read", e.filesystem_read},
                {"filesystem_write", e.filesystem_write},
                {"syscalls", e.syscalls},
                {"never", e.never},
                {"protect", e.protect}};
    if (e.memory_max_bytes) esc["memory_max_bytes"] = *e.memory_max_bytes;
    j["escalation"] = esc;
  }
  j["kill_grace_ms"] = plan.kill_grace_ms;
  j["nonce"] = plan.nonce;
  if (plan.gvisor) {
    j["gvisor"] = {{"runsc", plan.gvisor->runsc},       {"version", plan.gvisor->version},
                   {"platform", plan.gvisor->platform}, {"rootless", plan.gvisor->rootless},
                   {"state_parent", plan.gvisor->state_parent}, {"inside", plan.gvisor->inside}};
  }
  if (plan.microvm) {
    const MicrovmPlan& m = *plan.microvm;
    j["microvm"] = {{"qemu", m.qemu},           {"virtiofsd", m.virtiofsd},   {"kernel", m.kernel},
                    {"initramfs", m.initramfs}, {"accel", m.accel},           {"memory_mib", m.memory_mib},
                    {"vcpus", m.vcpus},         {"rootless", m.rootless},     {"state_parent", m.state_parent}};
  }
  if (plan.remote) {
    const RemotePlan& r = *plan.remote;
    j["remote"] = {{"ssh", r.ssh},           {"port", r.port},       {"ssh_config", r.ssh_config},
                   {"level", r.level},       {"workspace", r.workspace}, {"session", r.session},
                   {"policy_yaml", r.policy_yaml}, {"binary", r.binary},
                   {"k8s_namespace", r.k8s_namespace}, {"k8s_template", r.k8s_template},
                   {"k8s_context", r.k8s_context},     {"k8s_kubeconfig", r.k8s_kubeconfig},
                   {"k8s_claim", r.k8s_claim},         {"k8s_pod", r.k8s_pod}};
  }
  j["policy_sha256"] = plan.policy_sha256;
  return j.dump(indent);
}

Result<Plan> PlanFromJson(const std::string& text) {
  Plan plan;
  try {
    json j = json::parse(text);
    plan.confined = j.at("confined").get<bool>();
    const std::string backend = j.value("backend", std::string(ToString(Backend::kNamespaces)));
    if (backend == ToString(Backend::kLandlockOnly)) {
      plan.backend = Backend::kLandlockOnly;
    } else if (backend == ToString(Backend::kGvisor)) {
      plan.backend = Backend::kGvisor;
      const json& g = j.at("gvisor");
      plan.gvisor = GvisorPlan{g.at("runsc").get<std::string>(), g.at("version").get<std::string>(),
                               g.at("platform").get<std::string>(), g.at("rootless").get<bool>(),
                               g.at("state_parent").get<std::string>()};
      plan.gvisor->inside = g.value("inside", false);
    } else if (backend == ToString(Backend::kMicrovm)) {
      plan.backend = Backend::kMicrovm;
      const json& m = j.at("microvm");
      plan.microvm = MicrovmPlan{m.at("qemu").get<std::string>(),       m.at("virtiofsd").get<std::string>(),
                                 m.at("kernel").get<std::string>(),     m.at("initramfs").get<std::string>(),
                                 m.at("accel").get<std::string>(),      m.at("memory_mib").get<std::uint64_t>(),
                                 m.at("vcpus").get<unsigned>(),         m.at("rootless").get<bool>(),
                                 m.at("state_parent").get<std::string>()};
    } else if (backend != ToString(Backend::kNamespaces)) {
      return Status::Error("plan", "unknown backend " + backend);
    }
    if (j.contains("remote")) {
      const json& r = j.at("remote");
      plan.remote = RemotePlan{r.at("ssh").get<std::string>(),        r.at("port").get<std::string>(),
                               r.at("ssh_config").get<std::string>(), r.at("level").get<std::string>(),
                               r.at("workspace").get<std::string>(),  r.at("session").get<std::string>(),
                               r.at("policy_yaml").get<std::string>(), r.at("binary").get<std::string>(),
                               r.value("k8s_namespace", ""),         r.value("k8s_template", ""),
                               r.value("k8s_context", ""),           r.value("k8s_kubeconfig", ""),
                               r.value("k8s_claim", ""),             r.value("k8s_pod", "")};
    }
    plan.private_dir_parent = j.value("private_dir_parent", std::string());
    plan.private_dir = j.value("private_dir", std::string());
    plan.argv = j.at("argv").get<std::vector<std::string>>();
    plan.cwd = j.at("cwd").get<std::string>();
    plan.hostname = j.at("hostname").get<std::string>();
    plan.namespaces = j.at("namespaces").get<std::vector<std::string>>();
    plan.uid = j.at("uid").get<uid_t>();
    plan.gid = j.at("gid").get<gid_t>();
    for (const auto& o : j.at("mounts")) {
      MountOp m;
      auto kind = KindFromString(o.at("kind").get<std::string>());
      if (!kind) return Status::Error("plan", "unknown mount kind " + o.at("kind").dump());
      m.kind = *kind;
      m.target = o.at("target").get<std::string>();
      m.why = o.value("why", "");
      m.source = o.value("source", "");
      m.read_only = o.value("read_only", false);
      m.optional = o.value("optional", false);
      m.data = o.value("data", "");
      plan.mounts.push_back(std::move(m));
    }
    for (const auto& g : j.at("deny_globs")) {
      plan.deny_globs.push_back({g.at("source_root").get<std::string>(),
                                 g.at("target_root").get<std::string>(),
                                 g.value("pattern_base", ""),
                                 g.at("patterns").get<std::vector<std::string>>()});
    }
    plan.absent = j.at("absent").get<std::vector<std::string>>();
    plan.unix_sockets = j.value("unix_sockets", std::vector<std::string>{});
    plan.cache_dirs = j.value("cache_dirs", std::vector<std::string>{});
    if (j.contains("home_links")) {
      for (const auto& l : j.at("home_links")) {
        plan.home_links.push_back({l.at("name").get<std::string>(), l.at("target").get<std::string>(),
                                   l.value("optional", false), l.value("why", "")});
      }
    }
    plan.scan_cache_dir = j.value("scan_cache_dir", "");
    if (j.contains("protect_git")) plan.protect_git = j.at("protect_git").get<std::vector<std::string>>();
    const json& env = j.at("env");
    plan.env.pass_all = env.at("pass_all").get<bool>();
    plan.env.pass = env.at("pass").get<std::vector<std::string>>();
    for (const auto& kv : env.at("set")) {
      plan.env.set.emplace_back(kv.at(0).get<std::string>(), kv.at(1).get<std::string>());
    }
    plan.home = j.at("home").get<std::string>();
    const json& ws = j.at("workspace");
    plan.workspace_source = ws.at("source").get<std::string>();
    plan.workspace_target = ws.at("target").get<std::string>();
    plan.workspace_writable = ws.at("writable").get<bool>();
    if (ws.contains("overlay")) {
      const json& o = ws.at("overlay");
      plan.workspace_overlay = WorkspaceOverlay{o.at("lowers").get<std::vector<std::string>>(),
                                                o.at("upper").get<std::string>(), o.at("work").get<std::string>()};
      plan.workspace_overlay->upper_fs_bytes = o.value("upper_fs_bytes", std::uint64_t{0});
      plan.workspace_overlay->upper_seeded = o.value("upper_seeded", false);
      plan.workspace_overlay->tmpfs_bytes = o.value("tmpfs_bytes", std::uint64_t{0});
      if (o.contains("apply")) {
        auto apply = ParseOverlayApply(o.at("apply").get<std::string>());
        if (!apply) return Status::Error("plan", "workspace.overlay.apply: '" + o.at("apply").get<std::string>() + "' is not on-success, always or never");
        plan.workspace_overlay->apply = *apply;
      }
    }
    if (ws.contains("quota")) {
      plan.workspace_quota = WorkspaceQuotaPlan{ws.at("quota").at("device").get<std::string>(),
                                                ws.at("quota").at("bytes").get<std::uint64_t>()};
    }
    if (j.contains("limits")) {
      const json& lim = j.at("limits");
      ResourceLimits& l = plan.limits;
      auto u64 = [&](const char* k, std::optional<std::uint64_t>* out) {
        if (lim.contains(k)) *out = lim.at(k).get<std::uint64_t>();
      };
      auto dbl = [&](const char* k, std::optional<double>* out) {
        if (lim.contains(k)) *out = lim.at(k).get<double>();
      };
      u64("memory_max_bytes", &l.memory_max_bytes);
      u64("memory_low_bytes", &l.memory_low_bytes);
      dbl("cpu_max_cores", &l.cpu_max_cores);
      dbl("cpu_weight_cores", &l.cpu_weight_cores);
      u64("pids_max", &l.pids_max);
      u64("fsize_bytes", &l.fsize_bytes);
      u64("nproc", &l.nproc);
      l.nofile = lim.value("nofile", l.nofile);
    }
    // Absent: a plan without that layer (the enforcement report says so).
    if (j.contains("landlock")) plan.landlock = LandlockFromJson(j.at("landlock"));
    if (j.contains("seccomp")) {
      auto sp = SeccompFromJson(j.at("seccomp"));
      if (!sp.ok()) return sp.status();
      plan.seccomp = std::move(*sp);
    }
    if (j.contains("network")) {
      const json& n = j.at("network");
      plan.network.allow = n.value("allow", std::vector<std::string>{});
      plan.network.deny = n.value("deny", std::vector<std::string>{});
      plan.network.default_allow = n.value("default", std::string("deny")) == "allow";
      plan.network.ask_unknown = n.value("on_unknown_domain", std::string("deny")) == "ask";
      plan.network.sni_check = n.value("tls_sni_check", true);
      plan.network.sni_ports = n.value("tls_sni_ports", std::vector<std::uint16_t>{443});
      plan.network.broker = n.value("broker", false);
      plan.network.dns_address = n.value("dns_address", std::string());
      plan.network.inspect_tls_all = n.value("inspect_tls_all", false);
      plan.network.inspect_tls = n.value("inspect_tls", std::vector<std::string>{});
      if (n.contains("proxy") && n.at("proxy").is_object()) {
        plan.network.proxy = ProxyPorts{n.at("proxy").at("http_port").get<std::uint16_t>(),
                                        n.at("proxy").at("socks_port").get<std::uint16_t>()};
      }
      if (n.contains("terminator")) CredentialsFromJson(n.at("terminator"), &plan.network);
    }
    if (j.contains("timeout_ms")) plan.timeout_ms = j.at("timeout_ms").get<std::uint64_t>();
    plan.tty = j.value("tty", false);
    plan.kill_grace_ms = j.value("kill_grace_ms", plan.kill_grace_ms);
    plan.denial_outcome = j.value("denial_outcome", true);
    if (j.contains("escalation")) {
      const json& e = j.at("escalation");
      EscalationPlan& esc = plan.escalation;
      esc.offers = true;
      esc.network = e.at("network").get<std::vector<std::string>>();
      esc.filesystem_read = e.at("filesystem_read").get<std::vector<std::string>>();
      esc.filesystem_write = e.at("filesystem_write").get<std::vector<std::string>>();
      esc.syscalls = e.at("syscalls").get<std::vector<std::string>>();
      esc.never = e.at("never").get<std::vector<std::string>>();
      esc.protect = e.at("protect").get<std::vector<std::string>>();
      if (e.contains("memory_max_bytes")) esc.memory_max_bytes = e.at("memory_max_bytes").get<std::uint64_t>();
    }
    plan.nonce = j.at("nonce").get<std::string>();
    plan.policy_sha256 = j.value("policy_sha256", "");
  } catch (const std::exception& e) {
    return Status::Error("plan", std::string("malformed plan: ") + e.what());
  }
  return plan;
}

}  // namespace agentbox
