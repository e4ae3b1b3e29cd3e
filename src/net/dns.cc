#include "net/dns.h"

#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ip/udp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <list>
#include <unordered_set>

namespace agentbox::net {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using udp = asio::ip::udp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::size_t kHeaderSize = 12;
constexpr std::uint16_t kFlagQr = 0x8000;
constexpr std::uint16_t kFlagTc = 0x0200;
constexpr std::uint16_t kFlagRd = 0x0100;
constexpr std::uint16_t kFlagRa = 0x0080;
// The payload size advertised in our OPT records: the usual safe value
// (no fragmentation on any path), and we never need more from a stub.
constexpr std::uint16_t kOurUdpSize = 1232;
constexpr std::size_t kMaxWireName = 255;
// Denials are reported per name; beyond this many names active within a
// second, refusals are still answered but no longer reported one by one.
constexpr std::size_t kMaxTrackedDenials = 4096;
constexpr auto kDenialInterval = std::chrono::seconds(1);
// Queries read from one TCP connection and not yet answered: past this,
// reading pauses until answers have been written (a client that does not
// read its answers cannot make us buffer without bound).
constexpr std::size_t kMaxTcpInFlight = 16;

std::uint16_t Get16(std::string_view w, std::size_t at) {
  return static_cast<std::uint16_t>((static_cast<std::uint8_t>(w[at]) << 8) | static_cast<std::uint8_t>(w[at + 1]));
}
void Put16(std::string& out, std::uint16_t v) {
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v & 0xff));
}
void Put32(std::string& out, std::uint32_t v) {
  Put16(out, static_cast<std::uint16_t>(v >> 16));
  Put16(out, static_cast<std::uint16_t>(v & 0xffff));
}
void Set16(std::string& out, std::size_t at, std::uint16_t v) {
  out[at] = static_cast<char>(v >> 8);
  out[at + 1] = static_cast<char>(v & 0xff);
}

Status Malformed(const std::string& what) { return Status::Error("dns", "malformed query: " + what); }

// The question's name, uncompressed, lower-cased into `name`. A label may
// carry any byte but '.', which the dotted form could not tell apart.
Status ReadQuestionName(std::string_view w, std::size_t* pos, std::string* name) {
  std::size_t p = *pos;
  const std::size_t start = p;
  name->clear();
  while (true) {
    if (p >= w.size()) return Malformed("name runs past the end");
    const auto len = static_cast<std::uint8_t>(w[p]);
    if ((len & 0xc0) == 0xc0) return Malformed("compression pointer in the question");
    if (len & 0xc0) return Malformed("unknown label type");
    ++p;
    if (len == 0) break;
    if (w.size() - p < len) return Malformed("label runs past the end");
    if (p + len - start + 1 > kMaxWireName) return Malformed("name longer than 255 octets");
    if (!name->empty()) name->push_back('.');
    for (std::size_t i = 0; i < len; ++i) {
      char c = w[p + i];
      if (c == '.') return Malformed("'.' inside a label");
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      name->push_back(c);
    }
    p += len;
  }
  if (name->size() > 253) return Malformed("name longer than 253 characters");
  *pos = p;
  return Status();
}

// The one additional record a query may carry: OPT, owned by the root.
Status ReadOpt(std::string_view w, std::size_t* pos, DnsQuery* q) {
  std::size_t p = *pos;
  if (w.size() - p < 11) return Malformed("additional record runs past the end");
  if (w[p] != 0) return Malformed("additional record not owned by the root");
  if (Get16(w, p + 1) != kDnsTypeOpt) return Malformed("additional record other than OPT");
  q->edns = true;
  q->udp_size = std::max<std::uint16_t>(512, Get16(w, p + 3));
  const std::uint16_t rdlen = Get16(w, p + 9);
  p += 11;
  if (w.size() - p < rdlen) return Malformed("OPT data runs past the end");
  // Options are code, length, data; they must fill the data exactly.
  std::size_t o = p;
  const std::size_t end = p + rdlen;
  while (o < end) {
    if (end - o < 4) return Malformed("OPT option header cut short");
    const std::uint16_t olen = Get16(w, o + 2);
    o += 4;
    if (end - o < olen) return Malformed("OPT option runs past its record");
    o += olen;
  }
  *pos = end;
  return Status();
}

// The encoded form of a dotted name; false when it cannot be one.
bool EncodeName(const std::string& name, std::string& out) {
  std::size_t start = 0;
  const std::size_t before = out.size();
  while (start < name.size()) {
    std::size_t dot = name.find('.', start);
    if (dot == std::string::npos) dot = name.size();
    const std::size_t len = dot - start;
    if (len == 0 || len > 63) {
      out.resize(before);
      return false;
    }
    out.push_back(static_cast<char>(len));
    out.append(name, start, len);
    start = dot + 1;
  }
  out.push_back('\0');
  if (out.size() - before > kMaxWireName) {
    out.resize(before);
    return false;
  }
  return true;
}

std::string HeaderOnly(std::uint16_t id, std::uint16_t flags) {
  std::string out;
  out.reserve(kHeaderSize);
  Put16(out, id);
  Put16(out, flags);
  out.append(8, '\0');
  return out;
}

