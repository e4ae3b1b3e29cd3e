// The filesystem the command sees: secrets absent, system read-only, writes
// only where the policy allows, a private /tmp and HOME, a minimal /dev and a
// masked /proc.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>

#include <set>
#include <string>

#include "harness.h"

namespace agentbox::e2e {
namespace {

// Removes a host path on scope exit: a test that shows a write escaping the
// sandbox must not leave that write behind.
class RemoveOnExit {
 public:
  explicit RemoveOnExit(std::string path) : path_(std::move(path)) {}
  ~RemoveOnExit() { RemoveTree(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ------------------------------------------------------------ secrets in HOME

TEST(Secrets, HomeCredentialsAreUnreadable) {
  Sandbox sb;
  RunResult r = sb.Sh(
      "cat \"$HOME/.ssh/id_rsa\"; echo \"ssh=$?\"; cat \"$HOME/.aws/credentials\"; echo \"aws=$?\";"
      "cat ~/.ssh/id_rsa ~/.aws/credentials 2>/dev/null; exit 0");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "ssh=1")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "aws=1")) << r.Describe();
  for (const std::string& secret : {sb.ssh_secret(), sb.aws_secret()}) {
    EXPECT_FALSE(Contains(r.out, secret)) << "secret leaked to stdout\n" << r.Describe();
    EXPECT_FALSE(Contains(r.err, secret)) << "secret leaked to stderr\n" << r.Describe();
  }
}

TEST(Secrets, ReadingACredentialIsReportedAsADenial) {
  Sandbox sb;
  RunResult r = sb.Sh("cat \"$HOME/.ssh/id_rsa\"");
  EXPECT_EQ(r.status, 1) << r.Describe();
  EXPECT_FALSE(Contains(r.out + r.err, sb.ssh_secret())) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  EXPECT_EQ(ReportInt(r, "exit_code"), 1) << r.Describe();
  EXPECT_TRUE(HasDenial(r, ".ssh")) << r.Describe();
}

TEST(Secrets, HomeIsPrivateEmptyWritableAndDiscarded) {
  Sandbox sb;
  const std::string marker = "home-write-" + RandomHex();
  RunResult r = sb.Sh("echo \"home=$HOME\"; echo \"entries=$(ls -A \"$HOME\" | wc -l)\";"
                      "echo " + marker + " > \"$HOME/written.txt\" && cat \"$HOME/written.txt\"");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "home=" + sb.home() + "\n")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "entries=0\n")) << "the private HOME should start empty\n" << r.Describe();
  EXPECT_TRUE(Contains(r.out, marker)) << "HOME should be writable inside\n" << r.Describe();
  EXPECT_FALSE(Exists(sb.home() + "/written.txt")) << "a write to the private HOME reached the host";
  EXPECT_TRUE(Exists(sb.home() + "/.ssh/id_rsa"));  // the host's files are untouched
  EXPECT_EQ(ReadFile(sb.home() + "/notes.txt").value_or(""), "an ordinary file in the real home\n");
}

TEST(Secrets, SymlinkFromWorkspaceToHostSecretLeadsNowhere) {
  Sandbox sb;
  ASSERT_EQ(symlink((sb.home() + "/.ssh/id_rsa").c_str(), (sb.ws() + "/key-link").c_str()), 0);
  ASSERT_EQ(symlink((sb.home() + "/.aws").c_str(), (sb.ws() + "/aws-link").c_str()), 0);
  RunResult r = sb.Sh("cat key-link; echo \"key=$?\"; cat aws-link/credentials; echo \"aws=$?\"");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "key=1")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "aws=1")) << r.Describe();
  EXPECT_FALSE(Contains(r.out + r.err, sb.ssh_secret())) << r.Describe();
  EXPECT_FALSE(Contains(r.out + r.err, sb.aws_secret())) << r.Describe();
}

