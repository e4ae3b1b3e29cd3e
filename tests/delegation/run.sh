#!/usr/bin/env bash
# Cgroup delegation end to end, on real cgroups: as root, `agentbox
# setup-delegation` hands the test user `agentbox-test` a subtree in each v1
# hierarchy a run's limits need (memory, pids, cpu, cpuacct), under a cgroup
# this script creates beneath its own (lib.sh; nothing outside it is
# touched); then, as that user, TEST_BIN runs with the record (the
# delegation and resources tests: limits enforced, an OOM reported, a fork
# bomb capped); afterwards no run cgroup and no process is left in the
# delegated directories, and `--remove` leaves nothing. A trap removes
# everything even on failure.
#
#   tests/delegation/run.sh AGENTBOX_BIN TEST_BIN FIXTURES_DIR [GTEST_FILTER [GTEST_FLAGS...]]
#
# Not root: not applicable (setup-delegation is root's), said, exit 0.
set -euo pipefail
bin="$1" tests="$2" fixtures="$3"
shift 3
filter='--gtest_filter=Delegation.*:Memory.*:Processes.*:Cpu.*:Usage.*:Cleanup.*'
if [ $# -gt 0 ]; then filter="--gtest_filter=$1"; shift; fi

if [ "$(id -u)" -ne 0 ]; then
  echo "delegation: not applicable here: setup-delegation needs root (uid $(id -u))"
  exit 0
fi
user=agentbox-test
. "$(dirname "${BASH_SOURCE[0]}")/../test_user.sh"
ensure_test_user "$user"
home="$(getent passwd "$user" | cut -d: -f6)"
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

stage="$(mktemp -d /tmp/agentbox-deleg.XXXXXX)"
trap 'delegation_cleanup; rm -rf "$stage"' EXIT
rc=0
delegation_setup "$bin" "$user" "$stage/record" || rc=$?
if [ $rc -eq 2 ]; then exit 0; fi
[ $rc -eq 0 ] || exit $rc

cp "$bin" "$stage/agentbox"
cp "$tests" "$stage/tests"
cp -r "$fixtures" "$stage/fixtures"
chmod -R a+rX "$stage"
chmod 755 "$stage"
cd "$stage"
runuser -u "$user" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" LANG=C.UTF-8 TMPDIR=/tmp \
  AGENTBOX_BIN="$stage/agentbox" AGENTBOX_FIXTURES="$stage/fixtures" AGENTBOX_DELEGATION_RECORD="$stage/record" \
  "$stage/tests" --gtest_brief=1 "$filter" "$@" || rc=$?

delegation_check_empty || rc=1

# The ownership check on real cgroups: the record names a directory that is
# no longer the user's (root's now): it is not used, check says why, and a
# limit it would have carried is refused (fail closed). Memory: it has no
# fallback (max_processes would fall back to RLIMIT_NPROC in the sandbox's
# user namespace).
as_user() {
  runuser -u "$user" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" LANG=C.UTF-8 TMPDIR=/tmp \
    AGENTBOX_DELEGATION_RECORD="$stage/record" "$@"
}
memory_dir="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["v1"]["memory"])' \
  "$stage/record/$(id -u "$user").json")"
chown root:root "$memory_dir"
if ! as_user "$stage/agentbox" check --json | python3 -c '
import json, sys
c = json.load(sys.stdin)["host"]["cgroups"]
assert "memory" not in c["delegation"], c
assert "pids" in c["delegation"], c
assert any("owned by uid 0, not by uid" in n for n in c["delegation_notes"]), c
'; then
  echo "delegation: a delegated directory not owned by the user was used, or check did not say why" >&2
  rc=1
fi
refused=0
err="$(cd /tmp && as_user "$stage/agentbox" run --memory 64Mi -- true 2>&1)" || refused=$?
if [ "$refused" -ne 125 ] || ! grep -q "owned by uid 0" <<<"$err"; then
  echo "delegation: --memory with the memory directory not the user's: exit $refused, not 125 naming the owner: $err" >&2
  rc=1
fi
chown "$user:$(id -g "$user")" "$memory_dir"

# The v2 migration rule on the real kernel: a v2 directory delegated to the
# user (made here beneath our own v2 cgroup, added to the record by hand)
# cannot serve an agentbox that runs outside it, and check says so.
v2_own="$(awk -F: '$1 == "0" { print $3 }' /proc/self/cgroup)"
v2_mnt="$(awk '$0 ~ / - cgroup2 / { print $5; exit }' /proc/self/mountinfo)"
if [ -n "$v2_own" ] && [ -n "$v2_mnt" ]; then
  v2_dir="$v2_mnt${v2_own%/}/agentbox-deltest-v2-$$"
  mkdir "$v2_dir"
  deleg_made+=("$v2_dir")  # the trap removes it too
  chown "$user:$(id -g "$user")" "$v2_dir"
  rec="$stage/record/$(id -u "$user").json"
  cp "$rec" "$stage/record.v1"
  python3 - "$rec" "$v2_dir" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
r["v2"] = {"dir": sys.argv[2], "controllers": [], "entry": sys.argv[2] + "/login"}
json.dump(r, open(sys.argv[1], "w"))
PY
  if ! as_user "$stage/agentbox" check --json | python3 -c '
import json, sys
c = json.load(sys.stdin)["host"]["cgroups"]
assert "v2" not in c["delegation"], c
assert any("is outside it" in n and "common ancestor" in n for n in c["delegation_notes"]), c
'; then
    echo "delegation: check did not name the v2 migration rule for a v2 delegation agentbox runs outside of" >&2
    rc=1
  fi
  cp "$stage/record.v1" "$rec"
  rmdir "$v2_dir"
fi

delegation_remove || rc=1
exit $rc
