// Plans a confined command through the installed library and prints the level.
#include <agentbox/confine.h>
#include <agentbox/policy.h>

#include <cstdio>

int main() {
  agentbox::HostCaps host;
  host.user_namespaces = host.mount_ns = host.pid_ns = host.net_ns = true;
  host.ipc_ns = host.uts_ns = host.new_mount_api = true;
  host.landlock_abi = 7;        // full needs Landlock (ABI >= 2) and seccomp too
  host.seccomp_filter = true;
  agentbox::Invocation inv{"/work", "/work", "/home/u", "/usr/bin/agentbox", "00"};
  auto c = agentbox::Confine({"true"}, agentbox::PresetFor(agentbox::Mode::kWorkspaceWrite), host, inv);
  if (!c.ok()) return 1;
  std::printf("%s %zu\n", agentbox::ToString(c->enforcement.level), c->plan.mounts.size());
  return 0;
}
