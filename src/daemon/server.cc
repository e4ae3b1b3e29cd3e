#include "daemon/server.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <atomic>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "agentbox/outcome.h"
#include "daemon/listen.h"
#include "linux/descendants.h"

namespace agentbox::daemon {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kBackPressureBytes = 1u << 20;  // Reply::Write blocks above this
constexpr std::size_t kChunkCoalesce = 64u << 10;     // chunks merged up to this per write
constexpr int kLingerMs = 2000;                       // reading what an over-limit client still sends
constexpr int kFinalFlushMs = 2000;                   // last responses at shutdown

long MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// What a Reply has queued for its connection; shared by the Reply (any
// thread) and the connection (event loop thread).
struct Outbox {
  enum class Mode { kNone, kFull, kStream };
  std::mutex mu;
  std::condition_variable drained;
  Mode mode = Mode::kNone;
  bool ended = false;
  bool gone = false;
  std::deque<std::string> chunks;
  std::size_t queued = 0;
  nlohmann::json notes = nlohmann::json::object();

  void MarkGone() {
    std::lock_guard lock(mu);
    gone = true;
    chunks.clear();
    queued = 0;
    drained.notify_all();
  }
};

// The connection as seen by its Reply: methods run on the event loop thread.
class ConnectionBase : public std::enable_shared_from_this<ConnectionBase> {
 public:
  virtual ~ConnectionBase() = default;
  virtual void SendFull(Response response) = 0;
  virtual void BeginStream(int status, std::string content_type, Headers headers) = 0;
  virtual void Pump() = 0;
  // Shutdown: close if waiting for a request; else close after the response.
  virtual void CloseIfIdle() = 0;
  virtual void CloseNow() = 0;
  virtual void Upgrade(WebSocketHandler handler) = 0;
};

constexpr std::size_t kWebSocketQueueBytes = 8u << 20;  // a client this far behind is disconnected
constexpr std::size_t kWebSocketMessageBytes = 1u << 20;

// A connection taken over as a WebSocket (RFC 6455, through Beast). Its
// state lives on the event loop thread; Send and Close post there.
template <class Socket>
class WebSocketSession : public ConnectionBase, public WebSocket {
 public:
  WebSocketSession(std::set<ConnectionBase*>& registry, asio::io_context& io, Socket socket,
                   WebSocketHandler handler)
      : registry_(registry), io_(io), ws_(std::move(socket)), handler_(std::move(handler)) {
    registry_.insert(this);
  }
  ~WebSocketSession() override { registry_.erase(this); }

  void Accept(http::request<http::string_body> request) {
    ws_.set_option(websocket::stream_base::timeout{std::chrono::seconds(30), websocket::stream_base::none(), false});
    ws_.read_message_max(kWebSocketMessageBytes);
    ws_.set_option(websocket::stream_base::decorator([](websocket::response_type& res) {
      res.set(http::field::server, std::string("agentbox/") + Version());
    }));
    auto self = Self();
    auto req = std::make_shared<http::request<http::string_body>>(std::move(request));
    ws_.async_accept(*req, [self, req](error_code ec) {
      if (ec) return self->Ended();
      self->open_ = true;
      if (self->handler_.on_open) self->handler_.on_open(self);
      self->Read();
      self->Pump();
    });
  }

  void Send(std::string data, bool binary) override {
    asio::post(io_, [self = Self(), data = std::move(data), binary]() mutable {
      if (self->closing_ || self->ended_) return;
      self->queued_ += data.size();
      if (self->queued_ > kWebSocketQueueBytes) {
        self->out_.clear();
        self->queued_ = 0;
        self->CloseWith(websocket::close_code::policy_error, "client too slow; attach again for the scrollback");
        return;
      }
      self->out_.emplace_back(std::move(data), binary);
      self->Pump();
    });
  }

  void Close(std::string reason) override {
    asio::post(io_, [self = Self(), reason = std::move(reason)] {
      self->CloseWith(websocket::close_code::normal, reason);
    });
  }

  bool Closed() const override { return closed_flag_.load(); }

