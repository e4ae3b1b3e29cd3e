// Session terminals through the daemon: a pty inside the session's world,
// attached over a real WebSocket (Beast on the client side), resized,
// detached and attached again with its scrollback, killed with everything
// it started.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <optional>
#include <string>

#include "daemon_fixture.h"

namespace agentbox::session_test {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using e2e::Contains;
using e2e::TempDir;

// A WebSocket client on the daemon's unix socket; every read gives up after
// a few seconds (SO_RCVTIMEO), so a broken server fails the test, not hangs it.
class WsClient {
 public:
  bool Connect(const std::string& socket, const std::string& target, std::string* error) {
    try {
      ws_.next_layer().connect(asio::local::stream_protocol::endpoint(socket));
      struct timeval tv {5, 0};
      setsockopt(ws_.next_layer().native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      ws_.handshake("localhost", target);
      return true;
    } catch (const std::exception& e) {
      *error = e.what();
      return false;
    }
  }
  void SendBinary(const std::string& data) {
    ws_.binary(true);
    ws_.write(asio::buffer(data));
  }
  void SendText(const std::string& data) {
    ws_.binary(false);
    ws_.write(asio::buffer(data));
  }
  // Reads messages until the output holds `needle` (true), the socket
  // closes or `timeout_ms` passes. Text messages go to texts().
  bool ReadUntil(const std::string& needle, int timeout_ms = 15000) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!Contains(output_, needle)) {
      if (std::chrono::steady_clock::now() > until || closed_) return false;
      beast::flat_buffer buf;
      beast::error_code ec;
      ws_.read(buf, ec);
      if (ec == beast::error::timeout || ec == asio::error::would_block || ec == asio::error::try_again) continue;
      if (ec) {
        closed_ = true;
        close_reason_ = ws_.reason().reason.c_str();
        return Contains(output_, needle);
      }
      std::string data = beast::buffers_to_string(buf.data());
      if (ws_.got_binary()) {
        output_ += data;
      } else {
        texts_.push_back(json::parse(data, nullptr, false));
      }
    }
    return true;
  }
  // Reads until the server closes.
  void ReadToClose(int timeout_ms = 15000) { ReadUntil("\x01never\x02", timeout_ms); }
  void Close() {
    beast::error_code ec;
    ws_.close(websocket::close_code::normal, ec);
  }
  const std::string& output() const { return output_; }
  const std::vector<json>& texts() const { return texts_; }
  bool closed() const { return closed_; }

 private:
  asio::io_context io_;
  websocket::stream<asio::local::stream_protocol::socket> ws_{io_};
  std::string output_;
  std::vector<json> texts_;
  bool closed_ = false;
  std::string close_reason_;
};

class TerminalTest : public OneSessionTest {
 protected:
  std::string Ptys() const { return "/v1/sessions/" + id_ + "/ptys"; }
  // Opens a terminal; its id.
  std::string Open(const json& body = json::object()) {
    Answer a = Call(c(), "POST", Ptys(), body);
    EXPECT_EQ(a.status, 201) << a.text;
    return a.body.is_object() ? a.body.value("id", "") : "";
  }
  std::unique_ptr<WsClient> Attach(const std::string& pty, const std::string& query = "") {
    auto ws = std::make_unique<WsClient>();
    std::string error;
    EXPECT_TRUE(ws->Connect(d_.socket(), Ptys() + "/" + pty + query, &error)) << error;
    return ws;
  }
};

TEST_F(TerminalTest, AShellOnAPtyStreamsBothWays) {
  std::string pty = Open({{"cols", 80}, {"rows", 24}});
  ASSERT_FALSE(pty.empty());
  auto ws = Attach(pty);
  ws->SendBinary("echo hi-$((6*7)); tty; stty size; case $- in *m*) echo job-control-on;; esac\r");
  EXPECT_TRUE(ws->ReadUntil("job-control-on\r\n")) << ws->output();
  EXPECT_TRUE(Contains(ws->output(), "hi-42\r\n")) << ws->output();
  EXPECT_TRUE(Contains(ws->output(), "/dev/pts/")) << ws->output();
  EXPECT_TRUE(Contains(ws->output(), "24 80\r\n")) << ws->output();
  // The shell runs in the session's world: it sees the session's files.
  json w = Execute(c(), id_, "write_file", {{"path", "seen.txt"}, {"content", "from-the-tool"}});
  ASSERT_EQ(w.value("is_error", true), false) << w.dump();
  ws->SendBinary("cat seen.txt; echo\r");
  EXPECT_TRUE(ws->ReadUntil("from-the-tool\r\n")) << ws->output();
}