TEST(Secrets, HostTreesOutsideThePolicyAreAbsent) {
  Sandbox sb;
  WriteFile(sb.scratch() + "/outside.txt", "OUTSIDE-" + RandomHex() + "\n");
  RunResult r = sb.Sh("ls -A /; test -e '" + sb.scratch() + "/outside.txt' && echo scratch-visible;"
                      "cat /etc/shadow >/dev/null 2>&1 && echo shadow-readable; exit 0");
  ASSERT_EQ(r.status, 0) << r.Describe();
  std::set<std::string> root;
  for (const auto& line : Lines(r.out)) root.insert(line);
  // The top directory of the temp root ($TMPDIR may be under /var) holds the
  // workspace and HOME mount points; everything else must be absent.
  const std::string temp_top = TempRoot().substr(1, TempRoot().find('/', 1) - 1);
  for (const std::string absent : {"root", "var", "opt", "srv", "mnt", "boot", "sys", "run", "media"}) {
    if (absent == temp_top) continue;
    EXPECT_EQ(root.count(absent), 0u) << "/" << absent << " is visible inside\n" << r.Describe();
  }
  EXPECT_EQ(root.count("usr"), 1u) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "scratch-visible")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "shadow-readable")) << "/etc/shadow is denied by the preset\n" << r.Describe();
}

TEST(Secrets, WorkspaceInsideHomeStillHidesTheRestOfHome) {
  Sandbox sb(Sandbox::GitRepo::kNone);
  const std::string project = sb.home() + "/project";
  MakeDirs(project);
  Command c = sb.AgentboxCommand({"run", "--", "sh", "-c",
                                  "cat ~/.ssh/id_rsa; echo \"ssh=$?\"; ls -A ~; echo work > result.txt; pwd"});
  c.cwd = project;
  RunResult r = RunCommand(c);
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "ssh=1")) << r.Describe();
  EXPECT_FALSE(Contains(r.out + r.err, sb.ssh_secret())) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "notes.txt")) << "the rest of HOME is visible\n" << r.Describe();
  EXPECT_TRUE(Contains(r.out, "project\n")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, project + "\n")) << r.Describe();
  EXPECT_EQ(ReadFile(project + "/result.txt").value_or("<missing>"), "work\n");
}

TEST(Secrets, HomeThatIsTheWorkspaceHasItsCredentialsMasked) {
  Sandbox sb(Sandbox::GitRepo::kNone);
  // The agent was started in $HOME itself: the workspace holds the secrets.
  Command c = sb.AgentboxCommand({"run", "--", "sh", "-c",
                                  "cat .ssh/id_rsa ~/.aws/credentials; echo \"rc=$?\"; cat notes.txt"});
  c.cwd = sb.home();
  RunResult r = RunCommand(c);
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "rc=1")) << r.Describe();
  EXPECT_FALSE(Contains(r.out + r.err, sb.ssh_secret())) << r.Describe();
  EXPECT_FALSE(Contains(r.out + r.err, sb.aws_secret())) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "an ordinary file in the real home")) << r.Describe();
}

TEST(Secrets, DirectoryOnStdioCannotReachTheHost) {
  ASSERT_FALSE(FindTool("python3").empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  Sandbox sb;
  // A directory fd handed in as stdin would let openat() walk the host tree.
  int dir = open(sb.home().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir, 0);
  Command c = sb.AgentboxCommand({"run", "--report", sb.report_path(), "--", "python3", "-c",
                                  "import os\nfd = os.open('.ssh/id_rsa', os.O_RDONLY, dir_fd=0)\n"
                                  "print(os.read(fd, 200).decode())\n"});
  c.stdin_fd = dir;
  RunResult r = RunCommand(c);
  close(dir);
  EXPECT_FALSE(Contains(r.out + r.err, sb.ssh_secret())) << r.Describe();
  EXPECT_NE(r.status, 0) << r.Describe();
}

// ------------------------------------------------------------ writes

TEST(Writes, SystemDirectoriesAndRootAreReadOnly) {
  Sandbox sb;
  const std::string name = "agentbox-e2e-" + RandomHex();
  RemoveOnExit usr("/usr/" + name), etc("/etc/" + name), root("/" + name);
  RunResult r = sb.Sh("for p in /usr/" + name + " /etc/" + name + " /" + name +
                      "; do if touch \"$p\" 2>/dev/null; then echo \"wrote $p\"; else echo \"refused $p\"; fi; done");
  ASSERT_EQ(r.status, 0) << r.Describe();
  for (const auto* p : {&usr, &etc, &root}) {
    EXPECT_TRUE(Contains(r.out, "refused " + p->path())) << r.Describe();
    EXPECT_FALSE(Exists(p->path())) << p->path() << " was created on the host";
  }
}

TEST(Writes, WriteToReadOnlyPathIsReportedAsDenial) {
  Sandbox sb;
  const std::string target = "/usr/agentbox-e2e-" + RandomHex();
  RemoveOnExit cleanup(target);
  RunResult r = sb.Sh("touch " + target);
  EXPECT_EQ(r.status, 1) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "Read-only file system")) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  EXPECT_TRUE(HasDenial(r, target)) << r.Describe();
  ASSERT_TRUE(r.report);
  bool write_op = false;
  for (const auto& d : (*r.report)["denials"]) write_op |= d.value("op", "") == "write";
  EXPECT_TRUE(write_op) << r.Describe();
}

