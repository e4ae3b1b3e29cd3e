// What a `max_processes` limit costs a run where no pids cgroup is ours: the
// cgroup probe the policy triggers (to find there is none) and the runner's
// setrlimit calls, RLIMIT_NPROC among them, against the same calls without
// it. In-process, so the figures are the set-up alone, not a whole run's
// noise. Prints per-call times; asserts nothing.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include "agentbox/host_caps.h"
#include "agentbox/plan.h"
#include "linux/rlimits.h"

namespace {

using agentbox::ResourceLimits;

// The runner's rlimits as a run without max_processes sets them.
void BM_ApplyRlimits(benchmark::State& state) {
  ResourceLimits limits;
  for (auto _ : state) {
    if (!agentbox::linux::ApplyRlimits(limits).ok()) state.SkipWithError("ApplyRlimits failed");
  }
}

// The same with RLIMIT_NPROC (high enough not to bind this process).
void BM_ApplyRlimitsWithNproc(benchmark::State& state) {
  ResourceLimits limits;
  limits.nproc = 1u << 20;
  for (auto _ : state) {
    if (!agentbox::linux::ApplyRlimits(limits).ok()) state.SkipWithError("ApplyRlimits failed");
  }
}

// The cgroup probe a policy with max_processes adds to every run.
void BM_ProbeCgroupCaps(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(agentbox::ProbeCgroupCaps());
}

}  // namespace

BENCHMARK(BM_ApplyRlimits)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(BM_ApplyRlimitsWithNproc)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(BM_ProbeCgroupCaps)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK_MAIN();
