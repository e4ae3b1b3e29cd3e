// Credentials in sessions, through the daemon's API: the daemon reads a
// session's secrets from their sources (here its own environment) and hands
// them to the world's supervisor, whose proxy terminates TLS for the secret's
// host and adds the credential; the sandbox sees only a placeholder.
// POST /v1/sessions/{id}/secrets gives a new value to the running world
// (same supervisor) and to every later world of the session.
//
// The upstream is a python3 HTTPS server on the host's 127.0.0.1, named
// api.test, with a certificate from a test CA made by the openssl CLI (the
// e2e fixtures). The daemon runs in a mount namespace of its own (and, when
// not root, a user namespace mapping only the caller's ids) where a hosts
// file is bound over /etc/hosts and the test CA over OpenSSL's default trust
// file; TheDaemonsSslCertFileIsTheTrustOfItsWorlds shows the daemon's own
// SSL_CERT_FILE reaching its worlds instead.
#include <gtest/gtest.h>
#include <openssl/x509.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "daemon_fixture.h"
#include "ladder_workloads.h"
#include "net_fixtures.h"
#include "scoped_env.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;

// HTTPS on 127.0.0.1 with the certificate and key in argv[1:3]. Prints
// "REQ <method> <path> <the Authorization field, or -none->" before each
// answer leaves; answers 200 to a request with a bearer token, 401 to any
// other, and never echoes the field.
const std::string kBearerServer = R"PY(
import http.server, json, ssl, sys
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        got = self.headers.get("Authorization")
        print("REQ %s %s %s" % (self.command, self.path, got if got is not None else "-none-"), flush=True)
        bearer = got is not None and got.startswith("Bearer ")
        data = (json.dumps({"path": self.path, "bearer": bearer}, sort_keys=True) + "\n").encode()
        self.send_response(200 if bearer else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *args):
        pass
)PY" + std::string(e2e::kThreadingServerMain);

const char* const kPolicy = R"(version: 1
mode: workspace-write
network:
  allow: ["api.test", "127.0.0.1"]
credentials:
  secrets:
    api:
      from: { env: API_TOKEN }
      hosts: [api.test]
      inject: { header: Authorization, format: "Bearer {}" }
      placeholder_env: API_TOKEN_PLACEHOLDER
)";

// The value of "<name>=" on a line of `text`, or "" when no line has it.
std::string EnvValue(const std::string& text, const std::string& name) {
  for (const auto& line : e2e::Lines(text)) {
    if (line.rfind(name + "=", 0) == 0) return line.substr(name.size() + 1);
  }
  return "";
}

using test_support::ScopedEnv;

