// Where `--report FILE` and `--report-fd N` send the outcome report
// (docs/report.md), for `run`, `wrap` (carried into the argv it prints) and
// its `__exec` side.
//
// A sink is opened before anything runs: a report that cannot be written
// refuses the run (fail closed) instead of going missing after it.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "agentbox/status.h"
#include "linux/fd.h"

namespace agentbox::cli {

class ReportSink {
 public:
  ReportSink() = default;  // no report asked for

  // FILE: its directory is opened (and kept, so the report lands where it
  // was checked), and a temporary file is made and removed in it to prove
  // it writable. An existing FILE that is not a regular file (a symlink, a
  // directory, a fifo, a device) is refused: it is never followed or
  // written through. Errors name the flag and the path.
  static Result<ReportSink> ToFile(const std::string& path);
  // N: inherited, open for writing, and not stdin, stdout or stderr (the
  // command's). Marked close-on-exec here: it never reaches the sandbox.
  static Result<ReportSink> ToFd(int fd);

  bool wanted() const { return dir_.valid() || fd_ >= 0; }

  // FILE: written whole to a new file beside it (0600, a random name,
  // O_EXCL|O_NOFOLLOW), then renamed over it, so a reader sees the old
  // report or the new one, never a part, and a symlink planted at FILE
  // meanwhile is replaced rather than followed. N: written to the fd.
  Status Write(const std::string& text) const;

 private:
  std::string path_;      // FILE as given, for messages
  std::string name_;      // its last component
  linux::UniqueFd dir_;   // the directory FILE goes into
  int fd_ = -1;           // --report-fd
};

// `--report FILE` and `--report-fd N`.
struct ReportFlags {
  std::string file;
  std::optional<int> fd;

  void Register(CLI::App* app);
  // The sink they ask for (none when neither is given); an error when both
  // are, or when the one given cannot be written.
  Result<ReportSink> Open() const;
  // `wrap`: the same check of FILE as Open(), and of N only its form (the
  // harness opens N when it spawns the argv, which checks it then).
  Status CheckForWrap() const;
  // As arguments for `__exec`, FILE made absolute: the harness may spawn
  // the wrapped argv from another directory.
  std::vector<std::string> ForExec() const;
  bool wanted() const { return !file.empty() || fd.has_value(); }
};

}  // namespace agentbox::cli
