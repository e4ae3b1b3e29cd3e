#include "net/dns.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <map>
#include <set>
#include <thread>

namespace agentbox::net {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

// --- building queries and reading answers, independently of dns.cc ---------

std::string Wire16(std::uint16_t v) { return {static_cast<char>(v >> 8), static_cast<char>(v & 0xff)}; }

std::string WireName(const std::string& dotted) {
  std::string out;
  std::size_t start = 0;
  while (start < dotted.size()) {
    std::size_t dot = dotted.find('.', start);
    if (dot == std::string::npos) dot = dotted.size();
    out.push_back(static_cast<char>(dot - start));
    out += dotted.substr(start, dot - start);
    start = dot + 1;
  }
  out.push_back('\0');
  return out;
}

struct QueryOptions {
  bool rd = true;
  std::uint16_t qclass = kDnsClassIn;
  int udp_size = -1;  // -1: no OPT record
  std::uint8_t opcode = 0;
};

std::string Header(std::uint16_t id, std::uint16_t flags, std::uint16_t qd, std::uint16_t an, std::uint16_t ns,
                   std::uint16_t ar) {
  return Wire16(id) + Wire16(flags) + Wire16(qd) + Wire16(an) + Wire16(ns) + Wire16(ar);
}

std::string Opt(std::uint16_t udp_size, const std::string& rdata = "") {
  return std::string(1, '\0') + Wire16(kDnsTypeOpt) + Wire16(udp_size) + std::string(4, '\0') +
         Wire16(static_cast<std::uint16_t>(rdata.size())) + rdata;
}

std::string Query(std::uint16_t id, const std::string& name, std::uint16_t qtype, QueryOptions o = {}) {
  std::uint16_t flags = static_cast<std::uint16_t>(o.opcode << 11) | (o.rd ? 0x0100 : 0);
  std::string w = Header(id, flags, 1, 0, 0, o.udp_size >= 0 ? 1 : 0);
  w += WireName(name) + Wire16(qtype) + Wire16(o.qclass);
  if (o.udp_size >= 0) w += Opt(static_cast<std::uint16_t>(o.udp_size));
  return w;
}

struct Record {
  std::string name;
  std::uint16_t type = 0, cls = 0;
  std::uint32_t ttl = 0;
  std::string rdata;
};

struct Message {
  std::uint16_t id = 0, flags = 0, qd = 0, an = 0, ns = 0, ar = 0;
  std::string qname;
  std::uint16_t qtype = 0, qclass = 0;
  std::vector<Record> answers, additional;

  int rcode() const { return flags & 0xf; }
  bool qr() const { return flags & 0x8000; }
  bool tc() const { return flags & 0x0200; }
  bool rd() const { return flags & 0x0100; }
  bool ra() const { return flags & 0x0080; }
  std::vector<std::string> Addresses() const {
    std::vector<std::string> out;
    char buf[INET6_ADDRSTRLEN];
    for (const auto& r : answers) {
      if (r.rdata.size() == 4 || r.rdata.size() == 16) {
        inet_ntop(r.rdata.size() == 4 ? AF_INET : AF_INET6, r.rdata.data(), buf, sizeof buf);
        out.push_back(buf);
      }
    }
    return out;
  }
};

std::uint16_t At16(std::string_view w, std::size_t p) {
  return static_cast<std::uint16_t>((static_cast<std::uint8_t>(w[p]) << 8) | static_cast<std::uint8_t>(w[p + 1]));
}

// Reads a possibly compressed name; false when it does not parse.
bool ReadName(std::string_view w, std::size_t& pos, std::string& name) {
  std::size_t p = pos;
  bool jumped = false;
  name.clear();
  for (int hops = 0; hops < 32; ++hops) {
    if (p >= w.size()) return false;
    auto len = static_cast<std::uint8_t>(w[p]);
    if ((len & 0xc0) == 0xc0) {
      if (p + 1 >= w.size()) return false;
      if (!jumped) pos = p + 2;
      jumped = true;
      p = At16(w, p) & 0x3fff;
      continue;
    }
    ++p;
    if (len == 0) {
      if (!jumped) pos = p;
      return true;
    }
    if (p + len > w.size()) return false;
    if (!name.empty()) name += '.';
    name.append(w.substr(p, len));
    p += len;
  }
  return false;
}

std::optional<Message> ParseMessage(std::string_view w) {
  if (w.size() < 12) return std::nullopt;
  Message m;
  m.id = At16(w, 0);
  m.flags = At16(w, 2);
  m.qd = At16(w, 4);
  m.an = At16(w, 6);
  m.ns = At16(w, 8);
  m.ar = At16(w, 10);
  std::size_t p = 12;
  if (m.qd > 1) return std::nullopt;
  if (m.qd == 1) {
    if (!ReadName(w, p, m.qname) || p + 4 > w.size()) return std::nullopt;
    m.qtype = At16(w, p);
    m.qclass = At16(w, p + 2);
    p += 4;
  }
  auto read_records = [&](int n, std::vector<Record>& into) {
    for (int i = 0; i < n; ++i) {
      Record r;
      if (!ReadName(w, p, r.name) || p + 10 > w.size()) return false;
      r.type = At16(w, p);
      r.cls = At16(w, p + 2);
      r.ttl = (std::uint32_t{At16(w, p + 4)} << 16) | At16(w, p + 6);
      std::uint16_t rdlen = At16(w, p + 8);
      p += 10;
      if (p + rdlen > w.size()) return false;
      r.rdata = std::string(w.substr(p, rdlen));
      p += rdlen;
      into.push_back(std::move(r));
    }
    return true;
  };
  std::vector<Record> authority;
  if (!read_records(m.an, m.answers) || !read_records(m.ns, authority) || !read_records(m.ar, m.additional)) {
    return std::nullopt;
  }
  if (p != w.size()) return std::nullopt;
  return m;
}

IpAddress Ip(const char* text) { return *IpAddress::Parse(text); }

// --- loopback clients ----------------------------------------------------------

bool WaitReadable(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, static_cast<int>(timeout.count())) == 1;
}

