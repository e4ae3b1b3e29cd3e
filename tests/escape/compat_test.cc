// The compat suite: ordinary development work must keep working inside the
// default workspace-write policy while the escape battery's attacks fail.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "battery.h"

namespace agentbox::escape {
namespace {

using e2e::Contains;
using e2e::FindTool;

// The compat suite's tools are installed by scripts/install-deps.sh: a
// missing one is a broken set-up, not a reason to pass quietly.
#define REQUIRE_TOOL(name) \
  ASSERT_FALSE(FindTool(name).empty()) << name " is missing (scripts/install-deps.sh installs it)"

TEST(Compat, Python3) {
  REQUIRE_TOOL("python3");
  Sandbox sb;
  RunResult r = sb.RunArgv({"python3", "-c",
                            "import json, os, subprocess, sys\n"
                            "out = subprocess.run(['echo', 'child'], capture_output=True, text=True).stdout\n"
                            "open('py.json', 'w').write(json.dumps({'v': sys.version_info[0], 'child': out.strip()}))\n"
                            "print(open('py.json').read())\n"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "{\"v\": 3, \"child\": \"child\"}")) << r.Describe();
  EXPECT_TRUE(e2e::Exists(sb.ws() + "/py.json"));
}

TEST(Compat, Node) {
  REQUIRE_TOOL("node");
  Sandbox sb;
  RunResult r = sb.RunArgv({"node", "-e",
                            "const fs = require('fs'); const cp = require('child_process');\n"
                            "fs.writeFileSync('n.txt', 'node-data');\n"
                            "const out = cp.execSync('cat n.txt').toString();\n"
                            "fs.promises.readFile('n.txt', 'utf8').then(d => console.log('node-ok', out, d));\n"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "node-ok node-data node-data")) << r.Describe();
}

TEST(Compat, GccBuildInTheWorkspace) {
  REQUIRE_TOOL("gcc");
  Sandbox sb;
  e2e::WriteFile(sb.ws() + "/hello.c", "#include <stdio.h>\nint main(void){puts(\"gcc-hello\");return 0;}\n");
  RunResult r = sb.Sh("gcc -O1 -o hello hello.c && ./hello");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "gcc-hello")) << r.Describe();
}

TEST(Compat, CmakeBuildInTheWorkspace) {
  REQUIRE_TOOL("cmake");
  REQUIRE_TOOL("g++");
  Sandbox sb;
  e2e::WriteFile(sb.ws() + "/CMakeLists.txt",
                 "cmake_minimum_required(VERSION 3.13)\nproject(hello CXX)\nadd_executable(hello main.cc)\n");
  e2e::WriteFile(sb.ws() + "/main.cc", "#include <iostream>\nint main(){std::cout << \"cmake-hello\\n\";}\n");
  RunResult r = sb.Sh("cmake -S . -B build >/dev/null && cmake --build build -j2 >/dev/null && ./build/hello",
                      {}, {}, 90000);
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "cmake-hello")) << r.Describe();
}

TEST(Compat, GitAddAndCommit) {
  REQUIRE_TOOL("git");
  Sandbox sb;
  RunResult r = sb.Sh(
      "echo content > f.txt && git add f.txt && "
      "git -c user.name=agent -c user.email=agent@example.invalid commit -qm 'first' && "
      "git log --oneline | wc -l");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "1")) << r.Describe();
  EXPECT_EQ(sb.Git({"log", "--format=%s"}).out, "first\n") << "the commit is in the host's repository";
}

TEST(Compat, Ps) {
  REQUIRE_TOOL("ps");
  Sandbox sb;
  RunResult r = sb.Sh("ps -eo pid,comm");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "agentbox-init")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, " ps")) << r.Describe();
}

TEST(Compat, Nproc) {
  Sandbox sb;
  RunResult r = sb.RunArgv({"nproc"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(std::stoi(r.out), static_cast<int>(std::thread::hardware_concurrency())) << r.Describe();
}

TEST(Compat, Pty) {
  REQUIRE_TOOL("python3");
  Sandbox sb;
  RunResult r = sb.RunArgv({"python3", "-c", "import pty; pty.spawn(['sh', '-c', 'tty; echo pty-ok'])"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "/dev/pts/")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "pty-ok")) << r.Describe();
}

TEST(Compat, BashJobControlOnAPty) {
  REQUIRE_TOOL("python3");
  REQUIRE_TOOL("bash");
  Sandbox sb;
  e2e::Command c = sb.AgentboxCommand({"run", "--", "python3", "-c",
                                       "import pty; pty.spawn(['bash', '--norc', '--noprofile', '-i'])"});
  c.stdin_data =
      "set -m\nsleep 30 &\njobs\nkill -STOP %1\nsleep 0.2\njobs\nkill %1\nkill -CONT %1\nwait\n"
      "echo job-$((40+2))\nexit\n";
  RunResult r = e2e::RunCommand(c);
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "Running")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "Stopped")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "job-42")) << r.Describe();
  EXPECT_FALSE(Contains(r.err + r.out, "no job control")) << r.Describe();
}

TEST(Compat, PipesInBash) {
  REQUIRE_TOOL("bash");
  Sandbox sb;
  RunResult r = sb.RunArgv({"bash", "-c",
                            "seq 1 1000 | grep 7 | wc -l; set -o pipefail; false | true; echo rc=$?;"
                            "mkfifo /tmp/f; (echo via-fifo > /tmp/f &); cat /tmp/f; "
                            "exec 3< <(echo via-procsub); cat <&3"});
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "271\nrc=1\nvia-fifo\nvia-procsub\n")) << r.Describe();
}

TEST(Compat, TmpUse) {
  Sandbox sb;
  RunResult r = sb.Sh(
      "f=$(mktemp) && echo tmp-data > \"$f\" && cat \"$f\" && mkdir -p /tmp/a/b && "
      "touch /tmp/a/b/c && ls /tmp/a/b && df -P /tmp | tail -1 | cut -d' ' -f1");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "tmp-data\nc\ntmpfs\n")) << r.Describe();
}

TEST(Compat, Locale) {
  REQUIRE_TOOL("python3");
  Sandbox sb;
  RunResult r = sb.Sh("LANG=C.UTF-8 LC_ALL=C.UTF-8 python3 -c 'print(\"\\u00e9\")'; "
                      "LANG=C.UTF-8 LC_ALL=C.UTF-8 python3 -c 'import locale; print(locale.getpreferredencoding())'");
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_EQ(r.out, "\xc3\xa9\nUTF-8\n") << r.Describe();
}

}  // namespace
}  // namespace agentbox::escape
