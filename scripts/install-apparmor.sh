#!/usr/bin/env bash
# Installs agentbox's AppArmor profile (packaging/apparmor/agentbox) as
# /etc/apparmor.d/agentbox and loads it, so that agentbox may create user
# namespaces where kernel.apparmor_restrict_unprivileged_userns is 1.
# Idempotent. Needs root. `agentbox check` says when this is the fix.
#
#   scripts/install-apparmor.sh [PROFILE]   (default: the source tree's)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
profile="${1:-$here/../packaging/apparmor/agentbox}"
target=/etc/apparmor.d/agentbox

if [ ! -d /etc/apparmor.d ] || ! command -v apparmor_parser >/dev/null 2>&1; then
  echo "AppArmor is not installed on this host (no /etc/apparmor.d or apparmor_parser): nothing to do" >&2
  exit 0
fi
install -m 0644 "$profile" "$target"
if [ ! -e /sys/kernel/security/apparmor/profiles ]; then
  echo "installed $target; AppArmor is not active in this kernel, so it was not loaded" >&2
  exit 0
fi
apparmor_parser -r "$target"
echo "loaded $target: agentbox may now create user namespaces" >&2
