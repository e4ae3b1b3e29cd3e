// The egress proxy in `agentbox run`: listeners inside the sandbox's network
// namespace, served by the supervisor. The upstream is a small HTTP server
// on the host's 127.0.0.1 started by the test; nothing else is ever dialled.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>

#include "harness.h"

namespace agentbox::e2e {
namespace {

constexpr const char* kBody = "hello-from-the-host-listener";

// HTTP/1.0 on 127.0.0.1:<ephemeral>: every request gets kBody.
class HostServer {
 public:
  HostServer() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd_, 64) != 0) return;
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Loop(); });
  }
  ~HostServer() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    close(fd_);
  }
  int port() const { return port_; }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string url() const { return "http://" + target() + "/"; }
  int served() const { return served_; }

 private:
  void Loop() {
    while (!stop_) {
      pollfd p = {fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      std::string head;
      char buf[4096];
      while (head.find("\r\n\r\n") == std::string::npos) {
        pollfd q = {c, POLLIN, 0};
        if (poll(&q, 1, 5000) <= 0) break;
        ssize_t n = read(c, buf, sizeof buf);
        if (n <= 0) break;
        head.append(buf, static_cast<size_t>(n));
      }
      std::string resp = "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " +
                         std::to_string(std::string(kBody).size()) + "\r\nConnection: close\r\n\r\n" + kBody;
      (void)!send(c, resp.data(), resp.size(), MSG_NOSIGNAL);
      ++served_;
      close(c);
    }
  }
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> served_{0};
  std::thread thread_;
};

// The proxy variables, without the NO_PROXY exemption for 127.0.0.1 (the
// test's upstream is on loopback, which the plan exempts by default).
const std::string kUseProxy = "NO_PROXY= no_proxy= ";

std::string PolicyFile(const Sandbox& sb, const std::string& network) {
  std::string path = sb.scratch() + "/policy.yaml";
  WriteFile(path, "version: 1\nmode: workspace-write\nnetwork:\n" + network);
  return path;
}

const nlohmann::json* Connections(const RunResult& r) {
  if (!r.report || !(*r.report)["network"].is_object()) return nullptr;
  return &(*r.report)["network"]["connections"];
}

TEST(Network, AllowedThroughHttpProxyEnv) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  RunResult r = sb.Sh(kUseProxy + "curl -s " + server.url(), {"--allow-domain", server.target()});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, kBody)) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
  const nlohmann::json* c = Connections(r);
  ASSERT_NE(c, nullptr) << r.Describe();
  EXPECT_EQ((*c)["allowed"], 1) << r.Describe();
  EXPECT_EQ((*c)["denied"], 0) << r.Describe();
  EXPECT_GT((*c)["bytes_down"].get<int>(), 0) << r.Describe();
  ASSERT_TRUE(r.report);
  const auto& net = (*r.report)["enforcement"]["facets"]["network"];
  EXPECT_EQ(net["level"], "full") << r.Describe();
  EXPECT_EQ(net["mechanisms"], nlohmann::json({"network-namespace", "egress-proxy"})) << r.Describe();
  EXPECT_EQ(server.served(), 1);
}

TEST(Network, NotAllowedIsA403AndASandboxDenial) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  std::string policy = PolicyFile(sb, "  egress_proxy: true\n");
  RunResult r = sb.Sh("out=$(" + kUseProxy + "curl -s -i " + server.url() +
                          "); echo \"$out\"; echo \"$out\" | grep -q '^HTTP/1.1 200'",
                      {"--policy", policy});
  EXPECT_EQ(r.status, 1) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "403")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "X-Agentbox-Denied")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, kBody)) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  ASSERT_TRUE(r.report);
  bool found = false;
  for (const auto& d : (*r.report)["denials"]) {
    if (d["facet"] == "network" && d["op"] == "connect" && d["target"] == server.target() &&
        d["source"] == "proxy") {
      found = true;
      EXPECT_TRUE(Contains(d["reason"].get<std::string>(), "not-allowed")) << r.Describe();
    }
  }
  EXPECT_TRUE(found) << r.Describe();
  const nlohmann::json* c = Connections(r);
  ASSERT_NE(c, nullptr) << r.Describe();
  EXPECT_EQ((*c)["denied"], 1) << r.Describe();
  EXPECT_EQ(server.served(), 0);
}

