// The report's own rules: what is found missing after planning lowers the
// facet it names and the report's level, and nothing else.
#include <gtest/gtest.h>

#include "agentbox/outcome.h"
#include "report/report_json.h"

namespace agentbox {
namespace {

EnforcementReport FullReport() {
  EnforcementReport r;
  r.level = Level::kFull;
  for (const char* name : {"filesystem", "network"}) {
    FacetReport f;
    f.name = name;
    f.requested = true;
    f.level = Level::kFull;
    f.mechanisms = {"m"};
    r.facets.push_back(f);
  }
  return r;
}

TEST(AddMissing, LowersTheNamedFacetAndTheLevel) {
  EnforcementReport r = FullReport();
  AddMissing(&r, {"filesystem", "Landlock on this kernel (ABI 5) is short of the plan (ABI 7): ..."});
  EXPECT_EQ(r.level, Level::kPartial);
  EXPECT_EQ(r.facets[0].level, Level::kPartial);
  EXPECT_EQ(r.facets[1].level, Level::kFull);
  ASSERT_EQ(r.missing.size(), 1u);
  EXPECT_EQ(r.missing[0].facet, "filesystem");
  // A facet already short of full, or none at all, stays as it is.
  r.facets[1].level = Level::kNone;
  AddMissing(&r, {"network", "x"});
  EXPECT_EQ(r.facets[1].level, Level::kNone);
  EXPECT_EQ(r.missing.size(), 2u);
}

TEST(DenialJson, EscalationOfferIsListedOnlyWhenThereIsOne) {
  Outcome o;
  o.kind = OutcomeKind::kSandboxDenied;
  o.denials.push_back({"network", "connect", "a.example:443", "not-allowed", "proxy", 1});
  Denial with{"syscalls", "ptrace", "", "blocked by the seccomp filter", "seccomp", 2};
  EscalationOffer offer;
  offer.id = "esc-0123456789ab";
  offer.grant_key = "syscalls.allow";
  offer.grant_text = "ptrace";
  offer.within_ceiling = false;
  offer.why_not = "on_violation.max_grant.syscalls does not name ptrace";
  with.escalation = offer;
  o.denials.push_back(with);
  Denial memory{"resources", "memory", "memory.max", "OOM", "cgroup", 1};
  EscalationOffer more;
  more.id = "esc-ba9876543210";
  more.grant_key = "resources.memory_gib";
  more.grant_gib = 4;
  more.within_ceiling = true;
  more.why_not = "not shown when within";
  memory.escalation = more;
  o.denials.push_back(memory);

  const nlohmann::json j = ToJsonValue(o);
  EXPECT_FALSE(j["denials"][0].contains("escalation"));
  EXPECT_EQ(j["denials"][1]["escalation"],
            nlohmann::json({{"id", "esc-0123456789ab"},
                            {"grant", {{"syscalls.allow", "ptrace"}}},
                            {"within_ceiling", false},
                            {"why_not", "on_violation.max_grant.syscalls does not name ptrace"}}));
  EXPECT_EQ(j["denials"][2]["escalation"],
            nlohmann::json({{"id", "esc-ba9876543210"}, {"grant", {{"resources.memory_gib", 4}}}, {"within_ceiling", true}}));
  EXPECT_EQ(nlohmann::json::parse(ToJson(with)), j["denials"][1]);
}

TEST(EnforcementFromJson, ReadsBackWhatToJsonValueWrites) {
  EnforcementReport r = FullReport();
  r.backend = "linux-namespaces";
  r.backend_reason = "user namespaces available";
  r.facets[0].notes = {"workspace is a host bind"};
  r.facets[1].requested = false;
  AddMissing(&r, {"filesystem", "short of the plan"});
  r.skipped = {"/opt/x (filesystem.read_only: /opt/x): absent on this host"};
  r.notes = {"fresh_per_task: false"};
  const nlohmann::json j = ToJsonValue(r);
  auto back = EnforcementFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(ToJsonValue(*back), j);
  EXPECT_EQ(back->level, Level::kPartial);
  ASSERT_EQ(back->facets.size(), 2u);
  EXPECT_FALSE(back->facets[1].requested);
}

TEST(EnforcementFromJson, NamesTheFieldItCannotRead) {
  nlohmann::json j = ToJsonValue(FullReport());
  j["backend"] = "linux-namespaces";
  j["facets"]["network"]["level"] = "most";
  auto bad = EnforcementFromJson(j);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("enforcement.facets.network.level"), std::string::npos)
      << bad.status().message();
  j = ToJsonValue(FullReport());
  j["backend"] = "linux-namespaces";
  j["missing"] = {{{"facet", 1}}};
  auto missing = EnforcementFromJson(j);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("enforcement.missing"), std::string::npos);
}

}  // namespace
}  // namespace agentbox
