// escape_probe: one harmless attack per subcommand, for the escape battery.
//
// The same static binary runs on the host (where each attack is expected to
// work, so the test is real) and inside `agentbox run` (where it is expected
// to be blocked). It prints exactly one line per attack:
//
//   RESULT <attack> ok|blocked errno=<n> detail=<text>
//
// or, when the process that made the attempt was killed by a signal,
//
//   RESULT <attack> crashed errno=0 signal=<n> detail=<text>
//
// (a crash proves nothing about the sandbox: the kernel may lack the
// interface, so it is never reported as blocked). It exits 0 for ok, 1 for
// blocked, 2 for a usage error, 3 for a crash. Every argument that
// could touch the host names something the test created (a temp dir, its own
// listener, its own child process), and every kernel interface is called with
// arguments that make it fail or do nothing harmful: kexec_load with no
// segments and a bad flag, init_module with an empty image, reboot with a bad
// magic number, clock_settime to the current time.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/capability.h>
#include <linux/io_uring.h>
#include <linux/keyctl.h>
#include <linux/perf_event.h>
#include <linux/reboot.h>
#include <linux/userfaultfd.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif
#ifndef TIOCLINUX
#define TIOCLINUX 0x541C
#endif

static const char* g_attack = "?";

static int Report(int ok, int err, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static int Report(int ok, int err, const char* fmt, ...) {
  char detail[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof(detail), fmt, ap);
  va_end(ap);
  for (char* p = detail; *p; ++p) {
    if (*p == '\n') *p = ' ';
  }
  printf("RESULT %s %s errno=%d detail=%s\n", g_attack, ok ? "ok" : "blocked", err, detail);
  fflush(stdout);
  return ok ? 0 : 1;
}
#define OK(...) Report(1, 0, __VA_ARGS__)
#define BLOCKED(e, ...) Report(0, (e), __VA_ARGS__)

// The attempt died of signal `sig`: neither ok nor blocked.
static int Crashed(int sig, const char* what) {
  printf("RESULT %s crashed errno=0 signal=%d detail=%s killed by signal %d (%s)\n", g_attack, sig, what, sig,
         strsignal(sig));
  fflush(stdout);
  return 3;
}

static int Usage(void) {
  fprintf(stderr, "escape_probe: bad arguments for %s\n", g_attack);
  return 2;
}

// ------------------------------------------------------------ files

// read PATH [MARKER]: ok if PATH can be read (and contains MARKER).
static int DoRead(int argc, char** argv) {
  if (argc < 1) return Usage();
  int fd = open(argv[0], O_RDONLY | O_CLOEXEC);
  if (fd < 0) return BLOCKED(errno, "open(%s): %s", argv[0], strerror(errno));
  char buf[8192];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  int e = errno;
  close(fd);
  if (n < 0) return BLOCKED(e, "read(%s): %s", argv[0], strerror(e));
  buf[n] = 0;
  // memmem: the file may hold NULs before the marker (/proc/PID/environ).
  if (argc >= 2 && !memmem(buf, (size_t)n, argv[1], strlen(argv[1])))
    return BLOCKED(0, "read %zd bytes of %s, marker absent", n, argv[0]);
  return OK("read %zd bytes of %s", n, argv[0]);
}

// read_any PATH...: ok if any of them can be read (non-empty).
static int DoReadAny(int argc, char** argv) {
  int last = 0;
  char why[400] = "";
  for (int i = 0; i < argc; ++i) {
    int fd = open(argv[i], O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      last = errno;
      snprintf(why + strlen(why), sizeof(why) - strlen(why), "%s:%s; ", argv[i], strerror(errno));
      continue;
    }
    char buf[256];
    ssize_t n = read(fd, buf, sizeof(buf));
    last = n < 0 ? errno : 0;
    close(fd);
    if (n > 0) return OK("read %s", argv[i]);
    snprintf(why + strlen(why), sizeof(why) - strlen(why), "%s:read %zd; ", argv[i], n);
  }
  return BLOCKED(last, "%s", why);
}

// env NAME MARKER: ok if the variable is set and contains MARKER.
static int DoEnv(int argc, char** argv) {
  if (argc < 2) return Usage();
  const char* v = getenv(argv[0]);
  if (v && strstr(v, argv[1])) return OK("%s is visible", argv[0]);
  return BLOCKED(ENOENT, "%s is %s", argv[0], v ? "set without the marker" : "unset");
}

// write PATH TEXT: create or truncate PATH (no directories are created).
static int DoWrite(int argc, char** argv) {
  if (argc < 2) return Usage();
  int fd = open(argv[0], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
  if (fd < 0) return BLOCKED(errno, "open(%s): %s", argv[0], strerror(errno));
  ssize_t w = write(fd, argv[1], strlen(argv[1]));
  int e = errno;
  close(fd);
  if (w < 0) return BLOCKED(e, "write(%s): %s", argv[0], strerror(e));
  return OK("wrote %s", argv[0]);
}

// chmod_setid PATH: chmod(PATH, 06755); ok when the file then carries a
// set-id bit.
static int DoChmodSetid(int argc, char** argv) {
  if (argc < 1) return Usage();
  if (chmod(argv[0], 06755) != 0) return BLOCKED(errno, "chmod(%s, 06755): %s", argv[0], strerror(errno));
  struct stat st;
  if (stat(argv[0], &st) != 0) return BLOCKED(errno, "stat(%s): %s", argv[0], strerror(errno));
  if (st.st_mode & (S_ISUID | S_ISGID)) return OK("%s is now mode %o", argv[0], (unsigned)(st.st_mode & 07777));
  return BLOCKED(0, "%s kept no set-id bit (mode %o)", argv[0], (unsigned)(st.st_mode & 07777));
}

// append PATH TEXT
static int DoAppend(int argc, char** argv) {
  if (argc < 2) return Usage();
  int fd = open(argv[0], O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return BLOCKED(errno, "open(%s): %s", argv[0], strerror(errno));
  ssize_t w = write(fd, argv[1], strlen(argv[1]));
  int e = errno;
  close(fd);
  if (w < 0) return BLOCKED(e, "write(%s): %s", argv[0], strerror(e));
  return OK("appended to %s", argv[0]);
}

// rewrite PATH: write a file's current content back (a sysctl keeps its value).
static int DoRewrite(int argc, char** argv) {
  if (argc < 1) return Usage();
  char buf[4096] = "";
  int rfd = open(argv[0], O_RDONLY | O_CLOEXEC);
  ssize_t n = rfd >= 0 ? read(rfd, buf, sizeof(buf) - 1) : -1;
  if (rfd >= 0) close(rfd);
  int fd = open(argv[0], O_WRONLY | O_CLOEXEC);
  if (fd < 0) return BLOCKED(errno, "open(%s, O_WRONLY): %s", argv[0], strerror(errno));
  if (n <= 0) {
    close(fd);
    return BLOCKED(EIO, "could not read the current value of %s", argv[0]);
  }
  ssize_t w = write(fd, buf, (size_t)n);
  int e = errno;
  close(fd);
  if (w < 0) return BLOCKED(e, "write(%s): %s", argv[0], strerror(e));
  return OK("rewrote %s with its own value", argv[0]);
}

// open_wr PATH: open for writing, write nothing.
static int DoOpenWr(int argc, char** argv) {
  if (argc < 1) return Usage();
  int fd = open(argv[0], O_WRONLY | O_CLOEXEC);
  if (fd < 0) return BLOCKED(errno, "open(%s, O_WRONLY): %s", argv[0], strerror(errno));
  close(fd);
  return OK("opened %s for writing (nothing written)", argv[0]);
}

// open_rw PATH: open read-write (devices such as /dev/kvm, /dev/mem).
static int DoOpenRw(int argc, char** argv) {
  if (argc < 1) return Usage();
  int fd = open(argv[0], O_RDWR | O_CLOEXEC);
  if (fd < 0) return BLOCKED(errno, "open(%s, O_RDWR): %s", argv[0], strerror(errno));
  close(fd);
  return OK("opened %s read-write", argv[0]);
}

// link SRC DST: hard link a file.
static int DoLink(int argc, char** argv) {
  if (argc < 2) return Usage();
  if (link(argv[0], argv[1]) != 0) return BLOCKED(errno, "link(%s, %s): %s", argv[0], argv[1], strerror(errno));
  return OK("linked %s to %s", argv[0], argv[1]);
}

// readfd FD [MARKER]: read an inherited descriptor.
static int DoReadFd(int argc, char** argv) {
  if (argc < 1) return Usage();
  int fd = atoi(argv[0]);
  char buf[4096];
  ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n < 0) return BLOCKED(errno, "pread(%d): %s", fd, strerror(errno));
  buf[n] = 0;
  if (argc >= 2 && !strstr(buf, argv[1])) return BLOCKED(0, "fd %d readable but without the marker", fd);
  return OK("read %zd bytes from inherited fd %d", n, fd);
}

// openat_fd FD REL [MARKER]: use an inherited directory descriptor.
static int DoOpenatFd(int argc, char** argv) {
  if (argc < 2) return Usage();
  int dfd = atoi(argv[0]);
  int fd = openat(dfd, argv[1], O_RDONLY | O_CLOEXEC);
  if (fd < 0) return BLOCKED(errno, "openat(%d, %s): %s", dfd, argv[1], strerror(errno));
  char buf[4096];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n < 0) return BLOCKED(errno, "read: %s", strerror(errno));
  buf[n] = 0;
  if (argc >= 3 && !strstr(buf, argv[2])) return BLOCKED(0, "read without the marker");
  return OK("read %s through inherited dir fd %d", argv[1], dfd);
}

// exe_overwrite PID WAIT_MS: the runc-style attack. Hold /proc/PID/exe as
// O_PATH, and once the process has gone, reopen it for writing. Nothing is
// written: opening it writable is the escape.
static int DoExeOverwrite(int argc, char** argv) {
  if (argc < 2) return Usage();
  char path[64];
  snprintf(path, sizeof(path), "/proc/%s/exe", argv[0]);
  int wfd = open(path, O_WRONLY | O_CLOEXEC);
  if (wfd >= 0) {
    close(wfd);
    return OK("opened %s for writing directly", path);
  }
  int pfd = open(path, O_PATH | O_CLOEXEC);
  if (pfd < 0) return BLOCKED(errno, "open(%s, O_PATH): %s", path, strerror(errno));
  char again[64];
  snprintf(again, sizeof(again), "/proc/self/fd/%d", pfd);
  int wait_ms = atoi(argv[1]);
  int err = 0;
  for (int t = 0; t <= wait_ms; t += 20) {
    wfd = open(again, O_WRONLY | O_CLOEXEC);
    if (wfd >= 0) {
      close(wfd);
      return OK("reopened %s for writing through an O_PATH fd", path);
    }
    err = errno;
    if (err != ETXTBSY) break;
    usleep(20 * 1000);
  }
  return BLOCKED(err, "reopen of %s for writing: %s", path, strerror(err));
}

// ------------------------------------------------------------ processes

// ptrace PID...: PTRACE_ATTACH to any of them.
static int DoPtrace(int argc, char** argv) {
  int last = 0;
  char why[300] = "";
  for (int i = 0; i < argc; ++i) {
    pid_t pid = (pid_t)atoi(argv[i]);
    if (ptrace(PTRACE_ATTACH, pid, 0, 0) == 0) {
      waitpid(pid, NULL, __WALL);
      ptrace(PTRACE_DETACH, pid, 0, 0);
      return OK("attached to pid %d", pid);
    }
    last = errno;
    snprintf(why + strlen(why), sizeof(why) - strlen(why), "%d:%s; ", pid, strerror(errno));
  }
  return BLOCKED(last, "%s", why);
}

// ptrace_child: PTRACE_TRACEME in a child (the syscall itself, no target).
static int DoPtraceChild(void) {
  int p[2];
  if (pipe(p) != 0) return BLOCKED(errno, "pipe");
  pid_t c = fork();
  if (c == 0) {
    long r = ptrace(PTRACE_TRACEME, 0, 0, 0);
    int e = r == 0 ? 0 : errno;
    (void)!write(p[1], &e, sizeof(e));
    _exit(0);
  }
  int e = -1;
  (void)!read(p[0], &e, sizeof(e));
  waitpid(c, NULL, 0);
  if (e == 0) return OK("PTRACE_TRACEME succeeded");
  return BLOCKED(e, "PTRACE_TRACEME: %s", strerror(e));
}

// process_vm PID...: process_vm_readv from each.
static int DoProcessVm(int argc, char** argv) {
  int last = 0;
  char why[300] = "";
  pid_t own = 0;
  if (argc == 0) {
    // The syscall on our own child: works wherever the syscall is allowed.
    own = fork();
    if (own == 0) {
      pause();
      _exit(0);
    }
  }
  static char target_buf[16] = "probe-target";
  for (int i = 0; i < (argc ? argc : 1); ++i) {
    pid_t pid = argc ? (pid_t)atoi(argv[i]) : own;
    char buf[16];
    struct iovec local = {buf, sizeof(buf)}, remote = {target_buf, sizeof(target_buf)};
    ssize_t n = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n > 0) {
      if (own > 0) kill(own, SIGKILL), waitpid(own, NULL, 0);
      return OK("read %zd bytes of pid %d", n, pid);
    }
    last = errno;
    snprintf(why + strlen(why), sizeof(why) - strlen(why), "%d:%s; ", pid, strerror(errno));
  }
  if (own > 0) kill(own, SIGKILL), waitpid(own, NULL, 0);
  return BLOCKED(last, "%s", why);
}

