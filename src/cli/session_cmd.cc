// `agentbox session ...`: the daemon's client, so that everything the API
// offers is usable from a shell (docs/daemon.md).
//
//   agentbox session create --workspace DIR [--policy FILE] [--mode M] [--from-snapshot S]
//   agentbox session exec ID [--json] [--stream] [--call-id X] [--timeout T] [--cwd DIR] [--env N=V]... [--stdin] -- COMMAND...
//   agentbox session read ID PATH | write ID PATH < CONTENT
//   agentbox session snapshot ID [--keep] | snapshots [ID] | snapshot-rm SNAP | diff ID [--all] | apply ID [--all]
//   agentbox session log ID | rm ID | ls
//   agentbox session service start ID NAME [--cwd DIR] [--env K=V]... -- COMMAND...
//   agentbox session service ls ID | logs ID NAME [--follow] | restart ID NAME | stop ID NAME [--forget]
//   agentbox session port expose ID PORT | ls ID | rm ID PORT
//   agentbox session background-log ID
//
// The daemon is found at --socket, $AGENTBOX_SOCKET, or the state directory's
// socket; or at --url http://127.0.0.1:PORT with --token-file.
#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/subcommand.h"
#include "daemon/client.h"
#include "daemon/listen.h"
#include "linux/session_shell.h"

namespace agentbox::cli {
namespace {

using nlohmann::json;

struct SessionFlags {
  // Where the daemon is.
  std::string socket;
  std::string url;
  std::string token_file;
  std::string state_dir;
  // Per subcommand.
  std::string id;
  std::string path;
  std::string workspace;
  std::string policy_file;
  std::string mode;
  std::string from_snapshot;
  std::string command;
  std::string call_id;
  std::string timeout;
  std::string cwd;
  std::vector<std::string> env;  // NAME=VALUE, one a flag
  std::optional<long> offset, limit;
  bool keep = false;
  bool json = false;
  bool all = false;  // diff, apply: ignore rules off
  bool grants = false;  // log: the escalation and policy lines only
  bool stream = false;
  bool with_stdin = false;
  // Services and ports (cwd and env too: a service's).
  std::string name;
  int port = 0;
  bool follow = false;
  bool forget = false;
};

void SessionError(const std::string& message) { std::fprintf(stderr, "agentbox session: %s\n", message.c_str()); }

std::string ReadAll(std::istream& in) { return std::string(std::istreambuf_iterator<char>(in), {}); }

void WriteOut(std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

Result<daemon::Endpoint> ResolveEndpoint(const SessionFlags& f) {
  if (!f.url.empty()) {
    auto e = daemon::Endpoint::FromUrl(f.url);
    if (!e.ok()) return e;
    if (f.token_file.empty()) return Status::Error("connect", "--url needs --token-file FILE (the daemon's bearer token)");
    auto token = daemon::ReadTokenFile(f.token_file);
    if (!token.ok()) return token.status();
    e->token = *token;
    return e;
  }
  daemon::Endpoint e;
  if (!f.socket.empty()) {
    e.unix_socket = f.socket;
  } else if (const char* env = getenv("AGENTBOX_SOCKET"); env && *env) {
    e.unix_socket = env;
  } else {
    std::string dir = f.state_dir.empty() ? daemon::DefaultStateDir() : f.state_dir;
    if (dir.empty()) return Status::Error("connect", "no --socket, $AGENTBOX_SOCKET or home directory to find the daemon");
    e.unix_socket = daemon::SocketIn(dir);
  }
  return e;
}

std::string RealOrGiven(const std::string& path) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf)) return buf;
  return path;
}

// Quotes one argument for a POSIX shell, only when it needs it.
std::string ShellQuote(const std::string& arg) {
  if (!arg.empty() && arg.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-") ==
                          std::string::npos) {
    return arg;
  }
  return linux::ShellQuote(arg);
}

// The exit status `agentbox run` would give for this result.
int ExitStatusOf(const json& result) {
  const std::string kind = result.value("kind", "");
  if (kind == "exited" || (kind == "sandbox_denied" && result.contains("exit_code"))) {
    return result.value("exit_code", kExitFailure);
  }
  if (kind == "ok") return 0;
  if (kind == "timed_out") return kExitTimedOut;
  if (kind == "sandbox_error") return kExitSandbox;
  if (kind == "oom_killed") return 137;
  if (kind == "signaled") return 128 + result.value("signal", 9);
  if (kind == "cancelled" || kind == "interrupted") return kExitInterrupted;
  return kExitFailure;
}

