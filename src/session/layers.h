// A session's workspace as layers on disk: snapshots of its changes, their
// verification, and the diff against the base workspace.
//
// Overlay mode: the sandbox mounts overlayfs (with `userxattr`, inside its
// user namespace) with lowerdir = the snapshot layers the session started
// from (newest first), then the base workspace; upperdir = the session's own
// upper layer. In a layer a deleted path is a whiteout (a character device
// 0:0) and a directory that hides everything below it carries the xattr
// user.overlay.opaque = "y" (trusted.overlay.opaque is honoured when read).
// Redirects and metacopy are never in play: `userxattr` turns both off, so
// every upper file holds its whole data and a renamed directory is a copy.
//
// Copy mode (no overlayfs): the session works in a full copy of the base.
//
// Everything here runs on the host, outside the sandbox, over directories
// the sandbox can write while it runs: paths are resolved one component at a
// time below an opened root and no symlink is ever followed, so a layer
// rearranged under our feet can make a snapshot or a diff inconsistent but
// never make it read or write outside the layer.
//
// Functions are thread-safe (no shared state); two calls writing the same
// destination are the caller's to avoid.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agentbox/status.h"

namespace agentbox::session {

using Json = nlohmann::json;

struct LayerStack {
  std::string base;                 // the base workspace (never written here)
  std::vector<std::string> lowers;  // snapshot trees (<snapshot>/tree), newest first; overlay mode only
  std::string upper;                // the session's upper layer, or its full copy in copy mode
  bool copy_mode = false;           // `upper` is a full copy of the workspace (no layers, no whiteouts)
};

inline constexpr int kSnapshotVersion = 1;

// The stage of the error for a tree nested deeper than a host path can name
// (PATH_MAX under the layer's host directory, which is longer than the path
// the session sees): the daemon answers it as 422 `path_too_long`.
inline constexpr const char* kPathTooLong = "path_too_long";

// Freezes the session's changes into `dest_dir`, which is created (0700; its
// parent must exist, it must not).
//   dest_dir/tree           overlay mode: a copy of the upper layer only
//                           (files, directories with their modes, symlinks,
//                           whiteouts, the opaque mark), a layer to stack on
//                           the snapshot named `parent_snapshot_id`; the cost
//                           is proportional to the changed bytes (reflinks
//                           where the filesystem has them). Copy mode: a copy
//                           of the whole workspace, self-contained but not
//                           cheap (proportional to the workspace size, except
//                           on filesystems with reflinks).
//   dest_dir/manifest.json  {version, created (RFC 3339 UTC), parent, mode
//                           (overlay|copy), entries: [{path, type
//                           (file|dir|symlink|whiteout), mode, size, sha256,
//                           target, opaque}]} sorted by path. A path or a
//                           target that is not UTF-8 is stored exactly as
//                           "path_hex" / "target_hex" (lowercase hex of its
//                           bytes) instead of "path" / "target".
// Sockets, fifos and devices other than whiteouts are not kept; hard links
// become separate files. Set-user-ID and set-group-ID bits are not kept (nor
// the sticky bit on files): the mode copied and recorded is without them. A
// tree nested past PATH_MAX is refused with its path. Safe while the session runs: every checksum is
// taken on the copy, so the manifest always describes the bytes kept; but a
// snapshot of a tree that changes meanwhile is not a point-in-time view
// (freeze the sandbox first for that). Durability: the tree is flushed
// (syncfs), then the manifest is written last (temp file, fsync, rename,
// directory fsync), so a snapshot with a manifest is whole and one without
// is an interrupted copy. Returns the manifest.
Result<Json> CreateSnapshot(const LayerStack& stack, const std::string& parent_snapshot_id,
                            const std::string& dest_dir);

// The manifest of the snapshot in `dir`: stage "not_found" when the directory
// or its manifest is missing, stage "snapshot" when it does not parse or has
// the wrong version.
Result<Json> ReadSnapshotManifest(const std::string& dir);

// Checks the snapshot in `dir` against its manifest: every entry present
// with its type, mode, size, checksum, target and opaque mark, and nothing
// else in the tree. Errors name the snapshot and the path, e.g. stage
// "snapshot": "snapshot /s/abc is corrupt: src/a.c: checksum mismatch".
Status VerifySnapshot(const std::string& dir);

// Copies the tree `from` into `to` (created when missing, with the mode of
// `from`): files (reflinked where possible), directories and their modes,
// symlinks as symlinks, modification times; ownership too when run as
// root. A symlink is never followed, so nothing outside `from` is read.
// Sockets, fifos and devices are left out; hard links become separate files;
// set-user-ID and set-group-ID bits (and the sticky bit on files) are dropped.
Status CopyTree(const std::string& from, const std::string& to);

// Copies the contents of the upper layer directory `from_dir` into the empty
// directory `to_dir`, as CopyTree does, keeping whiteouts and opaque marks
// and ownership where the process may give it (a session's init copies an
// earlier world's upper layer into a new capped one: disk_gib); `to_dir`
// gets the mode and times of `from_dir`. Errors name paths below "upper".
Status CopyUpperLayer(int from_dir, int to_dir);

// Copies the upper layer directory `from` to `to` (created; its parent must
// exist), keeping whiteouts and opaque marks, then flushes it (syncfs): a
// session's capped upper layer written to the state directory when the
// process holding it stops.
Status CopyUpperTree(const std::string& from, const std::string& to);

// The session's changes against the base: the merged view (upper over the
// lowers over the base, or the copy) compared with the base, as git sees
// them: regular files and symlinks (directories are not content; an empty
// new directory is no change), the user-executable bit as mode 100755 vs
// 100644 and no other permission bits.
//   {"files": [{"path", "status": added|modified|deleted, "binary": bool}],
//    "patch": "<git-style diff>", "truncated": bool, "files_truncated": bool}
// A path that is not UTF-8 is listed with "path" made readable (U+FFFD for
// each byte that is not UTF-8) and "path_hex", its exact bytes in hex; the
// patch quotes such names as git does (octal escapes).
// Sorted by path. Overlay mode examines only the paths present in a layer
// (plus the base contents of directories a layer deleted or made opaque):
// the cost follows the changes, not the workspace. Copy mode walks both
// trees whole. Paths under a directory named `.git` are repository
// metadata, left out as git leaves them out (and `git apply` refuses them).
// `git apply` in a checkout of the base applies the patch: every section
// has git's full "index <old>..<new>" line (SHA-1 blob ids), and binary
// files (listed with binary: true) are in git's binary format ("GIT binary
// patch", literal hunks both ways: unified_diff.h GitBinaryPatch). The patch holds
// whole file sections only: when the next one would pass `max_patch_bytes`
// (or a file is bigger than that) it and the rest are left out of the patch
// (still listed in files) and "truncated" is true. No file is read past
// `max_patch_bytes` + 1 bytes, even one growing while it is read (larger
// files are compared by streaming when their sizes match).
//
// The list of files is capped too: past `max_files` changed paths the rest
// are left out of both, and "files_truncated" (and "truncated") is true.
//
// None of these functions throws: failures, including JSON and memory
// errors, come back as a Status naming the path.
inline constexpr std::size_t kMaxDiffFiles = 10000;

struct DiffOptions {
  std::size_t max_patch_bytes = 0;
  std::size_t max_files = kMaxDiffFiles;
  // false: paths the workspace's ignore rules leave out (gitignore.h: its
  // .gitignore files as the merged view holds them, a deleted directory's
  // as the base held them, the base's .git/info/exclude, then `exclude`)
  // are neither listed nor in the patch; the walk does not enter an
  // ignored directory. true: everything.
  bool all = false;
  std::vector<std::string> exclude;  // diff.exclude: gitignore-style, relative to the root
};
Result<Json> ComputeDiff(const LayerStack& stack, const DiffOptions& options);
// The same with default options (ignore rules honoured, no diff.exclude).
Result<Json> ComputeDiff(const LayerStack& stack, std::size_t max_patch_bytes,
                         std::size_t max_files = kMaxDiffFiles);

// What a session's changes are based on: the identity of every path of the
// base (type, mode, size, mtime, ctime, inode; directories by type only),
// written to `dest_file` (replaced atomically) when the session is created.
// Paths under a directory named .git are left out, as in the diff. Cost: one
// fstatat per entry of the base, no file read. `skip`: absolute paths left
// out with everything below them (agentbox's own directories).
Status RecordBase(const std::string& base, const std::string& dest_file, const std::vector<std::string>& skip = {});

// Now, as the session layer writes times: "2026-11-29T11:10:02Z" (UTC).
std::string NowRfc3339();

struct ApplyOptions {
  DiffOptions diff;           // which changes (max_patch_bytes, max_files unused)
  std::string base_record;    // RecordBase's file
  // Relative to the base: never written (policy filesystem.protect). The
  // hooks and config of every bare repository in either view are too.
  std::vector<std::string> protect;
};

// Writes the session's changes (the paths ComputeDiff lists, same options)
// into the base, all or nothing:
//   - every changed path, and each directory above it, is checked against
//     `base_record`: a base entry created, removed or changed since is a
//     conflict; a change to a protected path is refused. Either way nothing
//     is written and the answer lists them:
//       {"applied": [], "conflicts": [paths], "protected": [paths]}
//   - new contents are staged in a directory under the base (same
//     filesystem: .agentbox-apply-XXXXXX, removed at the end), flushed, then
//     renamed into place; replaced and deleted entries are first moved into
//     the staging directory, so that a failure part-way undoes every step
//     taken, in reverse. Directories the session removed are removed when
//     empty (ignored files may remain in them); new ones are created with
//     the session's modes. Not atomic across a crash of this process.
//   - files get the session's permission bits (set-id bits dropped); as
//     root, the owner of the file replaced, or of the directory created in.
// Success: {"applied": [paths], "files": [{"path", "status"}],
// "conflicts": [], "protected": []}, and `base_record` is brought up to date
// for the paths written. Errors name the path and the syscall.
Result<Json> ApplyChanges(const LayerStack& stack, const ApplyOptions& options);

}  // namespace agentbox::session
