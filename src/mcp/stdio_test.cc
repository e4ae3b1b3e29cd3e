#include "mcp/stdio.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "linux/fd.h"

namespace agentbox::mcp {
namespace {

using linux::UniqueFd;
using namespace std::chrono_literals;

// bash "block" runs until cancelled; anything else answers at once.
class BlockingSession : public SessionTools {
 public:
  Result<Json> Execute(const std::string&, const Json& input, const session::OutputSink&,
                       const std::atomic<bool>* cancel) override {
    if (input.value("command", "") == "block") {
      while (!cancel->load()) std::this_thread::sleep_for(1ms);
      return Json{{"output", ""}, {"is_error", true}, {"kind", "cancelled"}};
    }
    return Json{{"output", input.value("command", "")}, {"is_error", false}, {"kind", "exited"}, {"exit_code", 0}};
  }
  Result<std::string> Snapshot() override { return std::string("s"); }
  Result<Json> Diff() override { return Json{{"files", Json::array()}, {"patch", ""}}; }
  Result<Json> RequestEscalation(const std::string&, const std::string&) override {
    return Status::Error(session::kBadRequest, "no escalations here");
  }
};

// A server on a pair of pipes, served on a thread of its own.
class StdioTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int in[2], out[2], stop[2];
    ASSERT_EQ(pipe2(in, O_CLOEXEC), 0);
    ASSERT_EQ(pipe2(out, O_CLOEXEC), 0);
    ASSERT_EQ(pipe2(stop, O_CLOEXEC), 0);
    server_in_.reset(in[0]);
    to_server_.reset(in[1]);
    from_server_.reset(out[0]);
    server_out_.reset(out[1]);
    stop_read_.reset(stop[0]);
    stop_write_.reset(stop[1]);
    StdioOptions options;
    options.in_fd = server_in_.get();
    options.out_fd = server_out_.get();
    options.stop_fd = stop_read_.get();
    served_ = std::async(std::launch::async, [this, options] { return ServeStdio(server_, options); });
    Send(R"({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18"}})");
    ASSERT_EQ(Receive()["id"], 0);
  }
  void TearDown() override {
    to_server_.reset();  // EOF
    if (served_.valid()) served_.wait();
  }

  void Send(const std::string& text) {
    std::string line = text + "\n";
    for (std::size_t done = 0; done < line.size();) {
      ssize_t n = ::write(to_server_.get(), line.data() + done, line.size() - done);
      ASSERT_GT(n, 0);
      done += static_cast<std::size_t>(n);
    }
  }

  // The next line from the server (waits at most 20 s).
  Json Receive() {
    for (;;) {
      if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
        Json m = Json::parse(buffer_.substr(0, nl));
        buffer_.erase(0, nl + 1);
        return m;
      }
      pollfd p{from_server_.get(), POLLIN, 0};
      if (::poll(&p, 1, 20000) <= 0) return Json("timeout");
      char buf[65536];
      ssize_t n = ::read(from_server_.get(), buf, sizeof buf);
      if (n <= 0) return Json("eof");
      buffer_.append(buf, static_cast<std::size_t>(n));
    }
  }

  BlockingSession session_;
  Server server_{session_, ServerOptions{}};
  UniqueFd server_in_, to_server_, from_server_, server_out_, stop_read_, stop_write_;
  std::future<Result<StdioEnd>> served_;
  std::string buffer_;
};

TEST_F(StdioTest, PingIsAnsweredWhileACallRunsAndCancellationEndsIt) {
  Send(R"({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"bash","arguments":{"command":"block"}}})");
  Send(R"({"jsonrpc":"2.0","id":2,"method":"ping"})");
  EXPECT_EQ(Receive()["id"], 2);
  Send(R"({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}})");
  // The cancelled call gets no response: the next line answers the next request.
  Send(R"({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"bash","arguments":{"command":"after"}}})");
  Json next = Receive();
  EXPECT_EQ(next["id"], 3);
  EXPECT_EQ(next["result"]["content"][0]["text"], "after");
}

TEST_F(StdioTest, AnOversizedLineIsAnsweredAndTheServerGoesOn) {
  std::string huge = R"({"jsonrpc":"2.0","id":9,"method":"ping","params":{"pad":")" +
                     std::string(10 * 1024 * 1024, 'x') + R"("}})";
  std::thread writer([&] { Send(huge); });
  Json r = Receive();
  writer.join();
  EXPECT_EQ(r["error"]["code"], kInvalidRequest);
  EXPECT_TRUE(r["id"].is_null());
  Send(R"({"jsonrpc":"2.0","id":10,"method":"ping"})");
  EXPECT_EQ(Receive()["id"], 10);
}

TEST_F(StdioTest, MalformedLinesAndBlankLines) {
  Send("{oops");
  EXPECT_EQ(Receive()["error"]["code"], kParseError);
  Send("   ");
  Send("\r");
  Send(R"({"jsonrpc":"2.0","id":11,"method":"ping"})" "\r");  // CRLF line ends are accepted
  EXPECT_EQ(Receive()["id"], 11);
}

TEST_F(StdioTest, EofLetsCallsInFlightFinishAndAnswer) {
  Send(R"({"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"bash","arguments":{"command":"last"}}})");
  to_server_.reset();
  Json r = Receive();
  EXPECT_EQ(r["id"], 12);
  auto end = served_.get();
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(*end, StdioEnd::kEof);
}

TEST_F(StdioTest, StopCancelsCallsInFlight) {
  Send(R"({"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"bash","arguments":{"command":"block"}}})");
  Send(R"({"jsonrpc":"2.0","id":14,"method":"ping"})");
  EXPECT_EQ(Receive()["id"], 14);  // the call has been read
  ASSERT_EQ(::write(stop_write_.get(), "x", 1), 1);
  auto end = served_.get();
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(*end, StdioEnd::kStopped);
}

}  // namespace
}  // namespace agentbox::mcp
