#include "daemon/api.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "agentbox/outcome.h"
#include "linux/fd.h"
#include "net/secrets.h"
#include "report/json_text.h"
#include "session/layers.h"
#include "session/services.h"

namespace agentbox::daemon {

using nlohmann::json;

namespace {
constexpr std::size_t kLogChunk = 64u << 10;
}  // namespace

Response ErrorFor(const Status& s) {
  const std::string& stage = s.stage();
  if (stage == session::kNotFound) return Response::Error(404, "not_found", s.message());
  if (stage == session::kBadRequest) return Response::Error(400, "bad_request", s.message());
  if (stage == session::kBusy) return Response::Error(429, "busy", s.message());
  if (stage == session::kConflict) return Response::Error(409, "conflict", s.message());
  if (stage == session::kPathTooLong) return Response::Error(422, "path_too_long", s.message());
  return Response::Error(500, "internal", s.ToString());
}

Response Busy() {
  return Response::Error(429, "busy", "too many requests in progress; retry later");
}

// The body as a JSON object ("" counts as {}); else a 400 naming the problem.
bool ParseObject(const Request& req, json* out, Response* error) {
  if (req.body.find_first_not_of(" \t\r\n") == std::string::npos) {
    *out = json::object();
    return true;
  }
  auto what = [](const json::exception& e) {  // nlohmann's message without its "[json.exception...] "
    std::string text = e.what();
    if (auto bracket = text.find("] "); text.rfind("[json.exception", 0) == 0 && bracket != std::string::npos) {
      text = text.substr(bracket + 2);
    }
    return text;
  };
  try {
    *out = report::ParseJson(req.body);
  } catch (const json::parse_error& e) {
    *error = Response::Error(400, "malformed_json",
                             "request body is not valid JSON: " + what(e) + " (byte " + std::to_string(e.byte) + ")");
    return false;
  } catch (const json::exception& e) {  // a number past a double's range (out_of_range 406)
    *error = Response::Error(400, "malformed_json", "request body is not valid JSON: " + what(e));
    return false;
  }
  if (!out->is_object()) {
    *error = Response::Error(400, "bad_request", std::string("request body must be a JSON object, not ") +
                                                     out->type_name());
    return false;
  }
  return true;
}

// Checks that `obj` has only `allowed` keys and that each present key in
// `strings` is a string; names the first offender.
bool CheckFields(const json& obj, const std::vector<std::string>& allowed, const std::vector<std::string>& strings,
                 Response* error) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (std::find(allowed.begin(), allowed.end(), it.key()) == allowed.end()) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      *error = Response::Error(400, "bad_request", "unknown field '" + it.key() + "' (expected: " + list + ")");
      return false;
    }
  }
  for (const auto& key : strings) {
    if (obj.contains(key) && !obj[key].is_string()) {
      *error = Response::Error(400, "bad_request",
                               "field '" + key + "' must be a string, not " + std::string(obj[key].type_name()));
      return false;
    }
  }
  return true;
}

namespace {

std::string Str(const json& obj, const char* key) {
  return obj.contains(key) ? obj[key].get<std::string>() : std::string();
}

// Running calls that carry a call_id, so that they can be cancelled.
class CallRegistry {
 public:
  // nullptr when the same call is already running.
  std::shared_ptr<std::atomic<bool>> Register(const std::string& session, const std::string& call_id) {
    std::lock_guard lock(mu_);
    auto [it, fresh] = calls_.try_emplace(Key(session, call_id));
    if (!fresh) return nullptr;
    it->second = std::make_shared<std::atomic<bool>>(false);
    return it->second;
  }
  void Unregister(const std::string& session, const std::string& call_id) {
    std::lock_guard lock(mu_);
    calls_.erase(Key(session, call_id));
  }
  bool Cancel(const std::string& session, const std::string& call_id) {
    std::lock_guard lock(mu_);
    auto it = calls_.find(Key(session, call_id));
    if (it == calls_.end()) return false;
    it->second->store(true);
    return true;
  }

 private:
  static std::string Key(const std::string& session, const std::string& call_id) { return session + '\n' + call_id; }
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<std::atomic<bool>>> calls_;
};

struct Api {
  Server& server;
  session::Manager& manager;
  CallRegistry calls;

