#include "supervise/approver.h"

#include <string.h>
#include <sys/wait.h>

#include <cctype>
#include <string_view>

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

}  // namespace

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