// The name as a person may read it: printable ASCII kept, other bytes as
// \DDD (the zone-file escape).
std::string QuotedName(const std::string& name) {
  std::string out = "\"";
  for (unsigned char c : name) {
    if (c > 0x20 && c < 0x7f && c != '"' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\%03u", c);
      out += buf;
    }
  }
  return out + "\"";
}

}  // namespace

// --- wire format ---------------------------------------------------------------

Result<DnsQuery> ParseDnsQuery(std::string_view wire, std::optional<std::uint16_t>* id_out) {
  if (wire.size() < kHeaderSize) return Malformed("shorter than a header");
  DnsQuery q;
  q.id = Get16(wire, 0);
  if (id_out) *id_out = q.id;
  const std::uint16_t flags = Get16(wire, 2);
  if (flags & kFlagQr) return Malformed("QR set: a response, not a query");
  q.opcode = static_cast<std::uint8_t>((flags >> 11) & 0xf);
  q.recursion_desired = (flags & kFlagRd) != 0;
  if (Get16(wire, 4) != 1) return Malformed("not exactly one question");
  if (Get16(wire, 6) != 0 || Get16(wire, 8) != 0) return Malformed("answer or authority records in a query");
  const std::uint16_t additional = Get16(wire, 10);
  if (additional > 1) return Malformed("more than one additional record");

  std::size_t pos = kHeaderSize;
  if (Status s = ReadQuestionName(wire, &pos, &q.name); !s.ok()) return s;
  if (wire.size() - pos < 4) return Malformed("question cut short");
  q.qtype = Get16(wire, pos);
  q.qclass = Get16(wire, pos + 2);
  pos += 4;
  if (additional == 1) {
    if (Status s = ReadOpt(wire, &pos, &q); !s.ok()) return s;
  }
  if (pos != wire.size()) return Malformed("trailing bytes");
  return q;
}

std::string BuildDnsAnswer(const DnsQuery& q, DnsRcode rcode, const std::vector<IpAddress>& addresses,
                           std::uint32_t ttl, std::size_t max_size) {
  std::string out;
  out.reserve(512);
  Put16(out, q.id);
  std::uint16_t flags = kFlagQr | kFlagRa | static_cast<std::uint16_t>((q.opcode & 0xf) << 11) |
                        static_cast<std::uint16_t>(rcode);
  if (q.recursion_desired) flags |= kFlagRd;
  Put16(out, flags);
  out.append(8, '\0');  // counts, set below
  std::uint16_t questions = 0;
  if (EncodeName(q.name, out)) {
    Put16(out, q.qtype);
    Put16(out, q.qclass);
    questions = 1;
  }
  const std::size_t opt_size = q.edns ? 11 : 0;

  const bool v6 = q.qtype == kDnsTypeAaaa;
  const bool addresses_asked = questions == 1 && (q.qtype == kDnsTypeA || v6);
  const std::size_t rdlen = v6 ? 16 : 4;
  std::size_t count = 0;
  if (addresses_asked) {
    for (const auto& a : addresses) count += a.v6 == v6 ? 1 : 0;
  }
  count = std::min<std::size_t>(count, 0xffff);
  const std::size_t full = out.size() + count * (12 + rdlen) + opt_size;
  if (full > max_size) {
    flags |= kFlagTc;
    Set16(out, 2, flags);
    count = 0;
  }
  std::size_t written = 0;
  for (const auto& a : addresses) {
    if (written == count) break;
    if (a.v6 != v6) continue;
    Put16(out, 0xc000 | kHeaderSize);  // the question's name
    Put16(out, q.qtype);
    Put16(out, kDnsClassIn);
    Put32(out, ttl);
    Put16(out, static_cast<std::uint16_t>(rdlen));
    out.append(reinterpret_cast<const char*>(a.bytes.data()), rdlen);
    ++written;
  }
  if (q.edns) {
    out.push_back('\0');  // root
    Put16(out, kDnsTypeOpt);
    Put16(out, kOurUdpSize);
    Put32(out, 0);  // extended rcode 0, version 0, no DO
    Put16(out, 0);
  }
  Set16(out, 4, questions);
  Set16(out, 6, static_cast<std::uint16_t>(written));
  Set16(out, 10, q.edns ? 1 : 0);
  return out;
}

std::string BuildDnsFormErr(std::uint16_t id) {
  return HeaderOnly(id, kFlagQr | kFlagRa | static_cast<std::uint16_t>(DnsRcode::kFormErr));
}

// --- AddressBook -----------------------------------------------------------------

