#include "linux/cgroups.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <sstream>
#include <thread>

#include "linux/random.h"

namespace agentbox::linux {
namespace {

constexpr const char* kPrefix = "agentbox-";
// Who owns a run's cgroup, on the directory rather than in its name: the
// name shows inside the sandbox (/proc/self/cgroup), the tag does not.
constexpr const char* kOwnerTag = "user.agentbox.owner";
constexpr std::uint64_t kCpuPeriodUs = 100000;

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) {
    if (!cur.empty()) out.push_back(cur);
  }
  return out;
}

std::optional<std::uint64_t> Number(const std::string& text) {
  try {
    size_t used = 0;
    auto v = std::stoull(text, &used);
    return v;
  } catch (...) {
    return std::nullopt;
  }
}

// Field 22 of /proc/PID/stat (start time in clock ticks), read after the
// command name, which may hold spaces and parentheses.
std::optional<std::uint64_t> StartTime(const std::string& stat) {
  auto close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  auto fields = Words(stat.substr(close + 1));
  // fields[0] is field 3 (state): field 22 is fields[19].
  if (fields.size() < 20) return std::nullopt;
  return Number(fields[19]);
}

std::string OwnPidNs(const CgroupFs& fs) {
  char buf[64] = {};
  ssize_t n = readlink((fs.root() == "/" ? std::string("/proc/self/ns/pid")
                                          : fs.root() + "/proc/self/ns/pid").c_str(),
                       buf, sizeof(buf) - 1);
  std::string link = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  auto a = link.find('['), b = link.find(']');
  return a != std::string::npos && b != std::string::npos ? link.substr(a + 1, b - a - 1) : "0";
}

std::string Join(const std::string& dir, const std::string& name) {
  return dir == "/" ? "/" + name : dir + "/" + name;
}

}  // namespace

std::vector<std::string> Words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

bool Has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}


// ----------------------------------------------------------------- CgroupFs

CgroupFs::CgroupFs(std::string root) : root_(std::move(root)) {
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
}

std::string CgroupFs::Real(const std::string& path) const { return root_ == "/" ? path : root_ + path; }

Status CgroupFs::MakeDir(const std::string& path) const {
  if (mkdir(Real(path).c_str(), 0755) != 0) return Status::Errno("cgroup", "mkdir", path);
  return {};
}

Status CgroupFs::RemoveDir(const std::string& path) const {
  if (rmdir(Real(path).c_str()) != 0) return Status::Errno("cgroup", "rmdir", path);
  return {};
}

Status CgroupFs::Write(const std::string& path, const std::string& value) const {
  // A fake root holds plain files that may not exist yet; cgroupfs files always do.
  int flags = O_WRONLY | O_CLOEXEC | (root_ == "/" ? 0 : O_CREAT | O_TRUNC);
  UniqueFd fd(open(Real(path).c_str(), flags, 0644));
  if (!fd.valid()) return Status::Errno("cgroup", "open", path);
  ssize_t n = write(fd.get(), value.data(), value.size());
  if (n != static_cast<ssize_t>(value.size())) {
    return Status::Syscall("cgroup", "write(" + value + ")", path, n < 0 ? errno : EIO);
  }
  return {};
}

