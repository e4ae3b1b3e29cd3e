// Host facts that tests branch on, checked without agentbox, so a test can
// assert the product's behaviour on either side of the fact instead of
// accepting whatever the product did. Header-only: the e2e, escape, world and
// session suites share it.
#pragma once

#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace agentbox::host_facts {

namespace detail {

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

struct CgroupMount {
  std::string root, point, fstype, options;
};

inline std::vector<CgroupMount> CgroupMounts() {
  std::vector<CgroupMount> out;
  for (const auto& line : SplitLines(ReadAll("/proc/self/mountinfo"))) {
    std::istringstream in(line);
    std::string id, parent, dev, root, point, opts, f;
    in >> id >> parent >> dev >> root >> point >> opts;
    while (in >> f && f != "-") {
    }
    CgroupMount m{root, point, "", ""};
    std::string source;
    in >> m.fstype >> source >> m.options;
    if (m.fstype == "cgroup" || m.fstype == "cgroup2") out.push_back(m);
  }
  return out;
}

// `rel` (a path in /proc/self/cgroup) as seen through mount `m`, or "".
inline std::string Through(const CgroupMount& m, const std::string& rel) {
  if (m.root == "/") return rel == "/" ? m.point : m.point + rel;
  if (rel == m.root) return m.point;
  if (rel.rfind(m.root + "/", 0) == 0) return m.point + rel.substr(m.root.size());
  return "";
}

inline bool HasWord(const std::string& text, const std::string& word, char sep) {
  std::string w;
  std::istringstream in(text);
  while (std::getline(in, w, sep)) {
    while (!w.empty() && (w.back() == '\n' || w.back() == ' ')) w.pop_back();
    if (w == word) return true;
  }
  return false;
}

// True if `dir` holds a file named `prefix`* (a controller's interface files).
inline bool HasFileWithPrefix(const std::string& dir, const std::string& prefix) {
  DIR* d = opendir(dir.c_str());
  if (!d) return false;
  bool found = false;
  while (struct dirent* e = readdir(d)) found = found || std::string(e->d_name).rfind(prefix, 0) == 0;
  closedir(d);
  return found;
}

// Makes and removes a child of `dir`. It counts only if the kernel made it a
// cgroup (cgroup.procs appears) with `controller`'s files in it, when
// `controller` is not empty; tells whether `file` (if not empty) is in it.
inline bool ChildCgroupWorks(const std::string& dir, const std::string& controller, const std::string& file,
                             std::optional<bool>* has_file) {
  const std::string child = dir + "/agentbox-hostcheck-" + std::to_string(getpid()) + "-" +
                            std::to_string(std::random_device{}() % 100000);
  if (mkdir(child.c_str(), 0755) != 0) return false;
  const bool works = access((child + "/cgroup.procs").c_str(), F_OK) == 0 &&
                     (controller.empty() || HasFileWithPrefix(child, controller + "."));
  if (works && has_file && !file.empty()) *has_file = access((child + "/" + file).c_str(), F_OK) == 0;
  rmdir(child.c_str());
  return works;
}

}  // namespace detail

// The record `agentbox setup-delegation` wrote for this uid (in
// $AGENTBOX_DELEGATION_RECORD, else /run/agentbox/delegation), or null.
inline nlohmann::json DelegationRecord() {
  const char* env = std::getenv("AGENTBOX_DELEGATION_RECORD");
  const std::string dir = env && *env ? env : "/run/agentbox/delegation";
  auto j = nlohmann::json::parse(detail::ReadAll(dir + "/" + std::to_string(geteuid()) + ".json"), nullptr, false);
  return j.is_object() ? j : nlohmann::json();
}

// The directory delegated to this uid for `controller` ("v2": the v2 one),
// when the record names one that this uid owns; else "".
inline std::string DelegatedDir(const std::string& controller) {
  nlohmann::json j = DelegationRecord();
  std::string dir;
  if (controller == "v2" && j.contains("v2") && j["v2"].is_object()) dir = j["v2"].value("dir", "");
  if (controller != "v2" && j.contains("v1") && j["v1"].contains(controller)) dir = j["v1"][controller];
  struct stat st {};
  if (dir.empty() || lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) return "";
  return dir;
}

