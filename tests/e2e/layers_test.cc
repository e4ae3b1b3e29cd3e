// The layers stacked on the namespaces: the seccomp filter (each denied
// group attacked once, the denial reported by syscall name), foreign
// architectures refused, Landlock holding where a mount alone would allow,
// and ordinary work unaffected.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <string>

#include "harness.h"

namespace agentbox::e2e {
namespace {

// True if the report has a seccomp denial of `syscall`.
bool HasSyscallDenial(const RunResult& r, const std::string& syscall) {
  if (!r.report || !(*r.report)["denials"].is_array()) return false;
  for (const auto& d : (*r.report)["denials"]) {
    if (d.value("facet", "") == "syscalls" && d.value("op", "") == syscall && d.value("source", "") == "seccomp") {
      return true;
    }
  }
  return false;
}

// Each call prints "name result errno". Raw syscall numbers (x86_64), so
// that no libc wrapper hides what reaches the kernel.
constexpr const char* kAttacks = R"PY(
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
buf = ctypes.create_string_buffer(256)
addr = ctypes.addressof(buf)
def t(name, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    print(name, r, ctypes.get_errno(), flush=True)
t("ptrace", 101, 0, 0, 0, 0)                       # PTRACE_TRACEME
t("process_vm_readv", 310, os.getpid(), 0, 0, 0, 0, 0)
t("mount", 165, 0, addr, 0, 0, 0)
t("umount2", 166, addr, 0)
t("pivot_root", 155, addr, addr)
t("fsopen", 430, addr, 0)
t("open_tree", 428, -100, addr, 0)
t("move_mount", 429, -1, addr, -1, addr, 0)
t("fsmount", 432, -1, 0, 0)
t("fsconfig", 431, -1, 0, 0, 0, 0)
t("mount_setattr", 442, -1, addr, 0, 0, 0)
t("unshare", 272, 0x10000000)                     # CLONE_NEWUSER
t("setns", 308, -1, 0)
t("clone", 56, 0x10000000 | 17, 0, 0, 0, 0)      # CLONE_NEWUSER|SIGCHLD
struct = (ctypes.c_uint64 * 11)(0x10000000, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0)
t("clone3", 435, ctypes.addressof(struct), 88)
t("bpf", 321, 0, addr, 72)
t("userfaultfd", 323, 1)                          # UFFD_USER_MODE_ONLY
t("perf_event_open", 298, addr, 0, -1, -1, 0)
t("keyctl", 250, 0, -3, 0)                        # KEYCTL_GET_KEYRING_ID(session)
t("add_key", 248, addr, addr, 0, 0, -3)
t("request_key", 249, addr, addr, 0, 0)
t("init_module", 175, 0, 0, addr)
t("finit_module", 313, -1, addr, 0)
t("delete_module", 176, addr, 0)
t("kexec_load", 246, 0, 0, 0, 0)
t("reboot", 169, 0, 0, 0, 0)
t("swapon", 167, addr, 0)
t("swapoff", 168, addr)
t("settimeofday", 164, 0, 0)
t("clock_settime", 227, 0, addr)
t("adjtimex", 159, addr)
t("io_uring_setup", 425, 1, addr)
t("acct", 163, 0)
t("quotactl", 179, 0, addr, 0, 0)
t("name_to_handle_at", 303, -100, addr, addr, addr, 0)
t("open_by_handle_at", 304, -100, addr, 0)
t("personality", 135, 0x0400000)                 # READ_IMPLIES_EXEC
t("personality-query", 135, 0xffffffff)
t("ioctl", 16, 0, 0xffffffff00005412, addr)       # TIOCSTI with high bits set
t("tioclinux", 16, 0, 0x541C, addr)
t("socket-packet", 41, 17, 3, 0)                  # AF_PACKET, SOCK_RAW
t("socket-raw", 41, 2, 3, 1)                      # AF_INET, SOCK_RAW, ICMP
t("socket-netlink", 41, 16, 2, 9)                 # AF_NETLINK, NETLINK_AUDIT
t("socket-netlink-route", 41, 16, 3, 0)           # AF_NETLINK, SOCK_RAW, NETLINK_ROUTE (getifaddrs)
t("socket-inet", 41, 2, 1, 0)
t("socket-unix", 41, 1, 1, 0)
)PY";

// name -> (the errno the script must see, the syscall the report must name)
struct Expect {
  const char* label;
  int err;
  const char* reported;  // nullptr: not a reported denial
};

constexpr Expect kExpected[] = {
    {"ptrace", 1, "ptrace"}, {"process_vm_readv", 1, "process_vm_readv"}, {"mount", 1, "mount"},
    {"umount2", 1, "umount2"}, {"pivot_root", 1, "pivot_root"}, {"fsopen", 1, "fsopen"},
    {"open_tree", 1, "open_tree"}, {"move_mount", 1, "move_mount"}, {"fsmount", 1, "fsmount"},
    {"fsconfig", 1, "fsconfig"}, {"mount_setattr", 1, "mount_setattr"}, {"unshare", 1, "unshare"},
    {"setns", 1, "setns"}, {"clone", 1, "clone"}, {"clone3", 38, nullptr}, {"bpf", 1, "bpf"},
    {"userfaultfd", 1, "userfaultfd"}, {"perf_event_open", 1, "perf_event_open"}, {"keyctl", 1, "keyctl"},
    {"add_key", 1, "add_key"}, {"request_key", 1, "request_key"}, {"init_module", 1, "init_module"},
    {"finit_module", 1, "finit_module"}, {"delete_module", 1, "delete_module"}, {"kexec_load", 1, "kexec_load"},
    {"reboot", 1, "reboot"}, {"swapon", 1, "swapon"}, {"swapoff", 1, "swapoff"},
    {"settimeofday", 1, "settimeofday"}, {"clock_settime", 1, "clock_settime"}, {"adjtimex", 1, "adjtimex"},
    {"io_uring_setup", 1, "io_uring_setup"}, {"acct", 1, "acct"}, {"quotactl", 1, "quotactl"},
    {"name_to_handle_at", 1, "name_to_handle_at"}, {"open_by_handle_at", 1, "open_by_handle_at"},
    {"personality", 1, "personality"}, {"ioctl", 1, "ioctl"}, {"tioclinux", 1, "ioctl"},
    {"socket-packet", 1, "socket"}, {"socket-raw", 1, "socket"}, {"socket-netlink", 1, "socket"},
};

TEST(Seccomp, EveryDeniedGroupFailsWithEpermAndIsReportedByName) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "not applicable here: the script calls the syscalls by their x86_64 numbers";
#endif
  ASSERT_TRUE(HavePython()) << "python3 is missing (scripts/install-deps.sh installs it)";
  Sandbox sb;
  WriteFile(sb.ws() + "/attacks.py", kAttacks);
  RunResult r = sb.RunArgv({"python3", "attacks.py"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  for (const auto& e : kExpected) {
    EXPECT_TRUE(Contains(r.out, std::string(e.label) + " -1 " + std::to_string(e.err) + "\n"))
        << e.label << " should fail with errno " << e.err << "\n" << r.Describe();
    if (e.reported) {
      EXPECT_TRUE(HasSyscallDenial(r, e.reported)) << e.reported << "\n" << r.Describe();
    }
  }
  // Allowed: the personality query, inet, unix and NETLINK_ROUTE sockets; clone3's ENOSYS is no denial.
  EXPECT_FALSE(Contains(r.out, "personality-query -1")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "socket-inet -1")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "socket-unix -1")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "socket-netlink-route -1")) << r.Describe();
  EXPECT_FALSE(HasSyscallDenial(r, "clone3")) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << "a successful command stays exited\n" << r.Describe();
}

