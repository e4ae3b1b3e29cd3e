// The one kernel-compat header: constants and syscall numbers that older
// userspace headers lack. Everything that calls these goes through the thin
// wrappers below.
#pragma once

#include <fcntl.h>
#include <linux/landlock.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

// A socket's network namespace, as a cookie (Linux 5.14).
#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71
#endif
#ifndef SYS_clone3
#define SYS_clone3 435
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif
// pidfd_open of one thread rather than of a thread group (Linux 6.9).
#ifndef PIDFD_THREAD
#define PIDFD_THREAD O_EXCL
#endif
// seccomp user notification: synchronous wake-ups (Linux 6.6).
#ifndef SECCOMP_IOCTL_NOTIF_SET_FLAGS
#define SECCOMP_IOCTL_NOTIF_SET_FLAGS SECCOMP_IOW(4, __u64)
#endif
#ifndef SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP
#define SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP (1UL << 0)
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif
#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#endif
#ifndef SYS_landlock_add_rule
#define SYS_landlock_add_rule 445
#endif
#ifndef SYS_landlock_restrict_self
#define SYS_landlock_restrict_self 446
#endif
#ifndef SYS_openat2
#define SYS_openat2 437
#endif

#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif
#ifndef CLONE_NEWCGROUP
#define CLONE_NEWCGROUP 0x02000000
#endif
#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif
#ifndef OPEN_TREE_CLONE
#define OPEN_TREE_CLONE 1
#endif
#ifndef OPEN_TREE_CLOEXEC
#define OPEN_TREE_CLOEXEC O_CLOEXEC
#endif
#ifndef MOVE_MOUNT_F_EMPTY_PATH
#define MOVE_MOUNT_F_EMPTY_PATH 0x00000004
#endif
#ifndef MOVE_MOUNT_T_EMPTY_PATH
#define MOVE_MOUNT_T_EMPTY_PATH 0x00000040
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
#ifndef MOUNT_ATTR_RDONLY
#define MOUNT_ATTR_RDONLY 0x00000001
#define MOUNT_ATTR_NOSUID 0x00000002
#define MOUNT_ATTR_NODEV 0x00000004
#define MOUNT_ATTR_NOEXEC 0x00000008
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef LANDLOCK_CREATE_RULESET_VERSION
#define LANDLOCK_CREATE_RULESET_VERSION (1U << 0)
#endif
// Landlock rights newer than the userspace headers (ABI 3, 5, 6).
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif
#ifndef LANDLOCK_ACCESS_FS_IOCTL_DEV
#define LANDLOCK_ACCESS_FS_IOCTL_DEV (1ULL << 15)
#endif
#ifndef LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET
#define LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0)
#define LANDLOCK_SCOPE_SIGNAL (1ULL << 1)
#endif
#ifndef LANDLOCK_ACCESS_NET_BIND_TCP
#define LANDLOCK_ACCESS_NET_BIND_TCP (1ULL << 0)
#define LANDLOCK_ACCESS_NET_CONNECT_TCP (1ULL << 1)
#endif
#ifndef LANDLOCK_RULE_PATH_BENEATH
#define LANDLOCK_RULE_PATH_BENEATH 1
#endif
#ifndef LANDLOCK_RULE_NET_PORT
#define LANDLOCK_RULE_NET_PORT 2
#endif
#ifndef RESOLVE_NO_SYMLINKS
#define RESOLVE_NO_XDEV 0x01
#define RESOLVE_NO_MAGICLINKS 0x02
#define RESOLVE_NO_SYMLINKS 0x04
#define RESOLVE_BENEATH 0x08
#endif

