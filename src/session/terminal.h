// A session's terminal: a command on a pty inside the session's world,
// kept by the caller (the daemon) between attachments.
//
// The pty's master is agentbox's: a reader thread takes what the command
// writes into a scrollback of kScrollback bytes and hands it to whoever is
// attached; input and window sizes go the other way. Detaching leaves the
// command running; attaching again replays the scrollback first. The
// command's processes end with it (Kill, its own exit, or the world's end),
// as a call's do.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "agentbox/status.h"
#include "linux/fd.h"
#include "session/world.h"

namespace agentbox::session {

class Terminal {
 public:
  static constexpr std::size_t kScrollback = 1 << 20;    // bytes of output kept for a reattach
  static constexpr std::size_t kPendingInput = 1 << 20;  // input not yet taken by the pty

  // Output as it comes, on the reader thread; must not block.
  using OnOutput = std::function<void(std::string_view chunk)>;
  // Once, when the command has ended: {"exit_code"} or {"signal"}, or {"error"}.
  using OnExit = std::function<void(const nlohmann::json& end)>;

  // Starts `spec` in `world`; `world` is kept alive as long as the terminal.
  static Result<std::shared_ptr<Terminal>> Open(std::shared_ptr<World> world, std::string id,
                                                const WorldTerminalSpec& spec);
  ~Terminal();  // Kill(), then waits for the reader
  Terminal(const Terminal&) = delete;
  Terminal& operator=(const Terminal&) = delete;

  const std::string& id() const { return id_; }
  // Keystrokes; false once the command has ended or too much input waits.
  bool Write(std::string_view data);
  Status Resize(int cols, int rows);
  // Registers the callbacks; `replay` gets the scrollback as it is at that
  // moment, under the same lock as every OnOutput: nothing is lost or
  // repeated between it and the first OnOutput. An ended terminal calls
  // on_exit at once, after `replay`. Callbacks must not call back in.
  long Attach(OnOutput on_output, OnExit on_exit, const std::function<void(const std::string&)>& replay);
  void Detach(long token);
  // SIGKILL to the command and everything it started.
  void Kill();
  bool Running() const;
  // {id, command, cwd, cols, rows, created, running, attached, exit_code?, signal?, error?}
  nlohmann::json Describe() const;

 private:
  Terminal() = default;
  void ReadLoop();
  void Finish(nlohmann::json end);

  std::string id_;
  WorldTerminalSpec spec_;
  std::string created_;
  std::shared_ptr<World> world_;
  long call_id_ = 0;
  linux::UniqueFd master_;
  linux::UniqueFd result_;
  linux::UniqueFd wake_;  // eventfd: input waits, or the terminal is going away
  std::thread reader_;

  mutable std::mutex mu_;
  std::string scrollback_;   // the last kScrollback bytes
  std::string pending_;      // input the pty has not taken yet
  std::map<long, std::pair<OnOutput, OnExit>> attached_;
  long next_token_ = 1;
  bool stopping_ = false;
  std::optional<nlohmann::json> end_;
  int cols_ = 80, rows_ = 24;
};

}  // namespace agentbox::session
