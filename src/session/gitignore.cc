#include "session/gitignore.h"

#include <utility>

#include "agentbox/plan.h"  // GlobMatch

namespace agentbox::session {

IgnoreRules::IgnoreRules(Loader loader, std::string_view info_exclude, const std::vector<std::string>& extra)
    : loader_(std::move(loader)) {
  info_.rules = Parse(info_exclude);
  std::string text;
  for (const std::string& pattern : extra) text += pattern + "\n";
  extra_.rules = Parse(text);
}

std::vector<IgnoreRules::Rule> IgnoreRules::Parse(std::string_view text) {
  std::vector<Rule> rules;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) nl = text.size();
    std::string line(text.substr(start, nl - start));
    start = nl + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    // Trailing spaces go unless the last one is escaped.
    std::size_t end = line.size();
    while (end > 0 && line[end - 1] == ' ' && !(end >= 2 && line[end - 2] == '\\')) --end;
    line.resize(end);
    Rule rule;
    if (!line.empty() && line[0] == '!') {
      rule.negate = true;
      line.erase(0, 1);
    }
    if (!line.empty() && line.back() == '/') {
      rule.dir_only = true;
      line.pop_back();
    }
    if (line.empty() || line == "/") continue;
    // "x/**" is everything inside x, not x itself.
    if (line.size() >= 3 && line.compare(line.size() - 3, 3, "/**") == 0) line += "/*";
    rule.glob = std::move(line);  // a leading or inner '/' anchors it (GlobMatch)
    rules.push_back(std::move(rule));
  }
  return rules;
}

std::optional<bool> IgnoreRules::Decide(const std::vector<const Source*>& sources, const std::string& rel,
                                        bool is_dir) {
  for (auto s = sources.rbegin(); s != sources.rend(); ++s) {
    const Source& source = **s;
    std::string sub;
    if (source.dir.empty()) {
      sub = rel;
    } else if (rel.size() > source.dir.size() && rel.compare(0, source.dir.size(), source.dir) == 0 &&
               rel[source.dir.size()] == '/') {
      sub = rel.substr(source.dir.size() + 1);
    } else {
      continue;
    }
    for (auto r = source.rules.rbegin(); r != source.rules.rend(); ++r) {
      if (r->dir_only && !is_dir) continue;
      if (GlobMatch(r->glob, sub)) return !r->negate;
    }
  }
  return std::nullopt;
}

const IgnoreRules::Source& IgnoreRules::DirSource(const std::string& dir) {
  auto it = dirs_.find(dir);
  if (it != dirs_.end()) return it->second;
  Source source;
  source.dir = dir;
  if (std::optional<std::string> text = loader_(dir)) source.rules = Parse(*text);
  return dirs_.emplace(dir, std::move(source)).first->second;
}

bool IgnoreRules::Ignored(const std::string& rel, bool is_dir) {
  // The sources that apply to a path in directory `dir`: exclude, then the
  // .gitignore of the root and of every directory down to `dir`.
  std::vector<const Source*> sources{&info_, &DirSource("")};
  std::size_t pos = 0;
  for (;;) {
    std::size_t slash = rel.find('/', pos);
    if (slash == std::string::npos) break;
    const std::string dir = rel.substr(0, slash);
    auto known = dir_ignored_.find(dir);
    bool ignored;
    if (known != dir_ignored_.end()) {
      ignored = known->second;
    } else {
      sources.push_back(&extra_);
      ignored = Decide(sources, dir, true).value_or(false);
      sources.pop_back();
      dir_ignored_.emplace(dir, ignored);
    }
    if (ignored) return true;  // nothing below an excluded directory comes back
    sources.push_back(&DirSource(dir));
    pos = slash + 1;
  }
  sources.push_back(&extra_);
  return Decide(sources, rel, is_dir).value_or(false);
}

}  // namespace agentbox::session