// kill PID...: SIGTERM to each; ok if any signal was delivered.
static int DoKill(int argc, char** argv) {
  int last = 0;
  char why[300] = "";
  for (int i = 0; i < argc; ++i) {
    pid_t pid = (pid_t)atoi(argv[i]);
    if (pid <= 1) continue;
    if (kill(pid, SIGTERM) == 0) return OK("SIGTERM delivered to pid %d", pid);
    last = errno;
    snprintf(why + strlen(why), sizeof(why) - strlen(why), "%d:%s; ", pid, strerror(errno));
  }
  return BLOCKED(last, "%s", why);
}

// forkbomb TARGET SECONDS: a bounded fork bomb. Forks sleeping children until
// TARGET exist or fork fails; every child exits after SECONDS at the latest.
static int DoForkBomb(int argc, char** argv) {
  if (argc < 2) return Usage();
  int target = atoi(argv[0]);
  int secs = atoi(argv[1]);
  int made = 0, err = 0;
  pid_t* kids = calloc((size_t)target, sizeof(pid_t));
  for (; made < target; ++made) {
    pid_t c = fork();
    if (c < 0) {
      err = errno;
      break;
    }
    if (c == 0) {
      alarm((unsigned)secs);
      pause();
      _exit(0);
    }
    kids[made] = c;
  }
  for (int i = 0; i < made; ++i) kill(kids[i], SIGKILL);
  for (int i = 0; i < made; ++i) waitpid(kids[i], NULL, 0);
  free(kids);
  if (made >= target) return OK("forked %d processes", made);
  return BLOCKED(err, "fork failed after %d processes: %s", made, strerror(err));
}

