// Policy file parsing (DESIGN §3): yaml-cpp builds the node tree, this file
// checks it strictly against the schema and fills a Policy.
//
// Every error names "<source>:<line>:<column>: <key.path>: <what>", pointing
// at the offending value (or key). yaml-cpp exceptions never escape.
#include <fcntl.h>
#include <unistd.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "agentbox/policy.h"
#include "policy/checks.h"
#include "policy/sha256.h"

namespace agentbox {
namespace {

using policy_internal::BasicUsernameProblem;
using policy_internal::CacheNameProblem;
using policy_internal::CheckGitRemote;
using policy_internal::CheckHostName;
using policy_internal::CheckPath;
using policy_internal::CheckKubernetesName;
using policy_internal::CheckSshDestination;
using policy_internal::CredentialsInSandboxName;
using policy_internal::DomainList;
using policy_internal::DomainProblem;
using policy_internal::EnvNameProblem;
using policy_internal::EnvPassProblem;
using policy_internal::EnvSecretProblem;
using policy_internal::EnvUse;
using policy_internal::FormatNumber;
using policy_internal::GrantPathProblem;
using policy_internal::HeaderFormatProblem;
using policy_internal::HeaderNameProblem;
using policy_internal::HostPattern;
using policy_internal::HttpRuleProblem;
using policy_internal::InspectTlsProblem;
using policy_internal::IsValidUtf8;
using policy_internal::ParseUpstreamUrl;
using policy_internal::PathRule;
using policy_internal::RefPatternProblem;
using policy_internal::SecretNameProblem;
using policy_internal::SecretsModeProblem;
using policy_internal::UpstreamUrl;

// A value in the document, with its key path ("resources.cpu.limit") and the
// place an error about it should point at.
struct Field {
  YAML::Node node;
  std::string path;
  YAML::Mark mark;      // the value, or its key when the value is empty
  YAML::Mark key_mark;  // the key (for map entries), else same as `mark`
};

template <typename E>
const char* EnumName(E value) {
  return ToString(value);
}
const char* EnumName(CredentialsInSandbox value) { return CredentialsInSandboxName(value); }

// A number exactly as YAML wrote it ("0.5", "2", "1e3"), or nothing.
std::optional<double> AsNumber(const std::string& text) {
  double value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || !std::isfinite(value)) return std::nullopt;
  return value;
}

// `value * unit`, rounded, if it is a positive count that fits in 64 bits.
enum class ScaleResult { kOk, kNotPositive, kTooLarge };
ScaleResult ScalePositive(double value, double unit, std::uint64_t max, std::uint64_t& out) {
  if (!(value > 0)) return ScaleResult::kNotPositive;
  double scaled = std::round(value * unit);
  if (!(scaled <= static_cast<double>(max))) return ScaleResult::kTooLarge;
  if (scaled < 1) return ScaleResult::kNotPositive;
  out = static_cast<std::uint64_t>(scaled);
  return ScaleResult::kOk;
}

// Records where each document's root starts and whether it is empty.
// Used instead of YAML::LoadAll, which in yaml-cpp 0.7 never returns on a
// stray token at document level such as "&a," (jbeder/yaml-cpp#1040, fixed
// upstream after 0.7): like the upstream fix, counting stops at the first
// empty document.
class DocumentProbe : public YAML::EventHandler {
 public:
  bool empty() const { return empty_; }
  const YAML::Mark& root_mark() const { return root_mark_; }

