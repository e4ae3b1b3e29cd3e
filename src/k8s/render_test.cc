// `agentbox k8s render`: the mapping table row by row, the rendered stream
// validated against the agent-sandbox CRDs' OpenAPI v3 schemas
// (tests/fixtures/k8s, README there names the source), and secret values
// never in the output.
#include "k8s/render.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace agentbox::k8s {
namespace {

using nlohmann::json;

// --- YAML to JSON -------------------------------------------------------

// A plain scalar is typed as the YAML 1.2 core schema reads it; a quoted
// one is a string (yaml-cpp tags quoted scalars "!").
json ScalarToJson(const YAML::Node& node) {
  const std::string& text = node.Scalar();
  if (node.Tag() == "!") return text;
  if (text == "true") return true;
  if (text == "false") return false;
  if (text == "null" || text == "~" || text.empty()) return nullptr;
  static const std::regex kInt("^[-+]?[0-9]+$");
  static const std::regex kFloat(R"(^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$)");
  if (std::regex_match(text, kInt)) return std::stoll(text);
  if (std::regex_match(text, kFloat)) return std::stod(text);
  return text;
}

json YamlToJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      json out = json::object();
      for (const auto& kv : node) out[kv.first.Scalar()] = YamlToJson(kv.second);
      return out;
    }
    case YAML::NodeType::Sequence: {
      json out = json::array();
      for (const auto& item : node) out.push_back(YamlToJson(item));
      return out;
    }
    case YAML::NodeType::Scalar:
      return ScalarToJson(node);
    default:
      return nullptr;
  }
}

// --- The schemas --------------------------------------------------------

struct Crd {
  std::string group;
  std::string kind;
  json schema;  // the v1beta1 openAPIV3Schema
};

Crd LoadCrd(const std::string& file) {
  YAML::Node doc = YAML::LoadFile(std::string(AGENTBOX_FIXTURES) + "/k8s/" + file);
  Crd crd;
  crd.group = doc["spec"]["group"].Scalar();
  crd.kind = doc["spec"]["names"]["kind"].Scalar();
  for (const auto& version : doc["spec"]["versions"]) {
    if (version["name"].Scalar() == "v1beta1") crd.schema = YamlToJson(version["schema"]["openAPIV3Schema"]);
  }
  return crd;
}

// Parsed once: the template's CRD is 400 kB of YAML.
const std::map<std::string, Crd>& Crds() {
  static const std::map<std::string, Crd> crds = [] {
    std::map<std::string, Crd> out;
    for (const char* file : {"extensions.agents.x-k8s.io_sandboxtemplates.yaml",
                             "extensions.agents.x-k8s.io_sandboxwarmpools.yaml",
                             "extensions.agents.x-k8s.io_sandboxclaims.yaml"}) {
      Crd crd = LoadCrd(file);
      out[crd.kind] = crd;
    }
    return out;
  }();
  return crds;
}

// --- The validator (the OpenAPI v3 subset the CRDs use) ---------------

class Validator {
 public:
  std::vector<std::string> errors;

  void Check(const json& value, const json& schema, const std::string& path) {
    if (schema.contains("anyOf")) {
      bool any = false;
      for (const json& alternative : schema["anyOf"]) {
        Validator v;
        v.Check(value, alternative, path);
        any = any || v.errors.empty();
      }
      if (!any) Error(path, "matches none of anyOf");
    }
    if (schema.value("x-kubernetes-int-or-string", false) && !value.is_number_integer() && !value.is_string()) {
      Error(path, "is neither an integer nor a string");
    }
    if (schema.contains("enum")) {
      bool found = false;
      for (const json& allowed : schema["enum"]) found = found || allowed == value;
      if (!found) Error(path, "value " + value.dump() + " is not in enum " + schema["enum"].dump());
    }
    if (schema.contains("type") && !CheckType(value, schema["type"].get<std::string>(), path)) return;
    if (value.is_number_integer() && schema.contains("format")) CheckIntFormat(value, schema["format"], path);
    if (value.is_number() && schema.contains("minimum") && value.get<double>() < schema["minimum"].get<double>()) {
      Error(path, "is below the minimum " + schema["minimum"].dump());
    }
    if (value.is_string()) CheckString(value.get<std::string>(), schema, path);
    if (value.is_object()) CheckObject(value, schema, path);
    if (value.is_array()) CheckArray(value, schema, path);
  }

