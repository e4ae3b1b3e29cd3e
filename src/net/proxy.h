// The egress proxy engine: an HTTP proxy (CONNECT, absolute-URI requests)
// and a SOCKS5 proxy (CONNECT) on listening sockets handed over as fds,
// deciding every connection with a RuleSet, resolving names itself, and
// dialling exactly the address it checked.
//
// Event-driven on one boost::asio::io_context; nothing here starts a thread
// except SystemResolver. All methods of Proxy, and every callback it makes
// (Resolver, Asker, RecordSink), run on the thread that runs the io_context.
//
// The sandbox integration passes listening sockets created inside the
// sandbox's network namespace (SCM_RIGHTS); tests pass loopback listeners.
#pragma once

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "agentbox/status.h"
#include "net/rules.h"
#include "net/terminator.h"

namespace agentbox::net {

// Name resolution, injected so that tests never touch the machine's resolver.
class Resolver {
 public:
  using Callback = std::function<void(Result<std::vector<IpAddress>>)>;
  virtual ~Resolver() = default;
  // Resolves a normalised host name (never an IP literal, never "localhost").
  // `done` runs exactly once, on the proxy's io_context thread, and may run
  // after the asking connection is gone (it must tolerate that).
  virtual void Resolve(const std::string& host, Callback done) = 0;
};

// A fixed table, for tests: names not in it fail with "no such host".
class StaticResolver : public Resolver {
 public:
  explicit StaticResolver(boost::asio::io_context& io) : io_(io) {}
  void Add(const std::string& host, std::vector<IpAddress> addresses) { table_[host] = std::move(addresses); }
  // Answers nothing, ever, for `host`: a resolver that hangs.
  void Hang(const std::string& host) { hang_.push_back(host); }
  void Resolve(const std::string& host, Callback done) override;
  int calls() const { return calls_; }

 private:
  boost::asio::io_context& io_;
  std::map<std::string, std::vector<IpAddress>> table_;
  std::vector<std::string> hang_;
  std::vector<Callback> hung_;  // kept so that hung callbacks are never run
  int calls_ = 0;
};

// getaddrinfo on a small, fixed pool of worker threads (started by the
// first lookup) with a bounded queue (no thread per connection). Must be
// destroyed before the io_context; the destructor waits for lookups in
// progress. Resolve is called on one thread (the io_context's).
class SystemResolver : public Resolver {
 public:
  explicit SystemResolver(boost::asio::io_context& io, int threads = 2, std::size_t max_queued = 256);
  ~SystemResolver() override;
  void Resolve(const std::string& host, Callback done) override;

 private:
  void Work();
  boost::asio::io_context& io_;
  std::size_t max_queued_;
  int wanted_threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::string, Callback>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// The answer to "allow host:port?" under on_unknown_domain: ask.
enum class AskAnswer { kDeny, kOnce, kAlways };
const char* ToString(AskAnswer a);

class Asker {
 public:
  virtual ~Asker() = default;
  // Asks about one target (port 0: about the name on any port, for DNS
  // inside the sandbox). `done` runs once on the io_context thread, within
  // the asker's own bound (the proxy counts a question as open until then);
  // the proxy bounds the wait itself too and treats silence as kDeny.
  // The proxy asks one question per host:port at a time, and at most
  // ProxyOptions::max_asking questions at once.
  virtual void Ask(const std::string& host, std::uint16_t port, std::function<void(AskAnswer)> done) = 0;
};

// One per client connection, delivered when the connection ends.
struct ConnectionRecord {
  std::string protocol;    // "http-connect", "http", "socks5", "connect" (the broker), "dns"
  std::string host;        // the target as asked (normalised when it could be)
  std::uint16_t port = 0;
  std::string address;     // the address dialled; empty when none was
  std::string decision;    // "allow", "deny", "error"
  std::string rule;        // the entry that decided, or how ("ask: once")
  std::string reason;      // deny: DenyReason name; error: what failed
  std::string message;     // one line for people
  std::uint64_t bytes_up = 0;    // client → upstream, request head included
  std::uint64_t bytes_down = 0;  // upstream → client
  std::uint64_t duration_ms = 0;
  bool terminated = false;  // TLS ended by the terminator: `requests` says what went through
  std::uint64_t count = 1;  // "dns": how many refused queries this record stands for
  std::vector<RequestRecord> requests;

