#include "net/secrets.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>

#include "linux/host_program.h"

namespace agentbox::net {
namespace {

constexpr std::size_t kMaxSecretBytes = 64 * 1024;
constexpr int kCommandTimeoutMs = 10000;

std::string Hex(const unsigned char* p, std::size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < n; ++i) {
    out += kDigits[p[i] >> 4];
    out += kDigits[p[i] & 15];
  }
  return out;
}

// One trailing newline (LF or CRLF) is not part of a value read from a file
// or a command: `echo token > file` and `pass show` both add one.
std::string_view TrimNewline(std::string_view v) {
  if (v.ends_with("\r\n")) return v.substr(0, v.size() - 2);
  if (v.ends_with("\n")) return v.substr(0, v.size() - 1);
  return v;
}

Status Problem(const SecretSpec& spec, const std::string& what) {
  return Status::Error("credentials", DescribeSecret(spec) + ": " + what);
}

// Recognisable in a log, a header or a body, and of a token's shape; random
// per run and secret.
Result<std::string> MakePlaceholder(const SecretSpec& spec) {
  unsigned char r[20];
  if (RAND_bytes(r, sizeof r) != 1) return Problem(spec, "no randomness for its placeholder");
  return "agentbox-placeholder-" + spec.name + "-" + Hex(r, sizeof r);
}

// Environment variables taken once per process: the first store to need one
// copies it here and scrubs it from the environment; later stores (a daemon's
// next session) find it here.
std::mutex g_env_mu;
std::map<std::string, LockedBytes>& EnvValues() {
  static auto* values = new std::map<std::string, LockedBytes>();
  return *values;
}

Result<std::string_view> CaptureEnv(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_env_mu);
  auto& values = EnvValues();
  if (auto it = values.find(name); it != values.end()) return it->second.view();
  char* value = std::getenv(name.c_str());
  if (value == nullptr) return Status::Error("credentials", "not set");
  auto copy = LockedBytes::Copy(value);
  if (!copy.ok()) return copy.status();
  // The bytes getenv points at are the ones /proc/PID/environ shows (the
  // initial block on the stack, or a setenv copy): overwrite them, then
  // drop the variable so that nothing spawned from here inherits it.
  OPENSSL_cleanse(value, std::strlen(value));
  ::unsetenv(name.c_str());
  auto [it, inserted] = values.emplace(name, std::move(*copy));
  return it->second.view();
}

Result<LockedBytes> ReadFileSecret(const SecretSpec& spec) {
  int fd = ::open(spec.from.file.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return Problem(spec, std::string("cannot open: ") + std::strerror(errno));
  std::string data;
  char buf[4096];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      Wipe(data);
      return Problem(spec, std::string("cannot read: ") + std::strerror(err));
    }
    if (n == 0) break;
    data.append(buf, static_cast<std::size_t>(n));
    if (data.size() > kMaxSecretBytes) {
      ::close(fd);
      Wipe(data);
      return Problem(spec, "larger than 64 KiB");
    }
  }
  OPENSSL_cleanse(buf, sizeof buf);
  ::close(fd);
  auto locked = LockedBytes::Copy(TrimNewline(data));
  Wipe(data);
  return locked;
}

// Runs the command as agentbox runs every host program (linux/host_program.h:
// an empty stdin, a process group of its own that is killed once it has
// exited), bounded in time and size. Its stderr goes where the supervisor's
// goes: a password manager's prompt or complaint stays visible to the person.
Result<LockedBytes> RunCommandSecret(const SecretSpec& spec) {
  auto run = linux::RunHostProgram(spec.from.command, "", std::chrono::milliseconds(kCommandTimeoutMs),
                                   kMaxSecretBytes);
  if (!run.ok()) return Problem(spec, "cannot run it: " + run.status().message());
  std::string& data = run->output;
  std::string failed;
  switch (run->end) {
    case linux::ProgramRun::End::kTimedOut: failed = "the command did not finish within 10 s"; break;
    case linux::ProgramRun::End::kOutputTooLong: failed = "the command printed more than 64 KiB"; break;
    case linux::ProgramRun::End::kExited:
      if (!WIFEXITED(run->wait_status) || WEXITSTATUS(run->wait_status) != 0) {
        failed = "the command " + linux::DescribeWaitStatus(run->wait_status);
      }
      break;
  }
  if (!failed.empty()) {
    Wipe(data);
    return Problem(spec, failed);
  }
  auto locked = LockedBytes::Copy(TrimNewline(data));
  Wipe(data);
  return locked;
}

}  // namespace

void ScrubEnvironmentSource(const std::string& name) { (void)CaptureEnv(name); }

// --- LockedBytes ----------------------------------------------------------------

Result<LockedBytes> LockedBytes::Copy(std::string_view data) {
  LockedBytes b;
  if (data.empty()) return b;
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t len = (data.size() + page - 1) / page * page;
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Status::Errno("credentials", "mmap", std::to_string(len) + " bytes");
  // Locked: never written to swap. A limit too low for one page is an
  // error, not a quiet downgrade.
  if (::mlock(p, len) != 0) {
    int err = errno;
    ::munmap(p, len);
    return Status::Syscall("credentials", "mlock", "a secret's page (RLIMIT_MEMLOCK)", err);
  }
  ::madvise(p, len, MADV_DONTDUMP);
  ::madvise(p, len, MADV_WIPEONFORK);
  std::memcpy(p, data.data(), data.size());
  b.data_ = static_cast<char*>(p);
  b.size_ = data.size();
  b.mapped_ = len;
  return b;
}

