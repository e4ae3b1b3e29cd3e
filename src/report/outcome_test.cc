// The report's own rules: what is found missing after planning lowers the
// facet it names and the report's level, and nothing else.
#include <gtest/gtest.h>

#include "agentbox/outcome.h"

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

}  // namespace
}  // namespace agentbox