// A bash result's output is the command's output with agentbox's own lines
// around it: a first line naming a failure ("timed_out after 1.0s",
// "sandbox_denied: ..."), a last line "[exit code N]" or "[killed by signal
// N]". The command's part goes to stdout, agentbox's to stderr, as with
// `agentbox run`.
struct SplitOutput {
  std::string headline;
  std::string command_output;
  std::string trailer;
};
SplitOutput Split(const json& result) {
  SplitOutput s;
  s.command_output = result.value("output", "");
  const std::string kind = result.value("kind", "");
  if (kind != "exited" && kind != "signaled" && kind != "ok" && !kind.empty() &&
      s.command_output.compare(0, kind.size(), kind) == 0) {
    std::size_t nl = s.command_output.find('\n');
    s.headline = s.command_output.substr(0, nl);
    s.command_output = nl == std::string::npos ? "" : s.command_output.substr(nl + 1);
  }
  const std::string marker = kind == "exited" && result.value("exit_code", 0) != 0
                                 ? "[exit code " + std::to_string(result.value("exit_code", 0)) + "]"
                             : kind == "signaled" ? "[killed by signal " + std::to_string(result.value("signal", 0)) + "]"
                                                  : "";
  const std::string& out = s.command_output;
  if (!marker.empty() && out.size() >= marker.size() && out.compare(out.size() - marker.size(), marker.size(), marker) == 0 &&
      (out.size() == marker.size() || out[out.size() - marker.size() - 1] == '\n')) {
    s.trailer = marker;
    s.command_output.resize(out.size() - marker.size());
  }
  return s;
}

void PrintNotes(const SplitOutput& s) {
  if (!s.headline.empty()) SessionError(s.headline);
  if (!s.trailer.empty()) SessionError(s.trailer);
}

std::string SessionPath(const std::string& id, const std::string& rest = "") {
  return "/v1/sessions/" + id + rest;
}

// Runs one tool call; prints per the flags; returns the exit status.
int Execute(daemon::Client& client, const SessionFlags& f, const std::string& tool, const json& input,
            bool output_is_data) {
  json body = {{"name", tool}, {"input", input}};
  if (!f.call_id.empty()) body["call_id"] = f.call_id;
  std::string text;
  try {
    text = body.dump(-1, ' ', false, json::error_handler_t::strict);
  } catch (const json::type_error&) {
    SessionError("the " + tool + " input is not UTF-8 text (tools carry text; binary content is not supported)");
    return kExitUsage;
  }
  json result;
  if (f.stream) {
    bool got_result = false;
    bool streamed_any = false;
    std::string error;
    daemon::SseParser sse([&](const std::string& event, const std::string& data) {
      auto j = json::parse(data, nullptr, false);
      if (event == "output" && j.is_string()) {
        streamed_any = true;
        if (!f.json) WriteOut(j.get<std::string>());
      } else if (event == "result") {
        result = j;
        got_result = true;
      } else if (event == "error") {
        error = j.is_object() ? j["error"].value("message", data) : data;
      }
    });
    auto r = client.Call("POST", SessionPath(f.id, "/execute?stream=1"), text,
                         [&](std::string_view chunk) { sse.Feed(chunk); });
    if (!r.ok()) {
      SessionError(r.status().message());
      return kExitSandbox;
    }
    if (r->status != 200) {
      SessionError(r->ErrorMessage());
      return kExitSandbox;
    }
    if (!got_result) {
      SessionError(error.empty() ? "the stream ended without a result" : error);
      return kExitSandbox;
    }
    if (f.json) {
      WriteOut(result.dump(2) + "\n");
    } else {
      SplitOutput split = Split(result);
      // A replayed result comes whole, without output events.
      if (!streamed_any) WriteOut(split.command_output);
      PrintNotes(split);
    }
    return ExitStatusOf(result);
  }
  auto r = client.CallJson("POST", SessionPath(f.id, "/execute"), body);
  if (!r.ok()) {
    SessionError(r.status().message());
    return kExitSandbox;
  }
  result = std::move(*r);
  if (f.json) {
    WriteOut(result.dump(2) + "\n");
  } else if (output_is_data) {
    const std::string output = result.value("output", "");
    // A file tool's failure is a message, not file content: stderr.
    if (result.value("is_error", false)) {
      std::fprintf(stderr, "%s%s", output.c_str(), !output.empty() && output.back() != '\n' ? "\n" : "");
    } else {
      WriteOut(output);
    }
  } else {
    SplitOutput split = Split(result);
    WriteOut(split.command_output);
    PrintNotes(split);
  }
  return ExitStatusOf(result);
}

