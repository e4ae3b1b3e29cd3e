#include "net/proxy.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <system_error>
#include <unordered_set>

#include "net/http_request.h"
#include "net/socks5.h"
#include "net/tls_sni.h"

namespace agentbox::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

namespace {

class Session;

// Bytes moved per direction before yielding to other connections.
constexpr std::size_t kSpliceChunk = 1024 * 1024;
constexpr std::size_t kDefaultPipe = 64 * 1024;
constexpr std::size_t kBulkPipe = 1024 * 1024;
constexpr int kChunksPerTurn = 8;
// Unread request bytes are drained this long after a refusal, so that the
// close does not turn into a reset that destroys the 403 in flight.
constexpr std::chrono::milliseconds kLingerTime{500};

asio::ip::address ToAsio(const IpAddress& a) {
  if (!a.v6) return asio::ip::address_v4(asio::ip::address_v4::bytes_type{a.bytes[0], a.bytes[1], a.bytes[2], a.bytes[3]});
  asio::ip::address_v6::bytes_type b;
  std::copy(a.bytes.begin(), a.bytes.end(), b.begin());
  return asio::ip::address_v6(b);
}

// splice(2) into a socket has no MSG_NOSIGNAL: when the peer is gone it
// raises SIGPIPE, whose default action would kill the supervisor. SIGPIPE is
// blocked in this thread for the call and the one it raised is discarded, so
// the process's signal dispositions stay as the caller set them.
ssize_t SpliceToSocket(int pipe_r, int socket_fd, std::size_t len) {
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  ssize_t n = ::splice(pipe_r, nullptr, socket_fd, nullptr, len, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
  int err = errno;
  if (n < 0 && err == EPIPE) {
    timespec zero{0, 0};
    while (sigtimedwait(&pipe_set, nullptr, &zero) == SIGPIPE) {
    }
  }
  if (!sigismember(&old, SIGPIPE)) pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = err;
  return n;
}

}  // namespace

// --- Impl ------------------------------------------------------------------

struct Proxy::Impl : std::enable_shared_from_this<Proxy::Impl> {
  Impl(asio::io_context& io, RuleSet rules, ProxyOptions options, Resolver& resolver, Asker* asker,
       RecordSink* sink)
      : io(io), rules(std::move(rules)), options(options), resolver(&resolver), asker(asker), sink(sink) {}

  struct Listener {
    Listener(asio::io_context& io, ListenerKind kind) : acceptor(io), retry(io), kind(kind) {}
    tcp::acceptor acceptor;
    asio::steady_timer retry;
    ListenerKind kind;
    tcp protocol = tcp::v4();
  };

  struct Question {
    Question(asio::io_context& io, std::string key, std::string host, std::uint16_t port)
        : timer(io), key(std::move(key)), host(std::move(host)), port(port) {}
    std::vector<std::function<void(AskAnswer)>> waiters;
    asio::steady_timer timer;
    std::string key;
    std::string host;
    std::uint16_t port;
    bool asked = false;  // put to the asker (else waiting for a turn)
    bool done = false;   // answered, by the asker or the timer
  };

  void Accept(Listener* listener);
  // False when the question would be one too many (nothing was queued).
  bool Ask(const std::string& host, std::uint16_t port, std::function<void(AskAnswer)> done);
  void PutWaitingQuestions();
  void Answer(const std::string& key, AskAnswer answer);

  asio::io_context& io;
  RuleSet rules;  // replaced by SetRules, on the io thread
  const ProxyOptions options;
  Resolver* resolver;
  Asker* asker;
  RecordSink* sink;
  bool stopped = false;
  std::vector<std::unique_ptr<Listener>> listeners;
  std::unordered_set<Session*> sessions;
  std::map<std::string, std::shared_ptr<Question>> questions;  // open, by "host:port"
  std::deque<std::shared_ptr<Question>> waiting;  // open, not yet asked, oldest first
  std::size_t asking = 0;  // put to the asker and not yet answered by it
  std::unordered_set<std::string> always;  // "host:port" answered "always" this run
  std::unordered_map<std::uint16_t, AdoptedTarget> expected;  // kAdopted, by the client's local port
  ProxyStats stats;
};

namespace {

// One client connection, from accept to the record. Owned by the shared_ptrs
// its pending handlers hold; registered in Impl::sessions while open.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<Proxy::Impl> impl, tcp::socket client, ListenerKind kind)
      : impl_(std::move(impl)),
        client_(std::move(client)),
        upstream_(impl_->io),
        timer_(impl_->io),
        kind_(kind),
        start_(std::chrono::steady_clock::now()),
        parser_(impl_->options.header_limit) {
    record_.protocol = kind == ListenerKind::kHttp ? "http" : kind == ListenerKind::kSocks5 ? "socks5" : "connect";
  }
  ~Session() {
    if (!recorded_) impl_->sessions.erase(this);
    for (auto& p : pumps_) {
      if (p.pipe_r >= 0) ::close(p.pipe_r);
      if (p.pipe_w >= 0) ::close(p.pipe_w);
    }
  }

  void Start() {
    impl_->sessions.insert(this);
    error_code ec;
    client_.set_option(tcp::no_delay(true), ec);
    phase_ = kind_ == ListenerKind::kHttp ? Phase::kHttpHead : Phase::kSocksGreeting;
    Arm(impl_->options.header_timeout, [](Session& s) {
      if (s.kind_ == ListenerKind::kHttp && s.phase_ == Phase::kHttpHead) {
        s.Refuse(408, "", "request head not received in time", "header-timeout");
      } else {
        s.Finish("error", "header-timeout", "handshake not received in time");
      }
    });
    ReadMore();
  }