TEST(Writes, TmpIsWritableButPrivate) {
  Sandbox sb;
  const std::string name = "/tmp/agentbox-e2e-private-" + RandomHex();
  RemoveOnExit cleanup(name);
  RunResult r = sb.Sh("echo tmpdata > " + name + " && cat " + name + "; echo \"tmpdir=$TMPDIR\"");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "tmpdata\n")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "tmpdir=/tmp\n")) << r.Describe();
  EXPECT_FALSE(Exists(name)) << "a write to /tmp inside reached the host's /tmp";
}

TEST(Writes, HostTmpContentIsInvisible) {
  Sandbox sb;
  // A file in the host's /tmp (not the workspace, not HOME).
  TempDir host_tmp("agentbox-e2e-hosttmp-");
  WriteFile(host_tmp / "visible.txt", "HOSTTMP\n");
  RunResult r = sb.Sh("cat '" + host_tmp.path() + "/visible.txt' 2>/dev/null || echo not-visible");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "not-visible")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "HOSTTMP")) << r.Describe();
}

TEST(Writes, WorkspaceWritesPersistOnTheHost) {
  Sandbox sb;
  WriteFile(sb.ws() + "/old.txt", "old\n");
  const std::string marker = "persisted-" + RandomHex();
  RunResult r = sb.Sh("mkdir -p sub/dir && echo " + marker + " > sub/dir/new.txt && rm old.txt && pwd");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
  EXPECT_EQ(r.out, sb.ws() + "\n") << "cwd inside should be the workspace's own path";
  EXPECT_EQ(ReadFile(sb.ws() + "/sub/dir/new.txt").value_or("<missing>"), marker + "\n");
  EXPECT_FALSE(Exists(sb.ws() + "/old.txt"));
  struct stat st {};
  ASSERT_EQ(stat((sb.ws() + "/sub/dir/new.txt").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, getuid()) << "files written inside must belong to the invoking user";
  EXPECT_EQ(st.st_gid, getgid());
}

TEST(Writes, WorkspaceParentIsNotTheHostDirectory) {
  Sandbox sb;
  const std::string parent = sb.ws().substr(0, sb.ws().rfind('/'));
  const std::string sibling = parent + "/agentbox-e2e-sibling-" + RandomHex();
  RemoveOnExit cleanup(sibling);
  RunResult r = sb.Sh("echo x > '" + sibling + "' 2>/dev/null; ls -A .. ; exit 0");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Exists(sibling)) << "a write next to the workspace reached the host";
}

