// The OCI bundle for runsc, built from hand-made plans: no runsc involved.
#include "linux/gvisor.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

namespace agentbox::linux {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const std::string kBundle = "/run/agentbox/b1";

MountOp Op(MountKind kind, const std::string& source, const std::string& target, bool read_only = false,
           const std::string& data = "") {
  MountOp op;
  op.kind = kind;
  op.source = source;
  op.target = target;
  op.read_only = read_only;
  op.data = data;
  op.why = "test";
  return op;
}

ResolvedPlan Resolved(std::vector<ResolvedMount> mounts) {
  ResolvedPlan r;
  r.mounts = std::move(mounts);
  return r;
}

Plan BasePlan() {
  Plan p;
  p.uid = 1000;
  p.gid = 1001;
  p.cwd = "/home/u/proj";
  p.backend = Backend::kGvisor;
  p.gvisor = GvisorPlan{"/usr/bin/runsc", "0.0~20221219.0", "ptrace", false, "/tmp"};
  return p;
}

OciSpec Build(const Plan& plan, const ResolvedPlan& resolved) {
  auto spec = BuildOciSpec(plan, resolved, {"make", "test"}, {"PATH=/usr/bin"}, kBundle);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return spec.ok() ? *spec : OciSpec{};
}

const json* MountAt(const json& config, const std::string& destination) {
  for (const auto& m : config["mounts"]) {
    if (m["destination"] == destination) return &m;
  }
  return nullptr;
}

bool HasOption(const json& mount, const std::string& option) {
  const auto& o = mount["options"];
  return std::find(o.begin(), o.end(), option) != o.end();
}

bool LeftOutNames(const std::vector<std::string>& left_out, const std::string& what) {
  return std::any_of(left_out.begin(), left_out.end(),
                     [&](const std::string& s) { return s.find(what) != std::string::npos; });
}

const json* Rlimit(const json& config, const std::string& type) {
  for (const auto& r : config["process"]["rlimits"]) {
    if (r["type"] == type) return &r;
  }
  return nullptr;
}

// The tmpfs root is the bundle's read-only root instead; other tmpfs keep
// their options behind nosuid,nodev.
TEST(GvisorSpec, RootTmpfsIsDroppedOtherTmpfsKept) {
  OciSpec s = Build(BasePlan(), Resolved({{Op(MountKind::kTmpfs, "", "/", false, "mode=0755")},
                                           {Op(MountKind::kTmpfs, "", "/tmp", false, "mode=1777,size=16m")}}));
  EXPECT_EQ(MountAt(s.config, "/"), nullptr);
  const json* tmp = MountAt(s.config, "/tmp");
  ASSERT_NE(tmp, nullptr);
  EXPECT_EQ((*tmp)["type"], "tmpfs");
  EXPECT_EQ((*tmp)["options"], json::array({"nosuid", "nodev", "mode=1777", "size=16m"}));
  EXPECT_EQ(s.config["mounts"].size(), 1u);
  EXPECT_EQ(s.config["root"]["path"], kBundle + "/root");
  EXPECT_EQ(s.config["root"]["readonly"], true);
}

// Binds keep the plan's read-only flag; protect binds are read-only whatever it says.
TEST(GvisorSpec, BindsAreRbindNosuidNodevWithTheirMode) {
  OciSpec s = Build(BasePlan(), Resolved({{Op(MountKind::kBind, "/usr", "/usr", true)},
                                           {Op(MountKind::kBind, "/home/u/proj", "/home/u/proj", false)},
                                           {Op(MountKind::kProtect, "/home/u/proj/.git/hooks",
                                               "/home/u/proj/.git/hooks", false)}}));
  const json* usr = MountAt(s.config, "/usr");
  const json* ws = MountAt(s.config, "/home/u/proj");
  const json* hooks = MountAt(s.config, "/home/u/proj/.git/hooks");
  ASSERT_NE(usr, nullptr);
  ASSERT_NE(ws, nullptr);
  ASSERT_NE(hooks, nullptr);
  EXPECT_EQ((*usr)["type"], "bind");
  EXPECT_EQ((*usr)["source"], "/usr");
  EXPECT_EQ((*usr)["options"], json::array({"rbind", "ro", "nosuid", "nodev"}));
  EXPECT_EQ((*ws)["options"], json::array({"rbind", "rw", "nosuid", "nodev"}));
  EXPECT_EQ((*hooks)["source"], "/home/u/proj/.git/hooks");
  EXPECT_TRUE(HasOption(*hooks, "ro"));
  EXPECT_FALSE(HasOption(*hooks, "rw"));
}

// gVisor makes its own /dev: the plan's /dev entries are left out (and
// listed), except /dev/shm, which stays a mount.
TEST(GvisorSpec, DevEntriesOtherThanShmAreLeftOut) {
  OciSpec s = Build(BasePlan(), Resolved({{Op(MountKind::kTmpfs, "", "/dev", false, "mode=0755")},
                                           {Op(MountKind::kDevice, "/dev/null", "/dev/null")},
                                           {Op(MountKind::kDevpts, "", "/dev/pts")},
                                           {Op(MountKind::kSymlink, "/proc/self/fd", "/dev/fd")},
                                           {Op(MountKind::kTmpfs, "", "/dev/shm", false, "mode=1777")}}));
  EXPECT_EQ(MountAt(s.config, "/dev"), nullptr);
  EXPECT_EQ(MountAt(s.config, "/dev/null"), nullptr);
  EXPECT_EQ(MountAt(s.config, "/dev/pts"), nullptr);
  EXPECT_TRUE(s.root_entries.empty());  // not even the /dev/fd symlink
  ASSERT_NE(MountAt(s.config, "/dev/shm"), nullptr);
  EXPECT_EQ(s.config["mounts"].size(), 1u);
  for (const char* t : {"/dev ", "/dev/null ", "/dev/pts ", "/dev/fd "}) {
    EXPECT_TRUE(LeftOutNames(s.left_out, t)) << t;
  }
  EXPECT_FALSE(LeftOutNames(s.left_out, "/dev/shm"));
}

// Masks bind the bundle's mode-0 file or directory read-only; masks with no
// source, or under /proc (the Sentry's procfs has no host interfaces), are
// left out and listed.
TEST(GvisorSpec, MasksBindModeZeroPlaceholdersOrAreLeftOut) {
  ResolvedMount file{Op(MountKind::kMask, "/home/u/proj/.env", "/home/u/proj/.env")};
  file.is_dir = false;
  ResolvedMount dir{Op(MountKind::kMask, "/home/u/proj/secrets", "/home/u/proj/secrets")};
  dir.is_dir = true;
  ResolvedMount no_source{Op(MountKind::kMask, "", "/home/u/.ssh")};
  ResolvedMount proc{Op(MountKind::kMask, "/proc/kcore", "/proc/kcore")};
  proc.is_dir = false;
  OciSpec s = Build(BasePlan(), Resolved({file, dir, no_source, proc}));
  const json* f = MountAt(s.config, "/home/u/proj/.env");
  const json* d = MountAt(s.config, "/home/u/proj/secrets");
  ASSERT_NE(f, nullptr);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ((*f)["source"], kBundle + "/mask-file");
  EXPECT_EQ((*d)["source"], kBundle + "/mask-dir");
  EXPECT_TRUE(HasOption(*f, "ro"));
  EXPECT_TRUE(HasOption(*d, "ro"));
  EXPECT_EQ(MountAt(s.config, "/home/u/.ssh"), nullptr);
  EXPECT_EQ(MountAt(s.config, "/proc/kcore"), nullptr);
  EXPECT_TRUE(LeftOutNames(s.left_out, "/home/u/.ssh"));
  EXPECT_TRUE(LeftOutNames(s.left_out, "/proc/kcore"));
}

// Rootless, runsc's gofer is this user: a mask over a path it cannot open
// (here: one that does not exist) is left out rather than failing the start.
TEST(GvisorSpec, RootlessMaskOverAnUnopenablePathIsLeftOut) {
  Plan p = BasePlan();
  p.gvisor->rootless = true;
  ResolvedMount gone{Op(MountKind::kMask, "/nonexistent/agentbox-test/.env", "/home/u/proj/.env")};
  gone.is_dir = false;
  ResolvedMount readable{Op(MountKind::kMask, "/", "/home/u/proj/secrets")};
  OciSpec s = Build(p, Resolved({gone, readable}));
  EXPECT_EQ(MountAt(s.config, "/home/u/proj/.env"), nullptr);
  EXPECT_TRUE(LeftOutNames(s.left_out, "/home/u/proj/.env"));
  EXPECT_NE(MountAt(s.config, "/home/u/proj/secrets"), nullptr);  // a readable one is still masked
}

// A kFile is a bundle file with the plan's contents, bound read-only.
TEST(GvisorSpec, FileBecomesABundleFileBoundReadOnly) {
  OciSpec s = Build(BasePlan(), Resolved({{Op(MountKind::kFile, "", "/etc/resolv.conf", true, "nameserver 10.0.0.1\n")}}));
  ASSERT_EQ(s.files.size(), 1u);
  EXPECT_EQ(s.files[0].second, "nameserver 10.0.0.1\n");
  const json* m = MountAt(s.config, "/etc/resolv.conf");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ((*m)["source"], kBundle + "/" + s.files[0].first);
  EXPECT_TRUE(HasOption(*m, "ro"));
}

// Symlinks and kDir entries are made on the root before runsc starts, not mounts.
TEST(GvisorSpec, SymlinksAndDirsBecomeRootEntries) {
  OciSpec s = Build(BasePlan(), Resolved({{Op(MountKind::kSymlink, "usr/lib64", "/lib64")},
                                           {Op(MountKind::kSymlink, "", "/lib32")},  // absent on the host
                                           {Op(MountKind::kDir, "", "/opt/ceiling")}}));
  EXPECT_TRUE(s.config["mounts"].empty());
  ASSERT_EQ(s.root_entries.size(), 2u);
  EXPECT_EQ(s.root_entries[0].path, "/lib64");
  EXPECT_EQ(s.root_entries[0].target, "usr/lib64");
  EXPECT_EQ(s.root_entries[1].path, "/opt/ceiling");
  EXPECT_EQ(s.root_entries[1].target, "");
}

// An overlay workspace has no OCI form: an error, not a silent plain bind.
TEST(GvisorSpec, OverlayIsAnError) {
  auto s = BuildOciSpec(BasePlan(), Resolved({{Op(MountKind::kOverlay, "/home/u/proj", "/home/u/proj")}}),
                        {"true"}, {}, kBundle);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("overlay"), std::string::npos) << s.status().ToString();
}