void AddressBook::Add(const std::string& name, const std::vector<IpAddress>& addresses) {
  std::lock_guard lock(mu_);
  for (const auto& a : addresses) {
    std::string key = a.Unmapped().ToString();
    Entry& e = by_address_[key];
    auto it = std::find(e.names.begin(), e.names.end(), name);
    if (it != e.names.end()) {
      std::rotate(e.names.begin(), it, it + 1);
    } else {
      e.names.insert(e.names.begin(), name);
      if (e.names.size() > kMaxNamesPerAddress) e.names.pop_back();
    }
    e.stamp = ++next_stamp_;
    order_.emplace_back(e.stamp, std::move(key));
  }
  while (by_address_.size() > max_ && !order_.empty()) {
    auto [stamp, key] = std::move(order_.front());
    order_.pop_front();
    auto it = by_address_.find(key);
    if (it != by_address_.end() && it->second.stamp == stamp) by_address_.erase(it);
  }
  if (order_.size() > 2 * by_address_.size() + 1024) Compact();
}

void AddressBook::Compact() {
  std::deque<std::pair<std::uint64_t, std::string>> kept;
  for (auto& [stamp, key] : order_) {
    auto it = by_address_.find(key);
    if (it != by_address_.end() && it->second.stamp == stamp) kept.emplace_back(stamp, std::move(key));
  }
  order_.swap(kept);
}

std::vector<std::string> AddressBook::NamesFor(const IpAddress& address) const {
  const std::string key = address.Unmapped().ToString();
  std::lock_guard lock(mu_);
  auto it = by_address_.find(key);
  if (it == by_address_.end()) return {};
  return it->second.names;
}

// --- the server --------------------------------------------------------------------

namespace {
class TcpConnection;
}

struct DnsServer::Impl : std::enable_shared_from_this<DnsServer::Impl> {
  Impl(asio::io_context& io, Resolver& resolver, Decide decide, OnDenied on_denied, AddressBook& book,
       DnsServerOptions options)
      : io(io), resolver(&resolver), decide(std::move(decide)), on_denied(std::move(on_denied)), book(&book),
        options(options), udp_retry(io), accept_retry(io), denial_sweep(io) {}

  // Where an answer goes: a UDP peer, or a TCP connection (which may be
  // gone by the time the answer is ready).
  struct Origin {
    bool tcp = false;
    udp::endpoint peer;
    std::weak_ptr<TcpConnection> connection;
  };
  struct Waiter {
    DnsQuery query;
    Origin origin;
  };
  struct Deciding {
    std::uint64_t gen = 0;
    bool counted = false;  // its waiters count against max_pending (the decision did not come at once)
    std::vector<Waiter> waiters;
  };
  struct Lookup {
    explicit Lookup(asio::io_context& io) : timer(io) {}
    std::uint64_t gen = 0;
    asio::steady_timer timer;
    std::vector<Waiter> waiters;
  };
  struct CacheEntry {
    bool negative = false;  // the resolver said no: NXDOMAIN
    std::vector<IpAddress> addresses;
    Clock::time_point expiry;
    std::list<std::string>::iterator order;
  };
  struct DenialTrack {
    DnsVerdict verdict;
    std::uint64_t unreported = 0;
    Clock::time_point last_report;
  };
  struct Report {
    std::string name;
    DnsVerdict verdict;
    std::uint64_t count;
  };

  // Receiving.
  void ReceiveUdp();
  void Accept();
  void HandleMessage(std::string_view wire, const Origin& origin);

  // The steps of one query, in order.
  void Serve(DnsQuery q, const Origin& origin);
  void AskDecision(Waiter w);
  void OnVerdict(const std::string& name, std::uint64_t gen, DnsVerdict verdict);
  void Resolve(Waiter w);
  void OnResolved(const std::string& name, std::uint64_t gen, Result<std::vector<IpAddress>> result);
  void OnResolveTimeout(const std::string& name, std::uint64_t gen);

  // The cache.
  const CacheEntry* CacheFind(const std::string& name, Clock::time_point now);
  const CacheEntry& CachePut(const std::string& name, bool negative, std::vector<IpAddress> addresses);
  void AnswerFromCache(const Waiter& w, const CacheEntry& e, Clock::time_point now);

  // Answers; every message received gets exactly one Answer or Drop.
  void Answer(const DnsQuery& q, const Origin& origin, DnsRcode rcode,
              const std::vector<IpAddress>& addresses = {}, std::uint32_t ttl = 0);
  void SendRaw(const Origin& origin, std::string bytes, DnsRcode rcode);
  void Drop(const Origin& origin);

  // Denials, rate limited per name.
  void Denied(const std::string& name, const DnsVerdict& verdict, std::uint64_t count);
  void SweepDenials();
  void Deliver(std::vector<Report>& reports);

  void Stop();

  asio::io_context& io;
  Resolver* resolver;
  const Decide decide;
  const OnDenied on_denied;
  AddressBook* book;
  const DnsServerOptions options;
  bool stopped = false;

  std::unique_ptr<udp::socket> udp_socket;
  udp::endpoint udp_peer;
  // One buffer for every datagram: as large as a datagram can be, so that
  // one too long for us is seen whole (and refused) rather than cut short.
  std::array<char, 65536> udp_buffer;
  asio::steady_timer udp_retry;

  std::unique_ptr<tcp::acceptor> acceptor;
  tcp acceptor_protocol = tcp::v4();
  asio::steady_timer accept_retry;
  std::unordered_set<TcpConnection*> connections;

