// Per-run directories named after their supervisor's pid (a gVisor bundle,
// a microVM's sockets and logs): removed after the run, and by `agentbox gc`
// once a killed supervisor left one behind.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace agentbox::supervise {

// Removes `dir` and everything below it, following no symlink (a mode-0
// directory that cannot be read is removed too: it is empty); true when it
// is gone.
bool RemoveTree(const std::string& dir);

// The last `max` bytes of the file at `path` (trailing newlines dropped;
// "" when it cannot be read): a helper's log, a console.
std::string FileTail(const std::string& path, std::size_t max = 2000);

// Removes the directories <parent>/<prefix><pid>-* of this user whose
// supervisor `pid` is gone; returns those removed.
std::vector<std::string> CollectDeadRunDirs(const std::string& parent, const std::string& prefix);

}  // namespace agentbox::supervise
