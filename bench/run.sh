#!/usr/bin/env bash
# Builds and runs the start-up benchmark, then the transparent-egress one
# (which needs root and says so otherwise); each prints its ratios at the end.
#
#   bench/run.sh [benchmark flags]
#   AGENTBOX_CORE_REV=<rev> bench/run.sh   also builds that revision's binary
#       (e.g. the last one without the Landlock and seccomp layers) and
#       measures it in the same run, as "core alone".
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh" >/dev/null
if [ -n "${AGENTBOX_CORE_REV:-}" ]; then
  core="$(mktemp -d)"
  trap 'rm -rf "$core"' EXIT
  mkdir "$core/src"
  git -C "$root" archive "$AGENTBOX_CORE_REV" | tar -x -C "$core/src"
  cmake -S "$core/src" -B "$core/build" -DAGENTBOX_BUILD_TESTS=OFF -DAGENTBOX_BUILD_BENCH=OFF >/dev/null
  cmake --build "$core/build" --target agentbox_cli -j"$(nproc)" >/dev/null
  export AGENTBOX_CORE_BIN="$core/build/agentbox"
fi
"$root/build/bench/startup_bench" "$@"
"$root/build/bench/egress_bench"
