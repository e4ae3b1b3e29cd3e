// The Kubernetes API as a remote world needs it: a sandbox claimed from a
// cluster running kubernetes-sigs/agent-sandbox, and a byte stream to a
// process in its pod through the API server's exec subresource.
//
// The names below are the published API's (docs/kubernetes.md, "The world
// over the API", names the source files and commit they were read from):
//   SandboxClaim     extensions.agents.x-k8s.io/v1beta1, sandboxclaims
//   SandboxWarmPool  extensions.agents.x-k8s.io/v1beta1, sandboxwarmpools
//   Sandbox          agents.x-k8s.io/v1beta1, sandboxes
// A v1beta1 claim names a warm pool (spec.warmPoolRef), not a template:
// the client finds the pool serving the policy's template (ClaimedSandbox).
//
// Every request is its own TLS connection, verified against the
// kubeconfig's CA (kubeconfig.h); errors are Status values naming the
// server, the request and the API's own Status (code, reason, message).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "agentbox/policy.h"
#include "agentbox/status.h"
#include "k8s/exec_stream.h"
#include "k8s/kubeconfig.h"
#include "linux/fd.h"

namespace agentbox::k8s {

inline constexpr const char* kClaimGroupVersion = "extensions.agents.x-k8s.io/v1beta1";
inline constexpr const char* kSandboxGroupVersion = "agents.x-k8s.io/v1beta1";
// The Sandbox's annotation naming the pod adopted from a warm pool; without
// it the pod is named as the Sandbox (controllers/sandbox_controller.go,
// resolvePodName).
inline constexpr const char* kPodNameAnnotation = "agents.x-k8s.io/pod-name";

enum class Method { kGet, kPost, kDelete };

// One answer of the API server, whatever its status.
struct ApiResponse {
  int code = 0;
  nlohmann::json body;  // parsed JSON, null when the body was not JSON
  std::string text;     // the body as sent (the start of it for long ones)
};

// The Status object of a failed answer as one line: "HTTP 409 AlreadyExists:
// sandboxclaims... already exists" (or the body's start when it is none).
std::string DescribeFailure(const ApiResponse& r);

// Talks to one API server as one user. Thread-safe: the TLS settings are
// fixed at creation and every call has its own connection.
class ApiClient {
 public:
  // Builds the TLS context from `config` (CA, client certificate); a PEM
  // that does not load is an error naming the kubeconfig.
  static Result<std::unique_ptr<ApiClient>> Create(Kubeconfig config);
  ~ApiClient();
  ApiClient(const ApiClient&) = delete;
  ApiClient& operator=(const ApiClient&) = delete;

  const Kubeconfig& config() const { return config_; }
  // "https://HOST:PORT" for messages.
  std::string server() const;

  // One request to `path` (below the server's prefix, query included). A
  // non-2xx answer is a response too; only transport and TLS failures are
  // errors. `body`, when given, is sent as application/json.
  Result<ApiResponse> Call(Method method, const std::string& path, const nlohmann::json* body,
                           std::chrono::steady_clock::time_point deadline) const;

  // A watch (`path` with ?watch=1...): `on_event` gets each event object
  // ({type, object}) until it returns false, the server ends the stream or
  // the deadline passes (not an error: the caller looks again). A non-2xx
  // answer to the watch itself is an error with its Status.
  Status Watch(const std::string& path, std::chrono::steady_clock::time_point deadline,
               const std::function<bool(const nlohmann::json&)>& on_event) const;

  // Starts `argv` in `pod` (`container` "" = the pod's only container) with
  // stdin, stdout and stderr over a WebSocket (exec_stream.h). The upgrade
  // is done here, so a refusal (403, 404, 400) is this call's error.
  Result<std::unique_ptr<ExecStream>> Exec(const std::string& namespace_name, const std::string& pod,
                                           const std::string& container, const std::vector<std::string>& argv,
                                           ExecCallbacks callbacks, std::chrono::milliseconds connect_timeout) const;

