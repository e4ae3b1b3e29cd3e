#include "mcp/server.h"

#include <algorithm>
#include <condition_variable>
#include <optional>
#include <thread>

#include "report/json_text.h"

namespace agentbox::mcp {
namespace {

constexpr std::size_t kMaxEarlyCancels = 1024;
// The quickest progress notifications follow each other on output.
constexpr std::chrono::milliseconds kProgressMinGap{200};
// The output one progress notification carries at most.
constexpr std::size_t kProgressChunkBytes = 16 * 1024;

const char* kInstructions =
    "agentbox runs your commands and file edits in a sandbox: one session on one workspace, with a "
    "policy that decides which files are writable, which hosts are reachable and what resources a "
    "command may use. Use the tools as you would a shell and an editor. A result that starts with "
    "`sandbox_denied:` is the policy refusing an action, not a bug in your code: do not retry it or "
    "work around it; when it names an offer_id, request_escalation asks the user for that one permission. "
    "Your changes stay in the session until the user applies them; `diff` shows them.";

// structuredContent, outputSchema and titles came with revision 2025-06-18.
bool Structured(const std::string& revision) { return revision >= "2025-06-18"; }

bool ValidId(const Json& id) { return id.is_string() || id.is_number_integer(); }

Json Ok(const Json& id, Json result) { return {{"jsonrpc", "2.0"}, {"id", id}, {"result", std::move(result)}}; }

std::string IdText(const Json& id) { return id.dump(); }

// Sends notifications/progress for one running call: the output that came
// since the last one as its message (at most every kProgressMinGap, whole
// UTF-8 sequences, at most kProgressChunkBytes each with a note for what is
// left out), and without a message every interval while nothing comes; the
// rest of the output goes out as the call ends. From a thread of its own, so
// that the output sink never waits on the transport. Stops (joined) on
// destruction: no progress after the response.
class ProgressReporter {
 public:
  ProgressReporter(Json token, const Notify& notify, std::chrono::milliseconds interval)
      : token_(std::move(token)), notify_(notify), interval_(interval), start_(Clock::now()) {
    thread_ = std::thread([this] { Run(); });
  }
  ~ProgressReporter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void Output(std::string_view chunk) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const std::size_t room = pending_.size() < kProgressChunkBytes ? kProgressChunkBytes - pending_.size() : 0;
      pending_.append(chunk.substr(0, room));
      dropped_ += chunk.size() - std::min(room, chunk.size());
    }
    cv_.notify_all();
  }

 private:
  using Clock = std::chrono::steady_clock;

  // The pending output as a message: what ends in an unfinished UTF-8
  // sequence waits for the rest (unless the call is over).
  std::string TakeMessage(bool last) {
    std::size_t cut = pending_.size();
    if (!last) {
      for (std::size_t back = 1; back <= 3 && back <= cut; ++back) {
        const unsigned char c = static_cast<unsigned char>(pending_[cut - back]);
        if ((c & 0xC0) == 0x80) continue;
        const std::size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
        if (need > back) cut -= back;
        break;
      }
    }
    std::string message = pending_.substr(0, cut);
    pending_.erase(0, cut);
    if (dropped_ > 0) {
      message += "\n[" + std::to_string(dropped_) + " bytes of output not shown here: they are in the result]\n";
      dropped_ = 0;
    }
    return message;
  }

  void Send(std::unique_lock<std::mutex>& lock, std::optional<std::string> message) {
    Json params = {{"progressToken", token_}, {"progress", ++count_}};
    if (message) params["message"] = std::move(*message);
    Json note = {{"jsonrpc", "2.0"}, {"method", "notifications/progress"}, {"params", std::move(params)}};
    lock.unlock();
    notify_(note);
    lock.lock();
  }

  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    Clock::time_point last = start_;
    auto has_output = [&] { return !pending_.empty() || dropped_ > 0; };
    while (!done_) {
      // Output brings the next notification forward to kProgressMinGap after the last.
      const bool for_output = has_output();
      const Clock::time_point deadline =
          last + (for_output ? std::min<std::chrono::milliseconds>(kProgressMinGap, interval_) : interval_);
      const bool woken = cv_.wait_until(lock, deadline, [&] { return done_ || (!for_output && has_output()); });
      if (done_) break;
      if (woken) continue;  // output came during the long wait: recompute the deadline
      last = Clock::now();
      if (has_output()) {
        std::string message = TakeMessage(false);
        if (!message.empty()) Send(lock, std::move(message));
      } else {
        Send(lock, std::nullopt);  // still running
      }
    }
    if (has_output()) Send(lock, TakeMessage(true));
  }

  const Json token_;
  const Notify notify_;
  const std::chrono::milliseconds interval_;
  const Clock::time_point start_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string pending_;       // output not yet sent
  std::size_t dropped_ = 0;   // output past kProgressChunkBytes since the last notification
  std::uint64_t count_ = 0;
  std::thread thread_;
};