class UdpClient {
 public:
  explicit UdpClient(const sockaddr_in& server) {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int size = 1 << 20;
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    connected_ = ::connect(fd_, reinterpret_cast<const sockaddr*>(&server), sizeof server) == 0;
  }
  ~UdpClient() { ::close(fd_); }
  bool connected() const { return connected_; }
  bool Send(const std::string& bytes) { return ::send(fd_, bytes.data(), bytes.size(), 0) == ssize_t(bytes.size()); }
  std::optional<std::string> Receive(std::chrono::milliseconds timeout = 3000ms) {
    if (!WaitReadable(fd_, timeout)) return std::nullopt;
    std::string buf(65536, '\0');
    ssize_t n = ::recv(fd_, buf.data(), buf.size(), 0);
    if (n < 0) return std::nullopt;
    buf.resize(n);
    return buf;
  }
  std::optional<Message> Ask(const std::string& query) {
    if (!Send(query)) return std::nullopt;
    auto answer = Receive();
    if (!answer) return std::nullopt;
    return ParseMessage(*answer);
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

std::string Framed(const std::string& message) { return Wire16(static_cast<std::uint16_t>(message.size())) + message; }

class TcpClient {
 public:
  explicit TcpClient(const sockaddr_in& server) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    connected_ = ::connect(fd_, reinterpret_cast<const sockaddr*>(&server), sizeof server) == 0;
  }
  ~TcpClient() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool connected() const { return connected_; }
  bool Send(const std::string& bytes) {
    std::size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += n;
    }
    return true;
  }
  // Exactly n bytes, or nothing (timeout, EOF).
  std::optional<std::string> ReadExactly(std::size_t n, std::chrono::milliseconds timeout) {
    std::string out;
    while (out.size() < n) {
      if (!WaitReadable(fd_, timeout)) return std::nullopt;
      char buf[4096];
      ssize_t got = ::recv(fd_, buf, std::min(sizeof buf, n - out.size()), 0);
      if (got <= 0) return std::nullopt;
      out.append(buf, got);
    }
    return out;
  }
  std::optional<Message> ReadAnswer(std::chrono::milliseconds timeout = 3000ms) {
    auto len = ReadExactly(2, timeout);
    if (!len) return std::nullopt;
    auto body = ReadExactly(At16(*len, 0), timeout);
    if (!body) return std::nullopt;
    return ParseMessage(*body);
  }
  // True when the server closed the connection (EOF or reset) within `timeout`.
  bool ClosedByPeer(std::chrono::milliseconds timeout) {
    if (!WaitReadable(fd_, timeout)) return false;
    char c;
    return ::recv(fd_, &c, 1, 0) <= 0;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

// --- the harness: a server on loopback sockets, its io_context on a thread ------

struct DenialCall {
  std::string name;
  DnsVerdict verdict;
  std::uint64_t count = 0;
};

// Hands out nothing until the test says so (on the io thread).
class ManualResolver : public Resolver {
 public:
  void Resolve(const std::string& host, Callback done) override {
    ++calls;
    pending.emplace_back(host, std::move(done));
  }
  int calls = 0;
  std::vector<std::pair<std::string, Callback>> pending;
};

class DnsServerTest : public ::testing::Test {
 protected:
  void Start(DnsServerOptions options = {}, Resolver* resolver = nullptr) {
    int udp_fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int tcp_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(udp_fd, 0);
    ASSERT_GE(tcp_fd, 0);
    int size = 4 << 20;
    ::setsockopt(udp_fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(udp_fd, reinterpret_cast<sockaddr*>(&any), sizeof any), 0);
    ASSERT_EQ(::bind(tcp_fd, reinterpret_cast<sockaddr*>(&any), sizeof any), 0);
    ASSERT_EQ(::listen(tcp_fd, 64), 0);
    socklen_t len = sizeof udp_addr_;
    ::getsockname(udp_fd, reinterpret_cast<sockaddr*>(&udp_addr_), &len);
    len = sizeof tcp_addr_;
    ::getsockname(tcp_fd, reinterpret_cast<sockaddr*>(&tcp_addr_), &len);

    auto decide = [this](const std::string& name, std::function<void(DnsVerdict)> done) {
      ++decide_calls_;
      if (async_decide_) {
        pending_decisions_.emplace_back(name, std::move(done));
        return;
      }
      DnsVerdict v;
      v.allow = allowed_.count(name) > 0;
      v.rule = v.allow ? name : "network.default: deny";
      if (!v.allow) {
        v.message = name + " is not in network.allow";
        v.reason = "not-allowed";
      }
      done(v);
    };
    auto on_denied = [this](const std::string& name, const DnsVerdict& verdict, std::uint64_t count) {
      std::lock_guard lock(mu_);
      denials_.push_back({name, verdict, count});
    };
    server_ = std::make_unique<DnsServer>(io_, resolver ? *resolver : static_cast<Resolver&>(resolver_), decide,
                                          on_denied, book_, options);
    ASSERT_TRUE(server_->ServeUdp(udp_fd).ok());
    ASSERT_TRUE(server_->ServeTcp(tcp_fd).ok());
    thread_ = std::thread([this] {
      io_.run();
      ran_out_.set_value();
    });
  }

  // Runs `f` on the io thread and waits for it.
  template <typename F>
  auto OnIo(F f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto result = task.get_future();
    asio::post(io_, [&task] { task(); });
    return result.get();
  }

  void StopServer() {
    if (!server_ || stopped_) return;
    stopped_ = true;
    OnIo([this] { server_->Stop(); });
  }

  void TearDown() override {
    if (!thread_.joinable()) return;
    StopServer();
    // The server leaves nothing behind: once stopped, the io_context runs
    // out of work by itself.
    guard_.reset();
    auto done = ran_out_.get_future();
    if (done.wait_for(5s) != std::future_status::ready) {
      ADD_FAILURE() << "the io_context still had work after Stop()";
      io_.stop();
    }
    thread_.join();
    server_.reset();
  }

  std::vector<DenialCall> Denials() {
    std::lock_guard lock(mu_);
    return denials_;
  }
  int ResolverCalls() {
    return OnIo([this] { return resolver_.calls(); });
  }
  DnsServer::Stats Stats() { return server_->stats(); }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_ = asio::make_work_guard(io_);
  StaticResolver resolver_{io_};
  ManualResolver manual_;  // io thread
  AddressBook book_;
  std::set<std::string> allowed_;
  std::atomic<int> decide_calls_{0};
  bool async_decide_ = false;
  std::vector<std::pair<std::string, std::function<void(DnsVerdict)>>> pending_decisions_;  // io thread
  std::mutex mu_;
  std::vector<DenialCall> denials_;
  std::unique_ptr<DnsServer> server_;
  bool stopped_ = false;
  sockaddr_in udp_addr_{}, tcp_addr_{};
  std::thread thread_;
  std::promise<void> ran_out_;
};

// --- pure: the wire format ---------------------------------------------------------

TEST(DnsWireTest, ParsesAPlainQuery) {
  std::optional<std::uint16_t> id;
  auto q = ParseDnsQuery(Query(0x1234, "WWW.Example.COM", kDnsTypeAaaa), &id);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->id, 0x1234);
  EXPECT_EQ(id, 0x1234);
  EXPECT_TRUE(q->recursion_desired);
  EXPECT_EQ(q->opcode, 0);
  EXPECT_EQ(q->name, "www.example.com");
  EXPECT_EQ(q->qtype, kDnsTypeAaaa);
  EXPECT_EQ(q->qclass, kDnsClassIn);
  EXPECT_FALSE(q->edns);
  EXPECT_EQ(q->udp_size, 512);
}

TEST(DnsWireTest, ParsesEdnsAndItsSize) {
  auto q = ParseDnsQuery(Query(1, "example.com", kDnsTypeA, {.udp_size = 4096}));
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_TRUE(q->edns);
  EXPECT_EQ(q->udp_size, 4096);
  // A size below 512 means 512 (RFC 6891 6.2.5).
  auto small = ParseDnsQuery(Query(1, "example.com", kDnsTypeA, {.udp_size = 100}));
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->udp_size, 512);
  // Options (a cookie) are skipped when well formed.
  std::string w = Header(2, 0x0100, 1, 0, 0, 1) + WireName("example.com") + Wire16(1) + Wire16(1) +
                  Opt(1232, Wire16(10) + Wire16(8) + std::string(8, 'c'));
  auto cookie = ParseDnsQuery(w);
  ASSERT_TRUE(cookie.ok()) << cookie.status().ToString();
  EXPECT_EQ(cookie->udp_size, 1232);
  // The root is a name too.
  auto root = ParseDnsQuery(Query(3, "", 2));
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->name, "");
}

