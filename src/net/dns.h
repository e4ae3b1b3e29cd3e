// DNS inside the sandbox: the supervisor answers the sandbox's queries on a
// UDP socket and a TCP listener created inside its network namespace (the
// sandbox's /etc/resolv.conf names them), resolving allowed names itself
// and refusing the rest, each refusal a named denial.
//
// Only what a stub resolver asks is served: one question, class IN, opcode
// QUERY. A and AAAA for an allowed name get the addresses the supervisor's
// resolver found (cached; the AddressBook remembers them for the connect()
// broker); other types for an allowed name get an empty answer (NODATA); a
// name the policy does not allow gets REFUSED. Nothing is forwarded: the
// sandbox never talks to a resolver of the host's.
//
// Event-driven on one boost::asio::io_context, like the proxy: every method
// and callback runs on the thread that runs it, except AddressBook, which
// the broker reads from another thread.
#pragma once

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "agentbox/status.h"
#include "net/proxy.h"
#include "net/rules.h"

namespace agentbox::net {

// --- wire format (RFC 1035, RFC 6891 for the OPT record) -------------------

constexpr std::uint16_t kDnsTypeA = 1;
constexpr std::uint16_t kDnsTypePtr = 12;
constexpr std::uint16_t kDnsTypeAaaa = 28;
constexpr std::uint16_t kDnsTypeOpt = 41;
constexpr std::uint16_t kDnsClassIn = 1;

enum class DnsRcode : std::uint8_t {
  kNoError = 0,
  kFormErr = 1,
  kServFail = 2,
  kNxDomain = 3,
  kNotImp = 4,
  kRefused = 5,
};

struct DnsQuery {
  std::uint16_t id = 0;
  bool recursion_desired = false;
  std::uint8_t opcode = 0;
  std::string name;          // lower case, no trailing dot ("" is the root)
  std::uint16_t qtype = 0;
  std::uint16_t qclass = 0;
  bool edns = false;         // an OPT record came with it
  std::uint16_t udp_size = 512;  // what the client can take over UDP (OPT's size, at least 512)
};

// Parses a query strictly: header, exactly one question (compression
// pointers refused in it), at most one additional record (OPT). Anything
// else, a truncated message or trailing bytes is an error; when the header
// was readable, `id_out` receives the id so that FORMERR can be answered.
Result<DnsQuery> ParseDnsQuery(std::string_view wire, std::optional<std::uint16_t>* id_out = nullptr);

// The answer to `q`: QR and RA set, RD copied, the question echoed, one
// A/AAAA record per address of the query's family (others skipped) with
// `ttl`, and an OPT record when the query had one. Over `max_size` (UDP: the
// client's size) the answers are dropped and TC is set, so that the client
// asks again over TCP.
std::string BuildDnsAnswer(const DnsQuery& q, DnsRcode rcode, const std::vector<IpAddress>& addresses,
                           std::uint32_t ttl, std::size_t max_size = 65535);
// FORMERR for a message whose header could be read (id only, no question).
std::string BuildDnsFormErr(std::uint16_t id);

// --- what the sandbox was told ---------------------------------------------

// Names the sandbox resolved through us, by address: the broker's way from a
// connect()'s address back to the allowed name it came from. Thread-safe.
// Bounded: past `max_addresses` the oldest entries go.
class AddressBook {
 public:
  explicit AddressBook(std::size_t max_addresses = 65536) : max_(max_addresses) {}
  void Add(const std::string& name, const std::vector<IpAddress>& addresses);
  // Every name handed out with `address` (unmapped form compared), newest first.
  std::vector<std::string> NamesFor(const IpAddress& address) const;

 private:
  struct Entry {
    std::vector<std::string> names;  // newest first, at most kMaxNamesPerAddress
    std::uint64_t stamp = 0;         // of the key's newest place in order_
  };
  static constexpr std::size_t kMaxNamesPerAddress = 16;
  void Compact();  // drops order_'s stale places

  std::size_t max_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> by_address_;  // key: Unmapped().ToString()
  // (stamp, key), oldest first. An address added again gets a new place
  // (the old one turns stale), so that what is still handed out stays.
  std::deque<std::pair<std::uint64_t, std::string>> order_;
  std::uint64_t next_stamp_ = 0;
};

// --- the server --------------------------------------------------------------

// Whether a name may be resolved, decided by the caller (rules, asker).
struct DnsVerdict {
  bool allow = false;
  std::string rule;     // the entry that decided
  std::string message;  // deny: one line for people ("registry.example is not in network.allow")
  std::string reason;   // deny: a DenyReason name ("not-allowed", "deny-rule", "ask-denied", ...)
};

struct DnsServerOptions {
  std::chrono::seconds cache_ttl{60};           // how long an answer is served from the cache
  std::chrono::seconds negative_ttl{5};         // how long "no such name" is remembered
  std::chrono::milliseconds resolve_timeout{5000};  // no answer from the resolver by then: SERVFAIL
  std::size_t max_cache_names = 4096;
  std::size_t max_pending = 512;                // queries waiting for a decision or the resolver
  std::size_t max_tcp_connections = 64;
  std::chrono::milliseconds tcp_idle{10000};
  std::size_t max_udp_answer = 1232;            // the largest UDP answer sent, whatever the client says
};

class DnsServer {
 public:
  // Decides one name; `done` runs once, on the io thread (possibly later:
  // an asker). The server asks once per name while a decision is pending.
  using Decide = std::function<void(const std::string& name, std::function<void(DnsVerdict)> done)>;
  // Told of each denied name (at most once per name a second, with how many
  // queries were refused since), for the report.
  using OnDenied = std::function<void(const std::string& name, const DnsVerdict& verdict, std::uint64_t count)>;

  // `resolver` and `book` must outlive the server.
  DnsServer(boost::asio::io_context& io, Resolver& resolver, Decide decide, OnDenied on_denied, AddressBook& book,
            DnsServerOptions options = {});
  ~DnsServer();  // Stop()
  DnsServer(const DnsServer&) = delete;
  DnsServer& operator=(const DnsServer&) = delete;

  // A bound UDP socket / a bound, listening TCP socket; ownership of `fd`
  // passes in whatever the outcome.
  Status ServeUdp(int fd);
  Status ServeTcp(int fd);
  // Closes both and every TCP connection. Irreversible.
  void Stop();

  // queries: messages received (malformed and dropped ones too); answered:
  // answers sent, whatever their rcode; refused / formerr / servfail: the
  // answers with that rcode; cache_hits: answers served from the cache.
  struct Stats {
    std::uint64_t queries = 0, answered = 0, refused = 0, formerr = 0, servfail = 0, cache_hits = 0;
  };
  Stats stats() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace agentbox::net