  std::unordered_map<std::string, Deciding> deciding;
  std::unordered_map<std::string, std::unique_ptr<Lookup>> lookups;
  std::size_t parked = 0;  // waiters counted against max_pending
  std::uint64_t next_gen = 0;

  std::unordered_map<std::string, CacheEntry> cache;
  std::list<std::string> cache_order;  // oldest first

  std::unordered_map<std::string, DenialTrack> denials;
  asio::steady_timer denial_sweep;
  bool sweep_armed = false;

  struct Counters {
    std::atomic<std::uint64_t> queries{0}, answered{0}, refused{0}, formerr{0}, servfail{0}, cache_hits{0};
  } counters;
};

namespace {

// One TCP client: 2-byte length-prefixed queries, answered as they are
// ready (RFC 7766 allows any order; the ids tell them apart). Owned by the
// shared_ptrs its pending handlers hold (the idle timer always holds one);
// registered in Impl::connections while open.
class TcpConnection : public std::enable_shared_from_this<TcpConnection> {
 public:
  TcpConnection(std::shared_ptr<DnsServer::Impl> impl, tcp::socket socket)
      : impl_(std::move(impl)), socket_(std::move(socket)), idle_(impl_->io) {}
  ~TcpConnection() { impl_->connections.erase(this); }

  void Start() {
    impl_->connections.insert(this);
    ArmIdle();
    ReadLength();
  }

  // An answer to one of this connection's queries; empty: it gets none.
  void Send(std::string answer) {
    if (closed_) return;
    if (answer.empty()) return Done();
    std::string framed;
    framed.reserve(answer.size() + 2);
    Put16(framed, static_cast<std::uint16_t>(answer.size()));
    framed += answer;
    out_.push_back(std::move(framed));
    if (!writing_) WriteNext();
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    error_code ec;
    socket_.close(ec);
    idle_.cancel();
    impl_->connections.erase(this);
  }

 private:
  void ArmIdle() {
    ++idle_gen_;
    idle_.expires_after(impl_->options.tcp_idle);
    idle_.async_wait([self = shared_from_this(), gen = idle_gen_](error_code ec) {
      if (ec || self->closed_ || gen != self->idle_gen_) return;
      // Idle: nothing asked and nothing owed, or an answer the client has
      // not taken for a whole period. Waiting on our own lookups is not.
      if (self->in_flight_ == 0 || self->writing_) return self->Close();
      self->ArmIdle();
    });
  }

  void ReadLength() {
    reading_ = true;
    asio::async_read(socket_, asio::buffer(length_), [self = shared_from_this()](error_code ec, std::size_t) {
      self->reading_ = false;
      if (self->closed_) return;
      if (ec) return self->ReadEnded();
      const std::size_t len = (std::size_t{self->length_[0]} << 8) | self->length_[1];
      if (len == 0) return self->ReadLength();  // nothing to answer
      self->message_.resize(len);
      self->ReadMessage();
    });
  }

  void ReadMessage() {
    reading_ = true;
    asio::async_read(socket_, asio::buffer(message_), [self = shared_from_this()](error_code ec, std::size_t) {
      self->reading_ = false;
      if (self->closed_) return;
      if (ec) return self->ReadEnded();
      self->ArmIdle();
      ++self->in_flight_;
      DnsServer::Impl::Origin origin;
      origin.tcp = true;
      origin.connection = self;
      self->impl_->HandleMessage(self->message_, origin);
      self->MaybeRead();
    });
  }

  void MaybeRead() {
    if (closed_ || reading_ || read_ended_ || in_flight_ >= kMaxTcpInFlight) return;
    ReadLength();
  }

  // The client closed its side (or reset): what it asked is still answered.
  void ReadEnded() {
    read_ended_ = true;
    if (in_flight_ == 0) Close();
  }

  void WriteNext() {
    writing_ = true;
    asio::async_write(socket_, asio::buffer(out_.front()), [self = shared_from_this()](error_code ec, std::size_t) {
      self->writing_ = false;
      if (self->closed_) return;
      if (ec) return self->Close();
      self->out_.pop_front();
      self->ArmIdle();
      self->Done();
      if (!self->closed_ && !self->out_.empty() && !self->writing_) self->WriteNext();
    });
  }

  // One query fewer owed an answer.
  void Done() {
    if (in_flight_ > 0) --in_flight_;
    if (read_ended_ && in_flight_ == 0 && out_.empty()) return Close();
    MaybeRead();
  }

  std::shared_ptr<DnsServer::Impl> impl_;
  tcp::socket socket_;
  asio::steady_timer idle_;
  std::uint64_t idle_gen_ = 0;
  std::array<std::uint8_t, 2> length_{};
  std::string message_;
  std::deque<std::string> out_;
  std::size_t in_flight_ = 0;  // queries read, answer not yet written
  bool reading_ = false;
  bool writing_ = false;
  bool read_ended_ = false;
  bool closed_ = false;
};

}  // namespace

// --- receiving -----------------------------------------------------------------------

