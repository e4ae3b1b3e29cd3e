#include <nlohmann/json.hpp>

#include <utility>

#include "agentbox/outcome.h"
#include "report/report_json.h"

#ifndef AGENTBOX_VERSION
#define AGENTBOX_VERSION "0.0.0"
#endif

namespace agentbox {

using nlohmann::json;

const char* Version() { return AGENTBOX_VERSION; }

const char* ToString(Level level) {
  switch (level) {
    case Level::kFull: return "full";
    case Level::kPartial: return "partial";
    case Level::kNone: return "none";
  }
  return "?";
}

const char* ToString(OutcomeKind kind) {
  switch (kind) {
    case OutcomeKind::kExited: return "exited";
    case OutcomeKind::kSignaled: return "signaled";
    case OutcomeKind::kTimedOut: return "timed_out";
    case OutcomeKind::kOomKilled: return "oom_killed";
    case OutcomeKind::kSandboxDenied: return "sandbox_denied";
    case OutcomeKind::kSandboxError: return "sandbox_error";
  }
  return "?";
}

void AddMissing(EnforcementReport* report, MissingFacet missing) {
  for (auto& f : report->facets) {
    if (f.name == missing.facet && f.level == Level::kFull) f.level = Level::kPartial;
  }
  if (report->level == Level::kFull) report->level = Level::kPartial;
  report->missing.push_back(std::move(missing));
}

int Outcome::ExitStatus() const {
  switch (kind) {
    case OutcomeKind::kSandboxError: return 125;
    case OutcomeKind::kTimedOut: return 124;
    case OutcomeKind::kOomKilled: return 137;
    default: break;
  }
  if (signal) return 128 + *signal;
  return exit_code.value_or(125);
}

json ToJsonValue(const EnforcementReport& r) {
  json facets = json::object();
  for (const auto& f : r.facets) {
    json o = {{"level", ToString(f.level)}, {"requested", f.requested}, {"mechanisms", f.mechanisms}};
    if (!f.notes.empty()) o["notes"] = f.notes;
    facets[f.name] = o;
  }
  json missing = json::array();
  for (const auto& m : r.missing) missing.push_back({{"facet", m.facet}, {"reason", m.reason}});
  json j = {{"level", ToString(r.level)}, {"backend", r.backend}, {"facets", facets}, {"missing", missing}};
  if (!r.backend_reason.empty()) j["backend_reason"] = r.backend_reason;
  if (!r.runtime.empty()) j["runtime"] = r.runtime;
  if (!r.skipped.empty()) j["skipped"] = r.skipped;
  if (!r.notes.empty()) j["notes"] = r.notes;
  return j;
}

json ToJsonValue(const Denial& d) {
  json j = {{"facet", d.facet}, {"op", d.op}, {"target", d.target}, {"reason", d.reason}, {"source", d.source}};
  if (d.count) j["count"] = d.count;
  if (d.escalation) {
    const EscalationOffer& e = *d.escalation;
    json grant = json::object();
    if (e.grant_gib) {
      grant[e.grant_key] = *e.grant_gib;
    } else {
      grant[e.grant_key] = e.grant_text;
    }
    json offer = {{"id", e.id}, {"grant", grant}, {"within_ceiling", e.within_ceiling}};
    if (!e.within_ceiling) offer["why_not"] = e.why_not;
    j["escalation"] = offer;
  }
  return j;
}

json ToJsonValue(const Outcome& o) {
  json j;
  j["outcome"] = ToString(o.kind);
  j["exit_code"] = o.exit_code ? json(*o.exit_code) : json(nullptr);
  j["signal"] = o.signal ? json(*o.signal) : json(nullptr);
  j["enforcement"] = ToJsonValue(o.enforcement);
  json denials = json::array();
  for (const auto& d : o.denials) denials.push_back(ToJsonValue(d));
  j["denials"] = denials;
  if (o.error) {
    j["error"] = {{"stage", o.error->stage}, {"message", o.error->message}, {"errno", o.error->err}};
  } else {
    j["error"] = nullptr;
  }
  json usage = {{"wall_ms", o.usage.wall_ms},
                {"cpu_user_ms", o.usage.cpu_user_ms},
                {"cpu_sys_ms", o.usage.cpu_sys_ms}};
  usage["peak_memory_bytes"] = o.usage.peak_memory_bytes ? json(*o.usage.peak_memory_bytes) : json(nullptr);
  usage["peak_processes"] = o.usage.peak_processes ? json(*o.usage.peak_processes) : json(nullptr);
  usage["source"] = o.usage.source;
  if (o.usage.oom_kills) usage["oom_kills"] = *o.usage.oom_kills;
  const LimitsInForce& l = o.usage.limits;
  json limits = {{"cgroup", l.cgroup.empty() ? json(nullptr) : json(l.cgroup)}, {"core_dumps", l.core_dumps}};
  if (l.memory_max_bytes) limits["memory_max_bytes"] = *l.memory_max_bytes;
  if (l.memory_low_bytes) limits["memory_low_bytes"] = *l.memory_low_bytes;
  if (l.cpu_max_cores) limits["cpu_max_cores"] = *l.cpu_max_cores;
  if (l.cpu_weight_cores) limits["cpu_weight_cores"] = *l.cpu_weight_cores;
  if (l.pids_max) limits["pids_max"] = *l.pids_max;
  if (l.fsize_bytes) limits["fsize_bytes"] = *l.fsize_bytes;
  if (l.nproc) limits["nproc"] = *l.nproc;
  if (l.nofile) limits["nofile"] = *l.nofile;
  if (l.wall_clock_ms) limits["wall_clock_ms"] = *l.wall_clock_ms;
  usage["limits"] = limits;
  j["usage"] = usage;
  if (o.network) {
    const NetworkConnections& n = *o.network;
    j["network"] = {{"connections",
                     {{"allowed", n.allowed},
                      {"denied", n.denied},
                      {"errors", n.errors},
                      {"bytes_up", n.bytes_up},
                      {"bytes_down", n.bytes_down}}}};
  }
  if (!o.credential_uses.empty()) {
    json uses = json::array();
    for (const auto& u : o.credential_uses) {
      uses.push_back({{"secret", u.secret},
                      {"host", u.host},
                      {"method", u.method},
                      {"path", u.path},
                      {"decision", u.decision},
                      {"count", u.count}});
    }
    j["credentials"] = {{"uses", uses}};
  }
  if (o.workspace_overlay) {
    const WorkspaceOverlayResult& w = *o.workspace_overlay;
    json overlay = {{"size_bytes", w.size_bytes}, {"apply", w.apply}, {"action", w.action}, {"reason", w.reason}};
    overlay["diff"] = w.diff_json.empty() ? json(nullptr) : json::parse(w.diff_json, nullptr, false);
    if (!w.error.empty()) overlay["error"] = w.error;
    j["workspace"] = {{"overlay", overlay}};
  }
  j["policy_sha256"] = o.policy_sha256;
  j["agentbox_version"] = Version();
  return j;
}

Result<EnforcementReport> EnforcementFromJson(const json& j) {
  auto level = [](const json& v, const std::string& where) -> Result<Level> {
    const std::string s = v.is_string() ? v.get<std::string>() : "";
    for (Level l : {Level::kFull, Level::kPartial, Level::kNone}) {
      if (s == ToString(l)) return l;
    }
    return Status::Error("report", where + ": '" + v.dump() + "' is not full, partial or none");
  };
  auto strings = [](const json& o, const char* key, std::vector<std::string>* out) {
    if (!o.contains(key)) return true;
    if (!o.at(key).is_array()) return false;
    for (const auto& s : o.at(key)) {
      if (!s.is_string()) return false;
      out->push_back(s.get<std::string>());
    }
    return true;
  };
  if (!j.is_object()) return Status::Error("report", "enforcement: not an object");
  EnforcementReport r;
  auto l = level(j.value("level", json()), "enforcement.level");
  if (!l.ok()) return l.status();
  r.level = *l;
  if (!j.value("backend", json()).is_string()) return Status::Error("report", "enforcement.backend: not a string");
  r.backend = j.at("backend").get<std::string>();
  const json reason = j.value("backend_reason", json(""));
  if (!reason.is_string()) return Status::Error("report", "enforcement.backend_reason: not a string");
  r.backend_reason = reason.get<std::string>();
  const json runtime = j.value("runtime", json(""));
  if (!runtime.is_string()) return Status::Error("report", "enforcement.runtime: not a string");
  r.runtime = runtime.get<std::string>();
  if (!j.value("facets", json()).is_object()) return Status::Error("report", "enforcement.facets: not an object");
  for (const auto& [name, f] : j.at("facets").items()) {
    const std::string where = "enforcement.facets." + name;
    if (!f.is_object()) return Status::Error("report", where + ": not an object");
    FacetReport facet;
    facet.name = name;
    auto fl = level(f.value("level", json()), where + ".level");
    if (!fl.ok()) return fl.status();
    facet.level = *fl;
    if (!f.value("requested", json()).is_boolean()) return Status::Error("report", where + ".requested: not a boolean");
    facet.requested = f.at("requested").get<bool>();
    if (!strings(f, "mechanisms", &facet.mechanisms) || !strings(f, "notes", &facet.notes)) {
      return Status::Error("report", where + ": mechanisms and notes are lists of strings");
    }
    r.facets.push_back(std::move(facet));
  }
  if (!j.value("missing", json()).is_array()) return Status::Error("report", "enforcement.missing: not a list");
  for (const auto& m : j.at("missing")) {
    if (!m.is_object() || !m.value("facet", json()).is_string() || !m.value("reason", json()).is_string()) {
      return Status::Error("report", "enforcement.missing: each entry is {facet, reason}");
    }
    r.missing.push_back({m.at("facet").get<std::string>(), m.at("reason").get<std::string>()});
  }
  if (!strings(j, "skipped", &r.skipped) || !strings(j, "notes", &r.notes)) {
    return Status::Error("report", "enforcement: skipped and notes are lists of strings");
  }
  return r;
}

std::string ToJson(const Outcome& outcome, int indent) { return ToJsonValue(outcome).dump(indent); }
std::string ToJson(const Denial& denial, int indent) { return ToJsonValue(denial).dump(indent); }
std::string ToJson(const EnforcementReport& report, int indent) {
  return ToJsonValue(report).dump(indent);
}

}  // namespace agentbox
