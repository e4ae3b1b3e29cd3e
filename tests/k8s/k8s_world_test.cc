// A session whose world is a claimed agent-sandbox pod, end to end against
// the fake API server: the session Manager claims a sandbox, runs
// `agentbox __world --stdio` through the pod's exec WebSocket (which the
// fake runs on this host, the agentbox under test standing in for the
// pod's image), sends every call over that stream, and deletes the claim
// when the session goes.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "fake_api_server.h"
#include "host_facts.h"
#include "scoped_env.h"
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

using test_support::ScopedEnv;

bool AnyRequest(const std::vector<std::string>& requests, const std::string& method, const std::string& part) {
  return std::any_of(requests.begin(), requests.end(), [&](const std::string& r) {
    return r.rfind(method + " ", 0) == 0 && r.find(part) != std::string::npos;
  });
}

class K8sWorld : public ::testing::Test {
 protected:
  void SetUp() override {
    bin_ = getenv("AGENTBOX_BIN") ? getenv("AGENTBOX_BIN") : "";
    ASSERT_FALSE(bin_.empty()) << "AGENTBOX_BIN is not set";
    std::string error;
    server_ = FakeApiServer::Start({}, &error);
    ASSERT_TRUE(server_) << error;
    kubeconfig_ = dir_.path() + "/kubeconfig";
    std::ofstream(kubeconfig_) << server_->Kubeconfig();
    session::ManagerOptions o;
    o.state_dir = state_.path() + "/state";
    o.agentbox_exe = bin_;
    auto manager = session::Manager::Open(o);
    ASSERT_TRUE(manager.ok()) << manager.status().ToString();
    manager_ = std::move(*manager);
  }
  void TearDown() override { manager_.reset(); }
  std::string Create() {
    session::CreateRequest c;
    c.workspace = ws_.path();
    c.policy_yaml = "version: 1\nmode: workspace-write\nsandbox:\n  isolation: remote\n  remote:\n    kubernetes: "
                    "{ namespace: agents, template: agentbox, kubeconfig: " + kubeconfig_ + " }\n";
    auto id = manager_->Create(c);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return id.ok() ? *id : "";
  }
  json Run(const std::string& id, const std::string& name, const json& input) {
    auto r = manager_->Execute(id, name, input);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : json();
  }

  std::string bin_, kubeconfig_;
  Dir dir_, state_, ws_;
  std::unique_ptr<FakeApiServer> server_;
  std::unique_ptr<session::Manager> manager_;
};

