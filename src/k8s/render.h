// `agentbox k8s render`: a policy as kubernetes-sigs/agent-sandbox objects
// (docs/kubernetes.md has the mapping table this code implements).
//
// Pure functions from a parsed Policy to JSON objects of the published API
// (extensions.agents.x-k8s.io/v1beta1): no cluster, no files, no
// environment. A secret's value is never read here, so it cannot reach the
// output: a secret becomes a reference to a Kubernetes Secret, and one whose
// source has no reference (`from: {command: ...}`) is an error naming it.
// Thread-compatible; nothing is cached.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agentbox/policy.h"
#include "agentbox/status.h"

namespace agentbox::k8s {

// The API every object is rendered for: the storage version of the
// extensions CRDs at the commit named in tests/fixtures/k8s/README.md.
inline constexpr const char* kApiVersion = "extensions.agents.x-k8s.io/v1beta1";

// Defaults when neither sandbox.remote.kubernetes nor a flag names them.
inline constexpr const char* kDefaultNamespace = "default";
inline constexpr const char* kDefaultTemplateName = "agentbox";

// Where the pod keeps the daemon's state and the sessions' workspaces
// (emptyDir volumes: they go with the pod).
inline constexpr const char* kStateDir = "/var/lib/agentbox";
inline constexpr const char* kWorkspaceDir = "/workspace";
// serve's --grace; the pod's terminationGracePeriodSeconds leaves the
// daemon this plus kStopMarginSeconds to stop its sandboxes after SIGTERM.
inline constexpr int kServeGraceSeconds = 10;
inline constexpr int kStopMarginSeconds = 5;

struct RenderOptions {
  // Flags. Empty = sandbox.remote.kubernetes's value, else the default. A
  // flag that contradicts the policy is an error, never silently preferred.
  std::string namespace_name;
  std::string template_name;
  std::string image;        // "" = DefaultImage()
  std::string session;      // "" = no SandboxClaim
  std::string secret_name;  // "" = TEMPLATE + "-credentials"
  std::int32_t warm_pool_replicas = 0;
};

// "agentbox:VERSION": the image `agentbox k8s render` names by default.
std::string DefaultImage();

// The names every object uses, resolved from the policy and the flags.
struct Names {
  std::string namespace_name;
  std::string template_name;
  std::string warm_pool_name;  // = template_name: one pool per template
  std::string secret_name;
};
Result<Names> ResolveNames(const Policy& policy, const RenderOptions& options);

// The kernel boundary the pod's runtime gives (sandbox.remote.level, else
// sandbox.isolation): os, container or microvm. Anything else is an error.
Result<Isolation> PodLevel(const Policy& policy);

// spec.podTemplate.spec.runtimeClassName: "gvisor" for container, "kata"
// for microvm, none for os.
std::optional<std::string> RuntimeClassFor(Isolation level);

// A Kubernetes quantity: whole cores "2", else millicores "1500m"; bytes as
// "2Gi"/"512Mi"/"4Ki" when exact, else the plain number of bytes.
std::string CpuQuantity(double cores);
std::string ByteQuantity(std::uint64_t bytes);

// The container's `resources` ({requests, limits}); {} when the policy asks
// for nothing. max_processes, wall_clock and kill_grace have no place here
// (docs/kubernetes.md says who enforces them).
nlohmann::json ResourcesFor(const ResourcesSpec& resources);

// SandboxTemplate.spec.networkPolicy (ingress and egress rules; the
// controller adds the pod selector and both policy types). Egress is what
// the in-pod proxy may ever dial, by port and address block, plus DNS; a
// policy with no network gets no egress at all. Errors name the entry that
// does not parse.
Result<nlohmann::json> NetworkPolicyFor(const Policy& policy);

// credentials.secrets as references into the Secret `secret_name` (one key
// per secret, named as the secret): env-sourced ones as env entries with
// valueFrom.secretKeyRef, file-sourced ones as a read-only secret volume
// mounted at the file's path. A command source is an error naming it.
struct SecretRefs {
  nlohmann::json env = nlohmann::json::array();
  nlohmann::json volumes = nlohmann::json::array();
  nlohmann::json volume_mounts = nlohmann::json::array();
};
Result<SecretRefs> SecretRefsFor(const CredentialsSpec& credentials, const std::string& secret_name);

// A session's SandboxClaim name: TEMPLATE-SESSION, which must be a DNS
// label (the claim's Sandbox and pod are named after it).
Result<std::string> ClaimName(const std::string& template_name, const std::string& session);

// The objects, in apply order: SandboxTemplate, SandboxWarmPool, and a
// SandboxClaim when options.session is set.
Result<std::vector<nlohmann::json>> Render(const Policy& policy, const RenderOptions& options);

// The objects as one YAML stream ("---" between documents). A string that
// a YAML 1.1 reader would take for a number, a bool or null is quoted.
std::string ToYamlStream(const std::vector<nlohmann::json>& objects);

}  // namespace agentbox::k8s
