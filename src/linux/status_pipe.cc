#include "linux/status_pipe.h"

#include <unistd.h>

#include <cerrno>
#include <nlohmann/json.hpp>

namespace agentbox::linux {

using nlohmann::json;

void WriteMessage(int fd, const RunnerMessage& m) {
  json j;
  switch (m.type) {
    case RunnerMessage::Type::kSetupError:
    case RunnerMessage::Type::kExecError:
      j["t"] = m.type == RunnerMessage::Type::kSetupError ? "setup_error" : "exec_error";
      j["stage"] = m.status.stage();
      j["syscall"] = m.status.syscall();
      j["path"] = m.status.path();
      j["errno"] = m.status.err();
      j["message"] = m.status.err() != 0 || !m.status.syscall().empty() ? "" : m.status.message();
      break;
    case RunnerMessage::Type::kExit:
      j["t"] = "exit";
      j["code"] = m.exit_code;
      j["signal"] = m.signal;
      if (m.sandbox_empty) {
        j["empty"] = true;
        j["utime_us"] = m.cpu_user_us;
        j["stime_us"] = m.cpu_sys_us;
        j["maxrss_kib"] = m.max_rss_kib;
      }
      break;
    case RunnerMessage::Type::kReady:
      j["t"] = "ready";
      break;
    case RunnerMessage::Type::kLandlock:
      j["t"] = "landlock";
      j["abi"] = m.landlock_abi;
      j["short_of_plan"] = m.short_of_plan;
      break;
    case RunnerMessage::Type::kSeccompDenials:
      j["t"] = "seccomp";
      j["denied"] = json::array();
      for (const auto& [name, count] : m.denied) j["denied"].push_back({{"syscall", name}, {"count", count}});
      break;
  }
  std::string line = j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  if (line.size() > 4000) line = line.substr(0, 3990) + "\"}\n";  // stay atomic (PIPE_BUF)
  ssize_t r;
  do {
    r = write(fd, line.data(), line.size());
  } while (r < 0 && errno == EINTR);
}

bool ParseMessage(const std::string& line, RunnerMessage* m) {
  try {
    json j = json::parse(line);
    std::string t = j.at("t").get<std::string>();
    if (t == "landlock") {
      m->type = RunnerMessage::Type::kLandlock;
      m->landlock_abi = j.at("abi").get<int>();
      m->short_of_plan = j.at("short_of_plan").get<std::vector<std::string>>();
      return true;
    }
    if (t == "seccomp") {
      m->type = RunnerMessage::Type::kSeccompDenials;
      for (const auto& d : j.at("denied")) {
        m->denied.emplace_back(d.at("syscall").get<std::string>(), d.at("count").get<std::uint64_t>());
      }
      return true;
    }
    if (t == "ready") {
      m->type = RunnerMessage::Type::kReady;
      return true;
    }
    if (t == "exit") {
      m->type = RunnerMessage::Type::kExit;
      m->exit_code = j.at("code").get<int>();
      m->signal = j.at("signal").get<int>();
      m->sandbox_empty = j.value("empty", false);
      if (m->sandbox_empty) {
        m->cpu_user_us = j.at("utime_us").get<std::uint64_t>();
        m->cpu_sys_us = j.at("stime_us").get<std::uint64_t>();
        m->max_rss_kib = j.at("maxrss_kib").get<std::uint64_t>();
      }
      return true;
    }
    m->type = t == "exec_error" ? RunnerMessage::Type::kExecError : RunnerMessage::Type::kSetupError;
    std::string syscall = j.value("syscall", "");
    if (!syscall.empty() || j.value("errno", 0) != 0) {
      m->status = Status::Syscall(j.value("stage", "runner"), syscall, j.value("path", ""), j.value("errno", 0));
    } else {
      m->status = Status::Error(j.value("stage", "runner"), j.value("message", ""));
    }
    return true;
  } catch (...) {
    return false;
  }
}

bool StatusReader::Read(int fd, std::vector<RunnerMessage>* out) {
  char buf[8192];
  ssize_t got;
  do {
    got = read(fd, buf, sizeof(buf));
  } while (got < 0 && errno == EINTR);
  if (got <= 0) return false;
  partial_.append(buf, static_cast<size_t>(got));
  size_t start = 0;
  for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
    RunnerMessage m;
    if (ParseMessage(partial_.substr(start, nl - start), &m)) out->push_back(std::move(m));
  }
  partial_.erase(0, start);
  return true;
}

}  // namespace agentbox::linux
