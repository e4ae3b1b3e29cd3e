#!/usr/bin/env bash
# Builds the fuzzers (clang, libFuzzer, ASan, UBSan) in build-fuzz/ and runs
# them side by side for N seconds each (default 60): policy_fuzz on a scratch
# copy of fuzz/corpus, net_fuzz (the egress proxy's parsers) on a scratch copy
# of fuzz/net_corpus, so the checked-in corpora only change on purpose. Exits
# non-zero if either finds a crash; the reproducer is left in build-fuzz/.
#
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-fuzz"

# Ninja for a new build directory, as scripts/build.sh.
generator=()
[ -f "$build/CMakeCache.txt" ] || generator=(-G Ninja)
CXX=clang++ cmake -S "$root/fuzz" -B "$build" "${generator[@]}" \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" --target policy_fuzz net_fuzz -j"$(nproc)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir "$work/corpus" "$work/net_corpus"
cp "$root"/fuzz/corpus/* "$work/corpus/"
cp "$root"/fuzz/net_corpus/* "$work/net_corpus/"

echo "fuzzing ParsePolicy and the proxy parsers for ${seconds}s (in parallel)"
"$build/policy_fuzz" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
  -dict="$root/fuzz/policy.dict" -artifact_prefix="$build/policy-" -print_final_stats=1 \
  "$work/corpus" >"$work/policy.log" 2>&1 &
policy_pid=$!
"$build/net_fuzz" -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=1024 \
  -dict="$root/fuzz/net.dict" -artifact_prefix="$build/net-" -print_final_stats=1 \
  "$work/net_corpus" >"$work/net.log" 2>&1 &
net_pid=$!

status=0
for name in policy net; do
  pid_var="${name}_pid"
  if wait "${!pid_var}"; then
    grep -E '^stat::(number_of_executed_units|peak_rss_mb)' "$work/$name.log" | sed "s/^/${name}_fuzz: /"
  else
    tail -n 40 "$work/$name.log" >&2
    echo "${name}_fuzz found a crash; reproducer in $build/${name}-* (run: $build/${name}_fuzz FILE)" >&2
    status=1
  fi
done
exit "$status"
