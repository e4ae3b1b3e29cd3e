// The REST side of the client: one connection per request on an io_context
// of its own, every step bounded by the call's deadline (Beast's timeouts
// hold for asynchronous operations, hence the coroutine), as
// gateway/http_upstream.cc does for MCP servers.
#include "k8s/client.h"

#include <utility>  // before Asio's awaitable.hpp, which uses std::exchange

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/http.hpp>

#include <openssl/crypto.h>

#include <algorithm>
#include <cctype>
#include <thread>

#include "k8s/client_tls.h"

namespace agentbox::k8s {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kMaxBody = 16 * 1024 * 1024;  // one object or list
constexpr std::size_t kDetail = 400;                // of a non-Status body, for the error
constexpr std::size_t kMaxWatchLine = 4 * 1024 * 1024;

std::string Seconds(std::chrono::milliseconds d) {
  const auto ms = d.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

std::string PercentEncode(std::string_view s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string ClaimsPath(const std::string& ns) {
  return std::string("/apis/") + kClaimGroupVersion + "/namespaces/" + PercentEncode(ns) + "/sandboxclaims";
}
std::string PoolsPath(const std::string& ns) {
  return std::string("/apis/") + kClaimGroupVersion + "/namespaces/" + PercentEncode(ns) + "/sandboxwarmpools";
}
std::string SandboxPath(const std::string& ns, const std::string& name) {
  return std::string("/apis/") + kSandboxGroupVersion + "/namespaces/" + PercentEncode(ns) + "/sandboxes/" +
         PercentEncode(name);
}

http::verb VerbOf(Method m) {
  switch (m) {
    case Method::kGet: return http::verb::get;
    case Method::kPost: return http::verb::post;
    case Method::kDelete: return http::verb::delete_;
  }
  return http::verb::get;
}

const char* NameOf(Method m) {
  switch (m) {
    case Method::kGet: return "GET";
    case Method::kPost: return "POST";
    case Method::kDelete: return "DELETE";
  }
  return "?";
}

bool Ok(int code) { return code >= 200 && code <= 299; }

// The string at `key` of an object, "" when missing or not a string.
std::string Str(const Json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return "";
  return j[key].get<std::string>();
}

// The string at `a`.`b` of an object, "" when any step is missing or not
// of the expected type (answers are the server's, never trusted to have a shape).
std::string StrAt(const Json& j, const char* a, const char* b) {
  if (!j.is_object() || !j.contains(a) || !j[a].is_object() || !j[a].contains(b) || !j[a][b].is_string()) return "";
  return j[a][b].get<std::string>();
}

}  // namespace

std::string DescribeFailure(const ApiResponse& r) {
  std::string out = "HTTP " + std::to_string(r.code);
  const Json& b = r.body;
  if (b.is_object() && Str(b, "kind") == "Status") {
    const std::string reason = Str(b, "reason");
    if (!reason.empty()) out += " " + reason;
    const std::string message = Str(b, "message");
    if (!message.empty()) out += ": " + message;
    return out;
  }
  if (!r.text.empty()) out += ": " + r.text.substr(0, kDetail);
  return out;
}

ApiClient::~ApiClient() {
  OPENSSL_cleanse(config_.token.data(), config_.token.size());
  OPENSSL_cleanse(config_.client_key_pem.data(), config_.client_key_pem.size());
}

Result<std::unique_ptr<ApiClient>> ApiClient::Create(Kubeconfig config) {
  auto tls = MakeTlsContext(config);
  if (!tls.ok()) return tls.status();
  std::unique_ptr<ApiClient> api(new ApiClient());
  api->config_ = std::move(config);
  api->tls_ = std::move(*tls);
  return api;
}

std::string ApiClient::server() const {
  const bool v6 = config_.host.find(':') != std::string::npos;
  return "https://" + (v6 ? "[" + config_.host + "]" : config_.host) + ":" + config_.port;
}

namespace {

http::request<http::string_body> MakeRequest(const Kubeconfig& k, http::verb verb, const std::string& path) {
  http::request<http::string_body> request{verb, k.prefix + path, 11};
  const bool v6 = k.host.find(':') != std::string::npos;
  request.set(http::field::host, (v6 ? "[" + k.host + "]" : k.host) + ":" + k.port);
  request.set(http::field::user_agent, "agentbox");
  request.set(http::field::accept, "application/json");
  if (!k.token.empty()) request.set(http::field::authorization, "Bearer " + k.token);
  request.keep_alive(false);
  return request;
}

// Runs `body` (a coroutine on a TlsStream) on an io_context of its own;
// the failure, if any, as TransportError's text.
template <class Body>
std::string RunOnConnection(const Kubeconfig& k, TlsContext& tls, Clock::time_point deadline, Body body) {
  asio::io_context io;
  TlsStream stream(io, tls.ctx);
  beast::get_lowest_layer(stream).expires_at(deadline);
  std::exception_ptr failure;
  auto run = [&]() -> asio::awaitable<void> {
    co_await OpenTls(stream, k);
    co_await body(stream);
  };
  asio::co_spawn(io, run(), [&](std::exception_ptr e) { failure = e; });
  io.run();
  return failure ? TransportError(failure, stream.native_handle()) : "";
}

}  // namespace

Result<ApiResponse> ApiClient::Call(Method method, const std::string& path, const Json* body,
                                    Clock::time_point deadline) const {
  auto request = MakeRequest(config_, VerbOf(method), path);
  if (body) {
    request.set(http::field::content_type, "application/json");
    request.body() = body->dump();
  }
  request.prepare_payload();
  ApiResponse out;
  const std::string failed = RunOnConnection(config_, *tls_, deadline, [&](TlsStream& s) -> asio::awaitable<void> {
    co_await http::async_write(s, request, asio::use_awaitable);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxBody);
    co_await http::async_read(s, buffer, parser, asio::use_awaitable);
    out.code = static_cast<int>(parser.get().result_int());
    out.text = std::move(parser.get().body());
  });
  if (!failed.empty()) {
    return Status::Error(kApiStage, server() + ": " + NameOf(method) + " " + path + ": " + failed);
  }
  out.body = Json::parse(out.text, nullptr, false);
  if (out.body.is_discarded()) out.body = nullptr;
  return out;
}

Status ApiClient::Watch(const std::string& path, Clock::time_point deadline,
                        const std::function<bool(const Json&)>& on_event) const {
  auto request = MakeRequest(config_, http::verb::get, path);
  request.prepare_payload();
  ApiResponse refused;
  const std::string failed = RunOnConnection(config_, *tls_, deadline, [&](TlsStream& s) -> asio::awaitable<void> {
    co_await http::async_write(s, request, asio::use_awaitable);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(boost::none);  // a stream; each line is bounded below instead
    co_await http::async_read_header(s, buffer, parser, asio::use_awaitable);
    const int code = static_cast<int>(parser.get().result_int());
    if (!Ok(code)) {
      parser.body_limit(kMaxBody);
      co_await http::async_read(s, buffer, parser, asio::use_awaitable);
      refused.code = code;
      refused.text = std::move(parser.get().body());
      co_return;
    }
    std::string pending;
    for (;;) {
      pending += parser.get().body();
      parser.get().body().clear();  // the body reader appends at the end, wherever that is
      for (auto nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n')) {
        const Json event = Json::parse(pending.substr(0, nl), nullptr, false);
        pending.erase(0, nl + 1);
        if (event.is_object() && !on_event(event)) co_return;
      }
      if (pending.size() > kMaxWatchLine) {
        throw boost::system::system_error(asio::error::message_size, "a watch event longer than 4 MiB");
      }
      if (parser.is_done()) co_return;
      boost::system::error_code ec;
      co_await http::async_read_some(s, buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
      // The server ending a watch (its timeoutSeconds, a restart) is not a failure.
      if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::ssl::error::stream_truncated) {
        co_return;
      }
      if (ec) throw boost::system::system_error(ec);
    }
  });
  if (refused.code != 0) {
    refused.body = Json::parse(refused.text, nullptr, false);
    return Status::Error(kApiStage, server() + ": watch " + path + ": " + DescribeFailure(refused));
  }
  if (!failed.empty() && failed != "no answer in time") {
    return Status::Error(kApiStage, server() + ": watch " + path + ": " + failed);
  }
  return Status();
}

Result<std::unique_ptr<ExecStream>> ApiClient::Exec(const std::string& ns, const std::string& pod,
                                                    const std::string& container,
                                                    const std::vector<std::string>& argv, ExecCallbacks callbacks,
                                                    std::chrono::milliseconds connect_timeout) const {
  if (argv.empty()) return Status::Error(kApiStage, "exec in pod " + pod + ": no command");
  std::string target = config_.prefix + "/api/v1/namespaces/" + PercentEncode(ns) + "/pods/" + PercentEncode(pod) +
                       "/exec?";
  for (const auto& arg : argv) target += "command=" + PercentEncode(arg) + "&";
  if (!container.empty()) target += "container=" + PercentEncode(container) + "&";
  target += "stdin=true&stdout=true&stderr=true";
  auto stream = ExecStream::Start(config_, *tls_, target, std::move(callbacks), connect_timeout);
  if (!stream.ok()) {
    return stream.status().WithContext(server() + ": exec in pod " + ns + "/" + pod);
  }
  return stream;
}

ClaimState ClaimStateOf(const Json& claim) {
  ClaimState st;
  if (!claim.is_object()) return st;
  const Json& meta = claim.value("metadata", Json::object());
  st.deleting = meta.contains("deletionTimestamp") && !meta["deletionTimestamp"].is_null();
  const Json& status = claim.value("status", Json::object());
  if (!status.is_object()) return st;
  if (status.contains("sandbox") && status["sandbox"].is_object()) st.sandbox = Str(status["sandbox"], "name");
  if (status.contains("conditions") && status["conditions"].is_array()) {
    for (const auto& c : status["conditions"]) {
      if (!c.is_object() || Str(c, "type") != "Ready") continue;
      st.ready = Str(c, "status") == "True";
      st.ready_reason = Str(c, "reason");
      st.ready_message = Str(c, "message");
    }
  }
  return st;
}

Result<std::string> WarmPoolFor(const ApiClient& api, const std::string& ns, const std::string& template_name,
                                Clock::time_point deadline) {
  auto serves = [&](const Json& pool) {
    return pool.is_object() && pool.contains("spec") && StrAt(pool["spec"], "sandboxTemplateRef", "name") == template_name;
  };
  // The pool named as the template: one GET, and the name `agentbox k8s render` gives it.
  auto named = api.Call(Method::kGet, PoolsPath(ns) + "/" + PercentEncode(template_name), nullptr, deadline);
  if (!named.ok()) return named.status();
  if (Ok(named->code) && serves(named->body)) return template_name;
  if (!Ok(named->code) && named->code != 404) {
    return Status::Error(
        kApiStage, api.server() + ": get SandboxWarmPool " + ns + "/" + template_name + ": " + DescribeFailure(*named));
  }
  auto list = api.Call(Method::kGet, PoolsPath(ns), nullptr, deadline);
  if (!list.ok()) return list.status();
  if (!Ok(list->code)) {
    return Status::Error(kApiStage, api.server() + ": list SandboxWarmPools in " + ns + ": " + DescribeFailure(*list));
  }
  std::vector<std::string> found;
  const Json items = list->body.is_object() ? list->body.value("items", Json::array()) : Json::array();
  for (const auto& pool : items) {
    if (serves(pool)) found.push_back(StrAt(pool, "metadata", "name"));
  }
  if (found.size() == 1) return found[0];
  if (found.empty()) {
    return Status::Error(kApiStage,
                         "no SandboxWarmPool in namespace " + ns + " serves SandboxTemplate " + template_name +
                             "; a v1beta1 SandboxClaim names a warm pool, so the cluster needs one (replicas: "
                             "0 for cold starts; `agentbox k8s render` makes one named as the template)");
  }
  std::string names;
  for (const auto& n : found) names += (names.empty() ? "" : ", ") + n;
  return Status::Error(kApiStage, "several SandboxWarmPools in namespace " + ns + " serve SandboxTemplate " +
                                      template_name + " (" + names +
                                      ") and none is named as the template; name one "
                                      "after it so that the choice is not a guess");
}

namespace {

// Waits until the claim is Ready with a Sandbox bound: a GET, then a watch
// of that one object from the GET's resourceVersion, again after the
// server ends the watch, until the deadline. The API server ends watches
// on its own (timeoutSeconds, restarts); a GET between watches also
// covers a missed event. Backoff between rounds keeps a server that ends
// every watch at once from turning this into a busy loop.
Result<ClaimState> AwaitReady(const ApiClient& api, const std::string& ns, const std::string& name,
                              Clock::time_point deadline, std::chrono::milliseconds timeout) {
  ClaimState last;
  auto backoff = std::chrono::milliseconds(100);
  const std::string where = "SandboxClaim " + ns + "/" + name;
  for (;;) {
    auto got = api.Call(Method::kGet, ClaimsPath(ns) + "/" + PercentEncode(name), nullptr, deadline);
    if (!got.ok() && Clock::now() >= deadline) break;
    if (!got.ok()) return got.status();
    if (got->code == 404) return Status::Error(kApiStage, where + " was deleted while agentbox waited for it");
    if (!Ok(got->code)) {
      return Status::Error(kApiStage, api.server() + ": get " + where + ": " + DescribeFailure(*got));
    }
    last = ClaimStateOf(got->body);
    if (last.ready && !last.sandbox.empty()) return last;
    if (last.deleting) return Status::Error(kApiStage, where + " is being deleted");
    const auto left = std::chrono::duration_cast<std::chrono::seconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    const std::string rv = StrAt(got->body, "metadata", "resourceVersion");
    const std::string path = ClaimsPath(ns) + "?watch=1&allowWatchBookmarks=false&fieldSelector=" +
                             PercentEncode("metadata.name=" + name) + "&resourceVersion=" + PercentEncode(rv) +
                             "&timeoutSeconds=" + std::to_string(left + 1);
    Status failure;
    bool gone = false;
    Status watched = api.Watch(path, deadline, [&](const Json& event) {
      const std::string type = Str(event, "type");
      if (type == "DELETED") {
        gone = true;
        return false;
      }
      if (type == "ERROR") return false;  // e.g. 410 Expired: GET again
      if (type != "ADDED" && type != "MODIFIED") return true;
      last = ClaimStateOf(event.value("object", Json::object()));
      return !(last.ready && !last.sandbox.empty());
    });
    if (gone) return Status::Error(kApiStage, where + " was deleted while agentbox waited for it");
    if (last.ready && !last.sandbox.empty()) return last;
    if (!watched.ok()) return watched;
    if (Clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
  std::string why = last.ready_reason.empty() ? "no Ready condition yet"
                                              : "Ready is not True: " + last.ready_reason +
                                                    (last.ready_message.empty() ? "" : " (" + last.ready_message + ")");
  return Status::Error(kApiStage, where + " was not ready within " + Seconds(timeout) + ": " + why);
}

Json ClaimObject(const std::string& ns, const std::string& name, const std::string& pool) {
  return Json{{"apiVersion", kClaimGroupVersion},
              {"kind", "SandboxClaim"},
              {"metadata",
               {{"name", name}, {"namespace", ns}, {"labels", {{"agents.x-k8s.io/created-by", "agentbox"}}}}},
              {"spec", {{"warmPoolRef", {{"name", pool}}}}}};
}

}  // namespace

Result<std::unique_ptr<ClaimedSandbox>> ClaimedSandbox::Claim(const KubernetesRemoteSpec& spec,
                                                              const std::string& claim_name,
                                                              std::chrono::milliseconds ready_timeout) {
  auto config = LoadKubeconfig(spec.kubeconfig, spec.context);
  if (!config.ok()) return config.status();
  auto api = ApiClient::Create(std::move(*config));
  if (!api.ok()) return api.status();
  return Claim(std::shared_ptr<const ApiClient>(std::move(*api)), spec, claim_name, ready_timeout);
}

Result<std::unique_ptr<ClaimedSandbox>> ClaimedSandbox::Claim(std::shared_ptr<const ApiClient> api,
                                                              const KubernetesRemoteSpec& spec,
                                                              const std::string& claim_name,
                                                              std::chrono::milliseconds ready_timeout) {
  const auto deadline = Clock::now() + ready_timeout;
  const std::string& ns = spec.namespace_name;
  const std::string where = "SandboxClaim " + ns + "/" + claim_name;

  // 1. The warm pool serving the template (a v1beta1 claim names a pool).
  auto pool = WarmPoolFor(*api, ns, spec.template_name, deadline);
  if (!pool.ok()) return pool.status();

  // 2. The claim. A 409 means someone else's claim has the name: never adopted.
  const Json object = ClaimObject(ns, claim_name, *pool);
  auto created = api->Call(Method::kPost, ClaimsPath(ns), &object, deadline);
  if (!created.ok()) return created.status();
  if (created->code == 409) {
    return Status::Error(kApiStage, api->server() + ": create " + where + ": " + DescribeFailure(*created) +
                                        "; agentbox does not adopt a claim it did not create");
  }
  if (!Ok(created->code)) {
    return Status::Error(kApiStage, api->server() + ": create " + where + ": " + DescribeFailure(*created));
  }
  // From here on the claim is ours: the object deletes it on every way out.
  std::unique_ptr<ClaimedSandbox> claimed(new ClaimedSandbox());
  claimed->api_ = std::move(api);
  claimed->namespace_ = ns;
  claimed->claim_ = claim_name;
  claimed->uid_ = StrAt(created->body, "metadata", "uid");
  if (Status b = claimed->Bind(deadline, ready_timeout); !b.ok()) return b;
  return claimed;
}

Result<std::unique_ptr<ClaimedSandbox>> ClaimedSandbox::Resume(const KubernetesRemoteSpec& spec,
                                                               const std::string& claim_name, const std::string& uid,
                                                               std::chrono::milliseconds ready_timeout) {
  auto config = LoadKubeconfig(spec.kubeconfig, spec.context);
  if (!config.ok()) return config.status();
  auto made = ApiClient::Create(std::move(*config));
  if (!made.ok()) return made.status();
  std::shared_ptr<const ApiClient> api(std::move(*made));
  const auto deadline = Clock::now() + ready_timeout;
  const std::string& ns = spec.namespace_name;
  const std::string where = "SandboxClaim " + ns + "/" + claim_name;
  auto got = api->Call(Method::kGet, ClaimsPath(ns) + "/" + PercentEncode(claim_name), nullptr, deadline);
  if (!got.ok()) return got.status();
  if (got->code == 404) return Status::Error("not_found", where + " is gone");
  if (!Ok(got->code)) return Status::Error(kApiStage, api->server() + ": get " + where + ": " + DescribeFailure(*got));
  const Json metadata = got->body.is_object() ? got->body.value("metadata", Json::object()) : Json::object();
  const std::string label = StrAt(metadata, "labels", "agents.x-k8s.io/created-by");
  const std::string their_uid = StrAt(got->body, "metadata", "uid");
  if (label != "agentbox" || (!uid.empty() && their_uid != uid)) {
    return Status::Error("not_found", where + " is not the claim agentbox made (" +
                                     (label != "agentbox" ? "no agents.x-k8s.io/created-by: agentbox label"
                                                          : "uid " + their_uid + ", not " + uid) +
                                     "): not adopted, not deleted");
  }
  std::unique_ptr<ClaimedSandbox> claimed(new ClaimedSandbox());
  claimed->api_ = std::move(api);
  claimed->namespace_ = ns;
  claimed->claim_ = claim_name;
  claimed->uid_ = their_uid;
  if (Status b = claimed->Bind(deadline, ready_timeout); !b.ok()) return b;
  return claimed;
}

Status ClaimedSandbox::Bind(Clock::time_point deadline, std::chrono::milliseconds ready_timeout) {
  // Ready, with its Sandbox bound.
  auto ready = AwaitReady(*api_, namespace_, claim_, deadline, ready_timeout);
  if (!ready.ok()) return ready.status();
  sandbox_ = ready->sandbox;
  // The pod: the Sandbox's pod-name annotation (a pod adopted from the
  // warm pool keeps its own name), else the Sandbox's name.
  auto sandbox = api_->Call(Method::kGet, SandboxPath(namespace_, ready->sandbox), nullptr,
                            std::max(deadline, Clock::now() + std::chrono::seconds(10)));
  if (!sandbox.ok()) return sandbox.status();
  if (!Ok(sandbox->code)) {
    return Status::Error(kApiStage, api_->server() + ": get Sandbox " + namespace_ + "/" + ready->sandbox + ": " +
                                        DescribeFailure(*sandbox));
  }
  const Json& body = sandbox->body;
  if (body.is_object() && body.contains("metadata") && body["metadata"].is_object()) {
    pod_ = StrAt(body["metadata"], "annotations", kPodNameAnnotation);
  }
  if (pod_.empty()) pod_ = ready->sandbox;
  return Status();
}

ClaimedSandbox::~ClaimedSandbox() { (void)Release(); }

Result<linux::UniqueFd> ClaimedSandbox::Exec(const std::vector<std::string>& argv, ExecCallbacks callbacks,
                                             const std::string& container) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (released_) return Status::Error(kApiStage, "SandboxClaim " + namespace_ + "/" + claim_ + " was released");
    // Relays that ended hold nothing but a finished thread: joined here.
    std::erase_if(streams_, [](const std::unique_ptr<ExecStream>& s) { return s->done(); });
  }
  auto stream = api_->Exec(namespace_, pod_, container, argv, std::move(callbacks), std::chrono::seconds(30));
  if (!stream.ok()) return stream.status();
  linux::UniqueFd fd = (*stream)->TakeStream();
  std::lock_guard<std::mutex> lock(mu_);
  if (released_) return Status::Error(kApiStage, "SandboxClaim " + namespace_ + "/" + claim_ + " was released");
  streams_.push_back(std::move(*stream));
  return fd;
}

Status ClaimedSandbox::Release() {
  std::vector<std::unique_ptr<ExecStream>> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (released_ || !api_) return Status();
    streams.swap(streams_);
  }
  streams.clear();  // each relay stopped and joined before its pod goes
  const std::string where = "SandboxClaim " + namespace_ + "/" + claim_;
  const Json options = {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}, {"propagationPolicy", "Background"}};
  auto deleted = api_->Call(Method::kDelete, ClaimsPath(namespace_) + "/" + PercentEncode(claim_), &options,
                            Clock::now() + std::chrono::seconds(30));
  if (!deleted.ok()) return deleted.status().WithContext("delete " + where);
  if (!Ok(deleted->code) && deleted->code != 404) {
    return Status::Error(kApiStage, api_->server() + ": delete " + where + ": " + DescribeFailure(*deleted));
  }
  std::lock_guard<std::mutex> lock(mu_);
  released_ = true;
  return Status();
}

}  // namespace agentbox::k8s
