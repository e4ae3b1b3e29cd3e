// Credentials outside the box, before the launch: the secrets' store
// (environment sources are taken now, before anything is forked), the TLS
// terminator with its per-run CA, the sandbox's trust bundle and the
// placeholder variables.
#pragma once

#include <memory>

#include "agentbox/plan.h"
#include "agentbox/status.h"

namespace agentbox::net {
class SecretStore;
class Terminator;
}

namespace agentbox::supervise {

// Nothing (null) when the plan terminates no TLS. Otherwise fills in the
// plan: the kFile mount of the bundle gets the CA and the host's trust file
// (namespaces), or the bundle is written to the private directory and the
// trust variables set (landlock-only, after AdoptPrivateDir); each secret's
// placeholder_env gets its placeholder. Errors name the secret or the step.
// `secrets`: values handed over (a session's world); null: a store reading
// the plan's sources.
Result<std::shared_ptr<net::Terminator>> PrepareCredentials(Plan* plan,
                                                            std::shared_ptr<net::SecretStore> secrets = nullptr);

}  // namespace agentbox::supervise
