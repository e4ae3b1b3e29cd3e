// Escalation offers from denials, against hand-made plans: no kernel.
#include "confine/escalation.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "policy/sha256.h"

namespace agentbox {
namespace {

constexpr std::uint64_t kGiB = 1ULL << 30;

// A plan as Confine() leaves it for /home/u/proj under
// escalation: one_time_approval, with the ceiling of docs/policy.md.
Plan OfferingPlan() {
  Plan p;
  p.workspace_source = "/home/u/proj";
  p.workspace_target = "/home/u/proj";
  p.protect_git = {"hooks", "config"};
  EscalationPlan& e = p.escalation;
  e.offers = true;
  e.network = {"registry.example:443", "*.npmjs.org:443", "127.0.0.7"};
  e.filesystem_read = {"/home/u/src", "/opt/data"};
  e.filesystem_write = {"/home/u/src", "/home/u/proj"};
  e.syscalls = {"ptrace"};
  e.memory_max_bytes = 8 * kGiB;
  e.never = {"/home/u/.ssh",  "/home/u/.aws",  "**/.env",
             "/etc/shadow",   "secrets/*.key", "/home/u/.local/state/agentbox"};
  e.protect = {"/home/u/proj/.git/hooks", "/home/u/proj/.git/config"};
  return p;
}

// Paths that exist, for the nearest-parent rule.
PathExists Existing(std::set<std::string> paths) {
  return [paths = std::move(paths)](const std::string& p) { return p == "/" || paths.count(p) > 0; };
}
const PathExists kAll = [](const std::string&) { return true; };

Denial NetDenial(const std::string& target, const std::string& reason = "not-allowed: not in network.allow") {
  return {"network", "connect", target, reason, "proxy", 1};
}
Denial FsDenial(const std::string& op, const std::string& target) {
  return {"filesystem", op, target, "read of a denied path", "stderr-signature", 0};
}
Denial SysDenial(const std::string& name) {
  return {"syscalls", name, "", "blocked by the seccomp filter", "seccomp", 1};
}

TEST(EscalationTest, NetworkGrantIsTheHostAndPortAsDenied) {
  Plan p = OfferingPlan();
  auto offer = OfferFor(NetDenial("registry.example:443"), p, kAll);
  ASSERT_TRUE(offer.has_value());
  EXPECT_EQ(offer->grant_key, "network.allow");
  EXPECT_EQ(offer->grant_text, "registry.example:443");
  EXPECT_EQ(offer->grant_json, R"({"network.allow":"registry.example:443"})");
  EXPECT_EQ(offer->id, "esc-" + Sha256Hex(offer->grant_json).substr(0, 12));
  EXPECT_TRUE(offer->within_ceiling);
  EXPECT_TRUE(offer->why_not.empty());

  auto sub = OfferFor(NetDenial("cdn.npmjs.org:443"), p, kAll);
  ASSERT_TRUE(sub.has_value());
  EXPECT_EQ(sub->grant_text, "cdn.npmjs.org:443");  // never the pattern that covers it
  EXPECT_TRUE(sub->within_ceiling);

  auto address = OfferFor(NetDenial("127.0.0.7:8080"), p, kAll);
  ASSERT_TRUE(address.has_value());
  EXPECT_TRUE(address->within_ceiling);
}

TEST(EscalationTest, NetworkBeyondTheCeilingSaysWhy) {
  Plan p = OfferingPlan();
  // Another port of an allowed host: the ceiling names 443 only.
  auto port = OfferFor(NetDenial("registry.example:80"), p, kAll);
  ASSERT_TRUE(port.has_value());
  EXPECT_EQ(port->grant_text, "registry.example:80");
  EXPECT_FALSE(port->within_ceiling);
  EXPECT_NE(port->why_not.find("does not cover registry.example:80"), std::string::npos) << port->why_not;

  auto evil = OfferFor(NetDenial("evil.example:443"), p, kAll);
  ASSERT_TRUE(evil.has_value());
  EXPECT_FALSE(evil->within_ceiling);

  // network.deny wins over any allow entry, so a grant could not lift it.
  auto denied = OfferFor(NetDenial("registry.example:443", "deny-rule: registry.example:443 (rule: registry.example)"),
                         p, kAll);
  ASSERT_TRUE(denied.has_value());
  EXPECT_FALSE(denied->within_ceiling);
  EXPECT_NE(denied->why_not.find("network.deny"), std::string::npos);

  p.escalation.network.clear();
  auto none = OfferFor(NetDenial("registry.example:443"), p, kAll);
  ASSERT_TRUE(none.has_value());
  EXPECT_FALSE(none->within_ceiling);
  EXPECT_NE(none->why_not.find("max_grant.network is empty"), std::string::npos);
}

TEST(EscalationTest, NetworkRefusalsNoAllowEntryLiftsGetNoOffer) {
  Plan p = OfferingPlan();
  EXPECT_FALSE(OfferFor(NetDenial("registry.example:443", "address-guard: resolves to 10.0.0.1"), p, kAll));
  EXPECT_FALSE(OfferFor(NetDenial("registry.example:443", "sni-mismatch: SNI names other.example"), p, kAll));
  Denial request{"network", "request", "registry.example:443", "http_rules: POST /x", "proxy", 1};
  EXPECT_FALSE(OfferFor(request, p, kAll));
  EXPECT_FALSE(OfferFor(NetDenial("registry.example"), p, kAll));  // no port to scope a grant to
}

TEST(EscalationTest, ReadGrantIsThePathAsDenied) {
  Plan p = OfferingPlan();
  auto offer = OfferFor(FsDenial("access", "/home/u/src/lib/a.c"), p, kAll);
  ASSERT_TRUE(offer.has_value());
  EXPECT_EQ(offer->grant_key, "filesystem.read");
  EXPECT_EQ(offer->grant_text, "/home/u/src/lib/a.c");  // not the tree that allows it
  EXPECT_EQ(offer->grant_json, R"({"filesystem.read":"/home/u/src/lib/a.c"})");
  EXPECT_TRUE(offer->within_ceiling);

  auto outside = OfferFor(FsDenial("access", "/var/lib/db"), p, kAll);
  ASSERT_TRUE(outside.has_value());
  EXPECT_EQ(outside->grant_text, "/var/lib/db");
  EXPECT_FALSE(outside->within_ceiling);
  EXPECT_NE(outside->why_not.find("not within on_violation.max_grant.filesystem_read"), std::string::npos);

  // A prefix that is not a parent directory is not within.
  auto sibling = OfferFor(FsDenial("access", "/opt/database"), p, kAll);
  ASSERT_TRUE(sibling.has_value());
  EXPECT_FALSE(sibling->within_ceiling);
}

TEST(EscalationTest, WriteGrantIsThePathOrItsNearestExistingParent) {
  Plan p = OfferingPlan();
  auto existing = OfferFor(FsDenial("write", "/home/u/src/out.txt"), p, kAll);
  ASSERT_TRUE(existing.has_value());
  EXPECT_EQ(existing->grant_key, "filesystem.read_write");
  EXPECT_EQ(existing->grant_text, "/home/u/src/out.txt");
  EXPECT_TRUE(existing->within_ceiling);

  // Creating build/gen/x.o where only /home/u/src exists: that directory,
  // the narrowest tree the write needs.
  auto created = OfferFor(FsDenial("write", "/home/u/src/build/gen/x.o"), p,
                          Existing({"/home", "/home/u", "/home/u/src"}));
  ASSERT_TRUE(created.has_value());
  EXPECT_EQ(created->grant_text, "/home/u/src");
  EXPECT_EQ(created->grant_json, R"({"filesystem.read_write":"/home/u/src"})");
  EXPECT_TRUE(created->within_ceiling);

  // The nearest existing parent above the ceiling's tree is beyond it.
  auto above = OfferFor(FsDenial("write", "/home/u/src2/x"), p, Existing({"/home", "/home/u"}));
  ASSERT_TRUE(above.has_value());
  EXPECT_EQ(above->grant_text, "/home/u");
  EXPECT_FALSE(above->within_ceiling);

  // A relative path is the workspace's.
  auto relative = OfferFor(FsDenial("write", "gen/a.txt"), p, Existing({"/home/u/proj"}));
  ASSERT_TRUE(relative.has_value());
  EXPECT_EQ(relative->grant_text, "/home/u/proj");
  EXPECT_TRUE(relative->within_ceiling);
}

TEST(EscalationTest, NeverWiderThanTheDenial) {
  Plan p = OfferingPlan();
  for (const Denial& d : {FsDenial("access", "/home/u/src/a/b/c"), FsDenial("write", "/home/u/src/a/b/c"),
                          NetDenial("x.npmjs.org:443"), SysDenial("ptrace")}) {
    auto offer = OfferFor(d, p, kAll);
    ASSERT_TRUE(offer.has_value()) << d.target << d.op;
    // The grant names exactly what was denied: never the ceiling's entry.
    EXPECT_EQ(offer->grant_text, d.facet == "syscalls" ? d.op : d.target);
  }
}

TEST(EscalationTest, CredentialPathsAreAlwaysBeyond) {
  Plan p = OfferingPlan();
  // Even a ceiling that covers the whole home opens nothing under ~/.ssh.
  p.escalation.filesystem_read.push_back("/home/u");
  p.escalation.filesystem_write.push_back("/home/u");
  for (const char* path : {"/home/u/.ssh", "/home/u/.ssh/id_ed25519", "/home/u/.aws/credentials",
                           "/home/u/src/.env", "/srv/app/.env/x", "/home/u/proj/secrets/prod.key",
                           "/home/u/.local/state/agentbox/sessions"}) {
    for (const char* op : {"access", "write"}) {
      auto offer = OfferFor(FsDenial(op, path), p, kAll);
      ASSERT_TRUE(offer.has_value()) << op << " " << path;
      EXPECT_FALSE(offer->within_ceiling) << op << " " << path;
      EXPECT_NE(offer->why_not.find("no grant opens"), std::string::npos) << offer->why_not;
    }
  }
  // A write creating a key under ~/.ssh: its nearest parent is denied too.
  auto key = OfferFor(FsDenial("write", "/home/u/.ssh/new_key"), p, Existing({"/home", "/home/u", "/home/u/.ssh"}));
  ASSERT_TRUE(key.has_value());
  EXPECT_EQ(key->grant_text, "/home/u/.ssh");
  EXPECT_FALSE(key->within_ceiling);
  // Beside it, not under it: within.
  auto beside = OfferFor(FsDenial("access", "/home/u/.sshrc"), p, kAll);
  ASSERT_TRUE(beside.has_value());
  EXPECT_TRUE(beside->within_ceiling);

  // An absolute glob of filesystem.deny, anchored at the root.
  p.escalation.never.push_back("/home/u/*/tokens");
  auto token = OfferFor(FsDenial("access", "/home/u/src/tokens/gh"), p, kAll);
  ASSERT_TRUE(token.has_value());
  EXPECT_FALSE(token->within_ceiling);
  auto deeper = OfferFor(FsDenial("access", "/home/u/src/a/tokens"), p, kAll);
  ASSERT_TRUE(deeper.has_value());
  EXPECT_TRUE(deeper->within_ceiling) << deeper->why_not;
}

TEST(EscalationTest, ProtectedPathsAndSetIdBitsGetNoOffer) {
  Plan p = OfferingPlan();
  EXPECT_FALSE(OfferFor(FsDenial("write", "/home/u/proj/.git/config"), p, kAll));
  EXPECT_FALSE(OfferFor(FsDenial("write", "/home/u/proj/.git/hooks/pre-commit"), p, kAll));
  EXPECT_FALSE(OfferFor(FsDenial("write", ".git/hooks/post-checkout"), p, kAll));
  // Another repository of the workspace: its hooks are protected as well.
  EXPECT_FALSE(OfferFor(FsDenial("write", "/home/u/proj/vendor/lib/.git/hooks/x"), p, kAll));
  // Moving a protected path's ancestor away.
  EXPECT_FALSE(OfferFor(FsDenial("rename", "/home/u/proj/.git"), p, kAll));
  Denial setid{"filesystem", "chmod", "/home/u/proj/tool", "set-id bits", "seccomp", 1};
  EXPECT_FALSE(OfferFor(setid, p, kAll));
  Denial socket{"filesystem", "connect", "/run/docker.sock", "a unix socket outside the sandbox", "seccomp", 1};
  EXPECT_FALSE(OfferFor(socket, p, kAll));
  Denial hook{"filesystem", "git-hook", "/home/u/proj/sub/.git/hooks/x", "executable hook", "git-audit", 0};
  EXPECT_FALSE(OfferFor(hook, p, kAll));
  // Reading .git/config is not what protect refuses.
  auto read = OfferFor(FsDenial("access", "/home/u/proj/.git/config"), p, kAll);
  ASSERT_TRUE(read.has_value());
}

TEST(EscalationTest, SyscallGrants) {
  Plan p = OfferingPlan();
  auto ptrace = OfferFor(SysDenial("ptrace"), p, kAll);
  ASSERT_TRUE(ptrace.has_value());
  EXPECT_EQ(ptrace->grant_key, "syscalls.allow");
  EXPECT_EQ(ptrace->grant_json, R"({"syscalls.allow":"ptrace"})");
  EXPECT_TRUE(ptrace->within_ceiling);

  // Grantable, but not in this ceiling.
  auto vm = OfferFor(SysDenial("process_vm_readv"), p, kAll);
  ASSERT_TRUE(vm.has_value());
  EXPECT_FALSE(vm->within_ceiling);
  EXPECT_NE(vm->why_not.find("max_grant.syscalls does not name process_vm_readv"), std::string::npos);

  // Always denied, whatever the ceiling says (a plan made by hand may name them).
  p.escalation.syscalls = {"ptrace", "init_module", "unshare", "mount", "bpf"};
  for (const char* name : {"init_module", "unshare", "mount", "setns", "kexec_load", "io_uring_setup", "bpf"}) {
    auto offer = OfferFor(SysDenial(name), p, kAll);
    ASSERT_TRUE(offer.has_value()) << name;
    EXPECT_EQ(offer->grant_text, name);
    EXPECT_FALSE(offer->within_ceiling) << name;
    EXPECT_NE(offer->why_not.find("is never granted"), std::string::npos) << offer->why_not;
  }

  // Denied by its arguments (clone with namespace flags, socket families):
  // no grant names that.
  EXPECT_FALSE(OfferFor(SysDenial("clone"), p, kAll));
  EXPECT_FALSE(OfferFor(SysDenial("socket"), p, kAll));
}

TEST(EscalationTest, MemoryGrantDoublesTheLimitInWholeGiBUpToTheCap) {
  Plan p = OfferingPlan();
  Denial oom{"resources", "memory", "memory.max", "OOM-killed at the memory limit", "cgroup", 1};
  p.limits.memory_max_bytes = 512ULL << 20;  // 512 MiB → 1 GiB
  auto small = OfferFor(oom, p, kAll);
  ASSERT_TRUE(small.has_value());
  EXPECT_EQ(small->grant_key, "resources.memory_gib");
  EXPECT_EQ(small->grant_gib, std::optional<std::uint64_t>(1));
  EXPECT_EQ(small->grant_json, R"({"resources.memory_gib":1})");
  EXPECT_TRUE(small->within_ceiling);

  p.limits.memory_max_bytes = 1536ULL << 20;  // 1.5 GiB → 3 GiB
  EXPECT_EQ(OfferFor(oom, p, kAll)->grant_gib, std::optional<std::uint64_t>(3));

  p.limits.memory_max_bytes = 6 * kGiB;  // 12 GiB asked, 8 the cap
  auto capped = OfferFor(oom, p, kAll);
  ASSERT_TRUE(capped.has_value());
  EXPECT_EQ(capped->grant_gib, std::optional<std::uint64_t>(8));
  EXPECT_TRUE(capped->within_ceiling);

  p.limits.memory_max_bytes = 8 * kGiB;  // at the cap: nothing to offer
  EXPECT_FALSE(OfferFor(oom, p, kAll));
  p.limits.memory_max_bytes = 10 * kGiB;  // above it
  EXPECT_FALSE(OfferFor(oom, p, kAll));

  // No memory_gib in max_grant: the grant is beyond the ceiling.
  p.escalation.memory_max_bytes.reset();
  p.limits.memory_max_bytes = 2 * kGiB;
  auto uncapped = OfferFor(oom, p, kAll);
  ASSERT_TRUE(uncapped.has_value());
  EXPECT_EQ(uncapped->grant_gib, std::optional<std::uint64_t>(4));
  EXPECT_FALSE(uncapped->within_ceiling);
  EXPECT_NE(uncapped->why_not.find("memory_gib is not set"), std::string::npos);

  // No limit in force: nothing to raise.
  p.limits.memory_max_bytes.reset();
  EXPECT_FALSE(OfferFor(oom, p, kAll));
}

TEST(EscalationTest, EscalationDenyGivesNoOffers) {
  Plan p = OfferingPlan();
  p.escalation.offers = false;  // on_violation.escalation: deny
  p.limits.memory_max_bytes = kGiB;
  for (const Denial& d : {NetDenial("registry.example:443"), FsDenial("access", "/home/u/src/a"),
                          FsDenial("write", "/home/u/src/a"), SysDenial("ptrace"),
                          Denial{"resources", "memory", "memory.max", "OOM", "cgroup", 1}}) {
    EXPECT_FALSE(OfferFor(d, p, kAll)) << d.facet << " " << d.op;
  }
  std::vector<Denial> denials = {NetDenial("registry.example:443"), SysDenial("ptrace")};
  AttachOffers(p, &denials);
  for (const Denial& d : denials) EXPECT_FALSE(d.escalation.has_value());
}

TEST(EscalationTest, AttachOffersLooksPathsUpOnTheHost) {
  Plan p = OfferingPlan();
  // The workspace is mounted elsewhere inside: paths are looked up at its source.
  p.workspace_source = "/";
  p.workspace_target = "/workspace";
  p.escalation.filesystem_write = {"/workspace"};
  p.escalation.protect.clear();
  std::vector<Denial> denials = {FsDenial("write", "/workspace/usr/no-such-dir-here/x"), SysDenial("ptrace"),
                                 Denial{"resources", "write", "/workspace", "disk_gib: full", "statfs", 0}};
  AttachOffers(p, &denials);
  ASSERT_TRUE(denials[0].escalation.has_value());
  EXPECT_EQ(denials[0].escalation->grant_text, "/workspace/usr");  // /usr exists on every host this runs on
  EXPECT_TRUE(denials[0].escalation->within_ceiling);
  ASSERT_TRUE(denials[1].escalation.has_value());
  EXPECT_TRUE(denials[1].escalation->within_ceiling);
  EXPECT_FALSE(denials[2].escalation.has_value());  // disk_gib: no grant in this version
}

TEST(EscalationTest, OfferIdOfTheReportDocsExample) {
  EXPECT_EQ(MakeOffer("network.allow", "registry.example:443", std::nullopt).id, "esc-11a87832d6f9");
}

TEST(EscalationTest, OfferIdsDifferByGrant) {
  EXPECT_NE(MakeOffer("network.allow", "a.example:443", std::nullopt).id,
            MakeOffer("network.allow", "a.example:80", std::nullopt).id);
  EXPECT_NE(MakeOffer("filesystem.read", "/x", std::nullopt).id,
            MakeOffer("filesystem.read_write", "/x", std::nullopt).id);
  EXPECT_EQ(MakeOffer("resources.memory_gib", "", 4).id, MakeOffer("resources.memory_gib", "", 4).id);
  EXPECT_EQ(MakeOffer("syscalls.allow", "ptrace", std::nullopt).id.size(), 16u);  // "esc-" + 12
}

}  // namespace
}  // namespace agentbox
