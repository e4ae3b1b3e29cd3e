// Plumbing and process figures shared by the benchmarks: blocking listeners
// and clients (on 127.0.0.1, or an address of the bench's own network
// namespace), a CONNECT tunnel, a sink, the reference relay, a bulk transfer,
// percentiles, child processes, and a process's CPU seconds and RSS from
// /proc.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace agentbox::bench {

// `addr` in host byte order. Never a host's real address: 127.0.0.1, or one
// the bench put on its own network namespace's loopback.
inline int Listen(std::uint16_t* port, std::uint32_t addr = INADDR_LOOPBACK) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 4096) != 0) {
    std::perror("bind/listen");
    std::exit(1);
  }
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

inline int Connect(std::uint16_t port, std::uint32_t addr = INADDR_LOOPBACK) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(addr);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

inline bool SendAll(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// Reads an HTTP response head; whether it is a 200.
inline bool ReadHead(int fd) {
  std::string head;
  char c;
  while (head.size() < 4096 && (head.size() < 4 || head.compare(head.size() - 4, 4, "\r\n\r\n") != 0)) {
    if (::recv(fd, &c, 1, 0) != 1) return false;
    head += c;
  }
  return head.rfind("HTTP/1.1 200", 0) == 0;
}

// A CONNECT tunnel to `target` ("host:port") through the HTTP proxy on
// 127.0.0.1:`proxy`; -1 when it is not opened.
inline int Tunnel(std::uint16_t proxy, const std::string& target) {
  int fd = Connect(proxy);
  if (fd < 0) return -1;
  std::string req = "CONNECT " + target + " HTTP/1.1\r\n\r\n";
  if (!SendAll(fd, req.data(), req.size()) || !ReadHead(fd)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The reference relay: every accepted connection is joined to `target` by
// two threads, each splicing one direction through its own pipe. The
// cheapest relay there is (blocking splice(2), no decisions): what any relay
// in user space costs.
inline void SplicePump(int from, int to) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return;
  (void)::fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
  while (true) {
    ssize_t n = ::splice(from, nullptr, p[1], nullptr, 1 << 20, SPLICE_F_MOVE);
    if (n <= 0) break;
    while (n > 0) {
      ssize_t w = ::splice(p[0], nullptr, to, nullptr, static_cast<std::size_t>(n), SPLICE_F_MOVE);
      if (w <= 0) break;
      n -= w;
    }
  }
  ::shutdown(to, SHUT_WR);
  ::close(p[0]);
  ::close(p[1]);
}

// Runs in a process of its own (forked before any thread exists, so that its
// CPU seconds are its own) until killed.
[[noreturn]] inline void RunReferenceRelay(int listen_fd, std::uint16_t target,
                                           std::uint32_t target_addr = INADDR_LOOPBACK) {
  while (true) {
    int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) _exit(1);
    int u = Connect(target, target_addr);
    std::thread up(SplicePump, c, u), down(SplicePump, u, c);
    up.join();
    down.join();
    ::close(c);
    ::close(u);
  }
}

// Discards what it reads; answers one byte at EOF. One connection at a time.
inline void SinkServer(int listen_fd) {
  std::vector<char> buf(1 << 20);
  while (true) {
    int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    while (::recv(c, buf.data(), buf.size(), 0) > 0) {
    }
    SendAll(c, "k", 1);
    ::close(c);
  }
}

// Sends `bytes` on `fd` (to a SinkServer), half-closes, waits for the
// sink's byte and closes `fd`: MiB/s, or -1 on any failure.
inline double BulkSend(int fd, std::size_t bytes) {
  if (fd < 0) return -1;
  std::vector<char> block(1 << 20, 'b');
  auto t0 = std::chrono::steady_clock::now();
  for (std::size_t sent = 0; sent < bytes; sent += block.size()) {
    if (!SendAll(fd, block.data(), std::min(block.size(), bytes - sent))) {
      ::close(fd);
      return -1;
    }
  }
  ::shutdown(fd, SHUT_WR);
  char k;
  bool got = ::recv(fd, &k, 1, 0) == 1;
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  return got ? static_cast<double>(bytes) / s / (1 << 20) : -1;
}

// The value below which a fraction `q` of `v` lies (0.5: the median).
inline double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
}

// CPU seconds (user + system) of a process so far.
inline double CpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields;
  std::string field;
  for (char c : text.substr(close + 2)) {
    if (c == ' ') {
      fields.push_back(field);
      field.clear();
    } else {
      field += c;
    }
  }
  // Fields 14 and 15 (utime, stime) are the 12th and 13th after the name.
  if (fields.size() < 13) return 0;
  return static_cast<double>(std::stoull(fields[11]) + std::stoull(fields[12])) /
         static_cast<double>(::sysconf(_SC_CLK_TCK));
}

inline double SelfCpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

inline long RssKiB(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  }
  return -1;
}

// A child's stderr: discarded, or ours (to see why a client failed).
enum class ChildStderr { kDiscard, kInherit };

struct SpawnOptions {
  std::string cwd;     // empty: ours
  std::string env;     // "NAME=VALUE" added to our environment; empty: none
  int stdout_fd = -1;  // -1: /dev/null
  ChildStderr stderr_to = ChildStderr::kDiscard;
};

// Starts `argv` (argv[0] searched in PATH), stdin on /dev/null; the caller
// waits for it. Everything is prepared before the fork and the child only
// chdirs, dups and execs, so a parent with threads may call it.
inline pid_t Spawn(const std::vector<std::string>& argv, const SpawnOptions& o = {}) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::string name = o.env.substr(0, o.env.find('=') + 1);  // "NAME=": replaced, not repeated
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (name.empty() || std::string_view(*e).substr(0, name.size()) != name) env.push_back(*e);
  }
  if (!o.env.empty()) env.push_back(const_cast<char*>(o.env.c_str()));
  env.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    if (!o.cwd.empty() && ::chdir(o.cwd.c_str()) != 0) _exit(126);
    int null = ::open("/dev/null", O_RDWR);
    ::dup2(null, 0);
    ::dup2(o.stdout_fd >= 0 ? o.stdout_fd : null, 1);
    if (o.stderr_to == ChildStderr::kDiscard) ::dup2(null, 2);
    ::execvpe(args[0], args.data(), env.data());
    _exit(127);
  }
  return pid;
}

// Spawn and wait: the exit code, or 128 + the signal.
inline int RunOnce(const std::vector<std::string>& argv, const SpawnOptions& o = {}) {
  pid_t pid = Spawn(argv, o);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace agentbox::bench