 private:
  void Error(const std::string& path, const std::string& what) { errors.push_back(path + ": " + what); }

  bool CheckType(const json& value, const std::string& type, const std::string& path) {
    bool ok = (type == "object" && value.is_object()) || (type == "array" && value.is_array()) ||
              (type == "string" && value.is_string()) || (type == "integer" && value.is_number_integer()) ||
              (type == "number" && value.is_number()) || (type == "boolean" && value.is_boolean());
    if (!ok) Error(path, "expected " + type + ", got " + value.dump());
    return ok;
  }

  void CheckIntFormat(const json& value, const json& format, const std::string& path) {
    const long long n = value.get<long long>();
    if (format == "int32" && (n < INT32_MIN || n > INT32_MAX)) Error(path, "is out of int32 range");
  }

  void CheckString(const std::string& s, const json& schema, const std::string& path) {
    if (schema.contains("pattern") && !std::regex_search(s, std::regex(schema["pattern"].get<std::string>()))) {
      Error(path, "\"" + s + "\" does not match " + schema["pattern"].get<std::string>());
    }
    if (schema.contains("maxLength") && s.size() > schema["maxLength"].get<std::size_t>()) Error(path, "too long");
    if (schema.contains("minLength") && s.size() < schema["minLength"].get<std::size_t>()) Error(path, "too short");
  }

  // An unknown field is an error: the API server would prune it, and a
  // setting silently dropped on the cluster is the failure looked for.
  void CheckObject(const json& value, const json& schema, const std::string& path) {
    for (const json& name : schema.value("required", json::array())) {
      if (!value.contains(name.get<std::string>())) Error(path, "missing required field " + name.get<std::string>());
    }
    const bool preserve = schema.value("x-kubernetes-preserve-unknown-fields", false);
    for (const auto& [key, child] : value.items()) {
      const std::string at = path + "." + key;
      if (schema.contains("properties") && schema["properties"].contains(key)) {
        Check(child, schema["properties"][key], at);
      } else if (schema.contains("additionalProperties") && schema["additionalProperties"].is_object()) {
        Check(child, schema["additionalProperties"], at);
      } else if (!preserve && (schema.contains("properties") || schema.contains("additionalProperties"))) {
        Error(at, "unknown field");
      }
    }
  }

  void CheckArray(const json& value, const json& schema, const std::string& path) {
    for (std::size_t i = 0; i < value.size(); ++i) {
      if (schema.contains("items")) Check(value[i], schema["items"], path + "[" + std::to_string(i) + "]");
    }
    // listType map: the list-map-keys identify an item; set: the items.
    const std::string list_type = schema.value("x-kubernetes-list-type", "");
    std::set<std::string> seen;
    for (const json& item : value) {
      std::string identity = item.dump();
      if (list_type == "map") {
        identity.clear();
        for (const json& key : schema.value("x-kubernetes-list-map-keys", json::array())) {
          identity += item.value(key.get<std::string>(), json()).dump() + "|";
        }
      } else if (list_type != "set") {
        continue;
      }
      if (!seen.insert(identity).second) Error(path, "duplicate item " + identity);
    }
  }
};