TEST(Writes, WorkspaceMountedAtPolicyPath) {
  Sandbox sb;
  WriteFile(sb.ws() + "/hello.txt", "hello\n");
  WriteFile(sb.scratch() + "/policy.yaml",
            "version: 1\nfilesystem:\n  workspace: { path: /workspace, mode: read-write }\n");
  RunResult r = sb.Sh("pwd; cat hello.txt; echo inner > /workspace/inner.txt",
                      {"--policy", sb.scratch() + "/policy.yaml"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(r.out, "/workspace\nhello\n") << r.Describe();
  EXPECT_EQ(ReadFile(sb.ws() + "/inner.txt").value_or("<missing>"), "inner\n");
}

TEST(Writes, CwdInASubdirectoryIsKept) {
  Sandbox sb;
  MakeDirs(sb.ws() + "/deep/er");
  Command c = sb.AgentboxCommand({"run", "--workspace", sb.ws(), "--", "sh", "-c", "pwd; echo s > here.txt"});
  c.cwd = sb.ws() + "/deep/er";
  RunResult r = RunCommand(c);
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(r.out, sb.ws() + "/deep/er\n") << r.Describe();
  EXPECT_TRUE(Exists(sb.ws() + "/deep/er/here.txt"));
}

TEST(Writes, WorkspaceFlagWithCwdElsewhere) {
  Sandbox sb;
  Command c = sb.AgentboxCommand({"run", "--workspace", sb.ws(), "--", "sh", "-c", "pwd; echo w > w.txt"});
  c.cwd = "/";
  RunResult r = RunCommand(c);
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(r.out, sb.ws() + "\n") << r.Describe();
  EXPECT_EQ(ReadFile(sb.ws() + "/w.txt").value_or("<missing>"), "w\n");
}

TEST(ReadOnlyMode, WorkspaceIsReadOnlyAndTmpIsWritable) {
  Sandbox sb;
  WriteFile(sb.ws() + "/existing.txt", "readable\n");
  RunResult r = sb.Sh("cat existing.txt; echo new > new.txt; echo \"ws=$?\"; echo t > /tmp/t && echo tmp-ok;"
                      "echo append >> existing.txt; exit 0",
                      {"--mode", "read-only"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "readable\n")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "ws=")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ws=0")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "Read-only file system")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "tmp-ok")) << r.Describe();
  EXPECT_FALSE(Exists(sb.ws() + "/new.txt"));
  EXPECT_EQ(ReadFile(sb.ws() + "/existing.txt").value_or(""), "readable\n");
}

// ------------------------------------------------------------ deny globs

TEST(DenyGlob, NestedEnvFileIsMaskedAndReported) {
  Sandbox sb;
  const std::string secret = "ENV-SECRET-" + RandomHex();
  WriteFile(sb.ws() + "/a/b/.env", "TOKEN=" + secret + "\n", 0600);
  RunResult r = sb.Sh("cat a/b/.env");
  EXPECT_EQ(r.status, 1) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "Permission denied")) << r.Describe();
  EXPECT_FALSE(Contains(r.out + r.err, secret)) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  EXPECT_TRUE(HasDenial(r, ".env")) << r.Describe();
  EXPECT_EQ(ReadFile(sb.ws() + "/a/b/.env").value_or(""), "TOKEN=" + secret + "\n");
}

TEST(DenyGlob, EnvFilesAtAnyDepthAreMasked) {
  Sandbox sb;
  const std::string secret = "ENV-SECRET-" + RandomHex();
  WriteFile(sb.ws() + "/.env", secret + "\n");
  WriteFile(sb.ws() + "/p/q/r/s/t/.env", secret + "\n");
  WriteFile(sb.ws() + "/p/q/.env/inner.txt", secret + "\n");  // a directory named .env
  RunResult r = sb.Sh("grep -r " + secret.substr(0, 11) + " . 2>/dev/null; cat .env p/q/r/s/t/.env p/q/.env/inner.txt"
                      " 2>/dev/null; exit 0");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(r.out + r.err, secret)) << r.Describe();
}

// Every match is a mount; past the cap the run is refused with the count
// and the cap, not started with thousands of mounts.
TEST(DenyGlob, TooManyMatchesAreRefusedNamingTheCap) {
  Sandbox sb;
  for (int i = 0; i < 1100; ++i) WriteFile(sb.ws() + "/d" + std::to_string(i) + "/.env", "S=1\n");
  RunResult r = sb.Sh("echo ran");
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ran")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "1100")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "at most 1024")) << r.Describe();
}

