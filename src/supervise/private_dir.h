// The landlock-only backend's per-run private directory (HOME and TMPDIR
// point into it): created 0700 under a parent, removed with all it holds
// when the owner goes.
#pragma once

#include <memory>
#include <string>

#include "agentbox/status.h"

namespace agentbox::supervise {

class PrivateDir {
 public:
  // `parent`/agentbox-run-XXXXXX with `home` and `tmp` inside, all 0700.
  static Result<std::unique_ptr<PrivateDir>> Create(const std::string& parent);
  ~PrivateDir();
  PrivateDir(const PrivateDir&) = delete;
  PrivateDir& operator=(const PrivateDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  explicit PrivateDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace agentbox::supervise
