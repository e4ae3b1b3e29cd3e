#include "battery.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace agentbox::escape {
namespace {

struct Entry {
  std::string test;  // the gtest test that recorded it
  std::string name;
  Decision decision;
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
  if (ContainerMode()) return getuid() == 0 ? "container, root" : "container, unprivileged uid " + std::to_string(getuid());
  if (MicrovmMode()) return getuid() == 0 ? "microvm, root" : "microvm, unprivileged uid " + std::to_string(getuid());
  if (getuid() == 0) return "root";
  const std::string who = "unprivileged uid " + std::to_string(getuid());
  return host_facts::DelegatedDir("memory").empty() ? who : who + ", with a delegated cgroup subtree";
}

std::string CurrentTest() {
  const testing::TestInfo* t = testing::UnitTest::GetInstance()->current_test_info();
  return t ? std::string(t->test_suite_name()) + "." + t->name() : "";
}

// Prints the battery's summary after the last test, and appends it to
// $ESCAPE_SUMMARY_FILE so the test script can show it even when ctest hides
// the output of passing tests. The verdicts and gtest's results are counted
// apart and must agree: a blocked attack is a passed test, a not applicable
// one (or one whose limit the product refused) a skipped test, an escaped or
// otherwise not judged one a failed test.
class Summary : public testing::Environment {
 public:
  void TearDown() override {
    int tried = 0, blocked = 0, escaped = 0, not_applicable = 0, not_judged = 0, awaiting = 0;
    std::ostringstream detail, reasons;
    std::map<std::string, char> expected;  // test → 'p'assed, 's'kipped, 'f'ailed, from the verdicts
    for (const Entry& e : Entries()) {
      ++tried;
      char want = 'p';
      switch (e.decision.verdict) {
        case Verdict::kBlocked: ++blocked; break;
        case Verdict::kEscaped: ++escaped; want = 'f'; break;
        case Verdict::kNotApplicable: ++not_applicable; want = 's'; break;
        case Verdict::kNotJudged: ++not_judged; want = e.decision.skip ? 's' : 'f'; break;
      }
      if (e.decision.verdict != Verdict::kBlocked) {
        reasons << "  " << VerdictName(e.decision.verdict) << ": " << e.test << " (" << e.name
                << "): " << e.decision.why << "\n";
      }
      char& slot = expected[e.test];
      if (slot == 0 || want == 'f' || (want == 's' && slot == 'p')) slot = want;
      // A class this host cannot have (no i386 syscalls at all) awaits nothing.
      if (e.seccomp_layer && !e.seccomp_evidence && e.decision.verdict != Verdict::kNotApplicable) ++awaiting;
      detail << "  " << VerdictName(e.decision.verdict) << " " << e.name << "  [" << e.test << "]"
             << "\n      host:    " << e.host << "\n      inside:  " << e.inside
             << "\n      verdict: " << e.decision.why << (e.note.empty() ? "" : "\n      note:    " + e.note)
             << "\n";
    }
    int compat = 0, compat_passed = 0, compat_skipped = 0;
    int attack_tests = 0, attack_passed = 0, attack_skipped = 0, attack_failed = 0;
    std::ostringstream disagree;
    const testing::UnitTest* u = testing::UnitTest::GetInstance();
    for (int i = 0; i < u->total_test_suite_count(); ++i) {
      const testing::TestSuite* s = u->GetTestSuite(i);
      for (int j = 0; j < s->total_test_count(); ++j) {
        const testing::TestInfo* t = s->GetTestInfo(j);
        if (!t->should_run()) continue;
        const testing::TestResult* r = t->result();
        // A skip is not a pass, and a failure that also skipped is a failure.
        const char got = r->Failed() ? 'f' : r->Skipped() ? 's' : 'p';
        if (std::string(s->name()) == "Compat") {
          ++compat;
          compat_passed += got == 'p';
          compat_skipped += got == 's';
        } else if (std::string(s->name()) == "Attack") {
          ++attack_tests;
          attack_passed += got == 'p';
          attack_skipped += got == 's';
          attack_failed += got == 'f';
          const std::string name = std::string(s->name()) + "." + t->name();
          auto it = expected.find(name);
          if (it == expected.end()) {
            disagree << "  " << name << ": no verdict recorded\n";
          } else if (it->second != got) {
            disagree << "  " << name << ": the verdicts say " << it->second << ", gtest says " << got << "\n";
          }
        }
      }
    }
    std::ostringstream line;
    line << "escape battery (" << Who() << "): " << tried << " attacks tried: " << blocked << " blocked, "
         << escaped << " escaped, " << not_applicable << " not applicable, " << not_judged << " not judged"
         << "; compat " << compat_passed << "/" << compat << " passed";
    if (compat_skipped) line << " (" << compat_skipped << " skipped)";
    std::ostringstream extra;
    extra << "  attack tests passed " << attack_passed << "/" << attack_tests << ", skipped " << attack_skipped
          << ", failed " << attack_failed;
    if (awaiting) extra << "; " << awaiting << " seccomp-layer classes without a seccomp denial in the report";
    extra << "\n" << reasons.str();
    if (!disagree.str().empty()) extra << "  VERDICTS AND TEST RESULTS DISAGREE:\n" << disagree.str();
    const std::string text = detail.str() + line.str() + "\n" + extra.str();
    std::printf("\n--- escape battery verdicts ---\n%s", text.c_str());
    std::fflush(stdout);
    if (const char* f = std::getenv("ESCAPE_SUMMARY_FILE"); f && *f) {
      std::ofstream out(f, std::ios::app);
      out << line.str() << "\n" << extra.str();
    }
    EXPECT_TRUE(disagree.str().empty()) << "the battery's verdicts and gtest's results disagree:\n" << disagree.str();
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

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kBlocked: return "blocked";
    case Verdict::kEscaped: return "ESCAPED";
    case Verdict::kNotApplicable: return "not-applicable";
    case Verdict::kNotJudged: return "NOT-JUDGED";
  }
  return "?";
}

// ESCAPE_ISOLATION=container: every inside run on gVisor (agentbox run
// --isolation container). The seccomp layer's report evidence is then the
// Sentry's refusal (an errno), and no broker or DNS denial exists: the
// sandbox has no network at all.
bool ContainerMode() {
  const char* v = getenv("ESCAPE_ISOLATION");
  return v && std::string(v) == "container";
}

bool MicrovmMode() {
  const char* v = getenv("ESCAPE_ISOLATION");
  return v && std::string(v) == "microvm";
}

Decision Decide(const Facts& f) {
  if (!f.escaped.empty()) return {Verdict::kEscaped, f.escaped};
  // Without the limit it aims at, the attack running to its own bound proves nothing.
  if (!f.refused.empty()) {
    if (f.test_failed) return {Verdict::kNotJudged, "the test failed (see its assertions); " + f.refused};
    return {Verdict::kNotJudged, f.refused, true};
  }
  if (f.inside_ran && f.inside.ok && f.blocked.empty()) {
    return {Verdict::kEscaped, f.kind == Kind::kBoundary
                                   ? "the attack worked inside: " + f.inside.detail
                                   : "a kernel interface the seccomp layer closes was usable inside: " +
                                         f.inside.detail};
  }
  if (f.test_failed) return {Verdict::kNotJudged, "the test failed (see its assertions)"};
  if (!f.not_applicable.empty()) return {Verdict::kNotApplicable, f.not_applicable, true};
  if (!f.inside_ran) return {Verdict::kNotJudged, "the attack was never tried inside"};
  if (f.inside_timed_out) return {Verdict::kNotJudged, "the run inside timed out"};
  if (!f.blocked.empty()) return {Verdict::kBlocked, f.blocked};
  if (!f.inside.present) {
    return {Verdict::kNotJudged, "the probe printed no result inside (exit " + std::to_string(f.inside_status) + ")"};
  }
  if (f.inside.crashed) {
    return {Verdict::kNotJudged,
            "the attempt inside was killed by signal " + std::to_string(f.inside.signal) + ": " + f.inside.detail};
  }
  std::string err = "errno=" + std::to_string(f.inside.err);
  if (f.inside.err > 0) err += " (" + std::string(std::strerror(f.inside.err)) + ")";
  return {Verdict::kBlocked, err + ": " + f.inside.detail};
}

std::string HostRefusal(const Probe& host, const std::string& why) {
  if (host.ok) return "";
  if (!host.present) return why + ": the host check printed no result (" + host.line + ")";
  if (host.crashed && host.signal == SIGSEGV && host.line.find(" i386_unshare ") != std::string::npos) {
    return "the kernel serves no i386 syscalls (int 0x80 dies with SIGSEGV unconfined)";
  }
  if (host.crashed) return why + ": the host check was killed by signal " + std::to_string(host.signal);
  if (host.err == ENOSYS) return "this kernel does not provide it (ENOSYS unconfined): " + host.detail;
  if (host.err == ENOENT) return "this host does not have it (ENOENT unconfined): " + host.detail;
  return why + ": " + host.detail;
}

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
    p.crashed = verdict == "crashed";
    if (err.rfind("errno=", 0) == 0) p.err = std::atoi(err.c_str() + 6);
    if (auto sig = l.find(" signal="); sig != std::string::npos) p.signal = std::atoi(l.c_str() + sig + 8);
    auto d = l.find(" detail=");
    if (d != std::string::npos) p.detail = l.substr(d + 8);
  }
  return p;
}

