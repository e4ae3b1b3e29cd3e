// Where agentbox keeps things for the invoking user. The binary is static
// (no NSS), so a missing $HOME is looked up in /etc/passwd itself.
#pragma once

#include <string>

namespace agentbox::linux {

// $HOME when absolute, else the passwd entry of this uid; "" when neither.
std::string HomeDir();
// $XDG_CACHE_HOME/agentbox, else `home`/.cache/agentbox ("" without either).
std::string CacheDir(const std::string& home);
// $XDG_STATE_HOME/agentbox, else ~/.local/state/agentbox ("" without either).
std::string StateDir();

}  // namespace agentbox::linux