  void OnDocumentStart(const YAML::Mark& mark) override {
    empty_ = true;
    seen_root_ = false;
    root_mark_ = mark;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { Root(mark, /*empty=*/true); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { Root(mark, false); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    Root(mark, false);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    Root(mark, false);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Root(mark, false);
  }
  void OnMapEnd() override {}

 private:
  void Root(const YAML::Mark& mark, bool empty) {
    if (seen_root_) return;
    seen_root_ = true;
    empty_ = empty;
    root_mark_ = mark;
  }

  bool empty_ = true;
  bool seen_root_ = false;
  YAML::Mark root_mark_;
};

class Parser {
 public:
  // With `errors`, every error is collected there (ForEachKey and
  // ForEachItem go on with the next key or item after one fails), and
  // Parse() still returns the first; without, parsing stops at the first.
  Parser(const std::string& text, const std::string& source, std::vector<Status>* errors = nullptr)
      : text_(text), source_(source), errors_(errors) {}

  Result<Policy> Parse() const;

 private:
  using KeyFn = std::function<Status(const std::string& key, const Field& value)>;
  using ItemFn = std::function<Status(const Field& item)>;

  Status Fail(const YAML::Mark& mark, const std::string& path, const std::string& what) const;
  // Collecting: records `status` once (a nested key's error comes up
  // through every enclosing ForEachKey) and says to go on. Else: stop.
  bool Continue(const Status& status, Status& first) const;
  Status Fail(const Field& field, const std::string& what) const {
    return Fail(field.mark, field.path, what);
  }

  std::optional<std::string> NullTokenAt(const YAML::Mark& mark) const;
  std::string Describe(const Field& field) const;

  // Structure. `allowed` empty means any key (env.set).
  Status ForEachKey(const Field& map, std::initializer_list<const char*> allowed,
                    const KeyFn& fn) const;
  Status ForEachItem(const Field& list, const ItemFn& fn) const;
  // A map entry or list item as ForEachKey / ForEachItem present it.
  Field Entry(const Field& map, const YAML::Node& key, const YAML::Node& value) const;
  static Field Item(const Field& list, std::size_t index, const YAML::Node& item);
  // Looks up what ForEachKey / ForEachItem have already accepted, for checks
  // that span sections (which may come in any order).
  std::optional<Field> Child(const Field& map, const std::string& key) const;
  std::optional<Field> ChildItem(const Field& list, std::size_t index) const;
  // After ForEachKey accepted `map`: a missing key is an error at the map's key.
  Status RequireKeys(const Field& map, std::initializer_list<const char*> keys) const;

  // Leaves.
  Status ReadString(const Field& f, std::string& out) const;
  Status ReadBool(const Field& f, bool& out) const;
  template <typename E>
  Status ReadEnum(const Field& f, std::initializer_list<E> values, E& out) const;
  Status ReadPositive(const Field& f, double max, double& out) const;
  Status ReadCount(const Field& f, std::uint64_t max, std::uint64_t& out) const;
  Status ReadBytes(const Field& f, std::uint64_t& out) const;
  Status ReadDuration(const Field& f, std::uint64_t& out) const;
  Status ReadPaths(const Field& f, PathRule rule, std::vector<std::string>& out) const;
  Status ReadDomains(const Field& f, DomainList list, std::vector<std::string>& out) const;
  Status ReadPorts(const Field& f, std::vector<std::uint16_t>& out) const;
  Status ReadEnvName(const Field& f, std::string& out) const;
  // A duration with its unit (a bare number could mean seconds or minutes), > 0.
  Status ReadPositiveDuration(const Field& f, const char* example, std::uint64_t& out_ms) const;
  Status ReadHosts(const Field& f, HostPattern pattern, std::vector<std::string>& out) const;
  Status ReadInspectTls(const Field& f, NetworkSpec& out) const;

  // Sections. ParseSection dispatches a top-level key (already checked
  // against the allowed set) to its parser.
  Status ParseSection(const std::string& key, const Field& value, Policy& policy) const;
  Status ParseVersion(const Field& f, int& out) const;
  Status ParseSandbox(const Field& f, SandboxSpec& out) const;
  Status ParseRemote(const Field& f, RemoteSpec& out) const;
  Status CheckRemote(const Field& root, const Policy& policy) const;
  Status ParseFilesystem(const Field& f, FilesystemSpec& out) const;
  Status ParseNetwork(const Field& f, NetworkSpec& out) const;
  Status ParseHttpRules(const Field& f, std::vector<HttpRuleSpec>& out) const;
  Status ParseCredentials(const Field& f, CredentialsSpec& out) const;
  Status ParseGit(const Field& f, CredentialsSpec& out) const;
  Status ParseGitPush(const Field& f, GitPushSpec& out) const;
  Status ParseSecrets(const Field& f, std::vector<SecretSpec>& out) const;
  Status ParseSecret(const Field& f, const std::vector<SecretSpec>& earlier, SecretSpec& out) const;
  Status ParseSecretSource(const Field& f, SecretSource& out) const;
  Status ParseInjection(const Field& f, SecretInjection& out) const;
  Status ParseResources(const Field& f, ResourcesSpec& out) const;
  Status ParseEnv(const Field& f, EnvSpec& out) const;
  Status ParseCaches(const Field& f, std::vector<CacheSpec>& out) const;
  Status ParseHome(const Field& f, HomeSpec& out) const;
  Status ParseOnViolation(const Field& f, OnViolationSpec& out) const;
  Status ParseMaxGrant(const Field& f, MaxGrantSpec& out) const;
  Status ParseDiff(const Field& f, DiffSpec& out) const;
  Status ParseSession(const Field& f, SessionSpec& out) const;
  Status ParseTools(const Field& f, ToolsSpec& out) const;
  Status ParseUpstream(const Field& f, UpstreamSpec& out) const;
  Status CheckUpstreams(const Field& root, const Policy& policy) const;
  // Secrets against the mode and the environment, once every section is read.
  Status CheckSecrets(const Field& root, const Policy& policy) const;
  // Network keys against each other, once the whole section is read.
  Status CheckNetwork(const Field& root, const Policy& policy) const;
  // on_violation.max_grant's paths against the deny lists.
  Status CheckMaxGrant(const Field& root, const Policy& policy) const;

  const std::string& text_;
  const std::string& source_;
  std::vector<Status>* errors_;
};

bool Parser::Continue(const Status& status, Status& first) const {
  if (first.ok()) first = status;
  if (!errors_) return false;
  const std::string text = status.message();
  if (std::none_of(errors_->begin(), errors_->end(), [&](const Status& e) { return e.message() == text; })) {
    errors_->push_back(status);
  }
  return true;
}

Status Parser::Fail(const YAML::Mark& mark, const std::string& path,
                    const std::string& what) const {
  // yaml-cpp marks are 0-based and -1 when unknown; editors count from 1.
  std::string where = source_ + ":" + std::to_string(std::max(mark.line, 0) + 1) + ":" +
                      std::to_string(std::max(mark.column, 0) + 1) + ": ";
  if (!path.empty()) where += path + ": ";
  return Status::Error("policy", where + what);
}

// yaml-cpp turns a plain `~` or `null` into a null node and forgets the
// text. Policy strings are taken as written ("~" is the home directory), so
// the token is read back from the source at the node's mark.
std::optional<std::string> Parser::NullTokenAt(const YAML::Mark& mark) const {
  if (mark.pos < 0 || static_cast<std::size_t>(mark.pos) >= text_.size()) return std::nullopt;
  std::size_t end = text_.find_first_of(" \t\r\n,]}#", static_cast<std::size_t>(mark.pos));
  if (end == std::string::npos) end = text_.size();
  std::string token = text_.substr(static_cast<std::size_t>(mark.pos), end - mark.pos);
  if (token == "~" || token == "null" || token == "Null" || token == "NULL") return token;
  return std::nullopt;
}

std::string Parser::Describe(const Field& f) const {
  switch (f.node.Type()) {
    case YAML::NodeType::Map: return "a map";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Scalar: return "\"" + f.node.Scalar() + "\"";
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined: break;
  }
  if (auto token = NullTokenAt(f.mark)) return *token;
  return "nothing";
}

Status Parser::ForEachKey(const Field& map, std::initializer_list<const char*> allowed,
                          const KeyFn& fn) const {
  if (!map.node.IsMap()) return Fail(map, "expected a map, got " + Describe(map));
  // yaml-cpp keeps every entry of a map, duplicates included, but a lookup
  // returns only the first: report the second instead of ignoring it.
  std::vector<std::string> seen;
  Status first;
  // yaml-cpp's `it->first` is a member of a temporary proxy; bind the
  // dereferenced pair itself (range-for keeps it alive) and copy the nodes.
  for (const auto& entry : map.node) {
    const YAML::Node key = entry.first;
    const YAML::Node value = entry.second;
    Field key_field{key, map.path, key.Mark(), key.Mark()};
    if (!key.IsScalar()) {
      if (Continue(Fail(key_field, "keys must be strings, got " + Describe(key_field)), first)) continue;
      return first;
    }
    const std::string& name = key.Scalar();
    Field field = Entry(map, key, value);
    if (std::find(seen.begin(), seen.end(), name) != seen.end()) {
      if (Continue(Fail(key.Mark(), field.path, "duplicate key"), first)) continue;
      return first;
    }
    seen.push_back(name);
    if (allowed.size() != 0 &&
        std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return name == a; })) {
      std::string expected;
      for (const char* a : allowed) expected += (expected.empty() ? "" : ", ") + std::string(a);
      if (Continue(Fail(key.Mark(), field.path, "unknown key (expected one of: " + expected + ")"), first)) continue;
      return first;
    }
    Status status = fn(name, field);
    if (!status.ok() && !Continue(status, first)) return first;
  }
  return first;
}

Status Parser::ForEachItem(const Field& list, const ItemFn& fn) const {
  if (!list.node.IsSequence()) return Fail(list, "expected a list, got " + Describe(list));
  std::size_t index = 0;
  Status first;
  for (const YAML::Node& item : list.node) {
    Status status = fn(Item(list, index++, item));
    if (!status.ok() && !Continue(status, first)) return first;
  }
  return first;
}

Field Parser::Entry(const Field& map, const YAML::Node& key, const YAML::Node& value) const {
  const std::string& name = key.Scalar();
  std::string path = map.path.empty() ? name : map.path + "." + name;
  // An empty value's mark points at whatever token follows it; the key is
  // a better place to point at.
  YAML::Mark mark = value.Mark();
  if (value.IsNull() && !NullTokenAt(mark)) mark = key.Mark();
  return Field{value, path, mark, key.Mark()};
}

Field Parser::Item(const Field& list, std::size_t index, const YAML::Node& item) {
  return Field{item, list.path + "[" + std::to_string(index) + "]", item.Mark(), item.Mark()};
}

std::optional<Field> Parser::Child(const Field& map, const std::string& key) const {
  if (!map.node.IsMap()) return std::nullopt;
  for (const auto& entry : map.node) {
    const YAML::Node k = entry.first;
    const YAML::Node v = entry.second;
    if (k.IsScalar() && k.Scalar() == key) return Entry(map, k, v);
  }
  return std::nullopt;
}

std::optional<Field> Parser::ChildItem(const Field& list, std::size_t index) const {
  if (!list.node.IsSequence() || index >= list.node.size()) return std::nullopt;
  return Item(list, index, list.node[index]);
}

Status Parser::RequireKeys(const Field& map, std::initializer_list<const char*> keys) const {
  for (const char* key : keys) {
    if (!Child(map, key)) return Fail(map.key_mark, map.path, std::string("missing key \"") + key + "\"");
  }
  return Status();
}

Status Parser::ReadString(const Field& f, std::string& out) const {
  if (f.node.IsScalar()) {
    out = f.node.Scalar();
  } else if (auto token = f.node.IsNull() ? NullTokenAt(f.mark) : std::nullopt) {
    out = *token;
  } else {
    return Fail(f, "expected a string, got " + Describe(f));
  }
  if (!IsValidUtf8(out)) return Fail(f, "not valid UTF-8");
  return Status();
}

Status Parser::ReadBool(const Field& f, bool& out) const {
  // YAML 1.2 booleans only: "yes"/"on" are a classic source of surprises.
  std::string_view text = f.node.IsScalar() ? std::string_view(f.node.Scalar()) : "";
  if (text == "true" || text == "True" || text == "TRUE") {
    out = true;
  } else if (text == "false" || text == "False" || text == "FALSE") {
    out = false;
  } else {
    return Fail(f, "expected true or false, got " + Describe(f));
  }
  return Status();
}

template <typename E>
Status Parser::ReadEnum(const Field& f, std::initializer_list<E> values, E& out) const {
  std::string expected;
  for (E value : values) {
    if (f.node.IsScalar() && f.node.Scalar() == EnumName(value)) {
      out = value;
      return Status();
    }
    expected += (expected.empty() ? "" : ", ") + std::string(EnumName(value));
  }
  if (!f.node.IsScalar()) return Fail(f, "expected one of " + expected + ", got " + Describe(f));
  return Fail(f, "unknown value " + Describe(f) + " (expected one of: " + expected + ")");
}

Status Parser::ReadPositive(const Field& f, double max, double& out) const {
  std::optional<double> value = f.node.IsScalar() ? AsNumber(f.node.Scalar()) : std::nullopt;
  if (!value) return Fail(f, "expected a number, got " + Describe(f));
  if (!(*value > 0)) return Fail(f, "must be > 0");
  if (!(*value <= max)) return Fail(f, "is larger than the maximum, " + FormatNumber(max));
  out = *value;
  return Status();
}

Status Parser::ReadCount(const Field& f, std::uint64_t max, std::uint64_t& out) const {
  const std::string text = f.node.IsScalar() ? f.node.Scalar() : "";
  std::uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  bool digits_only = !text.empty() && std::all_of(text.begin(), text.end(),
                                                  [](char c) { return c >= '0' && c <= '9'; });
  if (!digits_only || (ec != std::errc() && ec != std::errc::result_out_of_range) ||
      ptr != text.data() + text.size()) {
    return Fail(f, "expected a whole number ≥ 1, got " + Describe(f));
  }
  if (ec == std::errc::result_out_of_range) {
    return Fail(f, "is larger than the maximum, " + std::to_string(max));
  }
  if (value == 0) return Fail(f, "must be ≥ 1");
  if (value > max) return Fail(f, "is larger than the maximum, " + std::to_string(max));
  out = value;
  return Status();
}

// A bare number is in GiB (the key says so); a string carries its own unit.
Status Parser::ReadBytes(const Field& f, std::uint64_t& out) const {
  if (!f.node.IsScalar()) return Fail(f, "expected a number of GiB or a size, got " + Describe(f));
  const std::string& text = f.node.Scalar();
  if (std::optional<double> gib = AsNumber(text)) {
    switch (ScalePositive(*gib, 1024.0 * 1024.0 * 1024.0, kMaxSizeBytes, out)) {
      case ScaleResult::kOk: return Status();
      case ScaleResult::kNotPositive: return Fail(f, "must be > 0");
      case ScaleResult::kTooLarge: return Fail(f, "is larger than the maximum, 1048576 GiB (1024Ti)");
    }
  }
  Result<std::uint64_t> bytes = ParseSize(text);
  if (!bytes.ok()) return Fail(f, bytes.status().message());
  out = *bytes;
  return Status();
}

// A bare number is in minutes (the key says so); a string carries its unit.
Status Parser::ReadDuration(const Field& f, std::uint64_t& out) const {
  if (!f.node.IsScalar()) {
    return Fail(f, "expected a number of minutes or a duration, got " + Describe(f));
  }
  const std::string& text = f.node.Scalar();
  if (std::optional<double> minutes = AsNumber(text)) {
    switch (ScalePositive(*minutes, 60.0 * 1000.0, kMaxDurationMs, out)) {
      case ScaleResult::kOk: return Status();
      case ScaleResult::kNotPositive: return Fail(f, "must be > 0");
      case ScaleResult::kTooLarge: return Fail(f, "is longer than the maximum, 10080 minutes (168h)");
    }
  }
  Result<std::uint64_t> ms = ParseDurationMs(text);
  if (!ms.ok()) return Fail(f, ms.status().message());
  out = *ms;
  return Status();
}

Status Parser::ReadPaths(const Field& f, PathRule rule, std::vector<std::string>& out) const {
  std::vector<std::string> paths;
  Status status = ForEachItem(f, [&](const Field& item) {
    std::string path;
    if (Status s = ReadString(item, path); !s.ok()) return s;
    if (auto problem = CheckPath(path, rule)) return Fail(item, *problem);
    paths.push_back(std::move(path));
    return Status();
  });
  if (!status.ok()) return status;
  out = std::move(paths);  // a list in the file replaces the preset's
  return Status();
}

Status Parser::ReadDomains(const Field& f, DomainList list, std::vector<std::string>& out) const {
  std::vector<std::string> domains;
  Status status = ForEachItem(f, [&](const Field& item) {
    std::string domain;
    if (Status s = ReadString(item, domain); !s.ok()) return s;
    if (auto problem = DomainProblem(domain, list)) return Fail(item, *problem);
    domains.push_back(std::move(domain));
    return Status();
  });
  if (!status.ok()) return status;
  out = std::move(domains);
  return Status();
}

Status Parser::ReadPositiveDuration(const Field& f, const char* example, std::uint64_t& out_ms) const {
  Result<std::uint64_t> ms =
      f.node.IsScalar() ? ParseDurationMs(f.node.Scalar())
                        : Result<std::uint64_t>(Status::Error("policy", std::string("expected a duration such as ") + example));
  if (!ms.ok()) return Fail(f, ms.status().message());
  if (*ms == 0) return Fail(f, "must be > 0");
  out_ms = *ms;
  return Status();
}

Status Parser::ReadEnvName(const Field& f, std::string& out) const {
  std::string name;
  if (Status s = ReadString(f, name); !s.ok()) return s;
  if (auto problem = EnvNameProblem(name)) return Fail(f, *problem);
  out = std::move(name);
  return Status();
}

// A non-empty list of distinct host names, normalised.
Status Parser::ReadHosts(const Field& f, HostPattern pattern, std::vector<std::string>& out) const {
  std::vector<std::string> hosts;
  Status status = ForEachItem(f, [&](const Field& item) -> Status {
    std::string host;
    if (Status s = ReadString(item, host); !s.ok()) return s;
    if (auto problem = CheckHostName(host, pattern)) return Fail(item, *problem);
    if (std::find(hosts.begin(), hosts.end(), host) != hosts.end()) {
      return Fail(item, "duplicate host \"" + host + "\"");
    }
    hosts.push_back(std::move(host));
    return Status();
  });
  if (!status.ok()) return status;
  out = std::move(hosts);
  return Status();
}

Status Parser::ParseVersion(const Field& f, int& out) const {
  std::uint64_t version = 0;
  const std::string text = f.node.IsScalar() ? f.node.Scalar() : "";
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), version);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    return Fail(f, "expected an integer, got " + Describe(f));
  }
  if (version != 1) return Fail(f, "unsupported version " + text + " (expected 1)");
  out = 1;
  return Status();
}

