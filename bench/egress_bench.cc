// Transparent egress (the DNS served inside the sandbox and the connect()
// broker) against direct connections, measured in the same run:
//   1. bulk transfer (1 GiB by default) over a connection the broker opened
//      and installed in the sandbox, against the same transfer direct, through
//      the proxy's CONNECT relay (HTTP_PROXY inside the sandbox) and through
//      the reference relay (bench_net.h);
//   2. connect() + close() of an allowed connection from inside the sandbox
//      against the same from outside: p50, p99 and what the broker adds;
//   3. a UDP DNS query for an allowed name, answered from the supervisor's
//      cache: p50, p99;
//   4. `agentbox run -- /bin/true` against bubblewrap, and a policy with
//      network.allow (proxy, DNS listeners, broker) against the same policy
//      without it.
// Prints figures and ratios; asserts nothing.
//
//   egress_bench [BYTES [ROUNDS]]   (default 1073741824 bytes, 9 rounds; needs root)
//
// The sandbox's loopback is its own, so the servers cannot be on 127.0.0.1:
// the bench makes a network namespace and a mount namespace of its own, puts
// 198.18.0.10 (the benchmarking range of RFC 2544, on no real network) on
// that namespace's loopback, and binds a hosts file naming it bench.test
// over /etc/hosts, where the supervisor's resolver finds it. Every client is
// this binary run again (`egress_bench --client ...`), inside the sandbox or
// outside it, and it times itself: agentbox's start-up is in none of the
// figures of 1-3.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench_net.h"

namespace {

using namespace agentbox::bench;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kServerAddr = 0xC612000A;  // 198.18.0.10, host byte order
constexpr const char* kServerIp = "198.18.0.10";
constexpr const char* kServerName = "bench.test";

double MsSince(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// --- the client: this binary, inside the sandbox or outside -------------------------

// The IPv4 address `host` resolves to (host byte order), 0 if none. Inside
// the sandbox this asks the supervisor's DNS, which is how the broker learns
// the name the address stands for.
std::uint32_t Resolve(const char* host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host, nullptr, &hints, &res) != 0 || res == nullptr) return 0;
  std::uint32_t a = ntohl(reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr.s_addr);
  ::freeaddrinfo(res);
  return a;
}

// bulk HOST PORT BYTES: a plain connect(), as a tool that knows no proxy makes
// it (inside: decided and installed by the broker; the proxy variables
// agentbox sets are not read); prints MiB/s.
int ClientBulk(const char* host, std::uint16_t port, std::size_t bytes) {
  std::uint32_t addr = Resolve(host);
  double mib_s = addr == 0 ? -1 : BulkSend(Connect(port, addr), bytes);
  if (mib_s < 0) {
    std::fprintf(stderr, "bulk to %s:%u failed\n", host, port);
    return 1;
  }
  std::printf("%.1f\n", mib_s);
  return 0;
}

// bulk-proxy HOST PORT BYTES: through a CONNECT tunnel of $HTTP_PROXY
// (http://127.0.0.1:PORT, as agentbox sets it); prints MiB/s.
int ClientBulkViaProxy(const char* host, std::uint16_t port, std::size_t bytes) {
  const char* proxy = std::getenv("HTTP_PROXY");
  constexpr std::string_view kPrefix = "http://127.0.0.1:";
  if (proxy == nullptr || std::string_view(proxy).substr(0, kPrefix.size()) != kPrefix) {
    std::fprintf(stderr, "HTTP_PROXY is not http://127.0.0.1:PORT: %s\n", proxy ? proxy : "(unset)");
    return 1;
  }
  auto proxy_port = static_cast<std::uint16_t>(std::atoi(proxy + kPrefix.size()));
  double mib_s = BulkSend(Tunnel(proxy_port, std::string(host) + ":" + std::to_string(port)), bytes);
  if (mib_s < 0) {
    std::fprintf(stderr, "bulk through %s to %s:%u failed\n", proxy, host, port);
    return 1;
  }
  std::printf("%.1f\n", mib_s);
  return 0;
}