// membomb MIB: touch MIB MiB, 8 MiB at a time, printing progress.
static int DoMemBomb(int argc, char** argv) {
  if (argc < 1) return Usage();
  int mib = atoi(argv[0]);
  int got = 0;
  for (; got < mib; got += 8) {
    char* p = mmap(NULL, 8u << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return BLOCKED(errno, "mmap failed after %d MiB", got);
    memset(p, 0x5a, 8u << 20);
    fprintf(stderr, "membomb: %d MiB\n", got + 8);
  }
  return OK("touched %d MiB", got);
}

// fill DIR MIB: write up to MIB MiB into DIR/escape-fill, then remove it.
static int DoFill(int argc, char** argv) {
  if (argc < 2) return Usage();
  char path[4096];
  snprintf(path, sizeof(path), "%s/escape-fill", argv[0]);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return BLOCKED(errno, "open(%s): %s", path, strerror(errno));
  static char block[1 << 20];
  memset(block, 0x5a, sizeof(block));
  int mib = atoi(argv[1]), done = 0, err = 0;
  for (; done < mib; ++done) {
    if (write(fd, block, sizeof(block)) != (ssize_t)sizeof(block)) {
      err = errno ? errno : ENOSPC;
      break;
    }
  }
  close(fd);
  unlink(path);
  if (done >= mib) return OK("wrote %d MiB to %s", done, argv[0]);
  return BLOCKED(err, "stopped after %d MiB: %s", done, strerror(err));
}

// ------------------------------------------------------------ namespaces, mounts

// mount DIR: a tmpfs on DIR (then unmounted).
static int DoMount(int argc, char** argv) {
  if (argc < 1) return Usage();
  if (mount("escape-probe", argv[0], "tmpfs", MS_NOSUID | MS_NODEV, "size=64k") != 0)
    return BLOCKED(errno, "mount tmpfs on %s: %s", argv[0], strerror(errno));
  umount2(argv[0], MNT_DETACH);
  return OK("mounted and unmounted a tmpfs on %s", argv[0]);
}

// unshare: a new user namespace (in a child, so the probe stays where it is).
static int InChild(int (*fn)(void*), void* arg) {
  pid_t c = fork();
  if (c < 0) return -errno;
  if (c == 0) _exit(fn(arg));
  int st = 0;
  waitpid(c, &st, 0);
  if (WIFSIGNALED(st)) return -1000 - WTERMSIG(st);
  return WEXITSTATUS(st);
}
static int UnshareUser(void* arg) {
  (void)arg;
  return unshare(CLONE_NEWUSER) == 0 ? 0 : errno;
}
static int DoUnshare(void) {
  int e = InChild(UnshareUser, NULL);
  if (e == 0) return OK("unshare(CLONE_NEWUSER) succeeded");
  if (e <= -1000) return Crashed(-e - 1000, "unshare(CLONE_NEWUSER):");
  if (e < 0) return BLOCKED(-e, "fork: %s", strerror(-e));
  return BLOCKED(e, "unshare(CLONE_NEWUSER): %s", strerror(e));
}

// clone3 with CLONE_NEWUSER (raw syscall).
struct clone_args_v0 {
  uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
};
static int DoClone3(void) {
  struct clone_args_v0 ca;
  memset(&ca, 0, sizeof(ca));
  ca.flags = CLONE_NEWUSER;
  ca.exit_signal = SIGCHLD;
  long r = syscall(SYS_clone3, &ca, sizeof(ca));
  if (r == 0) _exit(0);
  if (r < 0) return BLOCKED(errno, "clone3(CLONE_NEWUSER): %s", strerror(errno));
  waitpid((pid_t)r, NULL, 0);
  return OK("clone3(CLONE_NEWUSER) made child %ld", r);
}

// clone with CLONE_NEWUSER (the legacy syscall, fork-like).
static int DoCloneNs(void) {
  long r = syscall(SYS_clone, (unsigned long)(CLONE_NEWUSER | SIGCHLD), 0, 0, 0, 0);
  if (r == 0) _exit(0);
  if (r < 0) return BLOCKED(errno, "clone(CLONE_NEWUSER): %s", strerror(errno));
  waitpid((pid_t)r, NULL, 0);
  return OK("clone(CLONE_NEWUSER) made child %ld", r);
}

// setns NSPATH...: join a namespace file.
static int DoSetns(int argc, char** argv) {
  int last = 0;
  char why[300] = "";
  for (int i = 0; i < argc; ++i) {
    int fd = open(argv[i], O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      last = errno;
      snprintf(why + strlen(why), sizeof(why) - strlen(why), "open %s:%s; ", argv[i], strerror(errno));
      continue;
    }
    if (setns(fd, 0) == 0) {
      close(fd);
      return OK("joined %s", argv[i]);
    }
    last = errno;
    snprintf(why + strlen(why), sizeof(why) - strlen(why), "setns %s:%s; ", argv[i], strerror(errno));
    close(fd);
  }
  return BLOCKED(last, "%s", why);
}

// chroot DIR (in a child).
static int ChrootChild(void* arg) { return chroot((const char*)arg) == 0 ? 0 : errno; }
static int DoChroot(int argc, char** argv) {
  if (argc < 1) return Usage();
  int e = InChild(ChrootChild, argv[0]);
  if (e == 0) return OK("chroot(%s) succeeded", argv[0]);
  if (e <= -1000) return Crashed(-e - 1000, "chroot:");
  if (e < 0) return BLOCKED(-e, "fork: %s", strerror(-e));
  return BLOCKED(e, "chroot(%s): %s", argv[0], strerror(e));
}

// sethostname NAME [--newuts]: with --newuts, in a fresh uts namespace (the
// host variant: never rename the host itself).
static int DoSethostname(int argc, char** argv) {
  if (argc < 1) return Usage();
  if (argc >= 2 && strcmp(argv[1], "--newuts") == 0) {
    int flags = getuid() == 0 ? CLONE_NEWUTS : CLONE_NEWUSER | CLONE_NEWUTS;
    if (unshare(flags) != 0) return BLOCKED(errno, "unshare(uts): %s", strerror(errno));
  }
  if (sethostname(argv[0], strlen(argv[0])) != 0) return BLOCKED(errno, "sethostname: %s", strerror(errno));
  return OK("hostname set to %s", argv[0]);
}

// ------------------------------------------------------------ kernel interfaces

static int DoIoUring(void) {
  struct io_uring_params p;
  memset(&p, 0, sizeof(p));
  long fd = syscall(SYS_io_uring_setup, 1, &p);
  if (fd < 0) return BLOCKED(errno, "io_uring_setup: %s", strerror(errno));
  close((int)fd);
  return OK("io_uring_setup returned fd %ld", fd);
}

static int DoBpf(void) {
  union bpf_attr a;
  memset(&a, 0, sizeof(a));
  a.map_type = BPF_MAP_TYPE_ARRAY;
  a.key_size = 4;
  a.value_size = 4;
  a.max_entries = 1;
  long fd = syscall(SYS_bpf, BPF_MAP_CREATE, &a, sizeof(a));
  if (fd < 0) return BLOCKED(errno, "bpf(BPF_MAP_CREATE): %s", strerror(errno));
  close((int)fd);
  return OK("bpf map created");
}

static int DoUserfaultfd(void) {
  long fd = syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY);
  if (fd < 0) fd = syscall(SYS_userfaultfd, O_CLOEXEC);
  if (fd < 0) return BLOCKED(errno, "userfaultfd: %s", strerror(errno));
  close((int)fd);
  return OK("userfaultfd returned fd %ld", fd);
}

