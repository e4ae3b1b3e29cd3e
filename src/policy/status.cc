#include "agentbox/status.h"

#include <cstring>

namespace agentbox {
namespace {

// strerror_r comes in two flavours: GNU returns the text, XSI fills the buffer
// and returns 0. Overloading on the return type accepts either, so the code
// stays thread-safe (plain strerror may share one buffer) on glibc and musl.
[[maybe_unused]] const char* StrerrorText(const char* gnu_result, const char* /*buf*/) {
  return gnu_result;
}
[[maybe_unused]] const char* StrerrorText(int xsi_result, const char* buf) {
  return xsi_result == 0 ? buf : "Unknown error";
}

std::string StrerrorMessage(int err) {
  char buf[256] = {};
  return StrerrorText(strerror_r(err, buf, sizeof buf), buf);
}

}  // namespace

std::string Status::message() const {
  if (syscall_.empty()) return message_;
  std::string out = syscall_;
  if (!path_.empty()) out += "(" + path_ + ")";
  out += ": " + StrerrorMessage(err_);
  if (!message_.empty()) out += " — " + message_;
  return out;
}

std::string Status::ToString() const { return stage_ + ": " + message(); }

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  std::string message = message_.empty() ? context : context + ": " + message_;
  return Status(stage_, std::move(message), syscall_, path_, err_);
}

}  // namespace agentbox
