// `agentbox setup-delegation --user NAME [--remove] [--parent DIR...]`: as
// root, once, hands NAME a cgroup subtree per hierarchy (docs/delegation.md),
// so that NAME's runs get memory, cpu and process-count limits.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/subcommand.h"
#include "linux/cgroup_delegation.h"
#include "linux/cgroups.h"
#include "linux/user_dirs.h"

namespace agentbox::cli {
namespace {

void Say(const std::string& msg) { std::fprintf(stderr, "agentbox setup-delegation: %s\n", msg.c_str()); }

struct DelegationFlags {
  std::string user;
  bool remove = false;
  std::vector<std::string> parents;
};

int SetupDelegation(const DelegationFlags& f) {
  if (geteuid() != 0) {
    Say("must be run as root (it creates cgroups under root's own and hands them to a user)");
    return 1;
  }
  auto pw = linux::LookupUser(f.user);
  if (!pw) {
    Say("no such user in /etc/passwd: " + f.user);
    return 1;
  }
  if (pw->uid == 0) {
    Say("root needs no delegation");
    return 1;
  }
  const uid_t uid = pw->uid;
  const gid_t gid = pw->gid;
  linux::CgroupFs fs;
  linux::CgroupLayout layout = linux::DiscoverCgroupLayout(fs);
  auto plan = linux::PlanDelegation(fs, layout, f.user, uid, gid, f.parents);
  if (!plan.ok()) {
    Say(plan.status().message());
    return 1;
  }
  const std::string record_dir = linux::DelegationRecordDir();
  auto existing = linux::ReadDelegationRecord(record_dir, uid);
  if (f.remove) {
    std::optional<linux::DelegationRecord> record;
    if (existing.ok()) record = *existing;
    if (Status s = linux::RemoveDelegation(fs, *plan, record); !s.ok()) {
      Say(s.message());
      return 1;
    }
    if (Status s = linux::RemoveDelegationRecord(record_dir, uid); !s.ok()) {
      Say(s.message());
      return 1;
    }
    std::printf("removed the delegation of %s (uid %u) and its record %s\n", f.user.c_str(), uid,
                linux::DelegationRecordPath(record_dir, uid).c_str());
    return 0;
  }
  std::vector<std::string> notes = plan->notes;
  auto record = linux::ApplyDelegation(fs, *plan, &notes);
  if (!record.ok()) {
    Say(record.status().message());
    return 1;
  }
  if (record->v1.empty() && record->v2_dir.empty()) {
    for (const auto& n : notes) Say(n);
    Say("nothing could be delegated");
    return 1;
  }
  if (Status s = linux::WriteDelegationRecord(record_dir, *record); !s.ok()) {
    Say(s.message());
    return 1;
  }
  std::printf("delegated to %s (uid %u), recorded in %s:\n", f.user.c_str(), uid,
              linux::DelegationRecordPath(record_dir, uid).c_str());
  for (const auto& [c, d] : record->v1) std::printf("  v1 %-8s %s\n", c.c_str(), d.c_str());
  if (!record->v2_dir.empty()) {
    std::string cs;
    for (const auto& c : record->v2_controllers) cs += (cs.empty() ? "" : ",") + c;
    std::printf("  v2 [%s] %s\n", cs.c_str(), record->v2_dir.c_str());
    std::printf("  v2 is used only by an agentbox that runs inside it: move the user's shell or service into\n"
                "  %s (echo PID > %s/cgroup.procs), or use `agentbox run --systemd-scope`\n",
                record->v2_entry.c_str(), record->v2_entry.c_str());
  }
  for (const auto& n : notes) std::printf("  note: %s\n", n.c_str());
  return 0;
}

}  // namespace

Subcommand AddSetupDelegationCommand(CLI::App& app) {
  auto flags = std::make_shared<DelegationFlags>();
  CLI::App* cmd = app.add_subcommand(
      "setup-delegation", "as root: hand a user a cgroup subtree, so that its runs get memory, cpu and process limits");
  cmd->add_option("--user", flags->user, "the user to delegate to")->required();
  cmd->add_flag("--remove", flags->remove, "remove the delegation (refused while runs or processes are in it)");
  cmd->add_option("--parent", flags->parents,
                  "the cgroup to create the delegated one under, one per hierarchy to delegate "
                  "(default: root's own cgroup in each of memory, pids, cpu, cpuacct, and v2 if it has them)");
  return {cmd, [flags](const std::vector<std::string>&) { return SetupDelegation(*flags); }};
}

}  // namespace agentbox::cli
