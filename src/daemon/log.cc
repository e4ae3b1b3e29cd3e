#include "daemon/log.h"

#include <fcntl.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace agentbox::daemon {

std::string UtcNow() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  tm t{};
  gmtime_r(&ts.tv_sec, &t);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", t.tm_year + 1900, t.tm_mon + 1, t.tm_mday,
                t.tm_hour, t.tm_min, t.tm_sec, ts.tv_nsec / 1000000);
  return buf;
}

Logger::Logger() : fd_(STDERR_FILENO), owned_(false) {}

Result<std::unique_ptr<Logger>> Logger::ToFile(const std::string& path) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return Status::Errno("log", "open", path);
  return std::unique_ptr<Logger>(new Logger(fd, true));
}

Logger::~Logger() {
  if (owned_) close(fd_);
}

void Logger::Log(Level level, const std::string& event, const nlohmann::json& fields) {
  nlohmann::json line = {{"time", UtcNow()},
                         {"level", level == Level::kInfo ? "info" : level == Level::kWarn ? "warn" : "error"},
                         {"event", event}};
  for (auto it = fields.begin(); it != fields.end(); ++it) line[it.key()] = it.value();
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text += '\n';
  std::lock_guard lock(mu_);
  size_t off = 0;
  while (off < text.size()) {
    ssize_t n = write(fd_, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nowhere to report a failing log
    off += static_cast<size_t>(n);
  }
}

}  // namespace agentbox::daemon
