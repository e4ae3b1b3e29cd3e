// Landlock rules that mirror the mount plan: what is mounted is granted what
// its mount allows, and nothing that is not mounted is granted anything.
//
// Landlock rules are allow-lists over a hierarchy: rights granted on a
// directory hold for everything beneath it, whatever is mounted there. So a
// read-only mount inside the read-write workspace (a protected path, a mask)
// gets read-write rights from Landlock, and stays read-only by its mount
// flag; the two layers are each enough on their own where they overlap.
#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "confine/layers.h"
#include "confine/paths.h"
#include "linux/compat.h"

namespace agentbox {
namespace {

constexpr std::uint64_t kRead = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR;
constexpr std::uint64_t kReadExec = kRead | LANDLOCK_ACCESS_FS_EXECUTE;
// Everything a writable tree needs; device nodes can never be made.
constexpr std::uint64_t kWrite =
    LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_REMOVE_DIR | LANDLOCK_ACCESS_FS_REMOVE_FILE |
    LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG | LANDLOCK_ACCESS_FS_MAKE_SOCK |
    LANDLOCK_ACCESS_FS_MAKE_FIFO | LANDLOCK_ACCESS_FS_MAKE_SYM | LANDLOCK_ACCESS_FS_REFER |
    LANDLOCK_ACCESS_FS_TRUNCATE;
// A terminal needs its ioctls; `> /dev/null` opens with O_TRUNC.
constexpr std::uint64_t kDevice = LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_WRITE_FILE |
                                  LANDLOCK_ACCESS_FS_TRUNCATE | LANDLOCK_ACCESS_FS_IOCTL_DEV;
// Tools write /proc/self/... (oom_score_adj, comm, attr); /proc/sys is a
// read-only mount.
constexpr std::uint64_t kProc = kRead | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_TRUNCATE;

// Every filesystem right the kernel knows at `abi`: all of them are handled,
// so that anything not granted is denied.
std::uint64_t KnownRights(int abi) {
  if (abi <= 0) return 0;
  std::uint64_t r = (LANDLOCK_ACCESS_FS_MAKE_SYM << 1) - 1;  // ABI 1: bits 0..12
  if (abi >= 2) r |= LANDLOCK_ACCESS_FS_REFER;
  if (abi >= 3) r |= LANDLOCK_ACCESS_FS_TRUNCATE;
  if (abi >= 5) r |= LANDLOCK_ACCESS_FS_IOCTL_DEV;
  return r;
}

constexpr std::pair<std::uint64_t, const char*> kNames[] = {
    {LANDLOCK_ACCESS_FS_EXECUTE, "execute"},         {LANDLOCK_ACCESS_FS_WRITE_FILE, "write_file"},
    {LANDLOCK_ACCESS_FS_READ_FILE, "read_file"},     {LANDLOCK_ACCESS_FS_READ_DIR, "read_dir"},
    {LANDLOCK_ACCESS_FS_REMOVE_DIR, "remove_dir"},   {LANDLOCK_ACCESS_FS_REMOVE_FILE, "remove_file"},
    {LANDLOCK_ACCESS_FS_MAKE_CHAR, "make_char"},     {LANDLOCK_ACCESS_FS_MAKE_DIR, "make_dir"},
    {LANDLOCK_ACCESS_FS_MAKE_REG, "make_reg"},       {LANDLOCK_ACCESS_FS_MAKE_SOCK, "make_sock"},
    {LANDLOCK_ACCESS_FS_MAKE_FIFO, "make_fifo"},     {LANDLOCK_ACCESS_FS_MAKE_BLOCK, "make_block"},
    {LANDLOCK_ACCESS_FS_MAKE_SYM, "make_sym"},       {LANDLOCK_ACCESS_FS_REFER, "refer"},
    {LANDLOCK_ACCESS_FS_TRUNCATE, "truncate"},       {LANDLOCK_ACCESS_FS_IOCTL_DEV, "ioctl_dev"},
};

}  // namespace

std::string LandlockAccessNames(std::uint64_t access) {
  std::string out;
  for (const auto& [bit, name] : kNames) {
    if (access & bit) out += (out.empty() ? "" : ", ") + std::string(name);
  }
  return out.empty() ? "none" : out;
}

std::vector<std::string> LandlockLeftOut(int abi) {
  std::vector<std::string> out;
  if (abi < 2) out.push_back("refer (ABI 2): without it every rename or link across directories fails");
  if (abi < 3) out.push_back("truncate (ABI 3): truncate(2) and O_TRUNC are not checked");
  if (abi < 5) out.push_back("ioctl_dev (ABI 5): ioctls on device files are not checked");
  if (abi < 6) {
    out.push_back("scoping (ABI 6): abstract unix sockets and signals outside the sandbox are not "
                  "fenced by Landlock (the network and pid namespaces still fence them)");
  }
  return out;
}

LandlockPlan PlanLandlockOnly(const std::vector<std::string>& read_only, const std::string& workspace,
                              bool writable, int host_abi, bool required) {
  LandlockPlan ll;
  if (host_abi < kMinLandlockAbi) return ll;
  ll.abi = std::min(host_abi, kNewestLandlockAbi);
  ll.handled_fs = KnownRights(ll.abi);
  if (ll.abi >= 4) ll.handled_net = LANDLOCK_ACCESS_NET_BIND_TCP | LANDLOCK_ACCESS_NET_CONNECT_TCP;
  if (ll.abi >= 6) ll.scoped = LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL;
  ll.left_out = LandlockLeftOut(ll.abi);
  if (ll.abi < 4) {
    ll.left_out.push_back("TCP connect and bind (ABI 4): TCP rests on the seccomp connect() mediation alone");
  }
  ll.required = required;
  auto add = [&](const std::string& path, std::uint64_t access, bool optional, const std::string& why) {
    ll.rules.push_back({path, access & ll.handled_fs, optional, why});
  };
  for (const auto& p : read_only) add(p, kReadExec, true, "filesystem.read_only: " + p);
  add(workspace, writable ? kReadExec | kWrite : kReadExec, false,
      writable ? "workspace (read-write)" : "workspace (read-only)");
  for (const char* dev : {"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty",
                          "/dev/ptmx"}) {
    add(dev, kDevice, true, "device node");
  }
  add("/dev/pts", LANDLOCK_ACCESS_FS_READ_DIR | kDevice, true, "terminals (the host's devpts)");
  // Read only: writes to /proc would reach host-wide files (sysrq-trigger,
  // /proc/sys) that nothing but file modes guards without a mount plan.
  add("/proc", kRead, false, "host procfs, read-only: processes are visible");
  return ll;
}

void AddLandlockTree(LandlockPlan* plan, const std::string& path, bool writable, bool optional,
                     const std::string& why) {
  if (plan->abi <= 0) return;
  plan->rules.push_back({path, (writable ? kReadExec | kWrite : kReadExec) & plan->handled_fs, optional, why});
}

void AdoptPrivateDir(Plan* plan, const std::string& dir) {
  plan->private_dir = dir;
  if (plan->landlock.abi > 0) {
    plan->landlock.rules.push_back({dir, (kReadExec | kWrite) & plan->landlock.handled_fs, false,
                                    "private per-run directory (HOME, TMPDIR)"});
  }
  plan->home = dir + "/home";
  auto set_default = [&](const std::string& name, const std::string& value) {
    for (const auto& [k, v] : plan->env.set) {
      if (k == name) return;
    }
    plan->env.set.emplace_back(name, value);
  };
  set_default("HOME", plan->home);
  set_default("TMPDIR", dir + "/tmp");
}

namespace {
const char* const kProxyVars[] = {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY",
                                  "http_proxy", "https_proxy", "all_proxy", "no_proxy"};
const char* const kTrustVars[] = {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO",
                                  "CURL_CA_BUNDLE", "CARGO_HTTP_CAINFO", "PIP_CERT"};
}  // namespace

const std::vector<std::string>& SandboxEnvNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all(std::begin(kProxyVars), std::end(kProxyVars));
    all.insert(all.end(), std::begin(kTrustVars), std::end(kTrustVars));
    all.emplace_back("SSL_CERT_DIR");
    return all;
  }();
  return names;
}