void DnsServer::Impl::ReceiveUdp() {
  udp_socket->async_receive_from(
      asio::buffer(udp_buffer), udp_peer, [self = shared_from_this()](error_code ec, std::size_t n) {
        if (self->stopped || ec == asio::error::operation_aborted) return;
        if (ec) {
          // A refused earlier answer (ICMP) and the like: not this
          // datagram's fault. Pause a little so that an error that stays
          // does not spin.
          self->udp_retry.expires_after(std::chrono::milliseconds(ec == asio::error::connection_refused ? 0 : 50));
          self->udp_retry.async_wait([self](error_code ec2) {
            if (!ec2 && !self->stopped) self->ReceiveUdp();
          });
          return;
        }
        Origin origin;
        origin.peer = self->udp_peer;
        self->HandleMessage(std::string_view(self->udp_buffer.data(), n), origin);
        if (!self->stopped) self->ReceiveUdp();
      });
}

void DnsServer::Impl::Accept() {
  // accept4 with SOCK_CLOEXEC rather than Asio's accept (plain accept(2)):
  // processes the supervisor spawns must not inherit the sandbox's
  // connections.
  acceptor->async_wait(tcp::acceptor::wait_read, [self = shared_from_this()](error_code ec) {
    if (self->stopped || ec == asio::error::operation_aborted) return;
    int fd = ec ? -1 : ::accept4(self->acceptor->native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (!ec && (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)) return self->Accept();
      // Out of fds or a transient error: pause instead of spinning on a
      // listener that stays readable.
      self->accept_retry.expires_after(std::chrono::milliseconds(50));
      self->accept_retry.async_wait([self](error_code ec2) {
        if (!ec2 && !self->stopped) self->Accept();
      });
      return;
    }
    tcp::socket socket(self->io);
    error_code assign_ec;
    socket.assign(self->acceptor_protocol, fd, assign_ec);
    if (assign_ec) {
      ::close(fd);
    } else if (self->connections.size() >= self->options.max_tcp_connections) {
      error_code ignored;
      socket.close(ignored);
    } else {
      std::make_shared<TcpConnection>(self, std::move(socket))->Start();
    }
    self->Accept();
  });
}

void DnsServer::Impl::HandleMessage(std::string_view wire, const Origin& origin) {
  counters.queries.fetch_add(1, std::memory_order_relaxed);
  if (wire.size() < kHeaderSize) return Drop(origin);  // no id to answer to
  const std::uint16_t id = Get16(wire, 0);
  const std::uint16_t flags = Get16(wire, 2);
  // A response sent to us is never answered: two servers would bounce
  // answers between them for ever.
  if (flags & kFlagQr) return Drop(origin);
  if (const std::uint16_t opcode = (flags >> 11) & 0xf; opcode != 0) {
    const std::uint16_t answer = kFlagQr | kFlagRa | static_cast<std::uint16_t>(opcode << 11) |
                                 (flags & kFlagRd) | static_cast<std::uint16_t>(DnsRcode::kNotImp);
    return SendRaw(origin, HeaderOnly(id, answer), DnsRcode::kNotImp);
  }
  Result<DnsQuery> q = ParseDnsQuery(wire);
  if (!q.ok()) return SendRaw(origin, BuildDnsFormErr(id), DnsRcode::kFormErr);
  if (q->qclass != kDnsClassIn) return Answer(*q, origin, DnsRcode::kRefused);
  Serve(std::move(q).value(), origin);
}

// --- one query ------------------------------------------------------------------------

void DnsServer::Impl::Serve(DnsQuery q, const Origin& origin) {
  // Reverse lookups would tell the sandbox names it never asked for; the
  // stub gets a plain "no such name" without a decision.
  if (q.qtype == kDnsTypePtr) return Answer(q, origin, DnsRcode::kNxDomain);

  Result<std::string> normal = NormaliseHost(q.name);
  std::string problem;
  if (!normal.ok()) {
    problem = normal.status().message();
  } else if (IpAddress::Parse(q.name)) {
    problem = "an IP address is not a name to resolve";
  } else if (*normal != q.name) {
    problem = "not in normal form (the name as compared is \"" + *normal + "\")";
  }
  if (!problem.empty()) {
    DnsVerdict verdict;
    verdict.message = "DNS query for a bad name " + QuotedName(q.name) + ": " + problem;
    verdict.reason = ToString(DenyReason::kBadRequest);
    Denied(q.name, verdict, 1);
    return Answer(q, origin, DnsRcode::kRefused);
  }

  if (IsLocalhostName(q.name)) {
    static const std::vector<IpAddress> kLoopback = {IpAddress::V4(0x7f000001), *IpAddress::Parse("::1")};
    return Answer(q, origin, DnsRcode::kNoError, kLoopback,
                  static_cast<std::uint32_t>(std::max<std::int64_t>(1, options.cache_ttl.count())));
  }
  AskDecision(Waiter{std::move(q), origin});
}

