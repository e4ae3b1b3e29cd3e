// HttpUpstream: a Streamable HTTP MCP server behind the gateway (upstream.h).
// Each exchange is one connection on an io_context of its own, every step
// bounded by the call's deadline (Beast's timeouts hold for asynchronous
// operations, hence the coroutine).
#include <utility>  // before Asio's awaitable.hpp, which uses std::exchange

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <openssl/crypto.h>

#include <algorithm>
#include <cctype>
#include <functional>

#include "gateway/upstream.h"

namespace agentbox::gateway {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr std::size_t kMaxBody = 8 * 1024 * 1024;  // what one exchange may bring
constexpr std::size_t kDetail = 300;                // of a refusal's body, for the error

std::string Lower(beast::string_view s) {
  std::string out(s.data(), s.size());
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

bool IsResponseTo(const Json& message, const Json& id) {
  return message.is_object() && message.contains("id") && message["id"] == id && !message.contains("method") &&
         (message.contains("result") || message.contains("error"));
}

bool IsRequest(const Json& message) {
  return message.is_object() && message.contains("method") && message.contains("id");
}

// Server-sent events (the WHATWG format MCP uses): the data of each
// complete event, its `data:` lines joined with newlines.
class EventStream {
 public:
  void Feed(std::string_view bytes) {
    for (char c : bytes) {
      if (c != '\r') pending_ += c;
    }
  }
  bool Next(std::string& data) {
    const auto end = pending_.find("\n\n");
    if (end == std::string::npos) return false;
    std::string event = pending_.substr(0, end + 1);
    pending_.erase(0, end + 2);
    data.clear();
    bool any = false;
    for (std::size_t at = 0; at < event.size();) {
      const auto nl = event.find('\n', at);
      std::string_view line(event.data() + at, nl - at);
      at = nl + 1;
      if (line.rfind("data:", 0) != 0) continue;  // event:, id:, retry:, comments
      line.remove_prefix(5);
      if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      if (any) data += '\n';
      data += line;
      any = true;
    }
    return any || Next(data);
  }

 private:
  std::string pending_;
};

}  // namespace

struct HttpUpstream::Reply {
  int status = 0;          // the HTTP status; 0 when none came
  bool timed_out = false;  // the deadline passed first
  std::string error;       // what went wrong in the transport or the answer
  std::string session_id;  // the Mcp-Session-Id header
  std::string detail;      // for a refusal: Location, WWW-Authenticate, the body's start
  Json answer;             // the response to the request
};

namespace {

using Asked = std::function<void(const Json&)>;

template <class Stream>
asio::awaitable<void> Converse(Stream& stream, const http::request<http::string_body>& request, const Json& id,
                               HttpUpstream::Reply& out, const Asked& asked) {
  co_await http::async_write(stream, request, asio::use_awaitable);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxBody);
  co_await http::async_read_header(stream, buffer, parser, asio::use_awaitable);
  auto& response = parser.get();
  out.status = static_cast<int>(response.result_int());
  if (auto h = response.find("Mcp-Session-Id"); h != response.end()) out.session_id = std::string(h->value());
  const std::string type = Lower(response[http::field::content_type]);

  if (out.status < 200 || out.status > 299) {
    if (auto h = response.find(http::field::location); h != response.end()) out.detail = std::string(h->value());
    if (auto h = response.find(http::field::www_authenticate); h != response.end()) {
      out.detail = "WWW-Authenticate: " + std::string(h->value());
    }
    while (!parser.is_done() && response.body().size() < kDetail) {
      co_await http::async_read_some(stream, buffer, parser, asio::use_awaitable);
    }
    if (out.detail.empty()) out.detail = response.body().substr(0, kDetail);
    co_return;
  }
  if (id.is_null()) co_return;  // a notification, a response or DELETE: the status says it all

