#include "policy/checks.h"

#include <charconv>
#include <cstdint>
#include <system_error>

namespace agentbox::policy_internal {
namespace {

std::string Quoted(std::string_view text) { return "\"" + std::string(text) + "\""; }

bool IsPort(std::string_view text) {
  if (text.empty() || text.size() > 5) return false;
  unsigned port = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    port = port * 10 + static_cast<unsigned>(c - '0');
  }
  return port >= 1 && port <= 65535;
}

}  // namespace

std::optional<std::string> DomainProblem(std::string_view pattern, DomainList list) {
  if (pattern.empty()) return "empty entry";
  for (unsigned char c : pattern) {
    if (c <= ' ' || c == 0x7f) return "contains whitespace or a control character";
  }

  // Split off the port. "[v6]:443" is bracketed; a bare address with several
  // colons is an IPv6 literal (maybe a CIDR) and has no port.
  std::string_view host = pattern;
  std::string_view port;
  if (pattern.front() == '[') {
    std::size_t close = pattern.find(']');
    if (close == std::string_view::npos) return "missing ] in " + Quoted(pattern);
    host = pattern.substr(1, close - 1);
    std::string_view rest = pattern.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return "unexpected text after ] in " + Quoted(pattern);
      port = rest.substr(1);
      if (port.empty()) return "empty port in " + Quoted(pattern);
    }
  } else if (std::size_t colon = pattern.find(':');
             colon != std::string_view::npos &&
             pattern.find(':', colon + 1) == std::string_view::npos) {
    host = pattern.substr(0, colon);
    port = pattern.substr(colon + 1);
    if (port.empty()) return "empty port in " + Quoted(pattern);
  }
  if (!port.empty() && !IsPort(port)) {
    return "bad port " + Quoted(port) + " (expected 1-65535)";
  }
  if (host.empty()) return "empty host in " + Quoted(pattern);

  if (host == "*") {
    if (list == DomainList::kDeny) return std::nullopt;
    return Quoted(pattern) + " would allow every host (use network.default: allow instead)";
  }
  std::size_t star = host.find('*');
  if (star != std::string_view::npos) {
    if (star != 0 || host.size() < 2 || host[1] != '.' ||
        host.find('*', 1) != std::string_view::npos) {
      return "\"*\" may only stand for whole leading labels, as in \"*.example.com\" (got " +
             Quoted(pattern) + ")";
    }
    std::string_view suffix = host.substr(2);
    if (suffix.empty() || suffix.front() == '.' || suffix.back() == '.') {
      return "empty label in " + Quoted(pattern);
    }
    // "*.com" would open a whole top-level domain: every host there could
    // receive data. Deny lists may be as broad as they like.
    if (list == DomainList::kAllow && suffix.find('.') == std::string_view::npos) {
      return Quoted(pattern) +
             " is too broad (a wildcard needs at least two labels, e.g. \"*.example.com\")";
    }
  }
  return std::nullopt;
}

std::optional<std::string> EnvNameProblem(std::string_view name) {
  auto head = [](char c) { return c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); };
  bool ok = !name.empty() && head(name.front());
  for (char c : name) ok = ok && (head(c) || (c >= '0' && c <= '9'));
  if (ok) return std::nullopt;
  return "invalid variable name " + Quoted(name) + " (expected [A-Za-z_][A-Za-z0-9_]*)";
}

