// `agentbox k8s`: the Kubernetes agent-sandbox side of isolation: remote
// (docs/kubernetes.md).
//
//   agentbox k8s render --policy P [--namespace NS] [--name NAME]
//                       [--image IMAGE] [--session ID] [--secret-name NAME]
//                       [--warm-pool-replicas N]
//
// prints the policy's SandboxTemplate, SandboxWarmPool and (with --session)
// SandboxClaim as one YAML stream on stdout, for `kubectl apply -f -`.
// Nothing is sent anywhere; a policy that cannot be rendered honestly (a
// secret read by a command, an isolation with no pod) is an error on stderr,
// exit 1, and nothing on stdout.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "agentbox/policy.h"
#include "cli/subcommand.h"
#include "k8s/render.h"

namespace agentbox::cli {
namespace {

struct RenderFlags {
  std::string policy;
  k8s::RenderOptions options;
};

int RenderFail(const std::string& message) {
  std::fprintf(stderr, "agentbox k8s render: %s\n", message.c_str());
  return 1;
}

int RunRender(const RenderFlags& f) {
  auto policy = LoadPolicyFile(f.policy);
  if (!policy.ok()) return RenderFail(policy.status().message());
  auto objects = k8s::Render(*policy, f.options);
  if (!objects.ok()) return RenderFail(objects.status().message());
  const std::string yaml = k8s::ToYamlStream(*objects);
  std::fwrite(yaml.data(), 1, yaml.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : RenderFail("writing to stdout failed");
}

void AddRender(CLI::App& k8s, const std::shared_ptr<RenderFlags>& f) {
  CLI::App* cmd = k8s.add_subcommand("render", "print the policy's agent-sandbox objects as YAML (kubectl apply -f -)");
  cmd->add_option("--policy", f->policy, "the policy file")->required();
  cmd->add_option("--namespace", f->options.namespace_name,
                  std::string("namespace (default: sandbox.remote.kubernetes.namespace, else ") +
                      k8s::kDefaultNamespace + ")");
  cmd->add_option("--name", f->options.template_name,
                  std::string("SandboxTemplate and SandboxWarmPool name (default: sandbox.remote.kubernetes.template, "
                              "else ") +
                      k8s::kDefaultTemplateName + ")");
  cmd->add_option("--image", f->options.image,
                  "the pod's image, holding agentbox (default " + k8s::DefaultImage() + ")");
  cmd->add_option("--session", f->options.session, "also a SandboxClaim for this session id, named NAME-ID");
  cmd->add_option("--secret-name", f->options.secret_name,
                  "the Secret holding credentials.secrets, one key per secret (default NAME-credentials)");
  cmd->add_option("--warm-pool-replicas", f->options.warm_pool_replicas,
                  "pods kept ready for claims (default 0: each claim starts its own)");
}

}  // namespace

Subcommand AddK8sCommand(CLI::App& app) {
  Subcommand s;
  s.app = app.add_subcommand("k8s", "Kubernetes agent-sandbox objects for a policy");
  s.app->require_subcommand(1);
  auto render = std::make_shared<RenderFlags>();
  AddRender(*s.app, render);
  CLI::App* k8s = s.app;
  s.run = [k8s, render](const std::vector<std::string>&) {
    if (k8s->got_subcommand("render")) return RunRender(*render);
    return 2;
  };
  return s;
}

}  // namespace agentbox::cli