  // A connection the broker opened: already decided, dialled at once.
  void StartAdopted(AdoptedTarget t) {
    impl_->sessions.insert(this);
    error_code ec;
    client_.set_option(tcp::no_delay(true), ec);
    host_ = std::move(t.host);
    port_ = t.port;
    record_.host = host_;
    record_.port = port_;
    candidates_.push_back({t.address.Unmapped(), t.rule});
    Resolve(Decision::Allow(std::move(t.rule)));
  }

  // Stop(): ends the connection now; the record is delivered here.
  // The sandbox ended while this connection was open. An allowed tunnel
  // that carried data was allowed, whoever closed it (the proxy often sees
  // the run end before it sees the client's close).
  void Abort() {
    // The terminator holds this session alive while it serves; its Abort
    // lets go of it.
    auto self = shared_from_this();
    if (phase_ == Phase::kTerminated && terminated_) {
      Terminator::Outcome o = terminated_->Abort();
      terminated_.reset();
      TakeTerminated(o);
      if (o.decision == "error" && o.reason == "no-request") {
        return Finish("error", "proxy-stopped", "the proxy was stopped");
      }
      return Finish(o.decision, o.reason, o.message);
    }
    const bool relayed = phase_ == Phase::kRelay && (pumps_[0].bytes > 0 || pumps_[1].bytes > 0);
    Finish(relayed ? "allow" : "error", "proxy-stopped", "the proxy was stopped");
  }

  // The rules changed and no longer allow this connection's target: it
  // ends now, recorded as a denial saying so.
  void Revoke(const std::string& message) {
    auto self = shared_from_this();
    if (phase_ == Phase::kTerminated && terminated_) {
      Terminator::Outcome o = terminated_->Abort();
      terminated_.reset();
      TakeTerminated(o);
    }
    Finish("deny", "policy-changed", message);
  }
  // The target asked for ("" until the request named one).
  const std::string& target_host() const { return host_; }
  std::uint16_t target_port() const { return port_; }

 private:
  enum class Phase {
    kHttpHead, kSocksGreeting, kSocksRequest, kDeciding, kConnecting, kSni, kRelay, kTerminated, kDone
  };

  struct Pump {
    int pipe_r = -1;
    int pipe_w = -1;
    std::size_t in_pipe = 0;
    std::uint64_t bytes = 0;
    bool done = false;
    bool grown = false;
  };

  // --- timers and reading -------------------------------------------------

  // One timer per session, re-armed per phase; a stale expiry is recognised
  // by the generation it captured.
  void Arm(std::chrono::milliseconds after, void (*fire)(Session&)) {
    ++timer_gen_;
    timer_.expires_after(after);
    timer_.async_wait([self = shared_from_this(), gen = timer_gen_, fire](error_code ec) {
      if (ec || self->done() || gen != self->timer_gen_) return;
      fire(*self);
    });
  }
  void Disarm() {
    ++timer_gen_;
    timer_.cancel();
  }

  std::size_t BufferCap() const {
    switch (phase_) {
      case Phase::kHttpHead: return impl_->options.header_limit + 4096;
      case Phase::kSni: return kMaxClientHello + 4096;
      default: return 1024;  // a SOCKS handshake is at most 2+255 + 4+1+255+2 bytes
    }
  }

  void ReadMore() {
    std::size_t cap = BufferCap();
    if (in_.size() >= cap) return OnData();  // the parser decides (431, malformed)
    std::size_t old = in_.size();
    in_.resize(std::min(cap, old + 4096));
    client_.async_read_some(asio::buffer(in_.data() + old, in_.size() - old),
                            [self = shared_from_this(), old](error_code ec, std::size_t n) {
                              self->in_.resize(old + n);
                              if (self->done()) return;
                              if (ec || n == 0) {
                                return self->Finish("error", "client-closed",
                                                    "client closed before the request was complete");
                              }
                              self->OnData();
                            });
  }

  void OnData() {
    switch (phase_) {
      case Phase::kHttpHead: return OnHttpHead();
      case Phase::kSocksGreeting: return OnSocksGreeting();
      case Phase::kSocksRequest: return OnSocksRequest();
      case Phase::kSni: return OnSni();
      default: return;
    }
  }

  // --- HTTP -----------------------------------------------------------------

  void OnHttpHead() {
    HttpParseResult r = parser_.Parse(in_);
    if (r.state == ParseState::kNeedMore) {
      if (in_.size() >= BufferCap()) return Refuse(431, "", "request header larger than the limit", "bad-request");
      return ReadMore();
    }
    if (r.state == ParseState::kError) return Refuse(r.status, "", r.error, "bad-request");
    request_ = std::move(r.request);
    if (const Terminator* t = impl_->options.terminator.get()) {
      // A placeholder in any head sent to the proxy (a CONNECT's too) is
      // refused unless the head goes to the secret's own host; plain HTTP
      // to a host that gets credentials or L7 rules is refused outright,
      // since neither is ever applied in the clear.
      if (auto host = NormaliseHost(request_.host); host.ok()) {
        record_.host = *host;
        record_.port = request_.port;
        if (auto leaked = t->LeakedPlaceholder(std::string_view(in_).substr(0, request_.head_size), *host)) {
          return DenyPlaceholder(*leaked, *host);
        }
        if (request_.kind == ProxyRequest::Kind::kForward && t->Covers(*host)) {
          return Deny(Decision::Deny(DenyReason::kPlainHttp, "terminator",
                                     "plain HTTP to " + *host + " is refused: agentbox adds credentials and checks "
                                     "network.http_rules for this host over HTTPS only"));
        }
      }
    }
    in_.erase(0, request_.head_size);  // what follows the head: body or early tunnel bytes
    record_.protocol = request_.kind == ProxyRequest::Kind::kConnect ? "http-connect" : "http";
    Authorize(request_.host, request_.port);
  }

  // --- SOCKS5 ---------------------------------------------------------------