void SetProxyEnv(EnvRules* env, const ProxyPorts& ports, const std::string& no_proxy) {
  const std::string http = "http://127.0.0.1:" + std::to_string(ports.http_port);
  const std::string socks = "socks5h://127.0.0.1:" + std::to_string(ports.socks_port);
  std::vector<std::pair<const char*, std::string>> vars = {{"HTTP_PROXY", http},  {"HTTPS_PROXY", http},
                                                           {"ALL_PROXY", socks},  {"http_proxy", http},
                                                           {"https_proxy", http}, {"all_proxy", socks}};
  if (!no_proxy.empty()) {
    vars.emplace_back("NO_PROXY", no_proxy);
    vars.emplace_back("no_proxy", no_proxy);
  }
  for (const auto& [name, value] : vars) {
    const bool set = std::any_of(env->set.begin(), env->set.end(), [&](const auto& kv) { return kv.first == name; });
    if (!set) env->set.emplace_back(name, value);
  }
}

// The variables common runtimes read their trust store from, all naming
// the bundle (curl, OpenSSL, Python requests, Node, git, cargo, pip). A
// variable the policy sets itself is left as the policy says.
void SetTrustEnv(EnvRules* env, const std::string& bundle) {
  for (const char* name : kTrustVars) {
    const bool set = std::any_of(env->set.begin(), env->set.end(), [&](const auto& kv) { return kv.first == name; });
    if (!set) env->set.emplace_back(name, bundle);
  }
}