// Every object: its CRD found by group and kind, v1beta1, a namespaced
// name, and the schema's checks.
std::vector<std::string> ValidateObject(const json& object) {
  const std::string kind = object.value("kind", "");
  auto crd = Crds().find(kind);
  if (crd == Crds().end()) return {"no CRD for kind " + kind};
  std::vector<std::string> errors;
  if (object.value("apiVersion", "") != crd->second.group + "/v1beta1") {
    errors.push_back("apiVersion " + object.value("apiVersion", "") + " is not " + crd->second.group + "/v1beta1");
  }
  const json metadata = object.value("metadata", json::object());
  if (!metadata.contains("name") || !metadata.contains("namespace")) errors.push_back("metadata: no name or namespace");
  Validator v;
  v.Check(object, crd->second.schema, kind);
  errors.insert(errors.end(), v.errors.begin(), v.errors.end());
  return errors;
}

std::string Joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

// --- Fixtures -------------------------------------------------------------

Policy Parse(const std::string& yaml) {
  auto policy = ParsePolicy(yaml, "test.yaml");
  EXPECT_TRUE(policy.ok()) << policy.status().ToString();
  return policy.ok() ? *policy : Policy{};
}

const char* kRemote = R"(
version: 1
sandbox:
  isolation: remote
  remote:
    level: container
    kubernetes: {namespace: agents, template: coder}
)";

std::vector<json> MustRender(const Policy& policy, const RenderOptions& options = {}) {
  auto objects = Render(policy, options);
  EXPECT_TRUE(objects.ok()) << objects.status().ToString();
  return objects.ok() ? *objects : std::vector<json>{};
}

json TemplateOf(const std::vector<json>& objects) {
  for (const json& o : objects) {
    if (o["kind"] == "SandboxTemplate") return o;
  }
  ADD_FAILURE() << "no SandboxTemplate rendered";
  return json::object();
}

json PodOf(const std::vector<json>& objects) { return TemplateOf(objects)["spec"]["podTemplate"]["spec"]; }
json ContainerOf(const std::vector<json>& objects) { return PodOf(objects)["containers"][0]; }

// A policy that sets a key of every mapped row at once.
const char* kEverything = R"(
version: 1
sandbox:
  isolation: remote
  remote:
    level: os
    kubernetes: {namespace: agents, template: coder}
network:
  egress_proxy: true
  allow: ["github.com:443", "registry.npmjs.org:443", "10.1.2.3:5432", "example.org:8443"]
credentials:
  secrets:
    github: { from: { env: GH_TOKEN }, hosts: [github.com], placeholder_env: GITHUB_TOKEN }
    npm: { from: { file: /etc/agentbox/npm-token }, hosts: [registry.npmjs.org] }
resources:
  cpu: { guaranteed: 0.5, limit: 2 }
  memory_gib: { guaranteed: 0.5, limit: 2 }
  disk_gib: 4
  max_processes: 512
)";

// --- Schema validation ------------------------------------------------------

TEST(K8sRender, EveryObjectOfARichPolicyMatchesItsCrdSchema) {
  RenderOptions options;
  options.session = "s-0123abcd";
  auto objects = MustRender(Parse(kEverything), options);
  ASSERT_EQ(objects.size(), 3u);
  EXPECT_EQ(objects[0]["kind"], "SandboxTemplate");
  EXPECT_EQ(objects[1]["kind"], "SandboxWarmPool");
  EXPECT_EQ(objects[2]["kind"], "SandboxClaim");
  for (const json& o : objects) EXPECT_EQ(Joined(ValidateObject(o)), "") << o.dump(2);
}

TEST(K8sRender, TheYamlStreamReadsBackAsTheSameObjectsAndValidates) {
  RenderOptions options;
  options.session = "s-1";
  auto objects = MustRender(Parse(kEverything), options);
  const std::string yaml = ToYamlStream(objects);
  std::vector<YAML::Node> docs = YAML::LoadAll(yaml);
  ASSERT_EQ(docs.size(), objects.size()) << yaml;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    const json read = YamlToJson(docs[i]);
    EXPECT_EQ(read, objects[i]) << yaml;
    EXPECT_EQ(Joined(ValidateObject(read)), "");
  }
}

