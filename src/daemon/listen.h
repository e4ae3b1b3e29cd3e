// Where the daemon listens and who may talk to it: the unix socket (owner
// only), loopback TCP with a bearer token, and the state directory's lock.
// Each function is one step of `agentbox serve`'s start-up; none leaves
// anything behind when it fails.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "agentbox/status.h"
#include "linux/fd.h"

namespace agentbox::daemon {

// Creates, binds and listens on a unix stream socket at `path`, mode 0600
// (bound in a private 0700 directory beside it, made 0600 and renamed into
// place: no window where others may connect, and the process's umask is
// never touched).
// An existing socket nobody answers on is stale and replaced; one that
// answers (a running daemon), or anything that is not a socket, is refused.
Result<linux::UniqueFd> ListenUnix(const std::string& path);

// "127.0.0.1:8080", "[::1]:8080": a numeric loopback address and a port
// (0: any free port). Anything else is refused, naming the address.
struct TcpAddress {
  std::string host;  // numeric, without brackets
  uint16_t port = 0;
  bool v6 = false;
};
Result<TcpAddress> ParseLoopbackAddress(const std::string& text);
Result<linux::UniqueFd> ListenTcp(const TcpAddress& address);
// "127.0.0.1:PORT" of a bound socket.
std::string LocalAddress(int fd);

// The bearer token in `path`: the file must belong to this user (or root) and
// be neither readable nor writable by group or others; the token is its
// content without surrounding whitespace, at least 16 characters.
Result<std::string> ReadTokenFile(const std::string& path);

// true when `header` is "Bearer <token>", compared in time independent of
// where the first difference is.
bool BearerMatches(std::string_view header, std::string_view token);

// Where a daemon keeps its state when not told: $XDG_STATE_HOME/agentbox,
// else ~/.local/state/agentbox ("" when there is no home directory).
std::string DefaultStateDir();
// The socket inside a state directory.
std::string SocketIn(const std::string& state_dir);

// Clients: refuses a socket that belongs to another user (root excepted) or
// that group or others may open.
Status CheckSocketIsPrivate(const std::string& path);

// An exclusive lock on DIR/daemon.lock, held for the daemon's life, so that
// two daemons never share a state directory. Creates DIR (0700) if missing.
Result<linux::UniqueFd> LockStateDir(const std::string& dir);

}  // namespace agentbox::daemon