namespace agentbox::linux {

struct CloneArgs {
  std::uint64_t flags;
  std::uint64_t pidfd;
  std::uint64_t child_tid;
  std::uint64_t parent_tid;
  std::uint64_t exit_signal;
  std::uint64_t stack;
  std::uint64_t stack_size;
  std::uint64_t tls;
  std::uint64_t set_tid;
  std::uint64_t set_tid_size;
  std::uint64_t cgroup;
};

struct MountAttr {
  std::uint64_t attr_set;
  std::uint64_t attr_clr;
  std::uint64_t propagation;
  std::uint64_t userns_fd;
};

// struct landlock_ruleset_attr as of ABI 6 (older headers stop after
// handled_access_fs). The kernel accepts the larger size from ABI 1 on as
// long as the fields it does not know are zero.
struct LandlockRulesetAttr {
  std::uint64_t handled_access_fs;
  std::uint64_t handled_access_net;
  std::uint64_t scoped;
};

// struct landlock_net_port_attr (ABI 4), packed like the kernel's.
struct __attribute__((packed)) LandlockNetPortAttr {
  std::uint64_t allowed_access;
  std::uint64_t port;
};

struct OpenHow {
  std::uint64_t flags;
  std::uint64_t mode;
  std::uint64_t resolve;
};

// fork-like clone3 (no new stack): returns 0 in the child, the pid in the parent.
inline long Clone3(CloneArgs* args) { return syscall(SYS_clone3, args, sizeof(*args)); }
// Clone3, or the same fork-like clone where clone3 answers ENOSYS: Docker's
// default seccomp profile gives a container without CAP_SYS_ADMIN ENOSYS for
// every clone3 (a filter cannot read its flags), so that libc falls back to
// clone, whose flags it can check. clone carries no CLONE_INTO_CGROUP: a
// caller asking for it gets clone3's ENOSYS.
inline long CloneProcess(CloneArgs* args) {
  const long pid = Clone3(args);
  if (pid >= 0 || errno != ENOSYS || (args->flags & CLONE_INTO_CGROUP) != 0) return pid;
  // Raw clone's argument order on x86_64 and arm64: flags (with the exit
  // signal), stack (none: fork-like), parent_tid (where CLONE_PIDFD stores
  // the pidfd), then child_tid and tls (unused).
  return syscall(SYS_clone, args->flags | args->exit_signal, nullptr, reinterpret_cast<int*>(args->pidfd), nullptr,
                 nullptr);
}
inline int CloseRange(unsigned first, unsigned last, unsigned flags) {
  return static_cast<int>(syscall(SYS_close_range, first, last, flags));
}
// Closes every descriptor from `first` to `last`: close_range, or where the
// kernel refuses it (before Linux 5.9; gVisor's) the open ones that
// /proc/self/fd lists (a close per possible number costs seconds on
// gVisor). No allocation: safe in a forked child.
inline void CloseFds(unsigned first, unsigned last = ~0U) {
  if (CloseRange(first, last, 0) == 0) return;
  const int dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    for (unsigned fd = first; fd <= last && fd < 65536; ++fd) close(static_cast<int>(fd));
    return;
  }
  for (bool more = true; more;) {
    more = false;
    int found[256];
    int n = 0;
    lseek(dir, 0, SEEK_SET);
    alignas(8) char buf[4096];
    for (long got; n < 256 && (got = syscall(SYS_getdents64, dir, buf, sizeof(buf))) > 0;) {
      for (long off = 0; off < got;) {
        // struct linux_dirent64: ino (8), off (8), reclen (2), type (1), name.
        unsigned short reclen;
        __builtin_memcpy(&reclen, buf + off + 16, sizeof(reclen));
        const char* name = buf + off + 19;
        unsigned long fd = 0;
        bool number = *name != 0;
        for (const char* c = name; *c; ++c) {
          if (*c < '0' || *c > '9') {
            number = false;
            break;
          }
          fd = fd * 10 + static_cast<unsigned long>(*c - '0');
        }
        if (number && fd >= first && fd <= last && static_cast<int>(fd) != dir && n < 256) {
          found[n++] = static_cast<int>(fd);
        }
        off += reclen;
      }
    }
    for (int i = 0; i < n; ++i) close(found[i]);
    more = n == 256;
  }
  close(dir);
}
inline int OpenTree(int dirfd, const char* path, unsigned flags) {
  return static_cast<int>(syscall(SYS_open_tree, dirfd, path, flags));
}
inline int MoveMount(int from_dirfd, const char* from_path, int to_dirfd, const char* to_path,
                     unsigned flags) {
  return static_cast<int>(syscall(SYS_move_mount, from_dirfd, from_path, to_dirfd, to_path, flags));
}
inline int MountSetattr(int dirfd, const char* path, unsigned flags, MountAttr* attr) {
  return static_cast<int>(syscall(SYS_mount_setattr, dirfd, path, flags, attr, sizeof(*attr)));
}
inline int PidfdOpen(pid_t pid, unsigned flags = 0) {
  return static_cast<int>(syscall(SYS_pidfd_open, pid, flags));
}
inline int PidfdGetfd(int pidfd, int fd) { return static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, fd, 0)); }
inline int PidfdSendSignal(int pidfd, int sig) {
  return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}
inline int Openat2(int dirfd, const char* path, OpenHow* how) {
  return static_cast<int>(syscall(SYS_openat2, dirfd, path, how, sizeof(*how)));
}

}  // namespace agentbox::linux
