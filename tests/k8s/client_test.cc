// The Kubernetes client against FakeApiServer: kubeconfig parsing, the
// claim's life (create, ready, pod, delete), the exec stream, and the
// failures a real cluster gives (401, 409, an untrusted certificate, a claim
// that never becomes ready). Every wait is bounded.
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <openssl/evp.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "fake_api_server.h"
#include "k8s/client.h"
#include "k8s/kubeconfig.h"
#include "net/tls.h"

namespace agentbox::k8s {
namespace {

using testing::FakeApiServer;
using namespace std::chrono_literals;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/agentbox-k8s-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string p = path_ + "/" + name;
    std::ofstream(p) << text;
    return p;
  }

 private:
  std::string path_;
};

std::string Base64(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

// Reads from `fd` until EOF, at most `limit` seconds of silence.
std::string ReadAll(int fd, int limit_ms = 10000) {
  std::string out;
  char buf[65536];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, limit_ms) <= 0) {
      ADD_FAILURE() << "no EOF within " << limit_ms << " ms";
      break;
    }
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

std::string ReadN(int fd, std::size_t want) {
  std::string out;
  char buf[4096];
  while (out.size() < want) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) <= 0) break;
    const ssize_t n = ::read(fd, buf, std::min(sizeof buf, want - out.size()));
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

void WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

// The outcome and stderr lines of one exec, filled on the relay thread.
struct Seen {
  std::mutex mu;
  std::vector<std::string> stderr_lines;
  std::optional<ExecOutcome> outcome;
  std::condition_variable cv;

  ExecCallbacks Callbacks() {
    return ExecCallbacks{[this](std::string_view line) {
                           std::lock_guard<std::mutex> lock(mu);
                           stderr_lines.emplace_back(line);
                         },
                         [this](const ExecOutcome& o) {
                           std::lock_guard<std::mutex> lock(mu);
                           outcome = o;
                           cv.notify_all();
                         }};
  }
  std::optional<ExecOutcome> Wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, 10s, [this] { return outcome.has_value(); });
    return outcome;
  }
};

class K8sClient : public ::testing::Test {
 protected:
  void Start(FakeApiServer::Options options = {}) {
    std::string error;
    server_ = FakeApiServer::Start(std::move(options), &error);
    ASSERT_TRUE(server_) << error;
    server_->AddWarmPool("agents", "agentbox", "agentbox");
    spec_.namespace_name = "agents";
    spec_.template_name = "agentbox";
    spec_.kubeconfig = dir_.Write("kubeconfig", server_->Kubeconfig());
  }
  std::string Server() const { return "https://127.0.0.1:" + std::to_string(server_->port()); }

  TempDir dir_;
  std::unique_ptr<FakeApiServer> server_;
  KubernetesRemoteSpec spec_;
};

// --- kubeconfig -------------------------------------------------------------

constexpr const char* kKubeconfig = R"(apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: dev-cluster
  cluster:
    server: https://api.example.test:6443/
    certificate-authority-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==
- name: other-cluster
  cluster:
    server: https://[fd00::1]/prefix
    certificate-authority: ca.pem
contexts:
- name: dev
  context: {cluster: dev-cluster, user: dev-user}
- name: certs
  context: {cluster: other-cluster, user: cert-user}
- name: plugin
  context: {cluster: dev-cluster, user: exec-user}
- name: file-token
  context: {cluster: dev-cluster, user: file-user}
users:
- name: dev-user
  user: {token: abc.def}
- name: cert-user
  user:
    client-certificate: client.pem
    client-key-data: S0VZ
- name: exec-user
  user:
    exec: {apiVersion: client.authentication.k8s.io/v1, command: gke-gcloud-auth-plugin}
- name: file-user
  user: {tokenFile: token.txt}
)";

TEST(Kubeconfig, TokenAndInlineCaFromTheCurrentContext) {
  auto k = ParseKubeconfig(kKubeconfig, "/etc/kube/config", "");
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(k->context, "dev");
  EXPECT_EQ(k->host, "api.example.test");
  EXPECT_EQ(k->port, "6443");
  EXPECT_EQ(k->prefix, "");
  EXPECT_EQ(k->token, "abc.def");
  EXPECT_EQ(k->ca_pem, "-----BEGIN CERTIFICATE-----\n");
  EXPECT_TRUE(k->client_cert_pem.empty());
}

