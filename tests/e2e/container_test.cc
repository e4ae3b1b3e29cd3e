// agentbox inside an unprivileged container, the way Docker and Podman run
// one by default: no capabilities, its own user, pid, ipc, uts and network
// namespaces, a root of read-only binds like an image's, /sys read-only, and
// the runtime's default seccomp profile. The container is bwrap, started as
// an unprivileged user, with the containers-common profile
// (/usr/share/containers/seccomp.json, Podman's default) compiled for a
// process without CAP_SYS_ADMIN by oci_seccomp_bpf; with
// --docker-namespace-rules its namespace and mount entries are Docker's.
//
// What each asserts: the backend `check` and `run` pick, the reason they
// give, the doctor's cause, that a confined command runs and that a file the
// container holds outside the policy is not readable from the sandbox.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "harness.h"

namespace agentbox::e2e {
namespace {

constexpr const char* kPodmanProfile = "/usr/share/containers/seccomp.json";

std::string SeccompCompiler() {
  const char* env = getenv("OCI_SECCOMP_BPF");
  if (env && *env) return env;
#ifdef OCI_SECCOMP_BPF
  return OCI_SECCOMP_BPF;
#else
  return "";
#endif
}

std::string Dirname(const std::string& path) { return path.substr(0, path.find_last_of('/')); }

class Container {
 public:
  enum class Profile { kPodman, kDocker };
  enum class Proc { kFullyVisible, kMasked };

  // `tweaks`: more oci_seccomp_bpf arguments (--refuse NAME, --refuse-ioctl REQ).
  Container(Profile profile, Proc proc, const std::vector<std::string>& tweaks = {}) : proc_(proc) {
    chmod(root_.path().c_str(), 0755);
    MakeDirs(ws(), 0755);
    MakeDirs(home(), 0755);
    secret_ = RandomHex(12);
    WriteFile(root_ / "secret/token", secret_ + "\n", 0644);
    chmod((root_ / "secret").c_str(), 0755);
    if (geteuid() == 0) {
      // The container's user: not root, no capabilities.
      (void)!chown(ws().c_str(), kNobody, kNobody);
      (void)!chown(home().c_str(), kNobody, kNobody);
    }
    Command compile;
    const std::string out = root_ / "filter.bpf";
    compile.argv = {"/bin/sh", "-c", "exec \"$@\" > " + out, "sh", SeccompCompiler(), kPodmanProfile};
    if (profile == Profile::kDocker) compile.argv.push_back("--docker-namespace-rules");
    compile.argv.insert(compile.argv.end(), tweaks.begin(), tweaks.end());
    compiled_ = RunCommand(compile);
    chmod(out.c_str(), 0644);
  }

  const RunResult& compiled() const { return compiled_; }
  std::string ws() const { return root_ / "ws"; }
  std::string home() const { return root_ / "home"; }
  std::string report() const { return home() + "/report.json"; }
  const std::string& secret() const { return secret_; }

  // agentbox ARGS... inside the container, as its unprivileged user.
  RunResult Agentbox(const std::vector<std::string>& args) const {
    const std::string bin = AgentboxBin();
    std::vector<std::string> argv;
    if (geteuid() == 0) {
      argv = {FindTool("setpriv"), "--reuid=" + std::to_string(kNobody), "--regid=" + std::to_string(kNobody),
              "--clear-groups"};
    }
    // bwrap reads the BPF program from fd 3.
    for (const std::string& a : {std::string("/bin/sh"), std::string("-c"),
                                 "exec \"$@\" 3< " + (root_ / "filter.bpf"), std::string("sh"), FindTool("bwrap")}) {
      argv.push_back(a);
    }
    for (const char* a : {"--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net",
                          "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr",
                          "--ro-bind", "/etc", "/etc", "--ro-bind", "/sys", "/sys", "--dev", "/dev", "--proc", "/proc",
                          "--tmpfs", "/tmp"}) {
      argv.push_back(a);
    }
    for (const char* top : {"/bin", "/sbin", "/lib", "/lib32", "/lib64"}) {
      char target[256] = {};
      const ssize_t n = readlink(top, target, sizeof(target) - 1);
      if (n > 0) {
        argv.insert(argv.end(), {"--symlink", std::string(target, n), top});
      } else if (IsDir(top)) {
        argv.insert(argv.end(), {"--ro-bind", top, top});
      }
    }
    if (proc_ == Proc::kMasked) {
      // What Docker's and Podman's default masks do to /proc (kcore is one
      // too where the kernel has it).
      for (const char* p : {"/proc/keys", "/proc/timer_list"}) {
        if (Exists(p)) argv.insert(argv.end(), {"--ro-bind", "/dev/null", p});
      }
    }
    argv.insert(argv.end(), {"--ro-bind", Dirname(bin), Dirname(bin), "--bind", ws(), ws(), "--bind", home(), home(),
                             "--ro-bind", root_ / "secret", "/srv/secret", "--chdir", ws(), "--seccomp", "3", "--",
                             bin});
    argv.insert(argv.end(), args.begin(), args.end());
    Command c;
    c.argv = argv;
    c.env = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home(), "LANG=C.UTF-8"};
    c.timeout_ms = 60000;
    return RunCommand(c);
  }

