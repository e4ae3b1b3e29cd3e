#!/usr/bin/env bash
# Configures and builds into build/: everything (binary, library, tests,
# benchmarks), or only the targets named (`build.sh agentbox_cli`: the binary
# and what it needs, as the demo does).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/install-deps.sh"
# Ninja for a new build directory: it compiles a target's files while the
# libraries it links are still being built, where make waits for them. A
# directory configured before keeps its generator.
generator=()
[ -f "$root/build/CMakeCache.txt" ] || generator=(-G Ninja)
cmake -S "$root" -B "$root/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$root/build" -j"$(nproc)" "${targets[@]}"
