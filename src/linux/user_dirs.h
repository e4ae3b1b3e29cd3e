// Where agentbox keeps things for the invoking user. The binary is static
// (no NSS), so a missing $HOME is looked up in /etc/passwd itself.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace agentbox::linux {

// A user's passwd entry, from /etc/passwd itself (no NSS in a static binary).
struct PasswdEntry {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string home;
};
std::optional<PasswdEntry> LookupUser(const std::string& name);

// $HOME when absolute, else the passwd entry of this uid; "" when neither.
std::string HomeDir();
// $XDG_CACHE_HOME/agentbox, else `home`/.cache/agentbox ("" without either).
std::string CacheDir(const std::string& home);
// $XDG_STATE_HOME/agentbox, else ~/.local/state/agentbox ("" without either).
std::string StateDir();

// agentbox's own directories for this user, which no sandbox may see: the
// state and cache directories, and every state directory a daemon or MCP
// server registered. Canonical where they exist.
std::vector<std::string> OwnDirs(const std::string& home);
// Records `dir` (absolute) in StateDir()/state-dirs for OwnDirs. Best
// effort: a state directory that could not be recorded is still hidden
// from the sandboxes of the process that uses it.
void RegisterStateDir(const std::string& dir);

}  // namespace agentbox::linux
