#include "linux/namespaces.h"

#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "linux/compat.h"
#include "linux/fd.h"

namespace agentbox::linux {
namespace {

Status WriteFile(const char* path, const std::string& text) {
  UniqueFd fd(open(path, O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno("userns", "open", path);
  if (write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    return Status::Errno("userns", "write", path);
  }
  return {};
}

}  // namespace

unsigned long NamespaceFlags(const std::vector<std::string>& names) {
  unsigned long flags = 0;
  for (const auto& n : names) {
    if (n == "user") flags |= CLONE_NEWUSER;
    if (n == "mnt") flags |= CLONE_NEWNS;
    if (n == "pid") flags |= CLONE_NEWPID;
    if (n == "net") flags |= CLONE_NEWNET;
    if (n == "ipc") flags |= CLONE_NEWIPC;
    if (n == "uts") flags |= CLONE_NEWUTS;
    if (n == "cgroup") flags |= CLONE_NEWCGROUP;
  }
  return flags;
}

Status WriteIdMaps(uid_t uid, gid_t gid) {
  // The process maps itself, so the kernel lets it map exactly one id: its
  // own (root stays root, everyone else stays themselves; other owners show
  // as the overflow id). gid_map needs setgroups denied first.
  if (Status s = WriteFile("/proc/self/setgroups", "deny\n"); !s.ok()) return s;
  if (Status s = WriteFile("/proc/self/uid_map", std::to_string(uid) + " " + std::to_string(uid) + " 1\n");
      !s.ok()) {
    return s;
  }
  return WriteFile("/proc/self/gid_map", std::to_string(gid) + " " + std::to_string(gid) + " 1\n");
}

Status BringUpLoopback() {
  UniqueFd sock(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return Status::Errno("network", "socket", "AF_INET");
  struct ifreq ifr {};
  std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
  if (ioctl(sock.get(), SIOCGIFFLAGS, &ifr) != 0) return Status::Errno("network", "ioctl(SIOCGIFFLAGS)", "lo");
  ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  if (ioctl(sock.get(), SIOCSIFFLAGS, &ifr) != 0) return Status::Errno("network", "ioctl(SIOCSIFFLAGS)", "lo");
  return {};
}

Status SetHostname(const std::string& name) {
  if (sethostname(name.data(), name.size()) != 0) return Status::Errno("hostname", "sethostname", name);
  return {};
}

}  // namespace agentbox::linux
