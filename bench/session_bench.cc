// The session daemon, measured in one run against a real `agentbox serve`
// over its unix socket (DESIGN §5, §6):
//   session create (lazy: no process), first execute (cold provision),
//   warm `execute bash "true"` next to `agentbox run -- /bin/true`, a bare
//   fork+exec of /bin/true and a bare `bash -c true` (its anchor), read_file,
//   write_file and edit_file of a 1 MiB file next to an in-process copy of
//   1 MiB (their anchor with the warm call), snapshot (and diff) of
//   a 10k-file workspace with 100 files changed, and the memory of the daemon
//   plus its sandboxes with 100 idle provisioned sessions; and the bare HTTP
//   round trip (GET /v1/health) for the daemon's own share; and code mode:
//   run_code's start next to a warm bash call, and 50 tool calls from one
//   program next to 50 execute calls.
// Prints a table with the targets from the issue; asserts nothing.
//
//   session_bench [--warm N] [--bin PATH] [--calls]
//     --warm N     warm calls (default 500)
//     --bin PATH   the agentbox binary to serve (default: this build's)
//     --calls      the calls and their anchors only (no code mode, snapshot
//                  or memory rounds)
#include <dirent.h>
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
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "daemon/client.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Stats {
  std::vector<double> ms;
  double Percentile(double p) const {
    if (ms.empty()) return 0;
    std::vector<double> s = ms;
    std::sort(s.begin(), s.end());
    std::size_t i = static_cast<std::size_t>(p / 100.0 * static_cast<double>(s.size() - 1) + 0.5);
    return s[std::min(i, s.size() - 1)];
  }
};

struct Row {
  std::string what;
  std::size_t n;
  double p50, p99;
  std::string target;
  std::string note;
};
std::vector<Row> g_rows;

void Add(const std::string& what, const Stats& s, const std::string& target, const std::string& note = "") {
  g_rows.push_back({what, s.ms.size(), s.Percentile(50), s.Percentile(99), target, note});
}

void Die(const std::string& what) {
  std::fprintf(stderr, "session_bench: %s\n", what.c_str());
  std::exit(1);
}

std::string MakeTemp(const std::string& prefix) {
  std::string t = std::string(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp") + "/" + prefix + "XXXXXX";
  if (!mkdtemp(t.data())) Die("mkdtemp");
  return t;
}

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::trunc);
  out << content;
}

void MkdirP(const std::string& path) {
  for (std::size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') mkdir(path.substr(0, i).c_str(), 0755);
  }
}