Result<std::string> CgroupFs::Read(const std::string& path) const {
  UniqueFd fd(open(Real(path).c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno("cgroup", "open", path);
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Errno("cgroup", "read", path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

Status CgroupFs::SetTag(const std::string& path, const std::string& name, const std::string& value) const {
  if (setxattr(Real(path).c_str(), name.c_str(), value.data(), value.size(), XATTR_CREATE) != 0) {
    return Status::Errno("cgroup", "setxattr(" + name + ")", path);
  }
  return {};
}

std::optional<std::string> CgroupFs::Tag(const std::string& path, const std::string& name) const {
  char buf[256];
  ssize_t n = getxattr(Real(path).c_str(), name.c_str(), buf, sizeof(buf));
  if (n < 0) return std::nullopt;
  return std::string(buf, static_cast<size_t>(n));
}

Status CgroupFs::Chown(const std::string& path, uid_t uid, gid_t gid) const {
  if (fchownat(AT_FDCWD, Real(path).c_str(), uid, gid, AT_SYMLINK_NOFOLLOW) != 0) {
    return Status::Errno("cgroup", "chown(" + std::to_string(uid) + ":" + std::to_string(gid) + ")", path);
  }
  return {};
}

Result<UniqueFd> CgroupFs::OpenDir(const std::string& path) const {
  UniqueFd fd(open(Real(path).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno("cgroup", "open(O_PATH)", path);
  return fd;
}

Result<UniqueFd> CgroupFs::OpenForWrite(const std::string& path) const {
  UniqueFd fd(open(Real(path).c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno("cgroup", "open", path);
  return fd;
}

std::vector<std::string> CgroupFs::List(const std::string& dir) const {
  std::vector<std::string> out;
  DIR* d = opendir(Real(dir).c_str());
  if (!d) return out;
  while (struct dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != ".." && e->d_type == DT_DIR) out.push_back(name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// ------------------------------------------------------------------- layout

CgroupLayout ParseCgroupLayout(const std::string& mountinfo, const std::string& self_cgroup) {
  struct Mount {
    std::string root, point;
  };
  std::optional<Mount> v2;
  std::map<std::string, Mount> v1;  // controller -> mount
  std::istringstream lines(mountinfo);
  std::string line;
  while (std::getline(lines, line)) {
    // "id parent dev root mountpoint opts [optional...] - fstype source superopts"
    auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    auto pre = Words(line.substr(0, dash));
    auto post = Words(line.substr(dash + 3));
    if (pre.size() < 5 || post.size() < 3) continue;
    Mount m{pre[3], pre[4]};
    if (post[0] == "cgroup2") {
      if (!v2) v2 = m;
    } else if (post[0] == "cgroup") {
      for (const auto& opt : Split(post[2], ',')) {
        if (!v1.count(opt)) v1[opt] = m;
      }
    }
  }
  // Our path inside a hierarchy, seen through a mount of (part of) it.
  auto under = [](const Mount& m, const std::string& rel) -> std::optional<std::string> {
    std::string r = rel;
    if (m.root != "/") {
      if (r != m.root && r.rfind(m.root + "/", 0) != 0) return std::nullopt;  // not visible
      r = r.substr(m.root.size());
    }
    if (r.empty() || r == "/") return m.point;
    return m.point + r;
  };
  CgroupLayout out;
  if (v2) out.v2_mount = v2->point;
  for (const auto& [c, m] : v1) out.v1_mounts[c] = m.point;
  std::istringstream cl(self_cgroup);
  while (std::getline(cl, line)) {
    auto c1 = line.find(':');
    auto c2 = c1 == std::string::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string::npos) continue;
    std::string controllers = line.substr(c1 + 1, c2 - c1 - 1);
    std::string rel = line.substr(c2 + 1);
    if (controllers.empty()) {
      if (v2) {
        if (auto dir = under(*v2, rel)) {
          out.v2_dir = *dir;
          out.v2_is_root = rel == "/" && v2->root == "/";
        }
      }
      continue;
    }
    for (const auto& c : Split(controllers, ',')) {
      auto it = v1.find(c);
      if (it == v1.end()) continue;
      if (auto dir = under(it->second, rel)) out.v1_dirs[c] = *dir;
    }
  }
  return out;
}

CgroupLayout DiscoverCgroupLayout(const CgroupFs& fs) {
  auto mountinfo = fs.Read("/proc/self/mountinfo");
  auto self = fs.Read("/proc/self/cgroup");
  CgroupLayout layout = ParseCgroupLayout(mountinfo.ok() ? *mountinfo : "", self.ok() ? *self : "");
  if (!layout.v2_dir.empty()) {
    if (auto c = fs.Read(layout.v2_dir + "/cgroup.controllers"); c.ok()) layout.v2_controllers = Words(*c);
    if (auto c = fs.Read(layout.v2_dir + "/cgroup.subtree_control"); c.ok()) layout.v2_subtree = Words(*c);
  }
  return layout;
}

Hierarchy ChooseHierarchy(const CgroupFs& fs, const CgroupLayout& layout, const std::string& controller) {
  const std::string root = fs.root() == "/" ? "" : fs.root();
  if (!layout.v2_dir.empty() && Has(layout.v2_controllers, controller) &&
      (Has(layout.v2_subtree, controller) || layout.v2_is_root) &&
      access((root + layout.v2_dir).c_str(), W_OK) == 0) {
    return Hierarchy::kV2;
  }
  auto it = layout.v1_dirs.find(controller);
  if (it != layout.v1_dirs.end() && access((root + it->second).c_str(), W_OK) == 0) return Hierarchy::kV1;
  return Hierarchy::kNone;
}

std::optional<std::uint64_t> KeyedValue(const std::string& text, const std::string& key) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    auto w = Words(line);
    if (w.size() >= 2 && w[0] == key) return Number(w[1]);
  }
  return std::nullopt;
}

std::string SandboxCgroupName() { return std::string(kPrefix) + RandomHex(8); }

std::string CgroupOwner(const CgroupFs& fs) {
  auto stat = fs.Read("/proc/self/stat");
  auto start = stat.ok() ? StartTime(*stat) : std::nullopt;
  return OwnPidNs(fs) + "-" + std::to_string(getpid()) + "-" + std::to_string(start.value_or(0));
}

// ------------------------------------------------------------ SandboxCgroup

Result<std::unique_ptr<SandboxCgroup>> SandboxCgroup::Create(const CgroupFs& fs, const CgroupLayout& layout,
                                                            const ResourceLimits& limits,
                                                            const std::string& name) {
  std::unique_ptr<SandboxCgroup> cg(new SandboxCgroup(fs));  // its destructor undoes a partial set-up
  const std::string owner = CgroupOwner(fs);
  std::vector<std::string> needed;
  if (limits.memory_max_bytes || limits.memory_low_bytes) needed.push_back("memory");
  if (limits.pids_max) needed.push_back("pids");
  if (limits.cpu_max_cores || limits.cpu_weight_cores) needed.push_back("cpu");

  std::vector<std::string> v2_needed;
  for (const auto& c : needed) {
    Hierarchy h = ChooseHierarchy(fs, layout, c);
    if (h == Hierarchy::kNone) {
      return Status::Error("cgroup", "no writable cgroup gives the " + c +
                                         " controller to a child of this process's cgroup");
    }
    cg->where_[c] = h;
    if (h == Hierarchy::kV2) v2_needed.push_back(c);
  }
  // v1 cpu usage lives in cpuacct (a hierarchy of its own here and there).
  if (cg->where_.count("cpu") && cg->where_["cpu"] == Hierarchy::kV1 && layout.v1_dirs.count("cpuacct") &&
      ChooseHierarchy(fs, layout, "cpuacct") == Hierarchy::kV1) {
    cg->where_["cpuacct"] = Hierarchy::kV1;
  }

  // A v2 cgroup whenever ours is writable: placement by clone3, cgroup.kill,
  // and cpu.stat / memory.peak even on a hybrid host with no v2 controller.
  const std::string root = fs.root() == "/" ? "" : fs.root();
  if (!layout.v2_dir.empty() && access((root + layout.v2_dir).c_str(), W_OK) == 0) {
    for (const auto& c : v2_needed) {
      if (Has(layout.v2_subtree, c)) continue;
      // Only the hierarchy root gets here (ChooseHierarchy): it may enable
      // controllers for children while holding processes.
      if (Status s = fs.Write(layout.v2_dir + "/cgroup.subtree_control", "+" + c); !s.ok()) return s;
    }
    std::string dir = Join(layout.v2_dir, name);
    if (Status s = fs.MakeDir(dir); !s.ok()) return s;
    cg->v2_dir_ = dir;
    if (Status s = fs.SetTag(dir, kOwnerTag, owner); !s.ok()) return s;
    auto fd = fs.OpenDir(dir);
    if (!fd.ok()) return fd.status();
    cg->v2_fd_ = std::move(*fd);
  } else if (!v2_needed.empty()) {
    return Status::Error("cgroup", "v2 cgroup " + layout.v2_dir + " is not writable");
  }
  for (const auto& [c, h] : cg->where_) {
    if (h != Hierarchy::kV1) continue;
    std::string dir = Join(layout.v1_dirs.at(c), name);
    if (Status s = fs.MakeDir(dir); !s.ok()) return s;
    cg->v1_dirs_[c] = dir;
    if (Status s = fs.SetTag(dir, kOwnerTag, owner); !s.ok()) return s;
  }

  auto set = [&](const std::string& controller, const std::string& file, const std::string& value) -> Status {
    const bool v2 = cg->where_[controller] == Hierarchy::kV2;
    std::string path = (v2 ? cg->v2_dir_ : cg->v1_dirs_[controller]) + "/" + file;
    if (Status s = fs.Write(path, value); !s.ok()) return s;
    cg->applied_.push_back(file + "=" + value);
    return {};
  };
  if (limits.memory_max_bytes) {
    const std::string v = std::to_string(*limits.memory_max_bytes);
    if (cg->where_["memory"] == Hierarchy::kV2) {
      if (Status s = set("memory", "memory.max", v); !s.ok()) return s;
      // No swap: the ceiling is a ceiling, not a slow path to the disk.
      // (memory.swap.max is absent without swap accounting: nothing to limit.)
      if (fs.Read(cg->v2_dir_ + "/memory.swap.max").ok()) {
        if (Status s = set("memory", "memory.swap.max", "0"); !s.ok()) return s;
      }
    } else {
      if (Status s = set("memory", "memory.limit_in_bytes", v); !s.ok()) return s;
      // memory+swap ≤ memory: no swap. The swap file exists only with swap accounting.
      if (fs.Read(cg->v1_dirs_["memory"] + "/memory.memsw.limit_in_bytes").ok()) {
        if (Status s = set("memory", "memory.memsw.limit_in_bytes", v); !s.ok()) return s;
      }
      if (fs.Read(cg->v1_dirs_["memory"] + "/memory.swappiness").ok()) {
        if (Status s = set("memory", "memory.swappiness", "0"); !s.ok()) return s;
      }
    }
  }
  if (limits.memory_low_bytes) {
    const std::string v = std::to_string(*limits.memory_low_bytes);
    if (Status s = set("memory", cg->where_["memory"] == Hierarchy::kV2 ? "memory.low" : "memory.soft_limit_in_bytes", v);
        !s.ok()) {
      return s;
    }
  }
  if (limits.pids_max) {
    if (Status s = set("pids", "pids.max", std::to_string(*limits.pids_max)); !s.ok()) return s;
  }
  if (limits.cpu_max_cores) {
    auto quota = static_cast<std::uint64_t>(std::llround(*limits.cpu_max_cores * kCpuPeriodUs));
    quota = std::max<std::uint64_t>(quota, 1000);  // the kernel's minimum quota is 1 ms
    if (cg->where_["cpu"] == Hierarchy::kV2) {
      if (Status s = set("cpu", "cpu.max", std::to_string(quota) + " " + std::to_string(kCpuPeriodUs)); !s.ok()) {
        return s;
      }
    } else {
      if (Status s = set("cpu", "cpu.cfs_period_us", std::to_string(kCpuPeriodUs)); !s.ok()) return s;
      if (Status s = set("cpu", "cpu.cfs_quota_us", std::to_string(quota)); !s.ok()) return s;
    }
  }
  if (limits.cpu_weight_cores) {
    // One core of guarantee = the default share (weight 100, shares 1024).
    if (cg->where_["cpu"] == Hierarchy::kV2) {
      auto w = std::clamp<long long>(std::llround(*limits.cpu_weight_cores * 100), 1, 10000);
      if (Status s = set("cpu", "cpu.weight", std::to_string(w)); !s.ok()) return s;
    } else {
      auto sh = std::clamp<long long>(std::llround(*limits.cpu_weight_cores * 1024), 2, 262144);
      if (Status s = set("cpu", "cpu.shares", std::to_string(sh)); !s.ok()) return s;
    }
  }
  return cg;
}

std::vector<std::string> SandboxCgroup::AllDirs() const {
  std::vector<std::string> dirs;
  for (const auto& [c, d] : v1_dirs_) dirs.push_back(d);
  if (!v2_dir_.empty()) dirs.push_back(v2_dir_);
  return dirs;
}

Result<std::vector<UniqueFd>> SandboxCgroup::OpenTaskFiles() const {
  std::vector<UniqueFd> fds;
  for (const auto& [c, dir] : v1_dirs_) {
    auto fd = fs_.OpenForWrite(dir + "/tasks");
    if (!fd.ok()) return fd.status();
    fds.push_back(std::move(*fd));
  }
  return fds;
}

std::vector<pid_t> SandboxCgroup::Pids() const {
  std::vector<pid_t> pids;
  for (const auto& dir : AllDirs()) {
    auto text = fs_.Read(dir + "/cgroup.procs");
    if (!text.ok()) continue;
    for (const auto& w : Words(*text)) {
      if (auto n = Number(w); n && *n > 0) pids.push_back(static_cast<pid_t>(*n));
    }
  }
  std::sort(pids.begin(), pids.end());
  pids.erase(std::unique(pids.begin(), pids.end()), pids.end());
  return pids;
}

void SandboxCgroup::SignalAll(int sig, pid_t except) const {
  if (fs_.root() != "/") return;  // a fake cgroupfs lists nobody's processes
  for (pid_t p : Pids()) {
    if (p != except) kill(p, sig);
  }
}

void SandboxCgroup::KillAll() const {
  if (!v2_dir_.empty() && fs_.Write(v2_dir_ + "/cgroup.kill", "1").ok()) return;
  if (fs_.root() != "/") return;
  // No cgroup.kill: SIGKILL reaches stopped processes too; repeat while forks race us.
  for (int round = 0; round < 50; ++round) {
    auto pids = Pids();
    if (pids.empty()) return;
    for (pid_t p : pids) kill(p, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Status SandboxCgroup::SetMemoryMax(std::uint64_t bytes) {
  auto mem = where_.find("memory");
  if (mem == where_.end()) {
    return Status::Error("cgroup", "this sandbox's cgroup has no memory controller (no memory limit was set when "
                                   "it started), so its memory limit cannot be changed in place");
  }
  const std::string v = std::to_string(bytes);
  std::vector<std::string> files;
  if (mem->second == Hierarchy::kV2) {
    if (Status s = fs_.Write(v2_dir_ + "/memory.max", v); !s.ok()) return s;
    files = {"memory.max"};
  } else {
    // v1 keeps memory <= memory+swap at every step: the limit goes first
    // when it comes down, the memsw limit first when it goes up.
    const std::string& d = v1_dirs_.at("memory");
    const bool memsw = fs_.Read(d + "/memory.memsw.limit_in_bytes").ok();
    const auto current = fs_.Read(d + "/memory.limit_in_bytes");
    const bool raising = current.ok() && Number(*current).value_or(0) < bytes;
    files = {"memory.limit_in_bytes"};
    if (memsw) files.insert(raising ? files.begin() : files.end(), "memory.memsw.limit_in_bytes");
    for (const auto& f : files) {
      if (Status s = fs_.Write(d + "/" + f, v); !s.ok()) return s;
    }
  }
  for (const auto& f : files) {
    const std::string entry = f + "=" + v;
    auto old = std::find_if(applied_.begin(), applied_.end(), [&](const std::string& a) { return a.rfind(f + "=", 0) == 0; });
    if (old != applied_.end()) {
      *old = entry;
    } else {
      applied_.push_back(entry);
    }
  }
  return {};
}

CgroupStats SandboxCgroup::ReadStats() const {
  CgroupStats st;
  auto mem = where_.find("memory");
  if (mem != where_.end()) {
    if (mem->second == Hierarchy::kV2) {
      if (auto t = fs_.Read(v2_dir_ + "/memory.events"); t.ok()) {
        if (auto v = KeyedValue(*t, "oom_kill")) {
          st.oom_kills = *v;
          st.oom_counter = true;
        }
      }
    } else {
      const std::string& d = v1_dirs_.at("memory");
      if (auto t = fs_.Read(d + "/memory.oom_control"); t.ok()) {
        if (auto v = KeyedValue(*t, "oom_kill")) {
          st.oom_kills = *v;
          st.oom_counter = true;
        }
      }
      if (auto t = fs_.Read(d + "/memory.failcnt"); t.ok()) st.memory_failcnt = Number(*t).value_or(0);
      if (auto t = fs_.Read(d + "/memory.max_usage_in_bytes"); t.ok()) st.peak_memory_bytes = Number(*t);
    }
  }
  if (!v2_dir_.empty()) {
    if (auto t = fs_.Read(v2_dir_ + "/memory.peak"); t.ok()) st.peak_memory_bytes = Number(*t);
    if (auto t = fs_.Read(v2_dir_ + "/cpu.stat"); t.ok()) {
      st.cpu_user_us = KeyedValue(*t, "user_usec");
      st.cpu_sys_us = KeyedValue(*t, "system_usec");
    }
  }
  auto pids = where_.find("pids");
  if (pids != where_.end()) {
    std::string d = pids->second == Hierarchy::kV2 ? v2_dir_ : v1_dirs_.at("pids");
    if (auto t = fs_.Read(d + "/pids.peak"); t.ok()) st.peak_processes = Number(*t);
  }
  if (!st.cpu_user_us && v1_dirs_.count("cpuacct")) {
    const std::string& d = v1_dirs_.at("cpuacct");
    auto u = fs_.Read(d + "/cpuacct.usage_user");
    auto s = fs_.Read(d + "/cpuacct.usage_sys");
    if (u.ok() && s.ok()) {
      if (auto v = Number(*u)) st.cpu_user_us = *v / 1000;  // nanoseconds
      if (auto v = Number(*s)) st.cpu_sys_us = *v / 1000;
    }
  }
  return st;
}

std::string SandboxCgroup::Mechanism() const {
  bool v1 = !v1_dirs_.empty();
  if (v1 && !v2_dir_.empty()) return "cgroup-v1+v2";
  if (v1) return "cgroup-v1";
  return "cgroup-v2";
}

namespace {

// Kills what is left in `dirs` and removes them. rmdir answers EBUSY while
// exiting tasks are still charged to the cgroup: retry for a while.
void Teardown(const CgroupFs& fs, const std::vector<std::string>& dirs, const std::string& v2_dir) {
  if (!v2_dir.empty() && fs.root() == "/") (void)fs.Write(v2_dir + "/cgroup.kill", "1");
  for (const auto& dir : dirs) {
    for (int attempt = 0; attempt < 200; ++attempt) {
      Status s = fs.RemoveDir(dir);
      if (s.ok() || s.err() == ENOENT) break;
      if (s.err() != EBUSY) break;
      if (fs.root() == "/") {
        if (auto procs = fs.Read(dir + "/cgroup.procs"); procs.ok()) {
          for (const auto& w : Words(*procs)) {
            if (auto n = Number(w); n && *n > 0) kill(static_cast<pid_t>(*n), SIGKILL);
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(attempt < 20 ? 200 : 5000));
    }
  }
}

}  // namespace

SandboxCgroup::~SandboxCgroup() {
  if (fs_.root() != "/") {
    // A fake root: plain directories with plain files; clear them first.
    for (const auto& dir : AllDirs()) {
      std::string real = fs_.root() + dir;
      if (DIR* d = opendir(real.c_str())) {
        while (struct dirent* e = readdir(d)) {
          if (e->d_type == DT_REG) unlink((real + "/" + e->d_name).c_str());
        }
        closedir(d);
      }
    }
  }
  Teardown(fs_, AllDirs(), v2_dir_);
}

std::vector<std::string> CollectStaleCgroups(const CgroupFs& fs, const CgroupLayout& layout) {
  std::vector<std::string> parents;
  if (!layout.v2_dir.empty()) parents.push_back(layout.v2_dir);
  for (const auto& [c, d] : layout.v1_dirs) {
    // Only the hierarchies a run's cgroup can be in.
    if (Has({"memory", "pids", "cpu", "cpuacct"}, c) && !Has(parents, d)) parents.push_back(d);
  }
  const std::string own_ns = OwnPidNs(fs);
  std::vector<std::string> removed;
  for (const auto& parent : parents) {
    for (const auto& name : fs.List(parent)) {
      if (name.rfind(kPrefix, 0) != 0) continue;
      // The owner's <pidns>-<pid>-<starttime>: in the directory's tag, or in
      // the name itself for cgroups of older versions
      // (agentbox-<pidns>-<pid>-<starttime>-<nonce>).
      auto tag = fs.Tag(Join(parent, name), kOwnerTag);
      auto parts = Split(tag ? *tag : name.substr(std::string(kPrefix).size()), '-');
      if (parts.size() != (tag ? 3u : 4u) || parts[0] != own_ns) continue;  // untagged, or another pid namespace's
      auto pid = Number(parts[1]);
      auto start = Number(parts[2]);
      if (!pid || !start) continue;
      auto stat = fs.Read("/proc/" + parts[1] + "/stat");
      if (stat.ok() && StartTime(*stat) == start) continue;  // its supervisor is alive
      std::string dir = Join(parent, name);
      std::vector<std::string> one = {dir};
      Teardown(fs, one, parent == layout.v2_dir ? dir : "");
      removed.push_back(dir);
    }
  }
  return removed;
}

}  // namespace agentbox::linux
