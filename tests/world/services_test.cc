// What outlives a call: background processes (their later output in the
// session's background log), services, and ports exposed on the host's
// loopback; all of it ends with the session's world.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "session/services.h"
#include "session/session.h"
#include "world_helpers.h"

namespace agentbox::session {
namespace {

using world_test::Bin;
using world_test::Children;
using world_test::Read;

constexpr const char* kPython = "/usr/bin/python3";

std::string MakeSvcTemp(const char* what) {
  std::string t = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/agentbox-svc-" + what + ".XXXXXX";
  return mkdtemp(t.data()) ? t : "";
}

// Connects to 127.0.0.1:port, sends `request`, returns everything until the
// peer closes (or 10 s pass); "" when the connection fails or is closed at once.
std::string Exchange(int port, const std::string& request) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    (void)!write(fd, request.data(), request.size());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    char buf[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      struct pollfd p = {fd, POLLIN, 0};
      if (poll(&p, 1, 200) <= 0) continue;
      ssize_t n = read(fd, buf, sizeof(buf));
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return out;
}

std::string HttpGet(int port, const std::string& path = "/") {
  return Exchange(port, "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
}

// Retries until `ok` holds (a server starting), up to 20 s.
template <class F>
bool Eventually(F ok) {
  for (int i = 0; i < 200; ++i) {
    if (ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// The local addresses of this network namespace's listening TCP sockets on `port`.
std::vector<std::string> ListeningAddresses(int port) {
  std::vector<std::string> out;
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::istringstream in(Read(table));
    std::string line;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, state;
      f >> sl >> local >> remote >> state;
      const auto colon = local.rfind(':');
      if (colon == std::string::npos || state != "0A") continue;  // LISTEN
      if (std::stoi(local.substr(colon + 1), nullptr, 16) == port) out.push_back(local.substr(0, colon));
    }
  }
  return out;
}

class ServicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(Bin().empty()) << "AGENTBOX_BIN must name the agentbox binary";
    state_ = MakeSvcTemp("state");
    base_ = MakeSvcTemp("base");
    ASSERT_FALSE(state_.empty());
    ASSERT_FALSE(base_.empty());
    ManagerOptions o;
    o.state_dir = state_;
    o.agentbox_exe = Bin();
    auto m = Manager::Open(o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    manager_ = std::move(*m);
    CreateRequest c;
    c.workspace = base_;
    auto id = manager_->Create(c);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    id_ = *id;
  }
  void TearDown() override {
    manager_.reset();
    system(("chmod -R u+rwx " + state_ + " 2>/dev/null; rm -rf " + state_ + " " + base_).c_str());
    EXPECT_TRUE(Children().empty()) << "a world's process outlived its Manager";
  }
  Json Bash(const std::string& command, Json extra = Json::object()) {
    extra["command"] = command;
    auto r = manager_->Execute(id_, "bash", extra);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : Json();
  }
  std::string BackgroundLog() { return Read(*manager_->BackgroundLogPath(id_)); }
  // The command lines of the processes inside, one a line.
  std::string ProcessesInside() {
    return Bash("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done")["output"];
  }
  Json StartService(const std::string& name, const std::string& command) {
    ServiceSpec spec;
    spec.name = name;
    spec.command = command;
    auto r = manager_->StartService(id_, spec);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : Json();
  }
  int Expose(int port) {
    bool created = false;
    auto r = manager_->ExposePort(id_, port, &created);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return 0;
    EXPECT_TRUE(created);
    EXPECT_EQ((*r)["host"], "127.0.0.1") << r->dump();
    EXPECT_EQ((*r)["inside_port"], port) << r->dump();
    return (*r)["port"].get<int>();
  }
  bool HavePython() {
    struct stat st {};
    return stat(kPython, &st) == 0;
  }

  std::string state_, base_, id_;
  std::unique_ptr<Manager> manager_;
};

// The call ends when its command does, with exactly what the command wrote
// up to then; what it left running writes to the background log.
TEST_F(ServicesTest, ACallEndsWithItsCommandAndTheBackgroundWritesToTheLog) {
  Json r = Bash("echo before; (sleep 0.5; echo from-the-background; sleep 1; echo later) & echo end");
  EXPECT_EQ(r["kind"], "exited") << r.dump();
  EXPECT_EQ(r["exit_code"], 0) << r.dump();
  EXPECT_EQ(r["output"], "before\nend\n") << r.dump();
  EXPECT_LT(r["duration_ms"].get<long>(), 1500) << "the call waited for its background: " << r.dump();
  EXPECT_TRUE(Eventually([&] { return BackgroundLog().find("from-the-background\nlater\n") != std::string::npos; }))
      << BackgroundLog();
  Json code = Bash("(sleep 0.2; echo quiet) & exit 3");
  EXPECT_EQ(code["exit_code"], 3) << code.dump();
  EXPECT_EQ(code["output"], "[exit code 3]") << code.dump();
}

// nohup, setsid and a plain & all outlive the call; a server started in one
// call answers in the next; its request log lands in the background log.
TEST_F(ServicesTest, ABackgroundServerAnswersTheNextCall) {
  if (!HavePython()) GTEST_SKIP() << "not applicable here: no " << kPython << " on this host";
  Json r = Bash(std::string(kPython) + " -u -m http.server 8000 --bind 127.0.0.1 & "
                "nohup sleep 1101 >/dev/null 2>&1 & setsid sleep 1102 & echo started");
  EXPECT_EQ(r["kind"], "exited") << r.dump();
  EXPECT_NE(r["output"].get<std::string>().find("started"), std::string::npos) << r.dump();
  Json fetch = Bash(std::string(kPython) +
                    " -c 'import time,urllib.request\n"
                    "for i in range(100):\n"
                    "  try:\n"
                    "    print(urllib.request.urlopen(\"http://127.0.0.1:8000/\").status); break\n"
                    "  except Exception: time.sleep(0.1)'");
  EXPECT_EQ(fetch["output"], "200\n") << fetch.dump();
  EXPECT_TRUE(Eventually([&] { return BackgroundLog().find("\"GET / HTTP/1.1\" 200") != std::string::npos; }))
      << BackgroundLog();
  const std::string ps = ProcessesInside();
  for (const char* alive : {"http.server", "sleep 1101", "sleep 1102"}) {
    EXPECT_NE(ps.find(alive), std::string::npos) << alive << " did not outlive its call:\n" << ps;
  }
}

// A cancelled call and a timed-out call take everything they started along.
TEST_F(ServicesTest, ACancelledOrTimedOutCallLeavesNothingBehind) {
  std::atomic<bool> cancel{false};
  std::atomic<bool> ready{false};
  std::thread canceller([&] {
    for (int i = 0; i < 300 && !ready; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cancel = true;
  });
  auto r = manager_->Execute(id_, "bash",
                             {{"command", "sleep 1201 & (setsid sleep 1202 &); nohup sleep 1203 >/dev/null 2>&1 & "
                                          "echo ready; sleep 60"}},
                             "", [&](std::string_view chunk) {
                               if (chunk.find("ready") != std::string_view::npos) ready = true;
                             },
                             &cancel);
  canceller.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)["kind"], "cancelled") << r->dump();
  Json t = Bash("sleep 1204 & (trap '' TERM; setsid sh -c 'trap \"\" TERM; exec sleep 1205' &); sleep 60",
                {{"timeout", 1}});
  EXPECT_EQ(t["kind"], "timed_out") << t.dump();
  const std::string ps = ProcessesInside();
  EXPECT_NE(ps.find("for p in"), std::string::npos) << ps;
  for (const char* gone : {"sleep 1201", "sleep 1202", "sleep 1203", "sleep 1204", "sleep 1205"}) {
    EXPECT_EQ(ps.find(gone), std::string::npos) << gone << " outlived its cancelled or timed-out call:\n" << ps;
  }
}

// Background processes end with the world.
TEST_F(ServicesTest, BackgroundProcessesEndWithTheSession) {
  Bash("sleep 1301 & echo x");
  EXPECT_NE(ProcessesInside().find("sleep 1301"), std::string::npos);
  ASSERT_TRUE(manager_->Remove(id_).ok());
  EXPECT_TRUE(Children().empty()) << "the world outlived its session";
}

// python3 -m http.server as a service, exposed, fetched from the host,
// restarted (the port keeps working), its logs read, stopped.
TEST_F(ServicesTest, AServiceExposedOnTheHostsLoopback) {
  if (!HavePython()) GTEST_SKIP() << "not applicable here: no " << kPython << " on this host";
  Bash("mkdir -p site && echo hello-from-inside > site/index.html");
  Json s = StartService("web", std::string(kPython) + " -u -m http.server 8080 --bind 127.0.0.1 --directory site");
  EXPECT_EQ(s["state"], "running") << s.dump();
  EXPECT_GT(s.value("pid", 0), 0) << s.dump();
  const int host_port = Expose(8080);
  ASSERT_GT(host_port, 0);
  std::string page;
  EXPECT_TRUE(Eventually([&] { return (page = HttpGet(host_port)).find("hello-from-inside") != std::string::npos; }))
      << page;
  EXPECT_EQ(page.rfind("HTTP/1.0 200", 0), 0u) << page;
  // Only the host's loopback, ever.
  const auto addresses = ListeningAddresses(host_port);
  ASSERT_FALSE(addresses.empty());
  for (const auto& a : addresses) EXPECT_EQ(a, "0100007F") << "the bridge listens on more than 127.0.0.1";

  Json d = *manager_->Describe(id_);
  ASSERT_EQ(d["services"].size(), 1u) << d.dump();
  EXPECT_EQ(d["services"][0]["name"], "web");
  ASSERT_EQ(d["ports"].size(), 1u) << d.dump();
  EXPECT_EQ(d["ports"][0]["port"], host_port);

  auto restarted = manager_->RestartService(id_, "web");
  ASSERT_TRUE(restarted.ok()) << restarted.status().ToString();
  EXPECT_EQ((*restarted)["restarts"], 1) << restarted->dump();
  EXPECT_EQ((*restarted)["state"], "running") << restarted->dump();
  EXPECT_NE((*restarted)["pid"], s["pid"]) << restarted->dump();
  EXPECT_TRUE(Eventually([&] { return (page = HttpGet(host_port)).find("hello-from-inside") != std::string::npos; }))
      << "the port stopped working after the restart: " << page;

  const std::string logs = Read(*manager_->ServiceLogPath(id_, "web"));
  EXPECT_NE(logs.find("Serving HTTP on 127.0.0.1 port 8080"), std::string::npos) << logs;
  EXPECT_NE(logs.find("\"GET / HTTP/1.0\" 200"), std::string::npos) << logs;

  auto stopped = manager_->StopService(id_, "web", false);
  ASSERT_TRUE(stopped.ok());
  EXPECT_EQ((*stopped)["state"], "exited") << stopped->dump();
  EXPECT_EQ((*stopped)["stopped"], true) << stopped->dump();
  EXPECT_EQ(ProcessesInside().find("http.server"), std::string::npos);
  ASSERT_TRUE(manager_->UnexposePort(id_, 8080).ok());
  EXPECT_TRUE(ListeningAddresses(host_port).empty()) << "the bridge still listens after its removal";
  EXPECT_EQ(manager_->UnexposePort(id_, 8080).stage(), kNotFound);
}

TEST_F(ServicesTest, ServiceNamesAreCheckedAndUnique) {
  for (const char* bad : {"", "../x", "a/b", ".hidden", "-x", "sp ace"}) {
    ServiceSpec spec;
    spec.name = bad;
    spec.command = "sleep 1";
    auto r = manager_->StartService(id_, spec);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().stage(), kBadRequest) << bad;
  }
  ServiceSpec bad_env;
  bad_env.name = "e";
  bad_env.command = "true";
  bad_env.env = {{"1X", "v"}};
  EXPECT_EQ(manager_->StartService(id_, bad_env).status().stage(), kBadRequest);
  Json first = StartService("sleeper", "echo \"$GREETING\"; exec sleep 1401");
  EXPECT_EQ(first["state"], "running") << first.dump();
  ServiceSpec dup;
  dup.name = "sleeper";
  dup.command = "true";
  auto again = manager_->StartService(id_, dup);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().stage(), kConflict);
  ServiceSpec env;
  env.name = "env";
  env.command = "echo \"greeting=$GREETING\" in $PWD";
  env.cwd = "sub";
  env.env = {{"GREETING", "it's me"}};
  Bash("mkdir -p sub");
  auto e = manager_->StartService(id_, env);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_TRUE(Eventually([&] { return (*manager_->ServiceStatus(id_, "env"))["state"] == "exited"; }));
  Json st = *manager_->ServiceStatus(id_, "env");
  EXPECT_EQ(st["exit_code"], 0) << st.dump();
  EXPECT_EQ(st["stopped"], false) << st.dump();
  EXPECT_NE(Read(*manager_->ServiceLogPath(id_, "env")).find("greeting=it's me in "), std::string::npos);
  EXPECT_NE(Read(*manager_->ServiceLogPath(id_, "env")).find("/sub\n"), std::string::npos);
  // Deleted, its name is free again.
  ASSERT_TRUE(manager_->StopService(id_, "sleeper", true).ok());
  EXPECT_EQ(manager_->ServiceStatus(id_, "sleeper").status().stage(), kNotFound);
  EXPECT_EQ(ProcessesInside().find("sleep 1401"), std::string::npos);
  EXPECT_EQ(StartService("sleeper", "exec sleep 1402")["state"], "running");
}