struct BadMessage {
  const char* what;
  std::string wire;
  bool id_readable;
};

std::vector<BadMessage> BadMessages() {
  const std::string q = WireName("example.com") + Wire16(1) + Wire16(1);
  std::string long_name;
  for (int i = 0; i < 5; ++i) long_name += std::string(1, 63) + std::string(63, 'a');
  long_name.push_back('\0');
  return {
      {"empty", "", false},
      {"five bytes", "\x12\x34\x01\x00\x00", false},
      {"header only, no question", Header(0x101, 0x0100, 0, 0, 0, 0), true},
      {"two questions claimed, one present", Header(0x102, 0x0100, 2, 0, 0, 0) + q, true},
      {"name cut short", Header(0x103, 0x0100, 1, 0, 0, 0) + "\x07" "exam", true},
      {"compression pointer in the question", Header(0x104, 0x0100, 1, 0, 0, 0) + "\xc0\x0c" + Wire16(1) + Wire16(1),
       true},
      {"pointer loop", Header(0x105, 0x0100, 1, 0, 0, 0) + "\x03" "abc" "\xc0\x0c" + Wire16(1) + Wire16(1), true},
      {"label length 64 (reserved label type)",
       Header(0x106, 0x0100, 1, 0, 0, 0) + "\x40" + std::string(64, 'a') + '\0' + Wire16(1) + Wire16(1), true},
      {"label runs past the end", Header(0x107, 0x0100, 1, 0, 0, 0) + "\x3f" "abc", true},
      {"trailing junk", Header(0x108, 0x0100, 1, 0, 0, 0) + q + "junk", true},
      {"answer count lying", Header(0x109, 0x0100, 1, 1, 0, 0) + q, true},
      {"additional count lying", Header(0x10a, 0x0100, 1, 0, 0, 1) + q, true},
      {"additional record not OPT", Header(0x10b, 0x0100, 1, 0, 0, 1) + q + WireName("x") + Wire16(1) + Wire16(1) +
                                        std::string(4, '\0') + Wire16(4) + "\x01\x02\x03\x04",
       true},
      {"name over 255 octets", Header(0x10c, 0x0100, 1, 0, 0, 0) + long_name + Wire16(1) + Wire16(1), true},
      {"OPT option longer than its record",
       Header(0x10d, 0x0100, 1, 0, 0, 1) + q + Opt(1232, Wire16(10) + Wire16(50) + "abc"), true},
      {"qtype cut short", Header(0x10e, 0x0100, 1, 0, 0, 0) + WireName("example.com") + "\x00", true},
      {"a dot inside a label",
       Header(0x10f, 0x0100, 1, 0, 0, 0) + std::string("\x03" "a.b\0", 5) + Wire16(1) + Wire16(1), true},
      {"60000 bytes of junk after a header", Header(0x110, 0x0100, 1, 0, 0, 0) + std::string(60000, '\x3f'), true},
      {"two OPT records", Header(0x111, 0x0100, 1, 0, 0, 2) + q + Opt(1232) + Opt(1232), true},
  };
}

TEST(DnsWireTest, RefusesMalformedQueries) {
  for (const auto& bad : BadMessages()) {
    std::optional<std::uint16_t> id;
    auto q = ParseDnsQuery(bad.wire, &id);
    EXPECT_FALSE(q.ok()) << bad.what;
    EXPECT_EQ(id.has_value(), bad.id_readable) << bad.what;
  }
  // A response is not a query.
  EXPECT_FALSE(ParseDnsQuery(Header(1, 0x8100, 1, 0, 0, 0) + WireName("example.com") + Wire16(1) + Wire16(1)).ok());
}

TEST(DnsWireTest, BuildsAnAnswer) {
  DnsQuery q;
  q.id = 0xbeef;
  q.recursion_desired = true;
  q.name = "example.com";
  q.qtype = kDnsTypeA;
  q.qclass = kDnsClassIn;
  q.edns = true;
  q.udp_size = 1232;
  std::string wire = BuildDnsAnswer(q, DnsRcode::kNoError, {Ip("192.0.2.1"), Ip("2001:db8::1"), Ip("192.0.2.2")}, 42);
  auto m = ParseMessage(wire);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, 0xbeef);
  EXPECT_TRUE(m->qr());
  EXPECT_TRUE(m->ra());
  EXPECT_TRUE(m->rd());
  EXPECT_FALSE(m->tc());
  EXPECT_EQ(m->rcode(), 0);
  EXPECT_EQ(m->qname, "example.com");
  EXPECT_EQ(m->qtype, kDnsTypeA);
  EXPECT_EQ(m->qclass, kDnsClassIn);
  ASSERT_EQ(m->answers.size(), 2u);  // the IPv6 address is not an A record
  for (const auto& r : m->answers) {
    EXPECT_EQ(r.name, "example.com");
    EXPECT_EQ(r.type, kDnsTypeA);
    EXPECT_EQ(r.cls, kDnsClassIn);
    EXPECT_EQ(r.ttl, 42u);
  }
  EXPECT_EQ(m->Addresses(), (std::vector<std::string>{"192.0.2.1", "192.0.2.2"}));
  ASSERT_EQ(m->additional.size(), 1u);
  EXPECT_EQ(m->additional[0].type, kDnsTypeOpt);
  EXPECT_EQ(m->additional[0].name, "");

  q.qtype = kDnsTypeAaaa;
  q.edns = false;
  q.recursion_desired = false;
  m = ParseMessage(BuildDnsAnswer(q, DnsRcode::kNoError, {Ip("192.0.2.1"), Ip("2001:db8::1")}, 7));
  ASSERT_TRUE(m);
  EXPECT_FALSE(m->rd());
  EXPECT_EQ(m->Addresses(), std::vector<std::string>{"2001:db8::1"});
  EXPECT_TRUE(m->additional.empty());

  // Other types: no records, whatever the addresses.
  q.qtype = 15;  // MX
  m = ParseMessage(BuildDnsAnswer(q, DnsRcode::kNoError, {Ip("192.0.2.1")}, 7));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->rcode(), 0);
  EXPECT_TRUE(m->answers.empty());

  m = ParseMessage(BuildDnsAnswer(q, DnsRcode::kRefused, {}, 0));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->rcode(), 5);
  EXPECT_EQ(m->qname, "example.com");
}

