// Cgroups: one cgroup per run, nested under the cgroup agentbox runs in.
//
// Both layouts: pure v2, and hybrid (v1 controllers, plus a v2 hierarchy
// that may hold no controller at all). Each controller the limits need is
// taken from v2 when our own v2 cgroup can hand it to a child, else from its
// v1 hierarchy. No process is ever moved out of its own cgroup: the sandbox
// cgroup is a new child of ours, in every hierarchy used.
//
// Everything goes through CgroupFs, rooted at an injected path: "/" on a
// host, a directory of plain files in the unit tests (a fake cgroupfs).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agentbox/plan.h"
#include "agentbox/status.h"
#include "linux/fd.h"

namespace agentbox::linux {

// The cgroup filesystem (and /proc/self) seen from a root directory. Paths
// given to it are absolute ("/sys/fs/cgroup/..."); it prefixes its root.
// Stateless and thread-compatible.
class CgroupFs {
 public:
  explicit CgroupFs(std::string root = "/");

  Status MakeDir(const std::string& path) const;       // mkdir 0755; EEXIST is an error
  Status RemoveDir(const std::string& path) const;     // rmdir (cgroupfs: the cgroup goes)
  Status Write(const std::string& path, const std::string& value) const;  // one write(2)
  Result<std::string> Read(const std::string& path) const;
  Result<UniqueFd> OpenDir(const std::string& path) const;  // O_PATH|O_DIRECTORY, for clone3
  Result<UniqueFd> OpenForWrite(const std::string& path) const;
  std::vector<std::string> List(const std::string& dir) const;  // subdirectory names
  // An extended attribute of a directory (user.*: cgroupfs keeps them since 5.7).
  Status SetTag(const std::string& path, const std::string& name, const std::string& value) const;
  std::optional<std::string> Tag(const std::string& path, const std::string& name) const;
  // chown without following a symlink (setup-delegation hands a cgroup to a user).
  Status Chown(const std::string& path, uid_t uid, gid_t gid) const;

  const std::string& root() const { return root_; }

 private:
  std::string Real(const std::string& path) const;
  std::string root_;
};

// Where this process's own cgroups are. Pure data from /proc/self/mountinfo
// and /proc/self/cgroup (plus each v2 cgroup's controller files).
struct CgroupLayout {
  std::string v2_dir;                          // our cgroup in the v2 hierarchy ("" = none)
  bool v2_is_root = false;                     // it is the hierarchy's root (no internal-process rule)
  std::vector<std::string> v2_controllers;     // listed in its cgroup.controllers
  std::vector<std::string> v2_subtree;         // already enabled in its cgroup.subtree_control
  std::map<std::string, std::string> v1_dirs;  // controller -> our cgroup in its v1 hierarchy
  std::string v2_mount;                        // where the v2 hierarchy is mounted ("" = nowhere)
  std::map<std::string, std::string> v1_mounts;  // controller -> where its v1 hierarchy is mounted
  // Set by UseDelegation (cgroup_delegation.h): controller ("v2" for the v2
  // hierarchy) -> the delegated directory that stands in v1_dirs / v2_dir
  // for our own, unwritable cgroup; and why a delegation on record was not used.
  std::map<std::string, std::string> delegated;
  std::vector<std::string> delegation_notes;
};

// Parses the two /proc files. Mount roots other than "/" (a bind-mounted
// sub-hierarchy, as in containers without a cgroup namespace) are honoured.
CgroupLayout ParseCgroupLayout(const std::string& mountinfo, const std::string& self_cgroup);
// Reads /proc/self/{mountinfo,cgroup} and the v2 controller lists through `fs`.
CgroupLayout DiscoverCgroupLayout(const CgroupFs& fs);

// The whitespace-separated words of a cgroup file (cgroup.controllers,
// cgroup.subtree_control, ...), and whether `x` is among them.
std::vector<std::string> Words(const std::string& s);
bool Has(const std::vector<std::string>& v, const std::string& x);

enum class Hierarchy { kNone, kV1, kV2 };

// Which hierarchy gives each controller to a child of ours: v2 when our v2
// cgroup lists it and can enable it for children (already enabled, or the
// hierarchy root), else v1 when our v1 cgroup is writable (access(W_OK)).
Hierarchy ChooseHierarchy(const CgroupFs& fs, const CgroupLayout& layout, const std::string& controller);

// What the cgroup saw, read after the run.
struct CgroupStats {
  std::uint64_t oom_kills = 0;                  // memory.events oom_kill / oom_control oom_kill
  std::uint64_t memory_failcnt = 0;             // v1 memory.failcnt (limit hits)
  bool oom_counter = false;                     // an OOM-kill counter was readable
  std::optional<std::uint64_t> peak_memory_bytes;  // memory.peak / max_usage_in_bytes
  std::optional<std::uint64_t> peak_processes;     // pids.peak
  std::optional<std::uint64_t> cpu_user_us, cpu_sys_us;  // cpu.stat / cpuacct
};

// Parsers of the counter files, exposed for the tests.
std::optional<std::uint64_t> KeyedValue(const std::string& text, const std::string& key);

// The name of a run's cgroup: agentbox-<random>. The name shows inside the
// sandbox (/proc/self/cgroup), so it carries nothing of the host: no pid,
// no pid namespace, not the run's nonce. Its owner is a tag on the
// directory instead (CgroupOwner, user.agentbox.owner), from which a stale
// one (its supervisor gone) is told from a live one without any state file.
std::string SandboxCgroupName();
// This process as a cgroup's owner: <pidns>-<pid>-<starttime>.
std::string CgroupOwner(const CgroupFs& fs);

// One run's cgroup in every hierarchy it needs. Created with its limits
// written; destroyed (leftover processes killed, directories removed, with
// retries while the kernel lets go of exiting tasks) by the destructor.
class SandboxCgroup {
 public:
  // Creates `name` under our own cgroup for each controller `limits` needs
  // (plus a v2 cgroup for placement and cgroup.kill where our v2 cgroup is
  // writable). Every failure names the file and errno; a half-made cgroup is
  // removed again.
  static Result<std::unique_ptr<SandboxCgroup>> Create(const CgroupFs& fs, const CgroupLayout& layout,
                                                       const ResourceLimits& limits, const std::string& name);
  ~SandboxCgroup();
  SandboxCgroup(const SandboxCgroup&) = delete;
  SandboxCgroup& operator=(const SandboxCgroup&) = delete;