TEST_F(TerminalTest, ResizeReachesTheForegroundProgram) {
  std::string pty = Open();
  auto ws = Attach(pty);
  // A foreground program that waits for SIGWINCH and prints the new size.
  ws->SendBinary("sh -c 'trap \"echo winch-\\$(stty size | tr \\\" \\\" x); exit\" WINCH; echo armed; "
                 "while :; do sleep 0.05; done'\r");
  ASSERT_TRUE(ws->ReadUntil("armed\r\n")) << ws->output();
  ws->SendText(R"({"type":"resize","cols":132,"rows":43})");
  EXPECT_TRUE(ws->ReadUntil("winch-43x132\r\n")) << ws->output();
  ws->SendBinary("stty size\r");
  EXPECT_TRUE(ws->ReadUntil("43 132\r\n")) << ws->output();
  // Over HTTP too.
  Answer a = Call(c(), "POST", Ptys() + "/" + pty + "/resize", {{"cols", 90}, {"rows", 20}});
  EXPECT_EQ(a.status, 200) << a.text;
  EXPECT_EQ(a.body.value("cols", 0), 90) << a.text;
  Answer bad = Call(c(), "POST", Ptys() + "/" + pty + "/resize", {{"cols", 0}, {"rows", 20}});
  EXPECT_EQ(bad.status, 400) << bad.text;
}

TEST_F(TerminalTest, DetachKeepsItRunningAndReattachReplaysTheScrollback) {
  std::string pty = Open();
  {
    auto ws = Attach(pty);
    ws->SendBinary("echo first-$((40+2))\r");
    ASSERT_TRUE(ws->ReadUntil("first-42\r\n")) << ws->output();
    ws->Close();
  }
  // While nobody is attached: input over HTTP, output into the scrollback.
  Answer in = Call(c(), "POST", Ptys() + "/" + pty + "/input", {{"data", "echo while-detached-$((2*3))\r"}});
  ASSERT_EQ(in.status, 204) << in.text;
  Answer described = Call(c(), "GET", Ptys() + "/" + pty);
  ASSERT_EQ(described.status, 200) << described.text;
  EXPECT_EQ(described.body.value("running", false), true) << described.text;
  auto again = Attach(pty);
  EXPECT_TRUE(again->ReadUntil("while-detached-6\r\n")) << again->output();
  EXPECT_TRUE(Contains(again->output(), "first-42\r\n")) << again->output();
  // Without the scrollback: only what comes next.
  auto fresh = Attach(pty, "?scrollback=0");
  fresh->SendBinary("echo third\r");
  EXPECT_TRUE(fresh->ReadUntil("third\r\n")) << fresh->output();
  EXPECT_FALSE(Contains(fresh->output(), "first-42")) << fresh->output();
  // Listed in the session's description.
  Answer session = Call(c(), "GET", "/v1/sessions/" + id_);
  ASSERT_TRUE(session.body.contains("terminals")) << session.text;
  ASSERT_EQ(session.body["terminals"].size(), 1u) << session.text;
  EXPECT_EQ(session.body["terminals"][0].value("id", ""), pty) << session.text;
}

TEST_F(TerminalTest, ItsEndIsReportedWithTheExitStatus) {
  std::string pty = Open({{"command", "echo bye; exit 3"}});
  auto ws = Attach(pty);
  ws->ReadToClose();
  EXPECT_TRUE(Contains(ws->output(), "bye\r\n")) << ws->output();
  ASSERT_FALSE(ws->texts().empty()) << ws->output();
  EXPECT_EQ(ws->texts().back().value("type", ""), "exit") << ws->texts().back().dump();
  EXPECT_EQ(ws->texts().back().value("exit_code", -1), 3) << ws->texts().back().dump();
  Answer described = Call(c(), "GET", Ptys() + "/" + pty);
  EXPECT_EQ(described.body.value("running", true), false) << described.text;
  EXPECT_EQ(described.body.value("exit_code", -1), 3) << described.text;
  // A command that does not exist says so.
  std::string missing = Open({{"argv", {"no-such-command-here"}}});
  auto ws2 = Attach(missing);
  ws2->ReadToClose();
  ASSERT_FALSE(ws2->texts().empty()) << ws2->output();
  EXPECT_TRUE(Contains(ws2->texts().back().value("error", ""), "no-such-command-here")) << ws2->texts().back().dump();
}

