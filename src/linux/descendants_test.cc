#include "linux/descendants.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>

#include "linux/fd.h"

namespace agentbox::linux {
namespace {

// A loopback listener, and a connection to it that only a child process
// holds (the parent's copy is closed).
struct HeldConnection {
  UniqueFd listener, accepted;
  pid_t child = -1;
  std::uint64_t inode = 0;

  bool Make() {
    listener.reset(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (!listener.valid() || bind(listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        listen(listener.get(), 1) != 0 || getsockname(listener.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return false;
    }
    UniqueFd c(socket(AF_INET, SOCK_STREAM, 0));
    if (!c.valid() || connect(c.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return false;
    accepted.reset(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    struct stat st {};
    if (!accepted.valid() || fstat(c.get(), &st) != 0) return false;
    inode = st.st_ino;
    child = fork();
    if (child == 0) {
      pause();  // holds `c` until killed
      _exit(0);
    }
    return child > 0;  // `c` closes here: the child's is the only one
  }
  ~HeldConnection() {
    if (child > 0) {
      kill(child, SIGKILL);
      waitpid(child, nullptr, 0);
    }
  }
  // Whether the far end saw the connection end (within `ms`).
  bool PeerEnded(int ms) {
    struct pollfd p = {accepted.get(), POLLIN, 0};
    if (poll(&p, 1, ms) <= 0) return false;
    char b;
    return recv(accepted.get(), &b, 1, MSG_DONTWAIT) == 0;
  }
};

TEST(ShutDownHeldSocketsTest, TheHoldersConnectionEndsAndItKeepsItsDescriptor) {
  HeldConnection h;
  ASSERT_TRUE(h.Make());
  EXPECT_FALSE(h.PeerEnded(100)) << "the connection ended before it was shut down";
  EXPECT_EQ(ShutDownHeldSockets(h.child, {h.inode}), 1u);
  EXPECT_TRUE(h.PeerEnded(2000)) << "the far end did not see the connection end";
  EXPECT_EQ(kill(h.child, 0), 0) << "the holder itself is left running";
}

TEST(ShutDownHeldSocketsTest, ASocketNobodyThereHoldsIsLeftAlone) {
  HeldConnection h;
  ASSERT_TRUE(h.Make());
  EXPECT_EQ(ShutDownHeldSockets(h.child, {h.inode + 1000000}), 0u);
  EXPECT_FALSE(h.PeerEnded(200));
}

}  // namespace
}  // namespace agentbox::linux
