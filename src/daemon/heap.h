// How the session front ends (agentbox serve, agentbox mcp) hold the heap
// between calls.
//
// A file tool's call moves its content through several buffers of about its
// size (the request or the answer, its JSON, the HTTP body): ~10 MiB for a
// 1 MiB file. With glibc's defaults each such buffer of 128 KiB or more is a
// fresh mmap, or the arena's top is trimmed back to the kernel once freed,
// so every call faults the same pages in again: ~980 page faults a 1 MiB
// `read_file` in the daemon, ~10 ms on a machine where a fault costs 10 µs.
// Kept instead, a call reuses what the one before it touched; the process
// holds the memory its largest recent call needed (docs/performance.md,
// "Sessions").
#pragma once

namespace agentbox::daemon {

// Buffers up to 16 MiB come from the heap and stay in it; freed memory is
// returned to the kernel past 64 MiB at an arena's top. Call once, before
// the threads that serve calls start.
void KeepCallBuffersResident();

}  // namespace agentbox::daemon
