#include "linux/git_repos.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "agentbox/plan.h"
#include "confine/paths.h"
#include "linux/compat.h"
#include "linux/deny_scan.h"
#include "linux/fd.h"

namespace agentbox::linux {
namespace {

constexpr const char* kQuarantineSuffix = ".agentbox-quarantine";
constexpr std::size_t kMaxConfigBytes = 1 << 20;
constexpr int kMaxModuleDepth = 8;

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool IsDirAt(int dirfd, const char* name) {
  struct stat st {};
  return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
}

bool IsRegAt(int dirfd, const char* name) {
  struct stat st {};
  return fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

// The names of the subdirectories of `dirfd` (no symlink among them).
std::vector<std::string> SubDirs(int dirfd) {
  std::vector<std::string> out;
  int dup = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return out;
  DIR* d = fdopendir(dup);
  if (!d) {
    close(dup);
    return out;
  }
  while (struct dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    if (IsDirAt(dirfd, e->d_name)) out.emplace_back(e->d_name);
  }
  closedir(d);
  return out;
}

// Submodules keep their git directories in <git dir>/modules/<name>, where
// the name may hold slashes; theirs nest in turn.
void AddModules(int gitfd, const std::string& path, int depth, std::vector<GitDir>* out) {
  if (depth > kMaxModuleDepth) return;
  UniqueFd modules(openat(gitfd, "modules", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!modules.valid()) return;
  std::vector<std::pair<UniqueFd, std::string>> pending;
  pending.emplace_back(std::move(modules), path + "/modules");
  for (int level = 0; !pending.empty() && level <= kMaxModuleDepth; ++level) {
    std::vector<std::pair<UniqueFd, std::string>> next;
    for (auto& [fd, dir] : pending) {
      for (const auto& name : SubDirs(fd.get())) {
        UniqueFd sub(openat(fd.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!sub.valid()) continue;
        const std::string sub_path = dir + "/" + name;
        if (IsRegAt(sub.get(), "HEAD")) {
          out->push_back({sub_path, false});
          AddModules(sub.get(), sub_path, depth + 1, out);
        } else {
          next.emplace_back(std::move(sub), sub_path);
        }
      }
    }
    pending = std::move(next);
  }
}

// The git directory a `.git` file names (`gitdir: PATH`, relative to the
// file's directory), resolved; "" unless it is a directory in `workspace`.
// Git follows the file wherever it points, so what it names is a
// repository of the workspace too.
std::string GitdirTarget(const std::string& gitfile, const std::string& workspace) {
  UniqueFd f(open(gitfile.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!f.valid()) return "";
  char buf[4096];
  ssize_t n = pread(f.get(), buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "";
  std::string text(buf, static_cast<size_t>(n));
  if (text.rfind("gitdir:", 0) != 0) return "";
  std::string path = text.substr(7, text.find('\n') == std::string::npos ? std::string::npos : text.find('\n') - 7);
  while (!path.empty() && (path.front() == ' ' || path.front() == '\t')) path.erase(0, 1);
  while (!path.empty() && (path.back() == '\r' || path.back() == ' ' || path.back() == '\t')) path.pop_back();
  if (path.empty()) return "";
  if (path[0] != '/') path = paths::Parent(gitfile) + "/" + path;
  char* real = realpath(path.c_str(), nullptr);
  if (!real) return "";
  std::string resolved(real);
  free(real);
  struct stat st {};
  if (!paths::IsWithin(resolved, workspace) || lstat(resolved.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return "";
  return resolved;
}

// Renames `name` in `dirfd` to NAME.agentbox-quarantine (or .2, .3, ...,
// never replacing anything); returns the new name, "" when it failed.
std::string Quarantine(int dirfd, const std::string& name) {
  for (int i = 1; i <= 20; ++i) {
    std::string to = name + kQuarantineSuffix + (i == 1 ? "" : "." + std::to_string(i));
    if (renameat2(dirfd, name.c_str(), dirfd, to.c_str(), RENAME_NOREPLACE) == 0) return to;
    if (errno == EACCES) {
      // The command may have taken its own write permission away: it is the
      // user's directory, give it back.
      struct stat st {};
      if (fstat(dirfd, &st) == 0 && fchmod(dirfd, (st.st_mode & 07777) | S_IRWXU) == 0 &&
          renameat2(dirfd, name.c_str(), dirfd, to.c_str(), RENAME_NOREPLACE) == 0) {
        return to;
      }
    }
    if (errno != EEXIST) return "";
  }
  return "";
}

std::string Moved(const std::string& dir, const std::string& name, const std::string& to, int err) {
  if (!to.empty()) return "; quarantined as " + dir + "/" + to;
  return "; could not be quarantined: rename " + dir + "/" + name + ": " + std::strerror(err);
}

void AuditHooks(int gitfd, const std::string& git_path, std::vector<GitFinding>* out) {
  const std::string hooks_path = git_path + "/hooks";
  UniqueFd hooks(openat(gitfd, "hooks", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!hooks.valid()) {
    struct stat st {};
    if (fstatat(gitfd, "hooks", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
      std::string to = Quarantine(gitfd, "hooks");
      const int err = errno;
      out->push_back({"git-hook", hooks_path, to.empty() ? "" : git_path + "/" + to,
                      "hooks directory is a symlink, written during the run" + Moved(git_path, "hooks", to, err)});
    }
    return;
  }
  std::vector<std::string> names;
  {
    int dup = fcntl(hooks.get(), F_DUPFD_CLOEXEC, 0);
    DIR* d = dup >= 0 ? fdopendir(dup) : nullptr;
    if (!d) {
      if (dup >= 0) close(dup);
      return;
    }
    while (struct dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      names.push_back(name);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  for (const auto& name : names) {
    // Git runs hooks by their exact names: samples and our own quarantine
    // never run.
    if (EndsWith(name, ".sample") || name.find(kQuarantineSuffix) != std::string::npos) continue;
    struct stat st {};
    if (fstatat(hooks.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const bool link = S_ISLNK(st.st_mode);
    if (!link && !(S_ISREG(st.st_mode) && (st.st_mode & 0111))) continue;
    std::string what = link ? "symlink in hooks/" : "executable hook";
    bool chmodded = false;
    if (!link && st.st_nlink > 1) {
      // Another name of the same file (a script of the workspace linked in
      // as a hook) keeps its mode: renaming this name is what disarms it.
      what += " (hard-linked elsewhere: renamed only)";
    } else if (!link) {
      UniqueFd f(openat(hooks.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
      struct stat now {};
      // The file opened is the one looked at (same inode, still one name).
      chmodded = f.valid() && fstat(f.get(), &now) == 0 && now.st_ino == st.st_ino && now.st_dev == st.st_dev &&
                 now.st_nlink == 1 && fchmod(f.get(), now.st_mode & 07666) == 0;
      if (!chmodded) what += " (could not be made non-executable)";
    }
    std::string to = Quarantine(hooks.get(), name);
    const int err = errno;
    out->push_back({"git-hook", hooks_path + "/" + name, to.empty() ? "" : hooks_path + "/" + to,
                    what + " written during the run in a repository that was not protected at its start" +
                        (chmodded ? ", made non-executable" : "") + Moved(hooks_path, name, to, err)});
  }
}

void AuditConfig(int gitfd, const std::string& git_path, std::vector<GitFinding>* out) {
  const std::string config_path = git_path + "/config";
  UniqueFd f(openat(gitfd, "config", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  std::string why;
  if (!f.valid()) {
    struct stat st {};
    if (fstatat(gitfd, "config", &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISLNK(st.st_mode)) return;
    why = "config is a symlink";
  } else {
    struct stat st {};
    if (fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode)) return;
    if (static_cast<std::size_t>(st.st_size) > kMaxConfigBytes) {
      why = "config larger than " + std::to_string(kMaxConfigBytes) + " bytes (not read)";
    } else {
      std::string text(static_cast<std::size_t>(st.st_size), '\0');
      ssize_t n = pread(f.get(), text.data(), text.size(), 0);
      text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
      auto keys = DangerousGitConfigKeys(text);
      if (keys.empty()) return;
      why = "config setting";
      if (keys.size() > 1) why += "s";
      for (size_t i = 0; i < keys.size(); ++i) why += (i ? ", " : " ") + keys[i];
    }
  }
  f.reset();
  // Renamed, not rewritten: what the command wrote stays for the user to
  // read, and nothing the supervisor writes could be misparsed by git.
  std::string to = Quarantine(gitfd, "config");
  const int err = errno;
  out->push_back({"git-config", config_path, to.empty() ? "" : git_path + "/" + to,
                  why + " written during the run in a repository that was not protected at its start" +
                      Moved(git_path, "config", to, err)});
}

bool DangerousKey(const std::string& section, bool has_sub, const std::string& key) {
  // These name a program (or a file of settings) wherever they appear.
  for (const char* k : {"hookspath", "fsmonitor", "sshcommand", "uploadpack", "receivepack", "textconv",
                        "gitproxy", "askpass", "packobjectshook"}) {
    if (key == k) return true;
  }
  if (section == "core") return key == "pager" || key == "editor";
  if (section == "filter" || section == "includeif" || section == "pager" || section == "alias") return true;
  if (section == "include") return key == "path";
  if (section == "diff") return has_sub ? key == "command" : key == "external";
  if (section == "merge") return has_sub && key == "driver";
  if (section == "credential") return key == "helper";
  if (section == "gpg") return key == "program";
  if (section == "sequence") return key == "editor";
  if (section == "protocol") return key == "allow";
  return false;
}

}  // namespace

std::vector<std::string> DangerousGitConfigKeys(const std::string& text) {
  std::vector<std::string> out;
  std::string section, sub;
  bool has_sub = false;
  size_t i = 0;
  const size_t n = text.size();
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) i = 3;  // git skips a UTF-8 BOM
  auto skip_blank = [&] {
    while (i < n && (text[i] == ' ' || text[i] == '\t' || text[i] == '\r' || text[i] == '\f' || text[i] == '\v')) ++i;
  };
  auto skip_line = [&] {
    while (i < n && text[i] != '\n') ++i;
  };
  while (i < n) {
    skip_blank();
    if (i >= n) break;
    const char c = text[i];
    if (c == '\n') {
      ++i;
      continue;
    }
    if (c == '#' || c == ';') {
      skip_line();
      continue;
    }
    if (c == '[') {
      ++i;
      section.clear();
      sub.clear();
      has_sub = false;
      while (i < n && text[i] != ']' && text[i] != '"' && text[i] != '\n' && text[i] != ' ' && text[i] != '\t') {
        section += text[i++];
      }
      skip_blank();
      if (i < n && text[i] == '"') {
        ++i;
        has_sub = true;
        while (i < n && text[i] != '"' && text[i] != '\n') {
          if (text[i] == '\\' && i + 1 < n) ++i;
          sub += text[i++];
        }
        if (i < n && text[i] == '"') ++i;
      }
      while (i < n && text[i] != ']' && text[i] != '\n') ++i;
      if (i < n && text[i] == ']') ++i;
      // The old spelling [section.subsection].
      const auto dot = section.find('.');
      if (!has_sub && dot != std::string::npos) {
        sub = section.substr(dot + 1);
        section.resize(dot);
        has_sub = true;
      }
      section = Lower(section);
      continue;  // a key may follow on the same line
    }
    std::string key;
    while (i < n && (std::isalnum(static_cast<unsigned char>(text[i])) || text[i] == '-')) key += text[i++];
    if (key.empty()) {
      skip_line();  // git refuses such a file altogether
      continue;
    }
    key = Lower(key);
    skip_blank();
    if (i < n && text[i] == '=') {
      ++i;
      bool quoted = false;
      while (i < n) {
        const char v = text[i];
        if (v == '\\') {  // an escape, or a continuation line
          i += 2;
          continue;
        }
        if (v == '"') {
          quoted = !quoted;
        } else if (!quoted && (v == '#' || v == ';')) {
          skip_line();
          break;
        } else if (v == '\n') {
          break;
        }
        ++i;
      }
    }
    if (DangerousKey(section, has_sub, key)) {
      std::string name = section + (has_sub ? "." + sub : "") + "." + key;
      if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(std::move(name));
    }
  }
  return out;
}

Result<std::vector<GitDir>> FindGitDirs(const std::string& workspace, const std::string& cache_dir, DirStampMemo* memo,
                                        ScanCaches* kept) {
  GlobScan scan{workspace, workspace, "", {"**/.git", "**/HEAD"}};
  std::vector<DenyMatch> matches;
  ScanStats stats;
  if (Status s = ScanDenyGlobs(scan, workspace, workspace, cache_dir, &matches, &stats, memo, kept); !s.ok()) {
    return s;
  }
  std::sort(matches.begin(), matches.end(),
            [](const DenyMatch& a, const DenyMatch& b) { return a.host_path < b.host_path; });
  std::vector<GitDir> out;
  for (const auto& m : matches) {
    const std::string base = m.host_path.substr(m.host_path.rfind('/') + 1);
    if (base == "HEAD") {
      // A bare repository: HEAD beside objects/ and refs/.
      if (m.is_dir) continue;
      const std::string dir = paths::Parent(m.host_path);
      UniqueFd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!fd.valid() || !IsDirAt(fd.get(), "objects") || !IsDirAt(fd.get(), "refs")) continue;
      out.push_back({dir, false});
      AddModules(fd.get(), dir, 0, &out);
    } else if (m.is_dir) {
      out.push_back({m.host_path, false});
      UniqueFd fd(open(m.host_path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (fd.valid()) AddModules(fd.get(), m.host_path, 0, &out);
    } else {
      out.push_back({m.host_path, true});
      const std::string target = GitdirTarget(m.host_path, workspace);
      if (!target.empty()) {
        out.push_back({target, false});
        UniqueFd fd(open(target.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (fd.valid()) AddModules(fd.get(), target, 0, &out);
      }
    }
    if (out.size() > kMaxGitDirs) {
      return Status::Error("protect", "more than " + std::to_string(kMaxGitDirs) + " git repositories in the workspace " +
                                          workspace + "; each has its hooks and config protected, and this many "
                                          "are refused rather than left unprotected");
    }
  }
  std::sort(out.begin(), out.end(), [](const GitDir& a, const GitDir& b) { return a.host_path < b.host_path; });
  out.erase(std::unique(out.begin(), out.end(),
                        [](const GitDir& a, const GitDir& b) { return a.host_path == b.host_path; }),
            out.end());
  return out;
}

Result<std::vector<GitFinding>> AuditGitRepos(const std::string& workspace, const std::set<std::string>& known,
                                              bool hooks, bool config, const std::string& cache_dir, ScanCaches* kept) {
  std::vector<GitFinding> out;
  auto dirs = FindGitDirs(workspace, cache_dir, nullptr, kept);
  if (!dirs.ok()) return Status::Error("git-audit", dirs.status().message());
  UniqueFd ws(open(workspace.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!ws.valid()) return Status::Errno("git-audit", "open", workspace);
  for (const auto& d : *dirs) {
    if (d.is_file || known.count(d.host_path)) continue;
    if (!paths::IsWithin(d.host_path, workspace)) continue;
    const std::string rel = d.host_path == workspace ? "" : d.host_path.substr(workspace == "/" ? 1 : workspace.size() + 1);
    UniqueFd git = OpenBeneath(ws.get(), rel, O_RDONLY | O_DIRECTORY);
    if (!git.valid()) continue;  // moved, or reached through a symlink: git finds it there
    if (hooks) AuditHooks(git.get(), d.host_path, &out);
    if (config) AuditConfig(git.get(), d.host_path, &out);
  }
  return out;
}

}  // namespace agentbox::linux
