// Start-up cost of a confined /bin/true against the anchor tools, measured in
// the same run (DESIGN §6): bare exec, `unshare -Urmpnf --mount-proc`,
// bubblewrap with --unshare-all, and agentbox in workspace-write mode; plus
// the cost a 100k-file workspace adds with `**/.env` in deny, and the
// supervisor's peak RSS. Prints ratios; asserts nothing (targets live in the
// issue notes, not in tests).
//
// Then, from the same run: the phase breakdown of `agentbox run` (each
// step's CLOCK_MONOTONIC timestamp, recorded by agentbox itself with
// AGENTBOX_PHASES=FILE, as the median offset from the bench's fork), the
// deny-glob scan on a workspace whose directories change between runs and
// with a cold dentry/inode cache, and the private memory of a sandbox's idle
// init. docs/performance.md has the numbers and how to read them.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_net.h"

namespace {

namespace fs = std::filesystem;
using agentbox::bench::RunOnce;
using agentbox::bench::Spawn;

std::string g_agentbox = AGENTBOX_BIN;
std::string g_empty_ws;
std::string g_big_ws;
std::string g_noglob_policy;

void Measure(benchmark::State& state, const std::vector<std::string>& argv, const std::string& cwd = "",
             const std::string& env = "") {
  if (RunOnce(argv, {.cwd = cwd, .env = env}) != 0) {
    state.SkipWithError(("command failed: " + argv[0]).c_str());
    return;
  }
  for (auto _ : state) {
    if (RunOnce(argv, {.cwd = cwd, .env = env}) != 0) {
      state.SkipWithError("command failed during the run");
      return;
    }
  }
}

void BM_Bare(benchmark::State& s) { Measure(s, {"/bin/true"}); }
void BM_Unshare(benchmark::State& s) { Measure(s, {"unshare", "-Urmpnf", "--mount-proc", "/bin/true"}); }
void BM_Bwrap(benchmark::State& s) {
  Measure(s, {"bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev", "--proc",
              "/proc", "/bin/true"});
}
void BM_Agentbox(benchmark::State& s) {
  Measure(s, {g_agentbox, "run", "--mode", "workspace-write", "--", "/bin/true"}, g_empty_ws);
}
// The same run with cgroup-backed limits: cgroup creation, placement,
// counters and removal (the cost the resources layer adds).
void BM_AgentboxCgroupLimits(benchmark::State& s) {
  Measure(s, {g_agentbox, "run", "--mode", "workspace-write", "--require", "partial", "--memory", "512Mi",
              "--max-processes", "256", "--", "/bin/true"},
          g_empty_ws);
}
// The core alone (namespaces and mounts, no Landlock or seccomp layer): a
// build of an earlier revision named by AGENTBOX_CORE_BIN, measured in the
// same run so that the ratio says what the layers add.
std::string g_core_agentbox;
void BM_AgentboxCoreOnly(benchmark::State& s) {
  if (g_core_agentbox.empty()) {
    s.SkipWithError("AGENTBOX_CORE_BIN not set");
    return;
  }
  Measure(s, {g_core_agentbox, "run", "--mode", "workspace-write", "--", "/bin/true"}, g_empty_ws);
}
void BM_Agentbox100kFilesDenyGlob(benchmark::State& s) {
  Measure(s, {g_agentbox, "run", "--mode", "workspace-write", "--", "/bin/true"}, g_big_ws);
}
// A cache directory inside the workspace is refused, so every run scans in full.
void BM_Agentbox100kFilesDenyGlobUncached(benchmark::State& s) {
  Measure(s, {g_agentbox, "run", "--mode", "workspace-write", "--", "/bin/true"}, g_big_ws,
          "XDG_CACHE_HOME=" + g_big_ws + "/.cache");
}
void BM_Agentbox100kFilesNoGlob(benchmark::State& s) {
  Measure(s, {g_agentbox, "run", "--policy", g_noglob_policy, "--", "/bin/true"}, g_big_ws);
}

BENCHMARK(BM_Bare)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_Unshare)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_Bwrap)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_Agentbox)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_AgentboxCgroupLimits)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_AgentboxCoreOnly)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_Agentbox100kFilesDenyGlob)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_Agentbox100kFilesDenyGlobUncached)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();
BENCHMARK(BM_Agentbox100kFilesNoGlob)->Unit(benchmark::kMillisecond)->MinTime(1.0)->UseRealTime();

// Keeps each benchmark's mean wall time for the ratio table.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& r : runs) {
      if (!r.error_occurred && r.iterations > 0) {
        ms[r.run_name.function_name] = r.GetAdjustedRealTime();  // in the benchmark's unit (ms)
      }
    }
  }
  std::map<std::string, double> ms;
};

