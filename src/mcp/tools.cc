#include "mcp/tools.h"

#include <algorithm>
#include <cstdint>
#include <regex>

namespace agentbox::mcp {
namespace {

std::string SizeText(std::size_t bytes) {
  if (bytes >= 1024 * 1024 && bytes % (1024 * 1024) == 0) return std::to_string(bytes / (1024 * 1024)) + " MiB";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes / 1024) + " KiB";
  return std::to_string(bytes) + " bytes";
}

// "30s", "1.5s", "2m", "90s".
std::string DurationText(std::uint64_t ms) {
  if (ms % 60000 == 0 && ms >= 60000) return std::to_string(ms / 60000) + "m";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1fs", static_cast<double>(ms) / 1000.0);
  return buf;
}

// "512 MiB", "1.5 GiB".
std::string MemoryText(std::uint64_t bytes) {
  constexpr std::uint64_t kMiB = 1024 * 1024, kGiB = 1024 * kMiB;
  char buf[32];
  if (bytes >= kGiB && bytes % kGiB == 0) return std::to_string(bytes / kGiB) + " GiB";
  if (bytes >= kGiB) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / kGiB);
    return buf;
  }
  if (bytes >= kMiB && bytes % kMiB == 0) return std::to_string(bytes / kMiB) + " MiB";
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / kMiB);
  return buf;
}

std::string TypeName(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "integer";
    case Json::value_t::number_float: return "number";
    case Json::value_t::string: return "string";
    case Json::value_t::array: return "array";
    case Json::value_t::object: return "object";
    default: return "value";
  }
}

bool HasType(const Json& v, const std::string& type) {
  if (type == "string") return v.is_string();
  if (type == "integer") {
    if (v.is_number_integer()) return true;
    // 3.0 is an integer to JSON Schema.
    return v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<std::int64_t>(v.get<double>()));
  }
  if (type == "number") return v.is_number();
  if (type == "boolean") return v.is_boolean();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "null") return v.is_null();
  return false;
}