// connect HOST PORT N: N times socket(), then connect() + close() timed;
// prints each in ms.
int ClientConnect(const char* host, std::uint16_t port, int n) {
  std::uint32_t addr = Resolve(host);
  if (addr == 0) {
    std::fprintf(stderr, "%s does not resolve\n", host);
    return 1;
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(addr);
  a.sin_port = htons(port);
  std::vector<double> ms;
  ms.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    auto t0 = Clock::now();
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
      std::perror("connect");
      return 1;
    }
    ::close(fd);
    ms.push_back(MsSince(t0));
  }
  for (double m : ms) std::printf("%.4f\n", m);
  return 0;
}

// A query for NAME's A record, recursion desired.
std::string DnsQuery(std::uint16_t id, const std::string& name) {
  std::string q = {static_cast<char>(id >> 8), static_cast<char>(id & 0xff), 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 0};
  for (std::size_t at = 0; at < name.size();) {
    std::size_t dot = std::min(name.find('.', at), name.size());
    q += static_cast<char>(dot - at);
    q += name.substr(at, dot - at);
    at = dot + 1;
  }
  q += std::string{0, 0, 1, 0, 1};  // root label, QTYPE A, QCLASS IN
  return q;
}

// A NOERROR answer to `id` with at least one record.
bool DnsAnswered(const unsigned char* m, ssize_t n, std::uint16_t id) {
  return n >= 12 && ((m[0] << 8) | m[1]) == id && (m[2] & 0x80) != 0 && (m[3] & 0x0f) == 0 &&
         ((m[6] << 8) | m[7]) > 0;
}

// dns NAME N [IP PORT]: one warm-up query to IP:PORT (default
// 127.0.0.1:53, the sandbox's resolver), then N timed; prints each in ms.
int ClientDns(const std::string& name, int n, std::uint32_t server = INADDR_LOOPBACK, std::uint16_t port = 53) {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(server);
  a.sin_port = htons(port);
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
    std::perror("connect :53");
    return 1;
  }
  std::vector<double> ms;
  ms.reserve(static_cast<std::size_t>(n));
  unsigned char buf[1500];
  for (int i = 0; i <= n; ++i) {  // i == 0: the warm-up, which fills the cache
    const auto id = static_cast<std::uint16_t>(i + 1);
    const std::string q = DnsQuery(id, name);
    auto t0 = Clock::now();
    if (::send(fd, q.data(), q.size(), 0) != static_cast<ssize_t>(q.size())) {
      std::perror("send");
      return 1;
    }
    ssize_t got;
    do {
      got = ::recv(fd, buf, sizeof buf, 0);
    } while (got >= 2 && ((buf[0] << 8) | buf[1]) != id);  // a late answer to an earlier query
    if (!DnsAnswered(buf, got, id)) {
      std::fprintf(stderr, "no answer for %s (query %d)\n", name.c_str(), i);
      return 1;
    }
    if (i > 0) ms.push_back(MsSince(t0));
  }
  for (double m : ms) std::printf("%.4f\n", m);
  return 0;
}

int RunClient(int argc, char** argv) {
  const std::string mode = argc > 2 ? argv[2] : "";
  if (mode == "bulk" && argc == 6) {
    return ClientBulk(argv[3], static_cast<std::uint16_t>(std::atoi(argv[4])), std::strtoull(argv[5], nullptr, 10));
  }
  if (mode == "bulk-proxy" && argc == 6) {
    return ClientBulkViaProxy(argv[3], static_cast<std::uint16_t>(std::atoi(argv[4])),
                              std::strtoull(argv[5], nullptr, 10));
  }
  if (mode == "connect" && argc == 6) {
    return ClientConnect(argv[3], static_cast<std::uint16_t>(std::atoi(argv[4])), std::atoi(argv[5]));
  }
  if (mode == "dns" && argc == 5) return ClientDns(argv[3], std::atoi(argv[4]));
  in_addr server{};
  if (mode == "dns" && argc == 7 && ::inet_pton(AF_INET, argv[5], &server) == 1) {
    return ClientDns(argv[3], std::atoi(argv[4]), ntohl(server.s_addr), static_cast<std::uint16_t>(std::atoi(argv[6])));
  }
  std::fprintf(stderr, "usage: egress_bench --client bulk|bulk-proxy|connect HOST PORT N | dns NAME N [IP PORT]\n");
  return 2;
}

// --- the bench ---------------------------------------------------------------------