  // Shutdown: a normal closure; then the socket.
  void CloseIfIdle() override { CloseWith(websocket::close_code::going_away, "the daemon is shutting down"); }
  void CloseNow() override {
    error_code ec;
    beast::get_lowest_layer(ws_).close(ec);
    Ended();
  }
  void SendFull(Response) override {}
  void BeginStream(int, std::string, Headers) override {}
  void Pump() override {
    if (!open_ || writing_ || ended_) return;
    if (out_.empty()) {
      if (closing_ && !close_sent_) {
        close_sent_ = true;
        writing_ = true;
        auto self = Self();
        ws_.async_close(close_reason_, [self](error_code) {
          self->writing_ = false;
          // The peer's close frame ends the read loop, which ends us.
        });
      }
      return;
    }
    writing_ = true;
    auto data = std::make_shared<std::string>(std::move(out_.front().first));
    ws_.binary(out_.front().second);
    out_.pop_front();
    queued_ -= std::min(queued_, data->size());
    auto self = Self();
    ws_.async_write(asio::buffer(*data), [self, data](error_code ec, std::size_t) {
      self->writing_ = false;
      if (ec) return self->CloseNow();
      self->Pump();
    });
  }
  void Upgrade(WebSocketHandler) override {}

 private:
  std::shared_ptr<WebSocketSession> Self() {
    return std::static_pointer_cast<WebSocketSession>(shared_from_this());
  }

  void Read() {
    auto self = Self();
    ws_.async_read(buffer_, [self](error_code ec, std::size_t) {
      if (ec) return self->Ended();
      std::string data = beast::buffers_to_string(self->buffer_.data());
      self->buffer_.consume(self->buffer_.size());
      if (self->handler_.on_message && !self->closing_) self->handler_.on_message(std::move(data), self->ws_.got_binary());
      self->Read();
    });
  }

  void CloseWith(websocket::close_code code, const std::string& reason) {
    if (closing_ || ended_) return;
    closing_ = true;
    closed_flag_ = true;
    close_reason_ = websocket::close_reason(code, reason.substr(0, 120));
    if (!open_) return CloseNow();
    Pump();
  }

  void Ended() {
    if (ended_) return;
    ended_ = true;
    closed_flag_ = true;
    out_.clear();
    auto on_close = std::move(handler_.on_close);
    handler_ = {};  // what the handler holds goes now (a terminal's attachment)
    if (on_close) on_close();
  }

  std::set<ConnectionBase*>& registry_;
  asio::io_context& io_;
  websocket::stream<Socket> ws_;
  WebSocketHandler handler_;
  beast::flat_buffer buffer_;
  std::deque<std::pair<std::string, bool>> out_;
  std::size_t queued_ = 0;
  bool open_ = false, writing_ = false, closing_ = false, close_sent_ = false, ended_ = false;
  std::atomic<bool> closed_flag_{false};
  websocket::close_reason close_reason_;
};

}  // namespace

struct Server::Impl {
  Impl(ServerOptions o, Logger& l) : options(std::move(o)), log(l) {}

  void StartAccepting();
  template <class Acceptor>
  void Accept(Acceptor& acceptor);
  void BeginShutdown(const std::string& why);
  void FinishShutdown();
  bool WaitForWorkers(int timeout_ms);
  bool OnLoopThread() { return io.get_executor().running_in_this_thread(); }

  ServerOptions options;
  Logger& log;
  Router router;

  // Declared before the io_context: handlers destroyed with it unregister here.
  std::set<ConnectionBase*> connections;
  bool stopping = false;  // event loop thread only

  asio::io_context io{1};
  std::optional<asio::local::stream_protocol::acceptor> unix_acceptor;
  std::optional<asio::ip::tcp::acceptor> tcp_acceptor;
  std::string tcp_address;
  asio::signal_set signals{io, SIGTERM, SIGINT};
  asio::steady_timer accept_retry{io};
  asio::steady_timer flush_timer{io};
  Clock::time_point flush_deadline;

  std::mutex workers_mu;
  std::condition_variable workers_done;
  std::size_t workers = 0;
  bool workers_closed = false;
  std::function<void(int)> drain;
  std::thread shutdown_thread;
};

namespace {

class ReplyImpl : public Reply {
 public:
  ReplyImpl(Server::Impl& server, std::shared_ptr<ConnectionBase> conn, std::shared_ptr<Outbox> box, std::string route)
      : server_(server), conn_(std::move(conn)), box_(std::move(box)), route_(std::move(route)) {}

  ~ReplyImpl() override {
    bool unanswered = false;
    {
      std::lock_guard lock(box_->mu);
      if (box_->mode == Outbox::Mode::kNone) {
        unanswered = true;
        box_->mode = Outbox::Mode::kFull;
      } else if (box_->mode == Outbox::Mode::kStream && !box_->ended) {
        box_->ended = true;
      }
    }
    // The connection is released on its own thread.
    asio::post(server_.io, [conn = std::move(conn_), unanswered, route = route_] {
      if (unanswered) {
        conn->SendFull(Response::Error(500, "internal", "no answer was produced for " + route));
      } else {
        conn->Pump();
      }
    });
  }

