// The runner stage: runs in the cloned child, becomes pid 1 of the sandbox.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "agentbox/plan.h"
#include "agentbox/status.h"
#include "linux/resolve.h"
#include "linux/seccomp_filter.h"

namespace agentbox::linux {

// The command's environment under `rules`, from this process's own.
std::vector<std::string> BuildEnv(const EnvRules& rules);

// Never returns. Reports setup and exec failures, then the command's exit,
// on `status_fd`; dies with the supervisor (lifeline + PR_SET_PDEATHSIG).
// `filter`: the seccomp program the supervisor compiled before the clone
// (null: none; a plan with seccomp on is then refused, stage seccomp);
// `proxy_fd` carries the proxy's listeners to the supervisor (-1: no proxy).
[[noreturn]] void RunnerMain(const Plan& plan, const ResolvedPlan& resolved, const std::vector<std::string>& argv,
                             int status_fd, int lifeline_fd, const BpfProgram* filter, int proxy_fd);

// A session's init: the same set-up as RunnerMain, then, instead of one
// command, calls arrive on `control_fd` (SOCK_SEQPACKET) for as long as the
// session lives: each message is a JSON request (or "@" with the request in
// the first passed fd) plus fds:
//   {"op":"exec","id":N,"argv":[...],"cwd":"..."} + [stdin, output, result]
//       a new process in its own session (stdout and stderr on `output`);
//       its end is one line on `result`:
//       {"t":"exit","code":C,"signal":S,"denied":[{"syscall","count"}]}
//       (preceded by an exec_error line when it could not start)
//   {"op":"file","id":N,...} + [result]
//       `hooks.file_op` runs in a forked process (the sandbox's view, its
//       Landlock domain and seccomp filter) and writes its answer on `result`;
//       with "raw":"FIELD", the request is followed by '\n' and that input
//       field's bytes as they are (write_file's content: not escaped into
//       the JSON and parsed back on each side)
//   {"op":"kill","id":N,"signal":S}
// The init reports "ready" on the status pipe once set up; it ends when the
// control socket closes, or on SIGTERM once its calls are gone.
//
// With an upper layer of a size of its own (WorkspaceOverlay::upper_fs_bytes,
// disk_gib), the init mounts it (a tmpfs, copying in the upper layer of
// `upper_seed_fd`, an earlier world's upper filesystem, when >= 0) and sends
// its root first on `control_fd`: {"t":"upper"} with the fd.
// A file tool's answer, written as `head` then `body` (a read_file's body
// is the file: kept apart rather than copied after the head).
struct FileOpAnswer {
  std::string head;
  std::string body;
};

struct SessionHooks {
  // Takes the request (its own copy, in the forked process: a write_file's
  // content is moved out of it, not copied) and, for a request that came in
  // a memfd, the bytes after its JSON line apart in `raw` (read into a
  // string of their own size, never copied again: empty otherwise, the
  // bytes then following the line in `request`).
  FileOpAnswer (*file_op)(std::string request, std::string raw) = nullptr;
  Status (*copy_upper)(int from_dir, int to_dir) = nullptr;  // linux/mounts.h UpperFs
};

// The JSON of a control request: what comes before its '\n' (the raw field
// after it, when the request has one).
inline std::string_view ControlRequestJson(std::string_view request) {
  return request.substr(0, request.find('\n'));
}

[[noreturn]] void SessionInitMain(const Plan& plan, const ResolvedPlan& resolved, int status_fd, int lifeline_fd,
                                  const BpfProgram* filter, int proxy_fd, int control_fd, int upper_seed_fd,
                                  const SessionHooks& hooks);

}  // namespace agentbox::linux