  if (type.rfind("application/json", 0) == 0) {
    co_await http::async_read(stream, buffer, parser, asio::use_awaitable);
    Json body = Json::parse(response.body(), nullptr, false);
    if (body.is_array()) {
      for (const Json& m : body) {
        if (IsResponseTo(m, id)) out.answer = m;
      }
    } else if (IsResponseTo(body, id)) {
      out.answer = std::move(body);
    }
    if (out.answer.is_null()) out.error = "its JSON body holds no response to request " + id.dump();
    co_return;
  }
  if (type.rfind("text/event-stream", 0) == 0) {
    EventStream events;
    std::string data;
    for (;;) {
      events.Feed(response.body());
      response.body().clear();  // the body reader appends at the end, wherever that is
      while (events.Next(data)) {
        Json message = Json::parse(data, nullptr, false);
        if (IsResponseTo(message, id)) {
          out.answer = std::move(message);
          co_return;
        }
        if (IsRequest(message)) asked(message);
      }
      if (parser.is_done()) break;
      co_await http::async_read_some(stream, buffer, parser, asio::use_awaitable);
    }
    out.error = "its event stream ended without the response to request " + id.dump();
    co_return;
  }
  out.error = "it answered with Content-Type '" + type + "', not application/json or text/event-stream";
}

}  // namespace

HttpUpstream::HttpUpstream(std::string name, Url url, std::string bearer)
    : Upstream(std::move(name)), url_(std::move(url)), bearer_(std::move(bearer)) {}

Result<std::unique_ptr<HttpUpstream>> HttpUpstream::Start(const std::string& name, const std::string& url,
                                                          const std::string& bearer, std::chrono::milliseconds timeout) {
  Url parsed;
  if (auto problem = policy_internal::ParseUpstreamUrl(url, parsed)) {
    return Status::Error(kUpstreamStage, "upstream " + name + ": " + *problem);
  }
  std::unique_ptr<HttpUpstream> up(new HttpUpstream(name, std::move(parsed), bearer));
  auto init = up->Request("initialize", InitializeParams(), timeout);
  if (!init.ok()) return init.status();
  up->server_info_ = init->value("serverInfo", Json::object());
  {
    std::lock_guard<std::mutex> lock(up->mu_);
    up->protocol_ = init->value("protocolVersion", "");
  }
  const Json initialized = {{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}};
  Reply r = up->Exchange(&initialized, nullptr, timeout);
  if (r.status < 200 || r.status > 299) {
    return Status::Error(kUpstreamStage,
                         "upstream " + name + " did not take notifications/initialized: " +
                             (r.status ? "HTTP " + std::to_string(r.status) + " " + r.detail
                                       : (r.timed_out ? "no answer within " + Seconds(timeout) : r.error)));
  }
  return up;
}

HttpUpstream::~HttpUpstream() {
  bool ends_session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ends_session = !session_id_.empty() && !gone_;
  }
  if (ends_session) (void)Exchange(nullptr, nullptr, std::chrono::milliseconds(1000));
  OPENSSL_cleanse(bearer_.data(), bearer_.size());
}

bool HttpUpstream::alive() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !gone_;
}

HttpUpstream::Reply HttpUpstream::Exchange(const Json* message, const Json& id, std::chrono::milliseconds timeout) {
  Reply out;
  http::request<http::string_body> request{message ? http::verb::post : http::verb::delete_, url_.target, 11};
  const bool default_port = url_.port == (url_.tls ? "443" : "80");
  const std::string host = url_.host.find(':') != std::string::npos ? "[" + url_.host + "]" : url_.host;
  request.set(http::field::host, default_port ? host : host + ":" + url_.port);
  request.set(http::field::user_agent, "agentbox-gateway");
  if (message) {
    request.set(http::field::content_type, "application/json");
    request.set(http::field::accept, "application/json, text/event-stream");
    request.body() = message->dump();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!session_id_.empty()) request.set("Mcp-Session-Id", session_id_);
    if (!protocol_.empty()) request.set("MCP-Protocol-Version", protocol_);
  }
  if (!bearer_.empty()) request.set(http::field::authorization, "Bearer " + bearer_);
  request.keep_alive(false);
  request.prepare_payload();

  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const Asked asked = [this](const Json& m) { AnswerServer(m); };
  asio::io_context io;
  std::exception_ptr failure;
  auto run = [&]() -> asio::awaitable<void> {
    tcp::resolver resolver(io);
    beast::tcp_stream stream(io);
    stream.expires_at(deadline);
    auto endpoints = co_await resolver.async_resolve(url_.host, url_.port, asio::use_awaitable);
    co_await stream.async_connect(endpoints, asio::use_awaitable);
    if (!url_.tls) {
      co_await Converse(stream, request, id, out, asked);
      co_return;
    }
    asio::ssl::context tls(asio::ssl::context::tls_client);
    tls.set_default_verify_paths();
    tls.set_verify_mode(asio::ssl::verify_peer);
    beast::ssl_stream<beast::tcp_stream> secure(std::move(stream), tls);
    if (!SSL_set_tlsext_host_name(secure.native_handle(), url_.host.c_str())) {
      throw std::runtime_error("the TLS server name " + url_.host + " was refused");
    }
    secure.set_verify_callback(asio::ssl::host_name_verification(url_.host));
    co_await secure.async_handshake(asio::ssl::stream_base::client, asio::use_awaitable);
    co_await Converse(secure, request, id, out, asked);
  };
  asio::co_spawn(io, run(), [&](std::exception_ptr e) { failure = e; });
  io.run();
  if (failure) {
    try {
      std::rethrow_exception(failure);
    } catch (const boost::system::system_error& e) {
      if (e.code() == beast::error::timeout) {
        out.timed_out = true;
      } else {
        out.error = e.code().message();
        if (e.code().category() == asio::error::get_ssl_category()) out.error = "TLS: " + out.error;
      }
    } catch (const std::exception& e) {
      out.error = e.what();
    }
  }
  return out;
}