TEST(DnsWireTest, TruncatesWhatDoesNotFit) {
  DnsQuery q;
  q.id = 9;
  q.name = "many.example";
  q.qtype = kDnsTypeA;
  q.qclass = kDnsClassIn;
  q.edns = true;
  std::vector<IpAddress> many;
  for (std::uint32_t i = 0; i < 100; ++i) many.push_back(IpAddress::V4(0xc0000200 + i));
  std::string small = BuildDnsAnswer(q, DnsRcode::kNoError, many, 60, 512);
  EXPECT_LE(small.size(), 512u);
  auto m = ParseMessage(small);
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->tc());
  EXPECT_TRUE(m->answers.empty());
  EXPECT_EQ(m->qname, "many.example");
  EXPECT_EQ(m->additional.size(), 1u);  // the OPT record stays
  m = ParseMessage(BuildDnsAnswer(q, DnsRcode::kNoError, many, 60));
  ASSERT_TRUE(m);
  EXPECT_FALSE(m->tc());
  EXPECT_EQ(m->answers.size(), 100u);
}

TEST(DnsWireTest, FormErrCarriesTheIdOnly) {
  auto m = ParseMessage(BuildDnsFormErr(0x4242));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, 0x4242);
  EXPECT_TRUE(m->qr());
  EXPECT_EQ(m->rcode(), 1);
  EXPECT_EQ(m->qd, 0);
}

// --- AddressBook ------------------------------------------------------------------

TEST(AddressBookTest, NamesForAnAddressNewestFirst) {
  AddressBook book;
  book.Add("a.example", {Ip("192.0.2.1"), Ip("2001:db8::1")});
  book.Add("b.example", {Ip("192.0.2.1")});
  EXPECT_EQ(book.NamesFor(Ip("192.0.2.1")), (std::vector<std::string>{"b.example", "a.example"}));
  // The IPv4-mapped form of an address is that address.
  EXPECT_EQ(book.NamesFor(Ip("::ffff:192.0.2.1")), (std::vector<std::string>{"b.example", "a.example"}));
  EXPECT_EQ(book.NamesFor(Ip("2001:db8::1")), std::vector<std::string>{"a.example"});
  EXPECT_TRUE(book.NamesFor(Ip("192.0.2.99")).empty());
  // Added again: first again, not twice.
  book.Add("a.example", {Ip("192.0.2.1")});
  EXPECT_EQ(book.NamesFor(Ip("192.0.2.1")), (std::vector<std::string>{"a.example", "b.example"}));
  // Stored mapped, found unmapped.
  book.Add("c.example", {Ip("::ffff:198.51.100.7")});
  EXPECT_EQ(book.NamesFor(Ip("198.51.100.7")), std::vector<std::string>{"c.example"});
}

TEST(AddressBookTest, OldestAddressesGo) {
  AddressBook book(3);
  book.Add("one", {Ip("192.0.2.1")});
  book.Add("two", {Ip("192.0.2.2")});
  book.Add("three", {Ip("192.0.2.3")});
  book.Add("one", {Ip("192.0.2.1")});  // handed out again: newest now
  book.Add("four", {Ip("192.0.2.4")});
  EXPECT_TRUE(book.NamesFor(Ip("192.0.2.2")).empty());
  EXPECT_EQ(book.NamesFor(Ip("192.0.2.1")), std::vector<std::string>{"one"});
  EXPECT_EQ(book.NamesFor(Ip("192.0.2.3")), std::vector<std::string>{"three"});
  EXPECT_EQ(book.NamesFor(Ip("192.0.2.4")), std::vector<std::string>{"four"});
  // Many re-adds of the same addresses keep the bound and the contents.
  for (int i = 0; i < 5000; ++i) book.Add("four", {Ip("192.0.2.4")});
  EXPECT_EQ(book.NamesFor(Ip("192.0.2.4")), std::vector<std::string>{"four"});
  EXPECT_EQ(book.NamesFor(Ip("192.0.2.1")), std::vector<std::string>{"one"});
  std::vector<IpAddress> lots;
  for (std::uint32_t i = 0; i < 50; ++i) lots.push_back(IpAddress::V4(0xc6336400 + i));
  book.Add("lots", lots);
  EXPECT_TRUE(book.NamesFor(Ip("192.0.2.4")).empty());
  EXPECT_TRUE(book.NamesFor(lots[0]).empty());
  EXPECT_EQ(book.NamesFor(lots[49]), std::vector<std::string>{"lots"});
}

// --- the server -------------------------------------------------------------------

TEST_F(DnsServerTest, AnswersAAndAaaaForAnAllowedName) {
  allowed_ = {"example.com"};
  resolver_.Add("example.com", {Ip("93.184.216.34"), Ip("2606:2800:220:1::1")});
  Start();
  UdpClient client(udp_addr_);
  ASSERT_TRUE(client.connected());

  auto a = client.Ask(Query(0x0a0a, "Example.COM", kDnsTypeA));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->id, 0x0a0a);
  EXPECT_TRUE(a->qr());
  EXPECT_TRUE(a->ra());
  EXPECT_TRUE(a->rd());
  EXPECT_FALSE(a->tc());
  EXPECT_EQ(a->rcode(), 0);
  EXPECT_EQ(a->qname, "example.com");
  ASSERT_EQ(a->answers.size(), 1u);
  EXPECT_EQ(a->answers[0].type, kDnsTypeA);
  EXPECT_EQ(a->answers[0].cls, kDnsClassIn);
  EXPECT_EQ(a->answers[0].ttl, 60u);  // fresh from the resolver: the whole cache_ttl
  EXPECT_EQ(a->Addresses(), std::vector<std::string>{"93.184.216.34"});
  EXPECT_TRUE(a->additional.empty());
  // The broker knows the address by the time the answer arrives.
  EXPECT_EQ(book_.NamesFor(Ip("93.184.216.34")), std::vector<std::string>{"example.com"});
  EXPECT_EQ(book_.NamesFor(Ip("2606:2800:220:1::1")), std::vector<std::string>{"example.com"});

  auto aaaa = client.Ask(Query(0x0b0b, "example.com", kDnsTypeAaaa, {.udp_size = 1232}));
  ASSERT_TRUE(aaaa);
  EXPECT_EQ(aaaa->id, 0x0b0b);
  EXPECT_EQ(aaaa->rcode(), 0);
  ASSERT_EQ(aaaa->answers.size(), 1u);
  EXPECT_EQ(aaaa->answers[0].type, kDnsTypeAaaa);
  EXPECT_GE(aaaa->answers[0].ttl, 1u);
  EXPECT_LE(aaaa->answers[0].ttl, 60u);
  EXPECT_EQ(aaaa->Addresses(), std::vector<std::string>{"2606:2800:220:1::1"});
  ASSERT_EQ(aaaa->additional.size(), 1u);  // the OPT record, as the query had one
  EXPECT_EQ(aaaa->additional[0].type, kDnsTypeOpt);

  // Another type for an allowed name: NODATA.
  auto mx = client.Ask(Query(0x0c0c, "example.com", 15));
  ASSERT_TRUE(mx);
  EXPECT_EQ(mx->rcode(), 0);
  EXPECT_TRUE(mx->answers.empty());
  EXPECT_TRUE(Denials().empty());
}

