#include "net/ask.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <nlohmann/json.hpp>

#include <cstring>

#include "linux/host_program.h"

namespace agentbox::net {

namespace asio = boost::asio;
using boost::system::error_code;

AskAnswer ParseAnswer(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  std::size_t end = 0;
  while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end]))) ++end;
  std::string word(text.substr(0, end));
  for (char& c : word) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (word == "o" || word == "once" || word == "y" || word == "yes" || word == "allow") return AskAnswer::kOnce;
  if (word == "a" || word == "always") return AskAnswer::kAlways;
  return AskAnswer::kDeny;
}

// --- CommandAsker -------------------------------------------------------------

namespace {

// One run of the ask command: its stdout, a timer, and the answer once.
struct CommandRun : std::enable_shared_from_this<CommandRun> {
  CommandRun(asio::io_context& io, linux::HostProgram started, std::function<void(AskAnswer)> done)
      : out(io, started.TakeStdout().release()), timer(io), program(std::move(started)), done(std::move(done)) {}

  void Start(std::chrono::milliseconds timeout) {
    timer.expires_after(timeout);
    timer.async_wait([self = shared_from_this()](error_code ec) {
      if (!ec) self->End(AskAnswer::kDeny);
    });
    Read();
  }
  void Read() {
    if (text.size() > 4096) return End(AskAnswer::kDeny);
    out.async_read_some(asio::buffer(chunk), [self = shared_from_this()](error_code ec, std::size_t n) {
      if (self->ended) return;
      self->text.append(self->chunk, n);
      if (ec) return self->End(self->Decide());
      self->Read();
    });
  }
  AskAnswer Decide() {
    // Whatever it still does, the answer is in.
    const int status = program.End();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return AskAnswer::kDeny;
    return ParseAnswer(text);
  }
  void End(AskAnswer a) {
    if (ended) return;
    ended = true;
    program.End();
    timer.cancel();
    error_code ec;
    out.close(ec);
    done(a);
  }

  asio::posix::stream_descriptor out;
  asio::steady_timer timer;
  linux::HostProgram program;
  std::function<void(AskAnswer)> done;
  char chunk[512];
  std::string text;
  bool ended = false;
};

}  // namespace

CommandAsker::CommandAsker(asio::io_context& io, std::vector<std::string> argv, std::chrono::milliseconds timeout)
    : io_(io), argv_(std::move(argv)), timeout_(timeout) {}

void CommandAsker::Ask(const std::string& host, std::uint16_t port, std::function<void(AskAnswer)> done) {
  const std::string question = nlohmann::json{{"host", host}, {"port", port}}.dump() + "\n";
  // In agentbox's own process group: a program that asks on the terminal
  // must be able to read it.
  auto program = linux::HostProgram::Start(argv_, question, linux::ProcessGroup::kCallers);
  if (!program.ok()) {
    asio::post(io_, [done] { done(AskAnswer::kDeny); });
    return;
  }
  auto run = std::make_shared<CommandRun>(io_, std::move(*program), std::move(done));
  run->Start(timeout_);
}

// --- TerminalAsker --------------------------------------------------------------

TerminalAsker::TerminalAsker(asio::io_context& io, int in_fd, int out_fd, std::chrono::milliseconds timeout)
    : io_(io), in_(io, in_fd), out_fd_(out_fd == in_fd ? ::fcntl(out_fd, F_DUPFD_CLOEXEC, 0) : out_fd), timeout_(timeout), timer_(io) {
}

TerminalAsker::~TerminalAsker() {
  *alive_ = false;
  if (out_fd_ >= 0) ::close(out_fd_);
}

std::unique_ptr<TerminalAsker> TerminalAsker::OpenControllingTerminal(asio::io_context& io,
                                                                      std::chrono::milliseconds timeout) {
  int fd = ::open("/dev/tty", O_RDWR | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return nullptr;
  return std::make_unique<TerminalAsker>(io, fd, fd, timeout);
}

void TerminalAsker::Ask(const std::string& host, std::uint16_t port, std::function<void(AskAnswer)> done) {
  // Port 0: a question about the name itself (DNS inside the sandbox).
  std::string target = port == 0 ? host + " (any port)"
                       : host.find(':') != std::string::npos ? "[" + host + "]:" + std::to_string(port)
                                                             : host + ":" + std::to_string(port);
  queue_.push_back({std::move(target), std::move(done)});
  if (!asking_) Next();
}

void TerminalAsker::Next() {
  if (queue_.empty()) {
    asking_ = false;
    return;
  }
  asking_ = true;
  if (::isatty(out_fd_)) {
    // Outside the terminal's foreground process group (`agentbox run ... &`)
    // a read from it would stop the whole supervisor (SIGTTIN): no question,
    // a deny.
    if (::tcgetpgrp(out_fd_) != ::getpgrp()) return Answer(AskAnswer::kDeny, "");
    // Only an answer typed after the question counts, never type-ahead.
    ::tcflush(out_fd_, TCIFLUSH);
  }
  std::string prompt = "agentbox: allow " + queue_.front().target + "? [o]nce / [a]lways this run / [d]eny: ";
  ssize_t ignored = ::write(out_fd_, prompt.data(), prompt.size());
  (void)ignored;
  timer_.expires_after(timeout_);
  timer_.async_wait([this, alive = alive_](error_code ec) {
    if (ec || !*alive) return;
    Answer(AskAnswer::kDeny, "\nagentbox: no answer in time, denied\n");
  });
  line_.clear();
  ReadAnswer();
}

void TerminalAsker::ReadAnswer() {
  auto buf = std::make_shared<std::array<char, 256>>();
  in_.async_read_some(asio::buffer(*buf), [this, buf, alive = alive_](error_code ec, std::size_t n) {
    if (!*alive || !asking_) return;
    if (ec) return Answer(AskAnswer::kDeny, "");
    line_.append(buf->data(), n);
    std::size_t nl = line_.find('\n');
    if (nl == std::string::npos) {
      if (line_.size() > 256) return Answer(AskAnswer::kDeny, "");
      return ReadAnswer();
    }
    Answer(ParseAnswer(line_.substr(0, nl)), "");
  });
}

void TerminalAsker::Answer(AskAnswer a, const char* note) {
  if (queue_.empty()) return;
  if (note[0] != '\0') {
    ssize_t ignored = ::write(out_fd_, note, std::strlen(note));
    (void)ignored;
  }
  timer_.cancel();
  Pending p = std::move(queue_.front());
  queue_.pop_front();
  p.done(a);
  // A read still pending belongs to the next question now; cancel it.
  error_code ec;
  in_.cancel(ec);
  asking_ = false;
  asio::post(io_, [this, alive = alive_] {
    if (*alive && !asking_) Next();
  });
}

}  // namespace agentbox::net
