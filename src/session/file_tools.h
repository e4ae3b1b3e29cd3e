// The file tools of execute(name, input): read_file, write_file, edit_file,
// list_dir and glob.
//
// They run INSIDE the sandbox, in a process forked from the sandbox's init:
// under its mounts, Landlock domain and seccomp filter, with the workspace
// as the shell sees it. So a path means what it means to the shell, and a
// tool can neither reach what the shell cannot nor see a different copy of
// it. Plain open() is used on purpose: symlinks are followed exactly as the
// shell follows them, and the mount namespace is the boundary.
//
// Outcomes, as JSON:
//   {"kind": "ok" | "tool_error" | "sandbox_denied",
//    "output": "...",           // the tool's text; for a failure, the message
//    "error": "...",            // when not ok (the same message)
//    "denials": [{"facet": "filesystem", "op": "read"|"write", "target": path,
//                 "reason": "...", "source": "file-tool"}],   // sandbox_denied only
//    ...tool-specific fields}
// EACCES and EPERM (Landlock, a mask, file permissions) and EROFS (a
// read-only or protected path) are sandbox_denied, as the same failure is
// from the shell; anything else (ENOENT, EISDIR, a binary file, an ambiguous
// edit) is tool_error. A failure's message starts with its kind:
//   "sandbox_denied: write /work/.git/config: Read-only file system (protected or read-only path)"
//
// Strings in the result are valid UTF-8: bytes that are not (in file
// contents or names) are replaced with U+FFFD and "invalid_utf8": true is set.
//
// RunFileTool touches no global state; new files get 0666 & ~umask from the
// kernel, as the shell's do.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

namespace agentbox::session {

// git's and grep's test for binary content: a NUL byte in the first 8000
// bytes.
inline constexpr std::size_t kBinaryProbeBytes = 8000;

using Json = nlohmann::json;

struct FileToolLimits {
  std::string workspace;                 // the workspace as seen inside: relative paths and glob start here
  std::size_t max_read_bytes = 1 << 20;  // read_file output cap (cut at a line end, with a note)
  std::size_t max_write_bytes = 16 << 20;  // write_file content and edit_file file size cap
  std::size_t max_entries = 10000;       // list_dir entries and glob matches
};

// Tools and inputs:
//   read_file  {path, offset?, limit?}  offset: first line (1-based), limit: lines.
//              → the text as is; "total_lines", "truncated" (+ "next_offset").
//              A binary file (a NUL byte in its first 8000 bytes) is a
//              tool_error naming its size.
//   write_file {path, content}  → replaces the file atomically (a temp file in
//              the same directory, renamed over it) keeping its mode; new
//              files get 0666 & ~umask. The parent directory must exist (a
//              tool_error otherwise: create it with bash `mkdir -p`). Written
//              in place instead, like the shell's `>`, when the path is a
//              file with several hard links, or a mount point (a bind-mounted
//              file), or its directory refuses new entries while the file
//              itself is writable. A symlink is written through, as by the
//              shell. "bytes", "created".
//   edit_file  {path, old, new}  `old` must occur exactly once (overlapping
//              occurrences count), else tool_error "old text occurs N times
//              in <path>" / "old text not found in <path>"; written as
//              write_file does. "line": where the replacement starts.
//   list_dir   {path?}  (default: the workspace) one entry per line, sorted,
//              "name/" for directories; "entries": [{name, type (file|dir|
//              symlink|other), size, target (symlinks)}], "truncated".
//   glob       {pattern}  shell-style: `*`, `?`, `[...]` within a component,
//              `**` for any number of directories; wildcards do not match a
//              leading '.' (name dot directories to search them) and `**`
//              does not descend into symlinked directories. Relative patterns
//              start at the workspace and give workspace-relative paths;
//              absolute patterns give absolute paths. Sorted, one per line,
//              at most max_entries ("truncated"); "count".
// And one the session uses itself, no tool of execute():
//   resolve_dir {path}  a bash call's cwd: realpath() as the shell would
//              reach it; "output" is the directory, or a tool_error when it is
//              missing, not a directory, or outside the workspace (`..`, an
//              absolute path, a symlink leading out).
// Anything else is a tool_error ("unknown file tool ...").
inline constexpr const char* kResolveDirTool = "resolve_dir";

Json RunFileTool(const std::string& name, const Json& input, const FileToolLimits& limits);

}  // namespace agentbox::session