TEST_F(K8sWorld, ASessionClaimsASandboxRunsItsCallsThroughTheExecStreamAndReleasesTheClaim) {
  const std::string bin_dir = bin_.substr(0, bin_.rfind('/'));
  ScopedEnv path("PATH", bin_dir + ":" + (getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin"));
  ScopedEnv cache("XDG_CACHE_HOME", dir_.path() + "/pod-cache");
  ScopedEnv pod_state("XDG_STATE_HOME", dir_.path() + "/pod-state");
  std::ofstream(ws_.path() + "/base.txt") << "from the base\n";
  server_->AddWarmPool("agents", "agentbox", "agentbox");
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  EXPECT_FALSE(AnyRequest(server_->Requests(), "POST", "/sandboxclaims")) << "claimed before the first call";

  json first = Run(id, "bash", {{"command", "cat base.txt; echo warm > /tmp/warm"}});
  ASSERT_EQ(first.value("kind", ""), "exited") << first.dump();
  EXPECT_EQ(first.value("output", ""), "from the base\n");
  const json& enforcement = first["outcome"]["enforcement"];
  EXPECT_NE(enforcement.value("backend_reason", "").find("of claim agentbox-"), std::string::npos) << enforcement.dump();
  EXPECT_EQ(enforcement.value("level", ""), "full") << enforcement.dump();
  const auto requests = server_->Requests();
  EXPECT_TRUE(AnyRequest(requests, "POST", "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/agents/sandboxclaims"));
  EXPECT_TRUE(AnyRequest(requests, "GET", "/exec?")) << "no exec through the API server";

  // One world across calls; the file tools see what the shell see.
  EXPECT_EQ(Run(id, "bash", {{"command", "cat /tmp/warm"}}).value("output", ""), "warm\n");
  json w = Run(id, "write_file", {{"path", "tool.txt"}, {"content", "from the tool\n"}});
  EXPECT_EQ(w.value("is_error", true), false) << w.dump();
  EXPECT_EQ(Run(id, "bash", {{"command", "cat tool.txt"}}).value("output", ""), "from the tool\n");
  EXPECT_FALSE(std::filesystem::exists(ws_.path() + "/tool.txt")) << "the base was written";

  // A world that goes (its agentbox killed in the pod) is provisioned again
  // in the session's same sandbox: one claim, and the session's files kept.
  auto described = manager_->Describe(id);
  ASSERT_TRUE(described.ok());
  const int remote_pid = (*described)["remote"].value("remote_pid", 0);
  ASSERT_GT(remote_pid, 0) << described->dump();
  ASSERT_EQ(kill(remote_pid, SIGKILL), 0);
  // Once the session has seen its world go, the next call provisions one.
  for (int i = 0; i < 250; ++i) {
    auto now = manager_->Describe(id);
    if (now.ok() && !now->value("provisioned", true)) break;
    usleep(20000);
  }
  json again = Run(id, "bash", {{"command", "cat tool.txt"}});
  EXPECT_EQ(again.value("output", ""), "from the tool\n") << again.dump();
  auto after = manager_->Describe(id);
  ASSERT_TRUE(after.ok());
  EXPECT_NE((*after)["remote"].value("remote_pid", 0), remote_pid) << "the world was not provisioned again";
  const auto claims = server_->Requests();
  EXPECT_EQ(std::count_if(claims.begin(), claims.end(),
                          [](const std::string& r) { return r.rfind("POST ", 0) == 0 && r.find("/sandboxclaims") != std::string::npos; }),
            1)
      << "a second claim for the same session";

  // The session's end deletes its claim.
  ASSERT_TRUE(manager_->Remove(id).ok());
  EXPECT_TRUE(AnyRequest(server_->Requests(), "DELETE", "/sandboxclaims/agentbox-"));
}

// Diff and apply of a pod's world are the pod's agentbox's, by exec in the
// session's claimed pod (as ssh remotes do over a connection of their own);
// a snapshot, which would go with the claim, is refused rather than kept
// where it does not last.
TEST_F(K8sWorld, DiffAndApplyRunInTheClaimedPodAndASnapshotThatWouldGoWithItIsRefused) {
  const std::string bin_dir = bin_.substr(0, bin_.rfind('/'));
  ScopedEnv path("PATH", bin_dir + ":" + (getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin"));
  ScopedEnv cache("XDG_CACHE_HOME", dir_.path() + "/pod-cache");
  ScopedEnv pod_state("XDG_STATE_HOME", dir_.path() + "/pod-state");
  std::ofstream(ws_.path() + "/base.txt") << "one\n";
  server_->AddWarmPool("agents", "agentbox", "agentbox");
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  // No call yet: no pod, no changes, and nothing claimed to say so.
  auto empty = manager_->Diff(id);
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE((*empty)["files"].empty()) << empty->dump();
  EXPECT_FALSE(AnyRequest(server_->Requests(), "POST", "/sandboxclaims"));

  json r = Run(id, "bash", {{"command", "echo two >> base.txt; echo new > added.txt"}});
  ASSERT_EQ(r.value("exit_code", -1), 0) << r.dump();
  const auto seen = server_->Requests();
  const auto execs_before =
      std::count_if(seen.begin(), seen.end(), [](const std::string& q) { return q.find("/exec?") != std::string::npos; });
  auto diff = manager_->Diff(id);
  ASSERT_TRUE(diff.ok()) << diff.status().ToString();
  EXPECT_EQ((*diff)["files"].size(), 2u) << diff->dump();
  EXPECT_NE(diff->value("patch", "").find("+two"), std::string::npos) << diff->dump();
  const auto requests = server_->Requests();
  EXPECT_TRUE(std::any_of(requests.begin(), requests.end(), [](const std::string& q) {
    return q.find("/exec?") != std::string::npos && q.find("__remote-layers") != std::string::npos;
  })) << "the diff was not computed by the pod's agentbox";
  EXPECT_GT(std::count_if(requests.begin(), requests.end(),
                          [](const std::string& q) { return q.find("/exec?") != std::string::npos; }),
            execs_before);
  // The copy the diff read is the pod's (its state dir), not a local one.
  EXPECT_TRUE(std::filesystem::exists(dir_.path() + "/pod-state/agentbox/remote/" + id + "/copy/added.txt"));

  auto applied = manager_->Apply(id);
  ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  EXPECT_EQ((*applied)["applied"].size(), 2u) << applied->dump();
  std::ifstream in(ws_.path() + "/base.txt");
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "one\ntwo\n");

  auto snap = manager_->Snapshot(id);
  ASSERT_FALSE(snap.ok()) << "a snapshot was taken in a pod that goes with its claim";
  EXPECT_NE(snap.status().message().find("would go with the claim"), std::string::npos) << snap.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/pod-state/agentbox/remote-snapshots"));
  ASSERT_TRUE(manager_->Remove(id).ok());
}

// A daemon that stops without releasing its claims (killed) leaves them in
// the cluster; the session's log names each, so the next agentbox on that
// state directory resumes the claim (its pod keeps the session's changes)
// rather than leaking it and claiming another; one gone meanwhile is
// logged as released, and another is claimed.
TEST_F(K8sWorld, AClaimLeftByAStoppedAgentboxIsResumedAndOneGoneIsClaimedAfresh) {
  const std::string bin_dir = bin_.substr(0, bin_.rfind('/'));
  ScopedEnv path("PATH", bin_dir + ":" + (getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin"));
  ScopedEnv cache("XDG_CACHE_HOME", dir_.path() + "/pod-cache");
  ScopedEnv pod_state("XDG_STATE_HOME", dir_.path() + "/pod-state");
  server_->AddWarmPool("agents", "agentbox", "agentbox");
  session::ManagerOptions o;
  o.state_dir = state_.path() + "/left";
  o.agentbox_exe = bin_;
  const std::string id_file = dir_.path() + "/session-id";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // An agentbox that ends without releasing anything, as a killed one does.
    auto m = session::Manager::Open(o);
    if (!m.ok()) _exit(2);
    session::CreateRequest c;
    c.workspace = ws_.path();
    c.policy_yaml = "version: 1\nmode: workspace-write\nsandbox:\n  isolation: remote\n  remote:\n    kubernetes: "
                    "{ namespace: agents, template: agentbox, kubeconfig: " + kubeconfig_ + " }\n";
    auto id = (*m)->Create(c);
    if (!id.ok()) _exit(3);
    auto r = (*m)->Execute(*id, "bash", {{"command", "echo kept > kept.txt"}});
    if (!r.ok() || r->value("exit_code", -1) != 0) _exit(4);
    std::ofstream(id_file) << *id;
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the first agentbox failed: " << status;
  std::string id;
  std::ifstream(id_file) >> id;
  ASSERT_FALSE(id.empty());
  auto claims = [&] {
    const auto all = server_->Requests();
    return std::count_if(all.begin(), all.end(), [](const std::string& r) {
      return r.rfind("POST ", 0) == 0 && r.find("/sandboxclaims") != std::string::npos;
    });
  };
  ASSERT_EQ(claims(), 1);
  auto log_of = [&](session::Manager& m) {
    auto path = m.LogPath(id);
    std::ifstream in(path.ok() ? *path : "/nonexistent");
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };

  {
    auto again = session::Manager::Open(o);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    auto r = (*again)->Execute(id, "bash", {{"command", "cat kept.txt"}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->value("output", ""), "kept\n") << r->dump();
    EXPECT_EQ(claims(), 1) << "a second claim while the first was still there";
    EXPECT_NE(log_of(**again).find("\"claim_resumed\""), std::string::npos) << log_of(**again);
    // This one stops as a daemon does, releasing its claim (unlogged).
  }
  {
    auto third = session::Manager::Open(o);
    ASSERT_TRUE(third.ok()) << third.status().ToString();
    auto r = (*third)->Execute(id, "bash", {{"command", "echo after"}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->value("output", ""), "after\n") << r->dump();
    EXPECT_EQ(claims(), 2) << "the claim that was gone was not claimed again";
    const std::string log = log_of(**third);
    EXPECT_NE(log.find("is gone"), std::string::npos) << log;
    ASSERT_TRUE((*third)->Remove(id).ok());
  }
}

// The pod's kernel is the node's: an OOM kill of another process on it
// (here, an `agentbox run` at its own memory limit on this host, which the
// fake's pods share) during a call is not that call's. The call ends
// `exited`; counting the kernel's OOM kills (/proc/vmstat), as a microVM's
// guest may, would have made it `oom_killed`.
TEST_F(K8sWorld, AnOomKillElsewhereOnTheNodeIsNotTheCalls) {
  // The host fact, checked without agentbox: a child cgroup with the memory
  // controller, for the run that is OOM-killed beside the call.
  if (!host_facts::CgroupsExpected({"memory"})) {
    GTEST_SKIP() << "not applicable here: no writable cgroup with the memory controller for this user";
  }
  const std::string bin_dir = bin_.substr(0, bin_.rfind('/'));
  ScopedEnv path("PATH", bin_dir + ":" + (getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin"));
  ScopedEnv cache("XDG_CACHE_HOME", dir_.path() + "/pod-cache");
  ScopedEnv pod_state("XDG_STATE_HOME", dir_.path() + "/pod-state");
  server_->AddWarmPool("agents", "agentbox", "agentbox");
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(Run(id, "bash", {{"command", "true"}}).value("kind", ""), "exited");  // the world is up

  int elsewhere = -1;
  std::thread oom([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const std::string cmd =
        "'" + bin_ + "' run --memory 64Mi -- sh -c 'head -c 512M /dev/zero | tail' " + ">/dev/null 2>&1";
    const int st = std::system(cmd.c_str());
    elsewhere = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  });
  json r = Run(id, "bash", {{"command", "sleep 3; echo after"}});
  oom.join();
  ASSERT_EQ(elsewhere, 137) << "the run beside the call was not OOM-killed, so this test shows nothing";
  EXPECT_EQ(r.value("kind", ""), "exited") << r.dump();
  EXPECT_EQ(r.value("output", ""), "after\n") << r.dump();
  EXPECT_FALSE(r["outcome"]["usage"].contains("oom_kills")) << r.dump();
  ASSERT_TRUE(manager_->Remove(id).ok());
}

TEST_F(K8sWorld, AClaimThatCannotBeMadeIsTheCallsSandboxErrorNamingTheAPIsAnswer) {
  // No warm pool serves the template: the claim cannot be made.
  const std::string id = Create();
  ASSERT_FALSE(id.empty());
  json first = Run(id, "bash", {{"command", "echo should-not-run"}});
  EXPECT_EQ(first.value("kind", ""), "sandbox_error") << first.dump();
  const std::string out = first.value("output", "");
  EXPECT_NE(out.find("no SandboxWarmPool"), std::string::npos) << out;
  EXPECT_EQ(out.find("should-not-run"), std::string::npos) << out;
}

}  // namespace
}  // namespace agentbox::k8s
