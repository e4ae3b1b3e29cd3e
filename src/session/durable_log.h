// A session's append-only log file (log.jsonl) with group commit.
//
// Append() hands a line to the kernel with one write(2) under the log's
// lock: from then on it is in the file for every reader, and a SIGKILL of
// this process cannot lose it (the page cache belongs to the kernel).
// Sync(end) returns once the file is on disk up to `end`: once an
// fdatasync that began after the line's write has succeeded. Callers that
// sync at the same time share fdatasyncs: the first one syncs everything
// written so far while the others wait for it, then the next one that is
// still short syncs what came meanwhile (one fdatasync covers every line
// written before it began).
//
// An fdatasync that failed fails every later Sync as well: the kernel may
// have dropped the dirty pages, and a later fdatasync that succeeds says
// nothing about them.
//
// Thread-safe. Close() waits for an fdatasync in progress.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "agentbox/status.h"
#include "linux/fd.h"

namespace agentbox::session {

class DurableLog {
 public:
  DurableLog() = default;
  DurableLog(const DurableLog&) = delete;
  DurableLog& operator=(const DurableLog&) = delete;

  // Opens (creates) `path` for appending; Append and Sync before Open fail.
  Status Open(const std::string& path);
  void Close();

  // Writes `line` whole at the end of the file; the file's length after it
  // (what Sync takes), or the write's error.
  Result<std::uint64_t> Append(std::string_view line);
  // Returns once the file is on disk up to `end` (an Append's answer).
  Status Sync(std::uint64_t end);
  // The file's length so far: a Sync(written()) covers every line appended.
  std::uint64_t written() const;
  // fdatasyncs made so far (shared syncs count once).
  std::uint64_t syncs() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable synced_;
  std::string path_;
  linux::UniqueFd fd_;
  std::uint64_t written_ = 0;  // the file's length
  std::uint64_t durable_ = 0;  // on disk up to here
  std::uint64_t syncs_ = 0;
  bool syncing_ = false;       // an fdatasync is running, without mu_
  int sync_errno_ = 0;         // the first fdatasync that failed
};

}  // namespace agentbox::session