// The command has no capability in any set, no_new_privs, and the plan's rlimits.
TEST(GvisorSpec, ProcessHasNoCapabilitiesAndThePlansRlimits) {
  Plan p = BasePlan();
  p.limits.nofile = 4096;
  p.limits.fsize_bytes = 1ULL << 30;
  p.limits.nproc = 256;
  OciSpec s = Build(p, Resolved({}));
  const json& proc = s.config["process"];
  EXPECT_EQ(proc["args"], json::array({"make", "test"}));
  EXPECT_EQ(proc["env"], json::array({"PATH=/usr/bin"}));
  EXPECT_EQ(proc["cwd"], "/home/u/proj");
  EXPECT_EQ(proc["noNewPrivileges"], true);
  for (const char* set : {"bounding", "effective", "inheritable", "permitted", "ambient"}) {
    ASSERT_TRUE(proc["capabilities"].contains(set)) << set;
    EXPECT_TRUE(proc["capabilities"][set].empty()) << set;
  }
  const json* nofile = Rlimit(s.config, "RLIMIT_NOFILE");
  const json* fsize = Rlimit(s.config, "RLIMIT_FSIZE");
  const json* nproc = Rlimit(s.config, "RLIMIT_NPROC");
  const json* core = Rlimit(s.config, "RLIMIT_CORE");
  ASSERT_NE(nofile, nullptr);
  ASSERT_NE(fsize, nullptr);
  ASSERT_NE(nproc, nullptr);
  ASSERT_NE(core, nullptr);
  EXPECT_EQ((*nofile)["soft"], 4096);
  EXPECT_EQ((*nofile)["hard"], 4096);
  EXPECT_EQ((*fsize)["hard"], 1ULL << 30);
  EXPECT_EQ((*nproc)["soft"], 256);
  EXPECT_EQ((*nproc)["hard"], 256);
  EXPECT_EQ((*core)["hard"], 0);
}

