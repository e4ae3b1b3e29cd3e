// A World: one session's sandbox, alive between calls.
//
// Three processes: the caller (the daemon, or `agentbox mcp`), a small
// supervisor (`agentbox __world`, spawned fresh so that it starts
// single-threaded and small), and the sandbox's init, which that supervisor
// launches through the same Launch as `agentbox run` (namespaces, mounts,
// cgroup, Landlock, seccomp, egress proxy; set up once). Every call is a new
// process forked by the init: a command (fork+exec) or a file tool (a fork
// running agentbox's own code under the same mounts, Landlock domain and
// seccomp filter). So the file tools see exactly what the shell sees.
//
// The caller talks to the init directly over a control socket (handed over
// by the supervisor once the init is ready) and to the supervisor over a
// channel: readiness, proxy records as they come, OOM-kill counts, and the
// init's death. Closing the channel ends the world.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "agentbox/outcome.h"
#include "agentbox/plan.h"
#include "agentbox/status.h"
#include "net/secrets.h"
#include "linux/fd.h"
#include "linux/rlimits.h"
#include "session/session.h"

namespace agentbox::session {

// Status stage of a call that could not be sent because the world had
// already ended: nothing ran, so it may be retried in a fresh world.
inline constexpr const char* kWorldGone = "world_gone";
// The stage of World::File's error when the tool did not answer in time
// (its process is killed).
inline constexpr const char* kFileToolTimedOut = "file_tool_timed_out";

struct WorldExec {
  std::vector<std::string> argv;          // e.g. {"bash", "-c", command}
  // Set: the command runs in the session's persistent shell instead (argv
  // unused; see linux/session_shell.h). `cwd` "" then means where the last
  // call left the shell, and `env` names must be shell variable names.
  std::optional<std::string> shell_command;
  std::string cwd;                        // inside ("" = the init's)
  std::vector<std::string> env;           // "NAME=VALUE", over the plan's environment
  std::optional<std::string> stdin_data;  // none: /dev/null
  std::optional<std::uint64_t> timeout_ms;
  std::uint64_t kill_grace_ms = 2000;     // SIGTERM first, SIGKILL after this
  std::size_t output_cap = 256 * 1024;
  // Where what the command leaves running writes after the call's end (the
  // session's background log; -1: nowhere). Sent to the init with the call.
  int background_log_fd = -1;
  // run_code: a descriptor that becomes the command's fd 3 (its tool
  // bindings; -1: none), and a call with no network at all (a nested
  // Landlock domain without TCP, a seccomp filter without sockets) whose
  // background processes die with it.
  int binding_fd = -1;
  bool no_network = false;
  // Called once the command's process exists, with its pid inside.
  std::function<void(int pid)> on_started;
  // Set to true: the command is ended as by a timeout (SIGTERM, SIGKILL
  // after kill_grace_ms), without being reported as timed out (a service's stop).
  const std::atomic<bool>* stop = nullptr;
};

struct WorldExecResult {
  std::string output;                     // capped: head and tail kept, a marker between
  bool truncated = false;
  std::uint64_t output_bytes = 0;         // everything the command wrote
  std::optional<int> exit_code;
  std::optional<int> signal;
  bool timed_out = false;
  bool cancelled = false;
  bool stopped = false;                   // ended through WorldExec::stop
  std::optional<int> pid;                 // the command's, inside
  bool world_died = false;                // the init went away during the call
  std::uint64_t oom_kills = 0;            // during the call (the session's cgroup counter)
  std::vector<std::pair<std::string, std::uint64_t>> seccomp;  // denied syscalls, counted
  std::vector<nlohmann::json> connections;  // proxy records that ended during the call
  std::optional<Status> exec_error;       // the command could not start
  std::uint64_t wall_ms = 0;
  std::optional<struct rusage> rusage;    // the command's, as its init reaped it (wait4)
  // A call of the persistent shell: {"restarted", "ended", "why"} as its
  // keeper says (restarted: this call is the first of a new shell; ended:
  // the shell ended with this call).
  std::optional<nlohmann::json> shell;
};

// A terminal in the world (OpenTerminal): a command on a pty of the
// sandbox's own devpts, its controlling terminal.
struct WorldTerminalSpec {
  std::vector<std::string> argv;  // e.g. {"bash", "-l"}
  std::string cwd;                // inside ("" = the init's)
  int cols = 80, rows = 24;
  std::string term;               // TERM for the command ("" = the plan's)
};

struct WorldTerminal {
  long id = 0;           // the call's id: KillCall ends it
  linux::UniqueFd master;  // the pty's master, O_CLOEXEC
  linux::UniqueFd result;  // the end of the call: one JSON line ({"t":"exit",...} or exec_error)
};

class World {
 public:
  // Spawns `exe __world` with the plan and waits (up to `ready_timeout_ms`)
  // for the init to be set up. A setup failure comes back as the runner's
  // Status (stage, syscall, path, errno).
  // A plan whose upper layer has a size of its own (disk_gib) makes the
  // init mount it and hand it back (TakeUpperFs); `upper_seed_fd` (>= 0)
  // is an earlier world's, whose upper layer the new one starts with.
  // `rotated`: secrets whose value the API replaced, used instead of their
  // sources (the rest are read from theirs, here, and handed to the world).
  static Result<std::unique_ptr<World>> Start(const std::string& exe, const Plan& plan, int ready_timeout_ms,
                                              int upper_seed_fd = -1,
                                              const std::map<std::string, net::LockedBytes>* rotated = nullptr);
  ~World();  // Stop(0)
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  // False once the init or its supervisor is gone.
  bool Alive();
  // Why it died ("" while alive), and OOM kills seen at its death.
  std::string death() const;
  // The cgroup its processes run in ("cgroup-v2", ...; "" = none) and the
  // rlimits its runner set, as its supervisor says: for the limits a call's
  // report names.
  const std::string& cgroup_mechanism() const { return cgroup_mechanism_; }
  const linux::RlimitsSet& rlimits() const { return rlimits_; }
  // read_only entries absent on this host, skipped at set-up (the report's
  // enforcement.skipped).
  const std::vector<std::string>& skipped() const { return skipped_; }
  // What the runner found short of the plan at set-up (a kernel whose
  // Landlock gives less than planned, under require: partial): entries for
  // the report's enforcement.missing.
  const std::vector<MissingFacet>& short_of_plan() const { return short_of_plan_; }

