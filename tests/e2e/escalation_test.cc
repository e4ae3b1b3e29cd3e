// `agentbox run --on-denial ask`: after a run whose denials carry escalation
// offers, each offer within on_violation.max_grant is put to the approver
// (a host program, or the terminal), and the command runs once more with
// the grants approved. The upstreams are small HTTP servers on the host's
// 127.0.0.1 started by the test; the approvers are shell scripts that
// record being run.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "harness.h"
#include "linux/fd.h"
#include "net_fixtures.h"

namespace agentbox::e2e {
namespace {

using nlohmann::json;

// The proxy variables without the NO_PROXY exemption for 127.0.0.1 (the
// upstream is on loopback, which the plan exempts by default).
const std::string kUseProxy = "NO_PROXY= no_proxy= ";

// A policy with the egress proxy and nothing allowed, offering escalations
// held against max_grant.network `ceiling`.
std::string EscalatingPolicy(const Sandbox& sb, const std::vector<std::string>& ceiling,
                             const std::string& escalation = "one_time_approval") {
  std::string list;
  for (const auto& c : ceiling) list += (list.empty() ? "\"" : ", \"") + c + "\"";
  const std::string path = sb.scratch() + "/policy.yaml";
  WriteFile(path, "version: 1\nmode: workspace-write\nnetwork:\n  egress_proxy: true\n"
                  "on_violation:\n  escalation: " + escalation + "\n  max_grant:\n    network: [" + list + "]\n");
  return path;
}

// An approver script: appends a line to `asked` each time it runs, keeps
// the request it read in `request`, then runs `answer` (shell).
std::string Approver(const Sandbox& sb, const std::string& answer) {
  const std::string path = sb.scratch() + "/approve.sh";
  WriteFile(path, "#!/bin/sh\ncat > '" + sb.scratch() + "/request.json'\necho run >> '" + sb.scratch() +
                      "/asked'\n" + answer + "\n",
            0755);
  return path;
}

int TimesAsked(const Sandbox& sb) {
  auto text = ReadFile(sb.scratch() + "/asked");
  return text ? static_cast<int>(Lines(*text).size()) : 0;
}

const json& Escalations(const RunResult& r) {
  static const json none;
  if (!r.report || !r.report->contains("escalations")) return none;
  return (*r.report)["escalations"];
}

std::string Fetch(const HostServer& server) { return kUseProxy + "curl -s -f " + server.url(); }

TEST(OnDenialAsk, AnApprovedGrantRunsTheCommandOnceMoreAndItReachesTheHost) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  for (const std::string answer : {"once", "session"}) {
    SCOPED_TRACE("the approver answers " + answer);
    Sandbox sb;
    const std::string policy = EscalatingPolicy(sb, {server.target()});
    const std::string approver = Approver(sb, "echo " + answer);
    const int served_before = server.served();
    RunResult r = sb.Sh(Fetch(server), {"--policy", policy, "--on-denial", "ask", "--approve-command", approver});
    EXPECT_EQ(r.status, 0) << r.Describe();
    EXPECT_TRUE(Contains(r.out, HostServer::kBody)) << r.Describe();
    EXPECT_EQ(server.served(), served_before + 1) << "only the re-run reached the host";
    EXPECT_EQ(TimesAsked(sb), 1);
    EXPECT_TRUE(Contains(r.err, "running the command again")) << r.Describe();
    ASSERT_TRUE(r.report) << r.Describe();
    // The report is the re-run's.
    EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
    EXPECT_EQ(ReportInt(r, "exit_code"), 0) << r.Describe();
    EXPECT_TRUE((*r.report)["denials"].empty()) << r.Describe();
    // The first attempt, as it was.
    const json& first = (*r.report)["first_attempt"];
    ASSERT_TRUE(first.is_object()) << r.Describe();
    EXPECT_EQ(first["outcome"], "sandbox_denied") << r.Describe();
    EXPECT_EQ(first["exit_code"], 22) << "curl -f on the proxy's 403: " << r.Describe();
    ASSERT_EQ(first["denials"].size(), 1u) << r.Describe();
    EXPECT_EQ(first["denials"][0]["target"], server.target()) << r.Describe();
    const std::string offer_id = first["denials"][0]["escalation"]["id"];
    EXPECT_NE(first["policy_sha256"], (*r.report)["policy_sha256"]) << "the re-run's policy is the widened one";
    // The decision.
    const json& e = Escalations(r);
    ASSERT_EQ(e.size(), 1u) << r.Describe();
    EXPECT_EQ(e[0]["offer_id"], offer_id);
    EXPECT_EQ(e[0]["grant"], json({{"network.allow", server.target()}}));
    EXPECT_EQ(e[0]["within_ceiling"], true);
    EXPECT_EQ(e[0]["asked"], true);
    EXPECT_EQ(e[0]["decision"], "once");
    EXPECT_EQ(e[0]["decided_by"], "approve-command " + approver);
    EXPECT_EQ(e[0]["applied"], true);
    if (answer == "session") {
      EXPECT_TRUE(Contains(e[0]["reason"].get<std::string>(), "a run has no session")) << e[0].dump();
    }
    // What the approver was asked.
    auto request = ReadFile(sb.scratch() + "/request.json");
    ASSERT_TRUE(request);
    const json q = json::parse(*request, nullptr, false);
    EXPECT_EQ(q["type"], "escalation") << *request;
    EXPECT_EQ(q["offer_id"], offer_id) << *request;
    EXPECT_EQ(q["grant"], json({{"network.allow", server.target()}})) << *request;
    EXPECT_TRUE(Contains(q.value("reason", ""), "connect " + server.target())) << *request;
  }
}

TEST(OnDenialAsk, ADenyLeavesTheDenialAndNothingRunsAgain) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  const std::string policy = EscalatingPolicy(sb, {server.target()});
  const std::string approver = Approver(sb, "echo deny");
  RunResult r = sb.Sh(Fetch(server) + "; s=$?; echo attempt >> attempts; exit $s",
                      {"--policy", policy, "--on-denial", "ask", "--approve-command", approver});
  EXPECT_EQ(r.status, 22) << r.Describe();
  EXPECT_EQ(server.served(), 0);
  EXPECT_EQ(TimesAsked(sb), 1);
  EXPECT_EQ(Lines(ReadFile(sb.ws() + "/attempts").value_or("")).size(), 1u) << "one attempt only";
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  EXPECT_TRUE(HasDenial(r, server.target())) << r.Describe();
  ASSERT_TRUE(r.report);
  EXPECT_FALSE(r.report->contains("first_attempt")) << r.Describe();
  const json& e = Escalations(r);
  ASSERT_EQ(e.size(), 1u) << r.Describe();
  EXPECT_EQ(e[0]["asked"], true);
  EXPECT_EQ(e[0]["decision"], "deny");
  EXPECT_EQ(e[0]["applied"], false);
  EXPECT_TRUE(Contains(e[0]["reason"].get<std::string>(), "denied by approve-command " + approver)) << e[0].dump();
}