  void Send(Response response) override {
    {
      std::lock_guard lock(box_->mu);
      if (box_->mode != Outbox::Mode::kNone) return;  // answered already
      box_->mode = Outbox::Mode::kFull;
    }
    asio::post(server_.io, [conn = conn_, r = std::move(response)]() mutable { conn->SendFull(std::move(r)); });
  }

  void Begin(int status, std::string content_type, Headers headers) override {
    {
      std::lock_guard lock(box_->mu);
      if (box_->mode != Outbox::Mode::kNone) return;
      box_->mode = Outbox::Mode::kStream;
    }
    asio::post(server_.io, [conn = conn_, status, ct = std::move(content_type), h = std::move(headers)]() mutable {
      conn->BeginStream(status, std::move(ct), std::move(h));
    });
  }

  bool Write(std::string data) override {
    {
      std::unique_lock lock(box_->mu);
      if (box_->gone) return false;
      if (box_->mode != Outbox::Mode::kStream || box_->ended || data.empty()) return true;
      box_->queued += data.size();
      box_->chunks.push_back(std::move(data));
    }
    asio::post(server_.io, [conn = conn_] { conn->Pump(); });
    if (!server_.OnLoopThread()) {
      std::unique_lock lock(box_->mu);
      box_->drained.wait(lock, [&] { return box_->gone || box_->queued <= kBackPressureBytes; });
      return !box_->gone;
    }
    return true;
  }

  void End() override {
    {
      std::lock_guard lock(box_->mu);
      if (box_->mode != Outbox::Mode::kStream || box_->ended) return;
      box_->ended = true;
    }
    asio::post(server_.io, [conn = conn_] { conn->Pump(); });
  }

  void Upgrade(WebSocketHandler handler) override {
    {
      std::lock_guard lock(box_->mu);
      if (box_->mode != Outbox::Mode::kNone) return;
      box_->mode = Outbox::Mode::kFull;
    }
    asio::post(server_.io, [conn = conn_, h = std::move(handler)]() mutable { conn->Upgrade(std::move(h)); });
  }

  bool Gone() const override {
    std::lock_guard lock(box_->mu);
    return box_->gone;
  }

  void Note(const std::string& key, const std::string& value) override {
    std::lock_guard lock(box_->mu);
    box_->notes[key] = value;
  }

 private:
  Server::Impl& server_;
  std::shared_ptr<ConnectionBase> conn_;
  std::shared_ptr<Outbox> box_;
  std::string route_;
};

// One client connection over Protocol (unix or TCP): reads one request at a
// time, hands it to the router, writes the answer, repeats while kept alive.
template <class Protocol>
class Connection : public ConnectionBase {
 public:
  using Socket = typename Protocol::socket;

  Connection(Server::Impl& server, Socket socket, Peer peer)
      : server_(server), socket_(std::move(socket)), timer_(server.io), peer_(std::move(peer)) {
    server_.connections.insert(this);
  }
  ~Connection() override { server_.connections.erase(this); }

  void Start(bool forbidden, bool over_capacity) {
    forbidden_ = forbidden;
    over_capacity_ = over_capacity;
    WaitForRequest();
  }

  void SendFull(Response r) override {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kWriting;
    status_ = r.status;
    if (r.status >= 400 && r.content_type == "application/json") {
      auto body = nlohmann::json::parse(r.body, nullptr, false);
      if (body.is_object() && body.contains("error") && body["error"].is_object() && body["error"]["message"].is_string()) {
        error_message_ = body["error"]["message"].get<std::string>();
      }
    }
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(r.status), 11);
    res->set(http::field::server, std::string("agentbox/") + Version());
    if (!r.content_type.empty()) res->set(http::field::content_type, r.content_type);
    for (auto& [k, v] : r.headers) res->set(k, v);
    res->body() = std::move(r.body);
    keep_alive_ = keep_alive_ && !server_.stopping;
    res->keep_alive(keep_alive_);
    res->prepare_payload();
    Arm(server_.options.write_timeout_ms);
    auto self = Self();
    http::async_write(socket_, *res, [self, res](error_code ec, std::size_t n) { self->OnWritten(ec, n); });
  }

