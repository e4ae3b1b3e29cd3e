#include "linux/microvm.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "linux/fd.h"

namespace agentbox::linux {
namespace {

using nlohmann::json;

bool IsUnder(const std::string& path, const std::string& root) {
  if (root == "/") return !path.empty() && path[0] == '/';
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

// mkdir -p, each new directory 0755.
Status MakeDirs(const std::string& path) {
  std::string cur;
  std::size_t i = 0;
  while (i < path.size()) {
    std::size_t j = path.find('/', i + 1);
    if (j == std::string::npos) j = path.size();
    cur = path.substr(0, j);
    i = j;
    if (cur.empty()) continue;
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return Status::Errno("microvm", "mkdir", cur);
  }
  return {};
}

// A mount point at `path` like `like` (a directory, or an empty file).
Status MakeMountPoint(const std::string& path, bool dir) {
  if (dir) return MakeDirs(path);
  if (Status s = MakeDirs(path.substr(0, path.rfind('/'))); !s.ok()) return s;
  UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd.valid() && errno != EEXIST && errno != EISDIR) return Status::Errno("microvm", "create", path);
  return {};
}

Status BindReadOnly(const std::string& source, const std::string& target) {
  if (mount(source.c_str(), target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
    return Status::Errno("microvm", "bind " + source + " at", target);
  }
  struct mount_attr attr {};
  attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  if (syscall(SYS_mount_setattr, AT_FDCWD, target.c_str(), AT_RECURSIVE, &attr, sizeof(attr)) != 0) {
    return Status::Errno("microvm", "mount_setattr(read-only)", target);
  }
  return {};
}

// cpio newc: a header of 13 eight-digit hex fields after the magic.
void CpioEntry(std::string* out, const std::string& name, unsigned mode, const std::string& data,
               unsigned rdev_major = 0, unsigned rdev_minor = 0) {
  static unsigned ino = 1;
  char header[111];
  std::snprintf(header, sizeof(header), "070701%08X%08X%08X%08X%08X%08X%08zX%08X%08X%08X%08X%08zX%08X", ino++, mode,
                0u, 0u, 1u, 0u, data.size(), 0u, 0u, rdev_major, rdev_minor, name.size() + 1, 0u);
  out->append(header, 110);
  out->append(name);
  out->push_back('\0');
  while (out->size() % 4) out->push_back('\0');
  out->append(data);
  while (out->size() % 4) out->push_back('\0');
}

Result<std::string> ReadWhole(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno("microvm", "open", path);
  std::string data;
  char buf[1 << 16];
  for (ssize_t n; (n = read(fd.get(), buf, sizeof(buf))) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Errno("microvm", "read", path);
    }
    data.append(buf, static_cast<std::size_t>(n));
  }
  return data;
}

}  // namespace

void AppendFrame(std::string* out, FrameType type, std::string_view payload) {
  do {
    const std::string_view part = payload.substr(0, std::min(payload.size(), kMaxFrame));
    payload.remove_prefix(part.size());
    const auto n = static_cast<std::uint32_t>(part.size());
    out->push_back(static_cast<char>(type));
    for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    out->append(part);
  } while (!payload.empty());
}

void AppendControlFrames(std::string* out, const ControlFrame& request) {
  std::string head;
  auto put32 = [&](std::uint32_t v) {
    for (int i = 0; i < 4; ++i) head.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put32(static_cast<std::uint32_t>(request.fds.size()));
  for (const auto& d : request.fds) {
    put32(d.id);
    head.push_back(d.way);
  }
  std::string_view text = request.text;
  const std::size_t room = kMaxFrame - std::min(kMaxFrame, head.size());
  while (text.size() > room) {
    const std::size_t n = std::min(kMaxFrame, text.size() - room);
    AppendFrame(out, FrameType::kControlPart, text.substr(0, n));
    text.remove_prefix(n);
  }
  head.append(text);
  AppendFrame(out, FrameType::kControl, head);
}

bool ParseControlFrame(std::string_view payload, std::string parts, ControlFrame* out) {
  auto get32 = [&](std::size_t at, std::uint32_t* v) {
    if (payload.size() < at + 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= static_cast<std::uint32_t>(static_cast<unsigned char>(payload[at + i])) << (8 * i);
    return true;
  };
  std::uint32_t count = 0;
  if (!get32(0, &count) || count > 8) return false;
  std::size_t at = 4;
  out->fds.clear();
  for (std::uint32_t i = 0; i < count; ++i) {
    ControlDescriptor d;
    if (!get32(at, &d.id) || payload.size() < at + 5) return false;
    d.way = payload[at + 4];
    if (d.way != 'r' && d.way != 'w' && d.way != 's') return false;
    out->fds.push_back(d);
    at += 5;
  }
  out->text = std::move(parts);
  out->text.append(payload.substr(at));
  return true;
}

Status WriteFrame(int fd, FrameType type, std::string_view payload) {
  std::string frame;
  AppendFrame(&frame, type, payload);
  if (!WriteAll(fd, frame)) return Status::Errno("channel", "write", "frame");
  return {};
}

bool FrameReader::Read(int fd, std::vector<Frame>* out) {
  char buf[1 << 16];
  ssize_t n;
  do {
    n = read(fd, buf, sizeof(buf));
  } while (n < 0 && errno == EINTR);
  if (n < 0 && errno == EAGAIN) return true;
  if (n <= 0) return false;
  buffer_.append(buf, static_cast<std::size_t>(n));
  std::size_t at = 0;
  while (buffer_.size() - at >= 5) {
    const auto type = static_cast<FrameType>(buffer_[at]);
    std::uint32_t len = 0;
    for (int i = 0; i < 4; ++i) len |= static_cast<std::uint32_t>(static_cast<unsigned char>(buffer_[at + 1 + i])) << (8 * i);
    if (len > kMaxFrame) {
      error_ = "a frame of " + std::to_string(len) + " bytes (at most " + std::to_string(kMaxFrame) + ")";
      return false;
    }
    if (buffer_.size() - at - 5 < len) break;
    out->push_back({type, buffer_.substr(at + 5, len)});
    at += 5 + len;
  }
  buffer_.erase(0, at);
  return true;
}

std::string GuestRequestToJson(const GuestRequest& r) {
  json shares = json::array();
  for (const auto& s : r.shares) shares.push_back({{"tag", s.tag}, {"path", s.path}, {"writable", s.writable}});
  return json{{"plan", r.plan_json}, {"argv", r.argv},   {"shares", shares},
              {"stdin", r.stdin_open}, {"env", r.env}, {"pids_max", r.pids_max},
              {"proxy_http_port", r.proxy_http_port}, {"proxy_socks_port", r.proxy_socks_port},
              {"world", r.world}}
      .dump();
}

Result<GuestRequest> GuestRequestFromJson(const std::string& text) {
  try {
    const json j = json::parse(text);
    GuestRequest r;
    r.plan_json = j.at("plan").get<std::string>();
    r.argv = j.at("argv").get<std::vector<std::string>>();
    for (const auto& s : j.at("shares")) {
      r.shares.push_back({s.at("tag").get<std::string>(), s.at("path").get<std::string>(), s.at("writable").get<bool>()});
    }
    r.stdin_open = j.at("stdin").get<bool>();
    r.env = j.at("env").get<std::vector<std::string>>();
    r.pids_max = j.at("pids_max").get<std::uint64_t>();
    r.proxy_http_port = j.at("proxy_http_port").get<std::uint16_t>();
    r.proxy_socks_port = j.at("proxy_socks_port").get<std::uint16_t>();
    r.world = j.at("world").get<bool>();
    return r;
  } catch (const std::exception& e) {
    return Status::Error("guest", std::string("the request is not one: ") + e.what());
  }
}

const std::vector<std::string>& GuestModules() {
  static const std::vector<std::string> kModules = {
      "kernel/drivers/virtio/virtio_mmio.ko",
      "kernel/drivers/char/virtio_console.ko",
      "kernel/fs/fuse/virtiofs.ko",
  };
  return kModules;
}

Result<std::vector<std::string>> GuestModuleOrder(const std::string& release) {
  auto dep = ReadWhole("/lib/modules/" + release + "/modules.dep");
  if (!dep.ok()) return dep.status();
  // "kernel/a.ko: kernel/b.ko kernel/c.ko" per line.
  std::map<std::string, std::vector<std::string>> deps;
  std::size_t at = 0;
  while (at < dep->size()) {
    std::size_t nl = dep->find('\n', at);
    if (nl == std::string::npos) nl = dep->size();
    const std::string line = dep->substr(at, nl - at);
    at = nl + 1;
    const std::size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::vector<std::string>& list = deps[line.substr(0, colon)];
    std::size_t i = colon + 1;
    while (i < line.size()) {
      std::size_t j = line.find(' ', i);
      if (j == std::string::npos) j = line.size();
      if (j > i) list.push_back(line.substr(i, j - i));
      i = j + 1;
    }
  }
  std::vector<std::string> order;
  std::set<std::string> seen;
  std::function<Status(const std::string&)> add = [&](const std::string& m) -> Status {
    if (!seen.insert(m).second) return {};
    auto it = deps.find(m);
    if (it == deps.end()) {
      return Status::Error("microvm", "the guest kernel " + release + " has no module " + m +
                                          " (built in, or another kernel's layout): modules.dep does not list it");
    }
    for (const auto& d : it->second) {
      if (Status s = add(d); !s.ok()) return s;
    }
    order.push_back(m);
    return {};
  };
  for (const auto& m : GuestModules()) {
    if (Status s = add(m); !s.ok()) return s;
  }
  return order;
}

std::string KernelRelease(const std::string& kernel_path) {
  const std::string base = kernel_path.substr(kernel_path.rfind('/') + 1);
  if (base.rfind("vmlinuz-", 0) != 0 || base.size() == 8) return "";
  return base.substr(8);
}

Status WriteGuestInitramfs(const std::string& init, const std::string& release, const std::string& out) {
  std::string cpio;
  for (const char* dir : {"dev", "proc", "sys", "newroot", "lib", "lib/modules"}) CpioEntry(&cpio, dir, 040755, "");
  CpioEntry(&cpio, "dev/console", 020600, "", 5, 1);
  auto binary = ReadWhole(init);
  if (!binary.ok()) return binary.status();
  CpioEntry(&cpio, "init", 0100755, *binary);
  auto modules = GuestModuleOrder(release);
  if (!modules.ok()) return modules.status();
  std::string order;
  for (const auto& rel : *modules) {
    const std::string path = "/lib/modules/" + release + "/" + rel;
    auto data = ReadWhole(path);
    if (!data.ok()) {
      return Status::Error("microvm", "the guest kernel's module " + path + " cannot be read (" +
                                          data.status().message() + "): is linux-image-" + release + " installed?");
    }
    const std::string name = "lib/modules/" + rel.substr(rel.rfind('/') + 1);
    CpioEntry(&cpio, name, 0100644, *data);
    order += "/" + name + "\n";
  }
  CpioEntry(&cpio, "modules.order", 0100644, order);
  CpioEntry(&cpio, "TRAILER!!!", 0, "");
  const std::string tmp = out + ".tmp";
  UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return Status::Errno("microvm", "create", tmp);
  if (!WriteAll(fd.get(), cpio)) return Status::Errno("microvm", "write", tmp);
  fd.reset();
  if (rename(tmp.c_str(), out.c_str()) != 0) return Status::Errno("microvm", "rename", out);
  return {};
}

namespace {

std::uint64_t HostTscKhz() {
  // "cpu MHz		: 2199.998": under TCG the guest's TSC is the host's.
  auto info = ReadWhole("/proc/cpuinfo");
  if (!info.ok()) return 0;
  const auto at = info->find("cpu MHz");
  if (at == std::string::npos) return 0;
  const auto colon = info->find(':', at);
  if (colon == std::string::npos) return 0;
  const double mhz = std::strtod(info->c_str() + colon + 1, nullptr);
  return mhz > 0 ? static_cast<std::uint64_t>(mhz * 1000) : 0;
}

std::vector<std::string> QemuBaseArgv(const MicrovmPlan& vm, const std::string& append, bool memory_backend) {
  const bool kvm = vm.accel == "kvm";
  // Without KVM's clock, the guest kernel cannot calibrate its TSC on a
  // microvm machine (no PIT reference it trusts): it is told the rate.
  // cryptomgr.notests: the kernel checks each crypto algorithm it registers
  // against known answers at boot, a quarter of a boot under TCG (2.40 ->
  // 1.77 s of CPU); nothing in the guest rests on the kernel's crypto.
  std::string cmdline = "console=ttyS0 quiet loglevel=3 panic=-1 cryptomgr.notests rdinit=/init";
  if (const std::uint64_t khz = HostTscKhz(); !kvm && khz > 0) {
    cmdline += " tsc_early_khz=" + std::to_string(khz) + " lpj=" + std::to_string(khz * 1000 / 250);
  }
  if (!append.empty()) cmdline += " " + append;
  return {
      vm.qemu,
      "-nodefaults",
      "-no-user-config",
      "-nographic",
      "-no-reboot",
      // virtio 1.0 over MMIO: virtiofsd (libvhost-user) serves no legacy device.
      "-global",
      "virtio-mmio.force-legacy=false",
      "-machine",
      std::string("microvm,accel=") + (kvm ? "kvm" : "tcg") + ",x-option-roms=off" +
          (memory_backend ? ",memory-backend=mem" : ""),
      "-cpu",
      kvm ? "host" : "max",
      "-smp",
      std::to_string(vm.vcpus),
      "-m",
      std::to_string(vm.memory_mib) + "M",
      "-kernel",
      vm.kernel,
      "-initrd",
      vm.initramfs,
      // panic=-1: a guest panic ends QEMU (-no-reboot) at once.
      "-append",
      cmdline,
  };
}

}  // namespace

std::vector<std::string> QemuArgv(const QemuRun& run) {
  const MicrovmPlan& vm = run.vm;
  std::vector<std::string> a = QemuBaseArgv(vm, "", true);
  a.insert(a.end(), {
      // virtiofs needs the guest's memory shared with virtiofsd.
      "-object",
      "memory-backend-memfd,id=mem,size=" + std::to_string(vm.memory_mib) + "M,share=on",
      "-serial",
      "file:" + run.console_log,
      "-device",
      "virtio-serial-device",
      "-chardev",
      "socket,id=ctl,path=" + run.control_socket,
      "-device",
      std::string("virtserialport,chardev=ctl,name=") + kGuestPortName,
  });
  int i = 0;
  for (const auto& [tag, socket] : run.fs_sockets) {
    const std::string id = "fs" + std::to_string(i++);
    a.insert(a.end(), {"-chardev", "socket,id=" + id + ",path=" + socket, "-device",
                       "vhost-user-fs-device,chardev=" + id + ",tag=" + tag});
  }
  return a;
}

std::vector<std::string> QemuTrialArgv(const std::string& qemu, const std::string& kernel,
                                       const std::string& initramfs, const std::string& accel) {
  MicrovmPlan vm;
  vm.qemu = qemu;
  vm.kernel = kernel;
  vm.initramfs = initramfs;
  vm.accel = accel;
  vm.memory_mib = 256;
  vm.vcpus = 1;
  std::vector<std::string> a = QemuBaseArgv(vm, kGuestTrialArg, false);
  a.insert(a.end(), {"-serial", "stdio"});
  return a;
}

std::vector<std::string> VirtiofsdArgv(const std::string& virtiofsd, const std::string& socket,
                                       const std::string& source) {
  return {virtiofsd, "--socket-path=" + socket, "-o", "source=" + source, "-o", "cache=auto", "-o",
          "sandbox=namespace", "-o", "log_level=err", "--rlimit-nofile=0"};
}

std::string HostPathOf(const std::string& target, const ResolvedPlan& resolved) {
  std::string best_target, best_source;
  for (const auto& m : resolved.mounts) {
    if (m.op.kind != MountKind::kBind) continue;
    if (IsUnder(target, m.op.target) && m.op.target.size() >= best_target.size()) {
      best_target = m.op.target;
      best_source = m.op.source;
    }
  }
  if (best_target.empty()) return "";
  if (target == best_target) return best_source;
  const std::string rest = best_target == "/" ? target : target.substr(best_target.size());
  return best_source == "/" ? rest : best_source + rest;
}

std::vector<std::string> WritableSources(const ResolvedPlan& resolved) {
  std::vector<std::string> out;
  for (const auto& m : resolved.mounts) {
    if (m.op.kind == MountKind::kBind && !m.op.read_only && m.is_dir) out.push_back(m.op.source);
  }
  std::sort(out.begin(), out.end(), [](const std::string& a, const std::string& b) { return a.size() < b.size(); });
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Status PrepareShareView(const ResolvedPlan& resolved, const GuestShare& share, const std::string& staging,
                        const std::string& empty_file, const std::string& empty_dir) {
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return Status::Errno("microvm", "make mounts private", "/");
  }
  // Where a host path appears in what this share exports ("" = not in it).
  std::string root;
  if (!share.writable) {
    if (mount("tmpfs", staging.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m") != 0) {
      return Status::Errno("microvm", "mount(tmpfs)", staging);
    }
    for (const char* dir : {"/dev", "/proc", "/sys", "/tmp", "/run"}) {
      if (Status s = MakeDirs(staging + dir); !s.ok()) return s;
    }
    const std::vector<std::string> writable = WritableSources(resolved);
    for (const auto& m : resolved.mounts) {
      if (m.op.kind == MountKind::kSymlink && !m.op.source.empty() && !IsUnder(m.op.target, "/dev") &&
          !IsUnder(m.op.target, "/proc")) {
        // The guest resolves the plan again: a host link the plan keeps as
        // a link (merged /usr: /lib64 -> usr/lib64) is one there too.
        const std::string at = staging + m.op.target;
        if (Status s = MakeDirs(at.substr(0, at.rfind('/'))); !s.ok()) return s;
        if (symlink(m.op.source.c_str(), at.c_str()) != 0 && errno != EEXIST) {
          return Status::Errno("microvm", "symlink", at);
        }
        continue;
      }
      const bool sourced = m.op.kind == MountKind::kBind || (m.op.kind == MountKind::kFile && !m.op.source.empty());
      if (!sourced || m.op.source.empty() || m.op.source[0] != '/') continue;
      const std::string at = staging + (m.op.source == "/" ? "" : m.op.source);
      if (m.op.kind == MountKind::kBind && !m.op.read_only && m.is_dir) {
        if (Status s = MakeDirs(at); !s.ok()) return s;  // the writable share's mount point
        continue;
      }
      // Inside a writable share: that share exports it.
      if (std::any_of(writable.begin(), writable.end(), [&](const std::string& w) { return IsUnder(m.op.source, w); })) {
        continue;
      }
      struct stat st {};
      if (stat(m.op.source.c_str(), &st) != 0) continue;  // optional and absent: the guest skips it too
      if (Status s = MakeMountPoint(at, S_ISDIR(st.st_mode)); !s.ok()) return s;
      if (Status s = BindReadOnly(m.op.source, at); !s.ok()) return s;
    }
  }
  // Masks and protected paths below the exported tree, from the host side.
  for (const auto& m : resolved.mounts) {
    if (m.op.kind != MountKind::kMask && m.op.kind != MountKind::kProtect) continue;
    const std::string host = HostPathOf(m.op.target, resolved);
    if (host.empty()) continue;
    std::string at;
    if (share.writable) {
      if (!IsUnder(host, share.path)) continue;
      at = host;
    } else {
      at = staging + host;
    }
    struct stat st {};
    if (lstat(at.c_str(), &st) != 0) continue;  // not in this view (or in a writable share)
    if (m.op.kind == MountKind::kMask) {
      const std::string& empty = S_ISDIR(st.st_mode) ? empty_dir : empty_file;
      if (mount(empty.c_str(), at.c_str(), nullptr, MS_BIND, nullptr) != 0) {
        return Status::Errno("microvm", "mask", host);
      }
    } else if (Status s = BindReadOnly(at, at); !s.ok()) {
      return s;
    }
  }
  if (!share.writable && mount(nullptr, staging.c_str(), nullptr, MS_REMOUNT | MS_RDONLY | MS_BIND, nullptr) != 0) {
    return Status::Errno("microvm", "remount read-only", staging);
  }
  return {};
}

}  // namespace agentbox::linux
