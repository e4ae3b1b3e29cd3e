// Host-side fixtures for the end-to-end network tests: servers on the
// host's 127.0.0.1 started from python3 scripts, a test CA made with the
// openssl CLI, and `agentbox run` with a name table for the supervisor's
// resolver. Everything is made by the test at run time (nothing generated is
// committed) and goes away with the test's Sandbox.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness.h"

namespace agentbox::e2e {

// The host's python3 ("" if none).
std::string Python();

// The report's `denials` entry of facet "network" for `target`, or null.
const nlohmann::json* DenialFor(const RunResult& r, const std::string& target);

// The report's network.connections, or null.
const nlohmann::json* Connections(const RunResult& r);

// A python3 server on the host, started from a script written to the
// sandbox's scratch directory as `name`. The script prints "PORT <n>" first,
// then one line per event; its process group is killed when this goes away.
class HostScript {
 public:
  HostScript(const Sandbox& sb, const std::string& name, const std::string& script,
             const std::vector<std::string>& args);
  int port() const { return port_; }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  // Everything printed so far (stdout, then stderr). With a `needle`, first
  // pumps for up to `wait_ms` until it appears; without one, pumps for
  // `wait_ms` (so that "the server printed nothing" is checked on what it
  // has really written, not on what was read before).
  std::string Output(const std::string& needle = "", int wait_ms = 0);

 private:
  std::unique_ptr<Process> process_;
  int port_ = 0;
};

// A test CA and a server certificate, made with the openssl CLI in `dir`.
// The certificate's names (DNS:tls.test, front.test, api.test, evil.test,
// git.test and IP:127.0.0.1) serve every test host name.
struct TestCa {
  std::string ca_pem, server_pem, server_key;
  bool ok = false;
  std::string log;

  explicit TestCa(const std::string& dir);
};

// Smart HTTP for git: every request runs `git http-backend` as a CGI program
// over the repositories below argv[1] (GIT_HTTP_EXPORT_ALL). Optional
// arguments: `--tls CERT KEY` serves HTTPS; `--basic USER PASSWORD` answers
// 401 to a request without those credentials and runs the CGI with
// REMOTE_USER=USER (receive-pack also needs http.receivepack in the
// repository). Prints "GIT <method> <path> <status> auth=<ok|bad|none>"
// before each answer leaves.
extern const std::string kGitServer;
// The shared end of the python3 test servers (see net_fixtures.cc).
extern const char* const kThreadingServerMain;

// A python3 client whose every connect() is made on a worker thread (as
// libuv, Go or Java make theirs): fetches argv[1] through the proxy that
// HTTP_PROXY names (NO_PROXY cleared), printing "fetch <body>" or "fetch
// <error>"; with argv[2] (HOST:PORT), then connects there directly and
// prints "direct ok" or "direct errno=N".
extern const char* const kThreadedClient;

// `with_binds.py SOURCE TARGET [SOURCE TARGET ...] -- ARGV...`: runs ARGV in
// a new mount namespace (and, when not root, a user namespace mapping only
// the caller's own ids) where each SOURCE is bound over its TARGET: a hosts
// file over /etc/hosts lets the supervisor's resolver know the test's names.
extern const char* const kWithBinds;

// `agentbox run` as Sandbox::RunArgv does (sh -c `script`), with `hosts` as
// the supervisor's /etc/hosts and `extra_env` added to agentbox's own
// environment.
RunResult RunWithHosts(const Sandbox& sb, const std::string& hosts, const std::string& script,
                       const std::vector<std::string>& options, int timeout_ms = 30000,
                       const std::vector<std::string>& extra_env = {});

// `with_netns.py SPEC.json`: a network of the test's own, away from the
// host's. In a new network namespace (and mount namespace, and, when not
// root, a user namespace mapping only the caller's own ids) it brings `lo`
// up, adds the interface t0 (dummy; a bridge without ports where the kernel
// has no dummy driver; with neither, lo itself) with the spec's addresses
// (198.18.0.0/15, the benchmarking range: on no real network), checks that
// only lo and t0 are there and that there is no default route, binds the
// spec's files (a hosts file over /etc/hosts), starts the spec's servers and
// waits until each listens, then runs the spec's argv (agentbox) and, when it exits,
// kills every server it started by pid. Its own failures go to stderr as
// "with-netns: ..." with exit status 120; otherwise the status is argv's.
extern const char* const kWithNetns;

// A python3 server for the namespace: listens on every argument
// ("tcp:ADDR:PORT" or "udp:ADDR:PORT"); prints "ACCEPT ADDR:PORT" for each
// TCP connection it accepts, answers an HTTP request with "hello from
// ADDR:PORT" and prints "SERVED ADDR:PORT <request line>"; prints
// "UDP ADDR:PORT <n> bytes" for each datagram.
extern const char* const kNetnsServer;

// The test network of one Sandbox: servers on 198.18.0.10 and 198.18.0.11
// (on t0) inside a network namespace of its own, and `agentbox run`
// started there with `hosts` as the supervisor's /etc/hosts. The sandbox's
// loopback is its own, so the servers are reachable only as the supervisor
// reaches them: through the sandbox's DNS and the connect() broker.
class TestNetns {
 public:
  static constexpr const char* kAddr = "198.18.0.10";
  static constexpr const char* kOtherAddr = "198.18.0.11";

  // Why this host cannot make one ("" when it can): python3 and ip are needed.
  static std::string WhyNot();

  TestNetns(const Sandbox& sb, std::string hosts);

  // A server started in the namespace before agentbox, output to Log(name);
  // agentbox starts once each of `listens` ("tcp:ADDR:PORT", "udp:ADDR:PORT")
  // is listening.
  void AddServer(const std::string& name, const std::vector<std::string>& argv,
                 const std::vector<std::string>& listens, const std::string& cwd = "");
  // kNetnsServer on `listens`.
  void AddPythonServer(const std::string& name, const std::vector<std::string>& listens);
  // /run/NAME exists for the servers (sshd's privilege separation directory
  // as root): when missing, /run becomes a tmpfs in the wrapper's mount
  // namespace with the host's entries bound back, and NAME made in it.
  void NeedRunDir(const std::string& name) { run_dirs_.push_back(name); }

  // agentbox run --report R OPTIONS -- sh -c SCRIPT, in the namespace.
  RunResult Sh(const std::string& script, const std::vector<std::string>& options, int timeout_ms = 60000,
               const std::vector<std::string>& extra_env = {}) const;
  // What server `name` printed (after Sh returned: everything).
  std::string Log(const std::string& name) const;

 private:
  const Sandbox& sb_;
  std::string hosts_;
  nlohmann::json servers_ = nlohmann::json::array();
  std::vector<std::string> run_dirs_;
};

// The wrapper's own failure line ("with-netns: ..."), "" when it had none.
std::string NetnsError(const RunResult& r);

}  // namespace agentbox::e2e
