// Who decides an escalation request: a program (the daemon's and `run
// --on-denial ask`'s `--approve-command PROG`), or, for `run` without one,
// the person at the controlling terminal.
//
// A session's denial may come with an offer (the grant that would have
// allowed it); the agent may ask for it, and a person (through a program of
// theirs) says once, for the session, or no. This is the deciding part: the
// API builds the request, calls DecideByCommand, and applies and logs the
// decision.
//
// The program's protocol (docs/daemon.md, "Approvers"):
//   stdin:  one JSON object and a newline, then EOF:
//           {"type":"escalation","session","offer_id","call_id","reason","grant"}
//   stdout: `once`, `session` or `deny` (one word; surrounding whitespace is
//           ignored), or {"decision":"once"|"session"|"deny","reason":"..."};
//           at most kMaxAnswerBytes.
//   It must exit 0 within the timeout. Anything else is a deny whose reason
//   says precisely what happened (no answer in time, could not start, killed
//   by a signal, a non-zero exit, an answer that is none of the above, no
//   answer at all).
// It runs on the host, never in a sandbox, as the daemon's user, in a
// process group of its own that is killed whole once it has exited or the
// timeout passed (linux/host_program.h): nothing it started outlives the
// decision. Its stderr is the daemon's.
//
// Thread-safe: every call runs its own program; several request threads may
// decide at once.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace agentbox::supervise {

struct ApprovalRequest {
  std::string session;
  std::string offer_id;
  std::string call_id;
  std::string reason;     // why the call was denied
  nlohmann::json grant;   // what the agent asks for (the offer's grant)
};

enum class ApprovalAnswer {
  kOnce,     // this grant, for one call
  kSession,  // this grant, for the rest of the session
  kDeny,
};

struct ApprovalDecision {
  ApprovalAnswer answer = ApprovalAnswer::kDeny;
  std::string by;      // "approve-command PROG"; "" when no one was asked
  std::string reason;  // why a deny (for the log); the program's own reason when it gave one
};

inline constexpr std::size_t kMaxAnswerBytes = 4096;
inline constexpr std::chrono::milliseconds kDefaultApproveTimeout{60000};

// The deny of a daemon without --approve-command: reason "no approver is
// configured".
ApprovalDecision NoApprover();

// Runs `argv` for `request` (see above) and waits for its answer at most
// `timeout`; an empty `argv` (no --approve-command) is NoApprover(). Never
// fails: every failure is a deny with its reason. Blocks the calling thread
// for as long as the program takes (at most `timeout`).
ApprovalDecision DecideByCommand(const std::vector<std::string>& argv, const ApprovalRequest& request,
                                 std::chrono::milliseconds timeout);

// Asks on the controlling terminal (/dev/tty, never stdin: that is the
// command's), printing the request and the question there:
//   agentbox: <reason>
//   agentbox: grant {"network.allow":"host:443"} and run the command again?
//             [o]nce / [s]ession / [d]eny:
// once, o, yes, y → kOnce; session, s → kSession; anything else, an empty
// line, EOF or silence for `timeout` → a deny saying which. No terminal to
// open is a deny with reason "no terminal to ask"; a terminal whose
// foreground process group is not ours is a deny without a prompt (a read
// would stop us with SIGTTIN). Type-ahead is discarded: only an answer
// typed after the question counts. `by` is "terminal". Blocks for at most
// `timeout`.
ApprovalDecision DecideOnTerminal(const ApprovalRequest& request, std::chrono::milliseconds timeout);

// DecideOnTerminal's question and answer on descriptors of the caller's
// (tests give a socket pair): prompts on `out_fd`, reads one line from
// `in_fd`. Owns neither.
ApprovalDecision AskOnDescriptors(int in_fd, int out_fd, const ApprovalRequest& request,
                                  std::chrono::milliseconds timeout);

// The JSON line the program reads (without the newline).
nlohmann::json RequestJson(const ApprovalRequest& request);

// "once", "session", "deny".
const char* AnswerName(ApprovalAnswer answer);

}  // namespace agentbox::supervise