TEST(Seccomp, FailingCommandWithADenialIsSandboxDenied) {
  ASSERT_FALSE(FindTool("unshare").empty()) << "unshare is missing (scripts/install-deps.sh installs it)";
  Sandbox sb;
  RunResult r = sb.Sh("unshare -Ur true");
  EXPECT_NE(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "Operation not permitted")) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  EXPECT_TRUE(HasSyscallDenial(r, "unshare")) << r.Describe();
  const auto& facets = (*r.report)["enforcement"]["facets"];
  EXPECT_EQ(facets["syscalls"]["level"], "full") << r.Describe();
  EXPECT_TRUE(facets["syscalls"]["requested"].get<bool>()) << r.Describe();
}

#if defined(__x86_64__)
// One call through a foreign syscall table: `i386` is getpid (i386 nr 20)
// through int 0x80, `x32` is getpid with bit 30 set (x32 nr 39). Prints the
// raw return value and the pid.
constexpr const char* kForeignArch = R"C(
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char** argv) {
  long r;
  if (argc > 1 && strcmp(argv[1], "i386") == 0) {
    __asm__ volatile("int $0x80" : "=a"(r) : "a"(20L) : "memory");
  } else {
    __asm__ volatile("syscall" : "=a"(r) : "a"(0x40000000L | 39) : "rcx", "r11", "memory");
  }
  printf("%s=%ld pid=%d\n", argc > 1 ? argv[1] : "?", r, (int)getpid());
  return 0;
}
)C";

