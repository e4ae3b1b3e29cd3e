// Pseudo-terminals opened inside the sandbox: from its own devpts instance
// (the mount plan's /dev/pts, newinstance) on the namespaces backend, from
// the host's on landlock-only. The sandbox's commands get the slave as their
// controlling terminal; the master stays with agentbox (the runner's relay
// for `run --tty`, a session's terminal for the daemon).
#pragma once

#include <sys/ioctl.h>

#include "agentbox/status.h"
#include "linux/fd.h"

namespace agentbox::linux {

struct PtyPair {
  UniqueFd master;  // O_CLOEXEC
  UniqueFd slave;   // O_CLOEXEC | O_NOCTTY: a command takes it with TIOCSCTTY
};

// Opens /dev/ptmx, unlocks it and takes the slave by TIOCGPTPEER (no path
// lookup: the slave is this master's, whatever /dev/pts holds). `size`, when
// set, is the window size it starts with.
Result<PtyPair> OpenPty(const struct winsize* size = nullptr);

// The window size of `fd` when it is a terminal.
bool WindowSize(int fd, struct winsize* size);

}  // namespace agentbox::linux

#include <poll.h>

#include <string>
#include <vector>

namespace agentbox::linux {

// `run --tty`: the runner copies its stdin to the pty's master and the
// master's output to its stdout, inside its own poll loop. The master is
// non-blocking; stdin and stdout are the caller's and are left as they are
// (blocking writes: a stopped terminal stops the command, as it would).
class PtyRelay {
 public:
  PtyRelay(int master, int in, int out);
  // Appends what it waits for; Handle takes the same entries back.
  void AddPollFds(std::vector<struct pollfd>* fds);
  void Handle(const struct pollfd* fds);
  // The caller's terminal was resized: the pty follows (its foreground
  // group gets SIGWINCH from the kernel).
  void Resize();
  // After the command ended: what the master still holds, without waiting.
  void Drain();

 private:
  void ReadMaster();
  int master_, in_, out_;
  bool in_open_ = true, master_open_ = true, out_open_ = true;
  bool in_is_tty_;
  std::string to_master_;
  std::size_t polled_ = 0;  // entries added by the last AddPollFds
};

}  // namespace agentbox::linux
