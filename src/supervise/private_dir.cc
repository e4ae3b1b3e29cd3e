#include "supervise/private_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

namespace agentbox::supervise {
namespace {

// Removes everything below the directory `dirfd`, never following symlinks
// (what the sandbox left there is untrusted), granting ourselves search and
// write permission on directories the command locked.
void RemoveContents(int dirfd) {
  int copy = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return;
  DIR* dir = fdopendir(copy);
  if (!dir) {
    close(copy);
    return;
  }
  std::vector<std::string> names;
  while (struct dirent* e = readdir(dir)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(dir);
  for (const auto& n : names) {
    if (unlinkat(dirfd, n.c_str(), 0) == 0) continue;
    int sub = openat(dirfd, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0) {
      fchmodat(dirfd, n.c_str(), 0700, 0);
      sub = openat(dirfd, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (sub >= 0) {
      fchmod(sub, 0700);
      RemoveContents(sub);
      close(sub);
    }
    unlinkat(dirfd, n.c_str(), AT_REMOVEDIR);
  }
}

}  // namespace

Result<std::unique_ptr<PrivateDir>> PrivateDir::Create(const std::string& parent) {
  std::string tmpl = parent + "/agentbox-run-XXXXXX";
  if (!mkdtemp(tmpl.data())) return Status::Errno("private-dir", "mkdtemp", tmpl);
  std::unique_ptr<PrivateDir> dir(new PrivateDir(tmpl));
  for (const char* sub : {"/home", "/tmp"}) {
    std::string p = tmpl + sub;
    if (mkdir(p.c_str(), 0700) != 0) return Status::Errno("private-dir", "mkdir", p);
  }
  return dir;
}

PrivateDir::~PrivateDir() {
  int fd = open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) {
    fchmod(fd, 0700);
    RemoveContents(fd);
    close(fd);
  }
  rmdir(path_.c_str());
}

}  // namespace agentbox::supervise
