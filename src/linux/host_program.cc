#include "linux/host_program.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <sstream>
#include <utility>

#include "linux/compat.h"

extern char** environ;

namespace agentbox::linux {
namespace {

constexpr const char* kHostProgramStage = "host program";

// A pipe end that landed on 0, 1 or 2 (this process had one of them closed)
// would be overwritten by the spawn's own dup2 onto those numbers: moved
// above them first.
bool AboveStdio(UniqueFd* fd) {
  if (fd->get() > 2) return true;
  UniqueFd high(::fcntl(fd->get(), F_DUPFD_CLOEXEC, 3));
  if (!high.valid()) return false;
  *fd = std::move(high);
  return true;
}

// The request goes into the stdin pipe before the program exists: the
// write cannot block on a program that does not read, nor raise SIGPIPE
// in a program that exited early. Fails when it does not fit.
Status FillPipe(int fd, std::string_view input, const std::string& name) {
  if (input.empty()) return Status();
  // A user over fs.pipe-user-pages-soft gets one-page pipes; ask for more
  // (best effort: the write below tells whether it fits).
  if (input.size() > 4096) (void)::fcntl(fd, F_SETPIPE_SZ, static_cast<int>(HostProgram::kMaxInput));
  if (::fcntl(fd, F_SETFL, O_NONBLOCK) != 0)
    return Status::Errno(kHostProgramStage, "fcntl(O_NONBLOCK)", "the stdin of " + name);
  std::size_t done = 0;
  while (done < input.size()) {
    ssize_t n = ::write(fd, input.data() + done, input.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      return Status::Error(kHostProgramStage, "the request for " + name + " (" + std::to_string(input.size()) +
                                                  " bytes) does not fit in its stdin pipe");
    }
    if (n < 0) return Status::Errno(kHostProgramStage, "write", "the stdin of " + name);
    done += static_cast<std::size_t>(n);
  }
  return Status();
}

// Reads what `fd` (non-blocking) has now into `buf` after `*used`, up to
// `buf.size()`. Returns false at EOF (or a read error, which ends the
// stream the same way).
bool ReadAvailable(int fd, std::string& buf, std::size_t* used) {
  while (*used < buf.size()) {
    ssize_t n = ::read(fd, buf.data() + *used, buf.size() - *used);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    if (n <= 0) return false;
    *used += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

Result<HostProgram> HostProgram::Start(const std::vector<std::string>& argv, std::string_view input,
                                       ProcessGroup group) {
  if (argv.empty() || argv[0].empty()) return Status::Error(kHostProgramStage, "no program given");
  const std::string& name = argv[0];
  if (input.size() > kMaxInput) {
    return Status::Error(kHostProgramStage, "the request for " + name + " is " + std::to_string(input.size()) +
                                                " bytes, more than " + std::to_string(kMaxInput));
  }
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return Status::Errno(kHostProgramStage, "pipe2", "the stdin of " + name);
  UniqueFd in_read(in[0]), in_write(in[1]);
  if (::pipe2(out, O_CLOEXEC) != 0) return Status::Errno(kHostProgramStage, "pipe2", "the stdout of " + name);
  UniqueFd out_read(out[0]), out_write(out[1]);
  if (!AboveStdio(&in_read) || !AboveStdio(&out_write)) {
    return Status::Errno(kHostProgramStage, "fcntl(F_DUPFD_CLOEXEC)", "the pipes of " + name);
  }
  if (Status s = FillPipe(in_write.get(), input, name); !s.ok()) return s;
  in_write.reset();

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_read.get(), 0);
  posix_spawn_file_actions_adddup2(&actions, out_write.get(), 1);
  // stdin, stdout and stderr only: whatever this process holds (a
  // descriptor it inherited without close-on-exec included) stays here.
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  short flags = SpawnWithCleanSignals(&attr);
  if (group == ProcessGroup::kOwn) {
    posix_spawnattr_setpgroup(&attr, 0);
    flags |= POSIX_SPAWN_SETPGROUP;
  }
  posix_spawnattr_setflags(&attr, flags);
  std::vector<std::string> copy = argv;
  std::vector<char*> args;
  for (auto& a : copy) args.push_back(a.data());
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return Status::Syscall(kHostProgramStage, "posix_spawnp", name, rc);
  return HostProgram(pid, group, std::move(out_read));
}

short SpawnWithCleanSignals(posix_spawnattr_t* attr) {
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(attr, &none);
  posix_spawnattr_setsigdefault(attr, &all);
  return POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
}

HostProgram::HostProgram(HostProgram&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)),
      group_(other.group_),
      stdout_(std::move(other.stdout_)),
      reaped_(other.reaped_),
      wait_status_(other.wait_status_) {}

HostProgram& HostProgram::operator=(HostProgram&& other) noexcept {
  if (this != &other) {
    End();
    pid_ = std::exchange(other.pid_, -1);
    group_ = other.group_;
    stdout_ = std::move(other.stdout_);
    reaped_ = other.reaped_;
    wait_status_ = other.wait_status_;
  }
  return *this;
}

HostProgram::~HostProgram() { End(); }

int HostProgram::End() {
  if (pid_ < 0 || reaped_) return wait_status_;
  if (group_ == ProcessGroup::kOwn) ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);  // with kOwn too: it may have left its group
  while (::waitpid(pid_, &wait_status_, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  return wait_status_;
}

Result<ProgramRun> RunHostProgram(const std::vector<std::string>& argv, std::string_view input,
                                  std::chrono::milliseconds timeout, std::size_t max_output) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  auto program = HostProgram::Start(argv, input, ProcessGroup::kOwn);
  if (!program.ok()) return program.status();
  // Its exit, seen without reaping it (End still needs the pid): the
  // program is our unreaped child, so the pid is still its own here.
  UniqueFd exited(PidfdOpen(program->pid()));
  if (!exited.valid()) return Status::Errno(kHostProgramStage, "pidfd_open", argv[0]);
  const int out = program->stdout_fd();
  if (::fcntl(out, F_SETFL, O_NONBLOCK) != 0)
    return Status::Errno(kHostProgramStage, "fcntl(O_NONBLOCK)", "the stdout of " + argv[0]);

  ProgramRun run;
  run.output.resize(max_output + 1);
  std::size_t used = 0;
  bool out_open = true;
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      run.end = ProgramRun::End::kTimedOut;
      break;
    }
    pollfd p[2] = {{exited.get(), POLLIN, 0}, {out_open ? out : -1, POLLIN, 0}};
    const int ready = ::poll(p, 2, left > INT_MAX ? INT_MAX : static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return Status::Errno(kHostProgramStage, "poll", "the stdout of " + argv[0]);
    if (p[1].revents != 0) out_open = ReadAvailable(out, run.output, &used);
    // Once it has exited, what it wrote before is in the pipe: read that,
    // and no more (a process it left behind may hold the pipe open).
    if (p[0].revents != 0 && out_open) out_open = ReadAvailable(out, run.output, &used);
    if (used > max_output) {
      run.end = ProgramRun::End::kOutputTooLong;
      break;
    }
    if (p[0].revents != 0) {
      run.end = ProgramRun::End::kExited;
      break;
    }
  }
  run.output.resize(used);
  run.wait_status = program->End();
  return run;
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return "exited with status " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* abbrev = ::sigabbrev_np(sig);
    return "was killed by signal " + (abbrev ? "SIG" + std::string(abbrev) + " " : std::string()) + "(" +
           std::to_string(sig) + ")";
  }
  return "ended with wait status " + std::to_string(wait_status);
}

std::string FindOnPath(const std::string& root, const std::string& path_var, const std::string& name) {
  std::istringstream in(path_var);
  for (std::string dir; std::getline(in, dir, ':');) {
    if (dir.empty() || dir[0] != '/') continue;  // a relative PATH entry names nothing fixed
    const std::string candidate = dir + "/" + name;
    const std::string real = root == "/" ? candidate : root + candidate;
    struct stat st {};
    if (stat(real.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(real.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

}  // namespace agentbox::linux
