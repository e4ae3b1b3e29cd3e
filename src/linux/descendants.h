// The processes below a given one, from /proc: for the landlock-only
// backend, which has no pid namespace whose end would take them along.
//
// Complete for a root that is a child subreaper (PR_SET_CHILD_SUBREAPER):
// orphans then re-parent to it, so every process it started, however often
// it forked or double-forked, stays in its tree. A process started on the
// command's behalf by a host service (over a unix socket) is not in it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <vector>

namespace agentbox::linux {

// Live (non-zombie) processes whose parent chain leads to `root`, root excluded.
std::vector<pid_t> Descendants(pid_t root);

// Whether a live process below `root` holds a descriptor of one of the
// sockets with these inode numbers (its /proc/PID/fd links read
// "socket:[N]"). A process whose fds cannot be read (another uid, or made
// non-dumpable) counts as not holding any.
bool HeldByDescendant(pid_t root, const std::vector<std::uint64_t>& socket_inodes);

// Shuts down (shutdown(SHUT_RDWR), both directions) each of the sockets
// with these inode numbers that `root` or a process below it holds, by a
// copy of its descriptor (pidfd_getfd): the process keeps its descriptor,
// its peer sees the connection end. Returns how many were shut down; one
// held by no process there (closed meanwhile), or by a process whose
// descriptors cannot be taken (another uid, non-dumpable), is left.
size_t ShutDownHeldSockets(pid_t root, const std::vector<std::uint64_t>& socket_inodes);

// SIGKILLs the descendants of `root` until none is left, reaping them when
// `root` is the caller. Returns how many were left after the last round (0:
// all gone); a tree that keeps forking faster than it dies is given a few
// dozen rounds.
size_t KillDescendants(pid_t root);

// The name every agentbox runner and session init gives itself (comm).
inline constexpr const char kRunnerName[] = "agentbox-init";

// The pid of the nearest process at or above `pid` (following parents, in
// this pid namespace) that is an agentbox runner, not counting runners that
// are also above the caller itself; 0 when there is none. A process inside
// a sandbox cannot leave its runner's tree: the runner is its pid
// namespace's init, or a child subreaper that outlives it.
pid_t EnclosingRunner(pid_t pid);

}  // namespace agentbox::linux
