#include "session/services.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>

#include "linux/fd.h"
#include "linux/session_shell.h"
#include "session/session.h"

namespace agentbox::session {

using nlohmann::json;

namespace {

constexpr int kStartWaitMs = 60000;  // provisioning plus the exec, at most
constexpr off_t kLogCap = 64 << 20;  // a service's log, across its restarts

std::string Now() {
  struct timespec ts {};
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm {};
  gmtime_r(&ts.tv_sec, &tm);
  char buf[40];
  strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  char out[48];
  snprintf(out, sizeof(out), "%s.%03dZ", buf, static_cast<int>(ts.tv_nsec / 1000000 % 1000));
  return out;
}

bool EnvName(const std::string& n) {
  if (n.empty() || n.size() > 128 || (n[0] >= '0' && n[0] <= '9')) return false;
  for (char c : n) {
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

}  // namespace

Status ValidateServiceSpec(const ServiceSpec& spec) {
  const std::string& n = spec.name;
  bool ok = !n.empty() && n.size() <= 64 && n[0] != '.' && n[0] != '-' && n[0] != '_';
  for (char c : n) {
    ok = ok && ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                c == '-');
  }
  if (!ok) {
    return Status::Error(kBadRequest, "service name '" + n +
                                          "' is not 1 to 64 of [A-Za-z0-9._-] starting with a letter or digit");
  }
  if (spec.command.empty()) return Status::Error(kBadRequest, "service " + n + ": field 'command' is required");
  if (spec.command.find('\0') != std::string::npos || spec.cwd.find('\0') != std::string::npos) {
    return Status::Error(kBadRequest, "service " + n + ": a NUL byte in command or cwd");
  }
  for (const auto& [k, v] : spec.env) {
    if (!EnvName(k)) return Status::Error(kBadRequest, "service " + n + ": env name '" + k + "' is not [A-Za-z_][A-Za-z0-9_]*");
    if (v.find('\0') != std::string::npos) return Status::Error(kBadRequest, "service " + n + ": env." + k + " holds a NUL byte");
  }
  return {};
}

struct Services::Service {
  ServiceSpec spec;
  std::mutex control;  // Start/Stop/Restart of this service, one at a time
  mutable std::mutex mu;
  std::condition_variable changed;
  std::string state = "starting";  // starting | running | exited
  std::optional<int> pid, exit_code, signal;
  std::string started, exited, error;
  std::uint64_t restarts = 0;
  bool stopped = false;  // ended by Stop/Restart
  std::atomic<bool> stop{false};
  std::thread thread;