  void BeginStream(int status, std::string content_type, Headers headers) override {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kWriting;
    status_ = status;
    auto head = std::make_shared<http::response<http::empty_body>>(static_cast<http::status>(status), 11);
    head->set(http::field::server, std::string("agentbox/") + Version());
    head->set(http::field::content_type, content_type);
    head->set(http::field::cache_control, "no-cache");
    for (auto& [k, v] : headers) head->set(k, v);
    keep_alive_ = keep_alive_ && !server_.stopping;
    head->keep_alive(keep_alive_);
    head->chunked(true);
    auto sr = std::make_shared<http::response_serializer<http::empty_body>>(*head);
    writing_ = true;
    Arm(server_.options.write_timeout_ms);
    auto self = Self();
    http::async_write_header(socket_, *sr, [self, head, sr](error_code ec, std::size_t n) {
      self->writing_ = false;
      self->bytes_out_ += n;
      if (ec) return self->Fail();
      self->streaming_ = true;
      self->WatchPeer();
      self->Pump();
    });
  }

  // While a stream goes out, a client that leaves is seen at once, not at
  // the next chunk (a followed log may be quiet for long): the socket is
  // watched for its end, without reading what a client may send ahead. A
  // client that shuts its sending side down counts as gone.
  void WatchPeer() {
    auto self = Self();
    socket_.async_wait(Socket::wait_read, [self](error_code ec) {
      if (ec || !self->streaming_ || self->phase_ == Phase::kClosed) return;
      char byte;
      const ssize_t n = ::recv(self->socket_.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return self->Fail();
      if (n < 0) self->WatchPeer();
      // n > 0: the client sent its next request early; it stays unread.
    });
  }

  void Pump() override {
    if (!streaming_ || writing_ || phase_ == Phase::kClosed || !box_) return;
    auto data = std::make_shared<std::string>();
    bool last = false;
    {
      std::lock_guard lock(box_->mu);
      while (!box_->chunks.empty() && (data->empty() || data->size() + box_->chunks.front().size() <= kChunkCoalesce)) {
        box_->queued -= box_->chunks.front().size();
        data->append(box_->chunks.front());
        box_->chunks.pop_front();
      }
      last = data->empty() && box_->ended;
      box_->drained.notify_all();
    }
    auto self = Self();
    if (!data->empty()) {
      writing_ = true;
      Arm(server_.options.write_timeout_ms);
      bytes_out_ += data->size();
      asio::async_write(socket_, http::make_chunk(asio::buffer(*data)), [self, data](error_code ec, std::size_t) {
        self->writing_ = false;
        if (ec) return self->Fail();
        self->Pump();
      });
    } else if (last) {
      writing_ = true;
      streaming_ = false;
      Arm(server_.options.write_timeout_ms);
      asio::async_write(socket_, http::make_chunk_last(), [self](error_code ec, std::size_t n) {
        self->writing_ = false;
        self->OnWritten(ec, n);
      });
    }
  }

  void CloseIfIdle() override {
    if (phase_ == Phase::kIdle) CloseNow();
  }

  void Upgrade(WebSocketHandler handler) override {
    if (phase_ == Phase::kClosed) return;
    if (!upgrade_) {
      return SendFull(Response::Error(400, "bad_request", "this route needs a WebSocket (Upgrade: websocket)"));
    }
    Disarm();
    status_ = 101;
    LogRequest({});
    if (box_) {
      box_->MarkGone();
      box_.reset();
    }
    phase_ = Phase::kClosed;
    auto ws = std::make_shared<WebSocketSession<Socket>>(server_.connections, server_.io, std::move(socket_),
                                                         std::move(handler));
    ws->Accept(std::move(*upgrade_));
    upgrade_.reset();
  }

  void CloseNow() override {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    error_code ec;
    timer_.cancel();
    socket_.shutdown(asio::socket_base::shutdown_both, ec);
    socket_.close(ec);
    if (box_) box_->MarkGone();
  }

 private:
  enum class Phase { kIdle, kReading, kHandling, kWriting, kClosed };

  std::shared_ptr<Connection> Self() { return std::static_pointer_cast<Connection>(shared_from_this()); }

  // A deadline for the operation about to start: on expiry the socket's
  // operations are cancelled and the handler sees operation_aborted.
  void Arm(int ms) {
    timed_out_ = false;
    timer_.expires_after(std::chrono::milliseconds(ms));
    std::weak_ptr<Connection> weak = Self();
    timer_.async_wait([weak](error_code ec) {
      auto self = weak.lock();
      if (ec || !self) return;
      self->timed_out_ = true;
      error_code ignored;
      self->socket_.cancel(ignored);
    });
  }
  void Disarm() { timer_.cancel(); }

  // Idle (keep-alive) until the first byte of the next request arrives.
  void WaitForRequest() {
    if (server_.stopping && buffer_.size() == 0) return CloseNow();
    phase_ = Phase::kIdle;
    if (buffer_.size() > 0) return ReadHeader();
    Arm(server_.options.idle_timeout_ms);
    auto self = Self();
    socket_.async_wait(Socket::wait_read, [self](error_code ec) {
      if (self->phase_ == Phase::kClosed) return;
      if (ec) return self->CloseNow();
      self->ReadHeader();
    });
  }

  void ReadHeader() {
    phase_ = Phase::kReading;
    started_ = Clock::now();
    logged_ = false;
    status_ = 0;
    bytes_out_ = 0;
    method_.clear();
    target_.clear();
    path_.clear();
    error_message_.clear();
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(server_.options.max_header_bytes));
    parser_->body_limit(server_.options.max_body_bytes);
    Arm(server_.options.read_timeout_ms);
    auto self = Self();
    http::async_read_header(socket_, buffer_, *parser_, [self](error_code ec, std::size_t) { self->OnHeader(ec); });
  }

