# Sourced by the scripts that run tests as the unprivileged user `agentbox-test`.
#
#   ensure_test_user USER   # creates USER (with a home) unless it exists
#
# Several ctest entries start together on a fresh machine, and useradd run
# side by side is not safe: three at once each "succeed", leaving one entry
# whose home belongs to another uid. The creation takes a lock on this file.
ensure_test_user() {
  local user="$1" lock
  lock="$(dirname "${BASH_SOURCE[0]}")/test_user.sh"
  (
    flock 8
    id -u "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/sh "$user"
  ) 8<"$lock"
}
