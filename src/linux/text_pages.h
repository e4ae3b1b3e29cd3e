// How much of agentbox's own program the supervisor keeps resident.
//
// The supervisor runs a little of a large static binary. On a read fault in
// a file mapping the kernel maps the 15 pages around the faulting one too
// ("fault-around", 64 KiB by default): what a run touches once, scattered
// over the program, then weighs 16 times its size in the supervisor's RSS.
// The kernel does no fault-around in a mapping registered with userfaultfd
// for write-protection; with the kernel resolving that mode itself
// (UFFD_FEATURE_WP_ASYNC, Linux 6.7) the registration changes nothing else
// for read-only text, so each page the supervisor runs is mapped alone.
// Measured on this program: peak RSS and start-up time both lower
// (docs/performance.md, Memory).
#pragma once

namespace agentbox::linux {

// Registers the program's read-only segments as above. Best effort: on an
// older kernel, or where userfaultfd is refused (a seccomp profile, gVisor),
// nothing changes. The registration holds for this process's life through
// a close-on-exec descriptor it keeps; children it forks start without it.
// Call once, before the program's static initializers (a constructor of
// the highest priority open to programs).
void MapOnlyTouchedText();

}  // namespace agentbox::linux
