// Fuzzes the policy parser: any input must give a policy or a well-formed
// error, never a crash; and every accepted policy must survive
// ToYaml -> ParsePolicy unchanged, which is what `policy explain` promises.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "agentbox/policy.h"

namespace {

[[noreturn]] void Die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "policy_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);

  // Short inputs double as unit strings; only crashes matter here.
  if (size < 64) {
    (void)agentbox::ParseSize(text).ok();
    (void)agentbox::ParseDurationMs(text).ok();
  }

  agentbox::Result<agentbox::Policy> first = agentbox::ParsePolicy(text, "fuzz.yaml");
  if (!first.ok()) {
    const agentbox::Status& status = first.status();
    if (status.stage() != "policy" || status.message().rfind("fuzz.yaml:", 0) != 0) {
      Die("malformed error", status.ToString());
    }
    return 0;
  }

  const std::string yaml = agentbox::ToYaml(*first);
  agentbox::Result<agentbox::Policy> second = agentbox::ParsePolicy(yaml, "roundtrip.yaml");
  if (!second.ok()) Die("ToYaml output does not parse", second.status().ToString() + "\n" + yaml);
  const std::string again = agentbox::ToYaml(*second);
  if (again != yaml) Die("round trip changed the policy", yaml + "---\n" + again);
  return 0;
}