  void OnSocksGreeting() {
    SocksGreeting g = ParseSocksGreeting(in_);
    if (g.state == SocksState::kNeedMore) return ReadMore();
    if (g.state == SocksState::kError) return Finish("error", "bad-request", "not a SOCKS5 greeting");
    in_.erase(0, g.size);
    if (!g.no_auth) {
      static const std::uint8_t kNoMethod[] = {5, 0xff};
      return WriteThenFinish(std::string(reinterpret_cast<const char*>(kNoMethod), 2), "error", "bad-request",
                             "client offered no usable SOCKS authentication method");
    }
    static const std::uint8_t kNoAuth[] = {5, 0};
    phase_ = Phase::kSocksRequest;
    asio::async_write(client_, asio::buffer(kNoAuth), [self = shared_from_this()](error_code ec, std::size_t) {
      if (self->done()) return;
      if (ec) return self->Finish("error", "client-closed", "client went away during the SOCKS handshake");
      self->OnSocksRequest();
    });
  }

  void OnSocksRequest() {
    SocksRequest r = ParseSocksRequest(in_);
    if (r.state == SocksState::kNeedMore) return ReadMore();
    if (r.state == SocksState::kError) return SocksFail(r.reply, "error", "bad-request", "malformed SOCKS5 request");
    in_.erase(0, r.size);
    record_.host = r.host;
    record_.port = r.port;
    if (r.command != kSocksConnect) {
      return SocksFail(kSocksCommandNotSupported, "error", "bad-request",
                       r.command == kSocksBind           ? "SOCKS BIND is not supported"
                       : r.command == kSocksUdpAssociate ? "SOCKS UDP ASSOCIATE is not supported"
                                                         : "unknown SOCKS command");
    }
    Authorize(r.host, r.port);
  }

  // --- deciding -------------------------------------------------------------

  void Authorize(const std::string& raw_host, std::uint16_t port) {
    phase_ = Phase::kDeciding;
    Disarm();
    record_.host = raw_host;
    record_.port = port;
    auto host = NormaliseHost(raw_host);
    if (!host.ok()) {
      return Deny(Decision::Deny(DenyReason::kBadRequest, "", "bad target host: " + host.status().message()));
    }
    host_ = std::move(host).value();
    port_ = port;
    record_.host = host_;
    Decision d = impl_->rules.Decide(host_, port_);
    if (d.verdict == Verdict::kAllow) return Resolve(d);
    if (d.verdict == Verdict::kDeny) return Deny(d);
    const std::string key = TargetText(host_, port_);
    if (impl_->always.count(key)) return Resolve(Decision::Allow("ask: always"));
    if (!impl_->options.ask_unknown || impl_->asker == nullptr) return Deny(d);
    const bool queued = impl_->Ask(host_, port_, [self = shared_from_this(), d](AskAnswer a) {
      if (self->done()) return;
      if (a == AskAnswer::kDeny) {
        return self->Deny(Decision::Deny(DenyReason::kAskDenied, "on_unknown_domain: ask",
                                         TargetText(self->host_, self->port_) + " was not approved"));
      }
      self->Resolve(Decision::Allow(a == AskAnswer::kAlways ? "ask: always" : "ask: once"));
    });
    if (!queued) {
      const ProxyOptions& o = impl_->options;
      return Deny(Decision::Deny(DenyReason::kAskBusy, "on_unknown_domain: ask",
                                 key + " was not asked: " + std::to_string(o.max_asking) +
                                     " questions are open and " + std::to_string(o.max_waiting_questions) +
                                     " more wait"));
    }
  }

  void Resolve(Decision by_name) {
    by_name_ = std::move(by_name);
    record_.rule = by_name_.rule;
    phase_ = Phase::kConnecting;
    Arm(impl_->options.connect_timeout, [](Session& s) {
      error_code ignored;
      s.upstream_.close(ignored);
      s.Fail(504, kSocksTtlExpired, "connect-timeout",
             "no connection to " + TargetText(s.host_, s.port_) + " within the connect timeout");
    });
    if (kind_ == ListenerKind::kAdopted) return DialNext();  // the broker checked the address
    if (auto ip = IpAddress::Parse(host_)) return OnResolved(std::vector<IpAddress>{*ip});
    if (IsLocalhostName(host_)) {
      // RFC 6761: localhost is loopback, never asked of a resolver.
      return OnResolved(std::vector<IpAddress>{IpAddress::V4(0x7f000001), *IpAddress::Parse("::1")});
    }
    impl_->resolver->Resolve(host_, [self = shared_from_this()](Result<std::vector<IpAddress>> r) {
      if (self->done()) return;
      if (!r.ok()) {
        return self->Fail(502, kSocksHostUnreachable, "resolve-failed",
                          "cannot resolve " + self->host_ + ": " + r.status().message());
      }
      self->OnResolved(std::move(r).value());
    });
  }

  void OnResolved(std::vector<IpAddress> addresses) {
    // The guard runs on every address; only addresses that pass are dialled,
    // and they are dialled as checked (no second resolution).
    std::optional<Decision> refusal;
    for (const auto& a : addresses) {
      Decision d = impl_->rules.CheckAddress(host_, by_name_, a, port_);
      if (d.verdict == Verdict::kAllow) {
        candidates_.push_back({a.Unmapped(), d.rule});
      } else if (!refusal) {
        refusal = d;
      }
    }
    if (candidates_.empty()) {
      if (refusal) return Deny(*refusal);
      return Fail(502, kSocksHostUnreachable, "resolve-failed", host_ + " has no addresses");
    }
    DialNext();
  }