// Only records why a text is not JSON (nlohmann's message names the byte).
struct ErrorSax : nlohmann::json_sax<Json> {
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error = e.what();
    return false;
  }
  std::string error = "unknown";
};

}  // namespace

const std::vector<std::string>& SupportedProtocols() {
  static const std::vector<std::string> versions = {"2024-11-05", "2025-03-26", "2025-06-18"};
  return versions;
}

Server::Server(SessionTools& tools, ServerOptions options)
    : session_(tools), options_(std::move(options)), specs_(Tools(options_.output_cap_bytes)) {}

Server::~Server() = default;

Json Server::Error(const Json& id, int code, const std::string& message) {
  return {{"jsonrpc", "2.0"}, {"id", id}, {"error", {{"code", code}, {"message", message}}}};
}

Json Server::TooLarge(std::size_t bytes) {
  return Error(nullptr, kInvalidRequest,
               "message of " + std::to_string(bytes) + " bytes exceeds the limit of " +
                   std::to_string(kMaxMessageBytes) + " bytes; it was not read");
}

bool Server::MayRunLong(const Json& message) {
  if (message.is_array()) return true;
  return message.is_object() && message.contains("id") && message.value("method", Json()) == "tools/call";
}

bool Server::initialized() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !protocol_.empty();
}

std::string Server::protocol() const {
  std::lock_guard<std::mutex> lock(mu_);
  return protocol_;
}

void Server::Log(const std::string& line) const {
  if (options_.log) options_.log(line);
}

std::optional<Json> Server::Handle(std::string_view text, const Notify& notify) {
  if (text.size() > kMaxMessageBytes) return TooLarge(text.size());
  Json message = report::ParseJsonOrDiscarded(text);
  if (message.is_discarded()) {
    ErrorSax sax;
    (void)Json::sax_parse(text, &sax, Json::input_format_t::json, /*strict=*/true);
    return Error(nullptr, kParseError, "parse error: the message is not valid JSON: " + sax.error);
  }
  return Handle(message, notify);
}

std::optional<Json> Server::Handle(const Json& message, const Notify& notify) {
  if (!message.is_array()) return HandleOne(message, notify);
  // JSON-RPC batches: part of revision 2025-03-26 only (2025-06-18 removed
  // them, 2024-11-05 never had them), and never before initialize.
  const std::string revision = protocol();
  if (revision != "2025-03-26") {
    return Error(nullptr, kInvalidRequest,
                 "JSON-RPC batches are not supported in protocol revision " +
                     (revision.empty() ? std::string("negotiation (send initialize alone)") : revision) +
                     "; send one message per line");
  }
  if (message.empty()) return Error(nullptr, kInvalidRequest, "empty batch");
  Json responses = Json::array();
  for (const auto& one : message) {
    if (auto r = HandleOne(one, notify)) responses.push_back(std::move(*r));
  }
  if (responses.empty()) return std::nullopt;
  return responses;
}