// Without fsize or nproc in the plan, no such rlimit is invented.
TEST(GvisorSpec, UnsetLimitsAreNotInTheSpec) {
  OciSpec s = Build(BasePlan(), Resolved({}));
  EXPECT_EQ(Rlimit(s.config, "RLIMIT_FSIZE"), nullptr);
  EXPECT_EQ(Rlimit(s.config, "RLIMIT_NPROC"), nullptr);
  EXPECT_NE(Rlimit(s.config, "RLIMIT_NOFILE"), nullptr);
}

// The command runs as the plan's uid/gid; rootless, as root of runsc's user
// namespace (who owns the files there), still with no capability.
TEST(GvisorSpec, UserIsThePlansUnlessRootless) {
  Plan p = BasePlan();
  OciSpec s = Build(p, Resolved({}));
  EXPECT_EQ(s.config["process"]["user"]["uid"], 1000);
  EXPECT_EQ(s.config["process"]["user"]["gid"], 1001);
  p.gvisor->rootless = true;
  OciSpec r = Build(p, Resolved({}));
  EXPECT_EQ(r.config["process"]["user"]["uid"], 0);
  EXPECT_EQ(r.config["process"]["user"]["gid"], 0);
}

// The Sentry's own pid, network, ipc, uts and mount namespaces.
TEST(GvisorSpec, NamespacesAndSeccompOnlyWhenEnabled) {
  Plan p = BasePlan();
  OciSpec s = Build(p, Resolved({}));
  std::vector<std::string> types;
  for (const auto& ns : s.config["linux"]["namespaces"]) types.push_back(ns["type"]);
  std::sort(types.begin(), types.end());
  EXPECT_EQ(types, (std::vector<std::string>{"ipc", "mount", "network", "pid", "uts"}));
  EXPECT_FALSE(s.config["linux"].contains("seccomp"));
  p.seccomp.enabled = true;
  p.seccomp.rules.push_back({"ptrace", SeccompAction::kNotifyEperm, {}, "test"});
  OciSpec e = Build(p, Resolved({}));
  ASSERT_TRUE(e.config["linux"].contains("seccomp"));
  EXPECT_EQ(e.config["linux"]["seccomp"]["syscalls"].size(), 1u);
}