std::string BuildForeignArch(Sandbox& sb) {
  WriteFile(sb.scratch() + "/arch.c", kForeignArch);
  RunResult cc = sb.Host({"cc", "-O0", "-o", sb.ws() + "/arch", sb.scratch() + "/arch.c"});
  EXPECT_EQ(cc.status, 0) << cc.Describe();
  return sb.ws() + "/arch";
}
#endif

// int 0x80 reaches the i386 table, whose numbers the x86_64 rules do not
// name; the filter refuses the whole table (EPERM). The host check runs the
// same call unconfined: it must return the pid there, or the kernel serves
// no i386 calls at all (int 0x80 then dies with SIGSEGV, inside as well, and
// the filter is never asked).
TEST(Seccomp, I386SyscallsAreRefused) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "not applicable here: int 0x80 exists only on x86_64";
#else
  ASSERT_FALSE(FindTool("cc").empty()) << "cc is missing (scripts/install-deps.sh installs it)";
  Sandbox sb;
  const std::string arch = BuildForeignArch(sb);
  RunResult host = sb.Host({arch, "i386"});
  if (host.status == 128 + SIGSEGV) {
    GTEST_SKIP() << "not applicable here: the kernel serves no i386 syscalls (int 0x80 dies with SIGSEGV unconfined)";
  }
  ASSERT_EQ(host.status, 0) << host.Describe();
  const auto pid = host.out.substr(host.out.find("pid=") + 4);
  EXPECT_TRUE(Contains(host.out, "i386=" + pid.substr(0, pid.find('\n')) + " "))
      << "unconfined, the i386 getpid should return the pid\n" << host.Describe();
  RunResult r = sb.RunArgv({"./arch", "i386"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "i386=-1 ")) << "int 0x80 should get -EPERM\n" << r.Describe();
#endif
}

// Syscall numbers with bit 30 set reach the x32 table. The filter refuses
// them (EPERM) whether or not the kernel serves x32: unconfined the call
// returns the pid (x32 served) or -ENOSYS (not served), never -EPERM.
TEST(Seccomp, X32SyscallsAreRefused) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "not applicable here: the x32 table exists only on x86_64";
#else
  ASSERT_FALSE(FindTool("cc").empty()) << "cc is missing (scripts/install-deps.sh installs it)";
  Sandbox sb;
  const std::string arch = BuildForeignArch(sb);
  RunResult host = sb.Host({arch, "x32"});
  ASSERT_EQ(host.status, 0) << host.Describe();
  EXPECT_FALSE(Contains(host.out, "x32=-1 ")) << "unconfined, the x32 call is not refused with EPERM\n"
                                               << host.Describe();
  RunResult r = sb.RunArgv({"./arch", "x32"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "x32=-1 ")) << "x32 should get -EPERM\n" << r.Describe();
