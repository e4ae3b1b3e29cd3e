// Credentials through the Manager, against real worlds: the daemon side (this
// process) reads a session's secrets from their sources when it starts a
// world and scrubs an environment source from its own environment; the
// sandbox sees only the placeholder; RotateSecret refuses what the session
// cannot take and gives a running world the new value without replacing it.
// What the upstream then receives is tested over the daemon's API
// (tests/session/credentials_test.cc), where the upstream's name and CA can
// be given to the daemon's mount namespace.
#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "session/session.h"
#include "world_helpers.h"

namespace agentbox::session {
namespace {

using world_test::Bin;
using world_test::Children;
using world_test::Read;

std::string Hex(std::size_t bytes) {
  std::random_device rd;
  std::string out;
  for (std::size_t i = 0; i < bytes; ++i) {
    char b[3];
    std::snprintf(b, sizeof b, "%02x", static_cast<unsigned>(rd() & 0xff));
    out += b;
  }
  return out;
}

bool Contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// The value of "<name>=" on a line of `text`, or "".
std::string EnvValue(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + "=", 0) == 0) return line.substr(name.size() + 1);
  }
  return "";
}

class WorldCredentials : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(Bin().empty()) << "AGENTBOX_BIN must name the agentbox binary";
    const char* tmp = std::getenv("TMPDIR");
    state_ = std::string(tmp && *tmp == '/' ? tmp : "/tmp") + "/agentbox-world-creds.XXXXXX";
    ASSERT_NE(mkdtemp(state_.data()), nullptr);
    base_ = state_ + "/base";
    ASSERT_EQ(0, system(("mkdir -p " + base_ + " && git -C " + base_ + " init -q 2>/dev/null").c_str()));
    ManagerOptions o;
    o.state_dir = state_ + "/state";
    o.agentbox_exe = Bin();
    auto m = Manager::Open(o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    manager_ = std::move(*m);
    // A name of its own per test: the daemon side takes an environment
    // source once per process and keeps it.
    env_name_ = "AGENTBOX_TEST_TOKEN_" + Hex(6);
    value_ = "tok-" + Hex(16);
  }
  void TearDown() override {
    manager_.reset();
    unsetenv(env_name_.c_str());
    system(("chmod -R u+rwx " + state_ + " 2>/dev/null; rm -rf " + state_).c_str());
    EXPECT_TRUE(Children().empty()) << "a world's process outlived its Manager";
  }
  std::string Policy() const {
    return "version: 1\n"
           "mode: workspace-write\n"
           "network:\n"
           "  allow: [\"api.test\"]\n"
           "credentials:\n"
           "  secrets:\n"
           "    api:\n"
           "      from: { env: " + env_name_ + " }\n"
           "      hosts: [api.test]\n"
           "      inject: { header: Authorization, format: \"Bearer {}\" }\n"
           "      placeholder_env: API_TOKEN_PLACEHOLDER\n";
  }
  std::string Create(const std::string& policy) {
    CreateRequest c;
    c.workspace = base_;
    c.policy_yaml = policy;
    auto id = manager_->Create(c);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : "";
  }
  Json Bash(const std::string& id, const std::string& command) {
    auto r = manager_->Execute(id, "bash", {{"command", command}});
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : Json();
  }
  pid_t SandboxPid(const std::string& id) {
    auto d = manager_->Describe(id);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    return d.ok() ? d->value("sandbox_pid", -1) : -1;
  }
  std::string Log(const std::string& id) {
    auto path = manager_->LogPath(id);
    EXPECT_TRUE(path.ok()) << path.status().ToString();
    return path.ok() ? Read(*path) : "";
  }

  std::string state_, base_, env_name_, value_;
  std::unique_ptr<Manager> manager_;
};

// The value is read from this process's environment when the world starts,
// and is gone from it after; inside, only the placeholder shows.
TEST_F(WorldCredentials, AnEnvironmentSourceIsTakenFromTheDaemonSideAndScrubbed) {
  ASSERT_EQ(0, setenv(env_name_.c_str(), value_.c_str(), 1));
  const std::string id = Create(Policy());
  ASSERT_FALSE(id.empty());
  EXPECT_NE(getenv(env_name_.c_str()), nullptr) << "read before any world started";
  Json r = Bash(id, "env; tr '\\0' '\\n' < /proc/self/environ");
  EXPECT_EQ(r.value("kind", ""), "exited") << r.dump();
  const std::string out = r.value("output", "");
  EXPECT_EQ(EnvValue(out, "API_TOKEN_PLACEHOLDER").rfind("agentbox-placeholder-api-", 0), 0u) << out;
  EXPECT_TRUE(EnvValue(out, env_name_).empty()) << out;
  EXPECT_FALSE(Contains(out, value_)) << out;
  EXPECT_EQ(getenv(env_name_.c_str()), nullptr) << "the source stayed in the daemon side's environment";
  EXPECT_FALSE(Contains(Log(id), value_));
}

