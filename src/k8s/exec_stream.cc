#include "k8s/exec_stream.h"

#include <utility>  // before Asio's awaitable.hpp, which uses std::exchange

#include <sys/socket.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>

#include <nlohmann/json.hpp>

#include "k8s/client_tls.h"

namespace agentbox::k8s {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using Json = nlohmann::json;

constexpr unsigned char kStdin = 0, kStdout = 1, kStderr = 2, kError = 3, kClose = 255;
constexpr std::size_t kMaxStatus = 64 * 1024;  // channel 3 carries one Status
constexpr std::size_t kMaxLine = 64 * 1024;    // a stderr line before it is passed on in pieces

// A Status from channel 3 as the outcome (remotecommand's
// NonZeroExitCodeReason and ExitCodeCauseType, apimachinery
// pkg/util/remotecommand/constants.go).
ExecOutcome OutcomeOf(const std::string& status_json) {
  ExecOutcome out;
  const Json s = Json::parse(status_json, nullptr, false);
  if (!s.is_object()) {
    out.message = "channel 3 carried no Status: " + status_json.substr(0, 200);
    return out;
  }
  auto str = [](const Json& j, const char* k) {
    return j.is_object() && j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string();
  };
  out.reason = str(s, "reason");
  out.message = str(s, "message");
  if (str(s, "status") == "Success") {
    out.kind = ExecOutcome::Kind::kExited;
    out.exit_code = 0;
    return out;
  }
  out.kind = ExecOutcome::Kind::kFailed;
  if (out.reason == "NonZeroExitCode" && s.contains("details") && s["details"].is_object() &&
      s["details"].contains("causes") && s["details"]["causes"].is_array()) {
    for (const auto& cause : s["details"]["causes"]) {
      if (str(cause, "reason") != "ExitCode") continue;
      try {
        out.exit_code = std::stoi(str(cause, "message"));
        out.kind = ExecOutcome::Kind::kExited;
      } catch (const std::exception&) {
      }
    }
  }
  return out;
}

}  // namespace

struct ExecStream::Relay {
  using Ws = websocket::stream<TlsStream>;

  Relay(TlsContext& tls, ExecCallbacks cb) : ws(io, tls.ctx), local(io), callbacks(std::move(cb)) {}

  asio::io_context io;
  Ws ws;
  asio::posix::stream_descriptor local;  // the relay's end of the socketpair
  ExecCallbacks callbacks;
  std::string protocol;
  bool v5 = false;

  // Relay thread only.
  std::string status_json;
  std::string stderr_line;
  std::string ended_by;  // what ended the connection when no Status came
  bool caller_gone = false;

  mutable std::mutex mu;
  mutable std::condition_variable cv;
  bool finished = false;
  ExecOutcome outcome;

  void Stderr(std::string_view bytes) {
    for (char c : bytes) {
      if (c == '\n' || stderr_line.size() >= kMaxLine) {
        if (callbacks.on_stderr) callbacks.on_stderr(stderr_line);
        stderr_line.clear();
        if (c == '\n') continue;
      }
      stderr_line += c;
    }
  }

  // Ends both directions: the socket and the caller's end close, pending
  // operations complete with operation_aborted.
  void Abort() {
    boost::system::error_code ignored;
    beast::get_lowest_layer(ws).socket().close(ignored);
    local.close(ignored);
  }

  // WebSocket → the caller's end (stdout), stderr callback, channel 3.
  asio::awaitable<void> FromRemote() {
    beast::flat_buffer buffer;
    for (;;) {
      boost::system::error_code ec;
      co_await ws.async_read(buffer, asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        if (ec != websocket::error::closed && ec != asio::error::operation_aborted) ended_by = ec.message();
        break;
      }
      const auto data = buffer.data();
      std::string_view frame(static_cast<const char*>(data.data()), data.size());
      if (!frame.empty()) {
        const unsigned char channel = static_cast<unsigned char>(frame[0]);
        frame.remove_prefix(1);
        if (channel == kStdout && !frame.empty() && !caller_gone) {
          co_await asio::async_write(local, asio::buffer(frame.data(), frame.size()),
                                     asio::redirect_error(asio::use_awaitable, ec));
          // The caller closed its end: nobody reads the output any more.
          if (ec) {
            caller_gone = true;
            ended_by = "the caller closed its end of the stream";
            buffer.consume(buffer.size());
            break;
          }
        } else if (channel == kStderr) {
          Stderr(frame);
        } else if (channel == kError && status_json.size() + frame.size() <= kMaxStatus) {
          status_json.append(frame);
        }
      }
      buffer.consume(buffer.size());
    }
    Abort();
  }

