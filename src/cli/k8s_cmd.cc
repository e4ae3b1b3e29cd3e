// `agentbox k8s`: the Kubernetes agent-sandbox side of isolation: remote
// (docs/kubernetes.md).
#include <CLI/CLI.hpp>

#include "cli/subcommand.h"

namespace agentbox::cli {

Subcommand AddK8sCommand(CLI::App& app) {
  Subcommand s;
  s.app = app.add_subcommand("k8s", "Kubernetes agent-sandbox objects for a policy");
  s.app->require_subcommand(1);
  s.run = [](const std::vector<std::string>&) { return 2; };
  return s;
}

}  // namespace agentbox::cli
