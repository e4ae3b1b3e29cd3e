#include "daemon/heap.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace agentbox::daemon {
namespace {

constexpr std::size_t kBuffer = 3u << 19;  // 1.5 MiB: a 1 MiB file's content and its JSON
constexpr int kBuffers = 6;
constexpr long kPages = static_cast<long>(kBuffer / 4096) * kBuffers;

long MinorFaults() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

// A call's worth of buffers, written and freed; the page faults of the
// fourth and fifth such call, after the allocator has settled.
long FaultsOfLaterCalls() {
  long faults = 0;
  for (int call = 0; call < 5; ++call) {
    const long before = MinorFaults();
    std::vector<char*> buffers;
    for (int i = 0; i < kBuffers; ++i) {
      buffers.push_back(static_cast<char*>(std::malloc(kBuffer)));
      std::memset(buffers.back(), 'x', kBuffer);
    }
    for (char* b : buffers) std::free(b);
    if (call >= 3) faults += MinorFaults() - before;
  }
  return faults;
}

// In a child, so that this process's allocator stays as it was: the faults
// of the later calls, written to a pipe.
long InChild(bool keep) {
  int p[2];
  if (pipe(p) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    if (keep) KeepCallBuffersResident();
    const long faults = FaultsOfLaterCalls();
    _exit(write(p[1], &faults, sizeof faults) == sizeof faults ? 0 : 1);
  }
  close(p[1]);
  long faults = -1;
  if (read(p[0], &faults, sizeof faults) != sizeof faults) faults = -1;
  close(p[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return faults;
}

TEST(Heap, ACallsBuffersAreReusedByTheNextCallWithoutFaultingAgain) {
  const long kept = InChild(true);
  ASSERT_GE(kept, 0);
  EXPECT_LT(kept, 2 * kPages / 10) << "two calls of " << kPages << " pages each faulted " << kept << " times";
}

// What the setting is for: with glibc's own thresholds the same calls fault
// their buffers in again each time (the arena's top is trimmed past twice
// the largest buffer freed). Should glibc stop doing so, this says it.
TEST(Heap, WithoutItTheSameCallsFaultTheirBuffersInAgain) {
  const long defaults = InChild(false);
  ASSERT_GE(defaults, 0);
  EXPECT_GT(defaults, kPages) << "two calls of " << kPages << " pages each faulted " << defaults << " times";
}

}  // namespace
}  // namespace agentbox::daemon
