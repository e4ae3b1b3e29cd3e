#include "mcp/http.h"

#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "agentbox/outcome.h"
#include "linux/random.h"
#include "mcp/server.h"
#include "report/json_text.h"

namespace agentbox::mcp {
namespace {

using daemon::ReplyPtr;
using daemon::Request;
using daemon::Response;
using Clock = std::chrono::steady_clock;

constexpr const char* kSessionHeader = "Mcp-Session-Id";

// One MCP session: its protocol state and the agentbox session it drives.
struct McpSession {
  McpSession(session::Manager& manager, std::string agentbox_id, const ServerOptions& options)
      : tools(manager, std::move(agentbox_id)), server(tools, options) {}
  ManagerTools tools;
  Server server;
  std::mutex mu;
  Clock::time_point last_used = Clock::now();  // guarded by mu
  int active = 0;                              // requests being served, guarded by mu
};

// Marks a session busy for the life of one request.
class InUse {
 public:
  explicit InUse(std::shared_ptr<McpSession> s) : s_(std::move(s)) {
    std::lock_guard<std::mutex> lock(s_->mu);
    ++s_->active;
    s_->last_used = Clock::now();
  }
  ~InUse() {
    std::lock_guard<std::mutex> lock(s_->mu);
    --s_->active;
    s_->last_used = Clock::now();
  }
  InUse(const InUse&) = delete;
  InUse& operator=(const InUse&) = delete;

 private:
  std::shared_ptr<McpSession> s_;
};

Response Rpc(int status, const Json& body) {
  Response r;
  r.status = status;
  r.content_type = "application/json";
  r.body = Serialize(body);
  return r;
}

Response RpcError(int status, const Json& id, int code, const std::string& message) {
  return Rpc(status, Server::Error(id, code, message));
}

std::string RandomId() { return linux::RandomHex(16); }

// "http://localhost:3000", "http://127.0.0.1", "http://[::1]:8080".
bool LoopbackOrigin(const std::string& origin) {
  const auto scheme = origin.find("://");
  if (scheme == std::string::npos) return false;
  std::string host = origin.substr(scheme + 3);
  host = host.substr(0, host.find('/'));
  if (host.rfind("[::1]", 0) == 0) return true;
  host = host.substr(0, host.find(':'));
  return host == "localhost" || host.rfind("127.", 0) == 0;
}

bool Accepts(const std::string& accept, const std::string& type) {
  return accept.find(type) != std::string::npos || accept.find("*/*") != std::string::npos;
}

bool IsRequest(const Json& m) { return m.is_object() && m.contains("id") && m.contains("method"); }

bool HasRequest(const Json& message) {
  if (message.is_array()) return std::any_of(message.begin(), message.end(), IsRequest);
  return IsRequest(message);
}

// A tools/call that asked for progress: worth an event stream.
bool WantsProgress(const Json& message) {
  if (!IsRequest(message) || message.value("method", Json()) != "tools/call") return false;
  const Json params = message.value("params", Json::object());
  return params.is_object() && params.contains("_meta") && params["_meta"].is_object() &&
         params["_meta"].contains("progressToken");
}

std::string SseMessage(const Json& message) { return "event: message\ndata: " + Serialize(message) + "\n\n"; }

int HttpStatusFor(const Status& s) {
  if (s.stage() == session::kNotFound) return 404;
  if (s.stage() == session::kBadRequest) return 400;
  if (s.stage() == session::kBusy) return 429;
  if (s.stage() == session::kConflict) return 409;
  return 500;
}

class Endpoint {
 public:
  Endpoint(daemon::Server& server, session::Manager& manager, HttpOptions options)
      : daemon_(server), manager_(manager), options_(options) {
    server_options_.version = Version();
    server_options_.output_cap_bytes = options.output_cap_bytes;
    server_options_.log = [this](const std::string& line) {
      daemon_.log().Log(daemon::Level::kInfo, "mcp", {{"message", line}});
    };
  }

  void Handle(Request req, ReplyPtr reply) {
    if (req.path != "/mcp") {
      return reply->Send(Response::Error(404, "not_found", "no route " + req.path + " (the MCP endpoint is /mcp)"));
    }
    if (const std::string origin = req.Header("origin"); !origin.empty() && !LoopbackOrigin(origin)) {
      return reply->Send(Response::Error(403, "forbidden", "Origin " + origin + " is not a loopback origin"));
    }
    if (req.method == "POST") return Post(std::move(req), std::move(reply));
    if (req.method == "DELETE") return Delete(req, reply);
    Response r = RpcError(405, nullptr, kInvalidRequest,
                          req.method + " /mcp: not offered (this server opens no stream of its own); use POST");
    r.headers.emplace_back("Allow", "POST, DELETE");
    reply->Send(std::move(r));
  }

