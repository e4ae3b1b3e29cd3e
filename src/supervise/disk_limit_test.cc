#include "supervise/disk_limit.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace agentbox::supervise {
namespace {

TEST(DiskLimit, TheReasonNamesDiskGibTheSizeAndEnospc) {
  EXPECT_EQ(DiskFullReason(1ULL << 30), "disk_gib: the workspace's 1 GiB is full (ENOSPC)");
  EXPECT_EQ(DiskFullReason(3ULL << 29), "disk_gib: the workspace's 1.5 GiB is full (ENOSPC)");
  EXPECT_EQ(DiskFullReason(100ULL << 20), "disk_gib: the workspace's 100 MiB is full (ENOSPC)");
}

TEST(DiskLimit, TheStderrSignatureIsTheKernelsMessage) {
  auto d = DiskFullDenialFromOutput("dd: error writing 'fill/9': No space left on device\n", 1ULL << 30, "/w");
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->facet, "resources");
  EXPECT_EQ(d->op, "write");
  EXPECT_EQ(d->target, "/w");
  EXPECT_EQ(d->source, "stderr-signature");
  EXPECT_FALSE(DiskFullDenialFromOutput("Permission denied\n", 1ULL << 30, "/w").has_value());
}

// A filesystem with room is not full; one filled to its size is, by
// statfs. In a child with a user and mount namespace of its own, on a tmpfs
// of 1 MiB + 64 KiB.
TEST(DiskLimit, StatfsTellsAFullFilesystemFromOneWithRoom) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string uid = std::to_string(getuid()), gid = std::to_string(getgid());
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) _exit(77);
    auto put = [](const char* file, const std::string& text) {
      int f = open(file, O_WRONLY | O_CLOEXEC);
      bool ok = f >= 0 && write(f, text.data(), text.size()) == static_cast<ssize_t>(text.size());
      if (f >= 0) close(f);
      return ok;
    };
    if (!put("/proc/self/setgroups", "deny") || !put("/proc/self/uid_map", "0 " + uid + " 1") ||
        !put("/proc/self/gid_map", "0 " + gid + " 1")) {
      _exit(2);
    }
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) _exit(2);
    char dir[] = "/tmp/agentbox-disk-limit.XXXXXX";
    if (!mkdtemp(dir)) _exit(2);
    if (mount("tmpfs", dir, "tmpfs", 0, "size=1088k") != 0) {
      rmdir(dir);
      _exit(77);
    }
    int root = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int code = 0;
    if (DiskFullDenial(root, 1088 << 10, "/w").has_value()) code = 3;  // empty: room
    int fd = openat(root, "fill", O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    static char block[65536];
    while (write(fd, block, sizeof(block)) > 0) {
    }
    const bool enospc = errno == ENOSPC;
    auto full = DiskFullDenial(root, 1088 << 10, "/w");
    if (code == 0 && !enospc) code = 4;
    if (code == 0 && (!full || full->source != "statfs" || full->reason.find("disk_gib") == std::string::npos)) {
      code = 5;
    }
    close(fd);
    close(root);
    umount2(dir, MNT_DETACH);
    rmdir(dir);
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "not applicable here: no user namespace with a tmpfs mount";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: room read as full; 4: the fill did not end in ENOSPC; 5: full not seen";
}

}  // namespace
}  // namespace agentbox::supervise
