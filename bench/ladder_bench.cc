// The isolation ladder's start-up cost: `agentbox run -- /bin/true` per
// level (os: namespaces; container: gVisor; microvm: QEMU, with QEMU's own
// boot to the guest's init under TCG and KVM), next to bare exec, `unshare`,
// bubblewrap and gVisor's own `runsc do` in the same run, interleaved round
// by round and summarised by the median. Then sessions per level through a
// real `agentbox serve`: the first call (the world's start), a warm call,
// and the idle world's memory (the proportional set size of every process
// the daemon keeps for it), next to a bare `bash -c true`. Prints ratios;
// asserts nothing.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

double MsOf(const std::vector<std::string>& argv, const agentbox::bench::SpawnOptions& o = {}, bool* failed = nullptr) {
  auto t0 = std::chrono::steady_clock::now();
  const int rc = RunOnce(argv, o);
  if (failed && rc != 0) *failed = true;
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// What `argv` prints, trailing newline dropped ("" on failure).
std::string OutputOf(const std::vector<std::string>& argv) {
  int p[2];
  if (pipe(p) != 0) return "";
  pid_t pid = agentbox::bench::Spawn(argv, {.stdout_fd = p[1]});
  close(p[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(p[0], buf, sizeof(buf))) > 0;) out.append(buf, static_cast<size_t>(n));
  close(p[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? out : "";
}

// Every descendant of `root` now.
std::vector<pid_t> Descendants(pid_t root) {
  std::vector<std::pair<pid_t, pid_t>> all;  // pid, parent
  if (DIR* d = opendir("/proc")) {
    while (dirent* e = readdir(d)) {
      const pid_t pid = std::atoi(e->d_name);
      if (pid <= 0) continue;
      std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
      std::string line;
      std::getline(stat, line);
      const auto close_paren = line.rfind(')');
      if (close_paren == std::string::npos) continue;
      char state = 0;
      int ppid = 0;
      if (std::sscanf(line.c_str() + close_paren + 1, " %c %d", &state, &ppid) == 2) all.push_back({pid, ppid});
    }
    closedir(d);
  }
  std::vector<pid_t> out = {root};
  for (std::size_t i = 0; i < out.size(); ++i) {
    for (const auto& [pid, parent] : all) {
      if (parent == out[i]) out.push_back(pid);
    }
  }
  out.erase(out.begin());
  return out;
}

// The summed Pss of `pids` in KiB.
long PssKib(const std::vector<pid_t>& pids) {
  long total = 0;
  for (pid_t pid : pids) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/smaps_rollup");
    for (std::string line; std::getline(f, line);) {
      if (line.rfind("Pss:", 0) == 0) total += std::atol(line.c_str() + 4);
    }
  }
  return total;
}

struct SessionRow {
  std::string level;
  std::vector<double> first, warm;
  std::vector<long> idle_kib;
  bool failed = false;
};

// Sessions on `level` through the daemon at `socket` (serve's pid `serve`):
// `rounds` sessions, each with its first call, `warm` warm calls and the
// world's memory measured once idle.
void MeasureSessions(const std::string& agentbox, const std::string& socket, pid_t serve, const std::string& ws,
                     const std::string& policy, int rounds, int warm, SessionRow* row) {
  for (int i = 0; i < rounds && !row->failed; ++i) {
    const std::vector<std::string> base = {agentbox, "session", "--socket", socket};
    auto with = [&](std::vector<std::string> rest) {
      std::vector<std::string> v = base;
      v.insert(v.end(), rest.begin(), rest.end());
      return v;
    };
    const std::string id = OutputOf(with({"create", "--workspace", ws, "--policy", policy}));
    if (id.empty()) {
      row->failed = true;
      return;
    }
    const auto before = Descendants(serve);
    row->first.push_back(MsOf(with({"exec", id, "--command", "true"}), {}, &row->failed));
    for (int j = 0; j < warm && !row->failed; ++j) {
      row->warm.push_back(MsOf(with({"exec", id, "--command", "true"}), {}, &row->failed));
    }
    std::vector<pid_t> world;
    for (pid_t p : Descendants(serve)) {
      if (std::find(before.begin(), before.end(), p) == before.end()) world.push_back(p);
    }
    row->idle_kib.push_back(PssKib(world));
    RunOnce(with({"rm", id}));
  }
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
  // Sessions per level, through one daemon.
  std::vector<SessionRow> sessions = {{"os"}, {"container"}, {"microvm"}};
  std::vector<double> bash_true;
  {
    const std::string state_dir = base + "/serve", socket = state_dir + "/agentbox.sock";
    fs::create_directories(state_dir);
    pid_t serve = agentbox::bench::Spawn({agentbox, "serve", "--state-dir", state_dir, "--socket", socket});
    struct stat st {};
    for (int i = 0; i < 500 && stat(socket.c_str(), &st) != 0; ++i) usleep(10000);
    for (auto& row : sessions) {
      const std::string policy = base + "/session-" + row.level + ".yaml";
      std::ofstream(policy) << "version: 1\nmode: workspace-write\nsandbox: { isolation: " << row.level << " }\n";
      const bool vm = row.level == "microvm";
      MeasureSessions(agentbox, socket, serve, ws, policy, vm ? 3 : 5, vm ? 10 : 20, &row);
    }
    for (int i = 0; i < 40; ++i) bash_true.push_back(MsOf({"bash", "-c", "true"}));
    kill(serve, SIGTERM);
    waitpid(serve, nullptr, 0);
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
  const double bash = Median(bash_true);
  std::printf("sessions per level through `agentbox serve` (median ms of `agentbox session exec ID --command true`, "
              "the CLI client included; idle: Pss of the world's processes)\n");
  std::printf("  %-40s %9.2f ms\n", "bash -c true (bare, same run)", bash);
  for (const auto& r : sessions) {
    if (r.failed || r.first.empty()) {
      std::printf("  %-40s %9s\n", ("session on " + r.level).c_str(), "not available here or in this version");
      continue;
    }
    std::vector<double> idle(r.idle_kib.begin(), r.idle_kib.end());
    std::printf("  %-40s first %9.2f ms   warm %8.2f ms (%5.2fx bash -c true)   idle %8.1f MiB\n",
                ("session on " + r.level).c_str(), Median(r.first), Median(r.warm),
                bash > 0 ? Median(r.warm) / bash : 0.0, Median(idle) / 1024.0);
  }
  if (!entries[5].failed && os > 0) {
    std::printf("  %-40s %9.2f ms\n", "container over os", Median(entries[5].ms) - os);
  }
  return 0;
}
