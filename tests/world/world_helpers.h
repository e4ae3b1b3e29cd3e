// Helpers shared by the world tests (one binary, several files).
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace agentbox::session::world_test {

// The agentbox binary under test (AGENTBOX_BIN), or "".
inline std::string Bin() {
  const char* b = std::getenv("AGENTBOX_BIN");
  return b ? b : "";
}

inline std::string Read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The pids of this process's children (the worlds' supervisors).
inline std::vector<pid_t> Children() {
  std::vector<pid_t> out;
  const std::string self = "/proc/" + std::to_string(getpid()) + "/task";
  if (DIR* d = opendir(self.c_str())) {
    while (struct dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::istringstream in(Read(self + "/" + e->d_name + "/children"));
      pid_t p;
      while (in >> p) out.push_back(p);
    }
    closedir(d);
  }
  return out;
}

}  // namespace agentbox::session::world_test
