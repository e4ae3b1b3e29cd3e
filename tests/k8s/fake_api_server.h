// An in-process stand-in for a Kubernetes API server running
// kubernetes-sigs/agent-sandbox, on 127.0.0.1 over TLS with a CA the test
// makes (net::RunCa). It serves the endpoints the client uses and answers
// the way the real server does, with the Status bodies recorded in
// tests/fixtures/k8s/responses (README there names their sources):
//   sandboxclaims: create, get, watch (one object), delete
//   sandboxwarmpools: get, list; sandboxes: get
//   pods/{pod}/exec: the WebSocket upgrade; the argv runs here (fork/exec)
//   and its stdio is relayed on channels 0/1/2, its end on channel 3.
// Its "controller" marks a claim Ready after `ready_after` (or never), with
// a Sandbox whose pod is named by the pod-name annotation, as one adopted
// from a warm pool is.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace agentbox::k8s::testing {

class FakeApiServer {
 public:
  enum class Readiness { kAfterDelay, kNever };
  struct Options {
    std::string token = "fake-token";  // the bearer token accepted
    std::string client_ca_pem;         // client certificates it accepts ("" = none)
    std::vector<std::string> exec_protocols = {"v5.channel.k8s.io", "v4.channel.k8s.io"};
    Readiness readiness = Readiness::kAfterDelay;
    std::chrono::milliseconds ready_after{100};
    bool adopt_from_pool = true;  // the Sandbox and pod named apart from the claim
  };

  // Listens on 127.0.0.1 (an ephemeral port). nullptr with `error` set on failure.
  static std::unique_ptr<FakeApiServer> Start(Options options, std::string* error);
  ~FakeApiServer();

  std::uint16_t port() const;
  const std::string& ca_pem() const;
  // A kubeconfig for this server with `user_yaml` as the user's body
  // (default: the accepted token); the CA inline as certificate-authority-data.
  std::string Kubeconfig(const std::string& user_yaml = "") const;

  void AddWarmPool(const std::string& ns, const std::string& name, const std::string& template_name);
  bool HasClaim(const std::string& ns, const std::string& name) const;
  // Every request as "METHOD target" in arrival order.
  std::vector<std::string> Requests() const;

  struct State;

 private:
  FakeApiServer() = default;
  std::unique_ptr<State> state_;
};

}  // namespace agentbox::k8s::testing