Status Parser::ParseSandbox(const Field& f, SandboxSpec& out) const {
  return ForEachKey(
      f, {"isolation", "require", "image", "fresh_per_task", "snapshot_on_exit", "remote"},
      [&](const std::string& key, const Field& v) -> Status {
        if (key == "remote") {
          RemoteSpec remote;
          if (Status s = ParseRemote(v, remote); !s.ok()) return s;
          out.remote = std::move(remote);
          return Status();
        }
        // Every rung of the isolation ladder parses; whether this host can
        // provide it is decided when the policy is enforced.
        if (key == "isolation") {
          return ReadEnum(v,
                          {Isolation::kHost, Isolation::kOs, Isolation::kContainer,
                           Isolation::kMicrovm, Isolation::kRemote},
                          out.isolation);
        }
        if (key == "require")
          return ReadEnum(v, {Requirement::kFull, Requirement::kPartial}, out.require);
        if (key == "image") {
          if (Status s = ReadString(v, out.image); !s.ok()) return s;
          if (out.image.empty()) return Fail(v, "must not be empty");
          return Status();
        }
        if (key == "fresh_per_task") return ReadBool(v, out.fresh_per_task);
        return ReadBool(v, out.snapshot_on_exit);
      });
}

// sandbox.remote: { ssh, ssh_config?, level?, workspace? } or { kubernetes: {...}, level? }
Status Parser::ParseRemote(const Field& f, RemoteSpec& out) const {
  Status status = ForEachKey(
      f, {"ssh", "ssh_config", "level", "workspace", "kubernetes"}, [&](const std::string& key, const Field& v) -> Status {
        if (key == "ssh") {
          if (Status s = ReadString(v, out.ssh); !s.ok()) return s;
          if (auto problem = CheckSshDestination(out.ssh)) return Fail(v, *problem);
          return Status();
        }
        if (key == "ssh_config") {
          if (Status s = ReadString(v, out.ssh_config); !s.ok()) return s;
          if (auto problem = CheckPath(out.ssh_config, PathRule::kFile)) return Fail(v, *problem);
          return Status();
        }
        if (key == "level") {
          if (Status s = ReadEnum(v, {Isolation::kOs, Isolation::kContainer, Isolation::kMicrovm}, out.level);
              !s.ok()) {
            return s;
          }
          return Status();
        }
        if (key == "workspace") {
          if (Status s = ReadString(v, out.workspace); !s.ok()) return s;
          if (auto problem = CheckPath(out.workspace, PathRule::kWorkspace)) return Fail(v, *problem);
          return Status();
        }
        KubernetesRemoteSpec k;
        Status ks = ForEachKey(v, {"namespace", "template", "context", "kubeconfig"},
                               [&](const std::string& kkey, const Field& kv) -> Status {
                                 std::string text;
                                 if (Status s = ReadString(kv, text); !s.ok()) return s;
                                 if (kkey == "kubeconfig") {
                                   if (auto problem = CheckPath(text, PathRule::kFile)) return Fail(kv, *problem);
                                   k.kubeconfig = std::move(text);
                                   return Status();
                                 }
                                 if (kkey == "context") {
                                   if (text.empty()) return Fail(kv, "must not be empty");
                                   k.context = std::move(text);
                                   return Status();
                                 }
                                 if (auto problem = CheckKubernetesName(text)) return Fail(kv, *problem);
                                 (kkey == "namespace" ? k.namespace_name : k.template_name) = std::move(text);
                                 return Status();
                               });
        if (!ks.ok()) return ks;
        if (k.namespace_name.empty()) return Fail(v, "kubernetes needs namespace: the namespace of the claims");
        if (k.template_name.empty()) return Fail(v, "kubernetes needs template: the SandboxTemplate to claim from");
        out.kubernetes = std::move(k);
        return Status();
      });
  if (!status.ok()) return status;
  if (out.ssh.empty() == !out.kubernetes) {
    return Fail(f, out.ssh.empty() ? "names no remote: give ssh (\"user@host\") or kubernetes ({namespace, template})"
                                   : "gives both ssh and kubernetes: a remote world is one or the other");
  }
  if (out.kubernetes && (!out.ssh_config.empty() || !out.workspace.empty())) {
    return Fail(f, "ssh_config and workspace are for an ssh remote; a kubernetes sandbox's workspace is its pod's");
  }
  return Status();
}

