#include "daemon/heap.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
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

// In a fresh process (this test program again, stopped before its tests
// by the probe below), so that the allocator starts as a daemon's does:
// this process's heap, after other tests, may hold free memory below
// chunks still in use, which no setting trims. The faults of the later
// calls, from its output.
long InFreshProcess(bool keep) {
  int p[2];
  if (pipe(p) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    if (dup2(p[1], STDOUT_FILENO) < 0) _exit(126);
    setenv("AGENTBOX_HEAP_PROBE", keep ? "keep" : "defaults", 1);
    execl("/proc/self/exe", "heap-probe", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(p[1]);
  char text[64] = {};
  ssize_t n = read(p[0], text, sizeof text - 1);
  close(p[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (n <= 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
  return std::strtol(text, nullptr, 10);
}

// The probe: with AGENTBOX_HEAP_PROBE in its environment this program
// measures, prints the faults and exits before any test runs.
[[maybe_unused]] const bool kProbe = [] {
  const char* mode = std::getenv("AGENTBOX_HEAP_PROBE");
  if (!mode) return false;
  if (std::strcmp(mode, "keep") == 0) KeepCallBuffersResident();
  const long faults = FaultsOfLaterCalls();
  std::printf("%ld\n", faults);
  std::fflush(stdout);
  _exit(0);
}();

TEST(Heap, ACallsBuffersAreReusedByTheNextCallWithoutFaultingAgain) {
  const long kept = InFreshProcess(true);
  ASSERT_GE(kept, 0);
  EXPECT_LT(kept, 2 * kPages / 10) << "two calls of " << kPages << " pages each faulted " << kept << " times";
}

// What the setting is for: with glibc's own thresholds the same calls fault
// their buffers in again each time (the arena's top is trimmed past twice
// the largest buffer freed). Should glibc stop doing so, this says it.
TEST(Heap, WithoutItTheSameCallsFaultTheirBuffersInAgain) {
  const long defaults = InFreshProcess(false);
  ASSERT_GE(defaults, 0);
  EXPECT_GT(defaults, kPages) << "two calls of " << kPages << " pages each faulted " << defaults << " times";
}

}  // namespace
}  // namespace agentbox::daemon
