#include "linux/text_pages.h"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>

#include "linux/compat.h"

namespace agentbox::linux {
namespace {

// The first object dl_iterate_phdr reports is the program itself.
int RegisterProgramSegments(struct dl_phdr_info* info, size_t, void* data) {
  const int uffd = *static_cast<int*>(data);
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_W)) continue;
    const std::uintptr_t start = (info->dlpi_addr + ph.p_vaddr) & ~(page - 1);
    const std::uintptr_t end = (info->dlpi_addr + ph.p_vaddr + ph.p_memsz + page - 1) & ~(page - 1);
    struct uffdio_register reg {};
    reg.range.start = start;
    reg.range.len = end - start;
    reg.mode = UFFDIO_REGISTER_MODE_WP;
    ioctl(uffd, UFFDIO_REGISTER, &reg);  // a segment refused keeps the kernel's default
  }
  return 1;  // the program only
}

}  // namespace

void MapOnlyTouchedText() {
  // User faults only: what unprivileged processes may register.
  const int uffd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
  if (uffd < 0) return;
  struct uffdio_api api {};
  api.api = UFFD_API;
  api.features = UFFD_FEATURE_WP_ASYNC;
  if (ioctl(uffd, UFFDIO_API, &api) != 0) {
    close(uffd);
    return;
  }
  int fd = uffd;
  dl_iterate_phdr(&RegisterProgramSegments, &fd);
  // Kept open: closing it would end the registration.
}

}  // namespace agentbox::linux