std::optional<Json> Server::HandleOne(const Json& message, const Notify& notify) {
  if (!message.is_object()) {
    return Error(nullptr, kInvalidRequest, "invalid request: a JSON-RPC message is an object, got " +
                                               std::string(message.type_name()));
  }
  const bool has_id = message.contains("id");
  const Json id = has_id ? message["id"] : Json();
  if (has_id && !ValidId(id)) {
    return Error(nullptr, kInvalidRequest, "invalid request: id must be a string or an integer");
  }
  if (message.value("jsonrpc", Json()) != "2.0") {
    return has_id || message.contains("method")
               ? std::optional<Json>(Error(id, kInvalidRequest, "invalid request: \"jsonrpc\" must be \"2.0\""))
               : std::nullopt;
  }
  auto method_it = message.find("method");
  if (method_it == message.end()) {
    // A response from the client: this server sends no requests, so there
    // is nothing waiting for it.
    if (has_id && (message.contains("result") || message.contains("error"))) return std::nullopt;
    return Error(id, kInvalidRequest, "invalid request: no \"method\"");
  }
  if (!method_it->is_string()) return Error(id, kInvalidRequest, "invalid request: \"method\" must be a string");
  const std::string method = method_it->get<std::string>();
  const Json params = message.contains("params") ? message["params"] : Json::object();

  if (!has_id) {
    // Notifications get no answer, not even an error.
    if (!params.is_object()) return std::nullopt;
    if (method == "notifications/cancelled") {
      Cancel(params.value("requestId", Json()));
    } else if (method == "notifications/initialized") {
      Log("client ready");
    }
    return std::nullopt;
  }
  if (!params.is_object()) return Error(id, kInvalidParams, method + ": params must be an object");
  if (method == "ping") return Ok(id, Json::object());
  if (method == "initialize") return Initialize(id, params);
  if (!initialized()) {
    return Error(id, kNotInitialized, "server not initialized: the first request must be initialize, not " + method);
  }
  if (method == "tools/list") {
    Json list = Json::array();
    const bool structured = Structured(protocol());
    for (const auto& spec : specs_) {
      Json tool = ToolJson(spec);
      if (!structured) {
        // Revisions before 2025-06-18 have no output schemas or titles.
        tool.erase("outputSchema");
        tool.erase("title");
      }
      list.push_back(std::move(tool));
    }
    if (auto run_code = RunCodeSpec()) {
      Json tool = ToolJson(*run_code);
      if (!structured) {
        tool.erase("outputSchema");
        tool.erase("title");
      }
      list.push_back(std::move(tool));
    }
    (void)RefreshUpstream("");
    std::vector<ToolSpec> upstream;
    {
      std::lock_guard<std::mutex> lock(mu_);
      upstream = upstream_specs_;
    }
    for (const auto& spec : upstream) {
      Json tool = {{"name", spec.name}, {"description", spec.description}, {"inputSchema", spec.input_schema}};
      if (!spec.title.empty()) tool["title"] = spec.title;
      if (structured && spec.output_schema.is_object()) tool["outputSchema"] = spec.output_schema;
      if (!structured) tool.erase("title");
      list.push_back(std::move(tool));
    }
    return Ok(id, {{"tools", list}});
  }
  if (method == "tools/call") return CallTool(id, params, notify);
  return Error(id, kMethodNotFound, "method not found: " + method);
}

Json Server::Initialize(const Json& id, const Json& params) {
  if (const std::string current = protocol(); !current.empty()) {
    return Error(id, kInvalidRequest, "already initialized (protocol " + current + ")");
  }
  auto version = params.find("protocolVersion");
  if (version == params.end() || !version->is_string()) {
    return Error(id, kInvalidParams, "initialize: params.protocolVersion: required string");
  }
  const auto& supported = SupportedProtocols();
  const std::string asked = version->get<std::string>();
  const bool known = std::find(supported.begin(), supported.end(), asked) != supported.end();
  const std::string chosen = known ? asked : kProtocolLatest;
  std::string client;
  if (auto info = params.find("clientInfo"); info != params.end() && info->is_object()) {
    client = info->value("name", std::string("?")) + " " + info->value("version", std::string("?"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!protocol_.empty()) return Error(id, kInvalidRequest, "already initialized (protocol " + protocol_ + ")");
    protocol_ = chosen;
    client_ = client;
  }
  Log("initialize: client " + (client.empty() ? std::string("(unnamed)") : client) + ", protocol " + asked +
      (known ? "" : " (unsupported; answering " + chosen + ")"));
  return Ok(id, {{"protocolVersion", chosen},
                 {"capabilities", {{"tools", {{"listChanged", false}}}}},
                 {"serverInfo", {{"name", "agentbox"}, {"title", "agentbox sandbox"}, {"version", options_.version}}},
                 {"instructions", kInstructions}});
}

void Server::Cancel(const Json& request_id) {
  if (!ValidId(request_id)) return;
  const std::string key = IdText(request_id);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = in_flight_.find(key); it != in_flight_.end()) {
    it->second->store(true);
    return;
  }
  // Not seen yet (or already done: then this entry is never used, since
  // request ids are not reused within a session).
  early_cancels_.push_back(key);
  if (early_cancels_.size() > kMaxEarlyCancels) early_cancels_.pop_front();
}