 private:
  void Post(Request req, ReplyPtr reply) {
    if (const std::string v = req.Header("mcp-protocol-version"); !v.empty()) {
      const auto& ok = SupportedProtocols();
      if (std::find(ok.begin(), ok.end(), v) == ok.end()) {
        return reply->Send(RpcError(400, nullptr, kInvalidRequest, "unsupported MCP-Protocol-Version: " + v));
      }
    }
    if (req.body.size() > kMaxMessageBytes) return reply->Send(Rpc(413, Server::TooLarge(req.body.size())));
    Json message = report::ParseJsonOrDiscarded(req.body);
    if (message.is_discarded()) {
      return reply->Send(RpcError(400, nullptr, kParseError, "parse error: the request body is not valid JSON"));
    }
    const std::string sid = req.Header("mcp-session-id");
    if (sid.empty()) {
      if (IsRequest(message) && message["method"] == "initialize") return Initialize(std::move(req), std::move(message), reply);
      return reply->Send(RpcError(400, IsRequest(message) ? message["id"] : Json(), kInvalidRequest,
                                  "Mcp-Session-Id header required: send initialize (without the header) first"));
    }
    std::shared_ptr<McpSession> s = Find(sid);
    if (!s) {
      return reply->Send(RpcError(404, IsRequest(message) ? message["id"] : Json(), kInvalidRequest,
                                  "no MCP session " + sid + " (ended or expired): initialize again"));
    }
    reply->Note("mcp_session", sid);
    reply->Note("session", s->tools.session_id());

    if (!HasRequest(message)) {
      // Notifications (a cancellation among them) and responses: at once.
      InUse use(s);
      (void)s->server.Handle(message, nullptr);
      return reply->Send(Response{202, "application/json", "", {}});
    }
    if (!Server::MayRunLong(message)) {
      InUse use(s);
      auto response = s->server.Handle(message, nullptr);
      return reply->Send(response ? Rpc(200, *response) : Response{202, "application/json", "", {}});
    }
    const bool stream = WantsProgress(message) && Accepts(req.Header("accept"), "text/event-stream");
    const Json id = IsRequest(message) ? message["id"] : Json();
    auto work = [s, reply, message = std::move(message), stream] {
      InUse use(s);
      if (!stream) {
        auto response = s->server.Handle(message, nullptr);
        return reply->Send(response ? Rpc(200, *response) : Response{202, "application/json", "", {}});
      }
      reply->Begin(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
      auto response = s->server.Handle(message, [&reply](const Json& note) { reply->Write(SseMessage(note)); });
      if (response) reply->Write(SseMessage(*response));
      reply->End();
    };
    if (!daemon_.RunBlocking(std::move(work))) {
      reply->Send(RpcError(429, id, kInternalError, "too many calls in progress; retry later"));
    }
  }

  void Initialize(Request req, Json message, ReplyPtr reply) {
    const Json id = message["id"];
    const Json params = message.value("params", Json::object());
    if (!params.is_object() || !params.contains("protocolVersion") || !params["protocolVersion"].is_string()) {
      return reply->Send(RpcError(200, id, kInvalidParams, "initialize: params.protocolVersion: required string"));
    }
    auto q = [&](const char* key) { return req.query.count(key) ? req.query.at(key) : std::string(); };
    const std::string attach = q("session"), workspace = q("workspace"), policy = q("policy"), mode = q("mode");
    if (!attach.empty() && !workspace.empty()) {
      return reply->Send(RpcError(400, id, kInvalidParams, "/mcp: give ?session=ID or ?workspace=DIR, not both"));
    }
    if (attach.empty() && workspace.empty()) {
      return reply->Send(RpcError(400, id, kInvalidParams,
                                  "/mcp: the initialize request needs ?workspace=DIR (a new session) or ?session=ID "
                                  "(an existing one) in the URL"));
    }
    for (const auto& [name, path] : {std::pair{"workspace", workspace}, std::pair{"policy", policy}}) {
      if (!path.empty() && path[0] != '/') {
        return reply->Send(RpcError(400, id, kInvalidParams, std::string("/mcp: ") + name + " '" + path +
                                                                 "' is not an absolute path"));
      }
    }
    auto work = [this, reply, id, message = std::move(message), attach, workspace, policy, mode] {
      std::string agentbox_id = attach;
      if (!attach.empty()) {
        if (auto d = manager_.Describe(attach); !d.ok()) {
          return reply->Send(RpcError(HttpStatusFor(d.status()), id, kInvalidParams, "/mcp ?session=" + attach + ": " +
                                                                                        d.status().message()));
        }
      } else {
        session::CreateRequest create;
        create.workspace = workspace;
        create.mode = mode;
        if (!policy.empty()) {
          std::ifstream in(policy);
          if (!in) {
            return reply->Send(RpcError(400, id, kInvalidParams, "/mcp ?policy=" + policy + ": cannot read the file"));
          }
          std::stringstream ss;
          ss << in.rdbuf();
          create.policy_yaml = ss.str();
        }
        auto created = manager_.Create(create);
        if (!created.ok()) {
          return reply->Send(RpcError(HttpStatusFor(created.status()), id, kInvalidParams,
                                      "cannot create a session on " + workspace + ": " + created.status().message()));
        }
        agentbox_id = *created;
      }
      auto s = std::make_shared<McpSession>(manager_, agentbox_id, server_options_);
      auto response = s->server.Handle(message, nullptr);
      if (!response || !response->contains("result")) return reply->Send(Rpc(200, response.value_or(Json())));
      (*response)["result"]["_meta"] = {{"agentbox/session", agentbox_id}};
      const std::string sid = RandomId();
      if (!Insert(sid, s)) {
        return reply->Send(RpcError(429, id, kInternalError,
                                    "too many MCP sessions in use (" + std::to_string(options_.max_sessions) +
                                        "); end one with DELETE /mcp"));
      }
      reply->Note("mcp_session", sid);
      reply->Note("session", agentbox_id);
      Response r = Rpc(200, *response);
      r.headers.emplace_back(kSessionHeader, sid);
      reply->Send(std::move(r));
    };
    if (!daemon_.RunBlocking(std::move(work))) {
      reply->Send(RpcError(429, id, kInternalError, "too many calls in progress; retry later"));
    }
  }

  void Delete(const Request& req, const ReplyPtr& reply) {
    const std::string sid = req.Header("mcp-session-id");
    if (sid.empty()) return reply->Send(RpcError(400, nullptr, kInvalidRequest, "DELETE /mcp: Mcp-Session-Id header required"));
    std::shared_ptr<McpSession> s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = sessions_.find(sid);
      if (it != sessions_.end()) {
        s = it->second;
        sessions_.erase(it);
      }
    }
    if (!s) return reply->Send(RpcError(404, nullptr, kInvalidRequest, "no MCP session " + sid));
    s->server.CancelAll();
    reply->Note("mcp_session", sid);
    reply->Send(Response::NoContent());
  }

