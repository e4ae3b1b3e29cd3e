// The egress proxy against direct loopback, measured in the same run:
//   1. bulk transfer (1 GiB by default) through a CONNECT tunnel vs direct;
//   2. CONNECT setup + first byte, p50 added latency over a direct connect;
//   3. 1,000 concurrent tunnels: errors and the proxy's RSS growth per tunnel.
// The proxy runs in a forked child process (as it will in the supervisor), so
// its RSS is its own. Prints figures and ratios; asserts nothing.
//
//   proxy_bench [BYTES [ROUNDS]]   (default 1073741824 bytes, 5 rounds)
//
// The bulk rounds alternate direct, tunnel and a reference relay, so that a
// neighbour's load hits all alike; each round prints its figures and the CPU
// seconds spent by the endpoints (this process) and by the proxy process.
// The reference relay is the cheapest relay there is (blocking splice(2), a
// thread per direction, no decisions): what any relay in user space costs.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "bench_net.h"
#include "net/proxy.h"

namespace {

using namespace agentbox::bench;

using Clock = std::chrono::steady_clock;

// The proxy process: serves the listener until killed.
[[noreturn]] void RunProxy(int listen_fd) {
  boost::asio::io_context io;
  agentbox::net::StaticResolver resolver(io);
  auto rules = agentbox::net::RuleSet::Build({"127.0.0.1"}, {}, agentbox::NetDefault::kDeny);
  agentbox::net::Proxy proxy(io, std::move(rules).value(), {}, resolver, nullptr, nullptr);
  if (!proxy.Serve(listen_fd, agentbox::net::ListenerKind::kHttp).ok()) _exit(1);
  io.run();
  _exit(0);
}

// Echoes each connection on its own thread (the latency test is sequential,
// the concurrency test keeps 1,000 threads parked in recv).
void EchoServer(int listen_fd) {
  while (true) {
    int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    std::thread([c] {
      char buf[4096];
      ssize_t n;
      while ((n = ::recv(c, buf, sizeof buf, 0)) > 0) SendAll(c, buf, static_cast<std::size_t>(n));
      ::close(c);
    }).detach();
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (std::size_t{1} << 30);
  const int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 5;
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &lim);
  ::signal(SIGPIPE, SIG_IGN);

  std::uint16_t proxy_port, sink_port, echo_port, relay_port;
  int proxy_fd = Listen(&proxy_port);
  int sink_fd = Listen(&sink_port);
  int relay_fd = Listen(&relay_port);
  pid_t proxy = ::fork();  // before any thread exists
  if (proxy == 0) RunProxy(proxy_fd);
  ::close(proxy_fd);
  pid_t relay = ::fork();
  if (relay == 0) RunReferenceRelay(relay_fd, sink_port);
  ::close(relay_fd);
  int echo_fd = Listen(&echo_port);
  std::thread(SinkServer, sink_fd).detach();
  std::thread(EchoServer, echo_fd).detach();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));

  // 1. Bulk: direct, tunnel and reference relay, alternating.
  const double gib = static_cast<double>(bytes) / (1 << 30);
  double direct = 0, tunnel = 0, reference = 0;
  std::vector<double> ratios, reference_ratios;
  for (int i = 0; i < rounds; ++i) {
    double self0 = SelfCpuSeconds();
    double d = BulkSend(Connect(sink_port), bytes);
    double self1 = SelfCpuSeconds(), proxy1 = CpuSeconds(proxy);
    int fd = Tunnel(proxy_port, "127.0.0.1:" + std::to_string(sink_port));
    double t = fd < 0 ? -1 : BulkSend(fd, bytes);
    double self2 = SelfCpuSeconds(), proxy2 = CpuSeconds(proxy), relay2 = CpuSeconds(relay);
    double r = BulkSend(Connect(relay_port), bytes);
    double relay3 = CpuSeconds(relay);
    std::printf("  round %d: direct %.0f MiB/s (endpoints %.2f s CPU/GiB); tunnel %.0f MiB/s (endpoints %.2f, "
                "proxy %.2f s CPU/GiB), ratio %.2f; reference relay %.0f MiB/s (relay %.2f s CPU/GiB), ratio %.2f\n",
                i + 1, d, (self1 - self0) / gib, t, (self2 - self1) / gib, (proxy2 - proxy1) / gib, t / d, r,
                (relay3 - relay2) / gib, r / d);
    direct = std::max(direct, d);
    tunnel = std::max(tunnel, t);
    reference = std::max(reference, r);
    ratios.push_back(t / d);
    reference_ratios.push_back(r / d);
  }
  std::printf("bulk %.0f MiB: best direct %.0f MiB/s, best CONNECT tunnel %.0f MiB/s, best reference relay %.0f MiB/s; "
              "median round ratio: tunnel %.2f (target >= 0.90), reference relay %.2f\n",
              static_cast<double>(bytes) / (1 << 20), direct, tunnel, reference, Percentile(ratios, 0.5),
              Percentile(reference_ratios, 0.5));

  // 2. Connection setup + first byte, sequential, p50 over 2,000 each.
  std::vector<double> d_ms, t_ms;
  int latency_errors = 0;
  for (int i = 0; i < 2000; ++i) {
    for (int via_proxy = 0; via_proxy < 2; ++via_proxy) {
      auto t0 = Clock::now();
      int fd = via_proxy ? Tunnel(proxy_port, "127.0.0.1:" + std::to_string(echo_port)) : Connect(echo_port);
      char c = 'x';
      bool ok = fd >= 0 && SendAll(fd, &c, 1) && ::recv(fd, &c, 1, 0) == 1;
      double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (fd >= 0) ::close(fd);
      if (!ok) {
        ++latency_errors;
        continue;
      }
      (via_proxy ? t_ms : d_ms).push_back(ms);
    }
  }
  std::printf("connect + first byte: direct p50 %.3f ms, via CONNECT p50 %.3f ms, added %.3f ms "
              "(target <= 0.300), errors %d\n",
              Percentile(d_ms, 0.5), Percentile(t_ms, 0.5), Percentile(t_ms, 0.5) - Percentile(d_ms, 0.5),
              latency_errors);

  // 3. 1,000 concurrent tunnels, each with a byte echoed through it.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  long rss0 = RssKiB(proxy);
  constexpr int kTunnels = 1000;
  std::vector<int> fds;
  int errors = 0;
  for (int i = 0; i < kTunnels; ++i) {
    int fd = Tunnel(proxy_port, "127.0.0.1:" + std::to_string(echo_port));
    if (fd < 0) {
      ++errors;
      continue;
    }
    fds.push_back(fd);
  }
  for (int fd : fds) {
    char c = 'y';
    if (!SendAll(fd, &c, 1) || ::recv(fd, &c, 1, 0) != 1) ++errors;
  }
  long rss1 = RssKiB(proxy);
  std::printf("%d concurrent tunnels: errors %d, proxy RSS %ld → %ld KiB, growth %.1f KiB/tunnel (target <= 64)\n",
              kTunnels, errors, rss0, rss1, static_cast<double>(rss1 - rss0) / kTunnels);
  for (int fd : fds) ::close(fd);

  ::kill(proxy, SIGTERM);
  ::waitpid(proxy, nullptr, 0);
  ::kill(relay, SIGKILL);
  ::waitpid(relay, nullptr, 0);
  return 0;
}