std::optional<std::string> CheckPath(std::string& path, PathRule rule) {
  if (path.empty()) return "empty path";
  for (unsigned char c : path) {
    if (c < ' ' || c == 0x7f) return "contains a control character";
  }

  const bool tilde = path.front() == '~';
  if (tilde) {
    if (path != "~" && path.compare(0, 2, "~/") != 0) {
      return "only ~ and ~/... are supported, not ~user (" + Quoted(path) + ")";
    }
    if (rule == PathRule::kWorkspace || rule == PathRule::kProtect) {
      return "~ is not allowed here (" + Quoted(path) + ")";
    }
  }

  // ".." could climb out of the workspace or make one entry alias another;
  // every entry must name its target directly.
  for (std::size_t start = 0; start <= path.size();) {
    std::size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (path.compare(start, end - start, "..") == 0) {
      return "\"..\" components are not allowed (" + Quoted(path) + ")";
    }
    start = end + 1;
  }

  if (path.find_first_of("*?[") != std::string::npos) {
    if (rule != PathRule::kDeny) return "globs are not allowed here (" + Quoted(path) + ")";
    std::size_t open = path.find('[');
    while (open != std::string::npos) {
      std::size_t close = path.find(']', open + 1);
      if (close == std::string::npos) return "unterminated [ in " + Quoted(path);
      open = path.find('[', close + 1);
    }
  }

  const bool absolute = path.front() == '/';
  if (rule == PathRule::kWorkspace && !absolute) {
    return "must be an absolute path (" + Quoted(path) + ")";
  }
  if (rule == PathRule::kReadOnly && !absolute && !tilde) {
    return "must be an absolute path or start with ~/ (" + Quoted(path) + ")";
  }

  std::string normal;
  normal.reserve(path.size());
  for (char c : path) {
    if (c == '/' && !normal.empty() && normal.back() == '/') continue;
    normal.push_back(c);
  }
  if (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  if (rule == PathRule::kReadOnly && normal == "/") {
    // The mount plan builds a fresh root from named trees; the host's own
    // root in their place would bring in everything the policy does not name.
    return "\"/\" would bind the host's whole root into the sandbox: every user's files, and every unix "
           "socket on the host (a read-only mount does not stop connect() to a daemon's socket); list the "
           "directories the command needs instead";
  }
  path = std::move(normal);
  return std::nullopt;
}

bool IsValidUtf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    auto byte = static_cast<unsigned char>(text[i]);
    std::size_t extra = 0;
    std::uint32_t cp = 0;
    if (byte < 0x80) {
      ++i;
      continue;
    } else if ((byte & 0xe0) == 0xc0) {
      extra = 1;
      cp = byte & 0x1f;
    } else if ((byte & 0xf0) == 0xe0) {
      extra = 2;
      cp = byte & 0x0f;
    } else if ((byte & 0xf8) == 0xf0) {
      extra = 3;
      cp = byte & 0x07;
    } else {
      return false;
    }
    if (i + extra >= text.size()) return false;
    for (std::size_t k = 1; k <= extra; ++k) {
      auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (next & 0x3f);
    }
    // Overlong forms, UTF-16 surrogates and values past U+10FFFF.
    static constexpr std::uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) return false;
    i += extra + 1;
  }
  return true;
}

std::string FormatNumber(double value) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  if (ec != std::errc()) return "0";
  return std::string(buf, end);
}

std::string FormatSize(std::uint64_t bytes) {
  struct Unit {
    const char* name;
    std::uint64_t size;
  };
  // Largest unit that divides exactly, binary first: memory is usually
  // thought of in MiB/GiB. "B" keeps odd byte counts unambiguous.
  static constexpr Unit kUnits[] = {
      {"Ti", 1ULL << 40},      {"Gi", 1ULL << 30},  {"Mi", 1ULL << 20}, {"Ki", 1ULL << 10},
      {"T", 1000'000'000'000}, {"G", 1000'000'000}, {"M", 1000'000},    {"K", 1000},
  };
  for (const Unit& unit : kUnits) {
    if (bytes % unit.size == 0) return std::to_string(bytes / unit.size) + unit.name;
  }
  return std::to_string(bytes) + "B";
}

std::string FormatDurationMs(std::uint64_t ms) {
  if (ms % 3'600'000 == 0) return std::to_string(ms / 3'600'000) + "h";
  if (ms % 60'000 == 0) return std::to_string(ms / 60'000) + "m";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

}  // namespace agentbox::policy_internal
