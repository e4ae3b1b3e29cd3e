// A second "host" for sandbox.isolation: remote: a real sshd (Debian's
// openssh-server) that the test starts on 127.0.0.1 with keys it makes, as
// the invoking user, and stops by pid (with every process its connections
// left). The remote's agentbox installs into, and keeps its state in,
// directories of the test's (sshd's SetEnv of XDG_CACHE_HOME and
// XDG_STATE_HOME), removed with it.
//
// As root sshd needs its privilege separation directory, /run/sshd; where
// the host has none, sshd runs in a mount namespace of its own whose /run
// is a tmpfs with the host's entries bound back and sshd's made in it.
#pragma once

#include <dirent.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

namespace agentbox::session_test {

inline std::string LoginName() {
  struct passwd* pw = getpwuid(getuid());
  return pw ? pw->pw_name : "root";
}

// Children of `pid` (from /proc/*/stat), then theirs.
inline std::vector<pid_t> ProcessTree(pid_t root) {
  std::vector<pid_t> out, todo = {root};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    DIR* d = opendir("/proc");
    if (!d) break;
    while (struct dirent* e = readdir(d)) {
      const pid_t child = static_cast<pid_t>(std::atoi(e->d_name));
      if (child <= 0) continue;
      std::ifstream stat("/proc/" + std::string(e->d_name) + "/stat");
      std::string line;
      std::getline(stat, line);
      const auto close = line.rfind(')');
      if (close == std::string::npos) continue;
      char state = 0;
      int ppid = 0;
      if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == p) {
        out.push_back(child);
        todo.push_back(child);
      }
    }
    closedir(d);
  }
  return out;
}

// The pid's parent, or 0.
inline pid_t ParentOf(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  char state = 0;
  int ppid = 0;
  if (close == std::string::npos || std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) != 2) return 0;
  return ppid;
}

class SshHost {
 public:
  enum class Kind {
    kPlain,
    // Every login runs in a user namespace of its own in which no further
    // user namespace can be made (its max_user_namespaces is 0): a remote
    // whose kernel refuses user namespaces to this user.
    kNoUserNamespaces,
  };

  // Why this host cannot give a test sshd ("" when it can).
  static std::string WhyNot() {
    if (access("/usr/sbin/sshd", X_OK) != 0) return "/usr/sbin/sshd is not installed (openssh-server)";
    if (e2e::FindTool("ssh").empty()) return "no ssh client (openssh-client)";
    if (e2e::FindTool("unshare").empty()) return "no unshare (util-linux)";
    return "";
  }

  explicit SshHost(Kind kind = Kind::kPlain) : kind_(kind) {}
  ~SshHost() { Stop(); }
  SshHost(const SshHost&) = delete;
  SshHost& operator=(const SshHost&) = delete;

