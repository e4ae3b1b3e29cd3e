#!/usr/bin/env bash
# Builds and runs the benchmarks that carry the performance targets, in one
# run on this machine: the start-up benchmark (bubblewrap, unshare, bare
# /bin/true and bash -c true interleaved with agentbox; the deny-glob scan;
# memory), the session daemon's (warm calls next to a bare bash -c true;
# file tools; idle sessions' memory), then the transparent-egress one (which
# needs root and says so otherwise). Ends with each target's line next to its
# anchor, as measured above.
#
#   bench/run.sh [startup_bench flags]
#   AGENTBOX_CORE_REV=<rev> bench/run.sh   also builds that revision's binary
#       (e.g. the last one without the Landlock and seccomp layers) and
#       measures it in the same run, as "core alone".
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh" >/dev/null
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
if [ -n "${AGENTBOX_CORE_REV:-}" ]; then
  mkdir "$out/core"
  git -C "$root" archive "$AGENTBOX_CORE_REV" | tar -x -C "$out/core"
  cmake -S "$out/core" -B "$out/core-build" -DAGENTBOX_BUILD_TESTS=OFF -DAGENTBOX_BUILD_BENCH=OFF >/dev/null
  cmake --build "$out/core-build" --target agentbox_cli -j"$(nproc)" >/dev/null
  export AGENTBOX_CORE_BIN="$out/core-build/agentbox"
fi
"$root/build/bench/startup_bench" "$@" | tee "$out/startup.txt"
"$root/build/bench/session_bench" | tee "$out/session.txt"
"$root/build/bench/egress_bench"

# The targets, one line each, from the runs above.
pick() { grep -F -m1 -- "$2" "$out/$1" | sed 's/^ *//' || echo "(not measured: no line \"$2\")"; }
echo
echo "targets (this run; anchors measured in the same run)"
echo "  start-up, interleaved medians (ms):"
for name in "bare /bin/true" "bare bash -c true" "unshare -Urmpnf --mount-proc" "bwrap --unshare-all" \
            "agentbox run  " "agentbox run --memory --max-processes  " "agentbox run --allow-domain"; do
  echo "    $(pick startup.txt "$name")"
done
echo "    $(pick startup.txt "agentbox / bubblewrap ")"
echo "    $(pick startup.txt "agentbox --memory --max-processes / bubblewrap")"
echo "    $(pick startup.txt "agentbox --allow-domain / bubblewrap")"
echo "  deny globs:"
echo "    $(pick startup.txt "100k files, **/.env, nothing changed")"
echo "    $(pick startup.txt "100k files, 20 dirs touched between runs")"
echo "    $(pick startup.txt "100k files, dentry/inode cache dropped")"
echo "  memory:"
echo "    $(pick startup.txt "supervisor peak RSS")"
echo "    $(pick startup.txt "sandbox init, idle")"
echo "    $(pick session.txt "a session's idle world")"
echo "  sessions:"
echo "    $(pick session.txt "bare bash -c true (anchor)")"
echo "    $(pick session.txt "warm execute bash \"true\" ")"
for tool in read_file write_file edit_file; do
  echo "    $(grep -E -m1 "^$tool +1 MiB" "$out/session.txt" || echo "(not measured: no $tool line)")"
done
