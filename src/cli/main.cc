// agentbox: the command line (DESIGN §2).
#include <fcntl.h>
#include <limits.h>
#include <sys/random.h>
#include <termios.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "agentbox/confine.h"
#include "agentbox/diagnosis.h"
#include "agentbox/host_caps.h"
#include "agentbox/outcome.h"
#include "agentbox/plan.h"
#include "agentbox/policy.h"
#include "agentbox/run.h"
#include "cli/report_sink.h"
#include "cli/subcommand.h"
#include "linux/cgroup_delegation.h"
#include "linux/cgroups.h"
#include "linux/microvm.h"
#include "linux/phases.h"
#include "supervise/approver.h"
#include "supervise/escalation_round.h"
#include "supervise/gvisor_world.h"
#include "supervise/microvm_run.h"
#include "supervise/systemd_scope.h"
#if !AGENTBOX_CORE_ONLY
#include "session/code_mode.h"
#include "session/remote_world.h"
#include "session/world.h"
#endif
#include "linux/random.h"
#include "linux/user_dirs.h"
#include "linux/workspace_fs.h"
#include "report/report_json.h"

namespace agentbox::cli {

#if AGENTBOX_CORE_ONLY
// What agentbox-core (the binary the demo builds first) leaves out, said
// wherever it is asked for.
constexpr const char* kNoSessions =
    "this build has no sessions, daemon, MCP server or Kubernetes objects; the agentbox binary has them "
    "(scripts/build.sh builds it)";
#endif
namespace {

using nlohmann::json;

// Flags shared by `run`, `wrap` and `policy explain`.
struct PolicyFlags {
  std::string policy_file;
  std::string mode;
  std::string require;
  std::string workspace;
  std::vector<std::string> allow_domains;
  std::string timeout;
  std::string kill_grace;
  std::string memory;
  std::optional<std::uint64_t> max_processes;
  std::optional<double> cpus;
  std::vector<std::string> env;
  std::string backend;
  std::string isolation;

  void Register(CLI::App* app, bool full) {
    app->add_option("--policy", policy_file, "policy file (YAML)");
    app->add_option("--mode", mode, "read-only | workspace-write | danger-full-access");
    app->add_option("--workspace", workspace, "workspace directory (default: current directory)");
    if (!full) return;
    app->add_option("--backend", backend, "auto | namespaces | landlock (default: auto)");
    app->add_option("--isolation", isolation, "os | container | microvm: the policy's sandbox.isolation, overridden");
    app->add_option("--require", require, "full | partial (default: the policy's, else full)");
    // One value per flag, repeated for more: a second word is the command's,
    // even without `--`.
    app->add_option("--allow-domain", allow_domains, "allow egress to PATTERN (repeatable)")
        ->allow_extra_args(false);
    app->add_option("--timeout", timeout, "wall clock limit, e.g. 30s, 5m");
    app->add_option("--kill-grace", kill_grace, "after SIGTERM at the deadline, wait this long before killing (default 2s)");
    app->add_option("--memory", memory, "memory ceiling, e.g. 512Mi, 2Gi");
    app->add_option("--max-processes", max_processes, "process limit");
    app->add_option("--cpus", cpus, "CPU ceiling in cores");
    app->add_option("--env", env, "pass NAME, or set NAME=VALUE (repeatable)")
        ->allow_extra_args(false);
  }
};

void Error(const std::string& msg) { std::fprintf(stderr, "agentbox: %s\n", msg.c_str()); }

std::string Nonce() { return linux::RandomHex(8); }

Result<Policy> BuildPolicy(const PolicyFlags& f) {
  PolicyOverrides o;
  if (!f.mode.empty()) {
    o.mode = ParseMode(f.mode);
    if (!o.mode) {
      return Status::Error("policy", "--mode: '" + f.mode +
                                         "' is not one of read-only, workspace-write, danger-full-access");
    }
  }
  if (!f.require.empty()) {
    if (f.require == "full") {
      o.require = Requirement::kFull;
    } else if (f.require == "partial") {
      o.require = Requirement::kPartial;
    } else {
      return Status::Error("policy", "--require: '" + f.require + "' is not full or partial");
    }
  }
  o.allow_domains = f.allow_domains;
  if (!f.timeout.empty()) {
    auto ms = ParseDurationMs(f.timeout);
    if (!ms.ok()) return Status::Error("policy", "--timeout: " + ms.status().message());
    o.timeout_ms = *ms;
  }
  if (!f.kill_grace.empty()) {
    auto ms = ParseDurationMs(f.kill_grace);
    if (!ms.ok()) return Status::Error("policy", "--kill-grace: " + ms.status().message());
    o.kill_grace_ms = *ms;
  }
  if (!f.memory.empty()) {
    auto bytes = ParseSize(f.memory);
    if (!bytes.ok()) return Status::Error("policy", "--memory: " + bytes.status().message());
    o.memory_bytes = *bytes;
  }
  o.max_processes = f.max_processes;
  o.cpus = f.cpus;
  o.env = f.env;

  const bool from_file = !f.policy_file.empty();
  Result<Policy> base = from_file ? LoadPolicyFile(f.policy_file) : PresetFor(Mode::kWorkspaceWrite);
  if (!base.ok()) return base;
  const bool overridden = o.mode || o.require || !o.allow_domains.empty() || o.timeout_ms || o.kill_grace_ms ||
                          o.memory_bytes || o.max_processes || o.cpus || !o.env.empty();
  auto p = ApplyOverrides(std::move(*base), o, from_file);
  if (!p.ok()) return p;
  if (!f.isolation.empty()) {
    // The rungs a run can take; the others are refused by name when asked for.
    bool known = false;
    for (Isolation i : {Isolation::kHost, Isolation::kOs, Isolation::kContainer, Isolation::kMicrovm,
                        Isolation::kRemote}) {
      if (f.isolation == ToString(i)) {
        p->sandbox.isolation = i;
        known = true;
      }
    }
    if (!known) {
      return Status::Error("policy", "--isolation: '" + f.isolation +
                                         "' is not one of host, os, container, microvm, remote");
    }
  }
  // The report's hash names what was in force: with flags on top, the
  // effective policy (derived by PolicyDigest() when a report needs it).
  if (overridden || !f.isolation.empty()) p->sha256.clear();
  return p;
}

Result<BackendChoice> ParseBackend(const std::string& s) {
  if (s.empty() || s == "auto") return BackendChoice::kAuto;
  if (s == "namespaces") return BackendChoice::kNamespaces;
  if (s == "landlock") return BackendChoice::kLandlock;
  return Status::Error("invocation", "--backend: '" + s + "' is not auto, namespaces or landlock");
}

Result<Invocation> BuildInvocation(const PolicyFlags& f) {
  Invocation inv;
  auto backend = ParseBackend(f.backend);
  if (!backend.ok()) return backend.status();
  inv.backend = *backend;
  if (const char* run = getenv("XDG_RUNTIME_DIR"); run && *run == '/' && access(run, W_OK | X_OK) == 0) {
    inv.runtime_dir = run;
  }
  char cwd[PATH_MAX];
  if (!getcwd(cwd, sizeof(cwd))) return Status::Errno("invocation", "getcwd");
  inv.cwd = RealPath(cwd);
  std::string ws = f.workspace.empty() ? std::string(cwd) : f.workspace;
  inv.workspace = RealPath(ws);
  if (inv.workspace.empty()) return Status::Errno("workspace", "realpath", ws);
  inv.home = linux::HomeDir();
  if (!inv.home.empty()) {
    std::string real = RealPath(inv.home);
    if (!real.empty()) inv.home = real;
  }
  inv.self_exe = RealPath("/proc/self/exe");
  inv.cache_dir = linux::CacheDir(inv.home);
  inv.own_dirs = linux::OwnDirs(inv.home);
  inv.nonce = Nonce();
  inv.workspace_fs = linux::ProbeWorkspaceFs(inv.workspace);
  return inv;
}


// `run --systemd-scope` (docs/delegation.md): re-executes under systemd-run
// in a scope systemd delegates to us, or, once re-executed, moves into the
// scope's leaf so that the run's cgroups get its controllers. Returns the
// exit status when the run must not go on here (-1: go on).
int SystemdScope(int argc, char** argv) {
  auto probe = supervise::ProbeSystemdScope(supervise::CurrentEnvironment());
  switch (probe.answer) {
    case supervise::SystemdScopeProbe::Answer::kUnavailable:
      Error("--systemd-scope: " + probe.reason);
      return kExitSandbox;
    case supervise::SystemdScopeProbe::Answer::kAlreadyInScope: {
      if (Status s = linux::EnterDelegatedScope(linux::CgroupFs(), geteuid()); !s.ok()) {
        Error(s.message());
        return kExitSandbox;
      }
      return -1;
    }
    case supervise::SystemdScopeProbe::Answer::kReexec:
      break;
  }
  std::vector<std::string> args(argv + 1, argv + argc);
  auto full = supervise::SystemdScopeArgv(probe.systemd_run, RealPath("/proc/self/exe"), args);
  std::vector<char*> cargv;
  for (auto& a : full) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  // The mark that stops a second re-execution (a loop) in the child.
  setenv(supervise::kSystemdScopeEnv, "1", 1);
  execv(probe.systemd_run.c_str(), cargv.data());
  Error("--systemd-scope: execv(" + probe.systemd_run + "): " + std::strerror(errno));
  return kExitSandbox;
}

// `agentbox gc`: what killed supervisors left behind.
int CmdGc(bool quiet) {
  for (const auto& path : CollectGarbage()) {
    if (!quiet) std::printf("removed %s\n", path.c_str());
  }
  return 0;
}

void WriteReport(const ReportSink& sink, const Outcome& outcome) {
  if (!sink.wanted()) return;
  if (Status s = sink.Write(ToJson(outcome) + "\n"); !s.ok()) Error("could not write the report: " + s.message());
}

// The report with what `--on-denial ask` adds (docs/report.md,
// "escalations"): every offer and decision, and, after a re-run, the first
// attempt's outcome and denials.
void WriteReport(const ReportSink& sink, const Outcome& outcome, const std::vector<supervise::EscalationRecord>& records,
                 const std::optional<Outcome>& first_attempt) {
  if (!sink.wanted()) return;
  json j = ToJsonValue(outcome);
  j["escalations"] = supervise::EscalationsJson(records);
  if (first_attempt) j["first_attempt"] = supervise::FirstAttemptJson(*first_attempt);
  if (Status s = sink.Write(j.dump(2) + "\n"); !s.ok()) Error("could not write the report: " + s.message());
}

void Summarise(const Outcome& o) {
  switch (o.kind) {
    case OutcomeKind::kSandboxError:
      Error("sandbox error [stage=" + (o.error ? o.error->stage : "?") + "]: " + (o.error ? o.error->message : "") +
            " (nothing was run, or its setup broke; exit 125)");
      break;
    case OutcomeKind::kTimedOut:
      Error("timed_out: " + (o.error ? o.error->message : std::string("deadline reached")) + " (exit 124)");
      break;
    case OutcomeKind::kOomKilled: {
      // One line, as for a timeout: the memory limit ended it, not the code.
      std::string what = "oom_killed";
      if (o.usage.limits.memory_max_bytes) {
        what += " at the memory limit of " + std::to_string(*o.usage.limits.memory_max_bytes / (1024 * 1024)) + " MiB";
      }
      if (o.usage.oom_kills) what += " (" + std::to_string(*o.usage.oom_kills) + " OOM kill(s) in the sandbox's cgroup)";
      Error(what + " (exit 137)");
      break;
    }
    case OutcomeKind::kSandboxDenied:
      for (const auto& d : o.denials) {
        Error("sandbox_denied: " + d.op + " " + d.target + ": " + d.reason);
      }
      break;
    default:
      if (o.error && o.error->stage == "exec") Error(o.error->message);
      break;
  }
}

// Flags for the egress proxy, on `run`, on `wrap` (carried in the argv it
// prints) and on its `__exec` side.
struct NetworkFlags {
  std::string ask_command;
  std::string network_log;
  std::string ask_timeout;