  void OnHeader(error_code ec) {
    if (phase_ == Phase::kClosed) return;
    if (ec) return OnReadError(ec);
    auto& req = parser_->get();
    method_ = std::string(req.method_string());
    target_ = std::string(req.target());
    if (auto length = parser_->content_length(); length && *length > server_.options.max_body_bytes) {
      return Reject(413, "payload_too_large",
                    "request body of " + std::to_string(*length) + " bytes exceeds the limit of " +
                        std::to_string(server_.options.max_body_bytes) + " bytes");
    }
    if (Lower(std::string(req[http::field::expect])) == "100-continue") {
      auto self = Self();
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      asio::async_write(socket_, asio::buffer(kContinue), [self](error_code ec, std::size_t) {
        if (ec) return self->CloseNow();
        self->ReadBody();
      });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    if (parser_->is_done()) return OnBody({});
    Arm(server_.options.read_timeout_ms);
    auto self = Self();
    http::async_read(socket_, buffer_, *parser_, [self](error_code ec, std::size_t) { self->OnBody(ec); });
  }

  void OnReadError(error_code ec) {
    if (timed_out_) {
      return Reject(408, "request_timeout",
                    "the request did not arrive within " + std::to_string(server_.options.read_timeout_ms) + " ms");
    }
    if (ec == http::error::header_limit) {
      return Reject(431, "headers_too_large",
                    "request header block exceeds " + std::to_string(server_.options.max_header_bytes) + " bytes");
    }
    if (ec == http::error::body_limit) {
      return Reject(413, "payload_too_large",
                    "request body exceeds the limit of " + std::to_string(server_.options.max_body_bytes) + " bytes");
    }
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
        ec == http::error::partial_message || ec == asio::error::operation_aborted) {
      return CloseNow();
    }
    if (ec.category() == http::make_error_code(http::error::bad_method).category()) {
      return Reject(400, "bad_request", "malformed HTTP request: " + ec.message());
    }
    CloseNow();
  }

