// What every run's supervision loop shares: copying the command's output,
// the wall clock in milliseconds, and the signals forwarded to the sandbox.
#pragma once

#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "linux/fd.h"

namespace agentbox::supervise {

using RunClock = std::chrono::steady_clock;

// Writes all of `data` to `fd`; gives up quietly when `fd` is gone (our own
// stderr closed: keep draining so the command is not blocked).
inline void WriteAll(int fd, const char* data, std::size_t n) { (void)linux::WriteAll(fd, {data, n}); }

inline std::uint64_t Ms(RunClock::duration d) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

// The signals a run forwards to its sandbox.
inline constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// Blocks the forwarded signals (and `extra`, when > 0) for its lifetime,
// delivering them on get() instead (-1 when `forward` is false: nothing is
// blocked then but `extra`); restores the caller's mask when destroyed.
class ForwardedSignals {
 public:
  explicit ForwardedSignals(bool forward, int extra = 0) {
    sigset_t mask;
    sigemptyset(&mask);
    if (forward) {
      for (int s : kForwarded) sigaddset(&mask, s);
      if (extra > 0) sigaddset(&mask, extra);
    }
    sigprocmask(SIG_BLOCK, &mask, &saved_);
    if (forward) fd_.reset(signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  }
  ~ForwardedSignals() { sigprocmask(SIG_SETMASK, &saved_, nullptr); }
  ForwardedSignals(const ForwardedSignals&) = delete;
  ForwardedSignals& operator=(const ForwardedSignals&) = delete;
  int get() const { return fd_.get(); }
  bool valid() const { return fd_.valid(); }

 private:
  sigset_t saved_{};
  linux::UniqueFd fd_;
};

}  // namespace agentbox::supervise
