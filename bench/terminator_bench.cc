// The TLS terminator's cost, as ratios against a plain CONNECT tunnel in the
// same run, on loopback:
//   1. one HTTPS request on a fresh connection (CONNECT + TLS handshake + GET
//      + response): p50/p90/p99, tunnel vs terminated, and the p50 added;
//      then requests on one kept-alive connection each: the p50 added per
//      request;
//   2. bulk download (/bulk?n=BYTES) through the tunnel vs the terminator:
//      MiB/s and the ratio, per round;
//   3. CONCURRENT connections held open after one request each: the proxy's
//      RSS growth per connection, tunnel vs terminated.
// The upstream is an HTTPS/1.1 keep-alive server in this process, its
// certificates from a CA of its own: as api.test it holds a secret (the
// terminator ends its TLS, injects the token and masks it in responses), as
// rules.test it has network.http_rules only (terminated, nothing injected,
// so nothing to mask), as plain.test the terminator does not cover it (a
// tunnel, the client trusting the upstream's CA, the SNI checked as on 443).
// Each client trusts one CA only, so a handshake that succeeds shows which
// path the connection took.
// The proxy runs in forked child processes (as it will in the supervisor):
// one for 1 and 2, a fresh one for each RSS figure, so that each RSS is its
// own. The terminator trusts the upstream through SSL_CERT_FILE, set in the
// child only. Prints figures, ratios and the two targets; asserts nothing.
//
//   terminator_bench [CONNS [BYTES [ROUNDS [CONCURRENT [KEEPALIVE]]]]]
//   (defaults 500 fresh connections per side, 268435456 bytes, 5 rounds,
//    200 concurrent connections, 1000 kept-alive requests per side)
//
// Tunnel and terminated measurements alternate (and so do their order), so
// that a neighbour's load hits both alike. CPU seconds are the endpoints'
// (this process: client and upstream) and the proxy process's.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_net.h"
#include "net/proxy.h"
#include "net/secrets.h"
#include "net/terminator.h"
#include "net/tls.h"

namespace {

using namespace agentbox::bench;

namespace net = agentbox::net;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "s3cr3t-token-value-0123456789";
constexpr const char* kSecretHost = "api.test";   // a secret: terminated, injected, masked
constexpr const char* kRulesHost = "rules.test";  // http_rules only: terminated, nothing injected
constexpr const char* kPlainHost = "plain.test";  // not covered: a tunnel

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }




bool SslWriteAll(SSL* s, const char* p, std::size_t n) {
  while (n > 0) {
    int w = SSL_write(s, p, static_cast<int>(std::min<std::size_t>(n, 1 << 20)));
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// --- the upstream ---------------------------------------------------------------

// One HTTPS/1.1 keep-alive connection: GET /bulk?n=N answers N bytes, any
// other target a small JSON body. Requests carry no body here.
void ServeHttps(SSL_CTX* ctx, int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  static const std::string kBlock(256 * 1024, 'x');
  SSL* s = SSL_new(ctx);
  SSL_set_fd(s, fd);
  if (SSL_accept(s) == 1) {
    std::string in;
    char buf[16384];
    while (true) {
      std::size_t end;
      while ((end = in.find("\r\n\r\n")) == std::string::npos) {
        int n = SSL_read(s, buf, sizeof buf);
        if (n <= 0) break;
        in.append(buf, static_cast<std::size_t>(n));
      }
      if (end == std::string::npos) break;
      const std::size_t sp = in.find(' ');
      const std::string target = in.substr(sp + 1, in.find(' ', sp + 1) - sp - 1);
      in.erase(0, end + 4);
      if (target.rfind("/bulk?n=", 0) == 0) {
        std::size_t n = std::stoull(target.substr(8));
        std::string head = "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: " +
                           std::to_string(n) + "\r\n\r\n";
        bool ok = SslWriteAll(s, head.data(), head.size());
        for (std::size_t sent = 0; ok && sent < n; sent += kBlock.size()) {
          ok = SslWriteAll(s, kBlock.data(), std::min(kBlock.size(), n - sent));
        }
        if (!ok) break;
      } else {
        const std::string body = "{\"id\":1296269,\"name\":\"hello-world\",\"full_name\":\"acme/hello-world\","
                                 "\"private\":false,\"path\":\"" + target + "\"}";
        const std::string out = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                                std::to_string(body.size()) + "\r\n\r\n" + body;
        if (!SslWriteAll(s, out.data(), out.size())) break;
      }
    }
  }
  SSL_free(s);
  ::close(fd);
}

void AcceptHttps(SSL_CTX* ctx, int listen_fd) {
  while (true) {
    int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    std::thread(ServeHttps, ctx, c).detach();
  }
}

// --- the proxy process ------------------------------------------------------------

// The proxy with a terminator for api.test (a secret) and rules.test
// (http_rules), plain.test tunnelled. Sends the run CA's PEM on `pem_fd`,
// then serves until killed.
[[noreturn]] void RunProxy(int listen_fd, int pem_fd, const std::string& upstream_ca_file, std::uint16_t plain_port) {
  ::setenv("SSL_CERT_FILE", upstream_ca_file.c_str(), 1);  // the upstream's CA is this host's trust store
  boost::asio::io_context io;
  net::StaticResolver resolver(io);
  for (const char* h : {kSecretHost, kRulesHost, kPlainHost}) resolver.Add(h, {net::IpAddress::V4(0x7f000001)});
  agentbox::SecretSpec api;
  api.name = "api";
  api.from.kind = agentbox::SecretSource::Kind::kFile;
  api.from.file = "/nonexistent";  // the value is set below
  api.hosts = {kSecretHost};
  api.placeholder_env = "API_TOKEN";
  auto store = net::SecretStore::Create({api});
  agentbox::Status set = store.ok() ? (*store)->SetForTest(0, kToken) : store.status();
  if (!set.ok()) {
    std::fprintf(stderr, "secret store: %s\n", set.ToString().c_str());
    _exit(2);
  }
  agentbox::CredentialsSpec credentials;
  credentials.secrets = {api};
  auto made = net::Terminator::Create(credentials, {{kRulesHost, {"GET /**"}}}, *store, {});
  if (!made.ok()) {
    std::fprintf(stderr, "terminator: %s\n", made.status().ToString().c_str());
    _exit(2);
  }
  std::shared_ptr<net::Terminator> terminator = std::move(*made);
  const std::string& pem = terminator->ca_pem();
  if (::write(pem_fd, pem.data(), pem.size()) != static_cast<ssize_t>(pem.size())) _exit(2);
  ::close(pem_fd);
  // Names that resolve to loopback pass the address guard only with the address allowed too.
  auto rules = net::RuleSet::Build({kSecretHost, kRulesHost, kPlainHost, "127.0.0.1"}, {}, agentbox::NetDefault::kDeny);
  if (!rules.ok()) _exit(2);
  net::ProxyOptions options;
  options.terminator = terminator;
  options.sni_ports = {443, plain_port};  // the tunnel's ClientHello is checked as on :443
  net::Proxy proxy(io, std::move(*rules), options, resolver, nullptr, nullptr);
  if (!proxy.Serve(listen_fd, net::ListenerKind::kHttp).ok()) _exit(1);
  io.run();
  _exit(0);
}

struct ProxyChild {
  pid_t pid = -1;
  std::uint16_t port = 0;
  SSL_CTX* trust_run = nullptr;  // a client trusting this child's run CA
};

SSL_CTX* ClientContext(const std::string& ca_pem) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  BIO* bio = BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size()));
  X509* ca = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  if (ca == nullptr || X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), ca) != 1) {
    std::fprintf(stderr, "cannot read a CA certificate\n");
    std::exit(1);
  }
  X509_free(ca);
  BIO_free(bio);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  static const unsigned char kHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  SSL_CTX_set_alpn_protos(ctx, kHttp11, sizeof kHttp11);
  return ctx;
}

// --- the client ---------------------------------------------------------------------

// CONNECT through the proxy, then TLS checking the host name, then
// HTTP/1.1 requests on the one connection.
class Client {
 public:
  struct Times {
    Clock::duration connect{}, handshake{}, request{};
  };
  Client() = default;
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client() { Close(); }