SeccompRule Rule(const std::string& syscall, SeccompArgCheck when,
                 SeccompAction action = SeccompAction::kNotifyEperm) {
  return {syscall, action, std::move(when), "test"};
}

json Oci(std::vector<SeccompRule> rules, std::vector<std::string>* left_out) {
  SeccompPlan plan;
  plan.enabled = true;
  plan.rules = std::move(rules);
  return OciSeccomp(plan, left_out);
}

// kAlways: one rule with no args, refused with EPERM; everything else allowed.
TEST(GvisorSeccomp, AlwaysIsOneRuleWithoutArgsAnsweringEperm) {
  std::vector<std::string> left_out;
  json j = Oci({Rule("ptrace", {})}, &left_out);
  EXPECT_EQ(j["defaultAction"], "SCMP_ACT_ALLOW");
  ASSERT_EQ(j["syscalls"].size(), 1u);
  const json& r = j["syscalls"][0];
  EXPECT_EQ(r["names"], json::array({"ptrace"}));
  EXPECT_EQ(r["action"], "SCMP_ACT_ERRNO");
  EXPECT_EQ(r["errnoRet"], EPERM);
  EXPECT_EQ(r["errnoRet"], 1);
  EXPECT_FALSE(r.contains("args"));
  EXPECT_TRUE(left_out.empty());
}

