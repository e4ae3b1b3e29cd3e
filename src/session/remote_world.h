// A session's world on another host (sandbox.isolation: remote).
//
// The files and the processes of a session move together: bash, the file
// tools and code mode all run in one world on the remote, reached over one
// byte stream. Over SSH that stream is the system's `ssh` client's stdio
// (the user's agent, configuration and known_hosts; strict host key
// checking, never an automatic accept), at whose far end runs
//
//   agentbox __world --stdio
//
// installed on first use into the remote's cache directory by digest. The
// remote agentbox confines the policy with its own host's enforcement (its
// Landlock, seccomp, namespaces, cgroups, its proxy and credentials) and
// says what it enforced; a remote that cannot enforce the policy refuses
// with its own reason. The daemon keeps the log, the recipe and the secrets'
// sources (brain); the remote gets the secrets' values over the stream
// only, in memory (hands).
//
// Protocol, after the remote's shell has run the install script:
//   remote → caller  kWorld {"t":"hello","pid":N,"version":V}
//   caller → remote  kRequest {policy_yaml, level, workspace, session}
//   remote → caller  kWorld {"t":"confined","confined":{...}} or kFailure
// then the frames of a relayed world (session/relayed_world.cc), as a
// microVM's or a gVisor sandbox's.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "agentbox/confine.h"
#include "agentbox/plan.h"
#include "agentbox/status.h"

namespace agentbox::session {

// The stage of the errors of a remote world.
inline constexpr const char* kRemoteStage = "remote";

// `agentbox __world --stdio`: the remote end. Returns the exit status.
int RemoteStdioMain();

// The caller's side, in the `__world` process spawned for a plan with
// `remote` (world_main.cc): connects, provisions, relays.
int RemoteWorldMain(const Plan& plan);

// A session's changes on the remote, worked on there by the remote agentbox
// (`agentbox __remote-layers`, over a connection of its own: ssh, installing
// the binary first as a world's connection does, or exec in the session's
// claimed pod): `request` is
//   {"op": "diff", "all", "exclude": [...], "max_patch_bytes"}
//   {"op": "apply", "all", "exclude": [...], "protect": [...]}
//   {"op": "snapshot", "snapshot": ID}       kept in the remote's
//                                            remote-snapshots/ID, beyond the session
//   {"op": "seed", "snapshot": ID}           the session's copy made from it
//   {"op": "drop_snapshot", "snapshot": ID}  removed there
// with ComputeDiff's or ApplyChanges' JSON as the answer (layers.h),
// computed on the remote's copy against its workspace; a snapshot answers
// {snapshot, created, entries}, seed {seeded}, drop {dropped}. The request
// is one kRequest frame, the answer kResult frames.
Result<nlohmann::json> RemoteLayers(const RemotePlan& remote, nlohmann::json request);

// `agentbox __remote-layers`: the remote end (the request on stdin, the
// answer on stdout). Returns the exit status.
int RemoteLayersMain();

// Removes a session's state on the remote (its copy of the workspace) over
// a connection of its own. An error names the host and what ssh said.
Status ForgetRemoteSession(const RemotePlan& remote);

// A confined command as JSON and back: the remote's plan and enforcement
// report travel to the caller, whose calls report them.
nlohmann::json ConfinedToJson(const ConfinedCommand& confined);
Result<ConfinedCommand> ConfinedFromJson(const nlohmann::json& j);

// The binary a remote gets for the agentbox at `exe`: its stripped copy
// beside it (the build's remote/agentbox, an installation's
// lib/agentbox/remote/agentbox) when there is one, else `exe` itself.
std::string RemoteBinaryFor(const std::string& exe);

// The ssh command line that runs `remote_command` on the plan's host:
// batch mode (no prompt), strict host key checking, no forwarding of any
// kind (agent, X11, ports), no escape character. Pure, for tests.
std::vector<std::string> SshArgv(const RemotePlan& remote, const std::string& remote_command);

// The POSIX shell script the remote runs first: checks the installed
// binary's digest, asks for it when absent or different ("need") and
// installs what it is sent only when its digest matches, then execs
// `__world --stdio`. Pure, for tests.
// `command` is what the script execs once the binary is there
// ("__world --stdio", "__remote-layers").
std::string InstallScript(const std::string& sha256_hex, std::uint64_t size, const std::string& machine,
                          const std::string& command = "__world --stdio");

}  // namespace agentbox::session
