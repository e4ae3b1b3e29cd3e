// Session terminals, measured in one run: a keystroke's round trip (key in,
// its echo out) through a real `agentbox serve` — WebSocket over the unix
// socket, the daemon, the pty master it holds, the sandbox's pty and an
// interactive bash's line editor — next to the same bash on a host pty read
// and written directly (the anchor: no daemon, no sandbox, no WebSocket).
// Prints p50/p99 and the ratio; asserts nothing.
//
//   terminal_bench [--keys N]      (default 500)
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_net.h"
#include "daemon/client.h"

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using agentbox::bench::Percentile;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "terminal_bench: %s\n", what.c_str());
  std::exit(1);
}

std::string MakeTemp(const std::string& prefix) {
  std::string t = std::string(getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp") + "/" + prefix + "XXXXXX";
  if (!mkdtemp(t.data())) Die("mkdtemp");
  return t;
}

// Types `keys` times 'a' then a backspace; times each 'a' to its echo.
// First a prompt with neither of the two in it, and everything up to it read.
template <class SendFn, class ReadFn>
std::vector<double> Keystrokes(int keys, SendFn send, ReadFn read_until) {
  send("PS1='$ '; echo syn$((1+1))\r");
  if (!read_until("syn2\r\n") || !read_until("$ ")) Die("no prompt");
  std::vector<double> ms;
  for (int i = 0; i < keys; ++i) {
    auto t0 = Clock::now();
    send("a");
    if (!read_until("a")) Die("no echo of a keystroke");
    ms.push_back(Ms(Clock::now() - t0));
    send("\x7f");
    if (!read_until("\b")) Die("no echo of a backspace");
  }
  return ms;
}

std::vector<double> HostPty(int keys) {
  int master = -1;
  struct winsize size {};
  size.ws_col = 200;
  size.ws_row = 50;
  pid_t pid = forkpty(&master, nullptr, nullptr, &size);
  if (pid < 0) Die("forkpty");
  if (pid == 0) {
    execl("/bin/bash", "bash", "--norc", "--noprofile", "-i", static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string seen;
  auto read_until = [&](const std::string& needle) {
    for (;;) {
      if (auto at = seen.find(needle); at != std::string::npos) {
        seen.erase(0, at + needle.size());
        return true;
      }
      struct pollfd p = {master, POLLIN, 0};
      if (poll(&p, 1, 5000) <= 0) return false;
      char buf[4096];
      ssize_t n = read(master, buf, sizeof(buf));
      if (n <= 0) return false;
      seen.append(buf, static_cast<size_t>(n));
    }
  };
  auto send = [&](const char* s) { (void)!write(master, s, std::strlen(s)); };
  auto ms = Keystrokes(keys, send, read_until);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  close(master);
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  int keys = 500;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--keys") keys = std::atoi(argv[i + 1]);
  }
  const std::string root = MakeTemp("agentbox-terminal-bench-");
  const std::string state = root + "/state", ws = root + "/ws", sock = root + "/state/agentbox.sock";
  mkdir(ws.c_str(), 0755);
  pid_t daemon_pid = fork();
  if (daemon_pid == 0) {
    setpgid(0, 0);
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    execl(AGENTBOX_BIN, AGENTBOX_BIN, "serve", "--state-dir", state.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  agentbox::daemon::Endpoint ep;
  ep.unix_socket = sock;
  agentbox::daemon::Client client(ep);
  bool up = false;
  for (int i = 0; i < 200 && !up; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto r = client.Call("GET", "/v1/health", "");
    up = r.ok() && r->status == 200;
  }
  if (!up) Die("the daemon did not start");
  auto created = client.Call("POST", "/v1/sessions", json{{"workspace", ws}}.dump());
  if (!created.ok() || created->status != 201) Die("session create failed");
  const std::string id = json::parse(created->body)["id"].get<std::string>();
  const auto open_started = Clock::now();
  auto pty = client.Call("POST", "/v1/sessions/" + id + "/ptys",
                            json{{"argv", {"bash", "--norc", "--noprofile", "-i"}}, {"cols", 200}, {"rows", 50}}.dump());
  if (!pty.ok() || pty->status != 201) Die("terminal open failed: " + (pty.ok() ? pty->body : pty.status().ToString()));
  const double open_ms = Ms(Clock::now() - open_started);
  const std::string tid = json::parse(pty->body)["id"].get<std::string>();

  asio::io_context io;
  websocket::stream<asio::local::stream_protocol::socket> wsock(io);
  wsock.next_layer().connect(asio::local::stream_protocol::endpoint(sock));
  struct timeval tv {5, 0};
  setsockopt(wsock.next_layer().native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const auto attach_started = Clock::now();
  wsock.handshake("localhost", "/v1/sessions/" + id + "/ptys/" + tid);
  const double attach_ms = Ms(Clock::now() - attach_started);
  wsock.binary(true);
  std::string seen;
  auto read_until = [&](const std::string& needle) {
    for (;;) {
      if (auto at = seen.find(needle); at != std::string::npos) {
        seen.erase(0, at + needle.size());
        return true;
      }
      beast::flat_buffer buf;
      beast::error_code ec;
      wsock.read(buf, ec);
      if (ec) return false;
      if (wsock.got_binary()) seen += beast::buffers_to_string(buf.data());
    }
  };
  auto send = [&](const char* s) { wsock.write(asio::buffer(s, std::strlen(s))); };
  std::vector<double> boxed = Keystrokes(keys, send, read_until);
  beast::error_code ignored;
  wsock.close(websocket::close_code::normal, ignored);
  std::vector<double> host = HostPty(keys);

  // The daemon is stopped next either way; a failed delete is only said.
  if (auto deleted = client.Call("DELETE", "/v1/sessions/" + id, ""); !deleted.ok()) {
    std::fprintf(stderr, "terminal_bench: deleting session %s: %s\n", id.c_str(), deleted.status().ToString().c_str());
  }
  kill(daemon_pid, SIGTERM);
  waitpid(daemon_pid, nullptr, 0);
  std::string rm = "rm -rf '" + root + "'";
  (void)!std::system(rm.c_str());

  const double bp50 = Percentile(boxed, 0.50), hp50 = Percentile(host, 0.50);
  std::printf("%-58s %6s %9s %9s\n", "keystroke to echo (interactive bash)", "n", "p50 ms", "p99 ms");
  std::printf("%-58s %6zu %9.3f %9.3f\n", "session terminal: WebSocket > daemon > sandbox pty", boxed.size(), bp50,
              Percentile(boxed, 0.99));
  std::printf("%-58s %6zu %9.3f %9.3f\n", "anchor: host pty, read and written directly", host.size(), hp50,
              Percentile(host, 0.99));
  std::printf("ratio p50: %.2fx   (+%.3f ms)\n", hp50 > 0 ? bp50 / hp50 : 0.0, bp50 - hp50);
  std::printf("terminal open (warm world): %.1f ms; WebSocket attach: %.1f ms\n", open_ms, attach_ms);
  return 0;
}
