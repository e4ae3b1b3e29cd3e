# Shared by tests/delegation/run.sh and tests/escape/run_battery.sh (mode
# `delegated`): as root, a cgroup delegation for USER on real cgroups, under
# a cgroup created here beneath this process's own in each v1 hierarchy a
# run's limits need (memory, pids, cpu, cpuacct), so that nothing outside it
# is touched. Source it, then:
#
#   delegation_setup BIN USER RECORD_DIR   # or returns 2: not applicable (says why)
#   delegation_check_empty                 # 1 when a cgroup or process is left
#   delegation_remove                      # --remove, checked; 1 when it left something
#   delegation_cleanup                     # for a trap: removes everything, quietly

deleg_bin="" deleg_user="" deleg_record=""
deleg_parents=()
deleg_made=()

# Our own cgroup in the v1 hierarchy of controller $1 (/proc/self/cgroup and the mounts).
deleg_own_dir() {
  local c="$1" rel mnt
  rel="$(awk -F: -v c="$c" '{ n = split($2, a, ","); for (i = 1; i <= n; i++) if (a[i] == c) print $3 }' /proc/self/cgroup)"
  mnt="$(awk -v c="$c" '$0 ~ / - cgroup / { n = split($NF, o, ","); for (i = 1; i <= n; i++) if (o[i] == c) print $5 }' /proc/self/mountinfo | head -1)"
  [ -n "$rel" ] && [ -n "$mnt" ] || return 1
  if [ "$rel" = / ]; then echo "$mnt"; else echo "$mnt$rel"; fi
}

delegation_setup() {
  deleg_bin="$1" deleg_user="$2" deleg_record="$3"
  local name="agentbox-deltest-$$-$RANDOM" seen="" c dir
  for c in memory pids cpu cpuacct; do
    if ! dir="$(deleg_own_dir "$c")"; then
      echo "not applicable here: no v1 $c hierarchy (the delegation test drives v1 cgroups)"
      return 2
    fi
    case " $seen " in *" $dir "*) continue ;; esac  # co-mounted controllers share one
    seen="$seen $dir"
    mkdir "$dir/$name" || return 1
    deleg_made+=("$dir/$name")
    deleg_parents+=(--parent "$dir/$name")
  done
  AGENTBOX_DELEGATION_RECORD="$deleg_record" "$deleg_bin" setup-delegation --user "$deleg_user" \
    "${deleg_parents[@]}" || return 1
  # Twice is fine.
  AGENTBOX_DELEGATION_RECORD="$deleg_record" "$deleg_bin" setup-delegation --user "$deleg_user" \
    "${deleg_parents[@]}" >/dev/null || return 1
}

delegation_check_empty() {
  local d del left procs rc=0
  for d in "${deleg_made[@]}"; do
    del="$d/agentbox-delegate-$deleg_user"
    left="$(find "$del" -mindepth 1 -type d 2>/dev/null || true)"
    if [ -n "$left" ]; then
      echo "delegation: cgroups left behind: $left" >&2
      rc=1
    fi
    procs="$(cat "$del/cgroup.procs" 2>/dev/null || true)"
    if [ -n "$procs" ]; then
      echo "delegation: processes left in $del: $procs" >&2
      rc=1
    fi
  done
  return $rc
}

delegation_remove() {
  local d rc=0
  AGENTBOX_DELEGATION_RECORD="$deleg_record" "$deleg_bin" setup-delegation --user "$deleg_user" --remove \
    "${deleg_parents[@]}" || rc=1
  for d in "${deleg_made[@]}"; do
    if [ -e "$d/agentbox-delegate-$deleg_user" ]; then
      echo "delegation: --remove left $d/agentbox-delegate-$deleg_user" >&2
      rc=1
    fi
  done
  if [ -e "$deleg_record/$(id -u "$deleg_user").json" ]; then
    echo "delegation: --remove left the record" >&2
    rc=1
  fi
  return $rc
}

delegation_cleanup() {
  local d
  [ -n "$deleg_bin" ] || return 0
  if [ ${#deleg_parents[@]} -gt 0 ]; then
    AGENTBOX_DELEGATION_RECORD="$deleg_record" "$deleg_bin" setup-delegation --user "$deleg_user" --remove \
      "${deleg_parents[@]}" >/dev/null 2>&1 || true
  fi
  for d in "${deleg_made[@]}"; do
    rmdir "$d/agentbox-delegate-$deleg_user" 2>/dev/null || true
    if [ -e "$d" ] && ! rmdir "$d" 2>/dev/null; then echo "delegation: could not remove $d" >&2; fi
  done
  deleg_made=()
  deleg_parents=()
}