// VmHWM of the supervisor while its command sleeps: its peak after set-up.
long SupervisorPeakRssKib() {
  pid_t pid = Spawn({g_agentbox, "run", "--", "sleep", "0.4"}, {.cwd = g_empty_ws});
  long hwm = -1;
  for (int i = 0; i < 30; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::ifstream status("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("VmHWM:", 0) == 0) hwm = std::max(hwm, std::atol(line.c_str() + 6));
    }
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return hwm;
}

double NowMs() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// `runs` runs of argv with AGENTBOX_PHASES set: per step, the median offset
// from the fork of `agentbox` ("exited": the bench's waitpid returned),
// printed in time order with the gap from the step before.
void PhaseBreakdown(const char* title, const std::vector<std::string>& argv, const std::string& cwd,
                    const std::string& dir, int runs) {
  const std::string file = dir + "/phases.txt";
  std::map<std::string, std::vector<double>> offsets;
  for (int i = 0; i < runs; ++i) {
    unlink(file.c_str());
    const double t0 = NowMs();
    RunOnce(argv, {.cwd = cwd, .env = "AGENTBOX_PHASES=" + file});
    const double t1 = NowMs();
    offsets["exited (waitpid returned)"].push_back(t1 - t0);
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) {
      if (line == "--") break;
      std::istringstream ls(line);
      long long ns = 0;
      ls >> ns;
      std::string name;
      std::getline(ls, name);
      if (!name.empty() && name[0] == ' ') name.erase(0, 1);
      offsets[name].push_back(static_cast<double>(ns) / 1e6 - t0);
    }
  }
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [name, v] : offsets) order.emplace_back(Median(v), name);
  std::sort(order.begin(), order.end());
  std::printf("\nphase breakdown: %s (%d runs; median ms from fork)\n", title, runs);
  std::printf("  %-34s %9s %9s\n", "step (ends at)", "at", "phase");
  double prev = 0;
  for (const auto& [at, name] : order) {
    std::printf("  %-34s %9.3f %9.3f\n", name.c_str(), at, at - prev);
    prev = at;
  }
}

// The directories of the big workspace (relative), for touching some.
std::vector<std::string> g_big_dirs;

// Runs argv once per round after `prepare`, timing the run alone.
double MedianAfter(const std::vector<std::string>& argv, const std::string& cwd, int rounds,
                   const std::function<void(int)>& prepare) {
  std::vector<double> ms;
  for (int i = 0; i < rounds; ++i) {
    prepare(i);
    const double t0 = NowMs();
    RunOnce(argv, {.cwd = cwd});
    ms.push_back(NowMs() - t0);
  }
  return Median(ms);
}

// Private memory (Private_Clean + Private_Dirty, KiB) of `pid`.
long PrivateKib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps_rollup");
  long total = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Private_Clean:", 0) == 0 || line.rfind("Private_Dirty:", 0) == 0) {
      total += std::atol(line.c_str() + line.find(':') + 1);
    }
  }
  return total;
}

