// A session's services: named long-running processes in its world, not
// tied to a call (docs/sessions.md "Services").
//
// Each runs as a command of the world (the same keeper as a bash call:
// its own session, subreaper, signal scope) with no timeout, from a thread
// of its own here; its output goes to services/<name>.log under the
// session's directory. A service ends when it exits, when it is stopped or
// restarted (SIGTERM, SIGKILL after the policy's grace), and with its world.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "agentbox/status.h"
#include "session/world.h"

namespace agentbox::session {

struct ServiceSpec {
  std::string name;     // [A-Za-z0-9][A-Za-z0-9._-]{0,63}
  std::string command;  // bash -c
  std::string cwd;      // inside; relative: to the workspace ("" = the workspace)
  std::vector<std::pair<std::string, std::string>> env;  // added to the policy's
};

// Checks a spec (name, env names, command); a kBadRequest Status naming the problem.
Status ValidateServiceSpec(const ServiceSpec& spec);

// What a service runs in: the session's live world (provisioned if needed),
// its working directory inside and the kill grace.
struct ServiceWorld {
  std::shared_ptr<World> world;
  std::string cwd;
  std::uint64_t kill_grace_ms = 2000;
  int background_log_fd = -1;
};

class Services {
 public:
  using WorldFor = std::function<Result<ServiceWorld>()>;
  // `dir`: the session's directory (logs go to dir/services).
  Services(std::string dir, WorldFor world_for);
  ~Services();  // StopAll()

  // 409 (kConflict) when the name is taken; the service's status.
  Result<nlohmann::json> Start(const ServiceSpec& spec);
  Result<nlohmann::json> Restart(const std::string& name);
  // Ends it (it stays listed, exited); `forget`: and drops it from the list.
  Result<nlohmann::json> Stop(const std::string& name, bool forget);
  Result<nlohmann::json> Get(const std::string& name) const;
  nlohmann::json List() const;
  Result<std::string> LogPath(const std::string& name) const;
  // Whether it is running (for a log that follows it).
  bool Running(const std::string& name) const;
  // Ends every service and joins their threads (session removal, shutdown).
  void StopAll();

 private:
  struct Service;
  void Launch(const std::shared_ptr<Service>& svc);
  static void Halt(Service& svc);
  std::string LogFile(const std::string& name) const { return dir_ + "/services/" + name + ".log"; }

  std::string dir_;
  WorldFor world_for_;
  mutable std::mutex mu_;  // the map; each Service has its own lock for its state
  std::map<std::string, std::shared_ptr<Service>> services_;
};

}  // namespace agentbox::session
