// run_code through the daemon's API: programs that call the session's tools
// as functions, each in a fresh process of the session's world, with no
// network of their own even where bash has one; and hostile programs.
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>

#include "daemon_fixture.h"
#include "host_facts.h"
#include "upstream.h"

namespace agentbox::session_test {
namespace {

using e2e::Contains;
using e2e::TempDir;

class CodeModeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access("/usr/bin/python3", X_OK) != 0 && access("/bin/python3", X_OK) != 0) {
      GTEST_SKIP() << "not applicable here: python3 is not installed on the read-only system";
    }
    ASSERT_TRUE(d_.Start()) << d_.error();
  }
  daemon::Client& c() { return d_.client(); }
  json Run(const std::string& id, const std::string& language, const std::string& code,
           const std::string& call_id = "", const json& extra = json::object()) {
    json input = {{"language", language}, {"code", code}};
    for (const auto& [k, v] : extra.items()) input[k] = v;
    return Execute(c(), id, "run_code", input, call_id);
  }
  static bool HasNode() { return access("/usr/bin/node", X_OK) == 0 || access("/bin/node", X_OK) == 0; }
  std::vector<json> Log(const std::string& id) {
    Answer a = Call(c(), "GET", "/v1/sessions/" + id + "/log");
    std::vector<json> out;
    size_t start = 0;
    while (start < a.text.size()) {
      size_t nl = a.text.find('\n', start);
      if (nl == std::string::npos) nl = a.text.size();
      json line = json::parse(a.text.substr(start, nl - start), nullptr, false);
      if (line.is_object()) out.push_back(line);
      start = nl + 1;
    }
    return out;
  }

  TempDir ws_{"agentbox-code-ws-"};
  Daemon d_;
};

TEST_F(CodeModeTest, APythonProgramCallsTheToolsAsFunctionsAndItsLastExpressionIsTheResult) {
  const std::string id = CreateSession(c(), ws_.path());
  ASSERT_EQ(Bash(c(), id, "printf 'alpha\\nbeta\\ngamma\\n' > words.txt && mkdir sub && touch sub/a.py sub/b.py")
                .value("exit_code", -1), 0);
  json r = Run(id, "python",
               "import tools\n"
               "text = await tools.read_file('words.txt')\n"
               "files = await tools.glob(pattern='sub/*.py')\n"
               "await tools.write_file(path='out.txt', content=text.upper())\n"
               "print('lines:', len(text.splitlines()))\n"
               "{'files': files.split(), 'first': text.split()[0]}\n",
               "code-1");
  ASSERT_EQ(r.value("kind", ""), "exited") << r.dump(2);
  EXPECT_EQ(r.value("exit_code", -1), 0) << r.dump(2);
  EXPECT_FALSE(r.value("is_error", true)) << r.dump(2);
  EXPECT_EQ(r["result"], json({{"files", {"sub/a.py", "sub/b.py"}}, {"first", "alpha"}})) << r.dump(2);
  EXPECT_TRUE(Contains(r.value("output", ""), "lines: 3\n")) << r.dump(2);
  EXPECT_TRUE(Contains(r.value("output", ""), "\"first\":\"alpha\"")) << r.dump(2);
  EXPECT_EQ(r.value("tool_calls", 0), 3) << r.dump(2);
  // The write went where bash sees it: one world.
  EXPECT_EQ(Bash(c(), id, "cat out.txt").value("output", ""), "ALPHA\nBETA\nGAMMA\n");
  // The program's calls are in the log as children of its call.
  int children = 0;
  for (const json& line : Log(id)) {
    if (line.value("type", "") != "call" || !line.contains("parent")) continue;
    EXPECT_EQ(line["parent"].value("call_id", ""), "code-1") << line.dump();
    EXPECT_TRUE(Contains(line.value("call_id", ""), "code-1#")) << line.dump();
    ++children;
  }
  EXPECT_EQ(children, 3);
}