void DnsServer::Impl::AskDecision(Waiter w) {
  if (auto it = deciding.find(w.query.name); it != deciding.end()) {
    if (parked >= options.max_pending) return Answer(w.query, w.origin, DnsRcode::kServFail);
    // Counted: an entry is uncounted only inside its own decide call.
    ++parked;
    it->second.waiters.push_back(std::move(w));
    return;
  }
  if (!decide) {
    DnsVerdict verdict;
    verdict.message = w.query.name + ": no decision could be asked for";
    verdict.reason = ToString(DenyReason::kNotAllowed);
    Denied(w.query.name, verdict, 1);
    return Answer(w.query, w.origin, DnsRcode::kRefused);
  }
  const std::string name = w.query.name;
  const std::uint64_t gen = ++next_gen;
  Deciding& d = deciding[name];
  d.gen = gen;
  d.waiters.push_back(std::move(w));
  decide(name, [weak = weak_from_this(), name, gen](DnsVerdict verdict) {
    if (auto self = weak.lock()) self->OnVerdict(name, gen, std::move(verdict));
  });
  // A rules-only decision came back inside the call; one for the asker is
  // pending, and only then does the query take one of max_pending's places.
  auto it = deciding.find(name);
  if (it == deciding.end() || it->second.gen != gen || it->second.counted || stopped) return;
  it->second.counted = true;
  if (parked >= options.max_pending) {
    Waiter first = std::move(it->second.waiters.back());
    it->second.waiters.pop_back();
    return Answer(first.query, first.origin, DnsRcode::kServFail);
  }
  parked += it->second.waiters.size();
}

void DnsServer::Impl::OnVerdict(const std::string& name, std::uint64_t gen, DnsVerdict verdict) {
  if (stopped) return;
  auto it = deciding.find(name);
  if (it == deciding.end() || it->second.gen != gen) return;  // answered twice
  std::vector<Waiter> waiters = std::move(it->second.waiters);
  if (it->second.counted) parked -= waiters.size();
  deciding.erase(it);
  if (!verdict.allow) {
    // Reported first: whoever reads the report has it before the sandbox
    // has its answer.
    if (!waiters.empty()) Denied(name, verdict, waiters.size());
    for (const auto& w : waiters) Answer(w.query, w.origin, DnsRcode::kRefused);
    return;
  }
  for (auto& w : waiters) {
    if (stopped) return;
    Resolve(std::move(w));
  }
}

void DnsServer::Impl::Resolve(Waiter w) {
  const Clock::time_point now = Clock::now();
  if (const CacheEntry* e = CacheFind(w.query.name, now)) {
    counters.cache_hits.fetch_add(1, std::memory_order_relaxed);
    return AnswerFromCache(w, *e, now);
  }
  if (parked >= options.max_pending) return Answer(w.query, w.origin, DnsRcode::kServFail);
  ++parked;
  if (auto it = lookups.find(w.query.name); it != lookups.end()) {
    it->second->waiters.push_back(std::move(w));
    return;
  }
  const std::string name = w.query.name;
  const std::uint64_t gen = ++next_gen;
  auto lookup = std::make_unique<Lookup>(io);
  lookup->gen = gen;
  lookup->waiters.push_back(std::move(w));
  lookup->timer.expires_after(options.resolve_timeout);
  lookup->timer.async_wait([weak = weak_from_this(), name, gen](error_code ec) {
    auto self = weak.lock();
    if (!ec && self) self->OnResolveTimeout(name, gen);
  });
  lookups[name] = std::move(lookup);
  resolver->Resolve(name, [weak = weak_from_this(), name, gen](Result<std::vector<IpAddress>> result) {
    if (auto self = weak.lock()) self->OnResolved(name, gen, std::move(result));
  });
}

void DnsServer::Impl::OnResolved(const std::string& name, std::uint64_t gen, Result<std::vector<IpAddress>> result) {
  if (stopped) return;
  const bool found = result.ok() && !result->empty();
  // Cached whether or not anyone still waits: an answer that came after
  // the timeout serves the client's retry.
  const CacheEntry& e = CachePut(name, !found, found ? std::move(result).value() : std::vector<IpAddress>{});
  // The broker must know an address before the sandbox can connect to it.
  if (found) book->Add(name, e.addresses);
  auto it = lookups.find(name);
  if (it == lookups.end() || it->second->gen != gen) return;
  std::unique_ptr<Lookup> lookup = std::move(it->second);
  lookups.erase(it);
  lookup->timer.cancel();
  parked -= lookup->waiters.size();
  const Clock::time_point now = Clock::now();
  for (const auto& w : lookup->waiters) AnswerFromCache(w, e, now);
}

void DnsServer::Impl::OnResolveTimeout(const std::string& name, std::uint64_t gen) {
  if (stopped) return;
  auto it = lookups.find(name);
  if (it == lookups.end() || it->second->gen != gen) return;
  std::unique_ptr<Lookup> lookup = std::move(it->second);
  lookups.erase(it);
  parked -= lookup->waiters.size();
  for (const auto& w : lookup->waiters) Answer(w.query, w.origin, DnsRcode::kServFail);
}

// --- the cache ---------------------------------------------------------------------------

const DnsServer::Impl::CacheEntry* DnsServer::Impl::CacheFind(const std::string& name, Clock::time_point now) {
  auto it = cache.find(name);
  if (it == cache.end()) return nullptr;
  if (it->second.expiry <= now) {
    cache_order.erase(it->second.order);
    cache.erase(it);
    return nullptr;
  }
  return &it->second;
}

