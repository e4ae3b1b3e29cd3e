#include "session/file_tools.h"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "confine/paths.h"
#include "linux/fd.h"
#include "report/json_text.h"

namespace agentbox::session {
namespace {

using linux::UniqueFd;

// ------------------------------------------------------------------ results

// `text` as valid UTF-8: each byte that does not start a well-formed sequence
// becomes U+FFFD. Sets *changed when anything was replaced.
std::string Utf8Safe(std::string text, bool* changed) {
  if (report::WellFormedUtf8(text)) return text;  // the common case: as it is, not copied
  std::string out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    if (s[i] < 0x80) {  // a run of ASCII, appended at once
      std::size_t end = i + 1;
      while (end < n && s[end] < 0x80) ++end;
      out.append(text, i, end - i);
      i = end;
      continue;
    }
    if (const std::size_t len = report::Utf8SequenceLength(s, i, n); len > 0) {
      out.append(text, i, len);
      i += len;
    } else {
      out.append("\xef\xbf\xbd");
      *changed = true;
      ++i;
    }
  }
  return out;
}

Json Ok(std::string output) {
  bool changed = false;
  Json result = {{"kind", "ok"}, {"output", Utf8Safe(std::move(output), &changed)}};
  if (changed) result["invalid_utf8"] = true;
  return result;
}

Json Failure(const char* kind, const std::string& message) {
  bool changed = false;
  std::string text = Utf8Safe(std::string(kind) + ": " + message, &changed);
  Json result = {{"kind", kind}, {"output", text}, {"error", text}};
  if (changed) result["invalid_utf8"] = true;
  return result;
}

Json ToolError(const std::string& message) { return Failure("tool_error", message); }

// The one errno → outcome mapping of the file tools. `op` is the denial's
// op (read or write), `verb` what was being done ("read", "write", "list"…).
Json FromErrno(int err, const char* op, const std::string& verb, const std::string& path) {
  std::string reason = std::strerror(err);
  if (err == EROFS) {
    reason += " (protected or read-only path)";
  } else if (err == EACCES || err == EPERM) {
    reason += " (denied by the sandbox policy or by file permissions)";
  } else {
    return ToolError(verb + " " + path + ": " + reason);
  }
  Json result = Failure("sandbox_denied", verb + " " + path + ": " + reason);
  bool changed = false;
  result["denials"] = Json::array({{{"facet", "filesystem"},
                                    {"op", op},
                                    {"target", Utf8Safe(path, &changed)},
                                    {"reason", reason},
                                    {"source", "file-tool"}}});
  return result;
}

// ------------------------------------------------------------------ input

// Reads a string field; returns nullptr and sets *error when it is missing or
// not a string.
const std::string* StringField(const Json& input, const std::string& tool, const char* key, Json* error,
                               bool required = true) {
  if (input.is_object()) {
    auto it = input.find(key);
    if (it != input.end() && it->is_string()) return &it->get_ref<const std::string&>();
    if (it == input.end() && !required) return nullptr;
  }
  *error = ToolError(tool + ": input field \"" + key + "\" must be a string");
  return nullptr;
}

// An optional positive integer field; false (with *error) when malformed.
bool CountField(const Json& input, const std::string& tool, const char* key, std::optional<std::size_t>* out,
                Json* error) {
  if (!input.is_object()) return true;
  auto it = input.find(key);
  if (it == input.end() || it->is_null()) return true;
  if (it->is_number_integer() && it->get<std::int64_t>() >= 1) {
    *out = static_cast<std::size_t>(it->get<std::int64_t>());
    return true;
  }
  *error = ToolError(tool + ": input field \"" + key + "\" must be a positive integer");
  return false;
}

std::string Resolve(const std::string& path, const FileToolLimits& limits) {
  if (!path.empty() && path[0] == '/') return path;
  if (limits.workspace.empty()) return path;
  if (path.empty() || path == ".") return limits.workspace;
  return limits.workspace.back() == '/' ? limits.workspace + path : limits.workspace + "/" + path;
}

// /proc and /sys (and the kernel's other pseudo-filesystems mounted under
// /sys) are the kernel's view of processes and devices, not files: a file
// tool's /proc/self is the tool's own process, whose environment and memory
// are not the session's to read or to probe with edit_file. The file tools
// refuse them by the filesystem an opened fd is on, so a symlink or a bind
// mount leading there is refused too; the shell still reads them.
bool IsKernelFs(const struct statfs& fs) {
  switch (static_cast<unsigned long>(fs.f_type)) {
    case PROC_SUPER_MAGIC:
    case SYSFS_MAGIC:
    case CGROUP_SUPER_MAGIC:
    case CGROUP2_SUPER_MAGIC:
    case DEBUGFS_MAGIC:
    case TRACEFS_MAGIC:
    case SECURITYFS_MAGIC:
    case BPF_FS_MAGIC:
      return true;
    default:
      return false;
  }
}

bool FdOnKernelFs(int fd) {
  struct statfs fs {};
  return fstatfs(fd, &fs) == 0 && IsKernelFs(fs);
}

bool PathOnKernelFs(const std::string& path) {
  struct statfs fs {};
  return statfs(path.c_str(), &fs) == 0 && IsKernelFs(fs);
}

Json KernelFsRefusal(const std::string& verb, const std::string& path) {
  return ToolError(verb + " " + path +
                   ": refused: /proc and /sys are not open to the file tools (they would show the tool's own "
                   "process, not the session's files); use the shell");
}

std::string Dirname(const std::string& path) {
  std::size_t slash = path.find_last_not_of('/');
  if (slash == std::string::npos) return "/";
  slash = path.rfind('/', slash);
  if (slash == std::string::npos) return ".";
  std::size_t end = path.find_last_not_of('/', slash);
  return end == std::string::npos ? "/" : path.substr(0, end + 1);
}

// ------------------------------------------------------------------ io

// Reads the whole file; false with errno set on failure.
bool ReadAll(int fd, std::string* out) {
  char buf[1 << 16];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) return true;
    out->append(buf, static_cast<std::size_t>(n));
  }
}

