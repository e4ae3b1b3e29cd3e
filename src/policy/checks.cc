#include "policy/checks.h"

#include <algorithm>
#include <cctype>
#include <array>
#include <charconv>
#include <cstdint>
#include <string>
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

bool IsAsciiLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

char Lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

// RFC 9110 tchar: the characters of a token (method, field name).
bool IsTchar(char c) {
  static constexpr std::string_view kPunct = "!#$%&'*+-.^_`|~";
  return IsAsciiLetter(c) || IsDigit(c) || kPunct.find(c) != std::string_view::npos;
}

bool HasControl(std::string_view text) {
  for (unsigned char c : text) {
    if (c < ' ' || c == 0x7f) return true;
  }
  return false;
}

// The label rules NormaliseHost (net/rules.h) applies to a lower-case ASCII
// name, with the same reasons.
std::optional<std::string> LabelProblem(std::string_view name, std::string_view as_written) {
  if (name.empty()) return "empty host name";
  if (name.size() > 253) return "host name longer than 253 characters";
  std::string_view last;
  for (std::size_t start = 0; start <= name.size();) {
    std::size_t dot = name.find('.', start);
    if (dot == std::string_view::npos) dot = name.size();
    std::string_view label = name.substr(start, dot - start);
    if (label.empty()) return "empty label in " + Quoted(as_written);
    if (label.size() > 63) return "label longer than 63 characters in " + Quoted(as_written);
    if (label.front() == '-' || label.back() == '-') {
      return "label starts or ends with '-' in " + Quoted(as_written);
    }
    for (char c : label) {
      if (!(c >= 'a' && c <= 'z') && !IsDigit(c) && c != '-' && c != '_') {
        return std::string("character '") + c + "' is not allowed in a host name (" + Quoted(as_written) + ")";
      }
    }
    last = label;
    start = dot + 1;
  }
  // "127.1" and "2130706433" are IPv4 addresses to every resolver.
  bool numeric = std::all_of(last.begin(), last.end(), IsDigit);
  if (numeric || (last.size() > 2 && last[0] == '0' && last[1] == 'x')) {
    return Quoted(as_written) + " is, or reads as, an IP address: a host name is required here";
  }
  return std::nullopt;
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

std::optional<std::string> EnvPassProblem(std::string_view entry) {
  if (entry.find('*') == std::string_view::npos) return EnvNameProblem(entry);
  auto name_char = [](char c) {
    return c == '_' || c == '*' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
  };
  bool ok = !(entry.front() >= '0' && entry.front() <= '9');
  for (char c : entry) ok = ok && name_char(c);
  if (ok) return std::nullopt;
  return "invalid variable pattern " + Quoted(entry) + " (expected [A-Za-z_][A-Za-z0-9_]* with * as the only wildcard)";
}

std::optional<std::string> CacheNameProblem(std::string_view name) {
  auto lead = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  bool ok = !name.empty() && name.size() <= 64 && lead(name.front());
  for (char c : name) ok = ok && (lead(c) || c == '_' || c == '.' || c == '-');
  if (ok) return std::nullopt;
  return "invalid cache name " + Quoted(name) + " (expected [a-z0-9][a-z0-9_.-]*, at most 64 characters)";
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
    if (rule == PathRule::kHomeImport) {
      return "relative to the home directory already: write " + Quoted(path == "~" ? "" : path.substr(2)) +
             " without ~/";
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
  if (rule == PathRule::kHomeImport && absolute) {
    return "must be relative to the home directory, not absolute (" + Quoted(path) + ")";
  }
  if ((rule == PathRule::kReadOnly || rule == PathRule::kFile || rule == PathRule::kReadWrite) && !absolute &&
      !tilde) {
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
  if (rule == PathRule::kReadWrite && (normal == "/" || normal == "~")) {
    return Quoted(normal) + " would make " + (normal == "/" ? "the host's whole root" : "the caller's whole home") +
           " writable from the sandbox; name the directories the command writes";
  }
  if (rule == PathRule::kHomeImport) {
    for (std::size_t start = 0; start <= normal.size();) {
      std::size_t end = normal.find('/', start);
      if (end == std::string::npos) end = normal.size();
      if (normal.compare(start, end - start, ".") == 0) {
        return "\".\" components are not allowed (" + Quoted(path) + "): name a file or directory in the home";
      }
      start = end + 1;
    }
  }
  if (rule == PathRule::kFile && (normal == "/" || normal == "~")) {
    return "must name a file, not a directory (" + Quoted(path) + ")";
  }
  path = std::move(normal);
  return std::nullopt;
}

}  // namespace agentbox::policy_internal

namespace agentbox {

bool EnvPatternMatch(std::string_view pattern, std::string_view name) {
  if (pattern.find('*') == std::string_view::npos) return pattern == name;
  // agentbox's own variables (the plan a wrapped command carries) are
  // nobody's to pass by a pattern.
  if (name.substr(0, 9) == "AGENTBOX_") return false;
  // Nor the proxy variables: where the sandbox has a proxy, they are the
  // egress path agentbox gives it (NO_PROXY would route around it); where
  // it has none, there is no way out for a caller's proxy to lead to.
  for (std::string_view proxy : {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
                                 "all_proxy", "no_proxy"}) {
    if (name == proxy) return false;
  }
  // Greedy match with backtracking to the last star: linear enough for names.
  std::size_t p = 0, n = 0, star = std::string_view::npos, mark = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p;
      ++n;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      n = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace agentbox

namespace agentbox::policy_internal {

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

// ---- Credentials and HTTP rules ---------------------------------------------

std::optional<std::string> SecretNameProblem(std::string_view name) {
  bool ok = !name.empty() && name.size() <= 64 && (IsAsciiLetter(name.front()) || name.front() == '_');
  for (char c : name) ok = ok && (IsAsciiLetter(c) || IsDigit(c) || c == '_' || c == '-');
  if (ok) return std::nullopt;
  return "invalid secret name " + Quoted(name) + " (expected [A-Za-z_][A-Za-z0-9_-]{0,63})";
}

std::optional<std::string> CheckHostName(std::string& host, HostPattern pattern) {
  const std::string written = host;
  if (host.empty()) return "empty host name";
  for (unsigned char c : host) {
    if (c <= ' ' || c == 0x7f) return "contains whitespace or a control character";
  }
  for (unsigned char c : host) {
    if (c >= 0x80) {
      return Quoted(written) + " is not ASCII: write an internationalised name in its A-label form (xn--...)";
    }
  }
  if (host.find("://") != std::string::npos) return "a host name, not a URL (" + Quoted(written) + ")";
  if (host.front() == '[' || std::count(host.begin(), host.end(), ':') > 1) {
    return Quoted(written) + " is an IP address: a host name is required here";
  }
  if (host.find(':') != std::string::npos) return "no port here (" + Quoted(written) + ")";
  if (host.find('/') != std::string::npos) return Quoted(written) + " is not a host name";

  for (char& c : host) c = Lower(c);
  if (host.size() > 1 && host.back() == '.') host.pop_back();
  std::string_view name = host;
  if (host.find('*') != std::string::npos) {
    if (pattern == HostPattern::kExact) return "no wildcard here: an exact host name (got " + Quoted(written) + ")";
    if (host == "*") return Quoted(written) + " would match every host";
    // Shape ("*." first, once) and breadth ("*.com") as network.allow has them.
    if (auto problem = DomainProblem(host, DomainList::kAllow)) return problem;
    name.remove_prefix(2);
  }
  return LabelProblem(name, written);
}

std::optional<std::string> PathPatternProblem(std::string_view path) {
  if (path.empty()) return "empty path";
  if (path.front() != '/') return "a path must start with \"/\" (got " + Quoted(path) + ")";
  // Escaped dots decoded, so that "%2e%2e" is seen as the ".." it is.
  std::string dots;
  for (std::size_t i = 0; i < path.size(); ++i) {
    auto c = static_cast<unsigned char>(path[i]);
    if (c <= ' ' || c == 0x7f) return "contains whitespace or a control character (" + Quoted(path) + ")";
    if (c >= 0x80) return "contains a character that is not ASCII: write it percent-encoded (" + Quoted(path) + ")";
    if (c == '?') return "no query (\"?\") here: a rule matches the path alone (" + Quoted(path) + ")";
    if (c == '#') return "no fragment (\"#\") here: requests do not carry one (" + Quoted(path) + ")";
    // Servers disagree about these; the proxy refuses requests that hold them.
    if (c == '\\') return "no backslash (some servers read it as \"/\") in " + Quoted(path);
    if (c != '%') {
      dots += static_cast<char>(c);
      continue;
    }
    int hi = i + 2 < path.size() ? HexValue(path[i + 1]) : -1;
    int lo = hi >= 0 ? HexValue(path[i + 2]) : -1;
    if (lo < 0) return "bad percent-encoding in " + Quoted(path);
    int value = hi * 16 + lo;
    if (value == '/' || value == '\\') return "no encoded slash or backslash (%2F, %5C) in " + Quoted(path);
    if (value < 0x20 || value == 0x7f) return "no encoded control character in " + Quoted(path);
    dots += value == '.' ? std::string(".") : std::string(path.substr(i, 3));
    i += 2;
  }
  std::string_view rest = std::string_view(dots).substr(1);
  for (std::size_t start = 0; start <= rest.size();) {
    std::size_t slash = rest.find('/', start);
    const bool last = slash == std::string_view::npos;
    if (last) slash = rest.size();
    std::string_view segment = rest.substr(start, slash - start);
    // A trailing "/" is an empty last segment, and significant; "//" is not.
    if (segment.empty() && !last) return "empty segment (\"//\") in " + Quoted(path);
    // Servlet containers drop ";params" before routing: "..;x" is "..".
    std::string_view bare = segment.substr(0, segment.find(';'));
    if (bare == "." || bare == "..") return "\".\" and \"..\" segments are not allowed (" + Quoted(path) + ")";
    if (!segment.empty() && bare.empty()) return "a segment of only ;params in " + Quoted(path);
    if (segment != "**" && segment.find("**") != std::string_view::npos) {
      return "\"**\" must be a whole segment, as in \"/a/**\" (got " + Quoted(path) + ")";
    }
    start = slash + 1;
  }
  return std::nullopt;
}

std::optional<std::string> HttpRuleProblem(std::string_view rule) {
  std::size_t space = rule.find(' ');
  if (space == std::string_view::npos || space == 0) {
    return "expected \"METHOD /path\", e.g. \"GET /repos/**\" (got " + Quoted(rule) + ")";
  }
  std::string_view method = rule.substr(0, space);
  if (method != "*") {
    for (char c : method) {
      if (c == '*') return "\"*\" stands alone for any method (got " + Quoted(method) + ")";
      if (c >= 'a' && c <= 'z') return "the method must be upper case (got " + Quoted(method) + ")";
      if (!IsTchar(c)) return "not an HTTP method: " + Quoted(method);
    }
  }
  return PathPatternProblem(rule.substr(space + 1));
}

std::optional<std::string> CheckSshDestination(const std::string& destination) {
  if (destination.empty()) return "must not be empty";
  if (destination[0] == '-') return "must not start with '-' (ssh would read it as an option)";
  for (char c : destination) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == '@' ||
                    c == ':' || c == '[' || c == ']';
    if (!ok) {
      return std::string("holds '") + c + "': a destination is [user@]host[:port] (letters, digits, . - _ @ : [ ])";
    }
  }
  // A port after the host: host:port or [v6]:port.
  const auto close = destination.find(']');
  const auto colon = close != std::string::npos ? destination.find(':', close)
                     : std::count(destination.begin(), destination.end(), ':') == 1 ? destination.find(':')
                                                                                     : std::string::npos;
  if (colon != std::string::npos) {
    const std::string port = destination.substr(colon + 1);
    unsigned value = 0;
    auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (port.empty() || ec != std::errc() || ptr != port.data() + port.size() || value < 1 || value > 65535) {
      return "has the port '" + port + "' (a port is 1-65535)";
    }
  }
  const auto at = destination.find('@');
  if (at != std::string::npos && (at == 0 || destination.find('@', at + 1) != std::string::npos ||
                                  at + 1 == destination.size())) {
    return "is not [user@]host[:port]";
  }
  return std::nullopt;
}

std::optional<std::string> CheckKubernetesName(const std::string& name) {
  if (name.empty()) return "must not be empty";
  if (name.size() > 63) return "is longer than 63 characters (a Kubernetes name is a DNS label)";
  for (char c : name) {
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '-')) {
      return "\"" + name + "\" is not a DNS label (lower-case letters, digits and '-')";
    }
  }
  if (name.front() == '-' || name.back() == '-') return "\"" + name + "\" must start and end with a letter or digit";
  return std::nullopt;
}

std::optional<std::string> CheckGitRemote(std::string& remote) {
  const std::string written = remote;
  auto has_scheme = [&](std::string_view scheme) {
    return EqualsIgnoringCase(std::string_view(remote).substr(0, scheme.size()), scheme);
  };
  if (has_scheme("http://")) {
    return "credentials are never sent over plain HTTP: use https:// (" + Quoted(written) + ")";
  }
  if (!has_scheme("https://")) {
    return "must be an https:// URL, e.g. \"https://github.com/acme/*\" (got " + Quoted(written) + ")";
  }
  std::string_view rest = std::string_view(remote).substr(8);
  std::size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  if (authority.find('@') != std::string_view::npos) {
    return "no user name or password in a remote: they come from credentials.secrets (" + Quoted(written) + ")";
  }
  std::string port;
  std::string host(authority);
  if (std::size_t colon = authority.rfind(':');
      colon != std::string_view::npos && authority.front() != '[' &&
      authority.find(':') == colon) {
    std::string_view port_text = authority.substr(colon + 1);
    if (!IsPort(port_text)) return "bad port " + Quoted(port_text) + " (expected 1-65535) in " + Quoted(written);
    port = std::to_string(std::stoul(std::string(port_text)));  // "08443" → "8443"
    if (port == "443") port.clear();                             // the https default, as a remote matches
    host = std::string(authority.substr(0, colon));
  }
  if (auto problem = CheckHostName(host, HostPattern::kExact)) return problem;
  if (path.empty() || path == "/") {
    return "needs a path after the host, e.g. \"https://github.com/acme/*\" (got " + Quoted(written) + ")";
  }
  if (auto problem = PathPatternProblem(path)) return problem;
  remote = "https://" + host + (port.empty() ? "" : ":" + port) + std::string(path);
  return std::nullopt;
}

std::optional<std::string> RefPatternProblem(std::string_view ref) {
  if (ref.substr(0, 5) != "refs/" || ref.size() == 5) {
    return "must be a full ref name starting with \"refs/\", e.g. \"refs/heads/agent/*\" (got " + Quoted(ref) + ")";
  }
  for (unsigned char c : ref) {
    if (c <= ' ' || c == 0x7f) return "contains whitespace or a control character (" + Quoted(ref) + ")";
    if (c == '?' || c == '[' || c == ']') return "\"*\" is the only glob character (got " + Quoted(ref) + ")";
    if (c == '~' || c == '^' || c == ':' || c == '\\') {
      return std::string("'") + static_cast<char>(c) + "' is not allowed in a git ref name (" + Quoted(ref) + ")";
    }
  }
  if (ref.find("..") != std::string_view::npos || ref.find("//") != std::string_view::npos ||
      ref.back() == '/' || ref.find("@{") != std::string_view::npos) {
    return "not a git ref name: \"..\", \"//\", \"@{\" and a trailing \"/\" are refused (" + Quoted(ref) + ")";
  }
  for (std::size_t start = 0; start < ref.size();) {
    std::size_t slash = std::min(ref.find('/', start), ref.size());
    std::string_view segment = ref.substr(start, slash - start);
    if (segment != "**" && segment.find("**") != std::string_view::npos) {
      return "\"**\" must be a whole segment, as in \"refs/heads/agent/**\" (got " + Quoted(ref) + ")";
    }
    start = slash + 1;
  }
  return std::nullopt;
}

std::optional<std::string> HeaderNameProblem(std::string_view name) {
  if (name.empty()) return "empty header name";
  for (char c : name) {
    if (!IsTchar(c)) return "not an HTTP header name (RFC 9110 token): " + Quoted(name);
  }
  // These decide how the request is framed or where it goes: a secret there
  // would change the request's meaning, not authenticate it.
  static constexpr std::array<std::string_view, 9> kFraming = {
      "host", "content-length", "transfer-encoding", "connection", "upgrade",
      "te",   "trailer",        "keep-alive",        "proxy-connection"};
  for (std::string_view framing : kFraming) {
    if (EqualsIgnoringCase(name, framing)) {
      return Quoted(name) + " frames or routes the request; it cannot carry a secret";
    }
  }
  return std::nullopt;
}

std::optional<std::string> HeaderFormatProblem(std::string_view format) {
  if (HasControl(format)) return "contains a control character (CR, LF, NUL, tab, ...)";
  std::size_t first = format.find("{}");
  if (first == std::string_view::npos || format.find("{}", first + 2) != std::string_view::npos) {
    return "must hold \"{}\" (where the secret goes) exactly once (got " + Quoted(format) + ")";
  }
  return std::nullopt;
}

std::optional<std::string> BasicUsernameProblem(std::string_view username) {
  if (username.empty()) return "must not be empty";
  if (HasControl(username)) return "contains a control character";
  if (username.find(':') != std::string_view::npos) {
    return "must not contain \":\" (it ends the user name in user:password)";
  }
  return std::nullopt;
}

std::optional<std::string> EnvSecretProblem(const SecretSpec& secret, CredentialsInSandbox in_sandbox,
                                            std::string_view name, EnvUse use) {
  const std::string where = "credentials.secrets." + secret.name;
  if (use == EnvUse::kPass && name.find('*') != std::string_view::npos) {
    const std::string matched = !secret.placeholder_env.empty() && EnvPatternMatch(name, secret.placeholder_env)
                                    ? secret.placeholder_env
                                    : in_sandbox == CredentialsInSandbox::kNone &&
                                              secret.from.kind == SecretSource::Kind::kEnv &&
                                              EnvPatternMatch(name, secret.from.env)
                                          ? secret.from.env
                                          : "";
    if (matched.empty()) return std::nullopt;
    return "the pattern " + Quoted(name) + " matches " + matched + ": " +
           *EnvSecretProblem(secret, in_sandbox, matched, use);
  }
  if (!secret.placeholder_env.empty() && name == secret.placeholder_env) {
    return std::string(name) + " is " + where + ".placeholder_env: " +
           (use == EnvUse::kSet ? "a value here would replace the placeholder"
                                : "the sandbox gets the placeholder there, not the caller's value");
  }
  if (in_sandbox == CredentialsInSandbox::kNone && secret.from.kind == SecretSource::Kind::kEnv &&
      name == secret.from.env) {
    return std::string(name) + " is the source of " + where +
           "; with credentials.in_sandbox: none it never enters the sandbox";
  }
  return std::nullopt;
}

std::optional<std::string> SecretsModeProblem(Mode mode, const CredentialsSpec& credentials) {
  if (mode != Mode::kDangerFullAccess || credentials.secrets.empty()) return std::nullopt;
  return "secrets are refused with mode: danger-full-access: the command runs on the host with the caller's "
         "environment, and nothing keeps a secret out of it";
}

std::optional<std::string> InspectTlsProblem(const NetworkSpec& network) {
  if (network.tls_sni_check || (!network.inspect_tls_all && network.inspect_tls.empty())) return std::nullopt;
  return "inspect_tls keeps the SNI check, which tls_sni_check: false turns off";
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

std::optional<std::string> GrantPathProblem(std::string_view path, const std::vector<std::string>& deny) {
  auto within = [](std::string_view p, std::string_view root) {
    return p == root || (p.size() > root.size() && p.compare(0, root.size(), root) == 0 && p[root.size()] == '/');
  };
  auto check = [&](const std::string& entry, const char* list) -> std::optional<std::string> {
    const std::string why = "\"" + std::string(path) + "\" is never granted: " + list + " \"" + entry + "\"";
    if (entry.rfind("**/", 0) == 0 && entry.find_first_of("*?[", 3) == std::string::npos) {
      const std::string name = entry.substr(3);
      for (std::size_t start = 0; start < path.size();) {
        std::size_t end = path.find('/', start);
        if (end == std::string_view::npos) end = path.size();
        if (path.substr(start, end - start) == name) return why + " hides it";
        start = end + 1;
      }
      return std::nullopt;
    }
    if (entry.find_first_of("*?[") != std::string::npos) return std::nullopt;
    if (entry[0] != '/' && entry[0] != '~') return std::nullopt;  // workspace-relative
    if (within(path, entry)) return why + " covers it";
    return std::nullopt;
  };
  for (const std::string& entry : NeverGrantedPaths()) {
    if (auto problem = check(entry, "the built-in credential path")) return problem;
  }
  for (const std::string& entry : deny) {
    if (auto problem = check(entry, "filesystem.deny")) return problem;
  }
  return std::nullopt;
}

std::optional<std::string> ParseUpstreamUrl(const std::string& url, UpstreamUrl& parsed) {
  UpstreamUrl out;
  std::string rest;
  if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else if (url.rfind("https://", 0) == 0) {
    out.tls = true;
    rest = url.substr(8);
  } else {
    return "\"" + url + "\" is not an http:// or https:// URL";
  }
  if (rest.find('#') != std::string::npos) return "\"" + url + "\": a URL with a fragment";
  const auto path_at = rest.find_first_of("/?");
  std::string authority = rest.substr(0, path_at);
  out.target = path_at == std::string::npos ? "/" : rest.substr(path_at);
  if (out.target.front() == '?') out.target = "/" + out.target;
  if (authority.find('@') != std::string::npos) {
    return "\"" + url + "\": user info in the URL is refused; give the credential as secret";
  }
  std::string port;
  if (!authority.empty() && authority.front() == '[') {
    const auto close = authority.find(']');
    if (close == std::string::npos) return "\"" + url + "\": an unclosed [ in the host";
    out.host = authority.substr(1, close - 1);
    const std::string after = authority.substr(close + 1);
    if (!after.empty() && after.front() != ':') return "\"" + url + "\": text after the host's ]";
    if (!after.empty()) port = after.substr(1);
  } else {
    const auto colon = authority.rfind(':');
    out.host = authority.substr(0, colon);
    if (colon != std::string::npos) port = authority.substr(colon + 1);
  }
  if (out.host.empty()) return "\"" + url + "\" has no host";
  if (port.empty()) {
    port = out.tls ? "443" : "80";
  } else {
    const bool digits = port.size() <= 5 && std::all_of(port.begin(), port.end(), [](unsigned char c) { return std::isdigit(c); });
    if (!digits || std::stoi(port) < 1 || std::stoi(port) > 65535) {
      return "\"" + url + "\": port '" + port + "' is not 1-65535";
    }
  }
  out.port = port;
  parsed = std::move(out);
  return std::nullopt;
}


}  // namespace agentbox::policy_internal