  std::string ToJson() const;  // one line, for the --network-log JSONL
  // The record back from its line (a session's world sends them so);
  // nullopt for anything that is not one.
  static std::optional<ConnectionRecord> FromJson(std::string_view line);
};

class RecordSink {
 public:
  virtual ~RecordSink() = default;
  virtual void Record(const ConnectionRecord& record) = 0;
};

// kAdopted: connections the connect() broker opened for the sandbox to a
// host that keeps the relay (TLS termination, network.inspect_tls); each
// arrives from the local port it was announced with (Proxy::Expect), and
// any other is closed without a word.
enum class ListenerKind { kHttp, kSocks5, kAdopted };

// What the broker decided for an adopted connection: the name it was
// allowed as, and the address the sandbox asked for (dialled as is).
struct AdoptedTarget {
  std::string host;
  std::uint16_t port = 0;
  IpAddress address;
  std::string rule;
};

struct ProxyOptions {
  bool ask_unknown = false;  // on_unknown_domain: ask (needs an Asker; otherwise deny)
  bool check_sni = true;     // CONNECT/SOCKS to a TLS port: SNI must name the target
  std::vector<std::uint16_t> sni_ports{443};         // the ports the SNI check applies to
  std::chrono::milliseconds header_timeout{10000};   // request head, SOCKS handshake, ClientHello
  std::chrono::milliseconds connect_timeout{10000};  // resolution plus dialling
  std::chrono::milliseconds ask_timeout{60000};      // a question unanswered by then is a deny
  // An asker may start a process per question: at most this many questions
  // are put at once, and at most max_waiting_questions more (distinct
  // host:port) wait for a turn; beyond, a new target is refused (ask-busy).
  std::size_t max_asking = 4;
  std::size_t max_waiting_questions = 64;
  std::size_t header_limit = 32 * 1024;              // request line + fields; beyond → 431
  std::size_t max_connections = 8192;                // beyond: accepted and closed at once
  // Asked about each accepted connection's descriptor before anything is
  // read from it; false: closed at once, without a record (a connection
  // from outside the sandbox is not the sandbox's). Unset: every one served.
  std::function<bool(int fd)> admit;
  // Hosts it covers get their TLS ended and each request decided
  // (terminator.h); a placeholder of one of its secrets in a plain HTTP
  // request to another host is refused. Used on the io thread only.
  std::shared_ptr<Terminator> terminator;
};

struct ProxyStats {
  std::size_t active = 0;
  std::uint64_t accepted = 0;
  std::uint64_t refused_over_limit = 0;
  std::uint64_t refused_not_admitted = 0;  // ProxyOptions::admit said no
};

class Proxy {
 public:
  // `resolver` must outlive the proxy; `asker` and `sink` may be null.
  Proxy(boost::asio::io_context& io, RuleSet rules, ProxyOptions options, Resolver& resolver, Asker* asker,
        RecordSink* sink);
  ~Proxy();  // Stop()
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // Serves a bound, listening TCP socket (IPv4 or IPv6). Takes ownership of
  // `fd` whatever the outcome.
  Status Serve(int fd, ListenerKind kind);

  // The connection from 127.0.0.1:`client_port` (or its v4-mapped form) to
  // a kAdopted listener goes to `target`: relayed with the SNI check, or
  // terminated when the terminator covers the host. One connection each.
  void Expect(std::uint16_t client_port, AdoptedTarget target);

  // Replaces the rules that decide new connections, and ends every open
  // connection whose target they no longer allow (recorded as a denial,
  // reason "policy-changed"). On the io_context's thread.
  void SetRules(RuleSet rules);

  // Closes the listeners and every connection; each open connection's record
  // is delivered before Stop returns. Irreversible.
  void Stop();

  ProxyStats stats() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace agentbox::net