// An approver that answers nonsense or dies: a deny, its reason recorded.
TEST(OnDenialAsk, AnApproverThatAnswersGarbageOrCrashesIsADeny) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  struct Case {
    std::string script;
    std::string reason;
  };
  for (const Case& c : std::vector<Case>{{"echo 'sure thing'", "answered \"sure thing\", not once, session or deny"},
                                        {"kill -SEGV $$", "killed by signal SIGSEGV"},
                                        {"echo once; exit 3", "exited with status 3"}}) {
    SCOPED_TRACE(c.script);
    Sandbox sb;
    const std::string policy = EscalatingPolicy(sb, {server.target()});
    RunResult r = sb.Sh(Fetch(server), {"--policy", policy, "--on-denial", "ask", "--approve-command",
                                        Approver(sb, c.script)});
    EXPECT_EQ(r.status, 22) << r.Describe();
    EXPECT_EQ(TimesAsked(sb), 1);
    EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
    ASSERT_TRUE(r.report);
    EXPECT_FALSE(r.report->contains("first_attempt")) << r.Describe();
    const json& e = Escalations(r);
    ASSERT_EQ(e.size(), 1u) << r.Describe();
    EXPECT_EQ(e[0]["decision"], "deny");
    EXPECT_TRUE(Contains(e[0]["reason"].get<std::string>(), c.reason)) << e[0].dump();
  }
  EXPECT_EQ(server.served(), 0);
}

