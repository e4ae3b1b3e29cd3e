// Subcommands that live in their own file: each Add* function registers its
// CLI11 subcommand on the app; after parsing, main() runs the chosen one.
#pragma once

#include <CLI/CLI.hpp>
#include <climits>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace agentbox::cli {

// Exit codes of the command line (DESIGN.md §3), as every subcommand uses them.
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitTimedOut = 124;
inline constexpr int kExitSandbox = 125;
inline constexpr int kExitInterrupted = 130;

// realpath(3) of `p`, or "" when it cannot be resolved.
inline std::string RealPath(const std::string& p) {
  char buf[PATH_MAX];
  return realpath(p.c_str(), buf) ? std::string(buf) : std::string();
}

struct Subcommand {
  CLI::App* app = nullptr;
  // Runs the subcommand; `after_dashes` is everything after the first `--`.
  std::function<int(const std::vector<std::string>& after_dashes)> run;
};

// `agentbox serve`: the session daemon (serve_cmd.cc).
Subcommand AddServeCommand(CLI::App& app);
// `agentbox session ...`: the daemon's client (session_cmd.cc).
Subcommand AddSessionCommand(CLI::App& app);
// `agentbox mcp`: the sandbox as an MCP server on stdio (mcp_cmd.cc).
Subcommand AddMcpCommand(CLI::App& app);
// `agentbox setup-delegation`: a cgroup subtree for a user (delegation_cmd.cc).
Subcommand AddSetupDelegationCommand(CLI::App& app);
// `agentbox k8s ...`: Kubernetes agent-sandbox objects from a policy (k8s_cmd.cc).
Subcommand AddK8sCommand(CLI::App& app);

}  // namespace agentbox::cli
