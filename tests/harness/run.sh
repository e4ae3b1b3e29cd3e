#!/usr/bin/env bash
# Runs the scripted agent task (agent_task.py) against an agentbox binary, as
# the invoking user or as an unprivileged one.
#
#   tests/harness/run.sh self|unprivileged AGENTBOX_BIN
#
# As root, `unprivileged` creates the user agentbox-test if needed and runs
# the task as that user from a staged copy it can read.
set -euo pipefail
who="$1" bin="$(realpath "$2")"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py=/usr/bin/python3
[ -x "$py" ] || py="$(command -v python3)"

if [ "$who" = self ] || [ "$(id -u)" -ne 0 ]; then
  exec "$py" "$here/agent_task.py" "$bin"
fi

user=agentbox-test
. "$(dirname "${BASH_SOURCE[0]}")/../test_user.sh"
ensure_test_user "$user"
home="$(getent passwd "$user" | cut -d: -f6)"
stage="$(mktemp -d /tmp/agentbox-harness-unpriv.XXXXXX)"
trap 'rm -rf "$stage"' EXIT
cp "$bin" "$stage/agentbox"
cp "$here/agent_task.py" "$stage/"
chmod -R a+rX "$stage"
chmod 755 "$stage"
cd "$stage"
runuser -u "$user" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" LANG=C.UTF-8 \
  TMPDIR=/tmp "$py" "$stage/agent_task.py" "$stage/agentbox"