// One line of `session log --grants` for an escalation or policy event of
// the log; "" for any other line.
std::string GrantLogLine(const json& e) {
  const std::string event = e.value("event", "");
  const std::string time = e.value("time", "");
  auto grant_text = [](const json& g) {
    if (!g.is_object() || g.empty()) return std::string("?");
    const auto& v = g.begin().value();
    return g.begin().key() + " " + (v.is_string() ? v.get<std::string>() : v.dump());
  };
  if (event == "escalation_offered") {
    const json offer = e.value("offer", json::object());
    std::string line = time + " offered   " + offer.value("id", "") + " " + grant_text(offer.value("grant", json())) +
                       (offer.value("within_ceiling", false) ? " (within the ceiling)"
                                                             : " (beyond the ceiling: " + offer.value("why_not", "") + ")");
    if (!e.value("call_id", "").empty()) line += " call " + e.value("call_id", "");
    return line + " seq " + std::to_string(e.value("seq", 0));
  }
  const json r = e.value("escalation", json());
  if (event == "escalation_requested" && r.is_object()) {
    return time + " requested " + r.value("id", "") + " " + r.value("offer_id", "") + " " +
           grant_text(r.value("grant", json())) + " by " + r.value("by", "") +
           (r.value("reason", "").empty() ? "" : ": \"" + r.value("reason", "") + "\"");
  }
  if (event == "escalation_decided" && r.is_object()) {
    std::string line = time + " decided   " + r.value("id", "") + " " + r.value("decision", "") + " by " +
                       r.value("decided_by", "");
    if (!r.value("decision_reason", "").empty()) line += ": " + r.value("decision_reason", "");
    return line;
  }
  if (event == "grant_applied") {
    return time + " granted   " + e.value("escalation", "") + " " + grant_text(e.value("grant", json())) + " for " +
           (e.value("scope", "") == "session" ? std::string("the session") : std::string("one call")) + " (" +
           e.value("applied", "") + ")";
  }
  if (event == "grant_used") {
    return time + " used      " + e.value("escalation", "") + " " + grant_text(e.value("grant", json())) +
           " by the call at seq " + std::to_string(e.value("seq", 0)) + " (" + e.value("applied", std::string()) + ")";
  }
  if (event == "grant_expired") {
    return time + " expired   " + e.value("escalation", "") + " " + grant_text(e.value("grant", json())) + ": " +
           e.value("why", "");
  }
  if (event == "policy_changed") {
    const json net = e.value("network", json::object());
    return time + " policy    by " + e.value("by", "") + ": network.allow " + net.value("allow", json::array()).dump() +
           ", network.deny " + net.value("deny", json::array()).dump() + " (" + e.value("applied", "") + ")";
  }
  return "";
}