// A source that cannot be read fails the world's start, by name, and the
// session stays usable once it can.
TEST_F(WorldCredentials, AMissingSourceFailsTheStartByName) {
  const std::string id = Create(Policy());
  ASSERT_FALSE(id.empty());
  auto r = manager_->Execute(id, "bash", {{"command", "echo ran"}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->value("kind", ""), "sandbox_error") << r->dump();
  const std::string output = r->value("output", "");
  EXPECT_TRUE(Contains(output, "credentials.secrets.api")) << output;
  EXPECT_TRUE(Contains(output, env_name_)) << output;
  EXPECT_TRUE(Children().empty()) << "a world runs without its secret";
  ASSERT_EQ(0, setenv(env_name_.c_str(), value_.c_str(), 1));
  Json ok = Bash(id, "echo ran");
  EXPECT_EQ(ok.value("output", ""), "ran\n") << ok.dump();
}

TEST_F(WorldCredentials, RotateSecretRefusesWhatTheSessionCannotTake) {
  ASSERT_EQ(0, setenv(env_name_.c_str(), value_.c_str(), 1));
  const std::string id = Create(Policy());
  ASSERT_FALSE(id.empty());
  Status s = manager_->RotateSecret("s-0000000000000000", "api", "v");
  EXPECT_EQ(s.stage(), kNotFound) << s.ToString();
  s = manager_->RotateSecret(id, "nope", "v");
  EXPECT_EQ(s.stage(), kBadRequest) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "nope")) << s.ToString();
  s = manager_->RotateSecret(id, "api", "");
  EXPECT_EQ(s.stage(), kBadRequest) << s.ToString();
  s = manager_->RotateSecret(id, "api", std::string(64 * 1024 + 1, 'a'));
  EXPECT_EQ(s.stage(), kBadRequest) << s.ToString();
  for (const std::string& bad : std::vector<std::string>{"a\nb", "a\rb", std::string("a\0b", 3), "a\x7f"}) {
    s = manager_->RotateSecret(id, "api", bad);
    EXPECT_EQ(s.stage(), kBadRequest) << s.ToString();
  }
  const std::string plain = Create("");
  ASSERT_FALSE(plain.empty());
  s = manager_->RotateSecret(plain, "api", "v");
  EXPECT_EQ(s.stage(), kBadRequest) << s.ToString();
  EXPECT_TRUE(Children().empty()) << "a refused rotation started a world";
  // The largest value taken, before any world: none starts for it.
  s = manager_->RotateSecret(id, "api", std::string(64 * 1024, 'b'));
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(Children().empty()) << "a rotation started a world";
  Json r = Bash(id, "echo ran");
  EXPECT_EQ(r.value("output", ""), "ran\n") << r.dump();
}

// A rotation goes to the running world, which stays: the same supervisor
// before and after, and the next call runs in it. The value is not logged.
TEST_F(WorldCredentials, RotateSecretKeepsTheRunningWorld) {
  ASSERT_EQ(0, setenv(env_name_.c_str(), value_.c_str(), 1));
  const std::string id = Create(Policy());
  ASSERT_FALSE(id.empty());
  Json r = Bash(id, "echo kept > /tmp/world-marker; echo $API_TOKEN_PLACEHOLDER");
  ASSERT_EQ(r.value("kind", ""), "exited") << r.dump();
  const std::string placeholder = r.value("output", "");
  const pid_t sup = SandboxPid(id);
  ASSERT_GT(sup, 0);
  const std::string rotated = "tok-rotated-" + Hex(16);
  Status s = manager_->RotateSecret(id, "api", rotated);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(SandboxPid(id), sup);
  r = Bash(id, "cat /tmp/world-marker; echo $API_TOKEN_PLACEHOLDER");
  EXPECT_EQ(r.value("output", ""), "kept\n" + placeholder) << "not the same world, or a new placeholder: " << r.dump();
  EXPECT_EQ(SandboxPid(id), sup);
  EXPECT_EQ(Children(), std::vector<pid_t>{sup});
  const std::string log = Log(id);
  EXPECT_FALSE(Contains(log, rotated)) << log;
  EXPECT_FALSE(Contains(log, value_)) << log;
}

}  // namespace
}  // namespace agentbox::session
