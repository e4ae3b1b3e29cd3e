#!/usr/bin/env bash
# Builds and runs the start-up benchmark; prints the ratio table at the end.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh" >/dev/null
exec "$root/build/bench/startup_bench" "$@"
