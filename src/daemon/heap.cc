#include "daemon/heap.h"

#include <malloc.h>

namespace agentbox::daemon {

void KeepCallBuffersResident() {
  // Setting either turns off glibc's own adjustment of both (mallopt(3)).
  mallopt(M_MMAP_THRESHOLD, 16 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

}  // namespace agentbox::daemon
