// Planning of the two defence-in-depth layers stacked on the namespaces:
// Landlock (filesystem) and seccomp (syscalls). Pure, like the rest of
// confine/: the host's abilities come in as numbers, no kernel is asked.
#pragma once

#include <string>
#include <vector>

#include "agentbox/plan.h"

namespace agentbox {

// The newest Landlock ABI this version knows; the oldest it applies. ABI 1
// has no REFER right: every rename or link across directories would fail
// (EXDEV), which breaks git, so the layer starts at ABI 2.
inline constexpr int kNewestLandlockAbi = 7;
inline constexpr int kMinLandlockAbi = 2;

// What Landlock at `abi` cannot restrict that the newest ABI can, in words.
std::vector<std::string> LandlockLeftOut(int abi);

// Rules mirroring `plan.mounts` (which must be final). abi < kMinLandlockAbi
// gives an empty plan (abi 0).
LandlockPlan PlanLandlock(const Plan& plan, int host_abi, bool required);

// The landlock-only backend's rules, on HOST paths (nothing is mounted):
// read+exec on `read_only`, the workspace (read-write when `writable`), the
// usual /dev nodes, read on /proc; TCP connect and bind handled with no
// port allowed (ABI >= 4); signals and abstract unix sockets scoped (ABI >= 6).
// The per-run private directory is added by AdoptPrivateDir().
LandlockPlan PlanLandlockOnly(const std::vector<std::string>& read_only, const std::string& workspace,
                              bool writable, int host_abi, bool required);

// A landlock-only rule for a host tree the policy adds (read_write, a
// cache, an imported dotfile): read+exec, and every write right when
// `writable`; `optional` ones are skipped when absent.
void AddLandlockTree(LandlockPlan* plan, const std::string& path, bool writable, bool optional,
                     const std::string& why);

// Gives a landlock-only plan its per-run private directory `dir` (which
// holds `home` and `tmp`): a read-write Landlock rule, and HOME and TMPDIR
// pointing into it unless the policy sets them.
void AdoptPrivateDir(Plan* plan, const std::string& dir);

// Which network the sandbox's sockets live in. kOwnNamespace: a network
// namespace of its own fences them. kHostNetwork (landlock-only): the
// host's; only TCP may be made (Landlock fences its ports, the runner's
// connect() mediation its addresses), and listen() is mediated.
enum class SocketScope { kOwnNamespace, kHostNetwork };

// The denied syscalls and argument checks (docs/seccomp.md gives the reasons).
SeccompPlan PlanSeccomp(bool host_has_seccomp, SocketScope scope = SocketScope::kOwnNamespace);
// Takes the rules of the syscalls an approved grant allows out of `plan`
// (and lists them in plan->granted); a name SyscallGrantProblem refuses is
// an error naming it, whatever the caller was told.
Status GrantSyscalls(const std::vector<std::string>& names, SeccompPlan* plan);

// The landlock-only plan gets the egress proxy's ports, bound by the
// supervisor on the host's 127.0.0.1 for this run: the plan's
// network.proxy, Landlock's connect rules (those ports only) and the proxy
// variables (unless the policy's env.set names them).
void AdoptProxyPorts(Plan* plan, ProxyPorts ports);

// HTTP_PROXY, HTTPS_PROXY, ALL_PROXY (and lower-case) for `ports` on
// 127.0.0.1, each unless `env` sets it already. `no_proxy` ("" for none):
// NO_PROXY/no_proxy.
void SetProxyEnv(EnvRules* env, const ProxyPorts& ports, const std::string& no_proxy);
// SSL_CERT_FILE, REQUESTS_CA_BUNDLE, NODE_EXTRA_CA_CERTS, GIT_SSL_CAINFO,
// CURL_CA_BUNDLE, CARGO_HTTP_CAINFO and PIP_CERT name `bundle`, unless the
// policy sets one itself.
void SetTrustEnv(EnvRules* env, const std::string& bundle);
// Every variable SetProxyEnv and SetTrustEnv may set (SSL_CERT_DIR too, the
// trust store a world's supervisor is given): what agentbox itself decides
// for a sandbox's egress. A session call may not override them.
const std::vector<std::string>& SandboxEnvNames();

}  // namespace agentbox