TEST(Network, DirectConnectionBypassingTheProxyFails) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  RunResult r = sb.Sh("curl -s -m 5 --noproxy '*' " + server.url() + "; echo curl=$?",
                      {"--allow-domain", server.target()});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(r.out, kBody)) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "curl=0")) << r.Describe();
  EXPECT_EQ(server.served(), 0);
}

TEST(Network, PythonUrllibThroughTheProxy) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  RunResult r = sb.Sh(kUseProxy + "python3 -c 'import urllib.request,sys; "
                                  "sys.stdout.write(urllib.request.urlopen(\"" + server.url() +
                          "\", timeout=10).read().decode())'",
                      {"--allow-domain", server.target()});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, kBody)) << r.Describe();
}

TEST(Network, Socks5WithRemoteNames) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  RunResult r = sb.Sh("curl -s --noproxy '' --socks5-hostname 127.0.0.1:1080 " + server.url(),
                      {"--allow-domain", server.target()});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, kBody)) << r.Describe();
  const nlohmann::json* c = Connections(r);
  ASSERT_NE(c, nullptr) << r.Describe();
  EXPECT_EQ((*c)["allowed"], 1) << r.Describe();
}

TEST(Network, NetworkLogHasOneJsonLinePerConnection) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  std::string log = sb.scratch() + "/net.jsonl";
  RunResult r = sb.Sh(kUseProxy + "curl -s " + server.url() + "; " + kUseProxy + "curl -s " +
                          "http://127.0.0.1:1/ ; true",
                      {"--allow-domain", server.target(), "--network-log", log});
  EXPECT_EQ(r.status, 0) << r.Describe();
  auto text = ReadFile(log);
  ASSERT_TRUE(text) << r.Describe();
  auto lines = Lines(*text);
  ASSERT_EQ(lines.size(), 2u) << *text;
  auto first = nlohmann::json::parse(lines[0], nullptr, false);
  auto second = nlohmann::json::parse(lines[1], nullptr, false);
  ASSERT_FALSE(first.is_discarded()) << *text;
  ASSERT_FALSE(second.is_discarded()) << *text;
  EXPECT_EQ(first["decision"], "allow") << *text;
  EXPECT_EQ(first["port"], server.port()) << *text;
  EXPECT_EQ(second["decision"], "deny") << *text;
  EXPECT_EQ(second["port"], 1) << *text;
}

// on_unknown_domain: ask consults --ask-command (on the host, with the
// target on stdin); a yes cannot admit a loopback address, which only an IP
// entry in network.allow does, so the connection is still refused.
TEST(Network, AskCommandIsConsulted) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  std::string policy = PolicyFile(sb, "  on_unknown_domain: ask\n");
  std::string asked = sb.scratch() + "/asked.json";
  std::string ask = sb.scratch() + "/ask.sh";
  WriteFile(ask, "#!/bin/sh\ncat > '" + asked + "'\necho allow\n", 0755);
  RunResult r = sb.Sh(kUseProxy + "curl -s " + server.url() + "; true", {"--policy", policy, "--ask-command", ask});
  EXPECT_EQ(r.status, 0) << r.Describe();
  auto question = ReadFile(asked);
  ASSERT_TRUE(question) << r.Describe();
  EXPECT_TRUE(Contains(*question, "\"port\":" + std::to_string(server.port()))) << *question;
  EXPECT_TRUE(HasDenial(r, server.target())) << r.Describe();
  EXPECT_EQ(server.served(), 0);
}

TEST(Network, UnknownDomainWithoutAskCommandIsDenied) {
  HostServer server;
  ASSERT_GT(server.port(), 0);
  Sandbox sb;
  std::string policy = PolicyFile(sb, "  on_unknown_domain: ask\n");
  RunResult r = sb.Sh(kUseProxy + "curl -s -o /dev/null -w '%{http_code}' " + server.url(), {"--policy", policy});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "403")) << r.Describe();
  EXPECT_TRUE(HasDenial(r, server.target())) << r.Describe();
}

TEST(Network, NoProxyWithoutNetworkNeeds) {
  Sandbox sb;
  RunResult r = sb.Sh("env | grep -ci _proxy; true");
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "0")) << r.Describe();
  ASSERT_TRUE(r.report);
  EXPECT_FALSE(r.report->contains("network")) << r.Describe();
}

}  // namespace
}  // namespace agentbox::e2e