  void Register(CLI::App* app) {
    app->add_option("--ask-command", ask_command,
                    "on_unknown_domain: ask: run PROG per question ({\"host\",\"port\"} on stdin; answers "
                    "allow/always/deny); without it, the controlling terminal asks, else unknown domains are denied");
    app->add_option("--ask-timeout", ask_timeout, "a question unanswered this long is a deny (default 60s)");
    app->add_option("--network-log", network_log, "write every proxied connection to FILE (JSON lines)");
  }

  // Into `opts`; false (after saying why) when a value is bad.
  bool Apply(RunOptions* opts) const {
    opts->ask_command = ask_command;
    opts->network_log = network_log;
    if (!ask_timeout.empty()) {
      auto ms = ParseDurationMs(ask_timeout);
      if (!ms.ok() || *ms == 0) {
        Error("--ask-timeout: " + (ms.ok() ? std::string("must be longer than 0") : ms.status().message()));
        return false;
      }
      opts->ask_timeout_ms = *ms;
    }
    return true;
  }

  // As arguments for `__exec`, with paths made absolute: the harness may
  // start the wrapped argv from another directory.
  std::vector<std::string> ForExec() const {
    std::vector<std::string> args;
    auto absolute = [](const std::string& p) {
      std::error_code ec;
      auto abs = std::filesystem::absolute(p, ec);
      return ec ? p : abs.lexically_normal().string();
    };
    if (!ask_command.empty()) {
      args.push_back("--ask-command");
      args.push_back(ask_command.find('/') == std::string::npos ? ask_command : absolute(ask_command));
    }
    if (!ask_timeout.empty()) args.insert(args.end(), {"--ask-timeout", ask_timeout});
    if (!network_log.empty()) args.insert(args.end(), {"--network-log", absolute(network_log)});
    return args;
  }
};

// `run --workspace-overlay [--apply WHEN]`.
struct OverlayFlags {
  bool overlay = false;
  std::string apply;

  void Register(CLI::App* app) {
    app->add_flag("--workspace-overlay", overlay,
                  "write into a capped upper layer (tmpfs of disk_gib, default 1Gi) over the workspace, applied "
                  "at the end (namespaces backend)");
    app->add_option("--apply", apply, "with --workspace-overlay: on-success (default) | always | never");
  }

  // Into `inv`; false (after saying why) when the flags do not fit together.
  bool Apply(Invocation* inv) const {
    if (!apply.empty() && !overlay) {
      Error("--apply: only with --workspace-overlay");
      return false;
    }
    if (!overlay) return true;
    auto when = ParseOverlayApply(apply.empty() ? "on-success" : apply);
    if (!when) {
      Error("--apply: '" + apply + "' is not on-success, always or never");
      return false;
    }
    inv->workspace_overlay = *when;
    return true;
  }
};

// `run --on-denial deny|ask [--approve-command PROG] [--approve-timeout T]`.
struct DenialFlags {
  std::string on_denial;
  std::string approve_command;
  std::string approve_timeout;

  bool ask = false;
  std::chrono::milliseconds timeout = supervise::kDefaultApproveTimeout;

  void Register(CLI::App* app) {
    app->add_option("--on-denial", on_denial,
                    "deny (default) | ask: after the command, ask for each escalation offer within "
                    "on_violation.max_grant, then run it once more with the grants approved");
    app->add_option("--approve-command", approve_command,
                    "with --on-denial ask: PROG decides each grant (the request as JSON on stdin; answers "
                    "once/session/deny); without it, the controlling terminal asks");
    app->add_option("--approve-timeout", approve_timeout, "a grant not decided this long is a deny (default 60s)");
  }