TEST(DenyGlob, SecretAddedAfterACachedScanIsStillMasked) {
  Sandbox sb;
  WriteFile(sb.ws() + "/old/deep/notes.txt", "x");
  WriteFile(sb.ws() + "/old/.env", "FIRST\n");
  // Age every directory so that the scan may cache its verdicts.
  struct timespec past[2] = {{1600000000, 0}, {1600000000, 0}};
  for (const char* d : {"", "/old", "/old/deep"}) {
    ASSERT_EQ(utimensat(AT_FDCWD, (sb.ws() + d).c_str(), past, 0), 0);
  }
  // That moved their ctimes to now, which the cache also waits to settle.
  const time_t changed = time(nullptr);
  while (time(nullptr) < changed + 2) usleep(100 * 1000);
  RunResult first = sb.Sh("cat old/.env; exit 0");
  ASSERT_EQ(first.status, 0) << first.Describe();
  EXPECT_FALSE(Contains(first.out, "FIRST")) << first.Describe();
  EXPECT_TRUE(IsDir(sb.home() + "/.cache/agentbox/deny-scan")) << "the scan cache was not written";
  // A new secret in a directory the cache knows: the directory's mtime moves.
  const std::string secret = "LATE-SECRET-" + RandomHex();
  WriteFile(sb.ws() + "/old/deep/.env", secret + "\n");
  RunResult second = sb.Sh("cat old/deep/.env");
  EXPECT_FALSE(Contains(second.out + second.err, secret)) << second.Describe();
  EXPECT_EQ(OutcomeOf(second), "sandbox_denied") << second.Describe();
}

TEST(DenyGlob, PythonAndNodeStyleErrorsCountAsDenials) {
  Sandbox sb;
  WriteFile(sb.ws() + "/.env", "S=1\n");
  RunResult py = sb.Sh("python3 -c \"open('.env').read()\"");
  EXPECT_NE(py.status, 0) << py.Describe();
  EXPECT_TRUE(Contains(py.err, "[Errno 13] Permission denied: '.env'")) << py.Describe();
  EXPECT_EQ(OutcomeOf(py), "sandbox_denied") << py.Describe();
  EXPECT_TRUE(HasDenial(py, ".env")) << py.Describe();
  RunResult ro = sb.Sh("python3 -c \"open('/usr/agentbox-x', 'w')\"");
  EXPECT_EQ(OutcomeOf(ro), "sandbox_denied") << ro.Describe();
  EXPECT_TRUE(HasDenial(ro, "/usr/agentbox-x")) << ro.Describe();
}

TEST(DenyGlob, ReportAsTaskFailureListsDenialsButKeepsTheOutcome) {
  Sandbox sb;
  WriteFile(sb.ws() + "/.env", "S=1\n");
  WriteFile(sb.scratch() + "/p.yaml", "version: 1\non_violation: { report_as: task_failure }\n");
  RunResult r = sb.Sh("cat .env", {"--policy", sb.scratch() + "/p.yaml"});
  EXPECT_EQ(r.status, 1) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
  EXPECT_TRUE(HasDenial(r, ".env")) << r.Describe();
  ASSERT_TRUE(r.report.has_value());
  EXPECT_TRUE(Contains(r.report->at("enforcement").value("notes", nlohmann::json::array()).dump(), "task_failure"))
      << r.Describe();
}

TEST(DenyGlob, LookalikeFilesStayReadable) {
  Sandbox sb;
  WriteFile(sb.ws() + "/a/.envrc", "envrc\n");
  WriteFile(sb.ws() + "/a/env.txt", "envtxt\n");
  WriteFile(sb.ws() + "/a/.env.example", "example\n");
  RunResult r = sb.Sh("cat a/.envrc a/env.txt a/.env.example");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(r.out, "envrc\nenvtxt\nexample\n");
  EXPECT_EQ(OutcomeOf(r), "exited") << r.Describe();
}

