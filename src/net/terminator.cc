#include "net/terminator.h"

// GCC 12 reports Asio's coroutine frames (allocated and freed by Asio's own
// operator new/delete pair) as mismatched: a known false positive.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

#include <openssl/evp.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "net/git_push.h"
#include "net/http_head.h"
#include "net/http_request.h"
#include "net/http_text.h"
#include "net/rules.h"
#include "net/tls_socket.h"

namespace agentbox::net {

namespace asio = boost::asio;
namespace ssl = asio::ssl;
namespace http = boost::beast::http;
namespace beast = boost::beast;
using asio::awaitable;
using asio::use_awaitable;
using boost::system::error_code;
using tcp = asio::ip::tcp;

namespace {

constexpr std::size_t kRelayChunk = 64 * 1024;

using TlsStream = TlsSocket;

// Reads on a connection are this big; OpenSSL hands out one record (16 KiB
// at most) per read anyway.
constexpr std::size_t kReadChunk = 16 * 1024;
// Bytes a parser may leave unconsumed before the stream is refused: a head
// has its own (smaller) limit; this bounds chunk headers and trailers.
constexpr std::size_t kMaxUnparsed = 128 * 1024;

// Feeds `p` from `buf`, reading more from `s` whenever it needs more, until
// `enough()` holds (checked after each step) or the body buffer it was given
// is full. The peer's close ends a close-delimited message; anywhere else it
// is an error, as is a parse error.
template <class Parser, class Enough>
awaitable<error_code> Feed(TlsSocket& s, beast::flat_buffer& buf, Parser& p, Enough enough) {
  error_code ec;
  while (true) {
    std::size_t used = 0;
    if (buf.size() > 0) {
      used = p.put(buf.data(), ec);
      buf.consume(used);
      if (ec == http::error::need_buffer) co_return error_code();
      if (ec && ec != http::error::need_more) co_return ec;
      ec = {};
    }
    if (enough()) co_return error_code();
    if (used > 0 && buf.size() > 0) continue;
    // What the parser will not take yet (a chunk header with endless
    // extensions, endless trailers) is bounded: bodies themselves are
    // consumed as they come.
    if (buf.size() >= kMaxUnparsed) co_return error_code(http::error::buffer_overflow);
    auto space = buf.prepare(kReadChunk);
    const long n = co_await s.ReadSome(space.data(), space.size());
    if (n < 0) co_return error_code(asio::error::connection_reset);
    if (n == 0) {
      p.put_eof(ec);
      if (ec) co_return ec;
      co_return enough() ? error_code() : error_code(http::error::end_of_stream);
    }
    buf.commit(static_cast<std::size_t>(n));
  }
}

// "/a;x/b;y=1" → "/a/b": each segment without its parameters.
std::string WithoutParams(std::string_view path) {
  std::string out;
  out.reserve(path.size());
  bool in_params = false;
  for (char c : path) {
    if (c == '/') in_params = false;
    if (c == ';') in_params = true;
    if (!in_params) out += c;
  }
  return out;
}

// Whether `path` is a remote's repository or lies below one.
bool UnderARemote(const std::vector<std::string>& remotes, const std::string& host, std::uint16_t port,
                  std::string_view path) {
  for (std::size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    const std::string_view prefix = slash == std::string_view::npos ? path : path.substr(0, slash);
    if (!prefix.empty() && RemoteMatches(remotes, host, port, prefix)) return true;
    if (slash == std::string_view::npos) return false;
  }
}

// One chunk of a chunked body: its size in hex, the bytes, CRLF.
std::string Chunk(std::string_view piece) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", piece.size());
  std::string out(size);
  out.append(piece);
  out += "\r\n";
  return out;
}

std::string Base64(std::string_view in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

// Masks every occurrence of the needles in a stream, across the pieces it
// comes in: the last (longest needle - 1) bytes are held back until the
// next piece, or the end, shows they are not the start of one.
class Redactor {
 public:
  void Add(std::string_view needle) {
    if (needle.size() < 4) return;  // a value this short cannot be told from data
    needles_.push_back(needle);
    hold_ = std::max(hold_, needle.size() - 1);
  }
  bool active() const { return !needles_.empty(); }
  // Bytes that may go out now.
  std::string Feed(std::string_view piece) {
    pending_.append(piece);
    Mask();
    if (pending_.size() <= hold_) return {};
    std::string out = pending_.substr(0, pending_.size() - hold_);
    pending_.erase(0, pending_.size() - hold_);
    return out;
  }
  std::string Flush() {
    Mask();
    std::string out;
    out.swap(pending_);
    return out;
  }
  std::uint64_t masked() const { return masked_; }

 private:
  void Mask() {
    for (auto n : needles_) {
      for (std::size_t at = pending_.find(n); at != std::string::npos; at = pending_.find(n, at + n.size())) {
        std::fill(pending_.begin() + static_cast<std::ptrdiff_t>(at),
                  pending_.begin() + static_cast<std::ptrdiff_t>(at + n.size()), '*');
        ++masked_;
      }
    }
  }
  std::vector<std::string_view> needles_;
  std::size_t hold_ = 0;
  std::string pending_;
  std::uint64_t masked_ = 0;
};

// A needle search across pieces, without changing them (placeholders in a
// request body to a host they may not go to).
class Finder {
 public:
  explicit Finder(std::vector<std::pair<std::size_t, std::string_view>> needles) : needles_(std::move(needles)) {
    for (auto& [i, n] : needles_) keep_ = std::max(keep_, n.size() - 1);
  }
  bool active() const { return !needles_.empty(); }
  std::optional<std::size_t> Feed(std::string_view piece) {
    window_.append(piece);
    for (auto& [i, n] : needles_) {
      if (window_.find(n) != std::string::npos) return i;
    }
    if (window_.size() > keep_) window_.erase(0, window_.size() - keep_);
    return std::nullopt;
  }

 private:
  std::vector<std::pair<std::size_t, std::string_view>> needles_;
  std::size_t keep_ = 0;
  std::string window_;
};

}  // namespace

// --- configuration ------------------------------------------------------------------

struct Terminator::Impl {
  CredentialsSpec credentials;
  std::vector<std::vector<Rule>> secret_hosts;  // per secret
  struct GitHost {
    std::string host;
    std::uint16_t port;
  };
  std::vector<GitHost> git_hosts;
  HttpRuleSet http_rules;
  TerminatorOptions options;
  std::unique_ptr<RunCa> ca;
  SslCtxPtr upstream_ctx;
  std::unique_ptr<UpstreamSessions> upstream_sessions;  // after upstream_ctx: destroyed first
  std::vector<std::string> names;
  std::size_t open_connections = 0;
  std::size_t push_bytes_reserved = 0;  // of options.git_push_budget