TEST_F(TerminalTest, KillEndsEverythingItStarted) {
  std::string pty = Open();
  auto ws = Attach(pty);
  const std::string marker = "agentbox-pty-marker-" + e2e::RandomHex(4);
  ws->SendBinary("(exec -a " + marker + " sleep 1000) & disown; setsid bash -c 'exec -a " + marker +
                 "x sleep 1000' & echo started\r");
  ASSERT_TRUE(ws->ReadUntil("started\r\n")) << ws->output();
  // Both sleeps, by their argv[0]: the subshell that execs the first may be
  // later than the setsid one, and until `setsid` and `bash -c` have exec'd
  // the marker is in their arguments too.
  auto sleeps = [&] {
    int n = 0;
    for (pid_t pid : e2e::PidsWithCmdline(marker)) {
      n += e2e::ReadFile("/proc/" + std::to_string(pid) + "/cmdline").value_or("").rfind(marker, 0) == 0;
    }
    return n;
  };
  for (int i = 0; i < 50 && sleeps() < 2; ++i) usleep(100 * 1000);
  ASSERT_EQ(sleeps(), 2) << "the background sleeps did not start";
  Answer killed = Call(c(), "DELETE", Ptys() + "/" + pty);
  EXPECT_EQ(killed.status, 204) << killed.text;
  EXPECT_TRUE(e2e::WaitUntilNoProcess(marker, 10000)) << "a process the terminal started outlived it";
  ws->ReadToClose();
  EXPECT_TRUE(ws->closed());
  EXPECT_EQ(Call(c(), "GET", Ptys() + "/" + pty).status, 404);
  // The session goes on.
  EXPECT_EQ(Bash(c(), id_, "echo still").value("output", ""), "still\n");
}

TEST_F(TerminalTest, RemovingTheSessionEndsItsTerminals) {
  std::string pty = Open();
  auto ws = Attach(pty);
  const std::string marker = "agentbox-pty-rm-" + e2e::RandomHex(4);
  ws->SendBinary("exec -a " + marker + " sleep 1000\r");
  ASSERT_TRUE(ws->ReadUntil("sleep 1000")) << ws->output();
  for (int i = 0; i < 50 && e2e::PidsWithCmdline(marker).empty(); ++i) usleep(100 * 1000);
  ASSERT_FALSE(e2e::PidsWithCmdline(marker).empty());
  EXPECT_EQ(Call(c(), "DELETE", "/v1/sessions/" + id_).status, 204);
  EXPECT_TRUE(e2e::WaitUntilNoProcess(marker, 10000));
  ws->ReadToClose();
  EXPECT_TRUE(ws->closed());
}

TEST_F(TerminalTest, RequestsAreChecked) {
  Answer unknown = Call(c(), "POST", Ptys(), {{"shell", "zsh"}});
  EXPECT_EQ(unknown.status, 400) << unknown.text;
  EXPECT_TRUE(Contains(unknown.message(), "'shell'")) << unknown.text;
  Answer both = Call(c(), "POST", Ptys(), {{"command", "true"}, {"argv", {"true"}}});
  EXPECT_EQ(both.status, 400) << both.text;
  Answer escape = Call(c(), "POST", Ptys(), {{"cwd", "../.."}});
  EXPECT_EQ(escape.status, 400) << escape.text;
  Answer size = Call(c(), "POST", Ptys(), {{"cols", 5000}});
  EXPECT_EQ(size.status, 400) << size.text;
  EXPECT_EQ(Call(c(), "GET", Ptys() + "/t999").status, 404);
  EXPECT_EQ(Call(c(), "POST", "/v1/sessions/nope/ptys", json::object()).status, 404);
  // Attaching is a WebSocket or nothing: a plain GET describes.
  std::string pty = Open();
  Answer plain = Call(c(), "GET", Ptys() + "/" + pty);
  EXPECT_EQ(plain.status, 200) << plain.text;
  WsClient ws;
  std::string error;
  EXPECT_FALSE(ws.Connect(d_.socket(), Ptys() + "/t999", &error)) << "attached to a terminal that does not exist";
}

// Attack: TIOCSTI on the terminal's pty (the command's own controlling
// terminal) would type into the shell that reads it. Refused by the filter.
TEST_F(TerminalTest, TiocstiIsRefused) {
  if (access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "not applicable here: no /usr/bin/python3 on this host";
  std::string pty = Open();
  auto ws = Attach(pty);
  ws->SendBinary(
      "/usr/bin/python3 -c 'import fcntl,termios\ntry:\n fcntl.ioctl(0, termios.TIOCSTI, b\"x\"); print(\"inj\" \"ected\")\n"
      "except OSError as e: print(\"refu\" \"sed\", e.errno)'\r");
  EXPECT_TRUE(ws->ReadUntil("refused 1")) << ws->output();
  EXPECT_FALSE(Contains(ws->output(), "injected")) << ws->output();
}

}  // namespace
}  // namespace agentbox::session_test
