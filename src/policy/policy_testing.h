// What the policy tests share: the fixtures' directory, and a parse that
// must succeed.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "agentbox/policy.h"

namespace agentbox::policy_testing {

inline const std::string kFixtures = AGENTBOX_FIXTURES;

// The policy `text` parses to (a test failure, and a default policy, when it does not).
inline Policy MustParse(const std::string& text) {
  Result<Policy> r = ParsePolicy(text, "policy.yaml");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : Policy{};
}

}  // namespace agentbox::policy_testing
