#include "agentbox/status.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace agentbox {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status status;
  EXPECT_TRUE(status.ok());
  EXPECT_EQ(status.message(), "");
}

TEST(StatusTest, PlainError) {
  Status status = Status::Error("policy", "bad thing");
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.message(), "bad thing");
  EXPECT_EQ(status.ToString(), "policy: bad thing");
  EXPECT_EQ(status.err(), 0);
}

TEST(StatusTest, SyscallNamesPathAndErrno) {
  Status status = Status::Syscall("mount", "mount", "/usr", EACCES);
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.message(), "mount(/usr): Permission denied");
  EXPECT_EQ(status.ToString(), "mount: mount(/usr): Permission denied");
  EXPECT_EQ(status.err(), EACCES);
  EXPECT_EQ(status.path(), "/usr");
}

TEST(StatusTest, SyscallWithoutPath) {
  Status status = Status::Syscall("exec", "fork", "", EAGAIN);
  EXPECT_EQ(status.message(), "fork: Resource temporarily unavailable");
}

TEST(StatusTest, ErrnoCapturesCurrentErrno) {
  errno = ENOENT;
  Status status = Status::Errno("policy", "open", "/x");
  EXPECT_EQ(status.err(), ENOENT);
  EXPECT_EQ(status.message(), "open(/x): No such file or directory");
}

TEST(StatusTest, WithContextKeepsSyscallAndErrno) {
  Status status =
      Status::Syscall("mount", "mount", "/usr", EPERM).WithContext("binding system dirs");
  EXPECT_EQ(status.err(), EPERM);
  EXPECT_EQ(status.syscall(), "mount");
  EXPECT_EQ(status.message(), "mount(/usr): Operation not permitted — binding system dirs");

  Status plain = Status::Error("policy", "bad").WithContext("reading x");
  EXPECT_EQ(plain.ToString(), "policy: reading x: bad");
  EXPECT_TRUE(Status().WithContext("ignored").ok());
}

}  // namespace
}  // namespace agentbox
