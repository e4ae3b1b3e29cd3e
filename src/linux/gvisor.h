// sandbox.isolation: container — the plan as an OCI bundle for gVisor's runsc.
//
// The mount plan the namespaces backend applies itself becomes the OCI
// spec's root and mounts (runsc's gofer opens them; the Sentry serves the
// command's syscalls), the environment the same scrubbed one, the seccomp
// plan the spec's filter (loaded inside the Sentry with --oci-seccomp). The
// bundle is a directory of the run's: config.json, the root (empty but for
// the plan's symlinks and mount points), runsc's state and log.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agentbox/plan.h"
#include "agentbox/status.h"
#include "linux/resolve.h"

namespace agentbox::linux {

// What the root directory must hold before runsc starts: the plan's
// symlinks and empty directories (mount points on the read-only root are
// runsc's to make).
struct RootEntry {
  std::string path;    // inside, absolute
  std::string target;  // a symlink's target; "" for a directory
};

struct OciSpec {
  nlohmann::json config;               // config.json
  std::vector<RootEntry> root_entries;
  std::vector<std::pair<std::string, std::string>> files;  // bundle-relative name -> contents (kFile)
  std::vector<std::string> left_out;   // plan entries gVisor provides itself or that have no OCI form
};

// The spec for `argv` under the resolved plan, with `env` the command's
// environment. `bundle` is the bundle directory (absolute): the root is
// `bundle`/root; masks are `bundle`/mask-file and mask-dir (mode 0).
// Fails on a plan entry that has no OCI form (an overlay workspace). Rootless,
// a mask over a path this user cannot read is left out (access(2)): runsc's
// gofer, this user, could not open it as a mount point, nor the sandbox read it.
Result<OciSpec> BuildOciSpec(const Plan& plan, const ResolvedPlan& resolved, const std::vector<std::string>& argv,
                             const std::vector<std::string>& env, const std::string& bundle);

// The seccomp plan as an OCI `linux.seccomp` object (rules with no OCI form
// are listed in `left_out`).
nlohmann::json OciSeccomp(const SeccompPlan& seccomp, std::vector<std::string>* left_out);

// Writes the bundle: the root's entries, the files, config.json.
[[nodiscard]] Status WriteBundle(const OciSpec& spec, const std::string& bundle);

// runsc's argv for `run` of the bundle as container `id`, with its state
// under `state` and its log (JSON lines; errors land there) at `log`.
// `netns` "": --network=none (a loopback of the Sentry's only); else
// --network=host, with the spec's network namespace `netns` (see
// JoinNetworkNamespace): the Sentry's sockets are the host kernel's there.
std::vector<std::string> RunscRunArgv(const GvisorPlan& g, const std::string& bundle, const std::string& state,
                                      const std::string& log, const std::string& id, bool oci_seccomp,
                                      const std::string& netns = "");

// The spec's network namespace becomes the one at `path` (runsc joins it).
void JoinNetworkNamespace(OciSpec* spec, const std::string& path);

// runsc's log (--log-format=json): the message of its first "error" line,
// "" when there is none.
std::string RunscError(const std::string& log_text);

}  // namespace agentbox::linux