static int DoPerf(void) {
  struct perf_event_attr a;
  memset(&a, 0, sizeof(a));
  a.size = sizeof(a);
  a.type = PERF_TYPE_SOFTWARE;
  a.config = PERF_COUNT_SW_TASK_CLOCK;
  a.disabled = 1;
  a.exclude_kernel = 1;
  a.exclude_hv = 1;
  long fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
  if (fd < 0) return BLOCKED(errno, "perf_event_open: %s", strerror(errno));
  close((int)fd);
  return OK("perf_event_open returned fd %ld", fd);
}

static int DoKeyctl(void) {
  long id = syscall(SYS_add_key, "user", "escape-probe", "x", 1, KEY_SPEC_PROCESS_KEYRING);
  if (id < 0) return BLOCKED(errno, "add_key: %s", strerror(errno));
  return OK("add_key returned %ld", id);
}

static int DoKeyctlRaw(void) {
  long r = syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0);
  if (r < 0) return BLOCKED(errno, "keyctl(GET_KEYRING_ID): %s", strerror(errno));
  return OK("keyctl returned %ld", r);
}

// init_module with an empty image: EPERM without CAP_SYS_MODULE, else a
// parse error. "Reached the kernel" is anything but EPERM/ENOSYS.
static int DoModule(void) {
  long r = syscall(SYS_init_module, "", 0, "");
  int e = errno;
  if (r == 0) return OK("init_module succeeded?!");
  if (e == EPERM || e == ENOSYS) return BLOCKED(e, "init_module: %s", strerror(e));
  return OK("init_module reached the loader: %s", strerror(e));
}

