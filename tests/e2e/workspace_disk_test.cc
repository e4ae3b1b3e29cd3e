// disk_gib and the host workspace `agentbox run` writes to: bounded by a
// project quota where the workspace's filesystem has one (and agentbox may
// set it), by `--workspace-overlay` (a capped upper layer applied at the
// end), or listed in `enforcement.missing` (and refused under
// `require: full`).
//
// A write past the cap fails (ENOSPC / EDQUOT) and is reported as a
// `resources` denial naming disk_gib; what was written before it is kept.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <string>

#include "harness.h"

namespace agentbox::e2e {
namespace {

const nlohmann::json* DiskDenial(const RunResult& r) {
  if (!r.report || !(*r.report)["denials"].is_array()) return nullptr;
  for (const auto& d : (*r.report)["denials"]) {
    if (d["facet"] == "resources" && d["reason"].is_string() &&
        Contains(d["reason"].get<std::string>(), "disk_gib")) {
      return &d;
    }
  }
  return nullptr;
}

const nlohmann::json& Overlay(const RunResult& r) {
  static const nlohmann::json kNull;
  if (!r.report || !(*r.report)["workspace"].is_object()) return kNull;
  return (*r.report)["workspace"]["overlay"];
}

std::string Policy(const Sandbox& sb, const std::string& disk) {
  const std::string path = sb.scratch() + "/p.yaml";
  WriteFile(path, "version: 1\nmode: workspace-write\nresources:\n  disk_gib: " + disk + "\n");
  return path;
}

// Writes 90 MiB files until one fails or 2 GiB are written; prints each
// file that was written whole. Exits 1 when a write failed.
constexpr const char* kFill2GiB =
    "i=0; while [ $i -lt 23 ]; do i=$((i+1)); "
    "head -c 94371840 /dev/zero > fill$i || { echo failed=$i; exit 1; }; echo whole=$i; done; exit 0";

// Each file the fill reported whole is in `dir`, 90 MiB long; the sum of
// everything stays under `cap`.
void ExpectFillKept(const std::string& dir, const std::string& out, std::uint64_t cap) {
  int whole = 0;
  for (const auto& line : Lines(out)) {
    if (line.rfind("whole=", 0) == 0) whole = std::stoi(line.substr(6));
  }
  EXPECT_GE(whole, 5) << out;
  EXPECT_LT(whole, 23) << "the fill was never stopped\n" << out;
  std::uint64_t total = 0;
  for (int i = 1; i <= 23; ++i) {
    struct stat st {};
    const std::string f = dir + "/fill" + std::to_string(i);
    if (lstat(f.c_str(), &st) != 0) continue;
    total += static_cast<std::uint64_t>(st.st_size);
    if (i <= whole) { EXPECT_EQ(st.st_size, 94371840) << f; }
  }
  for (int i = 1; i <= whole; ++i) EXPECT_TRUE(Exists(dir + "/fill" + std::to_string(i))) << i;
  EXPECT_LE(total, cap) << "more than disk_gib landed in the workspace";
}

// ------------------------------------------------ no project quota: missing

// The scratch workspaces live in TempRoot(): on a filesystem with project
// quotas that agentbox may set, this is not the case under test.
bool WorkspaceHasProjectQuota(const std::string& dir, std::string* fstype) {
  RunResult r = RunCommand({{"/usr/bin/findmnt", "-n", "-o", "FSTYPE,OPTIONS", "--target", dir}});
  *fstype = r.out.substr(0, r.out.find(' '));
  return geteuid() == 0 && (Contains(r.out, "prjquota") || Contains(r.out, "pquota"));
}

TEST(WorkspaceDisk, WithoutProjectQuotaDiskGibIsMissingAndFullRefuses) {
  Sandbox sb;
  std::string fstype;
  if (WorkspaceHasProjectQuota(sb.ws(), &fstype)) {
    GTEST_SKIP() << "not applicable here: the temp dir's " << fstype << " has project quotas";
  }
  const std::string policy = Policy(sb, "100Mi");
  RunResult refused = sb.Sh("echo ran > out", {"--policy", policy});
  EXPECT_EQ(refused.status, 125) << refused.Describe();
  EXPECT_EQ(ErrorStage(refused), "confine") << refused.Describe();
  EXPECT_TRUE(Contains(refused.err, "disk_gib: the workspace " + sb.ws() + " is on ")) << refused.Describe();
  EXPECT_FALSE(Exists(sb.ws() + "/out"));

  RunResult r = sb.Sh("echo ran > out", {"--policy", policy, "--require", "partial"});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(MissingText(r), "disk_gib: the workspace " + sb.ws() + " is on " + fstype +
                                           " without project quotas: total disk use in it is not limited; "
                                           "--workspace-overlay bounds it"))
      << MissingText(r);
  EXPECT_EQ((*r.report)["enforcement"]["facets"]["resources"]["level"], "partial") << r.Describe();
}

// A read-only workspace cannot fill: nothing about it is missing.
TEST(WorkspaceDisk, ReadOnlyWorkspaceNeedsNoBound) {
  Sandbox sb;
  WriteFile(sb.scratch() + "/p.yaml", "version: 1\nmode: read-only\nresources:\n  disk_gib: 100Mi\n");
  RunResult r = sb.Sh("echo ran", {"--policy", sb.scratch() + "/p.yaml"});
  EXPECT_EQ(r.status, 0) << r.Describe();
  EXPECT_FALSE(Contains(MissingText(r), "disk_gib")) << MissingText(r);
}

// ------------------------------------------------------------ project quota

// An ext4 image with project quotas, loop-mounted in a temp dir; unmounted
// (the loop device goes with it: autoclear) however the test ends.
class QuotaFs {
 public:
  QuotaFs() {
    if (geteuid() != 0) {
      why_ = "not root (project quotas are set by root only)";
      return;
    }
    if (access("/dev/loop-control", F_OK) != 0) {
      why_ = "no /dev/loop-control";
      return;
    }
    const std::string img = dir_ / "fs.img";
    RunResult t = RunCommand({{"/usr/bin/truncate", "-s", "3G", img}});
    RunResult m = RunCommand({{FindTool("mkfs.ext4"), "-q", "-O", "quota", "-E", "quotatype=prjquota", img}});
    if (t.status != 0 || m.status != 0) {
      why_ = "mkfs.ext4 -O quota failed: " + m.err;
      return;
    }
    MakeDirs(mnt());
    RunResult mount = RunCommand({{"/usr/bin/mount", "-o", "loop,prjquota", img, mnt()}});
    if (mount.status != 0) {
      why_ = "mount -o loop,prjquota of an ext4 image failed (a kernel without CONFIG_QUOTA?): " + mount.err;
      return;
    }
    mounted_ = true;
  }
  ~QuotaFs() {
    if (mounted_) RunCommand({{"/usr/bin/umount", mnt()}});
  }
  const std::string& why_not() const { return why_; }
  std::string mnt() const { return dir_ / "mnt"; }

