#!/usr/bin/env bash
# The shipped AppArmor profile: what it must say (always checked), and that
# apparmor_parser accepts it (only where an AppArmor 4 parser is installed;
# exit 77, ctest's skip, elsewhere: "not applicable here").
#
#   tests/apparmor_profile_test.sh packaging/apparmor/agentbox
set -euo pipefail
profile="$1"
fail=0
expect() {
  if ! grep -qE "$1" "$profile"; then
    echo "FAIL: $profile lacks: $2" >&2
    fail=1
  fi
}
expect '^abi <abi/4\.0>,$' "abi <abi/4.0>"
expect '^include <tunables/global>$' "include <tunables/global>"
expect '^profile agentbox /usr/\{,local/\}bin/agentbox flags=\(unconfined\) \{$' \
  "a profile for /usr/bin/agentbox and /usr/local/bin/agentbox"
expect '^  userns,$' "the userns rule"
expect '^  include if exists <local/agentbox>$' "the local override include"
[ "$fail" -eq 0 ] || exit 1
echo "profile content: ok"

if ! command -v apparmor_parser >/dev/null 2>&1; then
  echo "parse: not applicable here: apparmor_parser is not installed (no AppArmor on this host)"
  exit 77
fi
if [ ! -e /etc/apparmor.d/abi/4.0 ]; then
  echo "parse: not applicable here: $(apparmor_parser --version | head -1) has no abi/4.0 (the userns rule needs AppArmor 4)"
  exit 77
fi
# -Q: parse and compile only, load nothing; -K: no cache.
apparmor_parser -Q -K "$profile"
echo "parse: ok"
