// Errors as values.
//
// A Status names the step that failed, the syscall (with its key argument,
// usually a path) and errno, so that a failure can be reported to a user or an
// agent without guessing. Result<T> is a value or a Status. Neither throws.
#pragma once

#include <cerrno>
#include <string>
#include <utility>
#include <variant>

namespace agentbox {

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK

  // A failure at `stage` (a setup step, "policy", "exec", ...).
  static Status Error(std::string stage, std::string message) {
    return Status(std::move(stage), std::move(message), /*syscall=*/"", /*path=*/"", 0);
  }
  // A failed syscall: errno is kept, the key argument named.
  static Status Syscall(std::string stage, std::string syscall, std::string path, int err) {
    return Status(std::move(stage), "", std::move(syscall), std::move(path), err);
  }
  // The current errno, captured at the call site.
  static Status Errno(std::string stage, std::string syscall, std::string path = "") {
    return Syscall(std::move(stage), std::move(syscall), std::move(path), errno);
  }

  bool ok() const { return stage_.empty() && message_.empty() && err_ == 0; }
  const std::string& stage() const { return stage_; }
  const std::string& syscall() const { return syscall_; }
  const std::string& path() const { return path_; }
  int err() const { return err_; }
  // "mount(/usr): Permission denied" or the plain message.
  std::string message() const;
  // "stage: message"
  std::string ToString() const;

  // Adds context in front of the message, keeping errno and syscall.
  Status WithContext(const std::string& context) const;

 private:
  Status(std::string stage, std::string message, std::string syscall, std::string path, int err)
      : stage_(std::move(stage)), message_(std::move(message)), syscall_(std::move(syscall)),
        path_(std::move(path)), err_(err) {}

  std::string stage_;
  std::string message_;
  std::string syscall_;
  std::string path_;
  int err_ = 0;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}            // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}     // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const { return std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace agentbox
