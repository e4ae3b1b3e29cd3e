// Round trip of one warm `bash "true"` call, three ways, in the same run:
//   1. MCP over stdio: tools/call to `agentbox mcp` (one line out, one in);
//   2. MCP over the daemon's /mcp (Streamable HTTP, unix socket);
//   3. the daemon's own API: POST /v1/sessions/{id}/execute (unix socket).
// Each on a warm session (the sandbox provisioned by warm-up calls), one
// keep-alive connection for HTTP. Prints p50/p90/p99 in ms; asserts nothing
// (targets live in the issue notes, not in tests).
//
//   mcp_bench [ROUNDS]      (default 300)
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;
namespace http = boost::beast::http;
using boost::asio::local::stream_protocol;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kWarmup = 20;

struct Child {
  pid_t pid = -1;
  int in = -1;   // its stdin
  int out = -1;  // its stdout
};

Child Spawn(const std::vector<std::string>& argv, bool pipes) {
  int to[2], from[2];
  if (pipes && (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0)) throw std::runtime_error("pipe2");
  pid_t pid = fork();
  if (pid == 0) {
    if (pipes) {
      dup2(to[0], 0);
      dup2(from[1], 1);
    }
    int null = open("/dev/null", O_WRONLY);
    dup2(null, 2);  // the server's log
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  Child c;
  c.pid = pid;
  if (pipes) {
    close(to[0]);
    close(from[1]);
    c.in = to[1];
    c.out = from[0];
  }
  return c;
}

void Wait(Child& c) {
  int status = 0;
  waitpid(c.pid, &status, 0);
}

struct Stats {
  double p50, p90, p99, mean;
};

Stats Summarise(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) { return ms[std::min(ms.size() - 1, static_cast<std::size_t>(q * ms.size()))]; };
  double sum = 0;
  for (double v : ms) sum += v;
  return {at(0.5), at(0.9), at(0.99), sum / ms.size()};
}

// --- stdio ---------------------------------------------------------------

class StdioClient {
 public:
  explicit StdioClient(Child c) : c_(c) {}
  Json Call(const Json& request) {
    std::string line = request.dump() + "\n";
    if (write(c_.in, line.data(), line.size()) != static_cast<ssize_t>(line.size())) throw std::runtime_error("write");
    for (;;) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        Json m = Json::parse(buf_.substr(0, nl));
        buf_.erase(0, nl + 1);
        if (m.contains("id") && m["id"] == request["id"]) return m;
        continue;  // a notification
      }
      char chunk[65536];
      ssize_t n = read(c_.out, chunk, sizeof chunk);
      if (n <= 0) throw std::runtime_error("agentbox mcp closed its stdout");
      buf_.append(chunk, static_cast<std::size_t>(n));
    }
  }

 private:
  Child c_;
  std::string buf_;
};

Json ToolsCall(int id) {
  return {{"jsonrpc", "2.0"},
          {"id", id},
          {"method", "tools/call"},
          {"params", {{"name", "bash"}, {"arguments", {{"command", "true"}}}}}};
}

