// The doctor: for each facility agentbox would use and this host refuses,
// why (a stable cause id) and how to lift it (commands to run). `agentbox
// check` prints these; `check --json` carries them as `diagnosis`.
//
// Diagnose() is a pure function of HostCaps (the probe's raw facts), so each
// cause is tested against a fake host; ProbeHost(kDeep) is what fills in the
// facts that need a real attempt (unshare, a fresh proc, lo up).
#pragma once

#include <string>
#include <vector>

#include "agentbox/host_caps.h"
#include "agentbox/plan.h"

namespace agentbox {

struct Diagnosis {
  std::string facet;   // "user-namespaces", "proc", "network", "processes", "landlock", "seccomp", "cgroups"
  std::string cause;   // a stable id: "apparmor-userns-restricted", "seccomp-refuses-unshare", ...
  std::string detail;  // what was seen on this host
  std::string fix;     // what to run or install to lift it
};

// Where the AppArmor profile comes from (source tree, `make install`) and
// where AppArmor loads it from.
inline constexpr const char* kAppArmorProfileSource = "packaging/apparmor/agentbox";
inline constexpr const char* kAppArmorProfileInstalled = "/etc/apparmor.d/agentbox";

// Every cause that applies, in the order user namespaces, proc, network,
// processes, Landlock, seccomp, cgroups. Empty when nothing stands in the way.
std::vector<Diagnosis> Diagnose(const HostCaps& host);

// `agentbox check`'s text for them: a "diagnosis:" line, then per cause its
// facet, "cause: ID: detail" and "fix: ..." lines.
std::string DiagnosisText(const std::vector<Diagnosis>& diagnosis);

// PATH directories under HOME that a plan leaves out. The sandbox's HOME is
// private (a fresh tmpfs; on the landlock-only backend a directory of its
// own), so a toolchain installed there (pyenv, cargo, nvm, ~/.local/bin) is
// not found inside unless filesystem.read_only binds it. `policy explain`
// says so, and `run` when a command was not found (exit 127).
struct HomePathDirs {
  std::vector<std::string> not_mounted;  // host paths, in PATH order
  // filesystem.read_only as it would bind them: the policy's entries, then
  // the toolchain's directory under HOME for each (~/.pyenv for
  // ~/.pyenv/shims; ~/.local/bin itself, since ~/.local holds user data).
  std::vector<std::string> read_only;
};

// The PATH a plan's command gets: the plan's own, else `host_path` when
// the plan passes PATH through, else "".
std::string PathInside(const EnvRules& env, const std::string& host_path);

// Of `dirs` (host paths, absolute and canonical: the caller resolves PATH's
// entries and drops those that do not exist), those under `home` (not HOME
// itself) that `plan` does not show at their path: no bind covers them (a
// deny mask is a choice, not an omission), or, landlock-only, no rule.
// `read_only_now` is the policy's filesystem.read_only. Pure.
HomePathDirs FindHomePathDirs(const Plan& plan, const std::vector<std::string>& dirs, const std::string& home,
                              const std::vector<std::string>& read_only_now);

// Three lines: each directory, the read_only list that would bind them, a
// caution; each line starts with `prefix`. "" when none is missing.
std::string HomePathDirsText(const HomePathDirs& found, const std::string& prefix);

}  // namespace agentbox
