// A session whose world is a claimed agent-sandbox pod, end to end against
// the fake API server: the session Manager claims a sandbox, runs
// `agentbox __world --stdio` through the pod's exec WebSocket (which the
// fake runs on this host, the agentbox under test standing in for the
// pod's image), sends every call over that stream, and deletes the claim
// when the session goes.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fake_api_server.h"
#include "session/session.h"

namespace agentbox::k8s {
namespace {

using nlohmann::json;
using testing::FakeApiServer;

class Dir {
 public:
  Dir() {
    char tmpl[] = "/tmp/agentbox-k8s-world-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~Dir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Sets a variable for the test's length (the fake forks the pod's command
// from this process: its environment is the pod's).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

bool AnyRequest(const std::vector<std::string>& requests, const std::string& method, const std::string& part) {
  return std::any_of(requests.begin(), requests.end(), [&](const std::string& r) {
    return r.rfind(method + " ", 0) == 0 && r.find(part) != std::string::npos;
  });
}

TEST(K8sWorld, ASessionClaimsASandboxRunsItsCallsThroughTheExecStreamAndReleasesTheClaim) {
  const char* bin = getenv("AGENTBOX_BIN");
  ASSERT_TRUE(bin && *bin) << "AGENTBOX_BIN is not set";
  Dir dir, state, ws;
  const std::string bin_dir = std::string(bin).substr(0, std::string(bin).rfind('/'));
  ScopedEnv path("PATH", bin_dir + ":" + (getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin"));
  ScopedEnv cache("XDG_CACHE_HOME", dir.path() + "/pod-cache");
  ScopedEnv pod_state("XDG_STATE_HOME", dir.path() + "/pod-state");
  std::ofstream(ws.path() + "/base.txt") << "from the base\n";

  std::string error;
  auto server = FakeApiServer::Start({}, &error);
  ASSERT_TRUE(server) << error;
  server->AddWarmPool("agents", "agentbox", "agentbox");
  const std::string kubeconfig = dir.path() + "/kubeconfig";
  std::ofstream(kubeconfig) << server->Kubeconfig();

  session::ManagerOptions o;
  o.state_dir = state.path() + "/state";
  o.agentbox_exe = bin;
  auto manager = session::Manager::Open(o);
  ASSERT_TRUE(manager.ok()) << manager.status().ToString();
  session::CreateRequest c;
  c.workspace = ws.path();
  c.policy_yaml = "version: 1\nmode: workspace-write\nsandbox:\n  isolation: remote\n  remote:\n    kubernetes: "
                  "{ namespace: agents, template: agentbox, kubeconfig: " + kubeconfig + " }\n";
  auto id = (*manager)->Create(c);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_FALSE(AnyRequest(server->Requests(), "POST", "/sandboxclaims")) << "claimed before the first call";

  auto first = (*manager)->Execute(*id, "bash", {{"command", "cat base.txt; echo warm > /tmp/warm"}});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->value("kind", ""), "exited") << first->dump();
  EXPECT_EQ(first->value("output", ""), "from the base\n");
  const json& enforcement = (*first)["outcome"]["enforcement"];
  EXPECT_NE(enforcement.value("backend_reason", "").find("of claim agentbox-"), std::string::npos) << enforcement.dump();
  EXPECT_EQ(enforcement.value("level", ""), "full") << enforcement.dump();
  const auto requests = server->Requests();
  EXPECT_TRUE(AnyRequest(requests, "POST", "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/agents/sandboxclaims"));
  EXPECT_TRUE(AnyRequest(requests, "GET", "/exec?")) << "no exec through the API server";

  // One world across calls; the file tools see what the shell sees.
  auto warm = (*manager)->Execute(*id, "bash", {{"command", "cat /tmp/warm"}});
  ASSERT_TRUE(warm.ok());
  EXPECT_EQ(warm->value("output", ""), "warm\n");
  auto w = (*manager)->Execute(*id, "write_file", {{"path", "tool.txt"}, {"content", "from the tool\n"}});
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->value("is_error", true), false) << w->dump();
  auto r = (*manager)->Execute(*id, "bash", {{"command", "cat tool.txt"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->value("output", ""), "from the tool\n");
  EXPECT_FALSE(std::filesystem::exists(ws.path() + "/tool.txt")) << "the base was written";

  // The session's end deletes its claim.
  ASSERT_TRUE((*manager)->Remove(*id).ok());
  EXPECT_TRUE(AnyRequest(server->Requests(), "DELETE", "/sandboxclaims/agentbox-"));
  manager->reset();
}

TEST(K8sWorld, AClaimThatCannotBeMadeIsTheCallsSandboxErrorNamingTheAPIsAnswer) {
  const char* bin = getenv("AGENTBOX_BIN");
  ASSERT_TRUE(bin && *bin) << "AGENTBOX_BIN is not set";
  Dir dir, state, ws;
  std::string error;
  auto server = FakeApiServer::Start({}, &error);
  ASSERT_TRUE(server) << error;
  // No warm pool serves the template: the claim cannot be made.
  const std::string kubeconfig = dir.path() + "/kubeconfig";
  std::ofstream(kubeconfig) << server->Kubeconfig();
  session::ManagerOptions o;
  o.state_dir = state.path() + "/state";
  o.agentbox_exe = bin;
  auto manager = session::Manager::Open(o);
  ASSERT_TRUE(manager.ok()) << manager.status().ToString();
  session::CreateRequest c;
  c.workspace = ws.path();
  c.policy_yaml = "version: 1\nsandbox:\n  isolation: remote\n  remote:\n    kubernetes: "
                  "{ namespace: agents, template: agentbox, kubeconfig: " + kubeconfig + " }\n";
  auto id = (*manager)->Create(c);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  auto first = (*manager)->Execute(*id, "bash", {{"command", "echo should-not-run"}});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->value("kind", ""), "sandbox_error") << first->dump();
  const std::string out = first->value("output", "");
  EXPECT_NE(out.find("no SandboxWarmPool"), std::string::npos) << out;
  EXPECT_EQ(out.find("should-not-run"), std::string::npos) << out;
  manager->reset();
}

}  // namespace
}  // namespace agentbox::k8s
