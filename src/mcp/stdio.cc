#include "mcp/stdio.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "report/json_text.h"

namespace agentbox::mcp {
namespace {

// Whole lines to one fd, one writer at a time. After a failed write (the
// client has gone) everything else is dropped.
class LineWriter {
 public:
  LineWriter(int fd, const std::function<void(const std::string&)>& log) : fd_(fd), log_(log) {}

  void Write(const Json& message) {
    std::string line = Serialize(message);
    line.push_back('\n');
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_) return;
    std::size_t done = 0;
    while (done < line.size()) {
      ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        broken_ = true;
        if (log_) log_(std::string("stdout: write failed: ") + std::strerror(errno) + "; dropping further output");
        return;
      }
      done += static_cast<std::size_t>(n);
    }
  }

 private:
  const int fd_;
  const std::function<void(const std::string&)>& log_;
  std::mutex mu_;
  bool broken_ = false;
};

// Threads for messages that may run long, started as needed up to `max`.
class WorkerPool {
 public:
  WorkerPool(std::size_t max, std::function<void(const Json&)> handle) : max_(max), handle_(std::move(handle)) {}
  ~WorkerPool() { Finish(); }

  void Post(Json message) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(message));
    if (idle_ == 0 && threads_.size() < max_) {
      threads_.emplace_back([this] { Work(); });
    } else {
      cv_.notify_one();
    }
  }

  // Drops what has not started yet.
  void DropQueued() {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.clear();
  }

  // Runs what is queued, then joins every thread.
  void Finish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [&] { return closing_ || !queue_.empty(); });
      --idle_;
      if (queue_.empty()) return;  // closing, nothing left
      Json message = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      handle_(message);
      lock.lock();
    }
  }

  const std::size_t max_;
  const std::function<void(const Json&)> handle_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Json> queue_;
  std::vector<std::thread> threads_;
  std::size_t idle_ = 0;
  bool closing_ = false;
};

bool Blank(std::string_view s) { return s.find_first_not_of(" \t\r") == std::string_view::npos; }

}  // namespace

Result<StdioEnd> ServeStdio(Server& server, const StdioOptions& options) {
  LineWriter writer(options.out_fd, options.log);
  const Notify notify = [&writer](const Json& message) { writer.Write(message); };
  WorkerPool pool(options.max_workers, [&](const Json& message) {
    if (auto response = server.Handle(message, notify)) writer.Write(*response);
  });

  auto dispatch = [&](std::string_view line) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (Blank(line)) return;
    Json message = report::ParseJsonOrDiscarded(line);
    if (message.is_discarded()) {
      if (auto response = server.Handle(line, notify)) writer.Write(*response);  // the parse error
    } else if (Server::MayRunLong(message)) {
      pool.Post(std::move(message));
    } else if (auto response = server.Handle(message, notify)) {
      writer.Write(*response);
    }
  };

  std::string pending;          // the line being read
  bool discarding = false;      // the line is over the limit: skip to its end
  std::size_t discarded = 0;
  std::vector<char> buf(64 * 1024);
  StdioEnd end = StdioEnd::kEof;
  Status failure;
  for (;;) {
    pollfd fds[2] = {{options.in_fd, POLLIN, 0}, {options.stop_fd, POLLIN, 0}};
    int ready = ::poll(fds, options.stop_fd >= 0 ? 2 : 1, -1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      failure = Status::Errno("mcp", "poll", "stdin");
      break;
    }
    if (options.stop_fd >= 0 && (fds[1].revents & POLLIN)) {
      end = StdioEnd::kStopped;
      break;
    }
    ssize_t n = ::read(options.in_fd, buf.data(), buf.size());
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) {
      failure = Status::Errno("mcp", "read", "stdin");
      break;
    }
    if (n == 0) {
      if (!discarding && !pending.empty()) dispatch(pending);  // a last line without newline
      if (discarding) writer.Write(Server::TooLarge(discarded));
      break;
    }
    std::string_view chunk(buf.data(), static_cast<std::size_t>(n));
    while (!chunk.empty()) {
      const std::size_t nl = chunk.find('\n');
      const std::string_view piece = chunk.substr(0, nl);
      if (discarding) {
        discarded += piece.size();
      } else {
        pending.append(piece);
        if (pending.size() > kMaxMessageBytes) {
          discarding = true;
          discarded = pending.size();
          std::string().swap(pending);
        }
      }
      if (nl == std::string_view::npos) break;
      chunk.remove_prefix(nl + 1);
      if (discarding) {
        if (options.log) options.log("stdin: skipped a message of " + std::to_string(discarded) + " bytes (over the limit)");
        writer.Write(Server::TooLarge(discarded));
        discarding = false;
        discarded = 0;
      } else {
        dispatch(pending);
        pending.clear();
      }
    }
  }
  if (end == StdioEnd::kStopped || !failure.ok()) {
    pool.DropQueued();
    server.CancelAll();
  }
  pool.Finish();
  if (!failure.ok()) return failure;
  return end;
}

}  // namespace agentbox::mcp