TEST_F(CodeModeTest, AJavaScriptProgramDoesTheSameWithAwaitAndReturn) {
  if (!HasNode()) GTEST_SKIP() << "not applicable here: node is not installed on the read-only system";
  const std::string id = CreateSession(c(), ws_.path());
  ASSERT_EQ(Bash(c(), id, "printf 'one\\ntwo\\n' > n.txt").value("exit_code", -1), 0);
  json r = Run(id, "javascript",
               "const text = await tools.read_file({path: 'n.txt'});\n"
               "console.log('read', text.length);\n"
               "return text.trim().split('\\n').map((l) => l.length);\n");
  ASSERT_EQ(r.value("kind", ""), "exited") << r.dump(2);
  EXPECT_EQ(r["result"], json({3, 3})) << r.dump(2);
  EXPECT_TRUE(Contains(r.value("output", ""), "read 8\n[3,3]")) << r.dump(2);
  // Without a top-level await, the last expression is the result.
  json plain = Run(id, "javascript", "const xs = [1, 2, 3];\nxs.reduce((a, b) => a + b, 0)\n");
  EXPECT_EQ(plain["result"], 6) << plain.dump(2);
}

TEST_F(CodeModeTest, EveryProgramIsAFreshProcessAndWhatItLeavesRunningDies) {
  const std::string id = CreateSession(c(), ws_.path());
  json first = Run(id, "python",
                   "import os, subprocess, builtins\n"
                   "builtins.leftover = 'state'\n"
                   "subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
                   "if os.fork() == 0:\n"
                   "    os.setsid()\n"
                   "    os.execvp('sleep', ['sleep', '601'])\n"
                   "os.getpid()\n");
  ASSERT_EQ(first.value("kind", ""), "exited") << first.dump(2);
  json second = Run(id, "python", "import os, builtins\n[os.getpid(), hasattr(builtins, 'leftover')]\n");
  ASSERT_EQ(second.value("kind", ""), "exited") << second.dump(2);
  EXPECT_NE(second["result"][0], first["result"]) << "the same process ran both programs";
  EXPECT_EQ(second["result"][1], false) << "the second program saw the first one's state";
  // Nothing the first program started outlived it, however it left.
  EXPECT_EQ(Bash(c(), id, "ps -eo args | grep -c '^sleep 60[01]' || true").value("output", ""), "0\n");
}

TEST_F(CodeModeTest, ErrorsCarryATracebackWithTheProgramsOwnLineNumbers) {
  const std::string id = CreateSession(c(), ws_.path());
  json r = Run(id, "python", "x = 1\n\ndef f(v):\n    return v / 0\n\nf(x)\n");
  EXPECT_EQ(r.value("kind", ""), "exited") << r.dump(2);
  EXPECT_EQ(r.value("exit_code", -1), 1) << r.dump(2);
  EXPECT_TRUE(r.value("is_error", false));
  ASSERT_TRUE(r["error"].is_object()) << r.dump(2);
  EXPECT_EQ(r["error"].value("type", ""), "ZeroDivisionError");
  EXPECT_EQ(r["error"].value("line", 0), 4) << r.dump(2);
  const std::string tb = r["error"].value("traceback", "");
  EXPECT_TRUE(Contains(tb, "line 6")) << tb;
  EXPECT_TRUE(Contains(tb, "return v / 0")) << tb;
  EXPECT_FALSE(Contains(tb, "_main")) << "the prelude's frames are not the program's: " << tb;
  EXPECT_TRUE(Contains(r.value("output", ""), "ZeroDivisionError")) << r.dump(2);
  // A syntax error names its line too; a failed tool call is an exception naming the tool.
  json syntax = Run(id, "python", "a = 1\nb = (2\n");
  EXPECT_EQ(syntax["error"].value("type", ""), "SyntaxError") << syntax.dump(2);
  EXPECT_EQ(syntax["error"].value("line", 0), 2) << syntax.dump(2);
  json missing = Run(id, "python", "import tools\nawait tools.read_file('nope.txt')\n");
  EXPECT_EQ(missing["error"].value("type", ""), "ToolError") << missing.dump(2);
  EXPECT_EQ(missing["error"].value("line", 0), 2) << missing.dump(2);
  EXPECT_TRUE(Contains(missing["error"].value("message", ""), "read_file")) << missing.dump(2);
  if (HasNode()) {
    json js = Run(id, "javascript", "const a = 1;\nfunction g() {\n  return a.b.c;\n}\ng();\n");
    EXPECT_EQ(js["error"].value("type", ""), "TypeError") << js.dump(2);
    EXPECT_EQ(js["error"].value("line", 0), 3) << js.dump(2);
    EXPECT_FALSE(Contains(js["error"].value("traceback", ""), "node:internal")) << js.dump(2);
  }
}