TEST(OnDenialAsk, AnOfferBeyondTheCeilingIsNeverAsked) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  const std::string policy = EscalatingPolicy(sb, {"registry.example:443"});
  RunResult r = sb.Sh(Fetch(server), {"--policy", policy, "--on-denial", "ask", "--approve-command",
                                      Approver(sb, "echo once")});
  EXPECT_EQ(r.status, 22) << r.Describe();
  EXPECT_EQ(TimesAsked(sb), 0) << "the approver ran";
  EXPECT_FALSE(Exists(sb.scratch() + "/request.json"));
  EXPECT_EQ(server.served(), 0);
  ASSERT_TRUE(r.report);
  EXPECT_FALSE(r.report->contains("first_attempt")) << r.Describe();
  const json& e = Escalations(r);
  ASSERT_EQ(e.size(), 1u) << r.Describe();
  EXPECT_EQ(e[0]["within_ceiling"], false);
  EXPECT_EQ(e[0]["asked"], false);
  EXPECT_EQ(e[0]["decision"], "deny");
  EXPECT_TRUE(e[0]["decided_by"].is_null()) << e[0].dump();
  EXPECT_TRUE(Contains(e[0]["reason"].get<std::string>(), "does not cover " + server.target())) << e[0].dump();
}

// A denial that only the re-run meets is listed, and nobody is asked again.
TEST(OnDenialAsk, NeverMoreThanOneReRun) {
  HostServer first, second;
  ASSERT_GT(first.port(), 0);
  ASSERT_GT(second.port(), 0);
  Sandbox sb;
  const std::string policy = EscalatingPolicy(sb, {first.target(), second.target()});
  const std::string approver = Approver(sb, "echo once");
  RunResult r = sb.Sh("echo attempt >> attempts; " + Fetch(first) + " && " + Fetch(second),
                      {"--policy", policy, "--on-denial", "ask", "--approve-command", approver});
  EXPECT_EQ(r.status, 22) << r.Describe();
  EXPECT_EQ(TimesAsked(sb), 1);
  EXPECT_EQ(Lines(ReadFile(sb.ws() + "/attempts").value_or("")).size(), 2u) << "two attempts, not three";
  EXPECT_EQ(first.served(), 1);
  EXPECT_EQ(second.served(), 0);
  ASSERT_TRUE(r.report);
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  EXPECT_TRUE(HasDenial(r, second.target())) << r.Describe();
  EXPECT_TRUE((*r.report)["first_attempt"]["denials"][0]["target"] == first.target()) << r.Describe();
  ASSERT_EQ(Escalations(r).size(), 1u) << r.Describe();
  EXPECT_EQ(Escalations(r)[0]["grant"], json({{"network.allow", first.target()}}));
}

// Without --approve-command the terminal decides; with none, nobody does.
TEST(OnDenialAsk, WithoutATerminalTheAnswerIsADeny) {
  const std::string setsid = FindTool("setsid");
  if (setsid.empty()) GTEST_SKIP() << "not applicable here: no setsid(1) to start agentbox without a terminal";
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  const std::string policy = EscalatingPolicy(sb, {server.target()});
  Command c = sb.AgentboxCommand({"run", "--report", sb.report_path(), "--policy", policy, "--on-denial", "ask",
                                  "--approve-timeout", "5s", "--", "sh", "-c", Fetch(server)});
  // A session of its own: no controlling terminal. -w: its status is ours.
  c.argv.insert(c.argv.begin(), {setsid, "-w"});
  RunResult r = RunCommand(c);
  EXPECT_EQ(r.status, 22) << r.Describe();
  EXPECT_EQ(server.served(), 0);
  auto text = ReadFile(sb.report_path());
  ASSERT_TRUE(text) << r.Describe();
  const json report = json::parse(*text, nullptr, false);
  ASSERT_TRUE(report.is_object()) << *text;
  ASSERT_EQ(report["escalations"].size(), 1u) << *text;
  const json& e = report["escalations"][0];
  EXPECT_EQ(e["asked"], true);
  EXPECT_EQ(e["decision"], "deny");
  EXPECT_EQ(e["decided_by"], "terminal");
  EXPECT_EQ(e["reason"], "no terminal to ask");
  EXPECT_FALSE(report.contains("first_attempt"));
}