// Overwrites the open file `fd` with `data` (the shell's `>`).
Json WriteInPlace(int fd, const std::string& path, const std::string& data, bool created) {
  if (ftruncate(fd, 0) != 0 || lseek(fd, 0, SEEK_SET) != 0 || !linux::WriteAll(fd, data)) {
    return FromErrno(errno, "write", "write", path);
  }
  Json result = Ok("wrote " + std::to_string(data.size()) + " bytes to " + path);
  result["bytes"] = data.size();
  result["created"] = created;
  return result;
}

// Replaces (or creates) the file at `path` with `data`; see the header for
// when it is atomic and when it is written in place.
Json WriteContent(const std::string& path, const std::string& data) {
  struct stat link {};
  const bool present = lstat(path.c_str(), &link) == 0;
  UniqueFd existing;
  struct stat st {};
  if (present || errno != ENOENT) {
    existing.reset(open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
    if (!existing.valid()) {
      if (errno == ENOENT && present && S_ISLNK(link.st_mode)) {
        // A dangling symlink: the shell creates its target.
        UniqueFd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, 0666));
        if (!fd.valid()) return FromErrno(errno, "write", "write", path);
        return WriteInPlace(fd.get(), path, data, true);
      }
      if (errno == EISDIR) return ToolError("write " + path + ": is a directory");
      if (PathOnKernelFs(path) || PathOnKernelFs(Dirname(path))) return KernelFsRefusal("write", path);
      return FromErrno(errno, "write", "write", path);
    }
    if (FdOnKernelFs(existing.get())) return KernelFsRefusal("write", path);
    if (fstat(existing.get(), &st) != 0) return FromErrno(errno, "write", "write", path);
    if (!S_ISREG(st.st_mode)) return ToolError("write " + path + ": not a regular file");
  } else {
    const std::string parent = Dirname(path);
    struct stat pst {};
    if (stat(parent.c_str(), &pst) != 0) {
      if (errno == ENOENT) {
        return ToolError("write " + path + ": parent directory " + parent +
                         " does not exist (create it first, e.g. with `mkdir -p " + parent + "`)");
      }
      return FromErrno(errno, "write", "write", path);
    }
    if (!S_ISDIR(pst.st_mode)) return ToolError("write " + path + ": " + parent + " is not a directory");
    if (PathOnKernelFs(parent)) return KernelFsRefusal("write", path);
  }

  // Several names for one file: replacing one name would split them.
  if (existing.valid() && st.st_nlink > 1) return WriteInPlace(existing.get(), path, data, false);

  // The name to replace: the file a symlink points to, as the shell would write it.
  std::string target = path;
  if (existing.valid() && S_ISLNK(link.st_mode)) {
    char* real = realpath(path.c_str(), nullptr);
    if (real == nullptr) return WriteInPlace(existing.get(), path, data, false);
    target = real;
    std::free(real);
  }
  const std::string dir = Dirname(target);
  std::string temp;
  UniqueFd out;
  for (int attempt = 0; attempt < 16 && !out.valid(); ++attempt) {
    struct timespec now {};
    clock_gettime(CLOCK_MONOTONIC, &now);
    // A short name of fixed length whatever the target's (a 255-byte name
    // leaves no room for a prefix and a suffix).
    temp = dir + "/.agentbox-" + std::to_string(getpid()) + "-" +
           std::to_string(static_cast<unsigned long>(now.tv_nsec) + static_cast<unsigned long>(attempt));
    // 0666 & ~umask for a new file, as the shell creates it; an existing
    // file's mode is copied below.
    out.reset(open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, existing.valid() ? 0600 : 0666));
    if (!out.valid() && errno != EEXIST) break;
  }
  if (!out.valid()) {
    // The directory refuses a new entry: an existing file may still be writable in place.
    if (existing.valid()) return WriteInPlace(existing.get(), path, data, false);
    return FromErrno(errno, "write", "write", path);
  }
  auto discard = [&](int err) {
    unlink(temp.c_str());
    return FromErrno(err, "write", "write", path);
  };
  if (!linux::WriteAll(out.get(), data)) return discard(errno);
  if (existing.valid()) {
    if (fchown(out.get(), st.st_uid, st.st_gid) != 0) {
      // Not ours to give away (an unprivileged sandbox): keep our ownership.
    }
    if (fchmod(out.get(), st.st_mode & 07777) != 0) return discard(errno);
  }
  out.reset();
  if (rename(temp.c_str(), target.c_str()) != 0) {
    int err = errno;
    unlink(temp.c_str());
    // A bind-mounted file (EBUSY) or another filesystem: write through it.
    if (existing.valid()) return WriteInPlace(existing.get(), path, data, false);
    return FromErrno(err, "write", "write", path);
  }
  Json result = Ok("wrote " + std::to_string(data.size()) + " bytes to " + path);
  result["bytes"] = data.size();
  result["created"] = !existing.valid();
  return result;
}

