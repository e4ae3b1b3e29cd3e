// disk_gib for `agentbox run` on a workspace whose filesystem has project
// quotas (ext4 with the quota feature mounted `prjquota`, XFS `pquota`), as
// root: the workspace and every entry in it get a fresh project id (with
// FS_XFLAG_PROJINHERIT on directories, so that what the run creates joins
// it), and the project a block limit of its use at the start plus disk_gib.
// The limit is on what the run *adds*: files already there count toward
// the project (they are tagged) but only their growth eats into disk_gib.
// When the run ends every entry that carries the id gets its previous id and
// flag back, and the limit is lifted.
//
// Cost: one ioctl pair per entry at the start and at the end, so
// proportional to the number of entries in the workspace (bench/
// project_quota_bench.cc), not to their size. Entries on other filesystems
// mounted inside the workspace are not entered (and not bounded); symlinks,
// sockets, fifos and devices are left as they are (a symlink's target is
// another entry or outside).
//
// A supervisor killed in between leaves its record in the state directory
// (<state>/quota/<id>.json): CollectStaleProjectQuotas, run by `agentbox gc`
// and at the start of every quota'd run, restores what a dead owner left.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agentbox/status.h"

namespace agentbox::linux {

struct ProjectAttr {
  std::uint32_t projid = 0;
  bool inherit = false;  // FS_XFLAG_PROJINHERIT
  bool operator==(const ProjectAttr& o) const { return projid == o.projid && inherit == o.inherit; }
};

struct QuotaUsage {
  std::uint64_t used_bytes = 0;
  std::uint64_t inodes = 0;
  std::uint64_t limit_bytes = 0;  // the block hard limit (0: none)
};

// The kernel's side, injectable: the real one issues FS_IOC_FS[GS]ETXATTR
// and quotactl(PRJQUOTA); tests keep the attributes in memory.
class WorkspaceQuota;
std::vector<std::string> CollectStaleProjectQuotas(class QuotaKernel* kernel, const std::string& record_dir);

class QuotaKernel {
 public:
  virtual ~QuotaKernel() = default;
  virtual Result<ProjectAttr> Get(int fd, const std::string& path) = 0;
  virtual Status Set(int fd, const std::string& path, const ProjectAttr& attr) = 0;
  virtual Result<QuotaUsage> Usage(const std::string& device, std::uint32_t projid) = 0;
  // 0 lifts the limit.
  virtual Status SetLimit(const std::string& device, std::uint32_t projid, std::uint64_t bytes) = 0;
};
std::unique_ptr<QuotaKernel> RealQuotaKernel();

// quotactl(Q_GETINFO, PRJQUOTA) on `device`: are project quotas on there?
Status ProjectQuotasOn(const std::string& device);

// One run's project quota on one workspace. Begin sets it up (undoing what
// it did when it fails); End, or the destructor, restores the workspace and
// lifts the limit.
class WorkspaceQuota {
 public:
  // `record_dir`: where the record goes (created 0700 when missing).
  [[nodiscard]] static Result<std::unique_ptr<WorkspaceQuota>> Begin(QuotaKernel* kernel,
                                                                    const std::string& workspace,
                                                                    const std::string& device,
                                                                    std::uint64_t disk_bytes,
                                                                    const std::string& record_dir);
  ~WorkspaceQuota();
  WorkspaceQuota(const WorkspaceQuota&) = delete;
  WorkspaceQuota& operator=(const WorkspaceQuota&) = delete;

  std::uint32_t projid() const { return projid_; }
  std::uint64_t limit_bytes() const { return limit_bytes_; }
  std::uint64_t start_bytes() const { return start_bytes_; }
  std::size_t tagged() const { return tagged_; }
  // The project's use now (for the disk_gib denial).
  Result<QuotaUsage> Usage() const { return kernel_->Usage(device_, projid_); }
  // Restores the workspace, lifts the limit, removes the record. Once.
  Status End();

 private:
  friend std::vector<std::string> CollectStaleProjectQuotas(QuotaKernel* kernel, const std::string& record_dir);
  WorkspaceQuota(QuotaKernel* kernel, std::string workspace, std::string device, std::string record)
      : kernel_(kernel), workspace_(std::move(workspace)), device_(std::move(device)), record_(std::move(record)) {}
  QuotaKernel* kernel_;
  std::string workspace_;
  std::string device_;
  std::string record_;
  std::uint32_t projid_ = 0;
  std::uint64_t start_bytes_ = 0;
  std::uint64_t limit_bytes_ = 0;
  std::size_t tagged_ = 0;
  std::map<std::string, ProjectAttr> previous_;  // entries that were not (0, no inherit), by relative path
  bool ended_ = false;
};

// Restores the workspace of every record in `record_dir` whose owner (a
// supervisor: <pidns>-<pid>-<starttime>) is gone. Returns what it restored
// ("<workspace> (project <id>)").
std::vector<std::string> CollectStaleProjectQuotas(QuotaKernel* kernel, const std::string& record_dir);

}  // namespace agentbox::linux