TEST_F(DnsServerTest, RefusesADeniedNameAndReportsItRateLimited) {
  Start();
  UdpClient client(udp_addr_);
  const auto start = std::chrono::steady_clock::now();
  auto first = client.Ask(Query(1, "evil.example", kDnsTypeA));
  ASSERT_TRUE(first);
  EXPECT_EQ(first->rcode(), 5);
  EXPECT_TRUE(first->answers.empty());
  auto denials = Denials();
  ASSERT_EQ(denials.size(), 1u);  // reported before the answer was sent
  EXPECT_EQ(denials[0].name, "evil.example");
  EXPECT_EQ(denials[0].count, 1u);
  EXPECT_EQ(denials[0].verdict.reason, "not-allowed");
  EXPECT_EQ(denials[0].verdict.message, "evil.example is not in network.allow");
  for (int i = 2; i <= 100; ++i) {
    auto m = client.Ask(Query(static_cast<std::uint16_t>(i), "evil.example", kDnsTypeA));
    ASSERT_TRUE(m) << i;
    EXPECT_EQ(m->rcode(), 5);
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  // Within the first second nothing more is reported (a slow machine may
  // pass the second: then one report a second, never one per query).
  if (elapsed < 900ms) {
    EXPECT_EQ(Denials().size(), 1u);
  }
  EXPECT_LE(Denials().size(), 2u + std::chrono::duration_cast<std::chrono::seconds>(elapsed).count());
  EXPECT_EQ(Stats().refused, 100u);
  StopServer();
  denials = Denials();
  std::uint64_t total = 0;
  for (const auto& d : denials) {
    EXPECT_EQ(d.name, "evil.example");
    total += d.count;
  }
  EXPECT_EQ(total, 100u);  // what was not reported yet was flushed by Stop
  if (elapsed < 900ms) {
    ASSERT_EQ(denials.size(), 2u);
    EXPECT_EQ(denials[1].count, 99u);
  }
}

TEST_F(DnsServerTest, ReportsAgainAfterASecond) {
  Start();
  UdpClient client(udp_addr_);
  ASSERT_TRUE(client.Ask(Query(1, "evil.example", kDnsTypeA)));
  ASSERT_TRUE(client.Ask(Query(2, "evil.example", kDnsTypeA)));
  ASSERT_TRUE(client.Ask(Query(3, "evil.example", kDnsTypeA)));
  // The sweep reports the two refusals after the second has passed, without
  // waiting for another query or for Stop.
  for (int i = 0; i < 40 && Denials().size() < 2; ++i) std::this_thread::sleep_for(100ms);
  auto denials = Denials();
  ASSERT_EQ(denials.size(), 2u);
  EXPECT_EQ(denials[0].count, 1u);
  EXPECT_EQ(denials[1].count, 2u);
}

TEST_F(DnsServerTest, ServesRepeatedQueriesFromTheCache) {
  allowed_ = {"cached.example"};
  resolver_.Add("cached.example", {Ip("192.0.2.10"), Ip("2001:db8::10")});
  Start();
  UdpClient client(udp_addr_);
  for (int i = 0; i < 10; ++i) {
    auto m = client.Ask(Query(static_cast<std::uint16_t>(i), "cached.example", i % 2 ? kDnsTypeAaaa : kDnsTypeA));
    ASSERT_TRUE(m);
    EXPECT_EQ(m->rcode(), 0);
    EXPECT_EQ(m->answers.size(), 1u);
  }
  EXPECT_EQ(ResolverCalls(), 1);
  EXPECT_EQ(Stats().cache_hits, 9u);
  EXPECT_EQ(decide_calls_.load(), 10);  // decided every time: a decision is not cached
}

TEST_F(DnsServerTest, ResolverFailureIsNxDomainAndRemembered) {
  allowed_ = {"missing.example"};
  Start();
  UdpClient client(udp_addr_);
  for (int i = 0; i < 3; ++i) {
    auto m = client.Ask(Query(static_cast<std::uint16_t>(i), "missing.example", kDnsTypeA));
    ASSERT_TRUE(m);
    EXPECT_EQ(m->rcode(), 3);
    EXPECT_TRUE(m->answers.empty());
  }
  EXPECT_EQ(ResolverCalls(), 1);
  EXPECT_TRUE(Denials().empty());
}

TEST_F(DnsServerTest, NegativeAnswersExpire) {
  allowed_ = {"missing.example"};
  DnsServerOptions options;
  options.negative_ttl = std::chrono::seconds(0);
  Start(options);
  UdpClient client(udp_addr_);
  for (std::uint16_t id : {1, 2}) {
    auto m = client.Ask(Query(id, "missing.example", kDnsTypeA));
    ASSERT_TRUE(m);
    EXPECT_EQ(m->rcode(), 3);
  }
  EXPECT_EQ(ResolverCalls(), 2);
}

TEST_F(DnsServerTest, HungResolverIsServFail) {
  allowed_ = {"slow.example"};
  resolver_.Hang("slow.example");
  DnsServerOptions options;
  options.resolve_timeout = 200ms;
  Start(options);
  UdpClient client(udp_addr_);
  auto m = client.Ask(Query(7, "slow.example", kDnsTypeA));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, 7);
  EXPECT_EQ(m->rcode(), 2);
  EXPECT_EQ(Stats().servfail, 1u);
}