// Accepts and closes: the far end of the connect() loop.
void CloseServer(int listen_fd) {
  while (true) {
    int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    ::close(c);
  }
}

// Answers each datagram with itself marked as a response with one answer:
// what a UDP round trip between two processes costs, the floor under the
// DNS figure.
void UdpEchoServer(int fd) {
  unsigned char buf[1500];
  while (true) {
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    ssize_t n = ::recvfrom(fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&peer), &len);
    if (n < 12) continue;
    buf[2] |= 0x80;
    buf[7] = 1;
    ::sendto(fd, buf, static_cast<std::size_t>(n), 0, reinterpret_cast<const sockaddr*>(&peer), len);
  }
}

int BindUdp(std::uint16_t* port, std::uint32_t addr) {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(addr);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("bind udp");
    std::exit(1);
  }
  *port = ntohs(a.sin_port);
  return fd;
}

// The bench's own network and mount namespaces: 198.18.0.10 on their
// loopback, named bench.test by `hosts`. Before any thread exists
// (unshare(CLONE_NEWNS) refuses a process with threads).
bool EnterBenchNetwork(const std::string& hosts) {
  if (::unshare(CLONE_NEWNET | CLONE_NEWNS) != 0) {
    std::perror("unshare(CLONE_NEWNET|CLONE_NEWNS)");
    return false;
  }
  // Private first, so that the bind over /etc/hosts stays in this namespace.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    std::perror("mount(MS_PRIVATE)");
    return false;
  }
  if (RunOnce({"ip", "link", "set", "lo", "up"}) != 0 ||
      RunOnce({"ip", "addr", "add", std::string(kServerIp) + "/32", "dev", "lo"}) != 0) {
    std::fprintf(stderr, "ip link/addr on the bench's loopback failed\n");
    return false;
  }
  if (::mount(hosts.c_str(), "/etc/hosts", nullptr, MS_BIND, nullptr) != 0) {
    std::perror("bind /etc/hosts");
    return false;
  }
  return true;
}

struct Run {
  bool ok = false;
  std::vector<double> values;  // what the client printed, one number a line
  double cpu_s = 0;            // user + system of the child and everything it waited for
};