// kLow32Equals compares the low 32 bits only; kMaskedEquals takes its mask.
TEST(GvisorSeccomp, EqualityChecksAreMaskedEq) {
  SeccompArgCheck low;
  low.kind = SeccompArgCheck::Kind::kLow32Equals;
  low.arg = 0;
  low.value = 16;
  SeccompArgCheck masked;
  masked.kind = SeccompArgCheck::Kind::kMaskedEquals;
  masked.arg = 2;
  masked.mask = 0xf0;
  masked.value = 0x20;
  std::vector<std::string> left_out;
  json j = Oci({Rule("socket", low), Rule("clone", masked)}, &left_out);
  ASSERT_EQ(j["syscalls"].size(), 2u);
  EXPECT_EQ(j["syscalls"][0]["args"],
            json::array({{{"index", 0}, {"value", 0xffffffffULL}, {"valueTwo", 16}, {"op", "SCMP_CMP_MASKED_EQ"}}}));
  EXPECT_EQ(j["syscalls"][1]["args"],
            json::array({{{"index", 2}, {"value", 0xf0}, {"valueTwo", 0x20}, {"op", "SCMP_CMP_MASKED_EQ"}}}));
  EXPECT_TRUE(left_out.empty());
}

// (arg & mask) != 0 has no OCI operator: one rule per bit of the mask (ORed).
TEST(GvisorSeccomp, AnyBitSetExpandsToOneRulePerBit) {
  SeccompArgCheck any;
  any.kind = SeccompArgCheck::Kind::kAnyBitSet;
  any.arg = 1;
  any.mask = (1ULL << 3) | (1ULL << 8) | (1ULL << 40);
  std::vector<std::string> left_out;
  json j = Oci({Rule("unshare", any)}, &left_out);
  ASSERT_EQ(j["syscalls"].size(), 3u);
  std::vector<std::uint64_t> bits;
  for (const auto& r : j["syscalls"]) {
    ASSERT_EQ(r["args"].size(), 1u);
    const json& a = r["args"][0];
    EXPECT_EQ(a["index"], 1);
    EXPECT_EQ(a["op"], "SCMP_CMP_MASKED_EQ");
    EXPECT_EQ(a["value"], a["valueTwo"]);  // (arg & bit) == bit
    bits.push_back(a["value"].get<std::uint64_t>());
  }
  EXPECT_EQ(bits, (std::vector<std::uint64_t>{1ULL << 3, 1ULL << 8, 1ULL << 40}));
  EXPECT_TRUE(left_out.empty());
}

// Checks no OCI rule can say (a bit test with an exception, a value outside
// a set) and ENOSYS answers are left out and listed; mediated connect() is
// dropped (no host socket to reach).
TEST(GvisorSeccomp, RulesWithoutAnOciFormAreLeftOut) {
  SeccompArgCheck except;
  except.kind = SeccompArgCheck::Kind::kAnyBitSet;
  except.mask = 0x7e020000;
  except.has_except = true;
  except.except = 0x20000;
  SeccompArgCheck not_in;
  not_in.kind = SeccompArgCheck::Kind::kLow32NotIn;
  not_in.values = {1, 2, 10};
  not_in.value = 64;
  std::vector<std::string> left_out;
  json j = Oci({Rule("clone", except), Rule("socket", not_in), Rule("clone3", {}, SeccompAction::kErrnoEnosys),
                Rule("connect", {}, SeccompAction::kNotifyMediate)},
               &left_out);
  EXPECT_TRUE(j["syscalls"].empty()) << j.dump();
  ASSERT_EQ(left_out.size(), 3u);
  EXPECT_TRUE(LeftOutNames(left_out, "clone if arg0"));
  EXPECT_TRUE(LeftOutNames(left_out, "socket if arg0"));
  EXPECT_TRUE(LeftOutNames(left_out, "clone3 → ENOSYS"));
  EXPECT_FALSE(LeftOutNames(left_out, "connect"));
}

