// Temporary: replaced by the grant mechanisms.
#include "confine/layers.h"
#include "session/world.h"
namespace agentbox {
bool LandlockCovers(const LandlockPlan&, const std::string&, bool) { return false; }
namespace session {
Status World::GraftPath(const std::string&, const std::string& target, bool) {
  return Status::Error("graft", "not available yet: " + target);
}
Status World::UngraftPath(const std::string& target) { return Status::Error("graft", "not available yet: " + target); }
Status World::SetMemoryLimit(std::uint64_t) { return Status::Error("memory", "not available yet"); }
}  // namespace session
}  // namespace agentbox
