// The daemon's life: start-up checks, SIGKILL and restart, SIGTERM.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "daemon_fixture.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;
using e2e::TempDir;

// Runs a streamed bash call on its own thread; `started` once output came.
class Background {
 public:
  Background(const daemon::Endpoint& endpoint, const std::string& id, const std::string& command,
             const std::string& call_id) {
    thread_ = std::thread([this, endpoint, id, command, call_id] {
      daemon::Client client(endpoint);
      daemon::SseParser sse([&](const std::string& event, const std::string& data) {
        if (event == "output") started_ = true;
        if (event == "result") result_ = json::parse(data, nullptr, false);
      });
      json body = {{"name", "bash"}, {"input", {{"command", command}}}, {"call_id", call_id}};
      auto r = client.Call("POST", "/v1/sessions/" + id + "/execute?stream=1", body.dump(),
                           [&](std::string_view chunk) { sse.Feed(chunk); });
      transport_ok_ = r.ok();
    });
  }
  ~Background() { Join(); }
  bool WaitStarted(int timeout_ms = 30000) {
    for (int waited = 0; waited < timeout_ms && !started_; waited += 10) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return started_;
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  const json& result() const { return result_; }
  bool transport_ok() const { return transport_ok_; }

 private:
  std::thread thread_;
  std::atomic<bool> started_{false};
  json result_;
  bool transport_ok_ = false;
};

TEST(DaemonLifecycle, SocketIsPrivateAndRemovedOnExit) {
  Daemon d;
  ASSERT_TRUE(d.Start()) << d.error();
  struct stat st {};
  ASSERT_EQ(lstat(d.socket().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, geteuid());
  ASSERT_EQ(lstat(d.state_dir().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 077, 0u) << "the state directory is open to others";
  d.Signal(SIGTERM);
  EXPECT_EQ(d.WaitExit(20000), 0) << d.output();
  EXPECT_FALSE(e2e::Exists(d.socket())) << "the socket outlived the daemon";
}

TEST(DaemonLifecycle, AStaleSocketIsReplaced) {
  Daemon d;
  e2e::MakeDirs(d.state_dir(), 0700);
  // A socket nobody listens on any more, as a SIGKILLed daemon leaves it.
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, d.socket().c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);
  ASSERT_TRUE(d.Start()) << d.error();
}

TEST(DaemonLifecycle, RefusesAPathThatIsNotASocket) {
  Daemon d;
  e2e::WriteFile(d.socket(), "precious\n");
  EXPECT_GT(d.StartExpectingFailure({}), 0);
  EXPECT_TRUE(Contains(d.error(), d.socket())) << d.error();
  EXPECT_TRUE(Contains(d.error(), "not a socket")) << d.error();
  EXPECT_EQ(e2e::ReadFile(d.socket()).value_or(""), "precious\n");
}

TEST(DaemonLifecycle, OneDaemonPerStateDirectory) {
  Daemon first;
  ASSERT_TRUE(first.Start()) << first.error();
  // Same state directory, another socket path.
  e2e::Command c;
  c.argv = {e2e::AgentboxBin(), "serve", "--state-dir", first.state_dir(), "--socket", first.root() + "/second.sock"};
  c.env = first.Env();
  c.timeout_ms = 20000;
  e2e::RunResult r = e2e::RunCommand(c);
  EXPECT_NE(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "another daemon")) << r.Describe();
  // And the same socket with another state directory: it answers, so it is kept.
  TempDir other("agentbox-session-other-");
  c.argv = {e2e::AgentboxBin(), "serve", "--state-dir", other / "state", "--socket", first.socket()};
  r = e2e::RunCommand(c);
  EXPECT_NE(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "already answers")) << r.Describe();
  EXPECT_EQ(Call(first.client(), "GET", "/v1/health").status, 200);
}