 private:
  ApiClient() = default;
  Kubeconfig config_;
  std::unique_ptr<TlsContext> tls_;
};

// What a SandboxClaim's status says.
struct ClaimState {
  bool ready = false;          // condition Ready is True
  std::string sandbox;         // status.sandbox.name ("" = none bound yet)
  std::string ready_reason;    // the Ready condition's reason and message,
  std::string ready_message;   // for a claim that is not ready
  bool deleting = false;       // metadata.deletionTimestamp is set
};
ClaimState ClaimStateOf(const nlohmann::json& claim);

// The SandboxWarmPool a claim for `template_name` names: the pool called
// as the template (what `agentbox k8s render` makes) if it serves that
// template, else the only pool in the namespace whose
// spec.sandboxTemplateRef names it. None, or several without one named as
// the template: an error naming them.
Result<std::string> WarmPoolFor(const ApiClient& api, const std::string& namespace_name,
                                const std::string& template_name, std::chrono::steady_clock::time_point deadline);

// A session's sandbox: a SandboxClaim this object created and deletes.
//
// Irreversible: Claim creates the claim in the cluster, and Release deletes
// it, which makes the controller delete the Sandbox and its pod (with all
// they hold). Thread-safe; Exec may be called from several threads.
class ClaimedSandbox {
 public:
  // Creates the SandboxClaim `claim_name` in spec.namespace_name against
  // the warm pool serving spec.template_name (WarmPoolFor), waits until its
  // Ready condition is True (at most `ready_timeout`, watching the claim),
  // and learns the pod from its Sandbox. On any failure after the create,
  // the claim is deleted before the error returns. A claim of that name
  // that exists already is an error (409), never adopted.
  static Result<std::unique_ptr<ClaimedSandbox>> Claim(const KubernetesRemoteSpec& spec,
                                                       const std::string& claim_name,
                                                       std::chrono::milliseconds ready_timeout);
  // The same with a client made by the caller (tests, a shared client).
  static Result<std::unique_ptr<ClaimedSandbox>> Claim(std::shared_ptr<const ApiClient> api,
                                                       const KubernetesRemoteSpec& spec,
                                                       const std::string& claim_name,
                                                       std::chrono::milliseconds ready_timeout);
  // A claim this agentbox created before it stopped (a session's log names
  // it, and the uid it had): bound again when it is still there, labelled
  // as agentbox's, with that uid, and Ready, so its pod (and what the
  // session left in it) serves the session again. not_found when it is
  // gone, or is not agentbox's or not that claim (then nothing is deleted).
  // One that is ours but never becomes Ready is deleted.
  static Result<std::unique_ptr<ClaimedSandbox>> Resume(const KubernetesRemoteSpec& spec,
                                                        const std::string& claim_name, const std::string& uid,
                                                        std::chrono::milliseconds ready_timeout);
  // Release()s; an error there is lost (call Release to see it).
  ~ClaimedSandbox();
  ClaimedSandbox(const ClaimedSandbox&) = delete;
  ClaimedSandbox& operator=(const ClaimedSandbox&) = delete;

  const std::string& claim() const { return claim_; }
  const std::string& sandbox() const { return sandbox_; }
  const std::string& pod() const { return pod_; }
  const std::string& namespace_name() const { return namespace_; }
  const std::string& uid() const { return uid_; }

  // Runs argv in the pod (its only container, or the one named by
  // `container`) and returns the caller's end of the byte stream
  // (exec_stream.h): reads are its stdout, writes its stdin; closing it
  // closes stdin and ends the relay. `callbacks` get its stderr lines and
  // its end (the exit code or failure from the API's channel 3). The relay
  // belongs to this object: Release and the destructor end it.
  Result<linux::UniqueFd> Exec(const std::vector<std::string>& argv, ExecCallbacks callbacks,
                               const std::string& container = "");

  // Ends every relay, then deletes the claim (propagationPolicy Background).
  // Idempotent: a claim already gone (404) is released; after success the
  // object holds nothing in the cluster.
  Status Release();

 private:
  ClaimedSandbox() = default;
  // Waits for Ready and learns the Sandbox and its pod.
  Status Bind(std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds ready_timeout);
  std::shared_ptr<const ApiClient> api_;
  std::string namespace_;
  std::string claim_;
  std::string uid_;
  std::string sandbox_;
  std::string pod_;
  std::mutex mu_;
  bool released_ = false;
  std::vector<std::unique_ptr<ExecStream>> streams_;
};

}  // namespace agentbox::k8s
