// Recognising a working sandbox denying something in a command's output:
// lines matched against the plan's denial signatures (confine.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <regex>
#include <string>
#include <vector>

#include "agentbox/confine.h"
#include "agentbox/outcome.h"

namespace agentbox::supervise {

constexpr std::size_t kMaxDenials = 32;
constexpr std::size_t kMaxLine = 8192;

// Scans stderr line by line against the denial signatures.
class DenialScanner {
 public:
  explicit DenialScanner(const std::vector<Signature>& sigs) : signatures_(sigs) {}

  void Feed(const char* data, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (data[i] == '\n') {
        Line();
        line_.clear();
      } else if (line_.size() < kMaxLine) {
        line_.push_back(data[i]);
      }
    }
  }
  void Finish() {
    if (!line_.empty()) Line();
    line_.clear();
  }
  std::vector<Denial>& denials() { return denials_; }

 private:
  void Line() {
    if (denials_.size() >= kMaxDenials) return;
    // Cheap pre-filter: every signature names one of these errno texts.
    static constexpr const char* kHints[] = {"denied", "ead-only", "not permitted", "o such file",
                                             "ot a directory", "busy", "EROFS", "Errno"};
    if (std::none_of(std::begin(kHints), std::end(kHints),
                     [&](const char* h) { return line_.find(h) != std::string::npos; })) {
      return;
    }
    Compile();
    for (const auto& c : compiled_) {
      std::smatch m;
      if (!std::regex_search(line_, m, c.re)) continue;
      Denial d;
      d.facet = "filesystem";
      // The path is in whichever shape's group matched.
      for (size_t g = 1; g < m.size(); ++g) {
        if (m[g].matched && m[g].length() > 0) {
          d.target = m[g].str();
          break;
        }
      }
      if (line_.find("busy") != std::string::npos) {
        bool removal = line_.find("remove") != std::string::npos || line_.find("unlink") != std::string::npos ||
                       line_.find("rmdir") != std::string::npos;
        d.op = removal ? "remove" : "rename";
      } else if (line_.find("ead-only") != std::string::npos || line_.find("EROFS") != std::string::npos) {
        d.op = "write";
      } else {
        d.op = "access";
      }
      d.reason = c.meaning;
      d.source = "stderr-signature";
      bool dup = std::any_of(denials_.begin(), denials_.end(), [&](const Denial& o) {
        return o.target == d.target && o.reason == d.reason;
      });
      if (!dup) denials_.push_back(std::move(d));
      return;
    }
  }

  // Compiling the regexes costs more than a whole sandbox start: do it only
  // once a line looks like an error.
  void Compile() {
    if (compiled_done_) return;
    compiled_done_ = true;
    for (const auto& s : signatures_) {
      try {
        compiled_.push_back({std::regex(s.pattern, std::regex::ECMAScript | std::regex::optimize), s.meaning});
      } catch (const std::regex_error&) {
        // A signature that does not compile cannot match; it is the plan's bug, not the run's.
      }
    }
  }

  const std::vector<Signature>& signatures_;
  bool compiled_done_ = false;
  struct Compiled {
    std::regex re;
    std::string meaning;
  };
  std::vector<Compiled> compiled_;
  std::string line_;
  std::vector<Denial> denials_;
};

}  // namespace agentbox::supervise