  bool Owns(std::size_t secret, const std::string& host) const {
    return std::any_of(secret_hosts[secret].begin(), secret_hosts[secret].end(),
                       [&](const Rule& r) { return Matches(r, host, 0); });
  }
  bool IsGitHost(const std::string& host, std::uint16_t port) const {
    return std::any_of(git_hosts.begin(), git_hosts.end(),
                       [&](const GitHost& g) { return g.host == host && g.port == port; });
  }
  bool PushRules() const {
    return !credentials.git_rules.push.allow_refs.empty() || credentials.git_rules.push.deny_force;
  }
};

namespace {

// "https://git.example:8443/acme/*" → host and port.
std::optional<std::pair<std::string, std::uint16_t>> RemoteHost(const std::string& remote) {
  constexpr std::string_view kScheme = "https://";
  if (remote.rfind(kScheme, 0) != 0) return std::nullopt;
  std::string_view rest = std::string_view(remote).substr(kScheme.size());
  std::string_view authority = rest.substr(0, rest.find('/'));
  auto split = SplitAuthority(authority, 443);
  if (!split) return std::nullopt;
  auto host = NormaliseHost(split->first);
  if (!host.ok()) return std::nullopt;
  return std::make_pair(*host, split->second);
}

}  // namespace

Terminator::~Terminator() = default;

Result<std::unique_ptr<Terminator>> Terminator::Create(const CredentialsSpec& credentials,
                                                       const std::vector<HttpRuleSpec>& http_rules,
                                                       std::shared_ptr<SecretStore> secrets,
                                                       TerminatorOptions options) {
  std::unique_ptr<Terminator> t(new Terminator());
  t->impl_ = std::make_unique<Impl>();
  Impl& impl = *t->impl_;
  impl.credentials = credentials;
  impl.options = options;
  t->secrets_ = std::move(secrets);
  auto add_name = [&](const std::string& n) {
    if (std::find(impl.names.begin(), impl.names.end(), n) == impl.names.end()) impl.names.push_back(n);
  };
  for (const auto& spec : credentials.secrets) {
    std::vector<Rule> rules;
    for (const auto& h : spec.hosts) {
      auto rule = ParseRule(h, ListKind::kAllow);
      if (!rule.ok()) {
        return Status::Error("credentials", "credentials.secrets." + spec.name + ".hosts: " + rule.status().message());
      }
      add_name(rule->kind == RuleKind::kSuffix ? "*." + rule->host : rule->host);
      rules.push_back(std::move(*rule));
    }
    impl.secret_hosts.push_back(std::move(rules));
  }
  auto rules = HttpRuleSet::Build(http_rules);
  if (!rules.ok()) return Status::Error("network", "network.http_rules: " + rules.status().message());
  impl.http_rules = std::move(*rules);
  for (const auto& h : impl.http_rules.hosts()) add_name(h);
  for (const auto& remote : credentials.git_rules.remotes) {
    auto hp = RemoteHost(remote);
    if (!hp) return Status::Error("credentials", "credentials.git.remotes: cannot read the host of " + remote);
    impl.git_hosts.push_back({hp->first, hp->second});
    add_name(hp->first);
  }
  auto ca = RunCa::Create(impl.names);
  if (!ca.ok()) return ca.status();
  impl.ca = std::move(*ca);
  auto upstream = MakeUpstreamContext();
  if (!upstream.ok()) return upstream.status();
  impl.upstream_ctx = std::move(*upstream);
  impl.upstream_sessions = std::make_unique<UpstreamSessions>(impl.upstream_ctx.get());
  return t;
}

bool Terminator::Covers(const std::string& host) const {
  for (std::size_t i = 0; i < impl_->secret_hosts.size(); ++i) {
    if (impl_->Owns(i, host)) return true;
  }
  if (impl_->http_rules.Covers(host)) return true;
  return std::any_of(impl_->git_hosts.begin(), impl_->git_hosts.end(),
                     [&](const Impl::GitHost& g) { return g.host == host; });
}

std::vector<std::string> Terminator::Names() const { return impl_->names; }
const std::string& Terminator::ca_pem() const { return impl_->ca->certificate_pem(); }

std::optional<std::size_t> Terminator::LeakedPlaceholder(std::string_view data, const std::string& host) const {
  for (std::size_t i = 0; i < secrets_->specs().size(); ++i) {
    if (impl_->Owns(i, host)) continue;
    if (data.find(secrets_->placeholder(i)) != std::string_view::npos) return i;
  }
  return std::nullopt;
}

std::string RequestRecord::ToJsonText() const {
  nlohmann::json j = {{"method", method}, {"path", path}, {"decision", decision}, {"status", status}};
  if (!facet.empty()) j["facet"] = facet;
  if (!op.empty()) j["op"] = op;
  if (!reason.empty()) j["reason"] = reason;
  if (!rule.empty()) j["rule"] = rule;
  if (!secrets.empty()) j["secrets"] = secrets;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// --- one terminated connection --------------------------------------------------------

namespace {

class Connection : public Terminator::Handle, public std::enable_shared_from_this<Connection> {
 public:
  Connection(Terminator::Impl& t, SecretStore& secrets, tcp::socket& client, tcp::socket& upstream,
             std::string hello, std::string host, std::uint16_t port, std::shared_ptr<void> keep,
             Terminator::Done done)
      : t_(t),
        secrets_(secrets),
        client_sock_(client),
        upstream_sock_(upstream),
        hello_(std::move(hello)),
        host_(std::move(host)),
        port_(port),
        keep_(std::move(keep)),
        done_(std::move(done)),
        timer_(client.get_executor()),
        upstream_wait_(client.get_executor()) {
    ++t_.open_connections;
  }
  ~Connection() override { --t_.open_connections; }

  void Start() {
    ++coroutines_;
    asio::co_spawn(client_sock_.get_executor(), Run(), [self = shared_from_this()](std::exception_ptr e) {
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& ex) {
          self->SetError("internal", std::string("terminator: ") + ex.what());
        } catch (...) {
          self->SetError("internal", "terminator: unknown exception");
        }
      }
      self->Finish();
    });
  }

 private:
  struct Decision {
    bool refused = false;
    std::string response;  // refused: the whole response to send
    RequestRecord record;
    std::vector<std::size_t> inject;  // secrets to add to the request
    bool check_push = false;
    GitRequest git;
  };

  awaitable<void> Run();
  awaitable<bool> ReadHead(TlsStream& client, beast::flat_buffer& buf, RequestHead& head, bool first);
  Decision Decide(const RequestHead& head, std::string_view raw_head);
  awaitable<bool> Exchange(TlsStream& client, TlsStream& up, beast::flat_buffer& cbuf, beast::flat_buffer& ubuf,
                           RequestHead head, Decision d);
  awaitable<bool> SendBody(TlsStream& client, TlsStream& up, beast::flat_buffer& cbuf, const RequestHead& head,
                           Decision& d);
  awaitable<bool> SendBufferedPush(TlsStream& client, TlsStream& up, beast::flat_buffer& cbuf, RequestHead& head,
                                   Decision& d);
  awaitable<bool> Relay(TlsStream& client, TlsStream& up, beast::flat_buffer& ubuf, const RequestHead& head,
                        Decision& d);
  Status Inject(RequestHead& head, Decision& d);

  // A value injected on this connection, to be masked in responses: as it
  // is, percent-encoded (upper- and lower-case hex: an echoed URL) and
  // JSON-escaped ("\/", "\"", "\\": an echoed field in a JSON body).
  void AddMasked(std::string_view value) {
    static const char kUpper[] = "0123456789ABCDEF";
    static const char kLower[] = "0123456789abcdef";
    std::string forms[4];
    forms[0].assign(value);
    for (unsigned char c : value) {
      const bool unreserved = std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~';
      for (int k = 1; k <= 2; ++k) {
        const char* digits = k == 1 ? kUpper : kLower;
        if (unreserved) {
          forms[k] += static_cast<char>(c);
        } else {
          forms[k] += '%';
          forms[k] += digits[c >> 4];
          forms[k] += digits[c & 15];
        }
      }
      if (c == '/' || c == '"' || c == '\\') forms[3] += '\\';
      forms[3] += static_cast<char>(c);
    }
    // One locked page for all of a value's forms (one mmap and mlock, not four).
    std::string all;
    std::vector<std::pair<std::size_t, std::size_t>> spans;
    for (auto& form : forms) {
      const bool seen = std::any_of(injected_.begin(), injected_.end(), [&](std::string_view v) { return v == form; }) ||
                        std::any_of(spans.begin(), spans.end(), [&](const auto& sp) {
                          return std::string_view(all).substr(sp.first, sp.second) == form;
                        });
      if (!seen) {
        spans.emplace_back(all.size(), form.size());
        all += form;
      }
      Wipe(form);
    }
    auto copy = LockedBytes::Copy(all);
    Wipe(all);
    if (!copy.ok()) return;
    for (const auto& [at, n] : spans) injected_.push_back(copy->view().substr(at, n));
    injected_storage_.push_back(std::move(*copy));
  }

  // The head, serialised (and checked), to the host; the bytes that carried
  // a value are zeroed once sent. False: refused or the host is gone.
  awaitable<bool> SendHead(TlsStream& client, TlsStream& up, const RequestHead& head, Decision& d) {
    auto serialised = SerialiseRequestHead(head);
    if (!serialised.ok()) co_return co_await RefuseUnsendable(client, d, serialised.status());
    std::string wire = std::move(*serialised);
    const bool ok = co_await WriteView(up, wire, &up_bytes_);
    Wipe(wire);
    if (!ok) {
      d.record.decision = "error";
      d.record.reason = "upstream closed";
    }
    co_return ok;
  }

  // A head that does not serialise back to the same request (a secret's
  // value with a line break, say): nothing goes upstream.
  awaitable<bool> RefuseUnsendable(TlsStream& client, Decision& d, const Status& why) {
    d.record.decision = "error";
    d.record.reason = "the request cannot be sent on: " + why.message();
    d.record.status = 502;
    co_await Write(client, SimpleResponse(502, "", "agentbox: " + d.record.reason), &down_bytes_);
    co_return false;
  }

  // Writes all of `data`, which the coroutine owns (a temporary passed in
  // stays alive across the suspension whatever the compiler makes of the
  // full-expression). False: the peer is gone.
  awaitable<bool> Write(TlsStream& s, std::string data, std::uint64_t* count) {
    co_return co_await WriteView(s, data, count);
  }
  // For bytes that stay put until the write is done (a member, a buffer of
  // the caller's frame).
  awaitable<bool> WriteView(TlsStream& s, std::string_view data, std::uint64_t* count) {
    const bool ok = co_await s.WriteAll(data);
    if (ok && count != nullptr) *count += data.size();
    co_return ok;
  }

  // The upstream's handshake, started as soon as the client's is done and
  // run alongside the client's first request; Exchange waits for it.
  awaitable<void> UpstreamHandshake() {
    upstream_ok_ = co_await upstream_tls_->Handshake(TlsSocket::Role::kClient);
    upstream_done_ = true;
    upstream_wait_.cancel();
  }

  void Arm(std::chrono::milliseconds after, std::string what) {
    ++gen_;
    timer_.expires_after(after);
    timer_.async_wait([self = shared_from_this(), gen = gen_, what = std::move(what)](error_code ec) {
      if (ec || gen != self->gen_) return;
      self->timed_out_ = what;
      error_code ignored;
      self->client_sock_.close(ignored);
      self->upstream_sock_.close(ignored);
    });
  }
  void Disarm() {
    ++gen_;
    timer_.cancel();
  }

  void SetError(const std::string& reason, const std::string& message) {
    if (!outcome_.decision.empty()) return;
    outcome_.decision = "error";
    outcome_.reason = reason;
    outcome_.message = message;
  }
  void Record(RequestRecord r) { outcome_.requests.push_back(std::move(r)); }

  // Run has ended: the record goes out now. The caller's object (and its
  // sockets) is let go of only when no coroutine of this connection is left
  // that could still touch a socket (the upstream's handshake may be under
  // way: the caller's Close ends it).
  void Finish() {
    Disarm();
    auto done = std::move(done_);
    done_ = nullptr;
    if (done) done(Conclude());
    CoroutineEnded();
  }
  void CoroutineEnded() {
    if (--coroutines_ == 0) keep_.reset();
  }

  // The caller closes the sockets next: the coroutine then ends on its own
  // (its operations complete, aborted) and lets go of the caller's object
  // only then, since it still refers to the sockets until it has.
  Terminator::Outcome Abort() override {
    done_ = nullptr;
    return Conclude();
  }

  // The connection's record from its requests: allowed if any request was.
  Terminator::Outcome Conclude() {
    if (!timed_out_.empty() && outcome_.decision.empty()) {
      SetError("timeout", timed_out_ + " did not finish in time");
    }
    Terminator::Outcome out = outcome_;
    bool allowed = false;
    const RequestRecord* first_denial = nullptr;
    for (const auto& r : out.requests) {
      if (r.decision == "allow") allowed = true;
      if (r.decision == "deny" && first_denial == nullptr) first_denial = &r;
    }
    if (allowed) {
      out.decision = "allow";
      out.reason.clear();
      out.message.clear();
    } else if (first_denial != nullptr) {
      out.decision = "deny";
      out.reason = first_denial->op == "send" ? "placeholder" : first_denial->op;
      out.message = first_denial->reason;
    } else if (out.decision.empty()) {
      out.decision = "error";
      out.reason = "no-request";
      out.message = "the connection carried no complete request";
    }
    out.bytes_up = up_bytes_;
    out.bytes_down = down_bytes_;
    return out;
  }

  Terminator::Impl& t_;
  SecretStore& secrets_;
  tcp::socket& client_sock_;
  tcp::socket& upstream_sock_;
  std::string hello_;
  std::string host_;
  std::uint16_t port_;
  std::shared_ptr<void> keep_;
  Terminator::Done done_;
  asio::steady_timer timer_;
  std::uint64_t gen_ = 0;
  std::string timed_out_;
  Terminator::Outcome outcome_;
  std::optional<TlsSocket> client_tls_;
  std::optional<TlsSocket> upstream_tls_;
  asio::steady_timer upstream_wait_;
  int coroutines_ = 0;  // Run and the upstream's handshake, while they run
  bool upstream_done_ = false;  // the TLS handshake with the host has ended
  bool upstream_ok_ = false;    // ... and succeeded
  std::uint64_t up_bytes_ = 0;
  std::uint64_t down_bytes_ = 0;
  // The values injected on this connection (basic credentials in their
  // encoded form too), masked in responses.
  std::vector<LockedBytes> injected_storage_;
  std::vector<std::string_view> injected_;  // into injected_storage_ (whose pages never move)
};

awaitable<void> Connection::Run() {
  auto server = t_.ca->ServerContext(host_);
  if (!server.ok()) {
    SetError("tls-setup", server.status().message());
    co_return;
  }
  client_tls_.emplace(client_sock_, *server, std::move(hello_));
  TlsSocket& client = *client_tls_;
  Arm(t_.options.header_timeout, "the TLS handshake with the client");
  if (!co_await client.Handshake(TlsSocket::Role::kServer)) {
    SetError("client-tls", "TLS handshake with the client failed: " + client.error());
    co_return;
  }
  upstream_tls_.emplace(upstream_sock_, t_.upstream_ctx.get());
  TlsSocket& up = *upstream_tls_;
  if (Status s = PrepareUpstream(up.native_handle(), host_); !s.ok()) {
    SetError("upstream-tls", s.message());
    co_return;
  }
  t_.upstream_sessions->Offer(up.native_handle(), host_);
  // The handshake with the host runs alongside the client's first request:
  // it carries nothing of the request (the host was allowed already, and
  // the TCP connection to it is open), and no byte of a request goes to
  // the host before the request is decided.
  ++coroutines_;
  asio::co_spawn(client_sock_.get_executor(),
                 [self = shared_from_this()]() -> awaitable<void> { co_await self->UpstreamHandshake(); },
                 [self = shared_from_this()](std::exception_ptr) { self->CoroutineEnded(); });
  beast::flat_buffer cbuf, ubuf;
  for (bool first = true;; first = false) {
    RequestHead head;
    const bool read = co_await ReadHead(client, cbuf, head, first);
    if (!read) break;
    std::string_view raw(static_cast<const char*>(cbuf.data().data()), head.head_size);
    Decision d = Decide(head, raw);
    if (d.refused) {
      Arm(t_.options.header_timeout, "the refusal");
      d.record.status = d.record.status == 0 ? 403 : d.record.status;
      Record(d.record);
      co_await Write(client, d.response, &down_bytes_);
      break;
    }
    const bool again = co_await Exchange(client, up, cbuf, ubuf, std::move(head), std::move(d));
    if (!again) break;
  }
  Disarm();
  client.Shutdown();
  if (upstream_ok_) up.Shutdown();
  // The upstream's handshake may still be under way: it ends when the
  // sockets close, and holds this object until then.
}

// Reads one request head. False: the client closed between requests, or the
// head was refused (the refusal is sent and recorded here).
awaitable<bool> Connection::ReadHead(TlsStream& client, beast::flat_buffer& buf, RequestHead& head, bool first) {
  Arm(first ? t_.options.header_timeout : t_.options.idle_timeout,
      first ? std::string("the first request") : std::string("the next request"));
  bool started = buf.size() > 0;
  RequestHeadParser parser(t_.options.header_limit);
  while (true) {
    if (buf.size() > 0) {
      if (!started) {
        started = true;
        Arm(t_.options.header_timeout, "the request head");
      }
      std::string_view data(static_cast<const char*>(buf.data().data()), buf.size());
      HeadParse p = parser.Parse(data);
      if (p.state == ParseState::kDone) {
        head = std::move(p.head);
        co_return true;
      }
      if (p.state == ParseState::kError) {
        RequestRecord r;
        r.decision = "deny";
        r.facet = "network";
        r.op = "request";
        r.reason = p.reason;
        r.status = p.status;
        Record(r);
        Arm(t_.options.header_timeout, "the refusal");
        co_await Write(client, SimpleResponse(p.status, "bad-request", "agentbox: " + p.reason), &down_bytes_);
        co_return false;
      }
    }
    auto space = buf.prepare(kReadChunk);
    const long n = co_await client.ReadSome(space.data(), space.size());
    if (n <= 0) co_return false;  // closed (or timed out: Finish names it when nothing was served)
    buf.commit(static_cast<std::size_t>(n));
  }
}

Connection::Decision Connection::Decide(const RequestHead& head, std::string_view raw_head) {
  Decision d;
  RequestRecord& r = d.record;
  r.method = head.method;
  const std::string_view target = head.target;
  const std::string_view query = target.find('?') == std::string_view::npos ? "" : target.substr(target.find('?') + 1);
  auto refuse = [&](int status, const std::string& facet, const std::string& op, const std::string& denied,
                    const std::string& reason, const std::string& rule) {
    d.refused = true;
    r.decision = "deny";
    r.facet = facet;
    r.op = op;
    r.reason = reason;
    r.rule = rule;
    r.status = status;
    std::string line = "agentbox: " + reason;
    if (!rule.empty()) line += " (rule: " + rule + ")";
    // The header names the reason and, where one decided, the rule.
    d.response = SimpleResponse(status, rule.empty() ? denied : denied + "; rule=" + rule, line);
    return d;
  };
  auto path = NormaliseRequestPath(target);
  if (!path.ok()) return refuse(400, "network", "request", "bad-request", "bad request path: " + path.status().message(), "");
  r.path = *path;
  // The Host field must name the host that was allowed and whose
  // certificate was presented: anything else is a request smuggled to
  // another virtual host behind the same address.
  auto authority = SplitAuthority(head.host, port_);
  auto named = authority ? NormaliseHost(authority->first) : Result<std::string>(Status::Error("host", "malformed"));
  if (!named.ok() || *named != host_ || authority->second != port_) {
    return refuse(400, "network", "request", "host-mismatch",
                  "the Host field (" + head.host.substr(0, 255) + ") does not name the CONNECT target " +
                      TargetText(host_, port_),
                  "");
  }
  for (std::size_t i = 0; i < secrets_.specs().size(); ++i) {
    if (t_.Owns(i, host_)) continue;
    if (raw_head.find(secrets_.placeholder(i)) != std::string_view::npos) {
      return refuse(403, "credentials", "send", "placeholder",
                    "placeholder for " + secrets_.specs()[i].name + " sent to " + host_, "credentials.secrets." +
                        secrets_.specs()[i].name + ".hosts");
    }
  }
  if (t_.http_rules.Covers(host_)) {
    HttpRuleVerdict v = t_.http_rules.Check(host_, head.method, *path);
    if (!v.allowed) return refuse(403, "network", "request", "http-rule", v.message, v.rule);
    r.rule = v.rule;
  }
  // git is classified on the path as servers route it: without the
  // ";params" of its segments (servlet containers drop them), and
  // ".../info/refs" is git's whatever its query says.
  const std::string git_path = WithoutParams(*path);
  d.git = ClassifyGitRequest(head.method, git_path, query);
  if (d.git.service == GitService::kNone && git_path.ends_with("/info/refs")) {
    d.git.service = GitService::kUploadPack;
    d.git.advertisement = true;
    d.git.repo_path = git_path.substr(0, git_path.size() - std::string_view("/info/refs").size());
  }
  bool credentials_allowed = true;
  const auto& remotes = t_.credentials.git_rules.remotes;
  if (!remotes.empty() && t_.IsGitHost(host_, port_)) {
    // On a host that credentials.git.remotes names, credentials go only to
    // what lies under a remote: smart HTTP by its repository, anything else
    // (the dumb protocol, an API beside the repositories) by its path.
    credentials_allowed = d.git.service != GitService::kNone ? RemoteMatches(remotes, host_, port_, d.git.repo_path)
                                                             : UnderARemote(remotes, host_, port_, git_path);
    if (!credentials_allowed) {
      r.reason = "no credentials: " + (d.git.service != GitService::kNone ? d.git.repo_path : git_path) +
                 " is not in credentials.git.remotes";
    }
  }
  d.check_push = d.git.service == GitService::kReceivePack && !d.git.advertisement && t_.PushRules();
  if (credentials_allowed) {
    for (std::size_t i = 0; i < secrets_.specs().size(); ++i) {
      if (t_.Owns(i, host_)) d.inject.push_back(i);
    }
  }
  r.decision = "allow";
  return d;
}

// Adds the host's secrets to the head. Errors (a secret that cannot be
// read) name the secret and its source.
Status Connection::Inject(RequestHead& head, Decision& d) {
  std::string unsendable;
  for (std::size_t i : d.inject) {
    const SecretSpec& spec = secrets_.specs()[i];
    const std::string& placeholder = secrets_.placeholder(i);
    Status used = secrets_.WithValue(i, [&](std::string_view value) {
      std::string text;
      switch (spec.inject.kind) {
        case SecretInjection::Kind::kHeader: {
          const std::size_t at = spec.inject.format.find("{}");
          text = spec.inject.format.substr(0, at);
          text.append(value);
          if (at != std::string::npos) text += spec.inject.format.substr(at + 2);
          head.Set(spec.inject.header, std::move(text));
          break;
        }
        case SecretInjection::Kind::kBasic: {
          std::string pair = spec.inject.username + ":";
          pair.append(value);
          std::string encoded = Base64(pair);
          Wipe(pair);
          AddMasked(encoded);
          head.Set("Authorization", "Basic " + encoded);
          Wipe(encoded);
          break;
        }
        case SecretInjection::Kind::kPlaceholder: {
          auto replace = [&](std::string& s, bool in_target) {
            for (std::size_t at = s.find(placeholder); at != std::string::npos;
                 at = s.find(placeholder, at + value.size())) {
              // In the target, a placeholder right after "%" or "%X" would
              // join a percent-escape with the value's first bytes: the
              // host would decode something else, which the masking of
              // responses could not recognise.
              if (in_target && ((at >= 1 && s[at - 1] == '%') || (at >= 2 && s[at - 2] == '%'))) {
                unsendable = "the placeholder of " + spec.name + " follows a '%' in the request target";
                return;
              }
              s.replace(at, placeholder.size(), value);
            }
          };
          replace(head.target, true);
          for (auto& [name, v] : head.fields) replace(v, false);
          break;
        }
      }
      AddMasked(value);
    });
    if (!used.ok()) return used;
    if (!unsendable.empty()) return Status::Error("credentials", unsendable);
    d.record.secrets.push_back(spec.name);
  }
  // A response the masking cannot read (compressed) could carry an echoed
  // value back: a request that carries a secret asks for none.
  if (!d.record.secrets.empty()) head.Set("Accept-Encoding", "identity");
  return {};
}

// One request and its response. False: the connection ends after it.
awaitable<bool> Connection::Exchange(TlsStream& client, TlsStream& up, beast::flat_buffer& cbuf,
                                     beast::flat_buffer& ubuf, RequestHead head, Decision d) {
  // The head carries the injected values from here on: zeroed when done.
  struct WipeHead {
    RequestHead& h;
    ~WipeHead() {
      Wipe(h.target);
      for (auto& field : h.fields) Wipe(field.second);
    }
  } wipe_head{head};
  head.Remove("Proxy-Authorization");
  head.Remove("Proxy-Connection");
  // The host gets its name as it was checked, not as the client spelled it
  // (a trailing dot, upper case): a shared front end routes on it.
  {
    auto authority = SplitAuthority(head.host, std::nullopt);
    head.Set("Host", authority ? TargetText(host_, port_) : (host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_));
  }
  // A transfer coding the relay does not frame (TE: gzip) is not asked for.
  head.Remove("TE");
  // The proxy answers 100-continue itself once it has decided; upstream
  // gets the body straight away.
  bool expect_continue = false;
  if (const std::string* e = head.Field("Expect"); e != nullptr && IEquals(*e, "100-continue")) {
    expect_continue = true;
    head.Remove("Expect");
  }
  if (!upstream_done_) {
    error_code ec;
    Arm(t_.options.header_timeout, "the TLS handshake with " + TargetText(host_, port_));
    upstream_wait_.expires_at(asio::steady_timer::time_point::max());
    co_await upstream_wait_.async_wait(asio::redirect_error(use_awaitable, ec));
  }
  if (!upstream_ok_) {
    const std::string why = "TLS to " + TargetText(host_, port_) + " failed: " +
                            (upstream_done_ ? up.error() : std::string("the handshake did not end"));
    d.record.decision = "error";
    d.record.reason = why;
    d.record.status = 502;
    Record(d.record);
    SetError("upstream-tls", why);
    co_await Write(client, SimpleResponse(502, "", "agentbox: " + why), &down_bytes_);
    co_return false;
  }
  if (Status s = Inject(head, d); !s.ok()) {
    d.record.decision = "error";
    d.record.reason = s.message();
    d.record.status = 502;
    Record(d.record);
    co_await Write(client, SimpleResponse(502, "", "agentbox: " + s.message()), &down_bytes_);
    co_return false;
  }
  if (expect_continue) {
    const bool ok = co_await Write(client, "HTTP/1.1 100 Continue\r\n\r\n", &down_bytes_);
    if (!ok) co_return false;
  }
  Arm(t_.options.idle_timeout, "the request body");
  bool sent = false;
  if (d.check_push) {
    sent = co_await SendBufferedPush(client, up, cbuf, head, d);
  } else {
    sent = co_await SendBody(client, up, cbuf, head, d);
  }
  if (!sent || d.refused) {
    Record(d.record);
    co_return false;
  }
  const bool again = co_await Relay(client, up, ubuf, head, d);
  Record(d.record);
  co_return again;
}

awaitable<bool> Connection::SendBody(TlsStream& client, TlsStream& up, beast::flat_buffer& cbuf,
                                     const RequestHead& head, Decision& d) {
  if (!co_await SendHead(client, up, head, d)) co_return false;
  // Beast takes the body's framing from the head the strict parser passed.
  http::request_parser<http::buffer_body> p;
  p.header_limit(static_cast<std::uint32_t>(t_.options.header_limit));
  p.body_limit(std::numeric_limits<std::uint64_t>::max());
  error_code ec;
  p.put(asio::buffer(cbuf.data().data(), head.head_size), ec);
  cbuf.consume(head.head_size);
  if (ec || !p.is_header_done()) {
    d.record.decision = "error";
    d.record.reason = "request head: " + ec.message();
    co_return false;
  }
  p.eager(true);
  std::vector<std::pair<std::size_t, std::string_view>> needles;
  for (std::size_t i = 0; i < secrets_.specs().size(); ++i) {
    if (!t_.Owns(i, host_)) needles.emplace_back(i, secrets_.placeholder(i));
  }
  Finder finder(std::move(needles));
  const bool chunked = head.framing == BodyFraming::kChunked;
  std::vector<char> buf(kRelayChunk);
  while (!p.is_done()) {
    p.get().body().data = buf.data();
    p.get().body().size = buf.size();
    Arm(t_.options.idle_timeout, "the request body");  // idle, not total: a long upload is fine
    ec = co_await Feed(client, cbuf, p, [&] { return p.is_done() || p.get().body().size < buf.size(); });
    if (ec) {
      d.record.decision = "error";
      d.record.reason = "request body: " + ec.message();
      co_return false;
    }
    const std::size_t n = buf.size() - p.get().body().size;
    if (n == 0) continue;
    std::string_view piece(buf.data(), n);
    if (finder.active()) {
      if (auto leaked = finder.Feed(piece)) {
        // The head went out already: the request is cut short, which no
        // server takes for a complete one.
        const std::string& name = secrets_.specs()[*leaked].name;
        d.refused = true;
        d.record.decision = "deny";
        d.record.facet = "credentials";
        d.record.op = "send";
        d.record.reason = "placeholder for " + name + " sent to " + host_ + " (in the request body)";
        d.record.rule = "credentials.secrets." + name + ".hosts";
        d.record.status = 403;
        error_code ignored;
        upstream_sock_.close(ignored);
        co_await Write(client, SimpleResponse(403, "placeholder", "agentbox: " + d.record.reason), &down_bytes_);
        co_return false;
      }
    }
    bool ok = false;
    if (chunked) {
      ok = co_await Write(up, Chunk(piece), &up_bytes_);
    } else {
      ok = co_await WriteView(up, piece, &up_bytes_);
    }
    if (!ok) co_return false;
  }
  if (chunked) {
    const bool ok = co_await Write(up, "0\r\n\r\n", &up_bytes_);
    if (!ok) co_return false;
  }
  co_return true;
}

// A git push, read whole, checked against credentials.git.push, then sent
// on or answered with git's own refusal.
awaitable<bool> Connection::SendBufferedPush(TlsStream& client, TlsStream& up, beast::flat_buffer& cbuf,
                                             RequestHead& head, Decision& d) {
  auto refuse_plain = [&](int status, const std::string& reason) -> awaitable<bool> {
    d.refused = true;
    d.record.decision = "deny";
    d.record.facet = "credentials";
    d.record.op = "git-push";
    d.record.reason = reason;
    d.record.status = status;
    co_await Write(client, SimpleResponse(status, "git-push", "agentbox: " + reason), &down_bytes_);
    co_return false;
  };
  if (const std::string* enc = head.Field("Content-Encoding"); enc != nullptr && !IEquals(*enc, "identity")) {
    co_return co_await refuse_plain(415, "a compressed receive-pack request (" + *enc + ") cannot be checked");
  }
  // The push is held whole while it is checked: it reserves what it may
  // grow to (its Content-Length, or the limit) from the budget all pushes
  // share, and gives it back when this returns.
  const std::size_t budget_left = t_.options.git_push_budget - t_.push_bytes_reserved;
  std::size_t limit = std::min(t_.options.git_push_limit, budget_left);
  if (head.framing == BodyFraming::kLength) {
    if (head.content_length > t_.options.git_push_limit) {
      co_return co_await refuse_plain(413, "a push larger than " + std::to_string(t_.options.git_push_limit >> 20) +
                                               " MiB cannot be checked against credentials.git.push");
    }
    if (head.content_length > budget_left) {
      co_return co_await refuse_plain(503, "other pushes being checked hold the memory this one needs: push again");
    }
    limit = head.content_length;
  }
  if (limit == 0 && head.framing == BodyFraming::kChunked) {
    co_return co_await refuse_plain(503, "other pushes being checked hold the memory this one needs: push again");
  }
  struct Reservation {
    std::size_t& reserved;
    std::size_t bytes;
    ~Reservation() { reserved -= bytes; }
  } reservation{t_.push_bytes_reserved, limit};
  t_.push_bytes_reserved += limit;
  http::request_parser<http::string_body> p;
  p.header_limit(static_cast<std::uint32_t>(t_.options.header_limit));
  p.body_limit(limit);
  error_code ec;
  p.put(asio::buffer(cbuf.data().data(), head.head_size), ec);
  cbuf.consume(head.head_size);
  p.eager(true);
  if (!ec && !p.is_done()) ec = co_await Feed(client, cbuf, p, [&] { return p.is_done(); });
  if (ec == http::error::body_limit) {
    if (limit < t_.options.git_push_limit) {
      co_return co_await refuse_plain(503, "other pushes being checked hold the memory this one needs: push again");
    }
    co_return co_await refuse_plain(413, "a push larger than " + std::to_string(t_.options.git_push_limit >> 20) +
                                             " MiB cannot be checked against credentials.git.push");
  }
  if (ec) {
    d.record.decision = "error";
    d.record.reason = "receive-pack body: " + ec.message();
    co_return false;
  }
  const std::string& body = p.get().body();
  for (std::size_t i = 0; i < secrets_.specs().size(); ++i) {
    if (!t_.Owns(i, host_) && body.find(secrets_.placeholder(i)) != std::string::npos) {
      const std::string& name = secrets_.specs()[i].name;
      d.refused = true;
      d.record.decision = "deny";
      d.record.facet = "credentials";
      d.record.op = "send";
      d.record.reason = "placeholder for " + name + " sent to " + host_ + " (in a push)";
      d.record.rule = "credentials.secrets." + name + ".hosts";
      d.record.status = 403;
      co_await Write(client, SimpleResponse(403, "placeholder; rule=" + d.record.rule, "agentbox: " + d.record.reason),
                     &down_bytes_);
      co_return false;
    }
  }
  auto request = ParseReceivePack(body);
  if (!request.ok()) {
    co_return co_await refuse_plain(400, "malformed receive-pack request: " + request.status().message());
  }
  PushVerdict verdict = CheckPush(t_.credentials.git_rules.push, *request);
  if (!verdict.allowed()) {
    d.refused = true;
    d.record.decision = "deny";
    d.record.facet = "credentials";
    d.record.op = "git-push";
    d.record.reason = verdict.refused.front().reason;
    d.record.rule = "credentials.git.push";
    d.record.path = d.git.repo_path + " " + verdict.refused.front().update.ref;
    d.record.status = 200;
    // git reads a refusal from the receive-pack result (report-status),
    // and prints its text as "remote: ..." and "[remote rejected]".
    std::string result = RefusalResponseBody(*request, verdict);
    std::string response =
        "HTTP/1.1 200 OK\r\nContent-Type: application/x-git-receive-pack-result\r\nCache-Control: no-cache\r\n"
        "X-Agentbox-Denied: git-push\r\nContent-Length: " +
        std::to_string(result.size()) + "\r\nConnection: close\r\n\r\n" + result;
    co_await Write(client, response, &down_bytes_);
    co_return false;
  }
  head.Remove("Transfer-Encoding");
  head.Set("Content-Length", std::to_string(body.size()));
  head.framing = BodyFraming::kLength;
  head.content_length = body.size();
  if (!co_await SendHead(client, up, head, d)) co_return false;
  const bool sent = co_await WriteView(up, body, &up_bytes_);
  co_return sent;
}

// The upstream's response, relayed with every injected value masked. True:
// both sides keep the connection for another request.
awaitable<bool> Connection::Relay(TlsStream& client, TlsStream& up, beast::flat_buffer& ubuf,
                                  const RequestHead& head, Decision& d) {
  Redactor redactor;
  for (std::string_view v : injected_) redactor.Add(v);
  error_code ec;
  std::vector<char> buf(kRelayChunk);
  while (true) {
    http::response_parser<http::buffer_body> p;
    p.header_limit(static_cast<std::uint32_t>(t_.options.header_limit));
    p.body_limit(std::numeric_limits<std::uint64_t>::max());
    if (head.method == "HEAD") p.skip(true);
    Arm(t_.options.idle_timeout, "the response of " + TargetText(host_, port_));
    ec = co_await Feed(up, ubuf, p, [&] { return p.is_header_done(); });
    if (ec) {
      d.record.decision = "error";
      d.record.reason = "upstream response: " + ec.message();
      d.record.status = 502;
      co_await Write(client, SimpleResponse(502, "", "agentbox: no response from " + TargetText(host_, port_) + ": " +
                                                         ec.message()),
                     &down_bytes_);
      co_return false;
    }
    auto& m = p.get();
    const int status = static_cast<int>(m.result_int());
    if (status == 101) {
      d.record.decision = "error";
      d.record.reason = "the upstream switched protocols, which the terminator does not relay";
      co_return false;
    }
    if (redactor.active() && status / 100 != 1) {
      auto enc = m.find(http::field::content_encoding);
      if (enc != m.end() && !IEquals(std::string_view(enc->value().data(), enc->value().size()), "identity")) {
        // Asked for identity, answered compressed: nothing of it can be
        // shown to be free of the value, so none of it is passed on.
        d.record.decision = "error";
        d.record.reason = "the response of " + TargetText(host_, port_) + " is compressed (" +
                          std::string(enc->value()) + "), which the masking of injected values cannot read";
        d.record.status = 502;
        co_await Write(client, SimpleResponse(502, "", "agentbox: " + d.record.reason), &down_bytes_);
        co_return false;
      }
    }
    std::string wire = "HTTP/" + std::to_string(m.version() / 10) + "." + std::to_string(m.version() % 10) + " " +
                       std::to_string(status) + " " + std::string(m.reason()) + "\r\n";
    for (const auto& f : m) {
      wire += std::string(f.name_string()) + ": " + std::string(f.value()) + "\r\n";
    }
    wire += "\r\n";
    std::string head_out = redactor.active() ? redactor.Feed(wire) + redactor.Flush() : wire;
    const bool head_sent = co_await Write(client, std::move(head_out), &down_bytes_);
    if (!head_sent) co_return false;
    if (status / 100 == 1) continue;  // 100, 103: the final response follows
    d.record.status = status;
    const bool chunked = p.chunked();
    const bool keep = m.keep_alive() && head.version == 11 && !p.need_eof() &&
                      !(head.Field("Connection") != nullptr && IEquals(*head.Field("Connection"), "close"));
    p.eager(true);
    while (!p.is_done()) {
      m.body().data = buf.data();
      m.body().size = buf.size();
      Arm(t_.options.idle_timeout, "the response body of " + TargetText(host_, port_));
      ec = co_await Feed(up, ubuf, p, [&] { return p.is_done() || m.body().size < buf.size(); });
      if (ec) co_return false;
      const std::size_t n = buf.size() - m.body().size;
      if (n == 0) continue;
      if (!redactor.active() && !chunked) {
        // The bulk path: straight from the buffer the parser filled.
        const bool ok = co_await WriteView(client, std::string_view(buf.data(), n), &down_bytes_);
        if (!ok) co_return false;
        continue;
      }
      std::string piece = redactor.active() ? redactor.Feed({buf.data(), n}) : std::string(buf.data(), n);
      if (!piece.empty()) {
        if (chunked) piece = Chunk(piece);
        const bool ok = co_await Write(client, std::move(piece), &down_bytes_);
        if (!ok) co_return false;
      }
    }
    std::string rest = redactor.active() ? redactor.Flush() : std::string();
    if (!rest.empty()) {
      if (chunked) rest = Chunk(rest);
      const bool ok = co_await Write(client, std::move(rest), &down_bytes_);
      if (!ok) co_return false;
    }
    if (chunked) {
      const bool ok = co_await Write(client, "0\r\n\r\n", &down_bytes_);
      if (!ok) co_return false;
    }
    co_return keep;
  }
}

}  // namespace

std::shared_ptr<Terminator::Handle> Terminator::Serve(tcp::socket& client, tcp::socket& upstream,
                                                     std::string client_hello, const std::string& host,
                                                     std::uint16_t port, std::shared_ptr<void> keep_alive, Done done) {
  if (impl_->open_connections >= impl_->options.max_connections) return nullptr;
  auto c = std::make_shared<Connection>(*impl_, *secrets_, client, upstream, std::move(client_hello), host, port,
                                        std::move(keep_alive), std::move(done));
  c->Start();
  return c;
}

}  // namespace agentbox::net
