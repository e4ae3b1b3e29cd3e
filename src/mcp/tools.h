// The session's tools as MCP sees them: names, descriptions written for a
// model, JSON Schemas for input and output, argument validation, and the
// rendering of a session result into an MCP tool result.
//
// Pure functions over JSON; nothing here runs a tool.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace agentbox::mcp {

using Json = nlohmann::json;

struct ToolSpec {
  std::string name;
  std::string title;
  std::string description;  // one paragraph for a model
  Json input_schema;        // JSON Schema (draft 2020-12 subset, see Validate)
  Json output_schema;       // the shape of structuredContent
  bool read_only = false;   // annotations.readOnlyHint
};

// bash, read_file, write_file, edit_file, list_dir, glob, diff, snapshot,
// request_escalation.
// `output_cap_bytes` appears in the descriptions (the limit a model meets).
std::vector<ToolSpec> Tools(std::size_t output_cap_bytes);
// run_code for a session whose CodeMode (session::Manager::CodeMode) is
// `code_mode`: its description lists the bindings a program gets; none
// when the host has no interpreter for it.
std::optional<ToolSpec> RunCodeTool(const Json& code_mode, std::size_t output_cap_bytes);
// "read_file(path, offset?, limit?)": a binding's name and fields, required first.
std::string BindingSignature(const Json& binding);
const ToolSpec* FindTool(const std::vector<ToolSpec>& tools, const std::string& name);

// The MCP `Tool` object (tools/list entry) of a spec.
Json ToolJson(const ToolSpec& spec);

// Checks `value` against `schema`, for the subset the tool schemas use:
// type (string | integer | number | boolean | object | array, or a list of
// them), properties, required, additionalProperties (false, or a schema for
// the others), propertyNames, minimum, exclusiveMinimum, maximum,
// minLength, pattern (strings), items, anyOf, enum. Returns "" when valid, else the first problem, naming
// the field: "arguments.timeout: expected integer, got string".
std::string Validate(const Json& value, const Json& schema, const std::string& where = "arguments");

// Renders a session result (session.h: {output, is_error, kind, outcome, ...})
// as an MCP CallToolResult: text content with the kind first for a failure,
// isError, and structuredContent carrying the whole result. Text longer than
// `cap` bytes is cut with an explicit note (and the same text goes into
// structuredContent.output, with "truncated": true). Each escalation offer
// the result's denials carry adds a line after the text (never cut):
//   to retry with this permission (network.allow host:443), call
//   request_escalation with offer_id esc-...
// for one within the ceiling, `no escalation: <why_not>` for one beyond.
Json RenderResult(const std::string& tool, const Json& result, std::size_t cap);

// A call the session could not serve, as an isError result whose text is
// "<kind>: <message>": kind "sandbox_error" (the session is gone, a cap, a
// broken sandbox) or "tool_error" (e.g. no diff for a session that works on
// its workspace directly). structuredContent only for the tools whose
// output schema is the session result (a client validates
// structuredContent against the declared schema even on errors).
Json RenderFailure(const std::string& tool, const std::string& kind, const std::string& message);

// A request_escalation result (the escalation object of session.h
// RequestEscalation) as a CallToolResult: "granted once: <grant> — the next
// call may use it", "granted for the session: <grant> — ...", "denied:
// <decision_reason>"; structuredContent the object itself. Not an error
// either way: the call did what it was asked.
Json RenderEscalation(const Json& escalation);

// diff {} and snapshot {} results.
Json RenderDiff(const Json& diff, std::size_t cap);
Json RenderSnapshot(const std::string& snapshot_id);

// The first line of a failed call's text: "timed_out after 30s",
// "oom_killed at 512 MiB", "sandbox_denied: network egress to
// evil.example:443 not in allowlist", "sandbox_error: ...", "exited with
// code 2", ... Empty for a success.
std::string Headline(const Json& result);

// Cuts `text` to at most `cap` bytes at a UTF-8 boundary, with `note` after
// it. Returns std::nullopt when the text fits.
std::optional<std::string> Cap(const std::string& text, std::size_t cap, const std::string& note);

// Serialises a message for the wire (one line, no newline inside; invalid
// UTF-8 in strings is replaced, never an exception).
std::string Serialize(const Json& message);

}  // namespace agentbox::mcp