// The sandbox's init (the runner) while its command sleeps: its private memory.
long IdleInitPrivateKib() {
  pid_t pid = Spawn({g_agentbox, "run", "--", "sleep", "0.5"}, {.cwd = g_empty_ws});
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  long kib = -1;
  // The runner is the supervisor's child named agentbox-init.
  std::ifstream children("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  pid_t child = 0;
  while (children >> child) {
    std::ifstream comm("/proc/" + std::to_string(child) + "/comm");
    std::string name;
    std::getline(comm, name);
    if (name == "agentbox-init") kib = PrivateKib(child);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return kib;
}

void MakeBigWorkspace(const std::string& root, int files) {
  // 1000 directories of 100 files, a few .env among them.
  for (int d = 0; d < files / 100; ++d) {
    const std::string rel = "pkg" + std::to_string(d / 50) + "/mod" + std::to_string(d);
    std::string dir = root + "/" + rel;
    fs::create_directories(dir);
    g_big_dirs.push_back(rel);
    for (int f = 0; f < 100; ++f) {
      std::ofstream(dir + "/f" + std::to_string(f) + ".txt") << "x";
    }
    if (d % 250 == 0) std::ofstream(dir + "/.env") << "SECRET=1";
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (const char* b = getenv("AGENTBOX_BIN")) g_agentbox = b;
  if (const char* c = getenv("AGENTBOX_CORE_BIN")) g_core_agentbox = c;
  char tmpl[] = "/tmp/agentbox-bench.XXXXXX";
  std::string base = mkdtemp(tmpl);
  g_empty_ws = base + "/empty";
  g_big_ws = base + "/big";
  fs::create_directories(g_empty_ws);
  std::fprintf(stderr, "creating a 100k-file workspace in %s ...\n", g_big_ws.c_str());
  MakeBigWorkspace(g_big_ws, 100000);
  g_noglob_policy = base + "/noglob.yaml";
  std::ofstream(g_noglob_policy) << "version: 1\nmode: workspace-write\nfilesystem:\n  deny: [\"~/.ssh\", \"~/.aws\"]\n";

  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);

  // The same commands once more, interleaved round by round and summarised
  // by the median: on a shared or virtual machine, noise that lasts seconds
  // then hits every command alike instead of whichever ran at the time.
  struct Entry {
    const char* name;
    std::vector<std::string> argv;
    std::string cwd;
    std::vector<double> ms;
  };
  std::vector<Entry> entries = {
      {"bwrap --unshare-all", {"bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--dev",
                               "/dev", "--proc", "/proc", "/bin/true"}, "", {}},
      {"agentbox run", {g_agentbox, "run", "--", "/bin/true"}, g_empty_ws, {}},
      {"agentbox run --memory --max-processes",
       {g_agentbox, "run", "--require", "partial", "--memory", "512Mi", "--max-processes", "256", "--", "/bin/true"},
       g_empty_ws, {}},
      {"agentbox run --allow-domain (egress proxy on)",
       {g_agentbox, "run", "--allow-domain", "example.com", "--", "/bin/true"}, g_empty_ws, {}},
      {"unshare -Urmpnf --mount-proc", {"unshare", "-Urmpnf", "--mount-proc", "/bin/true"}, "", {}},
      {"bare /bin/true", {"/bin/true"}, "", {}},
      {"bare bash -c true", {"/bin/bash", "-c", "true"}, "", {}},
  };
  if (!g_core_agentbox.empty()) entries.push_back({"core alone", {g_core_agentbox, "run", "--", "/bin/true"}, g_empty_ws, {}});
  const int rounds = 150;
  for (int i = 0; i < rounds; ++i) {
    for (auto& e : entries) {
      auto t0 = std::chrono::steady_clock::now();
      RunOnce(e.argv, {.cwd = e.cwd});
      e.ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  std::printf("\ninterleaved, %d rounds, median ms:\n", rounds);
  double m_bwrap = median(entries[0].ms), m_ab = median(entries[1].ms), m_cg = median(entries[2].ms);
  for (const auto& e : entries) std::printf("  %-44s %7.2f\n", e.name, median(e.ms));
  std::printf("  %-44s %7.2fx (target <= 0.9x)\n", "agentbox / bubblewrap", m_ab / m_bwrap);
  std::printf("  %-44s %7.2fx\n", "agentbox --memory --max-processes / bubblewrap", m_cg / m_bwrap);
  std::printf("  %-44s %7.2fx\n", "agentbox --allow-domain / bubblewrap", median(entries[3].ms) / m_bwrap);
  std::printf("  %-44s %7.2f ms (target <= 1 ms)\n", "added by cgroup limits", m_cg - m_ab);
  if (!g_core_agentbox.empty()) {  // the core's entry is the last
    std::printf("  %-44s %7.2f ms (target <= 0.5 ms)\n", "added by the Landlock + seccomp layers",
                m_ab - median(entries.back().ms));
  }
  long rss = SupervisorPeakRssKib();
  long init_private = IdleInitPrivateKib();

  // The phase breakdowns, and the deny-glob scan beyond the unchanged case.
  PhaseBreakdown("agentbox run --mode workspace-write -- /bin/true", {g_agentbox, "run", "--", "/bin/true"},
                 g_empty_ws, base, 100);
  PhaseBreakdown("the same with --memory 512Mi --max-processes 256",
                 {g_agentbox, "run", "--require", "partial", "--memory", "512Mi", "--max-processes", "256", "--",
                  "/bin/true"},
                 g_empty_ws, base, 60);
  PhaseBreakdown("the same with --allow-domain example.com (egress proxy on)",
                 {g_agentbox, "run", "--allow-domain", "example.com", "--", "/bin/true"}, g_empty_ws, base, 60);
  PhaseBreakdown("the same on the 100k-file workspace, **/.env in deny", {g_agentbox, "run", "--", "/bin/true"},
                 g_big_ws, base, 60);
  const std::vector<std::string> plain = {g_agentbox, "run", "--", "/bin/true"};
  const int scan_rounds = 40;
  const double empty_again = MedianAfter(plain, g_empty_ws, scan_rounds, [](int) {});
  const double big_again = MedianAfter(plain, g_big_ws, scan_rounds, [](int) {});
  // A build between runs: 20 directories get a new file each (their ctime
  // moves, so each is read again), spread over the tree.
  std::mt19937 rng(7);
  const double touched = MedianAfter(plain, g_big_ws, scan_rounds, [&](int i) {
    for (int k = 0; k < 20; ++k) {
      const std::string& d = g_big_dirs[rng() % g_big_dirs.size()];
      std::ofstream(g_big_ws + "/" + d + "/out" + std::to_string(i) + ".o") << "o";
    }
  });
  // Cold: the kernel's dentry and inode caches dropped before each run
  // (root only; the page cache is kept, so agentbox's own binary stays warm).
  double cold = -1;
  if (geteuid() == 0) {
    cold = MedianAfter(plain, g_big_ws, 10, [](int) {
      sync();
      std::ofstream("/proc/sys/vm/drop_caches") << "2";
    });
  }
  fs::remove_all(base);

  auto get = [&](const char* n) { return reporter.ms.count(n) ? reporter.ms[n] : -1.0; };
  double bare = get("BM_Bare"), unshare = get("BM_Unshare"), bwrap = get("BM_Bwrap"), ab = get("BM_Agentbox");
  double glob = get("BM_Agentbox100kFilesDenyGlob"), noglob = get("BM_Agentbox100kFilesNoGlob");
  double uncached = get("BM_Agentbox100kFilesDenyGlobUncached");
  std::printf("\n%-46s %9s %14s\n", "confined /bin/true (same run)", "mean ms", "agentbox / x");
  auto row = [&](const char* name, double v) {
    if (v < 0) {
      std::printf("%-46s %9s\n", name, "n/a");
    } else {
      std::printf("%-46s %9.2f %13.2fx\n", name, v, ab > 0 ? ab / v : 0.0);
    }
  };
  row("bare /bin/true", bare);
  row("unshare -Urmpnf --mount-proc", unshare);
  row("bwrap --unshare-all --ro-bind / / ...", bwrap);
  row("agentbox run --mode workspace-write", ab);
  std::printf("\n%-46s %9.2f ms\n", "100k-file workspace, **/.env in deny", glob);
  std::printf("%-46s %9.2f ms\n", "  the same, scan cache disabled (full walk)", uncached);
  std::printf("%-46s %9.2f ms\n", "100k-file workspace, no deny glob", noglob);
  std::printf("%-46s %9.2f ms (target <= 50 ms)\n", "added by the deny-glob scan (cached)", glob - noglob);
  std::printf("%-46s %9.2f ms (target <= 50 ms)\n", "added by the deny-glob scan (full walk)", uncached - noglob);
  std::printf("%-46s %9.2f ms (target <= 50 ms)\n", "100k workspace vs empty workspace", glob - ab);
  double cg = get("BM_AgentboxCgroupLimits");
  std::printf("%-46s %9.2f ms\n", "--memory 512Mi --max-processes 256", cg);
  std::printf("%-46s %9.2f ms (target <= 1 ms; %.2fx the plain run)\n", "added by cgroup setup and teardown",
              cg - ab, ab > 0 ? cg / ab : 0.0);
  double core = get("BM_AgentboxCoreOnly");
  if (core > 0) {
    std::printf("%-46s %9.2f ms\n", "core alone (AGENTBOX_CORE_BIN)", core);
    std::printf("%-46s %9.2f ms (target <= 0.5 ms; %.2fx the core)\n", "added by the Landlock + seccomp layers",
                ab - core, ab / core);
  }
  std::printf("%-46s %9ld KiB (target <= 4096 KiB)\n", "supervisor peak RSS (VmHWM)", rss);
  std::printf("%-46s %9ld KiB (target <= 1024 KiB)\n", "sandbox init, idle: private memory", init_private);
  std::printf("\ndeny-glob scan, %d rounds, median ms (same run):\n", scan_rounds);
  std::printf("  %-44s %7.2f\n", "empty workspace", empty_again);
  std::printf("  %-44s %7.2f (%+.2f ms; target <= +3 ms)\n", "100k files, **/.env, nothing changed", big_again,
              big_again - empty_again);
  std::printf("  %-44s %7.2f (%+.2f ms)\n", "100k files, 20 dirs touched between runs", touched,
              touched - empty_again);
  if (cold >= 0) {
    std::printf("  %-44s %7.2f (%+.2f ms; 10 rounds)\n", "100k files, dentry/inode cache dropped", cold,
                cold - empty_again);
  } else {
    std::printf("  %-44s %7s (needs root)\n", "100k files, dentry/inode cache dropped", "n/a");
  }
  std::printf("%-46s %9.2fx (target <= 1.0x)\n", "agentbox / bubblewrap", bwrap > 0 ? ab / bwrap : 0.0);
  return 0;
}