LockedBytes::~LockedBytes() {
  if (data_ == nullptr) return;
  OPENSSL_cleanse(data_, mapped_);
  ::munlock(data_, mapped_);
  ::munmap(data_, mapped_);
}

LockedBytes::LockedBytes(LockedBytes&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)) {}

LockedBytes& LockedBytes::operator=(LockedBytes&& other) noexcept {
  if (this != &other) {
    LockedBytes old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

void Wipe(std::string& s) {
  if (!s.empty()) OPENSSL_cleanse(s.data(), s.size());
  s.clear();
  s.shrink_to_fit();
}

// --- SecretStore ----------------------------------------------------------------

std::string DescribeSecret(const SecretSpec& spec) {
  std::string from;
  switch (spec.from.kind) {
    case SecretSource::Kind::kEnv: from = "env " + spec.from.env; break;
    case SecretSource::Kind::kFile: from = "file " + spec.from.file; break;
    case SecretSource::Kind::kCommand:
      from = "command";
      for (const auto& a : spec.from.command) from += " " + a;
      break;
  }
  return "credentials.secrets." + spec.name + " (from " + from + ")";
}

Result<std::shared_ptr<SecretStore>> SecretStore::Create(const std::vector<SecretSpec>& specs) {
  std::shared_ptr<SecretStore> store(new SecretStore());
  store->specs_ = specs;
  store->values_.resize(specs.size());
  for (const auto& spec : specs) {
    auto placeholder = MakePlaceholder(spec);
    if (!placeholder.ok()) return placeholder.status();
    store->placeholders_.push_back(std::move(*placeholder));
  }
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].from.kind != SecretSource::Kind::kEnv) continue;
    auto v = CaptureEnv(specs[i].from.env);
    if (!v.ok()) return Problem(specs[i], v.status().message());
    auto copy = LockedBytes::Copy(*v);
    if (!copy.ok()) return Problem(specs[i], copy.status().message());
    if (copy->empty()) return Problem(specs[i], "empty");
    store->values_[i] = std::move(*copy);
  }
  return store;
}

Result<std::shared_ptr<SecretStore>> SecretStore::WithValues(const std::vector<SecretSpec>& specs,
                                                             std::vector<std::pair<std::string, std::string>>& values) {
  std::shared_ptr<SecretStore> store(new SecretStore());
  store->specs_ = specs;
  store->values_.resize(specs.size());
  Status failed;
  for (const auto& spec : specs) {
    auto placeholder = MakePlaceholder(spec);
    if (!placeholder.ok()) failed = placeholder.status();
    store->placeholders_.push_back(placeholder.ok() ? std::move(*placeholder) : std::string());
  }
  for (auto& [name, value] : values) {
    const std::size_t i = store->Find(name);
    if (i < specs.size() && failed.ok()) {
      auto copy = LockedBytes::Copy(value);
      if (copy.ok()) {
        store->values_[i] = std::move(*copy);
      } else {
        failed = Problem(specs[i], copy.status().message());
      }
    }
    Wipe(value);
  }
  if (!failed.ok()) return failed;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (store->values_[i].empty()) return Problem(specs[i], "no value was handed over");
  }
  return store;
}

Status SecretStore::ForEachValue(const std::function<void(const std::string&, std::string_view)>& use) {
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    if (Status s = WithValue(i, [&](std::string_view v) { use(specs_[i].name, v); }); !s.ok()) return s;
  }
  return {};
}

std::size_t SecretStore::Find(const std::string& name) const {
  for (std::size_t i = 0; i < specs_.size(); ++i) {
    if (specs_[i].name == name) return i;
  }
  return specs_.size();
}

Status SecretStore::WithValue(std::size_t i, const std::function<void(std::string_view)>& use) {
  std::lock_guard<std::mutex> lock(mu_);
  if (i >= specs_.size()) return Status::Error("credentials", "no such secret");
  if (values_[i].empty()) {
    const SecretSpec& spec = specs_[i];
    Result<LockedBytes> read = spec.from.kind == SecretSource::Kind::kFile ? ReadFileSecret(spec)
                                                                             : RunCommandSecret(spec);
    if (!read.ok()) return read.status();
    if (read->empty()) return Problem(spec, "empty");
    values_[i] = std::move(*read);
  }
  use(values_[i].view());
  return {};
}

Status SecretStore::Rotate(const std::string& name, std::string_view value) {
  const std::size_t i = Find(name);
  if (i == specs_.size()) return Status::Error("credentials", "no secret called " + name);
  if (value.empty()) return Problem(specs_[i], "a rotated value may not be empty");
  auto copy = LockedBytes::Copy(value);
  if (!copy.ok()) return copy.status();
  std::lock_guard<std::mutex> lock(mu_);
  values_[i] = std::move(*copy);
  return {};
}

Status SecretStore::SetForTest(std::size_t i, std::string_view value) {
  auto copy = LockedBytes::Copy(value);
  if (!copy.ok()) return copy.status();
  std::lock_guard<std::mutex> lock(mu_);
  values_[i] = std::move(*copy);
  return {};
}

}  // namespace agentbox::net