TEST_F(DnsServerTest, OneLookupPerNameAndALateAnswerIsCached) {
  allowed_ = {"late.example"};
  ManualResolver& manual = manual_;
  DnsServerOptions options;
  options.resolve_timeout = 300ms;
  Start(options, &manual);
  UdpClient client(udp_addr_);
  ASSERT_TRUE(client.Send(Query(1, "late.example", kDnsTypeA)));
  ASSERT_TRUE(client.Send(Query(2, "late.example", kDnsTypeAaaa)));
  std::set<int> ids;
  for (int i = 0; i < 2; ++i) {
    auto raw = client.Receive();
    ASSERT_TRUE(raw);
    auto m = ParseMessage(*raw);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->rcode(), 2);
    ids.insert(m->id);
  }
  EXPECT_EQ(ids, (std::set<int>{1, 2}));
  EXPECT_EQ(OnIo([&] { return manual.calls; }), 1);
  // The resolver answers after the timeout: kept for the client's retry.
  OnIo([&] {
    for (auto& [host, done] : manual.pending) done(std::vector<IpAddress>{Ip("192.0.2.77")});
    manual.pending.clear();
  });
  auto m = client.Ask(Query(3, "late.example", kDnsTypeA));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->rcode(), 0);
  EXPECT_EQ(m->Addresses(), std::vector<std::string>{"192.0.2.77"});
  EXPECT_EQ(OnIo([&] { return manual.calls; }), 1);
  EXPECT_EQ(book_.NamesFor(Ip("192.0.2.77")), std::vector<std::string>{"late.example"});
}

TEST_F(DnsServerTest, TooLargeForUdpIsTruncatedAndWholeOverTcp) {
  allowed_ = {"many.example"};
  std::vector<IpAddress> many;
  for (std::uint32_t i = 0; i < 100; ++i) many.push_back(IpAddress::V4(0xc6336400 + i));
  resolver_.Add("many.example", many);
  Start();
  UdpClient client(udp_addr_);
  // Even a client that says it takes 4096 bytes gets at most max_udp_answer.
  for (int size : {-1, 4096}) {
    auto m = client.Ask(Query(11, "many.example", kDnsTypeA, {.udp_size = size}));
    ASSERT_TRUE(m);
    EXPECT_EQ(m->rcode(), 0);
    EXPECT_TRUE(m->tc());
    EXPECT_TRUE(m->answers.empty());
    EXPECT_EQ(m->qname, "many.example");
  }
  TcpClient tcp(tcp_addr_);
  ASSERT_TRUE(tcp.connected());
  ASSERT_TRUE(tcp.Send(Framed(Query(12, "many.example", kDnsTypeA))));
  auto m = tcp.ReadAnswer();
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, 12);
  EXPECT_FALSE(m->tc());
  EXPECT_EQ(m->answers.size(), 100u);
  EXPECT_EQ(book_.NamesFor(many[99]), std::vector<std::string>{"many.example"});
}

TEST_F(DnsServerTest, TcpAnswersPipelinedQueries) {
  allowed_ = {"one.example", "two.example"};
  resolver_.Add("one.example", {Ip("192.0.2.1")});
  resolver_.Add("two.example", {Ip("192.0.2.2")});
  Start();
  TcpClient tcp(tcp_addr_);
  ASSERT_TRUE(tcp.connected());
  ASSERT_TRUE(tcp.Send(Framed(Query(21, "one.example", kDnsTypeA)) + Framed(Query(22, "two.example", kDnsTypeA))));
  std::map<int, std::vector<std::string>> got;
  for (int i = 0; i < 2; ++i) {
    auto m = tcp.ReadAnswer();
    ASSERT_TRUE(m);
    got[m->id] = m->Addresses();
  }
  EXPECT_EQ(got[21], std::vector<std::string>{"192.0.2.1"});
  EXPECT_EQ(got[22], std::vector<std::string>{"192.0.2.2"});
  // And more on the same connection later, from the cache.
  ASSERT_TRUE(tcp.Send(Framed(Query(23, "one.example", kDnsTypeA))));
  auto m = tcp.ReadAnswer();
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, 23);
  EXPECT_EQ(m->Addresses(), std::vector<std::string>{"192.0.2.1"});
}

TEST_F(DnsServerTest, MalformedQueriesAreFormErrOrDropped) {
  allowed_ = {"ok.example"};
  resolver_.Add("ok.example", {Ip("192.0.2.5")});
  Start();
  UdpClient client(udp_addr_);
  std::uint16_t next = 0x7000;
  for (const auto& bad : BadMessages()) {
    ASSERT_TRUE(client.Send(bad.wire) || bad.wire.empty()) << bad.what;
    // A good query right after: the server still answers, and its answer
    // comes after the bad message's (if that one gets any).
    const std::uint16_t id = next++;
    ASSERT_TRUE(client.Send(Query(id, "ok.example", kDnsTypeA)));
    auto raw = client.Receive();
    ASSERT_TRUE(raw) << bad.what;
    auto m = ParseMessage(*raw);
    ASSERT_TRUE(m) << bad.what;
    if (bad.id_readable) {
      EXPECT_EQ(m->id, At16(bad.wire, 0)) << bad.what;
      EXPECT_EQ(m->rcode(), 1) << bad.what;
      EXPECT_TRUE(m->qr()) << bad.what;
      raw = client.Receive();
      ASSERT_TRUE(raw) << bad.what;
      m = ParseMessage(*raw);
      ASSERT_TRUE(m) << bad.what;
    }
    EXPECT_EQ(m->id, id) << bad.what;
    EXPECT_EQ(m->Addresses(), std::vector<std::string>{"192.0.2.5"}) << bad.what;
  }
  // A response sent to the server is dropped, never answered.
  std::string response = Query(0x6000, "ok.example", kDnsTypeA);
  response[2] = static_cast<char>(response[2] | 0x80);
  ASSERT_TRUE(client.Send(response));
  auto m = client.Ask(Query(0x6001, "ok.example", kDnsTypeA));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, 0x6001);
  EXPECT_EQ(Stats().formerr, 17u);
  EXPECT_TRUE(Denials().empty());
}

TEST_F(DnsServerTest, MalformedQueriesOverTcp) {
  allowed_ = {"ok.example"};
  resolver_.Add("ok.example", {Ip("192.0.2.5")});
  Start();
  TcpClient tcp(tcp_addr_);
  ASSERT_TRUE(tcp.connected());
  // The largest message a frame can carry, junk after a header; a zero
  // length frame; a frame too short for a header. Then a good query.
  std::string huge = Header(0x5151, 0x0100, 1, 0, 0, 0) + std::string(65535 - 12, '\x3f');
  ASSERT_TRUE(tcp.Send(Framed(huge) + Wire16(0) + Framed("abc") + Framed(Query(0x5252, "ok.example", kDnsTypeA))));
  auto m = tcp.ReadAnswer();
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, 0x5151);
  EXPECT_EQ(m->rcode(), 1);
  m = tcp.ReadAnswer();
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, 0x5252);
  EXPECT_EQ(m->Addresses(), std::vector<std::string>{"192.0.2.5"});
  // Half a frame and a close: nothing to answer, nothing left behind.
  {
    TcpClient partial(tcp_addr_);
    ASSERT_TRUE(partial.Send(Wire16(100) + "abc"));
  }
  TcpClient again(tcp_addr_);
  ASSERT_TRUE(again.Send(Framed(Query(0x5353, "ok.example", kDnsTypeA))));
  m = again.ReadAnswer();
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, 0x5353);
}