  // Parses the values; false (after saying why) when they do not fit.
  bool Apply() {
    if (on_denial.empty() || on_denial == "deny") {
      ask = false;
    } else if (on_denial == "ask") {
      ask = true;
    } else {
      Error("--on-denial: '" + on_denial + "' is not deny or ask");
      return false;
    }
    if (!ask && (!approve_command.empty() || !approve_timeout.empty())) {
      Error(std::string(approve_command.empty() ? "--approve-timeout" : "--approve-command") +
            ": only with --on-denial ask");
      return false;
    }
    if (!approve_timeout.empty()) {
      auto ms = ParseDurationMs(approve_timeout);
      if (!ms.ok() || *ms == 0) {
        Error("--approve-timeout: " + (ms.ok() ? std::string("must be longer than 0") : ms.status().message()));
        return false;
      }
      timeout = std::chrono::milliseconds(*ms);
    }
    return true;
  }

  // The approver: the program when given, else the terminal.
  supervise::Approve Approver() const {
    if (!approve_command.empty()) {
      return [argv = std::vector<std::string>{approve_command}, t = timeout](const supervise::ApprovalRequest& r) {
        return supervise::DecideByCommand(argv, r, t);
      };
    }
    return [t = timeout](const supervise::ApprovalRequest& r) { return supervise::DecideOnTerminal(r, t); };
  }
};

// run --tty on a terminal: ours is raw for the run, so every key (^C, ^Z
// and ^D included) reaches the sandbox's pty, whose line discipline does
// what a terminal does; restored when the run ends.
class RawTerminal {
 public:
  explicit RawTerminal(int fd) : fd_(fd) {
    if (!isatty(fd_) || tcgetattr(fd_, &saved_) != 0) return;
    struct termios raw = saved_;
    cfmakeraw(&raw);
    active_ = tcsetattr(fd_, TCSADRAIN, &raw) == 0;
  }
  ~RawTerminal() {
    if (active_) tcsetattr(fd_, TCSADRAIN, &saved_);
  }
  RawTerminal(const RawTerminal&) = delete;
  RawTerminal& operator=(const RawTerminal&) = delete;

