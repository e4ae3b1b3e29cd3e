// Value rules shared by the policy file parser and the command-line
// overrides, so that `--allow-domain` and `network.allow` accept the same
// things. Each check returns what is wrong (for the caller to prefix with a
// file location or a flag name), or nothing when the value is fine.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "agentbox/policy.h"

namespace agentbox::policy_internal {

enum class DomainList { kAllow, kDeny };
// Light syntax check of a host pattern: `host`, `*.suffix`, `[v6]`, CIDR,
// each with an optional `:port`. The allow list refuses over-broad wildcards.
std::optional<std::string> DomainProblem(std::string_view pattern, DomainList list);

// Environment variable names: [A-Za-z_][A-Za-z0-9_]*.
std::optional<std::string> EnvNameProblem(std::string_view name);

// Which filesystem list a path belongs to; each accepts different forms.
enum class PathRule {
  kWorkspace,  // absolute only
  kReadOnly,   // absolute or ~, ~/...; not "/" (the host root would replace the fresh one)
  kDeny,       // absolute, ~/..., or workspace-relative; globs allowed
  kProtect,    // absolute or workspace-relative
};
// Checks `path` against `rule` and normalises it in place (no duplicate or
// trailing slashes). `~` is kept as written: it is expanded outside the
// policy layer, where $HOME is known.
std::optional<std::string> CheckPath(std::string& path, PathRule rule);

bool IsValidUtf8(std::string_view text);

// Canonical text forms used by ToYaml; each parses back to the same value.
std::string FormatNumber(double value);          // shortest round-trip form: "0.5", "2"
std::string FormatSize(std::uint64_t bytes);     // "512Mi", "1G", "1234B"
std::string FormatDurationMs(std::uint64_t ms);  // "45m", "90s", "250ms"

}  // namespace agentbox::policy_internal

namespace agentbox::policy_internal {

// CredentialsInSandbox has a single value today, so the public header names
// no ToString for it; the parser and ToYaml share this one.
inline const char* CredentialsInSandboxName(CredentialsInSandbox) { return "none"; }

}  // namespace agentbox::policy_internal
