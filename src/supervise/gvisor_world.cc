// A session's world on gVisor: see gvisor_world.h.
//
// runsc dies with this process (PR_SET_PDEATHSIG), and its attached
// sandbox and gofer with it; the run's cgroup is killed whole at the end;
// the bundle directory carries this process's pid, so that `agentbox gc`
// removes it after a kill -9.
#include "supervise/gvisor_world.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "linux/cgroups.h"
#include "linux/compat.h"
#include "linux/gvisor.h"
#include "linux/resolve.h"
#include "linux/runner.h"
#include "supervise/guest_egress.h"
#include "supervise/gvisor_run.h"
#include "supervise/resources.h"
#include "supervise/run_dirs.h"
#include "supervise/run_io.h"

namespace agentbox::supervise {
namespace {

std::string SelfExe() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

}  // namespace

struct GvisorSandbox::State {
  std::string dir;
  pid_t runsc = -1;
  linux::UniqueFd pidfd;
  bool reaped = false;
  int wait_status = 0;
  linux::UniqueFd channel;
  std::unique_ptr<linux::SandboxCgroup> cgroup;
  std::unique_ptr<GuestEgress> egress;
  std::vector<std::string> skipped;
  std::uint64_t memory_limit = 0;
  // Held while the sandbox lives: the placeholders of missing protected
  // paths (runsc's gofer binds them) stay until the end.
  std::optional<linux::ResolvedPlan> resolved;

