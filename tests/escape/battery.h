// The escape battery's framework: the attack probe, per-attack verdicts and
// the summary line.
//
// Each attack test runs the same probe binary twice: on the host, where the
// attack is expected to work (so the test is real), and inside `agentbox run`,
// where it must be blocked. The probe prints
//   RESULT <attack> ok|blocked errno=<n> detail=<text>
// and the test turns the pair into a verdict:
//   blocked    the attack failed inside and nothing changed on the host
//   escaped    it crossed the boundary: a secret read, a host file, process,
//              socket or setting reached or changed
//   reachable  a kernel interface the seccomp layer is meant to close was
//              usable inside, with no effect on the host
//   not judged a resource attack whose limit this build refuses to apply
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

struct Probe {
  bool present = false;  // a RESULT line for the attack was printed
  bool ok = false;       // the attack worked
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

enum class Verdict { kBlocked, kEscaped, kReachable, kNotJudged };

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
  // The host result, for the record: why this class proves less here.
  void HostNote(const std::string& why) { host_note_ = why; }
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
  void Blocked() { inside_ok_ = false; }
  void NotJudged(const std::string& why);

  // For attacks the seccomp layer owns: the inside errno is `expected_errno`
  // and the report lists a denial with source "seccomp" naming `syscall`.
  // `reported` false: the filter answers this one itself, without telling the
  // supervisor (clone3's ENOSYS, a foreign architecture); then the evidence
  // is the errno and "seccomp-bpf" among the syscalls facet's mechanisms.
  void ExpectSeccomp(const Probe& inside, int expected_errno, const std::string& syscall, bool reported = true);

  static std::string Stage(const Sandbox& sb);  // copies the probe into the workspace

 private:
  std::string name_;
  Kind kind_;
  bool seccomp_layer_;
  bool inside_ran_ = false;
  bool inside_ok_ = false;
  bool escaped_ = false;
  bool not_judged_ = false;
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
