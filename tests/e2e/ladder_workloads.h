// What every rung of the isolation ladder must run and keep out, shared by
// the container (gVisor) and microvm tests: the compat workloads, and the
// secrets-absent / nothing-written-outside check, and egress through the
// proxy.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "harness.h"
#include "net_fixtures.h"

namespace agentbox::e2e {

inline std::string BinDir() {
  const std::string bin = AgentboxBin();
  return bin.substr(0, bin.rfind('/'));
}

// The guest kernel release the build made an image for ("" none).
inline std::string GuestRelease() {
  DIR* d = opendir("/boot");
  if (!d) return "";
  std::string found;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("vmlinuz-", 0) != 0) continue;
    const std::string release = name.substr(8);
    if (Exists(BinDir() + "/guest/initramfs-" + release + ".img") && release > found) found = release;
  }
  closedir(d);
  return found;
}

// "" when a microVM can run here for this user, else why not.
inline const std::string& MicrovmLack() {
  static const std::string lack = [] {
    if (FindTool("qemu-system-x86_64").empty()) return std::string("QEMU (qemu-system-x86_64) is not installed");
    if (!Exists("/usr/lib/qemu/virtiofsd")) return std::string("QEMU's virtiofsd is not installed");
    if (GuestRelease().empty()) {
      return "no guest kernel in /boot with a guest image in " + BinDir() + "/guest (the build makes one per "
             "kernel that has virtiofs)";
    }
    if (geteuid() != 0 && getgroups(0, nullptr) > 0) {
      return std::string("this unprivileged user has supplementary groups, which virtiofsd (QEMU 7.2) must drop "
                         "and a user namespace forbids dropping (the microvm_unprivileged run clears them)");
    }
    return std::string();
  }();
  return lack;
}

#define REQUIRE_MICROVM()                                                                   \
  do {                                                                                      \
    if (!MicrovmLack().empty()) GTEST_SKIP() << "not applicable here: " << MicrovmLack(); \
  } while (0)


// "" when runsc can start a sandbox for this user here, else why not.
inline const std::string& GvisorLack() {
  static const std::string lack = [] {
    const std::string runsc = FindTool("runsc");
    if (runsc.empty()) return std::string("gVisor's runsc is not installed");
    TempDir state("agentbox-e2e-runsc-");
    Command c;
    c.argv = {runsc, "--root=" + state.path(), "--network=none", "--ignore-cgroups"};
    if (geteuid() != 0) c.argv.push_back("--rootless");
    c.argv.insert(c.argv.end(), {"do", "/bin/true"});
    c.env = {"PATH=/usr/bin:/bin"};
    c.cwd = "/";
    RunResult r = RunCommand(c);
    if (r.status != 0) return "runsc do /bin/true failed here: " + r.Describe();
    return std::string();
  }();
  return lack;
}

#define REQUIRE_GVISOR()                                                       \
  do {                                                                         \
    if (!GvisorLack().empty()) GTEST_SKIP() << "not applicable here: " << GvisorLack(); \
  } while (0)

// gcc, python, git commit, pipes and /tmp, node where installed; ends by
// printing `release=$(uname -r)`.
inline std::string CompatScript() {
  std::string script =
      "set -e; printf 'int main(void){return 7;}' > /tmp/a.c; gcc /tmp/a.c -o /tmp/a; set +e; /tmp/a; "
      "echo gcc=$?; set -e; "
      "python3 -c 'import os; print(\"python\", os.getpid() > 0)'; "
      "git -c user.email=a@b -c user.name=a commit -q --allow-empty -m inside && git log --oneline | wc -l; "
      "echo pipes | tr a-z A-Z | sed s/P/p/; "
      "echo tmp > /tmp/t && cat /tmp/t; "
      "echo release=$(uname -r)";
  if (!FindTool("node").empty()) script += "; node -e 'console.log(\"node\", 6*7)'";
  return script;
}

inline void ExpectCompat(const Sandbox& sb, const RunResult& r) {
  ASSERT_EQ(r.status, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "gcc=7")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "python True")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "\n1\n")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "pIPES")) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "tmp\n")) << r.Describe();
  if (!FindTool("node").empty()) { EXPECT_TRUE(Contains(r.out, "node 42")) << r.Describe(); }
  // The commit landed in the host's workspace.
  EXPECT_FALSE(sb.Git({"log", "--oneline"}).out.empty());
  ASSERT_TRUE(r.report) << r.Describe();
  EXPECT_EQ(OutcomeOf(r), "exited");
}

// Reads the fixture's secrets, /etc/shadow and a planted .env; tries to
// write outside the workspace; lists processes; connects to `server` on
// the host's loopback. `more`: extra shell lines before the python part.
struct SecretsCheck {
  std::string env_marker = "DOTENV-" + RandomHex();
  std::string outside;
  HostServer server;

  std::string Script(const Sandbox& sb, const std::string& more = "") {
    WriteFile(sb.ws() + "/.env", "TOKEN=" + env_marker + "\n");
    outside = sb.scratch() + "/planted";
    return "cat " + sb.home() + "/.ssh/id_rsa " + sb.home() + "/.aws/credentials .env /etc/shadow; "
           "for p in /usr/planted /etc/planted " + outside + "; do "
           "  echo x > $p 2>/dev/null && echo WROTE $p; done; "
           "echo in-ws > inside.txt; " + more +
           "python3 - <<'EOF'\n"
           "import os, socket\n"
           "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
           "print('pids', len(pids))\n"
           "s = socket.socket(); s.settimeout(2)\n"
           "try:\n"
           "    s.connect(('127.0.0.1', " + std::to_string(server.port()) + ")); print('CONNECTED')\n"
           "except OSError as e:\n"
           "    print('connect refused', e.errno)\n"
           "EOF";
  }

