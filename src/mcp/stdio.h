// The stdio transport of MCP: newline-delimited JSON-RPC messages on a pair
// of file descriptors (the client's pipes).
//
// One reader thread (the caller's) reads and answers quick messages in
// order (ping, initialize, tools/list, cancellations); tool calls and
// batches go to worker threads, so a running command never holds up a ping
// or its own cancellation. Writes are whole lines under one mutex.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "agentbox/status.h"
#include "mcp/server.h"

namespace agentbox::mcp {

struct StdioOptions {
  int in_fd = 0;
  int out_fd = 1;
  // Readable (a byte written by a signal handler) when the process should
  // stop at once: calls in flight are cancelled. -1: none.
  int stop_fd = -1;
  std::size_t max_workers = 16;  // tool calls running at once; more wait
  std::function<void(const std::string& line)> log;
};

enum class StdioEnd { kEof, kStopped };

// Serves until EOF on in_fd (calls in flight finish and are answered) or
// until stop_fd is readable (calls in flight are cancelled). Returns when no
// call is running. Fails only when in_fd cannot be read.
Result<StdioEnd> ServeStdio(Server& server, const StdioOptions& options);

}  // namespace agentbox::mcp