void AdoptProxyPorts(Plan* plan, ProxyPorts ports) {
  plan->network.proxy = ports;
  if (plan->landlock.handled_net & LANDLOCK_ACCESS_NET_CONNECT_TCP) {
    plan->landlock.connect_tcp_ports = {ports.http_port, ports.socks_port};
  }
  // No NO_PROXY: 127.0.0.1 is the host's loopback here, reached (when the
  // rules allow) only through the proxy.
  SetProxyEnv(&plan->env, ports, "");
}

bool LandlockCovers(const LandlockPlan& plan, const std::string& path, bool writable) {
  if (plan.abi <= 0) return true;  // no Landlock layer: nothing of it to cover
  std::uint64_t need = kRead;
  if (writable) need |= LANDLOCK_ACCESS_FS_WRITE_FILE;
  need &= plan.handled_fs;
  // Rights add up over the ancestors' rules (one ruleset, one layer).
  std::uint64_t granted = 0;
  for (const auto& r : plan.rules) {
    if (r.path != path && paths::IsWithin(path, r.path)) granted |= r.access;
  }
  return (granted & need) == need;
}

LandlockPlan PlanLandlock(const Plan& plan, int host_abi, bool required) {
  LandlockPlan ll;
  if (host_abi < kMinLandlockAbi) return ll;
  ll.abi = std::min(host_abi, kNewestLandlockAbi);
  ll.handled_fs = KnownRights(ll.abi);
  if (ll.abi >= 6) ll.scoped = LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL;
  ll.left_out = LandlockLeftOut(ll.abi);
  ll.required = required;
  auto add = [&](const std::string& path, std::uint64_t access, bool optional, const std::string& why) {
    ll.rules.push_back({path, access & ll.handled_fs, optional, why});
  };
  for (const auto& m : plan.mounts) {
    switch (m.kind) {
      case MountKind::kTmpfs:
        if (m.target == "/" || m.target == "/dev") {
          add(m.target, LANDLOCK_ACCESS_FS_READ_DIR, false, m.why + ": listing only");
        } else {
          add(m.target, kReadExec | kWrite, false, m.why);
        }
        break;
      case MountKind::kBind:
      case MountKind::kOverlay:
        add(m.target, m.read_only ? kReadExec : kReadExec | kWrite, m.optional, m.why);
        break;
      case MountKind::kDevice:
        add(m.target, kDevice, m.optional, m.why);
        break;
      case MountKind::kDevpts:
        add(m.target, LANDLOCK_ACCESS_FS_READ_DIR | kDevice, false, m.why);
        break;
      case MountKind::kProc:
        add(m.target, kProc, false, m.why);
        break;
      case MountKind::kFile:
        add(m.target, LANDLOCK_ACCESS_FS_READ_FILE, false, m.why);
        break;
      case MountKind::kDir:  // empty until a grant is grafted below it
        add(m.target, m.read_only ? kReadExec : kReadExec | kWrite, false, m.why);
        break;
      case MountKind::kSymlink:   // resolved to its target, which has its own rule
      case MountKind::kMask:      // inside a granted tree, mode 0000 and read-only
      case MountKind::kProtect:   // read-only by its mount flag
      case MountKind::kPin:
      case MountKind::kReadOnly:
        break;
    }
  }
  return ll;
}

}  // namespace agentbox