// Runs a client (or agentbox running one) to its end; its stderr is ours.
Run RunAndRead(const std::vector<std::string>& argv, const std::string& cwd) {
  Run r;
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return r;
  pid_t pid = Spawn(argv, {.cwd = cwd, .stdout_fd = p[1], .stderr_to = ChildStderr::kInherit});
  ::close(p[1]);
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(p[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
  ::close(p[0]);
  int status = 0;
  rusage ru{};
  ::wait4(pid, &status, 0, &ru);
  r.ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!r.ok) {
    std::fprintf(stderr, "egress_bench: %s ... %s: %s %d; stdout: %.2000s\n", argv[0].c_str(), argv.back().c_str(),
                 WIFEXITED(status) ? "exit" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                 out.c_str());
  }
  r.cpu_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
            static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  for (const char* at = out.c_str(); *at != '\0';) {
    char* end = nullptr;
    double v = std::strtod(at, &end);
    if (end == at) break;
    r.values.push_back(v);
    at = end;
  }
  return r;
}

struct Bench {
  std::string self;      // this binary
  std::string agentbox;  // the binary measured
  std::string ws;        // the sandbox's workspace and cwd: an empty directory
  std::string net_policy, nonet_policy;

  std::vector<std::string> Outside(const std::vector<std::string>& client) const {
    std::vector<std::string> argv = {self, "--client"};
    argv.insert(argv.end(), client.begin(), client.end());
    return argv;
  }
  std::vector<std::string> Inside(const std::vector<std::string>& client) const {
    std::vector<std::string> argv = {agentbox, "run", "--policy", net_policy, "--", self, "--client"};
    argv.insert(argv.end(), client.begin(), client.end());
    return argv;
  }
};

// Both policies bind the directory of this binary read-only (nothing but
// the workspace and the listed system directories exists inside); `allow`
// empty: no network section, no proxy, DNS or broker.
void WritePolicy(const std::string& path, const std::string& self_dir, const std::vector<std::string>& allow) {
  std::ofstream f(path);
  f << "version: 1\nfilesystem:\n  read_only: [\"/usr\", \"/bin\", \"/sbin\", \"/lib\", \"/lib64\", \"/etc\", \""
    << self_dir << "\"]\n";
  if (allow.empty()) return;
  f << "network:\n  allow: [";
  for (std::size_t i = 0; i < allow.size(); ++i) f << (i ? ", " : "") << '"' << allow[i] << '"';
  f << "]\n";
}

double Median(const std::vector<double>& v) { return Percentile(v, 0.5); }

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--client") == 0) return RunClient(argc, argv);
  std::size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (std::size_t{1} << 30);
  const int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 9;
  if (::geteuid() != 0) {
    std::printf("egress_bench: not applicable here: needs root (its own network namespace with 198.18.0.10)\n");
    return 0;
  }
  const auto started = Clock::now();
  ::signal(SIGPIPE, SIG_IGN);

  Bench b;
  b.self = fs::read_symlink("/proc/self/exe").string();
  b.agentbox = AGENTBOX_BIN;
  if (const char* e = std::getenv("AGENTBOX_BIN")) b.agentbox = e;
  char tmpl[] = "/tmp/agentbox-egress-bench.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string base = tmpl;
  b.ws = base + "/ws";
  fs::create_directories(b.ws);
  std::ofstream(base + "/hosts") << "127.0.0.1\tlocalhost\n" << kServerIp << '\t' << kServerName << '\n';
  if (!EnterBenchNetwork(base + "/hosts")) {
    fs::remove_all(base);
    return 1;
  }

  std::uint16_t sink_port, close_port, relay_port;
  int sink_fd = Listen(&sink_port, kServerAddr);
  int close_fd = Listen(&close_port, kServerAddr);
  int relay_fd = Listen(&relay_port, kServerAddr);
  pid_t relay = ::fork();  // before any thread exists
  if (relay == 0) RunReferenceRelay(relay_fd, sink_port, kServerAddr);
  ::close(relay_fd);
  std::thread(SinkServer, sink_fd).detach();
  std::thread(CloseServer, close_fd).detach();
  std::uint16_t echo_port;
  std::thread(UdpEchoServer, BindUdp(&echo_port, kServerAddr)).detach();

  const std::string self_dir = fs::path(b.self).parent_path().string();
  const std::string host = kServerName;
  b.net_policy = base + "/net.yaml";
  b.nonet_policy = base + "/nonet.yaml";
  WritePolicy(b.net_policy, self_dir,
              {host + ":" + std::to_string(sink_port), host + ":" + std::to_string(close_port), kServerIp});
  WritePolicy(b.nonet_policy, self_dir, {});
  std::printf("egress_bench: %s, servers on %s (%s) in the bench's own network namespace\n", b.agentbox.c_str(),
              kServerIp, kServerName);

  // 1. Bulk: direct, broker-installed, CONNECT relay, reference relay, alternating.
  const double gib = static_cast<double>(bytes) / (1 << 30);
  const std::string n_bytes = std::to_string(bytes);
  const std::string sink = std::to_string(sink_port);
  double best[4] = {0, 0, 0, 0};
  std::vector<double> ratio[4];
  int bulk_failures = 0;
  for (int i = 0; i < rounds; ++i) {
    // Odd rounds run in the reverse order, so that none always comes first.
    Run d, k, p, r;
    double relay_cpu = 0;
    for (int step = 0; step < 4; ++step) {
      switch (i % 2 == 0 ? step : 3 - step) {
        case 0:
          d = RunAndRead(b.Outside({"bulk", host, sink, n_bytes}), b.ws);
          break;
        case 1:
          k = RunAndRead(b.Inside({"bulk", host, sink, n_bytes}), b.ws);
          break;
        case 2:
          p = RunAndRead(b.Inside({"bulk-proxy", host, sink, n_bytes}), b.ws);
          break;
        case 3: {
          double relay0 = CpuSeconds(relay);
          r = RunAndRead(b.Outside({"bulk", host, std::to_string(relay_port), n_bytes}), b.ws);
          relay_cpu = CpuSeconds(relay) - relay0;
          break;
        }
      }
    }
    const Run* runs[4] = {&d, &k, &p, &r};
    double mib[4];
    for (int j = 0; j < 4; ++j) {
      bool ok = runs[j]->ok && runs[j]->values.size() == 1;
      bulk_failures += ok ? 0 : 1;
      mib[j] = ok ? runs[j]->values[0] : 0;
      best[j] = std::max(best[j], mib[j]);
      if (j > 0 && mib[0] > 0) ratio[j].push_back(mib[j] / mib[0]);
    }
    std::printf("  round %d: direct %.0f MiB/s (client %.2f s CPU/GiB); broker %.0f MiB/s, %.2fx (agentbox and "
                "client %.2f); CONNECT relay %.0f MiB/s, %.2fx (agentbox and client %.2f); reference relay %.0f "
                "MiB/s, %.2fx (client %.2f, relay %.2f)\n",
                i + 1, mib[0], d.cpu_s / gib, mib[1], mib[1] / mib[0], k.cpu_s / gib, mib[2], mib[2] / mib[0],
                p.cpu_s / gib, mib[3], mib[3] / mib[0], r.cpu_s / gib, relay_cpu / gib);
    std::fflush(stdout);
  }

  // 2. connect() + close(), inside (through the broker) and outside, in
  // alternating blocks.
  constexpr int kConnectBlocks = 4, kConnectsPerBlock = 1000;
  std::vector<double> direct_ms, broker_ms;
  int connect_failures = 0;
  const std::string close_to = std::to_string(close_port), per_block = std::to_string(kConnectsPerBlock);
  for (int i = 0; i < kConnectBlocks; ++i) {
    Run d, k;
    if (i % 2 == 0) d = RunAndRead(b.Outside({"connect", host, close_to, per_block}), b.ws);
    k = RunAndRead(b.Inside({"connect", host, close_to, per_block}), b.ws);
    if (i % 2 == 1) d = RunAndRead(b.Outside({"connect", host, close_to, per_block}), b.ws);
    connect_failures += (d.ok ? 0 : 1) + (k.ok ? 0 : 1);
    direct_ms.insert(direct_ms.end(), d.values.begin(), d.values.end());
    broker_ms.insert(broker_ms.end(), k.values.begin(), k.values.end());
  }

  // 3. DNS from the supervisor's cache, beside the same loop against a UDP
  // echo (outside), in alternating blocks.
  constexpr int kDnsBlocks = 4, kDnsPerBlock = 1500;
  std::vector<double> dns_ms, echo_ms;
  int dns_failures = 0;
  for (int i = 0; i < kDnsBlocks; ++i) {
    Run dns, echo;
    const std::vector<std::string> to_echo = {"dns", host, std::to_string(kDnsPerBlock), kServerIp,
                                              std::to_string(echo_port)};
    if (i % 2 == 0) echo = RunAndRead(b.Outside(to_echo), b.ws);
    dns = RunAndRead(b.Inside({"dns", host, std::to_string(kDnsPerBlock)}), b.ws);
    if (i % 2 == 1) echo = RunAndRead(b.Outside(to_echo), b.ws);
    dns_failures += (dns.ok ? 0 : 1) + (echo.ok ? 0 : 1);
    dns_ms.insert(dns_ms.end(), dns.values.begin(), dns.values.end());
    echo_ms.insert(echo_ms.end(), echo.values.begin(), echo.values.end());
  }

  // 4. The per-command cost: interleaved rounds, median wall time.
  struct Entry {
    const char* name;
    std::vector<std::string> argv;
    std::vector<double> ms;
    int failures = 0;
  };
  std::vector<Entry> entries = {
      {"bwrap --unshare-all ... /bin/true",
       {"bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
        "/bin/true"}},
      {"agentbox run -- /bin/true", {b.agentbox, "run", "--", "/bin/true"}},
      {"agentbox run, policy without network", {b.agentbox, "run", "--policy", b.nonet_policy, "--", "/bin/true"}},
      {"agentbox run, policy with network.allow", {b.agentbox, "run", "--policy", b.net_policy, "--", "/bin/true"}},
  };
  // AGENTBOX_BASELINE_BIN: an earlier build, measured in the same rounds,
  // so that what this one adds per command is seen beside it.
  const char* baseline = std::getenv("AGENTBOX_BASELINE_BIN");
  if (baseline && *baseline) {
    entries.push_back({"baseline: agentbox run -- /bin/true", {baseline, "run", "--", "/bin/true"}});
    entries.push_back(
        {"baseline: policy with network.allow", {baseline, "run", "--policy", b.net_policy, "--", "/bin/true"}});
  }
  constexpr int kCommandRounds = 100;
  for (int i = 0; i < kCommandRounds; ++i) {
    for (auto& e : entries) {
      auto t0 = Clock::now();
      e.failures += RunOnce(e.argv, {.cwd = b.ws}) == 0 ? 0 : 1;
      e.ms.push_back(MsSince(t0));
    }
  }

  ::kill(relay, SIGKILL);
  ::waitpid(relay, nullptr, 0);
  ::umount2("/etc/hosts", MNT_DETACH);
  fs::remove_all(base);

  // Summary.
  const double d50 = Percentile(direct_ms, 0.5), d99 = Percentile(direct_ms, 0.99);
  const double k50 = Percentile(broker_ms, 0.5), k99 = Percentile(broker_ms, 0.99);
  const double bwrap = Median(entries[0].ms), plain = Median(entries[1].ms);
  const double nonet = Median(entries[2].ms), net = Median(entries[3].ms);
  std::printf("\nbulk %.0f MiB, best of %d alternating rounds (failed transfers: %d):\n",
              static_cast<double>(bytes) / (1 << 20), rounds, bulk_failures);
  std::printf("  %-48s %8.0f MiB/s\n", "direct (outside the sandbox)", best[0]);
  const char* bulk_names[4] = {"", "broker-installed connection", "CONNECT relay (HTTP_PROXY inside)",
                               "reference relay (outside)"};
  for (int j = 1; j < 4; ++j) {
    std::printf("  %-48s %8.0f MiB/s  best %.2fx, median round %.2fx%s\n", bulk_names[j], best[j],
                best[0] > 0 ? best[j] / best[0] : 0.0, Median(ratio[j]), j == 1 ? "  (target >= 0.95x)" : "");
  }
  std::printf("connect() + close(), %d each (failed runs: %d):\n", kConnectBlocks * kConnectsPerBlock,
              connect_failures);
  std::printf("  %-48s p50 %.3f ms, p99 %.3f ms\n", "direct (outside)", d50, d99);
  std::printf("  %-48s p50 %.3f ms, p99 %.3f ms\n", "inside, through the broker", k50, k99);
  std::printf("  %-48s p50 %.3f ms (target <= 0.15 ms), p99 %.3f ms\n", "added by the broker", k50 - d50, k99 - d99);
  std::printf("DNS, %d UDP queries for %s each (failed runs: %d):\n", kDnsBlocks * kDnsPerBlock, kServerName,
              dns_failures);
  std::printf("  %-48s p50 %.3f ms, p99 %.3f ms\n", "UDP echo in the bench (outside)", Percentile(echo_ms, 0.5),
              Percentile(echo_ms, 0.99));
  std::printf("  %-48s p50 %.3f ms (target <= 0.1 ms), p99 %.3f ms\n", "the sandbox's DNS, from its cache",
              Percentile(dns_ms, 0.5), Percentile(dns_ms, 0.99));
  std::printf("per command, %d interleaved rounds, median wall ms:\n", kCommandRounds);
  for (const auto& e : entries) std::printf("  %-48s %8.2f ms  (failed: %d)\n", e.name, Median(e.ms), e.failures);
  std::printf("  %-48s %8.2fx\n", "agentbox run / bubblewrap", plain / bwrap);
  std::printf("  %-48s %8.2f ms, %.2fx\n", "added by network.allow (proxy, DNS, broker)", net - nonet, net / nonet);
  std::printf("  %-48s %8.2fx\n", "agentbox run with network.allow / bubblewrap", net / bwrap);
  if (entries.size() > 4) {
    const double base = Median(entries[4].ms), base_net = Median(entries[5].ms);
    std::printf("  %-48s %8.2fx (this build %.2fx)\n", "baseline run / bubblewrap", base / bwrap, plain / bwrap);
    std::printf("  %-48s %8.2fx (this build %.2fx)\n", "baseline with network.allow / bubblewrap", base_net / bwrap,
                net / bwrap);
  }
  std::printf("whole bench: %.1f s\n", std::chrono::duration<double>(Clock::now() - started).count());
  return 0;
}