// The test CA, the bearer server on api.test, and a daemon whose secret
// API_TOKEN is in its environment only.
class SessionCredentials : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* tool : {"python3", "openssl", "curl"}) {
      if (e2e::FindTool(tool).empty()) GTEST_SKIP() << "not applicable here: " << tool << " is not installed";
    }
    trust_file_ = X509_get_default_cert_file();
    if (!e2e::Exists(trust_file_)) {
      GTEST_SKIP() << "not applicable here: OpenSSL's default trust file " << trust_file_
                   << " does not exist, so the test CA cannot be bound in its place";
    }
    sb_ = std::make_unique<e2e::Sandbox>(e2e::Sandbox::GitRepo::kNone);
    ca_ = std::make_unique<e2e::TestCa>(sb_->scratch());
    ASSERT_TRUE(ca_->ok) << ca_->log;
    api_ = std::make_unique<e2e::HostScript>(*sb_, "bearer_server.py", kBearerServer,
                                             std::vector<std::string>{ca_->server_pem, ca_->server_key});
    ASSERT_GT(api_->port(), 0) << api_->Output();
    token_ = "tok-first-" + e2e::RandomHex(16);
    rotated_ = "tok-rotated-" + e2e::RandomHex(16);
  }

  // Starts the daemon under e2e::kWithBinds: the hosts file over /etc/hosts and,
  // with `bind_trust`, the test CA over OpenSSL's default trust file.
  // SSL_CERT_FILE names the test CA in the daemon's environment either way.
  void StartDaemon(bool bind_trust = true) {
    const std::string scratch = sb_->scratch();
    e2e::WriteFile(scratch + "/hosts", "127.0.0.1 api.test\n");
    e2e::WriteFile(scratch + "/with_binds.py", e2e::kWithBinds);
    std::string binds = scratch + "/hosts /etc/hosts";
    if (bind_trust) binds += " " + ca_->ca_pem + " " + trust_file_;
    const std::string wrapper = scratch + "/agentbox";
    e2e::WriteFile(wrapper,
                   "#!/bin/sh\nexec " + e2e::Python() + " " + scratch + "/with_binds.py " + binds + " -- " +
                       e2e::AgentboxBin() + " \"$@\"\n",
                   0755);
    d_.extra_env = {"SSL_CERT_FILE=" + ca_->ca_pem, "API_TOKEN=" + token_};
    ScopedEnv bin("AGENTBOX_BIN", wrapper);  // the fixture starts $AGENTBOX_BIN
    ASSERT_TRUE(d_.Start()) << d_.error();
  }

  daemon::Client& c() { return d_.client(); }
  std::string Url(const std::string& path) const {
    return "https://api.test:" + std::to_string(api_->port()) + path;
  }
  // curl inside the session; its output ends with "HTTP <status>".
  json Curl(const std::string& id, const std::string& path) {
    return Bash(c(), id, "curl -sS --max-time 20 -w '\\nHTTP %{http_code}\\n' " + Url(path));
  }
  // The call ran and the upstream answered 200 (it saw a bearer token).
  void ExpectAnswered(const json& r) {
    EXPECT_EQ(r.value("exit_code", -1), 0) << r.dump();
    EXPECT_TRUE(Contains(Output(r), "\nHTTP 200\n")) << r.dump() << "\n" << api_->Output();
  }
  std::string Create() { return CreateSession(c(), ws_.path(), {{"policy", kPolicy}}); }
  pid_t SandboxPid(const std::string& id) {
    Answer a = Call(c(), "GET", "/v1/sessions/" + id);
    EXPECT_EQ(a.status, 200) << a.text;
    return a.body.is_object() ? a.body.value("sandbox_pid", -1) : -1;
  }
  Answer Rotate(const std::string& id, const json& body) {
    return Call(c(), "POST", "/v1/sessions/" + id + "/secrets", body);
  }
  // The server's line for `path`, once it has printed one ("" if it did not).
  std::string Seen(const std::string& path) {
    const std::string prefix = "REQ GET " + path + " ";
    for (const auto& line : e2e::Lines(api_->Output(prefix, 10000))) {
      if (line.rfind(prefix, 0) == 0) return line;
    }
    return "";
  }
  std::string SawBearer(const std::string& path, const std::string& value) {
    return "REQ GET " + path + " Bearer " + value;
  }
  // Neither value (nor any of `more`) in the session's log, the daemon's log
  // file or its output.
  void ExpectNoValueLogged(const std::string& id, std::vector<std::string> more = {}) {
    Answer log = Call(c(), "GET", "/v1/sessions/" + id + "/log");
    ASSERT_EQ(log.status, 200) << log.text;
    EXPECT_TRUE(Contains(log.text, "\"bash\"")) << "the session's log holds no calls: " << log.text;
    const std::string daemon_log = e2e::ReadFile(d_.log_path()).value_or("");
    const std::string daemon_out = d_.output();
    more.push_back(token_);
    more.push_back(rotated_);
    for (const std::string& value : more) {
      EXPECT_FALSE(Contains(log.text, value)) << "in the session's log:\n" << log.text;
      EXPECT_FALSE(Contains(daemon_log, value)) << "in the daemon's log:\n" << daemon_log;
      EXPECT_FALSE(Contains(daemon_out, value)) << "in the daemon's output:\n" << daemon_out;
    }
  }

  std::string trust_file_, token_, rotated_;
  std::unique_ptr<e2e::Sandbox> sb_;
  std::unique_ptr<e2e::TestCa> ca_;
  std::unique_ptr<e2e::HostScript> api_;
  e2e::TempDir ws_{"agentbox-session-ws-"};  // outlives the daemon
  Daemon d_;
};