const DnsServer::Impl::CacheEntry& DnsServer::Impl::CachePut(const std::string& name, bool negative,
                                                             std::vector<IpAddress> addresses) {
  if (auto it = cache.find(name); it != cache.end()) {
    cache_order.erase(it->second.order);
    cache.erase(it);
  }
  // The oldest entry is the first to expire (positive entries all live
  // cache_ttl), so it goes first; expired ones go whenever they are found.
  while (!cache.empty() && cache.size() >= std::max<std::size_t>(1, options.max_cache_names)) {
    cache.erase(cache_order.front());
    cache_order.pop_front();
  }
  CacheEntry& e = cache[name];
  e.negative = negative;
  e.addresses = std::move(addresses);
  e.expiry = Clock::now() + (negative ? options.negative_ttl : options.cache_ttl);
  e.order = cache_order.insert(cache_order.end(), name);
  return e;
}

void DnsServer::Impl::AnswerFromCache(const Waiter& w, const CacheEntry& e, Clock::time_point now) {
  if (e.negative) return Answer(w.query, w.origin, DnsRcode::kNxDomain);
  // What is left of the entry's life, rounded up, and at least a second:
  // the stub never keeps an answer longer than we do.
  const auto left = std::chrono::ceil<std::chrono::seconds>(e.expiry - now).count();
  const auto ttl = static_cast<std::uint32_t>(std::clamp<std::int64_t>(left, 1, 0x7fffffff));
  Answer(w.query, w.origin, DnsRcode::kNoError, e.addresses, ttl);
}

// --- answers ----------------------------------------------------------------------------

void DnsServer::Impl::Answer(const DnsQuery& q, const Origin& origin, DnsRcode rcode,
                             const std::vector<IpAddress>& addresses, std::uint32_t ttl) {
  const std::size_t max_size =
      origin.tcp ? 65535 : std::max<std::size_t>(512, std::min<std::size_t>(q.udp_size, options.max_udp_answer));
  SendRaw(origin, BuildDnsAnswer(q, rcode, addresses, ttl, max_size), rcode);
}

void DnsServer::Impl::SendRaw(const Origin& origin, std::string bytes, DnsRcode rcode) {
  if (stopped) return;
  counters.answered.fetch_add(1, std::memory_order_relaxed);
  switch (rcode) {
    case DnsRcode::kRefused: counters.refused.fetch_add(1, std::memory_order_relaxed); break;
    case DnsRcode::kFormErr: counters.formerr.fetch_add(1, std::memory_order_relaxed); break;
    case DnsRcode::kServFail: counters.servfail.fetch_add(1, std::memory_order_relaxed); break;
    default: break;
  }
  if (origin.tcp) {
    if (auto c = origin.connection.lock()) c->Send(std::move(bytes));
    return;
  }
  // A non-blocking send: a datagram that does not fit in the socket's
  // buffer now is lost like any other, and the stub asks again.
  error_code ec;
  udp_socket->send_to(asio::buffer(bytes), origin.peer, 0, ec);
}

void DnsServer::Impl::Drop(const Origin& origin) {
  if (!origin.tcp) return;
  if (auto c = origin.connection.lock()) c->Send(std::string());
}

// --- denials -----------------------------------------------------------------------------

void DnsServer::Impl::Denied(const std::string& name, const DnsVerdict& verdict, std::uint64_t count) {
  if (stopped || !on_denied) return;
  const Clock::time_point now = Clock::now();
  auto it = denials.find(name);
  if (it == denials.end()) {
    if (denials.size() >= kMaxTrackedDenials) return;  // refused all the same, not reported
    DenialTrack& t = denials[name];
    t.verdict = verdict;
    t.last_report = now;
    if (!sweep_armed) {
      sweep_armed = true;
      denial_sweep.expires_after(kDenialInterval);
      denial_sweep.async_wait([weak = weak_from_this()](error_code ec) {
        auto self = weak.lock();
        if (!self || ec || self->stopped) return;
        self->sweep_armed = false;
        self->SweepDenials();
      });
    }
    on_denied(name, verdict, count);
    return;
  }
  DenialTrack& t = it->second;
  t.verdict = verdict;
  t.unreported += count;
  if (now - t.last_report < kDenialInterval) return;  // the sweep reports it
  std::vector<Report> reports{{name, t.verdict, t.unreported}};
  t.unreported = 0;
  t.last_report = now;
  Deliver(reports);
}

// Once a second while names are tracked: reports what was refused since a
// name's last report, and forgets names refused no more.
void DnsServer::Impl::SweepDenials() {
  const Clock::time_point now = Clock::now();
  std::vector<Report> reports;
  for (auto it = denials.begin(); it != denials.end();) {
    DenialTrack& t = it->second;
    if (now - t.last_report < kDenialInterval) {
      ++it;
    } else if (t.unreported > 0) {
      reports.push_back({it->first, t.verdict, t.unreported});
      t.unreported = 0;
      t.last_report = now;
      ++it;
    } else {
      it = denials.erase(it);
    }
  }
  if (!denials.empty()) {
    sweep_armed = true;
    denial_sweep.expires_after(kDenialInterval);
    denial_sweep.async_wait([weak = weak_from_this()](error_code ec) {
      auto self = weak.lock();
      if (!self || ec || self->stopped) return;
      self->sweep_armed = false;
      self->SweepDenials();
    });
  }
  Deliver(reports);
}