  Result<WorldExecResult> Exec(const WorldExec& exec, const OutputSink& sink, const std::atomic<bool>* cancel);
  // Starts a command on a pty inside; it runs until it exits, KillCall or
  // the world's end. Its processes die with it, as a call's do.
  Result<WorldTerminal> OpenTerminal(const WorldTerminalSpec& spec);
  // Signals a running call (a terminal's): SIGKILL ends it and everything it started.
  void KillCall(long id, int sig);
  // Runs a file tool inside: `req` is {"name", "input", "workspace"};
  // the answer is the tool's JSON (see file_tools.h).
  Result<nlohmann::json> File(nlohmann::json req, int timeout_ms);

  // A fresh, unconnected TCP socket (IPv4) made by the init in the
  // sandbox's network namespace: connecting it reaches the sandbox's
  // loopback, not the host's (a port bridge's inside end).
  Result<linux::UniqueFd> OpenInsideSocket(int timeout_ms);

  // Hands the world's proxy a new value for one of the plan's secrets; the
  // next request that carries it uses the new one. The world keeps running.
  Status RotateSecret(const std::string& name, std::string_view value);

  // Replaces the world's network allow and deny lists (its supervisor's
  // Egress::SetRules): in force, and open proxy connections to targets no
  // longer allowed closed, when this returns.
  Status SetNetworkRules(const std::vector<std::string>& allow, const std::vector<std::string>& deny);

  // Binds the host path `source` (a directory or a file, no symlink on the
  // way) recursively at `target` inside the running world, read-only
  // unless `writable`, always nosuid and nodev; the mountpoint and its
  // missing parents are made on the world's root tmpfs. The init and
  // everything running stay as they are; the next call sees the path. A
  // target that is a mountpoint or lies inside a mount other than the root
  // tmpfs (a bound /usr, the private /tmp, the workspace) is refused with
  // an error naming it: such a grant needs a new world. Landlock must
  // cover the target too (LandlockCovers, confine/layers.h), or the path is
  // mounted and still denied. Errors: stage "graft", syscall, path, errno.
  Status GraftPath(const std::string& source, const std::string& target, bool writable);
  // Detaches what GraftPath mounted at `target` (and removes its
  // mountpoint): the next call no longer sees it. Only a grafted target.
  Status UngraftPath(const std::string& target);
  // Replaces the memory limit of the world's cgroup (memory.max on cgroup
  // v2, memory.limit_in_bytes on v1), in force when this returns. An error
  // when the world has no cgroup with a memory controller (its policy set
  // no memory limit when it started).
  Status SetMemoryLimit(std::uint64_t bytes);