// On a microVM: the world's supervisor on the host holds the values and
// ends TLS for the guest, which sees the placeholder only; a rotation takes
// effect in the running VM, and no value crosses into it.
TEST_F(SessionCredentials, InAMicrovmTheHostAddsTheTokenAndARotationReachesTheRunningVm) {
  if (!e2e::MicrovmLack().empty()) GTEST_SKIP() << "not applicable here: " << e2e::MicrovmLack();
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string id = CreateSession(c(), ws_.path(), {{"policy", std::string(kPolicy) +
                                                                        "sandbox: { isolation: microvm }\n"}});
  ASSERT_FALSE(id.empty());
  json r = Bash(c(), id, "uname -r; curl -sS --max-time 60 " + Url("/first") + "; echo; env");
  EXPECT_EQ(r.value("exit_code", -1), 0) << r.dump() << api_->Output();
  const std::string out = Output(r);
  EXPECT_TRUE(Contains(out, e2e::GuestRelease() + "\n")) << "not the guest kernel: " << out;
  EXPECT_EQ(Seen("/first"), SawBearer("/first", token_)) << api_->Output();
  EXPECT_EQ(EnvValue(out, "API_TOKEN_PLACEHOLDER").rfind("agentbox-placeholder-api-", 0), 0u) << out;
  EXPECT_FALSE(Contains(out, token_)) << out;
  Answer a = Rotate(id, {{"name", "api"}, {"value", rotated_}});
  ASSERT_EQ(a.status, 200) << a.text;
  json second = Curl(id, "/second");
  ExpectAnswered(second);
  EXPECT_EQ(Seen("/second"), SawBearer("/second", rotated_)) << api_->Output();
  ExpectNoValueLogged(id);
}

// The token reaches the upstream; inside, `env` shows the placeholder and
// nothing shows the token; the daemon's environment no longer holds it.
TEST_F(SessionCredentials, CurlInsideGetsTheTokenAndTheSandboxOnlyThePlaceholder) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  json r = Bash(c(), id, "curl -sS --max-time 20 " + Url("/first") + "; echo; env; cat /proc/self/environ | tr '\\0' '\\n'");
  EXPECT_EQ(r.value("kind", ""), "exited") << r.dump();
  EXPECT_EQ(r.value("exit_code", -1), 0) << r.dump();
  const std::string out = Output(r);
  EXPECT_TRUE(Contains(out, "\"bearer\": true")) << out << api_->Output();
  EXPECT_EQ(Seen("/first"), SawBearer("/first", token_)) << api_->Output();
  const std::string placeholder = EnvValue(out, "API_TOKEN_PLACEHOLDER");
  EXPECT_EQ(placeholder.rfind("agentbox-placeholder-api-", 0), 0u) << out;
  EXPECT_TRUE(EnvValue(out, "API_TOKEN").empty()) << out;
  EXPECT_FALSE(Contains(out, token_)) << out;
  const std::string environ = e2e::ReadFile("/proc/" + std::to_string(d_.pid()) + "/environ").value_or("");
  EXPECT_TRUE(Contains(environ, "SSL_CERT_FILE=")) << "the daemon's environment could not be read";
  EXPECT_FALSE(Contains(environ, token_)) << "the daemon's /proc/PID/environ still holds the token";
  const pid_t sup = SandboxPid(id);
  ASSERT_GT(sup, 0);
  const std::string sup_environ = e2e::ReadFile("/proc/" + std::to_string(sup) + "/environ").value_or("");
  EXPECT_FALSE(Contains(sup_environ, token_)) << "the world's supervisor has the token in its environment";
  ExpectNoValueLogged(id);
}

