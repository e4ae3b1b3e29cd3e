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
#include "linux/microvm.h"

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

// The /boot/vmlinuz-* kernels Debian's kernel packages installed, newest first.
std::vector<std::string> FindGuestKernels() {
  std::vector<std::string> found;
  DIR* d = opendir("/boot");
  if (!d) return found;
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, "vmlinuz-", 8) == 0) found.push_back(std::string("/boot/") + e->d_name);
  }
  closedir(d);
  std::sort(found.rbegin(), found.rend());
  return found;
}

// Where agentbox's guest images are: <directory of this binary>/guest
// (the build's), else <prefix>/lib/agentbox/guest for an installed binary.
std::string GuestImageDir() {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "";
  std::string dir(self, static_cast<std::size_t>(n));
  dir = dir.substr(0, dir.rfind('/'));
  struct stat st {};
  if (stat((dir + "/guest").c_str(), &st) == 0) return dir + "/guest";
  const std::string prefix = dir.substr(0, dir.rfind('/'));
  return prefix + "/lib/agentbox/guest";
}

// runsc's version, remembered per binary: asking it costs a Go program's
// start (20-30 ms) on every run. The record is keyed by the binary's
// device, inode, size and mtime, in this user's cache directory; it names
// the version for the report only (enforcement never reads it).
std::string FileKey(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return "";
  return std::to_string(st.st_dev) + "-" + std::to_string(st.st_ino) + "-" + std::to_string(st.st_size) + "-" +
         std::to_string(st.st_mtim.tv_sec);
}

// Whether KVM can run the guest is a fact of this boot of this machine
// (nested virtualisation may offer /dev/kvm and still fail the guest): the
// trial's verdict is remembered per boot, QEMU binary and guest kernel.
std::string KvmTrialCachePath(const std::string& qemu, const std::string& kernel) {
  // A fact of this boot: kept in this user's runtime directory (or a 0700
  // one of its own in /tmp), which a reboot empties.
  std::string dir;
  if (const char* x = getenv("XDG_RUNTIME_DIR"); x && *x == '/') {
    dir = x;
  } else {
    dir = "/tmp/agentbox-facts-" + std::to_string(getuid());
    mkdir(dir.c_str(), 0700);
    struct stat st {};
    if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077)) {
      return "";  // not ours alone: nothing is remembered
    }
  }
  const std::string qkey = FileKey(qemu), kkey = FileKey(kernel);
  std::string boot;
  if (linux::UniqueFd fd(open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC)); fd.valid()) {
    char buf[64];
    ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n > 0) boot.assign(buf, static_cast<std::size_t>(n));
    while (!boot.empty() && boot.back() == '\n') boot.pop_back();
  }
  if (dir.empty() || qkey.empty() || kkey.empty() || boot.empty()) return "";
  return dir + "/agentbox/kvm-trial-" + boot + "-" + qkey + "-" + kkey;
}

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
  for (const char* p : {"/usr/lib/qemu/virtiofsd", "/usr/libexec/virtiofsd"}) {
    if (access(p, X_OK) == 0) {
      l.virtiofsd = p;
      break;
    }
  }
  // The newest kernel agentbox has a guest image for (the image carries
  // that release's virtio modules).
  const std::vector<std::string> kernels = FindGuestKernels();
  const std::string images = GuestImageDir();
  for (const auto& k : kernels) {
    const std::string release = k.substr(k.rfind('/') + 9);
    const std::string image = images + "/initramfs-" + release + ".img";
    if (access(image.c_str(), R_OK) == 0 && access(k.c_str(), R_OK) == 0) {
      l.guest_kernel = k;
      l.guest_image = image;
      break;
    }
  }
  if (l.guest_image.empty()) {
    if (kernels.empty()) {
      l.guest_image_why = "no guest kernel in /boot (Debian package linux-image-cloud-amd64)";
    } else {
      l.guest_kernel = kernels.front();
      l.guest_image_why = "no guest image for " + kernels.front() + " at " + images + "/initramfs-" +
                          kernels.front().substr(kernels.front().rfind('/') + 9) +
                          ".img (the build makes it: cmake --build build --target guest_image)";
    }
  }
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
  if (const long n = sysconf(_SC_NPROCESSORS_ONLN); n > 0) l.cpus = static_cast<unsigned>(n);
  if (l.kvm && !l.qemu.empty() && !l.guest_image.empty()) {
    // /dev/kvm opens; whether it runs this guest is tried once per boot
    // (check included: a failing trial costs its whole 8 s timeout): a trial
    // boot to the guest's init.
    const std::string cache = KvmTrialCachePath(l.qemu, l.guest_kernel);
    std::string verdict = ReadCachedVersion(cache);
    if (verdict.empty()) {
      int ws = 0;
      const auto t0 = std::chrono::steady_clock::now();
      const std::string out =
          Output(linux::QemuTrialArgv(l.qemu, l.guest_kernel, l.guest_image, "kvm"), std::chrono::seconds(8), &ws);
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
      verdict = out.find(linux::kGuestTrialReady) != std::string::npos ? "ok" : "failed-" + std::to_string(ms.count());
      WriteCachedVersion(cache, verdict);
    }
    if (verdict != "ok") {
      l.kvm = false;
      l.kvm_why = "/dev/kvm opens, but a trial VM under KVM did not reach the guest's init (nested virtualisation "
                  "that cannot run this guest kernel); QEMU's TCG runs it instead";
    }
  }
  if (l.qemu.empty()) {
    l.microvm_why = "QEMU is not installed (Debian package qemu-system-x86)";
  } else if (l.virtiofsd.empty()) {
    l.microvm_why = "QEMU's virtiofsd is not installed (Debian package qemu-system-common)";
  } else if (!l.guest_image_why.empty()) {
    l.microvm_why = l.guest_image_why;
  } else if (getuid() != 0 && access("/proc/self/ns/user", F_OK) != 0) {
    l.microvm_why = "no user namespaces: virtiofsd runs in one of agentbox's without root";
  } else if (const int groups = getgroups(0, nullptr); getuid() != 0 && groups > 0) {
    // QEMU 7.2's virtiofsd drops supplementary groups with setgroups(),
    // which the user namespace of an unprivileged user must forbid (else a
    // group that denies would be dropped): it exits at start.
    l.microvm_why = "without root, virtiofsd (QEMU " + std::string("7.2's") + ") must drop this process's " +
                    std::to_string(groups) + " supplementary group(s), which a user namespace of an unprivileged "
                    "user forbids; run as root, or start agentbox with no supplementary groups (setpriv "
                    "--clear-groups, or a service's empty SupplementaryGroups)";
  }
  return l;
}

}  // namespace agentbox