// A plain string of the JSON value of `key` in `obj`, or "".
std::string Str(const Json& obj, const char* key) {
  if (!obj.is_object()) return "";
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

const Json* Path(const Json& root, std::initializer_list<const char*> keys) {
  const Json* cur = &root;
  for (const char* k : keys) {
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(k);
    if (it == cur->end()) return nullptr;
    cur = &*it;
  }
  return cur;
}

std::string DenialText(const Json& d) {
  const std::string facet = Str(d, "facet"), op = Str(d, "op"), target = Str(d, "target"),
                    reason = Str(d, "reason");
  if (facet == "network") {
    std::string out = "network egress to " + (target.empty() ? std::string("(unknown host)") : target);
    if (!reason.empty()) out += " " + reason;
    return out;
  }
  std::string out = op.empty() ? facet : op;
  if (!target.empty()) out += " " + target;
  if (!reason.empty()) out += ": " + reason;
  return out;
}

// The schema of a session result (session.h), as structuredContent.
Json ResultSchema() {
  return {
      {"type", "object"},
      {"properties",
       {{"name", {{"type", "string"}}},
        {"output", {{"type", "string"}, {"description", "the tool's output (what the text content shows)"}}},
        {"is_error", {{"type", "boolean"}}},
        {"kind",
         {{"type", "string"},
          {"description",
           "exited | signaled | timed_out | oom_killed | sandbox_denied | sandbox_error | ok | tool_error | "
           "interrupted | cancelled"}}},
        {"exit_code", {{"type", "integer"}}},
        {"truncated", {{"type", "boolean"}}},
        {"outcome", {{"type", "object"}, {"description", "the full outcome report (bash) or {kind, denials?, error?}"}}},
        {"replayed", {{"type", "boolean"}}},
        {"duration_ms", {{"type", "integer"}}}}},
      {"required", {"output", "is_error", "kind"}},
  };
}

std::string DenialNote() {
  return " A refusal by the sandbox comes back with isError and starts with `sandbox_denied:` naming what was "
         "refused (e.g. `sandbox_denied: write /workspace/.git/config: Read-only file system (protected or read-only path)`): that is the "
         "sandbox's policy, not a bug in your code or the tool, so do not retry it or try to get around it; choose "
         "another way or ask the user. When the result adds `call request_escalation with offer_id esc-...`, you may "
         "instead ask for that one permission with request_escalation; a person decides.";
}

// {"network.allow": "host:443"} as "network.allow host:443".
std::string GrantText(const Json& grant) {
  if (!grant.is_object() || grant.size() != 1) return grant.dump(-1, ' ', false, Json::error_handler_t::replace);
  const auto& value = grant.begin().value();
  return grant.begin().key() + " " +
         (value.is_string() ? value.get<std::string>() : value.dump(-1, ' ', false, Json::error_handler_t::replace));
}

// One line per distinct escalation offer the result's denials carry: how
// to ask for it, or why it cannot be asked for.
std::string EscalationLines(const Json& result) {
  const Json* denials = Path(result, {"outcome", "denials"});
  if (!denials || !denials->is_array()) return "";
  std::string lines;
  std::vector<std::string> seen;
  for (const auto& d : *denials) {
    const Json* e = Path(d, {"escalation"});
    if (!e || !e->is_object()) continue;
    const std::string id = Str(*e, "id");
    if (id.empty() || std::find(seen.begin(), seen.end(), id) != seen.end()) continue;
    seen.push_back(id);
    const std::string grant = GrantText(e->value("grant", Json::object()));
    if (e->value("within_ceiling", false)) {
      lines += "to retry with this permission (" + grant + "), call request_escalation with offer_id " + id + "\n";
    } else {
      const std::string why = Str(*e, "why_not");
      lines += "no escalation: " + (why.empty() ? grant + " is beyond what the policy may grant" : why) + "\n";
    }
  }
  return lines;
}

// The escalation object (session.h RequestEscalation), as structuredContent.
Json EscalationSchema() {
  const Json text = {{"type", "string"}};
  // No union types (a strict schema compiler refuses them): the fields that
  // may be null carry a description only.
  return {
      {"type", "object"},
      {"properties",
       {{"id", text},
        {"session", text},
        {"offer_id", text},
        {"grant", {{"type", "object"}, {"description", "the permission asked for, e.g. {\"network.allow\": \"host:443\"}"}}},
        {"reason", text},
        {"by", text},
        {"request_id", {{"description", "as given, or null"}}},
        {"state", {{"type", "string"}, {"description", "pending | granted | denied"}}},
        {"decision", {{"description", "once | session | deny (null while pending)"}}},
        {"decided_by", {{"description", "who decided: approve-command PROG, the API, or null"}}},
        {"decision_reason", {{"description", "why a deny, in words"}}},
        {"asked", {{"type", "boolean"}, {"description", "false: refused without asking anyone (beyond the ceiling)"}}},
        {"applied", {{"description", "live | new_world | next_world, or null when nothing was applied"}}},
        {"replayed", {{"type", "boolean"}}}}},
      {"required", {"offer_id", "state"}},
  };
}

std::vector<ToolSpec> MakeTools(std::size_t cap) {
  const std::string cap_text = SizeText(cap);
  std::vector<ToolSpec> tools;

  tools.push_back(ToolSpec{
      "bash", "Run a shell command in the sandbox",
      "Runs `command` with bash inside the agentbox sandbox, starting in the workspace; files you change stay "
      "for later calls in this session (the real workspace is untouched until the user applies the session's "
      "diff). Output is stdout and stderr combined, capped at " +
          cap_text +
          " (a note says when it was cut: narrow the command, e.g. with head, tail or grep). `timeout` is in "
          "seconds (default: the policy's wall-clock limit); a command that overruns is killed and the result "
          "starts with `timed_out after 30.0s`; one that exceeds the memory limit starts with `oom_killed at 512 "
          "MiB`; a non-zero exit starts with `exited with code N`. Network access goes only through the "
          "sandbox's egress proxy, to hosts the policy allows; any other host gives `sandbox_denied: network "
          "egress to HOST:PORT refused: ...`." +
          DenialNote() + " `sandbox_error:` means the sandbox itself failed.",
      {{"type", "object"},
       {"properties",
        {{"command", {{"type", "string"}, {"minLength", 1}, {"description", "the command line, run with bash -c"}}},
         {"timeout",
          {{"anyOf",
            {{{"type", "number"}, {"exclusiveMinimum", 0}, {"maximum", 604800}},
             {{"type", "string"}, {"pattern", "^[0-9]+(\\.[0-9]+)?(ms|s|m|h)$"}}}},
           {"description", "seconds (or a duration such as \"90s\", \"5m\") before the command is killed; "
                           "default: the session's call timeout (10 minutes unless the policy says otherwise)"}}},
         {"stdin", {{"type", "string"}, {"description", "text given to the command on standard input"}}},
         {"cwd",
          {{"type", "string"},
           {"minLength", 1},
           {"description", "directory to start in, relative to the workspace (default: the workspace); it must "
                           "stay inside the workspace"}}},
         {"env",
          {{"type", "object"},
           {"propertyNames", {{"pattern", "^[A-Za-z_][A-Za-z0-9_]*$"}}},
           {"additionalProperties", {{"type", "string"}}},
           {"description", "variables added to the command's environment (the sandbox's proxy and CA "
                           "variables cannot be overridden)"}}}}},
       {"required", {"command"}},
       {"additionalProperties", false}},
      ResultSchema()});

  tools.push_back(ToolSpec{
      "read_file", "Read a text file",
      "Returns the text of the file at `path` (relative to the workspace, or absolute as the shell inside the "
      "sandbox sees it): the same file that `bash` would read. `offset` is the first line to return (1-based) "
      "and `limit` the number of lines; use them to page through a long file. The text is capped at " +
          cap_text +
          " with a note when cut. A missing file, a directory or a binary file gives a `tool_error:` result; a "
          "path the policy hides or forbids gives `sandbox_denied:`." +
          DenialNote(),
      {{"type", "object"},
       {"properties",
        {{"path", {{"type", "string"}, {"minLength", 1}, {"description", "file path"}}},
         {"offset", {{"type", "integer"}, {"minimum", 1}, {"description", "first line to return, 1-based"}}},
         {"limit", {{"type", "integer"}, {"minimum", 1}, {"description", "number of lines to return"}}}}},
       {"required", {"path"}},
       {"additionalProperties", false}},
      ResultSchema(), true});

  tools.push_back(ToolSpec{
      "write_file", "Write a file",
      "Creates or replaces the file at `path` (relative to the workspace, or absolute as the shell inside the "
      "sandbox sees it) with `content`; an existing file is replaced atomically and keeps its mode. The parent "
      "directory must exist (else a `tool_error:`; create it with bash `mkdir -p`). The write lands in this "
      "session's view of the workspace, exactly where `bash` sees it. Writing outside the writable places, or to "
      "a protected path such as `.git/config` or `.git/hooks`, gives `sandbox_denied:`." +
          DenialNote(),
      {{"type", "object"},
       {"properties",
        {{"path", {{"type", "string"}, {"minLength", 1}, {"description", "file path"}}},
         {"content", {{"type", "string"}, {"description", "the whole new content of the file"}}}}},
       {"required", {"path", "content"}},
       {"additionalProperties", false}},
      ResultSchema()});

  tools.push_back(ToolSpec{
      "edit_file", "Replace text in a file",
      "Replaces the text `old` with `new` in the file at `path`. `old` must occur exactly once in the file: "
      "include enough surrounding lines to make it unique. When it is missing or occurs more than once the "
      "file is left unchanged and the result is a `tool_error:` saying which (`old text not found in PATH`, "
      "`old text occurs 3 times in PATH`); read the file again and retry with a corrected `old`. Protected or "
      "denied paths give `sandbox_denied:`." +
          DenialNote(),
      {{"type", "object"},
       {"properties",
        {{"path", {{"type", "string"}, {"minLength", 1}, {"description", "file path"}}},
         {"old", {{"type", "string"}, {"minLength", 1}, {"description", "the exact text to replace (unique)"}}},
         {"new", {{"type", "string"}, {"description", "the replacement text"}}}}},
       {"required", {"path", "old", "new"}},
       {"additionalProperties", false}},
      ResultSchema()});

  tools.push_back(ToolSpec{
      "list_dir", "List a directory",
      "Lists the entries of the directory at `path` (relative to the workspace; default: the workspace "
      "itself), sorted, one per line, directories marked with a trailing `/`. The listing is capped at " +
          cap_text + " with a note when cut. Paths the policy hides give `sandbox_denied:`." + DenialNote(),
      {{"type", "object"},
       {"properties",
        {{"path", {{"type", "string"}, {"minLength", 1}, {"description", "directory path (default: the workspace)"}}}}},
       {"additionalProperties", false}},
      ResultSchema(), true});

  tools.push_back(ToolSpec{
      "glob", "Find files by pattern",
      "Returns the files matching `pattern`, sorted, one per line: `*`, `?` and `[...]` match within one path "
      "component, `**` any number of directories (e.g. `src/**/*.cc`); wildcards do not match a leading `.` "
      "(name dot directories to search them). A relative pattern starts at the workspace and gives "
      "workspace-relative paths. Files the policy hides are not listed. The list is capped at " +
          cap_text + " with a note when cut: use a narrower pattern.",
      {{"type", "object"},
       {"properties",
        {{"pattern", {{"type", "string"}, {"minLength", 1}, {"description", "glob pattern, e.g. **/*.py"}}}}},
       {"required", {"pattern"}},
       {"additionalProperties", false}},
      ResultSchema(), true});

  tools.push_back(ToolSpec{
      "diff", "Show this session's changes",
      "Returns every change this session made to the workspace, against the base the session started from: "
      "the changed files (added, modified, deleted) and a git-style unified diff, capped at " +
          cap_text +
          ". The real workspace is untouched until the user applies this diff; use it to review your work "
          "before you finish.",
      {{"type", "object"}, {"properties", Json::object()}, {"additionalProperties", false}},
      {{"type", "object"},
       {"properties",
        {{"files",
          {{"type", "array"},
           {"items",
            {{"type", "object"},
             {"properties",
              {{"path", {{"type", "string"}}},
               {"status", {{"type", "string"}, {"description", "added | modified | deleted"}}},
               {"binary", {{"type", "boolean"}}}}},
             {"required", {"path", "status"}}}}}},
         {"patch", {{"type", "string"}}},
         {"truncated", {{"type", "boolean"}}}}},
       {"required", {"files", "patch"}}},
      true});

  tools.push_back(ToolSpec{
      "snapshot", "Snapshot the workspace",
      "Freezes the session's current changes as a snapshot and returns its id. A later session can start from "
      "it (restore, or several sessions forking from one point). Cheap: proportional to the changed bytes. Use "
      "it before a risky step you may want to come back to.",
      {{"type", "object"}, {"properties", Json::object()}, {"additionalProperties", false}},
      {{"type", "object"}, {"properties", {{"snapshot_id", {{"type", "string"}}}}}, {"required", {"snapshot_id"}}}});

  tools.push_back(ToolSpec{
      "request_escalation", "Ask for a permission the sandbox refused",
      "Asks the person supervising this session for one permission the sandbox refused. Use it only when a "
      "result says `to retry with this permission (...), call request_escalation with offer_id esc-...`: pass "
      "that `offer_id` and a short `reason` saying why the task needs it (the person deciding reads it). The "
      "call waits for the decision. `granted once: ...` means the permission holds for your next call only: "
      "retry the refused action right away. `granted for the session: ...` means it holds for every later call. "
      "`denied: <reason>` means it stays refused: do not ask again for the same offer; choose another way or ask "
      "the user. A result that says `no escalation: ...` names a permission that cannot be granted at all; do not "
      "ask for it.",
      {{"type", "object"},
       {"properties",
        {{"offer_id",
          {{"type", "string"},
           {"pattern", "^esc-[0-9a-f]{12}$"},
           {"description", "the offer id a refused result named (esc- and 12 hex digits)"}}},
         {"reason",
          {{"type", "string"},
           {"minLength", 1},
           {"description", "why the task needs this permission, in a sentence, for the person deciding"}}}}},
       {"required", {"offer_id", "reason"}},
       {"additionalProperties", false}},
      EscalationSchema()});
  return tools;
}

}  // namespace