  void DialNext() {
    if (next_candidate_ >= candidates_.size()) {
      return Fail(502, kSocksConnectionRefused, "connect-failed",
                  "cannot connect to " + TargetText(host_, port_) + ": " + last_connect_error_);
    }
    const auto& [address, rule] = candidates_[next_candidate_++];
    record_.address = address.ToString();
    record_.rule = rule;
    error_code ec;
    upstream_.close(ec);
    // Opened here, not by async_connect: Asio's socket() has no
    // SOCK_CLOEXEC, and an --ask-command helper spawned meanwhile would
    // inherit the connection.
    const tcp::endpoint endpoint(ToAsio(address), port_);
    int fd = ::socket(endpoint.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      last_connect_error_ = std::string("socket: ") + std::strerror(errno);
      return DialNext();
    }
    upstream_.assign(endpoint.protocol(), fd, ec);
    if (ec) {
      ::close(fd);
      last_connect_error_ = "socket: " + ec.message();
      return DialNext();
    }
    upstream_.async_connect(endpoint, [self = shared_from_this()](error_code ec) {
      if (self->done()) return;
      if (ec) {
        self->last_connect_error_ = ec.message();
        return self->DialNext();
      }
      self->OnConnected();
    });
  }

  void OnConnected() {
    Disarm();
    error_code ec;
    upstream_.set_option(tcp::no_delay(true), ec);
    if (kind_ == ListenerKind::kHttp && request_.kind == ProxyRequest::Kind::kForward) {
      preface_ = request_.upstream_head + in_;
      std::string().swap(in_);
      return SendPreface();
    }
    if (kind_ == ListenerKind::kAdopted) return Established(*this);  // no handshake to answer
    std::string reply;
    if (kind_ == ListenerKind::kHttp) {
      reply = "HTTP/1.1 200 Connection established\r\n\r\n";
    } else {
      auto r = SocksReply(kSocksSucceeded);
      reply.assign(r.begin(), r.end());
    }
    WriteClient(std::move(reply), &Established);
  }

  // The tunnel is up: the SNI check or the terminator first where they
  // apply, else the relay.
  static void Established(Session& s) {
    const auto& ports = s.impl_->options.sni_ports;
    s.terminate_ = s.impl_->options.terminator && s.impl_->options.terminator->Covers(s.host_);
    if (s.terminate_ ||
        (s.impl_->options.check_sni && std::find(ports.begin(), ports.end(), s.port_) != ports.end())) {
      s.phase_ = Phase::kSni;
      s.Arm(s.impl_->options.header_timeout,
            [](Session& t) { t.Finish("error", "header-timeout", "TLS ClientHello not received in time"); });
      return s.OnSni();
    }
    s.preface_ = std::move(s.in_);
    std::string().swap(s.in_);
    s.SendPreface();
  }

  void OnSni() {
    SniResult r = ParseClientHelloSni(in_);
    if (r.state == SniState::kNeedMore) return ReadMore();
    Disarm();
    const std::string target = TargetText(host_, port_);
    if (r.state == SniState::kMalformed) {
      return Deny(Decision::Deny(DenyReason::kSniMismatch, "sni-check",
                                 target + ": malformed TLS ClientHello"));
    }
    if (r.state == SniState::kFound) {
      auto sni = NormaliseHost(r.server_name);
      if (!sni.ok() || *sni != host_) {
        std::string shown = r.server_name.substr(0, 255);
        for (char& c : shown) {
          if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f || c == '"') c = '?';
        }
        return Deny(Decision::Deny(DenyReason::kSniMismatch, "sni-check",
                                   target + ": TLS SNI names \"" + shown + "\", not " +
                                       (kind_ == ListenerKind::kAdopted ? "the name the connection was allowed as"
                                                                        : "the CONNECT target")));
      }
    }
    if (terminate_) {
      // Whatever is not TLS would pass both the credentials and the L7
      // rules by: a terminated host speaks TLS or nothing.
      if (r.state == SniState::kNotTls) {
        return Deny(Decision::Deny(DenyReason::kNotTls, "terminator",
                                   target + ": the tunnel does not start with TLS, and agentbox terminates TLS "
                                            "for this host (credentials or network.http_rules)"));
      }
      return StartTerminated();
    }
    // kNotTls (another protocol on :443, such as ssh) and kAbsent pass: the
    // check is about TLS claiming a different name than the one allowed.
    preface_ = std::move(in_);
    std::string().swap(in_);
    SendPreface();
  }

  void SendPreface() {
    if (preface_.empty()) return StartRelay();
    asio::async_write(upstream_, asio::buffer(preface_), [self = shared_from_this()](error_code ec, std::size_t n) {
      if (self->done()) return;
      self->preface_bytes_ += n;
      std::string().swap(self->preface_);
      if (ec) return self->Finish("error", "upstream-closed", "upstream closed: " + ec.message());
      self->StartRelay();
    });
  }

  // --- terminated TLS -------------------------------------------------------

  void StartTerminated() {
    phase_ = Phase::kTerminated;
    record_.terminated = true;
    record_.decision = "allow";
    std::string hello = std::move(in_);
    std::string().swap(in_);
    terminated_ = impl_->options.terminator->Serve(
        client_, upstream_, std::move(hello), host_, port_, shared_from_this(), [this](Terminator::Outcome o) {
          terminated_.reset();
          TakeTerminated(o);
          Finish(o.decision, o.reason, o.message);
        });
    if (!terminated_) {
      // A fatal TLS alert, internal_error: the client's library names it.
      static const char kInternalError[] = {0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 80};
      WriteThenFinish(std::string(kInternalError, sizeof kInternalError), "error", "terminator-busy",
                      "too many terminated connections are open at once");
    }
  }

  void TakeTerminated(Terminator::Outcome& o) {
    record_.requests = std::move(o.requests);
    pumps_[0].bytes = o.bytes_up;
    pumps_[1].bytes = o.bytes_down;
  }