// What the terminal shows, read from its master side until `needle`
// appears or `timeout_ms` passes.
std::string ReadTerminalUntil(int master, const std::string& needle, int timeout_ms) {
  std::string seen;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (seen.find(needle) == std::string::npos && std::chrono::steady_clock::now() < end) {
    pollfd p{master, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[512];
    const ssize_t n = read(master, buf, sizeof buf);
    if (n <= 0) break;
    seen.append(buf, static_cast<std::size_t>(n));
  }
  return seen;
}

// With no --approve-command the terminal asks: agentbox runs with a pty as
// its controlling terminal, the question appears there, and what is typed
// after it decides.
TEST(OnDenialAsk, TheTerminalAsksAndWhatIsTypedDecides) {
  const std::string setsid = FindTool("setsid");
  if (setsid.empty()) GTEST_SKIP() << "not applicable here: no setsid(1) to give agentbox a terminal";
  HostServer server;
  ASSERT_GT(server.port(), 0);
  for (const std::string typed : {"once", "deny"}) {
    SCOPED_TRACE("typed " + typed);
    Sandbox sb;
    const std::string policy = EscalatingPolicy(sb, {server.target()});
    int master = -1, slave = -1;
    ASSERT_EQ(openpty(&master, &slave, nullptr, nullptr, nullptr), 0) << std::strerror(errno);
    agentbox::linux::UniqueFd m(master), s(slave);
    Command c = sb.AgentboxCommand({"run", "--report", sb.report_path(), "--policy", policy, "--on-denial", "ask",
                                    "--approve-timeout", "20s", "--", "sh", "-c", Fetch(server)});
    // A session of its own whose controlling terminal is the pty (stdin).
    c.argv.insert(c.argv.begin(), {setsid, "--ctty", "--wait"});
    c.stdin_fd = s.get();
    c.timeout_ms = 40000;
    const int served_before = server.served();
    Process p(c);
    ASSERT_TRUE(p.started()) << p.start_error();
    const std::string shown = ReadTerminalUntil(m.get(), "[d]eny: ", 20000);
    ASSERT_TRUE(Contains(shown, "grant {\"network.allow\":\"" + server.target() + "\"}")) << shown;
    const std::string line = typed + "\n";
    ASSERT_EQ(write(m.get(), line.data(), line.size()), static_cast<ssize_t>(line.size()));
    RunResult r = p.Wait();
    auto text = ReadFile(sb.report_path());
    ASSERT_TRUE(text) << r.Describe();
    const json report = json::parse(*text, nullptr, false);
    ASSERT_TRUE(report.is_object()) << *text;
    ASSERT_EQ(report["escalations"].size(), 1u) << *text;
    EXPECT_EQ(report["escalations"][0]["decided_by"], "terminal") << *text;
    if (typed == "once") {
      EXPECT_EQ(r.status, 0) << r.Describe();
      EXPECT_TRUE(Contains(r.out, HostServer::kBody)) << r.Describe();
      EXPECT_EQ(server.served(), served_before + 1);
      EXPECT_EQ(report["escalations"][0]["decision"], "once") << *text;
    } else {
      EXPECT_EQ(r.status, 22) << r.Describe();
      EXPECT_EQ(server.served(), served_before);
      EXPECT_EQ(report["escalations"][0]["decision"], "deny") << *text;
      EXPECT_FALSE(report.contains("first_attempt")) << *text;
    }
  }
}

TEST(OnDenialAsk, APolicyWithoutEscalationsIsRefusedBeforeAnythingRuns) {
  Sandbox sb;
  const std::string policy = EscalatingPolicy(sb, {"127.0.0.1:1"}, "deny");
  RunResult r = sb.Sh("touch ran", {"--policy", policy, "--on-denial", "ask", "--approve-command", "/bin/true"});
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "on_violation.escalation")) << r.Describe();
  EXPECT_FALSE(Exists(sb.ws() + "/ran"));
  EXPECT_EQ(ErrorStage(r), "policy") << r.Describe();
}

TEST(OnDenialAsk, FlagsThatDoNotFitAreUsageErrors) {
  Sandbox sb;
  RunResult r = sb.Sh("touch ran", {"--on-denial", "maybe"});
  EXPECT_EQ(r.status, 2) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "--on-denial: 'maybe' is not deny or ask")) << r.Describe();
  r = sb.Sh("touch ran", {"--approve-command", "/bin/true"});
  EXPECT_EQ(r.status, 2) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "--approve-command: only with --on-denial ask")) << r.Describe();
  EXPECT_FALSE(Exists(sb.ws() + "/ran"));
}

// The default, deny, is today's behaviour: no escalations key, one attempt.
TEST(OnDenialAsk, DenyIsTheDefaultAndAsksNobody) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  const std::string policy = EscalatingPolicy(sb, {server.target()});
  RunResult r = sb.Sh(Fetch(server), {"--policy", policy});
  EXPECT_EQ(r.status, 22) << r.Describe();
  ASSERT_TRUE(r.report);
  EXPECT_FALSE(r.report->contains("escalations")) << r.Describe();
  EXPECT_FALSE(r.report->contains("first_attempt")) << r.Describe();
  EXPECT_EQ(server.served(), 0);
}

}  // namespace
}  // namespace agentbox::e2e
