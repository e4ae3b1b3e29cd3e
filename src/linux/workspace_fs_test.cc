#include "linux/workspace_fs.h"

#include <gtest/gtest.h>

namespace agentbox::linux {
namespace {

TEST(WorkspaceFs, FindMountReadsTheFieldsAfterTheSeparator) {
  const std::string info =
      "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,errors=remount-ro\n"
      "91 22 7:0 / /mnt/q rw,relatime shared:40 master:2 - ext4 /dev/loop0 rw,prjquota\n"
      "95 22 0:50 / /mnt/x rw - xfs /dev/loop1 rw,attr2,inode64,prjquota\n";
  MountFacts q = FindMount(info, 91);
  EXPECT_EQ(q.fstype, "ext4");
  EXPECT_EQ(q.super_options, "rw,prjquota");
  EXPECT_EQ(FindMount(info, 95).fstype, "xfs");
  EXPECT_EQ(FindMount(info, 9).fstype, "");  // a prefix of 91 is not 91
}

TEST(WorkspaceFs, ProbeNamesTheFilesystem) {
  WorkspaceFs tmp = ProbeWorkspaceFs("/proc");
  EXPECT_TRUE(tmp.known);
  EXPECT_EQ(tmp.fstype, "proc");
  EXPECT_FALSE(tmp.project_quota);
  EXPECT_FALSE(ProbeWorkspaceFs("/nonexistent-agentbox-dir").known);
}

}  // namespace
}  // namespace agentbox::linux