#endif
}

// /dev is a writable tmpfs of the sandbox's own (owned by the caller's
// mapped uid), so the mount alone would let the command create files in
// it; Landlock grants /dev only listing, so creation fails with EACCES.
TEST(Landlock, HoldsWhereTheMountWouldAllow) {
  Sandbox sb;
  RunResult r = sb.Sh("touch /dev/agentbox-probe; echo \"touch=$?\"; mkdir /dev/d; echo \"mkdir=$?\";"
                      "ls /dev >/dev/null && echo listed; echo x > /dev/null && echo null-ok;"
                      "echo ws > ws.txt && cat ws.txt; echo t > /tmp/t && cat /tmp/t;"
                      "echo h > \"$HOME/h\" && cat \"$HOME/h\"; cat /proc/self/comm >/dev/null && echo proc-ok;"
                      "echo 0 > /proc/self/oom_score_adj && echo proc-write-ok; exit 0");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "touch=1")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "mkdir=1")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "Permission denied")) << r.Describe();
  for (const char* ok : {"listed", "null-ok", "ws\n", "t\n", "h\n", "proc-ok", "proc-write-ok"}) {
    EXPECT_TRUE(Contains(r.out, ok)) << ok << "\n" << r.Describe();
  }
  const auto& fs = (*r.report)["enforcement"]["facets"]["filesystem"];
  bool named = false;
  for (const auto& m : fs["mechanisms"]) named |= m.get<std::string>().rfind("landlock-abi-", 0) == 0;
  EXPECT_TRUE(named) << r.Describe();
}

TEST(Layers, OrdinaryWorkloadsStillWork) {
  // scripts/install-deps.sh installs all three: a missing one is a broken set-up.
  ASSERT_FALSE(FindTool("cc").empty()) << "cc is missing (scripts/install-deps.sh installs it)";
  ASSERT_FALSE(FindTool("make").empty()) << "make is missing (scripts/install-deps.sh installs it)";
  ASSERT_TRUE(HavePython()) << "python3 is missing (scripts/install-deps.sh installs it)";
  Sandbox sb;
  std::string script =
      "set -e; ls -la / >/dev/null; echo pipe | tr a-z A-Z; sh -c 'sleep 0.2 & wait'; echo waited;"
      "git -c user.name=t -c user.email=t@e add -A >/dev/null 2>&1 || true;"
      "echo hi > f.txt; git -c user.name=t -c user.email=t@e add f.txt;"
      "git -c user.name=t -c user.email=t@e commit -qm msg && echo committed;";
  WriteFile(sb.ws() + "/hello.c", "#include <stdio.h>\nint main(void){puts(\"built\");return 0;}\n");
  WriteFile(sb.ws() + "/Makefile", "hello: hello.c\n\tcc -o hello hello.c\n");
  script += "make -s >/dev/null && ./hello;";
  {
    script +=
        "python3 -c '\n"
        "import socket, threading\n"
        "s = socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(1)\n"
        "def serve():\n"
        "    c, _ = s.accept(); c.sendall(b\"tcp-ok\"); c.close()\n"
        "threading.Thread(target=serve).start()\n"
        "c = socket.create_connection(s.getsockname()); print(c.recv(16).decode())\n'";
  }
  RunResult r = sb.Sh(script, {}, {}, 60000);
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "PIPE")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "waited")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "committed")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "built")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "tcp-ok")) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
  EXPECT_TRUE((*r.report)["denials"].empty()) << "ordinary work should trip no layer\n" << r.Describe();
}

}  // namespace
}  // namespace agentbox::e2e
