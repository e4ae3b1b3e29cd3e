// The filesystem under a workspace, for disk_gib: its type and whether a
// project quota could bound what a run writes there (ext4 mounted with
// prjquota, XFS with pquota/prjquota, and root to set one). Cheap: one
// statfs, plus one read of /proc/self/mountinfo for ext4 and XFS only.
#pragma once

#include <string>

#include "agentbox/confine.h"

namespace agentbox::linux {

WorkspaceFs ProbeWorkspaceFs(const std::string& dir);

// For tests: the fstype and super options of the mount with id `mnt_id` in
// mountinfo text ("" when not found). Fields: see proc(5).
struct MountFacts {
  std::string fstype;
  std::string source;  // the block device, for a disk filesystem
  std::string super_options;
};
MountFacts FindMount(const std::string& mountinfo, unsigned long long mnt_id);

}  // namespace agentbox::linux
