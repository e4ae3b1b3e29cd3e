#include "battery.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace agentbox::escape {
namespace {

struct Entry {
  std::string name;
  Verdict verdict;
  bool seccomp_layer;
  bool seccomp_evidence;
  std::string host;
  std::string inside;
  std::string note;
};

std::vector<Entry>& Entries() {
  static std::vector<Entry> entries;
  return entries;
}

std::string Who() {
  if (getuid() == 0) return "root";
  return "unprivileged uid " + std::to_string(getuid());
}

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kBlocked: return "blocked";
    case Verdict::kEscaped: return "ESCAPED";
    case Verdict::kReachable: return "reachable";
    case Verdict::kNotJudged: return "not-judged";
  }
  return "?";
}

// Prints the battery's summary after the last test, and appends it to
// $ESCAPE_SUMMARY_FILE so the test script can show it even when ctest hides
// the output of passing tests.
class Summary : public testing::Environment {
 public:
  void TearDown() override {
    int tried = 0, blocked = 0, escaped = 0, reachable = 0, not_judged = 0, awaiting = 0;
    std::ostringstream detail;
    for (const Entry& e : Entries()) {
      ++tried;
      switch (e.verdict) {
        case Verdict::kBlocked: ++blocked; break;
        case Verdict::kEscaped: ++escaped; break;
        case Verdict::kReachable: ++reachable; break;
        case Verdict::kNotJudged: ++not_judged; break;
      }
      if (e.seccomp_layer && !e.seccomp_evidence) ++awaiting;
      detail << "  " << VerdictName(e.verdict) << " " << e.name << "\n      host:   " << e.host
             << "\n      inside: " << e.inside << (e.note.empty() ? "" : "\n      note:   " + e.note) << "\n";
    }
    int compat = 0, compat_passed = 0, attack_tests = 0, attack_passed = 0;
    const testing::UnitTest* u = testing::UnitTest::GetInstance();
    for (int i = 0; i < u->total_test_suite_count(); ++i) {
      const testing::TestSuite* s = u->GetTestSuite(i);
      for (int j = 0; j < s->total_test_count(); ++j) {
        const testing::TestInfo* t = s->GetTestInfo(j);
        if (!t->should_run()) continue;
        const bool passed = t->result()->Passed() || t->result()->Skipped();
        if (std::string(s->name()) == "Compat") {
          ++compat;
          compat_passed += passed;
        } else if (std::string(s->name()) == "Attack") {
          ++attack_tests;
          attack_passed += passed;
        }
      }
    }
    std::ostringstream line;
    line << "escape battery (" << Who() << "): " << tried << " attacks tried, " << blocked << " blocked, "
         << escaped << " escaped";
    if (reachable) line << ", " << reachable << " reachable (kernel interface usable inside, no host effect)";
    if (not_judged) line << ", " << not_judged << " not judged (resource limits refused by this build)";
    line << "; compat " << compat_passed << "/" << compat << " passed";
    std::ostringstream extra;
    extra << "  attack tests passed " << attack_passed << "/" << attack_tests;
    if (awaiting) extra << "; " << awaiting << " seccomp-layer classes without a seccomp denial in the report";
    const std::string text = detail.str() + line.str() + "\n" + extra.str() + "\n";
    std::printf("\n--- escape battery verdicts ---\n%s", text.c_str());
    std::fflush(stdout);
    if (const char* f = std::getenv("ESCAPE_SUMMARY_FILE"); f && *f) {
      std::ofstream out(f, std::ios::app);
      out << line.str() << "\n" << extra.str() << "\n";
    }
  }
};

[[maybe_unused]] testing::Environment* const kSummary = testing::AddGlobalTestEnvironment(new Summary);