// Opens a regular file for reading; a Json failure otherwise.
std::optional<Json> OpenForRead(const std::string& path, UniqueFd* fd, struct stat* st) {
  fd->reset(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (!fd->valid()) {
    if (PathOnKernelFs(path)) return KernelFsRefusal("read", path);
    return FromErrno(errno, "read", "read", path);
  }
  if (FdOnKernelFs(fd->get())) return KernelFsRefusal("read", path);
  if (fstat(fd->get(), st) != 0) return FromErrno(errno, "read", "read", path);
  if (S_ISDIR(st->st_mode)) return ToolError("read " + path + ": is a directory (list it with list_dir)");
  if (!S_ISREG(st->st_mode)) return ToolError("read " + path + ": not a regular file");
  return std::nullopt;
}

// ------------------------------------------------------------------ tools

Json ReadFile(const Json& input, const FileToolLimits& limits) {
  Json error;
  const std::string* path_in = StringField(input, "read_file", "path", &error);
  if (!path_in) return error;
  std::optional<std::size_t> offset_in, limit_in;
  if (!CountField(input, "read_file", "offset", &offset_in, &error)) return error;
  if (!CountField(input, "read_file", "limit", &limit_in, &error)) return error;
  const std::string path = Resolve(*path_in, limits);
  const std::size_t first = offset_in.value_or(1);
  const std::size_t last = limit_in ? first + *limit_in - 1 : SIZE_MAX;  // inclusive

  UniqueFd fd;
  struct stat st {};
  if (auto failure = OpenForRead(path, &fd, &st)) return *failure;

  // One pass: count every line, keep the wanted ones while they fit.
  std::string output;
  // Room for what it will most likely hold, at once (not grown by doubling:
  // each step a new buffer, faulted in and copied).
  if (st.st_size > 0)
    output.reserve(std::min<std::size_t>(static_cast<std::size_t>(st.st_size), limits.max_read_bytes));
  // The wanted line being read is collected in place, at the end of
  // `output` from `line_start` on: a 1 MiB one-line file (minified JSON)
  // is not grown by doubling in a string of its own, then copied.
  std::size_t line_start = 0;
  std::size_t line = 1;      // the line the next byte belongs to
  std::size_t shown_last = 0;
  bool truncated = false;
  bool cut_line = false;     // a single line longer than the cap was cut
  bool last_ended = true;    // the text read so far ends with '\n' (or is empty)
  std::size_t total_bytes = 0;
  std::string head;          // the first bytes, for the binary test
  char buf[1 << 16];
  for (;;) {
    ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return FromErrno(errno, "read", "read", path);
    }
    if (n == 0) break;
    if (head.size() < kBinaryProbeBytes) {
      head.append(buf, std::min<std::size_t>(static_cast<std::size_t>(n), kBinaryProbeBytes - head.size()));
      if (head.find('\0') != std::string::npos) {
        return ToolError("read " + path + ": binary file (" + std::to_string(st.st_size) +
                         " bytes), not shown");
      }
    }
    total_bytes += static_cast<std::size_t>(n);
    std::size_t pos = 0;
    const std::size_t len = static_cast<std::size_t>(n);
    while (pos < len) {
      const char* nl = static_cast<const char*>(std::memchr(buf + pos, '\n', len - pos));
      std::size_t end = nl ? static_cast<std::size_t>(nl - buf) + 1 : len;
      const bool wanted = !truncated && line >= first && line <= last;
      if (wanted) {
        const std::size_t take = end - pos;
        const std::size_t room = limits.max_read_bytes - output.size();
        if (take > room) {
          truncated = true;
          if (line_start == 0) {  // one line bigger than the cap: show its start
            output.append(buf + pos, room);
            shown_last = line;
            cut_line = true;
          } else {
            output.resize(line_start);  // the lines before it, whole
          }
        } else {
          output.append(buf + pos, take);
        }
      }
      last_ended = nl != nullptr;
      if (nl) {
        if (wanted && !truncated) shown_last = line;
        line_start = output.size();
        ++line;
      }
      pos = end;
    }
  }
  if (!truncated && output.size() > line_start) shown_last = line;  // the last line, without '\n'
  const std::size_t total_lines = total_bytes == 0 ? 0 : (last_ended ? line - 1 : line);
  if (first > 1 && first > total_lines) {
    return ToolError("read " + path + ": offset " + std::to_string(first) + " is past the end (" +
                     std::to_string(total_lines) + " lines)");
  }
  if (truncated) {
    const std::size_t next = shown_last + 1;
    if (!output.empty() && output.back() != '\n') output += '\n';
    output += "[truncated: ";
    output += cut_line ? "line " + std::to_string(shown_last) + " cut at " +
                             std::to_string(limits.max_read_bytes) + " bytes"
                       : "lines " + std::to_string(first) + "-" + std::to_string(shown_last) + " of " +
                             std::to_string(total_lines) + " shown";
    output += " (output capped at " + std::to_string(limits.max_read_bytes) + " bytes); read on with offset=" +
              std::to_string(next) + "]\n";
  }
  Json result = Ok(std::move(output));
  result["total_lines"] = total_lines;
  result["truncated"] = truncated;
  if (truncated) result["next_offset"] = shown_last + 1;
  return result;
}