Status Parser::CheckRemote(const Field& root, const Policy& policy) const {
  const bool remote = policy.sandbox.isolation == Isolation::kRemote;
  if (remote == policy.sandbox.remote.has_value()) return Status();
  std::optional<Field> sandbox = Child(root, "sandbox");
  if (remote) {
    std::optional<Field> iso = sandbox ? Child(*sandbox, "isolation") : std::nullopt;
    return Fail(iso ? *iso : root, "isolation: remote needs sandbox.remote: where the world runs "
                                   "({ssh: \"user@host\", level: os} or {kubernetes: {namespace, template}})");
  }
  std::optional<Field> at = sandbox ? Child(*sandbox, "remote") : std::nullopt;
  return Fail(at ? *at : root, std::string("sandbox.remote is set but sandbox.isolation is ") +
                                   ToString(policy.sandbox.isolation) + ", not remote");
}

Status Parser::ParseFilesystem(const Field& f, FilesystemSpec& out) const {
  return ForEachKey(
      f, {"workspace", "read_only", "read_write", "caches", "deny", "protect", "unix_sockets"},
      [&](const std::string& key, const Field& v) -> Status {
        if (key == "workspace") {
          return ForEachKey(v, {"path", "mode"}, [&](const std::string& wkey, const Field& w) {
            if (wkey == "mode") {
              return ReadEnum(w, {Access::kReadWrite, Access::kReadOnly}, out.workspace.access);
            }
            std::string path;
            if (Status s = ReadString(w, path); !s.ok()) return s;
            if (auto problem = CheckPath(path, PathRule::kWorkspace)) return Fail(w, *problem);
            out.workspace.path = std::move(path);
            return Status();
          });
        }
        if (key == "read_only") return ReadPaths(v, PathRule::kReadOnly, out.read_only);
        if (key == "read_write") return ReadPaths(v, PathRule::kReadWrite, out.read_write);
        if (key == "caches") return ParseCaches(v, out.caches);
        if (key == "deny") return ReadPaths(v, PathRule::kDeny, out.deny);
        if (key == "unix_sockets") return ReadPaths(v, PathRule::kReadOnly, out.unix_sockets);
        return ReadPaths(v, PathRule::kProtect, out.protect);
      });
}

// A non-empty list of distinct TCP ports (1-65535).
Status Parser::ReadPorts(const Field& f, std::vector<std::uint16_t>& out) const {
  std::vector<std::uint16_t> ports;
  Status status = ForEachItem(f, [&](const Field& item) -> Status {
    const std::string text = item.node.IsScalar() ? item.node.Scalar() : "";
    unsigned value = 0;
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || value < 1 || value > 65535) {
      return Fail(item, "expected a port (1-65535), got " + Describe(item));
    }
    auto port = static_cast<std::uint16_t>(value);
    if (std::find(ports.begin(), ports.end(), port) != ports.end()) return Fail(item, "duplicate port " + text);
    ports.push_back(port);
    return Status();
  });
  if (!status.ok()) return status;
  if (ports.empty()) return Fail(f, "empty list (to turn the check off, use tls_sni_check: false)");
  out = std::move(ports);
  return Status();
}

// network.inspect_tls: true (every host), false (none), or host names and
// "*.suffix" patterns as credentials.secrets.*.hosts take them: names as a
// TLS ClientHello carries them, so no port and no address.
Status Parser::ReadInspectTls(const Field& f, NetworkSpec& out) const {
  if (!f.node.IsSequence()) {
    if (ReadBool(f, out.inspect_tls_all).ok()) {
      out.inspect_tls.clear();
      return Status();
    }
    return Fail(f, "expected true, false or a list of hosts, got " + Describe(f));
  }
  std::vector<std::string> hosts;
  if (Status s = ReadHosts(f, HostPattern::kWildcard, hosts); !s.ok()) return s;
  if (hosts.empty()) return Fail(f, "empty list (to inspect no host, use inspect_tls: false)");
  out.inspect_tls_all = false;
  out.inspect_tls = std::move(hosts);
  return Status();
}

Status Parser::ParseNetwork(const Field& f, NetworkSpec& out) const {
  return ForEachKey(
      f,
      {"default", "egress_proxy", "allow", "deny", "on_unknown_domain", "tls_sni_check", "tls_sni_ports",
       "inspect_tls", "http_rules"},
      [&](const std::string& key, const Field& v) -> Status {
        if (key == "default") {
          return ReadEnum(v, {NetDefault::kDeny, NetDefault::kAllow}, out.default_action);
        }
        if (key == "egress_proxy") return ReadBool(v, out.egress_proxy);
        if (key == "allow") return ReadDomains(v, DomainList::kAllow, out.allow);
        if (key == "deny") return ReadDomains(v, DomainList::kDeny, out.deny);
        if (key == "tls_sni_check") return ReadBool(v, out.tls_sni_check);
        if (key == "tls_sni_ports") return ReadPorts(v, out.tls_sni_ports);
        if (key == "inspect_tls") return ReadInspectTls(v, out);
        if (key == "http_rules") return ParseHttpRules(v, out.http_rules);
        return ReadEnum(v, {UnknownDomain::kDeny, UnknownDomain::kAsk}, out.on_unknown_domain);
      });
}

// network.http_rules: one entry per host, each a non-empty list of
// "METHOD /path" patterns.
Status Parser::ParseHttpRules(const Field& f, std::vector<HttpRuleSpec>& out) const {
  std::vector<HttpRuleSpec> rules;
  Status status = ForEachItem(f, [&](const Field& item) -> Status {
    HttpRuleSpec rule;
    Status s = ForEachKey(item, {"host", "allow"}, [&](const std::string& key, const Field& v) -> Status {
      if (key == "host") {
        if (Status r = ReadString(v, rule.host); !r.ok()) return r;
        if (auto problem = CheckHostName(rule.host, HostPattern::kExact)) return Fail(v, *problem);
        for (std::size_t i = 0; i < rules.size(); ++i) {
          if (rules[i].host == rule.host) {
            return Fail(v, "duplicate host \"" + rule.host + "\" (also in " + f.path + "[" +
                               std::to_string(i) + "]): give each host one entry");
          }
        }
        return Status();
      }
      Status r = ForEachItem(v, [&](const Field& entry) -> Status {
        std::string pattern;
        if (Status t = ReadString(entry, pattern); !t.ok()) return t;
        if (auto problem = HttpRuleProblem(pattern)) return Fail(entry, *problem);
        if (std::find(rule.allow.begin(), rule.allow.end(), pattern) != rule.allow.end()) {
          return Fail(entry, "duplicate rule \"" + pattern + "\"");
        }
        rule.allow.push_back(std::move(pattern));
        return Status();
      });
      if (!r.ok()) return r;
      if (rule.allow.empty()) {
        return Fail(v, "empty list (to refuse every request to the host, leave it out of network.allow)");
      }
      return Status();
    });
    if (!s.ok()) return s;
    if (Status r = RequireKeys(item, {"host", "allow"}); !r.ok()) return r;
    rules.push_back(std::move(rule));
    return Status();
  });
  if (!status.ok()) return status;
  out = std::move(rules);
  return Status();
}

Status Parser::ParseCredentials(const Field& f, CredentialsSpec& out) const {
  return ForEachKey(
      f, {"in_sandbox", "git", "tools", "secrets"}, [&](const std::string& key, const Field& v) -> Status {
        if (key == "in_sandbox") {
          return ReadEnum(v, {CredentialsInSandbox::kNone, CredentialsInSandbox::kAllow}, out.in_sandbox);
        }
        if (key == "git") return ParseGit(v, out);
        if (key == "secrets") return ParseSecrets(v, out.secrets);
        return ReadEnum(v, {ToolCredentials::kNone, ToolCredentials::kVaultProxy}, out.tools);
      });
}