TEST(DaemonLifecycle, SigkillAndRestartKeepSessionsLogsAndFiles) {
  TempDir ws("agentbox-session-ws-");
  Daemon d;
  ASSERT_TRUE(d.Start()) << d.error();
  std::string id = CreateSession(d.client(), ws.path());
  json w = Execute(d.client(), id, "write_file", {{"path", "kept.txt"}, {"content", "survives\n"}}, "before-1");
  ASSERT_EQ(w.value("is_error", true), false) << w.dump();
  json counted = Bash(d.client(), id, "echo x >> counter; wc -l < counter", "before-2");
  ASSERT_EQ(Output(counted), "1\n");

  // A call in flight at the kill.
  Background running(d.endpoint(), id, "echo started; echo x >> counter; sleep 300", "in-flight");
  ASSERT_TRUE(running.WaitStarted());
  const std::vector<pid_t> sandbox = d.Descendants();
  ASSERT_FALSE(sandbox.empty());
  d.Signal(SIGKILL);
  ASSERT_EQ(d.WaitExit(10000), 128 + SIGKILL);
  running.Join();
  EXPECT_TRUE(Daemon::WaitGone(sandbox, 15000)) << "sandbox processes outlived the SIGKILLed daemon";

  ASSERT_TRUE(d.Start()) << d.error();
  Answer list = Call(d.client(), "GET", "/v1/sessions");
  ASSERT_EQ(list.status, 200);
  ASSERT_EQ(list.body["sessions"].size(), 1u) << list.text;
  EXPECT_EQ(list.body["sessions"][0].value("id", ""), id);

  // The upper layer: the file written before the kill.
  EXPECT_EQ(Output(Bash(d.client(), id, "cat kept.txt")), "survives\n");
  // The log: every call before the kill, and the one in flight as interrupted.
  auto log = d.client().Call("GET", "/v1/sessions/" + id + "/log");
  ASSERT_TRUE(log.ok());
  EXPECT_TRUE(Contains(log->body, "\"before-1\"")) << log->body;
  EXPECT_TRUE(Contains(log->body, "\"before-2\"")) << log->body;
  bool interrupted = false;
  for (const auto& line : e2e::Lines(log->body)) {
    if (Contains(line, "\"in-flight\"") && Contains(line, "interrupted")) interrupted = true;
  }
  EXPECT_TRUE(interrupted) << "the call in flight is not recorded as interrupted:\n" << log->body;
  // Replays still come from the log, across the restart.
  json replay = Bash(d.client(), id, "echo x >> counter; wc -l < counter", "before-2");
  EXPECT_EQ(replay.value("replayed", false), true) << replay.dump();
  EXPECT_EQ(Output(replay), "1\n");
  // Another command under the same call_id is a conflict, naming the difference; nothing runs.
  Answer other = Call(d.client(), "POST", "/v1/sessions/" + id + "/execute",
                      {{"name", "bash"}, {"input", {{"command", "echo never >> counter"}}}, {"call_id", "in-flight"}});
  EXPECT_EQ(other.status, 409) << other.text;
  EXPECT_TRUE(Contains(other.message(), "call_id in-flight was recorded with input.command")) << other.text;
  json again = Bash(d.client(), id, "echo started; echo x >> counter; sleep 300", "in-flight");
  EXPECT_EQ(again.value("replayed", false), true) << again.dump();
  EXPECT_EQ(again.value("kind", ""), "interrupted") << again.dump();
  EXPECT_FALSE(Contains(Output(Bash(d.client(), id, "cat counter")), "never"));
}

// Calls of one session that end together share the log's fdatasync (group
// commit): a SIGKILL while several run side by side loses none that was
// answered, and runs none again.
TEST(DaemonLifecycle, SigkillLosesNoAnsweredCallOfConcurrentCalls) {
  TempDir ws("agentbox-session-ws-");
  Daemon d;
  ASSERT_TRUE(d.Start()) << d.error();
  const std::string id = CreateSession(d.client(), ws.path());
  ASSERT_FALSE(Bash(d.client(), id, "true").value("is_error", true));
  auto command = [](const std::string& call_id) { return "echo " + call_id + " >> ran.txt; echo " + call_id; };

  // Clients calling side by side until the daemon is gone; each keeps what
  // it sent and what was answered (with its output).
  constexpr int kClients = 4;
  constexpr int kAnsweredBeforeKill = 60;
  std::atomic<int> answered_total{0};
  std::vector<std::vector<std::string>> sent(kClients);
  std::vector<std::map<std::string, std::string>> answered(kClients);
  std::vector<std::thread> clients;
  for (int k = 0; k < kClients; ++k) {
    clients.emplace_back([&, k] {
      daemon::Client client(d.endpoint());
      for (int i = 0; i < 10000; ++i) {
        const std::string call_id = "c" + std::to_string(k) + "-" + std::to_string(i);
        sent[k].push_back(call_id);
        Answer a = Call(client, "POST", "/v1/sessions/" + id + "/execute",
                        {{"name", "bash"}, {"input", {{"command", command(call_id)}}}, {"call_id", call_id}});
        if (a.status != 200) return;  // the daemon is gone
        answered[k][call_id] = a.body.value("output", "");
        ++answered_total;
      }
    });
  }
  // Killed right after an answer went out, with the others' calls running.
  while (answered_total.load() < kAnsweredBeforeKill) std::this_thread::yield();
  d.Signal(SIGKILL);
  ASSERT_EQ(d.WaitExit(10000), 128 + SIGKILL);
  for (auto& t : clients) t.join();

  ASSERT_TRUE(d.Start()) << d.error();
  std::size_t checked = 0, unanswered = 0;
  for (int k = 0; k < kClients; ++k) {
    for (const std::string& call_id : sent[k]) {
      json r = Bash(d.client(), id, command(call_id), call_id);
      auto it = answered[k].find(call_id);
      if (it != answered[k].end()) {
        // Answered before the kill: in the log, the same result again.
        EXPECT_EQ(r.value("replayed", false), true) << call_id << " was answered and is lost: " << r.dump();
        EXPECT_EQ(Output(r), it->second) << call_id;
        EXPECT_EQ(it->second, call_id + "\n") << call_id;
        ++checked;
      } else {
        ++unanswered;
      }
    }
  }
  EXPECT_GE(checked, static_cast<std::size_t>(kAnsweredBeforeKill));
  EXPECT_GE(unanswered, static_cast<std::size_t>(kClients));  // each client's last call at least
  // Each call ran once at most: a call that had begun is replayed (as
  // interrupted or with its result), never run a second time.
  const std::string ran = Output(Bash(d.client(), id, "cat ran.txt"));
  std::map<std::string, int> runs;
  for (const auto& line : e2e::Lines(ran)) ++runs[line];
  for (const auto& [call_id, n] : runs) EXPECT_EQ(n, 1) << call_id << " ran " << n << " times";
  for (int k = 0; k < kClients; ++k) {
    for (const auto& [call_id, output] : answered[k]) EXPECT_EQ(runs[call_id], 1) << call_id;
  }
}

