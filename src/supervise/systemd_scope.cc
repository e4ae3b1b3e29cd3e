#include "supervise/systemd_scope.h"

#include <sys/stat.h>
#include <unistd.h>

#include <sstream>

#include "linux/host_program.h"

extern char** environ;

namespace agentbox::supervise {
namespace {

std::string Get(const std::map<std::string, std::string>& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() ? "" : it->second;
}

bool IsSocket(const std::string& root, const std::string& path) {
  struct stat st {};
  const std::string real = root == "/" ? path : root + path;
  return stat(real.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

}  // namespace

SystemdScopeProbe ProbeSystemdScope(const std::map<std::string, std::string>& env, const std::string& root) {
  SystemdScopeProbe p;
  if (Get(env, kSystemdScopeEnv) == "1") {
    p.answer = SystemdScopeProbe::Answer::kAlreadyInScope;
    p.reason = std::string("re-executed under systemd-run already (") + kSystemdScopeEnv + "=1): not again";
    return p;
  }
  // The user manager: its private socket, or the user bus it listens on.
  const std::string runtime = Get(env, "XDG_RUNTIME_DIR");
  const std::string bus = Get(env, "DBUS_SESSION_BUS_ADDRESS");
  std::string found;
  if (!runtime.empty() && runtime[0] == '/' && IsSocket(root, runtime + "/systemd/private")) {
    found = "systemd user manager at " + runtime + "/systemd/private";
  } else if (bus.rfind("unix:path=", 0) == 0 &&
             IsSocket(root, bus.substr(10, bus.find(',') == std::string::npos ? std::string::npos : bus.find(',') - 10))) {
    found = "user D-Bus at " + bus;
  } else if (!runtime.empty() && runtime[0] == '/' && IsSocket(root, runtime + "/bus")) {
    found = "user D-Bus at " + runtime + "/bus";
  }
  if (found.empty()) {
    p.reason = "no systemd user manager (" +
               (runtime.empty() ? std::string("XDG_RUNTIME_DIR is unset")
                                : "no socket at " + runtime + "/systemd/private or " + runtime + "/bus") +
               (bus.empty() ? ", DBUS_SESSION_BUS_ADDRESS is unset" : ", none at " + bus) + ")";
    return p;
  }
  p.systemd_run = linux::FindOnPath(root, Get(env, "PATH"), "systemd-run");
  if (p.systemd_run.empty()) {
    p.reason = found + ", but no systemd-run on PATH";
    return p;
  }
  p.answer = SystemdScopeProbe::Answer::kReexec;
  p.reason = found;
  return p;
}

std::map<std::string, std::string> CurrentEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

std::vector<std::string> SystemdScopeArgv(const std::string& systemd_run, const std::string& self,
                                          const std::vector<std::string>& args) {
  std::vector<std::string> argv = {systemd_run, "--user", "--scope", "-p", "Delegate=yes", "--quiet", "--", self};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

}  // namespace agentbox::supervise
