#include "session/terminal.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "session/layers.h"

namespace agentbox::session {
Result<std::shared_ptr<Terminal>> Terminal::Open(std::shared_ptr<World> world, std::string id,
                                                 const WorldTerminalSpec& spec) {
  auto opened = world->OpenTerminal(spec);
  if (!opened.ok()) return opened.status();
  std::shared_ptr<Terminal> t(new Terminal());
  t->id_ = std::move(id);
  t->spec_ = spec;
  t->cols_ = spec.cols;
  t->rows_ = spec.rows;
  t->created_ = NowRfc3339();
  t->world_ = std::move(world);
  t->call_id_ = opened->id;
  t->master_ = std::move(opened->master);
  t->result_ = std::move(opened->result);
  t->wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!t->wake_.valid()) {
    t->world_->KillCall(t->call_id_, SIGKILL);
    return Status::Errno("pty", "eventfd");
  }
  fcntl(t->master_.get(), F_SETFL, fcntl(t->master_.get(), F_GETFL) | O_NONBLOCK);
  t->reader_ = std::thread([raw = t.get()] { raw->ReadLoop(); });
  return t;
}

Terminal::~Terminal() {
  Kill();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  std::uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
  if (reader_.joinable()) reader_.join();
}

bool Terminal::Write(std::string_view data) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (end_ || pending_.size() + data.size() > kPendingInput) return false;
    pending_.append(data);
  }
  std::uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
  return true;
}

Status Terminal::Resize(int cols, int rows) {
  if (cols < 1 || cols > 1000 || rows < 1 || rows > 1000) {
    return Status::Error("bad_request", "a terminal's size is 1 to 1000 columns and rows, not " +
                                            std::to_string(cols) + "x" + std::to_string(rows));
  }
  struct winsize size {};
  size.ws_col = static_cast<unsigned short>(cols);
  size.ws_row = static_cast<unsigned short>(rows);
  std::lock_guard<std::mutex> lock(mu_);
  if (end_) return Status::Error("conflict", "terminal " + id_ + " has ended");
  // The kernel sends SIGWINCH to the pty's foreground group.
  if (ioctl(master_.get(), TIOCSWINSZ, &size) != 0) return Status::Errno("pty", "ioctl(TIOCSWINSZ)", "terminal " + id_);
  cols_ = cols;
  rows_ = rows;
  return {};
}

long Terminal::Attach(OnOutput on_output, OnExit on_exit, const std::function<void(const std::string&)>& replay) {
  std::optional<nlohmann::json> ended;
  long token;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (replay) replay(scrollback_);
    token = next_token_++;
    if (end_) {
      ended = end_;
    } else {
      attached_.emplace(token, std::make_pair(std::move(on_output), on_exit));
    }
  }
  if (ended && on_exit) on_exit(*ended);
  return token;
}

void Terminal::Detach(long token) {
  std::lock_guard<std::mutex> lock(mu_);
  attached_.erase(token);
}

void Terminal::Kill() {
  bool running;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running = !end_.has_value();
  }
  if (running && world_) world_->KillCall(call_id_, SIGKILL);
}

bool Terminal::Running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !end_.has_value();
}

nlohmann::json Terminal::Describe() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json j = {{"id", id_},          {"command", spec_.argv}, {"cwd", spec_.cwd},
                      {"cols", cols_},      {"rows", rows_},        {"created", created_},
                      {"running", !end_},   {"attached", attached_.size()}};
  if (end_) j.update(*end_);
  return j;
}

void Terminal::Finish(nlohmann::json end) {
  std::map<long, std::pair<OnOutput, OnExit>> attached;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (end_) return;
    end_ = end;
    attached.swap(attached_);
    pending_.clear();
  }
  for (auto& [token, callbacks] : attached) {
    if (callbacks.second) callbacks.second(end);
  }
}

void Terminal::ReadLoop() {
  char buf[16384];
  bool master_open = true;
  std::string result_text;
  for (;;) {
    bool want_write;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
      want_write = !pending_.empty();
    }
    struct pollfd fds[3] = {{master_open ? master_.get() : -1, static_cast<short>(POLLIN | (want_write ? POLLOUT : 0)), 0},
                            {wake_.get(), POLLIN, 0},
                            {master_open ? -1 : result_.get(), POLLIN, 0}};
    if (poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents & POLLIN) {
      std::uint64_t n;
      (void)!read(wake_.get(), &n, sizeof(n));
    }
    if (master_open && (fds[0].revents & POLLOUT)) {
      std::lock_guard<std::mutex> lock(mu_);
      ssize_t w = write(master_.get(), pending_.data(), pending_.size());
      if (w > 0) pending_.erase(0, static_cast<size_t>(w));
    }
    if (master_open && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t n = read(master_.get(), buf, sizeof(buf));
      if (n > 0) {
        std::lock_guard<std::mutex> lock(mu_);
        scrollback_.append(buf, static_cast<size_t>(n));
        if (scrollback_.size() > kScrollback) scrollback_.erase(0, scrollback_.size() - kScrollback);
        for (auto& [token, callbacks] : attached_) {
          if (callbacks.first) callbacks.first(std::string_view(buf, static_cast<size_t>(n)));
        }
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        master_open = false;  // EIO: no process holds the slave any more
      }
    }
    if (!master_open && (fds[2].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t n = read(result_.get(), buf, sizeof(buf));
      if (n > 0) {
        result_text.append(buf, static_cast<size_t>(n));
        if (result_text.size() > 65536) result_text.resize(65536);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      // The keeper's last word: its exit line, an exec error, or nothing
      // (the world ended under it).
      // Lines: {"t":"started"}, then an exec_error (the command could not
      // start) and/or the exit; the error says more than the exit after it.
      nlohmann::json end, line;
      for (size_t start = 0; start < result_text.size();) {
        size_t nl = result_text.find('\n', start);
        if (nl == std::string::npos) nl = result_text.size();
        nlohmann::json l = nlohmann::json::parse(result_text.substr(start, nl - start), nullptr, false);
        start = nl + 1;
        if (!l.is_object()) continue;
        const std::string lt = l.value("t", "");
        if (lt == "exec_error" || (lt == "exit" && (!line.is_object() || line.value("t", "") != "exec_error"))) line = l;
      }
      const std::string t = line.is_object() ? line.value("t", "") : "";
      if (t == "exit" && line.value("signal", 0) > 0) {
        end["signal"] = line.value("signal", 0);
      } else if (t == "exit") {
        end["exit_code"] = line.value("code", -1);
      } else if (t == "exec_error") {
        end["error"] = line.value("stage", "") + ": " + line.value("syscall", "") + ": " +
                       std::strerror(line.value("errno", 0));
        if (line.value("errno", 0) == ENOENT) end["error"] = "command not found: " + (spec_.argv.empty() ? "" : spec_.argv[0]);
      } else {
        end["error"] = "the session's sandbox ended" + (world_->Alive() ? std::string() : ": " + world_->death());
      }
      Finish(end);
      break;
    }
  }
  // Going away before the command ended (the terminal was removed).
  Finish({{"error", "terminal removed"}});
}

}  // namespace agentbox::session