  void DenyPlaceholder(std::size_t secret, const std::string& host) {
    const Terminator& t = *impl_->options.terminator;
    const std::string& name = t.secrets().specs()[secret].name;
    RequestRecord r;
    r.method = request_.method;
    r.decision = "deny";
    r.facet = "credentials";
    r.op = "send";
    r.reason = "placeholder for " + name + " sent to " + host;
    r.rule = "credentials.secrets." + name + ".hosts";
    r.status = 403;
    record_.requests.push_back(r);
    Deny(Decision::Deny(DenyReason::kPlaceholder, r.rule, r.reason));
  }

  // --- relay ----------------------------------------------------------------

  void StartRelay() {
    phase_ = Phase::kRelay;
    record_.decision = "allow";
    std::string().swap(in_);
    error_code ec;
    client_.native_non_blocking(true, ec);
    upstream_.native_non_blocking(true, ec);
    Pumpit(0);
    Pumpit(1);
  }

  // Moves bytes one way with splice(2) through a pipe: socket → pipe → socket,
  // no copy to user space. Direction 0 is client → upstream.
  void Pumpit(int dir) {
    if (done()) return;
    Pump& p = pumps_[dir];
    tcp::socket& from = dir == 0 ? client_ : upstream_;
    tcp::socket& to = dir == 0 ? upstream_ : client_;
    if (p.pipe_r < 0) {
      int fds[2];
      if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
        return Finish("error", "relay-failed", std::string("pipe2: ") + std::strerror(errno));
      }
      p.pipe_r = fds[0];
      p.pipe_w = fds[1];
    }
    for (int turn = 0; turn < kChunksPerTurn; ++turn) {
      while (p.in_pipe > 0) {
        ssize_t n = SpliceToSocket(p.pipe_r, to.native_handle(), p.in_pipe);
        if (n > 0) {
          p.in_pipe -= static_cast<std::size_t>(n);
          p.bytes += static_cast<std::uint64_t>(n);
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) {
          to.async_wait(tcp::socket::wait_write, [self = shared_from_this(), dir](error_code ec) {
            if (ec) return;  // closed: the session is finishing
            self->Pumpit(dir);
          });
          return;
        }
        return Finish(p.bytes > 0 || pumps_[1 - dir].bytes > 0 ? "allow" : "error", "",
                      std::string(dir == 0 ? "upstream" : "client") + " reset the connection");
      }
      ssize_t n = ::splice(from.native_handle(), nullptr, p.pipe_w, nullptr, kSpliceChunk,
                           SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n > 0) {
        p.in_pipe = static_cast<std::size_t>(n);
        // A full default pipe means a bulk stream: a larger pipe moves more
        // per syscall. Idle and small tunnels keep the default (pipe memory
        // counts against a per-user limit).
        if (!p.grown && static_cast<std::size_t>(n) >= kDefaultPipe) {
          p.grown = true;
          (void)::fcntl(p.pipe_w, F_SETPIPE_SZ, static_cast<int>(kBulkPipe));
        }
        continue;
      }
      if (n == 0) {
        // Half-close: pass the EOF on and keep the other direction running.
        p.done = true;
        error_code ec;
        to.shutdown(tcp::socket::shutdown_send, ec);
        if (pumps_[1 - dir].done) Finish("allow", "", "");
        return;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        from.async_wait(tcp::socket::wait_read, [self = shared_from_this(), dir](error_code ec) {
          if (ec) return;
          self->Pumpit(dir);
        });
        return;
      }
      return Finish("allow", "", std::string(dir == 0 ? "client" : "upstream") + " reset the connection");
    }
    // Fairness: a bulk stream yields to other connections every few chunks.
    asio::post(impl_->io, [self = shared_from_this(), dir] { self->Pumpit(dir); });
  }

  // --- refusing and finishing -----------------------------------------------

  void Deny(const Decision& d) {
    record_.rule = d.rule;
    if (kind_ == ListenerKind::kHttp && phase_ != Phase::kSni) {
      std::string line = "agentbox: " + d.message;
      if (!d.rule.empty()) line += " (rule: " + d.rule + ")";
      return RefuseWith(SimpleResponse(403, ToString(d.reason), line), "deny", ToString(d.reason), d.message);
    }
    if (kind_ == ListenerKind::kSocks5 && phase_ != Phase::kSni) {
      auto r = SocksReply(kSocksNotAllowed);
      return WriteThenFinish(std::string(r.begin(), r.end()), "deny", ToString(d.reason), d.message);
    }
    // The tunnel was confirmed before the ClientHello could be read, so no
    // 403 is possible any more: the client gets a fatal TLS alert,
    // access_denied (RFC 8446 §6.2), which its TLS library names, and the
    // tunnel is closed. Nothing reached the upstream.
    static const char kAccessDenied[] = {0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 49};
    WriteThenFinish(std::string(kAccessDenied, sizeof kAccessDenied), "deny", ToString(d.reason), d.message);
  }

  // A failure that is not a policy decision: 502/504 or a SOCKS error code.
  void Fail(int http_status, std::uint8_t socks_reply, const std::string& reason, const std::string& message) {
    if (kind_ == ListenerKind::kHttp) return Refuse(http_status, "", message, reason);
    if (kind_ == ListenerKind::kAdopted) {
      // The sandbox's connect() has returned already: a reset is what it
      // would have seen from an upstream that went away.
      error_code ec;
      client_.set_option(asio::socket_base::linger(true, 0), ec);
      return Finish("error", reason, message);
    }
    SocksFail(socks_reply, "error", reason, message);
  }

  void SocksFail(std::uint8_t code, const std::string& decision, const std::string& reason,
                 const std::string& message) {
    auto r = SocksReply(code);
    WriteThenFinish(std::string(r.begin(), r.end()), decision, reason, message);
  }

  void Refuse(int status, const std::string& denied, const std::string& message, const std::string& reason) {
    RefuseWith(SimpleResponse(status, denied, "agentbox: " + message), status == 403 ? "deny" : "error", reason,
               message);
  }

  void RefuseWith(std::string response, const std::string& decision, const std::string& reason,
                  const std::string& message) {
    WriteThenFinish(std::move(response), decision, reason, message);
  }

  void WriteClient(std::string data, void (*then)(Session&)) {
    out_ = std::move(data);
    asio::async_write(client_, asio::buffer(out_), [self = shared_from_this(), then](error_code ec, std::size_t) {
      if (self->done()) return;
      std::string().swap(self->out_);
      if (ec) return self->Finish("error", "client-closed", "client went away");
      then(*self);
    });
  }

  // Writes a final answer, records, then half-closes and drains briefly.
  void WriteThenFinish(std::string data, const std::string& decision, const std::string& reason,
                       const std::string& message) {
    Disarm();
    error_code ec;
    client_.cancel(ec);  // a read still pending (header timeout) must not write into in_ any more
    upstream_.close(ec);
    Record(decision, reason, message);
    phase_ = Phase::kDone;
    out_ = std::move(data);
    asio::async_write(client_, asio::buffer(out_), [self = shared_from_this()](error_code ec, std::size_t) {
      if (ec) return self->Close();
      self->client_.shutdown(tcp::socket::shutdown_send, ec);
      // One bound for the whole drain, however much the client keeps sending.
      ++self->timer_gen_;
      self->timer_.expires_after(kLingerTime);
      self->timer_.async_wait([self](error_code) { self->Close(); });
      self->drain_.resize(4096);
      self->Drain();
    });
  }

  void Drain() {
    client_.async_read_some(asio::buffer(drain_), [self = shared_from_this()](error_code ec, std::size_t) {
      if (ec || !self->client_.is_open()) return self->Close();
      self->Drain();
    });
  }

  void Finish(const std::string& decision, const std::string& reason, const std::string& message) {
    if (done()) return;
    phase_ = Phase::kDone;
    Record(decision, reason, message);
    Close();
  }

  void Record(const std::string& decision, const std::string& reason, const std::string& message) {
    if (recorded_) return;
    recorded_ = true;
    impl_->sessions.erase(this);
    record_.decision = decision;
    record_.reason = reason;
    record_.message = message;
    record_.bytes_up = preface_bytes_ + pumps_[0].bytes;
    record_.bytes_down = pumps_[1].bytes;
    record_.duration_ms = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start_).count());
    if (impl_->sink != nullptr) impl_->sink->Record(record_);
  }

  void Close() {
    ++timer_gen_;
    timer_.cancel();
    error_code ec;
    client_.close(ec);
    upstream_.close(ec);
    for (auto& p : pumps_) {
      if (p.pipe_r >= 0) ::close(p.pipe_r);
      if (p.pipe_w >= 0) ::close(p.pipe_w);
      p.pipe_r = p.pipe_w = -1;
    }
  }

  bool done() const { return phase_ == Phase::kDone; }

  std::shared_ptr<Proxy::Impl> impl_;
  tcp::socket client_;
  tcp::socket upstream_;
  asio::steady_timer timer_;
  std::uint64_t timer_gen_ = 0;
  ListenerKind kind_;
  Phase phase_ = Phase::kHttpHead;
  std::chrono::steady_clock::time_point start_;
  HttpRequestParser parser_;
  ProxyRequest request_;
  std::string in_;       // bytes read from the client, not yet consumed
  std::string out_;      // the reply being written to the client
  std::string drain_;    // scratch for unread request bytes after a refusal
  std::string preface_;  // bytes for upstream before the relay starts
  std::uint64_t preface_bytes_ = 0;
  std::string host_;
  std::uint16_t port_ = 0;
  Decision by_name_;
  std::vector<std::pair<IpAddress, std::string>> candidates_;
  std::size_t next_candidate_ = 0;
  std::string last_connect_error_;
  Pump pumps_[2];
  bool terminate_ = false;  // the terminator covers host_: its TLS ends here
  std::shared_ptr<Terminator::Handle> terminated_;
  ConnectionRecord record_;
  bool recorded_ = false;
};

}  // namespace