// The host fact the resource tests branch on, checked without agentbox:
// can this process make a child cgroup that gets `controller`? That is a
// directory it can create (and removes again) under its own cgroup in a
// hierarchy that carries the controller: a v1 hierarchy mounted with it, or
// the v2 hierarchy with it in cgroup.controllers and either enabled for
// children (subtree_control) or the cgroup being the hierarchy's root (which
// may enable it), and the kernel must make the new directory a cgroup with
// the controller's files. A writable-looking directory alone proves nothing:
// the controller may be absent, the cgroupfs refuse in practice (a
// container), or the path be another filesystem mounted over it. Where no
// cgroup of our own gives it, a v1 directory delegated to this uid by
// `agentbox setup-delegation` (DelegatedDir) is tried the same way.
// `has_file`: whether such a child shows `file` (for example pids.peak); left
// empty when that cannot be told without enabling the controller.
inline bool CgroupControllerDelegated(const std::string& controller, const std::string& file = "",
                                      std::optional<bool>* has_file = nullptr) {
  using namespace detail;
  if (has_file) has_file->reset();
  std::map<std::string, std::string> rel;  // controller list ("" for v2) → path
  for (const auto& line : SplitLines(ReadAll("/proc/self/cgroup"))) {
    auto c1 = line.find(':'), c2 = line.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    rel[line.substr(c1 + 1, c2 - c1 - 1)] = line.substr(c2 + 1);
  }
  for (const auto& m : CgroupMounts()) {
    if (m.fstype == "cgroup2") {
      if (!rel.count("")) continue;
      const std::string dir = Through(m, rel[""]);
      if (dir.empty() || !HasWord(ReadAll(dir + "/cgroup.controllers"), controller, ' ')) continue;
      const bool enabled = HasWord(ReadAll(dir + "/cgroup.subtree_control"), controller, ' ');
      const bool is_root = rel[""] == "/" && m.root == "/";
      if (!enabled && !is_root) continue;
      // A child of the v2 root gets the controller only once the root enables it.
      if (ChildCgroupWorks(dir, enabled ? controller : "", enabled ? file : "", has_file)) return true;
    } else if (HasWord(m.options, controller, ',')) {
      for (const auto& [list, path] : rel) {
        if (!HasWord(list, controller, ',')) continue;
        const std::string dir = Through(m, path);
        if (!dir.empty() && ChildCgroupWorks(dir, controller, file, has_file)) return true;
      }
    }
  }
  // No cgroup of our own gives it: a delegated one (setup-delegation) may.
  // (v1 only: a v2 delegation serves only a process inside it.)
  const std::string delegated = DelegatedDir(controller);
  return !delegated.empty() && ChildCgroupWorks(delegated, controller, file, has_file);
}

// CgroupControllerDelegated for each of `controllers`.
inline bool CgroupsExpected(std::initializer_list<const char*> controllers) {
  for (const char* c : controllers) {
    if (!CgroupControllerDelegated(c)) return false;
  }
  return true;
}

// The kernel's Landlock ABI (0: none), as the sandbox would see it.
inline int LandlockAbi() {
  long abi = syscall(444 /* landlock_create_ruleset */, nullptr, 0, 1 /* LANDLOCK_CREATE_RULESET_VERSION */);
  return abi < 0 ? 0 : static_cast<int>(abi);
}

// Does RLIMIT_NPROC, set inside a fresh user namespace, cap that namespace's
// tasks alone? Linux 5.14+ keeps the count per user namespace and uid, and
// the root user is exempt from the limit. Tried for real, without agentbox:
// a throw-away child unshares a user namespace, sets the limit to 4 and
// forks up to 8 sleeping children; the cap holds if a fork fails with EAGAIN.
inline bool NprocCapsUserNamespace() {
  const pid_t child = fork();
  if (child < 0) return false;
  if (child == 0) {
    if (unshare(CLONE_NEWUSER) != 0) _exit(2);
    struct rlimit lim = {4, 4};
    if (setrlimit(RLIMIT_NPROC, &lim) != 0) _exit(3);
    pid_t kids[8];
    int made = 0, err = 0;
    for (; made < 8; ++made) {
      const pid_t k = fork();
      if (k < 0) {
        err = errno;
        break;
      }
      if (k == 0) {
        alarm(10);
        pause();
        _exit(0);
      }
      kids[made] = k;
    }
    for (int i = 0; i < made; ++i) kill(kids[i], SIGKILL);
    for (int i = 0; i < made; ++i) waitpid(kids[i], nullptr, 0);
    _exit(made < 8 && err == EAGAIN ? 0 : 1);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace agentbox::host_facts
