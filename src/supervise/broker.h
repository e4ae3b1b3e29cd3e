// The connect() broker's supervisor side: decides each TCP connect() the
// runner forwards (linux/connect_broker.h) and opens the allowed ones from
// the host's network, handing the socket back to be installed in place of
// the caller's. No relay stays in the data path of a direct connection;
// hosts that need TLS termination, credentials, HTTP rules or
// network.inspect_tls get a socket that leads to the proxy instead.
//
// The decision is the proxy's rule engine's: an address is known by the
// names the sandbox's DNS handed it out for (AddressBook); an address no
// such name has is decided as an IP literal (IP and CIDR entries).
//
// Runs on the egress io_context; every method on its thread.
#pragma once

#include <boost/asio/io_context.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "linux/fd.h"
#include "net/dns.h"
#include "net/proxy.h"
#include "net/rules.h"

namespace agentbox::supervise {

struct BrokerDeps {
  const net::RuleSet* rules = nullptr;
  net::AddressBook* book = nullptr;
  // Names the person (or --ask-command) allowed when the DNS asked: any port.
  const std::unordered_set<std::string>* approved = nullptr;
  // Whether connections to `host` keep the proxy's relay (terminator,
  // inspect_tls); then they are adopted by `proxy` through its kAdopted
  // listener at 127.0.0.1:adopt_port.
  std::function<bool(const std::string& host)> relay;
  net::Proxy* proxy = nullptr;
  std::uint16_t adopt_port = 0;
  net::RecordSink* sink = nullptr;
  // Without DNS inside (landlock-only) the sandbox resolves names through
  // the host's /etc/hosts or not at all: these names (the exact host names
  // of network.allow) are resolved by `resolver` when the broker starts,
  // and their addresses known by them, so that host rules decide there too.
  // Requests wait for those answers (at most kPreresolveWait).
  std::vector<std::string> preresolve;
  net::Resolver* resolver = nullptr;
};

class ConnectBroker {
 public:
  // Takes the channel (the supervisor's end of the socketpair).
  ConnectBroker(boost::asio::io_context& io, linux::UniqueFd channel, BrokerDeps deps);
  ~ConnectBroker();
  ConnectBroker(const ConnectBroker&) = delete;
  ConnectBroker& operator=(const ConnectBroker&) = delete;

  void Start();
  // Stops reading requests; connections already handed over are the
  // sandbox's. Irreversible.
  void Stop();

  // After the rules it decides with changed: the direct connections it
  // handed over that they no longer allow (by socket inode), forgotten
  // here; ending them is the caller's (linux::ShutDownHeldSockets).
  std::vector<std::uint64_t> Revoke();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// The decision on a connect() to `address`:`port`, and the host it is
// allowed (or refused) as: a name the sandbox resolved, or the literal.
struct BrokerDecision {
  net::Decision decision;
  std::string host;
};
BrokerDecision DecideConnect(const net::RuleSet& rules, const net::AddressBook& book,
                             const std::unordered_set<std::string>& approved, const net::IpAddress& address,
                             std::uint16_t port);

}  // namespace agentbox::supervise
