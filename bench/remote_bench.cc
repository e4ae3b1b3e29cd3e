// Remote worlds (sandbox.isolation: remote over ssh), measured in one run
// through a real `agentbox serve` over its unix socket, against a test sshd
// on 127.0.0.1 started as the session tests start it (tests/session/ssh_host.h:
// its own keys, known_hosts and ssh_config with the Host alias `testremote`;
// the remote's cache and state in its directory through sshd's SetEnv), next
// to a local `os` world of the same daemon:
//   - the first call of a fresh session (`bash "true"`): over ssh with the
//     binary copied there (the remote's cache emptied before each), over ssh
//     with the binary already there, and on os; a bare `ssh testremote true`
//     as the connection's floor;
//   - warm `bash "true"`, p50 and p90, per world, interleaved call by call;
//   - read_file of a 10 MiB file (10240 lines of 1 KiB, made in the world by
//     its shell) in pages of 1000 lines: read_file returns at most 1 MiB a
//     call (FileToolLimits::max_read_bytes), so a pass is 11 calls; MB/s
//     (10^6 bytes) of the median pass;
//   - a bare `bash -c true`, the unit.
// Each figure is printed with its anchor from the same run and the ratio;
// nothing is asserted.
//
//   remote_bench [--warm N] [--first N] [--copies N] [--reads N]
//                (defaults 200, 8, 3, 5)
//
// Bounded: every call to the daemon gives up after 120 s, and no sample is
// started after 10 minutes (the rows then say how many they got). Only
// 127.0.0.1 is used. The daemon is stopped by its pid (its group killed
// after 30 s), then sshd and every process its connections left (SshHost),
// then the temporary directory is removed by its path.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "daemon/client.h"
#include "harness.h"
#include "ssh_host.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace e2e = agentbox::e2e;
using agentbox::session_test::SshHost;

constexpr int kCallTimeoutMs = 120 * 1000;
constexpr auto kTimeBound = std::chrono::minutes(10);
constexpr std::size_t kBigLines = 10240, kBigLineBytes = 1024, kBigBytes = kBigLines * kBigLineBytes;
constexpr int kPageLines = 1000;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// Whether samples may still be taken.
class Deadline {
 public:
  Deadline() : end_(Clock::now() + kTimeBound) {}
  bool passed() {
    if (Clock::now() < end_) return false;
    hit_ = true;
    return true;
  }
  bool hit() const { return hit_; }

 private:
  Clock::time_point end_;
  bool hit_ = false;
};

