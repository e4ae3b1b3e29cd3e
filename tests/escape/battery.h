// The escape battery's framework: the attack probe, per-attack verdicts and
// the summary line.
//
// Each attack test runs the same probe binary twice: on the host, where the
// attack is expected to work (so the test is real), and inside `agentbox run`,
// where it must be blocked. The probe prints
//   RESULT <attack> ok|blocked errno=<n> detail=<text>
//   RESULT <attack> crashed errno=0 signal=<n> detail=<text>
// and the test turns the pair into one of four verdicts:
//   blocked         the attack's effect was refused inside, shown by the errno
//                   the probe got or by a check of the host object it aimed at
//   escaped         it crossed the boundary: a secret read, a host file,
//                   process, socket or setting reached or changed, or a kernel
//                   interface the seccomp layer closes was usable inside
//   not applicable  the attack cannot be shown to work on this host (the host
//                   check, run unconfined, failed for the host's own reason)
//   not judged      nothing can be concluded: the probe crashed or timed out
//                   or printed nothing, the test failed, or the product
//                   refused (fail closed) the limit the attack is aimed at
// A test whose verdict is blocked passes; not applicable and the product's
// refusal are recorded as skips with the reason; escaped and every other not
// judged fail the test. The summary counts each and checks that they agree
// with gtest's own results.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "harness.h"

namespace agentbox::escape {

using e2e::Command;
using e2e::RunResult;
using e2e::Sandbox;

// The probe binary: $ESCAPE_PROBE, else the one built beside this test.
std::string ProbeBin();

// ESCAPE_ISOLATION=container: every inside run is on gVisor (--isolation container).
bool ContainerMode();
// ESCAPE_ISOLATION=microvm: every inside run is in a QEMU microVM (--isolation
// microvm): the guest applies the os plan again, with no network device.
bool MicrovmMode();

struct Probe {
  bool present = false;  // a RESULT line for the attack was printed
  bool ok = false;       // the attack worked
  bool crashed = false;  // the attempt was killed by a signal (neither ok nor blocked)
  int signal = 0;        // that signal
  int err = -1;
  std::string detail;
  std::string line;
  std::string Describe() const { return present ? line : "(no RESULT line)"; }
};
// The RESULT line for `attack` in `out`.
Probe ParseProbe(const std::string& out, const std::string& attack);

enum class Kind {
  kBoundary,  // "ok" inside means an escape
  kSurface,   // "ok" inside means a kernel interface is reachable
};

enum class Verdict { kBlocked, kEscaped, kNotApplicable, kNotJudged };
const char* VerdictName(Verdict v);

// Everything a verdict is decided from (kept apart from Attack so the rules
// have unit tests of their own: battery_test.cc).
struct Facts {
  Kind kind = Kind::kBoundary;
  bool inside_ran = false;
  bool inside_timed_out = false;
  int inside_status = -1;
  Probe inside;
  std::string escaped;         // a host check saw the boundary crossed
  std::string blocked;         // a host check that proves the effect was refused
  std::string not_applicable;  // the host's reason the attack cannot work here
  std::string refused;         // the product refused the limit the attack aims at
  bool test_failed = false;
};
struct Decision {
  Verdict verdict;
  std::string why;
  bool skip = false;  // the test is recorded as skipped with `why`
};
Decision Decide(const Facts& f);

// The host check of an attack that the host itself may forbid (privileges,
// kernel features, devices): the reason it cannot be shown here, or "" when
// the host check worked. A crash of int 0x80 means the kernel serves no i386
// syscalls.
std::string HostRefusal(const Probe& host, const std::string& why);

// How to start a run when the plain Sh() is not enough.
struct Extra {
  std::vector<std::string> wrapper;          // prepended to the agentbox (or probe) argv
  int stdin_fd = -1;                         // the child's stdin
  std::function<void(pid_t)> on_start;       // called with the child's pid once started
};

// One attack class. The destructor records the verdict for the summary.
class Attack {
 public:
  Attack(std::string name, Kind kind, bool seccomp_layer = false);
  ~Attack();

  // The probe on the host, in the workspace, with the sandbox's environment.
  Probe Host(const Sandbox& sb, const std::vector<std::string>& args,
             const std::vector<std::string>& extra_env = {}, const Extra& x = {});
  // The host result, for the record: how the host check was made.
  void HostNote(const std::string& why) { host_note_ = why; }
  // The attack cannot be shown to work on this host, for `why` (a host fact,
  // checked without agentbox). The inside run still happens and an escape
  // still fails the test; otherwise the test is skipped as not applicable.
  void NotApplicable(const std::string& why);
  // NotApplicable(HostRefusal(host, why)) when the host check failed.
  // Returns true when the host check worked.
  bool RequireHost(const Probe& host, const std::string& why);
  // A host result obtained some other way (a wrapper, another uid).
  void SetHost(const Probe& p) { host_ = p; }

  // The probe inside `agentbox run`, staged into the workspace. Checks that
  // the fake HOME, the workspace's .git/config and .git/hooks and the host's
  // hostname are unchanged afterwards.
  Probe Inside(const Sandbox& sb, const std::vector<std::string>& args,
               const std::vector<std::string>& options = {},
               const std::vector<std::string>& extra_env = {}, int timeout_ms = 30000,
               const Extra& x = {});
  // The same with an arbitrary command (sh -c script) that prints RESULT lines.
  Probe InsideSh(const Sandbox& sb, const std::string& script, const std::string& attack,
                 const std::vector<std::string>& options = {},
                 const std::vector<std::string>& extra_env = {}, int timeout_ms = 30000,
                 const Extra& x = {});
  const RunResult& run() const { return run_; }

  // Overrides the verdict the inside probe implies.
  void Escaped(const std::string& why);
  // The effect was refused, as `evidence` (a check of the host object) shows.
  void Blocked(const std::string& evidence);
  // The product refused (fail closed) the limit this attack is aimed at.
  void Refused(const std::string& why);

  // For attacks the seccomp layer owns: the inside errno is `expected_errno`
  // and the report lists a denial with source "seccomp" naming `syscall`.
  // `reported` false: the filter answers this one itself, without telling the
  // supervisor (clone3's ENOSYS, a foreign architecture); then the evidence
  // is the errno and "seccomp-bpf" among the syscalls facet's mechanisms.
  void ExpectSeccomp(const Probe& inside, int expected_errno, const std::string& syscall, bool reported = true);

  // The report names the refusal: a denial from a layer inside (source
  // "seccomp", or the supervisor's "broker" or "dns" the filter hands calls
  // to) with these facet, op and target.
  void ExpectDenial(const std::string& facet, const std::string& op, const std::string& target);

  static std::string Stage(const Sandbox& sb);  // copies the probe into the workspace

 private:
  std::string name_;
  Kind kind_;
  bool seccomp_layer_;
  Facts facts_;
  bool seccomp_evidence_ = false;
  std::string note_;
  std::string host_note_;
  Probe host_;
  Probe inside_;
  RunResult run_;
};

// Snapshot of a tree: relative path → content (or link target / "dir").
std::map<std::string, std::string> SnapshotTree(const std::string& root);

}  // namespace agentbox::escape
