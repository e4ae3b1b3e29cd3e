#include "fake_api_server.h"

#include <utility>  // before Asio's awaitable.hpp, which uses std::exchange

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "net/tls.h"

namespace agentbox::k8s::testing {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;
using Json = nlohmann::json;
using TlsSocket = beast::ssl_stream<tcp::socket>;

constexpr const char* kClaimGroup = "extensions.agents.x-k8s.io";
constexpr const char* kSandboxGroup = "agents.x-k8s.io";

// A recorded response (tests/fixtures/k8s/responses) with its {{keys}} filled.
std::string Fixture(const std::string& name, const std::map<std::string, std::string>& values) {
  std::ifstream in(std::string(AGENTBOX_K8S_RESPONSES) + "/" + name);
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  for (const auto& [key, value] : values) {
    const std::string mark = "{{" + key + "}}";
    // Values go inside JSON strings.
    std::string escaped = Json(value).dump();
    escaped = escaped.substr(1, escaped.size() - 2);
    for (auto at = text.find(mark); at != std::string::npos; at = text.find(mark, at + escaped.size())) {
      text.replace(at, mark.size(), escaped);
    }
  }
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::string Unescape(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i] == '+' ? ' ' : s[i];
    }
  }
  return out;
}

std::multimap<std::string, std::string> Query(const std::string& q) {
  std::multimap<std::string, std::string> out;
  if (q.empty()) return out;
  for (const auto& kv : Split(q, '&')) {
    const auto eq = kv.find('=');
    out.emplace(Unescape(kv.substr(0, eq)), eq == std::string::npos ? "" : Unescape(kv.substr(eq + 1)));
  }
  return out;
}

std::string Now() { return "2026-01-01T00:00:00Z"; }

}  // namespace

struct FakeApiServer::State {
  Options options;
  std::unique_ptr<net::RunCa> ca;
  std::unique_ptr<asio::ssl::context> ctx;
  asio::io_context accept_io;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::uint16_t port = 0;
  std::thread accept_thread;
  std::thread controller;

  mutable std::mutex mu;
  std::condition_variable changed;
  bool stopping = false;
  std::int64_t rv = 1000;
  std::map<std::string, Json> claims;     // "ns/name"
  std::map<std::string, Json> pools;      // "ns/name"
  std::map<std::string, Json> sandboxes;  // "ns/name"
  std::set<std::string> pods;             // "ns/name"
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::string>> schedule;  // claims to make ready
  std::vector<std::string> log;
  std::vector<std::thread> connections;
  std::set<int> open_fds;
  std::set<pid_t> children;

  // --- the controller -----------------------------------------------------

  void MakeReady(const std::string& key) {
    auto it = claims.find(key);
    if (it == claims.end()) return;
    Json& claim = it->second;
    const std::string ns = claim["metadata"]["namespace"], name = claim["metadata"]["name"];
    const std::string pool = claim["spec"]["warmPoolRef"]["name"];
    const std::string sandbox = options.adopt_from_pool ? pool + "-x7k2p" : name;
    Json sb = {{"apiVersion", "agents.x-k8s.io/v1beta1"},
               {"kind", "Sandbox"},
               {"metadata", {{"name", sandbox}, {"namespace", ns}, {"resourceVersion", std::to_string(++rv)}}},
               {"status", {{"conditions", Json::array({{{"type", "Ready"}, {"status", "True"}, {"reason", "DependenciesReady"}}})}}}};
    std::string pod = sandbox;
    if (options.adopt_from_pool) {
      pod = pool + "-pod-q9w4z";
      sb["metadata"]["annotations"] = {{"agents.x-k8s.io/pod-name", pod}};
    }
    sandboxes[ns + "/" + sandbox] = sb;
    pods.insert(ns + "/" + pod);
    claim["status"] = {{"sandbox", {{"name", sandbox}, {"podIPs", Json::array({"10.0.0.7"})}}},
                       {"conditions", Json::array({{{"type", "Ready"}, {"status", "True"}, {"reason", "DependenciesReady"},
                                                    {"message", "Pod is Ready; Service Exists"},
                                                    {"lastTransitionTime", Now()}, {"observedGeneration", 1}}})}};
    claim["metadata"]["resourceVersion"] = std::to_string(++rv);
    changed.notify_all();
  }