void Server::CancelAll() {
  std::lock_guard<std::mutex> lock(mu_);
  closing_ = true;
  for (auto& [_, flag] : in_flight_) flag->store(true);
}

std::optional<Json> Server::CallTool(const Json& id, const Json& params, const Notify& notify) {
  auto name_it = params.find("name");
  if (name_it == params.end() || !name_it->is_string()) {
    return Error(id, kInvalidParams, "tools/call: params.name: required string");
  }
  const std::string name = name_it->get<std::string>();
  const ToolSpec* tool = FindTool(specs_, name);
  std::optional<ToolSpec> upstream;
  std::optional<ToolSpec> run_code = !tool && name == "run_code" ? RunCodeSpec() : std::nullopt;
  if (run_code) tool = &*run_code;
  if (!tool && name.find('.') != std::string::npos) {
    upstream = RefreshUpstream(name);
    if (upstream) tool = &*upstream;
  }
  if (!tool) {
    std::string names;
    for (const auto& s : specs_) names += (names.empty() ? "" : ", ") + s.name;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& s : upstream_specs_) names += ", " + s.name;
      // An upstream that could not list its tools says why its tools are missing.
      if (auto e = upstream_errors_.find(name.substr(0, name.find('.'))); e != upstream_errors_.end()) {
        names += "; " + e->second;
      }
    }
    return Error(id, kInvalidParams, "tools/call: unknown tool \"" + name + "\" (tools: " + names + ")");
  }
  const Json arguments = params.contains("arguments") ? params["arguments"] : Json::object();
  // An upstream tool's input is checked by the session's gateway, against
  // the schema the upstream gave (a refusal comes back as bad_request).
  if (std::string problem = upstream ? "" : Validate(arguments, tool->input_schema); !problem.empty()) {
    return Error(id, kInvalidParams, "tools/call " + name + ": " + problem);
  }
  Json progress_token;
  if (auto meta = params.find("_meta"); meta != params.end() && meta->is_object()) {
    if (auto t = meta->find("progressToken"); t != meta->end() && ValidId(*t)) progress_token = *t;
  }

  const std::string key = IdText(id);
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_flight_.count(key)) return Error(id, kInvalidRequest, "request id " + key + " is already in flight");
    if (auto early = std::find(early_cancels_.begin(), early_cancels_.end(), key); early != early_cancels_.end()) {
      early_cancels_.erase(early);
      Log("tools/call " + key + " " + name + ": cancelled before it started");
      return std::nullopt;
    }
    if (closing_) {
      Log("tools/call " + key + " " + name + ": not started, the server is closing");
      return std::nullopt;
    }
    in_flight_[key] = cancel;
  }
  Log("tools/call " + key + " " + name);
  const auto start = std::chrono::steady_clock::now();
  Result<Json> run = RunTool(*tool, arguments, progress_token, notify, cancel.get());
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.erase(key);
  }
  if (!run.ok()) {
    Log("tools/call " + key + " " + name + ": refused by the session: " + run.status().message());
    return Error(id, kInvalidParams, "tools/call " + name + ": " + run.status().message());
  }
  Json result = std::move(run).value();
  const Json structured = result.value("structuredContent", Json::object());
  const std::string kind = structured.value("kind", std::string("ok"));
  Log("tools/call " + key + " " + name + ": " + (cancel->load() ? "cancelled" : kind) + " (" +
      std::to_string(ms) + " ms)");
  // A cancelled request gets no response (the client has stopped waiting).
  if (cancel->load()) return std::nullopt;
  if (!Structured(protocol())) result.erase("structuredContent");
  return Ok(id, std::move(result));
}

std::optional<ToolSpec> Server::RunCodeSpec() {
  Result<Json> code_mode = session_.CodeMode();
  if (!code_mode.ok()) return std::nullopt;
  return RunCodeTool(*code_mode, options_.output_cap_bytes);
}