Json WriteFile(const Json& input, const FileToolLimits& limits) {
  Json error;
  const std::string* path_in = StringField(input, "write_file", "path", &error);
  if (!path_in) return error;
  const std::string* content = StringField(input, "write_file", "content", &error);
  if (!content) return error;
  const std::string path = Resolve(*path_in, limits);
  if (content->size() > limits.max_write_bytes) {
    return ToolError("write " + path + ": content is " + std::to_string(content->size()) +
                     " bytes, more than the limit of " + std::to_string(limits.max_write_bytes));
  }
  return WriteContent(path, *content);
}

Json EditFile(const Json& input, const FileToolLimits& limits) {
  Json error;
  const std::string* path_in = StringField(input, "edit_file", "path", &error);
  if (!path_in) return error;
  const std::string* old_text = StringField(input, "edit_file", "old", &error);
  if (!old_text) return error;
  const std::string* new_text = StringField(input, "edit_file", "new", &error);
  if (!new_text) return error;
  const std::string path = Resolve(*path_in, limits);
  if (old_text->empty()) return ToolError("edit " + path + ": old text is empty");

  UniqueFd fd;
  struct stat st {};
  if (auto failure = OpenForRead(path, &fd, &st)) return *failure;
  if (static_cast<std::size_t>(st.st_size) > limits.max_write_bytes) {
    return ToolError("edit " + path + ": file is " + std::to_string(st.st_size) + " bytes, more than the limit of " +
                     std::to_string(limits.max_write_bytes));
  }
  // One buffer for the file and the edit, sized once: a 1 MiB file read by
  // appends, then cut and joined into a second string, faulted in ~4 MiB of
  // fresh mappings in the tool's process.
  std::string text;
  text.reserve(static_cast<std::size_t>(st.st_size) + new_text->size() + 1);
  if (!ReadAll(fd.get(), &text)) return FromErrno(errno, "read", "read", path);
  fd.reset();

  std::size_t count = 0;
  std::size_t at = std::string::npos;
  for (std::size_t pos = text.find(*old_text); pos != std::string::npos; pos = text.find(*old_text, pos + 1)) {
    if (count++ == 0) at = pos;
  }
  if (count == 0) return ToolError("old text not found in " + path);
  if (count > 1) return ToolError("old text occurs " + std::to_string(count) + " times in " + path);
  const std::size_t edited_size = text.size() - old_text->size() + new_text->size();
  if (edited_size > limits.max_write_bytes) {
    return ToolError("edit " + path + ": the result would be " + std::to_string(edited_size) +
                     " bytes, more than the limit of " + std::to_string(limits.max_write_bytes));
  }
  const std::size_t line = static_cast<std::size_t>(std::count(text.begin(), text.begin() + at, '\n')) + 1;
  text.replace(at, old_text->size(), *new_text);  // in place: the text before `at` stays as it was
  Json result = WriteContent(path, text);
  if (result["kind"] != "ok") return result;
  Json done = Ok("edited " + path + ": replaced 1 occurrence at line " + std::to_string(line));
  done["line"] = line;
  return done;
}