// A rotation reaches the running world: the next request carries the new
// value and the supervisor is the same process. Names and values the
// session cannot take are refused; no value is ever logged.
TEST_F(SessionCredentials, RotationReachesTheRunningWorld) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  json r = Curl(id, "/before");
  ExpectAnswered(r);
  EXPECT_EQ(Seen("/before"), SawBearer("/before", token_)) << api_->Output();
  const pid_t sup = SandboxPid(id);
  ASSERT_GT(sup, 0);

  Answer a = Rotate(id, {{"name", "api"}, {"value", rotated_}});
  EXPECT_EQ(a.status, 200) << a.text;
  EXPECT_EQ(a.body, json({{"rotated", "api"}})) << a.text;
  EXPECT_FALSE(Contains(a.text, rotated_));

  r = Curl(id, "/after");
  ExpectAnswered(r);
  EXPECT_EQ(Seen("/after"), SawBearer("/after", rotated_)) << api_->Output();
  EXPECT_EQ(SandboxPid(id), sup) << "the rotation restarted the world";

  // Refused, and the value in force stays.
  Answer unknown = Rotate(id, {{"name", "nope"}, {"value", "x-" + e2e::RandomHex(8)}});
  EXPECT_EQ(unknown.status, 400) << unknown.text;
  EXPECT_EQ(unknown.code(), "bad_request") << unknown.text;
  EXPECT_TRUE(Contains(unknown.message(), "nope")) << unknown.text;
  Answer empty = Rotate(id, {{"name", "api"}, {"value", ""}});
  EXPECT_EQ(empty.status, 400) << empty.text;
  Answer control = Rotate(id, {{"name", "api"}, {"value", "bad\r\nX-Injected: 1"}});
  EXPECT_EQ(control.status, 400) << control.text;
  EXPECT_FALSE(Contains(control.text, "X-Injected")) << "the refusal echoes the value: " << control.text;
  Answer no_value = Rotate(id, {{"name", "api"}});
  EXPECT_EQ(no_value.status, 400) << no_value.text;
  Answer extra = Rotate(id, {{"name", "api"}, {"value", rotated_}, {"more", 1}});
  EXPECT_EQ(extra.status, 400) << extra.text;
  EXPECT_FALSE(Contains(extra.text, rotated_)) << extra.text;
  Answer no_session = Call(c(), "POST", "/v1/sessions/s-0000000000000000/secrets", {{"name", "api"}, {"value", "v"}});
  EXPECT_EQ(no_session.status, 404) << no_session.text;

  r = Curl(id, "/still");
  ExpectAnswered(r);
  EXPECT_EQ(Seen("/still"), SawBearer("/still", rotated_)) << api_->Output();

  // Each of several rotations in a row is the value of the request after it.
  std::vector<std::string> values;
  for (int i = 0; i < 8; ++i) {
    values.push_back("tok-again-" + std::to_string(i) + "-" + e2e::RandomHex(8));
    ASSERT_EQ(Rotate(id, {{"name", "api"}, {"value", values.back()}}).status, 200);
    const std::string path = "/again-" + std::to_string(i);
    ExpectAnswered(Curl(id, path));
    EXPECT_EQ(Seen(path), SawBearer(path, values.back())) << api_->Output();
  }
  EXPECT_EQ(SandboxPid(id), sup);
  ExpectNoValueLogged(id, values);
}

// A rotation reaches a connection that is already open: one curl sends a
// request every 250 ms over one tunnel, the value changes half way, and the
// requests after it carry the new value, the ones before the old.
TEST_F(SessionCredentials, RotationReachesAnOpenConnection) {
  e2e::Command help;
  help.argv = {e2e::FindTool("curl"), "--help", "all"};
  if (!Contains(e2e::RunCommand(help).out, "--rate")) {
    GTEST_SKIP() << "not applicable here: this curl has no --rate (curl 7.84 or later has)";
  }
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  ExpectAnswered(Curl(id, "/warm"));  // the world is up before the clock starts
  constexpr int kRequests = 12;
  std::string urls;
  for (int i = 0; i < kRequests; ++i) urls += " -o /dev/null " + Url("/open-" + std::to_string(i));
  json run;
  std::thread call([&] {
    daemon::Client own(d_.endpoint());
    run = Bash(own, id, "curl -sS --max-time 60 --rate 4/s -w '%{http_code} %{num_connects}\\n'" + urls);
  });
  const bool started = Contains(api_->Output("REQ GET /open-2 ", 20000), "REQ GET /open-2 ");
  Answer a = Rotate(id, {{"name", "api"}, {"value", rotated_}});
  call.join();
  ASSERT_TRUE(started) << api_->Output();
  ASSERT_EQ(a.status, 200) << a.text;
  EXPECT_EQ(run.value("exit_code", -1), 0) << run.dump();
  // Every transfer got 200, all but the first on the first one's connection.
  std::vector<std::string> transfers = e2e::Lines(Output(run));
  ASSERT_EQ(transfers.size(), static_cast<size_t>(kRequests)) << Output(run);
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(transfers[i], i == 0 ? "200 1" : "200 0") << "transfer " << i << ":\n" << Output(run);
  }
  // The old value up to some request, the new one from then on.
  int switched_at = -1;
  for (int i = 0; i < kRequests; ++i) {
    const std::string path = "/open-" + std::to_string(i);
    const std::string seen = Seen(path);
    if (seen == SawBearer(path, rotated_)) {
      if (switched_at < 0) switched_at = i;
    } else {
      EXPECT_EQ(seen, SawBearer(path, token_)) << api_->Output();
      EXPECT_LT(switched_at, 0) << "the old value came back at " << path << ":\n" << api_->Output();
    }
  }
  EXPECT_GT(switched_at, 2) << api_->Output();  // /open-2 was seen before the rotation
  EXPECT_GE(switched_at, 0) << "the open connection never got the new value:\n" << api_->Output();
  ExpectNoValueLogged(id);
}