  nlohmann::json Check() const {
    RunResult r = Agentbox({"check", "--json"});
    try {
      return nlohmann::json::parse(r.out);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "check --json: " << e.what() << "\n" << r.Describe();
      return {};
    }
  }

  // A confined command that writes in the workspace and reads the secret.
  RunResult RunProbe(const std::vector<std::string>& options) const {
    std::vector<std::string> args = {"run", "--report", report()};
    args.insert(args.end(), options.begin(), options.end());
    args.insert(args.end(), {"--", "/bin/sh", "-c",
                             "echo ran; echo w > in-ws && echo wrote; cat /srv/secret/token; echo read=$?"});
    return Agentbox(args);
  }

  nlohmann::json Report() const {
    auto text = ReadFile(report());
    if (!text) return {};
    return nlohmann::json::parse(*text, nullptr, false);
  }

 private:
  static constexpr uid_t kNobody = 65534;
  TempDir root_{"agentbox-e2e-container-"};
  Proc proc_;
  std::string secret_;
  RunResult compiled_;
};

std::vector<std::string> Causes(const nlohmann::json& check) {
  std::vector<std::string> out;
  if (check.contains("diagnosis")) {
    for (const auto& d : check["diagnosis"]) out.push_back(d.value("cause", ""));
  }
  return out;
}

bool Has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// bwrap must be able to make the container here: an unprivileged user
// namespace for the test's user.
void RequireContainer(const Container& c) {
  ASSERT_TRUE(Exists(kPodmanProfile)) << kPodmanProfile << " is missing (scripts/install-deps.sh installs it)";
  ASSERT_FALSE(FindTool("bwrap").empty()) << "bwrap is missing (scripts/install-deps.sh installs it)";
  ASSERT_EQ(c.compiled().status, 0) << c.compiled().Describe();
}

bool BwrapWorks(const Container& c) { return c.Agentbox({"--version"}).status == 0; }

void ExpectConfinedRunWorked(const Container& c, const RunResult& r) {
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "ran\nwrote\n")) << r.Describe();
  EXPECT_TRUE(Exists(c.ws() + "/in-ws")) << r.Describe();
  EXPECT_FALSE(Contains(r.out, c.secret())) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "read=0")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "read=1")) << r.Describe();
}

TEST(Container, PodmanProfileWithAFullyVisibleProcGetsTheNamespacesBackend) {
  Container c(Container::Profile::kPodman, Container::Proc::kFullyVisible);
  RequireContainer(c);
  if (!BwrapWorks(c)) GTEST_SKIP() << "not applicable here: bwrap cannot create a user namespace for this user";
  nlohmann::json check = c.Check();
  EXPECT_EQ(check["host"].value("seccomp_mode", -1), 2) << check.dump(2);
  EXPECT_EQ(check.value("backend", "").rfind("namespaces (", 0), 0u) << check.dump(2);
  EXPECT_FALSE(Has(Causes(check), "seccomp-refuses-unshare")) << check.dump(2);
  EXPECT_FALSE(Has(Causes(check), "proc-overmounted")) << check.dump(2);
  // The image's /sys is read-only: no cgroup of our own, and check says so.
  EXPECT_TRUE(Has(Causes(check), "cgroupfs-read-only")) << check.dump(2);

  RunResult r = c.RunProbe({});
  ExpectConfinedRunWorked(c, r);
  nlohmann::json report = c.Report();
  EXPECT_EQ(report["enforcement"].value("backend", ""), "linux-namespaces") << report.dump(2);
  // Podman's profile refuses sethostname without CAP_SYS_ADMIN, even in our
  // own uts namespace: the report says the hostname stays the container's.
  bool noted = false;
  const nlohmann::json& processes = report["enforcement"]["facets"]["processes"];
  if (processes.contains("notes")) {
    for (const auto& n : processes["notes"]) {
      noted = noted || Contains(n.get<std::string>(), "hostname stays the container's");
    }
  }
  EXPECT_TRUE(noted) << report.dump(2);
}

