// sandbox.remote: the forms a remote world is named in, and every refusal
// with its key path and line:column.
#include <gtest/gtest.h>

#include <string>

#include "agentbox/policy.h"
#include "policy/policy_testing.h"

namespace agentbox {
namespace {

using policy_testing::MustParse;

// The whole message of the first error, or "" when the text parses.
std::string ErrorOf(const std::string& text) {
  Result<Policy> r = ParsePolicy(text, "policy.yaml");
  if (r.ok()) return "";
  EXPECT_EQ(r.status().stage(), "policy");
  return r.status().message();
}

std::string WithSsh(const std::string& destination) {
  return "sandbox:\n  isolation: remote\n  remote:\n    ssh: \"" + destination + "\"\n";
}

TEST(RemoteParse, SshWithAPortIsKeptAsWrittenAndTheLevelDefaultsToOs) {
  Policy p = MustParse("sandbox:\n  isolation: remote\n  remote:\n    ssh: agent@build-3.example:2222\n");
  EXPECT_EQ(p.sandbox.isolation, Isolation::kRemote);
  ASSERT_TRUE(p.sandbox.remote.has_value());
  EXPECT_EQ(p.sandbox.remote->ssh, "agent@build-3.example:2222");
  EXPECT_EQ(p.sandbox.remote->level, Isolation::kOs);
  EXPECT_EQ(p.sandbox.remote->ssh_config, "");
  EXPECT_EQ(p.sandbox.remote->workspace, "");
  EXPECT_FALSE(p.sandbox.remote->kubernetes.has_value());
}

TEST(RemoteParse, IPv6InBracketsWithAndWithoutAPort) {
  for (const char* destination : {"agent@[2001:db8::1]:2222", "[::1]", "[fe80::1]:22", "build-3"}) {
    Policy p = MustParse(WithSsh(destination));
    ASSERT_TRUE(p.sandbox.remote.has_value()) << destination;
    EXPECT_EQ(p.sandbox.remote->ssh, destination);
  }
}

TEST(RemoteParse, SshConfigUnderHomeKeepsItsTildeAndEveryLevelParses) {
  const std::pair<const char*, Isolation> levels[] = {
      {"os", Isolation::kOs}, {"container", Isolation::kContainer}, {"microvm", Isolation::kMicrovm}};
  for (const auto& [name, level] : levels) {
    Policy p = MustParse(std::string("sandbox:\n  isolation: remote\n  remote:\n    ssh: build-3\n"
                                     "    ssh_config: ~/.ssh/agentbox_config\n    workspace: /srv/work\n"
                                     "    level: ") + name + "\n");
    ASSERT_TRUE(p.sandbox.remote.has_value()) << name;
    EXPECT_EQ(p.sandbox.remote->level, level) << name;
    EXPECT_EQ(p.sandbox.remote->ssh_config, "~/.ssh/agentbox_config");
    EXPECT_EQ(p.sandbox.remote->workspace, "/srv/work");
  }
}

TEST(RemoteParse, AKubernetesBlockNamesItsClusterAndTemplate) {
  Policy p = MustParse(
      "sandbox:\n  isolation: remote\n  remote:\n    level: microvm\n    kubernetes:\n      namespace: agents\n"
      "      template: coder-1\n      context: staging\n      kubeconfig: ~/.kube/staging\n");
  ASSERT_TRUE(p.sandbox.remote.has_value());
  EXPECT_EQ(p.sandbox.remote->ssh, "");
  EXPECT_EQ(p.sandbox.remote->level, Isolation::kMicrovm);
  ASSERT_TRUE(p.sandbox.remote->kubernetes.has_value());
  EXPECT_EQ(p.sandbox.remote->kubernetes->namespace_name, "agents");
  EXPECT_EQ(p.sandbox.remote->kubernetes->template_name, "coder-1");
  EXPECT_EQ(p.sandbox.remote->kubernetes->context, "staging");
  EXPECT_EQ(p.sandbox.remote->kubernetes->kubeconfig, "~/.kube/staging");
}

TEST(RemoteParse, ExplainsOutputParsesToTheSameRemote) {
  for (const std::string& text :
       {std::string("sandbox:\n  isolation: remote\n  remote: {ssh: \"agent@[::1]:2200\", ssh_config: "
                    "~/.ssh/cfg, level: container, workspace: /srv/w}\n"),
        std::string("sandbox:\n  isolation: remote\n  remote: {kubernetes: {namespace: agents, template: coder, "
                    "context: c1, kubeconfig: /etc/kube/config}}\n")}) {
    Policy p = MustParse(text);
    Policy back = MustParse(ToYaml(p));
    ASSERT_TRUE(p.sandbox.remote && back.sandbox.remote) << ToYaml(p);
    EXPECT_EQ(back.sandbox.isolation, Isolation::kRemote);
    EXPECT_EQ(back.sandbox.remote->ssh, p.sandbox.remote->ssh);
    EXPECT_EQ(back.sandbox.remote->ssh_config, p.sandbox.remote->ssh_config);
    EXPECT_EQ(back.sandbox.remote->level, p.sandbox.remote->level);
    EXPECT_EQ(back.sandbox.remote->workspace, p.sandbox.remote->workspace);
    ASSERT_EQ(back.sandbox.remote->kubernetes.has_value(), p.sandbox.remote->kubernetes.has_value());
    if (p.sandbox.remote->kubernetes) {
      EXPECT_EQ(back.sandbox.remote->kubernetes->namespace_name, "agents");
      EXPECT_EQ(back.sandbox.remote->kubernetes->template_name, "coder");
      EXPECT_EQ(back.sandbox.remote->kubernetes->context, "c1");
      EXPECT_EQ(back.sandbox.remote->kubernetes->kubeconfig, "/etc/kube/config");
    }
  }
}

// ---- Refusals: the key path and where it is -----------------------------------

TEST(RemoteParse, BothSshAndKubernetesIsOneTooMany) {
  EXPECT_EQ(ErrorOf("sandbox:\n  isolation: remote\n  remote:\n    ssh: build-3\n"
                    "    kubernetes: {namespace: agents, template: coder}\n"),
            "policy.yaml:4:5: sandbox.remote: gives both ssh and kubernetes: a remote world is one or the other");
}

TEST(RemoteParse, NeitherSshNorKubernetesNamesNoRemote) {
  EXPECT_EQ(ErrorOf("sandbox:\n  isolation: remote\n  remote:\n    level: os\n"),
            "policy.yaml:4:5: sandbox.remote: names no remote: give ssh (\"user@host\") or kubernetes "
            "({namespace, template})");
}

TEST(RemoteParse, IsolationRemoteNeedsSandboxRemote) {
  EXPECT_EQ(ErrorOf("version: 1\nsandbox:\n  isolation: remote\n"),
            "policy.yaml:3:14: sandbox.isolation: isolation: remote needs sandbox.remote: where the world runs "
            "({ssh: \"user@host\", level: os} or {kubernetes: {namespace, template}})");
}

TEST(RemoteParse, SandboxRemoteWithoutIsolationRemoteIsAnError) {
  EXPECT_EQ(ErrorOf("sandbox:\n  isolation: microvm\n  remote:\n    ssh: build-3\n"),
            "policy.yaml:4:5: sandbox.remote: sandbox.remote is set but sandbox.isolation is microvm, not remote");
  // The preset's isolation counts as well.
  EXPECT_EQ(ErrorOf("sandbox:\n  remote: {ssh: build-3}\n"),
            "policy.yaml:2:11: sandbox.remote: sandbox.remote is set but sandbox.isolation is os, not remote");
}

TEST(RemoteParse, ADestinationSshWouldReadAsAnOptionIsRefused) {
  EXPECT_EQ(ErrorOf(WithSsh("-oProxyCommand=sh")),
            "policy.yaml:4:10: sandbox.remote.ssh: must not start with '-' (ssh would read it as an option)");
}

TEST(RemoteParse, ASpaceOrASemicolonInTheDestinationIsRefused) {
  EXPECT_EQ(ErrorOf(WithSsh("build 3")),
            "policy.yaml:4:10: sandbox.remote.ssh: holds ' ': a destination is [user@]host[:port] "
            "(letters, digits, . - _ @ : [ ])");
  EXPECT_EQ(ErrorOf(WithSsh("build-3;id")),
            "policy.yaml:4:10: sandbox.remote.ssh: holds ';': a destination is [user@]host[:port] "
            "(letters, digits, . - _ @ : [ ])");
}

TEST(RemoteParse, APortOutside1To65535IsRefused) {
  EXPECT_EQ(ErrorOf(WithSsh("build-3:0")),
            "policy.yaml:4:10: sandbox.remote.ssh: has the port '0' (a port is 1-65535)");
  EXPECT_EQ(ErrorOf(WithSsh("agent@build-3:70000")),
            "policy.yaml:4:10: sandbox.remote.ssh: has the port '70000' (a port is 1-65535)");
  EXPECT_EQ(ErrorOf(WithSsh("[::1]:70000")),
            "policy.yaml:4:10: sandbox.remote.ssh: has the port '70000' (a port is 1-65535)");
  EXPECT_EQ(ErrorOf(WithSsh("build-3:65535")), "");
  EXPECT_EQ(ErrorOf(WithSsh("build-3:1")), "");
}

TEST(RemoteParse, AKubernetesNameIsADnsLabel) {
  EXPECT_EQ(ErrorOf("sandbox:\n  isolation: remote\n  remote:\n    kubernetes:\n      namespace: Agents\n"
                    "      template: coder\n"),
            "policy.yaml:5:18: sandbox.remote.kubernetes.namespace: \"Agents\" is not a DNS label "
            "(lower-case letters, digits and '-')");
  EXPECT_EQ(ErrorOf("sandbox:\n  isolation: remote\n  remote:\n    kubernetes:\n      namespace: agents\n"
                    "      template: coder-\n"),
            "policy.yaml:6:17: sandbox.remote.kubernetes.template: \"coder-\" must start and end with a letter "
            "or digit");
}

TEST(RemoteParse, KubernetesWithAWorkspaceIsRefused) {
  EXPECT_EQ(ErrorOf("sandbox:\n  isolation: remote\n  remote:\n    workspace: /srv/w\n    kubernetes:\n"
                    "      namespace: agents\n      template: coder\n"),
            "policy.yaml:4:5: sandbox.remote: ssh_config and workspace are for an ssh remote; a kubernetes "
            "sandbox's workspace is its pod's");
}

TEST(RemoteParse, ALevelIsOsContainerOrMicrovm) {
  EXPECT_EQ(ErrorOf("sandbox:\n  isolation: remote\n  remote:\n    ssh: build-3\n    level: remote\n"),
            "policy.yaml:5:12: sandbox.remote.level: unknown value \"remote\" (expected one of: os, container, "
            "microvm)");
}

}  // namespace
}  // namespace agentbox
