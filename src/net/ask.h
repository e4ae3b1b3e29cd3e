// Askers for `on_unknown_domain: ask`: a prompt on the controlling terminal,
// or an external program (`--ask-command PROG`). Both answer on the proxy's
// io_context thread and treat anything but an explicit yes as a deny.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "net/proxy.h"

namespace agentbox::net {

// Runs `argv` once per question with {"host": "...", "port": N} on stdin and
// reads its answer from stdout: "allow" (or "once", "yes") allows once,
// "always" allows host:port for the rest of the run, anything else, a
// non-zero exit or no answer within `timeout` denies. It is started as a
// host program (linux/host_program.h: the question already in its stdin
// pipe), in agentbox's process group so that it may prompt on agentbox's
// terminal; once its stdout ends, or at the bound, it is killed and reaped.
class CommandAsker : public Asker {
 public:
  CommandAsker(boost::asio::io_context& io, std::vector<std::string> argv, std::chrono::milliseconds timeout);
  void Ask(const std::string& host, std::uint16_t port, std::function<void(AskAnswer)> done) override;

 private:
  boost::asio::io_context& io_;
  std::vector<std::string> argv_;
  std::chrono::milliseconds timeout_;
};

// Asks on a terminal, one question at a time:
//   agentbox: allow api.example.com:443? [o]nce / [a]lways this run / [d]eny:
// Input typed before a question is discarded. On a terminal whose foreground
// process group is not this process's, every question is a deny without a
// prompt (reading would stop the process with SIGTTIN). Silence for
// `timeout` is a deny. Owns the two descriptors it is given (they may be the
// same fd; a socket works too, for tests).
class TerminalAsker : public Asker {
 public:
  TerminalAsker(boost::asio::io_context& io, int in_fd, int out_fd, std::chrono::milliseconds timeout);
  // The controlling terminal (/dev/tty), or nothing when there is none.
  static std::unique_ptr<TerminalAsker> OpenControllingTerminal(boost::asio::io_context& io,
                                                                std::chrono::milliseconds timeout);
  void Ask(const std::string& host, std::uint16_t port, std::function<void(AskAnswer)> done) override;

 private:
  struct Pending {
    std::string target;
    std::function<void(AskAnswer)> done;
  };
  void Next();
  void ReadAnswer();
  void Answer(AskAnswer a, const char* note);

  boost::asio::io_context& io_;
  boost::asio::posix::stream_descriptor in_;
  int out_fd_;
  std::chrono::milliseconds timeout_;
  boost::asio::steady_timer timer_;
  std::deque<Pending> queue_;
  bool asking_ = false;
  std::string line_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);

 public:
  ~TerminalAsker() override;
};

// Parses an answer word: "o"/"once"/"y"/"yes"/"allow" → kOnce,
// "a"/"always" → kAlways, anything else → kDeny. Case-insensitive, trimmed.
AskAnswer ParseAnswer(std::string_view text);

}  // namespace agentbox::net