TEST(Kubeconfig, ClientCertificateFilesAreRelativeToTheKubeconfig) {
  TempDir dir;
  dir.Write("ca.pem", "CA");
  dir.Write("client.pem", "CERT");
  const std::string path = dir.Write("config", kKubeconfig);
  auto k = LoadKubeconfig(path, "certs");
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(k->host, "fd00::1");
  EXPECT_EQ(k->port, "443");
  EXPECT_EQ(k->prefix, "/prefix");
  EXPECT_EQ(k->ca_pem, "CA");
  EXPECT_EQ(k->client_cert_pem, "CERT");
  EXPECT_EQ(k->client_key_pem, "KEY");
  EXPECT_TRUE(k->token.empty());
}

TEST(Kubeconfig, TokenFile) {
  TempDir dir;
  dir.Write("token.txt", "from-file\n");
  auto k = LoadKubeconfig(dir.Write("config", kKubeconfig), "file-token");
  ASSERT_TRUE(k.ok()) << k.status().ToString();
  EXPECT_EQ(k->token, "from-file");
}

TEST(Kubeconfig, AMissingContextIsNamedWithTheFile) {
  auto k = ParseKubeconfig(kKubeconfig, "/etc/kube/config", "staging");
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("'staging'"), std::string::npos) << k.status().ToString();
  EXPECT_NE(k.status().message().find("/etc/kube/config"), std::string::npos);
}

TEST(Kubeconfig, AnExecPluginIsRefusedNamingTheContext) {
  auto k = ParseKubeconfig(kKubeconfig, "/etc/kube/config", "plugin");
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("context 'plugin'"), std::string::npos) << k.status().ToString();
  EXPECT_NE(k.status().message().find("exec credential plugin"), std::string::npos);
}

TEST(Kubeconfig, InsecureSkipTlsVerifyIsRefused) {
  const std::string yaml = R"(current-context: c
clusters: [{name: k, cluster: {server: "https://h", insecure-skip-tls-verify: true}}]
contexts: [{name: c, context: {cluster: k, user: u}}]
users: [{name: u, user: {token: t}}]
)";
  auto k = ParseKubeconfig(yaml, "/x", "");
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("insecure-skip-tls-verify"), std::string::npos) << k.status().ToString();
}

TEST(Kubeconfig, PlainHttpAndAMissingCredentialAreRefused) {
  const std::string http = R"(current-context: c
clusters: [{name: k, cluster: {server: "http://h:8080"}}]
contexts: [{name: c, context: {cluster: k, user: u}}]
users: [{name: u, user: {token: t}}]
)";
  EXPECT_FALSE(ParseKubeconfig(http, "/x", "").ok());
  const std::string none = R"(current-context: c
clusters: [{name: k, cluster: {server: "https://h"}}]
contexts: [{name: c, context: {cluster: k, user: u}}]
users: [{name: u, user: {}}]
)";
  auto k = ParseKubeconfig(none, "/x", "");
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.status().message().find("no token"), std::string::npos) << k.status().ToString();
}