  // Makes the keys and configuration and starts sshd; "" or what failed.
  std::string Start() {
    const std::string d = dir_.path();
    for (const char* key : {"host_key", "other_host_key", "id"}) {
      e2e::RunResult k = Run({e2e::FindTool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-f", d + "/" + key});
      if (k.status != 0) return "ssh-keygen: " + k.Describe();
    }
    e2e::WriteFile(d + "/authorized_keys", *e2e::ReadFile(d + "/id.pub"), 0600);
    e2e::MakeDirs(cache_dir(), 0700);
    e2e::MakeDirs(state_dir(), 0700);
    for (int attempt = 0; attempt < 5; ++attempt) {
      port_ = FreePort();
      std::string config = "ListenAddress 127.0.0.1\nPort " + std::to_string(port_) + "\nHostKey " + d +
                           "/host_key\nAuthorizedKeysFile " + d + "/authorized_keys\n"
                           "PidFile none\nUsePAM no\nStrictModes no\nPasswordAuthentication no\n"
                           "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
                           "PermitRootLogin prohibit-password\nPrintMotd no\nPrintLastLog no\nLogLevel VERBOSE\n"
                           "AllowUsers " + LoginName() + "\n"
                           "SetEnv XDG_CACHE_HOME=" + cache_dir() + " XDG_STATE_HOME=" + state_dir() + "\n";
      if (kind_ == Kind::kNoUserNamespaces) {
        e2e::WriteFile(d + "/no-userns.sh",
                       "#!/bin/sh\n"
                       "# The login's command in a user namespace that may make no other.\n"
                       "exec " + e2e::FindTool("unshare") + " --user --map-root-user -- /bin/sh -c "
                       "'echo 0 > /proc/sys/user/max_user_namespaces && exec /bin/sh -c \"$SSH_ORIGINAL_COMMAND\"'\n",
                       0755);
        config += "ForceCommand " + d + "/no-userns.sh\n";
      }
      e2e::WriteFile(d + "/sshd_config", config, 0600);
      std::vector<std::string> sshd = {"/usr/sbin/sshd", "-D", "-e", "-f", d + "/sshd_config", "-E", d + "/sshd.log"};
      e2e::Command c;
      if (getuid() == 0 && !e2e::IsDir("/run/sshd")) {
        // A /run of sshd's own with the host's entries in it, and /run/sshd.
        e2e::WriteFile(d + "/with-run.sh",
                       "#!/bin/sh\nset -e\naside=\"$1\"; shift\nmkdir -p \"$aside\"\n"
                       "mount -n --rbind /run \"$aside\"\nmount -n -t tmpfs -o mode=0755 tmpfs /run\n"
                       "for e in \"$aside\"/* \"$aside\"/.[!.]*; do\n"
                       "  [ -e \"$e\" ] || [ -L \"$e\" ] || continue\n  n=\"${e##*/}\"\n"
                       "  if [ -L \"$e\" ]; then cp -P \"$e\" \"/run/$n\"\n"
                       "  elif [ -d \"$e\" ]; then mkdir -p \"/run/$n\"; mount -n --rbind \"$e\" \"/run/$n\"\n"
                       "  else touch \"/run/$n\"; mount -n --bind \"$e\" \"/run/$n\"; fi\ndone\n"
                       "mkdir -m 0755 /run/sshd\nexec \"$@\"\n",
                       0755);
        c.argv = {e2e::FindTool("unshare"), "--mount", "--propagation", "private", "--", d + "/with-run.sh",
                  d + "/run-host"};
        c.argv.insert(c.argv.end(), sshd.begin(), sshd.end());
      } else {
        c.argv = sshd;
      }
      c.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"};
      c.timeout_ms = 3600 * 1000;
      process_ = std::make_unique<e2e::Process>(c);
      if (!process_->started()) return "sshd: " + process_->start_error();
      if (WaitListening()) break;
      const std::string log = e2e::ReadFile(d + "/sshd.log").value_or("");
      process_.reset();
      if (log.find("Address already in use") == std::string::npos) return "sshd did not start listening: " + log;
    }
    if (!process_) return "sshd found no free port";
    // The client's side: a Host alias, its key, and a known_hosts holding
    // the server's key (or, for the host key tests, another).
    TrustKey("host_key");
    e2e::WriteFile(ssh_config(),
                   "Host testremote\n  HostName 127.0.0.1\n  Port " + std::to_string(port_) + "\n  User " +
                       LoginName() + "\n  IdentityFile " + d + "/id\n  IdentitiesOnly yes\n  UserKnownHostsFile " +
                       known_hosts() + "\n  GlobalKnownHostsFile /dev/null\n",
                   0600);
    return "";
  }

  // Makes known_hosts trust `key` ("host_key": the server's; "other_host_key":
  // a key the server does not have; "": nothing).
  void TrustKey(const std::string& key) {
    std::string line;
    if (!key.empty()) {
      std::string pub = *e2e::ReadFile(dir_ / (key + ".pub"));
      pub = pub.substr(0, pub.find(' ', pub.find(' ') + 1));
      line = "[127.0.0.1]:" + std::to_string(port_) + " " + pub + "\n";
    }
    e2e::WriteFile(known_hosts(), line, 0600);
  }

  void Stop() {
    if (!process_) return;
    // Everything its connections left (sessions call setsid: not in its group).
    std::vector<pid_t> tree = ProcessTree(process_->pid());
    for (pid_t p : tree) kill(p, SIGKILL);
    process_.reset();  // kills sshd's group and reaps it
    Daemon_WaitGone(tree);
  }

  pid_t pid() const { return process_ ? process_->pid() : -1; }
  int port() const { return port_; }
  std::string ssh_config() const { return dir_ / "ssh_config"; }
  std::string known_hosts() const { return dir_ / "known_hosts"; }
  std::string cache_dir() const { return dir_ / "remote-cache"; }
  std::string state_dir() const { return dir_ / "remote-state"; }
  std::string log() const { return e2e::ReadFile(dir_ / "sshd.log").value_or(""); }
  // The policy of a session whose world is on this host.
  std::string Policy(const std::string& level = "os", const std::string& extra = "") const {
    return "version: 1\nmode: workspace-write\nsandbox:\n  isolation: remote\n  remote: { ssh: testremote, "
           "ssh_config: " + ssh_config() + ", level: " + level + " }\n" + extra;
  }

 private:
  static e2e::RunResult Run(const std::vector<std::string>& argv) {
    e2e::Command c;
    c.argv = argv;
    c.env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"};
    return e2e::RunCommand(c);
  }
  static int FreePort() {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    close(fd);
    return ntohs(a.sin_port);
  }
  bool WaitListening() {
    const long deadline = e2e::NowMs() + 10000;
    while (e2e::NowMs() < deadline) {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      struct sockaddr_in a {};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port_));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      const bool up = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
      close(fd);
      if (up) return true;
      if (waitpid(process_->pid(), nullptr, WNOHANG) != 0) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  static void Daemon_WaitGone(const std::vector<pid_t>& pids) {
    const long deadline = e2e::NowMs() + 5000;
    for (pid_t p : pids) {
      while (kill(p, 0) == 0 && e2e::NowMs() < deadline) {
        std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
        std::string line;
        std::getline(stat, line);
        const auto close = line.rfind(')');
        if (close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z') break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }

  Kind kind_;
  e2e::TempDir dir_{"agentbox-sshd-"};
  int port_ = 0;
  std::unique_ptr<e2e::Process> process_;
};

}  // namespace agentbox::session_test
