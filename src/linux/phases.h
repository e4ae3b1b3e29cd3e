// Start-up phase timestamps, for bench/startup_bench's phase breakdown.
//
// With AGENTBOX_PHASES=FILE in the environment of `agentbox run`, each named
// step of a run records a CLOCK_MONOTONIC timestamp, and the supervisor
// appends one line per step ("<ns> <name>") to FILE when the run is over.
// Steps of the runner are recorded in a shared anonymous page mapped before
// the clone (the runner is a copy of the supervisor that never execs; the
// command's exec drops the page). Off, the default, Mark is one load and one
// branch and nothing is mapped, opened or written.
//
// Not thread-safe to Init; Mark is safe from any thread or process that
// shares the page. Names must be string literals (their addresses are the
// same in the runner and the supervisor).
#pragma once

namespace agentbox::linux::phases {

// Reads AGENTBOX_PHASES once; maps the page when it is set. Call first
// thing in main(): the first step recorded is "main".
void Init();
// Records `name` now, when enabled.
void Mark(const char* name);
// Supervisor, once the run is over: appends the steps to the file.
void Flush();

}  // namespace agentbox::linux::phases