TEST(K8sRender, StringsThatLookLikeOtherScalarsAreQuoted) {
  const std::string yaml = ToYamlStream({json{{"a", "2"}, {"b", "yes"}, {"c", "on"}, {"d", ""}, {"e", "500m"},
                                              {"f", "-x"}, {"g", "plain"}, {"h", 2}, {"i", false}}});
  EXPECT_NE(yaml.find("a: \"2\""), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("b: \"yes\""), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("c: \"on\""), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("d: \"\""), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("e: \"500m\""), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("g: plain"), std::string::npos) << yaml;
  EXPECT_NE(ToYamlStream({json{{"cidr", "::/0"}}}).find("cidr: \"::/0\""), std::string::npos);
  EXPECT_NE(ToYamlStream({json{{"a", json::array()}, {"o", json::object()}}}).find("a: []\no: {}"),
            std::string::npos)
      << ToYamlStream({json{{"a", json::array()}, {"o", json::object()}}});
  EXPECT_NE(yaml.find("h: 2"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("i: false"), std::string::npos) << yaml;
}

// The validator must be able to fail: each of these is a plausible mistake.
TEST(K8sRender, TheValidatorRejectsWrongManifests) {
  auto objects = MustRender(Parse(kRemote), RenderOptions{.session = "s-1"});
  ASSERT_EQ(objects.size(), 3u);
  const json good_template = objects[0], good_pool = objects[1], good_claim = objects[2];
  ASSERT_EQ(Joined(ValidateObject(good_claim)), "");

  json claim = good_claim;  // the deprecated v1alpha1 shape
  claim["spec"].erase("warmPoolRef");
  claim["spec"]["sandboxTemplateRef"] = {{"name", "coder"}};
  std::string errors = Joined(ValidateObject(claim));
  EXPECT_NE(errors.find("missing required field warmPoolRef"), std::string::npos) << errors;
  EXPECT_NE(errors.find("SandboxClaim.spec.sandboxTemplateRef: unknown field"), std::string::npos) << errors;

  json pool = good_pool;
  pool["spec"]["replicas"] = "two";
  EXPECT_NE(Joined(ValidateObject(pool)).find("spec.replicas: expected integer"), std::string::npos);
  pool["spec"]["replicas"] = -1;
  EXPECT_NE(Joined(ValidateObject(pool)).find("below the minimum"), std::string::npos);

  json t = good_template;
  t["spec"]["networkPolicyManagement"] = "Sometimes";
  EXPECT_NE(Joined(ValidateObject(t)).find("not in enum"), std::string::npos);

  t = good_template;
  t["spec"]["podTemplate"]["spec"]["containers"][0]["resources"] = {{"limits", {{"cpu", "two cores"}}}};
  EXPECT_NE(Joined(ValidateObject(t)).find("does not match"), std::string::npos);

  t = good_template;
  t["spec"]["podTemplate"]["spec"]["containers"][0]["env"].push_back({{"name", "HOME"}, {"value", "/x"}});
  EXPECT_NE(Joined(ValidateObject(t)).find("duplicate item"), std::string::npos) << Joined(ValidateObject(t));

  t = good_template;
  t["spec"]["networkPolicy"]["egress"] = json::parse(R"([{"to": [{"ipBlock": {"except": ["10.0.0.0/8"]}}]}])");
  EXPECT_NE(Joined(ValidateObject(t)).find("missing required field cidr"), std::string::npos);

  t = good_template;  // a misspelt pod field would be pruned by the API server
  t["spec"]["podTemplate"]["spec"]["automountServiceAccountTokens"] = false;
  EXPECT_NE(Joined(ValidateObject(t)).find("podTemplate.spec.automountServiceAccountTokens: unknown field"),
            std::string::npos)
      << Joined(ValidateObject(t));

  t = good_template;
  t["spec"]["podTemplate"]["spec"]["containers"][0]["securityContext"]["procMount"] = 1;
  EXPECT_NE(Joined(ValidateObject(t)).find("procMount: expected string"), std::string::npos);

  t = good_template;
  t["apiVersion"] = "extensions.agents.x-k8s.io/v1alpha1";
  EXPECT_NE(Joined(ValidateObject(t)).find("is not extensions.agents.x-k8s.io/v1beta1"), std::string::npos);
}

// --- The mapping table, row by row --------------------------------------

TEST(K8sRender, NamesComeFromSandboxRemoteKubernetes) {
  auto objects = MustRender(Parse(kRemote));
  ASSERT_EQ(objects.size(), 2u);  // no --session: no claim
  EXPECT_EQ(objects[0]["metadata"]["name"], "coder");
  EXPECT_EQ(objects[0]["metadata"]["namespace"], "agents");
  EXPECT_EQ(objects[1]["metadata"]["name"], "coder");
  EXPECT_EQ(objects[1]["spec"]["sandboxTemplateRef"]["name"], "coder");
  EXPECT_EQ(objects[1]["spec"]["replicas"], 0);
}

TEST(K8sRender, WithoutRemoteNamesComeFromFlagsElseDefaults) {
  Policy policy = Parse("version: 1\n");
  auto objects = MustRender(policy);
  EXPECT_EQ(objects[0]["metadata"]["name"], kDefaultTemplateName);
  EXPECT_EQ(objects[0]["metadata"]["namespace"], kDefaultNamespace);
  objects = MustRender(policy, RenderOptions{.namespace_name = "ns1", .template_name = "t1"});
  EXPECT_EQ(objects[0]["metadata"]["name"], "t1");
  EXPECT_EQ(objects[0]["metadata"]["namespace"], "ns1");
}

TEST(K8sRender, AFlagThatContradictsThePolicyIsAnError) {
  auto objects = Render(Parse(kRemote), RenderOptions{.template_name = "other"});
  ASSERT_FALSE(objects.ok());
  EXPECT_NE(objects.status().message().find("--name other contradicts sandbox.remote.kubernetes.template (coder)"),
            std::string::npos)
      << objects.status().message();
  objects = Render(Parse(kRemote), RenderOptions{.namespace_name = "elsewhere"});
  ASSERT_FALSE(objects.ok());
  EXPECT_NE(objects.status().message().find("--namespace elsewhere contradicts"), std::string::npos);
  EXPECT_TRUE(Render(Parse(kRemote), RenderOptions{.template_name = "coder"}).ok());
  EXPECT_FALSE(Render(Parse("version: 1\n"), RenderOptions{.template_name = "Not_A_Label"}).ok());
}

TEST(K8sRender, LevelChoosesTheRuntimeClass) {
  auto pod_for = [](const char* level) {
    return PodOf(MustRender(Parse(std::string("version: 1\nsandbox:\n  isolation: remote\n  remote:\n    level: ") +
                                  level + "\n    kubernetes: {namespace: a, template: b}\n")));
  };
  EXPECT_EQ(pod_for("container")["runtimeClassName"], "gvisor");
  EXPECT_EQ(pod_for("microvm")["runtimeClassName"], "kata");
  EXPECT_FALSE(pod_for("os").contains("runtimeClassName"));
  // Without sandbox.remote, sandbox.isolation is the level.
  EXPECT_EQ(PodOf(MustRender(Parse("version: 1\nsandbox: {isolation: microvm}\n")))["runtimeClassName"], "kata");
}

TEST(K8sRender, NoPodForHostIsolationOrAnSshRemote) {
  auto host = Render(Parse("version: 1\nmode: danger-full-access\nsandbox: {isolation: host}\n"), {});
  ASSERT_FALSE(host.ok());
  EXPECT_NE(host.status().message().find("sandbox.isolation host"), std::string::npos);
  auto ssh = Render(Parse("version: 1\nsandbox:\n  isolation: remote\n  remote: {ssh: builder@example.org}\n"), {});
  ASSERT_FALSE(ssh.ok());
  EXPECT_NE(ssh.status().message().find("ssh host"), std::string::npos);
}

TEST(K8sRender, ThePodRunsServeWithoutAServiceAccountTokenAndWithWhatItsNamespacesNeed) {
  auto objects = MustRender(Parse(kRemote), RenderOptions{.image = "registry.example/agentbox:1"});
  const json pod = PodOf(objects);
  const json container = ContainerOf(objects);
  EXPECT_EQ(pod["automountServiceAccountToken"], false);
  EXPECT_EQ(pod["enableServiceLinks"], false);
  EXPECT_EQ(pod["hostUsers"], false);
  EXPECT_EQ(pod["securityContext"]["seccompProfile"]["type"], "Unconfined");
  EXPECT_EQ(pod["securityContext"]["appArmorProfile"]["type"], "Unconfined");
  EXPECT_EQ(pod["securityContext"]["runAsNonRoot"], true);
  EXPECT_EQ(container["securityContext"]["procMount"], "Unmasked");
  EXPECT_EQ(container["securityContext"]["allowPrivilegeEscalation"], false);
  EXPECT_EQ(container["securityContext"]["capabilities"]["drop"], json({"ALL"}));
  EXPECT_EQ(container["image"], "registry.example/agentbox:1");
  EXPECT_EQ(container["command"], json({"agentbox", "serve", "--state-dir", kStateDir, "--grace", "10s"}));
  EXPECT_EQ(pod["terminationGracePeriodSeconds"], kServeGraceSeconds + kStopMarginSeconds);
  EXPECT_EQ(ContainerOf(MustRender(Parse(kRemote)))["image"], DefaultImage());
  const json spec = TemplateOf(objects)["spec"];
  EXPECT_EQ(spec["envVarsInjectionPolicy"], "Disallowed");
  EXPECT_EQ(spec["volumeClaimTemplatesPolicy"], "Disallowed");
  EXPECT_EQ(spec["networkPolicyManagement"], "Managed");
}

TEST(K8sRender, ResourcesMapToRequestsAndLimits) {
  const json resources = ContainerOf(MustRender(Parse(kEverything)))["resources"];
  EXPECT_EQ(resources, json::parse(R"({
    "requests": {"cpu": "500m", "memory": "512Mi"},
    "limits": {"cpu": "2", "memory": "2Gi", "ephemeral-storage": "4Gi"}
  })"));
  // max_processes has no pod field: nothing is invented for it.
  EXPECT_EQ(resources.dump().find("512\""), std::string::npos);
  EXPECT_FALSE(ContainerOf(MustRender(Parse(kRemote))).contains("resources"));
}

TEST(K8sRender, Quantities) {
  EXPECT_EQ(CpuQuantity(2), "2");
  EXPECT_EQ(CpuQuantity(1.5), "1500m");
  EXPECT_EQ(CpuQuantity(0.0001), "1m");
  EXPECT_EQ(ByteQuantity(1ULL << 30), "1Gi");
  EXPECT_EQ(ByteQuantity(3ULL << 29), "1536Mi");
  EXPECT_EQ(ByteQuantity(1000), "1000");
  EXPECT_EQ(ByteQuantity(4ULL << 40), "4Ti");
}

TEST(K8sRender, NoNetworkMeansNoEgressAndNoIngress) {
  const json np = TemplateOf(MustRender(Parse(kRemote)))["spec"]["networkPolicy"];
  EXPECT_EQ(np, json::parse(R"({"ingress": [], "egress": []})"));
}

TEST(K8sRender, AllowedPortsAndAddressBlocksBecomeEgressRulesWithDns) {
  const json egress = TemplateOf(MustRender(Parse(kEverything)))["spec"]["networkPolicy"]["egress"];
  ASSERT_EQ(egress.size(), 3u) << egress.dump(2);
  // DNS to the cluster's resolver.
  EXPECT_EQ(egress[0]["to"][0]["podSelector"]["matchLabels"]["k8s-app"], "kube-dns");
  EXPECT_EQ(egress[0]["ports"], json::parse(R"([{"protocol":"UDP","port":53},{"protocol":"TCP","port":53}])"));
  // Names: public addresses, on the allowed ports only.
  EXPECT_EQ(egress[1]["ports"], json::parse(R"([{"protocol":"TCP","port":443},{"protocol":"TCP","port":8443}])"));
  EXPECT_EQ(egress[1]["to"][0]["ipBlock"]["cidr"], "0.0.0.0/0");
  EXPECT_NE(egress[1]["to"][0]["ipBlock"]["except"].dump().find("169.254.0.0/16"), std::string::npos);
  EXPECT_EQ(egress[1]["to"][1]["ipBlock"]["cidr"], "::/0");
  // An IP entry: exactly that address, on its port.
  EXPECT_EQ(egress[2], json::parse(R"({"to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}],
                                       "ports": [{"protocol": "TCP", "port": 5432}]})"));
}

