// Services, ports and the background log through the daemon's API and CLI.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "daemon_fixture.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;
using e2e::TempDir;

constexpr const char* kPython = "/usr/bin/python3";

std::string HttpGet(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  std::string out;
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET / HTTP/1.0\r\n\r\n";
    (void)!write(fd, req.data(), req.size());
    char buf[4096];
    for (;;) {
      struct pollfd p = {fd, POLLIN, 0};
      if (poll(&p, 1, 10000) <= 0) break;
      ssize_t n = read(fd, buf, sizeof(buf));
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
  }
  if (fd >= 0) close(fd);
  return out;
}

template <class F>
bool Eventually(F ok) {
  for (int i = 0; i < 200; ++i) {
    if (ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

class ServicesApiTest : public OneSessionTest {
 protected:
  std::string P(const std::string& rest) { return "/v1/sessions/" + id_ + rest; }
  e2e::RunResult Cli(const std::vector<std::string>& args) {
    e2e::Command cmd;
    cmd.argv = {e2e::AgentboxBin(), "session", "--socket", d_.socket()};
    cmd.argv.insert(cmd.argv.end(), args.begin(), args.end());
    cmd.env = d_.Env();
    cmd.cwd = ws_.path();
    cmd.timeout_ms = 120000;
    return e2e::RunCommand(cmd);
  }
};

TEST_F(ServicesApiTest, RequestsAreChecked) {
  Answer unknown = Call(c(), "POST", P("/services"), {{"name", "x"}, {"command", "true"}, {"restart", "always"}});
  EXPECT_EQ(unknown.status, 400) << unknown.text;
  EXPECT_TRUE(Contains(unknown.message(), "'restart'")) << unknown.text;
  Answer bad_name = Call(c(), "POST", P("/services"), {{"name", "../up"}, {"command", "true"}});
  EXPECT_EQ(bad_name.status, 400) << bad_name.text;
  EXPECT_TRUE(Contains(bad_name.message(), "../up")) << bad_name.text;
  Answer bad_env = Call(c(), "POST", P("/services"), {{"name", "x"}, {"command", "true"}, {"env", {{"A", 1}}}});
  EXPECT_EQ(bad_env.status, 400) << bad_env.text;
  EXPECT_TRUE(Contains(bad_env.message(), "env.A")) << bad_env.text;
  Answer no_command = Call(c(), "POST", P("/services"), {{"name", "x"}});
  EXPECT_EQ(no_command.status, 400) << no_command.text;
  Answer port_field = Call(c(), "POST", P("/ports"), {{"port", 80}, {"bind", "0.0.0.0"}});
  EXPECT_EQ(port_field.status, 400) << port_field.text;
  EXPECT_TRUE(Contains(port_field.message(), "'bind'")) << port_field.text;
  for (const json& bad : {json(0), json(65536), json("80"), json(-1)}) {
    Answer a = Call(c(), "POST", P("/ports"), {{"port", bad}});
    EXPECT_EQ(a.status, 400) << bad.dump() << ": " << a.text;
  }
  EXPECT_EQ(Call(c(), "GET", P("/services/none")).status, 404);
  EXPECT_EQ(Call(c(), "DELETE", P("/ports/80")).status, 404);
  EXPECT_EQ(Call(c(), "DELETE", P("/ports/x")).status, 400);
  EXPECT_EQ(Call(c(), "GET", "/v1/sessions/nope/services").status, 404);
  EXPECT_TRUE(d_.Children().empty()) << "a refused request started a sandbox";
}

TEST_F(ServicesApiTest, AServiceItsLogsAndItsPortOverTheApi) {
  struct stat st {};
  if (stat(kPython, &st) != 0) GTEST_SKIP() << "not applicable here: no " << kPython << " on this host";
  Answer started = Call(c(), "POST", P("/services"),
                        {{"name", "web"}, {"command", std::string(kPython) + " -u -m http.server 8090 --bind 127.0.0.1"},
                         {"env", {{"PYTHONDONTWRITEBYTECODE", "1"}}}});
  ASSERT_EQ(started.status, 201) << started.text;
  EXPECT_EQ(started.body.value("state", ""), "running") << started.text;
  Answer dup = Call(c(), "POST", P("/services"), {{"name", "web"}, {"command", "true"}});
  EXPECT_EQ(dup.status, 409) << dup.text;

  Answer exposed = Call(c(), "POST", P("/ports"), {{"port", 8090}});
  ASSERT_EQ(exposed.status, 201) << exposed.text;
  EXPECT_EQ(exposed.body.value("host", ""), "127.0.0.1");
  const int host_port = exposed.body.value("port", 0);
  ASSERT_GT(host_port, 0) << exposed.text;
  EXPECT_EQ(Call(c(), "POST", P("/ports"), {{"port", 8090}}).status, 200) << "exposing twice";
  std::string page;
  EXPECT_TRUE(Eventually([&] { return (page = HttpGet(host_port)).rfind("HTTP/1.0 200", 0) == 0; })) << page;

  Answer described = Call(c(), "GET", P(""));
  ASSERT_EQ(described.status, 200);
  ASSERT_EQ(described.body["services"].size(), 1u) << described.text;
  EXPECT_EQ(described.body["services"][0].value("name", ""), "web");
  ASSERT_EQ(described.body["ports"].size(), 1u) << described.text;
  EXPECT_EQ(described.body["ports"][0].value("inside_port", 0), 8090);

  // A follower sees what comes until the service exits.
  std::string followed;
  std::thread follower([&] {
    daemon::Client client(d_.endpoint());
    auto r = client.Call("GET", P("/services/web/logs?follow=1"), "",
                         [&](std::string_view chunk) { followed.append(chunk); });
    if (r.ok()) followed += r->body;
  });
  EXPECT_TRUE(Eventually([&] { return Contains(followed, "Serving HTTP"); })) << followed;
  HttpGet(host_port);
  EXPECT_TRUE(Eventually([&] { return Contains(followed, "\"GET / HTTP/1.0\" 200"); })) << followed;
  Answer stopped = Call(c(), "POST", P("/services/web/stop"));
  EXPECT_EQ(stopped.status, 200) << stopped.text;
  EXPECT_EQ(stopped.body.value("state", ""), "exited") << stopped.text;
  follower.join();  // the follow ends with the service

  Answer logs = Call(c(), "GET", P("/services/web/logs"));
  EXPECT_EQ(logs.status, 200);
  EXPECT_TRUE(Contains(logs.text, "Serving HTTP on 127.0.0.1 port 8090")) << logs.text;

  // The CLI: restart, ls, logs, stop --forget, ports.
  e2e::RunResult restart = Cli({"service", "restart", id_, "web"});
  EXPECT_EQ(restart.status, 0) << restart.Describe();
  e2e::RunResult ls = Cli({"service", "ls", id_});
  EXPECT_TRUE(Contains(ls.out, "web\trunning pid ")) << ls.Describe();
  EXPECT_TRUE(Contains(ls.out, "1 restarts")) << ls.Describe();
  EXPECT_TRUE(Eventually([&] { return HttpGet(host_port).rfind("HTTP/1.0 200", 0) == 0; }))
      << "the port stopped working after the restart";
  e2e::RunResult ports = Cli({"port", "ls", id_});
  EXPECT_EQ(ports.out, "8090\t127.0.0.1:" + std::to_string(host_port) + "\n") << ports.Describe();
  e2e::RunResult forget = Cli({"service", "stop", id_, "web", "--forget"});
  EXPECT_EQ(forget.status, 0) << forget.Describe();
  EXPECT_EQ(Call(c(), "GET", P("/services/web")).status, 404);
  e2e::RunResult cli_start = Cli({"service", "start", id_, "echoer", "--env", "WORD=hi there", "--", "sh", "-c",
                                  "echo \"$WORD\""});
  EXPECT_EQ(cli_start.status, 0) << cli_start.Describe();
  EXPECT_TRUE(Eventually([&] { return Cli({"service", "logs", id_, "echoer"}).out == "hi there\n"; }));
  EXPECT_EQ(Cli({"port", "rm", id_, "8090"}).status, 0);
  EXPECT_EQ(Call(c(), "GET", P("/ports")).body["ports"].size(), 0u);
}

TEST_F(ServicesApiTest, TheBackgroundLogHasWhatCallsLeftRunningWrote) {
  json r = Bash(c(), id_, "(sleep 0.3; echo after-the-call) & echo in-the-call");
  EXPECT_EQ(r.value("output", ""), "in-the-call\n") << r.dump();
  std::string log;
  EXPECT_TRUE(Eventually([&] {
    log = Call(c(), "GET", P("/background/log")).text;
    return log == "after-the-call\n";
  })) << log;
  e2e::RunResult cli = Cli({"background-log", id_});
  EXPECT_EQ(cli.out, "after-the-call\n") << cli.Describe();
}

// A client that leaves while the service still sends (the bridge's next
// write fails with EPIPE) ends its own connection only: the daemon, its
// bridge and the session go on.
TEST_F(ServicesApiTest, AClientLeavingMidAnswerEndsOnlyItsConnection) {
  struct stat st {};
  if (stat(kPython, &st) != 0) GTEST_SKIP() << "not applicable here: no " << kPython << " on this host";
  Answer started = Call(c(), "POST", P("/services"),
                        {{"name", "flood"},
                         {"command", std::string(kPython) +
                                         " -c 'import socket\ns=socket.socket(); "
                                         "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                                         "s.bind((\"127.0.0.1\", 8301)); s.listen(8)\n"
                                         "while True:\n  c,_=s.accept()\n  try:\n    c.sendall(b\"x\" * (8 << 20))\n"
                                         "  except OSError: pass\n  c.close()'"}});
  ASSERT_EQ(started.status, 201) << started.text;
  Answer exposed = Call(c(), "POST", P("/ports"), {{"port", 8301}});
  ASSERT_EQ(exposed.status, 201) << exposed.text;
  const int host_port = exposed.body.value("port", 0);
  int answered = 0;
  for (int i = 0; i < 20 && answered < 5; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(host_port));
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << "the daemon's bridge is gone";
    char byte = 0;
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 10000) > 0 && read(fd, &byte, 1) == 1) ++answered;
    // Unread data at close: a reset, then EPIPE on the bridge's next write.
    close(fd);
    if (answered == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the service starting
  }
  EXPECT_EQ(answered, 5);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(d_.running());
  Answer health = Call(c(), "GET", "/v1/health");
  EXPECT_EQ(health.status, 200) << "the daemon died: " << d_.output();
  EXPECT_EQ(Bash(c(), id_, "echo alive").value("output", ""), "alive\n");
}

// A follower that leaves is let go at once, though the service says nothing
// more: its request ends (and is logged) while the service runs on.
TEST_F(ServicesApiTest, AFollowerThatLeavesIsLetGo) {
  Answer started = Call(c(), "POST", P("/services"), {{"name", "quiet"}, {"command", "echo hello; exec sleep 600"}});
  ASSERT_EQ(started.status, 201) << started.text;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", d_.socket().c_str());
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string request = "GET " + P("/services/quiet/logs?follow=1") + " HTTP/1.1\r\nHost: agentbox\r\n\r\n";
  ASSERT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string got;
  char buf[4096];
  while (!Contains(got, "hello")) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 20000) <= 0) break;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ASSERT_TRUE(Contains(got, "hello")) << got;
  close(fd);
  auto follow_ended = [&] {
    for (const auto& e : d_.LogEvents()) {
      if (e.value("event", "") == "request" && Contains(e.value("path", ""), "/services/quiet/logs")) return true;
    }
    return false;
  };
  EXPECT_TRUE(Eventually(follow_ended)) << "the follow of a quiet service outlived its client";
  EXPECT_EQ(Call(c(), "GET", P("/services/quiet")).body.value("state", ""), "running");
}

}  // namespace
}  // namespace agentbox::session_test