static int DoFinitModule(void) {
  long r = syscall(SYS_finit_module, -1, "", 0);
  int e = errno;
  if (r == 0) return OK("finit_module succeeded?!");
  if (e == EPERM || e == ENOSYS) return BLOCKED(e, "finit_module: %s", strerror(e));
  return OK("finit_module passed the permission check: %s", strerror(e));
}

// kexec_load with no segments and an invalid flag.
static int DoKexec(void) {
  long r = syscall(SYS_kexec_load, 0UL, 0UL, NULL, 0xdead0000UL);
  int e = errno;
  if (r == 0) return OK("kexec_load succeeded?!");
  if (e == EPERM || e == ENOSYS) return BLOCKED(e, "kexec_load: %s", strerror(e));
  return OK("kexec_load passed the permission check: %s", strerror(e));
}

// reboot with a bad magic number: EPERM without CAP_SYS_BOOT, else EINVAL.
static int DoReboot(void) {
  long r = syscall(SYS_reboot, 0x12345678, 0x87654321, LINUX_REBOOT_CMD_CAD_OFF, NULL);
  int e = errno;
  if (r == 0) return OK("reboot returned 0?!");
  if (e == EPERM || e == ENOSYS) return BLOCKED(e, "reboot: %s", strerror(e));
  return OK("reboot passed the permission check: %s", strerror(e));
}

// clock_settime to the current time.
static int DoClock(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  if (clock_settime(CLOCK_REALTIME, &ts) != 0) return BLOCKED(errno, "clock_settime: %s", strerror(errno));
  return OK("clock_settime to the current time succeeded");
}

// personality(ADDR_NO_RANDOMIZE): weakens ASLR for the next exec.
static int DoPersonality(void) {
  int cur = personality(0xffffffff);
  int r = personality((unsigned long)(cur | ADDR_NO_RANDOMIZE));
  if (r < 0) return BLOCKED(errno, "personality: %s", strerror(errno));
  int now = personality(0xffffffff);
  if (!(now & ADDR_NO_RANDOMIZE)) return BLOCKED(EPERM, "flag not set (0x%x)", now);
  return OK("ADDR_NO_RANDOMIZE set (0x%x)", now);
}

// i386 syscalls from a 64-bit process through int 0x80: getpid (i386 nr 20),
// which cannot fail, shows whether the i386 table is served at all; then
// unshare(CLONE_NEWUSER) (i386 nr 310), which a filter that checks only
// x86_64 numbers lets through. A kernel without i386 emulation
// (CONFIG_IA32_EMULATION off, or ia32_emulation=0) answers int 0x80 with
// SIGSEGV: reported as a crash, since it says nothing about a sandbox.
#if defined(__x86_64__)
static long I386Call(long nr, long arg) {
  long r;
  __asm__ volatile("int $0x80" : "=a"(r) : "a"(nr), "b"(arg) : "memory");
  return r;
}
static int I386Getpid(void* arg) {
  (void)arg;
  long r = I386Call(20, 0);
  return r == getpid() ? 0 : r < 0 ? (int)-r : 255;
}
static int I386Unshare(void* arg) {
  (void)arg;
  long r = I386Call(310, CLONE_NEWUSER);
  return r == 0 ? 0 : (int)-r;
}
static int DoI386(void) {
  int e = InChild(I386Getpid, NULL);
  if (e <= -1000) return Crashed(-e - 1000, "i386 getpid through int 0x80:");
  if (e == 255) return BLOCKED(0, "i386 getpid returned something other than the pid");
  if (e != 0) return BLOCKED(e, "i386 getpid: %s", strerror(e));
  e = InChild(I386Unshare, NULL);
  if (e == 0) return OK("i386 getpid and unshare(CLONE_NEWUSER) through int 0x80 succeeded");
  if (e <= -1000) return Crashed(-e - 1000, "i386 unshare through int 0x80:");
  return BLOCKED(e, "i386 getpid served, i386 unshare: %s", strerror(e));
}
#else
static int DoI386(void) { return BLOCKED(ENOSYS, "not an x86_64 build: no int 0x80"); }
#endif