  json Describe() const {
    std::lock_guard<std::mutex> lock(mu);
    json j = {{"name", spec.name}, {"command", spec.command}, {"cwd", spec.cwd}, {"state", state},
              {"started", started}, {"restarts", restarts}};
    if (pid) j["pid"] = *pid;
    if (state == "exited") {
      j["exited"] = exited;
      j["stopped"] = stopped;
      if (exit_code) j["exit_code"] = *exit_code;
      if (signal) j["signal"] = *signal;
      if (!error.empty()) j["error"] = error;
    }
    return j;
  }
};

Services::Services(std::string dir, WorldFor world_for) : dir_(std::move(dir)), world_for_(std::move(world_for)) {}

Services::~Services() { StopAll(); }

void Services::Launch(const std::shared_ptr<Service>& svc) {
  {
    std::lock_guard<std::mutex> lock(svc->mu);
    svc->state = "starting";
    svc->pid.reset();
    svc->exit_code.reset();
    svc->signal.reset();
    svc->error.clear();
    svc->exited.clear();
    svc->stopped = false;
    svc->started = Now();
  }
  svc->stop = false;
  svc->thread = std::thread([this, svc] {
    auto finish = [&](const std::string& error) {
      std::lock_guard<std::mutex> lock(svc->mu);
      svc->state = "exited";
      svc->exited = Now();
      if (!error.empty()) svc->error = error;
      svc->changed.notify_all();
    };
    auto w = world_for_();
    if (!w.ok()) return finish(w.status().ToString());
    const std::string log_path = LogFile(svc->spec.name);
    linux::UniqueFd log(open(log_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600));
    if (!log.valid()) return finish(Status::Errno("service", "open", log_path).ToString());
    std::string script;
    for (const auto& [k, v] : svc->spec.env) script += "export " + k + "=" + linux::ShellQuote(v) + "; ";
    script += svc->spec.command;
    WorldExec exec;
    exec.argv = {"bash", "-c", script};
    const std::string& cwd = svc->spec.cwd;
    exec.cwd = cwd.empty() ? w->cwd : cwd[0] == '/' ? cwd : w->cwd + "/" + cwd;
    exec.kill_grace_ms = w->kill_grace_ms;
    exec.output_cap = 4096;  // the output is in the log, not kept here
    exec.background_log_fd = w->background_log_fd;
    exec.stop = &svc->stop;
    exec.on_started = [&](int pid) {
      std::lock_guard<std::mutex> lock(svc->mu);
      svc->pid = pid;
      svc->state = "running";
      svc->changed.notify_all();
    };
    const int log_fd = log.get();
    bool capped = false;
    auto sink = [log_fd, &capped](std::string_view chunk) {
      if (capped) return;
      struct stat st {};
      if (fstat(log_fd, &st) == 0 && st.st_size + static_cast<off_t>(chunk.size()) > kLogCap) {
        (void)linux::WriteAll(log_fd, "\n[agentbox: the service's log is full (64 MiB); later output dropped]\n");
        capped = true;
        return;
      }
      (void)linux::WriteAll(log_fd, chunk);
    };
    auto r = w->world->Exec(exec, sink, nullptr);
    std::string error;
    if (!r.ok()) {
      error = r.status().ToString();
    } else {
      std::lock_guard<std::mutex> lock(svc->mu);
      svc->exit_code = r->exit_code;
      svc->signal = r->signal;
      if (r->exec_error) error = r->exec_error->ToString();
      if (r->world_died) error = "the session's sandbox ended";
    }
    finish(error);
  });
  std::unique_lock<std::mutex> lock(svc->mu);
  svc->changed.wait_for(lock, std::chrono::milliseconds(kStartWaitMs), [&] { return svc->state != "starting"; });
}

void Services::Halt(Service& svc) {
  svc.stop = true;
  if (svc.thread.joinable()) svc.thread.join();
  std::lock_guard<std::mutex> lock(svc.mu);
  svc.stopped = true;
}

Result<json> Services::Start(const ServiceSpec& spec) {
  if (Status v = ValidateServiceSpec(spec); !v.ok()) return v;
  auto svc = std::make_shared<Service>();
  svc->spec = spec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (services_.count(spec.name)) {
      return Status::Error(kConflict, "service '" + spec.name + "' exists (restart it, or delete it first)");
    }
    services_[spec.name] = svc;
  }
  mkdir((dir_ + "/services").c_str(), 0700);
  std::lock_guard<std::mutex> control(svc->control);
  Launch(svc);
  return svc->Describe();
}

Result<json> Services::Restart(const std::string& name) {
  std::shared_ptr<Service> svc;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = services_.find(name);
    if (it == services_.end()) return Status::Error(kNotFound, "no service '" + name + "'");
    svc = it->second;
  }
  std::lock_guard<std::mutex> control(svc->control);
  Halt(*svc);
  {
    std::lock_guard<std::mutex> lock(svc->mu);
    ++svc->restarts;
  }
  Launch(svc);
  return svc->Describe();
}

Result<json> Services::Stop(const std::string& name, bool forget) {
  std::shared_ptr<Service> svc;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = services_.find(name);
    if (it == services_.end()) return Status::Error(kNotFound, "no service '" + name + "'");
    svc = it->second;
  }
  std::lock_guard<std::mutex> control(svc->control);
  const bool was_running = [&] {
    std::lock_guard<std::mutex> lock(svc->mu);
    return svc->state != "exited";
  }();
  Halt(*svc);
  if (!was_running) {
    std::lock_guard<std::mutex> lock(svc->mu);
    svc->stopped = false;  // it had ended by itself
  }
  json j = svc->Describe();
  if (forget) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = services_.find(name);
    if (it != services_.end() && it->second == svc) services_.erase(it);
  }
  return j;
}

Result<json> Services::Get(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = services_.find(name);
  if (it == services_.end()) return Status::Error(kNotFound, "no service '" + name + "'");
  return it->second->Describe();
}

json Services::List() const {
  std::vector<std::shared_ptr<Service>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, svc] : services_) all.push_back(svc);
  }
  json out = json::array();
  for (const auto& svc : all) out.push_back(svc->Describe());
  return out;
}

Result<std::string> Services::LogPath(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!services_.count(name)) return Status::Error(kNotFound, "no service '" + name + "'");
  return LogFile(name);
}

bool Services::Running(const std::string& name) const {
  std::shared_ptr<Service> svc;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = services_.find(name);
    if (it == services_.end()) return false;
    svc = it->second;
  }
  std::lock_guard<std::mutex> lock(svc->mu);
  return svc->state != "exited";
}

void Services::StopAll() {
  std::vector<std::shared_ptr<Service>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, svc] : services_) all.push_back(svc);
  }
  for (auto& svc : all) svc->stop = true;  // all at once: one grace, not one each
  for (auto& svc : all) {
    std::lock_guard<std::mutex> control(svc->control);
    Halt(*svc);
  }
}

}  // namespace agentbox::session
