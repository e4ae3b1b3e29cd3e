// The secrets of credentials.secrets, held by the supervisor: read from
// their source at first use (environment variables at once, see below),
// kept in memory that is locked, left out of core dumps and zeroed in any
// child this process forks, and never logged. What the sandbox gets instead
// is a placeholder: a random token, unique per run and secret.
//
// Thread-safe: the proxy's thread reads values while a session's API call
// may rotate one.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "agentbox/policy.h"
#include "agentbox/status.h"

namespace agentbox::net {

// Bytes in pages of their own: mlock(2)ed, MADV_DONTDUMP, MADV_WIPEONFORK;
// zeroed before they are unmapped. Move-only.
class LockedBytes {
 public:
  LockedBytes() = default;
  static Result<LockedBytes> Copy(std::string_view data);
  ~LockedBytes();
  LockedBytes(LockedBytes&& other) noexcept;
  LockedBytes& operator=(LockedBytes&& other) noexcept;
  std::string_view view() const { return {data_, size_}; }
  bool empty() const { return size_ == 0; }

 private:
  char* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t mapped_ = 0;
};

// Zeroes a string's bytes (headers that carried a value) before it is freed.
void Wipe(std::string& s);

class SecretStore {
 public:
  // Makes a placeholder per secret. A secret `from: { env: NAME }` is taken
  // from the environment now, once per process, and its value in the
  // process's environment block is overwritten and the variable unset: a
  // process forked later (the sandbox's init among them) has no copy of it
  // in /proc/PID/environ. Files and commands are read at first use.
  static Result<std::shared_ptr<SecretStore>> Create(const std::vector<SecretSpec>& specs);

  // A store whose values were read elsewhere (a session's world gets them
  // from the daemon, which holds the sources): `values` by secret name,
  // wiped here. A secret without a value is an error.
  static Result<std::shared_ptr<SecretStore>> WithValues(const std::vector<SecretSpec>& specs,
                                                         std::vector<std::pair<std::string, std::string>>& values);

  // Every value, read from its source now (the daemon's side of a session:
  // the world needs them before its first request). `use` gets each
  // secret's name and value and must not keep the view.
  Status ForEachValue(const std::function<void(const std::string&, std::string_view)>& use);

  const std::vector<SecretSpec>& specs() const { return specs_; }
  const std::string& placeholder(std::size_t i) const { return placeholders_[i]; }
  // The index of the secret called `name`, or specs().size().
  std::size_t Find(const std::string& name) const;

  // Calls `use` with the value of secret `i`, reading it from its source
  // first if need be (a command is given 10 s). Errors name the secret and
  // its source, never a value. `use` runs under the store's lock and must
  // not keep the view.
  Status WithValue(std::size_t i, const std::function<void(std::string_view)>& use);

  // Replaces a secret's value (a session's rotation); the next request uses it.
  Status Rotate(const std::string& name, std::string_view value);

  // Test seam: a value as if read from its source.
  Status SetForTest(std::size_t i, std::string_view value);

 private:
  SecretStore() = default;
  std::vector<SecretSpec> specs_;
  std::vector<std::string> placeholders_;
  std::mutex mu_;
  std::vector<LockedBytes> values_;
};

// Takes an environment variable as an `env` source does (copied once per
// process, scrubbed from the environment) without using it: a secret whose
// value came from elsewhere (a rotation) leaves no copy behind either.
void ScrubEnvironmentSource(const std::string& name);

// "credentials.secrets.github (from env GH_TOKEN)" for errors and explain.
std::string DescribeSecret(const SecretSpec& spec);

}  // namespace agentbox::net
