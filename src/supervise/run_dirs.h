// Per-run directories named after their supervisor's pid (a gVisor bundle,
// a microVM's sockets and logs): removed after the run, and by `agentbox gc`
// once a killed supervisor left one behind.
#pragma once

#include <string>
#include <vector>

namespace agentbox::supervise {

// Removes `dir` and everything below it, following no symlink (a mode-0
// directory that cannot be read is removed too: it is empty); true when it
// is gone.
bool RemoveTree(const std::string& dir);

// Removes the directories <parent>/<prefix><pid>-* of this user whose
// supervisor `pid` is gone; returns those removed.
std::vector<std::string> CollectDeadRunDirs(const std::string& parent, const std::string& prefix);

}  // namespace agentbox::supervise