  bool Open(std::uint16_t proxy, SSL_CTX* ctx, const std::string& host, std::uint16_t port, Times* t = nullptr) {
    auto t0 = Clock::now();
    fd_ = Connect(proxy);
    if (fd_ < 0) return false;
    host_ = host + ":" + std::to_string(port);
    const std::string req = "CONNECT " + host_ + " HTTP/1.1\r\nHost: " + host_ + "\r\n\r\n";
    if (!SendAll(fd_, req.data(), req.size())) return false;
    std::string head;
    char c;
    while (head.size() < 4096 && (head.size() < 4 || head.compare(head.size() - 4, 4, "\r\n\r\n") != 0)) {
      if (::recv(fd_, &c, 1, 0) != 1) return false;
      head += c;
    }
    if (head.rfind("HTTP/1.1 200", 0) != 0) {
      std::fprintf(stderr, "CONNECT %s: %.200s\n", host_.c_str(), head.c_str());
      return false;
    }
    auto t1 = Clock::now();
    ssl_ = SSL_new(ctx);
    SSL_set_tlsext_host_name(ssl_, host.c_str());
    SSL_set1_host(ssl_, host.c_str());
    SSL_set_fd(ssl_, fd_);
    if (SSL_connect(ssl_) != 1) {
      ERR_print_errors_fp(stderr);
      return false;
    }
    if (t != nullptr) {
      t->connect = t1 - t0;
      t->handshake = Clock::now() - t1;
    }
    return true;
  }

  // One GET and its whole response; the body's size in `body`. False on
  // anything but a complete 200.
  bool Get(const std::string& path, std::size_t* body = nullptr) {
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: " + host_ +
                            "\r\nUser-Agent: terminator_bench\r\nAccept: */*\r\n\r\n";
    if (!SslWriteAll(ssl_, req.data(), req.size())) return false;
    std::size_t end;
    while ((end = in_.find("\r\n\r\n")) == std::string::npos) {
      if (!Read()) return false;
    }
    if (in_.rfind("HTTP/1.1 200", 0) != 0) {
      std::fprintf(stderr, "response: %.200s\n", in_.c_str());
      return false;
    }
    std::size_t length = 0;
    for (const char* name : {"Content-Length: ", "content-length: "}) {
      std::size_t at = in_.find(name);
      if (at != std::string::npos && at < end) length = std::stoull(in_.substr(at + 16));
    }
    std::size_t have = in_.size() - (end + 4);
    while (have < length) {
      int n = SSL_read(ssl_, big_.data(), static_cast<int>(std::min(big_.size(), length - have)));
      if (n <= 0) return false;
      have += static_cast<std::size_t>(n);
    }
    in_.erase(0, std::min(in_.size(), end + 4 + length));
    if (body != nullptr) *body = length;
    return true;
  }

  void Close() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (fd_ >= 0) ::close(fd_);
    ssl_ = nullptr;
    fd_ = -1;
    in_.clear();
  }

 private:
  bool Read() {
    char buf[16384];
    int n = SSL_read(ssl_, buf, sizeof buf);
    if (n <= 0) return false;
    in_.append(buf, static_cast<std::size_t>(n));
    return true;
  }

  int fd_ = -1;
  SSL* ssl_ = nullptr;
  std::string host_;
  std::string in_;
  std::vector<char> big_ = std::vector<char>(256 * 1024);
};

// --- figures ---------------------------------------------------------------------------

struct Site {
  const char* host;
  std::uint16_t port = 0;
  int fd = -1;
  SSL_CTX* server = nullptr;
};

struct Bulk {
  double mib_s = -1, self_cpu = 0, proxy_cpu = 0;  // CPU: seconds per GiB
};

Bulk Download(const ProxyChild& proxy, SSL_CTX* ctx, const Site& site, std::size_t bytes) {
  Bulk b;
  Client c;
  if (!c.Open(proxy.port, ctx, site.host, site.port)) return b;
  const double self0 = SelfCpuSeconds(), proxy0 = CpuSeconds(proxy.pid);
  auto t0 = Clock::now();
  std::size_t got = 0;
  if (!c.Get("/bulk?n=" + std::to_string(bytes), &got) || got != bytes) return b;
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const double gib = static_cast<double>(bytes) / (1 << 30);
  b.mib_s = static_cast<double>(bytes) / s / (1 << 20);
  b.self_cpu = (SelfCpuSeconds() - self0) / gib;
  b.proxy_cpu = (CpuSeconds(proxy.pid) - proxy0) / gib;
  return b;
}