// `agentbox serve` on a unix socket in `root`, with a HOME of its own there.
// Stopped by its pid when destroyed: SIGTERM, then its group's SIGKILL.
class Daemon {
 public:
  explicit Daemon(const std::string& root) : socket_(root + "/state/agentbox.sock") {
    e2e::MakeDirs(root + "/home", 0700);
    e2e::MakeDirs(root + "/state", 0700);
    const std::string state = root + "/state", log = root + "/daemon.log", out = root + "/daemon.out";
    std::vector<std::string> argv = {AGENTBOX_BIN, "serve", "--state-dir", state, "--socket", socket_,
                                     "--log-file", log};
    std::vector<std::string> env = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + root + "/home", "LANG=C.UTF-8"};
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      const int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> args, envp;
      for (auto& a : argv) args.push_back(a.data());
      for (auto& e : env) envp.push_back(e.data());
      args.push_back(nullptr);
      envp.push_back(nullptr);
      execve(args[0], args.data(), envp.data());
      _exit(127);
    }
    for (int i = 0; i < 1000 && pid_ > 0; ++i) {
      agentbox::daemon::Client probe(endpoint());
      auto r = probe.Call("GET", "/v1/health");
      if (r.ok() && r->status == 200) {
        up_ = true;
        return;
      }
      if (waitpid(pid_, nullptr, WNOHANG) != 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~Daemon() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int st = 0;
    for (int i = 0; i < 3000 && waitpid(pid_, &st, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(-pid_, SIGKILL);  // the daemon's group: what it left, or the daemon itself after 30 s
    waitpid(pid_, &st, WNOHANG);
  }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  bool up() const { return up_; }
  agentbox::daemon::Endpoint endpoint() const {
    agentbox::daemon::Endpoint e;
    e.unix_socket = socket_;
    e.timeout_ms = kCallTimeoutMs;
    return e;
  }

 private:
  std::string socket_;
  pid_t pid_ = -1;
  bool up_ = false;
};

// One kind of world: its policy, its samples, and the first thing that
// failed ("" while none has; a world that failed takes no more samples).
struct World {
  std::string name;
  std::string policy;
  std::vector<double> first_copied, first, warm, read_mbps;
  std::string error;
  bool ok() const { return error.empty(); }
};

class Bench {
 public:
  explicit Bench(const agentbox::daemon::Endpoint& e, std::string workspace)
      : client_(e), workspace_(std::move(workspace)) {}

  // The new session's id, or "" with w->error set.
  std::string Create(World* w) {
    auto r = client_.CallJson("POST", "/v1/sessions", {{"workspace", workspace_}, {"policy", w->policy}});
    if (!r.ok() || !(*r)["id"].is_string()) {
      Fail(w, "create: " + (r.ok() ? r->dump() : r.status().ToString()));
      return "";
    }
    return (*r)["id"];
  }
  void Remove(const std::string& id) {
    if (!id.empty()) (void)client_.Call("DELETE", "/v1/sessions/" + id);
  }
  // A tool call; its result, or nullopt with w->error set (a tool error too).
  std::optional<json> Exec(World* w, const std::string& id, const std::string& tool, const json& input) {
    auto r = client_.CallJson("POST", "/v1/sessions/" + id + "/execute", {{"name", tool}, {"input", input}});
    if (!r.ok()) {
      Fail(w, tool + ": " + r.status().ToString());
      return std::nullopt;
    }
    if (r->value("is_error", false) || (tool == "bash" && r->value("exit_code", -1) != 0)) {
      Fail(w, tool + " " + input.dump() + ": " + r->dump().substr(0, 400));
      return std::nullopt;
    }
    return *r;
  }
  // ms of `bash "true"` in session `id`, or nullopt.
  std::optional<double> TimedTrue(World* w, const std::string& id) {
    const auto t0 = Clock::now();
    if (!Exec(w, id, "bash", {{"command", "true"}})) return std::nullopt;
    return Ms(Clock::now() - t0);
  }
  // The session's `remote.binary` ("installed", "present"; "" for a local world).
  std::string BinaryState(const std::string& id) {
    auto r = client_.CallJson("GET", "/v1/sessions/" + id);
    if (!r.ok() || !r->contains("remote")) return "";
    return (*r)["remote"].value("binary", "");
  }
  // A fresh session's first call; `want` the remote's binary state it must report.
  void FirstCall(World* w, std::vector<double>* into, const std::string& want) {
    const std::string id = Create(w);
    if (id.empty()) return;
    if (auto ms = TimedTrue(w, id)) {
      const std::string got = BinaryState(id);
      if (got != want) {
        Fail(w, "the first call's binary was '" + got + "', not '" + want + "'");
      } else {
        into->push_back(*ms);
      }
    }
    Remove(id);
  }
  // Makes the 10 MiB file in the session by its shell, checked by size.
  void MakeBigFile(World* w, const std::string& id) {
    const std::string cmd = "awk 'BEGIN { for (i = 0; i < " + std::to_string(kBigLines) +
                            "; i++) printf \"%07d %0" + std::to_string(kBigLineBytes - 9) +
                            "d\\n\", i, 0 }' > big.txt; wc -c < big.txt";
    auto r = Exec(w, id, "bash", {{"command", cmd}});
    if (r && r->value("output", "") != std::to_string(kBigBytes) + "\n") {
      Fail(w, "big.txt has " + r->value("output", "?") + " bytes, not " + std::to_string(kBigBytes));
    }
  }
  // One pass over big.txt in pages, as an agent pages (from next_offset when
  // a page was cut); MB/s, or nullopt when a page failed or bytes are missing.
  std::optional<double> ReadPass(World* w, const std::string& id) {
    std::size_t bytes = 0;
    const auto t0 = Clock::now();
    for (std::size_t offset = 1; offset <= kBigLines;) {
      auto page = Exec(w, id, "read_file", {{"path", "big.txt"}, {"offset", offset}, {"limit", kPageLines}});
      if (!page) return std::nullopt;
      std::size_t lines = 0;
      for (const auto& line : e2e::Lines(page->value("output", ""))) {
        if (line.rfind("[truncated:", 0) == 0) continue;  // the tool's note, not the file's
        bytes += line.size() + 1;
        ++lines;
      }
      if (lines == 0) {
        Fail(w, "read_file returned no line at offset " + std::to_string(offset));
        return std::nullopt;
      }
      offset = page->value("truncated", false) ? page->value("next_offset", offset + lines) : offset + lines;
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (bytes != kBigBytes) {
      Fail(w, "a pass read " + std::to_string(bytes) + " bytes, not " + std::to_string(kBigBytes));
      return std::nullopt;
    }
    return static_cast<double>(bytes) / 1e6 / seconds;
  }

 private:
  static void Fail(World* w, const std::string& why) {
    if (w->error.empty()) w->error = why;
  }

  agentbox::daemon::Client client_;
  std::string workspace_;
};

// ms of running `argv` to its end (its output discarded); nullopt if it failed.
std::optional<double> TimedRun(const std::vector<std::string>& argv) {
  e2e::Command c;
  c.argv = argv;
  c.env = {"PATH=/usr/bin:/bin", "LANG=C"};
  c.timeout_ms = 30000;
  const auto t0 = Clock::now();
  const e2e::RunResult r = e2e::RunCommand(c);
  if (r.status != 0) return std::nullopt;
  return Ms(Clock::now() - t0);
}

std::string Ratio(double a, double b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", b > 0 ? a / b : 0.0);
  return buf;
}

// One latency line: p50 and p90, then the anchor's p50 and the ratio of p50s.
void PrintLatency(const std::string& what, const std::vector<double>& ms, const std::string& anchor_name,
                  const std::vector<double>& anchor) {
  if (ms.empty()) {
    std::printf("  %-40s %5s\n", what.c_str(), "no sample");
    return;
  }
  const double p50 = Percentile(ms, 50), p90 = Percentile(ms, 90);
  if (anchor_name.empty()) {
    std::printf("  %-40s %5zu %9.2f %9.2f\n", what.c_str(), ms.size(), p50, p90);
    return;
  }
  const double a = Percentile(anchor, 50);
  std::printf("  %-40s %5zu %9.2f %9.2f   %-32s %9.2f %8s\n", what.c_str(), ms.size(), p50, p90, anchor_name.c_str(),
              a, Ratio(p50, a).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t warm_n = 200, first_n = 8, copies_n = 3, reads_n = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::size_t v = std::strtoul(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--warm") == 0) warm_n = v;
    else if (std::strcmp(argv[i], "--first") == 0) first_n = v;
    else if (std::strcmp(argv[i], "--copies") == 0) copies_n = v;
    else if (std::strcmp(argv[i], "--reads") == 0) reads_n = v;
  }
  if (std::string why = SshHost::WhyNot(); !why.empty()) {
    std::printf("remote_bench: not applicable here: %s\n", why.c_str());
    return 0;
  }
  struct stat binary {};
  const std::string exe = AGENTBOX_BIN, copied = exe.substr(0, exe.rfind('/')) + "/remote/agentbox";
  if (stat(copied.c_str(), &binary) != 0) {
    std::fprintf(stderr, "remote_bench: no %s (the remote_binary target)\n", copied.c_str());
    return 1;
  }

  // Destroyed in reverse: the daemon (and the ssh clients of its worlds),
  // then sshd and whatever its connections left, then the directory.
  e2e::TempDir root("agentbox-remote-bench-");
  SshHost host;
  if (std::string why = host.Start(); !why.empty()) {
    std::fprintf(stderr, "remote_bench: the test sshd: %s\n", why.c_str());
    return 1;
  }
  const std::string ws = root / "ws";
  e2e::WriteFile(ws + "/README", "bench\n");
  std::optional<Daemon> daemon(std::in_place, root.path());
  if (!daemon->up()) {
    std::fprintf(stderr, "remote_bench: the daemon did not start; %s\n",
                 e2e::ReadFile(root / "daemon.out").value_or("").c_str());
    return 1;
  }
  Bench b(daemon->endpoint(), ws);
  Deadline deadline;
  World ssh{"ssh", host.Policy("os")};
  World os{"os", "version: 1\nmode: workspace-write\nsandbox: { isolation: os }\n"};
  std::vector<double> bash_true, ssh_true;

  // The units: a bare `bash -c true`, and a bare ssh connection to the
  // remote (key exchange, authentication, a session channel, `true`).
  for (int i = 0; i < 100 && !deadline.passed(); ++i) {
    if (auto ms = TimedRun({"/bin/bash", "-c", "true"})) bash_true.push_back(*ms);
  }
  const std::vector<std::string> bare_ssh = {"/usr/bin/ssh", "-F", host.ssh_config(), "-o", "BatchMode=yes",
                                             "-T", "testremote", "true"};
  for (std::size_t i = 0; i < first_n && !deadline.passed(); ++i) {
    if (auto ms = TimedRun(bare_ssh)) ssh_true.push_back(*ms);
  }

  // 1. First calls. With the copy: the remote's cache emptied by its path
  // before each, so each session installs the binary again.
  const std::string remote_bin = host.cache_dir() + "/agentbox/bin";
  for (std::size_t i = 0; i < copies_n && ssh.ok() && !deadline.passed(); ++i) {
    e2e::RemoveTree(remote_bin);
    b.FirstCall(&ssh, &ssh.first_copied, "installed");
  }
  // Then with the binary there (installing it once more if none is), interleaved with os.
  if (ssh.ok() && !e2e::IsDir(remote_bin)) b.FirstCall(&ssh, &ssh.first_copied, "installed");
  for (std::size_t i = 0; i < first_n && !deadline.passed() && (ssh.ok() || os.ok()); ++i) {
    if (ssh.ok()) b.FirstCall(&ssh, &ssh.first, "present");
    if (os.ok()) b.FirstCall(&os, &os.first, "");
  }

  // 2. Warm calls, one session per world, interleaved call by call.
  const std::string ssh_id = ssh.ok() ? b.Create(&ssh) : "", os_id = os.ok() ? b.Create(&os) : "";
  for (int i = 0; i < 5; ++i) {  // provision, and warm up
    if (ssh.ok()) (void)b.TimedTrue(&ssh, ssh_id);
    if (os.ok()) (void)b.TimedTrue(&os, os_id);
  }
  for (std::size_t i = 0; i < warm_n && !deadline.passed() && (ssh.ok() || os.ok()); ++i) {
    for (auto [w, id] : {std::pair{&ssh, ssh_id}, std::pair{&os, os_id}}) {
      if (!w->ok()) continue;
      if (auto ms = b.TimedTrue(w, id)) w->warm.push_back(*ms);
    }
  }

  // 3. read_file of 10 MiB, pass by pass, interleaved.
  if (ssh.ok()) b.MakeBigFile(&ssh, ssh_id);
  if (os.ok()) b.MakeBigFile(&os, os_id);
  for (std::size_t i = 0; i < reads_n && !deadline.passed() && (ssh.ok() || os.ok()); ++i) {
    for (auto [w, id] : {std::pair{&ssh, ssh_id}, std::pair{&os, os_id}}) {
      if (!w->ok()) continue;
      if (auto mbps = b.ReadPass(w, id)) w->read_mbps.push_back(*mbps);
    }
  }
  b.Remove(ssh_id);
  b.Remove(os_id);
  daemon.reset();  // the daemon and its worlds stop before sshd and the files go

  std::printf("\nremote worlds through `agentbox serve` (unix socket): ssh to a test sshd on 127.0.0.1 (level os), "
              "next to a local os world; this machine, same run%s\n\n",
              deadline.hit() ? " (stopped at the 10-minute bound: see n)" : "");
  std::printf("  %-40s %5s %9s %9s   %-32s %9s %8s\n", "what", "n", "p50 ms", "p90 ms", "anchor", "p50 ms", "ratio");
  PrintLatency("bash -c true (bare; the unit)", bash_true, "", {});
  PrintLatency("ssh testremote true (bare connection)", ssh_true, "bash -c true", bash_true);
  PrintLatency("first call, os", os.first, "bash -c true", bash_true);
  PrintLatency("first call, ssh, binary present", ssh.first, "first call, os", os.first);
  PrintLatency("first call, ssh, binary present", ssh.first, "ssh testremote true", ssh_true);
  PrintLatency("first call, ssh, binary copied", ssh.first_copied, "first call, os", os.first);
  PrintLatency("first call, ssh, binary copied", ssh.first_copied, "first call, ssh, binary present", ssh.first);
  PrintLatency("warm bash \"true\", os", os.warm, "bash -c true", bash_true);
  PrintLatency("warm bash \"true\", ssh", ssh.warm, "warm bash \"true\", os", os.warm);
  PrintLatency("warm bash \"true\", ssh", ssh.warm, "bash -c true", bash_true);
  std::printf("\n  read_file of %zu MiB (%zu lines of %zu bytes) in pages of %d lines (read_file's cap: 1 MiB a call)\n",
              kBigBytes >> 20, kBigLines, kBigLineBytes, kPageLines);
  std::printf("  %-40s %5s %9s %9s   %-32s %9s %8s\n", "", "n", "MB/s p50", "min", "anchor", "MB/s p50", "ratio");
  auto read_line = [&](const std::string& what, const World& w, const std::string& anchor_name, const World* a) {
    if (w.read_mbps.empty()) {
      std::printf("  %-40s %5s\n", what.c_str(), "no sample");
      return;
    }
    const double p50 = Percentile(w.read_mbps, 50), lo = *std::min_element(w.read_mbps.begin(), w.read_mbps.end());
    if (!a || a->read_mbps.empty()) {
      std::printf("  %-40s %5zu %9.1f %9.1f\n", what.c_str(), w.read_mbps.size(), p50, lo);
      return;
    }
    const double ap = Percentile(a->read_mbps, 50);
    std::printf("  %-40s %5zu %9.1f %9.1f   %-32s %9.1f %8s\n", what.c_str(), w.read_mbps.size(), p50, lo,
                anchor_name.c_str(), ap, Ratio(p50, ap).c_str());
  };
  read_line("read_file 10 MiB, os", os, "", nullptr);
  read_line("read_file 10 MiB, ssh", ssh, "read_file 10 MiB, os", &os);
  std::printf("\n  binary copied on a first call: %.1f MB (the stripped build, %s)\n",
              static_cast<double>(binary.st_size) / 1e6, copied.c_str());
  int rc = 0;
  for (const World* w : {&ssh, &os}) {
    if (!w->ok()) {
      std::printf("  %s world failed: %s\n", w->name.c_str(), w->error.c_str());
      rc = 1;
    }
  }
  host.Stop();
  return rc;
}