// `git: none | proxy` (the seed's short form), or a map of remotes and push
// rules, which means proxy.
Status Parser::ParseGit(const Field& f, CredentialsSpec& out) const {
  if (!f.node.IsMap()) {
    if (!f.node.IsScalar()) {
      return Fail(f, "expected none, proxy or a map (remotes, push), got " + Describe(f));
    }
    out.git_rules = GitCredentialsSpec{};
    return ReadEnum(f, {GitCredentials::kNone, GitCredentials::kProxy}, out.git);
  }
  GitCredentialsSpec rules;
  Status status = ForEachKey(f, {"remotes", "push"}, [&](const std::string& key, const Field& v) -> Status {
    if (key == "push") return ParseGitPush(v, rules.push);
    Status s = ForEachItem(v, [&](const Field& item) -> Status {
      std::string remote;
      if (Status r = ReadString(item, remote); !r.ok()) return r;
      if (auto problem = CheckGitRemote(remote)) return Fail(item, *problem);
      if (std::find(rules.remotes.begin(), rules.remotes.end(), remote) != rules.remotes.end()) {
        return Fail(item, "duplicate remote \"" + remote + "\"");
      }
      rules.remotes.push_back(std::move(remote));
      return Status();
    });
    if (!s.ok()) return s;
    if (rules.remotes.empty()) return Fail(v, "empty list (for no git credentials, use git: none)");
    return Status();
  });
  if (!status.ok()) return status;
  if (Status s = RequireKeys(f, {"remotes"}); !s.ok()) return s;
  out.git = GitCredentials::kProxy;
  out.git_rules = std::move(rules);
  return Status();
}

Status Parser::ParseGitPush(const Field& f, GitPushSpec& out) const {
  return ForEachKey(f, {"allow_refs", "deny_force"}, [&](const std::string& key, const Field& v) -> Status {
    if (key == "deny_force") return ReadBool(v, out.deny_force);
    std::vector<std::string> refs;
    Status s = ForEachItem(v, [&](const Field& item) -> Status {
      std::string ref;
      if (Status r = ReadString(item, ref); !r.ok()) return r;
      if (auto problem = RefPatternProblem(ref)) return Fail(item, *problem);
      if (std::find(refs.begin(), refs.end(), ref) != refs.end()) return Fail(item, "duplicate ref \"" + ref + "\"");
      refs.push_back(std::move(ref));
      return Status();
    });
    if (!s.ok()) return s;
    // The struct reads an empty list as "any ref"; written out, [] reads as
    // "no ref", so neither meaning is given to it.
    if (refs.empty()) return Fail(v, "empty list (to allow pushing any ref, leave allow_refs out)");
    out.allow_refs = std::move(refs);
    return Status();
  });
}

Status Parser::ParseSecrets(const Field& f, std::vector<SecretSpec>& out) const {
  std::vector<SecretSpec> secrets;
  Status status = ForEachKey(f, {}, [&](const std::string& name, const Field& v) -> Status {
    if (auto problem = SecretNameProblem(name)) return Fail(v.key_mark, f.path, *problem);
    SecretSpec secret;
    secret.name = name;
    if (Status s = ParseSecret(v, secrets, secret); !s.ok()) return s;
    secrets.push_back(std::move(secret));
    return Status();
  });
  if (!status.ok()) return status;
  out = std::move(secrets);  // file order
  return Status();
}

Status Parser::ParseSecret(const Field& f, const std::vector<SecretSpec>& earlier, SecretSpec& out) const {
  std::optional<Field> inject;
  Status status = ForEachKey(
      f, {"from", "hosts", "inject", "placeholder_env"}, [&](const std::string& key, const Field& v) -> Status {
        if (key == "from") return ParseSecretSource(v, out.from);
        if (key == "hosts") {
          if (Status s = ReadHosts(v, HostPattern::kWildcard, out.hosts); !s.ok()) return s;
          if (out.hosts.empty()) return Fail(v, "empty list (the hosts the secret is sent to)");
          return Status();
        }
        if (key == "inject") {
          inject = v;
          return ParseInjection(v, out.inject);
        }
        if (Status s = ReadEnvName(v, out.placeholder_env); !s.ok()) return s;
        for (const SecretSpec& other : earlier) {
          if (other.placeholder_env == out.placeholder_env) {
            return Fail(v, out.placeholder_env + " is already the placeholder_env of credentials.secrets." +
                               other.name);
          }
        }
        return Status();
      });
  if (!status.ok()) return status;
  // hosts may be left out only by a secret that a tools.upstream entry
  // uses (CheckUpstreams): it is then sent to no host by the proxy.
  if (Status s = RequireKeys(f, {"from"}); !s.ok()) return s;
  if (out.inject.kind == SecretInjection::Kind::kPlaceholder && out.placeholder_env.empty()) {
    return Fail(*inject, "placeholder needs placeholder_env: the variable in which the sandbox finds the "
                         "placeholder the proxy replaces");
  }
  return Status();
}

// from: exactly one of env, file, command.
Status Parser::ParseSecretSource(const Field& f, SecretSource& out) const {
  bool given = false;
  Status status = ForEachKey(f, {"env", "file", "command"}, [&](const std::string& key, const Field& v) -> Status {
    if (given) return Fail(v.key_mark, v.path, "give only one of env, file, command");
    given = true;
    if (key == "env") {
      out.kind = SecretSource::Kind::kEnv;
      return ReadEnvName(v, out.env);
    }
    if (key == "file") {
      out.kind = SecretSource::Kind::kFile;
      if (Status s = ReadString(v, out.file); !s.ok()) return s;
      if (auto problem = CheckPath(out.file, PathRule::kFile)) return Fail(v, *problem);
      return Status();
    }
    out.kind = SecretSource::Kind::kCommand;
    std::vector<std::string> argv;
    Status s = ForEachItem(v, [&](const Field& item) -> Status {
      std::string arg;
      if (Status r = ReadString(item, arg); !r.ok()) return r;
      // exec() would end the argument at the NUL.
      if (arg.find('\0') != std::string::npos) return Fail(item, "contains a NUL character");
      if (argv.empty() && arg.empty()) return Fail(item, "empty program name");
      argv.push_back(std::move(arg));
      return Status();
    });
    if (!s.ok()) return s;
    if (argv.empty()) return Fail(v, "empty list (expected the program and its arguments)");
    out.command = std::move(argv);
    return Status();
  });
  if (!status.ok()) return status;
  if (!given) return Fail(f, "expected one of env, file, command");
  return Status();
}

// inject: basic | placeholder | {header, format} | {basic: {username}}.
// Left out, the struct's default stands: Authorization: Bearer {}.
Status Parser::ParseInjection(const Field& f, SecretInjection& out) const {
  static const std::string kForms =
      "basic, placeholder, {header: NAME, format: \"... {} ...\"} or {basic: {username: NAME}}";
  if (f.node.IsScalar()) {
    if (f.node.Scalar() == "basic") {
      out.kind = SecretInjection::Kind::kBasic;
    } else if (f.node.Scalar() == "placeholder") {
      out.kind = SecretInjection::Kind::kPlaceholder;
    } else {
      return Fail(f, "unknown value " + Describe(f) + " (expected " + kForms + ")");
    }
    return Status();
  }
  if (!f.node.IsMap()) return Fail(f, "expected " + kForms + ", got " + Describe(f));
  SecretInjection result;
  bool header = false, format = false, basic = false;
  auto entry = [&](const std::string& key, const Field& v) -> Status {
    if ((key == "basic" && (header || format)) || (key != "basic" && basic)) {
      return Fail(v.key_mark, v.path, "basic and header/format are two ways to inject; give one");
    }
    if (key == "header") {
      header = true;
      if (Status s = ReadString(v, result.header); !s.ok()) return s;
      if (auto problem = HeaderNameProblem(result.header)) return Fail(v, *problem);
      return Status();
    }
    if (key == "format") {
      format = true;
      if (Status s = ReadString(v, result.format); !s.ok()) return s;
      if (auto problem = HeaderFormatProblem(result.format)) return Fail(v, *problem);
      return Status();
    }
    basic = true;
    if (v.node.IsNull()) return Status();  // `basic:` alone: the default user name
    return ForEachKey(v, {"username"}, [&](const std::string&, const Field& u) -> Status {
      if (Status s = ReadString(u, result.username); !s.ok()) return s;
      if (auto problem = BasicUsernameProblem(result.username)) return Fail(u, *problem);
      return Status();
    });
  };
  if (Status s = ForEachKey(f, {"header", "format", "basic"}, entry); !s.ok()) return s;
  if (!header && !format && !basic) return Fail(f, "empty map (expected " + kForms + ")");
  if (basic) {
    result.kind = SecretInjection::Kind::kBasic;
  } else {
    result.kind = SecretInjection::Kind::kHeader;
    if (!format) result.format = "{}";  // a header given alone carries the bare value
  }
  out = std::move(result);
  return Status();
}

