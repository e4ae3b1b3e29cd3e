// The pidfd through which the responder reaches a caller's descriptors: a
// notification names a thread, which need not lead its thread group.
#include "linux/seccomp_notify.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <future>
#include <thread>

#include "linux/compat.h"
#include "linux/fd.h"

namespace agentbox::linux {
namespace {

// A thread of ours that runs `setup`, then waits until this goes away.
class Worker {
 public:
  explicit Worker(std::function<void()> setup = [] {}) {
    std::promise<pid_t> started;
    std::future<pid_t> tid = started.get_future();
    thread_ = std::thread([this, setup = std::move(setup), started = std::move(started)]() mutable {
      setup();
      started.set_value(gettid());
      release_.get_future().wait();
    });
    tid_ = tid.get();
  }
  ~Worker() {
    release_.set_value();
    thread_.join();
  }
  pid_t tid() const { return tid_; }

 private:
  std::promise<void> release_;
  std::thread thread_;
  pid_t tid_ = 0;
};

bool SameFile(int a, int b) {
  struct stat sa {}, sb {};
  return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

bool KernelHasThreadPidfds() {
  UniqueFd probe(PidfdOpen(getpid(), PIDFD_THREAD));
  return probe.valid();
}

TEST(ThreadGroupOf, AWorkerThreadBelongsToOurProcess) {
  Worker w;
  ASSERT_NE(w.tid(), getpid());
  EXPECT_EQ(ThreadGroupOf(w.tid()), getpid());
  EXPECT_EQ(ThreadGroupOf(getpid()), getpid());
}

TEST(ThreadGroupOf, AThreadThatIsGoneHasNone) {
  pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  EXPECT_EQ(ThreadGroupOf(child), 0);
}

TEST(OpenThreadPidfd, ReachesTheDescriptorsOfAThreadThatDoesNotLeadItsGroup) {
  Worker w;
  // What the responder used to do: pidfd_open refuses a non-leader's id
  // (EINVAL, or ENOENT on newer kernels).
  UniqueFd plain(PidfdOpen(w.tid()));
  EXPECT_FALSE(plain.valid());
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  UniqueFd a(pair[0]), b(pair[1]);
  UniqueFd pidfd = OpenThreadPidfd(w.tid());
  ASSERT_TRUE(pidfd.valid()) << std::strerror(errno);
  UniqueFd copy(PidfdGetfd(pidfd.get(), a.get()));
  ASSERT_TRUE(copy.valid()) << std::strerror(errno);
  EXPECT_TRUE(SameFile(copy.get(), a.get()));
}

TEST(OpenThreadPidfd, ReachesADescriptorTableTheThreadUnshared) {
  if (!KernelHasThreadPidfds()) GTEST_SKIP() << "not applicable here: no PIDFD_THREAD before Linux 6.9";
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  UniqueFd a(pair[0]), b(pair[1]);
  constexpr int kOnlyThere = 777;
  ASSERT_EQ(fcntl(kOnlyThere, F_GETFD), -1);
  int setup_error = 0;
  Worker w([&] {
    if (unshare(CLONE_FILES) != 0 || dup2(b.get(), kOnlyThere) != kOnlyThere) setup_error = errno;
  });
  ASSERT_EQ(setup_error, 0) << std::strerror(setup_error);
  ASSERT_EQ(fcntl(kOnlyThere, F_GETFD), -1);  // not in our table
  UniqueFd pidfd = OpenThreadPidfd(w.tid());
  ASSERT_TRUE(pidfd.valid()) << std::strerror(errno);
  UniqueFd copy(PidfdGetfd(pidfd.get(), kOnlyThere));
  ASSERT_TRUE(copy.valid()) << std::strerror(errno);
  EXPECT_TRUE(SameFile(copy.get(), b.get()));
}

TEST(OpenThreadPidfd, AThreadThatIsGoneHasNone) {
  pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  UniqueFd pidfd = OpenThreadPidfd(child);
  EXPECT_FALSE(pidfd.valid());
  EXPECT_EQ(errno, ESRCH);
}

}  // namespace
}  // namespace agentbox::linux
