// Programs on the host that agentbox asks for a decision: an --ask-command
// (a connection to an unknown domain), an --approve-command (an escalation
// request of a session). They run outside every sandbox, as this process's
// user, with a request on stdin and their answer read from stdout.
//
// How one is started, the same for all of them:
//   - in a process group of its own (ProcessGroup::kOwn), so that it and
//     whatever it forks can be killed as one; or in this process's
//     (kCallers), for a program that may prompt on this process's terminal
//     (a process group in the terminal's background is stopped when it reads);
//   - stdin a pipe that already holds the whole request and is closed behind
//     it (the program reads the request, then EOF; this process never
//     blocks on, or gets SIGPIPE from, a program that does not read it);
//   - stdout a pipe to this process; stderr this process's own (a daemon's
//     log file or terminal), so that the program's complaints stay visible;
//   - no other descriptor (closefrom 3), an empty signal mask and every
//     signal at its default (a daemon's worker thread blocks signals; the
//     program must not inherit that).
#pragma once

#include <spawn.h>

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "agentbox/status.h"
#include "linux/fd.h"

namespace agentbox::linux {

enum class ProcessGroup {
  kOwn,      // a new group, led by the program; End kills the group
  kCallers,  // this process's group; End kills the program alone
};

// One started program. Move-only; destroying it ends it (End) when no one
// did. Not thread-safe: one owner at a time.
class HostProgram {
 public:
  // The most a request may be: what a pipe holds without a reader.
  static constexpr std::size_t kMaxInput = 64 * 1024;

  // Starts `argv` (argv[0] is looked up in PATH when it has no '/') with
  // `input` on its stdin. Fails, with errno and argv[0] named, when the
  // program cannot be started (posix_spawnp), and when `input` is larger
  // than its pipe holds.
  static Result<HostProgram> Start(const std::vector<std::string>& argv, std::string_view input,
                                   ProcessGroup group);

  HostProgram(HostProgram&& other) noexcept;
  HostProgram& operator=(HostProgram&& other) noexcept;
  HostProgram(const HostProgram&) = delete;
  HostProgram& operator=(const HostProgram&) = delete;
  ~HostProgram();

  pid_t pid() const { return pid_; }
  // The read end of its stdout (close-on-exec, blocking); invalid once taken.
  int stdout_fd() const { return stdout_.get(); }
  UniqueFd TakeStdout() { return std::move(stdout_); }

  // SIGKILLs the program, with ProcessGroup::kOwn its whole group (and so
  // whatever it started that stayed in the group), and reaps it; returns
  // its wait status. The group is killed before the program is reaped:
  // until then its pid, which is the group's id, cannot be reused. Once
  // done, later calls return the same status and kill nothing.
  int End();

 private:
  HostProgram(pid_t pid, ProcessGroup group, UniqueFd out) : pid_(pid), group_(group), stdout_(std::move(out)) {}
  pid_t pid_ = -1;
  ProcessGroup group_ = ProcessGroup::kOwn;
  UniqueFd stdout_;
  bool reaped_ = false;
  int wait_status_ = 0;
};

// How a program run to its end ended (RunHostProgram).
struct ProgramRun {
  enum class End {
    kExited,         // it exited (or was killed by a signal): wait_status says how
    kTimedOut,       // it had not exited when the timeout passed
    kOutputTooLong,  // it printed more than the bound
  };
  End end = End::kExited;
  int wait_status = 0;  // waitpid's; with kTimedOut/kOutputTooLong, the SIGKILL's
  std::string output;   // its stdout: at most the bound, one byte more with kOutputTooLong
};

// Starts `argv` (HostProgram::Start, in a group of its own) and waits, at most `timeout`, for it to
// exit, keeping what it prints on stdout up to `max_output` bytes (one byte
// more ends the run: kOutputTooLong). What it printed before it exited
// counts, even when a process it left behind still holds its stdout open.
// However it ends, the process group is killed and the program reaped
// before this returns: nothing of it outlives the call. `output` is read
// straight into one buffer reserved up front, never reallocated (a caller
// that wipes it leaves no copy behind in freed memory). Fails only when the
// program cannot be started (or watched: pidfd_open, poll).
// Thread-safe: every call has its own program and pipes.
Result<ProgramRun> RunHostProgram(const std::vector<std::string>& argv, std::string_view input,
                                  std::chrono::milliseconds timeout, std::size_t max_output);

// Sets `attr` so that the spawned program starts with no signal blocked
// and every disposition at its default (the caller's threads block and
// ignore some); returns the flags that says, for posix_spawnattr_setflags.
short SpawnWithCleanSignals(posix_spawnattr_t* attr);

// The first regular, executable `name` in the ':'-separated `path_var`,
// skipping relative entries (they name nothing fixed); "" when none. Looked
// up below `root` ("/" for this host's own tree); the answer is the path
// as seen from `root`.
std::string FindOnPath(const std::string& root, const std::string& path_var, const std::string& name);

// "exited with status 3", "was killed by signal SIGSEGV (11)".
std::string DescribeWaitStatus(int wait_status);

}  // namespace agentbox::linux
