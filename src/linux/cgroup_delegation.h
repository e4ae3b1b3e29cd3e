// Cgroup delegation: a subtree that root hands to one user once
// (`agentbox setup-delegation --user NAME`), so that the user's runs get
// memory, cpu and process-count limits without root.
//
// The model is the kernel's, as rootless container engines use it
// (Documentation/admin-guide/cgroup-v2.rst, "Delegation"; cgroup-v1/cgroups.rst,
// "Attaching processes"):
//  - v1: a directory per hierarchy, owned by the user (so the user may
//    mkdir children, whose files the kernel then gives to their creator),
//    with its `tasks` and `cgroup.procs`. A task may be moved by a writer of
//    the target `tasks` file whose euid is the task's uid: the user's own
//    runner moves itself, from wherever it is.
//  - v2: a directory owned by the user with its cgroup.procs,
//    cgroup.threads and cgroup.subtree_control, the controllers enabled for
//    it in its parent's cgroup.subtree_control where the kernel allows (not
//    where the parent holds processes: the no-internal-process rule), and a
//    leaf `login` for the user's processes. The v2 migration rule: the
//    writer must be able to write cgroup.procs of the common ancestor of the
//    source and destination cgroups (clone3's CLONE_INTO_CGROUP included). A
//    user process outside the delegated directory cannot place anything in
//    it: the v2 delegation serves agentbox only when it runs inside it.
//
// The record of a delegation is a root-owned JSON file per user,
// <record dir>/<uid>.json (/run/agentbox/delegation, or the directory in
// AGENTBOX_DELEGATION_RECORD, read by the supervisor and by setup-delegation
// only). An unprivileged agentbox uses a directory it names only after
// checking, with fstat on the opened directory, that the directory is owned
// by its uid and lies on a cgroup filesystem of the right hierarchy: the
// record says where, the kernel's own answers say whether.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agentbox/status.h"
#include "linux/cgroups.h"

namespace agentbox::linux {

// What setup-delegation handed to a user.
struct DelegationRecord {
  std::string user;
  uid_t uid = 0;
  gid_t gid = 0;
  std::map<std::string, std::string> v1;    // controller -> delegated directory
  std::string v2_dir;                       // the delegated v2 directory ("" = none)
  std::vector<std::string> v2_controllers;  // enabled for children of v2_dir
  std::string v2_entry;                     // v2_dir/login: where the user's processes go
};

// The record directory: $AGENTBOX_DELEGATION_RECORD, else /run/agentbox/delegation.
std::string DelegationRecordDir();
std::string DelegationRecordPath(const std::string& dir, uid_t uid);
std::string DelegationRecordJson(const DelegationRecord& record);
Result<DelegationRecord> ParseDelegationRecord(const std::string& text);
// The record for `uid` in `dir`: nullopt when there is none; an error when
// it is there but unreadable, unparseable, for another uid, or not owned by
// root or writable by anyone but root (then it is not setup-delegation's).
Result<std::optional<DelegationRecord>> ReadDelegationRecord(const std::string& dir, uid_t uid);

// Whether `dir` may serve `uid` as a delegated cgroup: a directory (no
// symlink at its end), owned by `uid` (fstat on the opened directory), on a
// cgroup filesystem (fstatfs; skipped under a fake root) and under
// `mount`, the mount point of the hierarchy it stands for.
Status CheckDelegatedDir(const CgroupFs& fs, const std::string& dir, const std::string& mount, uid_t uid);

// Puts the record's directories in `layout` for the controllers whose own
// cgroup gives nothing to a child (ChooseHierarchy says kNone), after
// CheckDelegatedDir; the v2 directory only when our v2 cgroup lies inside
// it (the migration rule). What is not used is said in delegation_notes.
void UseDelegation(const CgroupFs& fs, const DelegationRecord& record, uid_t uid, CgroupLayout* layout);

// DiscoverCgroupLayout, with this uid's delegation (if any) put in: what the
// supervisor, the probe and `gc` use.
CgroupLayout DiscoverRunCgroupLayout(const CgroupFs& fs);

// Inside a scope that systemd delegated to this process (`run
// --systemd-scope`, Delegate=yes): our v2 cgroup, a *.scope we own, holds
// us, so the kernel gives its children no controller (the no-internal-process
// rule). Moves this process (single-threaded: call it before any thread
// starts) into the leaf <scope>/supervisor and enables the scope's
// controllers for its children; DiscoverRunCgroupLayout then takes the
// scope as the delegated v2 directory (AGENTBOX_SYSTEMD_SCOPE=1 set).
// The process moves only downwards, within the scope made for it.
Status EnterDelegatedScope(const CgroupFs& fs, uid_t uid);
// The scope EnterDelegatedScope moved us below, when our v2 cgroup is its
// `supervisor` leaf; else "".
std::string DelegatedScopeOf(const CgroupLayout& layout);

// ------------------------------------------------------- setup-delegation

// One directory to hand over: a v1 hierarchy's (controllers share it when
// co-mounted) or the v2 one ("v2" in `controllers`' place: hierarchy).
struct DelegationTarget {
  std::string hierarchy;                 // "v1" or "v2"
  std::vector<std::string> controllers;  // v1: the hierarchy's controllers; v2: those to enable
  std::string parent;                    // the existing cgroup it goes under
  std::string dir;                       // parent/agentbox-delegate-<user>
};

struct DelegationPlan {
  std::string user;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<DelegationTarget> targets;
  std::vector<std::string> notes;  // hierarchies left out, and why
};

// The plan, pure but for reading cgroup.controllers: parents default to
// root's own cgroup in each hierarchy that carries memory, pids, cpu or
// cpuacct (v2: when it lists one of memory, pids, cpu); `parents`, when not
// empty, name exactly the hierarchies to delegate and where (each is
// matched to the hierarchy mounted above it).
Result<DelegationPlan> PlanDelegation(const CgroupFs& fs, const CgroupLayout& layout, const std::string& user,
                                      uid_t uid, gid_t gid, const std::vector<std::string>& parents);
// Carries the plan out (existing directories are taken as they are: running
// it twice is fine) and returns the record to write, with what the kernel
// refused in `notes` (a v2 controller it would not enable).
Result<DelegationRecord> ApplyDelegation(const CgroupFs& fs, const DelegationPlan& plan,
                                         std::vector<std::string>* notes);
// Removes the plan's directories and the record's: stale run cgroups in
// them are collected first (CollectStaleCgroups); a directory that still
// has a child cgroup or a process is refused, with its path, and nothing is
// killed. Missing directories are fine.
Status RemoveDelegation(const CgroupFs& fs, const DelegationPlan& plan, const std::optional<DelegationRecord>& record);

// Writes the record (root-owned, mode 0644, by rename) / removes it.
Status WriteDelegationRecord(const std::string& dir, const DelegationRecord& record);
Status RemoveDelegationRecord(const std::string& dir, uid_t uid);

}  // namespace agentbox::linux
