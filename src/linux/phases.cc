#include "linux/phases.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace agentbox::linux::phases {
namespace {

constexpr int kMaxSteps = 96;

struct Page {
  std::atomic<std::uint32_t> count;
  struct Step {
    const char* name;
    std::int64_t ns;
  } steps[kMaxSteps];
};

struct State {
  Page* page = nullptr;  // null: disabled
  const char* file = nullptr;
};

State& state() {
  static State s;
  return s;
}

std::int64_t NowNs() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace

void Init() {
  State& s = state();
  if (s.page) return;
  const char* file = getenv("AGENTBOX_PHASES");
  if (!file || !*file) return;
  void* p = mmap(nullptr, sizeof(Page), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return;
  s.page = static_cast<Page*>(p);
  s.file = file;
  Mark("main");
}

void Mark(const char* name) {
  Page* page = state().page;
  if (!page) return;
  const std::uint32_t i = page->count.fetch_add(1, std::memory_order_relaxed);
  if (i >= kMaxSteps) return;
  page->steps[i].name = name;
  page->steps[i].ns = NowNs();
}

void Flush() {
  State& s = state();
  if (!s.page) return;
  Mark("end");
  const std::uint32_t n = std::min<std::uint32_t>(s.page->count.load(), kMaxSteps);
  std::string text;
  for (std::uint32_t i = 0; i < n; ++i) {
    if (!s.page->steps[i].name) continue;
    text += std::to_string(s.page->steps[i].ns) + " " + s.page->steps[i].name + "\n";
  }
  text += "--\n";
  const int fd = open(s.file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return;
  ssize_t ignored = write(fd, text.data(), text.size());
  (void)ignored;
  close(fd);
  s.page->count.store(0);
}

}  // namespace agentbox::linux::phases
