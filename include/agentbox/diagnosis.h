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

}  // namespace agentbox