  void OnBody(error_code ec) {
    if (phase_ == Phase::kClosed) return;
    if (ec) return OnReadError(ec);
    Disarm();
    ++requests_;
    auto msg = parser_->release();
    parser_.reset();
    keep_alive_ = msg.keep_alive();

    Request request;
    request.method = method_;
    request.target = target_;
    request.peer = peer_;
    if (!ParseTarget(request.target, &request.path, &request.query)) {
      return Reject(400, "bad_request", "malformed request target '" + request.target + "'");
    }
    path_ = request.path;
    for (const auto& field : msg) {
      request.headers.emplace_back(Lower(std::string(field.name_string())), std::string(field.value()));
    }
    request.websocket = websocket::is_upgrade(msg);
    if (request.websocket) {
      upgrade_ = msg;  // the handshake needs its headers
      upgrade_->body().clear();
    }
    request.body = std::move(msg.body());

    if (over_capacity_) {
      return Reject(503, "unavailable",
                    "too many connections (limit " + std::to_string(server_.options.max_connections) + ")");
    }
    if (forbidden_) {
      server_.log.Log(Level::kWarn, "peer_refused",
                      {{"uid", peer_.uid}, {"pid", peer_.pid}, {"runner", peer_.runner}, {"method", method_},
                       {"path", path_}});
      if (peer_.runner > 0) {
        return Reject(403, "forbidden",
                      "pid " + std::to_string(peer_.pid) + " runs inside an agentbox sandbox (runner pid " +
                          std::to_string(peer_.runner) + "): no sandbox may use the daemon");
      }
      return Reject(403, "forbidden",
                    "uid " + std::to_string(peer_.uid) + " may not use this daemon (only uid " +
                        std::to_string(geteuid()) + " and root may)");
    }
    if (peer_.transport == Peer::Transport::kTcp && !BearerMatches(request.Header("authorization"), server_.options.token)) {
      server_.log.Log(Level::kWarn, "unauthorized", {{"peer", peer_.address}, {"method", method_}, {"path", path_}});
      Response r = Response::Error(401, "unauthorized",
                                   request.Header("authorization").empty()
                                       ? "this listener needs an Authorization: Bearer <token> header"
                                       : "the bearer token does not match");
      r.headers.emplace_back("WWW-Authenticate", "Bearer");
      keep_alive_ = false;
      return SendFull(std::move(r));
    }
    if (server_.stopping) {
      keep_alive_ = false;
      return SendFull(Response::Error(503, "shutting_down", "the daemon is shutting down"));
    }

    phase_ = Phase::kHandling;
    box_ = std::make_shared<Outbox>();
    auto reply = std::make_shared<ReplyImpl>(server_, Self(), box_, method_ + " " + path_);
    try {
      server_.router.Dispatch(std::move(request), reply);
    } catch (const std::exception& e) {
      server_.log.Log(Level::kError, "handler_exception", {{"method", method_}, {"path", path_}, {"what", e.what()}});
      reply->Send(Response::Error(500, "internal", std::string("internal error: ") + e.what()));
    }
  }

  // Answers an error and closes; input the client still sends is read and
  // dropped for a moment, so that it sees the answer rather than a reset.
  void Reject(int status, const std::string& code, const std::string& message) {
    keep_alive_ = false;
    linger_ = true;
    SendFull(Response::Error(status, code, message));
  }

  void OnWritten(error_code ec, std::size_t n) {
    Disarm();
    bytes_out_ += n;
    LogRequest(ec);
    if (box_) {
      box_->MarkGone();  // nothing more goes out for this request
      box_.reset();
    }
    if (ec) return CloseNow();
    if (!keep_alive_) return linger_ ? Linger() : CloseNow();
    WaitForRequest();
  }

  void Fail() {
    LogRequest(asio::error::broken_pipe);
    CloseNow();
  }

  void Linger() {
    phase_ = Phase::kWriting;
    error_code ignored;
    socket_.shutdown(asio::socket_base::shutdown_send, ignored);
    Arm(kLingerMs);
    auto scratch = std::make_shared<std::array<char, 65536>>();
    auto self = Self();
    socket_.async_read_some(asio::buffer(*scratch), [self, scratch](error_code ec, std::size_t) {
      if (ec) return self->CloseNow();
      self->LingerMore(scratch);
    });
  }
  void LingerMore(std::shared_ptr<std::array<char, 65536>> scratch) {
    auto self = Self();
    socket_.async_read_some(asio::buffer(*scratch), [self, scratch](error_code ec, std::size_t) {
      if (ec) return self->CloseNow();
      self->LingerMore(scratch);
    });
  }

  std::string PeerName() const {
    if (peer_.transport == Peer::Transport::kTcp) return peer_.address;
    return "unix uid " + std::to_string(peer_.uid) + " pid " + std::to_string(peer_.pid);
  }

  void LogRequest(error_code ec) {
    if (logged_) return;
    logged_ = true;
    nlohmann::json fields = {{"method", method_}, {"path", path_.empty() ? target_ : path_}, {"status", status_},
                             {"duration_ms", MsSince(started_)}, {"bytes", bytes_out_}, {"peer", PeerName()}};
    if (box_) {
      std::lock_guard lock(box_->mu);
      for (auto it = box_->notes.begin(); it != box_->notes.end(); ++it) fields[it.key()] = it.value();
    }
    if (!error_message_.empty()) fields["error"] = error_message_;
    if (ec) fields["write_error"] = ec.message();
    server_.log.Log(status_ >= 500 || ec ? Level::kError : status_ == 401 || status_ == 403 ? Level::kWarn : Level::kInfo,
                    "request", fields);
    bytes_out_ = 0;
  }