  // Runs `work` on a worker; 429 when none is free.
  void Blocking(const ReplyPtr& reply, std::function<void()> work) {
    if (!server.RunBlocking(std::move(work))) reply->Send(Busy());
  }

  void Health(Request, ReplyPtr reply) {
    Blocking(reply, [this, reply] {
      reply->Send(Response::Json(200, {{"ok", true}, {"version", Version()}, {"sessions", manager.List().size()}}));
    });
  }

  void Create(Request req, ReplyPtr reply) {
    json body;
    Response error;
    if (!ParseObject(req, &body, &error) ||
        !CheckFields(body, {"policy", "mode", "workspace", "from_snapshot"}, {"policy", "mode", "workspace", "from_snapshot"},
                     &error)) {
      return reply->Send(error);
    }
    session::CreateRequest cr;
    cr.policy_yaml = Str(body, "policy");
    cr.mode = Str(body, "mode");
    cr.workspace = Str(body, "workspace");
    cr.from_snapshot = Str(body, "from_snapshot");
    if (cr.workspace.empty()) {
      return reply->Send(Response::Error(400, "bad_request", "field 'workspace' (an absolute directory) is required"));
    }
    if (cr.workspace[0] != '/') {
      return reply->Send(Response::Error(400, "bad_request", "workspace '" + cr.workspace + "' is not an absolute path"));
    }
    Blocking(reply, [this, reply, cr = std::move(cr)] {
      auto id = manager.Create(cr);
      if (!id.ok()) return reply->Send(ErrorFor(id.status()));
      reply->Note("session", *id);
      Response r = Response::Json(201, {{"id", *id}});
      r.headers.emplace_back("Location", "/v1/sessions/" + *id);
      reply->Send(std::move(r));
    });
  }

  void List(Request, ReplyPtr reply) {
    Blocking(reply, [this, reply] {
      json sessions = json::array();
      for (const auto& id : manager.List()) {
        auto d = manager.Describe(id);
        if (d.ok()) sessions.push_back(*d);  // removed meanwhile: skipped
      }
      reply->Send(Response::Json(200, {{"sessions", sessions}}));
    });
  }

  void Describe(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    Blocking(reply, [this, reply, id = req.params[0]] {
      auto d = manager.Describe(id);
      reply->Send(d.ok() ? Response::Json(200, *d) : ErrorFor(d.status()));
    });
  }

  void Execute(Request req, ReplyPtr reply) {
    const std::string id = req.params[0];
    reply->Note("session", id);
    json body;
    Response error;
    if (!ParseObject(req, &body, &error) ||
        !CheckFields(body, {"name", "input", "call_id"}, {"name", "call_id"}, &error)) {
      return reply->Send(error);
    }
    if (!body.contains("name")) {
      return reply->Send(Response::Error(400, "bad_request", "field 'name' (the tool) is required"));
    }
    const std::string name = body["name"];
    const auto& tools = session::ToolNames();
    // NAME.TOOL is an upstream's: the session knows its tools.
    if (name.find('.') == std::string::npos && std::find(tools.begin(), tools.end(), name) == tools.end()) {
      std::string list;
      for (const auto& t : tools) list += (list.empty() ? "" : ", ") + t;
      return reply->Send(Response::Error(400, "unknown_tool", "unknown tool '" + name + "'; the tools are: " + list));
    }
    json input = body.contains("input") ? std::move(body["input"]) : json::object();  // a file's content: not copied
    if (!input.is_object()) {
      return reply->Send(Response::Error(400, "bad_request", "field 'input' must be an object, not " +
                                                                 std::string(input.type_name())));
    }
    const std::string call_id = Str(body, "call_id");
    reply->Note("tool", name);
    if (!call_id.empty()) reply->Note("call_id", call_id);

    std::shared_ptr<std::atomic<bool>> cancel;
    if (!call_id.empty()) {
      cancel = calls.Register(id, call_id);
      if (!cancel) {
        return reply->Send(Response::Error(409, "conflict", "call '" + call_id + "' is already running in session " + id +
                                                                 "; send it again when it has finished to get its result"));
      }
    } else {
      cancel = std::make_shared<std::atomic<bool>>(false);
    }
    const bool stream = req.QueryFlag("stream");
    auto work = [this, reply, id, name, input = std::move(input), call_id, cancel, stream]() mutable {
      // Unregistered before the answer goes out: once a client has the
      // result, the call is no longer running.
      auto finished = [&] {
        if (!call_id.empty()) calls.Unregister(id, call_id);
      };
      if (stream) return ExecuteStreaming(reply, id, name, input, call_id, cancel.get(), finished);
      auto result = manager.Execute(id, name, std::move(input), call_id, nullptr, cancel.get());
      finished();
      reply->Send(result.ok() ? Response::Json(200, *result) : ErrorFor(result.status()));
    };
    if (!server.RunBlocking(std::move(work))) {
      if (!call_id.empty()) calls.Unregister(id, call_id);
      reply->Send(Busy());
    }
  }

