// `agentbox run --systemd-scope`: where systemd manages the user's session,
// the run re-executes itself under
//   systemd-run --user --scope -p Delegate=yes --quiet -- agentbox run ...
// so that its supervisor starts in a scope systemd delegated to it (a v2
// cgroup the user owns, with the controllers the user manager has). Once
// inside, EnterDelegatedScope (linux/cgroup_delegation.h) moves the
// supervisor into a leaf of the scope so that the run's cgroups, beside the
// leaf, get the controllers (the no-internal-process rule).
//
// AGENTBOX_SYSTEMD_SCOPE=1 marks the re-executed process: it is never
// re-executed again (no loop), whatever the environment says.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace agentbox::supervise {

inline constexpr const char* kSystemdScopeEnv = "AGENTBOX_SYSTEMD_SCOPE";

struct SystemdScopeProbe {
  enum class Answer {
    kReexec,          // a user manager is reachable and systemd-run is there
    kAlreadyInScope,  // this process is the re-executed one
    kUnavailable,     // `reason` says what is missing
  };
  Answer answer = Answer::kUnavailable;
  std::string reason;       // how the manager was found, or why not
  std::string systemd_run;  // its path, for kReexec
};

// Pure but for looking at files beneath `root` ("/" on a host, a fake tree
// in the tests): the environment decides (XDG_RUNTIME_DIR with its
// systemd/private or bus socket, DBUS_SESSION_BUS_ADDRESS, PATH).
SystemdScopeProbe ProbeSystemdScope(const std::map<std::string, std::string>& env, const std::string& root = "/");
// The environment of this process, for ProbeSystemdScope.
std::map<std::string, std::string> CurrentEnvironment();
// systemd-run's argv that runs `self` with `args` (argv[1..]) in a delegated scope.
std::vector<std::string> SystemdScopeArgv(const std::string& systemd_run, const std::string& self,
                                          const std::vector<std::string>& args);

}  // namespace agentbox::supervise
