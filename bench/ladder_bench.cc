// The isolation ladder's start-up cost: `agentbox run -- /bin/true` per
// level (os: namespaces; container: gVisor; microvm: QEMU, with QEMU's own
// boot to the guest's init under TCG and KVM), next to bare exec, `unshare`,
// bubblewrap and gVisor's own `runsc do` in the same run, interleaved round
// by round and summarised by the median. Prints ratios; asserts nothing.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench_net.h"

namespace {

namespace fs = std::filesystem;
using agentbox::bench::RunOnce;

struct Entry {
  std::string name;
  std::vector<std::string> argv;
  std::string cwd;
  std::vector<double> ms;
  bool failed = false;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string agentbox = AGENTBOX_BIN;
  if (const char* b = getenv("AGENTBOX_BIN")) agentbox = b;
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 40;
  char tmpl[] = "/tmp/agentbox-ladder-bench.XXXXXX";
  const std::string base = mkdtemp(tmpl);
  const std::string ws = base + "/ws", state = base + "/runsc-state";
  fs::create_directories(ws);
  fs::create_directories(state);
  std::vector<std::string> runsc = {"runsc", "--root=" + state, "--network=none", "--ignore-cgroups"};
  if (geteuid() != 0) runsc.push_back("--rootless");
  runsc.insert(runsc.end(), {"do", "/bin/true"});

  std::vector<Entry> entries = {
      {"bare /bin/true", {"/bin/true"}, "", {}},
      {"unshare -Urmpnf --mount-proc", {"unshare", "-Urmpnf", "--mount-proc", "/bin/true"}, "", {}},
      {"bwrap --unshare-all", {"bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev",
                               "--proc", "/proc", "/bin/true"}, "", {}},
      {"agentbox run (isolation: os)", {agentbox, "run", "--", "/bin/true"}, ws, {}},
      {"runsc do /bin/true (gVisor alone)", runsc, ws, {}},
      {"agentbox run --isolation container", {agentbox, "run", "--isolation", "container", "--", "/bin/true"}, ws, {}},
  };
  for (auto& e : entries) e.failed = RunOnce(e.argv, {.cwd = e.cwd}) != 0;  // warm-up, and a check
  for (int i = 0; i < rounds; ++i) {
    for (auto& e : entries) {
      if (e.failed) continue;
      auto t0 = std::chrono::steady_clock::now();
      if (RunOnce(e.argv, {.cwd = e.cwd}) != 0) e.failed = true;
      e.ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  // The microVM rows: a VM per run costs seconds under TCG, so fewer rounds.
  std::vector<Entry> vm = {
      {"QEMU boot to the guest's init, tcg", {"timeout", "20", agentbox, "__guest-trial", "tcg"}, "", {}},
      {"QEMU boot to the guest's init, kvm", {"timeout", "20", agentbox, "__guest-trial", "kvm"}, "", {}},
      {"agentbox run --isolation microvm", {"timeout", "120", agentbox, "run", "--isolation", "microvm", "--", "/bin/true"}, ws, {}},
  };
  const int vm_rounds = std::max(3, rounds / 10);
  for (auto& e : vm) e.failed = RunOnce(e.argv, {.cwd = e.cwd}) != 0;
  for (int i = 0; i < vm_rounds; ++i) {
    for (auto& e : vm) {
      if (e.failed) continue;
      auto t0 = std::chrono::steady_clock::now();
      if (RunOnce(e.argv, {.cwd = e.cwd}) != 0) e.failed = true;
      e.ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  fs::remove_all(base);
  const double bwrap = entries[2].failed ? 0 : Median(entries[2].ms);
  const double os = entries[3].failed ? 0 : Median(entries[3].ms);
  const double gvisor = entries[4].failed ? 0 : Median(entries[4].ms);
  std::printf("run -- /bin/true per isolation level, %d interleaved rounds (median ms)\n", rounds);
  std::printf("  %-40s %9s %10s %10s\n", "", "ms", "/ bwrap", "/ runsc do");
  auto print_rows = [&](const std::vector<Entry>& rows) {
    for (const auto& e : rows) {
      if (e.failed) {
        std::printf("  %-40s %9s\n", e.name.c_str(), "failed");
        continue;
      }
      const double m = Median(e.ms);
      std::printf("  %-40s %9.2f %9.2fx %9.2fx\n", e.name.c_str(), m, bwrap > 0 ? m / bwrap : 0.0,
                  gvisor > 0 ? m / gvisor : 0.0);
    }
  };
  print_rows(entries);
  std::printf("microVM, %d rounds (median ms; a row that failed could not run here: KVM that cannot boot the "
              "guest, say)\n", vm_rounds);
  print_rows(vm);
  if (!entries[5].failed && os > 0) {
    std::printf("  %-40s %9.2f ms\n", "container over os", Median(entries[5].ms) - os);
  }
  return 0;
}
