// Gitignore rules for a session's diff: which paths of a workspace its
// .gitignore files (root and nested), .git/info/exclude and the policy's
// diff.exclude leave out, with git's semantics (gitignore(5)):
//   - blank lines and lines starting with '#' are no rules; trailing spaces
//     are dropped unless escaped ("\ "); "\#" and "\!" start a literal;
//   - "!" negates (re-includes what an earlier rule excluded), but nothing
//     below an excluded directory can be re-included;
//   - a trailing "/" matches directories only;
//   - a '/' at the start or in the middle anchors the pattern to the
//     directory of its .gitignore; otherwise it matches at any depth below it;
//   - "*", "?", "[...]" match within one component; "**/" any leading
//     directories, "/**" everything inside, "/**/" zero or more directories.
// Precedence, lowest first: .git/info/exclude, the root .gitignore, deeper
// ones, diff.exclude; within one source the last matching rule decides.
// Files git tracks although a rule matches them are not known here (the
// index is not read): they are left out as an untracked file would be.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace agentbox::session {

class IgnoreRules {
 public:
  // The text of the .gitignore in directory `dir` ("" = the root), or
  // nullopt when there is none.
  using Loader = std::function<std::optional<std::string>(const std::string& dir)>;

  // `info_exclude`: the text of .git/info/exclude ("" when none);
  // `extra`: diff.exclude's patterns, relative to the root.
  IgnoreRules(Loader loader, std::string_view info_exclude, const std::vector<std::string>& extra);

  // Whether `rel` (relative to the root, no leading '/') is left out:
  // itself or a directory above it matches. `is_dir`: `rel` is a directory.
  bool Ignored(const std::string& rel, bool is_dir);

 private:
  struct Rule {
    std::string glob;  // for GlobMatch: anchored ones hold a '/'
    bool negate = false;
    bool dir_only = false;
  };
  struct Source {
    std::string dir;  // the rules' base directory ("" = the root)
    std::vector<Rule> rules;
  };

  static std::vector<Rule> Parse(std::string_view text);
  // The decision of the rules of `sources` for `rel` alone: true excluded,
  // false re-included, nullopt no rule matched.
  static std::optional<bool> Decide(const std::vector<const Source*>& sources, const std::string& rel, bool is_dir);
  const Source& DirSource(const std::string& dir);

  Loader loader_;
  Source info_;
  Source extra_;
  std::map<std::string, Source> dirs_;        // per directory, loaded once
  std::map<std::string, bool> dir_ignored_;   // directories already decided
};

}  // namespace agentbox::session