  std::shared_ptr<McpSession> Find(const std::string& sid) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sessions_.find(sid);
    return it == sessions_.end() ? nullptr : it->second;
  }

  // Adds a session, first dropping expired ones and, at the cap, the least
  // recently used idle one. false: every session is busy.
  bool Insert(const std::string& sid, std::shared_ptr<McpSession> s) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    auto idle_since = [](McpSession& m) -> std::optional<Clock::time_point> {
      std::lock_guard<std::mutex> l(m.mu);
      return m.active == 0 ? std::optional(m.last_used) : std::nullopt;
    };
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      auto since = idle_since(*it->second);
      it = since && now - *since > options_.idle_expiry ? sessions_.erase(it) : std::next(it);
    }
    if (sessions_.size() >= options_.max_sessions) {
      auto oldest = sessions_.end();
      Clock::time_point oldest_at = Clock::time_point::max();
      for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
        if (auto since = idle_since(*it->second); since && *since < oldest_at) {
          oldest = it;
          oldest_at = *since;
        }
      }
      if (oldest == sessions_.end()) return false;
      sessions_.erase(oldest);
    }
    sessions_[sid] = std::move(s);
    return true;
  }

  daemon::Server& daemon_;
  session::Manager& manager_;
  const HttpOptions options_;
  ServerOptions server_options_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<McpSession>> sessions_;
};

}  // namespace

void RegisterHttp(daemon::Server& server, session::Manager& manager, HttpOptions options) {
  auto endpoint = std::make_shared<Endpoint>(server, manager, options);
  server.router().AddPrefix("/mcp", [endpoint](Request req, ReplyPtr reply) {
    endpoint->Handle(std::move(req), std::move(reply));
  });
}

}  // namespace agentbox::mcp