Status Parser::ParseResources(const Field& f, ResourcesSpec& out) const {
  // guaranteed ≤ limit is checked when the file gives both; the error points
  // at the limit and quotes the guarantee as written.
  auto order_error = [&](const Field& guaranteed, const Field& limit) {
    return Fail(limit, "must be ≥ guaranteed (" + guaranteed.node.Scalar() + ")");
  };

  return ForEachKey(
      f, {"cpu", "memory_gib", "disk_gib", "wall_clock_min", "kill_grace", "max_processes"},
      [&](const std::string& key, const Field& v) -> Status {
        if (key == "cpu") {
          std::optional<Field> guaranteed, limit;
          Status s =
              ForEachKey(v, {"guaranteed", "limit"}, [&](const std::string& k, const Field& c) {
                double cores = 0;
                if (Status r = ReadPositive(c, kMaxCpus, cores); !r.ok()) return r;
                (k == "guaranteed" ? guaranteed : limit) = c;
                (k == "guaranteed" ? out.cpu.guaranteed : out.cpu.limit) = cores;
                return Status();
              });
          if (!s.ok()) return s;
          if (guaranteed && limit && *out.cpu.guaranteed > *out.cpu.limit) {
            return order_error(*guaranteed, *limit);
          }
          return Status();
        }
        if (key == "memory_gib") {
          // A size alone (`memory_gib: 512Mi`, `memory_gib: 2`) is the limit.
          if (v.node.IsScalar()) {
            std::uint64_t bytes = 0;
            if (Status r = ReadBytes(v, bytes); !r.ok()) return r;
            out.memory_limit_bytes = bytes;
            return Status();
          }
          std::optional<Field> guaranteed, limit;
          Status s =
              ForEachKey(v, {"guaranteed", "limit"}, [&](const std::string& k, const Field& m) {
                std::uint64_t bytes = 0;
                if (Status r = ReadBytes(m, bytes); !r.ok()) return r;
                (k == "guaranteed" ? guaranteed : limit) = m;
                (k == "guaranteed" ? out.memory_guaranteed_bytes : out.memory_limit_bytes) = bytes;
                return Status();
              });
          if (!s.ok()) return s;
          if (guaranteed && limit && *out.memory_guaranteed_bytes > *out.memory_limit_bytes) {
            return order_error(*guaranteed, *limit);
          }
          return Status();
        }
        std::uint64_t value = 0;
        Status s;
        if (key == "disk_gib") {
          s = ReadBytes(v, value);
          if (s.ok()) out.disk_bytes = value;
        } else if (key == "wall_clock_min") {
          s = ReadDuration(v, value);
          if (s.ok()) out.wall_clock_ms = value;
        } else if (key == "kill_grace") {
          // Seconds, not minutes, are its scale: the unit is required.
          Result<std::uint64_t> ms = v.node.IsScalar() ? ParseDurationMs(v.node.Scalar())
                                                       : Result<std::uint64_t>(Status::Error("policy", "expected a duration such as 5s"));
          if (ms.ok()) {
            out.kill_grace_ms = *ms;
          } else {
            s = Fail(v, ms.status().message());
          }
        } else {
          s = ReadCount(v, kMaxProcesses, value);
          if (s.ok()) out.max_processes = value;
        }
        return s;
      });
}

Status Parser::ParseEnv(const Field& f, EnvSpec& out) const {
  return ForEachKey(f, {"pass", "set"}, [&](const std::string& key, const Field& v) -> Status {
    if (key == "pass") {
      std::vector<std::string> pass;
      Status s = ForEachItem(v, [&](const Field& item) {
        std::string name;
        if (Status r = ReadString(item, name); !r.ok()) return r;
        if (auto problem = EnvPassProblem(name)) return Fail(item, *problem);
        pass.push_back(std::move(name));
        return Status();
      });
      if (!s.ok()) return s;
      out.pass = std::move(pass);
      return Status();
    }
    std::vector<std::pair<std::string, std::string>> set;
    Status s = ForEachKey(v, {}, [&](const std::string& name, const Field& value) {
      if (auto problem = EnvNameProblem(name)) return Fail(value.key_mark, v.path, *problem);
      // Scalars are taken as written: `CI: 1` sets "1", `DEBUG: true` "true".
      std::string text;
      if (Status r = ReadString(value, text); !r.ok()) return r;
      set.emplace_back(name, std::move(text));
      return Status();
    });
    if (!s.ok()) return s;
    out.set = std::move(set);
    return Status();
  });
}

// filesystem.caches: NAME: PATH, or NAME: {path: PATH, host: DIR} to back
// the cache with a host directory of the caller's choosing.
Status Parser::ParseCaches(const Field& f, std::vector<CacheSpec>& out) const {
  std::vector<CacheSpec> caches;
  Status status = ForEachKey(f, {}, [&](const std::string& name, const Field& v) -> Status {
    if (auto problem = CacheNameProblem(name)) return Fail(v.key_mark, v.path, *problem);
    CacheSpec cache;
    cache.name = name;
    auto read_path = [&](const Field& p, PathRule rule, std::string& path) -> Status {
      if (Status s = ReadString(p, path); !s.ok()) return s;
      if (auto problem = CheckPath(path, rule)) return Fail(p, *problem);
      return Status();
    };
    if (v.node.IsMap()) {
      Status s = ForEachKey(v, {"path", "host"}, [&](const std::string& key, const Field& c) -> Status {
        return read_path(c, PathRule::kReadWrite, key == "path" ? cache.path : cache.host);
      });
      if (!s.ok()) return s;
      if (Status r = RequireKeys(v, {"path"}); !r.ok()) return r;
    } else if (Status s = read_path(v, PathRule::kReadWrite, cache.path); !s.ok()) {
      return s;
    }
    for (const CacheSpec& other : caches) {
      if (other.path == cache.path) {
        return Fail(v, "the same path as filesystem.caches." + other.name + " (" + cache.path + ")");
      }
    }
    caches.push_back(std::move(cache));
    return Status();
  });
  if (!status.ok()) return status;
  out = std::move(caches);
  return Status();
}

Status Parser::ParseHome(const Field& f, HomeSpec& out) const {
  return ForEachKey(f, {"import"}, [&](const std::string&, const Field& v) -> Status {
    return ReadPaths(v, PathRule::kHomeImport, out.import);
  });
}

Status Parser::ParseOnViolation(const Field& f, OnViolationSpec& out) const {
  return ForEachKey(
      f, {"report_as", "escalation", "max_grant"}, [&](const std::string& key, const Field& v) -> Status {
        if (key == "report_as") {
          return ReadEnum(v, {ReportAs::kSandboxDenial, ReportAs::kTaskFailure}, out.report_as);
        }
        if (key == "max_grant") return ParseMaxGrant(v, out.max_grant);
        return ReadEnum(v, {Escalation::kDeny, Escalation::kOneTimeApproval}, out.escalation);
      });
}

// on_violation.max_grant. Paths are checked against the deny lists once
// every section is read (CheckMaxGrant): filesystem.deny may come later.
Status Parser::ParseMaxGrant(const Field& f, MaxGrantSpec& out) const {
  MaxGrantSpec grant;
  Status status = ForEachKey(
      f, {"network", "filesystem_read", "filesystem_write", "syscalls", "memory_gib"},
      [&](const std::string& key, const Field& v) -> Status {
        if (key == "network") return ReadDomains(v, DomainList::kAllow, grant.network);
        if (key == "filesystem_read") return ReadPaths(v, PathRule::kReadWrite, grant.filesystem_read);
        if (key == "filesystem_write") return ReadPaths(v, PathRule::kReadWrite, grant.filesystem_write);
        if (key == "memory_gib") {
          std::uint64_t bytes = 0;
          if (Status s = ReadBytes(v, bytes); !s.ok()) return s;
          grant.memory_bytes = bytes;
          return Status();
        }
        std::vector<std::string> names;
        Status s = ForEachItem(v, [&](const Field& item) -> Status {
          std::string name;
          if (Status r = ReadString(item, name); !r.ok()) return r;
          if (auto problem = SyscallGrantProblem(name)) return Fail(item, *problem);
          if (std::find(names.begin(), names.end(), name) != names.end()) {
            return Fail(item, "duplicate syscall \"" + name + "\"");
          }
          names.push_back(std::move(name));
          return Status();
        });
        if (!s.ok()) return s;
        grant.syscalls = std::move(names);
        return Status();
      });
  if (!status.ok()) return status;
  out = std::move(grant);
  return Status();
}

