// Who may talk to the daemon: the unix socket's owner (and root) only,
// loopback TCP only with the bearer token; the client refuses sockets that
// are not private.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/listen.h"
#include "daemon_fixture.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;
using e2e::TempDir;

// A uid that is neither root nor the test's own.
constexpr uid_t kOtherUid = 65534;

const std::string kToken = "0123456789abcdef0123456789abcdef";

std::string WriteToken(const TempDir& dir, const std::string& token, mode_t mode) {
  const std::string path = dir / "token";
  e2e::WriteFile(path, token + "\n", mode);
  chmod(path.c_str(), mode);
  return path;
}

// The port from the daemon's "listening" log line.
uint16_t ListeningPort(const Daemon& d) {
  json e = d.LogEvent("listening");
  std::string address = e.is_object() ? e.value("address", "") : "";
  auto colon = address.rfind(':');
  return colon == std::string::npos ? 0 : static_cast<uint16_t>(std::stoi(address.substr(colon + 1)));
}

daemon::Endpoint Tcp(uint16_t port, const std::string& token) {
  daemon::Endpoint e;
  e.host = "127.0.0.1";
  e.port = port;
  e.token = token;
  e.timeout_ms = 60000;
  return e;
}

TEST(DaemonAuth, TcpNeedsTheBearerToken) {
  TempDir secrets("agentbox-session-token-");
  Daemon d;
  ASSERT_TRUE(d.Start({"--listen", "127.0.0.1:0", "--token-file", WriteToken(secrets, kToken, 0600)})) << d.error();
  const uint16_t port = ListeningPort(d);
  ASSERT_NE(port, 0) << "no listening address in the log";

  daemon::Client none(Tcp(port, ""));
  Answer a = Call(none, "GET", "/v1/health");
  EXPECT_EQ(a.status, 401) << a.text;
  EXPECT_EQ(a.code(), "unauthorized");
  EXPECT_TRUE(Contains(a.message(), "Bearer")) << a.text;

  std::string wrong = kToken;
  wrong.back() = wrong.back() == 'f' ? 'e' : 'f';  // same length, last byte differs
  daemon::Client bad(Tcp(port, wrong));
  EXPECT_EQ(Call(bad, "GET", "/v1/health").status, 401);
  daemon::Client prefix(Tcp(port, kToken.substr(0, 16)));
  EXPECT_EQ(Call(prefix, "GET", "/v1/health").status, 401);
  daemon::Client longer(Tcp(port, kToken + "0"));
  EXPECT_EQ(Call(longer, "GET", "/v1/health").status, 401);
  // Refused before routing: an unknown path is 401 too, not 404.
  EXPECT_EQ(Call(bad, "POST", "/v1/sessions", {{"workspace", "/tmp"}}).status, 401);
  EXPECT_TRUE(Call(d.client(), "GET", "/v1/sessions").body["sessions"].empty()) << "an unauthorised create went through";

  daemon::Client good(Tcp(port, kToken));
  Answer ok = Call(good, "GET", "/v1/health");
  EXPECT_EQ(ok.status, 200) << ok.text;
  bool logged = false;
  for (const auto& e : d.LogEvents()) logged = logged || e.value("event", "") == "unauthorized";
  EXPECT_TRUE(logged) << "no log line for the refused requests";
}

TEST(DaemonAuth, TokenFileMustBePrivate) {
  TempDir secrets("agentbox-session-token-");
  Daemon d;
  const std::string token = WriteToken(secrets, kToken, 0644);
  EXPECT_GT(d.StartExpectingFailure({"--listen", "127.0.0.1:0", "--token-file", token}), 0);
  EXPECT_TRUE(Contains(d.error(), token)) << d.error();
  EXPECT_TRUE(Contains(d.error(), "0644")) << d.error();
  EXPECT_FALSE(e2e::Exists(d.socket())) << "it listened before refusing";

  const std::string short_token = WriteToken(secrets, "short", 0600);
  EXPECT_GT(d.StartExpectingFailure({"--listen", "127.0.0.1:0", "--token-file", short_token}), 0);
  EXPECT_TRUE(Contains(d.error(), "at least")) << d.error();
}