  // The v2 cgroup's fd for clone3(CLONE_INTO_CGROUP); -1 when there is none.
  int v2_fd() const { return v2_fd_.get(); }
  // v1 cgroups need the runner's pid written into them after the clone.
  bool NeedsAttach() const { return !v1_dirs_.empty(); }
  // v1 placement from inside: the `tasks` file of each v1 cgroup, opened
  // here (the kernel checks the opener's credentials); the runner writes "0"
  // to each as its first step, which moves just itself without taking the
  // cgroup threadgroup lock for writing (an RCU grace period per run).
  [[nodiscard]] Result<std::vector<UniqueFd>> OpenTaskFiles() const;
  // Sends `sig` to every process in the cgroup (but `except`).
  void SignalAll(int sig, pid_t except = -1) const;
  // Kills everything in it: cgroup.kill where the kernel has it, else SIGKILL
  // to each listed process (repeated until the lists stay empty).
  void KillAll() const;
  CgroupStats ReadStats() const;
  // Replaces the memory ceiling (v2 memory.max; v1 memory.limit_in_bytes,
  // and memory.memsw.limit_in_bytes with it where swap is accounted) while
  // the sandbox runs. A limit below what it uses now makes the kernel
  // reclaim, then OOM-kill inside. An error when the cgroup has no memory
  // controller (none was asked for at creation).
  [[nodiscard]] Status SetMemoryMax(std::uint64_t bytes);
  // The limits written, for the report ("memory.max=536870912", ...).
  const std::vector<std::string>& applied() const { return applied_; }
  // "cgroup-v2", "cgroup-v1" or "cgroup-v1+v2".
  std::string Mechanism() const;

 private:
  SandboxCgroup(const CgroupFs& fs) : fs_(fs) {}
  std::vector<std::string> AllDirs() const;
  std::vector<pid_t> Pids() const;

  CgroupFs fs_;
  std::string v2_dir_;                          // "" when no v2 cgroup
  UniqueFd v2_fd_;
  std::map<std::string, std::string> v1_dirs_;  // controller -> created dir
  std::map<std::string, Hierarchy> where_;      // controller -> hierarchy used
  std::vector<std::string> applied_;
};

// Stale run cgroups under our own cgroups: their supervisor (same pid
// namespace) is gone or is another process now. Kills what is left in them
// and removes them. Cgroups of live runs, or of other pid namespaces, are
// never touched. Returns what was removed.
std::vector<std::string> CollectStaleCgroups(const CgroupFs& fs, const CgroupLayout& layout);

}  // namespace agentbox::linux
