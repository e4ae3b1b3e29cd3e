// Gitignore-style glob matching for deny entries; env.pass patterns.
#include <fnmatch.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "agentbox/plan.h"

namespace agentbox {
namespace {

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= s.size()) {
    size_t slash = s.find('/', start);
    if (slash == std::string::npos) slash = s.size();
    if (slash > start) parts.push_back(s.substr(start, slash - start));
    start = slash + 1;
  }
  return parts;
}

bool MatchParts(const std::vector<std::string>& pat, size_t pi, const std::vector<std::string>& path,
                size_t si) {
  while (pi < pat.size()) {
    if (pat[pi] == "**") {
      // `**` matches zero or more whole components.
      for (size_t k = si; k <= path.size(); ++k) {
        if (MatchParts(pat, pi + 1, path, k)) return true;
      }
      return false;
    }
    if (si >= path.size()) return false;
    // Dot files are matched by `*` as gitignore does (no FNM_PERIOD).
    if (fnmatch(pat[pi].c_str(), path[si].c_str(), 0) != 0) return false;
    ++pi;
    ++si;
  }
  return si == path.size();
}

}  // namespace

bool GlobMatch(const std::string& pattern, const std::string& relative_path) {
  std::string pat = pattern;
  if (!pat.empty() && pat.back() == '/') pat.pop_back();
  bool anchored = pat.find('/') != std::string::npos;
  if (!pat.empty() && pat[0] == '/') pat.erase(0, 1);
  std::vector<std::string> pp = Split(pat);
  if (!anchored) pp.insert(pp.begin(), "**");
  return MatchParts(pp, 0, Split(relative_path), 0);
}

std::vector<std::string> PassedNames(const std::vector<std::string>& pass, char* const* envp) {
  std::vector<std::string> out;
  auto add = [&out](std::string name) {
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(std::move(name));
  };
  for (const auto& entry : pass) {
    if (entry.find('*') == std::string::npos) {
      add(entry);
      continue;
    }
    for (char* const* e = envp; e && *e; ++e) {
      const char* eq = std::strchr(*e, '=');
      if (!eq) continue;
      std::string name(*e, static_cast<std::size_t>(eq - *e));
      if (EnvPatternMatch(entry, name)) add(std::move(name));
    }
  }
  return out;
}

}  // namespace agentbox
