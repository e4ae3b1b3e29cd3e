// The tool gateway of one session (policy `tools.upstream`, docs/tools.md):
// the upstream MCP servers' allowed tools under one namespace, NAME.TOOL,
// next to the session's own. The daemon starts each server (or opens its
// session, for a Streamable HTTP one) outside every sandbox the first time
// one of its tools is listed or called, holds its credential (given to a
// stdio server in its environment, to an HTTP one as a bearer header on
// each request, never to a sandbox), checks every call's input against the tool's schema before the
// server sees it, and bounds each call by the upstream's timeout.
//
// A tool the policy does not allow does not exist: it is neither listed nor
// callable, whatever the server offers. A server that cannot start, dies or
// does not answer is a `tool_error` naming it; the next call starts it again.
//
// Thread-safety: every method may be called from several threads at once;
// calls to one upstream run concurrently (JSON-RPC ids tell them apart).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agentbox/policy.h"
#include "agentbox/status.h"

namespace agentbox::gateway {

using Json = nlohmann::json;
class Upstream;

// The value of the secret credentials.secrets NAME, read from its source.
using SecretValue = std::function<Result<std::string>(const std::string& name)>;

class Gateway {
 public:
  Gateway(std::vector<UpstreamSpec> upstreams, SecretValue secret, std::size_t output_cap);
  ~Gateway();  // ends every server it started
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // Whether `name` is NAME.TOOL for one of the upstreams (allowed or not).
  bool Routes(const std::string& name) const;

  // The allowed tools of every upstream, started as needed:
  // {"tools": [{name: "NAME.TOOL", description, inputSchema, outputSchema?,
  //   upstream: NAME}], "errors": [{upstream, error}]}. An allowed tool the
  // server does not offer is left out; so is every tool of a server that
  // cannot start (its error is listed).
  Json Tools();

  // Calls NAME.TOOL with `input`. A tool that is not allowed, or that the
  // server does not offer, is an error with stage "bad_request" ("unknown
  // tool"); so is input the tool's schema refuses (the server never sees
  // it). Otherwise a session result: {output, is_error, kind: "ok" |
  // "tool_error", truncated, output_bytes, upstream: {name, tool,
  // content, structuredContent?}}; a server that fails, or answers late,
  // gives kind "tool_error" and an output naming it.
  Result<Json> Call(const std::string& name, const Json& input);

 private:
  struct Slot;
  // The running server of `slot`, started (again) when there is none.
  Result<std::shared_ptr<Upstream>> Running(Slot& slot);
  Result<Json> Listed(Slot& slot);  // its tools/list, filtered by allow (cached)

  std::vector<std::unique_ptr<Slot>> slots_;
  SecretValue secret_;
  std::size_t output_cap_;
};

}  // namespace agentbox::gateway