void HttpUpstream::AnswerServer(const Json& request) {
  Json response = {{"jsonrpc", "2.0"}, {"id", request["id"]}};
  if (request.value("method", "") == "ping") {
    response["result"] = Json::object();
  } else {
    response["error"] = {{"code", -32601}, {"message", "the agentbox gateway serves no requests from an upstream"}};
  }
  (void)Exchange(&response, nullptr, std::chrono::milliseconds(2000));
}

Result<Json> HttpUpstream::Request(const std::string& method, const Json& params, std::chrono::milliseconds timeout) {
  std::int64_t id;
  bool had_session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (gone_)
      return Status::Error(kUpstreamStage, "upstream " + name_ + " ended its session; the next call starts a new one");
    id = next_id_++;
    had_session = !session_id_.empty();
  }
  const Json message = {{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", params}};
  Reply r = Exchange(&message, id, timeout);
  const std::string who = "upstream " + name_ + " (" + (url_.tls ? "https://" : "http://") + url_.host + ":" + url_.port + ")";
  if (r.timed_out) {
    const Json cancel = {{"jsonrpc", "2.0"},
                         {"method", "notifications/cancelled"},
                         {"params", {{"requestId", id}, {"reason", "no answer within " + Seconds(timeout)}}}};
    (void)Exchange(&cancel, nullptr, std::chrono::milliseconds(1000));
    return Status::Error(kUpstreamStage,
                         "upstream " + name_ + " did not answer " + method + " within " + Seconds(timeout));
  }
  if (r.status == 0) return Status::Error(kUpstreamStage, who + " cannot be reached: " + r.error);
  if (r.status == 404 && had_session) {
    std::lock_guard<std::mutex> lock(mu_);
    gone_ = true;
    return Status::Error(kUpstreamStage, "upstream " + name_ + " ended its session (HTTP 404 to " + method +
                                             "); the next call starts a new one");
  }
  if (r.status == 401 || r.status == 403) {
    return Status::Error(kUpstreamStage, who + " refused the credential for " + method + " (HTTP " +
                                             std::to_string(r.status) + (r.detail.empty() ? "" : ", " + r.detail) +
                                             ")");
  }
  if (r.status >= 300 && r.status <= 399) {
    return Status::Error(kUpstreamStage,
                         who + " redirects " + method + " (HTTP " + std::to_string(r.status) + " to " + r.detail +
                             "); a redirect is not followed, the credential goes only to the URL the policy names");
  }
  if (r.status < 200 || r.status > 299) {
    return Status::Error(kUpstreamStage, who + " answered " + method + " with HTTP " + std::to_string(r.status) +
                                             (r.detail.empty() ? "" : ": " + r.detail));
  }
  if (!r.error.empty()) return Status::Error(kUpstreamStage, who + " gave no answer to " + method + ": " + r.error);
  if (method == "initialize" && !r.session_id.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    session_id_ = r.session_id;
  }
  return AnswerResult(method, r.answer);
}

}  // namespace agentbox::gateway
