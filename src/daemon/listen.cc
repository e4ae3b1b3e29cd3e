#include "daemon/listen.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <vector>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "linux/user_dirs.h"

namespace agentbox::daemon {
namespace {

constexpr int kBacklog = 128;
constexpr size_t kMinTokenLength = 16;

std::string Octal(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

Result<sockaddr_un> UnixAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return Status::Error("listen", "socket path " + path + " is empty or longer than " +
                                       std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

// True when something accepts connections on the socket at `path`.
bool SomeoneListens(const sockaddr_un& addr) {
  linux::UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return false;
  return connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
}

}  // namespace

Result<linux::UniqueFd> ListenUnix(const std::string& path) {
  auto addr = UnixAddress(path);
  if (!addr.ok()) return addr.status();
  struct stat st{};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status::Error("listen", path + " exists and is not a socket; refusing to replace it");
    }
    if (SomeoneListens(*addr)) {
      return Status::Error("listen", "a daemon already answers on " + path);
    }
    if (unlink(path.c_str()) != 0) return Status::Errno("listen", "unlink (stale socket)", path);
  } else if (errno != ENOENT) {
    return Status::Errno("listen", "lstat", path);
  }
  linux::UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return Status::Errno("listen", "socket(AF_UNIX)");
  // Bound inside a fresh 0700 directory beside `path`, made 0600 there and
  // only then renamed into place: nobody else can connect in between, and
  // no umask(2) is needed (the umask is the whole process's, and the daemon
  // has other threads creating files).
  const std::size_t slash = path.rfind('/');
  std::string staging = (slash == std::string::npos ? std::string(".") : path.substr(0, slash + 1)) +
                        ".agentbox-listen-XXXXXX";
  if (!mkdtemp(staging.data())) return Status::Errno("listen", "mkdtemp", staging);
  linux::UniqueFd dir(open(staging.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  auto fail = [&](const char* call, const std::string& what) {
    Status s = Status::Errno("listen", call, what);
    if (dir.valid()) unlinkat(dir.get(), "socket", 0);
    rmdir(staging.c_str());
    return s;
  };
  if (!dir.valid()) return fail("open", staging);
  // Through the directory's descriptor: short whatever `path`'s length.
  auto staged = UnixAddress("/proc/self/fd/" + std::to_string(dir.get()) + "/socket");
  if (!staged.ok()) return fail("bind", staging + "/socket");
  if (bind(fd.get(), reinterpret_cast<const sockaddr*>(&*staged), sizeof(*staged)) != 0) {
    return fail("bind", staging + "/socket");
  }
  if (fchmodat(dir.get(), "socket", 0600, 0) != 0) return fail("chmod 0600", staging + "/socket");
  // RENAME_NOREPLACE: a socket that appeared at `path` meanwhile is not replaced.
  if (renameat2(dir.get(), "socket", AT_FDCWD, path.c_str(), RENAME_NOREPLACE) != 0) {
    return fail("renameat2(RENAME_NOREPLACE)", path);
  }
  rmdir(staging.c_str());
  if (listen(fd.get(), kBacklog) != 0) {
    Status s = Status::Errno("listen", "listen", path);
    unlink(path.c_str());
    return s;
  }
  return fd;
}

Result<TcpAddress> ParseLoopbackAddress(const std::string& text) {
  TcpAddress a;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return Status::Error("listen", "--listen " + text + ": expected [ADDRESS]:PORT");
    }
    a.host = text.substr(1, close - 1);
    port = text.substr(close + 2);
    a.v6 = true;
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos) return Status::Error("listen", "--listen " + text + ": expected ADDRESS:PORT");
    a.host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(port) > 65535) {
    return Status::Error("listen", "--listen " + text + ": '" + port + "' is not a port number");
  }
  a.port = static_cast<uint16_t>(std::stoul(port));
  bool loopback = false;
  if (a.v6) {
    in6_addr in6{};
    if (inet_pton(AF_INET6, a.host.c_str(), &in6) != 1) {
      return Status::Error("listen", "--listen " + text + ": '" + a.host + "' is not a numeric IPv6 address");
    }
    loopback = IN6_IS_ADDR_LOOPBACK(&in6);
  } else {
    in_addr in4{};
    if (inet_pton(AF_INET, a.host.c_str(), &in4) != 1) {
      return Status::Error("listen", "--listen " + text + ": '" + a.host + "' is not a numeric IPv4 address");
    }
    loopback = (ntohl(in4.s_addr) >> 24) == 127;
  }
  if (!loopback) {
    return Status::Error("listen", "--listen " + text + ": " + a.host +
                                       " is not a loopback address; the daemon listens on TCP only on 127.0.0.0/8 "
                                       "or ::1 (use the unix socket, or a tunnel, to reach it from elsewhere)");
  }
  return a;
}

