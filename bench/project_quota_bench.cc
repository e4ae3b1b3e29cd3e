// disk_gib by a project quota (linux/project_quota.h): the set-up and the
// tear-down one `agentbox run` pays, on a loop-mounted ext4 with project
// quotas, for a workspace of 10 and of 1,000 entries. The cost is one
// FS_IOC_FSGETXATTR + FS_IOC_FSSETXATTR pair per entry each way, plus three
// quotactl calls: the 10-entry line is the per-run overhead (target < 0.2 ms).
// Needs root, a loop device and a kernel with CONFIG_QUOTA; otherwise each
// case reports why it did not run (SkipWithError). Asserts nothing.
//
//   project_quota_bench [benchmark flags]   (the image goes under $TMPDIR or /tmp)
#include <benchmark/benchmark.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "linux/project_quota.h"
#include "linux/workspace_fs.h"

namespace {

namespace fs = std::filesystem;

struct LoopExt4 {
  std::string root, mnt, device, why_not;
  bool mounted = false;

  LoopExt4() {
    if (geteuid() != 0) {
      why_not = "not root";
      return;
    }
    const char* tmp = getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/agentbox-quota-bench.XXXXXX";
    if (!mkdtemp(tmpl.data())) {
      why_not = "mkdtemp failed";
      return;
    }
    root = tmpl;
    mnt = root + "/mnt";
    fs::create_directories(mnt);
    const std::string img = root + "/fs.img";
    const std::string make = "truncate -s 256M " + img + " && mkfs.ext4 -q -O quota -E quotatype=prjquota " + img +
                             " && mount -o loop,prjquota " + img + " " + mnt + " 2>/dev/null";
    if (std::system(make.c_str()) != 0) {
      why_not = "mkfs.ext4 -O quota + mount -o loop,prjquota failed (no loop device, or a kernel without CONFIG_QUOTA)";
      return;
    }
    mounted = true;
    agentbox::WorkspaceFs probe = agentbox::linux::ProbeWorkspaceFs(mnt);
    if (!probe.project_quota) {
      why_not = "the mount has no usable project quota: " + probe.why_not;
      return;
    }
    device = probe.device;
  }
  ~LoopExt4() {
    if (mounted) std::system(("umount " + mnt).c_str());
    std::error_code ec;
    if (!root.empty()) fs::remove_all(root, ec);
  }
};

LoopExt4& Fs() {
  static LoopExt4 fs;
  return fs;
}

void BM_ProjectQuotaSetUpAndTearDown(benchmark::State& state) {
  LoopExt4& ext4 = Fs();
  if (!ext4.why_not.empty()) {
    state.SkipWithError(("not applicable here: " + ext4.why_not).c_str());
    return;
  }
  const int entries = static_cast<int>(state.range(0));
  const std::string ws = ext4.mnt + "/ws" + std::to_string(entries);
  for (int i = 0; i < entries; ++i) {
    const std::string dir = ws + "/d" + std::to_string(i / 100);
    fs::create_directories(dir);
    std::ofstream(dir + "/f" + std::to_string(i)) << "x";
  }
  auto kernel = agentbox::linux::RealQuotaKernel();
  const std::string records = ext4.root + "/records";
  for (auto _ : state) {
    auto q = agentbox::linux::WorkspaceQuota::Begin(kernel.get(), ws, ext4.device, 1ull << 30, records);
    if (!q.ok()) {
      state.SkipWithError(q.status().ToString().c_str());
      return;
    }
    if (!(*q)->End().ok()) {
      state.SkipWithError("restoring failed");
      return;
    }
  }
}
BENCHMARK(BM_ProjectQuotaSetUpAndTearDown)->Arg(10)->Arg(1000)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
