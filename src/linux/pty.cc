#include "linux/pty.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>

namespace agentbox::linux {

Result<PtyPair> OpenPty(const struct winsize* size) {
  PtyPair pty;
  pty.master.reset(open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!pty.master.valid()) return Status::Errno("pty", "open", "/dev/ptmx");
  int unlock = 0;
  if (ioctl(pty.master.get(), TIOCSPTLCK, &unlock) != 0) return Status::Errno("pty", "ioctl(TIOCSPTLCK)", "/dev/ptmx");
  pty.slave.reset(ioctl(pty.master.get(), TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!pty.slave.valid()) return Status::Errno("pty", "ioctl(TIOCGPTPEER)", "/dev/ptmx");
  if (size && size->ws_col > 0 && size->ws_row > 0 && ioctl(pty.master.get(), TIOCSWINSZ, size) != 0) {
    return Status::Errno("pty", "ioctl(TIOCSWINSZ)", "/dev/ptmx");
  }
  return pty;
}

bool WindowSize(int fd, struct winsize* size) {
  return isatty(fd) && ioctl(fd, TIOCGWINSZ, size) == 0 && size->ws_col > 0 && size->ws_row > 0;
}

}  // namespace agentbox::linux

namespace agentbox::linux {
namespace {
constexpr std::size_t kRelayBuffer = 64 * 1024;
}

PtyRelay::PtyRelay(int master, int in, int out) : master_(master), in_(in), out_(out), in_is_tty_(isatty(in) == 1) {
  int flags = fcntl(master_, F_GETFL);
  if (flags >= 0) fcntl(master_, F_SETFL, flags | O_NONBLOCK);
  Resize();
}

void PtyRelay::Resize() {
  struct winsize size {};
  if (WindowSize(in_, &size) || WindowSize(out_, &size)) ioctl(master_, TIOCSWINSZ, &size);
}

void PtyRelay::AddPollFds(std::vector<struct pollfd>* fds) {
  short master_events = 0;
  if (master_open_) master_events = static_cast<short>(POLLIN | (to_master_.empty() ? 0 : POLLOUT));
  fds->push_back({master_open_ ? master_ : -1, master_events, 0});
  fds->push_back({in_open_ && master_open_ && to_master_.size() < kRelayBuffer ? in_ : -1, POLLIN, 0});
  polled_ = 2;
}

void PtyRelay::ReadMaster() {
  char buf[16384];
  for (;;) {
    ssize_t n = read(master_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) {  // EIO: no process holds the slave any more
      master_open_ = false;
      return;
    }
    for (ssize_t done = 0; out_open_ && done < n;) {
      ssize_t w = write(out_, buf + done, static_cast<size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        out_open_ = false;  // the caller stopped reading: the output is dropped, the command goes on
        break;
      }
      done += w;
    }
  }
}

void PtyRelay::Handle(const struct pollfd* fds) {
  if (polled_ < 2) return;
  if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) ReadMaster();
  if (master_open_ && (fds[0].revents & POLLOUT) && !to_master_.empty()) {
    ssize_t w = write(master_, to_master_.data(), to_master_.size());
    if (w > 0) to_master_.erase(0, static_cast<size_t>(w));
  }
  if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
    char buf[16384];
    ssize_t n = read(in_, buf, sizeof(buf));
    if (n > 0) {
      to_master_.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
      in_open_ = false;
      // Input that is not a terminal ended: the pty reads end of file, as
      // a terminal's ^D would give it (at the start of a line).
      if (!in_is_tty_) {
        struct termios t {};
        char eof = tcgetattr(master_, &t) == 0 && t.c_cc[VEOF] ? static_cast<char>(t.c_cc[VEOF]) : '\x04';
        to_master_.push_back(eof);
      }
    }
  }
}

void PtyRelay::Drain() {
  if (master_open_) ReadMaster();
}

}  // namespace agentbox::linux