  // Output as SSE events as it comes; the headers go out with the first
  // chunk, so that a call refused before running still gets its status code.
  void ExecuteStreaming(const ReplyPtr& reply, const std::string& id, const std::string& name, const json& input,
                        const std::string& call_id, const std::atomic<bool>* cancel,
                        const std::function<void()>& finished) {
    bool begun = false;
    std::string tail;
    auto begin = [&] {
      if (begun) return;
      begun = true;
      reply->Begin(200, "text/event-stream");
    };
    session::OutputSink sink = [&](std::string_view chunk) {
      std::string text = TakeCompleteUtf8(tail + std::string(chunk), &tail);
      if (text.empty()) return;
      begin();
      reply->Write(SseEvent("output", text));
    };
    auto result = manager.Execute(id, name, input, call_id, sink, cancel);
    finished();
    if (!result.ok() && !begun) return reply->Send(ErrorFor(result.status()));
    begin();
    if (!tail.empty()) reply->Write(SseEvent("output", tail));
    if (result.ok()) {
      reply->Write(SseEvent("result", *result));
    } else {
      Response e = ErrorFor(result.status());
      reply->Write(SseEvent("error", json::parse(e.body)));
    }
    reply->End();
  }

  void Cancel(Request req, ReplyPtr reply) {
    const std::string& id = req.params[0];
    const std::string& call_id = req.params[1];
    reply->Note("session", id);
    reply->Note("call_id", call_id);
    if (!calls.Cancel(id, call_id)) {
      return reply->Send(Response::Error(404, "not_found", "no running call '" + call_id + "' in session " + id));
    }
    reply->Send(Response::Json(202, {{"cancelling", true}, {"call_id", call_id}}));
  }

  // POST /v1/sessions/{id}/snapshot [{"keep": bool}]
  void Snapshot(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    json body;
    Response error;
    if (!ParseObject(req, &body, &error) || !CheckFields(body, {"keep"}, {}, &error)) return reply->Send(error);
    if (body.contains("keep") && !body["keep"].is_boolean()) {
      return reply->Send(Response::Error(400, "bad_request", "field 'keep' must be a boolean, not " +
                                                                 std::string(body["keep"].type_name())));
    }
    const auto life = body.value("keep", false) ? session::Manager::SnapshotLife::kKeep
                                                : session::Manager::SnapshotLife::kWithSession;
    Blocking(reply, [this, reply, id = req.params[0], life] {
      auto s = manager.Snapshot(id, life);
      reply->Send(s.ok() ? Response::Json(201, {{"snapshot_id", *s}}) : ErrorFor(s.status()));
    });
  }

  // GET /v1/snapshots, GET /v1/sessions/{id}/snapshots
  void ListSnapshots(Request req, ReplyPtr reply) {
    const std::string id = req.params.empty() ? "" : req.params[0];
    if (!id.empty()) reply->Note("session", id);
    Blocking(reply, [this, reply, id] {
      auto list = manager.ListSnapshots(id);
      reply->Send(list.ok() ? Response::Json(200, *list) : ErrorFor(list.status()));
    });
  }

  void DeleteSnapshot(Request req, ReplyPtr reply) {
    Blocking(reply, [this, reply, id = req.params[0]] {
      Status s = manager.DeleteSnapshot(id);
      reply->Send(s.ok() ? Response::NoContent() : ErrorFor(s));
    });
  }

