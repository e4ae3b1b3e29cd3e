#!/usr/bin/env bash
# Builds the policy fuzzer (clang, libFuzzer, ASan, UBSan) in build-fuzz/ and
# runs it for N seconds (default 60) on a scratch copy of fuzz/corpus, so the
# checked-in corpus only changes on purpose. Exits non-zero if it finds a crash;
# the reproducer is left in build-fuzz/.
#
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-fuzz"

CC=clang CXX=clang++ cmake -S "$root/fuzz" -B "$build" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target policy_fuzz -j"$(nproc)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir "$work/corpus"
cp "$root"/fuzz/corpus/* "$work/corpus/"

echo "fuzzing ParsePolicy for ${seconds}s"
if ! "$build/policy_fuzz" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
    -dict="$root/fuzz/policy.dict" -artifact_prefix="$build/" -print_final_stats=1 \
    "$work/corpus"; then
  echo "policy_fuzz found a crash; reproducer in $build/ (run: $build/policy_fuzz FILE)" >&2
  exit 1
fi
