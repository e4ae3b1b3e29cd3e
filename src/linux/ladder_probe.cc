// The isolation ladder's probe: which programs and devices can give a
// command a kernel of its own here (gVisor's runsc; QEMU, KVM and a guest
// kernel). Nothing here is assumed: each fact is looked up or tried.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "agentbox/host_caps.h"
#include "linux/fd.h"
#include "linux/host_program.h"

namespace agentbox {
namespace {

// The first executable `name` in PATH (or the system's directories when
// PATH is unset); "" when none.
std::string FindProgram(const char* name) {
  const char* path = getenv("PATH");
  return linux::FindOnPath("/", path && *path ? path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                           name);
}

// What `argv` prints (stdout and stderr together), or "" when it cannot run.
std::string Output(const std::vector<std::string>& argv, std::chrono::milliseconds timeout, int* wait_status) {
  std::vector<std::string> sh = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1"};
  sh.insert(sh.end(), argv.begin(), argv.end());
  auto run = linux::RunHostProgram(sh, "", timeout, 64 * 1024);
  if (!run.ok()) {
    *wait_status = -1;
    return "";
  }
  *wait_status = run->end == linux::ProgramRun::End::kExited ? run->wait_status : -1;
  return run->output;
}

std::string FirstLine(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}

// The newest /boot/vmlinuz-* a Debian kernel package installed ("" none).
std::string FindGuestKernel() {
  DIR* d = opendir("/boot");
  if (!d) return "";
  std::vector<std::string> found;
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, "vmlinuz-", 8) == 0) found.push_back(std::string("/boot/") + e->d_name);
  }
  closedir(d);
  std::sort(found.begin(), found.end());
  return found.empty() ? "" : found.back();
}

// runsc's version, remembered per binary: asking it costs a Go program's
// start (20-30 ms) on every run. The record is keyed by the binary's
// device, inode, size and mtime, in this user's cache directory; it names
// the version for the report only (enforcement never reads it).
std::string VersionCachePath(const std::string& runsc) {
  struct stat st {};
  if (stat(runsc.c_str(), &st) != 0) return "";
  std::string dir;
  if (const char* x = getenv("XDG_CACHE_HOME"); x && *x == '/') {
    dir = x;
  } else if (const char* h = getenv("HOME"); h && *h == '/') {
    dir = std::string(h) + "/.cache";
  } else {
    return "";
  }
  return dir + "/agentbox/runsc-version-" + std::to_string(st.st_dev) + "-" + std::to_string(st.st_ino) + "-" +
         std::to_string(st.st_size) + "-" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec);
}

std::string ReadCachedVersion(const std::string& path) {
  if (path.empty()) return "";
  linux::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return "";
  char buf[128];
  ssize_t n = read(fd.get(), buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string v(buf, static_cast<std::size_t>(n));
  // One printable token, as runsc prints it; anything else is not ours.
  for (char c : v) {
    if (c <= ' ' || c > '~') return "";
  }
  return v;
}

void WriteCachedVersion(const std::string& path, const std::string& version) {
  if (path.empty()) return;
  const std::string dir = path.substr(0, path.rfind('/'));
  mkdir(dir.substr(0, dir.rfind('/')).c_str(), 0700);
  mkdir(dir.c_str(), 0700);
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  linux::UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return;
  if (write(fd.get(), version.data(), version.size()) == static_cast<ssize_t>(version.size())) {
    rename(tmp.c_str(), path.c_str());
  } else {
    unlink(tmp.c_str());
  }
}

}  // namespace

LadderCaps ProbeLadder(ProbeDepth depth) {
  LadderCaps l;
  l.probed = true;
  l.runsc_rootless = getuid() != 0;
  l.runsc = FindProgram("runsc");
  if (l.runsc.empty()) {
    l.runsc_why = "gVisor's runsc is not installed (Debian package runsc)";
  } else if (const std::string cache = VersionCachePath(l.runsc);
             depth == ProbeDepth::kQuick && !(l.runsc_version = ReadCachedVersion(cache)).empty()) {
    // This binary answered before (check, kDeep, always asks it again).
  } else {
    int ws = 0;
    const std::string out = Output({l.runsc, "--version"}, std::chrono::seconds(10), &ws);
    // "runsc version 0.0~20221219.0"
    const std::string first = FirstLine(out);
    const std::string prefix = "runsc version ";
    if (ws != 0 || first.rfind(prefix, 0) != 0) {
      l.runsc_why = l.runsc + " --version did not answer as runsc does: '" + first + "'";
    } else {
      l.runsc_version = first.substr(prefix.size());
      WriteCachedVersion(cache, l.runsc_version);
    }
  }
  if (depth == ProbeDepth::kDeep && l.runsc_why.empty()) {
    // A real sandbox, the way runs start one: no network, cgroups left to
    // agentbox, --rootless without root. Its state in a directory of its own.
    char dir[] = "/tmp/agentbox-runsc-probe-XXXXXX";
    if (mkdtemp(dir)) {
      std::vector<std::string> argv = {l.runsc, std::string("--root=") + dir, "--network=none", "--ignore-cgroups",
                                       "--platform=" + l.runsc_platform};
      if (l.runsc_rootless) argv.push_back("--rootless");
      argv.insert(argv.end(), {"do", "/bin/true"});
      int ws = 0;
      const std::string out = Output(argv, std::chrono::seconds(30), &ws);
      l.runsc_tried = true;
      if (ws != 0) {
        l.runsc_why = "a trial sandbox (runsc" + std::string(l.runsc_rootless ? " --rootless" : "") +
                      " do /bin/true) failed: " + (FirstLine(out).empty() ? "no message" : FirstLine(out));
      }
      Output({"/bin/rm", "-rf", "--", dir}, std::chrono::seconds(10), &ws);
    }
  }
  l.qemu = FindProgram("qemu-system-x86_64");
  l.guest_kernel = FindGuestKernel();
  struct stat st {};
  if (stat("/dev/kvm", &st) != 0) {
    l.kvm_why = "no /dev/kvm (no hardware virtualisation offered to this machine)";
  } else {
    linux::UniqueFd kvm(open("/dev/kvm", O_RDWR | O_CLOEXEC));
    if (kvm.valid()) {
      l.kvm = true;
    } else {
      l.kvm_why = std::string("/dev/kvm: ") + std::strerror(errno) + " (mode " +
                  std::to_string((st.st_mode >> 6) & 7) + std::to_string((st.st_mode >> 3) & 7) +
                  std::to_string(st.st_mode & 7) + ", owner uid " + std::to_string(st.st_uid) + ")";
    }
  }
  return l;
}

}  // namespace agentbox