std::vector<double> BenchStdio(const std::string& bin, const std::string& ws, const std::string& state, int rounds) {
  Child c = Spawn({bin, "mcp", "--workspace", ws, "--state-dir", state}, true);
  StdioClient client(c);
  client.Call({{"jsonrpc", "2.0"},
               {"id", 0},
               {"method", "initialize"},
               {"params", {{"protocolVersion", "2025-06-18"}, {"capabilities", Json::object()}}}});
  int id = 1;
  for (int i = 0; i < kWarmup; ++i) {
    Json r = client.Call(ToolsCall(id++));
    if (r["result"].value("isError", true)) throw std::runtime_error("stdio warm-up call failed: " + r.dump());
  }
  std::vector<double> ms;
  for (int i = 0; i < rounds; ++i) {
    auto t0 = Clock::now();
    client.Call(ToolsCall(id++));
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  close(c.in);  // EOF: clean shutdown
  close(c.out);
  Wait(c);
  return ms;
}

// --- HTTP over the daemon's unix socket ----------------------------------

class HttpClient {
 public:
  explicit HttpClient(const std::string& socket_path) : socket_(io_) {
    socket_.connect(stream_protocol::endpoint(socket_path));
  }
  http::response<http::string_body> Post(const std::string& target, const std::string& body,
                                         const std::vector<std::pair<std::string, std::string>>& headers = {}) {
    http::request<http::string_body> req{http::verb::post, target, 11};
    req.set(http::field::host, "localhost");
    req.set(http::field::content_type, "application/json");
    req.set(http::field::accept, "application/json, text/event-stream");
    for (const auto& [k, v] : headers) req.set(k, v);
    req.body() = body;
    req.prepare_payload();
    http::write(socket_, req);
    http::response<http::string_body> res;
    http::read(socket_, buffer_, res);
    return res;
  }

 private:
  boost::asio::io_context io_;
  stream_protocol::socket socket_;
  boost::beast::flat_buffer buffer_;
};

double Time(const std::function<void()>& f) {
  auto t0 = Clock::now();
  f();
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct DaemonFigures {
  std::vector<double> api;
  std::vector<double> mcp;
};

DaemonFigures BenchDaemon(const std::string& bin, const std::string& ws, const std::string& state, int rounds) {
  const std::string sock = state + "/bench.sock";
  Child d = Spawn({bin, "serve", "--state-dir", state, "--socket", sock}, false);
  for (int i = 0; i < 300 && !fs::exists(sock); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  DaemonFigures out;
  try {
    HttpClient api(sock);
    auto created = api.Post("/v1/sessions", Json{{"workspace", ws}}.dump());
    if (created.result_int() != 201) throw std::runtime_error("POST /v1/sessions: " + created.body());
    const std::string id = Json::parse(created.body())["id"];
    const std::string target = "/v1/sessions/" + id + "/execute";
    const std::string body = Json{{"name", "bash"}, {"input", {{"command", "true"}}}}.dump();
    for (int i = 0; i < kWarmup; ++i) {
      auto r = api.Post(target, body);
      if (r.result_int() != 200) throw std::runtime_error("execute warm-up: " + r.body());
    }
    for (int i = 0; i < rounds; ++i) out.api.push_back(Time([&] { api.Post(target, body); }));

    HttpClient mcp(sock);
    auto init = mcp.Post("/mcp?session=" + id,
                         Json{{"jsonrpc", "2.0"},
                              {"id", 0},
                              {"method", "initialize"},
                              {"params", {{"protocolVersion", "2025-06-18"}, {"capabilities", Json::object()}}}}
                             .dump());
    const std::string sid(init["Mcp-Session-Id"]);
    if (init.result_int() != 200 || sid.empty()) throw std::runtime_error("POST /mcp initialize: " + init.body());
    const std::vector<std::pair<std::string, std::string>> h = {{"Mcp-Session-Id", sid},
                                                                {"MCP-Protocol-Version", "2025-06-18"}};
    int next = 1;
    for (int i = 0; i < kWarmup; ++i) mcp.Post("/mcp", ToolsCall(next++).dump(), h);
    for (int i = 0; i < rounds; ++i) out.mcp.push_back(Time([&] { mcp.Post("/mcp", ToolsCall(next++).dump(), h); }));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mcp_bench: daemon part failed: %s\n", e.what());
  }
  kill(d.pid, SIGTERM);
  Wait(d);
  return out;
}

void Row(const char* name, const std::vector<double>& ms) {
  if (ms.empty()) {
    std::printf("%-44s %s\n", name, "(not measured)");
    return;
  }
  Stats s = Summarise(ms);
  std::printf("%-44s %7.2f %7.2f %7.2f %7.2f\n", name, s.p50, s.p90, s.p99, s.mean);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 300;
  const std::string bin = std::getenv("AGENTBOX_BIN") ? std::getenv("AGENTBOX_BIN") : AGENTBOX_BIN;
  char tmpl[] = "/tmp/agentbox-mcp-bench.XXXXXX";
  if (!mkdtemp(tmpl)) return 1;
  const std::string root = tmpl;
  fs::create_directories(root + "/ws");
  std::ofstream(root + "/ws/README") << "bench\n";
  int rc = 0;
  try {
    auto stdio = BenchStdio(bin, root + "/ws", root + "/state-mcp", rounds);
    auto daemon = BenchDaemon(bin, root + "/ws", root + "/state-daemon", rounds);
    std::printf("warm bash \"true\", %d rounds after %d warm-up calls (ms)\n", rounds, kWarmup);
    std::printf("%-44s %7s %7s %7s %7s\n", "", "p50", "p90", "p99", "mean");
    Row("MCP stdio: tools/call (agentbox mcp)", stdio);
    Row("MCP HTTP: POST /mcp tools/call (daemon)", daemon.mcp);
    Row("daemon API: POST /v1/sessions/{id}/execute", daemon.api);
    if (!daemon.api.empty()) {
      std::printf("MCP stdio p50 / daemon API p50: %.2f\n", Summarise(stdio).p50 / Summarise(daemon.api).p50);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mcp_bench: %s\n", e.what());
    rc = 1;
  }
  fs::remove_all(root);
  return rc;
}