TEST_F(CodeModeTest, ATimeoutIsReportedAsForBash) {
  const std::string id = CreateSession(c(), ws_.path());
  json r = Run(id, "python", "while True:\n    pass\n", "", {{"timeout", 1}});
  EXPECT_EQ(r.value("kind", ""), "timed_out") << r.dump(2);
  EXPECT_TRUE(Contains(r.value("output", ""), "timed_out after 1.0s")) << r.dump(2);
}

TEST_F(CodeModeTest, BindingsAreCheckedAndBashIsBoundOnlyWhenThePolicySaysSo) {
  const std::string id = CreateSession(c(), ws_.path());
  json r = Run(id, "python",
               "import tools\n"
               "a = await tools.call('bash', {'command': 'echo hi'})\n"
               "b = await tools.call('read_file', {'path': 'x', 'bogus': 1})\n"
               "c = await tools.call('run_code', {'language': 'python', 'code': '1'})\n"
               "[a['kind'], a['output'], b['kind'], b['output'], c['output'], hasattr(tools, 'bash')]\n");
  ASSERT_EQ(r.value("kind", ""), "exited") << r.dump(2);
  const json& v = r["result"];
  EXPECT_EQ(v[0], "tool_error");
  EXPECT_TRUE(Contains(v[1].get<std::string>(), "tools.run_code.bash")) << v.dump();
  EXPECT_EQ(v[2], "tool_error");
  EXPECT_TRUE(Contains(v[3].get<std::string>(), "bogus")) << v.dump();
  EXPECT_TRUE(Contains(v[4].get<std::string>(), "cannot start another")) << v.dump();
  EXPECT_EQ(v[5], false);

  const std::string bound = CreateSession(c(), ws_.path(), {{"policy", "version: 1\ntools:\n  run_code:\n    bash: true\n"}});
  json with_bash = Run(bound, "python", "import tools\n(await tools.bash(command='echo from-bash')).strip()\n");
  EXPECT_EQ(with_bash["result"], "from-bash") << with_bash.dump(2);
}

TEST_F(CodeModeTest, AReplayedProgramRunsNothing) {
  const std::string id = CreateSession(c(), ws_.path());
  const std::string code =
      "import tools\n"
      "n = await tools.list_dir('.')\n"
      "await tools.write_file(path='count.txt', content=str(len(n.split())) + '!')\n"
      "'done'\n";
  json first = Run(id, "python", code, "replay-1");
  ASSERT_EQ(first["result"], "done") << first.dump(2);
  ASSERT_EQ(Bash(c(), id, "rm count.txt").value("exit_code", -1), 0);
  json again = Run(id, "python", code, "replay-1");
  EXPECT_TRUE(again.value("replayed", false)) << again.dump(2);
  EXPECT_EQ(Bash(c(), id, "test -e count.txt && echo ran || echo not-ran").value("output", ""), "not-ran\n");
}