  // SIGTERM to everything inside, SIGKILL after `grace_ms`; waits for the
  // supervisor to finish (it removes the cgroup). Idempotent.
  void Stop(int grace_ms);

  pid_t supervisor_pid() const { return supervisor_pid_; }

  // The root of the session's upper filesystem (disk_gib: a tmpfs mounted by
  // the init), once; invalid when the plan has none. Whoever holds it keeps
  // the session's changes after this world ends: its upper layer is at
  // "upper" below it, readable from the host through the fd.
  linux::UniqueFd TakeUpperFs() { return std::move(upper_fs_); }

  // A remote world's (sandbox.isolation: remote): what the remote agentbox
  // confined, as remote_world.cc's ConfinedToJson with "host",
  // "remote_pid", "remote_version" and "binary" beside it; null otherwise.
  std::shared_ptr<const nlohmann::json> remote_confined() const { return remote_confined_; }

 private:
  World() = default;
  // `raw` (may be null): an input field's bytes sent after the JSON
  // (linux/runner.h, "raw").
  Status SendControl(const nlohmann::json& request, const std::vector<int>& fds, const std::string* raw = nullptr);
  Status AskSupervisor(std::string text, std::optional<std::string>* answer, const std::string& what);
  // Reads whatever the supervisor has sent; with `until_stats`, waits (up
  // to `wait_ms`) for a stats answer. Call with channel_mu_ held.
  void PumpChannel(bool until_stats, int wait_ms);
  std::uint64_t QueryOomKills();

  std::optional<std::string> rotation_error_;  // the last "rotated" answer ("" = applied); state_mu_
  std::optional<std::string> network_error_;   // the last "network" answer ("" = applied); state_mu_
  std::optional<std::string> grant_error_;     // the last "graft"/"ungraft"/"memory" answer; state_mu_
  Status grant_status_;                         // that answer as a Status; state_mu_
  pid_t supervisor_pid_ = -1;
  std::string cgroup_mechanism_;
  linux::RlimitsSet rlimits_;
  std::vector<std::string> skipped_;
  std::vector<MissingFacet> short_of_plan_;
  linux::UniqueFd supervisor_pidfd_;
  linux::UniqueFd channel_;  // to the supervisor
  linux::UniqueFd control_;  // to the init
  linux::UniqueFd upper_fs_;
  std::shared_ptr<const nlohmann::json> remote_confined_;
  std::mutex send_mu_;
  std::mutex channel_mu_;
  std::atomic<long> next_id_{1};
  std::atomic<bool> dead_{false};
  bool stopped_ = false;
  std::mutex state_mu_;      // guards what follows
  std::string death_;
  std::uint64_t oom_kills_ = 0;
  bool stats_fresh_ = false;
  std::deque<std::pair<std::chrono::steady_clock::time_point, nlohmann::json>> connections_;
};

// The `agentbox __world` process: fd 3 is the channel, fd 4 the plan; its
// environment is empty. Returns the process's exit status.
int WorldMain();

// The fd on which `agentbox __world` finds its plan (a memfd, as JSON).
inline constexpr int kWorldPlanFd = 4;
// The fd on which it finds an earlier world's upper filesystem, when the
// plan's WorkspaceOverlay::upper_seeded says there is one.
inline constexpr int kWorldUpperSeedFd = 5;

// `plan` with the variables its env.pass (or pass_all) takes from this
// process's environment resolved into env.set: nothing below the caller
// reads an environment of its own.
Plan WithResolvedEnv(const Plan& plan);

// Points the plan's workspace (its bind's source, the mounts and deny-glob
// scans below it) at `to`: a session's copy of the workspace.
void RebaseWorkspace(Plan* plan, const std::string& to);

}  // namespace agentbox::session