  void Controller() {
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping) {
      auto next = std::chrono::steady_clock::time_point::max();
      for (auto it = schedule.begin(); it != schedule.end();) {
        if (it->first <= std::chrono::steady_clock::now()) {
          MakeReady(it->second);
          it = schedule.erase(it);
        } else {
          next = std::min(next, it->first);
          ++it;
        }
      }
      if (next == std::chrono::steady_clock::time_point::max()) {
        changed.wait(lock);
      } else {
        changed.wait_until(lock, next);
      }
    }
  }

  // --- HTTP ---------------------------------------------------------------

  using Request = http::request<http::string_body>;
  using Response = http::response<http::string_body>;

  static Response Answer(const Request& req, int code, std::string body) {
    Response res{static_cast<http::status>(code), req.version()};
    res.set(http::field::content_type, "application/json");
    res.body() = std::move(body);
    res.keep_alive(false);
    res.prepare_payload();
    return res;
  }

  bool Authenticated(const Request& req, SSL* ssl) const {
    const std::string auth(req[http::field::authorization]);
    if (!auth.empty()) return auth == "Bearer " + options.token;
    if (options.client_ca_pem.empty()) return false;
    X509* peer = SSL_get1_peer_certificate(ssl);
    const bool ok = peer && SSL_get_verify_result(ssl) == X509_V_OK;
    X509_free(peer);
    return ok;
  }

  Json ClaimFromCreate(const std::string& ns, Json body) {
    body["metadata"]["namespace"] = ns;
    body["metadata"]["uid"] = "6f1c2b9e-0d7a-4c55-9a51-" + std::to_string(100000000000 + rv);
    body["metadata"]["resourceVersion"] = std::to_string(++rv);
    body["metadata"]["generation"] = 1;
    body["metadata"]["creationTimestamp"] = Now();
    if (options.readiness == Readiness::kNever) {
      body["status"] = {{"conditions", Json::array({{{"type", "Ready"}, {"status", "False"}, {"reason", "SandboxNotReady"},
                                                     {"message", "Sandbox is not ready"}, {"lastTransitionTime", Now()},
                                                     {"observedGeneration", 1}}})}};
    }
    return body;
  }

  // One REST request; `stream` is used only by a watch.
  Response Rest(const Request& req, TlsSocket& stream, bool* streamed) {
    const std::string target(req.target());
    const auto qpos = target.find('?');
    const auto parts = Split(target.substr(0, qpos), '/');
    const auto query = Query(qpos == std::string::npos ? "" : target.substr(qpos + 1));
    // "", apis, GROUP, v1beta1, namespaces, NS, RESOURCE[, NAME]
    if (parts.size() < 7 || parts[1] != "apis" || parts[4] != "namespaces") {
      return Answer(req, 404, Fixture("unknown_resource.json", {}));
    }
    const std::string group = parts[2], ns = parts[5], resource = parts[6];
    const std::string name = parts.size() > 7 ? parts[7] : "";
    const bool claims_api = group == kClaimGroup && parts[3] == "v1beta1" &&
                            (resource == "sandboxclaims" || resource == "sandboxwarmpools");
    const bool sandbox_api = group == kSandboxGroup && parts[3] == "v1beta1" && resource == "sandboxes";
    if ((!claims_api && !sandbox_api) || parts.size() > 8) return Answer(req, 404, Fixture("unknown_resource.json", {}));
    const std::map<std::string, std::string> what = {
        {"qresource", resource + "." + group}, {"group", group}, {"resource", resource}, {"name", name}};
    std::unique_lock<std::mutex> lock(mu);
    auto& table = resource == "sandboxclaims" ? claims : resource == "sandboxwarmpools" ? pools : sandboxes;
    const std::string key = ns + "/" + name;

    if (req.method() == http::verb::get && !name.empty()) {
      auto it = table.find(key);
      if (it == table.end()) return Answer(req, 404, Fixture("not_found.json", what));
      return Answer(req, 200, it->second.dump());
    }
    if (req.method() == http::verb::get && query.count("watch") && resource == "sandboxclaims") {
      lock.unlock();
      *streamed = true;
      Watch(req, stream, ns, query);
      return Response{};
    }
    if (req.method() == http::verb::get) {
      Json items = Json::array();
      for (const auto& [k, v] : table) {
        if (k.rfind(ns + "/", 0) == 0) items.push_back(v);
      }
      return Answer(req, 200,
                    Json{{"apiVersion", group + "/v1beta1"}, {"kind", "List"},
                         {"metadata", {{"resourceVersion", std::to_string(rv)}}}, {"items", items}}
                        .dump());
    }
    if (req.method() == http::verb::post && name.empty() && resource == "sandboxclaims") {
      // The order the API server checks in: media type, decoding, validation, storage.
      const std::string type(req[http::field::content_type]);
      if (type.rfind("application/json", 0) != 0 && type.rfind("application/yaml", 0) != 0) {
        return Answer(req, 415, Fixture("unsupported_media_type.json", {}));
      }
      Json body = Json::parse(req.body(), nullptr, false);
      if (body.is_discarded() || !body.is_object()) {
        return Answer(req, 400, Fixture("bad_request.json",
                                        {{"message", "the object provided is unrecognized (must be of type "
                                                     "SandboxClaim): couldn't get version/kind; json parse error: "
                                                     "invalid character looking for beginning of value"}}));
      }
      const std::string claim_name = body["metadata"].value("name", "");
      if (body.value("kind", "") != "SandboxClaim" || body.value("apiVersion", "") != std::string(kClaimGroup) + "/v1beta1") {
        return Answer(req, 400, Fixture("bad_request.json", {{"message", "the API version in the data (" +
                                                                             body.value("apiVersion", "") +
                                                                             ") does not match the expected API version (" +
                                                                             kClaimGroup + "/v1beta1)"}}));
      }
      if (body["metadata"].contains("namespace") && body["metadata"]["namespace"] != ns) {
        return Answer(req, 400, Fixture("bad_request.json", {{"message", "the namespace of the provided object does "
                                                                         "not match the namespace sent on the request"}}));
      }
      if (!body.contains("spec") || !body["spec"].contains("warmPoolRef")) {
        return Answer(req, 422, Fixture("invalid_required.json", {{"kind", "SandboxClaim"}, {"group", kClaimGroup},
                                                                  {"name", claim_name}, {"field", "spec.warmPoolRef"}}));
      }
      const std::string claim_key = ns + "/" + claim_name;
      if (claims.count(claim_key)) {
        auto w = what;
        w["name"] = claim_name;
        return Answer(req, 409, Fixture("already_exists.json", w));
      }
      Json claim = ClaimFromCreate(ns, std::move(body));
      claims[claim_key] = claim;
      if (options.readiness == Readiness::kAfterDelay) {
        schedule.emplace_back(std::chrono::steady_clock::now() + options.ready_after, claim_key);
      }
      changed.notify_all();
      return Answer(req, 201, claim.dump());
    }
    if (req.method() == http::verb::delete_ && !name.empty() && resource == "sandboxclaims") {
      auto it = claims.find(key);
      if (it == claims.end()) return Answer(req, 404, Fixture("not_found.json", what));
      auto w = what;
      w["uid"] = it->second["metadata"].value("uid", "");
      claims.erase(it);
      ++rv;
      changed.notify_all();
      return Answer(req, 200, Fixture("delete_success.json", w));
    }
    Response res = Answer(req, 405,
                          Json{{"kind", "Status"}, {"apiVersion", "v1"}, {"metadata", Json::object()},
                               {"status", "Failure"}, {"message", "the server does not allow this method on the requested resource"},
                               {"reason", "MethodNotAllowed"}, {"details", Json::object()}, {"code", 405}}
                              .dump());
    return res;
  }

  // A watch of one claim (fieldSelector=metadata.name=NAME): its changes
  // after `resourceVersion` as JSON lines, until timeoutSeconds or its deletion.
  void Watch(const Request& req, TlsSocket& stream, const std::string& ns,
             const std::multimap<std::string, std::string>& query) {
    std::string name;
    if (auto it = query.find("fieldSelector"); it != query.end() && it->second.rfind("metadata.name=", 0) == 0) {
      name = it->second.substr(14);
    }
    std::int64_t since = 0;
    if (auto it = query.find("resourceVersion"); it != query.end() && !it->second.empty()) since = std::stoll(it->second);
    int timeout = 60;
    if (auto it = query.find("timeoutSeconds"); it != query.end()) timeout = std::stoi(it->second);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(timeout);

    http::response<http::empty_body> res{http::status::ok, req.version()};
    res.set(http::field::content_type, "application/json");
    res.chunked(true);
    http::response_serializer<http::empty_body> sr{res};
    boost::system::error_code ec;
    http::write_header(stream, sr, ec);
    if (ec) return;
    const std::string key = ns + "/" + name;
    for (;;) {
      std::string line;
      {
        std::unique_lock<std::mutex> lock(mu);
        changed.wait_until(lock, end, [&] {
          auto it = claims.find(key);
          return stopping || it == claims.end() || std::stoll(it->second["metadata"].value("resourceVersion", "0")) > since;
        });
        if (stopping || std::chrono::steady_clock::now() >= end) break;
        auto it = claims.find(key);
        if (it == claims.end()) {
          line = Json{{"type", "DELETED"}, {"object", {{"metadata", {{"name", name}, {"namespace", ns}}}}}}.dump() + "\n";
        } else {
          since = std::stoll(it->second["metadata"].value("resourceVersion", "0"));
          line = Json{{"type", "MODIFIED"}, {"object", it->second}}.dump() + "\n";
        }
      }
      asio::write(stream, http::make_chunk(asio::buffer(line)), ec);
      if (ec || line.find("\"DELETED\"") != std::string::npos) break;
    }
    asio::write(stream, http::make_chunk_last(), ec);
  }

  // --- exec -----------------------------------------------------------------

  // The argv's process with its stdio on pipes (every end CLOEXEC; the
  // child's ends dup2'd onto 0, 1, 2).
  pid_t Spawn(const std::vector<std::string>& argv, int* in, int* out, int* err) {
    int pin[2], pout[2], perr[2];
    if (pipe2(pin, O_CLOEXEC) || pipe2(pout, O_CLOEXEC) || pipe2(perr, O_CLOEXEC)) return -1;
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(pin[0], 0);
      dup2(pout[1], 1);
      dup2(perr[1], 2);
      execvp(args[0], args.data());
      _exit(127);
    }
    close(pin[0]);
    close(pout[1]);
    close(perr[1]);
    *in = pin[1];
    *out = pout[0];
    *err = perr[0];
    return pid;
  }

  void Exec(Request req, TlsSocket stream, asio::io_context& io) {
    const std::string target(req.target());
    const auto parts = Split(target.substr(0, target.find('?')), '/');
    const std::string ns = parts[4], pod = parts[6];
    if (!websocket::is_upgrade(req)) {
      // UpgradeAwareHandler with UpgradeRequired: NewBadRequest("Upgrade request required").
      auto res = Answer(req, 400, Fixture("upgrade_required.json", {}));
      boost::system::error_code ec;
      http::write(stream, res, ec);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!pods.count(ns + "/" + pod)) {
        auto res = Answer(req, 404, Fixture("not_found.json", {{"qresource", "pods"}, {"group", ""},
                                                               {"resource", "pods"}, {"name", pod}}));
        boost::system::error_code ec;
        http::write(stream, res, ec);
        return;
      }
    }
    // The subprotocol: the first the server supports, in its own order.
    std::string offered(req[http::field::sec_websocket_protocol]);
    std::set<std::string> asked;
    for (auto p : Split(offered, ',')) {
      while (!p.empty() && p.front() == ' ') p.erase(0, 1);
      while (!p.empty() && p.back() == ' ') p.pop_back();
      asked.insert(p);
    }
    std::string chosen;
    for (const auto& p : options.exec_protocols) {
      if (asked.count(p)) {
        chosen = p;
        break;
      }
    }
    if (chosen.empty()) {
      // wsstream's handshake refuses; golang.org/x/net/websocket answers 403 and no body.
      boost::system::error_code ec;
      asio::write(stream, asio::buffer(std::string("HTTP/1.1 403 Forbidden\r\n\r\n")), ec);
      stream.shutdown(ec);  // Go's tls.Conn.Close sends close_notify
      return;
    }
    std::vector<std::string> argv;
    for (const auto& [k, v] : Query(target.substr(target.find('?') + 1))) {
      if (k == "command") argv.push_back(v);
    }
    websocket::stream<TlsSocket> ws(std::move(stream));
    ws.set_option(websocket::stream_base::decorator(
        [chosen](websocket::response_type& res) { res.set(http::field::sec_websocket_protocol, chosen); }));
    boost::system::error_code ec;
    ws.accept(req, ec);
    if (ec) return;
    ws.binary(true);
    int in, out, err;
    const pid_t pid = Spawn(argv, &in, &out, &err);
    {
      std::lock_guard<std::mutex> lock(mu);
      children.insert(pid);
    }
    std::string command;
    for (const auto& a : argv) command += (command.empty() ? "" : " ") + a;
    Relay(ws, io, pid, in, out, err, chosen == "v5.channel.k8s.io", command);
    std::lock_guard<std::mutex> lock(mu);
    children.erase(pid);
  }

  // The process's stdio over the WebSocket until it ends, then its Status
  // on channel 3 and the close handshake, as the stream translator's
  // finish() does.
  void Relay(websocket::stream<TlsSocket>& ws, asio::io_context& io, pid_t pid, int in, int out, int err, bool v5,
             const std::string& command) {
    asio::posix::stream_descriptor stdin_pipe(io, in), stdout_pipe(io, out), stderr_pipe(io, err);
    std::deque<std::string> outbox;
    std::size_t queued = 0;
    asio::steady_timer wake(io), space(io);
    int producers = 2;
    bool writer_done = false;

    auto writer = [&]() -> asio::awaitable<void> {
      for (;;) {
        boost::system::error_code ec;
        if (outbox.empty()) {
          if (producers == 0) break;
          wake.expires_at(asio::steady_timer::time_point::max());
          co_await wake.async_wait(asio::redirect_error(asio::use_awaitable, ec));
          continue;
        }
        std::string frame = std::move(outbox.front());
        outbox.pop_front();
        queued -= frame.size();
        space.cancel();
        co_await ws.async_write(asio::buffer(frame), asio::redirect_error(asio::use_awaitable, ec));
        if (ec) break;
      }
      // Both outputs ended: the exit status, then the close handshake.
      int status = 0;
      waitpid(pid, &status, 0);
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      std::string s = code == 0 ? Fixture("exec_success.json", {})
                                : Fixture("exec_nonzero_exit.json", {{"command", command}, {"code", std::to_string(code)}});
      s.insert(s.begin(), '\x03');
      boost::system::error_code ec;
      co_await ws.async_write(asio::buffer(s), asio::redirect_error(asio::use_awaitable, ec));
      co_await ws.async_close(websocket::close_code::normal, asio::redirect_error(asio::use_awaitable, ec));
      writer_done = true;
      boost::system::error_code ignored;
      stdin_pipe.close(ignored);
    };
    auto producer = [&](asio::posix::stream_descriptor& pipe, char channel) -> asio::awaitable<void> {
      std::string buf(32 * 1024, '\0');
      for (;;) {
        boost::system::error_code ec;
        const std::size_t n = co_await pipe.async_read_some(asio::buffer(buf), asio::redirect_error(asio::use_awaitable, ec));
        if (ec) break;
        outbox.push_back(std::string(1, channel) + buf.substr(0, n));
        queued += n + 1;
        wake.cancel();
        // Backpressure: at most 1 MiB waits for the client.
        while (queued > (1u << 20)) {
          space.expires_at(asio::steady_timer::time_point::max());
          co_await space.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        }
      }
      --producers;
      wake.cancel();
    };
    auto reader = [&]() -> asio::awaitable<void> {
      beast::flat_buffer buffer;
      for (;;) {
        boost::system::error_code ec;
        co_await ws.async_read(buffer, asio::redirect_error(asio::use_awaitable, ec));
        if (ec) break;
        std::string frame = beast::buffers_to_string(buffer.data());
        buffer.consume(buffer.size());
        if (frame.empty()) continue;
        if (frame[0] == 0 && stdin_pipe.is_open()) {
          co_await asio::async_write(stdin_pipe, asio::buffer(frame.data() + 1, frame.size() - 1),
                                     asio::redirect_error(asio::use_awaitable, ec));
        } else if (v5 && static_cast<unsigned char>(frame[0]) == 255 && frame.size() == 2 && frame[1] == 0) {
          boost::system::error_code ignored;
          stdin_pipe.close(ignored);
        }
      }
      // The client closed the WebSocket: the process's stdin ends with it.
      boost::system::error_code ignored;
      stdin_pipe.close(ignored);
      if (!writer_done) {
        stdout_pipe.close(ignored);
        stderr_pipe.close(ignored);
      }
    };
    // The translator sends an empty message on stdout first: the stream is open.
    outbox.push_back(std::string(1, '\x01'));
    asio::co_spawn(io, writer(), asio::detached);
    asio::co_spawn(io, producer(stdout_pipe, '\x01'), asio::detached);
    asio::co_spawn(io, producer(stderr_pipe, '\x02'), asio::detached);
    asio::co_spawn(io, reader(), asio::detached);
    io.run();
  }

  void Serve(tcp::socket socket, asio::io_context& io) {
    boost::system::error_code ec;
    TlsSocket stream(std::move(socket), *ctx);
    stream.handshake(asio::ssl::stream_base::server, ec);
    if (ec) return;
    beast::flat_buffer buffer;
    Request req;
    http::read(stream, buffer, req, ec);
    if (ec) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      log.push_back(std::string(req.method_string()) + " " + std::string(req.target()));
    }
    if (!Authenticated(req, stream.native_handle())) {
      auto res = Answer(req, 401, Fixture("unauthorized.json", {}));
      http::write(stream, res, ec);
      return;
    }
    const std::string target(req.target());
    const auto parts = Split(target.substr(0, target.find('?')), '/');
    if (parts.size() == 8 && parts[1] == "api" && parts[2] == "v1" && parts[3] == "namespaces" && parts[5] == "pods" &&
        parts[7] == "exec") {
      Exec(std::move(req), std::move(stream), io);
      return;
    }
    bool streamed = false;
    auto res = Rest(req, stream, &streamed);
    if (!streamed) http::write(stream, res, ec);
    stream.shutdown(ec);
  }

  void Accept() {
    for (;;) {
      auto io = std::make_shared<asio::io_context>();
      boost::system::error_code ec;
      tcp::socket socket(*io);
      acceptor->accept(socket, ec);
      std::lock_guard<std::mutex> lock(mu);
      if (ec || stopping) return;
      open_fds.insert(socket.native_handle());
      connections.emplace_back([this, io, s = std::move(socket)]() mutable {
        const int fd = s.native_handle();
        Serve(std::move(s), *io);
        std::lock_guard<std::mutex> lock(mu);
        open_fds.erase(fd);
      });
    }
  }
};

