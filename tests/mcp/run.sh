#!/usr/bin/env bash
# Runs the MCP tests (node's test runner with the official MCP TypeScript SDK
# client) against an agentbox binary, as the invoking user or as an
# unprivileged one.
#
#   tests/mcp/run.sh self|unprivileged AGENTBOX_BIN [TEST_FILE...]
#
# Installs the client's packages with `npm ci` first; skipped when
# node_modules already matches package-lock.json. As root, `unprivileged`
# creates the user agentbox-test if needed and runs the tests as that user
# from a staged copy (binary, tests, node_modules) it can read.
set -euo pipefail
who="$1" bin="$(realpath "$2")"
shift 2
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(stdio.test.mjs protocol.test.mjs http.test.mjs gateway.test.mjs gateway_http.test.mjs)

# npm ci, once per lock file (serialised: two ctest entries may start together).
exec 9<"$here/package-lock.json"
flock 9
lock_sum="$(sha256sum "$here/package-lock.json" | cut -d' ' -f1)"
stamp="$here/node_modules/.agentbox-lock-sha256"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$lock_sum" ]; then
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$lock_sum" >"$stamp"
fi
flock -u 9

if [ "$who" = self ] || [ "$(id -u)" -ne 0 ]; then
  cd "$here"
  exec env AGENTBOX_BIN="$bin" node --test "${files[@]}"
fi

user=agentbox-test
. "$(dirname "${BASH_SOURCE[0]}")/../test_user.sh"
ensure_test_user "$user"
home="$(getent passwd "$user" | cut -d: -f6)"
stage="$(mktemp -d /tmp/agentbox-mcp-unpriv.XXXXXX)"
trap 'rm -rf "$stage"' EXIT
cp "$bin" "$stage/agentbox"
mkdir "$stage/tests"
cp "$here"/*.mjs "$here/package.json" "$stage/tests/"
cp -r "$here/node_modules" "$stage/tests/node_modules"
chmod -R a+rX "$stage"
chmod 755 "$stage"
cd "$stage/tests"
runuser -u "$user" -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" LANG=C.UTF-8 \
  TMPDIR=/tmp AGENTBOX_BIN="$stage/agentbox" node --test "${files[@]}"