Result<linux::UniqueFd> ListenTcp(const TcpAddress& a) {
  const std::string where = (a.v6 ? "[" + a.host + "]" : a.host) + ":" + std::to_string(a.port);
  linux::UniqueFd fd(socket(a.v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return Status::Errno("listen", "socket(AF_INET)", where);
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int rc;
  if (a.v6) {
    sockaddr_in6 sa{};
    sa.sin6_family = AF_INET6;
    sa.sin6_port = htons(a.port);
    inet_pton(AF_INET6, a.host.c_str(), &sa.sin6_addr);
    rc = bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  } else {
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(a.port);
    inet_pton(AF_INET, a.host.c_str(), &sa.sin_addr);
    rc = bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  }
  if (rc != 0) return Status::Errno("listen", "bind", where);
  if (listen(fd.get(), kBacklog) != 0) return Status::Errno("listen", "listen", where);
  return fd;
}

std::string LocalAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "";
  char host[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    auto* sa = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &sa->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(sa->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    auto* sa = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &sa->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(sa->sin6_port));
  }
  return "";
}

Result<std::string> ReadTokenFile(const std::string& path) {
  linux::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return Status::Errno("token", "open", path);
  struct stat st{};
  if (fstat(fd.get(), &st) != 0) return Status::Errno("token", "fstat", path);
  if (!S_ISREG(st.st_mode)) return Status::Error("token", "token file " + path + " is not a regular file");
  if (st.st_uid != geteuid() && st.st_uid != 0) {
    return Status::Error("token", "token file " + path + " belongs to uid " + std::to_string(st.st_uid) +
                                      ", not to this user (" + std::to_string(geteuid()) + ") or root");
  }
  if (st.st_mode & 077) {
    return Status::Error("token", "token file " + path + " has mode " + Octal(st.st_mode) +
                                      ": group or others may access it (chmod 600 " + path + ")");
  }
  std::string text;
  char buf[4096];
  for (;;) {
    ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::Errno("token", "read", path);
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > 4096) return Status::Error("token", "token file " + path + " is longer than 4096 bytes");
  }
  const char* space = " \t\r\n";
  size_t b = text.find_first_not_of(space);
  size_t e = text.find_last_not_of(space);
  std::string token = b == std::string::npos ? "" : text.substr(b, e - b + 1);
  if (token.size() < kMinTokenLength) {
    return Status::Error("token", "token file " + path + " holds " + std::to_string(token.size()) +
                                      " characters; a token needs at least " + std::to_string(kMinTokenLength));
  }
  if (token.find_first_of(space) != std::string::npos) {
    return Status::Error("token", "token file " + path + ": the token must be one word (no spaces or newlines)");
  }
  return token;
}

bool BearerMatches(std::string_view header, std::string_view token) {
  constexpr std::string_view kScheme = "Bearer ";
  // Every byte of the expected value is compared, whatever the presented
  // one's length or content; lengths are compared at the end.
  std::string expected = std::string(kScheme) + std::string(token);
  unsigned char diff = header.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    unsigned char have = i < header.size() ? static_cast<unsigned char>(header[i]) : 0;
    diff |= have ^ static_cast<unsigned char>(expected[i]);
  }
  return diff == 0 && !token.empty();
}

std::string DefaultStateDir() { return linux::StateDir(); }

std::string SocketIn(const std::string& state_dir) { return state_dir + "/agentbox.sock"; }

Status CheckSocketIsPrivate(const std::string& path) {
  struct stat st{};
  if (lstat(path.c_str(), &st) != 0) return Status::Errno("connect", "lstat", path);
  if (!S_ISSOCK(st.st_mode)) return Status::Error("connect", path + " is not a socket");
  if (st.st_uid != getuid() && st.st_uid != 0) {
    return Status::Error("connect", "refusing to connect to " + path + ": it belongs to uid " +
                                        std::to_string(st.st_uid) + ", not to you (" + std::to_string(getuid()) +
                                        ") or root");
  }
  if (st.st_mode & 077) {
    return Status::Error("connect", "refusing to connect to " + path + ": mode " + Octal(st.st_mode) +
                                        " lets group or others use it (a daemon's socket is 0600)");
  }
  return Status();
}

Result<linux::UniqueFd> LockStateDir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return Status::Errno("state", "mkdir", dir);
  const std::string path = dir + "/daemon.lock";
  linux::UniqueFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return Status::Errno("state", "open", path);
  if (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return Status::Error("state", "another daemon holds " + path + " (one daemon per state directory)");
    }
    return Status::Errno("state", "flock", path);
  }
  return fd;
}

}  // namespace agentbox::daemon