Attack::Attack(std::string name, Kind kind, bool seccomp_layer)
    : name_(std::move(name)), kind_(kind), seccomp_layer_(seccomp_layer) {
  facts_.kind = kind;
}

Attack::~Attack() {
  facts_.inside = inside_;
  facts_.test_failed = testing::Test::HasFailure();
  const Decision d = Decide(facts_);
  // Only a blocked attack passes: an escape or a verdict that could not be
  // reached fails the test (unless it failed already), and a host on which
  // the attack cannot work, or a limit the product refused, is a skip.
  if (d.verdict == Verdict::kEscaped || (d.verdict == Verdict::kNotJudged && !d.skip)) {
    if (!facts_.test_failed) ADD_FAILURE() << name_ << ": " << VerdictName(d.verdict) << ": " << d.why;
  } else if (d.skip) {
    const std::string msg =
        std::string(d.verdict == Verdict::kNotApplicable ? "not applicable here: " : "not judged: ") + d.why;
    GTEST_MESSAGE_AT_(__FILE__, __LINE__, msg.c_str(), testing::TestPartResult::kSkip);
  }
  std::string host = host_.Describe() + (host_note_.empty() ? "" : "  [" + host_note_ + "]");
  Entries().push_back({CurrentTest(), name_, d, seccomp_layer_, seccomp_evidence_, host, inside_.Describe(), note_});
}

