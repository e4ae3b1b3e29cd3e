#include "supervise/resources.h"

#include <fcntl.h>

#include <cstdlib>

#include "supervise/gvisor_run.h"
#include "supervise/microvm_run.h"

#include "agentbox/run.h"
#include "linux/cgroup_delegation.h"
#include "supervise/workspace_disk.h"

namespace agentbox::supervise {

Result<std::unique_ptr<linux::SandboxCgroup>> MakeRunCgroup(const Plan& plan) {
  if (!plan.confined || !plan.limits.NeedsCgroup()) return std::unique_ptr<linux::SandboxCgroup>();
  linux::CgroupFs fs;
  // Our own cgroup, or where it is not writable this user's delegated one.
  linux::CgroupLayout layout = linux::DiscoverRunCgroupLayout(fs);
  (void)linux::CollectStaleCgroups(fs, layout);
  auto cg = linux::SandboxCgroup::Create(fs, layout, plan.limits, linux::SandboxCgroupName());
  if (!cg.ok()) return cg.status();
  return std::move(*cg);
}

LimitsInForce LimitsFor(const Plan& plan, const std::string& cgroup_mechanism, const linux::RlimitsSet& rlimits) {
  LimitsInForce l;
  l.wall_clock_ms = plan.timeout_ms;
  if (plan.confined) {
    // ApplyRlimits sets these in the runner, before the command and every
    // session call, which inherit them.
    l.core_dumps = false;
    l.nofile = rlimits.nofile_soft;
    l.fsize_bytes = rlimits.fsize;
    l.nproc = rlimits.nproc;
  }
  if (cgroup_mechanism.empty()) return l;
  l.cgroup = cgroup_mechanism;
  l.memory_max_bytes = plan.limits.memory_max_bytes;
  l.memory_low_bytes = plan.limits.memory_low_bytes;
  l.cpu_max_cores = plan.limits.cpu_max_cores;
  l.cpu_weight_cores = plan.limits.cpu_weight_cores;
  l.pids_max = plan.limits.pids_max;
  return l;
}

void FillRusage(const struct rusage& ru, Usage* usage) {
  usage->cpu_user_ms = static_cast<std::uint64_t>(ru.ru_utime.tv_sec) * 1000 + ru.ru_utime.tv_usec / 1000;
  usage->cpu_sys_ms = static_cast<std::uint64_t>(ru.ru_stime.tv_sec) * 1000 + ru.ru_stime.tv_usec / 1000;
  usage->peak_memory_bytes = static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;
}

void FillUsage(const Plan& plan, const linux::SandboxCgroup* cgroup, const linux::CgroupStats& stats,
               Usage* usage) {
  usage->limits = LimitsFor(plan, cgroup ? cgroup->Mechanism() : std::string(), linux::RlimitsFor(plan.limits));
  if (!cgroup) return;
  if (stats.peak_memory_bytes) {
    usage->peak_memory_bytes = stats.peak_memory_bytes;
    usage->source = "cgroup";
  }
  if (stats.cpu_user_us && stats.cpu_sys_us) {
    usage->cpu_user_ms = *stats.cpu_user_us / 1000;
    usage->cpu_sys_ms = *stats.cpu_sys_us / 1000;
    usage->source = "cgroup";
  }
  usage->peak_processes = stats.peak_processes;
  if (stats.oom_counter) usage->oom_kills = stats.oom_kills;
}

Denial OomDenial(std::uint64_t limit_bytes, std::uint64_t kills) {
  return Denial{"resources", "memory", "memory.max",
                "the kernel's OOM killer ended " + std::to_string(kills) + " process(es) at the memory limit of " +
                    std::to_string(limit_bytes) + " bytes (resources.memory_gib)",
                "cgroup", kills};
}

Result<std::vector<linux::UniqueFd>> RunCgroupTaskFiles(const linux::SandboxCgroup* cgroup) {
  std::vector<linux::UniqueFd> files;
  if (!cgroup) return files;
  if (cgroup->v2_fd() >= 0) {
    linux::UniqueFd procs(openat(cgroup->v2_fd(), "cgroup.procs", O_WRONLY | O_CLOEXEC));
    if (!procs.valid()) return Status::Errno("cgroup", "open", "cgroup.procs");
    files.push_back(std::move(procs));
  }
  if (cgroup->NeedsAttach()) {
    auto v1 = cgroup->OpenTaskFiles();
    if (!v1.ok()) return v1.status();
    for (auto& f : *v1) files.push_back(std::move(f));
  }
  return files;
}

}  // namespace agentbox::supervise

namespace agentbox {

std::vector<std::string> CollectGarbage() {
  linux::CgroupFs fs;
  std::vector<std::string> out = linux::CollectStaleCgroups(fs, linux::DiscoverRunCgroupLayout(fs));
  // Project quotas of killed supervisors: their workspaces' ids restored.
  if (const std::string records = supervise::WorkspaceQuotaRecordDir(); !records.empty()) {
    auto kernel = linux::RealQuotaKernel();
    for (auto& w : linux::CollectStaleProjectQuotas(kernel.get(), records)) out.push_back(std::move(w));
  }
  // gVisor bundles of killed supervisors (runsc and its sandbox died with them).
  std::vector<std::string> parents = {"/tmp"};
  if (const char* run = getenv("XDG_RUNTIME_DIR"); run && *run == '/') parents.emplace_back(run);
  for (const auto& p : parents) {
    for (auto& b : supervise::CollectGvisorBundles(p)) out.push_back(std::move(b));
    for (auto& b : supervise::CollectMicrovmDirs(p)) out.push_back(std::move(b));
  }
  return out;
}

}  // namespace agentbox