// --- Impl -------------------------------------------------------------------

void Proxy::Impl::Accept(Listener* listener) {
  // accept4 with SOCK_CLOEXEC rather than Asio's accept (plain accept(2)):
  // the --ask-command helper is spawned from this process while connections
  // are open, and must not inherit the sandbox's.
  listener->acceptor.async_wait(tcp::acceptor::wait_read, [self = shared_from_this(), listener](error_code ec) {
    if (self->stopped) return;
    if (ec == asio::error::operation_aborted) return;
    int fd = ec ? -1 : ::accept4(listener->acceptor.native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (!ec && (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)) return self->Accept(listener);
      // Out of fds (EMFILE/ENFILE) or a transient error: pause instead of
      // spinning on a listener that stays readable.
      listener->retry.expires_after(std::chrono::milliseconds(50));
      listener->retry.async_wait([self, listener](error_code ec2) {
        if (!ec2 && !self->stopped) self->Accept(listener);
      });
      return;
    }
    tcp::socket socket(self->io);
    error_code assign_ec;
    socket.assign(listener->protocol, fd, assign_ec);
    if (assign_ec) {
      ::close(fd);
      return self->Accept(listener);
    }
    ++self->stats.accepted;
    if (self->sessions.size() >= self->options.max_connections) {
      ++self->stats.refused_over_limit;
      error_code ignored;
      socket.close(ignored);
    } else if (self->options.admit && !self->options.admit(socket.native_handle())) {
      ++self->stats.refused_not_admitted;
      error_code ignored;
      socket.close(ignored);
    } else if (listener->kind == ListenerKind::kAdopted) {
      // Only what the broker announced, from the port it announced.
      error_code pec;
      const tcp::endpoint peer = socket.remote_endpoint(pec);
      const auto it = pec ? self->expected.end() : self->expected.find(peer.port());
      const bool loopback = !pec && (peer.address().is_loopback() ||
                                     (peer.address().is_v6() && peer.address().to_v6().is_v4_mapped() &&
                                      asio::ip::make_address_v4(asio::ip::v4_mapped, peer.address().to_v6()).is_loopback()));
      if (it == self->expected.end() || !loopback) {
        ++self->stats.refused_not_admitted;
        error_code ignored;
        socket.close(ignored);
      } else {
        AdoptedTarget target = std::move(it->second);
        self->expected.erase(it);
        std::make_shared<Session>(self, std::move(socket), listener->kind)->StartAdopted(std::move(target));
      }
    } else {
      std::make_shared<Session>(self, std::move(socket), listener->kind)->Start();
    }
    self->Accept(listener);
  });
}