TEST(K8sRender, AnyPortWhenANameHasNoPortOrTheDefaultIsAllow) {
  auto egress_of = [](const std::string& network) {
    const json t = TemplateOf(MustRender(Parse(std::string(kRemote) + "network:\n" + network)));
    return t["spec"]["networkPolicy"]["egress"];
  };
  json egress = egress_of("  allow: [github.com, localhost]\n");
  ASSERT_EQ(egress.size(), 2u) << egress.dump(2);  // DNS, public any port; localhost adds nothing
  EXPECT_FALSE(egress[1].contains("ports"));
  egress = egress_of("  default: allow\n");
  ASSERT_EQ(egress.size(), 2u) << egress.dump(2);
  EXPECT_FALSE(egress[1].contains("ports"));
  egress = egress_of("  allow: [\"192.168.0.0/16\"]\n");
  ASSERT_EQ(egress.size(), 1u) << egress.dump(2);  // no names: no DNS
  EXPECT_EQ(egress[0], json::parse(R"({"to":[{"ipBlock":{"cidr":"192.168.0.0/16"}}]})"));
}

TEST(K8sRender, EnvSecretsBecomeSecretKeyRefsAndFileSecretsASecretVolume) {
  RenderOptions options;
  options.secret_name = "team-tokens";
  auto objects = MustRender(Parse(kEverything), options);
  const json container = ContainerOf(objects);
  const json pod = PodOf(objects);
  json github;
  for (const json& e : container["env"]) {
    if (e["name"] == "GH_TOKEN") github = e;
  }
  EXPECT_EQ(github, json::parse(R"({"name": "GH_TOKEN",
                                    "valueFrom": {"secretKeyRef": {"name": "team-tokens", "key": "github"}}})"));
  EXPECT_FALSE(github.contains("value"));
  json volume, mount;
  for (const json& v : pod["volumes"]) {
    if (v.contains("secret")) volume = v;
  }
  for (const json& m : container["volumeMounts"]) {
    if (m["mountPath"] == "/etc/agentbox/npm-token") mount = m;
  }
  EXPECT_EQ(volume["secret"]["secretName"], "team-tokens");
  EXPECT_EQ(volume["secret"]["items"], json::parse(R"([{"key":"npm","path":"npm"}])"));
  EXPECT_EQ(mount["subPath"], "npm");
  EXPECT_EQ(mount["readOnly"], true);
  EXPECT_EQ(mount["name"], volume["name"]);
  // The default Secret name.
  EXPECT_EQ(ContainerOf(MustRender(Parse(kEverything)))["env"][1]["valueFrom"]["secretKeyRef"]["name"],
            "coder-credentials");
}