  void Expect(const Sandbox& sb, const RunResult& r) {
    ASSERT_TRUE(r.report) << r.Describe();
    const std::string all = r.out + r.err;
    EXPECT_FALSE(Contains(all, sb.ssh_secret())) << r.Describe();
    EXPECT_FALSE(Contains(all, sb.aws_secret())) << r.Describe();
    EXPECT_FALSE(Contains(all, env_marker)) << r.Describe();
    EXPECT_FALSE(Contains(all, "root:")) << r.Describe();  // /etc/shadow's first field
    EXPECT_FALSE(Contains(r.out, "WROTE")) << r.Describe();
    EXPECT_FALSE(Exists(outside));
    EXPECT_FALSE(Exists(sb.home() + "/planted"));
    EXPECT_FALSE(Exists("/usr/planted"));
    EXPECT_EQ(ReadFile(sb.ws() + "/inside.txt").value_or(""), "in-ws\n");
    // The host's loopback is not the sandbox's.
    EXPECT_TRUE(Contains(r.out, "connect refused")) << r.Describe();
    EXPECT_EQ(server.served(), 0);
    for (const auto& line : Lines(r.out)) {
      if (line.rfind("pids ", 0) == 0) { EXPECT_LT(std::stoi(line.substr(5)), 10) << r.Describe(); }
    }
    EXPECT_TRUE(HasDenial(r, ".env")) << r.Describe();
  }
};

// POST: answers the body's sha256 (hex, a line) and 2 MiB of "x".
inline const char* const kBulkServer = R"PY(import hashlib, http.server
class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers["Content-Length"])
        data = b""
        while len(data) < n:
            chunk = self.rfile.read(n - len(data))
            if not chunk:
                break
            data += chunk
        body = hashlib.sha256(data).hexdigest().encode() + b"\n" + b"x" * (2 << 20)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        print("BULK", len(data), flush=True)
    def log_message(self, *args):
        pass
srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
print("PORT", srv.server_address[1], flush=True)
srv.serve_forever()
)PY";

// Egress by network.allow through agentbox's proxy: an allowed host on the
// host's loopback is reached over HTTP and SOCKS, another host's request is
// a 403 named in the report, a direct connection (no proxy) has nowhere to
// go, and 3 MiB up with 2 MiB back arrive whole. The command exits 3.
struct EgressCheck {
  HostServer allowed, denied;
  HostScript bulk;

  explicit EgressCheck(const Sandbox& sb) : bulk(sb, "bulk_server.py", kBulkServer, {}) {}

  std::string PolicyLines() const {
    return "network: { allow: [\"" + allowed.target() + "\", \"" + bulk.target() + "\"], egress_proxy: true }\n";
  }

  std::string Script() const {
    return "export NO_PROXY= no_proxy=; "
           "echo http=$(curl -s -m 60 " + allowed.url() + "); "
           "echo socks=$(curl -s -m 60 --noproxy '' --socks5-hostname 127.0.0.1:1080 " + allowed.url() + "); "
           "echo denied=$(curl -s -m 60 -o /dev/null -w '%{http_code}' " + denied.url() + "); "
           "curl -s -m 10 --noproxy '*' " + denied.url() + "; echo direct=$?; "
           "head -c 3145728 /dev/urandom > up; curl -s -m 120 --data-binary @up -o down http://" + bulk.target() +
           "/; [ \"$(sha256sum < up | cut -d' ' -f1)\" = \"$(head -1 down)\" ] && echo big=ok $(wc -c < down); "
           "exit 3";
  }

  void Expect(const RunResult& r) const {
    ASSERT_GT(allowed.port(), 0);
    ASSERT_GT(bulk.port(), 0);
    EXPECT_EQ(r.status, 3) << r.Describe();
    EXPECT_TRUE(Contains(r.out, std::string("http=") + HostServer::kBody)) << r.Describe();
    EXPECT_TRUE(Contains(r.out, std::string("socks=") + HostServer::kBody)) << r.Describe();
    EXPECT_TRUE(Contains(r.out, "denied=403")) << r.Describe();
    EXPECT_FALSE(Contains(r.out, "direct=0")) << r.Describe();
    EXPECT_TRUE(Contains(r.out, "big=ok 2097217")) << r.Describe();
    EXPECT_EQ(denied.served(), 0);
    EXPECT_GE(allowed.served(), 2);
    ASSERT_TRUE(r.report) << r.Describe();
    EXPECT_EQ(OutcomeOf(r), "sandbox_denied") << r.Describe();
    const nlohmann::json* d = DenialFor(r, denied.target());
    EXPECT_NE(d, nullptr) << r.Describe();
    const auto& c = (*r.report)["network"]["connections"];
    EXPECT_GE(c["allowed"].get<int>(), 3) << r.Describe();
    EXPECT_EQ(c["denied"], 1) << r.Describe();
  }
};

}  // namespace agentbox::e2e