bool Proxy::Impl::Ask(const std::string& host, std::uint16_t port, std::function<void(AskAnswer)> done) {
  const std::string key = TargetText(host, port);
  auto it = questions.find(key);
  if (it != questions.end()) {  // the same question is already open: wait for its answer
    it->second->waiters.push_back(std::move(done));
    return true;
  }
  if (asking >= options.max_asking && waiting.size() >= options.max_waiting_questions) return false;
  auto q = std::make_shared<Question>(io, key, host, port);
  q->waiters.push_back(std::move(done));
  questions[key] = q;
  // The bound covers the wait for a turn too: a connection never waits
  // longer than ask_timeout for its answer.
  q->timer.expires_after(options.ask_timeout);
  q->timer.async_wait([self = shared_from_this(), key](error_code ec) {
    if (!ec) self->Answer(key, AskAnswer::kDeny);
  });
  waiting.push_back(std::move(q));
  PutWaitingQuestions();
  return true;
}

// A question's turn ends when the asker answers it (the ask command has
// exited and been reaped by then), not when the proxy's timer gave up on
// it: the count is of what the asker really has open.
void Proxy::Impl::PutWaitingQuestions() {
  while (!stopped && asking < options.max_asking && !waiting.empty()) {
    std::shared_ptr<Question> q = std::move(waiting.front());
    waiting.pop_front();
    if (q->done) continue;
    q->asked = true;
    ++asking;
    asker->Ask(q->host, q->port, [weak = weak_from_this(), q](AskAnswer a) {
      auto self = weak.lock();
      if (!self) return;
      --self->asking;
      if (!q->done) self->Answer(q->key, a);
      self->PutWaitingQuestions();
    });
  }
}

void Proxy::Impl::Answer(const std::string& key, AskAnswer answer) {
  auto it = questions.find(key);
  if (it == questions.end()) return;
  auto q = it->second;
  questions.erase(it);
  q->done = true;
  q->timer.cancel();
  if (!q->asked) waiting.erase(std::remove(waiting.begin(), waiting.end(), q), waiting.end());
  if (answer == AskAnswer::kAlways) always.insert(key);
  for (auto& waiter : q->waiters) waiter(answer);
}

// --- Proxy ------------------------------------------------------------------

Proxy::Proxy(asio::io_context& io, RuleSet rules, ProxyOptions options, Resolver& resolver, Asker* asker,
             RecordSink* sink)
    : impl_(std::make_shared<Impl>(io, std::move(rules), options, resolver, asker, sink)) {}

Proxy::~Proxy() { Stop(); }

Status Proxy::Serve(int fd, ListenerKind kind) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    Status s = Status::Errno("proxy", "getsockname", "fd " + std::to_string(fd));
    ::close(fd);
    return s;
  }
  if (addr.ss_family != AF_INET && addr.ss_family != AF_INET6) {
    ::close(fd);
    return Status::Error("proxy", "fd " + std::to_string(fd) + " is not an IPv4 or IPv6 socket");
  }
  auto listener = std::make_unique<Impl::Listener>(impl_->io, kind);
  error_code ec;
  listener->protocol = addr.ss_family == AF_INET ? tcp::v4() : tcp::v6();
  listener->acceptor.assign(listener->protocol, fd, ec);
  if (ec) {
    ::close(fd);
    return Status::Syscall("proxy", "assign listener", "fd " + std::to_string(fd), ec.value());
  }
  listener->acceptor.non_blocking(true, ec);
  Impl::Listener* raw = listener.get();
  impl_->listeners.push_back(std::move(listener));
  impl_->Accept(raw);
  return Status();
}

void Proxy::Stop() {
  if (!impl_ || impl_->stopped) return;
  error_code ec;
  for (auto& l : impl_->listeners) {
    l->acceptor.close(ec);
    l->retry.cancel();
  }
  std::vector<Session*> open(impl_->sessions.begin(), impl_->sessions.end());
  for (Session* s : open) {
    if (impl_->sessions.count(s)) s->Abort();
  }
  for (auto& [key, q] : impl_->questions) {
    q->done = true;
    q->timer.cancel();
  }
  impl_->questions.clear();
  impl_->waiting.clear();
  impl_->stopped = true;
  impl_->sink = nullptr;
}

void Proxy::SetRules(RuleSet rules) {
  impl_->rules = std::move(rules);
  std::vector<Session*> open(impl_->sessions.begin(), impl_->sessions.end());
  for (Session* s : open) {
    if (!impl_->sessions.count(s) || s->target_host().empty()) continue;
    const std::string key = TargetText(s->target_host(), s->target_port());
    if (impl_->rules.Decide(s->target_host(), s->target_port()).verdict == Verdict::kAllow) continue;
    if (impl_->always.count(key)) continue;  // approved by the asker for the run
    s->Revoke(key + " is no longer allowed: the network rules changed while the connection was open");
  }
}

