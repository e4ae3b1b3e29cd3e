#include "linux/user_dirs.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include <cstdlib>
#include <fstream>
#include <vector>

namespace agentbox::linux {

std::string HomeDir() {
  if (const char* h = getenv("HOME"); h && *h == '/') return h;
  std::ifstream passwd("/etc/passwd");
  const std::string uid = std::to_string(getuid());
  for (std::string line; std::getline(passwd, line);) {
    std::vector<std::string> f;
    size_t start = 0;
    for (size_t colon; (colon = line.find(':', start)) != std::string::npos; start = colon + 1) {
      f.push_back(line.substr(start, colon - start));
    }
    f.push_back(line.substr(start));
    if (f.size() >= 6 && f[2] == uid) return f[5];
  }
  return "";
}

std::string CacheDir(const std::string& home) {
  if (const char* xdg = getenv("XDG_CACHE_HOME"); xdg && *xdg == '/') return std::string(xdg) + "/agentbox";
  return home.empty() ? "" : home + "/.cache/agentbox";
}

std::string StateDir() {
  if (const char* xdg = getenv("XDG_STATE_HOME"); xdg && *xdg == '/') return std::string(xdg) + "/agentbox";
  const std::string home = HomeDir();
  return home.empty() ? "" : home + "/.local/state/agentbox";
}

namespace {

constexpr std::size_t kMaxRegistered = 1024;

std::string Canonical(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) ? std::string(buf) : path;
}

}  // namespace

std::vector<std::string> OwnDirs(const std::string& home) {
  std::vector<std::string> out;
  auto add = [&out](const std::string& dir) {
    if (dir.empty() || dir[0] != '/') return;
    const std::string c = Canonical(dir);
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  };
  const std::string state = StateDir();
  add(state);
  add(CacheDir(home));
  if (!state.empty()) {
    std::ifstream registry(state + "/state-dirs");
    std::string line;
    for (std::size_t n = 0; n < kMaxRegistered && std::getline(registry, line); ++n) add(line);
  }
  return out;
}

void RegisterStateDir(const std::string& dir) {
  const std::string state = StateDir();
  if (state.empty() || dir.empty() || dir[0] != '/' || dir.find('\n') != std::string::npos) return;
  const std::string c = Canonical(dir);
  for (const auto& known : OwnDirs(HomeDir())) {
    if (known == c) return;
  }
  for (std::size_t slash = state.find('/', 1);; slash = state.find('/', slash + 1)) {
    mkdir(state.substr(0, slash).c_str(), 0700);
    if (slash == std::string::npos) break;
  }
  const std::string line = c + "\n";
  int fd = open((state + "/state-dirs").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  (void)!write(fd, line.data(), line.size());
  close(fd);
}

}  // namespace agentbox::linux