TEST(Container, MaskedProcPicksLandlockOnlyAndSaysWhy) {
  Container c(Container::Profile::kPodman, Container::Proc::kMasked);
  RequireContainer(c);
  if (!BwrapWorks(c)) GTEST_SKIP() << "not applicable here: bwrap cannot create a user namespace for this user";
  nlohmann::json check = c.Check();
  const std::string backend = check.value("backend", "");
  EXPECT_EQ(backend.rfind("landlock-only (", 0), 0u) << check.dump(2);
  EXPECT_TRUE(Contains(backend, "/proc cannot be mounted")) << backend;
  EXPECT_TRUE(Contains(backend, "/proc/keys")) << backend;
  EXPECT_TRUE(Has(Causes(check), "proc-overmounted")) << check.dump(2);
  EXPECT_EQ(check["host"]["proc"].value("mount_errno", 0), EPERM) << check.dump(2);

  // Fail closed: full enforcement is refused, with the reason.
  RunResult full = c.RunProbe({});
  EXPECT_EQ(full.status, 125) << full.Describe();
  EXPECT_FALSE(Contains(full.out, "ran")) << full.Describe();
  EXPECT_TRUE(Contains(full.err, "/proc cannot be mounted")) << full.Describe();

  RunResult r = c.RunProbe({"--require", "partial"});
  ExpectConfinedRunWorked(c, r);
  EXPECT_TRUE(Contains(r.out, "Permission denied") || Contains(r.err, "Permission denied")) << r.Describe();
  nlohmann::json report = c.Report();
  EXPECT_EQ(report["enforcement"].value("backend", ""), "landlock-only") << report.dump(2);
  EXPECT_TRUE(Contains(report["enforcement"].value("backend_reason", ""), "/proc cannot be mounted")) << report.dump(2);
}

TEST(Container, DockerNamespaceRulesRefuseUnshareAndLandlockOnlyRuns) {
  Container c(Container::Profile::kDocker, Container::Proc::kFullyVisible);
  RequireContainer(c);
  if (!BwrapWorks(c)) GTEST_SKIP() << "not applicable here: bwrap cannot create a user namespace for this user";
  nlohmann::json check = c.Check();
  const std::string backend = check.value("backend", "");
  EXPECT_EQ(backend.rfind("landlock-only (", 0), 0u) << check.dump(2);
  EXPECT_TRUE(Contains(backend, "unshare(CLONE_NEWUSER|CLONE_NEWNS) failed")) << backend;
  EXPECT_TRUE(Has(Causes(check), "seccomp-refuses-unshare")) << check.dump(2);

  // clone3 answers ENOSYS under this profile: the runner is started by clone.
  RunResult r = c.RunProbe({"--require", "partial"});
  ExpectConfinedRunWorked(c, r);
  nlohmann::json report = c.Report();
  EXPECT_EQ(report["enforcement"].value("backend", ""), "landlock-only") << report.dump(2);
}

// A profile that refuses bringing an interface up (SIOCSIFFLAGS): check's
// deep probe tries it for real in a new network namespace and names the
// cause; a run on the namespaces backend then fails loudly at that step.
TEST(Container, RefusedLoopbackIsDiagnosedAndARunFailsLoudly) {
  Container c(Container::Profile::kPodman, Container::Proc::kFullyVisible, {"--refuse-ioctl", "0x8914"});
  RequireContainer(c);
  if (!BwrapWorks(c)) GTEST_SKIP() << "not applicable here: bwrap cannot create a user namespace for this user";
  nlohmann::json check = c.Check();
  EXPECT_TRUE(Has(Causes(check), "netlink-lo-refused")) << check.dump(2);
  RunResult r = c.RunProbe({});
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_FALSE(Contains(r.out, "ran")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "ioctl(SIOCSIFFLAGS)")) << r.Describe();
}

// A profile older than Landlock (ENOSYS for the landlock_* calls).
TEST(Container, ProfileWithoutLandlockIsDiagnosed) {
  Container c(Container::Profile::kPodman, Container::Proc::kFullyVisible,
              {"--refuse", "landlock_create_ruleset", "--refuse", "landlock_add_rule", "--refuse",
               "landlock_restrict_self"});
  RequireContainer(c);
  if (!BwrapWorks(c)) GTEST_SKIP() << "not applicable here: bwrap cannot create a user namespace for this user";
  nlohmann::json check = c.Check();
  EXPECT_EQ(check["host"].value("landlock_abi", -1), 0) << check.dump(2);
  EXPECT_TRUE(Has(Causes(check), "seccomp-refuses-landlock")) << check.dump(2);
  // The namespaces backend does not need Landlock to run.
  EXPECT_EQ(check.value("backend", "").rfind("namespaces (", 0), 0u) << check.dump(2);
}

}  // namespace
}  // namespace agentbox::e2e