int RunQuiet(const std::vector<std::string>& argv) {
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(null, 1);
    dup2(null, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

std::vector<pid_t> Descendants(pid_t root) {
  std::vector<pid_t> out, todo{root};
  while (!todo.empty()) {
    pid_t p = todo.back();
    todo.pop_back();
    out.push_back(p);
    const std::string tasks = "/proc/" + std::to_string(p) + "/task";
    if (DIR* d = opendir(tasks.c_str())) {
      while (dirent* e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        std::ifstream in(tasks + "/" + e->d_name + "/children");
        for (pid_t c; in >> c;) todo.push_back(c);
      }
      closedir(d);
    }
  }
  return out;
}

// kB of a field ("Rss:", "Pss:") in /proc/PID/smaps_rollup.
long Smaps(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/smaps_rollup");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field, 0) == 0) return std::atol(line.c_str() + field.size());
  }
  return 0;
}

const char* g_bin = AGENTBOX_BIN;

class Daemon {
 public:
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
  explicit Daemon(const std::string& root) : root_(root) {
    socket_ = root + "/state/agentbox.sock";
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      int log = open((root + "/daemon.out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(log, 1);
      dup2(log, 2);
      const std::string state = root + "/state", logfile = root + "/daemon.log";
      execl(g_bin, g_bin, "serve", "--state-dir", state.c_str(), "--log-file", logfile.c_str(),
            "--max-sessions", "400", static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 1000; ++i) {
      struct stat st {};
      if (lstat(socket_.c_str(), &st) == 0) {
        agentbox::daemon::Client probe(Endpoint());
        auto r = probe.Call("GET", "/v1/health");
        if (r.ok() && r->status == 200) return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    Die("the daemon did not start; see " + root + "/daemon.out");
  }
  ~Daemon() {
    kill(pid_, SIGTERM);
    int st = 0;
    for (int i = 0; i < 3000 && waitpid(pid_, &st, WNOHANG) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(-pid_, SIGKILL);
    waitpid(pid_, &st, WNOHANG);
  }
  agentbox::daemon::Endpoint Endpoint() const {
    agentbox::daemon::Endpoint e;
    e.unix_socket = socket_;
    return e;
  }
  pid_t pid() const { return pid_; }

 private:
  std::string root_, socket_;
  pid_t pid_ = -1;
};

json Check(agentbox::Result<json> r, const std::string& what) {
  if (!r.ok()) Die(what + ": " + r.status().ToString());
  return *r;
}

std::string Create(agentbox::daemon::Client& c, const std::string& ws) {
  return Check(c.CallJson("POST", "/v1/sessions", {{"workspace", ws}}), "create")["id"];
}

json Exec(agentbox::daemon::Client& c, const std::string& id, const std::string& name, const json& input) {
  json r = Check(c.CallJson("POST", "/v1/sessions/" + id + "/execute", {{"name", name}, {"input", input}}), name);
  if (r.value("is_error", false)) Die(name + " " + input.dump() + " failed: " + r.dump().substr(0, 400));
  return r;
}

// One execute call, timed from the request's send to the answer's last
// byte: the request is serialized before and the answer parsed after (a
// harness's JSON library is not the daemon's time; nlohmann's takes ~10 ms
// per MiB of string here).
json ExecTimed(agentbox::daemon::Client& c, const std::string& id, const std::string& name, const json& input,
               Stats* stats) {
  const std::string body = json{{"name", name}, {"input", input}}.dump();
  const auto t0 = Clock::now();
  auto r = c.Call("POST", "/v1/sessions/" + id + "/execute", body);
  stats->ms.push_back(Ms(Clock::now() - t0));
  if (!r.ok()) Die(name + ": " + r.status().ToString());
  json result = json::parse(r->body, nullptr, false);
  if (r->status != 200 || !result.is_object() || result.value("is_error", false)) {
    Die(name + " failed: HTTP " + std::to_string(r->status) + ": " + r->body.substr(0, 400));
  }
  return result;
}

Stats Time(std::size_t n, const std::function<void()>& f) {
  Stats s;
  for (std::size_t i = 0; i < n; ++i) {
    auto t0 = Clock::now();
    f();
    s.ms.push_back(Ms(Clock::now() - t0));
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t warm_n = 500;
  bool calls_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--warm") == 0 && i + 1 < argc) warm_n = std::strtoul(argv[++i], nullptr, 10);
    else if (std::strcmp(argv[i], "--bin") == 0 && i + 1 < argc) g_bin = argv[++i];
    else if (std::strcmp(argv[i], "--calls") == 0) calls_only = true;
    else Die(std::string("unknown argument ") + argv[i]);
  }
  const std::string root = MakeTemp("agentbox-session-bench-");
  const std::string small_ws = root + "/small";
  MkdirP(small_ws);
  WriteFile(small_ws + "/README", "bench\n");
  // 1 MiB of text lines for read_file.
  {
    std::string mib;
    while (mib.size() < (1u << 20)) mib += "0123456789 the quick brown fox jumps over the lazy dog 0123456789\n";
    mib.resize(1u << 20);
    mib.back() = '\n';
    WriteFile(small_ws + "/one-mib.txt", mib);
    // edit_file's: one marker, swapped back and forth by the edits.
    mib.replace(mib.size() / 2, 7, "@@A@@@@");
    WriteFile(small_ws + "/edit-mib.txt", mib);
  }
  // 10k files in 100 directories.
  const std::string big_ws = root + "/big";
  for (int d = 0; d < 100; ++d) {
    MkdirP(big_ws + "/dir" + std::to_string(d));
    for (int f = 0; f < 100; ++f) {
      WriteFile(big_ws + "/dir" + std::to_string(d) + "/file" + std::to_string(f) + ".txt",
                "file " + std::to_string(d * 100 + f) + "\nsecond line\n");
    }
  }

  std::optional<Daemon> daemon(std::in_place, root);
  agentbox::daemon::Client c(daemon->Endpoint());

  // 0. The HTTP round trip alone (a worker thread, no session work).
  Stats health = Time(500, [&] { Check(c.CallJson("GET", "/v1/health"), "health"); });
  Add("GET /v1/health (round trip)", health, "");

  // 1. Create (lazy).
  std::vector<std::string> idle;
  Stats create = Time(100, [&] { idle.push_back(Create(c, small_ws)); });
  Add("session create (lazy)", create, "<= 1 ms");

  // 2. First execute: the sandbox is provisioned.
  std::size_t provisioned = 0;
  Stats cold = Time(20, [&] { Exec(c, idle[provisioned++], "bash", {{"command", "true"}}); });
  Add("first execute (cold provision)", cold, "");

  // 3. Warm calls, and the anchors.
  const std::string warm = idle[0];
  Exec(c, warm, "bash", {{"command", "true"}});
  Stats warm_true;
  for (std::size_t i = 0; i < warm_n; ++i) ExecTimed(c, warm, "bash", {{"command", "true"}}, &warm_true);
  Add("warm execute bash \"true\"", warm_true, "<= 1.2x bash");
  Stats run_true = Time(calls_only ? 20 : 100, [&] {
    if (RunQuiet({g_bin, "run", "--workspace", small_ws, "--", "/bin/true"}) != 0) Die("agentbox run failed");
  });
  Add("agentbox run -- /bin/true", run_true, "");
  Stats bare = Time(500, [&] { RunQuiet({"/bin/true"}); });
  Add("bare fork+exec /bin/true", bare, "");
  Stats bare_bash = Time(500, [&] { RunQuiet({"/bin/bash", "-c", "true"}); });
  Add("bare bash -c true (anchor)", bare_bash, "");

  // 4. The file tools on 1 MiB, next to their anchor: 2 warm calls plus an
  // in-process copy of 1 MiB (read a file, write another; page cache).
  std::string copy_buf(2u << 20, '\0');
  Stats copy = Time(100, [&] {
    int in = open((small_ws + "/one-mib.txt").c_str(), O_RDONLY | O_CLOEXEC);
    int out = open((root + "/copy-mib.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (in < 0 || out < 0) Die("copy: open");
    ssize_t got = 0, n;
    while ((n = read(in, copy_buf.data() + got, copy_buf.size() - static_cast<std::size_t>(got))) > 0) got += n;
    if (write(out, copy_buf.data(), static_cast<std::size_t>(got)) != got) Die("copy: write");
    close(in);
    close(out);
  });
  Add("copy 1 MiB in-process (anchor)", copy, "");
  std::size_t read_bytes = 0;
  bool read_truncated = false;
  Stats read;
  for (int i = 0; i < 30; ++i) {
    json r = ExecTimed(c, warm, "read_file", {{"path", "one-mib.txt"}}, &read);
    read_bytes = r.value("output", "").size();
    read_truncated = r.value("truncated", false);
  }
  Add("read_file of a 1 MiB file", read, "<= 2w+copy",
      std::to_string(read_bytes) + " bytes returned" + (read_truncated ? " (capped)" : ""));
  std::string mib_content;
  {
    std::ifstream in(small_ws + "/one-mib.txt", std::ios::binary);
    mib_content.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  Stats write;
  for (int i = 0; i < 30; ++i) {
    ExecTimed(c, warm, "write_file", {{"path", "written-mib.txt"}, {"content", mib_content}}, &write);
  }
  Add("write_file of 1 MiB", write, "<= 2w+copy");
  bool marker_a = true;
  Stats edit;
  for (int i = 0; i < 30; ++i) {
    ExecTimed(c, warm, "edit_file",
              {{"path", "edit-mib.txt"}, {"old", marker_a ? "@@A@@@@" : "@@B@@@@"}, {"new", marker_a ? "@@B@@@@" : "@@A@@@@"}},
              &edit);
    marker_a = !marker_a;
  }
  Add("edit_file in a 1 MiB file", edit, "<= 2w+copy");

  Stats code_py, code_js, program50, execute50;
  long rss = 0, pss = 0, private_kib = 0, daemon_rss = 0;
  std::size_t idle_sessions = 0;
  std::vector<pid_t> procs;
  if (!calls_only) {
    // 4b. Code mode: a program's start next to a warm bash call, and 50 tool
    // calls from one program next to 50 execute calls (the model's turns aside).
    const bool has_node = access("/usr/bin/node", X_OK) == 0 || access("/bin/node", X_OK) == 0;
    Exec(c, warm, "run_code", {{"language", "python"}, {"code", "1"}});
    code_py = Time(30, [&] { Exec(c, warm, "run_code", {{"language", "python"}, {"code", "1"}}); });
    Add("run_code python \"1\"", code_py, "", "vs warm bash \"true\" above");
    if (has_node) {
      code_js = Time(30, [&] { Exec(c, warm, "run_code", {{"language", "javascript"}, {"code", "1"}}); });
      Add("run_code javascript \"1\"", code_js, "");
    }
    const std::string fifty =
        "import tools\nn = 0\nfor _ in range(50):\n    n += len(await tools.read_file('README'))\nn\n";
    std::size_t program_bytes = 0, execute_bytes = 0;  // what reaches the model
    program50 = Time(10, [&] {
      program_bytes = Exec(c, warm, "run_code", {{"language", "python"}, {"code", fifty}}).value("output", "").size();
    });
    Add("run_code: 50 read_file bindings", program50, "",
        "one program, start included; " + std::to_string(program_bytes) + " bytes of output returned");
    execute50 = Time(10, [&] {
      execute_bytes = 0;
      for (int i = 0; i < 50; ++i) execute_bytes += Exec(c, warm, "read_file", {{"path", "README"}}).value("output", "").size();
    });
    Add("50 execute read_file calls", execute50, "",
        "one client, back to back; " + std::to_string(execute_bytes) + " bytes of output returned");

    // 5. Snapshot and diff: 10k files, 100 changed before each round.
    const std::string big = Create(c, big_ws);
    Exec(c, big, "bash", {{"command", "true"}});
    Stats snapshot, diff;
    for (int round = 0; round < 10; ++round) {
      Exec(c, big, "bash",
           {{"command", "for d in $(seq 0 99); do echo round" + std::to_string(round) + " >> dir$d/file" +
                            std::to_string(round) + ".txt; done"}});
      auto t0 = Clock::now();
      Check(c.CallJson("POST", "/v1/sessions/" + big + "/snapshot"), "snapshot");
      snapshot.ms.push_back(Ms(Clock::now() - t0));
      t0 = Clock::now();
      Check(c.CallJson("GET", "/v1/sessions/" + big + "/diff"), "diff");
      diff.ms.push_back(Ms(Clock::now() - t0));
    }
    json described = Check(c.CallJson("GET", "/v1/sessions/" + big), "describe");
    Add("snapshot, 10k files, 100 changed", snapshot, "<= 100 ms", "workspace mode " + described.value("mode", "?"));
    Add("diff, 10k files, 100+ changed", diff, "");

    // 6. Memory with 100 idle provisioned sessions.
    while (idle.size() < 100) idle.push_back(Create(c, small_ws));
    for (; provisioned < idle.size(); ++provisioned) Exec(c, idle[provisioned], "bash", {{"command", "true"}});
    procs = Descendants(daemon->pid());
    for (pid_t p : procs) {
      rss += Smaps(p, "Rss:");
      pss += Smaps(p, "Pss:");
      private_kib += Smaps(p, "Private_Clean:") + Smaps(p, "Private_Dirty:");
    }
    idle_sessions = idle.size() + 1;  // and the 10k-file one
    daemon_rss = Smaps(daemon->pid(), "Rss:");
  }

  std::printf("\nagentbox session daemon (unix socket; %zu warm calls; this machine, same run)\n\n", warm_n);
  std::printf("%-36s %5s %10s %10s   %-12s %s\n", "what", "n", "p50 ms", "p99 ms", "target", "");
  for (const auto& r : g_rows) {
    std::printf("%-36s %5zu %10.3f %10.3f   %-12s %s\n", r.what.c_str(), r.n, r.p50, r.p99, r.target.c_str(),
                r.note.c_str());
  }
  auto ratio = [](double a, double b) { return b > 0 ? a / b : 0; };
  // The targets as ratios to their anchors, p50 of this run.
  const double w = warm_true.Percentile(50), bash_p50 = bare_bash.Percentile(50);
  const double file_anchor = 2 * w + copy.Percentile(50);
  std::printf("\nwarm execute bash \"true\" %.3f ms / bare bash -c true %.3f ms: %.2fx (target <= 1.2x)\n", w,
              bash_p50, ratio(w, bash_p50));
  for (const auto& [what, st] : {std::pair<const char*, const Stats*>{"read_file ", &read},
                                 {"write_file", &write}, {"edit_file ", &edit}}) {
    std::printf("%s 1 MiB %8.3f ms / (2 x warm %.3f + copy %.3f = %.3f ms): %.2fx (target <= 1.0x)\n", what,
                st->Percentile(50), w, copy.Percentile(50), file_anchor, ratio(st->Percentile(50), file_anchor));
  }
  std::printf("warm execute / bare fork+exec: %.1fx   agentbox run / warm execute: %.1fx\n",
              ratio(w, bare.Percentile(50)), ratio(run_true.Percentile(50), w));
  if (calls_only) {
    daemon.reset();
    const std::string cleanup = "rm -rf '" + root + "'";
    return std::system(cleanup.c_str()) == 0 ? 0 : 1;
  }
  std::printf("run_code python / warm bash: %.1fx   50 bindings / 50 execute calls: %.2fx\n",
              ratio(code_py.Percentile(50), w), ratio(program50.Percentile(50), execute50.Percentile(50)));
  std::printf("\nmemory, 100 idle provisioned sessions (+1 with 10k files): %zu processes\n", procs.size());
  std::printf("  total PSS %8.1f MiB (target <= 200 MiB)   sum of RSS %8.1f MiB   daemon alone RSS %6.1f MiB\n",
              static_cast<double>(pss) / 1024, static_cast<double>(rss) / 1024,
              static_cast<double>(daemon_rss) / 1024);
  std::printf("  a session's idle world: private %6.0f KiB (target <= 1024 KiB)   PSS %6.0f KiB\n",
              static_cast<double>(private_kib) / static_cast<double>(idle_sessions),
              static_cast<double>(pss) / static_cast<double>(idle_sessions));

  daemon.reset();  // the daemon and its sandboxes stop before their files go
  const std::string cleanup = "rm -rf '" + root + "'";
  return std::system(cleanup.c_str()) == 0 ? 0 : 1;
}
