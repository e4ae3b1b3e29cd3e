#!/usr/bin/env bash
# Installs what is missing, builds everything, and runs the whole suite under
# ctest: unit tests, end-to-end tests as root, the same end-to-end tests as an
# unprivileged user, and the policy fuzzer (60 s).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh"
cd "$root/build"
ctest --output-on-failure -j"$(nproc)" --timeout 900