  void Reap(std::chrono::milliseconds grace) {
    if (runsc <= 0 || reaped) return;
    const auto until = RunClock::now() + grace;
    while (RunClock::now() < until) {
      if (waitpid(runsc, &wait_status, WNOHANG) == runsc) {
        reaped = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (!reaped) {
      kill(runsc, SIGKILL);
      while (waitpid(runsc, &wait_status, 0) < 0 && errno == EINTR) {
      }
      reaped = true;
    }
    // The sandbox and its gofer, should one outlive runsc.
    if (cgroup) cgroup->KillAll();
  }
  ~State() {
    channel.reset();
    Reap(std::chrono::milliseconds(0));
    egress.reset();
    if (!dir.empty() && !getenv("AGENTBOX_DEBUG_KEEP_BUNDLE")) RemoveTree(dir);
  }
  Status Failed(const std::string& when) {
    std::string why = linux::RunscError(FileTail(dir + "/runsc.log", 1u << 20));
    const std::string err = FileTail(dir + "/stderr.log", 1500);
    if (!err.empty()) why += (why.empty() ? "" : "; ") + std::string("the sandbox's init: ") + err;
    return Status::Error("gvisor", "runsc " + when + (why.empty() ? "" : ": " + why));
  }
};

Plan GvisorInsidePlan(const Plan& plan) {
  Plan g = plan;
  g.confined = false;
  g.gvisor->inside = true;
  g.microvm.reset();
  g.namespaces.clear();
  g.landlock.abi = 0;
  g.landlock.required = false;
  g.seccomp.enabled = false;
  // The host's cgroup holds the whole sandbox; the clock is the world's.
  g.limits.memory_max_bytes.reset();
  g.limits.memory_low_bytes.reset();
  g.limits.cpu_max_cores.reset();
  g.limits.cpu_weight_cores.reset();
  g.limits.pids_max.reset();
  g.scan_cache_dir.clear();
  g.cache_dirs.clear();
  g.workspace_quota.reset();
  // Egress: the inside's relay listens at the proxy ports; the proxy, and
  // any TLS it ends, is this host's.
  g.network.terminate = false;
  g.network.proxy.reset();
  return g;
}

Result<std::unique_ptr<GvisorSandbox>> GvisorSandbox::Start(const Plan& plan, const RunOptions& options,
                                                            linux::GuestRequest request,
                                                            std::shared_ptr<net::Terminator> terminator) {
  if (!plan.gvisor) return Status::Error("gvisor", "the plan names no runsc");
  const GvisorPlan& g = *plan.gvisor;
  auto resolved = linux::ResolvePlan(plan);
  if (!resolved.ok()) return resolved.status();
  auto state = std::make_unique<State>();
  state->skipped = resolved->skipped;
  state->resolved = std::move(*resolved);
  state->memory_limit = plan.limits.memory_max_bytes.value_or(0);

  std::string dir = g.state_parent + "/" + kGvisorBundlePrefix + std::to_string(getpid()) + "-XXXXXX";
  if (!mkdtemp(dir.data())) return Status::Errno("gvisor", "mkdtemp", dir);
  state->dir = dir;

  const std::string exe = SelfExe();
  if (exe.empty()) return Status::Errno("gvisor", "readlink", "/proc/self/exe");
  auto spec = linux::BuildOciSpec(plan, *state->resolved, {kGvisorInsideBinary, kGvisorInsideArg}, request.env, dir);
  if (!spec.ok()) return spec.status();
  // agentbox's own (static) binary, read-only: the world's relay and supervisor.
  spec->config["mounts"].push_back({{"destination", kGvisorInsideBinary},
                                    {"type", "bind"},
                                    {"source", exe},
                                    {"options", {"rbind", "ro", "nosuid", "nodev"}}});
  spec->root_entries.push_back({"/.agentbox", ""});
  if (Status s = linux::WriteBundle(*spec, dir); !s.ok()) return s;
  {
    // The mount point, on the read-only root.
    const std::string at = dir + "/root" + kGvisorInsideBinary;
    linux::UniqueFd point(open(at.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0555));
    if (!point.valid()) return Status::Errno("gvisor", "open", at);
  }

  auto made = MakeRunCgroup(plan);
  if (!made.ok()) return made.status();
  state->cgroup = std::move(*made);
  auto opened = RunCgroupTaskFiles(state->cgroup.get());
  if (!opened.ok()) return opened.status();
  std::vector<linux::UniqueFd> task_files = std::move(*opened);

  if (plan.network.proxy) {
    auto started = GuestEgress::Start(plan, options, std::move(terminator));
    if (!started.ok()) return started.status();
    state->egress = std::move(*started);
    request.proxy_http_port = plan.network.proxy->http_port;
    request.proxy_socks_port = plan.network.proxy->socks_port;
  }

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return Status::Errno("gvisor", "socketpair", "the sandbox's stream");
  }
  state->channel.reset(sv[0]);
  linux::UniqueFd theirs(sv[1]);
  linux::UniqueFd err(open((dir + "/stderr.log").c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!err.valid()) return Status::Errno("gvisor", "open", dir + "/stderr.log");

  const std::vector<std::string> runsc = linux::RunscRunArgv(g, dir, dir + "/state", dir + "/runsc.log",
                                                             "agentbox-" + plan.nonce, plan.seccomp.enabled);
  std::vector<char*> cargv;
  for (const auto& a : runsc) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return Status::Errno("gvisor", "fork", "runsc");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    for (auto& f : task_files) {
      if (write(f.get(), "0", 1) != 1) _exit(126);
    }
    dup2(theirs.get(), 0);
    dup2(theirs.get(), 1);
    dup2(err.get(), 2);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    close_range(3, ~0U, 0);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  state->runsc = pid;
  state->pidfd.reset(linux::PidfdOpen(pid));
  if (!state->pidfd.valid()) return Status::Errno("gvisor", "pidfd_open", "runsc");
  theirs.reset();

  request.world = true;
  request.pids_max = 0;  // the host's cgroup counts the sandbox's tasks
  request.plan_json = PlanToJson(GvisorInsidePlan(plan));
  if (Status s = linux::WriteFrame(state->channel.get(), linux::FrameType::kRequest,
                                   linux::GuestRequestToJson(request));
      !s.ok()) {
    return state->Failed("took no request");
  }
  return std::unique_ptr<GvisorSandbox>(new GvisorSandbox(std::move(state)));
}

GvisorSandbox::GvisorSandbox(std::unique_ptr<State> state) : s_(std::move(state)) {}
GvisorSandbox::~GvisorSandbox() = default;
int GvisorSandbox::channel() const { return s_->channel.get(); }
int GvisorSandbox::ended_fd() const { return s_->pidfd.get(); }
const std::vector<std::string>& GvisorSandbox::skipped() const { return s_->skipped; }
Egress* GvisorSandbox::egress() { return s_->egress ? &s_->egress->proxy() : nullptr; }
linux::UniqueFd GvisorSandbox::DialEgress(char tag) { return s_->egress ? s_->egress->Dial(tag) : linux::UniqueFd(); }
void GvisorSandbox::Reap(std::chrono::milliseconds grace) { s_->Reap(grace); }

std::string GvisorSandbox::EndedHow(bool* oom) {
  s_->Reap(std::chrono::milliseconds(1000));
  const linux::CgroupStats stats = s_->cgroup ? s_->cgroup->ReadStats() : linux::CgroupStats{};
  *oom = stats.oom_kills > 0;
  if (*oom) {
    return "the session's gVisor sandbox ran out of memory at its cgroup's limit of " +
           std::to_string(s_->memory_limit) + " bytes and was ended by the kernel's OOM killer";
  }
  return "the session's gVisor sandbox ended: " + s_->Failed("ended").message();
}

Status GvisorSandbox::SetMemory(std::uint64_t bytes) {
  if (!s_->cgroup) {
    return Status::Error("cgroup", "this session's sandbox runs without a cgroup: its memory limit cannot be set");
  }
  Status s = s_->cgroup->SetMemoryMax(bytes);
  if (s.ok()) s_->memory_limit = bytes;
  return s;
}

std::string GvisorSandbox::GraftRefusal() const {
  return "a gVisor sandbox's mounts are set when it starts: a path cannot be grafted into a running one (start a "
         "new session with the path in the policy)";
}

}  // namespace agentbox::supervise
