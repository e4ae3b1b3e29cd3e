#include "session/upper_image.h"

#include <fcntl.h>
#include <linux/loop.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "linux/fd.h"

namespace agentbox::session {
namespace {

using linux::UniqueFd;

constexpr const char* kMkfs = "mkfs.ext4";
constexpr const char* kToolPath = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";

bool IsMountPoint(const std::string& dir) {
  struct stat here {}, parent {};
  if (stat(dir.c_str(), &here) != 0) return false;
  if (stat((dir + "/..").c_str(), &parent) != 0) return false;
  return here.st_dev != parent.st_dev;
}

// Runs mkfs.ext4 on `image`: no reserved blocks (the cap is the session's
// whole), quiet, with an empty environment but a fixed PATH.
Status Format(const std::string& image) {
  std::vector<std::string> args = {kMkfs, "-q", "-F", "-m", "0", "-L", "agentbox-upper", image};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::string path = kToolPath;
  char* envp[] = {path.data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, kMkfs, &actions, nullptr, argv.data(), envp);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return Status::Syscall("session", "posix_spawnp(mkfs.ext4)", image, rc);
  int ws = 0;
  while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
    return Status::Error("session", "mkfs.ext4 " + image + " failed (status " + std::to_string(ws) + ")");
  }
  return {};
}

// Attaches `image` to a free loop device (autoclear: it goes with the
// mount) and mounts it at `dir`.
Status LoopMount(const std::string& image, const std::string& dir) {
  UniqueFd file(open(image.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!file.valid()) return Status::Errno("session", "open", image);
  UniqueFd control(open("/dev/loop-control", O_RDWR | O_CLOEXEC));
  if (!control.valid()) return Status::Errno("session", "open", "/dev/loop-control");
  for (int attempt = 0; attempt < 16; ++attempt) {
    const int n = ioctl(control.get(), LOOP_CTL_GET_FREE);
    if (n < 0) return Status::Errno("session", "ioctl(LOOP_CTL_GET_FREE)", "/dev/loop-control");
    const std::string dev = "/dev/loop" + std::to_string(n);
    UniqueFd loop(open(dev.c_str(), O_RDWR | O_CLOEXEC));
    if (!loop.valid()) return Status::Errno("session", "open", dev);
    struct loop_config config {};
    config.fd = static_cast<__u32>(file.get());
    config.info.lo_flags = LO_FLAGS_AUTOCLEAR;
    std::strncpy(reinterpret_cast<char*>(config.info.lo_file_name), image.c_str(), LO_NAME_SIZE - 1);
    if (ioctl(loop.get(), LOOP_CONFIGURE, &config) != 0) {
      if (errno == EBUSY) continue;  // taken meanwhile by someone else
      return Status::Errno("session", "ioctl(LOOP_CONFIGURE)", dev);
    }
    if (mount(dev.c_str(), dir.c_str(), "ext4", MS_NOSUID | MS_NODEV, nullptr) != 0) {
      const int err = errno;
      ioctl(loop.get(), LOOP_CLR_FD, 0);
      return Status::Syscall("session", "mount(ext4, " + dev + ")", dir, err);
    }
    return {};  // the mount holds the device; autoclear frees it at umount
  }
  return Status::Error("session", "no free loop device for " + image);
}

}  // namespace

bool UpperImageAvailable() {
  if (geteuid() != 0 || access("/dev/loop-control", R_OK | W_OK) != 0) return false;
  for (const char* dir : {"/usr/sbin/", "/usr/bin/", "/sbin/", "/bin/"}) {
    if (access((std::string(dir) + kMkfs).c_str(), X_OK) == 0) return true;
  }
  return false;
}

Status EnsureUpperImage(const std::string& image, const std::string& mount_dir, std::uint64_t bytes,
                        mode_t upper_mode) {
  if (!IsMountPoint(mount_dir)) {
    struct stat st {};
    if (stat(image.c_str(), &st) != 0) {
      // Sparse: the disk is used as the session writes, up to `bytes`.
      const std::string tmp = image + ".tmp";
      UniqueFd fd(open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
      if (!fd.valid()) return Status::Errno("session", "open", tmp);
      if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) return Status::Errno("session", "ftruncate", tmp);
      fd.reset();
      if (Status s = Format(tmp); !s.ok()) {
        unlink(tmp.c_str());
        return s;
      }
      if (rename(tmp.c_str(), image.c_str()) != 0) return Status::Errno("session", "rename", image);
    }
    if (mkdir(mount_dir.c_str(), 0700) != 0 && errno != EEXIST) return Status::Errno("session", "mkdir", mount_dir);
    if (Status s = LoopMount(image, mount_dir); !s.ok()) return s;
  }
  // ext4's own lost+found is left alone: it is not in the layer.
  const std::string upper = mount_dir + "/upper", work = mount_dir + "/work";
  if (mkdir(upper.c_str(), 0700) == 0) {
    if (chmod(upper.c_str(), upper_mode & 07777) != 0) return Status::Errno("session", "chmod", upper);
  } else if (errno != EEXIST) {
    return Status::Errno("session", "mkdir", upper);
  }
  if (mkdir(work.c_str(), 0700) != 0 && errno != EEXIST) return Status::Errno("session", "mkdir", work);
  return {};
}

Status UnmountUpperImage(const std::string& mount_dir) {
  if (!IsMountPoint(mount_dir)) return {};
  if (umount2(mount_dir.c_str(), UMOUNT_NOFOLLOW) == 0) return {};
  if (errno == EBUSY && umount2(mount_dir.c_str(), MNT_DETACH | UMOUNT_NOFOLLOW) == 0) return {};
  return Status::Errno("session", "umount2", mount_dir);
}

}  // namespace agentbox::session
