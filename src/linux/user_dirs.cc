#include "linux/user_dirs.h"

#include <unistd.h>

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

}  // namespace agentbox::linux
