#!/usr/bin/env bash
# Runs the escape battery (tests/escape/) as root or as an unprivileged user
# and prints its summary line; the line is also written to SUMMARY_FILE so the
# test script can show it after ctest, which hides the output of passing tests.
#
#   tests/escape/run_battery.sh root|unprivileged|delegated AGENTBOX_BIN TEST_BIN PROBE_BIN SUMMARY_FILE
#
# As root, "unprivileged" creates the user `agentbox-test` if needed, stages
# the binaries where that user can read them, and stages the setuid and
# file-capability copies of the probe (which only root can make). Not root:
# "unprivileged" runs as is, and "root" is reported as not run.
# "delegated" is "unprivileged" with a cgroup delegation for the user
# (tests/delegation/lib.sh: `agentbox setup-delegation` under a cgroup made
# beneath ours, removed afterwards): the resource attacks must then get
# root's verdicts. It needs root to set up, and is reported as not run otherwise.
# "root-container" and "unprivileged-container" run the attacks with every
# inside run on gVisor (ESCAPE_ISOLATION=container: --isolation container).
# "root-microvm" runs every inside run in a QEMU microVM (ESCAPE_ISOLATION=microvm);
# under TCG that is minutes, so ctest does not run it (docs/isolation.md).
set -uo pipefail
who="$1" bin="$2" tests="$3" probe="$4" summary="$5"
iso_env=() filter=()
case "$who" in
  *-container)
    who="${who%-container}"
    iso_env=(ESCAPE_ISOLATION=container)
    export ESCAPE_ISOLATION=container
    filter=(--gtest_filter='Attack.*:Battery.*') ;;
  *-microvm)
    who="${who%-microvm}"
    iso_env=(ESCAPE_ISOLATION=microvm)
    export ESCAPE_ISOLATION=microvm
    filter=(--gtest_filter='Attack.*:Battery.*') ;;
esac
fixtures="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/fixtures"
: >"$summary"

run() {
  "$@" --gtest_brief=1 "${filter[@]}"
}

if [ "$who" = delegated ] && [ "$(id -u)" -ne 0 ]; then
  echo "escape battery (delegated): not run (setting up a delegation needs root)" | tee "$summary"
  exit 0
fi

if [ "$who" = root ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "escape battery (root): not run (the test command is not root)" | tee "$summary"
    exit 0
  fi
  ESCAPE_SUMMARY_FILE="$summary" AGENTBOX_BIN="$bin" ESCAPE_PROBE="$probe" AGENTBOX_FIXTURES="$fixtures" \
    run "$tests"
  rc=$?
elif [ "$(id -u)" -ne 0 ]; then
  ESCAPE_SUMMARY_FILE="$summary" AGENTBOX_BIN="$bin" ESCAPE_PROBE="$probe" AGENTBOX_FIXTURES="$fixtures" \
    run "$tests"
  rc=$?
else
  user=agentbox-test
  . "$(dirname "${BASH_SOURCE[0]}")/../test_user.sh"
  ensure_test_user "$user"
  home="$(getent passwd "$user" | cut -d: -f6)"
  stage="$(mktemp -d /tmp/agentbox-escape.XXXXXX)"
  trap 'rm -rf "$stage"' EXIT
  delegation_env=()
  if [ "$who" = delegated ]; then
    . "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/delegation/lib.sh"
    trap 'delegation_cleanup; rm -rf "$stage"' EXIT
    delegation_setup "$bin" "$user" "$stage/record"
    case $? in
      0) ;;
      2) echo "escape battery (delegated): not run (not applicable here: no v1 cgroup hierarchies)" | tee "$summary"
         exit 0 ;;
      *) echo "escape battery (delegated): setup-delegation failed" | tee "$summary"
         exit 1 ;;
    esac
    delegation_env=(AGENTBOX_DELEGATION_RECORD="$stage/record")
  fi
  cp "$bin" "$stage/agentbox"
  cp "$tests" "$stage/agentbox_escape_tests"
  cp "$probe" "$stage/escape_probe"
  cp -r "$fixtures" "$stage/fixtures"
  mkdir "$stage/priv"
  "$probe" stage_privileged "$stage/priv" >/dev/null || echo "run_battery: could not stage the privileged probes"
  chmod -R a+rX "$stage"
  chmod 755 "$stage" "$stage/priv"
  out="$stage/summary.txt"
  touch "$out" && chown "$user" "$out"
  cd "$stage"
  runuser -u "$user" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" LANG=C.UTF-8 \
    TMPDIR=/tmp AGENTBOX_BIN="$stage/agentbox" AGENTBOX_FIXTURES="$stage/fixtures" \
    ESCAPE_PROBE="$stage/escape_probe" ESCAPE_PRIV_STAGE="$stage/priv" ESCAPE_SUMMARY_FILE="$out" \
    "${delegation_env[@]}" "${iso_env[@]}" "$stage/agentbox_escape_tests" --gtest_brief=1 "${filter[@]}"
  rc=$?
  cp "$out" "$summary"
  if [ "$who" = delegated ]; then
    delegation_check_empty || rc=1
    delegation_remove || rc=1
  fi
fi
echo
cat "$summary"
exit $rc