TEST(K8sRender, ACommandSourcedSecretIsAnErrorNamingIt) {
  auto objects = Render(Parse(std::string(kRemote) + R"(
network: {allow: ["api.example.com:443"]}
credentials:
  secrets:
    vault_token: { from: { command: [vault, read, -field=token, secret/x] }, hosts: [api.example.com] }
)"),
                        {});
  ASSERT_FALSE(objects.ok());
  EXPECT_NE(objects.status().message().find("credentials.secrets.vault_token"), std::string::npos)
      << objects.status().message();
  EXPECT_NE(objects.status().message().find("command"), std::string::npos);
}

TEST(K8sRender, ASessionGetsAClaimOnTheWarmPool) {
  auto objects = MustRender(Parse(kRemote), RenderOptions{.session = "s-0a1b2c"});
  ASSERT_EQ(objects.size(), 3u);
  EXPECT_EQ(objects[2]["metadata"]["name"], "coder-s-0a1b2c");
  EXPECT_EQ(objects[2]["metadata"]["namespace"], "agents");
  EXPECT_EQ(objects[2]["metadata"]["labels"]["agentbox/session"], "s-0a1b2c");
  EXPECT_EQ(objects[2]["metadata"]["labels"]["agents.x-k8s.io/created-by"], "agentbox");
  EXPECT_EQ(*ClaimName("coder", "s-0a1b2c"), "coder-s-0a1b2c");
  EXPECT_FALSE(ClaimName("coder", std::string(60, 'a')).ok());  // past a DNS label's 63
  EXPECT_EQ(objects[2]["spec"], json::parse(R"({"warmPoolRef":{"name":"coder"}})"));
  auto bad = Render(Parse(kRemote), RenderOptions{.session = "S_1"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("session S_1"), std::string::npos);
}

// --- Secrets never in the output ------------------------------------------

// setenv changes the process: in a forked child (STYLE.md 10). The child
// reports what it found through its exit code.
TEST(K8sRender, ASecretValueNeverAppearsInTheOutput) {
  const std::string marker = "agentbox-marker-5f0c2a91d7";
  char dir_template[] = "/tmp/agentbox-k8s-render-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string file = std::string(dir_template) + "/token";
  std::ofstream(file) << marker << "\n";
  const std::string policy_yaml = std::string(kRemote) + "network: {allow: [\"github.com:443\"]}\n"
                                  "credentials:\n  secrets:\n"
                                  "    gh: { from: { env: AGENTBOX_TEST_GH_TOKEN }, hosts: [github.com] }\n"
                                  "    f: { from: { file: " + file + " }, hosts: [github.com] }\n";
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("AGENTBOX_TEST_GH_TOKEN", marker.c_str(), 1);
    auto policy = ParsePolicy(policy_yaml, "test.yaml");
    if (!policy.ok()) _exit(3);
    auto objects = Render(*policy, RenderOptions{.session = "s-1"});
    if (!objects.ok()) _exit(4);
    const std::string yaml = ToYamlStream(*objects);
    if (yaml.find("AGENTBOX_TEST_GH_TOKEN") == std::string::npos) _exit(5);  // the reference is there
    _exit(yaml.find(marker) == std::string::npos ? 0 : 6);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  std::remove(file.c_str());
  rmdir(dir_template);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: policy did not parse, 4: render failed, 5: no reference, 6: value leaked";
}

// --- kubectl, where there is one ---------------------------------------

std::string Which(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = dir + "/" + program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// kubectl's client-side dry run still asks the API server for the kinds'
// REST mappings, so it needs a cluster with the agent-sandbox CRDs.
TEST(K8sRender, KubectlClientDryRunAcceptsTheStream) {
  const std::string kubectl = Which("kubectl");
  if (kubectl.empty()) GTEST_SKIP() << "not applicable here: kubectl is not installed";
  if (std::system((kubectl + " get crd sandboxtemplates.extensions.agents.x-k8s.io >/dev/null 2>&1").c_str()) != 0) {
    GTEST_SKIP() << "not applicable here: no cluster with the agent-sandbox CRDs is reachable";
  }
  char path[] = "/tmp/agentbox-k8s-render-XXXXXX.yaml";
  const int fd = mkstemps(path, 5);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << ToYamlStream(MustRender(Parse(kEverything), RenderOptions{.session = "s-1"}));
  const int rc = std::system((kubectl + " apply --dry-run=client -f " + path + " >/dev/null").c_str());
  std::remove(path);
  EXPECT_EQ(rc, 0);
}

}  // namespace
}  // namespace agentbox::k8s