TEST(DaemonAuth, TcpOnlyOnLoopbackAndOnlyWithAToken) {
  TempDir secrets("agentbox-session-token-");
  const std::string token = WriteToken(secrets, kToken, 0600);
  Daemon d;
  // Refused while parsing the flag: nothing is bound to these addresses.
  EXPECT_GT(d.StartExpectingFailure({"--listen", "0.0.0.0:0", "--token-file", token}), 0);
  EXPECT_TRUE(Contains(d.error(), "not a loopback address")) << d.error();
  EXPECT_GT(d.StartExpectingFailure({"--listen", "[::]:0", "--token-file", token}), 0);
  EXPECT_TRUE(Contains(d.error(), "not a loopback address")) << d.error();
  EXPECT_GT(d.StartExpectingFailure({"--listen", "localhost:0", "--token-file", token}), 0);
  EXPECT_TRUE(Contains(d.error(), "localhost")) << d.error();
  EXPECT_GT(d.StartExpectingFailure({"--listen", "127.0.0.1:0"}), 0);
  EXPECT_TRUE(Contains(d.error(), "--token-file")) << d.error();
  EXPECT_FALSE(e2e::Exists(d.socket()));
}

TEST(DaemonAuth, ClientRefusesASocketOthersCanUse) {
  Daemon d;
  ASSERT_TRUE(d.Start()) << d.error();
  ASSERT_EQ(chmod(d.socket().c_str(), 0666), 0);
  e2e::Command c;
  c.argv = {e2e::AgentboxBin(), "session", "--socket", d.socket(), "ls"};
  c.env = d.Env();
  e2e::RunResult r = e2e::RunCommand(c);
  EXPECT_NE(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "refusing to connect to " + d.socket())) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "0666")) << r.Describe();

  daemon::Client lib(d.endpoint());
  auto refused = lib.Call("GET", "/v1/health");
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(Contains(refused.status().message(), "refusing")) << refused.status().ToString();

  ASSERT_EQ(chmod(d.socket().c_str(), 0600), 0);
  r = e2e::RunCommand(c);
  EXPECT_EQ(r.status, 0) << r.Describe();
}

TEST(DaemonAuth, ClientRefusesASocketOwnedBySomeoneElse) {
  if (geteuid() != 0) GTEST_SKIP() << "not applicable here: only root can give the socket to another uid";
  Daemon d;
  ASSERT_TRUE(d.Start()) << d.error();
  ASSERT_EQ(chown(d.socket().c_str(), kOtherUid, kOtherUid), 0);
  Status s = daemon::CheckSocketIsPrivate(d.socket());
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(Contains(s.message(), "belongs to uid " + std::to_string(kOtherUid))) << s.message();
  e2e::Command c;
  c.argv = {e2e::AgentboxBin(), "session", "--socket", d.socket(), "ls"};
  c.env = d.Env();
  e2e::RunResult r = e2e::RunCommand(c);
  EXPECT_NE(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "belongs to uid")) << r.Describe();
}

TEST(DaemonAuth, AnotherUidGets403EvenThroughAnOpenSocket) {
  if (geteuid() != 0) GTEST_SKIP() << "not applicable here: only root can connect as another uid";
  Daemon d;
  // The socket in a directory others may traverse, so that only the
  // daemon's own peer check stands between them and the API.
  TempDir open_dir("agentbox-session-open-");
  chmod(open_dir.path().c_str(), 0755);
  const std::string sock = open_dir / "agentbox.sock";
  d.UseSocket(sock);
  ASSERT_TRUE(d.Start()) << d.error();

  const std::string request = "GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  // At mode 0600 the kernel already refuses them.
  std::string denied = RawExchange(sock, request, 10000, kOtherUid);
  EXPECT_TRUE(Contains(denied, "CONNECT-FAILED")) << denied;

  ASSERT_EQ(chmod(sock.c_str(), 0666), 0);
  std::string forbidden = RawExchange(sock, request, 10000, kOtherUid);
  EXPECT_EQ(RawStatus(forbidden), 403) << forbidden;
  EXPECT_TRUE(Contains(forbidden, "uid " + std::to_string(kOtherUid))) << forbidden;
  const std::string create = json{{"workspace", "/tmp"}}.dump();
  std::string post = RawExchange(sock,
                                 "POST /v1/sessions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: " +
                                     std::to_string(create.size()) + "\r\n\r\n" + create,
                                 10000, kOtherUid);
  EXPECT_EQ(RawStatus(post), 403) << post;

  json refused = d.LogEvent("peer_refused");
  ASSERT_TRUE(refused.is_object()) << "no log line for the refused peer";
  EXPECT_EQ(refused.value("uid", 0u), kOtherUid);

  // Root (the test) is still served.
  EXPECT_EQ(RawStatus(RawExchange(sock, request)), 200);
  EXPECT_TRUE(Call(d.client(), "GET", "/v1/sessions").body["sessions"].empty());
}

}  // namespace
}  // namespace agentbox::session_test
