#include "linux/gvisor.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <sstream>

#include "linux/fd.h"

namespace agentbox::linux {
namespace {

using json = nlohmann::json;

bool Under(const std::string& path, const std::string& dir) {
  return path == dir || path.rfind(dir + "/", 0) == 0;
}

// "mode=0755,size=16m" -> ["mode=0755", "size=16m"]
std::vector<std::string> SplitOptions(const std::string& data) {
  std::vector<std::string> out;
  std::stringstream in(data);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

json Bind(const std::string& source, const std::string& target, bool read_only) {
  return {{"destination", target},
          {"type", "bind"},
          {"source", source},
          {"options", {"rbind", read_only ? "ro" : "rw", "nosuid", "nodev"}}};
}

json Arg(unsigned index, std::uint64_t mask, std::uint64_t value) {
  return {{"index", index}, {"value", mask}, {"valueTwo", value}, {"op", "SCMP_CMP_MASKED_EQ"}};
}

}  // namespace

json OciSeccomp(const SeccompPlan& seccomp, std::vector<std::string>* left_out) {
  json syscalls = json::array();
  for (const auto& rule : seccomp.rules) {
    if (rule.action == SeccompAction::kNotifyMediate) {
      // connect() to unix sockets: the sandbox has no host socket to reach.
      continue;
    }
    if (rule.action == SeccompAction::kErrnoEnosys) {
      // Answered -ENOSYS so that libc falls back (clone3 to clone). runsc
      // of Debian 12 answers a filter's SCMP_ACT_ERRNO with EPERM whatever
      // errnoRet says, which breaks the fallback (pthread_create fails): the
      // rule is left to the Sentry, whose table answers what it lacks itself.
      left_out->push_back(Describe(rule) + " (left to gVisor: its filter cannot answer ENOSYS)");
      continue;
    }
    const int errno_ret = EPERM;
    // Each entry is one OCI rule: its args are ANDed; rules are ORed.
    std::vector<json> arg_sets;
    const SeccompArgCheck& w = rule.when;
    using K = SeccompArgCheck::Kind;
    switch (w.kind) {
      case K::kAlways: arg_sets.push_back(json::array()); break;
      case K::kLow32Equals: arg_sets.push_back(json::array({Arg(w.arg, 0xffffffffULL, w.value)})); break;
      case K::kMaskedEquals: arg_sets.push_back(json::array({Arg(w.arg, w.mask, w.value)})); break;
      case K::kAnyBitSet:
        if (w.has_except) {
          left_out->push_back(Describe(rule) + " (no OCI form: a bit test with an exception)");
          continue;
        }
        // (arg & mask) != 0: any one of its bits set.
        for (unsigned bit = 0; bit < 64; ++bit) {
          const std::uint64_t b = 1ULL << bit;
          if (w.mask & b) arg_sets.push_back(json::array({Arg(w.arg, b, b)}));
        }
        break;
      case K::kLow32NotIn:
        left_out->push_back(Describe(rule) + " (no OCI form: a value outside a set)");
        continue;
    }
    for (auto& args : arg_sets) {
      if (w.has_also) args.push_back(Arg(w.also_arg, w.also_mask, w.also_value));
      json r = {{"names", {rule.syscall}}, {"action", "SCMP_ACT_ERRNO"}, {"errnoRet", errno_ret}};
      if (!args.empty()) r["args"] = args;
      syscalls.push_back(std::move(r));
    }
  }
  return {{"defaultAction", "SCMP_ACT_ALLOW"}, {"architectures", {"SCMP_ARCH_X86_64"}}, {"syscalls", syscalls}};
}

Result<OciSpec> BuildOciSpec(const Plan& plan, const ResolvedPlan& resolved, const std::vector<std::string>& argv,
                             const std::vector<std::string>& env, const std::string& bundle) {
  OciSpec spec;
  json mounts = json::array();
  const std::string mask_file = bundle + "/mask-file";
  const std::string mask_dir = bundle + "/mask-dir";
  int file_no = 0;
  for (const auto& rm : resolved.mounts) {
    const MountOp& op = rm.op;
    // gVisor builds its own /dev (null, zero, full, random, urandom, tty,
    // ptmx, pts, fd, std*): the plan's device nodes and devpts are its.
    if (op.target == "/dev" || (Under(op.target, "/dev") && !Under(op.target, "/dev/shm"))) {
      spec.left_out.push_back(op.target + " (" + op.why + "): gVisor's own /dev");
      continue;
    }
    switch (op.kind) {
      case MountKind::kTmpfs: {
        if (op.target == "/") break;  // the bundle's read-only root stands for it
        std::vector<std::string> options = {"nosuid", "nodev"};
        for (const auto& o : SplitOptions(op.data)) options.push_back(o);
        mounts.push_back({{"destination", op.target}, {"type", "tmpfs"}, {"source", "tmpfs"}, {"options", options}});
        break;
      }
      case MountKind::kBind:
        mounts.push_back(Bind(op.source, op.target, op.read_only));
        break;
      case MountKind::kProtect:
        mounts.push_back(Bind(op.source, op.target, true));
        break;
      case MountKind::kPin:
        // A mount point cannot be renamed away, in the Sentry as in Linux.
        mounts.push_back(Bind(op.source, op.target, !plan.workspace_writable));
        break;
      case MountKind::kProc:
        mounts.push_back({{"destination", op.target},
                          {"type", "proc"},
                          {"source", "proc"},
                          {"options", {"nosuid", "noexec", "nodev"}}});
        break;
      case MountKind::kMask:
        if (plan.gvisor && plan.gvisor->rootless && !op.source.empty() &&
            access(op.source.c_str(), rm.is_dir ? R_OK | X_OK : R_OK) != 0) {
          // Rootless, runsc's gofer is this user: a path it cannot open is
          // closed to the sandbox already (and cannot be a mount point).
          spec.left_out.push_back(op.target + " (" + op.why + "): not readable by this user, closed inside too");
          break;
        }
        if (op.source.empty() || Under(op.target, "/proc")) {
          // Host kernel interfaces (/proc/kcore, ...): the Sentry's procfs has none of them.
          spec.left_out.push_back(op.target + " (" + op.why + "): not in gVisor's procfs");
          break;
        }
        // As the namespaces backend masks: a mode-0 file or directory,
        // read-only, so that a read fails (EACCES) rather than seeing nothing.
        mounts.push_back(Bind(rm.is_dir ? mask_dir : mask_file, op.target, true));
        break;
      case MountKind::kReadOnly:
        // /proc/sys: read-only in gVisor's procfs already.
        spec.left_out.push_back(op.target + " (" + op.why + "): read-only in gVisor");
        break;
      case MountKind::kSymlink:
        if (op.source.empty()) break;  // an optional link the host does not have
        spec.root_entries.push_back({op.target, op.source});
        break;
      case MountKind::kDir:
        spec.root_entries.push_back({op.target, ""});
        break;
      case MountKind::kFile: {
        const std::string name = "file-" + std::to_string(file_no++);
        spec.files.emplace_back(name, op.data);
        mounts.push_back(Bind(bundle + "/" + name, op.target, true));
        break;
      }
      case MountKind::kDevpts:
      case MountKind::kDevice:
        break;  // under /dev: handled above
      case MountKind::kOverlay:
        return Status::Error("gvisor", op.target + " (" + op.why + "): an overlay workspace has no OCI form here");
    }
  }

  json caps = json::array();  // none, in every set
  json rlimits = json::array();
  const ResourceLimits& lim = plan.limits;
  rlimits.push_back({{"type", "RLIMIT_NOFILE"}, {"soft", lim.nofile}, {"hard", lim.nofile}});
  if (lim.fsize_bytes) rlimits.push_back({{"type", "RLIMIT_FSIZE"}, {"soft", *lim.fsize_bytes}, {"hard", *lim.fsize_bytes}});
  if (lim.nproc) rlimits.push_back({{"type", "RLIMIT_NPROC"}, {"soft", *lim.nproc}, {"hard", *lim.nproc}});
  rlimits.push_back({{"type", "RLIMIT_CORE"}, {"soft", 0}, {"hard", 0}});

  // Rootless, the caller is root of the sandbox's user namespace: its files
  // are owned by uid 0 there, and so is the command (with no capability).
  const bool rootless = plan.gvisor && plan.gvisor->rootless;
  const json user = {{"uid", rootless ? 0 : plan.uid}, {"gid", rootless ? 0 : plan.gid}};
  json process = {{"terminal", false},
                  {"user", user},
                  {"args", argv},
                  {"env", env},
                  {"cwd", plan.cwd.empty() ? "/" : plan.cwd},
                  {"capabilities",
                   {{"bounding", caps}, {"effective", caps}, {"inheritable", caps}, {"permitted", caps}, {"ambient", caps}}},
                  {"rlimits", rlimits},
                  {"noNewPrivileges", true}};
  json linux_section = {{"namespaces",
                         {{{"type", "pid"}}, {{"type", "network"}}, {{"type", "ipc"}}, {{"type", "uts"}},
                          {{"type", "mount"}}}}};
  if (plan.seccomp.enabled) linux_section["seccomp"] = OciSeccomp(plan.seccomp, &spec.left_out);
  spec.config = {{"ociVersion", "1.0.0"},
                 {"process", process},
                 {"root", {{"path", bundle + "/root"}, {"readonly", true}}},
                 {"hostname", plan.hostname.empty() ? "agentbox" : plan.hostname},
                 {"mounts", mounts},
                 {"linux", linux_section}};
  return spec;
}

Status WriteBundle(const OciSpec& spec, const std::string& bundle) {
  const std::string root = bundle + "/root";
  if (mkdir(root.c_str(), 0755) != 0 && errno != EEXIST) return Status::Errno("gvisor", "mkdir", root);
  for (const auto& e : spec.root_entries) {
    // Parents first (a link at /usr/lib64 needs /usr on the root; the mount
    // covers it later).
    std::string at = root;
    const std::string rel = e.path.substr(1);
    std::size_t pos = 0;
    while ((pos = rel.find('/', pos)) != std::string::npos) {
      at = root + "/" + rel.substr(0, pos);
      if (mkdir(at.c_str(), 0755) != 0 && errno != EEXIST) return Status::Errno("gvisor", "mkdir", at);
      ++pos;
    }
    const std::string path = root + e.path;
    if (e.target.empty()) {
      if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return Status::Errno("gvisor", "mkdir", path);
    } else if (symlink(e.target.c_str(), path.c_str()) != 0 && errno != EEXIST) {
      return Status::Errno("gvisor", "symlink", path);
    }
  }
  auto write_file = [](const std::string& path, const std::string& text, mode_t mode) -> Status {
    UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode));
    if (!fd.valid()) return Status::Errno("gvisor", "open", path);
    std::size_t done = 0;
    while (done < text.size()) {
      ssize_t n = write(fd.get(), text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Status::Errno("gvisor", "write", path);
      done += static_cast<std::size_t>(n);
    }
    return {};
  };
  if (Status s = write_file(bundle + "/mask-file", "", 0); !s.ok()) return s;
  if (mkdir((bundle + "/mask-dir").c_str(), 0) != 0) return Status::Errno("gvisor", "mkdir", bundle + "/mask-dir");
  for (const auto& [name, text] : spec.files) {
    if (Status s = write_file(bundle + "/" + name, text, 0444); !s.ok()) return s;
  }
  return write_file(bundle + "/config.json", spec.config.dump(), 0600);
}

std::vector<std::string> RunscRunArgv(const GvisorPlan& g, const std::string& bundle, const std::string& state,
                                      const std::string& log, const std::string& id, bool oci_seccomp,
                                      const std::string& netns) {
  std::vector<std::string> argv = {g.runsc,
                                   "--root=" + state,
                                   "--log=" + log,
                                   "--log-format=json",
                                   netns.empty() ? "--network=none" : "--network=host",
                                   // The run's cgroup is agentbox's: runsc's processes start in it.
                                   "--ignore-cgroups",
                                   "--platform=" + g.platform};
  if (oci_seccomp) argv.push_back("--oci-seccomp");
  if (g.rootless) argv.push_back("--rootless");
  argv.insert(argv.end(), {"run", "--bundle", bundle, id});
  return argv;
}

void JoinNetworkNamespace(OciSpec* spec, const std::string& path) {
  for (auto& ns : spec->config["linux"]["namespaces"]) {
    if (ns["type"] == "network") ns["path"] = path;
  }
}

std::string RunscError(const std::string& log_text) {
  // runsc's processes (runsc, gofer, sandbox) append objects to one log,
  // not always a line each: split at the top-level braces.
  std::size_t depth = 0, start = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < log_text.size(); ++i) {
    const char c = log_text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      if (depth++ == 0) start = i;
    } else if (c == '}' && depth > 0 && --depth == 0) {
      try {
        json j = json::parse(log_text.substr(start, i + 1 - start));
        if (j.is_object() && j.value("level", "") == "error") return j.value("msg", std::string("(no message)"));
      } catch (const json::exception&) {
        // not one of runsc's objects
      }
    }
  }
  return "";
}

}  // namespace agentbox::linux
