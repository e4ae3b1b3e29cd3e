// Value rules shared by the policy file parser and the command-line
// overrides, so that `--allow-domain` and `network.allow` accept the same
// things. Each check returns what is wrong (for the caller to prefix with a
// file location or a flag name), or nothing when the value is fine.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agentbox/policy.h"

namespace agentbox::policy_internal {

enum class DomainList { kAllow, kDeny };
// Light syntax check of a host pattern: `host`, `*.suffix`, `[v6]`, CIDR,
// each with an optional `:port`. The allow list refuses over-broad wildcards.
std::optional<std::string> DomainProblem(std::string_view pattern, DomainList list);

// Environment variable names: [A-Za-z_][A-Za-z0-9_]*.
std::optional<std::string> EnvNameProblem(std::string_view name);
// env.pass entries: a name, or a pattern of name characters and `*`
// (NPM_CONFIG_*, *_PROXY); a pattern must not start with a digit.
std::optional<std::string> EnvPassProblem(std::string_view entry);

// filesystem.caches keys: [a-z0-9][a-z0-9_.-]*, at most 64 characters (a
// directory name under agentbox's cache root).
std::optional<std::string> CacheNameProblem(std::string_view name);

// Which filesystem list a path belongs to; each accepts different forms.
enum class PathRule {
  kWorkspace,  // absolute only
  kReadOnly,   // absolute or ~, ~/...; not "/" (the host root would replace the fresh one)
  kDeny,       // absolute, ~/..., or workspace-relative; globs allowed
  kProtect,    // absolute or workspace-relative
  kFile,       // absolute or ~/...; names a file (not "/" or "~"); no globs
  kReadWrite,  // absolute or ~/...; not "/" or "~" (the host root, the caller's whole home); no globs
  kHomeImport, // relative to the caller's home: not absolute, no ~, no globs, not "."
};
// Checks `path` against `rule` and normalises it in place (no duplicate or
// trailing slashes). `~` is kept as written: it is expanded outside the
// policy layer, where $HOME is known.
std::optional<std::string> CheckPath(std::string& path, PathRule rule);

bool IsValidUtf8(std::string_view text);

// An on_violation.max_grant path (as CheckPath(kReadWrite) left it) that
// no grant could use: it is, or lies under, a built-in credential path
// (NeverGrantedPaths) or an entry of `deny` written the same way (`~/…` or
// absolute), or one of its components is what a `**/NAME` entry hides.
// Workspace-relative and other glob entries are checked when an offer is
// made, against the path denied.
std::optional<std::string> GrantPathProblem(std::string_view path, const std::vector<std::string>& deny);

// ---- Credentials and HTTP rules ---------------------------------------------
//
// Each value below decides where a secret goes or which requests pass, so
// it is checked here, where the file position is still known, rather than
// when the proxy starts.

// Secret names (the keys of credentials.secrets): [A-Za-z_][A-Za-z0-9_-]{0,63}.
std::optional<std::string> SecretNameProblem(std::string_view name);

// A host that receives a secret or carries HTTP rules: a DNS name, never an
// IP literal, a CIDR, a port, a URL or "*" alone. kWildcard also admits
// "*.example.com" (strict subdomains, at least two labels after the star).
// Normalises in place exactly as NormaliseHost (net/rules.h) does for ASCII
// names: lower case, one trailing dot removed, LDH labels (underscore
// tolerated), at most 253 characters, a last label that is not a number.
// Names that are not ASCII are refused rather than mapped: the policy layer
// has no IDNA tables, and a U-label kept as written would never equal the
// A-label the proxy compares with, so its rules would silently not apply.
enum class HostPattern { kExact, kWildcard };
std::optional<std::string> CheckHostName(std::string& host, HostPattern pattern);

// A request path pattern: "/" first; no query ("?"), fragment ("#"),
// whitespace, control or non-ASCII characters; "**" only as a whole segment
// ("*" may be a segment or part of one). Also refused, as the proxy's
// NormaliseRequestPath (net/http_rules.h) refuses them in requests, so that
// a pattern the file accepts is one the proxy can match: a backslash, a bad
// or encoded-slash/backslash/control escape, "//" before the last segment,
// "." and ".." segments (also as %2e, or followed by ";params"), and a
// segment of only ";params".
std::optional<std::string> PathPatternProblem(std::string_view path);

// One network.http_rules[].allow entry: "METHOD /path", METHOD an upper-case
// HTTP token or "*", the path as PathPatternProblem says.
std::optional<std::string> HttpRuleProblem(std::string_view rule);

// A credentials.git.remotes entry: "https://host[:port]/path", the host as
// CheckHostName(kExact) says, the path a PathPatternProblem pattern other
// than "/". Normalises the scheme, host and port in place (":443", the
// default, is dropped).
std::optional<std::string> CheckGitRemote(std::string& remote);
// sandbox.remote.ssh: "[user@]host[:port]" (or an ssh_config Host alias):
// nothing ssh would read as an option or a second argument.
std::optional<std::string> CheckSshDestination(const std::string& destination);
// A Kubernetes object name (an RFC 1123 DNS label: a namespace, a template).
std::optional<std::string> CheckKubernetesName(const std::string& name);

// A tools.upstream[].url, "http(s)://HOST[:PORT][/PATH]" (no user info, no
// fragment, PORT 1-65535, the scheme's by default), split for a client.
struct UpstreamUrl {
  bool tls = false;
  std::string host;    // without brackets
  std::string port;
  std::string target;  // path and query, "/" at least
};
std::optional<std::string> ParseUpstreamUrl(const std::string& url, UpstreamUrl& parsed);

// A credentials.git.push.allow_refs entry: "refs/..." with "*" as the only
// glob character ("**" only as a whole segment) and nothing git refuses in
// a ref name.
std::optional<std::string> RefPatternProblem(std::string_view ref);

// inject.header: an HTTP field name (RFC 9110 token) that does not frame or
// route the request (Host, Content-Length, Transfer-Encoding, ...).
std::optional<std::string> HeaderNameProblem(std::string_view name);
// inject.format: "{}" exactly once, no control characters (CR/LF would split
// the header into two).
std::optional<std::string> HeaderFormatProblem(std::string_view format);
// inject.basic.username: not empty, no ":" (it ends the user name in
// "user:password"), no control characters.
std::optional<std::string> BasicUsernameProblem(std::string_view username);

// Whether giving the sandbox the variable `name` (env.pass, env.set, --env)
// clashes with `secret`: its source under credentials.in_sandbox: none, or
// its placeholder variable. The message names the secret.
// An env.pass pattern (EnvPatternMatch) matches the source or the
// placeholder variable the same way a name equal to it does.
enum class EnvUse { kPass, kSet };
std::optional<std::string> EnvSecretProblem(const SecretSpec& secret, CredentialsInSandbox in_sandbox,
                                            std::string_view name, EnvUse use);

// A policy in `mode` may not hold secrets: danger-full-access runs the
// command on the host, with the caller's environment.
std::optional<std::string> SecretsModeProblem(Mode mode, const CredentialsSpec& credentials);

// network.inspect_tls keeps a connection on the relay for the SNI check;
// with network.tls_sni_check: false there would be no check to keep.
std::optional<std::string> InspectTlsProblem(const NetworkSpec& network);

// Canonical text forms used by ToYaml; each parses back to the same value.
std::string FormatNumber(double value);          // shortest round-trip form: "0.5", "2"
std::string FormatSize(std::uint64_t bytes);     // "512Mi", "1G", "1234B"
std::string FormatDurationMs(std::uint64_t ms);  // "45m", "90s", "250ms"

}  // namespace agentbox::policy_internal

namespace agentbox::policy_internal {

// The public header names no ToString for CredentialsInSandbox; the parser
// and ToYaml share this one.
inline const char* CredentialsInSandboxName(CredentialsInSandbox value) {
  return value == CredentialsInSandbox::kAllow ? "allow" : "none";
}

}  // namespace agentbox::policy_internal