  Server::Impl& server_;
  Socket socket_;
  asio::steady_timer timer_;
  Peer peer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::request<http::string_body>> upgrade_;  // a WebSocket handshake's request
  std::shared_ptr<Outbox> box_;
  Phase phase_ = Phase::kIdle;
  bool forbidden_ = false;
  bool over_capacity_ = false;
  bool keep_alive_ = true;
  bool linger_ = false;
  bool timed_out_ = false;
  bool writing_ = false;
  bool streaming_ = false;
  std::size_t requests_ = 0;
  bool logged_ = false;
  std::string error_message_;
  std::string method_, target_, path_;
  int status_ = 0;
  std::size_t bytes_out_ = 0;
  Clock::time_point started_ = Clock::now();
};

}  // namespace

template <class Acceptor>
void Server::Impl::Accept(Acceptor& acceptor) {
  using Protocol = typename Acceptor::protocol_type;
  // accept4 with SOCK_CLOEXEC rather than Asio's accept: sandboxes are
  // spawned from this process while it runs, and a client's connection must
  // never be inherited by one.
  acceptor.async_wait(Acceptor::wait_read, [this, &acceptor](error_code ec) {
    if (stopping || ec == asio::error::operation_aborted) return;
    int fd = ec ? -1 : accept4(acceptor.native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (!ec && (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED)) return Accept(acceptor);
      // Out of descriptors, most likely: try again shortly rather than spin.
      log.Log(Level::kError, "accept_failed", {{"error", ec ? ec.message() : std::string(strerror(errno))}});
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this, &acceptor](error_code e) {
        if (!e && !stopping) Accept(acceptor);
      });
      return;
    }
    typename Protocol::socket socket(io);
    error_code assign_ec;
    socket.assign(acceptor.local_endpoint().protocol(), fd, assign_ec);
    if (assign_ec) {
      close(fd);
      return Accept(acceptor);
    }
    const bool over = connections.size() >= options.max_connections;
    Peer peer;
    if constexpr (std::is_same_v<Protocol, asio::local::stream_protocol>) {
      peer.transport = Peer::Transport::kUnix;
      peer.address = "unix";
      bool forbidden = true;  // unknown peer: refused
      ucred cred{};
      socklen_t len = sizeof(cred);
      if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
        peer.uid = cred.uid;
        peer.pid = cred.pid;
        // A second fence behind the sandbox's own: a process below an
        // agentbox runner never drives the daemon (it would run anything,
        // anywhere). pid 0 is a peer whose pid namespace is not below ours
        // (a container's client): the sandboxes the daemon can meet are.
        peer.runner = cred.pid > 0 ? linux::EnclosingRunner(cred.pid) : 0;
        forbidden = (cred.uid != geteuid() && cred.uid != 0) || peer.runner != 0;
      }
      auto conn = std::make_shared<Connection<Protocol>>(*this, std::move(socket), peer);
      conn->Start(forbidden, over);
    } else {
      peer.transport = Peer::Transport::kTcp;
      error_code e;
      auto remote = socket.remote_endpoint(e);
      peer.address = e ? "tcp" : remote.address().to_string() + ":" + std::to_string(remote.port());
      auto conn = std::make_shared<Connection<Protocol>>(*this, std::move(socket), peer);
      conn->Start(false, over);
    }
    Accept(acceptor);
  });
}

void Server::Impl::StartAccepting() {
  if (unix_acceptor) Accept(*unix_acceptor);
  if (tcp_acceptor) Accept(*tcp_acceptor);
}

bool Server::Impl::WaitForWorkers(int timeout_ms) {
  std::unique_lock lock(workers_mu);
  return workers_done.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return workers == 0; });
}

void Server::Impl::BeginShutdown(const std::string& why) {
  if (stopping) return;
  stopping = true;
  std::size_t running;
  {
    std::lock_guard lock(workers_mu);
    running = workers;
  }
  log.Log(Level::kInfo, "shutdown_begin", {{"reason", why}, {"calls_in_flight", running}, {"grace_ms", options.grace_ms}});
  error_code ec;
  if (unix_acceptor) unix_acceptor->close(ec);
  if (tcp_acceptor) tcp_acceptor->close(ec);
  accept_retry.cancel();
  for (auto* c : std::vector<ConnectionBase*>(connections.begin(), connections.end())) c->CloseIfIdle();
  shutdown_thread = std::thread([this] {
    const bool finished = WaitForWorkers(options.grace_ms);
    if (!finished) log.Log(Level::kWarn, "shutdown_grace_over", {{"grace_ms", options.grace_ms}});
    if (drain) drain(options.grace_ms);
    // After the drain every call ends promptly; a few seconds are a margin.
    WaitForWorkers(5000);
    asio::post(io, [this] { FinishShutdown(); });
  });
}