// has_also ANDs a second comparison into every rule the first makes.
TEST(GvisorSeccomp, HasAlsoAddsASecondArg) {
  SeccompArgCheck w;
  w.kind = SeccompArgCheck::Kind::kAnyBitSet;
  w.arg = 0;
  w.mask = 0x3;
  w.has_also = true;
  w.also_arg = 2;
  w.also_mask = 0xff;
  w.also_value = 0x11;
  std::vector<std::string> left_out;
  json j = Oci({Rule("ioctl", w)}, &left_out);
  ASSERT_EQ(j["syscalls"].size(), 2u);
  for (const auto& r : j["syscalls"]) {
    ASSERT_EQ(r["args"].size(), 2u);
    EXPECT_EQ(r["args"][1],
              json::object({{"index", 2}, {"value", 0xff}, {"valueTwo", 0x11}, {"op", "SCMP_CMP_MASKED_EQ"}}));
  }
}

// runsc's processes append to one log, with or without newlines between
// objects: the first error's message, whatever braces and escaped quotes
// its strings hold.
TEST(GvisorRunscError, FindsTheFirstErrorObject) {
  const std::string log =
      R"({"msg":"starting {sandbox}","level":"info","time":"t"})"
      R"({"msg":"quote \" and brace } inside","level":"warning"})"
      "\n"
      R"({"msg":"creating container: \"/x\": no such file {", "level":"error"})"
      R"({"msg":"second error","level":"error"})";
  EXPECT_EQ(RunscError(log), "creating container: \"/x\": no such file {");
}

TEST(GvisorRunscError, LineSeparatedAndNoError) {
  EXPECT_EQ(RunscError("{\"msg\":\"a\",\"level\":\"info\"}\n{\"msg\":\"boom\",\"level\":\"error\"}\n"), "boom");
  EXPECT_EQ(RunscError("{\"msg\":\"a\",\"level\":\"info\"}\n{\"msg\":\"b\",\"level\":\"debug\"}\n"), "");
  EXPECT_EQ(RunscError(""), "");
  // Not JSON at all, and a message naming "error" at another level.
  EXPECT_EQ(RunscError("runsc: plain text\n{\"msg\":\"level error\",\"level\":\"warning\"}"), "");
}

bool Has(const std::vector<std::string>& argv, const std::string& arg) {
  return std::find(argv.begin(), argv.end(), arg) != argv.end();
}

// No network, agentbox's cgroup, the plan's platform; `run --bundle B ID` last.
TEST(GvisorRunscArgv, FlagsThenRunLast) {
  GvisorPlan g{"/usr/bin/runsc", "v", "ptrace", false, "/tmp"};
  auto argv = RunscRunArgv(g, "/b", "/s", "/l.json", "ab-1", false);
  ASSERT_GE(argv.size(), 4u);
  EXPECT_EQ(argv[0], "/usr/bin/runsc");
  EXPECT_TRUE(Has(argv, "--network=none"));
  EXPECT_TRUE(Has(argv, "--ignore-cgroups"));
  EXPECT_TRUE(Has(argv, "--platform=ptrace"));
  EXPECT_TRUE(Has(argv, "--root=/s"));
  EXPECT_TRUE(Has(argv, "--log=/l.json"));
  EXPECT_FALSE(Has(argv, "--rootless"));
  EXPECT_FALSE(Has(argv, "--oci-seccomp"));
  EXPECT_EQ(std::vector<std::string>(argv.end() - 4, argv.end()),
            (std::vector<std::string>{"run", "--bundle", "/b", "ab-1"}));
}

TEST(GvisorRunscArgv, RootlessAndOciSeccompOnlyWhenAsked) {
  GvisorPlan g{"/usr/bin/runsc", "v", "systrap", true, "/tmp"};
  auto argv = RunscRunArgv(g, "/b", "/s", "/l.json", "ab-1", true);
  EXPECT_TRUE(Has(argv, "--rootless"));
  EXPECT_TRUE(Has(argv, "--oci-seccomp"));
  EXPECT_TRUE(Has(argv, "--platform=systrap"));
  // Global flags come before the subcommand.
  const auto run = std::find(argv.begin(), argv.end(), "run");
  EXPECT_LT(std::find(argv.begin(), argv.end(), "--rootless"), run);
  EXPECT_LT(std::find(argv.begin(), argv.end(), "--oci-seccomp"), run);
  EXPECT_EQ(std::vector<std::string>(argv.end() - 4, argv.end()),
            (std::vector<std::string>{"run", "--bundle", "/b", "ab-1"}));
}