void Attack::NotApplicable(const std::string& why) {
  if (why.empty()) return;
  facts_.not_applicable += (facts_.not_applicable.empty() ? "" : "; ") + why;
}

bool Attack::RequireHost(const Probe& host, const std::string& why) {
  const std::string refusal = HostRefusal(host, why);
  NotApplicable(refusal);
  return refusal.empty();
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
  std::vector<std::string> opts = options;
  if (ContainerMode()) opts.insert(opts.begin(), {"--isolation", "container"});
  if (MicrovmMode()) opts.insert(opts.begin(), {"--isolation", "microvm"});
  if (x.wrapper.empty() && x.stdin_fd < 0 && !x.on_start) {
    run_ = sb.Sh(script, opts, extra_env, timeout_ms);
  } else {
    unlink(sb.report_path().c_str());
    std::vector<std::string> args = {"run", "--report", sb.report_path()};
    args.insert(args.end(), opts.begin(), opts.end());
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
  facts_.inside_ran = true;
  facts_.inside_timed_out = run_.timed_out;
  facts_.inside_status = run_.status;
  inside_ = ParseProbe(run_.out, attack);
  if (!inside_.present) inside_.line = "(no RESULT line) exit " + std::to_string(run_.status);
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
  facts_.escaped += (facts_.escaped.empty() ? "" : "; ") + why;
}

void Attack::Blocked(const std::string& evidence) {
  facts_.blocked += (facts_.blocked.empty() ? "" : "; ") + evidence;
}

void Attack::Refused(const std::string& why) {
  facts_.refused += (facts_.refused.empty() ? "" : "; ") + why;
}

void Attack::ExpectSeccomp(const Probe& inside, int expected_errno, const std::string& syscall, bool reported) {
  if (ContainerMode()) {
    // The Sentry (or the OCI filter inside it) refused it: an errno, no notification.
    seccomp_evidence_ = inside.present && !inside.ok && inside.err != 0;
    EXPECT_TRUE(seccomp_evidence_) << name_ << ": expected gVisor to refuse " << syscall << "\n  inside: "
                                   << inside.Describe();
    note_ += (note_.empty() ? "" : "; ") + std::string("refused inside gVisor: errno ") + std::to_string(inside.err);
    return;
  }
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

void Attack::ExpectDenial(const std::string& facet, const std::string& op, const std::string& target) {
  if (MicrovmMode() && facet == "network") {
    note_ += (note_.empty() ? "" : "; ") + std::string("no network device in the microVM: no ") + facet + "/" + op +
             " denial to report";
    return;
  }
  if (ContainerMode()) {
    // No broker or DNS in a gVisor sandbox: the verdict rests on the probe and the host check.
    note_ += (note_.empty() ? "" : "; ") + std::string("no network in the gVisor sandbox: no ") + facet + "/" + op +
             " denial to report";
    return;
  }
  bool found = false;
  if (run_.report && (*run_.report)["denials"].is_array()) {
    for (const auto& d : (*run_.report)["denials"]) {
      const std::string source = d.value("source", "");
      // The layers that refuse inside the sandbox: the seccomp filter, and
      // the supervisor's connect() broker and DNS that it hands calls to.
      const bool enforcing = source == "seccomp" || source == "broker" || source == "dns";
      found = found || (enforcing && d.value("facet", "") == facet &&
                        d.value("op", "") == op && d.value("target", "") == target);
    }
  }
  EXPECT_TRUE(found) << name_ << ": no " << facet << "/" << op << " denial naming " << target << " in the report\n"
                     << run_.Describe();
}

}  // namespace agentbox::escape
