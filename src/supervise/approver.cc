#include "supervise/approver.h"

#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <string_view>

#include "linux/fd.h"
#include "linux/host_program.h"

namespace agentbox::supervise {
namespace {

using nlohmann::json;

constexpr std::size_t kQuoteBytes = 80;

std::string_view Trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

// What the program printed, for a reason: as a JSON string (control
// characters escaped, invalid UTF-8 replaced), cut at kQuoteBytes.
std::string Quote(std::string_view text) {
  const bool cut = text.size() > kQuoteBytes;
  std::string quoted = json(std::string(text.substr(0, kQuoteBytes))).dump(-1, ' ', false, json::error_handler_t::replace);
  return cut ? quoted + "..." : quoted;
}

std::string Duration(std::chrono::milliseconds d) {
  if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + " s";
  return std::to_string(d.count()) + " ms";
}

// "No such file or directory (errno ENOENT 2)" for a failure with errno.
std::string Why(const Status& s) {
  if (s.err() == 0) return s.message();
  const char* name = ::strerrorname_np(s.err());
  return s.message() + " (errno " + (name ? std::string(name) + " " : std::string()) + std::to_string(s.err()) + ")";
}

ApprovalDecision Deny(const std::string& by, std::string reason) {
  return {ApprovalAnswer::kDeny, by, std::move(reason)};
}

bool AnswerFromWord(std::string_view word, ApprovalAnswer* answer) {
  if (word == "once") *answer = ApprovalAnswer::kOnce;
  else if (word == "session") *answer = ApprovalAnswer::kSession;
  else if (word == "deny") *answer = ApprovalAnswer::kDeny;
  else return false;
  return true;
}

// {"decision": "once"|"session"|"deny", "reason"?: "..."} and nothing else.
ApprovalDecision FromObject(std::string_view text, const std::string& by) {
  const json answer = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (answer.is_discarded() || !answer.is_object()) {
    return Deny(by, by + " answered " + Quote(text) + ", which is not a JSON object");
  }
  for (auto it = answer.begin(); it != answer.end(); ++it) {
    if (const std::string& key = it.key(); key != "decision" && key != "reason") {
      return Deny(by, by + " answered with the unknown key " + Quote(key) + " (only decision and reason): " + Quote(text));
    }
  }
  ApprovalDecision d{ApprovalAnswer::kDeny, by, ""};
  const auto decision = answer.find("decision");
  if (decision == answer.end() || !decision->is_string() ||
      !AnswerFromWord(decision->get_ref<const std::string&>(), &d.answer)) {
    return Deny(by, by + " answered " + Quote(text) + ": \"decision\" is not once, session or deny");
  }
  if (const auto reason = answer.find("reason"); reason != answer.end()) {
    if (!reason->is_string()) return Deny(by, by + " answered " + Quote(text) + ": \"reason\" is not a string");
    d.reason = reason->get<std::string>();
  }
  if (d.answer == ApprovalAnswer::kDeny && d.reason.empty()) d.reason = "denied by " + by;
  return d;
}

// The answer of a program that exited 0.
ApprovalDecision FromOutput(std::string_view output, const std::string& by) {
  const std::string_view text = Trim(output);
  if (text.empty()) return Deny(by, by + " printed nothing");
  if (text.front() == '{') return FromObject(text, by);
  ApprovalDecision d{ApprovalAnswer::kDeny, by, ""};
  if (!AnswerFromWord(text, &d.answer)) {
    return Deny(by, by + " answered " + Quote(text) + ", not once, session or deny");
  }
  if (d.answer == ApprovalAnswer::kDeny) d.reason = "denied by " + by;
  return d;
}

constexpr const char* kTerminal = "terminal";
constexpr std::size_t kMaxLineBytes = 256;

// One line from `fd` within `timeout` (without the newline), or why not.
Result<std::string> ReadLine(int fd, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string line;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Status::Error("terminal", "no answer within " + Duration(timeout));
    struct pollfd p {fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return Status::Errno("terminal", "poll");
    if (ready == 0) continue;
    char buf[128];
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return Status::Errno("terminal", "read");
    if (n == 0) return Status::Error("terminal", "the terminal closed (EOF) before an answer");
    line.append(buf, static_cast<std::size_t>(n));
    if (const auto nl = line.find('\n'); nl != std::string::npos) return line.substr(0, nl);
    if (line.size() > kMaxLineBytes) {
      return Status::Error("terminal", "an answer longer than " + std::to_string(kMaxLineBytes) + " bytes");
    }
  }
}

}  // namespace

ApprovalDecision AskOnDescriptors(int in_fd, int out_fd, const ApprovalRequest& request,
                                  std::chrono::milliseconds timeout) {
  if (::isatty(in_fd)) {
    // Outside the terminal's foreground process group (`agentbox run ... &`)
    // a read would stop the whole run (SIGTTIN): no question, a deny.
    if (::tcgetpgrp(in_fd) != ::getpgrp()) {
      return Deny(kTerminal, "the terminal's foreground is another process group (run in the background)");
    }
    // Only an answer typed after the question counts, never type-ahead.
    ::tcflush(in_fd, TCIFLUSH);
  }
  const std::string grant = request.grant.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string prompt;
  if (!request.reason.empty()) prompt += "agentbox: " + request.reason + "\n";
  prompt += "agentbox: grant " + grant + " and run the command again?\n" +
            "          [o]nce / [s]ession (once: a run has no session) / [d]eny: ";
  (void)linux::WriteAll(out_fd, prompt);
  auto line = ReadLine(in_fd, timeout);
  if (!line.ok()) {
    (void)linux::WriteAll(out_fd, "\nagentbox: denied (" + line.status().message() + ")\n");
    return Deny(kTerminal, "terminal: " + Why(line.status()));
  }
  std::string word(Trim(*line));
  std::transform(word.begin(), word.end(), word.begin(), [](unsigned char c) { return std::tolower(c); });
  if (word == "o" || word == "once" || word == "y" || word == "yes") return {ApprovalAnswer::kOnce, kTerminal, ""};
  if (word == "s" || word == "session") return {ApprovalAnswer::kSession, kTerminal, ""};
  if (word.empty()) return Deny(kTerminal, "denied at the terminal (an empty answer)");
  if (word == "d" || word == "deny" || word == "n" || word == "no") return Deny(kTerminal, "denied at the terminal");
  return Deny(kTerminal, "the terminal answered " + Quote(*line) + ", not once, session or deny");
}

ApprovalDecision DecideOnTerminal(const ApprovalRequest& request, std::chrono::milliseconds timeout) {
  // O_NOCTTY: asking must never make a terminal ours.
  linux::UniqueFd tty(::open("/dev/tty", O_RDWR | O_CLOEXEC | O_NOCTTY));
  if (!tty.valid()) return Deny(kTerminal, "no terminal to ask");
  return AskOnDescriptors(tty.get(), tty.get(), request, timeout);
}

ApprovalDecision NoApprover() { return {ApprovalAnswer::kDeny, "", "no approver is configured"}; }

json RequestJson(const ApprovalRequest& r) {
  return json{{"type", "escalation"}, {"session", r.session}, {"offer_id", r.offer_id},
              {"call_id", r.call_id}, {"reason", r.reason},   {"grant", r.grant}};
}

ApprovalDecision DecideByCommand(const std::vector<std::string>& argv, const ApprovalRequest& request,
                                 std::chrono::milliseconds timeout) {
  if (argv.empty()) return NoApprover();
  const std::string by = "approve-command " + argv[0];
  // Invalid UTF-8 in a reason or grant is replaced rather than thrown on:
  // the program gets a valid JSON line either way.
  const std::string line = RequestJson(request).dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  auto run = linux::RunHostProgram(argv, line, timeout, kMaxAnswerBytes);
  if (!run.ok()) return Deny(by, by + " could not start: " + Why(run.status()));
  switch (run->end) {
    case linux::ProgramRun::End::kTimedOut:
      return Deny(by, by + " did not answer within " + Duration(timeout) + " (killed)");
    case linux::ProgramRun::End::kOutputTooLong:
      return Deny(by, by + " printed more than " + std::to_string(kMaxAnswerBytes) + " bytes (killed)");
    case linux::ProgramRun::End::kExited:
      break;
  }
  const int status = run->wait_status;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string why = by + " " + linux::DescribeWaitStatus(status);
    const std::string_view printed = Trim(run->output);
    if (!printed.empty()) why += " (after printing " + Quote(printed) + ", which does not count)";
    return Deny(by, why);
  }
  return FromOutput(run->output, by);
}

const char* AnswerName(ApprovalAnswer answer) {
  switch (answer) {
    case ApprovalAnswer::kOnce: return "once";
    case ApprovalAnswer::kSession: return "session";
    case ApprovalAnswer::kDeny: return "deny";
  }
  return "deny";
}

}  // namespace agentbox::supervise