TEST_F(DnsServerTest, OtherOpcodesAreNotImplementedOtherClassesRefused) {
  allowed_ = {"ok.example"};
  Start();
  UdpClient client(udp_addr_);
  auto status = client.Ask(Query(31, "ok.example", kDnsTypeA, {.opcode = 2}));
  ASSERT_TRUE(status);
  EXPECT_EQ(status->id, 31);
  EXPECT_EQ(status->rcode(), 4);
  // An UPDATE (opcode 5) is not parsed as a query, just not implemented.
  auto update = client.Ask(Header(32, 5 << 11, 1, 1, 2, 0) + WireName("ok.example") + Wire16(6) + Wire16(1));
  ASSERT_TRUE(update);
  EXPECT_EQ(update->id, 32);
  EXPECT_EQ(update->rcode(), 4);
  auto chaos = client.Ask(Query(33, "version.bind", 16, {.qclass = 3}));
  ASSERT_TRUE(chaos);
  EXPECT_EQ(chaos->rcode(), 5);
  EXPECT_EQ(decide_calls_.load(), 0);
  EXPECT_TRUE(Denials().empty());
}

TEST_F(DnsServerTest, ReverseLookupsAreNxDomainWithoutDecision) {
  Start();
  UdpClient client(udp_addr_);
  auto m = client.Ask(Query(41, "1.0.0.127.in-addr.arpa", kDnsTypePtr));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->rcode(), 3);
  EXPECT_TRUE(m->answers.empty());
  EXPECT_EQ(decide_calls_.load(), 0);
  EXPECT_EQ(ResolverCalls(), 0);
  EXPECT_TRUE(Denials().empty());
}

TEST_F(DnsServerTest, LocalhostIsLoopbackWithoutDecision) {
  Start();
  UdpClient client(udp_addr_);
  auto a = client.Ask(Query(51, "localhost", kDnsTypeA));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->rcode(), 0);
  EXPECT_EQ(a->Addresses(), std::vector<std::string>{"127.0.0.1"});
  auto aaaa = client.Ask(Query(52, "api.LOCALHOST", kDnsTypeAaaa));
  ASSERT_TRUE(aaaa);
  EXPECT_EQ(aaaa->rcode(), 0);
  EXPECT_EQ(aaaa->Addresses(), std::vector<std::string>{"::1"});
  EXPECT_EQ(decide_calls_.load(), 0);
  EXPECT_EQ(ResolverCalls(), 0);
  // Not a suffix match on text: "notlocalhost" is a name like any other.
  auto other = client.Ask(Query(53, "notlocalhost", kDnsTypeA));
  ASSERT_TRUE(other);
  EXPECT_EQ(other->rcode(), 5);
  EXPECT_EQ(decide_calls_.load(), 1);
}

TEST_F(DnsServerTest, BadNamesAreRefusedAsBadRequests) {
  Start();
  UdpClient client(udp_addr_);
  const std::vector<std::string> bad = {"127.1", "-lead.example", "sp ace.example",
                                        "1.2.3.4", "", "caf\xc3\xa9.example"};
  std::uint16_t id = 60;
  for (const auto& name : bad) {
    auto m = client.Ask(Query(id++, name, kDnsTypeA));
    ASSERT_TRUE(m) << name;
    EXPECT_EQ(m->rcode(), 5) << name;
  }
  EXPECT_EQ(decide_calls_.load(), 0);
  auto denials = Denials();
  ASSERT_EQ(denials.size(), bad.size());
  for (std::size_t i = 0; i < bad.size(); ++i) {
    EXPECT_EQ(denials[i].verdict.reason, "bad-request");
    EXPECT_EQ(denials[i].count, 1u);
  }
  EXPECT_NE(denials[0].verdict.message.find("\"127.1\""), std::string::npos) << denials[0].verdict.message;
  EXPECT_NE(denials[2].verdict.message.find("sp\\032ace.example"), std::string::npos) << denials[2].verdict.message;
}

TEST_F(DnsServerTest, AFloodIsServedFromTheCache) {
  allowed_ = {"flood.example"};
  resolver_.Add("flood.example", {Ip("192.0.2.99")});
  Start();
  UdpClient client(udp_addr_);
  constexpr int kTotal = 5000;
  constexpr int kWindow = 64;  // in flight at once, so that no socket buffer overflows
  int sent = 0;
  std::set<int> answered;
  while (sent < kWindow) client.Send(Query(static_cast<std::uint16_t>(sent++), "flood.example", kDnsTypeA));
  while (static_cast<int>(answered.size()) < kTotal) {
    auto raw = client.Receive(3000ms);
    if (!raw) break;
    auto m = ParseMessage(*raw);
    ASSERT_TRUE(m);
    ASSERT_EQ(m->rcode(), 0);
    answered.insert(m->id);
    if (sent < kTotal) client.Send(Query(static_cast<std::uint16_t>(sent++), "flood.example", kDnsTypeA));
  }
  EXPECT_EQ(answered.size(), static_cast<std::size_t>(kTotal));
  EXPECT_EQ(ResolverCalls(), 1);
  EXPECT_GE(Stats().cache_hits, static_cast<std::uint64_t>(kTotal - kWindow));
  EXPECT_EQ(Stats().answered, static_cast<std::uint64_t>(kTotal));
}

TEST_F(DnsServerTest, TcpConnectionsAreBounded) {
  allowed_ = {"ok.example"};
  resolver_.Add("ok.example", {Ip("192.0.2.5")});
  DnsServerOptions options;
  options.max_tcp_connections = 2;
  Start(options);
  auto open = [&](std::uint16_t id) {
    auto c = std::make_unique<TcpClient>(tcp_addr_);
    EXPECT_TRUE(c->Send(Framed(Query(id, "ok.example", kDnsTypeA))));
    return c;
  };
  auto first = open(1);
  auto second = open(2);
  ASSERT_TRUE(first->ReadAnswer());
  ASSERT_TRUE(second->ReadAnswer());
  auto third = open(3);
  EXPECT_TRUE(third->ClosedByPeer(3000ms));
  // A place freed is a place for the next one.
  first->Close();
  std::optional<Message> m;
  for (int i = 0; i < 50 && !m; ++i) {
    std::this_thread::sleep_for(20ms);
    auto next = open(4);
    m = next->ReadAnswer(500ms);
  }
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, 4);
}