void Server::Impl::FinishShutdown() {
  {
    std::lock_guard lock(workers_mu);
    workers_closed = true;
  }
  for (auto* c : std::vector<ConnectionBase*>(connections.begin(), connections.end())) c->CloseIfIdle();
  flush_deadline = Clock::now() + std::chrono::milliseconds(kFinalFlushMs);
  // Poll until every connection has finished its response, or the deadline.
  struct Poll {
    static void Run(Server::Impl* s) {
      if (s->connections.empty() || Clock::now() >= s->flush_deadline) {
        for (auto* c : std::vector<ConnectionBase*>(s->connections.begin(), s->connections.end())) c->CloseNow();
        s->signals.cancel();
        s->io.stop();
        return;
      }
      s->flush_timer.expires_after(std::chrono::milliseconds(20));
      s->flush_timer.async_wait([s](error_code ec) {
        if (!ec) Run(s);
      });
    }
  };
  Poll::Run(this);
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  if (impl_->shutdown_thread.joinable()) impl_->shutdown_thread.join();
}

Result<std::unique_ptr<Server>> Server::Create(ServerOptions options, Logger& log) {
  if (!options.unix_listener.valid() && !options.tcp_listener.valid()) {
    return Status::Error("serve", "no listener: give a unix socket or a loopback TCP address");
  }
  if (options.tcp_listener.valid() && options.token.empty()) {
    return Status::Error("serve", "a TCP listener needs a bearer token (--token-file)");
  }
  auto impl = std::make_unique<Impl>(std::move(options), log);
  error_code ec;
  if (impl->options.unix_listener.valid()) {
    impl->unix_acceptor.emplace(impl->io);
    impl->unix_acceptor->assign(asio::local::stream_protocol(), impl->options.unix_listener.release(), ec);
    if (ec) return Status::Error("serve", "adopting the unix socket: " + ec.message());
  }
  if (impl->options.tcp_listener.valid()) {
    impl->tcp_address = LocalAddress(impl->options.tcp_listener.get());
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    getsockname(impl->options.tcp_listener.get(), reinterpret_cast<sockaddr*>(&ss), &len);
    impl->tcp_acceptor.emplace(impl->io);
    impl->tcp_acceptor->assign(ss.ss_family == AF_INET6 ? asio::ip::tcp::v6() : asio::ip::tcp::v4(),
                               impl->options.tcp_listener.release(), ec);
    if (ec) return Status::Error("serve", "adopting the TCP socket: " + ec.message());
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Router& Server::router() { return impl_->router; }
Logger& Server::log() { return impl_->log; }

bool Server::RunBlocking(std::function<void()> work) {
  Impl* s = impl_.get();
  {
    std::lock_guard lock(s->workers_mu);
    if (s->workers_closed || s->workers >= s->options.max_workers) return false;
    ++s->workers;
  }
  try {
    std::thread([s, work = std::move(work)]() mutable {
      try {
        work();
      } catch (const std::exception& e) {
        s->log.Log(Level::kError, "worker_exception", {{"what", e.what()}});
      }
      work = nullptr;  // drop the Reply before the count goes down
      std::lock_guard lock(s->workers_mu);
      --s->workers;
      s->workers_done.notify_all();
    }).detach();
  } catch (const std::system_error& e) {
    std::lock_guard lock(s->workers_mu);
    --s->workers;
    s->workers_done.notify_all();
    s->log.Log(Level::kError, "worker_spawn_failed", {{"what", e.what()}});
    return false;
  }
  return true;
}

std::size_t Server::Run(const std::function<void(int grace_ms)>& drain) {
  Impl* s = impl_.get();
  s->drain = drain;
  s->signals.async_wait([s](error_code ec, int sig) {
    if (!ec) s->BeginShutdown(sig == SIGTERM ? "SIGTERM" : "SIGINT");
  });
  s->StartAccepting();
  nlohmann::json where = nlohmann::json::object();
  if (s->unix_acceptor) where["socket"] = s->options.unix_path;
  if (s->tcp_acceptor) where["address"] = s->tcp_address;
  where["pid"] = getpid();
  where["version"] = Version();
  s->log.Log(Level::kInfo, "listening", where);
  s->io.run();
  if (s->shutdown_thread.joinable()) s->shutdown_thread.join();
  std::lock_guard lock(s->workers_mu);
  s->log.Log(Level::kInfo, "shutdown_done", {{"calls_still_running", s->workers}});
  return s->workers;
}

void Server::Stop() {
  Impl* s = impl_.get();
  asio::post(s->io, [s] { s->BeginShutdown("stop requested"); });
}

}  // namespace agentbox::daemon