void Proxy::Expect(std::uint16_t client_port, AdoptedTarget target) {
  impl_->expected[client_port] = std::move(target);
}

ProxyStats Proxy::stats() const {
  ProxyStats s = impl_->stats;
  s.active = impl_->sessions.size();
  return s;
}

// --- resolvers ----------------------------------------------------------------

void StaticResolver::Resolve(const std::string& host, Callback done) {
  ++calls_;
  if (std::find(hang_.begin(), hang_.end(), host) != hang_.end()) {
    hung_.push_back(std::move(done));
    return;
  }
  auto it = table_.find(host);
  Result<std::vector<IpAddress>> result =
      it == table_.end() ? Result<std::vector<IpAddress>>(Status::Error("resolve", "no such host"))
                         : Result<std::vector<IpAddress>>(it->second);
  asio::post(io_, [done = std::move(done), result = std::move(result)]() mutable { done(std::move(result)); });
}

SystemResolver::SystemResolver(asio::io_context& io, int threads, std::size_t max_queued)
    : io_(io), max_queued_(max_queued), wanted_threads_(threads) {}

SystemResolver::~SystemResolver() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void SystemResolver::Resolve(const std::string& host, Callback done) {
  {
    std::lock_guard lock(mu_);
    if (queue_.size() < max_queued_ && !stopping_) {
      // The pool starts with the first lookup: most sandboxes resolve
      // nothing, and a thread is a cost of every run's start and end.
      if (threads_.empty()) {
        try {
          for (int i = 0; i < wanted_threads_; ++i) threads_.emplace_back([this] { Work(); });
        } catch (const std::system_error&) {
          if (threads_.empty()) {
            asio::post(io_, [done = std::move(done)] { done(Status::Error("resolve", "no resolver thread")); });
            return;
          }
        }
      }
      queue_.emplace_back(host, std::move(done));
      cv_.notify_one();
      return;
    }
  }
  asio::post(io_, [done = std::move(done)] { done(Status::Error("resolve", "too many lookups in progress")); });
}

void SystemResolver::Work() {
  while (true) {
    std::pair<std::string, Callback> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* list = nullptr;
    int rc = ::getaddrinfo(job.first.c_str(), nullptr, &hints, &list);
    Result<std::vector<IpAddress>> result = Status::Error("resolve", rc == 0 ? "no addresses" : gai_strerror(rc));
    if (rc == 0) {
      std::vector<IpAddress> addresses;
      for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
        IpAddress a;
        if (ai->ai_family == AF_INET) {
          std::memcpy(a.bytes.data(), &reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr, 4);
        } else if (ai->ai_family == AF_INET6) {
          a.v6 = true;
          std::memcpy(a.bytes.data(), &reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr, 16);
        } else {
          continue;
        }
        if (std::find(addresses.begin(), addresses.end(), a) == addresses.end()) addresses.push_back(a);
      }
      ::freeaddrinfo(list);
      if (!addresses.empty()) result = std::move(addresses);
    }
    asio::post(io_, [done = std::move(job.second), result = std::move(result)]() mutable { done(std::move(result)); });
  }
}

// --- records --------------------------------------------------------------------

const char* ToString(AskAnswer a) {
  switch (a) {
    case AskAnswer::kDeny: return "deny";
    case AskAnswer::kOnce: return "once";
    case AskAnswer::kAlways: return "always";
  }
  return "?";
}

std::optional<ConnectionRecord> ConnectionRecord::FromJson(std::string_view line) {
  const auto j = nlohmann::json::parse(line, nullptr, false);
  if (!j.is_object()) return std::nullopt;
  try {
    ConnectionRecord r;
    r.protocol = j.value("protocol", "");
    r.host = j.value("host", "");
    r.port = j.value("port", std::uint16_t{0});
    r.address = j.value("address", "");
    r.decision = j.value("decision", "");
    r.rule = j.value("rule", "");
    r.reason = j.value("reason", "");
    r.message = j.value("message", "");
    r.bytes_up = j.value("bytes_up", std::uint64_t{0});
    r.bytes_down = j.value("bytes_down", std::uint64_t{0});
    r.duration_ms = j.value("duration_ms", std::uint64_t{0});
    r.terminated = j.value("terminated", false);
    r.count = j.value("count", std::uint64_t{1});
    if (j.contains("requests") && j["requests"].is_array()) {
      for (const auto& q : j["requests"]) {
        RequestRecord rr;
        rr.method = q.value("method", "");
        rr.path = q.value("path", "");
        rr.decision = q.value("decision", "");
        rr.facet = q.value("facet", "");
        rr.op = q.value("op", "");
        rr.reason = q.value("reason", "");
        rr.rule = q.value("rule", "");
        rr.secrets = q.value("secrets", std::vector<std::string>{});
        rr.status = q.value("status", 0);
        r.requests.push_back(std::move(rr));
      }
    }
    return r;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // a field of the wrong type
  }
}

std::string ConnectionRecord::ToJson() const {
  nlohmann::json j = {{"protocol", protocol}, {"host", host},     {"port", port},
                      {"address", address},   {"decision", decision}, {"rule", rule},
                      {"reason", reason},     {"message", message}, {"bytes_up", bytes_up},
                      {"bytes_down", bytes_down}, {"duration_ms", duration_ms}};
  if (terminated) j["terminated"] = true;
  if (count != 1) j["count"] = count;
  if (!requests.empty()) {
    j["requests"] = nlohmann::json::array();
    for (const auto& r : requests) j["requests"].push_back(nlohmann::json::parse(r.ToJsonText()));
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace agentbox::net