  // POST /v1/sessions/{id}/secrets {"name", "value"}: rotates one of the
  // session's credentials.secrets without restarting its world. The value is
  // never echoed or logged.
  void RotateSecret(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    json body;
    Response error;
    if (!ParseObject(req, &body, &error) || !CheckFields(body, {"name", "value"}, {"name", "value"}, &error)) {
      return reply->Send(error);
    }
    std::string name = Str(body, "name");
    std::string value = Str(body, "value");
    if (body.contains("value") && body["value"].is_string()) net::Wipe(body["value"].get_ref<std::string&>());
    if (name.empty()) return reply->Send(Response::Error(400, "bad_request", "field 'name' (a secret's name) is required"));
    Blocking(reply, [this, reply, id = req.params[0], name, value = std::move(value)]() mutable {
      Status s = manager.RotateSecret(id, name, value);
      net::Wipe(value);
      reply->Send(s.ok() ? Response::Json(200, {{"rotated", name}}) : ErrorFor(s));
    });
  }

  // PATCH /v1/sessions/{id}/policy {"policy": YAML, "by"?}: changes the
  // running session's policy (network.allow / deny, tightening only).
  void PatchPolicy(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    json body;
    Response error;
    if (!ParseObject(req, &body, &error) || !CheckFields(body, {"policy", "by"}, {"policy"}, &error)) {
      return reply->Send(error);
    }
    if (!body["policy"].is_string() || (body.contains("by") && !body["by"].is_string())) {
      return reply->Send(Response::Error(400, "bad_request", "fields 'policy' (YAML text) and 'by' must be strings"));
    }
    Blocking(reply, [this, reply, id = req.params[0], yaml = Str(body, "policy"), by = Str(body, "by")] {
      auto r = manager.PatchPolicy(id, yaml, by);
      reply->Send(r.ok() ? Response::Json(200, *r) : ErrorFor(r.status()));
    });
  }

  // POST /v1/sessions/{id}/escalations {offer_id, reason?, request_id?}:
  // asks for an offer's grant; answers once decided (at most the approver's
  // timeout) with the escalation (session.h RequestEscalation).
  void RequestEscalation(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    json body;
    Response error;
    if (!ParseObject(req, &body, &error) ||
        !CheckFields(body, {"offer_id", "reason", "request_id"}, {"offer_id", "reason", "request_id"}, &error)) {
      return reply->Send(error);
    }
    if (!body.contains("offer_id")) return reply->Send(Response::Error(400, "bad_request", "field 'offer_id' is needed"));
    session::EscalationAsk ask{Str(body, "offer_id"), Str(body, "reason"), Str(body, "request_id"), "api"};
    reply->Note("offer", ask.offer_id);
    Blocking(reply, [this, reply, id = req.params[0], ask] {
      auto r = manager.RequestEscalation(id, ask);
      reply->Send(r.ok() ? Response::Json(200, *r) : ErrorFor(r.status()));
    });
  }

  // POST /v1/sessions/{id}/escalations/{eid}/decision {decision, by?, reason?}
  // (--approve-api): a person's answer to a pending escalation.
  void DecideEscalation(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    json body;
    Response error;
    if (!ParseObject(req, &body, &error) ||
        !CheckFields(body, {"decision", "by", "reason"}, {"decision", "by", "reason"}, &error)) {
      return reply->Send(error);
    }
    if (!body.contains("decision")) {
      return reply->Send(Response::Error(400, "bad_request", "field 'decision' (once, session or deny) is needed"));
    }
    Blocking(reply, [this, reply, id = req.params[0], eid = req.params[1], decision = Str(body, "decision"),
                     by = Str(body, "by"), why = Str(body, "reason")] {
      auto r = manager.DecideEscalation(id, eid, decision, by, why);
      reply->Send(r.ok() ? Response::Json(200, *r) : ErrorFor(r.status()));
    });
  }

  void ListEscalations(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    Blocking(reply, [this, reply, id = req.params[0]] {
      auto r = manager.ListEscalations(id);
      reply->Send(r.ok() ? Response::Json(200, *r) : ErrorFor(r.status()));
    });
  }

  // GET /v1/sessions/{id}/tools: the session's tools, its own and its
  // upstream ones (NAME.TOOL, with their schemas; the servers started as
  // needed, and one that cannot start named in "errors").
  void Tools(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    Blocking(reply, [this, reply, id = req.params[0]] {
      auto r = manager.ListUpstreamTools(id);
      if (!r.ok()) return reply->Send(ErrorFor(r.status()));
      nlohmann::json body = {{"tools", session::ToolNames()}, {"upstream", (*r)["tools"]}, {"errors", (*r)["errors"]}};
      reply->Send(Response::Json(200, body));
    });
  }

