// `agentbox mcp`: the sandbox as an MCP server on stdio (docs/mcp.md).
#pragma once

#include <cstddef>
#include <string>

#include <CLI/CLI.hpp>

namespace agentbox::cli {

class McpCommand {
 public:
  // Adds the `mcp` subcommand and its flags to `app`.
  explicit McpCommand(CLI::App& app);
  bool chosen() const { return static_cast<bool>(*sub_); }
  // Serves until EOF on stdin; the process's exit status.
  int Run();

 private:
  CLI::App* sub_;
  std::string policy_file_;
  std::string mode_;
  std::string workspace_;
  std::string state_dir_;
  std::string session_;
  std::string log_file_;
  std::size_t output_cap_ = 64 * 1024;
  std::size_t workers_ = 16;
};

}  // namespace agentbox::cli