Json ListDir(const Json& input, const FileToolLimits& limits) {
  Json error;
  const std::string* path_in = StringField(input, "list_dir", "path", &error, /*required=*/false);
  if (!path_in && !error.is_null()) return error;
  const std::string path = Resolve(path_in ? *path_in : "", limits);
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) {
    if (PathOnKernelFs(path)) return KernelFsRefusal("list", path);
    if (errno == ENOTDIR) return ToolError("list " + path + ": not a directory");
    return FromErrno(errno, "read", "list", path);
  }
  if (FdOnKernelFs(fd.get())) return KernelFsRefusal("list", path);
  DIR* dir = fdopendir(fd.get());
  if (dir == nullptr) return FromErrno(errno, "read", "list", path);
  fd.release();
  std::vector<std::string> names;
  while (struct dirent* e = readdir(dir)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
  }
  const int dir_fd = dirfd(dir);
  std::sort(names.begin(), names.end());
  const bool truncated = names.size() > limits.max_entries;
  if (truncated) names.resize(limits.max_entries);

  bool changed = false;
  std::string output;
  Json entries = Json::array();
  for (const std::string& name : names) {
    struct stat st {};
    Json entry = {{"name", Utf8Safe(name, &changed)}};
    std::string type = "unknown";
    if (fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      type = S_ISREG(st.st_mode) ? "file" : S_ISDIR(st.st_mode) ? "dir" : S_ISLNK(st.st_mode) ? "symlink" : "other";
      entry["size"] = static_cast<std::uint64_t>(st.st_size);
      if (S_ISLNK(st.st_mode)) {
        char target[PATH_MAX];
        ssize_t n = readlinkat(dir_fd, name.c_str(), target, sizeof(target));
        if (n >= 0) entry["target"] = Utf8Safe(std::string(target, static_cast<std::size_t>(n)), &changed);
      }
    }
    entry["type"] = type;
    output += name + (type == "dir" ? "/" : "") + "\n";
    entries.push_back(std::move(entry));
  }
  closedir(dir);
  if (names.empty()) output = "(empty directory)\n";
  if (truncated) output += "[truncated: first " + std::to_string(limits.max_entries) + " entries shown]\n";
  Json result = Ok(output);
  result["entries"] = std::move(entries);
  result["truncated"] = truncated;
  if (changed) result["invalid_utf8"] = true;
  return result;
}