// Outside any walk of the table: the callback may call back into the server.
void DnsServer::Impl::Deliver(std::vector<Report>& reports) {
  for (const auto& r : reports) on_denied(r.name, r.verdict, r.count);
}

void DnsServer::Impl::Stop() {
  if (stopped) return;
  stopped = true;
  error_code ec;
  if (udp_socket) udp_socket->close(ec);
  if (acceptor) acceptor->close(ec);
  udp_retry.cancel();
  accept_retry.cancel();
  std::vector<TcpConnection*> open(connections.begin(), connections.end());
  for (TcpConnection* c : open) {
    if (connections.count(c)) c->Close();
  }
  for (auto& [name, lookup] : lookups) lookup->timer.cancel();
  lookups.clear();
  deciding.clear();
  parked = 0;
  denial_sweep.cancel();
  // Refusals not yet reported are reported now, so that the count is whole.
  std::vector<Report> reports;
  for (auto& [name, t] : denials) {
    if (t.unreported > 0) reports.push_back({name, t.verdict, t.unreported});
  }
  denials.clear();
  if (on_denied) Deliver(reports);
}

// --- DnsServer -------------------------------------------------------------------------------

DnsServer::DnsServer(asio::io_context& io, Resolver& resolver, Decide decide, OnDenied on_denied, AddressBook& book,
                     DnsServerOptions options)
    : impl_(std::make_shared<Impl>(io, resolver, std::move(decide), std::move(on_denied), book, options)) {}

DnsServer::~DnsServer() { Stop(); }

namespace {

// The socket's address family, or an error naming the descriptor.
Result<int> SocketFamily(int fd, const char* what) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Status::Errno("dns", "getsockname", std::string(what) + " fd " + std::to_string(fd));
  }
  if (addr.ss_family != AF_INET && addr.ss_family != AF_INET6) {
    return Status::Error("dns", std::string(what) + " fd " + std::to_string(fd) + " is not an IPv4 or IPv6 socket");
  }
  return static_cast<int>(addr.ss_family);
}

// The family of a socket handed to Serve*, or why it is not taken (then
// the descriptor is closed: ownership passed in whatever the outcome).
Result<int> AcceptedSocketFamily(int fd, bool stopped, bool served, const std::string& what) {
  Result<int> family = stopped  ? Result<int>(Status::Error("dns", "the DNS server was stopped"))
                       : served ? Result<int>(Status::Error("dns", "a " + what + " is served already"))
                                : SocketFamily(fd, what.substr(0, 3).c_str());
  if (!family.ok()) ::close(fd);
  return family;
}

}  // namespace

Status DnsServer::ServeUdp(int fd) {
  Result<int> family = AcceptedSocketFamily(fd, impl_->stopped, impl_->udp_socket != nullptr, "UDP socket");
  if (!family.ok()) return family.status();
  auto socket = std::make_unique<udp::socket>(impl_->io);
  error_code ec;
  socket->assign(*family == AF_INET ? udp::v4() : udp::v6(), fd, ec);
  if (ec) {
    ::close(fd);
    return Status::Syscall("dns", "assign UDP socket", "fd " + std::to_string(fd), ec.value());
  }
  socket->non_blocking(true, ec);
  impl_->udp_socket = std::move(socket);
  impl_->ReceiveUdp();
  return Status();
}

Status DnsServer::ServeTcp(int fd) {
  Result<int> family = AcceptedSocketFamily(fd, impl_->stopped, impl_->acceptor != nullptr, "TCP listener");
  if (!family.ok()) return family.status();
  auto acceptor = std::make_unique<tcp::acceptor>(impl_->io);
  impl_->acceptor_protocol = *family == AF_INET ? tcp::v4() : tcp::v6();
  error_code ec;
  acceptor->assign(impl_->acceptor_protocol, fd, ec);
  if (ec) {
    ::close(fd);
    return Status::Syscall("dns", "assign TCP listener", "fd " + std::to_string(fd), ec.value());
  }
  acceptor->non_blocking(true, ec);
  impl_->acceptor = std::move(acceptor);
  impl_->Accept();
  return Status();
}

void DnsServer::Stop() {
  if (impl_) impl_->Stop();
}

DnsServer::Stats DnsServer::stats() const {
  const auto& c = impl_->counters;
  Stats s;
  s.queries = c.queries.load(std::memory_order_relaxed);
  s.answered = c.answered.load(std::memory_order_relaxed);
  s.refused = c.refused.load(std::memory_order_relaxed);
  s.formerr = c.formerr.load(std::memory_order_relaxed);
  s.servfail = c.servfail.load(std::memory_order_relaxed);
  s.cache_hits = c.cache_hits.load(std::memory_order_relaxed);
  return s;
}

}  // namespace agentbox::net