// Egress: host sockets, but only in the namespace the spec names.
TEST(GvisorRunscArgv, AHostNetworkOnlyWithAPreparedNamespace) {
  GvisorPlan g{"/usr/bin/runsc", "v", "ptrace", false, "/tmp"};
  auto argv = RunscRunArgv(g, "/b", "/s", "/l.json", "ab-1", false, "/proc/7/fd/9");
  EXPECT_TRUE(Has(argv, "--network=host"));
  EXPECT_FALSE(Has(argv, "--network=none"));
  OciSpec spec;
  spec.config = {{"linux", {{"namespaces", {{{"type", "pid"}}, {{"type", "network"}}}}}}};
  JoinNetworkNamespace(&spec, "/proc/7/fd/9");
  EXPECT_EQ(spec.config["linux"]["namespaces"][1]["path"], "/proc/7/fd/9");
  EXPECT_FALSE(spec.config["linux"]["namespaces"][0].contains("path"));
}

class GvisorBundle : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/agentbox-gvisor-test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    bundle_ = tmpl;
  }
  // mask-dir is mode 0: not listable by a non-root user, but rmdir'able
  // (it is empty); give it its mode back so remove_all can walk it.
  void TearDown() override {
    if (bundle_.empty()) return;
    chmod((bundle_ + "/mask-dir").c_str(), 0700);
    std::error_code ec;
    fs::remove_all(bundle_, ec);
  }
  std::string bundle_;
};

// The root holds the entries (parents made too), the masks are mode 0, the
// kFile files are there, and config.json parses back to the spec.
TEST_F(GvisorBundle, WritesRootEntriesMasksFilesAndConfig) {
  Plan p = BasePlan();
  auto spec = BuildOciSpec(p,
                           Resolved({{Op(MountKind::kSymlink, "usr/lib64", "/lib64")},
                                     {Op(MountKind::kDir, "", "/opt/a/b/ceiling")},
                                     {Op(MountKind::kSymlink, "../../bin/sh", "/usr/local/bin/sh")},
                                     {Op(MountKind::kFile, "", "/etc/hostname", true, "agentbox\n")}}),
                           {"true"}, {}, bundle_);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ASSERT_TRUE(WriteBundle(*spec, bundle_).ok());

  const std::string root = bundle_ + "/root";
  struct stat st {};
  ASSERT_EQ(lstat((root + "/opt/a/b/ceiling").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  ASSERT_EQ(lstat((root + "/usr/local/bin").c_str(), &st), 0);  // a link's parents
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  char target[256] = {};
  ASSERT_GT(readlink((root + "/lib64").c_str(), target, sizeof(target) - 1), 0);
  EXPECT_STREQ(target, "usr/lib64");
  std::fill(std::begin(target), std::end(target), '\0');
  ASSERT_GT(readlink((root + "/usr/local/bin/sh").c_str(), target, sizeof(target) - 1), 0);
  EXPECT_STREQ(target, "../../bin/sh");

  ASSERT_EQ(lstat((bundle_ + "/mask-file").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0u);
  ASSERT_EQ(lstat((bundle_ + "/mask-dir").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0u);

  ASSERT_EQ(spec->files.size(), 1u);
  std::ifstream file(bundle_ + "/" + spec->files[0].first);
  std::stringstream contents;
  contents << file.rdbuf();
  EXPECT_EQ(contents.str(), "agentbox\n");

  std::ifstream config(bundle_ + "/config.json");
  ASSERT_TRUE(config.good());
  json back = json::parse(config, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(back.is_discarded());
  EXPECT_EQ(back, spec->config);
  EXPECT_EQ(back["root"]["path"], root);
}

}  // namespace
}  // namespace agentbox::linux