  // GET /v1/escalations/stream[?after=N]: every escalation change of every
  // session as it happens, one JSON object per line ({"seq", "escalation"});
  // pending ones are those a UI answers. Ends when the client leaves.
  void EscalationStream(Request req, ReplyPtr reply) {
    std::uint64_t after = 0;
    if (req.query.count("after")) {
      const std::string& text = req.query.at("after");
      char* end = nullptr;
      after = std::strtoull(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0') {
        return reply->Send(Response::Error(400, "bad_request", "after '" + text + "' is not a number"));
      }
    }
    Blocking(reply, [this, reply, after]() mutable {
      reply->Begin(200, "application/x-ndjson");
      // Every line at once, then a heartbeat line every 15 s so that a
      // proxy in between keeps the stream open and a gone client is seen.
      auto heartbeat = std::chrono::steady_clock::now();
      while (!reply->Gone()) {
        const auto asked = std::chrono::steady_clock::now();
        json batch = manager.EscalationChanges(after, 1000);
        for (const json& item : batch["escalations"]) {
          if (!reply->Write(item.dump() + "\n")) return;
        }
        after = batch.value("next", after);
        const auto now = std::chrono::steady_clock::now();
        if (now - heartbeat > std::chrono::seconds(15)) {
          heartbeat = now;
          if (!reply->Write("{}\n")) return;
        }
        // A manager that is stopping answers at once: no busy loop meanwhile.
        if (batch["escalations"].empty() && now - asked < std::chrono::milliseconds(100)) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      }
      reply->End();
    });
  }

  void Diff(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    std::string format = req.query.count("format") ? req.query.at("format") : "json";
    if (format != "json" && format != "patch") {
      return reply->Send(Response::Error(400, "bad_request", "format '" + format + "' is not json or patch"));
    }
    const bool all = req.QueryFlag("all");
    Blocking(reply, [this, reply, id = req.params[0], format, all] {
      auto d = manager.Diff(id, all);
      if (!d.ok()) return reply->Send(ErrorFor(d.status()));
      if (format == "json") return reply->Send(Response::Json(200, *d));
      Response r;
      r.content_type = "text/x-diff";
      r.body = d->value("patch", "");
      reply->Send(std::move(r));
    });
  }

  // POST /v1/sessions/{id}/apply[?all=1] (body empty or {}): the session's
  // changes into its base workspace, all or nothing. 409 when base files
  // changed since the session was created, 403 for protected paths; the
  // error carries the paths.
  void Apply(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    json body;
    Response error;
    if (!ParseObject(req, &body, &error) || !CheckFields(body, {}, {}, &error)) return reply->Send(error);
    const bool all = req.QueryFlag("all");
    Blocking(reply, [this, reply, id = req.params[0], all] {
      auto r = manager.Apply(id, all);
      if (!r.ok()) return reply->Send(ErrorFor(r.status()));
      const json& conflicts = (*r)["conflicts"];
      const json& refused = (*r)["protected"];
      if (conflicts.empty() && refused.empty()) return reply->Send(Response::Json(200, *r));
      auto names = [](const json& list) {
        std::string text;
        for (const auto& p : list) text += (text.empty() ? "" : ", ") + p.get<std::string>();
        return text;
      };
      const bool conflict = !conflicts.empty();
      std::string message =
          conflict ? "the base workspace changed since the session was created: " + names(conflicts)
                   : "protected paths are never written by apply: " + names(refused);
      if (conflict && !refused.empty()) message += "; protected paths are never written by apply: " + names(refused);
      message += " (nothing was applied)";
      json err = {{"code", conflict ? "conflict" : "protected"}, {"message", message}, {"conflicts", conflicts},
                  {"protected", refused}};
      reply->Send(Response::Json(conflict ? 409 : 403, {{"error", err}}));
    });
  }