  // The caller's end (stdin) → WebSocket; at its EOF, stdin's close.
  asio::awaitable<void> ToRemote() {
    std::string frame(1 + kChunk, '\0');
    for (;;) {
      boost::system::error_code ec;
      const std::size_t n = co_await local.async_read_some(asio::buffer(frame.data() + 1, kChunk),
                                                           asio::redirect_error(asio::use_awaitable, ec));
      if (ec == asio::error::eof) break;
      if (ec) co_return;  // aborted: FromRemote ended the relay
      frame[0] = static_cast<char>(kStdin);
      co_await ws.async_write(asio::buffer(frame.data(), n + 1), asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return;
    }
    boost::system::error_code ec;
    if (v5) {
      // v5's close signal: channel 255, then the channel that ends.
      const unsigned char close_stdin[2] = {kClose, kStdin};
      co_await ws.async_write(asio::buffer(close_stdin, 2), asio::redirect_error(asio::use_awaitable, ec));
    } else {
      // v4 cannot end stdin alone; ending the WebSocket is the only EOF it has.
      co_await ws.async_close(websocket::close_code::normal, asio::redirect_error(asio::use_awaitable, ec));
    }
  }

  void Run() {
    asio::co_spawn(io, FromRemote(), asio::detached);
    asio::co_spawn(io, ToRemote(), asio::detached);
    io.run();
    if (!stderr_line.empty() && callbacks.on_stderr) callbacks.on_stderr(stderr_line);
    ExecOutcome out;
    if (!status_json.empty()) {
      out = OutcomeOf(status_json);
    } else {
      out.message = "the connection ended before the command's status arrived" +
                    (ended_by.empty() ? std::string() : ": " + ended_by);
    }
    if (callbacks.on_end) callbacks.on_end(out);
    std::lock_guard<std::mutex> lock(mu);
    outcome = std::move(out);
    finished = true;
    cv.notify_all();
  }
};

Result<std::unique_ptr<ExecStream>> ExecStream::Start(const Kubeconfig& config, TlsContext& tls,
                                                      const std::string& target, ExecCallbacks callbacks,
                                                      std::chrono::milliseconds connect_timeout) {
  std::unique_ptr<ExecStream> stream(new ExecStream());
  stream->relay_ = std::make_unique<Relay>(tls, std::move(callbacks));
  Relay& r = *stream->relay_;

  // 1. The socketpair: one end for the caller, one for the relay.
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    return Status::Errno(kApiStage, "socketpair", "exec stream");
  }
  stream->caller_end_.reset(pair[0]);
  r.local.assign(pair[1]);

  // 2. TLS and the WebSocket upgrade, bounded by connect_timeout.
  const auto deadline = std::chrono::steady_clock::now() + connect_timeout;
  websocket::response_type answer;
  boost::system::error_code handshake_error;
  std::exception_ptr failure;
  auto upgrade = [&]() -> asio::awaitable<void> {
    beast::get_lowest_layer(r.ws).expires_at(deadline);
    co_await OpenTls(r.ws.next_layer(), config);
    r.ws.set_option(websocket::stream_base::decorator([&config](websocket::request_type& req) {
      req.set(http::field::user_agent, "agentbox");
      req.set(http::field::sec_websocket_protocol, std::string(kProtocolV5) + ", " + kProtocolV4);
      if (!config.token.empty()) req.set(http::field::authorization, "Bearer " + config.token);
    }));
    const bool v6 = config.host.find(':') != std::string::npos;
    const std::string host = (v6 ? "[" + config.host + "]" : config.host) + ":" + config.port;
    co_await r.ws.async_handshake(answer, host, target, asio::redirect_error(asio::use_awaitable, handshake_error));
  };
  asio::co_spawn(r.io, upgrade(), [&](std::exception_ptr e) { failure = e; });
  r.io.run();
  r.io.restart();
  if (handshake_error == websocket::error::upgrade_declined) {
    {
      // A refused upgrade: the API's Status, or the body's start.
      std::string why = "HTTP " + std::to_string(answer.result_int());
      const Json s = Json::parse(answer.body(), nullptr, false);
      if (s.is_object() && s.contains("kind") && s["kind"] == "Status") {
        if (s.contains("reason") && s["reason"].is_string()) why += " " + s["reason"].get<std::string>();
        if (s.contains("message") && s["message"].is_string()) why += ": " + s["message"].get<std::string>();
      } else if (!answer.body().empty()) {
        why += ": " + answer.body().substr(0, 300);
      }
      return Status::Error(kApiStage, "the WebSocket upgrade was refused: " + why);
    }
  }
  if (!failure && handshake_error) failure = std::make_exception_ptr(boost::system::system_error(handshake_error));
  if (failure) return Status::Error(kApiStage, TransportError(failure, r.ws.next_layer().native_handle()));
  r.protocol = std::string(answer[http::field::sec_websocket_protocol]);
  if (r.protocol != kProtocolV5 && r.protocol != kProtocolV4) {
    return Status::Error(kApiStage, "the server picked WebSocket subprotocol '" + r.protocol + "'; agentbox speaks " +
                                        kProtocolV5 + " and " + kProtocolV4);
  }
  r.v5 = r.protocol == kProtocolV5;

  // 3. The relay. The exec lives as long as the command; no idle timeout.
  beast::get_lowest_layer(r.ws).expires_never();
  r.ws.set_option(websocket::stream_base::timeout{std::chrono::seconds(30), websocket::stream_base::none(), false});
  r.ws.binary(true);
  r.ws.read_message_max(kMaxMessage);
  stream->thread_ = std::thread([relay = stream->relay_.get()] { relay->Run(); });
  return stream;
}

ExecStream::~ExecStream() {
  Stop();
  if (thread_.joinable()) thread_.join();
}

linux::UniqueFd ExecStream::TakeStream() { return std::move(caller_end_); }

const std::string& ExecStream::protocol() const { return relay_->protocol; }

bool ExecStream::done() const {
  std::lock_guard<std::mutex> lock(relay_->mu);
  return relay_->finished;
}

std::optional<ExecOutcome> ExecStream::Wait(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(relay_->mu);
  if (!relay_->cv.wait_for(lock, timeout, [this] { return relay_->finished; })) return std::nullopt;
  return relay_->outcome;
}

void ExecStream::Stop() {
  if (!relay_ || !thread_.joinable()) return;
  // On the relay's own thread: the stream objects are not thread-safe.
  asio::post(relay_->io, [relay = relay_.get()] {
    if (relay->ended_by.empty()) relay->ended_by = "stopped by agentbox";
    relay->Abort();
  });
}

}  // namespace agentbox::k8s