// open_by_handle: name_to_handle_at + open_by_handle_at on PATH ("shocker").
static int DoOpenByHandle(int argc, char** argv) {
  if (argc < 1) return Usage();
  struct {
    struct file_handle fh;
    unsigned char data[128];
  } h;
  h.fh.handle_bytes = 128;
  int mount_id = 0;
  if (name_to_handle_at(AT_FDCWD, argv[0], &h.fh, &mount_id, 0) != 0)
    return BLOCKED(errno, "name_to_handle_at(%s): %s", argv[0], strerror(errno));
  int fd = open_by_handle_at(AT_FDCWD, &h.fh, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return BLOCKED(errno, "open_by_handle_at: %s", strerror(errno));
  close(fd);
  return OK("opened %s by handle", argv[0]);
}

// ------------------------------------------------------------ terminals

static int EnsureCtty(int fd) {
  // Outside, when not root: make the tty our controlling terminal, as the
  // shell that owns a terminal has it.
  if (getsid(0) != getpid()) setsid();
  return ioctl(fd, TIOCSCTTY, 0);
}

// tiocsti FD TEXT [--highbit] [--ctty]
static int DoTiocsti(int argc, char** argv) {
  if (argc < 2) return Usage();
  int fd = atoi(argv[0]);
  int high = 0, ctty = 0;
  for (int i = 2; i < argc; ++i) {
    if (!strcmp(argv[i], "--highbit")) high = 1;
    if (!strcmp(argv[i], "--ctty")) ctty = 1;
  }
  if (ctty) EnsureCtty(fd);
  unsigned long req = TIOCSTI | (high ? 0x100000000UL : 0);
  for (const char* p = argv[1]; *p; ++p) {
    if (syscall(SYS_ioctl, fd, req, p) != 0)
      return BLOCKED(errno, "ioctl(%d, TIOCSTI%s): %s", fd, high ? "|1<<32" : "", strerror(errno));
  }
  return OK("injected %zu bytes with TIOCSTI%s", strlen(argv[1]), high ? "|1<<32" : "");
}

// tioclinux FD [--highbit]: TIOCLINUX subcode 3 (TIOCL_SETSEL-free: read the
// shift state of a virtual console, harmless).
static int DoTioclinux(int argc, char** argv) {
  if (argc < 1) return Usage();
  int fd = atoi(argv[0]);
  int high = argc >= 2 && !strcmp(argv[1], "--highbit");
  unsigned long req = TIOCLINUX | (high ? 0x100000000UL : 0);
  char arg[2] = {6, 0};  // TIOCL_GETSHIFTSTATE
  if (syscall(SYS_ioctl, fd, req, arg) != 0) {
    int e = errno;
    // ENOTTY/EINVAL: the kernel ran the request and the tty is not a virtual
    // console. Only EPERM (or a kill) means it was stopped before the driver.
    if (e == EPERM) return BLOCKED(e, "ioctl(TIOCLINUX%s): %s", high ? "|1<<32" : "", strerror(e));
    return OK("TIOCLINUX%s reached the tty layer: %s", high ? "|1<<32" : "", strerror(e));
  }
  return OK("TIOCLINUX%s succeeded: shift state %d", high ? "|1<<32" : "", arg[0]);
}

// ------------------------------------------------------------ network

static int DoTcp(int argc, char** argv) {
  if (argc < 1) return Usage();
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return BLOCKED(errno, "socket: %s", strerror(errno));
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[0]))};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(s, (struct sockaddr*)&a, sizeof(a)) != 0) return BLOCKED(errno, "connect: %s", strerror(errno));
  if (argc >= 2) (void)!write(s, argv[1], strlen(argv[1]));
  close(s);
  return OK("connected to 127.0.0.1:%s", argv[0]);
}

// udp PORT MARKER: send twice on a connected socket; a refusal shows up as
// ECONNREFUSED on the second send.
static int DoUdp(int argc, char** argv) {
  if (argc < 2) return Usage();
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return BLOCKED(errno, "socket: %s", strerror(errno));
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[0]))};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(s, (struct sockaddr*)&a, sizeof(a)) != 0) return BLOCKED(errno, "connect: %s", strerror(errno));
  for (int i = 0; i < 3; ++i) {
    if (send(s, argv[1], strlen(argv[1]), 0) < 0) return BLOCKED(errno, "send #%d: %s", i + 1, strerror(errno));
    usleep(50 * 1000);
  }
  close(s);
  return OK("sent to 127.0.0.1:%s without a refusal", argv[0]);
}

static int DoUnix(int argc, char** argv, int abstract) {
  if (argc < 1) return Usage();
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return BLOCKED(errno, "socket: %s", strerror(errno));
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  socklen_t len;
  if (abstract) {
    a.sun_path[0] = 0;
    strncpy(a.sun_path + 1, argv[0], sizeof(a.sun_path) - 2);
    len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(argv[0]));
  } else {
    strncpy(a.sun_path, argv[0], sizeof(a.sun_path) - 1);
    len = sizeof(a);
  }
  if (connect(s, (struct sockaddr*)&a, len) != 0) return BLOCKED(errno, "connect: %s", strerror(errno));
  if (argc >= 2) (void)!write(s, argv[1], strlen(argv[1]));
  close(s);
  return OK("connected to %s unix socket %s", abstract ? "abstract" : "pathname", argv[0]);
}