TEST(DaemonLifecycle, SigtermLetsCallsInFlightFinish) {
  TempDir ws("agentbox-session-ws-");
  Daemon d;
  ASSERT_TRUE(d.Start()) << d.error();
  std::string id = CreateSession(d.client(), ws.path());
  Background running(d.endpoint(), id, "echo started; sleep 1; echo finished", "graceful");
  ASSERT_TRUE(running.WaitStarted());
  d.Signal(SIGTERM);
  // New connections are refused once the shutdown began.
  for (int i = 0; i < 500 && d.LogEvent("shutdown_begin").is_null(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(d.LogEvent("shutdown_begin").is_null());
  EXPECT_EQ(d.LogEvent("shutdown_begin").value("calls_in_flight", 0), 1);
  daemon::Client late(d.endpoint());
  auto refused = late.Call("GET", "/v1/health");
  EXPECT_FALSE(refused.ok() && refused->status == 200) << "a new request was served during shutdown";

  running.Join();
  EXPECT_EQ(running.result().value("kind", ""), "exited") << running.result().dump();
  EXPECT_EQ(running.result().value("output", ""), "started\nfinished\n");
  EXPECT_EQ(d.WaitExit(30000), 0) << d.output();
  EXPECT_FALSE(d.LogEvent("shutdown_done").is_null());
  EXPECT_FALSE(e2e::Exists(d.socket()));

  ASSERT_TRUE(d.Start()) << d.error();
  EXPECT_EQ(Call(d.client(), "GET", "/v1/sessions/" + id).status, 200) << "the session did not persist";
  json replay = Bash(d.client(), id, "echo started; sleep 1; echo finished", "graceful");
  EXPECT_EQ(replay.value("replayed", false), true);
  EXPECT_EQ(Output(replay), "started\nfinished\n");
}

TEST(DaemonLifecycle, SigtermPastTheGraceInterruptsTheCall) {
  TempDir ws("agentbox-session-ws-");
  Daemon d;
  ASSERT_TRUE(d.Start({"--grace", "1s"})) << d.error();
  std::string id = CreateSession(d.client(), ws.path());
  Background running(d.endpoint(), id, "echo started; sleep 300", "too-long");
  ASSERT_TRUE(running.WaitStarted());
  const std::vector<pid_t> sandbox = d.Descendants();
  d.Signal(SIGTERM);
  EXPECT_EQ(d.WaitExit(30000), 0) << d.output();
  running.Join();
  EXPECT_TRUE(Daemon::WaitGone(sandbox, 10000)) << "sandbox processes outlived the daemon";
  if (running.transport_ok()) {
    EXPECT_NE(running.result().value("kind", ""), "exited") << running.result().dump();
  }
  ASSERT_TRUE(d.Start()) << d.error();
  auto log = d.client().Call("GET", "/v1/sessions/" + id + "/log");
  ASSERT_TRUE(log.ok());
  bool recorded = false;
  for (const auto& line : e2e::Lines(log->body)) {
    if (Contains(line, "\"too-long\"") && (Contains(line, "interrupted") || Contains(line, "cancelled"))) recorded = true;
  }
  EXPECT_TRUE(recorded) << log->body;
}

}  // namespace
}  // namespace agentbox::session_test