 private:
  int fd_;
  struct termios saved_ {};
  bool active_ = false;
};

// PATH's directories under HOME that the plan does not mount: PATH as the
// command gets it, each entry resolved on the host (missing ones dropped).
HomePathDirs HomePathDirsFor(const Plan& plan, const Policy& policy, const std::string& home) {
  const char* host_path = getenv("PATH");
  const std::string inside = PathInside(plan.env, host_path ? host_path : "");
  std::vector<std::string> dirs;
  for (size_t start = 0; start <= inside.size();) {
    size_t end = inside.find(':', start);
    if (end == std::string::npos) end = inside.size();
    const std::string entry = inside.substr(start, end - start);
    start = end + 1;
    if (entry.empty() || entry[0] != '/') continue;
    const std::string real = RealPath(entry);
    if (!real.empty() && std::filesystem::is_directory(real)) dirs.push_back(real);
  }
  return FindHomePathDirs(plan, dirs, home, policy.filesystem.read_only);
}

// One confined attempt of `run`: the outcome, and the plan it ran (for the
// not-found hint), or a refusal (nothing ran) as its outcome.
struct Attempt {
  Outcome outcome;
  std::optional<Plan> plan;  // empty: Confine refused
};

Attempt RunAttempt(const std::vector<std::string>& command, const Policy& policy, const Invocation& inv, bool tty,
                   bool quiet, const RunOptions& opts) {
  linux::phases::Mark("policy");
  HostCaps host = ProbeHostFor(policy);
  linux::phases::Mark("probe");
  auto confined = Confine(command, policy, host, inv);
  linux::phases::Mark("confine");
  if (!confined.ok()) {
    Error("refusing to run: " + confined.status().message());
    return {RefusedOutcome(confined.status(), AssessEnforcement(policy, host, inv), policy.sha256), std::nullopt};
  }
  confined->plan.tty = tty;
  Attempt a;
  {
    std::optional<RawTerminal> raw;
    if (tty) raw.emplace(STDIN_FILENO);
    a.outcome = Run(*confined, opts);
  }
  if (!quiet) Summarise(a.outcome);
  a.plan = std::move(confined->plan);
  return a;
}

// "--on-denial ask": which grants were approved, on stderr, before the re-run.
void SayRerun(const std::vector<supervise::EscalationRecord>& records) {
  std::string grants;
  for (const auto& r : records) {
    if (r.applied) grants += (grants.empty() ? "" : ", ") + r.offer.grant_json;
  }
  Error("running the command again with the grant(s) approved: " + grants);
}

int CmdRun(const PolicyFlags& f, const std::vector<std::string>& command, const ReportFlags& rf,
           bool quiet, bool tty, const NetworkFlags& nf, const OverlayFlags& of, DenialFlags df) {
  if (!df.Apply()) return kExitUsage;
  // First: a report that cannot be written refuses the run (there is none
  // to say why, so stderr does).
  auto sink = rf.Open();
  if (!sink.ok()) {
    Error(sink.status().message() + " (nothing was run)");
    return kExitSandbox;
  }
  const ReportSink& report = *sink;
  auto policy = BuildPolicy(f);
  if (policy.ok() && df.ask && policy->on_violation.escalation != Escalation::kOneTimeApproval) {
    policy = Status::Error("policy", "--on-denial ask: the policy offers no escalations to ask for "
                                     "(on_violation.escalation is deny; ask needs one_time_approval)");
  }
  if (!policy.ok()) {
    Error(policy.status().message());
    Outcome o = RefusedOutcome(policy.status(), {}, "");
    WriteReport(report, o);
    return kExitSandbox;
  }
  if (report.wanted()) policy->sha256 = PolicyDigest(*policy);
  auto inv = BuildInvocation(f);
  if (!inv.ok()) {
    Outcome o = RefusedOutcome(inv.status(), AssessEnforcement(*policy, ProbeHostFor(*policy)), policy->sha256);
    if (!quiet) Summarise(o);
    WriteReport(report, o);
    return kExitSandbox;
  }
  if (!of.Apply(&*inv)) return kExitUsage;
  inv->wrapped_command = false;  // run spawns the plan itself
  RunOptions opts;
  opts.scan_stderr = !isatty(STDERR_FILENO);
  // This process exits once the run is reported.
  opts.runner_teardown = RunnerTeardown::kLeaveToExit;
  if (!nf.Apply(&opts)) return kExitUsage;

  Attempt first = RunAttempt(command, *policy, *inv, tty, quiet, opts);
  std::vector<supervise::EscalationRecord> records;
  std::optional<Attempt> rerun;
  if (df.ask && first.plan) {
    // Decided after the command has ended, each offer once; approved grants
    // widen a copy of the policy for one more attempt, never a second.
    records = supervise::DecideOffers(first.outcome.denials, df.Approver());
    Policy widened = *policy;
    if (supervise::ApplyApproved(&records, &widened) > 0) {
      if (report.wanted()) widened.sha256 = PolicyDigest(widened);
      if (!quiet) SayRerun(records);
      inv->nonce = Nonce();  // a run of its own: its own cgroup, private dir and marks
      rerun = RunAttempt(command, widened, *inv, tty, quiet, opts);
    }
  }
  const Attempt& last = rerun ? *rerun : first;
  // 127: not found, by the runner or by the command's own shell. A
  // toolchain under HOME is the usual reason a command found outside is not.
  if (!quiet && last.plan && last.outcome.ExitStatus() == 127) {
    std::fputs(HomePathDirsText(HomePathDirsFor(*last.plan, *policy, inv->home), "agentbox: ").c_str(), stderr);
  }
  if (df.ask) {
    WriteReport(report, last.outcome, records, rerun ? std::optional<Outcome>(first.outcome) : std::nullopt);
  } else {
    WriteReport(report, last.outcome);
  }
  linux::phases::Flush();
  return last.outcome.ExitStatus();
}

// What `wrap --report` hands its `__exec` side beside the plan: the
// enforcement it assessed and the denial signatures, so that the report
// `__exec` writes is the one `run` would.
constexpr const char* kWrapReportEnv = "AGENTBOX_WRAP_REPORT";

int CmdWrap(const PolicyFlags& f, const std::vector<std::string>& command, const NetworkFlags& nf,
            const ReportFlags& rf) {
  if (RunOptions check; !nf.Apply(&check)) return kExitUsage;
  if (Status s = rf.CheckForWrap(); !s.ok()) {
    Error(s.message());
    return kExitSandbox;
  }
  auto policy = BuildPolicy(f);
  if (!policy.ok()) {
    Error(policy.status().message());
    return kExitSandbox;
  }
  policy->sha256 = PolicyDigest(*policy);
  HostCaps host = ProbeHostFor(*policy);
  auto inv = BuildInvocation(f);
  if (!inv.ok()) {
    Error(inv.status().ToString());
    return kExitSandbox;
  }
  auto confined = Confine(command, *policy, host, *inv);
  if (!confined.ok()) {
    Error("refusing to wrap: " + confined.status().message());
    return kExitSandbox;
  }
  // argv is [agentbox, "__exec", "--", command...]: the proxy's and the
  // report's flags go before "--".
  std::vector<std::string> exec_flags = nf.ForExec();
  for (auto& a : rf.ForExec()) exec_flags.push_back(std::move(a));
  confined->argv.insert(confined->argv.begin() + 2, exec_flags.begin(), exec_flags.end());
  json env = json::object();
  for (const auto& [k, v] : confined->env) env[k] = v;
  json sigs = json::array(), rules = json::array();
  for (const auto& s : confined->denial_signatures) sigs.push_back({{"pattern", s.pattern}, {"meaning", s.meaning}});
  for (const auto& s : confined->runner_failure_rules) rules.push_back({{"pattern", s.pattern}, {"meaning", s.meaning}});
  if (rf.wanted()) {
    env[kWrapReportEnv] = json{{"enforcement", ToJsonValue(confined->enforcement)}, {"denial_signatures", sigs}}.dump();
  }
  json out = {{"argv", confined->argv},
              {"env", env},
              {"enforcement", ToJsonValue(confined->enforcement)},
              {"denial_signatures", sigs},
              {"runner_failure_rules", rules},
              {"exit_codes", {{"timed_out", 124}, {"sandbox_error", 125}, {"not_executable", 126}, {"not_found", 127}}}};
  std::cout << out.dump(2) << "\n";
  return 0;
}

// kWrapReportEnv's content: what `run` knows from planning and `__exec`
// does not.
struct WrapReport {
  EnforcementReport enforcement;
  std::vector<Signature> denial_signatures;
};

Result<WrapReport> ParseWrapReport(const char* text) {
  if (!text) {
    return Status::Error("report", std::string(kWrapReportEnv) +
                                       " is not set: a report needs the argv and env of `agentbox wrap --report`");
  }
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("enforcement") || !j.value("denial_signatures", json()).is_array()) {
    return Status::Error("report", std::string(kWrapReportEnv) + ": not {enforcement, denial_signatures}");
  }
  auto enforcement = EnforcementFromJson(j.at("enforcement"));
  if (!enforcement.ok()) return enforcement.status().WithContext(kWrapReportEnv);
  WrapReport out{std::move(*enforcement), {}};
  for (const auto& s : j.at("denial_signatures")) {
    if (!s.is_object() || !s.value("pattern", json()).is_string() || !s.value("meaning", json()).is_string()) {
      return Status::Error("report", std::string(kWrapReportEnv) + ": denial_signatures: each is {pattern, meaning}");
    }
    out.denial_signatures.push_back({s.at("pattern").get<std::string>(), s.at("meaning").get<std::string>()});
  }
  return out;
}

// The far side of `wrap`: a harness spawned us with the plan in the environment.
int CmdExec(const std::vector<std::string>& command, const NetworkFlags& nf, const ReportFlags& rf) {
  // Opened first, refused only once the plan's nonce can mark the line.
  auto sink = rf.Open();
  const char* text = getenv(kPlanEnv);
  const char* report_text = getenv(kWrapReportEnv);
  Result<Plan> plan = Status::Error("plan", std::string(kPlanEnv) + " is not set (use `agentbox wrap`)");
  if (text) {
    plan = PlanFromJson(text);
    if (!plan.ok()) plan = Status::Error("plan", plan.status().message());
  }
  auto context = rf.wanted() ? ParseWrapReport(report_text) : Result<WrapReport>(WrapReport{});
  // Never into the sandbox.
  unsetenv(kPlanEnv);
  unsetenv(kWrapReportEnv);
  const std::string nonce = plan.ok() ? plan->nonce : "-";
  if (!sink.ok()) {
    Error("sandbox error [" + nonce + "] stage=report: " + sink.status().message() + " (nothing was run)");
    return kExitSandbox;
  }
  auto refuse = [&](const Status& why) {
    Error("sandbox error [" + nonce + "] stage=" + why.stage() + ": " + why.message());
    WriteReport(*sink, RefusedOutcome(why, context.ok() ? context->enforcement : EnforcementReport{},
                                      plan.ok() ? plan->policy_sha256 : ""));
    return kExitSandbox;
  };
  if (!plan.ok()) return refuse(plan.status());
  if (!context.ok()) return refuse(context.status());
  if (command.empty()) return refuse(Status::Error("plan", "no command after --"));
  RunOptions opts;
  opts.runner_teardown = RunnerTeardown::kLeaveToExit;  // this process exits once the run is reported
  if (!nf.Apply(&opts)) return kExitSandbox;
  // Without a report the harness applies the signatures itself; with one,
  // stderr is scanned as `run` scans it, for the outcome `run` would give.
  opts.scan_stderr = sink->wanted() && !isatty(STDERR_FILENO);
  ConfinedCommand confined;
  confined.plan = std::move(*plan);
  confined.plan.argv = command;
  confined.enforcement = std::move(context->enforcement);
  confined.denial_signatures = std::move(context->denial_signatures);
  Outcome o = Run(confined, opts);
  if (o.kind == OutcomeKind::kSandboxError) {
    Error("sandbox error [" + nonce + "] stage=" + (o.error ? o.error->stage : "runner") + ": " +
          (o.error ? o.error->message : ""));
  } else if (o.kind == OutcomeKind::kTimedOut) {
    Error("timed_out [" + nonce + "]: " + (o.error ? o.error->message : ""));
  }
  WriteReport(*sink, o);
  return o.ExitStatus();
}

const char* Yes(bool b) { return b ? "yes" : "no"; }

int CmdCheck(const std::string& policy_file, const std::string& backend_flag, bool as_json) {
  PolicyFlags f;
  f.policy_file = policy_file;
  auto policy = BuildPolicy(f);
  if (!policy.ok()) {
    Error(policy.status().message());
    return 1;
  }
  auto choice = ParseBackend(backend_flag);
  if (!choice.ok()) {
    Error(choice.status().message());
    return kExitUsage;
  }
  HostCaps h = ProbeHost(ProbeDepth::kDeep);
  // The current directory as the workspace, as `run` would take it: which
  // deny entries a backend can fence depends on where it and HOME lie.
  f.backend = backend_flag;
  auto inv = BuildInvocation(f);
  EnforcementReport r = inv.ok() ? AssessEnforcement(*policy, h, *inv) : AssessEnforcement(*policy, h, *choice);
  // What no backend of this version gives (sandbox.isolation, sandbox.image):
  // the same refusal `run` and `policy explain` give.
  const Status available = CheckAvailable(*policy);
  auto selected = SelectBackend(h, *choice);
  const std::string backend_line =
      !selected.ok() ? "none (" + selected.status().message() + ")"
      : selected->backend == Backend::kLandlockOnly ? "landlock-only (" + selected->why + ")"
                                                    : "namespaces (" + selected->why + ")";
  json host = {
      {"kernel", h.kernel_release},
      {"uid", h.uid},
      {"user_namespaces", {{"available", h.user_namespaces}, {"restricted", h.userns_restricted}, {"reason", h.userns_reason}}},
      {"namespaces", {{"mnt", h.mount_ns}, {"pid", h.pid_ns}, {"net", h.net_ns}, {"ipc", h.ipc_ns}, {"uts", h.uts_ns}, {"cgroup", h.cgroup_ns}}},
      {"landlock_abi", h.landlock_abi},
      {"seccomp_filter", h.seccomp_filter},
      {"no_new_privs", h.no_new_privs},
      {"new_mount_api", h.new_mount_api},
      {"overlayfs", h.overlayfs},
      {"pidfd", h.pidfd},
      {"seccomp_mode", h.seccomp_mode},
      {"proc", {{"fully_visible", h.proc_fully_visible}, {"overmounts", h.proc_overmounts}, {"mount_errno", h.proc_mount_errno}}},
      {"cgroups", {{"v2_mounted", h.cgroups.v2_mounted}, {"v2_own_path", h.cgroups.v2_own_path},
                   {"v1_controllers", h.cgroups.v1_controllers}, {"v1_writable", h.cgroups.v1_writable}, {"can_create_children", h.cgroups.can_create_children},
                   {"reason", h.cgroups.reason}}},
  };
  // run_code (sessions): the interpreters it runs programs with, found on the read-only system.
  json run_code = {{"languages", json::array()}, {"absent", json::array()}};
  std::string run_code_line;
#if AGENTBOX_CORE_ONLY
  run_code["absent"].push_back({{"language", "*"}, {"why", kNoSessions}});
  run_code_line = kNoSessions;
#else
  for (const auto& rt : session::CodeRuntimes()) {
    if (rt.path.empty()) {
      run_code["absent"].push_back({{"language", rt.language}, {"why", rt.why_absent}});
      run_code_line += (run_code_line.empty() ? "" : "; ") + rt.language + " not offered: " + rt.why_absent;
    } else {
      run_code["languages"].push_back({{"language", rt.language}, {"interpreter", rt.path}});
      run_code_line += (run_code_line.empty() ? "" : "; ") + rt.language + " (" + rt.path + ")";
    }
  }
#endif
  host["run_code"] = run_code;
  // The isolation ladder: container (gVisor) and microvm (QEMU, KVM, a guest kernel).
  const LadderCaps& l = h.ladder;
  const std::string container_line =
      l.runsc.empty() || !l.runsc_why.empty()
          ? "unavailable: " + l.runsc_why
          : "gVisor runsc " + l.runsc_version + " at " + l.runsc + " (platform " + l.runsc_platform +
                (l.runsc_rootless ? ", --rootless" : "") + (l.runsc_tried ? "; a trial sandbox ran" : "") + ")";
  const std::string microvm_line =
      (l.microvm_why.empty() ? "QEMU microvm, accelerator " + l.accel() + (l.kvm ? "" : " (" + l.kvm_why + ")") +
                                   ", guest kernel " + l.guest_kernel + ", image " + l.guest_image
                             : "unavailable: " + l.microvm_why) +
      " (qemu: " + (l.qemu.empty() ? "not installed" : l.qemu) + "; virtiofsd: " +
      (l.virtiofsd.empty() ? "not installed" : l.virtiofsd) + "; kvm: " + (l.kvm ? "yes" : l.kvm_why) + ")";
  host["ladder"] = {{"container", {{"runsc", l.runsc}, {"version", l.runsc_version}, {"platform", l.runsc_platform},
                                   {"rootless", l.runsc_rootless}, {"tried", l.runsc_tried},
                                   {"available", !l.runsc.empty() && l.runsc_why.empty()}, {"why", l.runsc_why}}},
                    {"microvm", {{"available", l.microvm_why.empty()}, {"why", l.microvm_why}, {"qemu", l.qemu},
                                 {"virtiofsd", l.virtiofsd}, {"accel", l.accel()}, {"kvm", l.kvm},
                                 {"kvm_why", l.kvm_why}, {"guest_kernel", l.guest_kernel},
                                 {"guest_image", l.guest_image}}}};
  const std::vector<Diagnosis> diagnosis = Diagnose(h);
  // setup-delegation's directories in use, per controller, and why one on record is not.
  json delegation = json::object();
  for (const auto& [c, d] : h.cgroups.delegation) delegation[c] = d;
  host["cgroups"]["delegation"] = delegation;
  host["cgroups"]["delegation_notes"] = h.cgroups.delegation_notes;
  if (as_json) {
    json out = {{"host", host}, {"backend", backend_line}, {"policy", policy->source}, {"enforcement", ToJsonValue(r)}};
    out["diagnosis"] = json::array();
    for (const auto& d : diagnosis) {
      out["diagnosis"].push_back({{"facet", d.facet}, {"cause", d.cause}, {"detail", d.detail}, {"fix", d.fix}});
    }
    if (!available.ok()) out["refusal"] = available.message();
    std::cout << out.dump(2) << "\n";
    return r.missing.empty() && selected.ok() && available.ok() ? 0 : 1;
  }
  std::printf("host: Linux %s, uid %u\n", h.kernel_release.c_str(), h.uid);
  std::printf("  user namespaces   %s%s%s\n", h.user_namespaces ? "available" : "unavailable",
              h.userns_reason.empty() ? "" : ": ", h.userns_reason.c_str());
  std::printf("  namespaces        mnt=%s pid=%s net=%s ipc=%s uts=%s cgroup=%s\n", Yes(h.mount_ns), Yes(h.pid_ns),
              Yes(h.net_ns), Yes(h.ipc_ns), Yes(h.uts_ns), Yes(h.cgroup_ns));
  std::printf("  new mount API     %s\n", Yes(h.new_mount_api));
  std::printf("  landlock          %s\n", h.landlock_abi ? ("ABI " + std::to_string(h.landlock_abi)).c_str() : "unavailable");
  std::printf("  seccomp filter    %s\n", Yes(h.seccomp_filter));
  std::printf("  pidfd             %s\n", Yes(h.pidfd));
  std::printf("  overlayfs         %s\n", Yes(h.overlayfs));
  std::printf("  run_code          %s\n", run_code_line.c_str());
  std::printf("  container         %s\n", container_line.c_str());
  std::printf("  microvm           %s\n", microvm_line.c_str());
  std::string v1;
  for (const auto& c : h.cgroups.v1_controllers) v1 += (v1.empty() ? "" : ",") + c;
  std::string v1w;
  for (const auto& c : h.cgroups.v1_writable) v1w += (v1w.empty() ? "" : ",") + c;
  std::printf("  cgroups           v2=%s (own: %s) v1=[%s] v1 writable=[%s] can create children=%s%s%s\n",
              Yes(h.cgroups.v2_mounted), h.cgroups.v2_own_path.c_str(), v1.c_str(), v1w.c_str(),
              Yes(h.cgroups.can_create_children), h.cgroups.reason.empty() ? "" : ": ", h.cgroups.reason.c_str());
  for (const auto& [c, d] : h.cgroups.delegation) std::printf("  delegation        %s: %s\n", c.c_str(), d.c_str());
  for (const auto& n : h.cgroups.delegation_notes) std::printf("  delegation        not used: %s\n", n.c_str());
  std::printf("\nbackend: %s\n", backend_line.c_str());
  std::printf("\n%s", DiagnosisText(diagnosis).c_str());
  std::printf("\npolicy %s → enforcement %s (backend %s%s%s)\n", policy->source.c_str(), ToString(r.level),
              r.backend.c_str(), r.runtime.empty() ? "" : ", ", r.runtime.c_str());
  for (const auto& facet : r.facets) {
    std::string mech;
    for (const auto& m : facet.mechanisms) mech += (mech.empty() ? "" : ", ") + m;
    std::printf("  %-12s %-8s %s%s\n", facet.name.c_str(), ToString(facet.level),
                facet.requested ? "" : "(not requested) ", mech.c_str());
    for (const auto& n : facet.notes) std::printf("  %-12s          note: %s\n", "", n.c_str());
  }
  for (const auto& m : r.missing) std::printf("  missing: %s: %s\n", m.facet.c_str(), m.reason.c_str());
  for (const auto& n : r.notes) std::printf("  note: %s\n", n.c_str());
  if (!available.ok()) std::printf("`agentbox run` would refuse: %s\n", available.message().c_str());
  return r.missing.empty() && selected.ok() && available.ok() ? 0 : 1;
}

int CmdValidate(const std::string& file) {
  // Every error, one per line; the policy itself only once there are none.
  std::vector<Status> errors = ValidatePolicyFile(file);
  for (const Status& e : errors) std::fprintf(stderr, "%s\n", e.message().c_str());
  if (!errors.empty()) return 1;
  auto p = LoadPolicyFile(file);
  if (!p.ok()) {
    std::fprintf(stderr, "%s\n", p.status().message().c_str());
    return 1;
  }
  std::printf("%s: valid (mode %s, isolation %s, sha256 %s)\n", file.c_str(), ToString(p->mode),
              ToString(p->sandbox.isolation), p->sha256.c_str());
  return 0;
}

void PrintPlan(const Plan& plan) {
  if (!plan.confined) {
    std::printf("plan: no confinement (danger-full-access): the command runs as is, with the whole environment\n");
    return;
  }
  if (plan.backend == Backend::kLandlockOnly) {
    std::printf("plan: backend landlock-only: no namespaces, no mounts; the command sees host paths, fenced by\n"
                "  Landlock (rules below); a private 0700 directory per run under %s holds HOME and TMPDIR\n"
                "  and is removed afterwards; the runner is a child subreaper and kills what is left at the end\n",
                plan.private_dir_parent.c_str());
    for (const auto& a : plan.absent) std::printf("  outside every allowed tree (denied by Landlock): %s\n", a.c_str());
    for (const auto& l : plan.home_links) {
      std::printf("  link in the private home: ~/%s -> %s%s (%s)\n", l.name.c_str(), l.target.c_str(),
                  l.optional ? " [if present]" : "", l.why.c_str());
    }
    std::printf("  cwd: %s\n", plan.cwd.c_str());
  } else {
  std::string ns;
  for (const auto& n : plan.namespaces) ns += (ns.empty() ? "" : " ") + n;
  if (plan.backend == Backend::kGvisor && plan.gvisor) {
    std::printf("plan: backend gvisor: the command runs on gVisor's Sentry (%s %s, platform %s%s), from an OCI\n"
                "  spec made of the mounts below (docs/isolation.md: what each becomes); no network\n"
                "  (--network=none); the run's cgroup holds runsc's processes\n",
                plan.gvisor->runsc.c_str(), plan.gvisor->version.c_str(), plan.gvisor->platform.c_str(),
                plan.gvisor->rootless ? ", --rootless" : "");
    std::printf("  mounts, in order (gVisor's own /dev and /proc stand for the plan's):\n");
  } else {
  std::printf("plan:\n  namespaces: %s (uid %u, gid %u mapped to themselves)\n", ns.c_str(), plan.uid, plan.gid);
  std::printf("  mounts, in order (new root on tmpfs, pivot_root, host root detached, root sealed read-only):\n");
  }
  for (const auto& m : plan.mounts) {
    std::string flags = m.read_only ? "ro" : "rw";
    if (m.kind == MountKind::kSymlink) flags = "";
    if (m.kind == MountKind::kMask) flags = "ro,mode=000";
    std::string src = m.source.empty() ? "" : m.source;
    std::printf("    %-8s %-14s %-28s %s%s%s\n", ToString(m.kind), flags.c_str(), m.target.c_str(),
                src.empty() ? "" : ("← " + src + "  ").c_str(), m.optional ? "[if present] " : "", m.why.c_str());
    if (!m.data.empty()) std::printf("    %-8s %-14s %-28s options %s\n", "", "", "", m.data.c_str());
  }
  std::printf("    (all binds nosuid,nodev; read-only ones recursively read-only)\n");
  for (const auto& g : plan.deny_globs) {
    std::string pats;
    for (const auto& p : g.patterns) pats += (pats.empty() ? "" : ", ") + p;
    std::printf("  deny globs: scanned in %s at launch, each match masked: %s\n", g.source_root.c_str(), pats.c_str());
  }
  if (!plan.protect_git.empty()) {
    std::string names;
    for (const auto& n : plan.protect_git) names += (names.empty() ? "" : ", ") + n;
    std::printf("  git repositories: every one found in %s at launch gets %s protected like the root's; "
                "ones created during the run are audited at its end\n",
                plan.workspace_source.c_str(), names.c_str());
  }
  for (const auto& a : plan.absent) std::printf("  absent (never mounted): %s\n", a.c_str());
  std::printf("  cwd: %s   HOME: %s\n", plan.cwd.c_str(), plan.home.c_str());
  }
  std::string pass;
  for (const auto& p : plan.env.pass) pass += (pass.empty() ? "" : " ") + p;
  std::printf("  env: pass [%s]; set", pass.c_str());
  for (const auto& [k, v] : plan.env.set) std::printf(" %s=%s", k.c_str(), v.c_str());
  std::printf("\n  process: runner is %s (reaps, forwards signals); command in a new session, no_new_privs,\n"
              "           all capabilities dropped, inherited fds above 2 closed\n",
              plan.backend == Backend::kLandlockOnly ? "a child subreaper, killing what is left at the end"
                                                     : "pid 1");
  const LandlockPlan& ll = plan.landlock;
  if (plan.backend == Backend::kGvisor) {
    std::printf("  landlock: none inside gVisor (its Sentry does not implement Landlock; the mounts are the fence)\n");
  } else if (ll.abi == 0) {
    std::printf("  landlock: not applied (this host has no Landlock ABI >= 2)\n");
  } else {
    std::printf("  landlock: ABI %d, applied by the runner after the root is built; everything not listed is denied\n"
                "            (handled: %s)%s\n",
                ll.abi, LandlockAccessNames(ll.handled_fs).c_str(),
                ll.scoped ? "; abstract unix sockets and signals scoped to the sandbox" : "");
    for (const auto& r : ll.rules) {
      std::printf("    %-28s %s%s  (%s)\n", r.path.c_str(), r.optional ? "[if present] " : "",
                  LandlockAccessNames(r.access).c_str(), r.why.c_str());
    }
    std::printf("    + the files or devices on stdin/stdout/stderr, with the access they were opened with\n");
    for (const auto& l : ll.left_out) std::printf("    this ABI leaves out: %s\n", l.c_str());
    if (ll.handled_net) {
      std::printf("    TCP connect and bind: handled; no port may be bound, and connect()ed only %s\n",
                  plan.network.proxy ? "to the egress proxy's two ports (bound per run)" : "to none");
    }
  }
  if (plan.network.proxy && plan.backend == Backend::kLandlockOnly) {
    std::printf("  network: egress proxy on two ports of the host's 127.0.0.1 that the supervisor binds for each run "
                "(HTTP_PROXY, ALL_PROXY name them); it serves only the sandbox's own connections\n");
  } else if (plan.network.proxy) {
    std::printf("  network: egress proxy at 127.0.0.1:%u (HTTP) and 127.0.0.1:%u (SOCKS5) inside\n",
                unsigned{plan.network.proxy->http_port}, unsigned{plan.network.proxy->socks_port});
    if (plan.network.sni_check) {
      std::string ports;
      for (std::uint16_t p : plan.network.sni_ports) ports += (ports.empty() ? "" : ", ") + std::to_string(p);
      std::printf("    TLS SNI check on tunnels to port%s %s: a ClientHello naming another host closes the tunnel\n",
                  plan.network.sni_ports.size() == 1 ? "" : "s", ports.c_str());
    } else {
      std::printf("    TLS SNI check: off (network.tls_sni_check: false)\n");
    }
  }
  if (std::string brokered = DescribeBrokeredTls(plan.network); !brokered.empty()) {
    std::printf("    %s\n", brokered.c_str());
  }
  if (!plan.seccomp.enabled) {
    std::printf("  seccomp: no filter (this host has no seccomp filtering)\n");
  } else {
    if (plan.backend == Backend::kGvisor) {
      std::printf("  seccomp: the OCI spec's filter, loaded inside the Sentry (--oci-seccomp): these calls fail with\n"
                  "           EPERM, not reported by name; rules answered ENOSYS are left to the Sentry:\n");
    } else {
    std::printf("  seccomp: filter after Landlock; denied calls fail with EPERM and are reported by name%s:\n",
                plan.seccomp.refuse_foreign_arches ? "; x32 and i386 calls get EPERM" : "");
    }
    for (const auto& r : plan.seccomp.rules) std::printf("    %s\n", Describe(r).c_str());
  }
  if (plan.timeout_ms) std::printf("  wall clock: %llu ms\n", static_cast<unsigned long long>(*plan.timeout_ms));
}

int CmdExplain(PolicyFlags f, bool as_json) {
  auto policy = BuildPolicy(f);
  if (!policy.ok()) {
    Error(policy.status().message());
    return 1;
  }
  HostCaps host = ProbeHostFor(*policy);
  auto inv = BuildInvocation(f);
  if (!inv.ok()) {
    Error(inv.status().ToString());
    return 1;
  }
  // Show the plan even where `run` would refuse, and say that it would.
  Policy relaxed = *policy;
  relaxed.sandbox.require = Requirement::kPartial;
  inv->wrapped_command = false;
  auto strict = Confine({"COMMAND"}, *policy, host, *inv);
  auto confined = Confine({"COMMAND"}, relaxed, host, *inv);
  const HomePathDirs home_path = confined.ok() ? HomePathDirsFor(confined->plan, *policy, inv->home) : HomePathDirs{};
  if (as_json) {
    json out = {{"policy_yaml", ToYaml(*policy)},
                {"enforcement", ToJsonValue(AssessEnforcement(*policy, host, *inv))},
                {"would_run", strict.ok()},
                {"path_under_home", {{"not_mounted", home_path.not_mounted}, {"read_only", home_path.read_only}}}};
    if (!strict.ok()) out["refusal"] = strict.status().message();
    if (confined.ok()) out["plan"] = json::parse(PlanToJson(confined->plan));
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::printf("# effective policy (%s)\n%s\n", policy->source.c_str(), ToYaml(*policy).c_str());
  EnforcementReport r = AssessEnforcement(*policy, host, *inv);
  std::printf("enforcement on this host: %s (backend %s%s%s)\n", ToString(r.level), r.backend.c_str(),
              r.runtime.empty() ? "" : ", ", r.runtime.c_str());
  for (const auto& m : r.missing) std::printf("  missing: %s: %s\n", m.facet.c_str(), m.reason.c_str());
  for (const auto& n : r.notes) std::printf("  note: %s\n", n.c_str());
  if (!strict.ok()) std::printf("`agentbox run` would refuse: %s\n", strict.status().message().c_str());
  std::fputs(HomePathDirsText(home_path, "").c_str(), stdout);
  if (confined.ok()) {
    PrintPlan(confined->plan);
  } else {
    std::printf("no plan: %s\n", confined.status().message().c_str());
  }
  return 0;
}

}  // namespace
}  // namespace agentbox::cli