// CONCURRENT connections to `site`, one GET each, held open: the proxy's RSS
// growth per connection. One connection first, completed and closed, so
// that what any first connection sets up once (a leaf certificate, OpenSSL's
// tables) is not counted.
double RssPerConnection(const ProxyChild& proxy, SSL_CTX* ctx, const Site& site, int count, long* before,
                        long* after, int* errors) {
  {
    Client warm;
    if (!warm.Open(proxy.port, ctx, site.host, site.port) || !warm.Get("/warm")) ++*errors;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  *before = RssKiB(proxy.pid);
  std::vector<std::unique_ptr<Client>> open;
  for (int i = 0; i < count; ++i) {
    auto c = std::make_unique<Client>();
    if (!c->Open(proxy.port, ctx, site.host, site.port) || !c->Get("/repos/acme/hello-world")) {
      ++*errors;
      continue;
    }
    open.push_back(std::move(c));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  *after = RssKiB(proxy.pid);
  open.clear();
  return static_cast<double>(*after - *before) / count;
}

const char* Mark(bool ok) { return ok ? "✓" : "✗"; }

}  // namespace

int main(int argc, char** argv) {
  const int conns = argc > 1 ? std::max(1, std::atoi(argv[1])) : 500;
  const std::size_t bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (std::size_t{256} << 20);
  const int rounds = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
  const int concurrent = argc > 4 ? std::max(1, std::atoi(argv[4])) : 200;
  const int keepalive = argc > 5 ? std::max(1, std::atoi(argv[5])) : 1000;
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &lim);
  ::signal(SIGPIPE, SIG_IGN);
  const auto started = Clock::now();

  // The upstream's CA and its certificates, one listener per name.
  auto made = net::RunCa::Create({});
  if (!made.ok()) {
    std::fprintf(stderr, "upstream CA: %s\n", made.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<net::RunCa> upstream_ca = std::move(*made);
  const std::string ca_file =
      (std::filesystem::temp_directory_path() / ("terminator-bench-ca-" + std::to_string(::getpid()) + ".pem")).string();
  std::ofstream(ca_file) << upstream_ca->certificate_pem();
  Site secret{kSecretHost}, rules{kRulesHost}, plain{kPlainHost};
  for (Site* s : {&secret, &rules, &plain}) {
    auto ctx = upstream_ca->ServerContext(s->host);
    if (!ctx.ok()) return 1;
    s->server = *ctx;
    // Real upstreams hand out session tickets (RunCa's own contexts do not):
    // the terminator resumes with them, as it would with a real host.
    SSL_CTX_set_num_tickets(s->server, 2);
    s->fd = Listen(&s->port);
  }

  // Three proxy processes, forked before any thread exists: A for the
  // latency and bulk figures, B and C fresh for one RSS figure each.
  ProxyChild children[3];
  for (ProxyChild& child : children) {
    int listen_fd = Listen(&child.port);
    int pem[2];
    if (::pipe2(pem, O_CLOEXEC) != 0) return 1;
    child.pid = ::fork();
    if (child.pid == 0) {
      ::close(pem[0]);
      for (Site* s : {&secret, &rules, &plain}) ::close(s->fd);
      RunProxy(listen_fd, pem[1], ca_file, plain.port);
    }
    ::close(listen_fd);
    ::close(pem[1]);
    std::string ca_pem;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(pem[0], buf, sizeof buf)) > 0) ca_pem.append(buf, static_cast<std::size_t>(n));
    ::close(pem[0]);
    if (ca_pem.empty()) {
      std::fprintf(stderr, "the proxy process did not start\n");
      return 1;
    }
    child.trust_run = ClientContext(ca_pem);
  }
  SSL_CTX* trust_upstream = ClientContext(upstream_ca->certificate_pem());
  for (Site* s : {&secret, &rules, &plain}) std::thread(AcceptHttps, s->server, s->fd).detach();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const ProxyChild& proxy = children[0];

  std::printf("terminator_bench: %d fresh connections per side, %d kept-alive requests per side, bulk %.0f MiB x %d "
              "rounds, %d concurrent connections\n",
              conns, keepalive, static_cast<double>(bytes) / (1 << 20), rounds, concurrent);

  // 1a. A fresh connection: CONNECT + handshake + one GET + response.
  std::vector<double> total[2], connect[2], handshake[2], request[2];
  int fresh_errors = 0;
  const double fresh_cpu0 = CpuSeconds(proxy.pid);
  for (int i = 0; i < conns; ++i) {
    for (int k = 0; k < 2; ++k) {
      const int terminated = (i + k) % 2;  // the order alternates too
      Client c;
      Client::Times t;
      auto t0 = Clock::now();
      bool ok = terminated ? c.Open(proxy.port, proxy.trust_run, secret.host, secret.port, &t)
                           : c.Open(proxy.port, trust_upstream, plain.host, plain.port, &t);
      auto t1 = Clock::now();
      ok = ok && c.Get("/repos/acme/hello-world");
      auto t2 = Clock::now();
      c.Close();
      if (!ok) {
        ++fresh_errors;
        continue;
      }
      total[terminated].push_back(Ms(t2 - t0));
      connect[terminated].push_back(Ms(t.connect));
      handshake[terminated].push_back(Ms(t.handshake));
      request[terminated].push_back(Ms(t2 - t1));
    }
  }
  const double fresh_cpu_ms = (CpuSeconds(proxy.pid) - fresh_cpu0) * 1e3 / conns;
  const char* side[2] = {"tunnel    ", "terminated"};
  std::printf("\n1. one HTTPS request on a fresh connection (ms; errors %d; proxy CPU %.3f ms per tunnel + "
              "terminated pair)\n",
              fresh_errors, fresh_cpu_ms);
  std::printf("                 p50     p90     p99   | p50 of: CONNECT  handshake  GET+response\n");
  for (int k = 0; k < 2; ++k) {
    std::printf("   %s  %6.3f  %6.3f  %6.3f  |         %6.3f   %6.3f     %6.3f\n", side[k], Percentile(total[k], 0.5),
                Percentile(total[k], 0.9), Percentile(total[k], 0.99), Percentile(connect[k], 0.5),
                Percentile(handshake[k], 0.5), Percentile(request[k], 0.5));
  }
  const double fresh_added = Percentile(total[1], 0.5) - Percentile(total[0], 0.5);
  std::printf("   added at p50: %.3f ms (target <= 1.000)\n", fresh_added);

  // 1b. Requests on one kept-alive connection per side, alternating.
  std::vector<double> kept[2];
  int kept_errors = 0;
  {
    Client c[2];
    bool ok = c[0].Open(proxy.port, trust_upstream, plain.host, plain.port) &&
              c[1].Open(proxy.port, proxy.trust_run, secret.host, secret.port) && c[0].Get("/warm") &&
              c[1].Get("/warm");  // the terminator's upstream handshake is done at the first request
    for (int i = 0; ok && i < keepalive; ++i) {
      for (int k = 0; k < 2; ++k) {
        const int terminated = (i + k) % 2;
        auto t0 = Clock::now();
        if (!c[terminated].Get("/repos/acme/hello-world?page=" + std::to_string(i))) {
          ++kept_errors;
          ok = false;
          break;
        }
        kept[terminated].push_back(Ms(Clock::now() - t0));
      }
    }
    if (!ok) ++kept_errors;
  }
  std::printf("   one kept-alive connection, %d requests each (ms; errors %d)\n", keepalive, kept_errors);
  for (int k = 0; k < 2; ++k) {
    std::printf("   %s  %6.3f  %6.3f  %6.3f\n", side[k], Percentile(kept[k], 0.5), Percentile(kept[k], 0.9),
                Percentile(kept[k], 0.99));
  }
  const double kept_added = Percentile(kept[1], 0.5) - Percentile(kept[0], 0.5);
  std::printf("   added per request at p50: %.3f ms\n", kept_added);

  // 2. Bulk: tunnel, terminated with a secret (the response is scanned for
  // it), terminated by http_rules only (nothing to scan), alternating.
  std::printf("\n2. bulk download of %.0f MiB (MiB/s; CPU s/GiB: endpoints, proxy)\n", static_cast<double>(bytes) / (1 << 20));
  std::vector<double> ratios, rules_ratios;
  Bulk best[3];
  for (int r = 0; r < rounds; ++r) {
    Bulk b[3];
    b[0] = Download(proxy, trust_upstream, plain, bytes);
    b[1] = Download(proxy, proxy.trust_run, secret, bytes);
    b[2] = Download(proxy, proxy.trust_run, rules, bytes);
    std::printf("   round %d: tunnel %5.0f (%.2f, %.2f); terminated %5.0f (%.2f, %.2f), ratio %.2f; "
                "terminated, no secret %5.0f (%.2f, %.2f), ratio %.2f\n",
                r + 1, b[0].mib_s, b[0].self_cpu, b[0].proxy_cpu, b[1].mib_s, b[1].self_cpu, b[1].proxy_cpu,
                b[1].mib_s / b[0].mib_s, b[2].mib_s, b[2].self_cpu, b[2].proxy_cpu, b[2].mib_s / b[0].mib_s);
    ratios.push_back(b[1].mib_s / b[0].mib_s);
    rules_ratios.push_back(b[2].mib_s / b[0].mib_s);
    for (int k = 0; k < 3; ++k) {
      if (b[k].mib_s > best[k].mib_s) best[k] = b[k];
    }
  }
  const double bulk_ratio = Percentile(ratios, 0.5);
  std::printf("   best: tunnel %.0f, terminated %.0f, terminated without a secret %.0f MiB/s; median round ratio "
              "%.2f (target >= 0.50), without a secret %.2f\n",
              best[0].mib_s, best[1].mib_s, best[2].mib_s, bulk_ratio, Percentile(rules_ratios, 0.5));

  // 3. RSS per open connection, each in a fresh proxy process.
  long tb = 0, ta = 0, xb = 0, xa = 0;
  int tunnel_errors = 0, term_errors = 0;
  const double rss_tunnel = RssPerConnection(children[1], trust_upstream, plain, concurrent, &tb, &ta, &tunnel_errors);
  const double rss_term =
      RssPerConnection(children[2], children[2].trust_run, secret, concurrent, &xb, &xa, &term_errors);
  std::printf("\n3. %d concurrent connections, one request each, kept open: proxy RSS\n", concurrent);
  std::printf("   tunnel      %ld → %ld KiB, %.1f KiB/connection (errors %d)\n", tb, ta, rss_tunnel, tunnel_errors);
  std::printf("   terminated  %ld → %ld KiB, %.1f KiB/connection (errors %d)\n", xb, xa, rss_term, term_errors);

  // A side with no figure at all (every attempt failed) meets no target.
  const bool fresh_ok = !total[0].empty() && !total[1].empty() && fresh_added <= 1.0;
  const bool bulk_ok = !ratios.empty() && std::all_of(ratios.begin(), ratios.end(), [](double r) { return r > 0; }) &&
                       bulk_ratio >= 0.5;
  std::printf("\n%-44s %10s %11s %9s %s\n", "", "tunnel", "terminated", "added", "target");
  std::printf("%-44s %10.3f %11.3f %9.3f <= 1 ms %s\n", "fresh HTTPS request, p50 (ms)", Percentile(total[0], 0.5),
              Percentile(total[1], 0.5), fresh_added, Mark(fresh_ok));
  std::printf("%-44s %10.3f %11.3f %9.3f\n", "fresh HTTPS request, p99 (ms)", Percentile(total[0], 0.99),
              Percentile(total[1], 0.99), Percentile(total[1], 0.99) - Percentile(total[0], 0.99));
  std::printf("%-44s %10.3f %11.3f %9.3f\n", "kept-alive request, p50 (ms)", Percentile(kept[0], 0.5),
              Percentile(kept[1], 0.5), kept_added);
  std::printf("%-44s %10.0f %11.0f %8.2fx >= 0.5x %s\n", "bulk, best round (MiB/s; ratio: median round)", best[0].mib_s,
              best[1].mib_s, bulk_ratio, Mark(bulk_ok));
  std::printf("%-44s %10.2f %11.2f\n", "bulk, proxy CPU (s/GiB, best round)", best[0].proxy_cpu, best[1].proxy_cpu);
  std::printf("%-44s %10.1f %11.1f %9.1f\n", "RSS per open connection (KiB)", rss_tunnel, rss_term,
              rss_term - rss_tunnel);
  std::printf("(%.1f s)\n", std::chrono::duration<double>(Clock::now() - started).count());
  std::fflush(stdout);

  for (ProxyChild& child : children) {
    ::kill(child.pid, SIGTERM);
    ::waitpid(child.pid, nullptr, 0);
  }
  std::filesystem::remove(ca_file);
  _exit(0);  // the upstream's threads are detached and still in accept
}
