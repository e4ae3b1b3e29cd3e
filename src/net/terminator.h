// The TLS terminator: for the hosts that hold a secret, that network.http_rules
// cover, or that credentials.git.remotes name, the proxy does not tunnel the
// sandbox's TLS but ends it here (a leaf from the per-run CA), reads each
// HTTP/1.1 request in plaintext, decides it, adds the credential the policy
// gives that host, and sends it on over a TLS connection of its own that is
// verified against the host's trust store.
//
// What is decided per request, in order: the Host field names the CONNECT
// target; the path is well-formed; no secret's placeholder goes to a host
// that is not the secret's; network.http_rules allow the method and path;
// a git push updates only refs credentials.git.push allows. Then each of the
// host's secrets is injected, and every use is recorded (never the value).
// Responses are scanned for the values injected on the connection and any
// occurrence is masked, so an upstream that echoes a request header cannot
// hand a secret back to the sandbox.
//
// Thread-compatible: used on the proxy's io_context thread only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "agentbox/policy.h"
#include "agentbox/status.h"
#include "net/http_rules.h"
#include "net/rules.h"
#include "net/secrets.h"
#include "net/tls.h"

namespace agentbox::net {

// One request seen behind the terminator, for the network log and the report.
struct RequestRecord {
  std::string method;
  std::string path;          // normalised, without the query
  std::string decision;      // "allow", "deny", "error"
  std::string facet;         // deny: "network" (http_rules, bad requests) or "credentials"
  std::string op;            // deny: "request", "send" (a placeholder), "git-push"
  std::string reason;        // named, one line
  std::string rule;          // the entry that decided, when one did
  std::vector<std::string> secrets;  // secrets injected into this request, by name
  int status = 0;            // the upstream's status, or ours when refused

  std::string ToJsonText() const;
};

struct TerminatorOptions {
  std::chrono::milliseconds header_timeout{10000};  // handshakes and each request head
  std::chrono::milliseconds idle_timeout{60000};    // between requests on one connection
  std::size_t header_limit = 64 * 1024;
  std::size_t git_push_limit = 256ull * 1024 * 1024;  // a receive-pack body read whole to check it
  // What all pushes being checked at once may hold together, so that many
  // connections cannot make the supervisor hold many limits' worth.
  std::size_t git_push_budget = 512ull * 1024 * 1024;
  // Terminated connections open at once (each holds two TLS connections,
  // ~120 KiB); beyond, a new one is refused.
  std::size_t max_connections = 1024;
};

class Terminator {
 public:
  // Everything the policy says about credentials and L7 rules, with the
  // secrets' store. Errors name the entry (hosts are parsed again here).
  static Result<std::unique_ptr<Terminator>> Create(const CredentialsSpec& credentials,
                                                    const std::vector<HttpRuleSpec>& http_rules,
                                                    std::shared_ptr<SecretStore> secrets, TerminatorOptions options);
  ~Terminator();

  // Whether the proxy ends TLS for `host` (normalised) instead of tunnelling.
  bool Covers(const std::string& host) const;
  // The hosts (patterns) it may issue certificates for: the CA's name constraint.
  std::vector<std::string> Names() const;
  const std::string& ca_pem() const;
  // The first secret whose placeholder occurs in `data` and which may not
  // go to `host`; nothing when none does.
  std::optional<std::size_t> LeakedPlaceholder(std::string_view data, const std::string& host) const;
  SecretStore& secrets() const { return *secrets_; }

  struct Outcome {
    std::string decision;  // "allow", "deny", "error" (for the connection's record)
    std::string reason;
    std::string message;
    std::vector<RequestRecord> requests;
    std::uint64_t bytes_up = 0;
    std::uint64_t bytes_down = 0;
  };
  using Done = std::function<void(Outcome)>;

  class Handle {
   public:
    virtual ~Handle() = default;
    // What the connection saw so far, now; `done` will not run any more.
    // The caller closes the sockets.
    virtual Outcome Abort() = 0;
  };

  // Serves one tunnel: `client` (whose first bytes, already read, are
  // `client_hello`) and `upstream` (connected TCP to the checked address).
  // Both sockets stay owned by the caller, who keeps them open until `done`
  // runs, or calls Abort. `keep_alive` is held until then.
  // Null, and nothing started, when max_connections are open already.
  std::shared_ptr<Handle> Serve(boost::asio::ip::tcp::socket& client, boost::asio::ip::tcp::socket& upstream,
                                std::string client_hello, const std::string& host, std::uint16_t port,
                                std::shared_ptr<void> keep_alive, Done done);

  struct Impl;

 private:
  Terminator() = default;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<SecretStore> secrets_;
};

}  // namespace agentbox::net