TEST(DenyGlob, MaskCannotBeRemovedOrOverwritten) {
  Sandbox sb;
  const std::string secret = "ENV-SECRET-" + RandomHex();
  WriteFile(sb.ws() + "/a/.env", secret + "\n");
  RunResult r = sb.Sh("rm -f a/.env; echo \"rm=$?\"; echo pwned > a/.env; echo \"write=$?\"; cat a/.env; exit 0");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "rm=0")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "write=0")) << r.Describe();
  EXPECT_FALSE(Contains(r.out + r.err, secret)) << r.Describe();
  EXPECT_EQ(ReadFile(sb.ws() + "/a/.env").value_or("<missing>"), secret + "\n");
}

TEST(DenyGlob, MaskFollowsARenameOfItsDirectory) {
  Sandbox sb;
  const std::string secret = "ENV-SECRET-" + RandomHex();
  WriteFile(sb.ws() + "/a/b/.env", secret + "\n");
  RunResult r = sb.Sh("mv a/b a/c 2>/dev/null; cat a/b/.env a/c/.env 2>/dev/null; exit 0");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(r.out + r.err, secret)) << r.Describe();
  std::string host = ReadFile(sb.ws() + "/a/b/.env").value_or("") + ReadFile(sb.ws() + "/a/c/.env").value_or("");
  EXPECT_EQ(host, secret + "\n") << "the secret file itself must survive on the host";
}

TEST(DenyGlob, ExplicitWorkspaceRelativeDenyEntry) {
  Sandbox sb;
  const std::string secret = "TOKEN-" + RandomHex();
  WriteFile(sb.ws() + "/config/token.txt", secret + "\n");
  WriteFile(sb.ws() + "/config/public.txt", "public\n");
  WriteFile(sb.scratch() + "/policy.yaml", "version: 1\nfilesystem:\n  deny: [config/token.txt]\n");
  RunResult r = sb.Sh("cat config/public.txt; cat config/token.txt", {"--policy", sb.scratch() + "/policy.yaml"});
  EXPECT_EQ(r.status, 1) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "public\n")) << r.Describe();
  EXPECT_FALSE(Contains(r.out + r.err, secret)) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  EXPECT_TRUE(HasDenial(r, "token.txt")) << r.Describe();
}

// ------------------------------------------------------------ /dev and /proc

TEST(Dev, OnlyAMinimalDevIsPresent) {
  Sandbox sb;
  RunResult r = sb.Sh(
      "head -c 4 /dev/zero | od -An -tx1; head -c 16 /dev/urandom | wc -c; echo x > /dev/null && echo null-ok;"
      "test -d /dev/pts && echo pts-ok; echo shm > /dev/shm/f && cat /dev/shm/f;"
      "for d in sda vda nvme0 mem kmem port kmsg kvm; do test -e /dev/$d && echo present-$d; done;"
      "echo ---; ls -A /dev");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, " 00 00 00 00\n")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "16\n")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "null-ok")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "pts-ok")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "shm\n")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "present-")) << r.Describe();
  const std::set<std::string> allowed = {"fd",  "full", "null",  "ptmx",   "pts",    "random", "shm",
                                         "tty", "zero", "stdin", "stdout", "stderr", "urandom", "console",
                                         "mqueue", "core"};
  auto after = r.out.substr(r.out.find("---\n") + 4);
  for (const auto& e : Lines(after)) EXPECT_EQ(allowed.count(e), 1u) << "/dev/" << e << " should not exist";
}

