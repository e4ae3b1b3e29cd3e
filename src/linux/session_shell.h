// The persistent shell of a session (`session.shell: persistent`): one bash
// that runs every bash call of the session in itself, so that `cd`,
// `export`, variables, functions and aliases carry over between calls.
//
// A keeper process of the init's owns the bash. Like a call's keeper it is
// outside the commands' signal scope, leads its own session and is a child
// subreaper, so everything the shell starts stays below it. Per call it
// makes FIFOs in a private directory (mode 0700, below /dev/shm, else /tmp)
// and writes one line to the shell's stdin. That line runs the call's
// command with `source`, with its stdout and stderr on a FIFO of its own
// and its stdin from a file of the call's data (or /dev/null), and then
// writes `$?` to the call's status FIFO:
//   - The command's text is read from a file, never pasted into the line,
//     so nothing in it changes how the line parses.
//   - The status comes on a descriptor of its own, not as a marker in the
//     output, so the output is exactly what the command wrote.
//   - What the call leaves running writes to the call's FIFO after the call
//     ends; the keeper drains that into the session's background log, never
//     into a later call's output.
//
// A timeout or a cancel signals the processes the call started (those
// below the keeper that were not there when the call began), never what
// earlier calls left running, and sends the shell ShellAbortSignal(), which
// the line traps to return from the command's `source`: the rest of the
// command does not run (a builtin loop ends too) and the shell stays. A
// command that keeps the shell from coming back (it ignores that signal)
// is ended with the shell, a second after the SIGKILL. A shell that exits (the
// command ran `exit`, or was killed) is started again on the next call, and
// both calls say so.
//
// The keeper talks to the init over a SOCK_SEQPACKET pair:
//   init → keeper: {"op":"call","id","cwd","env":[...],"stdin":bool} with the
//                  command's text (a memfd), stdin, stdout, and optionally
//                  the background log;
//                  {"op":"kill","signal":N}.
//   keeper → init: {"t":"started","id","pid"} (the shell's pid);
//                  {"t":"done","id","code","signal","exec_error"?,"shell":{...}}.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace agentbox::linux {

struct ShellHooks {
  // Starts bash in the sandbox's call environment (the commands' signal
  // scope, the plan's environment and cwd), stdin `script_fd`, stdout and
  // stderr /dev/null. A failure to exec it is one JSON line on `report_fd`
  // ({"t":"exec_error",...}). Returns its pid, or -1 with errno.
  std::function<pid_t(int script_fd, int report_fd)> start_shell;
  // Drains `fifo_fd` into `log_fd` (-1: dropped) until its last writer
  // closes it, then _exits: run in a forked process.
  void (*drain)(int fifo_fd, int log_fd) = nullptr;
  // Writes all of `n` bytes to the non-blocking `fd`, waiting for room.
  bool (*write_all)(int fd, const char* data, std::size_t n) = nullptr;
};

// The keeper's process: `sock` is its end of the pair with the init. Every
// other descriptor but 0-2 and `keep_fd` is closed first.
[[noreturn]] void ShellKeeperMain(int sock, int keep_fd, const ShellHooks& hooks);

// Whether `name` can be set as a shell variable (the call's `env` is set on
// the call's command as `NAME=value`).
bool IsShellVariableName(std::string_view name);

// `s` single-quoted for bash, with nothing expanded inside.
std::string ShellQuote(std::string_view s);

// The signal on which the shell abandons the call's command and comes
// back to read the next line (a real-time one; the line traps it).
int ShellAbortSignal();

// The line the keeper writes to the shell for call number `n`: below `dir`,
// "N.cmd" holds the command, "N.out" and "N.status" are FIFOs, and "N.in"
// holds the call's stdin when `stdin_file` (else stdin is /dev/null). `cwd` ("" = stay where
// the last call left the shell) and `env` ("NAME=VALUE" entries, names
// checked with IsShellVariableName) apply to this call.
std::string ShellCallLine(const std::string& dir, long n, const std::string& cwd, const std::vector<std::string>& env,
                          bool stdin_file);

}  // namespace agentbox::linux