std::unique_ptr<FakeApiServer> FakeApiServer::Start(Options options, std::string* error) {
  std::unique_ptr<FakeApiServer> server(new FakeApiServer());
  server->state_ = std::make_unique<State>();
  State& st = *server->state_;
  st.options = std::move(options);
  auto ca = net::RunCa::Create({});
  if (!ca.ok()) {
    *error = ca.status().ToString();
    return nullptr;
  }
  st.ca = std::move(*ca);
  auto native = st.ca->ServerContext("127.0.0.1");
  if (!native.ok()) {
    *error = native.status().ToString();
    return nullptr;
  }
  SSL_CTX_up_ref(*native);  // asio's context takes a reference of its own
  st.ctx = std::make_unique<asio::ssl::context>(*native);
  if (!st.options.client_ca_pem.empty()) {
    // Client certificates are asked for, not required: a token client sends none.
    st.ctx->add_certificate_authority(asio::buffer(st.options.client_ca_pem));
    SSL_CTX_set_verify(*native, SSL_VERIFY_PEER, nullptr);
  }
  st.acceptor = std::make_unique<tcp::acceptor>(st.accept_io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  st.port = st.acceptor->local_endpoint().port();
  st.accept_thread = std::thread([&st] { st.Accept(); });
  st.controller = std::thread([&st] { st.Controller(); });
  return server;
}

FakeApiServer::~FakeApiServer() {
  State& st = *state_;
  std::vector<std::thread> connections;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    st.stopping = true;
    st.changed.notify_all();
    for (int fd : st.open_fds) ::shutdown(fd, SHUT_RDWR);
    for (pid_t pid : st.children) ::kill(pid, SIGKILL);
  }
  boost::system::error_code ignored;
  ::shutdown(st.acceptor->native_handle(), SHUT_RDWR);
  st.acceptor->close(ignored);
  st.accept_thread.join();
  st.controller.join();
  {
    std::lock_guard<std::mutex> lock(st.mu);
    connections.swap(st.connections);
  }
  for (auto& t : connections) t.join();
}

