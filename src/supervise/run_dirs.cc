#include "supervise/run_dirs.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace agentbox::supervise {
namespace {

int RemoveEntry(const char* path, const struct stat*, int type, struct FTW*) {
  // FTW_DNR: a directory this user cannot read (a mode-0 mask directory, empty).
  if (type == FTW_DP || type == FTW_DNR) {
    rmdir(path);
  } else {
    unlink(path);
  }
  return 0;
}

}  // namespace

bool RemoveTree(const std::string& dir) {
  if (dir.empty()) return true;
  nftw(dir.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
  struct stat st {};
  return lstat(dir.c_str(), &st) != 0 && errno == ENOENT;
}

std::vector<std::string> CollectDeadRunDirs(const std::string& parent, const std::string& prefix) {
  std::vector<std::string> removed;
  DIR* d = opendir(parent.c_str());
  if (!d) return removed;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    const pid_t owner = static_cast<pid_t>(std::atol(name.c_str() + prefix.size()));
    if (owner <= 0 || kill(owner, 0) == 0 || errno != ESRCH) continue;  // its supervisor lives
    const std::string path = parent + "/" + name;
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid()) continue;
    if (RemoveTree(path)) removed.push_back(path);
  }
  closedir(d);
  return removed;
}

std::string FileTail(const std::string& path, std::size_t max) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string out;
  char buf[8192];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) {
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > 2 * max + sizeof(buf)) out.erase(0, out.size() - max);
  }
  close(fd);
  if (out.size() > max) out = out.substr(out.size() - max);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

}  // namespace agentbox::supervise