std::optional<ToolSpec> Server::RefreshUpstream(const std::string& name) {
  Result<Json> listed = session_.UpstreamTools();
  if (!listed.ok()) return std::nullopt;
  std::vector<ToolSpec> specs;
  for (const Json& t : listed->value("tools", Json::array())) {
    ToolSpec spec;
    spec.name = t.value("name", "");
    spec.title = t.value("title", "");
    spec.description = t.value("description", "");
    spec.input_schema = t.value("inputSchema", Json{{"type", "object"}});
    spec.output_schema = t.value("outputSchema", Json());
    specs.push_back(std::move(spec));
  }
  std::map<std::string, std::string> errors;
  for (const Json& e : listed->value("errors", Json::array())) errors[e.value("upstream", "")] = e.value("error", "");
  std::lock_guard<std::mutex> lock(mu_);
  upstream_specs_ = std::move(specs);
  upstream_errors_ = std::move(errors);
  for (const auto& s : upstream_specs_) {
    if (s.name == name) return s;
  }
  return std::nullopt;
}

Result<Json> Server::RunTool(const ToolSpec& tool, const Json& arguments, const Json& progress_token,
                     const Notify& notify, const std::atomic<bool>* cancel) {
  // No input to refuse here: a bad_request from the session means "not for
  // this session" (e.g. one working on its workspace directly has no diff).
  auto failure = [&](const Status& s) {
    return s.stage() == session::kBadRequest ? RenderFailure(tool.name, "tool_error", s.message())
                                             : RenderFailure(tool.name, "sandbox_error", s.ToString());
  };
  if (tool.name == "diff") {
    Result<Json> diff = session_.Diff();
    return diff.ok() ? RenderDiff(*diff, options_.output_cap_bytes) : failure(diff.status());
  }
  if (tool.name == "snapshot") {
    Result<std::string> snap = session_.Snapshot();
    return snap.ok() ? RenderSnapshot(*snap) : failure(snap.status());
  }
  if (tool.name == "request_escalation") {
    Result<Json> escalation = session_.RequestEscalation(arguments.value("offer_id", ""), arguments.value("reason", ""));
    if (escalation.ok()) return RenderEscalation(*escalation);
    // An offer this session never carried, or one in a state that refuses
    // the request, is the model's to correct; a session gone is not.
    if (escalation.status().stage() == session::kConflict) {
      return RenderFailure(tool.name, "tool_error", escalation.status().message());
    }
    return failure(escalation.status());
  }
  if (tool.name.find('.') != std::string::npos) {
    // An upstream tool: its content as the upstream gave it.
    Result<Json> result = session_.Execute(tool.name, arguments, nullptr, cancel);
    if (!result.ok()) {
      if (result.status().stage() == session::kBadRequest) return result.status();
      return RenderFailure(tool.name, "sandbox_error", result.status().ToString());
    }
    const Json& up = (*result)["upstream"];
    Json content = up.is_object() && up.contains("content") ? up["content"] : Json::array();
    if (!content.is_array() || content.empty()) content = Json::array({{{"type", "text"}, {"text", result->value("output", "")}}});
    Json out = {{"content", content}, {"isError", result->value("is_error", false)}};
    if (up.is_object() && up.contains("structuredContent")) out["structuredContent"] = up["structuredContent"];
    return out;
  }
  std::unique_ptr<ProgressReporter> progress;
  session::OutputSink sink;
  if (!progress_token.is_null() && notify && tool.name == "bash") {
    progress = std::make_unique<ProgressReporter>(progress_token, notify, options_.progress_interval);
    sink = [p = progress.get()](std::string_view chunk) { p->Output(chunk); };
  }
  Result<Json> result = session_.Execute(tool.name, arguments, sink, cancel);
  progress.reset();  // the last progress notification goes out before the response
  if (!result.ok()) {
    // The session refused the input: the same as a schema violation.
    if (result.status().stage() == session::kBadRequest) return result.status();
    return RenderFailure(tool.name, "sandbox_error", result.status().ToString());
  }
  return RenderResult(tool.name, *result, options_.output_cap_bytes);
}

}  // namespace agentbox::mcp
