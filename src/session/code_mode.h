// Code mode (run_code): one short program per call, in a fresh process of
// the session's world, with no network of its own, that calls the
// session's tools as functions.
//
// The program's process gets one descriptor, fd 3: one end of a stream
// socketpair whose other end a BindingServer serves in the caller. Over it,
// one JSON object per line:
//   caller → program  {"t":"program","language","code","tools":[{name, description, inputSchema}]}
//                     {"t":"return","id":N,"result":{...a session result...}}
//   program → caller  {"t":"call","id":N,"name":"read_file","input":{...}}
//                     {"t":"result","value":...}      the last expression, or result(...)
//                     {"t":"error","type","message","line","traceback"}
//                     {"t":"denied","op","target"}   the program tried the network
// The prelude (Python or JavaScript, run by the host's interpreter from the
// read-only system) reads the program, builds the `tools` module from the
// schemas, runs the code and reports; nothing of an interpreter is embedded.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "agentbox/status.h"
#include "linux/fd.h"

namespace agentbox::session {

using Json = nlohmann::json;

// A language run_code serves on this host: its interpreter, found on the
// host's /usr/bin or /bin (the read-only system every world sees).
struct CodeRuntime {
  std::string language;     // python | javascript
  std::string interpreter;  // python3 | node
  std::string path;         // "" when absent
  std::string why_absent;   // "" when present
};

// Both languages, present or not (for `check` and the tool's description).
std::vector<CodeRuntime> CodeRuntimes();
// The one of `language` ("python" | "javascript"); nullopt for another name.
std::optional<CodeRuntime> FindCodeRuntime(const std::string& language);

// The argv that runs `language`'s prelude with the interpreter at `path`.
std::vector<std::string> PreludeArgv(const std::string& language, const std::string& path);

// What a program reported over its descriptor by the end of its call.
struct ProgramReport {
  std::optional<Json> value;      // {"t":"result"}'s value
  std::optional<Json> error;      // {"t":"error"} without "t"
  std::vector<Json> denials;      // {"op","target"} of each {"t":"denied"} (the first 16)
  std::size_t calls = 0;          // tool calls it made
  std::string protocol_error;     // a line that broke the protocol ("" = none); the channel was closed
};

// Serves one program's descriptor on a thread of its own: sends the
// program, then answers each call with `dispatch(name, input, cancel)` (a
// session result; `cancel` is set when the call must end), one at a time.
// A line over `max_line` bytes or not a JSON object ends the channel.
class BindingServer {
 public:
  using Dispatch = std::function<Json(const std::string& name, const Json& input, const std::atomic<bool>* cancel)>;
  BindingServer(linux::UniqueFd fd, Json program, Dispatch dispatch, std::size_t max_calls,
                std::size_t max_line = 16u << 20);
  ~BindingServer();
  BindingServer(const BindingServer&) = delete;
  BindingServer& operator=(const BindingServer&) = delete;

  // Stops serving (a call in progress is cancelled and waited for), closes
  // the channel (a process still holding the other end reads EOF) and
  // returns what the program said.
  ProgramReport Finish();

 private:
  void Serve();

  linux::UniqueFd fd_;
  linux::UniqueFd wake_r_, wake_w_;
  Json program_;
  Dispatch dispatch_;
  std::size_t max_calls_;
  std::size_t max_line_;
  std::atomic<bool> stop_{false};
  ProgramReport report_;
  std::thread thread_;
  bool finished_ = false;
};

}  // namespace agentbox::session