std::uint16_t FakeApiServer::port() const { return state_->port; }
const std::string& FakeApiServer::ca_pem() const { return state_->ca->certificate_pem(); }

std::string FakeApiServer::Kubeconfig(const std::string& user_yaml) const {
  std::string ca_b64(4 * ((ca_pem().size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(ca_b64.data()),
                                reinterpret_cast<const unsigned char*>(ca_pem().data()), static_cast<int>(ca_pem().size()));
  ca_b64.resize(static_cast<std::size_t>(n));
  std::string user = user_yaml.empty() ? "    token: " + state_->options.token + "\n" : user_yaml;
  return "apiVersion: v1\nkind: Config\ncurrent-context: fake\nclusters:\n- name: fake-cluster\n  cluster:\n"
         "    server: https://127.0.0.1:" + std::to_string(port()) + "\n    certificate-authority-data: " + ca_b64 +
         "\ncontexts:\n- name: fake\n  context:\n    cluster: fake-cluster\n    user: fake-user\n"
         "users:\n- name: fake-user\n  user:\n" + user;
}

void FakeApiServer::AddWarmPool(const std::string& ns, const std::string& name, const std::string& template_name) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->pools[ns + "/" + name] = {
      {"apiVersion", "extensions.agents.x-k8s.io/v1beta1"},
      {"kind", "SandboxWarmPool"},
      {"metadata", {{"name", name}, {"namespace", ns}, {"resourceVersion", std::to_string(++state_->rv)}}},
      {"spec", {{"replicas", 1}, {"sandboxTemplateRef", {{"name", template_name}}}}},
      {"status", {{"replicas", 1}, {"readyReplicas", 1}}}};
}

bool FakeApiServer::HasClaim(const std::string& ns, const std::string& name) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->claims.count(ns + "/" + name) > 0;
}

std::vector<std::string> FakeApiServer::Requests() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->log;
}

}  // namespace agentbox::k8s::testing
