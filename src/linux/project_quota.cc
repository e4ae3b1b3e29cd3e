#include "linux/project_quota.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/quota.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "linux/fd.h"
#include "linux/random.h"

namespace agentbox::linux {
namespace {

using nlohmann::json;

constexpr std::uint32_t kProjidBase = 0x40000000u;  // above ids people hand out by hand

class Kernel final : public QuotaKernel {
 public:
  Result<ProjectAttr> Get(int fd, const std::string& path) override {
    struct fsxattr fsx {};
    if (ioctl(fd, FS_IOC_FSGETXATTR, &fsx) != 0) return Status::Errno("quota", "ioctl(FS_IOC_FSGETXATTR)", path);
    return ProjectAttr{fsx.fsx_projid, (fsx.fsx_xflags & FS_XFLAG_PROJINHERIT) != 0};
  }
  Status Set(int fd, const std::string& path, const ProjectAttr& attr) override {
    struct fsxattr fsx {};
    if (ioctl(fd, FS_IOC_FSGETXATTR, &fsx) != 0) return Status::Errno("quota", "ioctl(FS_IOC_FSGETXATTR)", path);
    fsx.fsx_projid = attr.projid;
    fsx.fsx_xflags = attr.inherit ? (fsx.fsx_xflags | FS_XFLAG_PROJINHERIT) : (fsx.fsx_xflags & ~FS_XFLAG_PROJINHERIT);
    if (ioctl(fd, FS_IOC_FSSETXATTR, &fsx) != 0) return Status::Errno("quota", "ioctl(FS_IOC_FSSETXATTR)", path);
    return {};
  }
  Result<QuotaUsage> Usage(const std::string& device, std::uint32_t projid) override {
    struct if_dqblk d {};
    if (syscall(SYS_quotactl, QCMD(Q_GETQUOTA, PRJQUOTA), device.c_str(), projid, &d) != 0) {
      return Status::Errno("quota", "quotactl(Q_GETQUOTA, PRJQUOTA, " + std::to_string(projid) + ")", device);
    }
    return QuotaUsage{d.dqb_curspace, d.dqb_curinodes, d.dqb_bhardlimit * QIF_DQBLKSIZE};
  }
  Status SetLimit(const std::string& device, std::uint32_t projid, std::uint64_t bytes) override {
    struct if_dqblk d {};
    d.dqb_bhardlimit = d.dqb_bsoftlimit = (bytes + QIF_DQBLKSIZE - 1) / QIF_DQBLKSIZE;
    d.dqb_valid = QIF_BLIMITS;
    if (syscall(SYS_quotactl, QCMD(Q_SETQUOTA, PRJQUOTA), device.c_str(), projid, &d) != 0) {
      return Status::Errno("quota", "quotactl(Q_SETQUOTA, PRJQUOTA, " + std::to_string(projid) + ")", device);
    }
    return {};
  }
};

std::string JoinRel(const std::string& a, const std::string& b) { return a.empty() ? b : a + "/" + b; }

// Every directory and regular file at and below `root` on its filesystem,
// each opened (without following symlinks) for `fn(fd, rel, is_dir)`.
// Stops at the first error.
using Visit = std::function<Status(int fd, const std::string& rel, bool is_dir)>;

Status WalkDir(int dir_fd, const std::string& rel, const std::string& root, dev_t dev, const Visit& fn) {
  int dup = fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return Status::Errno("quota", "fcntl(F_DUPFD_CLOEXEC)", JoinRel(root, rel));
  DIR* d = fdopendir(dup);
  if (!d) {
    close(dup);
    return Status::Errno("quota", "fdopendir", JoinRel(root, rel));
  }
  std::vector<std::string> names;
  while (struct dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  for (const auto& n : names) {
    const std::string r = JoinRel(rel, n);
    struct stat st {};
    if (fstatat(dir_fd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      return Status::Errno("quota", "fstatat", root + "/" + r);
    }
    if (st.st_dev != dev || !(S_ISDIR(st.st_mode) || S_ISREG(st.st_mode))) continue;
    const bool is_dir = S_ISDIR(st.st_mode);
    UniqueFd fd(openat(dir_fd, n.c_str(),
                       O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (is_dir ? O_DIRECTORY : 0)));
    if (!fd.valid()) return Status::Errno("quota", "openat", root + "/" + r);
    if (Status s = fn(fd.get(), r, is_dir); !s.ok()) return s;
    if (is_dir) {
      if (Status s = WalkDir(fd.get(), r, root, dev, fn); !s.ok()) return s;
    }
  }
  return {};
}

Status Walk(const std::string& root, const Visit& fn) {
  UniqueFd fd(open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno("quota", "open", root);
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return Status::Errno("quota", "fstat", root);
  if (Status s = fn(fd.get(), "", true); !s.ok()) return s;
  return WalkDir(fd.get(), "", root, st.st_dev, fn);
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// This process as a record's owner: <pidns>-<pid>-<starttime> (the same
// shape as a run cgroup's owner tag).
std::string OwnerOf(const std::string& pid) {
  char ns[64] = {};
  ssize_t n = readlink(("/proc/" + pid + "/ns/pid").c_str(), ns, sizeof ns - 1);
  const std::string stat = ReadText("/proc/" + pid + "/stat");
  const auto paren = stat.rfind(')');
  if (n <= 0 || paren == std::string::npos) return "";
  std::stringstream fields(stat.substr(paren + 2));
  std::string f;
  for (int i = 3; i <= 22 && fields >> f; ++i) {
  }
  return std::string(ns, static_cast<size_t>(n)) + "-" + pid + "-" + f;
}

bool OwnerAlive(const std::string& owner) {
  const auto a = owner.find('-'), b = owner.rfind('-');
  if (a == std::string::npos || b <= a) return false;
  const std::string own = OwnerOf("self");
  // Another pid namespace's supervisor: not ours to judge.
  if (own.substr(0, own.find('-')) != owner.substr(0, a)) return true;
  return OwnerOf(owner.substr(a + 1, b - a - 1)) == owner;
}

Status WriteRecord(const std::string& path, const json& j) {
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp, std::ios::trunc);
    out << j.dump() << "\n";
    out.flush();
    if (!out) return Status::Errno("quota", "write", temp);
  }
  if (rename(temp.c_str(), path.c_str()) != 0) return Status::Errno("quota", "rename", path);
  return {};
}

json RecordJson(const std::string& owner, const std::string& workspace, const std::string& device,
                std::uint32_t projid, const std::map<std::string, ProjectAttr>& previous) {
  json prev = json::object();
  for (const auto& [rel, attr] : previous) prev[rel] = {attr.projid, attr.inherit};
  return {{"version", 1}, {"owner", owner},   {"workspace", workspace},
          {"device", device}, {"projid", projid}, {"previous", prev}};
}

}  // namespace

std::unique_ptr<QuotaKernel> RealQuotaKernel() { return std::make_unique<Kernel>(); }

Status ProjectQuotasOn(const std::string& device) {
  struct if_dqinfo info {};
  if (syscall(SYS_quotactl, QCMD(Q_GETINFO, PRJQUOTA), device.c_str(), 0, &info) != 0) {
    return Status::Errno("quota", "quotactl(Q_GETINFO, PRJQUOTA)", device);
  }
  return {};
}

Result<std::unique_ptr<WorkspaceQuota>> WorkspaceQuota::Begin(QuotaKernel* kernel, const std::string& workspace,
                                                              const std::string& device, std::uint64_t disk_bytes,
                                                              const std::string& record_dir) {
  std::error_code ec;
  std::filesystem::create_directories(record_dir, ec);
  if (ec) return Status::Syscall("quota", "mkdir", record_dir, ec.value());
  chmod(record_dir.c_str(), 0700);
  // A fresh project: no use, no limit, no record of another run.
  std::uint32_t projid = 0;
  for (int attempt = 0; attempt < 16 && projid == 0; ++attempt) {
    const std::uint32_t id = kProjidBase | (static_cast<std::uint32_t>(std::stoul(RandomHex(4), nullptr, 16)) &
                                            (kProjidBase - 1));
    auto usage = kernel->Usage(device, id);
    if (!usage.ok()) return usage.status();
    if (usage->used_bytes || usage->inodes || usage->limit_bytes) continue;
    if (access((record_dir + "/" + std::to_string(id) + ".json").c_str(), F_OK) == 0) continue;
    projid = id;
  }
  if (projid == 0) return Status::Error("quota", "no unused project id found on " + device + " in 16 tries");
  std::unique_ptr<WorkspaceQuota> q(
      new WorkspaceQuota(kernel, workspace, device, record_dir + "/" + std::to_string(projid) + ".json"));
  q->projid_ = projid;
  const std::string owner = OwnerOf("self");
  // The record first: a supervisor killed while tagging leaves what gc needs
  // (every entry with the id goes back to 0; the exceptions found so far
  // are rewritten below).
  if (Status s = WriteRecord(q->record_, RecordJson(owner, workspace, device, projid, {})); !s.ok()) return s;
  Status tagged = Walk(workspace, [&](int fd, const std::string& rel, bool is_dir) -> Status {
    auto attr = kernel->Get(fd, JoinRel(workspace, rel));
    if (!attr.ok()) return attr.status();
    if (!(*attr == ProjectAttr{})) q->previous_[rel] = *attr;
    ++q->tagged_;
    return kernel->Set(fd, JoinRel(workspace, rel), {projid, is_dir});
  });
  if (tagged.ok()) tagged = WriteRecord(q->record_, RecordJson(owner, workspace, device, projid, q->previous_));
  if (!tagged.ok()) return tagged;  // the destructor restores what was tagged
  auto usage = kernel->Usage(device, projid);
  if (!usage.ok()) return usage.status();
  q->start_bytes_ = usage->used_bytes;
  q->limit_bytes_ = usage->used_bytes + disk_bytes;
  if (Status s = kernel->SetLimit(device, projid, q->limit_bytes_); !s.ok()) return s;
  return q;
}

Status WorkspaceQuota::End() {
  if (ended_) return {};
  ended_ = true;
  Status first;
  Status walked = Walk(workspace_, [&](int fd, const std::string& rel, bool) -> Status {
    auto attr = kernel_->Get(fd, JoinRel(workspace_, rel));
    if (!attr.ok() || attr->projid != projid_) return {};
    auto it = previous_.find(rel);
    Status s = kernel_->Set(fd, JoinRel(workspace_, rel), it == previous_.end() ? ProjectAttr{} : it->second);
    if (!s.ok() && first.ok()) first = s;
    return {};
  });
  if (!walked.ok() && first.ok()) first = walked;
  if (Status s = kernel_->SetLimit(device_, projid_, 0); !s.ok() && first.ok()) first = s;
  // Kept when something could not be restored: gc tries again.
  if (first.ok()) unlink(record_.c_str());
  return first;
}

WorkspaceQuota::~WorkspaceQuota() { (void)End(); }

std::vector<std::string> CollectStaleProjectQuotas(QuotaKernel* kernel, const std::string& record_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(record_dir, ec)) {
    if (entry.path().extension() != ".json") continue;
    json j = json::parse(ReadText(entry.path()), nullptr, false);
    if (j.is_discarded() || !j.is_object() || j.value("version", 0) != 1) continue;
    if (OwnerAlive(j.value("owner", ""))) continue;
    std::unique_ptr<WorkspaceQuota> q(new WorkspaceQuota(kernel, j.value("workspace", ""), j.value("device", ""),
                                                         entry.path().string()));
    q->projid_ = j.value("projid", 0u);
    if (q->projid_ < kProjidBase) continue;  // never one of ours
    for (const auto& [rel, v] : j.value("previous", json::object()).items()) {
      if (v.is_array() && v.size() == 2) q->previous_[rel] = {v[0].get<std::uint32_t>(), v[1].get<bool>()};
    }
    if (q->End().ok()) out.push_back(q->workspace_ + " (project " + std::to_string(q->projid_) + ")");
  }
  return out;
}

}  // namespace agentbox::linux