TEST(Kubeconfig, KubeconfigVariableFirstEntry) {
  // $KUBECONFIG is process-global: changed in a child only.
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("KUBECONFIG", "/a/one:/b/two", 1);
    auto p = KubeconfigPath("");
    _exit(p.ok() && *p == "/a/one" ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  auto explicit_path = KubeconfigPath("/given");
  ASSERT_TRUE(explicit_path.ok());
  EXPECT_EQ(*explicit_path, "/given");
}

// --- claims and exec ----------------------------------------------------------

TEST_F(K8sClient, ClaimBecomesReadyAndCatEchoesBytesBack) {
  Start();
  auto sandbox = ClaimedSandbox::Claim(spec_, "session-1", 10s);
  ASSERT_TRUE(sandbox.ok()) << sandbox.status().ToString();
  EXPECT_EQ((*sandbox)->sandbox(), "agentbox-x7k2p");
  EXPECT_EQ((*sandbox)->pod(), "agentbox-pod-q9w4z");  // the pod-name annotation, not the Sandbox's name
  EXPECT_TRUE(server_->HasClaim("agents", "session-1"));

  Seen seen;
  auto fd = (*sandbox)->Exec({"cat"}, seen.Callbacks());
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  WriteAll(fd->get(), "hello\n");
  EXPECT_EQ(ReadN(fd->get(), 6), "hello\n");

  // 1 MiB through cat, written and read at once: backpressure, not buffering.
  std::string big(1 << 20, '\0');
  std::mt19937 rng(7);
  for (auto& c : big) c = static_cast<char>(rng());
  std::thread writer([&] {
    WriteAll(fd->get(), big);
    ::shutdown(fd->get(), SHUT_WR);  // stdin's end: v5's close signal
  });
  const std::string back = ReadAll(fd->get());
  writer.join();
  EXPECT_EQ(back.size(), big.size());
  EXPECT_TRUE(back == big);
  auto outcome = seen.Wait();
  ASSERT_TRUE(outcome);
  EXPECT_EQ(outcome->kind, ExecOutcome::Kind::kExited);
  EXPECT_EQ(outcome->exit_code, 0);

  bool exec_seen = false;
  for (const auto& r : server_->Requests()) {
    if (r.rfind("GET /api/v1/namespaces/agents/pods/agentbox-pod-q9w4z/exec?command=cat&", 0) == 0) exec_seen = true;
  }
  EXPECT_TRUE(exec_seen);
}

TEST_F(K8sClient, StderrLinesAndANonZeroExitFromChannel3) {
  Start();
  auto sandbox = ClaimedSandbox::Claim(spec_, "session-2", 10s);
  ASSERT_TRUE(sandbox.ok()) << sandbox.status().ToString();
  Seen seen;
  auto fd = (*sandbox)->Exec({"sh", "-c", "echo first >&2; echo second >&2; echo out; exit 3"}, seen.Callbacks());
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_EQ(ReadAll(fd->get()), "out\n");
  auto outcome = seen.Wait();
  ASSERT_TRUE(outcome);
  EXPECT_EQ(outcome->kind, ExecOutcome::Kind::kExited);
  EXPECT_EQ(outcome->exit_code, 3);
  EXPECT_EQ(outcome->reason, "NonZeroExitCode");
  std::lock_guard<std::mutex> lock(seen.mu);
  EXPECT_EQ(seen.stderr_lines, (std::vector<std::string>{"first", "second"}));
}

TEST_F(K8sClient, ClosingOurEndEndsTheRelay) {
  Start();
  auto sandbox = ClaimedSandbox::Claim(spec_, "session-3", 10s);
  ASSERT_TRUE(sandbox.ok()) << sandbox.status().ToString();
  Seen seen;
  auto fd = (*sandbox)->Exec({"cat"}, seen.Callbacks());
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  fd->reset();  // stdin closes; cat ends; the relay ends
  auto outcome = seen.Wait();
  ASSERT_TRUE(outcome);
  EXPECT_EQ(outcome->kind, ExecOutcome::Kind::kExited);
}

TEST_F(K8sClient, ReleaseDeletesTheClaimOnceAndTheDestructorToo) {
  Start();
  auto sandbox = ClaimedSandbox::Claim(spec_, "session-4", 10s);
  ASSERT_TRUE(sandbox.ok()) << sandbox.status().ToString();
  ASSERT_TRUE(server_->HasClaim("agents", "session-4"));
  EXPECT_TRUE((*sandbox)->Release().ok());
  EXPECT_FALSE(server_->HasClaim("agents", "session-4"));
  EXPECT_TRUE((*sandbox)->Release().ok());  // idempotent, no second DELETE
  int deletes = 0;
  for (const auto& r : server_->Requests()) deletes += r.rfind("DELETE ", 0) == 0;
  EXPECT_EQ(deletes, 1);
  EXPECT_FALSE((*sandbox)->Exec({"true"}, {}).ok());

  auto other = ClaimedSandbox::Claim(spec_, "session-5", 10s);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  ASSERT_TRUE(server_->HasClaim("agents", "session-5"));
  other->reset();
  EXPECT_FALSE(server_->HasClaim("agents", "session-5"));
}

TEST_F(K8sClient, ABadTokenIs401NamingTheServer) {
  Start();
  spec_.kubeconfig = dir_.Write("bad", server_->Kubeconfig("    token: not-the-token\n"));
  auto sandbox = ClaimedSandbox::Claim(spec_, "session-6", 5s);
  ASSERT_FALSE(sandbox.ok());
  const std::string m = sandbox.status().message();
  EXPECT_NE(m.find(Server()), std::string::npos) << m;
  EXPECT_NE(m.find("HTTP 401 Unauthorized"), std::string::npos) << m;
  EXPECT_FALSE(server_->HasClaim("agents", "session-6"));
}

TEST_F(K8sClient, AServerCertificateFromAnotherCaIsRefused) {
  Start();
  auto other = net::RunCa::Create({});
  ASSERT_TRUE(other.ok());
  std::string config = server_->Kubeconfig();
  const auto at = config.find("certificate-authority-data: ") + 28;
  config.replace(at, config.find('\n', at) - at, Base64((*other)->certificate_pem()));
  spec_.kubeconfig = dir_.Write("other-ca", config);
  auto sandbox = ClaimedSandbox::Claim(spec_, "session-7", 5s);
  ASSERT_FALSE(sandbox.ok());
  EXPECT_NE(sandbox.status().message().find("certificate"), std::string::npos) << sandbox.status().ToString();
  EXPECT_TRUE(server_->Requests().empty());  // nothing was sent
}

TEST_F(K8sClient, AClaimThatNeverBecomesReadyTimesOutNamingItAndIsDeleted) {
  FakeApiServer::Options options;
  options.readiness = FakeApiServer::Readiness::kNever;
  Start(options);
  const auto start = std::chrono::steady_clock::now();
  auto sandbox = ClaimedSandbox::Claim(spec_, "stuck-claim", 1500ms);
  ASSERT_FALSE(sandbox.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 8s);
  const std::string m = sandbox.status().message();
  EXPECT_NE(m.find("SandboxClaim agents/stuck-claim was not ready within 1500 ms"), std::string::npos) << m;
  EXPECT_NE(m.find("SandboxNotReady"), std::string::npos) << m;
  EXPECT_FALSE(server_->HasClaim("agents", "stuck-claim"));
}

TEST_F(K8sClient, A409OnCreateIsClearAndLeavesTheOtherClaimAlone) {
  Start();
  auto first = ClaimedSandbox::Claim(spec_, "taken", 10s);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = ClaimedSandbox::Claim(spec_, "taken", 10s);
  ASSERT_FALSE(second.ok());
  const std::string m = second.status().message();
  EXPECT_NE(m.find("HTTP 409 AlreadyExists"), std::string::npos) << m;
  EXPECT_NE(m.find("does not adopt"), std::string::npos) << m;
  EXPECT_TRUE(server_->HasClaim("agents", "taken"));
}

TEST_F(K8sClient, ATemplateWithoutAWarmPoolIsNamed) {
  Start();
  spec_.template_name = "python";
  auto sandbox = ClaimedSandbox::Claim(spec_, "session-8", 5s);
  ASSERT_FALSE(sandbox.ok());
  EXPECT_NE(sandbox.status().message().find("SandboxTemplate python"), std::string::npos) << sandbox.status().ToString();
}

TEST_F(K8sClient, APoolServingTheTemplateUnderAnotherNameIsFound) {
  Start();
  server_->AddWarmPool("agents", "py-pool", "python");
  auto config = LoadKubeconfig(spec_.kubeconfig, "");
  ASSERT_TRUE(config.ok());
  auto api = ApiClient::Create(*config);
  ASSERT_TRUE(api.ok());
  auto pool = WarmPoolFor(**api, "agents", "python", std::chrono::steady_clock::now() + 5s);
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  EXPECT_EQ(*pool, "py-pool");
}

TEST_F(K8sClient, FallsBackToV4WhenTheServerPicksIt) {
  FakeApiServer::Options options;
  options.exec_protocols = {"v4.channel.k8s.io"};
  Start(options);
  auto sandbox = ClaimedSandbox::Claim(spec_, "session-9", 10s);
  ASSERT_TRUE(sandbox.ok()) << sandbox.status().ToString();
  auto config = LoadKubeconfig(spec_.kubeconfig, "");
  ASSERT_TRUE(config.ok());
  auto api = ApiClient::Create(*config);
  ASSERT_TRUE(api.ok());
  Seen seen;
  auto stream = (*api)->Exec("agents", (*sandbox)->pod(), "", {"cat"}, seen.Callbacks(), 10s);
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  EXPECT_EQ((*stream)->protocol(), "v4.channel.k8s.io");
  linux::UniqueFd fd = (*stream)->TakeStream();
  WriteAll(fd.get(), "over v4\n");
  EXPECT_EQ(ReadN(fd.get(), 8), "over v4\n");
  ::shutdown(fd.get(), SHUT_WR);  // v4 has no close signal: the WebSocket closes
  ReadAll(fd.get());
  EXPECT_TRUE((*stream)->Wait(10s).has_value());
}

TEST_F(K8sClient, ExecWithoutACommonSubprotocolIsRefused) {
  FakeApiServer::Options options;
  options.exec_protocols = {"channel.k8s.io"};
  Start(options);
  auto sandbox = ClaimedSandbox::Claim(spec_, "session-10", 10s);
  ASSERT_TRUE(sandbox.ok()) << sandbox.status().ToString();
  auto fd = (*sandbox)->Exec({"cat"}, {});
  ASSERT_FALSE(fd.ok());
  EXPECT_NE(fd.status().message().find("refused: HTTP 403"), std::string::npos) << fd.status().ToString();
}

TEST_F(K8sClient, ExecInAPodThatIsGoneIs404) {
  Start();
  auto config = LoadKubeconfig(spec_.kubeconfig, "");
  ASSERT_TRUE(config.ok());
  auto api = ApiClient::Create(*config);
  ASSERT_TRUE(api.ok());
  auto stream = (*api)->Exec("agents", "no-such-pod", "", {"cat"}, {}, 10s);
  ASSERT_FALSE(stream.ok());
  EXPECT_NE(stream.status().message().find("HTTP 404 NotFound: pods \"no-such-pod\" not found"), std::string::npos)
      << stream.status().ToString();
}

// --- the fake refuses what the API server refuses ---------------------------------

struct Raw {
  int code = 0;
  nlohmann::json body;
};

Raw RawRequest(const FakeApiServer& server, boost::beast::http::verb verb, const std::string& target,
               const std::string& content_type, const std::string& body, bool with_token = true,
               bool upgrade = false) {
  namespace asio = boost::asio;
  namespace http = boost::beast::http;
  asio::io_context io;
  asio::ssl::context ctx(asio::ssl::context::tls_client);
  ctx.add_certificate_authority(asio::buffer(server.ca_pem()));
  ctx.set_verify_mode(asio::ssl::verify_peer);
  boost::beast::ssl_stream<asio::ip::tcp::socket> s(io, ctx);
  s.next_layer().connect({asio::ip::make_address("127.0.0.1"), server.port()});
  s.handshake(asio::ssl::stream_base::client);
  http::request<http::string_body> req{verb, target, 11};
  req.set(http::field::host, "127.0.0.1");
  if (with_token) req.set(http::field::authorization, "Bearer fake-token");
  if (!content_type.empty()) req.set(http::field::content_type, content_type);
  if (upgrade) {
    req.set(http::field::connection, "Upgrade");
    req.set(http::field::upgrade, "websocket");
    req.set(http::field::sec_websocket_version, "13");
    req.set(http::field::sec_websocket_key, "dGhlIHNhbXBsZSBub25jZQ==");
    req.set(http::field::sec_websocket_protocol, "v5.channel.k8s.io");
  }
  req.body() = body;
  req.prepare_payload();
  http::write(s, req);
  boost::beast::flat_buffer buffer;
  http::response<http::string_body> res;
  boost::system::error_code ec;
  http::read(s, buffer, res, ec);
  return Raw{static_cast<int>(res.result_int()), nlohmann::json::parse(res.body(), nullptr, false)};
}

TEST_F(K8sClient, TheFakeRefusesMalformedRequestsAsTheApiServerDoes) {
  Start();
  using boost::beast::http::verb;
  const std::string claims = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/agents/sandboxclaims";
  const std::string good = R"({"apiVersion":"extensions.agents.x-k8s.io/v1beta1","kind":"SandboxClaim",)"
                           R"("metadata":{"name":"raw"},"spec":{"warmPoolRef":{"name":"agentbox"}}})";
  auto expect = [](const Raw& r, int code, const std::string& reason) {
    EXPECT_EQ(r.code, code);
    ASSERT_TRUE(r.body.is_object()) << code;
    EXPECT_EQ(r.body.value("kind", ""), "Status");
    EXPECT_EQ(r.body.value("apiVersion", ""), "v1");
    EXPECT_EQ(r.body.value("status", ""), "Failure");
    EXPECT_EQ(r.body.value("reason", ""), reason);
    EXPECT_EQ(r.body.value("code", 0), code);
  };
  expect(RawRequest(*server_, verb::post, claims, "text/plain", good), 415, "UnsupportedMediaType");
  expect(RawRequest(*server_, verb::post, claims, "application/json", "{not json"), 400, "BadRequest");
  expect(RawRequest(*server_, verb::post, claims, "application/json", good, /*with_token=*/false), 401, "Unauthorized");
  expect(RawRequest(*server_, verb::get, "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/agents/widgets", "", ""),
         404, "NotFound");
  expect(RawRequest(*server_, verb::post, claims, "application/json",
                    R"({"apiVersion":"extensions.agents.x-k8s.io/v1beta1","kind":"SandboxClaim","metadata":{"name":"x"},"spec":{}})"),
         422, "Invalid");
  EXPECT_EQ(RawRequest(*server_, verb::post, claims, "application/json", good).code, 201);
  const Raw conflict = RawRequest(*server_, verb::post, claims, "application/json", good);
  expect(conflict, 409, "AlreadyExists");
  EXPECT_EQ(conflict.body["details"].value("name", ""), "raw");
  const std::string exec = "/api/v1/namespaces/agents/pods/p/exec?command=cat&stdin=true&stdout=true";
  const Raw plain = RawRequest(*server_, verb::post, exec, "", "");
  expect(plain, 400, "BadRequest");
  EXPECT_EQ(plain.body.value("message", ""), "Upgrade request required");
}

// --- client certificates ------------------------------------------------------------

TEST_F(K8sClient, AClientCertificateAuthenticates) {
  TempDir keys;
  const std::string d = keys.path();
  const std::string script =
      "cd " + d + " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key "
      "-out ca.pem -days 1 -subj /CN=client-ca >/dev/null 2>&1 && openssl req -newkey ec -pkeyopt "
      "ec_paramgen_curve:P-256 -nodes -keyout client.key -out client.csr -subj /CN=agentbox-user >/dev/null 2>&1 && "
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 1 "
      ">/dev/null 2>&1";
  if (std::system(script.c_str()) != 0) GTEST_SKIP() << "not applicable here: the openssl command cannot make a client certificate";
  auto read = [&](const std::string& name) {
    std::ifstream in(d + "/" + name);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  FakeApiServer::Options options;
  options.client_ca_pem = read("ca.pem");
  Start(options);
  spec_.kubeconfig = dir_.Write("cert", server_->Kubeconfig("    client-certificate-data: " + Base64(read("client.pem")) +
                                                           "\n    client-key-data: " + Base64(read("client.key")) + "\n"));
  auto sandbox = ClaimedSandbox::Claim(spec_, "cert-claim", 10s);
  ASSERT_TRUE(sandbox.ok()) << sandbox.status().ToString();
  EXPECT_TRUE(server_->HasClaim("agents", "cert-claim"));
}

}  // namespace
}  // namespace agentbox::k8s
