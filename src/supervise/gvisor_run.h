// A run on gVisor (Backend::kGvisor): see gvisor_run.cc.
#pragma once

#include <string>
#include <vector>

#include "agentbox/confine.h"
#include "agentbox/outcome.h"
#include "agentbox/plan.h"
#include "agentbox/run.h"

namespace agentbox::supervise {

// Runs `argv` under the plan on runsc and classifies the outcome as a
// namespaces run does (timeout, OOM from the run cgroup's counter, denials
// from stderr; runsc's own failures as sandbox_error, stage "gvisor").
Outcome RunGvisor(const Plan& plan, const std::vector<std::string>& argv,
                  const std::vector<Signature>& denial_signatures, const RunOptions& options);

// Removes the bundles under `parent` whose supervisor is gone (a kill -9
// leaves its bundle directory; runsc and its sandbox died with it).
std::vector<std::string> CollectGvisorBundles(const std::string& parent);

// A bundle directory: <parent>/agentbox-gvisor-<supervisor pid>-XXXXXX.
inline constexpr const char* kGvisorBundlePrefix = "agentbox-gvisor-";

}  // namespace agentbox::supervise
