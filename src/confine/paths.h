// Lexical path helpers shared by planning and launch. No syscalls.
#pragma once

#include <string>
#include <string_view>

namespace agentbox::paths {

// True when `path` is `root` or lies below it (both absolute and normalised).
inline bool IsWithin(std::string_view path, std::string_view root) {
  if (root == "/") return !path.empty() && path[0] == '/';
  if (path.size() < root.size() || path.compare(0, root.size(), root) != 0) return false;
  return path.size() == root.size() || path[root.size()] == '/';
}

// `path` re-rooted from `from` to `to`; `path` must be within `from`.
inline std::string Rebase(std::string_view path, std::string_view from, std::string_view to) {
  std::string rest(from == "/" ? path : path.substr(from.size()));
  if (rest.empty()) return std::string(to);
  if (to == "/") return rest[0] == '/' ? rest : "/" + rest;
  return std::string(to) + (rest[0] == '/' ? "" : "/") + rest;
}

inline std::string Join(std::string_view base, std::string_view rel) {
  if (rel.empty()) return std::string(base);
  if (base.empty() || base == "/") return "/" + std::string(rel[0] == '/' ? rel.substr(1) : rel);
  return std::string(base) + "/" + std::string(rel);
}

// Number of components: "/" is 0, "/a/b" is 2.
inline int Depth(std::string_view path) {
  int d = 0;
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '/' && i + 1 < path.size()) ++d;
  }
  return d;
}

inline std::string Parent(std::string_view path) {
  auto slash = path.rfind('/');
  if (slash == 0 || slash == std::string_view::npos) return "/";
  return std::string(path.substr(0, slash));
}

inline bool HasGlob(std::string_view p) { return p.find_first_of("*?[") != std::string_view::npos; }

// "~" and "~/x" against `home`; "" when there is no home to expand against.
inline std::string ExpandHome(const std::string& p, const std::string& home) {
  if (p == "~") return home;
  if (p.rfind("~/", 0) == 0) return home.empty() ? "" : Join(home, p.substr(2));
  return p;
}

}  // namespace agentbox::paths
