// The runner's status pipe: one JSON object per line, each written with a
// single write(2) so that lines never interleave. Close-on-exec: a successful
// exec of the command closes the command's copy without a word.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "agentbox/status.h"

namespace agentbox::linux {

struct RunnerMessage {
  // kLandlock: Landlock in force short of the plan (only under require
  // partial; under full the runner refuses with a setup error instead).
  // kSeccompDenials: the calls the filter denied, sent before kExit.
  // kReady: a session's init is set up and waits for calls.
  enum class Type { kSetupError, kExecError, kExit, kLandlock, kSeccompDenials, kReady };
  Type type = Type::kSetupError;
  Status status;       // kSetupError, kExecError
  int exit_code = -1;  // kExit: exited with this code
  int signal = 0;      // kExit: killed by this signal
  // kExit from the init of a pid namespace: every other process of the
  // sandbox was killed and reaped before it was sent; the usage of the
  // runner and of all it reaped (what wait4 on the runner would give).
  bool sandbox_empty = false;
  std::uint64_t cpu_user_us = 0, cpu_sys_us = 0, max_rss_kib = 0;
  int landlock_abi = 0;                     // kLandlock: what the kernel offered
  std::vector<std::string> short_of_plan;   // kLandlock
  std::vector<std::pair<std::string, std::uint64_t>> denied;  // kSeccompDenials: syscall, count
};

// Best effort: the reader is the supervisor; if it is gone nobody listens.
void WriteMessage(int fd, const RunnerMessage& message);
bool ParseMessage(const std::string& line, RunnerMessage* message);

// Splits the status pipe into messages as it is read.
class StatusReader {
 public:
  // One read(2) of `fd`: the whole lines in it are parsed and appended to
  // `out` (unparseable lines are dropped). False at end of file or on error.
  bool Read(int fd, std::vector<RunnerMessage>* out);

 private:
  std::string partial_;
};

}  // namespace agentbox::linux
