#include "linux/descendants.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <functional>
#include <string>
#include <unordered_map>

#include "linux/fd.h"

namespace agentbox::linux {
namespace {

struct ProcInfo {
  pid_t ppid = 0;
  char state = '?';
};

// pid -> (ppid, state) for every process in /proc. The comm field may hold
// spaces and parentheses: parse after the last ')'.
std::unordered_map<pid_t, ProcInfo> ReadProcTable() {
  std::unordered_map<pid_t, ProcInfo> table;
  DIR* dir = opendir("/proc");
  if (!dir) return table;
  while (struct dirent* e = readdir(dir)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    char path[64], buf[512];
    std::snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    UniqueFd fd(open(path, O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) continue;
    ssize_t n = read(fd.get(), buf, sizeof(buf) - 1);
    if (n <= 0) continue;
    buf[n] = '\0';
    const char* close_paren = std::strrchr(buf, ')');
    if (!close_paren) continue;
    ProcInfo info;
    long ppid = 0;
    if (std::sscanf(close_paren + 1, " %c %ld", &info.state, &ppid) != 2) continue;
    info.ppid = static_cast<pid_t>(ppid);
    table[static_cast<pid_t>(pid)] = info;
  }
  closedir(dir);
  return table;
}

// comm and parent of one process, from /proc/PID/stat.
bool ReadStat(pid_t pid, std::string* comm, pid_t* ppid) {
  char path[64], buf[512];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  UniqueFd fd(open(path, O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return false;
  ssize_t n = read(fd.get(), buf, sizeof(buf) - 1);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* open_paren = std::strchr(buf, '(');
  const char* close_paren = std::strrchr(buf, ')');
  if (!open_paren || !close_paren || close_paren < open_paren) return false;
  comm->assign(open_paren + 1, close_paren);
  char state = '?';
  long parent = 0;
  if (std::sscanf(close_paren + 1, " %c %ld", &state, &parent) != 2) return false;
  *ppid = static_cast<pid_t>(parent);
  return true;
}

// The runners at or above `pid`, nearest first.
std::vector<pid_t> RunnersAbove(pid_t pid) {
  std::vector<pid_t> out;
  std::string comm;
  pid_t parent = 0;
  for (int depth = 0; depth < 4096 && pid > 0; ++depth) {
    if (!ReadStat(pid, &comm, &parent)) break;
    if (comm == kRunnerName) out.push_back(pid);
    if (pid == 1) break;
    pid = parent;
  }
  return out;
}

}  // namespace

pid_t EnclosingRunner(pid_t pid) {
  const auto ours = RunnersAbove(getpid());
  for (pid_t r : RunnersAbove(pid)) {
    if (std::find(ours.begin(), ours.end(), r) == ours.end()) return r;
  }
  return 0;
}

std::vector<pid_t> Descendants(pid_t root) {
  auto table = ReadProcTable();
  std::vector<pid_t> out;
  for (const auto& [pid, info] : table) {
    if (pid == root || info.state == 'Z' || info.state == 'X') continue;
    pid_t p = info.ppid;
    for (int depth = 0; depth < 4096 && p > 1; ++depth) {
      if (p == root) {
        out.push_back(pid);
        break;
      }
      auto it = table.find(p);
      if (it == table.end()) break;
      p = it->second.ppid;
    }
  }
  return out;
}

namespace {

// Calls `found(pid, fd, inode)` for each descriptor of a process in `pids`
// that is one of the sockets `socket_inodes`, until it returns true.
bool ForEachHeldSocket(const std::vector<pid_t>& pids, const std::vector<std::uint64_t>& socket_inodes,
                       const std::function<bool(pid_t, int, std::uint64_t)>& found) {
  for (pid_t p : pids) {
    const std::string dir = "/proc/" + std::to_string(p) + "/fd";
    int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) continue;
    DIR* d = fdopendir(dfd);
    if (!d) {
      close(dfd);
      continue;
    }
    bool stop = false;
    while (struct dirent* e = readdir(d)) {
      char link[64];
      ssize_t n = readlinkat(dfd, e->d_name, link, sizeof(link) - 1);
      if (n <= 0) continue;
      link[n] = 0;
      unsigned long long ino = 0;
      if (std::sscanf(link, "socket:[%llu]", &ino) != 1) continue;
      if (std::find(socket_inodes.begin(), socket_inodes.end(), ino) == socket_inodes.end()) continue;
      if ((stop = found(p, std::atoi(e->d_name), ino))) break;
    }
    closedir(d);
    if (stop) return true;
  }
  return false;
}

}  // namespace

bool HeldByDescendant(pid_t root, const std::vector<std::uint64_t>& socket_inodes) {
  return ForEachHeldSocket(Descendants(root), socket_inodes, [](pid_t, int, std::uint64_t) { return true; });
}

size_t ShutDownHeldSockets(pid_t root, const std::vector<std::uint64_t>& socket_inodes) {
  std::vector<pid_t> pids = Descendants(root);
  pids.insert(pids.begin(), root);
  std::vector<std::uint64_t> left = socket_inodes;
  size_t done = 0;
  ForEachHeldSocket(pids, socket_inodes, [&](pid_t pid, int fd, std::uint64_t ino) {
    if (std::find(left.begin(), left.end(), ino) == left.end()) return false;  // already shut down
    UniqueFd pidfd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
    if (!pidfd.valid()) return false;
    UniqueFd copy(static_cast<int>(syscall(SYS_pidfd_getfd, pidfd.get(), fd, 0)));
    struct stat st {};
    if (!copy.valid() || fstat(copy.get(), &st) != 0 || st.st_ino != ino) return false;  // gone or reused meanwhile
    if (shutdown(copy.get(), SHUT_RDWR) == 0) ++done;
    std::erase(left, ino);
    return left.empty();
  });
  return done;
}

size_t KillDescendants(pid_t root) {
  const bool ours = root == getpid();
  std::vector<pid_t> left;
  for (int round = 0; round < 50; ++round) {
    left = Descendants(root);
    if (left.empty()) break;
    for (pid_t pid : left) kill(pid, SIGKILL);
    if (ours) {
      while (waitpid(-1, nullptr, WNOHANG) > 0) {
      }
    }
    struct timespec pause = {0, 1000000};  // 1 ms: let the kills land
    nanosleep(&pause, nullptr);
  }
  if (ours) {
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
  }
  return left.size();
}

}  // namespace agentbox::linux