void Walk(const std::string& root, const std::string& rel, std::map<std::string, std::string>& out) {
  const std::string path = rel.empty() ? root : root + "/" + rel;
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return;
  if (S_ISLNK(st.st_mode)) {
    char buf[4096];
    ssize_t n = readlink(path.c_str(), buf, sizeof(buf));
    out[rel] = "link:" + std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
    return;
  }
  if (!S_ISDIR(st.st_mode)) {
    out[rel] = "file:" + std::to_string(st.st_mode & 07777) + ":" + e2e::ReadFile(path).value_or("?");
    return;
  }
  // agentbox's own deny-scan cache, written by the supervisor on the host
  // (and ~/.cache, which it creates): not the command's doing.
  if (rel == ".cache/agentbox") return;
  if (rel != ".cache") out[rel] = "dir:" + std::to_string(st.st_mode & 07777);
  DIR* d = opendir(path.c_str());
  if (!d) return;
  std::vector<std::string> names;
  while (struct dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  for (const auto& n : names) Walk(root, rel.empty() ? n : rel + "/" + n, out);
}

std::string Hostname() {
  char buf[256] = "";
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

}  // namespace

std::map<std::string, std::string> SnapshotTree(const std::string& root) {
  std::map<std::string, std::string> out;
  Walk(root, "", out);
  return out;
}

std::string ProbeBin() {
  const char* p = std::getenv("ESCAPE_PROBE");
  return p && *p ? p : ESCAPE_PROBE_DEFAULT;
}

Probe ParseProbe(const std::string& out, const std::string& attack) {
  Probe p;
  const std::string prefix = "RESULT " + attack + " ";
  for (const std::string& l : e2e::Lines(out)) {
    if (l.rfind(prefix, 0) != 0) continue;
    if (p.present && (p.ok || l.rfind(prefix + "ok ", 0) != 0)) continue;  // the first line, or the first "ok"
    p = Probe{};
    p.present = true;
    p.line = l;
    std::istringstream in(l.substr(prefix.size()));
    std::string verdict, err;
    in >> verdict >> err;
    p.ok = verdict == "ok";
    if (err.rfind("errno=", 0) == 0) p.err = std::atoi(err.c_str() + 6);
    auto d = l.find(" detail=");
    if (d != std::string::npos) p.detail = l.substr(d + 8);
  }
  return p;
}

Attack::Attack(std::string name, Kind kind, bool seccomp_layer)
    : name_(std::move(name)), kind_(kind), seccomp_layer_(seccomp_layer) {}

Attack::~Attack() {
  Verdict v = Verdict::kBlocked;
  if (escaped_ || (inside_ok_ && kind_ == Kind::kBoundary)) v = Verdict::kEscaped;
  else if (inside_ok_) v = Verdict::kReachable;
  else if (not_judged_) v = Verdict::kNotJudged;
  if (!inside_ran_ && !not_judged_) v = Verdict::kNotJudged;
  std::string host = host_.Describe() + (host_note_.empty() ? "" : "  [" + host_note_ + "]");
  Entries().push_back({name_, v, seccomp_layer_, seccomp_evidence_, host, inside_.Describe(), note_});
}

Probe Attack::Host(const Sandbox& sb, const std::vector<std::string>& args,
                   const std::vector<std::string>& extra_env, const Extra& x) {
  Command c;
  c.argv = x.wrapper;
  c.argv.push_back(ProbeBin());
  c.argv.insert(c.argv.end(), args.begin(), args.end());
  c.cwd = sb.ws();
  c.env = sb.Env(extra_env);
  c.stdin_fd = x.stdin_fd;
  e2e::Process p(c);
  if (x.on_start) x.on_start(p.pid());
  RunResult r = p.Wait();
  host_ = ParseProbe(r.out, args.empty() ? "" : args[0]);
  if (!host_.present) host_.line = "(no RESULT line) " + r.Describe();
  return host_;
}

std::string Attack::Stage(const Sandbox& sb) {
  const std::string dst = sb.ws() + "/escape_probe";
  if (!e2e::Exists(dst)) {
    auto bin = e2e::ReadFile(ProbeBin());
    if (!bin) throw std::runtime_error("cannot read the probe " + ProbeBin());
    e2e::WriteFile(dst, *bin, 0755);
  }
  return "./escape_probe";
}

Probe Attack::Inside(const Sandbox& sb, const std::vector<std::string>& args,
                     const std::vector<std::string>& options, const std::vector<std::string>& extra_env,
                     int timeout_ms, const Extra& x) {
  std::string script = "exec " + Stage(sb);
  for (const auto& a : args) {
    std::string q = "'";
    for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    script += " " + q + "'";
  }
  return InsideSh(sb, script, args.empty() ? "" : args[0], options, extra_env, timeout_ms, x);
}

Probe Attack::InsideSh(const Sandbox& sb, const std::string& script, const std::string& attack,
                       const std::vector<std::string>& options, const std::vector<std::string>& extra_env,
                       int timeout_ms, const Extra& x) {
  Stage(sb);
  const auto home_before = SnapshotTree(sb.home());
  const auto git_before = SnapshotTree(sb.ws() + "/.git/hooks");
  const auto config_before = e2e::ReadFile(sb.ws() + "/.git/config");
  const std::string host_before = Hostname();
  if (x.wrapper.empty() && x.stdin_fd < 0 && !x.on_start) {
    run_ = sb.Sh(script, options, extra_env, timeout_ms);
  } else {
    unlink(sb.report_path().c_str());
    std::vector<std::string> args = {"run", "--report", sb.report_path()};
    args.insert(args.end(), options.begin(), options.end());
    args.insert(args.end(), {"--", "sh", "-c", script});
    Command c = sb.AgentboxCommand(args, extra_env);
    c.argv.insert(c.argv.begin(), x.wrapper.begin(), x.wrapper.end());
    c.stdin_fd = x.stdin_fd;
    c.timeout_ms = timeout_ms;
    e2e::Process p(c);
    if (x.on_start) x.on_start(p.pid());
    run_ = p.Wait();
    if (auto text = e2e::ReadFile(sb.report_path())) {
      auto j = nlohmann::json::parse(*text, nullptr, false);
      if (!j.is_discarded()) run_.report = std::move(j);
    }
  }
  inside_ran_ = true;
  inside_ = ParseProbe(run_.out, attack);
  if (!inside_.present) inside_.line = "(no RESULT line) exit " + std::to_string(run_.status);
  inside_ok_ = inside_.ok;
  EXPECT_EQ(home_before, SnapshotTree(sb.home())) << name_ << ": the fake HOME changed\n" << run_.Describe();
  EXPECT_EQ(git_before, SnapshotTree(sb.ws() + "/.git/hooks")) << name_ << ": .git/hooks changed";
  EXPECT_EQ(config_before, e2e::ReadFile(sb.ws() + "/.git/config")) << name_ << ": .git/config changed";
  EXPECT_EQ(host_before, Hostname()) << name_ << ": the host's hostname changed";
  if (home_before != SnapshotTree(sb.home()) || config_before != e2e::ReadFile(sb.ws() + "/.git/config") ||
      git_before != SnapshotTree(sb.ws() + "/.git/hooks") || host_before != Hostname()) {
    Escaped("the host changed");
  }
  return inside_;
}

void Attack::Escaped(const std::string& why) {
  escaped_ = true;
  note_ += (note_.empty() ? "" : "; ") + why;
}

void Attack::NotJudged(const std::string& why) {
  not_judged_ = true;
  note_ += (note_.empty() ? "" : "; ") + why;
}

void Attack::ExpectSeccomp(const Probe& inside, int expected_errno, const std::string& syscall, bool reported) {
  if (!reported) {
    bool filter = false;
    if (run_.report) {
      const auto& m = (*run_.report)["enforcement"]["facets"]["syscalls"]["mechanisms"];
      if (m.is_array()) {
        for (const auto& x : m) filter = filter || x == "seccomp-bpf";
      }
    }
    seccomp_evidence_ = filter && inside.err == expected_errno;
    EXPECT_EQ(inside.err, expected_errno) << name_ << ": expected the seccomp filter's errno " << expected_errno
                                          << "\n  inside: " << inside.Describe();
    EXPECT_TRUE(filter) << name_ << ": the report does not list seccomp-bpf among the syscalls mechanisms\n"
                        << run_.Describe();
    note_ += (note_.empty() ? "" : "; ") + std::string("answered inside the filter: no denial entry by design");
    return;
  }
  EXPECT_EQ(inside.err, expected_errno) << name_ << ": expected the seccomp filter's errno " << expected_errno
                                        << " from " << syscall << "\n  inside: " << inside.Describe();
  bool found = false;
  if (run_.report && (*run_.report)["denials"].is_array()) {
    for (const auto& d : (*run_.report)["denials"]) {
      if (d.value("source", "") == "seccomp" && e2e::Contains(d.dump(), syscall)) found = true;
    }
  }
  seccomp_evidence_ = found;
  EXPECT_TRUE(found) << name_ << ": no denial with source \"seccomp\" naming " << syscall
                     << " in the report (the seccomp layer reports what it refused)\n"
                     << run_.Describe();
}

}  // namespace agentbox::escape
