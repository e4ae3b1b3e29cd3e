#include "daemon/client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>

#include <optional>

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "agentbox/outcome.h"
#include "daemon/listen.h"

namespace agentbox::daemon {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using boost::system::error_code;

constexpr std::uint64_t kMaxResponseBody = 1ull << 32;

// Gives `socket` a descriptor that is close-on-exec from its creation: a
// process the caller spawns must not inherit its connection to the daemon.
template <typename Socket, typename Protocol>
Status AssignCloexec(Socket& socket, const Protocol& protocol, int family) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::Errno("connect", "socket", "");
  boost::system::error_code ec;
  socket.assign(protocol, fd, ec);
  if (ec) {
    ::close(fd);
    return Status::Syscall("connect", "assign socket", "", ec.value());
  }
  return Status();
}

}  // namespace

Result<Endpoint> Endpoint::FromUrl(const std::string& url) {
  constexpr std::string_view kScheme = "http://";
  if (url.rfind(kScheme, 0) != 0) return Status::Error("connect", "--url " + url + ": expected http://HOST:PORT");
  std::string rest = url.substr(kScheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  auto addr = ParseLoopbackAddress(rest);
  if (!addr.ok()) return Status::Error("connect", "--url " + url + ": " + addr.status().message());
  Endpoint e;
  e.host = addr->host;
  e.port = addr->port;
  return e;
}

std::string Endpoint::Describe() const {
  if (!unix_socket.empty()) return unix_socket;
  return "http://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string HttpResponse::ErrorMessage() const {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() && j["error"].contains("message") &&
      j["error"]["message"].is_string()) {
    return j["error"]["message"].get<std::string>();
  }
  if (!body.empty()) return body;
  return "HTTP status " + std::to_string(status);
}

struct Client::Impl {
  Endpoint endpoint;
  asio::io_context io;
  std::optional<asio::local::stream_protocol::socket> unix_socket;
  std::optional<asio::ip::tcp::socket> tcp_socket;
  beast::flat_buffer buffer;

  bool connected() const { return unix_socket || tcp_socket; }