Status Parser::CheckMaxGrant(const Field& root, const Policy& policy) const {
  const MaxGrantSpec& g = policy.on_violation.max_grant;
  if (g.filesystem_read.empty() && g.filesystem_write.empty()) return Status();
  // No preset has a max_grant, so what is here is in the file.
  std::optional<Field> on_violation = Child(root, "on_violation");
  std::optional<Field> max_grant = on_violation ? Child(*on_violation, "max_grant") : std::nullopt;
  for (const auto& [key, list] : {std::pair{"filesystem_read", &g.filesystem_read},
                                  std::pair{"filesystem_write", &g.filesystem_write}}) {
    std::optional<Field> items = max_grant ? Child(*max_grant, key) : std::nullopt;
    for (std::size_t i = 0; i < list->size(); ++i) {
      std::optional<std::string> problem = GrantPathProblem((*list)[i], policy.filesystem.deny);
      if (!problem) continue;
      std::optional<Field> item = items ? ChildItem(*items, i) : std::nullopt;
      return Fail(item ? *item : root, *problem);
    }
  }
  return Status();
}

// diff.exclude: gitignore-style patterns, one per item as a line of a
// .gitignore would hold it; a comment or a blank would silently match
// nothing, so they are refused.
Status Parser::ParseDiff(const Field& f, DiffSpec& out) const {
  return ForEachKey(f, {"exclude"}, [&](const std::string&, const Field& v) {
    std::vector<std::string> patterns;
    Status status = ForEachItem(v, [&](const Field& item) {
      std::string pattern;
      if (Status s = ReadString(item, pattern); !s.ok()) return s;
      if (pattern.find_first_not_of(" \t") == std::string::npos) return Fail(item, "empty pattern");
      if (pattern.find_first_of("\n\r") != std::string::npos) return Fail(item, "a pattern is one line");
      if (pattern[0] == '#') return Fail(item, "a pattern starting with '#' is a comment in gitignore syntax (write \\# for a literal '#')");
      if (pattern == "!" || pattern == "/" || pattern == "!/") return Fail(item, "pattern \"" + pattern + "\" matches nothing");
      patterns.push_back(std::move(pattern));
      return Status();
    });
    if (!status.ok()) return status;
    out.exclude = std::move(patterns);
    return Status();
  });
}

Status Parser::ParseSession(const Field& f, SessionSpec& out) const {
  return ForEachKey(
      f, {"call_timeout", "idle_timeout", "shell"}, [&](const std::string& key, const Field& v) -> Status {
        if (key == "shell") return ReadEnum(v, {ShellMode::kFresh, ShellMode::kPersistent}, out.shell);
        std::uint64_t ms = 0;
        if (Status s = ReadPositiveDuration(v, "10m", ms); !s.ok()) return s;
        if (key == "call_timeout") {
          out.call_timeout_ms = ms;
        } else {
          out.idle_timeout_ms = ms;
        }
        return Status();
      });
}

Status Parser::CheckSecrets(const Field& root, const Policy& policy) const {
  const CredentialsSpec& c = policy.credentials;
  if (c.secrets.empty()) return Status();
  // Secrets come only from the file (no preset has any), so they are there.
  std::optional<Field> credentials = Child(root, "credentials");
  std::optional<Field> secrets = credentials ? Child(*credentials, "secrets") : std::nullopt;
  if (!secrets) return Fail(root, "credentials.secrets: not found in the file");
  if (auto problem = SecretsModeProblem(policy.mode, c)) return Fail(*secrets, *problem);

  // The env entry is pointed at when the file has it, else the secret's own
  // field (env.pass may be the preset's list).
  std::optional<Field> env = Child(root, "env");
  std::optional<Field> pass = env ? Child(*env, "pass") : std::nullopt;
  std::optional<Field> set = env ? Child(*env, "set") : std::nullopt;
  auto secret_field = [&](const SecretSpec& secret, const std::string& name) -> std::optional<Field> {
    std::optional<Field> field = Child(*secrets, secret.name);
    if (field && name == secret.placeholder_env) return Child(*field, "placeholder_env");
    std::optional<Field> from = field ? Child(*field, "from") : std::nullopt;
    return from ? Child(*from, "env") : std::nullopt;
  };
  auto check = [&](const std::string& name, EnvUse use, const std::optional<Field>& entry) -> Status {
    for (const SecretSpec& secret : c.secrets) {
      std::optional<std::string> problem = EnvSecretProblem(secret, c.in_sandbox, name, use);
      if (!problem) continue;
      if (entry) return Fail(*entry, *problem);
      const char* list = use == EnvUse::kPass ? "env.pass" : "env.set";
      std::optional<Field> at = secret_field(secret, name);
      return Fail(at ? *at : *secrets, std::string("in the preset's ") + list + ": " + *problem);
    }
    return Status();
  };
  for (std::size_t i = 0; i < policy.env.pass.size(); ++i) {
    std::optional<Field> item = pass ? ChildItem(*pass, i) : std::nullopt;
    if (Status s = check(policy.env.pass[i], EnvUse::kPass, item); !s.ok()) return s;
  }
  for (const auto& [name, value] : policy.env.set) {
    std::optional<Field> entry = set ? Child(*set, name) : std::nullopt;
    // A variable's name is its key: point there, as env.set's other errors do.
    if (entry) entry->mark = entry->key_mark;
    if (Status s = check(name, EnvUse::kSet, entry); !s.ok()) return s;
  }
  return Status();
}

Status Parser::CheckNetwork(const Field& root, const Policy& policy) const {
  std::optional<std::string> problem = InspectTlsProblem(policy.network);
  if (!problem) return Status();
  // No preset inspects TLS, so the key is in the file.
  std::optional<Field> network = Child(root, "network");
  std::optional<Field> inspect = network ? Child(*network, "inspect_tls") : std::nullopt;
  return Fail(inspect ? *inspect : root, *problem);
}

Status Parser::ParseSection(const std::string& key, const Field& v, Policy& policy) const {
  if (key == "version") return ParseVersion(v, policy.version);
  if (key == "mode") return Status();  // read first, in Parse()
  if (key == "sandbox") return ParseSandbox(v, policy.sandbox);
  if (key == "filesystem") return ParseFilesystem(v, policy.filesystem);
  if (key == "network") return ParseNetwork(v, policy.network);
  if (key == "credentials") return ParseCredentials(v, policy.credentials);
  if (key == "resources") return ParseResources(v, policy.resources);
  if (key == "env") return ParseEnv(v, policy.env);
  if (key == "diff") return ParseDiff(v, policy.diff);
  if (key == "home") return ParseHome(v, policy.home);
  if (key == "session") return ParseSession(v, policy.session);
  if (key == "tools") return ParseTools(v, policy.tools);
  return ParseOnViolation(v, policy.on_violation);
}

// tools: { upstream: [ {name, command | url, secret?, secret_env?, allow, timeout?} ], run_code: {bash?} }
Status Parser::ParseTools(const Field& f, ToolsSpec& out) const {
  return ForEachKey(f, {"upstream", "run_code"}, [&](const std::string& key, const Field& v) -> Status {
    if (key == "run_code") {
      return ForEachKey(v, {"bash"}, [&](const std::string&, const Field& b) -> Status {
        return ReadBool(b, out.run_code.bash);
      });
    }
    std::vector<UpstreamSpec> list;
    Status status = ForEachItem(v, [&](const Field& item) -> Status {
      UpstreamSpec u;
      if (Status s = ParseUpstream(item, u); !s.ok()) return s;
      for (const UpstreamSpec& other : list) {
        if (other.name == u.name) return Fail(item, "a second upstream named " + u.name);
      }
      list.push_back(std::move(u));
      return Status();
    });
    if (!status.ok()) return status;
    out.upstream = std::move(list);
    return Status();
  });
}

