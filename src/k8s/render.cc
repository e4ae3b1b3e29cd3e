// The policy → agent-sandbox mapping (docs/kubernetes.md, "The mapping").
#include "k8s/render.h"

#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cmath>
#include <set>
#include <string_view>

#include "net/rules.h"
#include "policy/checks.h"

#ifndef AGENTBOX_VERSION
#define AGENTBOX_VERSION "dev"
#endif

namespace agentbox::k8s {
namespace {

using nlohmann::json;
using policy_internal::CheckKubernetesName;

constexpr const char* kRenderStage = "k8s render";
constexpr const char* kContainerName = "agentbox";

Status Fail(const std::string& message) { return Status::Error(kRenderStage, message); }

// A name from the policy, else from a flag, else the default. A flag that
// names something else than the policy is refused: rendering objects for
// another template than the one the policy claims from would go unnoticed
// until a claim failed on the cluster.
Result<std::string> PickName(const std::string& what, const std::string& flag_name, const std::string& from_policy,
                             const std::string& flag, const std::string& fallback) {
  if (!from_policy.empty() && !flag.empty() && flag != from_policy) {
    return Fail(flag_name + " " + flag + " contradicts sandbox.remote.kubernetes." + what + " (" + from_policy +
                ") in the policy");
  }
  std::string name = !from_policy.empty() ? from_policy : !flag.empty() ? flag : fallback;
  if (auto problem = CheckKubernetesName(name)) return Fail(what + ": " + *problem);
  return name;
}

// The addresses a host name may resolve to and still be dialled by the
// proxy (its address guard refuses the rest unless an IP entry admits
// them): public IPv4 and IPv6, without the private, link-local (metadata
// server), CGNAT and unique-local ranges. A NetworkPolicy cannot say
// "public" itself, so it is "everything except".
json PublicPeers() {
  return json::array({
      {{"ipBlock",
        {{"cidr", "0.0.0.0/0"},
         {"except", {"10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
                     "192.168.0.0/16"}}}}},
      {{"ipBlock", {{"cidr", "::/0"}, {"except", {"::1/128", "fc00::/7", "fe80::/10"}}}}},
  });
}

// Cluster DNS: the proxy resolves the names it is asked for with the pod's
// resolver, which is the cluster's DNS service. Selected by the labels the
// kube-dns and CoreDNS deployments carry in kube-system.
json DnsRule() {
  return {
      {"to",
       {{{"namespaceSelector", {{"matchLabels", {{"kubernetes.io/metadata.name", "kube-system"}}}}},
         {"podSelector", {{"matchLabels", {{"k8s-app", "kube-dns"}}}}}}}},
      {"ports", {{{"protocol", "UDP"}, {"port", 53}}, {{"protocol", "TCP"}, {"port", 53}}}},
  };
}

json TcpPorts(const std::set<std::uint16_t>& ports) {
  json out = json::array();
  for (std::uint16_t port : ports) out.push_back({{"protocol", "TCP"}, {"port", port}});
  return out;
}

// What the in-pod proxy may dial, collected from every key that can let a
// connection out: network.allow, the grants an escalation may add
// (max_grant.network, when escalation is offered), and tools.upstream URLs
// (the daemon dials those itself).
struct Upstreams {
  bool any_public_port = false;            // a name on any port, default: allow, or ask
  std::set<std::uint16_t> public_ports;    // names on these ports
  // IP and CIDR entries: exactly that block, on a port or any (0).
  std::vector<std::pair<std::string, std::uint16_t>> blocks;
};

Status AddEntry(const std::string& key, const std::string& entry, Upstreams& out) {
  auto rule = net::ParseRule(entry, net::ListKind::kAllow);
  if (!rule.ok()) return Fail(key + ": " + rule.status().message());
  switch (rule->kind) {
    case net::RuleKind::kLocalhost:
      return Status();  // loopback never leaves the pod
    case net::RuleKind::kAddress: {
      const std::string cidr = rule->network.ToString() + "/" + std::to_string(rule->prefix);
      out.blocks.emplace_back(cidr, rule->port);
      return Status();
    }
    case net::RuleKind::kAnyHost:
    case net::RuleKind::kExactHost:
    case net::RuleKind::kSuffix:
      if (rule->port == 0) {
        out.any_public_port = true;
      } else {
        out.public_ports.insert(rule->port);
      }
      return Status();
  }
  return Status();
}

Result<Upstreams> CollectUpstreams(const Policy& policy) {
  Upstreams out;
  const NetworkSpec& net = policy.network;
  if (net.default_action == NetDefault::kAllow || net.on_unknown_domain == UnknownDomain::kAsk) {
    out.any_public_port = true;
  }
  for (const std::string& entry : net.allow) {
    if (Status s = AddEntry("network.allow", entry, out); !s.ok()) return s;
  }
  if (policy.on_violation.escalation == Escalation::kOneTimeApproval) {
    for (const std::string& entry : policy.on_violation.max_grant.network) {
      if (Status s = AddEntry("on_violation.max_grant.network", entry, out); !s.ok()) return s;
    }
  }
  for (const UpstreamSpec& upstream : policy.tools.upstream) {
    if (upstream.url.empty()) continue;
    policy_internal::UpstreamUrl url;
    if (auto problem = policy_internal::ParseUpstreamUrl(upstream.url, url)) {
      return Fail("tools.upstream." + upstream.name + ".url: " + *problem);
    }
    const bool v6 = url.host.find(':') != std::string::npos;
    const std::string entry = (v6 ? "[" + url.host + "]" : url.host) + ":" + url.port;
    if (Status s = AddEntry("tools.upstream." + upstream.name + ".url", entry, out); !s.ok()) return s;
  }
  return out;
}

// The daemon's command line: state and sessions on the pod's emptyDir, the
// unix socket only (no TCP listener: clients reach the daemon through the
// API server's exec or port-forward, which no NetworkPolicy sees).
json ServeCommand() {
  return json::array({"agentbox", "serve", "--state-dir", kStateDir, "--grace",
                      std::to_string(kServeGraceSeconds) + "s"});
}

// What agentbox's own namespaces, mounts and seccomp filter need of the pod
// (docs/check.md, "Inside a container"): the runtime's default seccomp
// profile refuses unshare and mount, its AppArmor profile mounts, and its
// masked /proc makes the kernel refuse a fresh proc in a user namespace;
// Unmasked needs the pod in a user namespace of its own (hostUsers: false).
void AddConfinementNeeds(json& pod_spec, json& container) {
  pod_spec["hostUsers"] = false;
  pod_spec["securityContext"] = {
      {"runAsNonRoot", true},
      {"runAsUser", 1000},
      {"runAsGroup", 1000},
      {"fsGroup", 1000},
      {"seccompProfile", {{"type", "Unconfined"}}},
      {"appArmorProfile", {{"type", "Unconfined"}}},
  };
  container["securityContext"] = {
      {"allowPrivilegeEscalation", false},
      {"capabilities", {{"drop", {"ALL"}}}},
      {"procMount", "Unmasked"},
  };
}

Result<json> PodSpecFor(const Policy& policy, const Names& names, const std::string& image) {
  auto level = PodLevel(policy);
  if (!level.ok()) return level.status();
  auto secrets = SecretRefsFor(policy.credentials, names.secret_name);
  if (!secrets.ok()) return secrets.status();

  json container = {
      {"name", kContainerName},
      {"image", image},
      {"command", ServeCommand()},
  };
  json env = json::array({{{"name", "HOME"}, {"value", kStateDir}}});
  for (const json& e : secrets->env) {
    if (e["name"] == "HOME") return Fail("a secret read from $HOME: the pod's HOME is agentbox's state directory");
    env.push_back(e);
  }
  container["env"] = env;
  json resources = ResourcesFor(policy.resources);
  if (!resources.empty()) container["resources"] = resources;
  json mounts = json::array({
      {{"name", "state"}, {"mountPath", kStateDir}},
      {{"name", "workspace"}, {"mountPath", kWorkspaceDir}},
  });
  for (const json& m : secrets->volume_mounts) mounts.push_back(m);
  container["volumeMounts"] = mounts;

  json volumes = json::array({
      {{"name", "state"}, {"emptyDir", json::object()}},
      {{"name", "workspace"}, {"emptyDir", json::object()}},
  });
  for (const json& v : secrets->volumes) volumes.push_back(v);

  json pod = {
      {"automountServiceAccountToken", false},
      {"enableServiceLinks", false},
      {"terminationGracePeriodSeconds", kServeGraceSeconds + kStopMarginSeconds},
      {"volumes", volumes},
  };
  if (auto runtime = RuntimeClassFor(*level)) pod["runtimeClassName"] = *runtime;
  AddConfinementNeeds(pod, container);
  pod["containers"] = json::array({container});
  return pod;
}

json Metadata(const std::string& name, const std::string& namespace_name) {
  return {
      {"name", name},
      {"namespace", namespace_name},
      {"labels", {{"app.kubernetes.io/name", "agentbox"}, {"app.kubernetes.io/managed-by", "agentbox"}}},
  };
}

// YAML 1.1 readers (sigs.k8s.io/yaml among them) take these plain scalars
// for bools, nulls or numbers; a string that looks like one is quoted.
bool NeedsQuotes(const std::string& s) {
  static const std::set<std::string> kWords = {
      "y",   "Y",   "yes", "Yes", "YES", "n",    "N",    "no",   "No",    "NO",    "true",  "True", "TRUE",
      "false", "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF", "null", "Null", "NULL", "~", "",
  };
  if (kWords.count(s)) return true;
  // Digits, signs and dots start numbers; the punctuation YAML gives
  // meaning at the start of a scalar ("::/0", "*.example.com", "-x") is
  // quoted too rather than left to each reader's reading of it.
  const unsigned char c = static_cast<unsigned char>(s.front());
  return !(std::isalpha(c) || c == '/' || c == '_');
}

void Emit(YAML::Emitter& out, const json& value) {
  switch (value.type()) {
    case json::value_t::object:
      if (value.empty()) {  // "{}" on the key's line, not below it
        out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
        return;
      }
      out << YAML::BeginMap;
      for (const auto& [key, child] : value.items()) {
        out << YAML::Key << key << YAML::Value;
        Emit(out, child);
      }
      out << YAML::EndMap;
      return;
    case json::value_t::array:
      if (value.empty()) {
        out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
        return;
      }
      out << YAML::BeginSeq;
      for (const json& child : value) Emit(out, child);
      out << YAML::EndSeq;
      return;
    case json::value_t::string: {
      const std::string& s = value.get_ref<const std::string&>();
      if (NeedsQuotes(s)) out << YAML::DoubleQuoted;
      out << s;
      return;
    }
    case json::value_t::boolean:
      out << value.get<bool>();
      return;
    case json::value_t::number_integer:
      out << value.get<std::int64_t>();
      return;
    case json::value_t::number_unsigned:
      out << value.get<std::uint64_t>();
      return;
    case json::value_t::number_float:
      out << value.get<double>();
      return;
    default:
      out << YAML::Null;
      return;
  }
}

}  // namespace

std::string DefaultImage() { return std::string("agentbox:") + AGENTBOX_VERSION; }

Result<Names> ResolveNames(const Policy& policy, const RenderOptions& options) {
  KubernetesRemoteSpec from_policy;
  if (policy.sandbox.remote && policy.sandbox.remote->kubernetes) from_policy = *policy.sandbox.remote->kubernetes;
  Names names;
  auto ns = PickName("namespace", "--namespace", from_policy.namespace_name, options.namespace_name, kDefaultNamespace);
  if (!ns.ok()) return ns.status();
  names.namespace_name = *ns;
  auto name = PickName("template", "--name", from_policy.template_name, options.template_name, kDefaultTemplateName);
  if (!name.ok()) return name.status();
  names.template_name = *name;
  names.warm_pool_name = names.template_name;
  names.secret_name = options.secret_name.empty() ? names.template_name + "-credentials" : options.secret_name;
  if (auto problem = CheckKubernetesName(names.secret_name)) return Fail("secret name: " + *problem);
  return names;
}

Result<Isolation> PodLevel(const Policy& policy) {
  const SandboxSpec& sandbox = policy.sandbox;
  if (sandbox.remote) {
    if (!sandbox.remote->kubernetes) {
      return Fail("sandbox.remote names an ssh host (" + sandbox.remote->ssh + "), not a kubernetes cluster");
    }
    return sandbox.remote->level;
  }
  switch (sandbox.isolation) {
    case Isolation::kOs:
    case Isolation::kContainer:
    case Isolation::kMicrovm:
      return sandbox.isolation;
    default:
      return Fail(std::string("sandbox.isolation ") + ToString(sandbox.isolation) +
                  " has no pod to render: give os, container, microvm, or remote with kubernetes");
  }
}

std::optional<std::string> RuntimeClassFor(Isolation level) {
  switch (level) {
    case Isolation::kContainer:
      return "gvisor";
    case Isolation::kMicrovm:
      return "kata";
    default:
      return std::nullopt;
  }
}

std::string CpuQuantity(double cores) {
  // Kubernetes keeps millicores; a finer fraction would be rounded by the
  // API server anyway, and rounding up keeps a tiny request non-zero.
  const auto milli = static_cast<std::uint64_t>(std::ceil(cores * 1000.0 - 1e-9));
  if (milli % 1000 == 0) return std::to_string(milli / 1000);
  return std::to_string(milli) + "m";
}

std::string ByteQuantity(std::uint64_t bytes) {
  static const std::pair<std::uint64_t, const char*> kUnits[] = {
      {1ULL << 50, "Pi"}, {1ULL << 40, "Ti"}, {1ULL << 30, "Gi"}, {1ULL << 20, "Mi"}, {1ULL << 10, "Ki"}};
  for (const auto& [size, suffix] : kUnits) {
    if (bytes >= size && bytes % size == 0) return std::to_string(bytes / size) + suffix;
  }
  return std::to_string(bytes);
}

json ResourcesFor(const ResourcesSpec& r) {
  json requests = json::object();
  json limits = json::object();
  if (r.cpu.guaranteed) requests["cpu"] = CpuQuantity(*r.cpu.guaranteed);
  if (r.cpu.limit) limits["cpu"] = CpuQuantity(*r.cpu.limit);
  if (r.memory_guaranteed_bytes) requests["memory"] = ByteQuantity(*r.memory_guaranteed_bytes);
  if (r.memory_limit_bytes) limits["memory"] = ByteQuantity(*r.memory_limit_bytes);
  if (r.disk_bytes) limits["ephemeral-storage"] = ByteQuantity(*r.disk_bytes);
  json out = json::object();
  if (!requests.empty()) out["requests"] = requests;
  if (!limits.empty()) out["limits"] = limits;
  return out;
}

Result<json> NetworkPolicyFor(const Policy& policy) {
  auto upstreams = CollectUpstreams(policy);
  if (!upstreams.ok()) return upstreams.status();
  json egress = json::array();
  const bool public_names = upstreams->any_public_port || !upstreams->public_ports.empty();
  // The proxy resolves names; without names to reach, DNS stays shut too
  // (it would be a channel out of its own).
  if (public_names) egress.push_back(DnsRule());
  if (upstreams->any_public_port) {
    egress.push_back({{"to", PublicPeers()}});
  } else if (!upstreams->public_ports.empty()) {
    egress.push_back({{"to", PublicPeers()}, {"ports", TcpPorts(upstreams->public_ports)}});
  }
  for (const auto& [cidr, port] : upstreams->blocks) {
    json rule = {{"to", {{{"ipBlock", {{"cidr", cidr}}}}}}};
    if (port != 0) rule["ports"] = TcpPorts({port});
    egress.push_back(rule);
  }
  // No ingress rule: the daemon listens on a unix socket only.
  return json{{"ingress", json::array()}, {"egress", egress}};
}

Result<SecretRefs> SecretRefsFor(const CredentialsSpec& credentials, const std::string& secret_name) {
  SecretRefs out;
  for (const SecretSpec& secret : credentials.secrets) {
    const std::string key = "credentials.secrets." + secret.name;
    switch (secret.from.kind) {
      case SecretSource::Kind::kEnv:
        out.env.push_back({
            {"name", secret.from.env},
            {"valueFrom", {{"secretKeyRef", {{"name", secret_name}, {"key", secret.name}}}}},
        });
        break;
      case SecretSource::Kind::kFile: {
        // One volume per file: a subPath mount puts the key at the exact
        // path without hiding the rest of its directory. Volume names are
        // DNS labels; secret names may hold '_' and capitals.
        std::string volume = "secret-" + std::to_string(out.volumes.size());
        out.volumes.push_back({
            {"name", volume},
            {"secret", {{"secretName", secret_name}, {"items", {{{"key", secret.name}, {"path", secret.name}}}}}},
        });
        out.volume_mounts.push_back(
            {{"name", volume}, {"mountPath", secret.from.file}, {"subPath", secret.name}, {"readOnly", true}});
        break;
      }
      case SecretSource::Kind::kCommand:
        return Fail(key + ": from: command has no Kubernetes reference (a command runs where agentbox runs, "
                          "and its output would have to be copied into the manifest); store the value in the "
                          "Secret " + secret_name + " under the key " + secret.name +
                    " and read it with from: {env: VAR}");
    }
  }
  return out;
}

Result<std::vector<json>> Render(const Policy& policy, const RenderOptions& options) {
  auto names = ResolveNames(policy, options);
  if (!names.ok()) return names.status();
  auto pod = PodSpecFor(policy, *names, options.image.empty() ? DefaultImage() : options.image);
  if (!pod.ok()) return pod.status();
  auto network = NetworkPolicyFor(policy);
  if (!network.ok()) return network.status();
  if (options.warm_pool_replicas < 0) return Fail("--warm-pool-replicas must not be negative");

  std::vector<json> objects;
  json template_meta = Metadata(names->template_name, names->namespace_name);
  template_meta["annotations"] = {{"agentbox/policy-sha256", PolicyDigest(policy)}};
  objects.push_back({
      {"apiVersion", kApiVersion},
      {"kind", "SandboxTemplate"},
      {"metadata", template_meta},
      {"spec",
       {
           {"podTemplate",
            {{"metadata", {{"labels", {{"app.kubernetes.io/name", "agentbox"}}}}}, {"spec", *pod}}},
           {"networkPolicyManagement", "Managed"},
           {"networkPolicy", *network},
           // A claim may not change the pod: its environment holds the
           // secrets' references and its volumes the workspace.
           {"envVarsInjectionPolicy", "Disallowed"},
           {"volumeClaimTemplatesPolicy", "Disallowed"},
       }},
  });
  objects.push_back({
      {"apiVersion", kApiVersion},
      {"kind", "SandboxWarmPool"},
      {"metadata", Metadata(names->warm_pool_name, names->namespace_name)},
      {"spec",
       {{"replicas", options.warm_pool_replicas}, {"sandboxTemplateRef", {{"name", names->template_name}}}}},
  });
  if (!options.session.empty()) {
    auto claim = ClaimName(names->template_name, options.session);
    if (!claim.ok()) return claim.status();
    json meta = Metadata(*claim, names->namespace_name);
    meta["labels"]["agentbox/session"] = options.session;
    // agent-sandbox's own label for who created an object (api/v1beta1
    // CreatedByLabel); the API client labels its claims the same way.
    meta["labels"]["agents.x-k8s.io/created-by"] = "agentbox";
    objects.push_back({
        {"apiVersion", kApiVersion},
        {"kind", "SandboxClaim"},
        {"metadata", meta},
        {"spec", {{"warmPoolRef", {{"name", names->warm_pool_name}}}}},
    });
  }
  return objects;
}

Result<std::string> ClaimName(const std::string& template_name, const std::string& session) {
  const std::string claim = template_name + "-" + session;
  if (auto problem = CheckKubernetesName(claim)) return Fail("claim name for session " + session + ": " + *problem);
  return claim;
}

std::string ToYamlStream(const std::vector<json>& objects) {
  std::string out;
  for (const json& object : objects) {
    YAML::Emitter emitter;
    Emit(emitter, object);
    out += "---\n";
    out += emitter.c_str();
    out += "\n";
  }
  return out;
}

}  // namespace agentbox::k8s
