#include "session/port_bridge.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace agentbox::session {

using linux::UniqueFd;

namespace {

constexpr int kWorldCheckMs = 500;       // how soon a bridge notices its world ended
constexpr int kInsideSocketMs = 5000;    // the init's answer for a fresh socket
constexpr int kInsideConnectMs = 5000;   // connecting inside

// Moves bytes from `from` to `to` through a pipe until `from` ends; then
// half-closes `to`, so the other side sees the end too. When `to` is gone
// (its peer reset or closed), both directions end. splice() takes no
// MSG_NOSIGNAL: SIGPIPE is blocked in this thread, so a peer gone is an
// EPIPE here, not the end of the process.
void Pump(int from, int to) {
  sigset_t pipe_signal;
  sigemptyset(&pipe_signal);
  sigaddset(&pipe_signal, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) {
    shutdown(from, SHUT_RDWR);
    shutdown(to, SHUT_RDWR);
    return;
  }
  UniqueFd r(p[0]), w(p[1]);
  for (;;) {
    ssize_t in = splice(from, nullptr, w.get(), nullptr, 1 << 16, SPLICE_F_MOVE);
    if (in < 0 && errno == EINTR) continue;
    if (in <= 0) break;
    while (in > 0) {
      ssize_t out = splice(r.get(), nullptr, to, nullptr, static_cast<size_t>(in), SPLICE_F_MOVE);
      if (out < 0 && errno == EINTR) continue;
      if (out <= 0) {
        shutdown(from, SHUT_RDWR);
        shutdown(to, SHUT_RDWR);
        return;
      }
      in -= out;
    }
  }
  shutdown(to, SHUT_WR);
}

// connect() with a deadline, on a blocking socket.
Status ConnectWithin(int fd, const sockaddr_in& addr, int timeout_ms, const std::string& what) {
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int rc = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  if (rc != 0 && errno == EINPROGRESS) {
    struct pollfd p = {fd, POLLOUT, 0};
    while ((rc = poll(&p, 1, timeout_ms)) < 0 && errno == EINTR) {
    }
    if (rc == 0) return Status::Error("port", "connect to " + what + " timed out");
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return Status::Syscall("port", "connect", what, err);
    rc = 0;
  } else if (rc != 0) {
    return Status::Errno("port", "connect", what);
  }
  fcntl(fd, F_SETFL, flags);
  return {};
}

}  // namespace

// Both sockets are closed as soon as both directions ended (a peer that
// still sends gets a reset, not a window that never opens), under `mu`:
// Stop() shuts them down from another thread.
struct PortBridge::Connection {
  std::mutex mu;
  UniqueFd client, inside;
  std::thread up, down;
  int finished = 0;  // mu

  void Finished() {
    std::lock_guard<std::mutex> lock(mu);
    if (++finished < 2) return;
    client.reset();
    inside.reset();
  }
  void ShutDown() {
    std::lock_guard<std::mutex> lock(mu);
    if (client.valid()) shutdown(client.get(), SHUT_RDWR);
    if (inside.valid()) shutdown(inside.get(), SHUT_RDWR);
  }
  bool Done() {
    std::lock_guard<std::mutex> lock(mu);
    return finished == 2;
  }
};

Result<std::unique_ptr<PortBridge>> PortBridge::Start(std::weak_ptr<World> world, int inside_port) {
  auto live = world.lock();
  if (!live || !live->Alive()) return Status::Error(kWorldGone, "the session's sandbox is not running");
  std::unique_ptr<PortBridge> b(new PortBridge());
  b->world_ = world;
  b->world_raw_ = live.get();
  b->inside_port_ = inside_port;
  b->listener_.reset(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!b->listener_.valid()) return Status::Errno("port", "socket(AF_INET)");
  // The host's loopback, and nothing else.
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(b->listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Status::Errno("port", "bind", "127.0.0.1:0");
  }
  if (listen(b->listener_.get(), 64) != 0) return Status::Errno("port", "listen", "127.0.0.1");
  socklen_t len = sizeof(addr);
  if (getsockname(b->listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Status::Errno("port", "getsockname", "127.0.0.1");
  }
  b->host_port_ = ntohs(addr.sin_port);
  b->wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!b->wake_.valid()) return Status::Errno("port", "eventfd");
  b->acceptor_ = std::thread([p = b.get()] { p->AcceptLoop(); });
  return b;
}

PortBridge::~PortBridge() { Stop(); }

bool PortBridge::Serves(const World* w) const { return active_ && w == world_raw_; }

void PortBridge::AcceptLoop() {
  while (!stopping_) {
    struct pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    int r = poll(fds, 2, kWorldCheckMs);
    if (stopping_) break;
    {
      auto live = world_.lock();
      if (!live || !live->Alive()) break;  // the bridge ends with its world
    }
    if (r <= 0 || !(fds[0].revents & POLLIN)) continue;
    UniqueFd client(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!client.valid()) continue;
    ++connections_;
    Relay(std::move(client));
  }
  active_ = false;
  listener_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& c : open_) c->ShutDown();
}

void PortBridge::Relay(UniqueFd client) {
  // Finished connections are joined here, as new ones come.
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = open_.begin(); it != open_.end();) {
      if ((*it)->Done()) {
        (*it)->up.join();
        (*it)->down.join();
        it = open_.erase(it);
      } else {
        ++it;
      }
    }
  }
  auto live = world_.lock();
  if (!live) return;
  auto inside = live->OpenInsideSocket(kInsideSocketMs);
  live.reset();
  if (!inside.ok()) return;  // the client sees the connection close
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(inside_port_));
  if (!ConnectWithin(inside->get(), addr, kInsideConnectMs, "127.0.0.1:" + std::to_string(inside_port_) + " inside").ok()) {
    return;  // nothing listens inside: the client sees the close
  }
  auto c = std::make_shared<Connection>();
  c->client = std::move(client);
  c->inside = std::move(*inside);
  Connection* raw = c.get();
  const int client_fd = c->client.get(), inside_fd = c->inside.get();
  std::lock_guard<std::mutex> lock(mu_);
  c->up = std::thread([raw, client_fd, inside_fd] {
    Pump(client_fd, inside_fd);
    raw->Finished();
  });
  c->down = std::thread([raw, client_fd, inside_fd] {
    Pump(inside_fd, client_fd);
    raw->Finished();
  });
  open_.push_back(std::move(c));
}

void PortBridge::Stop() {
  if (stopping_.exchange(true)) {
    if (acceptor_.joinable()) acceptor_.join();
    return;
  }
  if (wake_.valid()) {
    const std::uint64_t one = 1;
    (void)!write(wake_.get(), &one, sizeof(one));
  }
  if (acceptor_.joinable()) acceptor_.join();
  std::list<std::shared_ptr<Connection>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all.swap(open_);
  }
  for (auto& c : all) {
    c->ShutDown();
    if (c->up.joinable()) c->up.join();
    if (c->down.joinable()) c->down.join();
  }
  active_ = false;
}

}  // namespace agentbox::session