std::vector<ToolSpec> Tools(std::size_t output_cap_bytes) { return MakeTools(output_cap_bytes); }

std::string BindingSignature(const Json& binding) {
  const Json schema = binding.value("inputSchema", Json::object());
  const Json props = schema.value("properties", Json::object());
  std::vector<std::string> required;
  for (const auto& r : schema.value("required", Json::array())) {
    if (r.is_string() && props.contains(r.get<std::string>())) required.push_back(r.get<std::string>());
  }
  std::string args;
  for (const auto& r : required) args += (args.empty() ? "" : ", ") + r;
  for (const auto& [key, value] : props.items()) {
    if (std::find(required.begin(), required.end(), key) == required.end()) args += (args.empty() ? "" : ", ") + key + "?";
  }
  return binding.value("name", "") + "(" + args + ")";
}

std::optional<ToolSpec> RunCodeTool(const Json& code_mode, std::size_t output_cap_bytes) {
  const Json languages = code_mode.value("languages", Json::array());
  if (!languages.is_array() || languages.empty()) return std::nullopt;
  std::vector<std::string> names;
  for (const auto& l : languages) names.push_back(l.value("language", ""));
  std::string listed;
  for (const auto& b : code_mode.value("bindings", Json::array())) {
    std::string first = b.value("description", "");
    if (auto dot = first.find(". "); dot != std::string::npos) first.resize(dot + 1);
    if (first.size() > 160) first = first.substr(0, 157) + "...";
    listed += "\n- tools." + BindingSignature(b) + (first.empty() ? "" : ": " + first);
  }
  std::string language_list;
  for (const auto& n : names) language_list += (language_list.empty() ? "" : " or ") + n;
  ToolSpec spec{
      "run_code", "Run a short program that calls the tools as functions",
      "Runs one short " + language_list +
          " program in a fresh process of this session's sandbox (cwd: the workspace, the same files bash sees; "
          "nothing stays from earlier programs). The program has NO network of its own: it reaches files and "
          "services only through `tools`, one async function per tool, each call checked and logged as a direct "
          "call would be. Use it to call several tools in one turn and return only what matters (filter, join, "
          "count). Python: `tools` is a module, `await tools.read_file(path=\"a.txt\")` (keyword or positional "
          "arguments, required first); JavaScript: `await tools.read_file({path: \"a.txt\"})`. A binding returns "
          "the tool's output (an upstream's structured content when it has one) and raises tools.ToolError (with "
          ".kind and .output) when the call fails; `tools.call(name, input)` returns the whole result instead. The "
          "output is what the program prints, then its result: the value of the last expression (Python; "
          "JavaScript without top-level await), or `return` (JavaScript with top-level await), or what it passes "
          "to result(...). Capped at " + SizeText(output_cap_bytes) +
          ". An exception gives the traceback with the program's own line numbers; time and memory limits are "
          "reported as for bash (`timed_out`, `oom_killed`). The bindings:" + listed,
      {{"type", "object"},
       {"properties",
        {{"language", {{"type", "string"}, {"enum", names}, {"description", "the program's language"}}},
         {"code", {{"type", "string"}, {"minLength", 1}, {"description", "the program's source"}}},
         {"timeout",
          {{"anyOf",
            {{{"type", "number"}, {"exclusiveMinimum", 0}, {"maximum", 604800}},
             {{"type", "string"}, {"pattern", "^[0-9]+(\\.[0-9]+)?(ms|s|m|h)$"}}}},
           {"description", "seconds (or \"90s\", \"5m\") before the program is killed; default: the session's "
                           "call timeout"}}}}},
       {"required", {"language", "code"}},
       {"additionalProperties", false}},
      ResultSchema()};
  return spec;
}

