#include "linux/cgroup_delegation.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

namespace agentbox::linux {
namespace {

constexpr const char* kDefaultRecordDir = "/run/agentbox/delegation";
constexpr const char* kDirPrefix = "agentbox-delegate-";
constexpr const char* kEntryLeaf = "login";
// The supervisor's leaf inside a delegated systemd scope (EnterDelegatedScope).
constexpr const char* kScopeLeaf = "supervisor";
// The controllers a run's limits need (cpuacct: v1 cpu usage).
const std::vector<std::string> kV1Controllers = {"memory", "pids", "cpu", "cpuacct"};
const std::vector<std::string> kV2Controllers = {"memory", "pids", "cpu"};

bool Within(const std::string& path, const std::string& dir) {
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         (dir == "/" || path[dir.size()] == '/'));
}

std::string Stripped(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

bool Exists(const CgroupFs& fs, const std::string& dir) { return fs.OpenDir(dir).ok(); }

// mkdir that takes an existing directory as done (setup-delegation twice).
Status MakeDirOnce(const CgroupFs& fs, const std::string& dir) {
  Status s = fs.MakeDir(dir);
  if (s.ok() || (s.err() == EEXIST && Exists(fs, dir))) return {};
  return s;
}

std::string ReadOr(const CgroupFs& fs, const std::string& path) {
  auto text = fs.Read(path);
  return text.ok() ? *text : std::string();
}

}  // namespace

// ------------------------------------------------------------------ record

std::string DelegationRecordDir() {
  const char* env = std::getenv("AGENTBOX_DELEGATION_RECORD");
  return env && *env ? std::string(env) : std::string(kDefaultRecordDir);
}

std::string DelegationRecordPath(const std::string& dir, uid_t uid) {
  return Stripped(dir) + "/" + std::to_string(uid) + ".json";
}

std::string DelegationRecordJson(const DelegationRecord& r) {
  nlohmann::json j = {{"version", 1},
                      {"created_by", "agentbox setup-delegation"},
                      {"user", r.user},
                      {"uid", r.uid},
                      {"gid", r.gid},
                      {"v1", r.v1}};
  if (r.v2_dir.empty()) {
    j["v2"] = nullptr;
  } else {
    j["v2"] = {{"dir", r.v2_dir}, {"controllers", r.v2_controllers}, {"entry", r.v2_entry}};
  }
  return j.dump(2) + "\n";
}

Result<DelegationRecord> ParseDelegationRecord(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Error("delegation", "record is not a JSON object");
  DelegationRecord r;
  try {
    if (j.value("version", 0) != 1) return Status::Error("delegation", "record version is not 1");
    r.user = j.at("user").get<std::string>();
    r.uid = j.at("uid").get<uid_t>();
    r.gid = j.at("gid").get<gid_t>();
    for (const auto& [c, dir] : j.at("v1").items()) r.v1[c] = dir.get<std::string>();
    const auto& v2 = j.at("v2");
    if (!v2.is_null()) {
      r.v2_dir = v2.at("dir").get<std::string>();
      r.v2_controllers = v2.at("controllers").get<std::vector<std::string>>();
      r.v2_entry = v2.value("entry", "");
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::Error("delegation", std::string("record: ") + e.what());
  }
  auto absolute = [](const std::string& p) { return !p.empty() && p[0] == '/' && p.find("/../") == std::string::npos; };
  for (const auto& [c, dir] : r.v1) {
    if (!absolute(dir)) return Status::Error("delegation", "record: v1 " + c + " directory is not absolute: " + dir);
  }
  if (!r.v2_dir.empty() && !absolute(r.v2_dir)) {
    return Status::Error("delegation", "record: v2 directory is not absolute: " + r.v2_dir);
  }
  return r;
}

Result<std::optional<DelegationRecord>> ReadDelegationRecord(const std::string& dir, uid_t uid) {
  const std::string path = DelegationRecordPath(dir, uid);
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) {
    if (errno == ENOENT) return std::optional<DelegationRecord>();
    return Status::Errno("delegation", "open", path);
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return Status::Errno("delegation", "fstat", path);
  // setup-delegation's own: root's, and nobody else may change it.
  if (!S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & (S_IWGRP | S_IWOTH))) {
    return Status::Error("delegation", path + " is not a root-owned regular file writable by root only: ignored");
  }
  std::string text;
  char buf[4096];
  for (;;) {
    ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::Errno("delegation", "read", path);
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  auto r = ParseDelegationRecord(text);
  if (!r.ok()) return Status::Error("delegation", path + ": " + r.status().message());
  if (r->uid != uid) {
    return Status::Error("delegation", path + " is for uid " + std::to_string(r->uid) + ", not " + std::to_string(uid));
  }
  return std::optional<DelegationRecord>(std::move(*r));
}

// ------------------------------------------------------------------- using it

Status CheckDelegatedDir(const CgroupFs& fs, const std::string& dir, const std::string& mount, uid_t uid) {
  if (mount.empty() || !Within(dir, mount) || dir == mount) {
    return Status::Error("delegation", dir + " is not below the hierarchy's mount point " +
                                           (mount.empty() ? std::string("(not mounted)") : mount));
  }
  // O_NOFOLLOW: the last component must be the directory itself.
  UniqueFd fd(open((fs.root() == "/" ? dir : fs.root() + dir).c_str(),
                   O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno("delegation", "open(O_PATH|O_NOFOLLOW)", dir);
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return Status::Errno("delegation", "fstat", dir);
  if (st.st_uid != uid) {
    return Status::Error("delegation", dir + " is owned by uid " + std::to_string(st.st_uid) + ", not by uid " +
                                           std::to_string(uid) + ": not delegated to this user");
  }
  if (fs.root() == "/") {
    struct statfs sfs {};
    if (fstatfs(fd.get(), &sfs) != 0) return Status::Errno("delegation", "fstatfs", dir);
    if (sfs.f_type != CGROUP_SUPER_MAGIC && sfs.f_type != CGROUP2_SUPER_MAGIC) {
      return Status::Error("delegation", dir + " is not on a cgroup filesystem");
    }
  }
  return {};
}

void UseDelegation(const CgroupFs& fs, const DelegationRecord& record, uid_t uid, CgroupLayout* layout) {
  // v2 first: ChooseHierarchy prefers it.
  bool v2_needed = false;
  for (const auto& c : kV2Controllers) v2_needed = v2_needed || ChooseHierarchy(fs, *layout, c) == Hierarchy::kNone;
  if (!record.v2_dir.empty() && v2_needed) {
    const std::string& d = record.v2_dir;
    if (Status s = CheckDelegatedDir(fs, d, layout->v2_mount, uid); !s.ok()) {
      layout->delegation_notes.push_back("v2: " + s.message());
    } else if (layout->v2_dir.empty() || !Within(layout->v2_dir, d)) {
      layout->delegation_notes.push_back(
          "v2: the delegated cgroup " + d + " is not used: this process's v2 cgroup (" +
          (layout->v2_dir.empty() ? std::string("none") : layout->v2_dir) +
          ") is outside it, and the kernel moves a process into a cgroup only for a writer of "
          "cgroup.procs in the common ancestor of both; run agentbox from inside it (as root: "
          "echo <pid of the user's shell> > " + (record.v2_entry.empty() ? d : record.v2_entry) +
          "/cgroup.procs)");
    } else {
      CgroupLayout with = *layout;
      with.v2_dir = d;
      with.v2_is_root = false;
      with.v2_controllers = Words(ReadOr(fs, d + "/cgroup.controllers"));
      with.v2_subtree = Words(ReadOr(fs, d + "/cgroup.subtree_control"));
      bool gives = false;
      for (const auto& c : kV2Controllers) gives = gives || ChooseHierarchy(fs, with, c) == Hierarchy::kV2;
      if (gives) {
        with.delegated["v2"] = d;
        *layout = std::move(with);
      } else {
        layout->delegation_notes.push_back("v2: the delegated cgroup " + d +
                                           " enables none of memory, pids, cpu in its cgroup.subtree_control");
      }
    }
  }
  for (const auto& [c, d] : record.v1) {
    if (!Has(kV1Controllers, c)) continue;
    if (ChooseHierarchy(fs, *layout, c) != Hierarchy::kNone) continue;  // our own cgroup serves
    auto mount = layout->v1_mounts.find(c);
    Status s = CheckDelegatedDir(fs, d, mount == layout->v1_mounts.end() ? "" : mount->second, uid);
    if (!s.ok()) {
      layout->delegation_notes.push_back(c + ": " + s.message());
      continue;
    }
    layout->v1_dirs[c] = d;
    layout->delegated[c] = d;
  }
}

std::string DelegatedScopeOf(const CgroupLayout& layout) {
  const std::string leaf = std::string("/") + kScopeLeaf;
  const std::string& d = layout.v2_dir;
  if (d.size() <= leaf.size() || d.compare(d.size() - leaf.size(), leaf.size(), leaf) != 0) return "";
  std::string scope = d.substr(0, d.size() - leaf.size());
  const std::string suffix = ".scope";
  if (scope.size() <= suffix.size() || scope.compare(scope.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return "";
  }
  return scope;
}

Status EnterDelegatedScope(const CgroupFs& fs, uid_t uid) {
  CgroupLayout layout = DiscoverCgroupLayout(fs);
  if (!DelegatedScopeOf(layout).empty()) return {};  // entered already
  const std::string& scope = layout.v2_dir;
  if (scope.size() < 7 || scope.compare(scope.size() - 6, 6, ".scope") != 0) {
    return Status::Error("delegation", "--systemd-scope: this process's v2 cgroup " +
                                           (scope.empty() ? std::string("(none)") : scope) + " is not a systemd scope");
  }
  if (Status s = CheckDelegatedDir(fs, scope, layout.v2_mount, uid); !s.ok()) {
    return Status::Error("delegation", "--systemd-scope: the scope is not delegated to this user (Delegate=yes): " +
                                           s.message());
  }
  const std::string leaf = scope + "/" + kScopeLeaf;
  if (Status s = MakeDirOnce(fs, leaf); !s.ok()) return s;
  // "0": the writing process itself (cgroup-v2.rst, "Processes").
  if (Status s = fs.Write(leaf + "/cgroup.procs", "0"); !s.ok()) return s;
  auto offered = Words(ReadOr(fs, scope + "/cgroup.controllers"));
  auto enabled = Words(ReadOr(fs, scope + "/cgroup.subtree_control"));
  for (const auto& c : kV2Controllers) {
    if (!Has(offered, c) || Has(enabled, c)) continue;
    if (Status s = fs.Write(scope + "/cgroup.subtree_control", "+" + c); !s.ok()) return s;
  }
  return {};
}

CgroupLayout DiscoverRunCgroupLayout(const CgroupFs& fs) {
  CgroupLayout layout = DiscoverCgroupLayout(fs);
  // A systemd scope we were re-executed in (run --systemd-scope): its own
  // delegation, with no record; UseDelegation checks it like one.
  if (const char* in_scope = std::getenv("AGENTBOX_SYSTEMD_SCOPE"); in_scope && std::string(in_scope) == "1") {
    if (std::string scope = DelegatedScopeOf(layout); !scope.empty()) {
      DelegationRecord own;
      own.uid = geteuid();
      own.v2_dir = scope;
      UseDelegation(fs, own, geteuid(), &layout);
      return layout;
    }
  }
  auto record = ReadDelegationRecord(DelegationRecordDir(), geteuid());
  if (!record.ok()) {
    layout.delegation_notes.push_back(record.status().message());
  } else if (*record) {
    UseDelegation(fs, **record, geteuid(), &layout);
  }
  return layout;
}

// --------------------------------------------------------- setup-delegation

Result<DelegationPlan> PlanDelegation(const CgroupFs& fs, const CgroupLayout& layout, const std::string& user,
                                      uid_t uid, gid_t gid, const std::vector<std::string>& parents) {
  DelegationPlan plan;
  plan.user = user;
  plan.uid = uid;
  plan.gid = gid;
  const std::string leaf = kDirPrefix + user;
  // hierarchy key (a mount point) -> target being built
  std::map<std::string, DelegationTarget> by_mount;
  std::vector<std::string> order;
  auto add = [&](const std::string& mount, const std::string& hierarchy, const std::string& controller,
                 const std::string& parent) -> Status {
    auto it = by_mount.find(mount);
    if (it == by_mount.end()) {
      DelegationTarget t{hierarchy, {}, parent, parent + "/" + leaf};
      it = by_mount.emplace(mount, t).first;
      order.push_back(mount);
    } else if (it->second.parent != parent) {
      return Status::Error("delegation", "two parents in one hierarchy: " + it->second.parent + " and " + parent);
    }
    if (!Has(it->second.controllers, controller)) it->second.controllers.push_back(controller);
    return {};
  };

  std::vector<std::string> wanted_parents;
  for (const auto& p : parents) wanted_parents.push_back(Stripped(p));
  // The hierarchy holding `parent`: the longest mount point above it.
  auto parent_for = [&](const std::string& mount, const std::string& own) -> std::optional<std::string> {
    if (wanted_parents.empty()) return own;
    for (const auto& p : wanted_parents) {
      if (Within(p, mount)) return p;
    }
    return std::nullopt;
  };
  for (const auto& p : wanted_parents) {
    bool matched = layout.v2_mount.size() && Within(p, layout.v2_mount);
    for (const auto& c : kV1Controllers) {
      auto m = layout.v1_mounts.find(c);
      matched = matched || (m != layout.v1_mounts.end() && Within(p, m->second));
    }
    if (!matched) {
      return Status::Error("delegation", "--parent " + p + ": not in a cgroup hierarchy of memory, pids, cpu, "
                                         "cpuacct or the v2 hierarchy mounted here");
    }
    if (!Exists(fs, p)) return Status::Syscall("delegation", "open(O_PATH)", p, ENOENT);
  }

  for (const auto& c : kV1Controllers) {
    auto m = layout.v1_mounts.find(c);
    auto own = layout.v1_dirs.find(c);
    if (m == layout.v1_mounts.end() || own == layout.v1_dirs.end()) continue;
    auto parent = parent_for(m->second, own->second);
    if (!parent) continue;
    if (Status s = add(m->second, "v1", c, *parent); !s.ok()) return s;
  }
  if (!layout.v2_mount.empty() && !layout.v2_dir.empty()) {
    if (auto parent = parent_for(layout.v2_mount, layout.v2_dir)) {
      auto offered = Words(ReadOr(fs, *parent + "/cgroup.controllers"));
      std::vector<std::string> give;
      for (const auto& c : kV2Controllers) {
        if (Has(offered, c)) give.push_back(c);
      }
      if (give.empty()) {
        plan.notes.push_back("v2: not delegated: " + *parent +
                             "/cgroup.controllers lists none of memory, pids, cpu (their hierarchies are v1 here)");
      } else {
        for (const auto& c : give) {
          if (Status s = add(layout.v2_mount, "v2", c, *parent); !s.ok()) return s;
        }
      }
    }
  }
  for (const auto& m : order) plan.targets.push_back(by_mount[m]);
  if (plan.targets.empty()) return Status::Error("delegation", "no cgroup hierarchy to delegate here");
  return plan;
}

namespace {


Status ChownAll(const CgroupFs& fs, const std::string& dir, const std::vector<std::string>& files, uid_t uid,
                gid_t gid) {
  if (Status s = fs.Chown(dir, uid, gid); !s.ok()) return s;
  for (const auto& f : files) {
    if (Status s = fs.Chown(dir + "/" + f, uid, gid); !s.ok()) return s;
  }
  return {};
}

}  // namespace

Result<DelegationRecord> ApplyDelegation(const CgroupFs& fs, const DelegationPlan& plan,
                                         std::vector<std::string>* notes) {
  DelegationRecord r;
  r.user = plan.user;
  r.uid = plan.uid;
  r.gid = plan.gid;
  for (const auto& t : plan.targets) {
    if (t.hierarchy == "v1") {
      // The directory (children: mkdir needs write on it) and the files that
      // place a task in it; the children's own files go to their creator.
      if (Status s = MakeDirOnce(fs, t.dir); !s.ok()) return s;
      if (Status s = ChownAll(fs, t.dir, {"tasks", "cgroup.procs"}, plan.uid, plan.gid); !s.ok()) return s;
      for (const auto& c : t.controllers) r.v1[c] = t.dir;
      continue;
    }
    // v2: the controllers must be enabled in the parent's subtree_control
    // for the directory to have them; a parent that holds processes (and is
    // not the root) may not enable any (the no-internal-process rule).
    auto enabled = Words(ReadOr(fs, t.parent + "/cgroup.subtree_control"));
    std::vector<std::string> have;
    for (const auto& c : t.controllers) {
      if (!Has(enabled, c)) {
        Status s = fs.Write(t.parent + "/cgroup.subtree_control", "+" + c);
        if (!s.ok()) {
          notes->push_back("v2: " + c + " not delegated: " + s.message() +
                           (s.err() == EBUSY ? " (" + t.parent + " holds processes and is not the root: the kernel "
                                               "enables no controller for its children; use a --parent whose "
                                               "cgroup holds no process)"
                                             : std::string()));
          continue;
        }
      }
      have.push_back(c);
    }
    if (have.empty()) {
      notes->push_back("v2: nothing delegated under " + t.parent);
      continue;
    }
    if (Status s = MakeDirOnce(fs, t.dir); !s.ok()) return s;
    if (Status s = ChownAll(fs, t.dir, {"cgroup.procs", "cgroup.threads", "cgroup.subtree_control"}, plan.uid,
                            plan.gid);
        !s.ok()) {
      return s;
    }
    // The directory holds no process: its children (the runs, and `login`)
    // may get the controllers.
    auto own = Words(ReadOr(fs, t.dir + "/cgroup.subtree_control"));
    for (const auto& c : have) {
      if (Has(own, c)) continue;
      if (Status s = fs.Write(t.dir + "/cgroup.subtree_control", "+" + c); !s.ok()) return s;
    }
    // Where the user's shell or service goes: processes may not sit in a
    // cgroup that gives controllers to its children.
    const std::string entry = t.dir + "/" + kEntryLeaf;
    if (Status s = MakeDirOnce(fs, entry); !s.ok()) return s;
    if (Status s = ChownAll(fs, entry, {"cgroup.procs", "cgroup.threads", "cgroup.subtree_control"}, plan.uid,
                            plan.gid);
        !s.ok()) {
      return s;
    }
    r.v2_dir = t.dir;
    r.v2_controllers = have;
    r.v2_entry = entry;
  }
  return r;
}

Status RemoveDelegation(const CgroupFs& fs, const DelegationPlan& plan, const std::optional<DelegationRecord>& record) {
  // Every directory either names, each once; the v2 one with its entry leaf.
  std::vector<std::string> v1_dirs, v2_dirs;
  auto note = [](std::vector<std::string>* v, const std::string& d) {
    if (!d.empty() && !Has(*v, d)) v->push_back(d);
  };
  for (const auto& t : plan.targets) note(t.hierarchy == "v2" ? &v2_dirs : &v1_dirs, t.dir);
  if (record) {
    for (const auto& [c, d] : record->v1) note(&v1_dirs, d);
    note(&v2_dirs, record->v2_dir);
  }
  // Stale run cgroups first (their supervisors are gone), as `gc` does.
  for (const auto& d : v1_dirs) {
    CgroupLayout one;
    one.v1_dirs["memory"] = d;
    if (Exists(fs, d)) (void)CollectStaleCgroups(fs, one);
  }
  for (const auto& d : v2_dirs) {
    CgroupLayout one;
    one.v2_dir = d;
    if (Exists(fs, d)) (void)CollectStaleCgroups(fs, one);
  }
  // Refuse, naming what is left, before removing anything.
  auto busy = [&](const std::string& d, bool v2) -> Status {
    if (!Exists(fs, d)) return {};
    for (const auto& child : fs.List(d)) {
      if (v2 && child == kEntryLeaf) continue;
      return Status::Error("delegation", "refusing to remove " + d + ": it still has the child cgroup " + child +
                                             " (a live run, or the user's own)");
    }
    std::vector<std::string> with_procs = {d};
    if (v2) with_procs.push_back(d + "/" + kEntryLeaf);
    for (const auto& p : with_procs) {
      auto procs = fs.Read(p + "/cgroup.procs");
      if (procs.ok() && !Words(*procs).empty()) {
        return Status::Error("delegation", "refusing to remove " + p + ": processes still in it (" +
                                               p + "/cgroup.procs: " + Words(*procs)[0] + " ...)");
      }
      if (v2 && p != d && Exists(fs, p) && !fs.List(p).empty()) {
        return Status::Error("delegation", "refusing to remove " + p + ": it still has child cgroups");
      }
    }
    return {};
  };
  for (const auto& d : v1_dirs) {
    if (Status s = busy(d, false); !s.ok()) return s;
  }
  for (const auto& d : v2_dirs) {
    if (Status s = busy(d, true); !s.ok()) return s;
  }
  auto remove = [&](const std::string& d) -> Status {
    Status s = fs.RemoveDir(d);
    return s.ok() || s.err() == ENOENT ? Status() : s;
  };
  for (const auto& d : v2_dirs) {
    if (Status s = remove(d + "/" + kEntryLeaf); !s.ok()) return s;
    if (Status s = remove(d); !s.ok()) return s;
  }
  for (const auto& d : v1_dirs) {
    if (Status s = remove(d); !s.ok()) return s;
  }
  return {};
}

Status WriteDelegationRecord(const std::string& dir, const DelegationRecord& record) {
  // /run/agentbox and its delegation directory: root's, readable by all.
  std::string made;
  for (const auto& part : [&] {
         std::vector<std::string> parts;
         std::istringstream in(Stripped(dir));
         std::string p;
         while (std::getline(in, p, '/')) {
           if (!p.empty()) parts.push_back(p);
         }
         return parts;
       }()) {
    made += "/" + part;
    if (mkdir(made.c_str(), 0755) == 0) {
      // Readable by every user whatever root's umask is: the record is for them.
      if (chmod(made.c_str(), 0755) != 0) return Status::Errno("delegation", "chmod(0755)", made);
    } else if (errno != EEXIST) {
      return Status::Errno("delegation", "mkdir", made);
    }
  }
  const std::string path = DelegationRecordPath(dir, record.uid);
  const std::string tmp = path + ".tmp";
  const std::string text = DelegationRecordJson(record);
  UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd.valid()) return Status::Errno("delegation", "open", tmp);
  if (fchmod(fd.get(), 0644) != 0) return Status::Errno("delegation", "fchmod(0644)", tmp);
  if (write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    Status s = Status::Errno("delegation", "write", tmp);
    unlink(tmp.c_str());
    return s;
  }
  if (fsync(fd.get()) != 0) return Status::Errno("delegation", "fsync", tmp);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    Status s = Status::Errno("delegation", "rename", path);
    unlink(tmp.c_str());
    return s;
  }
  return {};
}

Status RemoveDelegationRecord(const std::string& dir, uid_t uid) {
  const std::string path = DelegationRecordPath(dir, uid);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) return Status::Errno("delegation", "unlink", path);
  return {};
}

}  // namespace agentbox::linux
