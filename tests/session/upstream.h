// A TCP server on a loopback address for the session tests: answers a GET
// with "ok" (counted) and holds any other connection open, noting when its
// peer closes it. Stopped (its thread joined, its sockets closed) by the destructor.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace agentbox::session_test {

class Upstream {
 public:
  explicit Upstream(const char* address = "127.0.0.1") {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    inet_pton(AF_INET, address, &a.sin_addr);
    socklen_t len = sizeof a;
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd_, 16) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return;
    }
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~Upstream() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) close(fd_);
    for (int c : held_) close(c);
  }
  int port() const { return port_; }
  int held() {
    std::lock_guard<std::mutex> l(mu_);
    return static_cast<int>(held_.size());
  }
  int closed() const { return closed_; }
  int served() const { return served_; }  // GETs answered

 private:
  void Serve() {
    while (!stop_) {
      std::vector<pollfd> fds = {{fd_, POLLIN, 0}};
      {
        std::lock_guard<std::mutex> l(mu_);
        for (int c : held_) fds.push_back({c, POLLIN, 0});
      }
      if (poll(fds.data(), fds.size(), 100) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) continue;
        char buf[1024];
        ssize_t n = recv(c, buf, sizeof buf, 0);
        if (n > 3 && std::string(buf, 3) == "GET") {
          static const char kOk[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
          (void)!send(c, kOk, sizeof kOk - 1, MSG_NOSIGNAL);
          close(c);
          ++served_;
        } else {
          std::lock_guard<std::mutex> l(mu_);
          held_.push_back(c);
        }
      }
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[256];
        if (recv(fds[i].fd, buf, sizeof buf, MSG_DONTWAIT) > 0) continue;
        std::lock_guard<std::mutex> l(mu_);
        std::erase(held_, fds[i].fd);
        close(fds[i].fd);
        ++closed_;
      }
    }
  }

  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> closed_{0};
  std::atomic<int> served_{0};
  std::mutex mu_;
  std::vector<int> held_;
  std::thread thread_;
};

}  // namespace agentbox::session_test