 private:
  TempDir dir_{"agentbox-e2e-quota-"};
  std::string why_;
  bool mounted_ = false;
};

std::uint32_t ProjectId(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct fsxattr fsx {};
  const int rc = fd < 0 ? -1 : ioctl(fd, FS_IOC_FSGETXATTR, &fsx);
  if (fd >= 0) close(fd);
  return rc == 0 ? fsx.fsx_projid : 0xffffffffu;
}

TEST(WorkspaceDisk, ProjectQuotaStopsA2GiBFillAndKeepsWhatCameBefore) {
  QuotaFs fs;
  if (!fs.why_not().empty()) GTEST_SKIP() << "not applicable here: " << fs.why_not();
  Sandbox sb;
  const std::string ws = fs.mnt() + "/ws";
  MakeDirs(ws);
  WriteFile(ws + "/before.txt", "kept\n");
  RunResult r = sb.Sh(kFill2GiB, {"--policy", Policy(sb, "1"), "--workspace", ws}, {}, 120000);
  EXPECT_EQ(r.status, 1) << r.Describe();
  ASSERT_TRUE(r.report) << r.Describe();
  EXPECT_FALSE(Contains(MissingText(r), "disk_gib")) << MissingText(r);
  const auto& mech = (*r.report)["enforcement"]["facets"]["resources"]["mechanisms"];
  EXPECT_TRUE(Contains(mech.dump(), "project-quota")) << mech.dump();
  const nlohmann::json* d = DiskDenial(r);
  ASSERT_NE(d, nullptr) << r.Describe();
  EXPECT_EQ((*d)["source"], "quota");
  EXPECT_TRUE(Contains((*d)["reason"].get<std::string>(), "is full (EDQUOT)")) << d->dump();
  ExpectFillKept(ws, r.out, (1ull << 30) + (1ull << 20));
  EXPECT_EQ(ReadFile(ws + "/before.txt").value_or(""), "kept\n");
  // The run's project is gone again.
  EXPECT_EQ(ProjectId(ws), 0u);
  EXPECT_EQ(ProjectId(ws + "/before.txt"), 0u);
  EXPECT_EQ(ProjectId(ws + "/fill1"), 0u);
}

// ---------------------------------------------------------- workspace overlay

TEST(WorkspaceDisk, OverlayStopsA2GiBFillAndKeepsWhatCameBefore) {
  Sandbox sb;
  WriteFile(sb.ws() + "/before.txt", "kept\n");
  RunResult r = sb.Sh(kFill2GiB, {"--policy", Policy(sb, "1"), "--workspace-overlay", "--apply", "always"},
                      {}, 120000);
  EXPECT_EQ(r.status, 1) << r.Describe();
  ASSERT_TRUE(r.report) << r.Describe();
  EXPECT_FALSE(Contains(MissingText(r), "disk_gib")) << MissingText(r);
  const auto& mech = (*r.report)["enforcement"]["facets"]["resources"]["mechanisms"];
  EXPECT_TRUE(Contains(mech.dump(), "workspace-overlay")) << mech.dump();
  const nlohmann::json* d = DiskDenial(r);
  ASSERT_NE(d, nullptr) << r.Describe();
  EXPECT_EQ((*d)["op"], "write");
  EXPECT_EQ((*d)["source"], "statfs");
  EXPECT_TRUE(Contains((*d)["reason"].get<std::string>(), "is full (ENOSPC)")) << d->dump();
  EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
  EXPECT_EQ(Overlay(r)["action"], "applied") << r.Describe();
  ExpectFillKept(sb.ws(), r.out, 1ull << 30);
  EXPECT_EQ(ReadFile(sb.ws() + "/before.txt").value_or(""), "kept\n");
}

TEST(WorkspaceDisk, OverlayAppliesOnSuccessWithTheDiffInTheReport) {
  Sandbox sb;
  WriteFile(sb.ws() + "/gone.txt", "old\n");
  WriteFile(sb.ws() + "/edit.txt", "one\n");
  WriteFile(sb.ws() + "/dir/inner.txt", "inner\n");
  RunResult r = sb.Sh("echo new > added.txt && rm gone.txt && echo two > edit.txt && rm -r dir && "
                      "mkdir -p dir/sub && echo fresh > dir/sub/f.txt && ln -s added.txt link",
                      {"--workspace-overlay"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(ReadFile(sb.ws() + "/added.txt").value_or(""), "new\n");
  EXPECT_FALSE(Exists(sb.ws() + "/gone.txt"));
  EXPECT_EQ(ReadFile(sb.ws() + "/edit.txt").value_or(""), "two\n");
  EXPECT_FALSE(Exists(sb.ws() + "/dir/inner.txt"));
  EXPECT_EQ(ReadFile(sb.ws() + "/dir/sub/f.txt").value_or(""), "fresh\n");
  char target[64] = {};
  EXPECT_EQ(readlink((sb.ws() + "/link").c_str(), target, sizeof(target) - 1), 9);
  EXPECT_STREQ(target, "added.txt");
  const auto& o = Overlay(r);
  ASSERT_TRUE(o.is_object()) << r.Describe();
  EXPECT_EQ(o["action"], "applied");
  EXPECT_EQ(o["apply"], "on-success");
  EXPECT_EQ(o["size_bytes"], 1ull << 30) << o.dump();  // no disk_gib: the default
  const std::string files = o["diff"]["files"].dump();
  EXPECT_TRUE(Contains(files, "\"added.txt\"")) << files;
  EXPECT_TRUE(Contains(files, "\"gone.txt\"")) << files;
  EXPECT_TRUE(Contains(o["diff"]["patch"].get<std::string>(), "+two")) << o.dump();
}

TEST(WorkspaceDisk, OverlayDiscardsAFailedRunUnlessAskedToApply) {
  Sandbox sb;
  WriteFile(sb.ws() + "/keep.txt", "original\n");
  RunResult r = sb.Sh("echo changed > keep.txt; echo new > new.txt; exit 3", {"--workspace-overlay"});
  EXPECT_EQ(r.status, 3) << r.Describe();
  EXPECT_EQ(ReadFile(sb.ws() + "/keep.txt").value_or(""), "original\n");
  EXPECT_FALSE(Exists(sb.ws() + "/new.txt"));
  EXPECT_EQ(Overlay(r)["action"], "discarded") << r.Describe();
  EXPECT_TRUE(Contains(Overlay(r)["reason"].dump(), "exited with 3")) << r.Describe();
  EXPECT_TRUE(Contains(Overlay(r)["diff"]["files"].dump(), "new.txt")) << r.Describe();

  RunResult never = sb.Sh("echo changed > keep.txt", {"--workspace-overlay", "--apply", "never"});
  EXPECT_EQ(never.status, 0) << never.Describe();
  EXPECT_EQ(ReadFile(sb.ws() + "/keep.txt").value_or(""), "original\n");
  EXPECT_EQ(Overlay(never)["action"], "discarded") << never.Describe();

  RunResult always = sb.Sh("echo changed > keep.txt; exit 3", {"--workspace-overlay", "--apply", "always"});
  EXPECT_EQ(always.status, 3) << always.Describe();
  EXPECT_EQ(ReadFile(sb.ws() + "/keep.txt").value_or(""), "changed\n");
  EXPECT_EQ(Overlay(always)["action"], "applied") << always.Describe();
}

TEST(WorkspaceDisk, OverlayTimedOutIsDiscarded) {
  Sandbox sb;
  RunResult r = sb.Sh("echo x > partial.txt; sleep 100", {"--workspace-overlay", "--timeout", "1s"});
  EXPECT_EQ(r.status, 124) << r.Describe();
  EXPECT_FALSE(Exists(sb.ws() + "/partial.txt"));
  EXPECT_EQ(Overlay(r)["action"], "discarded") << r.Describe();
}

TEST(WorkspaceDisk, OverlayIsRefusedOnTheLandlockOnlyBackend) {
  Sandbox sb;
  if (host_facts::LandlockAbi() < 1) GTEST_SKIP() << "not applicable here: this kernel has no Landlock";
  RunResult r = sb.Sh("echo ran > out", {"--workspace-overlay", "--backend", "landlock"});
  EXPECT_EQ(r.status, 125) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "--workspace-overlay needs the namespaces backend")) << r.Describe();
  EXPECT_FALSE(Exists(sb.ws() + "/out"));
}

TEST(WorkspaceDisk, ApplyWithoutOverlayIsAUsageError) {
  Sandbox sb;
  RunResult r = sb.Sh("true", {"--apply", "always"});
  EXPECT_EQ(r.status, 2) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "--apply")) << r.Describe();
}

}  // namespace
}  // namespace agentbox::e2e