// A world that dies is replaced by one that starts with the rotated value,
// not the source's (which the daemon still holds).
TEST_F(SessionCredentials, ARestartedWorldUsesTheRotatedValue) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  json r = Curl(id, "/one");
  ExpectAnswered(r);
  EXPECT_EQ(Seen("/one"), SawBearer("/one", token_)) << api_->Output();
  Answer a = Rotate(id, {{"name", "api"}, {"value", rotated_}});
  ASSERT_EQ(a.status, 200) << a.text;
  const pid_t sup = SandboxPid(id);
  ASSERT_GT(sup, 0);
  ASSERT_EQ(kill(sup, SIGKILL), 0);
  ASSERT_TRUE(Daemon::WaitGone({sup}, 10000));

  // A world whose death the daemon meets only while sending a call ends that
  // call as a sandbox_error that says the next one starts afresh
  // (docs/sessions.md), and the whole of a killed process (its threads, its
  // descriptors) may take a moment to go: the fresh world is what this test
  // is about, so it asks until one answers, for 15 s at most.
  const long deadline = e2e::NowMs() + 15000;
  do {
    r = Curl(id, "/two");
    if (r.value("kind", "") != "sandbox_error") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (e2e::NowMs() < deadline);
  ExpectAnswered(r);
  EXPECT_EQ(Seen("/two"), SawBearer("/two", rotated_)) << api_->Output();
  const pid_t next = SandboxPid(id);
  EXPECT_GT(next, 0);
  EXPECT_NE(next, sup) << "no new world after the old one was killed";
  Answer log = Call(c(), "GET", "/v1/sessions/" + id + "/log");
  EXPECT_TRUE(Contains(log.text, "\"reprovisioned\"")) << log.text;
  ExpectNoValueLogged(id);
}

// A value given before the first call is the first world's: the source is
// not used for it.
TEST_F(SessionCredentials, ARotationBeforeTheFirstCallIsTheFirstWorldsValue) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  Answer a = Rotate(id, {{"name", "api"}, {"value", rotated_}});
  EXPECT_EQ(a.status, 200) << a.text;
  EXPECT_TRUE(d_.Children().empty()) << "a rotation started the session's world";
  json r = Curl(id, "/first");
  ExpectAnswered(r);
  EXPECT_EQ(Seen("/first"), SawBearer("/first", rotated_)) << api_->Output();
  ExpectNoValueLogged(id);
}

// A session without secrets has no name to rotate.
TEST_F(SessionCredentials, ASessionWithoutSecretsRefusesARotation) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string id = CreateSession(c(), ws_.path());
  ASSERT_FALSE(id.empty());
  Answer a = Rotate(id, {{"name", "api"}, {"value", rotated_}});
  EXPECT_EQ(a.status, 400) << a.text;
  EXPECT_EQ(a.code(), "bad_request") << a.text;
  EXPECT_FALSE(Contains(a.text, rotated_)) << a.text;
}

// The daemon's SSL_CERT_FILE is what its worlds verify upstreams against,
// as `agentbox run` does with its own: here only the hosts file is bound,
// and the test CA is named by SSL_CERT_FILE in the daemon's environment alone
// (World::Start hands SSL_CERT_FILE and SSL_CERT_DIR to the world).
TEST_F(SessionCredentials, TheDaemonsSslCertFileIsTheTrustOfItsWorlds) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon(/*bind_trust=*/false));
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  json r = Curl(id, "/trusted");
  ExpectAnswered(r);
  EXPECT_EQ(Seen("/trusted"), SawBearer("/trusted", token_)) << api_->Output();
}

}  // namespace
}  // namespace agentbox::session_test
