// Structured logs: one JSON object per line, written whole with one write(2)
// so that lines from several threads never interleave.
//
//   {"time":"2025-01-02T03:04:05.678Z","level":"info","event":"request",
//    "method":"POST","path":"/v1/sessions/ID/execute","status":200,
//    "duration_ms":4,"session":"ID","call_id":"c1"}
//
// Thread-safe.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "agentbox/status.h"

namespace agentbox::daemon {

enum class Level { kInfo, kWarn, kError };

class Logger {
 public:
  // Logs to stderr.
  Logger();
  // Logs to `path`, appended to, created 0600.
  static Result<std::unique_ptr<Logger>> ToFile(const std::string& path);
  ~Logger();
  Logger(const Logger&) = delete;
  Logger& operator=(const Logger&) = delete;

  // Writes {"time", "level", "event", ...fields}.
  void Log(Level level, const std::string& event, const nlohmann::json& fields = nlohmann::json::object());

 private:
  explicit Logger(int fd, bool owned) : fd_(fd), owned_(owned) {}
  int fd_;
  bool owned_;
  std::mutex mu_;
};

// "2025-01-02T03:04:05.678Z", now.
std::string UtcNow();

}  // namespace agentbox::daemon