static int DoSocket(int family, int type, int proto, const char* what) {
  int s = socket(family, type | SOCK_CLOEXEC, proto);
  if (s < 0) return BLOCKED(errno, "socket(%s): %s", what, strerror(errno));
  close(s);
  return OK("socket(%s) created", what);
}

// dns NAME: one A query to the first nameserver in /etc/resolv.conf (UDP,
// 2 s). ok when an answer arrives.
static int DoDns(int argc, char** argv) {
  if (argc < 1) return Usage();
  char ns[64] = "";
  FILE* f = fopen("/etc/resolv.conf", "r");
  if (f) {
    char line[256];
    while (fgets(line, sizeof(line), f)) {
      if (sscanf(line, "nameserver %63s", ns) == 1 && strchr(ns, '.')) break;
      ns[0] = 0;
    }
    fclose(f);
  }
  if (!ns[0]) strcpy(ns, "127.0.0.53");
  if (argc >= 2) snprintf(ns, sizeof(ns), "%s", argv[1]);  // a server named outright
  unsigned char q[512];
  size_t n = 0;
  const unsigned char hdr[12] = {0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0};
  memcpy(q, hdr, 12);
  n = 12;
  const char* name = argv[0];
  while (*name) {
    const char* dot = strchr(name, '.');
    size_t l = dot ? (size_t)(dot - name) : strlen(name);
    q[n++] = (unsigned char)l;
    memcpy(q + n, name, l);
    n += l;
    name += l + (dot ? 1 : 0);
  }
  q[n++] = 0;
  q[n++] = 0, q[n++] = 1, q[n++] = 0, q[n++] = 1;
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return BLOCKED(errno, "socket: %s", strerror(errno));
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(53)};
  if (inet_pton(AF_INET, ns, &a.sin_addr) != 1) return BLOCKED(EINVAL, "bad nameserver %s", ns);
  if (sendto(s, q, n, 0, (struct sockaddr*)&a, sizeof(a)) < 0)
    return BLOCKED(errno, "sendto(%s:53): %s", ns, strerror(errno));
  struct pollfd p = {s, POLLIN, 0};
  if (poll(&p, 1, 2000) <= 0) return BLOCKED(ETIMEDOUT, "no answer from %s within 2 s", ns);
  unsigned char ans[512];
  ssize_t got = recv(s, ans, sizeof(ans), 0);
  if (got < 0) return BLOCKED(errno, "recv: %s", strerror(errno));
  // An answer that refuses, or carries no address, resolved nothing.
  if (got < 12) return BLOCKED(EPROTO, "%zd-byte answer from %s", got, ns);
  const int rcode = ans[3] & 0x0f, answers = (ans[6] << 8) | ans[7];
  if (rcode == 5) return BLOCKED(ECONNREFUSED, "REFUSED by %s", ns);
  if (rcode != 0 || answers == 0) return BLOCKED(ENOENT, "rcode %d, %d answers from %s", rcode, answers, ns);
  return OK("%zd-byte answer from %s with %d answers", got, ns, answers);
}

// ------------------------------------------------------------ privileges

// whoami: ok if the effective uid differs from the real one (a setuid bit
// took effect).
static int DoWhoami(void) {
  if (geteuid() != getuid()) return OK("setuid took effect: uid %d euid %d", getuid(), geteuid());
  return BLOCKED(EPERM, "uid %d euid %d: setuid ignored", getuid(), geteuid());
}

// caps_raw: a raw socket, which needs CAP_NET_RAW (from file capabilities).
static int DoCapsRaw(void) {
  int s = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_ICMP);
  if (s < 0) return BLOCKED(errno, "raw socket: %s", strerror(errno));
  close(s);
  return OK("raw socket created (CAP_NET_RAW effective)");
}

// sysv_shm KEY: attach the host's shared memory segment with that key.
static int DoSysvShm(int argc, char** argv) {
  if (argc < 1) return Usage();
  int id = shmget((key_t)strtol(argv[0], NULL, 0), 0, 0);
  if (id < 0) return BLOCKED(errno, "shmget(%s): %s", argv[0], strerror(errno));
  return OK("found segment %d for key %s", id, argv[0]);
}

// stage_privileged DIR: as root, copy this binary to DIR/probe_setuid (owner
// 65534, mode 04755) and DIR/probe_filecap (file capability cap_net_raw+ep).
static int CopySelf(const char* dst) {
  int in = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
  if (in < 0 || out < 0) return -1;
  char buf[65536];
  ssize_t n;
  while ((n = read(in, buf, sizeof(buf))) > 0) {
    if (write(out, buf, (size_t)n) != n) return -1;
  }
  close(in);
  close(out);
  return 0;
}
static int DoStage(int argc, char** argv) {
  if (argc < 1) return Usage();
  char a[4096], b[4096];
  snprintf(a, sizeof(a), "%s/probe_setuid", argv[0]);
  snprintf(b, sizeof(b), "%s/probe_filecap", argv[0]);
  if (CopySelf(a) != 0 || chown(a, 65534, 65534) != 0 || chmod(a, 04755) != 0)
    return BLOCKED(errno, "staging %s: %s", a, strerror(errno));
  if (CopySelf(b) != 0) return BLOCKED(errno, "copy %s: %s", b, strerror(errno));
  struct vfs_cap_data cap;
  memset(&cap, 0, sizeof(cap));
  cap.magic_etc = VFS_CAP_REVISION_2 | VFS_CAP_FLAGS_EFFECTIVE;
  cap.data[0].permitted = 1u << CAP_NET_RAW;
  if (setxattr(b, "security.capability", &cap, XATTR_CAPS_SZ_2, 0) != 0)
    return BLOCKED(errno, "setxattr(%s): %s", b, strerror(errno));
  chmod(b, 0755);
  return OK("staged %s and %s", a, b);
}

