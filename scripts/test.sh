#!/usr/bin/env bash
# Installs what is missing, builds everything, and runs the whole suite under
# ctest: unit tests, end-to-end tests as root, the same end-to-end tests as an
# unprivileged user, the escape battery (root and unprivileged), and the policy
# fuzzer (60 s).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh"
cd "$root/build"
rm -f escape-summary-*.txt
rc=0
# Two tests per core: much of the suite waits (on timeouts, on servers it
# starts, on a guest kernel's boot), and the extra slots fill that time (on
# 2 cores, 366 s against 398 s at one and a half tests per core and ~615 s
# at one; docs/performance.md, "Build").
jobs=$(( $(nproc) * 2 ))
[ "$jobs" -ge 1 ] || jobs=1
ctest --output-on-failure -j"$jobs" --timeout 900 || rc=$?
# ctest shows the output of failing tests only: the escape battery's summary lines.
cat escape-summary-root.txt escape-summary-unprivileged.txt escape-summary-delegated.txt \
  escape-summary-root-container.txt escape-summary-unprivileged-container.txt 2>/dev/null || true
exit "$rc"