TEST_F(DnsServerTest, IdleTcpConnectionsAreClosed) {
  DnsServerOptions options;
  options.tcp_idle = 200ms;
  Start(options);
  TcpClient tcp(tcp_addr_);
  ASSERT_TRUE(tcp.connected());
  EXPECT_TRUE(tcp.ClosedByPeer(3000ms));
}

TEST_F(DnsServerTest, OneDecisionPerNameAndPendingQueriesBounded) {
  allowed_ = {"asked.example"};
  resolver_.Add("asked.example", {Ip("192.0.2.8")});
  async_decide_ = true;
  DnsServerOptions options;
  options.max_pending = 2;
  Start(options);
  UdpClient client(udp_addr_);
  ASSERT_TRUE(client.Send(Query(71, "asked.example", kDnsTypeA)));
  ASSERT_TRUE(client.Send(Query(72, "asked.example", kDnsTypeAaaa)));
  ASSERT_TRUE(client.Send(Query(73, "asked.example", kDnsTypeA)));
  // The third is one too many: SERVFAIL at once.
  auto m = client.Ask(Query(74, "other.example", kDnsTypeA));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, 73);
  EXPECT_EQ(m->rcode(), 2);
  m = ParseMessage(*client.Receive());
  ASSERT_TRUE(m);
  EXPECT_EQ(m->id, 74);
  EXPECT_EQ(m->rcode(), 2);
  // One question per name, however many wait for it (other.example was
  // asked too: its query was refused a place only after).
  EXPECT_EQ(decide_calls_.load(), 2);
  OnIo([&] {
    for (auto& [name, done] : pending_decisions_) {
      DnsVerdict v;
      v.allow = true;
      v.rule = "ask: once";
      done(v);
    }
    pending_decisions_.clear();
  });
  std::map<int, std::vector<std::string>> got;
  for (int i = 0; i < 2; ++i) {
    auto raw = client.Receive();
    ASSERT_TRUE(raw);
    auto a = ParseMessage(*raw);
    ASSERT_TRUE(a);
    got[a->id] = a->Addresses();
  }
  EXPECT_EQ(got[71], std::vector<std::string>{"192.0.2.8"});
  EXPECT_TRUE(got.count(72));
  EXPECT_TRUE(got[72].empty());  // no IPv6 address for it
  EXPECT_EQ(ResolverCalls(), 1);
}

TEST_F(DnsServerTest, AnAskedDenialRefusesEveryWaiter) {
  async_decide_ = true;
  Start();
  UdpClient client(udp_addr_);
  ASSERT_TRUE(client.Send(Query(81, "nope.example", kDnsTypeA)));
  ASSERT_TRUE(client.Send(Query(82, "nope.example", kDnsTypeAaaa)));
  // Both queries read (each is handled whole when it is counted): the
  // second waits on the first one's decision.
  for (int i = 0; i < 300 && Stats().queries < 2; ++i) std::this_thread::sleep_for(10ms);
  OnIo([&] {
    for (auto& [name, done] : pending_decisions_) {
      DnsVerdict v;
      v.message = name + ": the person said no";
      v.reason = "ask-denied";
      done(v);
    }
    pending_decisions_.clear();
  });
  std::set<int> ids;
  for (int i = 0; i < 2; ++i) {
    auto raw = client.Receive();
    ASSERT_TRUE(raw);
    auto m = ParseMessage(*raw);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->rcode(), 5);
    ids.insert(m->id);
  }
  EXPECT_EQ(ids, (std::set<int>{81, 82}));
  EXPECT_EQ(decide_calls_.load(), 1);
  auto denials = Denials();
  ASSERT_EQ(denials.size(), 1u);
  EXPECT_EQ(denials[0].count, 2u);
  EXPECT_EQ(denials[0].verdict.reason, "ask-denied");
}

TEST_F(DnsServerTest, StopClosesEverything) {
  allowed_ = {"ok.example"};
  resolver_.Add("ok.example", {Ip("192.0.2.5")});
  Start();
  TcpClient tcp(tcp_addr_);
  ASSERT_TRUE(tcp.Send(Framed(Query(91, "ok.example", kDnsTypeA))));
  ASSERT_TRUE(tcp.ReadAnswer());
  StopServer();
  EXPECT_TRUE(tcp.ClosedByPeer(3000ms));
  UdpClient client(udp_addr_);
  ASSERT_TRUE(client.Send(Query(92, "ok.example", kDnsTypeA)));
  EXPECT_FALSE(client.Receive(300ms));
  EXPECT_FALSE(OnIo([&] { return server_->ServeUdp(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)).ok(); }));
}

TEST_F(DnsServerTest, StatsCountWhatHappened) {
  allowed_ = {"ok.example"};
  resolver_.Add("ok.example", {Ip("192.0.2.5")});
  Start();
  UdpClient client(udp_addr_);
  ASSERT_TRUE(client.Ask(Query(1, "ok.example", kDnsTypeA)));
  ASSERT_TRUE(client.Ask(Query(2, "ok.example", kDnsTypeA)));
  ASSERT_TRUE(client.Ask(Query(3, "no.example", kDnsTypeA)));
  ASSERT_TRUE(client.Ask(Header(4, 0, 0, 0, 0, 0)));
  ASSERT_TRUE(client.Send("xx"));
  ASSERT_TRUE(client.Ask(Query(5, "ok.example", kDnsTypeA)));
  auto s = Stats();
  EXPECT_EQ(s.queries, 6u);
  EXPECT_EQ(s.answered, 5u);
  EXPECT_EQ(s.refused, 1u);
  EXPECT_EQ(s.formerr, 1u);
  EXPECT_EQ(s.servfail, 0u);
  EXPECT_EQ(s.cache_hits, 2u);
}

TEST_F(DnsServerTest, CacheIsBounded) {
  DnsServerOptions options;
  options.max_cache_names = 2;
  for (const char* name : {"a.example", "b.example", "c.example"}) {
    allowed_.insert(name);
    resolver_.Add(name, {Ip("192.0.2.1")});
  }
  Start(options);
  UdpClient client(udp_addr_);
  std::uint16_t id = 1;
  for (const char* name : {"a.example", "b.example", "c.example", "a.example"}) {
    auto m = client.Ask(Query(id++, name, kDnsTypeA));
    ASSERT_TRUE(m);
    EXPECT_EQ(m->rcode(), 0);
  }
  // a.example was the oldest when c.example came: asked again.
  EXPECT_EQ(ResolverCalls(), 4);
  ASSERT_TRUE(client.Ask(Query(id++, "c.example", kDnsTypeA)));
  EXPECT_EQ(ResolverCalls(), 4);
}

}  // namespace
}  // namespace agentbox::net
