// A process in a pod as a local byte stream: the API server's exec
// subresource over a WebSocket, relayed to one end of a Unix socketpair.
//
// The wire (k8s.io/apimachinery remotecommand, KEP-3396): every WebSocket
// message is binary and starts with a channel byte: 0 stdin, 1 stdout,
// 2 stderr, 3 the command's Status (JSON, once, at the end), 4 terminal
// resize (unused: no tty). Subprotocol v5.channel.k8s.io adds a close
// signal (a message 255, N closes channel N), which carries our stdin's end;
// a server that picks v4.channel.k8s.io has none, so there stdin's end
// closes the whole WebSocket.
//
// The relay is one thread with its own io_context (not a child process: the
// TLS session and the WebSocket state live in this process, and a thread
// needs no second copy of the credentials). Buffers are bounded: one
// WebSocket message (at most kMaxMessage) on the way out to the socketpair,
// one read of kChunk bytes on the way in; each waits for the other side to
// take it, so a slow reader slows the pod's process, never memory.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "agentbox/status.h"
#include "k8s/kubeconfig.h"
#include "linux/fd.h"

namespace agentbox::k8s {

struct TlsContext;  // client_tls.h

inline constexpr const char* kProtocolV5 = "v5.channel.k8s.io";
inline constexpr const char* kProtocolV4 = "v4.channel.k8s.io";

// How the remote command ended, from channel 3.
struct ExecOutcome {
  enum class Kind {
    kExited,  // Status Success (exit code 0) or NonZeroExitCode (exit_code)
    kFailed,  // another Status Failure: the command could not run (message)
    kLost,    // no Status arrived: the connection ended or was stopped first
  };
  Kind kind = Kind::kLost;
  int exit_code = -1;   // for kExited
  std::string reason;   // the Status's reason ("NonZeroExitCode", "InternalError", ...)
  std::string message;  // the Status's message, or what ended the connection
};

struct ExecCallbacks {
  // Each line the command writes to stderr, without its newline (a line
  // longer than 64 KiB comes in pieces; a last line without one at the end).
  // Called on the relay thread.
  std::function<void(std::string_view)> on_stderr;
  // Once, on the relay thread, after the caller's end of the stream saw EOF.
  std::function<void(const ExecOutcome&)> on_end;
};

class ExecStream {
 public:
  static constexpr std::size_t kChunk = 64 * 1024;
  static constexpr std::size_t kMaxMessage = 16 * 1024 * 1024;

  // Connects to `config`'s server, upgrades `target` (the exec path with its
  // query) to a WebSocket offering v5 then v4, and starts the relay. A
  // refused upgrade is an error carrying the API's Status.
  static Result<std::unique_ptr<ExecStream>> Start(const Kubeconfig& config, TlsContext& tls,
                                                   const std::string& target, ExecCallbacks callbacks,
                                                   std::chrono::milliseconds connect_timeout);
  // Stop()s and joins the relay.
  ~ExecStream();
  ExecStream(const ExecStream&) = delete;
  ExecStream& operator=(const ExecStream&) = delete;

  // The caller's end (SOCK_STREAM, CLOEXEC), once; invalid afterwards.
  linux::UniqueFd TakeStream();
  // The subprotocol the server picked.
  const std::string& protocol() const;

  // Thread-safe. True once the relay has ended.
  bool done() const;
  // Blocks until the relay ends (at most `timeout`); nullopt on timeout.
  std::optional<ExecOutcome> Wait(std::chrono::milliseconds timeout) const;
  // Ends the relay now: the connection is closed, the caller's end sees EOF.
  void Stop();

  struct Relay;  // exec_stream.cc

 private:
  ExecStream() = default;
  std::unique_ptr<Relay> relay_;
  linux::UniqueFd caller_end_;
  std::thread thread_;
};

}  // namespace agentbox::k8s