Status Parser::ParseUpstream(const Field& f, UpstreamSpec& out) const {
  auto tool_name = [](const std::string& n) {
    return !n.empty() && n.size() <= 64 &&
           std::all_of(n.begin(), n.end(), [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '-'; });
  };
  bool secret_env_given = false;
  Status status = ForEachKey(
      f, {"name", "command", "url", "secret", "secret_env", "allow", "timeout"},
      [&](const std::string& key, const Field& v) -> Status {
        if (key == "name") {
          if (Status s = ReadString(v, out.name); !s.ok()) return s;
          const bool ok = !out.name.empty() && out.name.size() <= 32 && std::islower(static_cast<unsigned char>(out.name[0])) &&
                          std::all_of(out.name.begin(), out.name.end(), [](unsigned char c) {
                            return std::islower(c) || std::isdigit(c) || c == '_' || c == '-';
                          });
          if (!ok) return Fail(v, "\"" + out.name + "\" is not a name: a lower-case letter, then letters, digits, _ or -, at most 32 (its tools are NAME.TOOL)");
          return Status();
        }
        if (key == "command") {
          Status s = ForEachItem(v, [&](const Field& item) -> Status {
            std::string arg;
            if (Status r = ReadString(item, arg); !r.ok()) return r;
            out.command.push_back(std::move(arg));
            return Status();
          });
          if (!s.ok()) return s;
          if (out.command.empty() || out.command[0].empty()) return Fail(v, "empty command (the server's argv)");
          return Status();
        }
        if (key == "url") {
          if (Status s = ReadString(v, out.url); !s.ok()) return s;
          UpstreamUrl parsed;
          if (auto problem = ParseUpstreamUrl(out.url, parsed)) return Fail(v, *problem);
          return Status();
        }
        if (key == "secret") return ReadString(v, out.secret);
        if (key == "secret_env") {
          secret_env_given = true;
          return ReadEnvName(v, out.secret_env);
        }
        if (key == "allow") {
          Status s = ForEachItem(v, [&](const Field& item) -> Status {
            std::string name;
            if (Status r = ReadString(item, name); !r.ok()) return r;
            if (!tool_name(name)) return Fail(item, "\"" + name + "\" is not a tool name (letters, digits, _ or -)");
            if (std::find(out.allow.begin(), out.allow.end(), name) == out.allow.end()) out.allow.push_back(name);
            return Status();
          });
          if (!s.ok()) return s;
          if (out.allow.empty()) return Fail(v, "empty list (the upstream's tools to expose; the others do not exist)");
          return Status();
        }
        return ReadPositiveDuration(v, "30s", out.timeout_ms);
      });
  if (!status.ok()) return status;
  if (Status s = RequireKeys(f, {"name", "allow"}); !s.ok()) return s;
  if (out.command.empty() == out.url.empty()) {
    return Fail(f, "tools.upstream " + out.name + ": give exactly one of command (a stdio server) and url (Streamable HTTP)");
  }
  if (!out.url.empty() && secret_env_given) {
    return Fail(f, "tools.upstream " + out.name + ": secret_env is for a stdio server; a url upstream gets its secret "
                   "as an Authorization: Bearer header");
  }
  return Status();
}

// Each upstream's secret is one of credentials.secrets; a secret without
// hosts must be an upstream's.
Status Parser::CheckUpstreams(const Field& root, const Policy& policy) const {
  std::optional<Field> tools = Child(root, "tools");
  std::optional<Field> list = tools ? Child(*tools, "upstream") : std::nullopt;
  const auto& secrets = policy.credentials.secrets;
  for (std::size_t i = 0; i < policy.tools.upstream.size(); ++i) {
    const UpstreamSpec& u = policy.tools.upstream[i];
    if (u.secret.empty()) continue;
    if (std::none_of(secrets.begin(), secrets.end(), [&](const SecretSpec& s) { return s.name == u.secret; })) {
      std::optional<Field> item = list ? ChildItem(*list, i) : std::nullopt;
      std::optional<Field> at = item ? Child(*item, "secret") : std::nullopt;
      return Fail(at ? *at : root, "\"" + u.secret + "\" is not one of credentials.secrets");
    }
  }
  for (const SecretSpec& secret : secrets) {
    if (!secret.hosts.empty()) continue;
    const bool used = std::any_of(policy.tools.upstream.begin(), policy.tools.upstream.end(),
                                  [&](const UpstreamSpec& u) { return u.secret == secret.name; });
    if (used) continue;
    std::optional<Field> credentials = Child(root, "credentials");
    std::optional<Field> all = credentials ? Child(*credentials, "secrets") : std::nullopt;
    std::optional<Field> at = all ? Child(*all, secret.name) : std::nullopt;
    if (at) at->mark = at->key_mark;
    return Fail(at ? *at : root, "missing key \"hosts\" (the hosts the secret is sent to; only a secret that a "
                                 "tools.upstream entry uses may leave it out)");
  }
  return Status();
}

Result<Policy> Parser::Parse() const {
  YAML::Node document;
  try {
    document = YAML::Load(text_);
  } catch (const YAML::Exception& e) {
    return Fail(e.mark, "", "YAML syntax error: " + e.msg);
  }
  if (document.IsNull()) {
    return Fail(YAML::Mark(), "", "empty document (expected a map, at least \"version: 1\")");
  }
  Field root{document, "", document.Mark(), document.Mark()};
  if (!root.node.IsMap()) {
    return Fail(root, "expected a map at the top level, got " + Describe(root));
  }

  // A second policy after "---" would be silently ignored; a trailing empty
  // document is harmless.
  try {
    std::istringstream stream(text_);
    YAML::Parser parser(stream);
    DocumentProbe probe;
    for (int index = 0; parser.HandleNextDocument(probe); ++index) {
      if (index == 0) continue;
      if (probe.empty()) break;
      return Fail(probe.root_mark(), "", "more than one YAML document");
    }
  } catch (const YAML::Exception& e) {
    return Fail(e.mark, "", "YAML syntax error: " + e.msg);
  }

  // The mode picks the preset every other key overrides, so it is read
  // before anything else, wherever it appears in the file.
  Mode mode = Mode::kWorkspaceWrite;
  for (const auto& entry : root.node) {
    const YAML::Node key = entry.first;
    const YAML::Node value = entry.second;
    if (key.IsScalar() && key.Scalar() == "mode") {
      Field f{value, "mode", value.IsNull() ? key.Mark() : value.Mark(), key.Mark()};
      Status s =
          ReadEnum(f, {Mode::kReadOnly, Mode::kWorkspaceWrite, Mode::kDangerFullAccess}, mode);
      // Collecting, the rest is checked against the default mode's preset.
      Status first;
      if (!s.ok() && !Continue(s, first)) return s;
      break;
    }
  }

  Policy policy = PresetFor(mode);
  Status status = ForEachKey(
      root,
      {"version", "mode", "sandbox", "filesystem", "network", "credentials", "resources", "env", "home",
       "on_violation", "diff", "session", "tools"},
      [&](const std::string& key, const Field& value) { return ParseSection(key, value, policy); });
  if (!status.ok()) return status;
  // Collecting: an invalid mode was recorded, and the checks below
  // compare values that parsed.
  if (errors_ && !errors_->empty()) return errors_->front();
  if (Status s = CheckNetwork(root, policy); !s.ok()) return s;
  if (Status s = CheckRemote(root, policy); !s.ok()) return s;
  if (Status s = CheckMaxGrant(root, policy); !s.ok()) return s;
  if (Status s = CheckSecrets(root, policy); !s.ok()) return s;
  if (Status s = CheckUpstreams(root, policy); !s.ok()) return s;

  policy.source = source_;
  policy.sha256 = Sha256Hex(text_);
  return policy;
}

}  // namespace

Result<Policy> ParsePolicy(const std::string& text, const std::string& source_name) {
  // The checks above go through yaml-cpp accessors that may throw on
  // malformed trees; nothing may escape this seam.
  try {
    return Parser(text, source_name).Parse();
  } catch (const YAML::Exception& e) {
    return Status::Error("policy",
                         source_name + ":" + std::to_string(std::max(e.mark.line, 0) + 1) + ":" +
                             std::to_string(std::max(e.mark.column, 0) + 1) + ": " + e.msg);
  } catch (const std::exception& e) {
    return Status::Error("policy", source_name + ": " + e.what());
  }
}

namespace {

Result<std::string> ReadPolicyText(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Errno("policy", "open", path);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};

  std::string text;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::Errno("policy", "read", path);
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  return text;
}

}  // namespace

Result<Policy> LoadPolicyFile(const std::string& path) {
  auto text = ReadPolicyText(path);
  if (!text.ok()) return text.status();
  return ParsePolicy(*text, path);
}

std::vector<Status> ValidatePolicy(const std::string& text, const std::string& source_name) {
  std::vector<Status> errors;
  Status failure;
  try {
    Result<Policy> parsed = Parser(text, source_name, &errors).Parse();
    if (!parsed.ok()) failure = parsed.status();
  } catch (const YAML::Exception& e) {
    failure = Status::Error("policy", source_name + ":" + std::to_string(std::max(e.mark.line, 0) + 1) + ":" +
                                         std::to_string(std::max(e.mark.column, 0) + 1) + ": " + e.msg);
  } catch (const std::exception& e) {
    failure = Status::Error("policy", source_name + ": " + e.what());
  }
  // Errors before the keys (syntax, the document's shape) and after them
  // (checks across sections) come back from Parse() alone.
  if (!failure.ok()) {
    const std::string what = failure.message();
    if (std::none_of(errors.begin(), errors.end(), [&](const Status& e) { return e.message() == what; })) {
      errors.push_back(failure);
    }
  }
  return errors;
}

std::vector<Status> ValidatePolicyFile(const std::string& path) {
  auto text = ReadPolicyText(path);
  if (!text.ok()) return {text.status()};
  return ValidatePolicy(*text, path);
}

}  // namespace agentbox