// as_uid UID PROG ARGS...: drop to UID (root only) and exec.
static int DoAsUid(int argc, char** argv) {
  if (argc < 2) return Usage();
  uid_t u = (uid_t)atoi(argv[0]);
  if (setgroups(0, NULL) != 0 || setgid(u) != 0 || setuid(u) != 0)
    return BLOCKED(errno, "dropping to uid %u: %s", u, strerror(errno));
  execv(argv[1], argv + 1);
  return BLOCKED(errno, "exec %s: %s", argv[1], strerror(errno));
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: escape_probe ATTACK [ARGS...]\n");
    return 2;
  }
  g_attack = argv[1];
  int n = argc - 2;
  char** a = argv + 2;
  const char* c = argv[1];
  if (!strcmp(c, "read")) return DoRead(n, a);
  if (!strcmp(c, "read_any")) return DoReadAny(n, a);
  if (!strcmp(c, "env")) return DoEnv(n, a);
  if (!strcmp(c, "write")) return DoWrite(n, a);
  if (!strcmp(c, "append")) return DoAppend(n, a);
  if (!strcmp(c, "chmod_setid")) return DoChmodSetid(n, a);
  if (!strcmp(c, "rewrite")) return DoRewrite(n, a);
  if (!strcmp(c, "open_wr")) return DoOpenWr(n, a);
  if (!strcmp(c, "open_rw")) return DoOpenRw(n, a);
  if (!strcmp(c, "open_ro")) return DoRead(n, a);
  if (!strcmp(c, "link")) return DoLink(n, a);
  if (!strcmp(c, "readfd")) return DoReadFd(n, a);
  if (!strcmp(c, "openat_fd")) return DoOpenatFd(n, a);
  if (!strcmp(c, "exe_overwrite")) return DoExeOverwrite(n, a);
  if (!strcmp(c, "ptrace")) return DoPtrace(n, a);
  if (!strcmp(c, "ptrace_child")) return DoPtraceChild();
  if (!strcmp(c, "process_vm")) return DoProcessVm(n, a);
  if (!strcmp(c, "kill")) return DoKill(n, a);
  if (!strcmp(c, "forkbomb")) return DoForkBomb(n, a);
  if (!strcmp(c, "membomb")) return DoMemBomb(n, a);
  if (!strcmp(c, "fill")) return DoFill(n, a);
  if (!strcmp(c, "mount")) return DoMount(n, a);
  if (!strcmp(c, "unshare")) return DoUnshare();
  if (!strcmp(c, "clone3")) return DoClone3();
  if (!strcmp(c, "clone_ns")) return DoCloneNs();
  if (!strcmp(c, "setns")) return DoSetns(n, a);
  if (!strcmp(c, "chroot")) return DoChroot(n, a);
  if (!strcmp(c, "sethostname")) return DoSethostname(n, a);
  if (!strcmp(c, "io_uring")) return DoIoUring();
  if (!strcmp(c, "bpf")) return DoBpf();
  if (!strcmp(c, "userfaultfd")) return DoUserfaultfd();
  if (!strcmp(c, "perf_event_open")) return DoPerf();
  if (!strcmp(c, "add_key")) return DoKeyctl();
  if (!strcmp(c, "keyctl")) return DoKeyctlRaw();
  if (!strcmp(c, "init_module")) return DoModule();
  if (!strcmp(c, "finit_module")) return DoFinitModule();
  if (!strcmp(c, "kexec_load")) return DoKexec();
  if (!strcmp(c, "reboot")) return DoReboot();
  if (!strcmp(c, "clock_settime")) return DoClock();
  if (!strcmp(c, "personality")) return DoPersonality();
  if (!strcmp(c, "i386_unshare")) return DoI386();
  if (!strcmp(c, "open_by_handle")) return DoOpenByHandle(n, a);
  if (!strcmp(c, "tiocsti")) return DoTiocsti(n, a);
  if (!strcmp(c, "tioclinux")) return DoTioclinux(n, a);
  if (!strcmp(c, "tcp")) return DoTcp(n, a);
  if (!strcmp(c, "udp")) return DoUdp(n, a);
  if (!strcmp(c, "unix_abstract")) return DoUnix(n, a, 1);
  if (!strcmp(c, "unix_path")) return DoUnix(n, a, 0);
  if (!strcmp(c, "raw_socket")) return DoSocket(AF_INET, SOCK_RAW, IPPROTO_ICMP, "AF_INET, SOCK_RAW");
  if (!strcmp(c, "packet_socket")) return DoSocket(AF_PACKET, SOCK_RAW, htons(0x0003), "AF_PACKET, SOCK_RAW");
  if (!strcmp(c, "netlink_socket")) return DoSocket(AF_NETLINK, SOCK_RAW, 9 /*NETLINK_AUDIT*/, "AF_NETLINK, NETLINK_AUDIT");
  if (!strcmp(c, "dns")) return DoDns(n, a);
  if (!strcmp(c, "whoami")) return DoWhoami();
  if (!strcmp(c, "caps_raw")) return DoCapsRaw();
  if (!strcmp(c, "sysv_shm")) return DoSysvShm(n, a);
  if (!strcmp(c, "stage_privileged")) return DoStage(n, a);
  if (!strcmp(c, "as_uid")) return DoAsUid(n, a);
  fprintf(stderr, "escape_probe: unknown attack %s\n", c);
  return 2;
}