const ToolSpec* FindTool(const std::vector<ToolSpec>& tools, const std::string& name) {
  for (const auto& t : tools) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Json ToolJson(const ToolSpec& spec) {
  return {{"name", spec.name},
          {"title", spec.title},
          {"description", spec.description},
          {"inputSchema", spec.input_schema},
          {"outputSchema", spec.output_schema},
          {"annotations",
           {{"title", spec.title},
            {"readOnlyHint", spec.read_only},
            {"destructiveHint", !spec.read_only},
            {"openWorldHint", spec.name == "bash"}}}};
}

std::string Validate(const Json& value, const Json& schema, const std::string& where) {
  if (auto any = schema.find("anyOf"); any != schema.end()) {
    std::string problems;
    for (const auto& branch : *any) {
      const std::string e = Validate(value, branch, where);
      if (e.empty()) {
        problems.clear();
        break;
      }
      problems += (problems.empty() ? "" : "; or ") + e.substr(std::min(e.size(), where.size() + 2));
    }
    if (!problems.empty()) return where + ": " + problems;
  }
  if (auto t = schema.find("type"); t != schema.end()) {
    bool ok = false;
    std::string expected;
    if (t->is_string()) {
      ok = HasType(value, t->get<std::string>());
      expected = t->get<std::string>();
    } else {
      for (const auto& one : *t) {
        ok = ok || HasType(value, one.get<std::string>());
        expected += (expected.empty() ? "" : " or ") + one.get<std::string>();
      }
    }
    if (!ok) return where + ": expected " + expected + ", got " + TypeName(value);
  }
  if (auto e = schema.find("enum"); e != schema.end() && e->is_array()) {
    if (std::find(e->begin(), e->end(), value) == e->end()) return where + ": must be one of " + e->dump();
  }
  if (auto m = schema.find("minimum"); m != schema.end() && value.is_number()) {
    if (value.get<double>() < m->get<double>()) return where + ": must be at least " + m->dump();
  }
  if (auto m = schema.find("exclusiveMinimum"); m != schema.end() && value.is_number()) {
    if (!(value.get<double>() > m->get<double>())) return where + ": must be more than " + m->dump();
  }
  if (auto m = schema.find("maximum"); m != schema.end() && value.is_number()) {
    if (value.get<double>() > m->get<double>()) return where + ": must be at most " + m->dump();
  }
  if (auto p = schema.find("pattern"); p != schema.end() && value.is_string()) {
    if (!std::regex_search(value.get_ref<const std::string&>(), std::regex(p->get<std::string>()))) {
      return where + ": does not match " + p->get<std::string>();
    }
  }
  if (auto m = schema.find("minLength"); m != schema.end() && value.is_string()) {
    if (value.get_ref<const std::string&>().size() < m->get<std::size_t>()) {
      return where + (m->get<int>() == 1 ? ": must not be empty" : ": too short");
    }
  }
  if (value.is_array()) {
    if (auto items = schema.find("items"); items != schema.end()) {
      for (std::size_t i = 0; i < value.size(); ++i) {
        if (auto e = Validate(value[i], *items, where + "[" + std::to_string(i) + "]"); !e.empty()) return e;
      }
    }
  }
  if (value.is_object()) {
    const Json empty = Json::object();
    auto props_it = schema.find("properties");
    const Json& props = props_it == schema.end() ? empty : *props_it;
    if (auto req = schema.find("required"); req != schema.end()) {
      for (const auto& name : *req) {
        if (!value.contains(name.get<std::string>())) {
          return where + "." + name.get<std::string>() + ": required";
        }
      }
    }
    auto extra = schema.find("additionalProperties");
    const bool closed = extra != schema.end() && extra->is_boolean() && !extra->get<bool>();
    const bool typed = extra != schema.end() && extra->is_object();
    auto names = schema.find("propertyNames");
    for (const auto& [key, v] : value.items()) {
      if (names != schema.end()) {
        if (auto e = Validate(Json(key), *names, where + " name \"" + key + "\""); !e.empty()) return e;
      }
      auto p = props.find(key);
      if (p == props.end() && typed) {
        if (auto e = Validate(v, *extra, where + "." + key); !e.empty()) return e;
        continue;
      }
      if (p == props.end()) {
        if (closed) return where + "." + key + ": unknown field (allowed: " + [&] {
                             std::string names;
                             for (const auto& [n, _] : props.items()) names += (names.empty() ? "" : ", ") + n;
                             return names.empty() ? std::string("none") : names;
                           }() + ")";
        continue;
      }
      if (auto e = Validate(v, *p, where + "." + key); !e.empty()) return e;
    }
  }
  return "";
}

std::optional<std::string> Cap(const std::string& text, std::size_t cap, const std::string& note) {
  if (text.size() <= cap) return std::nullopt;
  std::size_t cut = cap;
  // Back up to a UTF-8 sequence start (never more than 3 continuation bytes).
  for (int i = 0; i < 3 && cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80; ++i) --cut;
  std::string out = text.substr(0, cut);
  if (!out.empty() && out.back() != '\n') out += '\n';
  out += note;
  return out;
}

std::string Headline(const Json& result) {
  const std::string kind = Str(result, "kind");
  const Json empty = Json::object();
  const Json& outcome = result.contains("outcome") && result["outcome"].is_object() ? result["outcome"] : empty;
  if (kind == "timed_out") {
    const Json* ms = Path(outcome, {"usage", "limits", "wall_clock_ms"});
    return ms && ms->is_number_unsigned() ? "timed_out after " + DurationText(ms->get<std::uint64_t>()) : "timed_out";
  }
  if (kind == "oom_killed") {
    const Json* bytes = Path(outcome, {"usage", "limits", "memory_max_bytes"});
    return bytes && bytes->is_number_unsigned() ? "oom_killed at " + MemoryText(bytes->get<std::uint64_t>())
                                                : "oom_killed";
  }
  if (kind == "sandbox_denied") {
    const Json* denials = Path(outcome, {"denials"});
    if (!denials || !denials->is_array() || denials->empty()) return "sandbox_denied";
    std::string out = "sandbox_denied: " + DenialText((*denials)[0]);
    if (denials->size() > 1) out += " (and " + std::to_string(denials->size() - 1) + " more)";
    return out;
  }
  if (kind == "sandbox_error") {
    const Json* error = Path(outcome, {"error"});
    if (error && error->is_object()) {
      const std::string stage = Str(*error, "stage"), message = Str(*error, "message");
      if (!message.empty()) return "sandbox_error: " + (stage.empty() ? "" : stage + ": ") + message;
    }
    if (error && error->is_string()) return "sandbox_error: " + error->get<std::string>();
    return "sandbox_error";
  }
  if (kind == "exited") {
    const Json* code = Path(result, {"exit_code"});
    if (!result.value("is_error", false)) return "";
    return code && code->is_number_integer() ? "exited with code " + std::to_string(code->get<int>()) : "exited";
  }
  if (kind == "signaled") {
    const Json* sig = Path(outcome, {"signal"});
    return sig && sig->is_number_integer() ? "signaled: signal " + std::to_string(sig->get<int>()) : "signaled";
  }
  if (kind == "interrupted") return "interrupted: the sandbox stopped during this call; it did not complete";
  if (kind == "cancelled") return "cancelled";
  if (kind == "tool_error") return "tool_error";
  return result.value("is_error", false) ? kind : "";
}

Json RenderResult(const std::string& tool, const Json& result, std::size_t cap) {
  Json structured = result.is_object() ? result : Json::object();
  structured["name"] = tool;
  std::string output = Str(result, "output");
  const bool is_error = result.value("is_error", false);
  if (!structured.contains("kind") || !structured["kind"].is_string()) structured["kind"] = is_error ? "tool_error" : "ok";
  // Put the kind first, unless the session already did ("sandbox_denied: ...").
  std::string text = output;
  if (is_error) {
    const std::string kind = structured["kind"].get<std::string>();
    if (output.rfind(kind, 0) != 0) {
      std::string head = Headline(structured);
      if (head == "tool_error" && !output.empty()) head += ":";
      text = head + (output.empty() ? "" : (head.back() == ':' ? " " : "\n") + output);
    }
  }
  std::string hint = tool == "read_file" ? "; use offset and limit to read the rest"
                     : tool == "bash"    ? "; narrow the command's output (head, tail, grep)"
                                         : "; narrow the request";
  if (auto cut = Cap(text, cap, "[output truncated: " + std::to_string(cap) + " of " + std::to_string(text.size()) +
                                    " bytes shown" + hint + "]")) {
    text = *cut;
    structured["truncated"] = true;
    structured["output_bytes"] = output.size();
  }
  if (text.empty()) text = is_error ? "(failed, no output)" : "(no output)";
  // After the cap, so that no cut ever hides how to ask for a permission.
  if (const std::string lines = EscalationLines(structured); !lines.empty()) {
    text += (text.back() == '\n' ? "" : "\n") + lines.substr(0, lines.size() - 1);
  }
  structured["output"] = text;
  if (!structured.contains("is_error")) structured["is_error"] = is_error;
  return {{"content", Json::array({{{"type", "text"}, {"text", text}}})},
          {"structuredContent", structured},
          {"isError", is_error}};
}

Json RenderFailure(const std::string& tool, const std::string& kind, const std::string& message) {
  const std::string text = kind + ": " + message;
  Json out = {{"content", Json::array({{{"type", "text"}, {"text", text}}})}, {"isError", true}};
  if (tool != "diff" && tool != "snapshot" && tool != "request_escalation") {
    out["structuredContent"] = {{"name", tool}, {"output", text}, {"is_error", true}, {"kind", kind},
                                {"outcome", {{"kind", kind}, {"error", message}}}};
  }
  return out;
}

Json RenderDiff(const Json& diff, std::size_t cap) {
  Json structured = diff.is_object() ? diff : Json::object();
  if (!structured.contains("files") || !structured["files"].is_array()) structured["files"] = Json::array();
  std::string patch = Str(structured, "patch");
  std::string text;
  if (structured["files"].empty()) {
    text = "no changes: the workspace is as the session found it";
  } else {
    for (const auto& f : structured["files"]) {
      text += Str(f, "status") + " " + Str(f, "path") + (f.value("binary", false) ? " (binary)" : "") + "\n";
    }
    text += "\n" + patch;
  }
  if (auto cut = Cap(text, cap, "[diff truncated: " + std::to_string(cap) + " of " + std::to_string(text.size()) +
                                    " bytes shown; read single files with read_file or bash git diff]")) {
    text = *cut;
    if (auto p = Cap(patch, cap, "[patch truncated]")) structured["patch"] = *p;
    structured["truncated"] = true;
  } else {
    structured["patch"] = patch;
  }
  return {{"content", Json::array({{{"type", "text"}, {"text", text}}})},
          {"structuredContent", structured},
          {"isError", false}};
}

Json RenderEscalation(const Json& escalation) {
  const Json structured = escalation.is_object() ? escalation : Json::object();
  const std::string state = Str(structured, "state"), decision = Str(structured, "decision");
  const std::string grant = GrantText(structured.value("grant", Json::object()));
  std::string text;
  if (state == "granted" && decision == "session") {
    text = "granted for the session: " + grant + " — every later call may use it";
  } else if (state == "granted") {
    text = "granted once: " + grant + " — the next call may use it";
  } else if (state == "denied") {
    const std::string why = Str(structured, "decision_reason");
    text = "denied: " + (why.empty() ? std::string("no reason given") : why);
  } else {
    text = "not decided (" + (state.empty() ? std::string("no state") : state) + "): " + grant;
  }
  return {{"content", Json::array({{{"type", "text"}, {"text", text}}})},
          {"structuredContent", structured},
          {"isError", false}};
}

Json RenderSnapshot(const std::string& snapshot_id) {
  return {{"content", Json::array({{{"type", "text"}, {"text", "snapshot " + snapshot_id}}})},
          {"structuredContent", {{"snapshot_id", snapshot_id}}},
          {"isError", false}};
}

std::string Serialize(const Json& message) {
  return message.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace agentbox::mcp