TEST(Proc, KernelInterfacesAreMasked) {
  Sandbox sb;
  RunResult r = sb.Sh(
      "for f in kcore keys sysrq-trigger timer_list kallsyms; do"
      "  test -e /proc/$f || echo absent-$f; grep -q \" /proc/$f \" /proc/self/mountinfo && echo masked-$f; done;"
      "echo \"keys=$(cat /proc/keys 2>/dev/null | wc -c)\"; echo \"kcore=$(head -c 64 /proc/kcore 2>/dev/null | wc -c)\";"
      "echo \"kallsyms=$(head -c 64 /proc/kallsyms 2>/dev/null | wc -c)\";"
      "test -w /proc/sysrq-trigger && echo sysrq-writable; exit 0");
  ASSERT_EQ(r.status, 0) << r.Describe();
  // Only what this kernel has can be masked; what it lacks must stay absent.
  for (const std::string f : {"kcore", "keys", "sysrq-trigger", "timer_list", "kallsyms"}) {
    if (Exists("/proc/" + f)) {
      EXPECT_TRUE(Contains(r.out, "masked-" + f + "\n")) << "/proc/" << f << " is not masked\n" << r.Describe();
    } else {
      EXPECT_TRUE(Contains(r.out, "absent-" + f + "\n")) << r.Describe();
    }
  }
  EXPECT_TRUE(Contains(r.out, "keys=0\n")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "kcore=0\n")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "kallsyms=0\n")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "sysrq-writable")) << r.Describe();
}

TEST(Proc, SysctlsAreReadOnlyAndHostnameIsPrivate) {
  Sandbox sb;
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  RunResult r = sb.Sh("echo evil > /proc/sys/kernel/hostname; echo \"w=$?\"; cat /proc/sys/kernel/hostname");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "w=0")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "agentbox\n")) << r.Describe();
  char after[256] = {};
  ASSERT_EQ(gethostname(after, sizeof(after) - 1), 0);
  EXPECT_STREQ(host, after);
}

// ------------------------------------------------------------ escapes

// A nested user namespace gives the command CAP_SYS_ADMIN over a copy of the
// mount table. The copied mounts are locked: no umount may reveal what a mask
// hides, and no remount may make a read-only bind writable. (Python's ctypes
// keeps the capabilities that an exec would drop.)
TEST(Escape, NestedUserNamespaceCannotUnmaskOrRemount) {
  ASSERT_FALSE(FindTool("python3").empty()) << "python3 is missing (scripts/install-deps.sh installs it)";
  Sandbox sb;
  const std::string secret = "ENV-SECRET-" + RandomHex();
  WriteFile(sb.ws() + "/.env", secret + "\n");
  const std::string usr_file = "/usr/agentbox-e2e-" + RandomHex();
  RemoveOnExit cleanup(usr_file);
  WriteFile(sb.ws() + "/escape.py", R"PY(
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x00020000
MS_REMOUNT, MS_BIND, MNT_DETACH = 32, 4096, 2
def call(name, rc):
    print(name, "ok" if rc == 0 else "errno=%d" % ctypes.get_errno(), flush=True)
call("unshare", libc.unshare(CLONE_NEWUSER | CLONE_NEWNS))
call("umount-env", libc.umount2(b".env", MNT_DETACH))
try:
    print(open(".env").read(), flush=True)
except OSError as e:
    print("read-env errno=%d" % e.errno, flush=True)
call("umount-hooks", libc.umount2(b".git/hooks", MNT_DETACH))
call("remount-hooks", libc.mount(None, b".git/hooks", None, MS_REMOUNT | MS_BIND, None))
call("remount-usr", libc.mount(None, b"/usr", None, MS_REMOUNT | MS_BIND, None))
call("umount-usr", libc.umount2(b"/usr", MNT_DETACH))
for p in (".git/hooks/pre-commit", sys.argv[1]):
    try:
        open(p, "w").write("evil\n")
        print("wrote", p, flush=True)
    except OSError as e:
        print("refused", p, e.errno, flush=True)
)PY");
  RunResult r = sb.RunArgv({"python3", "escape.py", usr_file});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(r.out + r.err, secret)) << r.Describe();
  for (const char* step : {"umount-env ok", "umount-hooks ok", "remount-hooks ok", "remount-usr ok", "umount-usr ok",
                           "wrote"}) {
    EXPECT_FALSE(Contains(r.out, step)) << step << "\n" << r.Describe();
  }
  EXPECT_FALSE(Exists(sb.ws() + "/.git/hooks/pre-commit")) << r.Describe();
  EXPECT_FALSE(Exists(usr_file)) << r.Describe();
}

}  // namespace
}  // namespace agentbox::e2e
