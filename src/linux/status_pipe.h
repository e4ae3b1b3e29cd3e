// The runner's status pipe: one JSON object per line, each written with a
// single write(2) so that lines never interleave. Close-on-exec: a successful
// exec of the command closes the command's copy without a word.
#pragma once

#include <string>

#include "agentbox/status.h"

namespace agentbox::linux {

struct RunnerMessage {
  enum class Type { kSetupError, kExecError, kExit };
  Type type = Type::kSetupError;
  Status status;       // kSetupError, kExecError
  int exit_code = -1;  // kExit: exited with this code
  int signal = 0;      // kExit: killed by this signal
};

// Best effort: the reader is the supervisor; if it is gone nobody listens.
void WriteMessage(int fd, const RunnerMessage& message);
bool ParseMessage(const std::string& line, RunnerMessage* message);

}  // namespace agentbox::linux