int Run(const std::string& sub, SessionFlags& f, const std::vector<std::string>& after_dashes) {
  auto endpoint = ResolveEndpoint(f);
  if (!endpoint.ok()) {
    SessionError(endpoint.status().message());
    return sub == "exec" ? kExitSandbox : kExitFailure;
  }
  daemon::Client client(*endpoint);
  auto fail = [&](const Status& s) {
    SessionError(s.message());
    return kExitFailure;
  };

  if (sub == "create") {
    json body = {{"workspace", RealOrGiven(f.workspace.empty() ? "." : f.workspace)}};
    if (!f.policy_file.empty()) {
      std::ifstream in(f.policy_file);
      if (!in) return fail(Status::Error("policy", "cannot read the policy file " + f.policy_file));
      body["policy"] = ReadAll(in);
    }
    if (!f.mode.empty()) body["mode"] = f.mode;
    if (!f.from_snapshot.empty()) body["from_snapshot"] = f.from_snapshot;
    auto r = client.CallJson("POST", "/v1/sessions", body);
    if (!r.ok()) return fail(r.status());
    WriteOut(f.json ? r->dump(2) + "\n" : r->value("id", "") + "\n");
    return 0;
  }
  if (sub == "exec") {
    if (!f.command.empty() && !after_dashes.empty()) {
      SessionError("give the command either after -- or with --command, not both");
      return kExitUsage;
    }
    std::string command = f.command;
    for (const auto& a : after_dashes) command += (command.empty() ? "" : " ") + ShellQuote(a);
    if (command.empty()) {
      SessionError("no command: agentbox session exec ID -- COMMAND [ARG...]  (or --command STRING)");
      return kExitUsage;
    }
    json input = {{"command", command}};
    if (!f.timeout.empty()) input["timeout"] = f.timeout;
    if (!f.cwd.empty()) input["cwd"] = f.cwd;
    if (!f.env.empty()) {
      json env = json::object();
      for (const auto& e : f.env) {
        const auto eq = e.find('=');
        if (eq == std::string::npos || eq == 0) {
          SessionError("--env " + e + ": expected NAME=VALUE");
          return kExitUsage;
        }
        env[e.substr(0, eq)] = e.substr(eq + 1);
      }
      input["env"] = env;
    }
    if (f.with_stdin) input["stdin"] = ReadAll(std::cin);
    return Execute(client, f, "bash", input, false);
  }
  if (sub == "read") {
    json input = {{"path", f.path}};
    if (f.offset) input["offset"] = *f.offset;
    if (f.limit) input["limit"] = *f.limit;
    return Execute(client, f, "read_file", input, true);
  }
  if (sub == "write") {
    return Execute(client, f, "write_file", {{"path", f.path}, {"content", ReadAll(std::cin)}}, true);
  }
  if (sub == "snapshot") {
    auto r = f.keep ? client.CallJson("POST", SessionPath(f.id, "/snapshot"), json{{"keep", true}})
                    : client.CallJson("POST", SessionPath(f.id, "/snapshot"));
    if (!r.ok()) return fail(r.status());
    WriteOut(f.json ? r->dump(2) + "\n" : r->value("snapshot_id", "") + "\n");
    return 0;
  }
  if (sub == "snapshots") {
    auto r = client.CallJson("GET", f.id.empty() ? "/v1/snapshots" : SessionPath(f.id, "/snapshots"));
    if (!r.ok()) return fail(r.status());
    if (f.json) {
      WriteOut(r->dump(2) + "\n");
      return 0;
    }
    for (const auto& s : (*r)["snapshots"]) {
      WriteOut(s.value("id", "") + "\t" + (s.value("session", "").empty() ? "-" : s.value("session", "")) + "\t" +
               s.value("created", "") + "\t" + (s.value("keep", false) ? "kept" : "with its session") + "\n");
    }
    return 0;
  }
  if (sub == "snapshot-rm") {
    auto r = client.CallJson("DELETE", "/v1/snapshots/" + f.id);
    if (!r.ok()) return fail(r.status());
    return 0;
  }
  if (sub == "diff") {
    if (f.json) {
      auto r = client.CallJson("GET", SessionPath(f.id, f.all ? "/diff?all=1" : "/diff"));
      if (!r.ok()) return fail(r.status());
      WriteOut(r->dump(2) + "\n");
      return 0;
    }
    auto r = client.Call("GET", SessionPath(f.id, f.all ? "/diff?format=patch&all=1" : "/diff?format=patch"));
    if (!r.ok()) return fail(r.status());
    if (r->status != 200) return fail(Status::Error("http", r->ErrorMessage()));
    WriteOut(r->body);
    return 0;
  }
  if (sub == "apply") {
    auto r = client.CallJson("POST", SessionPath(f.id, f.all ? "/apply?all=1" : "/apply"), json::object());
    if (!r.ok()) return fail(r.status());
    if (f.json) {
      WriteOut(r->dump(2) + "\n");
    } else {
      for (const auto& file : r->value("files", json::array())) {
        WriteOut(file.value("status", "") + " " + file.value("path", "") + "\n");
      }
    }
    return 0;
  }
  if (sub == "log" && f.grants) {
    std::string text;
    auto r = client.Call("GET", SessionPath(f.id, "/log"), "", [&](std::string_view chunk) { text += chunk; });
    if (!r.ok()) return fail(r.status());
    if (r->status != 200) return fail(Status::Error("http", r->ErrorMessage()));
    text += r->body;
    std::size_t start = 0;
    while (start < text.size()) {
      std::size_t nl = text.find('\n', start);
      if (nl == std::string::npos) nl = text.size();
      const std::string line = text.substr(start, nl - start);
      start = nl + 1;
      const json e = json::parse(line, nullptr, false);
      if (!e.is_object() || e.value("type", "") != "event") continue;
      const std::string text_line = GrantLogLine(e);
      if (text_line.empty()) continue;
      WriteOut(f.json ? line + "\n" : text_line + "\n");
    }
    return 0;
  }
  if (sub == "log") {
    auto r = client.Call("GET", SessionPath(f.id, "/log"), "", [](std::string_view chunk) { WriteOut(chunk); });
    if (!r.ok()) return fail(r.status());
    if (r->status != 200) return fail(Status::Error("http", r->ErrorMessage()));
    WriteOut(r->body);  // when the daemon sent it unchunked
    return 0;
  }
  // Streams a text body (a log) to stdout.
  auto print_text = [&](const std::string& target) {
    auto r = client.Call("GET", target, "", [](std::string_view chunk) { WriteOut(chunk); });
    if (!r.ok()) return fail(r.status());
    if (r->status != 200) return fail(Status::Error("http", r->ErrorMessage()));
    WriteOut(r->body);
    return 0;
  };
  auto print_json = [&](const Result<json>& r) {
    if (!r.ok()) return fail(r.status());
    WriteOut(r->dump(2) + "\n");
    return 0;
  };
  if (sub == "service start") {
    std::string command = f.command;
    for (const auto& a : after_dashes) command += (command.empty() ? "" : " ") + ShellQuote(a);
    if (command.empty()) {
      SessionError("no command: agentbox session service start ID NAME -- COMMAND [ARG...]  (or --command STRING)");
      return kExitUsage;
    }
    json body = {{"name", f.name}, {"command", command}};
    if (!f.cwd.empty()) body["cwd"] = f.cwd;
    if (!f.env.empty()) {
      body["env"] = json::object();
      for (const auto& kv : f.env) {
        const auto eq = kv.find('=');
        if (eq == std::string::npos || eq == 0) {
          SessionError("--env " + kv + ": expected NAME=VALUE");
          return kExitUsage;
        }
        body["env"][kv.substr(0, eq)] = kv.substr(eq + 1);
      }
    }
    return print_json(client.CallJson("POST", SessionPath(f.id, "/services"), body));
  }
  if (sub == "service ls") {
    auto r = client.CallJson("GET", SessionPath(f.id, "/services"));
    if (!r.ok()) return fail(r.status());
    if (f.json) return print_json(r);
    for (const auto& s : (*r)["services"]) {
      std::string state = s.value("state", "");
      if (s.contains("pid")) state += " pid " + std::to_string(s.value("pid", 0));
      if (s.contains("exit_code")) state += " exit " + std::to_string(s.value("exit_code", 0));
      if (s.contains("signal")) state += " signal " + std::to_string(s.value("signal", 0));
      WriteOut(s.value("name", "") + "\t" + state + "\t" + std::to_string(s.value("restarts", 0)) + " restarts\t" +
               s.value("command", "") + "\n");
    }
    return 0;
  }
  if (sub == "service logs") {
    return print_text(SessionPath(f.id, "/services/" + f.name + "/logs" + (f.follow ? "?follow=1" : "")));
  }
  if (sub == "service restart") return print_json(client.CallJson("POST", SessionPath(f.id, "/services/" + f.name + "/restart")));
  if (sub == "service stop") {
    return print_json(f.forget ? client.CallJson("DELETE", SessionPath(f.id, "/services/" + f.name))
                               : client.CallJson("POST", SessionPath(f.id, "/services/" + f.name + "/stop")));
  }
  if (sub == "port expose") {
    auto r = client.CallJson("POST", SessionPath(f.id, "/ports"), json{{"port", f.port}});
    if (!r.ok()) return fail(r.status());
    if (f.json) return print_json(r);
    WriteOut(r->value("host", "") + ":" + std::to_string(r->value("port", 0)) + "\n");
    return 0;
  }
  if (sub == "port ls") {
    auto r = client.CallJson("GET", SessionPath(f.id, "/ports"));
    if (!r.ok()) return fail(r.status());
    if (f.json) return print_json(r);
    for (const auto& p : (*r)["ports"]) {
      WriteOut(std::to_string(p.value("inside_port", 0)) + "\t" + p.value("host", "") + ":" +
               std::to_string(p.value("port", 0)) + "\n");
    }
    return 0;
  }
  if (sub == "port rm") {
    auto r = client.CallJson("DELETE", SessionPath(f.id, "/ports/" + std::to_string(f.port)));
    if (!r.ok()) return fail(r.status());
    return 0;
  }
  if (sub == "background-log") return print_text(SessionPath(f.id, "/background/log"));
  if (sub == "rm") {
    auto r = client.CallJson("DELETE", SessionPath(f.id));
    if (!r.ok()) return fail(r.status());
    return 0;
  }
  if (sub == "ls") {
    auto r = client.CallJson("GET", "/v1/sessions");
    if (!r.ok()) return fail(r.status());
    if (f.json) {
      WriteOut(r->dump(2) + "\n");
      return 0;
    }
    for (const auto& s : (*r)["sessions"]) {
      WriteOut(s.value("id", "") + "\t" + s.value("workspace", "") + "\t" +
               (s.value("provisioned", false) ? "provisioned" : "idle") + "\t" +
               std::to_string(s.value("calls", 0)) + " calls\n");
    }
    return 0;
  }
  return kExitUsage;
}

}  // namespace