  void Log(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    Blocking(reply, [this, reply, id = req.params[0]] {
      auto path = manager.LogPath(id);
      if (!path.ok()) return reply->Send(ErrorFor(path.status()));
      linux::UniqueFd fd(open(path->c_str(), O_RDONLY | O_CLOEXEC));
      if (!fd.valid() && errno != ENOENT) {
        return reply->Send(ErrorFor(Status::Errno("log", "open", *path)));
      }
      reply->Begin(200, "application/x-ndjson");
      struct stat st {};
      if (fd.valid() && fstat(fd.get(), &st) == 0) {
        SendLogPrefix(fd.get(), static_cast<std::uint64_t>(st.st_size),
                      [&](std::string chunk) { return reply->Write(std::move(chunk)); });
      }
      reply->End();
    });
  }

  // GET /v1/sessions/{id}/background/log: what the session's calls left
  // running wrote after their call ended, as it is on disk now.
  void BackgroundLog(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    Blocking(reply, [this, reply, id = req.params[0]] {
      auto path = manager.BackgroundLogPath(id);
      if (!path.ok()) return reply->Send(ErrorFor(path.status()));
      StreamFile(reply, *path, [] { return false; });
    });
  }

  // The file at `path` as text/plain from its start; while `more()` says
  // it may grow (a followed service), what is appended, until `more()` is
  // false and the rest is sent, or the client leaves.
  static void StreamFile(const ReplyPtr& reply, const std::string& path, const std::function<bool()>& more) {
    linux::UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid() && errno != ENOENT) return reply->Send(ErrorFor(Status::Errno("log", "open", path)));
    reply->Begin(200, "text/plain; charset=utf-8");
    std::string buf(kLogChunk, '\0');
    for (;;) {
      if (!fd.valid()) fd.reset(open(path.c_str(), O_RDONLY | O_CLOEXEC));
      ssize_t n = fd.valid() ? read(fd.get(), buf.data(), buf.size()) : 0;
      if (n < 0 && errno == EINTR) continue;
      if (n > 0) {
        if (!reply->Write(buf.substr(0, static_cast<std::size_t>(n)))) return;
        continue;
      }
      if (reply->Gone()) return;
      const bool still = more();
      if (!still) {
        // Whatever came between the last read and the end.
        while (fd.valid() && (n = read(fd.get(), buf.data(), buf.size())) > 0) {
          if (!reply->Write(buf.substr(0, static_cast<std::size_t>(n)))) return;
        }
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    reply->End();
  }

  // POST /v1/sessions/{id}/services {name, command, cwd?, env?} → 201 status.
  void StartService(Request req, ReplyPtr reply) {
    const std::string id = req.params[0];
    reply->Note("session", id);
    json body;
    Response error;
    if (!ParseObject(req, &body, &error) ||
        !CheckFields(body, {"name", "command", "cwd", "env"}, {"name", "command", "cwd"}, &error)) {
      return reply->Send(error);
    }
    session::ServiceSpec spec;
    spec.name = Str(body, "name");
    spec.command = Str(body, "command");
    spec.cwd = Str(body, "cwd");
    if (body.contains("env")) {
      if (!body["env"].is_object()) {
        return reply->Send(Response::Error(400, "bad_request", "field 'env' must be an object of strings, not " +
                                                                   std::string(body["env"].type_name())));
      }
      for (auto it = body["env"].begin(); it != body["env"].end(); ++it) {
        if (!it->is_string()) {
          return reply->Send(Response::Error(400, "bad_request", "field 'env." + it.key() + "' must be a string"));
        }
        spec.env.emplace_back(it.key(), it->get<std::string>());
      }
    }
    if (spec.name.empty()) return reply->Send(Response::Error(400, "bad_request", "field 'name' is required"));
    if (Status v = session::ValidateServiceSpec(spec); !v.ok()) return reply->Send(ErrorFor(v));
    reply->Note("service", spec.name);
    Blocking(reply, [this, reply, id, spec = std::move(spec)] {
      auto r = manager.StartService(id, spec);
      if (!r.ok()) return reply->Send(ErrorFor(r.status()));
      Response resp = Response::Json(201, *r);
      resp.headers.emplace_back("Location", "/v1/sessions/" + id + "/services/" + spec.name);
      reply->Send(std::move(resp));
    });
  }

  void ListServices(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    Blocking(reply, [this, reply, id = req.params[0]] {
      auto r = manager.ServiceStatus(id, "");
      reply->Send(r.ok() ? Response::Json(200, *r) : ErrorFor(r.status()));
    });
  }

  void GetService(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    Blocking(reply, [this, reply, id = req.params[0], name = req.params[1]] {
      auto r = manager.ServiceStatus(id, name);
      reply->Send(r.ok() ? Response::Json(200, *r) : ErrorFor(r.status()));
    });
  }

  // GET .../services/{name}/logs[?follow=1]: the service's output so far;
  // following, what comes until it exits or the client leaves.
  void ServiceLogs(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    const bool follow = req.QueryFlag("follow");
    Blocking(reply, [this, reply, id = req.params[0], name = req.params[1], follow] {
      auto path = manager.ServiceLogPath(id, name);
      if (!path.ok()) return reply->Send(ErrorFor(path.status()));
      StreamFile(reply, *path, [&] { return follow && manager.ServiceRunning(id, name); });
    });
  }

  void RestartService(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    Blocking(reply, [this, reply, id = req.params[0], name = req.params[1]] {
      auto r = manager.RestartService(id, name);
      reply->Send(r.ok() ? Response::Json(200, *r) : ErrorFor(r.status()));
    });
  }

  void StopService(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    Blocking(reply, [this, reply, id = req.params[0], name = req.params[1]] {
      auto r = manager.StopService(id, name, false);
      reply->Send(r.ok() ? Response::Json(200, *r) : ErrorFor(r.status()));
    });
  }

  void DeleteService(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    Blocking(reply, [this, reply, id = req.params[0], name = req.params[1]] {
      auto r = manager.StopService(id, name, true);
      reply->Send(r.ok() ? Response::Json(200, *r) : ErrorFor(r.status()));
    });
  }

  // POST /v1/sessions/{id}/ports {port} → 201 {host: "127.0.0.1", port, inside_port, connections}.
  void ExposePort(Request req, ReplyPtr reply) {
    const std::string id = req.params[0];
    reply->Note("session", id);
    json body;
    Response error;
    if (!ParseObject(req, &body, &error) || !CheckFields(body, {"port"}, {}, &error)) return reply->Send(error);
    if (!body.contains("port") || !body["port"].is_number_integer()) {
      return reply->Send(Response::Error(400, "bad_request", "field 'port' (an integer, 1 to 65535) is required"));
    }
    const long long port = body["port"].get<long long>();
    if (port < 1 || port > 65535) {
      return reply->Send(Response::Error(400, "bad_request", "port " + std::to_string(port) + " is not 1 to 65535"));
    }
    Blocking(reply, [this, reply, id, port] {
      bool created = false;
      auto r = manager.ExposePort(id, static_cast<int>(port), &created);
      reply->Send(r.ok() ? Response::Json(created ? 201 : 200, *r) : ErrorFor(r.status()));
    });
  }

  void ListPorts(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    Blocking(reply, [this, reply, id = req.params[0]] {
      auto r = manager.Ports(id);
      reply->Send(r.ok() ? Response::Json(200, *r) : ErrorFor(r.status()));
    });
  }

  void UnexposePort(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    const std::string& text = req.params[1];
    int port = 0;
    if (text.empty() || text.size() > 5 || text.find_first_not_of("0123456789") != std::string::npos ||
        (port = std::stoi(text)) < 1 || port > 65535) {
      return reply->Send(Response::Error(400, "bad_request", "port '" + text + "' is not 1 to 65535"));
    }
    Blocking(reply, [this, reply, id = req.params[0], port] {
      Status s = manager.UnexposePort(id, port);
      reply->Send(s.ok() ? Response::NoContent() : ErrorFor(s));
    });
  }

  void Remove(Request req, ReplyPtr reply) {
    reply->Note("session", req.params[0]);
    Blocking(reply, [this, reply, id = req.params[0]] {
      Status s = manager.Remove(id);
      reply->Send(s.ok() ? Response::NoContent() : ErrorFor(s));
    });
  }
};

}  // namespace

void SendLogPrefix(int fd, std::uint64_t limit, const std::function<bool(std::string)>& write) {
  std::string pending;  // read, not yet sent: the last line, until its '\n' comes
  std::uint64_t left = limit;
  std::string buf(kLogChunk, '\0');
  while (left > 0) {
    ssize_t n = read(fd, buf.data(), static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), left)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    left -= static_cast<std::uint64_t>(n);
    pending.append(buf, 0, static_cast<std::size_t>(n));
    const std::size_t end = pending.rfind('\n');
    if (end == std::string::npos) continue;
    if (!write(pending.substr(0, end + 1))) return;
    pending.erase(0, end + 1);
  }
}

