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
if ! id -u "$user" >/dev/null 2>&1; then
  useradd --create-home --shell /bin/sh "$user"
fi
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
# limit it would have carried is refused (fail closed).
as_user() {
  runuser -u "$user" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" LANG=C.UTF-8 TMPDIR=/tmp \
    AGENTBOX_DELEGATION_RECORD="$stage/record" "$@"
}
pids_dir="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["v1"]["pids"])' \
  "$stage/record/$(id -u "$user").json")"
chown root:root "$pids_dir"
if ! as_user "$stage/agentbox" check --json | python3 -c '
import json, sys
c = json.load(sys.stdin)["host"]["cgroups"]
assert "pids" not in c["delegation"], c
assert "memory" in c["delegation"], c
assert any("owned by uid 0, not by uid" in n for n in c["delegation_notes"]), c
'; then
  echo "delegation: a delegated directory not owned by the user was used, or check did not say why" >&2
  rc=1
fi
refused=0
err="$(cd /tmp && as_user "$stage/agentbox" run --max-processes 10 -- true 2>&1)" || refused=$?
if [ "$refused" -ne 125 ] || ! grep -q "owned by uid 0" <<<"$err"; then
  echo "delegation: --max-processes with the pids directory not the user's: exit $refused, not 125 naming the owner: $err" >&2
  rc=1
fi
chown "$user:$(id -g "$user")" "$pids_dir"

delegation_remove || rc=1
exit $rc
