// Service start to the first byte of an exposed port, against a real
// `agentbox serve`: POST .../services (python3 -m http.server) + POST
// .../ports, then GET / on the host port until the first byte of the answer,
// in a session whose world is already up. The anchor, in the same run: a
// `python3 -m http.server` started directly on the host, to its first byte.
// Prints p50 and p99 of each; asserts nothing.
//
//   service_bench [--n N]      (default 20)
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_net.h"
#include "daemon/client.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using agentbox::bench::Percentile;

constexpr const char* kPython = "/usr/bin/python3";

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

void Die(const std::string& what) {
  std::fprintf(stderr, "service_bench: %s\n", what.c_str());
  std::exit(1);
}

// One GET / on 127.0.0.1:port; true once a byte of the answer came.
bool FirstByte(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) Die("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool got = false;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const char req[] = "GET / HTTP/1.0\r\n\r\n";
    if (write(fd, req, sizeof(req) - 1) > 0) {
      struct pollfd p = {fd, POLLIN, 0};
      char c;
      got = poll(&p, 1, 5000) > 0 && read(fd, &c, 1) == 1;
    }
  }
  close(fd);
  return got;
}

void UntilFirstByte(int port) {
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (!FirstByte(port)) {
    if (Clock::now() > deadline) Die("no answer on 127.0.0.1:" + std::to_string(port) + " within 30 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    Die("bind 127.0.0.1:0");
  }
  close(fd);
  return ntohs(a.sin_port);
}

pid_t Spawn(const std::vector<std::string>& argv, const std::string& out) {
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    int null = open("/dev/null", O_RDWR);
    int log = open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    dup2(null, 0);
    dup2(log, 1);
    dup2(log, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

void KillAndReap(pid_t pid, int sig) {
  kill(-pid, sig);
  int st;
  waitpid(pid, &st, 0);
}

json Check(agentbox::Result<json> r, const std::string& what) {
  if (!r.ok()) Die(what + ": " + r.status().ToString());
  return *r;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = 20;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--n") == 0) n = std::strtoul(argv[i + 1], nullptr, 10);
  }
  struct stat st {};
  if (stat(kPython, &st) != 0) Die(std::string("needs ") + kPython);
  std::string root = std::string(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp") + "/agentbox-service-bench-XXXXXX";
  if (!mkdtemp(root.data())) Die("mkdtemp");
  const std::string ws = root + "/ws", state = root + "/state", socket_path = state + "/agentbox.sock";
  mkdir(ws.c_str(), 0755);
  const pid_t daemon = Spawn({AGENTBOX_BIN, "serve", "--state-dir", state, "--log-file", root + "/daemon.log"},
                             root + "/daemon.out");
  agentbox::daemon::Endpoint e;
  e.unix_socket = socket_path;
  for (int i = 0;; ++i) {
    if (i == 1000) Die("the daemon did not start; see " + root + "/daemon.out");
    if (lstat(socket_path.c_str(), &st) == 0) {
      agentbox::daemon::Client probe(e);
      auto r = probe.Call("GET", "/v1/health");
      if (r.ok() && r->status == 200) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  agentbox::daemon::Client c(e);
  const std::string id = Check(c.CallJson("POST", "/v1/sessions", {{"workspace", ws}}), "create")["id"];
  const std::string base = "/v1/sessions/" + id;
  Check(c.CallJson("POST", base + "/execute", {{"name", "bash"}, {"input", {{"command", "true"}}}}), "warm-up");

  std::vector<double> session_ms, started_ms, host_ms;
  for (std::size_t i = 0; i < n; ++i) {
    // The anchor: python3 -m http.server on the host.
    const int host_port = FreePort();
    auto t0 = Clock::now();
    const pid_t server = Spawn({kPython, "-m", "http.server", std::to_string(host_port), "--bind", "127.0.0.1"},
                               root + "/host-server.out");
    UntilFirstByte(host_port);
    host_ms.push_back(Ms(Clock::now() - t0));
    KillAndReap(server, SIGKILL);

    // The same server as a service, exposed.
    const int inside = 8000 + static_cast<int>(i);
    const std::string name = "web" + std::to_string(i);
    t0 = Clock::now();
    Check(c.CallJson("POST", base + "/services",
                     {{"name", name}, {"command", std::string(kPython) + " -m http.server " + std::to_string(inside) +
                                                      " --bind 127.0.0.1"}}),
          "start service");
    started_ms.push_back(Ms(Clock::now() - t0));
    const json port = Check(c.CallJson("POST", base + "/ports", {{"port", inside}}), "expose");
    UntilFirstByte(port.value("port", 0));
    session_ms.push_back(Ms(Clock::now() - t0));
    Check(c.CallJson("DELETE", base + "/services/" + name), "delete service");
    if (!c.Call("DELETE", base + "/ports/" + std::to_string(inside)).ok()) Die("unexpose");
  }
  if (!c.Call("DELETE", base).ok()) Die("remove the session");
  KillAndReap(daemon, SIGTERM);
  std::string rm = "rm -rf " + root;
  if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "service_bench: could not remove %s\n", root.c_str());

  std::printf("%-58s %6s %10s %10s\n", "what", "n", "p50 ms", "p99 ms");
  std::printf("%-58s %6zu %10.1f %10.1f\n", "service start + expose -> first byte (python3 http.server)",
              session_ms.size(), Percentile(session_ms, 0.50), Percentile(session_ms, 0.99));
  std::printf("%-58s %6zu %10.1f %10.1f\n", "  of which POST services answered (running, pid known)", started_ms.size(),
              Percentile(started_ms, 0.50), Percentile(started_ms, 0.99));
  std::printf("%-58s %6zu %10.1f %10.1f\n", "anchor: host python3 -m http.server -> first byte", host_ms.size(),
              Percentile(host_ms, 0.50), Percentile(host_ms, 0.99));
  std::printf("ratio p50: %.2fx\n", Percentile(session_ms, 0.50) / std::max(0.001, Percentile(host_ms, 0.50)));
  return 0;
}