#if AGENTBOX_CORE_ONLY
// agentbox-core (CMakeLists.txt): the sandbox, its supervisor and report,
// without the services; a session's entry points name where they are.
namespace {
int NoSessionsMain() {
  std::fprintf(stderr, "agentbox-core: %s\n", agentbox::cli::kNoSessions);
  return agentbox::cli::kExitSandbox;
}
int WorldMain() { return NoSessionsMain(); }
int RemoteStdioMain() { return NoSessionsMain(); }
int RemoteLayersMain() { return NoSessionsMain(); }
}  // namespace
#else
using agentbox::session::RemoteLayersMain;
using agentbox::session::RemoteStdioMain;
using agentbox::session::WorldMain;
#endif

int main(int argc, char** argv) {
  using namespace agentbox::cli;
  agentbox::linux::phases::Init();
  // A session's sandbox supervisor (spawned by sessions, never typed).
  if (argc == 2 && std::strcmp(argv[1], "__world") == 0) return WorldMain();
  // A session's world on this host for a caller elsewhere (sandbox.isolation:
  // remote): frames on stdin and stdout, reached over ssh.
  if (argc == 3 && std::strcmp(argv[1], "__world") == 0 && std::strcmp(argv[2], "--stdio") == 0) {
    return RemoteStdioMain();
  }
  // A remote session's diff, apply or snapshot on this host (remote_world.h).
  if (argc == 2 && std::strcmp(argv[1], "__remote-layers") == 0) return RemoteLayersMain();
  // A microVM's init: this binary is the guest image's /init.
  if (getpid() == 1 && std::strcmp(argv[0], "/init") == 0) agentbox::supervise::GuestInitMain(&WorldMain);
  // A session's world in a gVisor sandbox: this binary is the container's init.
  if (getpid() == 1 && argc == 2 && std::strcmp(argv[1], agentbox::supervise::kGvisorInsideArg) == 0) {
    agentbox::supervise::GvisorInsideMain(&WorldMain);
  }
  // A trial boot of the guest image (bench/ladder_bench: QEMU's boot to the
  // guest's init alone): exec's QEMU, which prints the guest's console.
  if (argc == 3 && std::strcmp(argv[1], "__guest-trial") == 0) {
    const agentbox::LadderCaps l = agentbox::ProbeLadder(agentbox::ProbeDepth::kQuick);
    if (l.qemu.empty() || l.guest_image.empty()) {
      std::fprintf(stderr, "agentbox: no QEMU or guest image: %s\n", l.microvm_why.c_str());
      return 1;
    }
    const auto a = agentbox::linux::QemuTrialArgv(l.qemu, l.guest_kernel, l.guest_image, argv[2]);
    std::vector<char*> c;
    for (const auto& s : a) c.push_back(const_cast<char*>(s.c_str()));
    c.push_back(nullptr);
    execv(c[0], c.data());
    std::perror("agentbox: exec qemu");
    return 1;
  }
  // The guest image for a kernel release (the build makes it: CMake's guest_image).
  if (argc == 5 && std::strcmp(argv[1], "__guest-image") == 0) {
    if (agentbox::Status s = agentbox::linux::WriteGuestInitramfs(argv[2], argv[3], argv[4]); !s.ok()) {
      std::fprintf(stderr, "agentbox: %s\n", s.ToString().c_str());
      return 1;
    }
    return 0;
  }
  CLI::App app{"agentbox: run commands for AI agents, confined (namespaces, read-only system, no network, "
               "a fail-closed policy and a truthful report)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("agentbox ") + agentbox::Version());

  // Only the subcommand named first is built: building every subcommand's
  // options costs CLI11 about 0.6 ms, most of what `run` itself spends
  // before confining anything. With no known name first (`--help`,
  // `--version`, a typo) all are built, for the help and the error.
  static constexpr std::string_view kTopLevel[] = {
      "run", "wrap", "__exec", "check", "gc", "policy", "serve", "session", "mcp", "setup-delegation", "k8s"};
  const std::string_view first = argc > 1 ? argv[1] : "";
  const bool build_all = std::find(std::begin(kTopLevel), std::end(kTopLevel), first) == std::end(kTopLevel);
  auto wanted = [&](std::string_view name) { return build_all || first == name; };

  PolicyFlags run_flags;
  std::vector<std::string> run_cmd;
  ReportFlags report;
  bool quiet = false;
  bool tty = false;
  bool systemd_scope = false;
  NetworkFlags net_flags;
  OverlayFlags overlay_flags;
  DenialFlags denial_flags;
  CLI::App* run = nullptr;
  if (wanted("run")) {
    run = app.add_subcommand("run", "run one command confined");
    run_flags.Register(run, true);
    report.Register(run);
    run->add_flag("--quiet", quiet, "print nothing of agentbox's own on success or failure");
    run->add_flag("--tty", tty,
                  "give the command a pseudo-terminal of the sandbox's own (controlling tty, job control, resize)");
    run->add_flag("--systemd-scope", systemd_scope,
                  "start the supervisor in a systemd user scope with Delegate=yes (systemd-run --user --scope), "
                  "so that limits come from a cgroup systemd delegates (docs/delegation.md)");
    net_flags.Register(run);
    overlay_flags.Register(run);
    denial_flags.Register(run);
    run->add_option("command", run_cmd, "the command, after --");
  }

  PolicyFlags wrap_flags;
  std::vector<std::string> wrap_cmd;
  NetworkFlags wrap_net_flags;
  ReportFlags wrap_report;
  CLI::App* wrap = nullptr;
  if (wanted("wrap")) {
    wrap = app.add_subcommand("wrap", "print the confined argv as JSON, for harnesses that spawn processes");
    wrap_flags.Register(wrap, true);
    wrap_net_flags.Register(wrap);
    wrap_report.Register(wrap);
    wrap->add_option("command", wrap_cmd, "the command, after --");
  }

  std::vector<std::string> exec_cmd;
  NetworkFlags exec_net_flags;
  ReportFlags exec_report;
  CLI::App* exec = nullptr;
  if (wanted("__exec")) {
    exec = app.add_subcommand("__exec", "");
    exec->group("");  // hidden: the far side of `wrap`
    exec_net_flags.Register(exec);
    exec_report.Register(exec);
    exec->add_option("command", exec_cmd);
  }

  std::string check_policy;
  bool check_json = false;
  std::string check_backend;
  CLI::App* check = nullptr;
  if (wanted("check")) {
    check = app.add_subcommand("check", "what this host can enforce, facet by facet");
    check->add_option("--policy", check_policy, "policy file (YAML)");
    check->add_option("--backend", check_backend, "auto | namespaces | landlock (default: auto)");
    check->add_flag("--json", check_json, "JSON output");
  }

  bool gc_quiet = false;
  CLI::App* gc = nullptr;
  if (wanted("gc")) {
    gc = app.add_subcommand("gc", "remove cgroups left behind by killed `agentbox run` supervisors");
    gc->add_flag("--quiet", gc_quiet, "print nothing");
  }

  std::string validate_file;
  PolicyFlags explain_flags;
  bool explain_json = false;
  CLI::App* validate = nullptr;
  CLI::App* explain = nullptr;
  if (wanted("policy")) {
    CLI::App* policy = app.add_subcommand("policy", "validate or explain a policy");
    policy->require_subcommand(1);
    validate = policy->add_subcommand("validate", "check a policy file; errors name line:column");
    validate->add_option("file", validate_file, "policy file")->required();
    explain = policy->add_subcommand("explain", "the effective policy with defaults, and the plan");
    explain_flags.Register(explain, true);
    explain->add_flag("--json", explain_json, "JSON output");
  }

  std::vector<Subcommand> subcommands;
#if AGENTBOX_CORE_ONLY
  for (const char* name : {"serve", "session", "mcp", "k8s"}) {
    if (first == name) {
      Error("'" + std::string(first) + "' is not in agentbox-core: " + kNoSessions);
      return kExitUsage;
    }
  }
#else
  if (wanted("serve")) subcommands.push_back(AddServeCommand(app));
  if (wanted("session")) subcommands.push_back(AddSessionCommand(app));
  if (wanted("mcp")) subcommands.push_back(AddMcpCommand(app));
#endif
  if (wanted("setup-delegation")) subcommands.push_back(AddSetupDelegationCommand(app));
#if !AGENTBOX_CORE_ONLY
  if (wanted("k8s")) subcommands.push_back(AddK8sCommand(app));
#endif
  // A first word that names none of them (checked against what was built,
  // so a name missing from kTopLevel only costs the full build).
  if (build_all && !first.empty() && first[0] != '-' &&
      app.get_subcommands([&](const CLI::App* sub) { return sub->get_name() == first; }).empty()) {
    Error("'" + std::string(first) + "' is not a subcommand (agentbox --help lists them)");
    return kExitUsage;
  }

  // Everything after the first `--` is the command, verbatim. Split it off
  // before parsing: otherwise a repeatable option just before `--` (say
  // `--env A=1 -- sh -c x`) lets the parser read the command's own flags.
  int split = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      split = i;
      break;
    }
  }
  std::vector<std::string> after_dashes(argv + std::min(split + 1, argc), argv + argc);
  try {
    app.parse(split, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }
  if (split < argc) {
    run_cmd.insert(run_cmd.end(), after_dashes.begin(), after_dashes.end());
    wrap_cmd.insert(wrap_cmd.end(), after_dashes.begin(), after_dashes.end());
    exec_cmd.insert(exec_cmd.end(), after_dashes.begin(), after_dashes.end());
  }
  // Which subcommand was given (an unbuilt one never is).
  auto given = [](const CLI::App* sub) { return sub != nullptr && sub->parsed(); };
  if ((given(run) || given(wrap)) && (given(run) ? run_cmd : wrap_cmd).empty()) {
    Error("no command given: agentbox " + std::string(given(run) ? "run" : "wrap") + " [OPTIONS] -- COMMAND [ARG...]");
    return kExitUsage;
  }
  if (given(run) && systemd_scope) {
    if (int status = SystemdScope(argc, argv); status >= 0) return status;
  }
  if (given(run)) {
    // Everything of the run is done and reported by CmdRun's own scopes:
    // what exit() would add is the libraries' static destructors and
    // handlers (OpenSSL's cleanup among them), each paging in code of its
    // own only to free memory the kernel frees anyway (0.15 ms of a run).
    const int status = CmdRun(run_flags, run_cmd, report, quiet, tty, net_flags, overlay_flags, denial_flags);
    std::fflush(nullptr);
    _exit(status);
  }
  if (given(wrap)) return CmdWrap(wrap_flags, wrap_cmd, wrap_net_flags, wrap_report);
  if (given(exec)) return CmdExec(exec_cmd, exec_net_flags, exec_report);
  if (given(check)) return CmdCheck(check_policy, check_backend, check_json);
  if (given(validate)) return CmdValidate(validate_file);
  if (given(explain)) return CmdExplain(explain_flags, explain_json);
  if (given(gc)) return CmdGc(gc_quiet);
  for (const auto& s : subcommands) {
    if (*s.app) return s.run(split < argc ? after_dashes : std::vector<std::string>{});
  }
  return kExitUsage;
}