  void SetTimeouts(int fd) {
    if (endpoint.timeout_ms <= 0) return;
    timeval tv{endpoint.timeout_ms / 1000, (endpoint.timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  }

  void Disconnect() {
    error_code ec;
    if (unix_socket) unix_socket->close(ec);
    if (tcp_socket) tcp_socket->close(ec);
    unix_socket.reset();
    tcp_socket.reset();
    buffer.clear();
  }

  Status Connect() {
    Disconnect();
    error_code ec;
    if (!endpoint.unix_socket.empty()) {
      if (endpoint.check_socket) {
        Status s = CheckSocketIsPrivate(endpoint.unix_socket);
        if (!s.ok() && s.err() == ENOENT) {
          return Status::Error("connect", "no daemon answers at " + endpoint.unix_socket +
                                              ": start one with `agentbox serve` (or name its socket with --socket)");
        }
        if (!s.ok()) return s;
      }
      unix_socket.emplace(io);
      // Opened here with SOCK_CLOEXEC (Asio's connect would open it without).
      if (Status s = AssignCloexec(*unix_socket, asio::local::stream_protocol(), AF_UNIX); !s.ok()) return s;
      unix_socket->connect(asio::local::stream_protocol::endpoint(endpoint.unix_socket), ec);
      if (ec) {
        unix_socket.reset();
        return Status::Error("connect", "cannot connect to the daemon at " + endpoint.unix_socket + ": " +
                                            ec.message() + " (is `agentbox serve` running?)");
      }
      SetTimeouts(unix_socket->native_handle());
      return Status();
    }
    auto address = asio::ip::make_address(endpoint.host, ec);
    if (ec) return Status::Error("connect", "'" + endpoint.host + "' is not an IP address");
    tcp_socket.emplace(io);
    const asio::ip::tcp::endpoint target(address, endpoint.port);
    if (Status s = AssignCloexec(*tcp_socket, target.protocol(), target.protocol().family()); !s.ok()) return s;
    tcp_socket->connect(target, ec);
    if (ec) {
      tcp_socket.reset();
      return Status::Error("connect", "cannot connect to the daemon at " + endpoint.Describe() + ": " + ec.message());
    }
    SetTimeouts(tcp_socket->native_handle());
    return Status();
  }

  template <class Socket>
  Result<HttpResponse> Exchange(Socket& socket, const http::request<http::string_body>& req,
                                const ChunkCallback& on_chunk, bool* retryable) {
    // Retryable: the daemon closed the connection before it saw the request.
    error_code ec;
    http::write(socket, req, ec);
    *retryable = static_cast<bool>(ec);
    if (ec) return Status::Error("http", "sending the request to " + endpoint.Describe() + ": " + ec.message());
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxResponseBody);
    std::function<std::size_t(std::uint64_t, beast::string_view, error_code&)> chunk_cb;
    if (on_chunk) {
      chunk_cb = [&](std::uint64_t, beast::string_view body, error_code&) {
        on_chunk(std::string_view(body.data(), body.size()));
        return body.size();
      };
      parser.on_chunk_body(chunk_cb);
    }
    http::read(socket, buffer, parser, ec);
    *retryable = ec == http::error::end_of_stream;
    if (ec) return Status::Error("http", "reading the answer from " + endpoint.Describe() + ": " + ec.message());
    auto& res = parser.get();
    HttpResponse out;
    out.status = static_cast<int>(res.result_int());
    out.content_type = std::string(res[http::field::content_type]);
    out.body = std::move(res.body());
    if (!res.keep_alive()) Disconnect();
    return out;
  }
};

Client::Client(Endpoint endpoint) : impl_(std::make_unique<Impl>()) { impl_->endpoint = std::move(endpoint); }
Client::~Client() = default;

Result<HttpResponse> Client::Call(const std::string& method, const std::string& target, const std::string& body,
                                  const ChunkCallback& on_chunk) {
  http::verb verb = http::string_to_verb(method);
  if (verb == http::verb::unknown) return Status::Error("http", "unknown method " + method);
  http::request<http::string_body> req{verb, target, 11};
  req.set(http::field::host, "localhost");
  req.set(http::field::user_agent, std::string("agentbox/") + Version());
  if (!impl_->endpoint.token.empty()) req.set(http::field::authorization, "Bearer " + impl_->endpoint.token);
  if (!body.empty()) req.set(http::field::content_type, "application/json");
  req.body() = body;
  req.keep_alive(true);
  req.prepare_payload();

  // A kept-alive connection may have been closed by the daemon meanwhile:
  // then one fresh attempt, as long as nothing of the answer was read.
  for (int attempt = 0; attempt < 2; ++attempt) {
    const bool reused = impl_->connected();
    if (!reused) {
      Status s = impl_->Connect();
      if (!s.ok()) return s;
    }
    bool retryable = false;
    Result<HttpResponse> r = impl_->unix_socket ? impl_->Exchange(*impl_->unix_socket, req, on_chunk, &retryable)
                                                : impl_->Exchange(*impl_->tcp_socket, req, on_chunk, &retryable);
    if (r.ok()) return r;
    impl_->Disconnect();
    if (!reused || !retryable) return r;
  }
  return Status::Error("http", "no answer from " + impl_->endpoint.Describe());
}

Result<nlohmann::json> Client::CallJson(const std::string& method, const std::string& target,
                                        const nlohmann::json& body) {
  auto r = Call(method, target, body.is_null() ? "" : body.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict));
  if (!r.ok()) return r.status();
  if (r->status < 200 || r->status > 299) {
    return Status::Error("http", r->ErrorMessage() + " (HTTP " + std::to_string(r->status) + ")");
  }
  if (r->body.empty()) return nlohmann::json();
  auto j = nlohmann::json::parse(r->body, nullptr, false);
  if (j.is_discarded()) return Status::Error("http", "the daemon's answer is not JSON: " + r->body.substr(0, 200));
  return j;
}

void SseParser::Feed(std::string_view bytes) {
  pending_.append(bytes);
  for (;;) {
    std::size_t end = pending_.find("\n\n");
    if (end == std::string::npos) return;
    std::string block = pending_.substr(0, end);
    pending_.erase(0, end + 2);
    std::string event = "message", data;
    bool has_data = false;
    std::size_t start = 0;
    while (start <= block.size()) {
      std::size_t nl = block.find('\n', start);
      if (nl == std::string::npos) nl = block.size();
      std::string line = block.substr(start, nl - start);
      start = nl + 1;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      auto value = [&](std::size_t colon) {
        std::string v = line.substr(colon + 1);
        if (!v.empty() && v[0] == ' ') v.erase(0, 1);
        return v;
      };
      if (line.rfind("event:", 0) == 0) {
        event = value(5);
      } else if (line.rfind("data:", 0) == 0) {
        data += (has_data ? "\n" : "") + value(4);
        has_data = true;
      }
    }
    if (has_data) on_event_(event, data);
  }
}

}  // namespace agentbox::daemon