Subcommand AddSessionCommand(CLI::App& app) {
  auto f = std::make_shared<SessionFlags>();
  CLI::App* cmd = app.add_subcommand("session", "talk to the session daemon (`agentbox serve`)");
  cmd->require_subcommand(1);
  cmd->add_option("--socket", f->socket, "the daemon's unix socket (default: $AGENTBOX_SOCKET, else STATE_DIR/agentbox.sock)");
  cmd->add_option("--state-dir", f->state_dir, "the daemon's state directory, to find its socket");
  cmd->add_option("--url", f->url, "the daemon over loopback TCP: http://127.0.0.1:PORT (with --token-file)");
  cmd->add_option("--token-file", f->token_file, "bearer token for --url");

  auto add = [&](const char* name, const char* help) {
    CLI::App* sub = cmd->add_subcommand(name, help);
    sub->fallthrough();  // the connection flags may come after the subcommand
    return sub;
  };
  CLI::App* create = add("create", "create a session (nothing starts before its first call); prints its id");
  create->add_option("--workspace", f->workspace, "the base workspace (default: current directory)");
  create->add_option("--policy", f->policy_file, "policy file (YAML)");
  create->add_option("--mode", f->mode, "read-only | workspace-write | danger-full-access");
  create->add_option("--from-snapshot", f->from_snapshot, "start from this snapshot");
  create->add_flag("--json", f->json, "print the answer as JSON");

  CLI::App* exec = add("exec", "run a command in the session; exits with its status (124 timed out, 125 sandbox error)");
  exec->add_option("id", f->id, "session id")->required();
  exec->add_option("--command", f->command, "the command as one shell string (instead of -- COMMAND...)");
  exec->add_option("--call-id", f->call_id, "idempotency key: a call id already in the log returns its result");
  exec->add_option("--timeout", f->timeout, "wall clock limit, e.g. 30s");
  exec->add_option("--cwd", f->cwd, "directory to start in, relative to the workspace (must stay inside it)");
  exec->add_option("--env", f->env, "NAME=VALUE added to the command's environment (repeatable)")
      ->allow_extra_args(false);
  exec->add_flag("--stdin", f->with_stdin, "send this process's standard input to the command");
  exec->add_flag("--stream", f->stream, "print output as it comes");
  exec->add_flag("--json", f->json, "print the result JSON instead of the output");

  CLI::App* read = add("read", "print a file as the session sees it");
  read->add_option("id", f->id, "session id")->required();
  read->add_option("path", f->path, "path (relative to the workspace)")->required();
  read->add_option("--offset", f->offset, "first line (1-based)");
  read->add_option("--limit", f->limit, "number of lines");
  read->add_flag("--json", f->json, "print the result JSON");

  CLI::App* write = add("write", "write standard input to a file in the session");
  write->add_option("id", f->id, "session id")->required();
  write->add_option("path", f->path, "path (relative to the workspace)")->required();
  write->add_flag("--json", f->json, "print the result JSON");

  CLI::App* snapshot = add("snapshot", "freeze the session's changes; prints the snapshot id");
  snapshot->add_option("id", f->id, "session id")->required();
  snapshot->add_flag("--json", f->json, "print the answer as JSON");
  snapshot->add_flag("--keep", f->keep, "keep the snapshot when the session is removed");

  CLI::App* snapshots = add("snapshots", "list snapshots (all, or those taken from one session)");
  snapshots->add_option("id", f->id, "session id (default: every snapshot)");
  snapshots->add_flag("--json", f->json, "print as JSON");

  CLI::App* snapshot_rm = add("snapshot-rm", "delete a snapshot");
  snapshot_rm->add_option("id", f->id, "snapshot id")->required();

  CLI::App* diff = add("diff", "the session's changes as a patch (agentbox session diff ID | git apply)");
  diff->add_option("id", f->id, "session id")->required();
  diff->add_flag("--json", f->json, "the file list and patch as JSON");
  diff->add_flag("--all", f->all, "include what the workspace's .gitignore files and diff.exclude leave out");

  CLI::App* apply = add("apply", "write the session's changes into its workspace, all or nothing");
  apply->add_option("id", f->id, "session id")->required();
  apply->add_flag("--all", f->all, "include what the workspace's .gitignore files and diff.exclude leave out");
  apply->add_flag("--json", f->json, "print the answer as JSON");

  CLI::App* log = add("log", "print the session's log (JSON lines)");
  log->add_option("id", f->id, "session id")->required();
  log->add_flag("--grants", f->grants,
                "only escalation offers, requests, decisions and grants, and policy changes, one line each "
                "(--json: their log lines)");
  log->add_flag("--json", f->json, "with --grants: print the log lines themselves");

  CLI::App* rm = add("rm", "stop and remove a session");
  rm->add_option("id", f->id, "session id")->required();

  CLI::App* ls = add("ls", "list sessions");
  ls->add_flag("--json", f->json, "print as JSON");

  CLI::App* bglog = add("background-log", "print what the session's calls left running wrote after their call");
  bglog->add_option("id", f->id, "session id")->required();

  CLI::App* service = add("service", "named long-running processes in a session (start, ls, logs, restart, stop)");
  service->require_subcommand(1);
  auto add_service = [&](const char* name, const char* help, bool named) {
    CLI::App* sub = service->add_subcommand(name, help);
    sub->fallthrough();
    sub->add_option("id", f->id, "session id")->required();
    if (named) sub->add_option("name", f->name, "service name")->required();
    return sub;
  };
  CLI::App* sstart = add_service("start", "start a service: agentbox session service start ID NAME -- COMMAND...", true);
  sstart->add_option("--command", f->command, "the command as one shell string (instead of -- COMMAND...)");
  sstart->add_option("--cwd", f->cwd, "working directory inside (relative: to the workspace)");
  sstart->add_option("--env", f->env, "NAME=VALUE for the service (repeatable)")->allow_extra_args(false);
  add_service("ls", "list the session's services", false)->add_flag("--json", f->json, "print as JSON");
  add_service("logs", "print a service's output", true)->add_flag("--follow", f->follow, "and what comes, until it exits");
  add_service("restart", "stop and start a service again", true);
  add_service("stop", "stop a service", true)->add_flag("--forget", f->forget, "and remove it from the list");

  CLI::App* port = add("port", "expose a port of the session's sandbox on the host's loopback (expose, ls, rm)");
  port->require_subcommand(1);
  auto add_port = [&](const char* name, const char* help, bool numbered) {
    CLI::App* sub = port->add_subcommand(name, help);
    sub->fallthrough();
    sub->add_option("id", f->id, "session id")->required();
    if (numbered) sub->add_option("port", f->port, "the port inside")->required()->check(CLI::Range(1, 65535));
    return sub;
  };
  add_port("expose", "expose a port; prints 127.0.0.1:HOSTPORT", true)->add_flag("--json", f->json, "print as JSON");
  add_port("ls", "list exposed ports (inside port, host address)", false)->add_flag("--json", f->json, "print as JSON");
  add_port("rm", "stop exposing a port", true);

  return {cmd, [f, cmd](const std::vector<std::string>& after_dashes) {
            for (CLI::App* sub : cmd->get_subcommands()) {
              if (!sub->parsed()) continue;
              for (CLI::App* nested : sub->get_subcommands()) {
                if (nested->parsed()) return Run(sub->get_name() + " " + nested->get_name(), *f, after_dashes);
              }
              return Run(sub->get_name(), *f, after_dashes);
            }
            return kExitUsage;
          }};
}

}  // namespace agentbox::cli