// The attack: a program in a session whose bash reaches a host tries every
// way out that does not go through its bindings. Each would be a connection
// on the listener (or a descriptor) if the claim were false.
TEST_F(CodeModeTest, AProgramHasNoNetworkEvenWhereBashHasOne) {
  Upstream host;
  ASSERT_GT(host.port(), 0);
  const std::string target = "127.0.0.1:" + std::to_string(host.port());
  const std::string id =
      CreateSession(c(), ws_.path(), {{"policy", "version: 1\nnetwork:\n  allow: [\"" + target + "\"]\n"}});
  // Bash reaches it (through the egress proxy): the network is there to take.
  json reached = Bash(c(), id, "NO_PROXY= no_proxy= curl -sS --max-time 10 http://" + target + "/ && echo");
  ASSERT_EQ(reached.value("output", ""), "ok\n") << reached.dump(2);
  ASSERT_EQ(host.served(), 1);
  // A background bash process holds a connected socket: the program may try
  // to take it from there.
  ASSERT_EQ(Bash(c(), id, "(exec 7<>/dev/tcp/127.0.0.1/${HTTP_PROXY##*:}; sleep 300) >/dev/null 2>&1 & echo $! > /tmp/holder")
                .value("exit_code", -1), 0);

  // Through the language: refused, named, and reported as a denial.
  json urllib = Run(id, "python",
                    "import urllib.request\n"
                    "urllib.request.urlopen('http://" + target + "/', timeout=5).read()\n");
  EXPECT_EQ(urllib.value("kind", ""), "sandbox_denied") << urllib.dump(2);
  EXPECT_TRUE(Contains(urllib.value("output", ""), "run_code programs have no network")) << urllib.dump(2);
  EXPECT_TRUE(Contains(urllib.value("output", ""), "127.0.0.1")) << urllib.dump(2);

  // Around the language, straight to the kernel: every family, the proxy's
  // port, datagram pairs (sendto a bound path), another process's socket.
  json raw = Run(id, "python",
                 "import ctypes, os, socket\n"
                 "libc = ctypes.CDLL(None, use_errno=True)\n"
                 "def attempt(f, *a):\n"
                 "    r = f(*a)\n"
                 "    return [r, ctypes.get_errno() if r < 0 else 0]\n"
                 "out = {}\n"
                 "for name, fam, typ in [('inet', 2, 1), ('inet6', 10, 1), ('udp', 2, 2), ('unix', 1, 1),\n"
                 "                       ('netlink', 16, 3), ('packet', 17, 3)]:\n"
                 "    out[name] = attempt(libc.socket, fam, typ, 0)\n"
                 "pair = (ctypes.c_int * 2)()\n"
                 "out['dgram_pair'] = attempt(libc.socketpair, 1, 2, 0, pair)\n"
                 "out['stream_pair'] = attempt(libc.socketpair, 1, 1, 0, pair)\n"
                 "holder = int(open('/tmp/holder').read())\n"
                 "pidfd = libc.syscall(434, holder, 0)\n"
                 "out['pidfd_getfd'] = attempt(libc.syscall, 438, pidfd, 7, 0)\n"
                 "out['io_uring'] = attempt(libc.syscall, 425, 8, ctypes.create_string_buffer(120))\n"
                 "try:\n"
                 "    import _socket\n"
                 "    _socket.socket(2, 1).connect(('127.0.0.1', int(os.environ['HTTP_PROXY'].rsplit(':', 1)[1])))\n"
                 "    out['c_socket'] = 'connected'\n"
                 "except OSError as e:\n"
                 "    out['c_socket'] = e.errno\n"
                 "out\n");
  ASSERT_EQ(raw.value("kind", ""), "exited") << raw.dump(2);
  const json& v = raw["result"];
  for (const char* family : {"inet", "inet6", "udp", "unix", "netlink", "packet", "dgram_pair"}) {
    EXPECT_EQ(v[family], json({-1, 13})) << family << ": " << v.dump();
  }
  EXPECT_EQ(v["stream_pair"], json({0, 0})) << "an event loop's wake-up pair must stay possible: " << v.dump();
  EXPECT_EQ(v["pidfd_getfd"][0], -1) << v.dump();
  EXPECT_EQ(v["io_uring"][0], -1) << v.dump();
  EXPECT_EQ(v["c_socket"], 13) << v.dump();

  if (HasNode()) {
    json js = Run(id, "javascript",
                  "const out = {};\n"
                  "try { require('net').connect(" + std::to_string(host.port()) + ", '127.0.0.1'); out.net = 'no error'; } catch (e) { out.net = e.code; }\n"
                  "const { TCP, constants } = process.binding('tcp_wrap');\n"
                  "out.raw = new TCP(constants.SOCKET).bind('127.0.0.1', 0);\n"
                  "out\n");
    ASSERT_EQ(js.value("kind", ""), "exited") << js.dump(2);
    EXPECT_EQ(js["result"].value("net", ""), "EACCES") << js.dump(2);
    EXPECT_EQ(js["result"].value("raw", 0), -13) << js.dump(2);
  }
  // Nothing reached the host but bash's one request.
  EXPECT_EQ(host.served(), 1);
  EXPECT_EQ(host.held(), 0);
  (void)Bash(c(), id, "kill $(cat /tmp/holder)");
}