// Services and ports end with the world.
TEST_F(ServicesTest, ServicesAndPortsEndWithTheSession) {
  StartService("long", "exec sleep 1501");
  Bash("true");
  const int host_port = Expose(9);
  ASSERT_GT(host_port, 0);
  ASSERT_TRUE(manager_->Remove(id_).ok());
  EXPECT_TRUE(Children().empty()) << "a service outlived its session";
  EXPECT_TRUE(ListeningAddresses(host_port).empty()) << "a port outlived its session";
}

// A connection to the exposed host port reaches that port inside and no
// other; nothing inside can use the bridge (or anything else) to reach the host.
TEST_F(ServicesTest, ThePortBridgeReachesOnlyItsPortAndNothingInsideReachesTheHost) {
  if (!HavePython()) GTEST_SKIP() << "not applicable here: no " << kPython << " on this host";
  auto server = [](int port, const char* name) {
    return std::string(kPython) +
           " -c 'import socket\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
           "s.bind((\"127.0.0.1\", " + std::to_string(port) + ")); s.listen(8)\n"
           "while True:\n  c,_=s.accept(); c.recv(100); c.sendall(b\"" + name + "\"); c.close()'";
  };
  StartService("a", server(8201, "server-a"));
  StartService("b", server(8202, "server-b"));
  const int host_port = Expose(8201);
  ASSERT_GT(host_port, 0);
  std::string got;
  ASSERT_TRUE(Eventually([&] { return (got = Exchange(host_port, "hi")) == "server-a"; })) << got;
  // Whatever the client sends, it is data for that one port: no protocol of
  // the bridge's picks another.
  for (const std::string& attempt : {std::string("CONNECT 127.0.0.1:8202 HTTP/1.1\r\n\r\n"),
                                     std::string("\x05\x01\x00", 3), std::string("8202\n")}) {
    EXPECT_EQ(Exchange(host_port, attempt), "server-a");
  }
  // A port nobody listens on inside: the connection closes, nothing else answers.
  const int dead_port = Expose(8203);
  EXPECT_EQ(Exchange(dead_port, "hi"), "");

  // A server of the host's on its loopback, and the bridge's own port: neither
  // is reachable from inside (the sandbox's loopback is its own).
  int host_server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(host_server, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(host_server, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(host_server, 4), 0);
  socklen_t len = sizeof(a);
  getsockname(host_server, reinterpret_cast<sockaddr*>(&a), &len);
  const int host_server_port = ntohs(a.sin_port);
  const std::string probe = std::string(kPython) +
                            " -c 'import socket,sys\nfor p in sys.argv[1:]:\n"
                            "  s=socket.socket(); s.settimeout(3)\n"
                            "  try:\n    s.connect((\"127.0.0.1\", int(p))); print(p, \"reached\")\n"
                            "  except Exception as e: print(p, \"refused\")' " +
                            std::to_string(host_port) + " " + std::to_string(host_server_port);
  Json r = Bash(probe);
  EXPECT_EQ(r["output"], std::to_string(host_port) + " refused\n" + std::to_string(host_server_port) + " refused\n")
      << r.dump();
  // The host's server saw no connection.
  struct pollfd p = {host_server, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0) << "a process inside reached the host's loopback";
  close(host_server);
}

// A service's log and the background log stop at 64 MiB, with a marker:
// a chatty process does not fill the state directory's disk.
TEST_F(ServicesTest, LogsAreCapped) {
  constexpr long kCap = 64L << 20;
  ServiceSpec spec;
  spec.name = "chatty";
  spec.command = "head -c 70000000 /dev/zero | tr '\\0' x";
  ASSERT_TRUE(manager_->StartService(id_, spec).ok());
  EXPECT_TRUE(Eventually([&] { return (*manager_->ServiceStatus(id_, "chatty"))["state"] == "exited"; }));
  struct stat st {};
  ASSERT_EQ(stat(manager_->ServiceLogPath(id_, "chatty")->c_str(), &st), 0);
  EXPECT_LE(st.st_size, kCap + 200);
  EXPECT_GT(st.st_size, kCap / 2);
  EXPECT_NE(Read(*manager_->ServiceLogPath(id_, "chatty")).find("[agentbox: the service's log is full (64 MiB)"),
            std::string::npos);
  Bash("(sleep 0.2; head -c 70000000 /dev/zero | tr '\\0' y) & true");
  const std::string marker = "[agentbox: background log full (64 MiB); later output dropped]";
  EXPECT_TRUE(Eventually([&] { return BackgroundLog().find(marker) != std::string::npos; }));
  // The writer is not stalled on a full pipe: it ends.
  EXPECT_TRUE(Eventually([&] { return ProcessesInside().find("head -c") == std::string::npos; }));
  ASSERT_EQ(stat(manager_->BackgroundLogPath(id_)->c_str(), &st), 0);
  EXPECT_LE(st.st_size, kCap + 65536 + 200);
}

}  // namespace
}  // namespace agentbox::session