std::string SseEvent(const std::string& event, const json& data) {
  return "event: " + event + "\ndata: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string TakeCompleteUtf8(std::string bytes, std::string* tail) {
  tail->clear();
  // Look back at most 3 bytes for the lead byte of an unfinished sequence.
  std::size_t n = bytes.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(bytes[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking
    std::size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    if (need > back) {
      *tail = bytes.substr(n - back);
      bytes.resize(n - back);
    }
    break;
  }
  return bytes;
}

void RegisterApi(Server& server, session::Manager& manager) {
  std::shared_ptr<Api> api(new Api{server, manager});
  auto bind = [api](void (Api::*method)(Request, ReplyPtr)) {
    return [api, method](Request req, ReplyPtr reply) { ((*api).*method)(std::move(req), std::move(reply)); };
  };
  Router& r = server.router();
  r.Add("GET", "/v1/health", bind(&Api::Health));
  r.Add("POST", "/v1/sessions", bind(&Api::Create));
  r.Add("GET", "/v1/sessions", bind(&Api::List));
  r.Add("GET", "/v1/sessions/{id}", bind(&Api::Describe));
  r.Add("DELETE", "/v1/sessions/{id}", bind(&Api::Remove));
  r.Add("POST", "/v1/sessions/{id}/execute", bind(&Api::Execute));
  r.Add("POST", "/v1/sessions/{id}/calls/{call_id}/cancel", bind(&Api::Cancel));
  r.Add("POST", "/v1/sessions/{id}/snapshot", bind(&Api::Snapshot));
  r.Add("GET", "/v1/sessions/{id}/snapshots", bind(&Api::ListSnapshots));
  r.Add("GET", "/v1/snapshots", bind(&Api::ListSnapshots));
  r.Add("DELETE", "/v1/snapshots/{id}", bind(&Api::DeleteSnapshot));
  r.Add("POST", "/v1/sessions/{id}/secrets", bind(&Api::RotateSecret));
  r.Add("PATCH", "/v1/sessions/{id}/policy", bind(&Api::PatchPolicy));
  r.Add("POST", "/v1/sessions/{id}/escalations", bind(&Api::RequestEscalation));
  r.Add("GET", "/v1/sessions/{id}/escalations", bind(&Api::ListEscalations));
  r.Add("GET", "/v1/sessions/{id}/tools", bind(&Api::Tools));
  r.Add("POST", "/v1/sessions/{id}/escalations/{eid}/decision", bind(&Api::DecideEscalation));
  r.Add("GET", "/v1/escalations/stream", bind(&Api::EscalationStream));
  r.Add("GET", "/v1/sessions/{id}/diff", bind(&Api::Diff));
  r.Add("POST", "/v1/sessions/{id}/apply", bind(&Api::Apply));
  r.Add("GET", "/v1/sessions/{id}/log", bind(&Api::Log));
  RegisterTerminalApi(server, manager);
  r.Add("GET", "/v1/sessions/{id}/background/log", bind(&Api::BackgroundLog));
  r.Add("POST", "/v1/sessions/{id}/services", bind(&Api::StartService));
  r.Add("GET", "/v1/sessions/{id}/services", bind(&Api::ListServices));
  r.Add("GET", "/v1/sessions/{id}/services/{name}", bind(&Api::GetService));
  r.Add("DELETE", "/v1/sessions/{id}/services/{name}", bind(&Api::DeleteService));
  r.Add("GET", "/v1/sessions/{id}/services/{name}/logs", bind(&Api::ServiceLogs));
  r.Add("POST", "/v1/sessions/{id}/services/{name}/restart", bind(&Api::RestartService));
  r.Add("POST", "/v1/sessions/{id}/services/{name}/stop", bind(&Api::StopService));
  r.Add("POST", "/v1/sessions/{id}/ports", bind(&Api::ExposePort));
  r.Add("GET", "/v1/sessions/{id}/ports", bind(&Api::ListPorts));
  r.Add("DELETE", "/v1/sessions/{id}/ports/{port}", bind(&Api::UnexposePort));
}

}  // namespace agentbox::daemon
