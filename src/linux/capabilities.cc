#include "linux/capabilities.h"

#include <linux/capability.h>
#include <linux/securebits.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <cstdlib>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace agentbox::linux {
namespace {

// The highest capability this kernel knows; 63 when it does not say.
int LastCap() {
  int fd = open("/proc/sys/kernel/cap_last_cap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 63;
  char buf[16] = {};
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  int last = n > 0 ? atoi(buf) : 63;
  return last > 0 && last < 64 ? last : 63;
}

}  // namespace

Status DropAllCapabilities() {
  // An unprivileged process outside a user namespace (the landlock-only
  // backend) holds no capability and may not touch securebits or the
  // bounding set; with no_new_privs no exec can grant it one either.
  struct __user_cap_header_struct query {};
  query.version = _LINUX_CAPABILITY_VERSION_3;
  struct __user_cap_data_struct held[2] = {};
  if (syscall(SYS_capget, &query, held) == 0 &&
      (held[0].permitted | held[1].permitted | held[0].inheritable | held[1].inheritable) == 0) {
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
      return Status::Errno("capabilities", "prctl(PR_SET_NO_NEW_PRIVS)");
    }
    return {};
  }
  // Securebits first: it needs CAP_SETPCAP, which goes with the bounding set.
  const unsigned long bits = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
                             SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED;
  if (prctl(PR_SET_SECUREBITS, bits, 0, 0, 0) != 0) {
    return Status::Errno("capabilities", "prctl(PR_SET_SECUREBITS)");
  }
  const int last = LastCap();
  for (int cap = 0; cap <= last; ++cap) {
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) {  // EINVAL: no such cap
      return Status::Errno("capabilities", "prctl(PR_CAPBSET_DROP)", std::to_string(cap));
    }
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL) {
    return Status::Errno("capabilities", "prctl(PR_CAP_AMBIENT_CLEAR_ALL)");
  }
  struct __user_cap_header_struct header {};
  header.version = _LINUX_CAPABILITY_VERSION_3;
  struct __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capset, &header, data) != 0) return Status::Errno("capabilities", "capset");
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    return Status::Errno("capabilities", "prctl(PR_SET_NO_NEW_PRIVS)");
  }
  return {};
}

}  // namespace agentbox::linux