// Hostile use of the binding descriptor: garbage, an endless line, a child
// that keeps it after the program ends. The call ends, the daemon serves on.
TEST_F(CodeModeTest, AHostileProgramCannotWedgeItsCallOrTheDaemon) {
  const std::string id = CreateSession(c(), ws_.path());
  json garbage = Run(id, "python", "import os\nos.write(3, b'not json\\n')\nimport time\ntime.sleep(0.2)\n'after'\n");
  EXPECT_TRUE(Contains(garbage.value("protocol_error", ""), "not a message")) << garbage.dump(2);
  json endless = Run(id, "python",
                     "import os\nchunk = b'x' * (1 << 20)\n"
                     "try:\n    for _ in range(40):\n        os.write(3, chunk)\nexcept OSError as e:\n    print('closed', e.errno)\n");
  EXPECT_TRUE(Contains(endless.value("protocol_error", ""), "longer than")) << endless.dump(2);
  json keeper = Run(id, "python",
                    "import os, time\n"
                    "if os.fork() == 0:\n"
                    "    time.sleep(300)\n"
                    "    os._exit(0)\n"
                    "'parent done'\n",
                    "", {{"timeout", 60}});
  EXPECT_EQ(keeper["result"], "parent done") << keeper.dump(2);
  EXPECT_LT(keeper.value("duration_ms", 100000), 30000) << keeper.dump(2);
  // A program cannot spoof another call's answer: its ids are its own.
  json spoof = Run(id, "python",
                   "import os, json\n"
                   "os.write(3, (json.dumps({'t': 'call', 'id': 'x', 'name': 'glob'}) + '\\n').encode())\n"
                   "import time\ntime.sleep(0.2)\n1\n");
  EXPECT_TRUE(Contains(spoof.value("protocol_error", ""), "integer id")) << spoof.dump(2);
  EXPECT_EQ(Bash(c(), id, "echo still-serving").value("output", ""), "still-serving\n");
}

// A flood of binding calls meets the per-program cap; a program that sends
// calls and never reads the answers is ended by its timeout; the daemon
// serves the session's next call either way.
TEST_F(CodeModeTest, AFloodOfCallsMeetsTheCapAndAProgramThatNeverReadsEndsAtItsTimeout) {
  const std::string id = CreateSession(c(), ws_.path());
  json flood = Run(id, "python",
                   "import tools\nfirst = None\nfor i in range(10001):\n"
                   "    r = await tools.call('nope', {})\n    first = first or r['output']\n"
                   "print(first)\nr['output']\n",
                   "", {{"timeout", 60}});
  EXPECT_TRUE(Contains(flood.value("output", ""), "no tool 'nope' in run_code's tools module")) << flood.dump(2);
  EXPECT_TRUE(Contains(flood.value("output", ""), "this program made more than 10000 tool calls")) << flood.dump(2);
  json deaf = Run(id, "python",
                  "import os, json\nline = (json.dumps({'t': 'call', 'id': 1, 'name': 'nope', 'input': {}}) + '\\n').encode()\n"
                  "for i in range(200000):\n    os.write(3, line)\n'unreachable'\n",
                  "", {{"timeout", 3}});
  EXPECT_EQ(deaf.value("kind", ""), "timed_out") << deaf.dump(2);
  EXPECT_EQ(Bash(c(), id, "echo still-serving").value("output", ""), "still-serving\n");
}

// A program that takes more memory than the session may have is
// `oom_killed`, as a bash command would be.
TEST_F(CodeModeTest, AProgramOverTheMemoryLimitIsOomKilled) {
  if (!host_facts::CgroupsExpected({"memory"})) {
    GTEST_SKIP() << "not applicable here: no writable cgroup with the memory controller for this user";
  }
  const std::string id = CreateSession(c(), ws_.path(), {{"policy", "version: 1\nresources:\n  memory_gib: { limit: 128Mi }\n"}});
  ASSERT_FALSE(id.empty());
  json r = Run(id, "python", "b = bytearray(400 << 20)\nb[::4096] = b'x' * len(b[::4096])\n'held'\n", "", {{"timeout", 60}});
  EXPECT_EQ(r.value("kind", ""), "oom_killed") << r.dump(2);
  EXPECT_EQ(Bash(c(), id, "echo still-serving").value("output", ""), "still-serving\n");
}

}  // namespace
}  // namespace agentbox::session_test
