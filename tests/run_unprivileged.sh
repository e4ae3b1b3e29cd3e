#!/usr/bin/env bash
# Runs a test suite (e2e, world, session) as an unprivileged user, the way
# most people run agents. As root: creates the user `agentbox-test` if needed
# and stages the binaries and fixtures where that user can read them. Not
# root: runs as is.
#
#   tests/run_unprivileged.sh AGENTBOX_BIN TEST_BIN FIXTURES_DIR [GTEST_FLAGS...]
#
# AGENTBOX_UNPRIV_NO_GROUPS=1: the user runs with no supplementary groups
# (setpriv --clear-groups), as a service may; isolation: microvm needs that
# without root (virtiofsd drops them, which a user namespace forbids).
set -euo pipefail
bin="$1" tests="$2" fixtures="$3"
shift 3

if [ "$(id -u)" -ne 0 ]; then
  exec env AGENTBOX_BIN="$bin" AGENTBOX_FIXTURES="$fixtures" "$tests" "$@"
fi

user=agentbox-test
. "$(dirname "${BASH_SOURCE[0]}")/test_user.sh"
ensure_test_user "$user"
home="$(getent passwd "$user" | cut -d: -f6)"
stage="$(mktemp -d /tmp/agentbox-unpriv.XXXXXX)"
trap 'rm -rf "$stage"' EXIT
cp "$bin" "$stage/agentbox"
# agentbox-core, the build's other binary, beside it (tests/e2e/cli_test.cc).
if [ -x "$(dirname "$bin")/agentbox-core" ]; then cp "$(dirname "$bin")/agentbox-core" "$stage/agentbox-core"; fi
# The microVM guest images the build made beside the binary.
if [ -d "$(dirname "$bin")/guest" ]; then cp -r "$(dirname "$bin")/guest" "$stage/guest"; fi
# The stripped binary a remote host gets (sandbox.isolation: remote).
if [ -d "$(dirname "$bin")/remote" ]; then cp -r "$(dirname "$bin")/remote" "$stage/remote"; fi
name="$(basename "$tests")"
cp "$tests" "$stage/$name"
cp -r "$fixtures" "$stage/fixtures"
chmod -R a+rX "$stage"
chmod 755 "$stage"
cd "$stage"
as_user=(runuser -u "$user" --)
if [ "${AGENTBOX_UNPRIV_NO_GROUPS:-}" = 1 ]; then
  as_user=(setpriv --reuid="$user" --regid="$user" --clear-groups --)
fi
"${as_user[@]}" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" LANG=C.UTF-8 \
  TMPDIR=/tmp AGENTBOX_BIN="$stage/agentbox" AGENTBOX_FIXTURES="$stage/fixtures" \
  "$stage/$name" --gtest_brief=1 "$@"
