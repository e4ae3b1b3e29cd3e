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

namespace {

// The first /etc/passwd entry (name:pw:uid:gid:gecos:home:shell) that `match` accepts.
template <typename Fn>
std::optional<PasswdEntry> FindPasswd(Fn&& match) {
  std::ifstream passwd("/etc/passwd");
  for (std::string line; std::getline(passwd, line);) {
    std::vector<std::string> f;
    size_t start = 0;
    for (size_t colon; (colon = line.find(':', start)) != std::string::npos; start = colon + 1) {
      f.push_back(line.substr(start, colon - start));
    }
    f.push_back(line.substr(start));
    if (f.size() < 6) continue;
    PasswdEntry e;
    e.name = f[0];
    try {
      e.uid = static_cast<uid_t>(std::stoul(f[2]));
      e.gid = static_cast<gid_t>(std::stoul(f[3]));
    } catch (...) {
      continue;
    }
    e.home = f[5];
    if (match(e)) return e;
  }
  return std::nullopt;
}

}  // namespace

std::optional<PasswdEntry> LookupUser(const std::string& name) {
  return FindPasswd([&](const PasswdEntry& e) { return e.name == name; });
}

std::string HomeDir() {
  if (const char* h = getenv("HOME"); h && *h == '/') return h;
  const uid_t uid = getuid();
  auto e = FindPasswd([&](const PasswdEntry& p) { return p.uid == uid; });
  return e ? e->home : "";
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

// The registry's entries (canonical when written), oldest first.
std::vector<std::string> ReadRegistry(const std::string& state) {
  std::vector<std::string> out;
  if (state.empty()) return out;
  std::ifstream registry(state + "/state-dirs");
  std::string line;
  for (std::size_t n = 0; n < kMaxRegistered && std::getline(registry, line); ++n) {
    if (!line.empty() && line[0] == '/') out.push_back(line);
  }
  return out;
}

}  // namespace

std::vector<std::string> OwnDirs(const std::string& home) {
  std::vector<std::string> out;
  auto add = [&out](const std::string& dir) {
    if (std::find(out.begin(), out.end(), dir) == out.end()) out.push_back(dir);
  };
  const std::string state = StateDir();
  if (!state.empty()) add(Canonical(state));
  if (const std::string cache = CacheDir(home); !cache.empty()) add(Canonical(cache));
  // Registered paths were canonical when written: no lookup per run.
  for (const auto& dir : ReadRegistry(state)) add(dir);
  return out;
}

void RegisterStateDir(const std::string& dir) {
  const std::string state = StateDir();
  if (state.empty() || dir.empty() || dir[0] != '/' || dir.find('\n') != std::string::npos) return;
  const std::string c = Canonical(dir);
  if (c == Canonical(state) || c == Canonical(CacheDir(HomeDir()))) return;
  // Rewritten whole, keeping the entries that still exist: state
  // directories come and go (tests, throw-away daemons), the list stays short.
  std::string text;
  std::size_t kept = 0;
  for (const auto& known : ReadRegistry(state)) {
    struct stat st {};
    if (known == c || stat(known.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    if (++kept >= kMaxRegistered) break;
    text += known + "\n";
  }
  text += c + "\n";
  for (std::size_t slash = state.find('/', 1);; slash = state.find('/', slash + 1)) {
    mkdir(state.substr(0, slash).c_str(), 0700);
    if (slash == std::string::npos) break;
  }
  // Written beside and renamed over: a reader sees the old list or the new.
  const std::string tmp = state + "/.state-dirs." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!written || rename(tmp.c_str(), (state + "/state-dirs").c_str()) != 0) unlink(tmp.c_str());
}

}  // namespace agentbox::linux