bool HasWildcard(const std::string& component) {
  return component.find_first_of("*?[") != std::string::npos;
}

class Globber {
 public:
  Globber(std::vector<std::string> parts, std::size_t max) : parts_(std::move(parts)), max_(max) {}

  // `dir`: the directory to match parts_[index] in; `shown`: its name in results.
  void Match(const std::string& dir, const std::string& shown, std::size_t index) {
    if (full()) return;
    if (PathOnKernelFs(dir)) return;  // not listed (see IsKernelFs)
    if (index == parts_.size()) {
      if (!shown.empty()) Add(shown);  // the start directory itself is no match
      return;
    }
    const std::string& part = parts_[index];
    if (part == "**") {
      Match(dir, shown, index + 1);  // no directory at all
      for (const std::string& name : List(dir)) {
        if (name[0] == '.') continue;
        struct stat st {};
        const std::string child = Join(dir, name);
        if (lstat(child.c_str(), &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
          Match(child, Join(shown, name), index);
        } else if (index + 1 == parts_.size()) {
          Add(Join(shown, name));  // a trailing `**` matches files too
        }
      }
      return;
    }
    if (!HasWildcard(part)) {
      Step(dir, shown, part, index);
      return;
    }
    for (const std::string& name : List(dir)) {
      if (fnmatch(part.c_str(), name.c_str(), FNM_PERIOD) == 0) Step(dir, shown, name, index);
    }
  }

  const std::set<std::string>& results() const { return results_; }
  bool truncated() const { return truncated_; }
  std::size_t unreadable() const { return unreadable_; }

 private:
  static std::string Join(const std::string& a, const std::string& b) {
    if (a.empty()) return b;
    return a.back() == '/' ? a + b : a + "/" + b;
  }

  // `name` matched parts_[index] in `dir`.
  void Step(const std::string& dir, const std::string& shown, const std::string& name, std::size_t index) {
    const std::string child = Join(dir, name);
    const std::string child_shown = Join(shown, name);
    struct stat st {};
    if (index + 1 == parts_.size()) {
      if (lstat(child.c_str(), &st) == 0) Add(child_shown);
      return;
    }
    if (stat(child.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) Match(child, child_shown, index + 1);
  }

  std::vector<std::string> List(const std::string& dir) {
    std::vector<std::string> names;
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) {
      ++unreadable_;
      return names;
    }
    while (struct dirent* e = readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }

  bool full() const { return truncated_; }
  void Add(const std::string& path) {
    if (results_.count(path)) return;
    if (results_.size() >= max_) {
      truncated_ = true;
      return;
    }
    results_.insert(path);
  }

  std::vector<std::string> parts_;
  std::size_t max_;
  std::set<std::string> results_;
  bool truncated_ = false;
  std::size_t unreadable_ = 0;
};

Json Glob(const Json& input, const FileToolLimits& limits) {
  Json error;
  const std::string* pattern = StringField(input, "glob", "pattern", &error);
  if (!pattern) return error;
  if (pattern->empty()) return ToolError("glob: the pattern is empty");
  const bool absolute = (*pattern)[0] == '/';
  std::vector<std::string> parts;
  for (std::size_t start = 0; start <= pattern->size();) {
    std::size_t slash = pattern->find('/', start);
    if (slash == std::string::npos) slash = pattern->size();
    if (slash > start) parts.push_back(pattern->substr(start, slash - start));
    start = slash + 1;
  }
  const std::string root = absolute ? "/" : (limits.workspace.empty() ? "." : limits.workspace);
  UniqueFd probe(open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!probe.valid()) return FromErrno(errno, "read", "glob in", root);
  probe.reset();
  // The pattern's literal start (no wildcard yet) leading into /proc or /sys.
  std::string literal = absolute ? "" : root;
  for (const std::string& part : parts) {
    if (HasWildcard(part)) break;
    literal += "/" + part;
    if (PathOnKernelFs(literal)) return KernelFsRefusal("glob", *pattern);
  }

  Globber globber(parts, limits.max_entries);
  globber.Match(root, absolute ? "/" : "", 0);
  std::string output;
  for (const std::string& path : globber.results()) output += path + "\n";
  if (globber.results().empty()) output = "no paths match " + *pattern + "\n";
  if (globber.truncated()) output += "[truncated: first " + std::to_string(limits.max_entries) + " matches shown]\n";
  Json result = Ok(output);
  result["count"] = globber.results().size();
  result["truncated"] = globber.truncated();
  if (globber.unreadable() > 0) result["unreadable_dirs"] = globber.unreadable();
  return result;
}

// A bash call's cwd, as the shell would reach it: relative to the
// workspace, every symlink followed. It must stay inside the workspace.
Json ResolveDir(const Json& input, const FileToolLimits& limits) {
  Json error;
  const std::string* given = StringField(input, "cwd", "path", &error);
  if (!given) return error;
  const std::string path = Resolve(*given, limits);
  char buf[PATH_MAX];
  if (!realpath(limits.workspace.c_str(), buf)) return FromErrno(errno, "read", "resolve the workspace", limits.workspace);
  const std::string workspace = buf;
  if (!realpath(path.c_str(), buf)) return FromErrno(errno, "read", "cwd", *given);
  const std::string real = buf;
  if (!paths::IsWithin(real, workspace)) {
    return ToolError("cwd " + *given + " leads to " + real + ", outside the workspace " + limits.workspace);
  }
  struct stat st {};
  if (stat(real.c_str(), &st) != 0) return FromErrno(errno, "read", "cwd", *given);
  if (!S_ISDIR(st.st_mode)) return ToolError("cwd " + *given + " is not a directory");
  return Ok(real);
}

}  // namespace

Json RunFileTool(const std::string& name, const Json& input, const FileToolLimits& limits) {
  if (name == "read_file") return ReadFile(input, limits);
  if (name == "write_file") return WriteFile(input, limits);
  if (name == "edit_file") return EditFile(input, limits);
  if (name == "list_dir") return ListDir(input, limits);
  if (name == "glob") return Glob(input, limits);
  if (name == kResolveDirTool) return ResolveDir(input, limits);
  return ToolError("unknown file tool \"" + name + "\" (read_file, write_file, edit_file, list_dir, glob)");
}

}  // namespace agentbox::session
