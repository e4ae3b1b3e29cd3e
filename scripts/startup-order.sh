#!/usr/bin/env bash
# Remakes src/cli/startup.order: the functions of the agentbox binary that
# a run, a run with limits, a run with egress, and an MCP session's calls
# reach, in the order they first reach them. The linker places them first in
# the program's text (CMakeLists.txt, docs/performance.md "Start-up"). Run it
# as root after changes to the start-up path, then rebuild and commit the file.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh" agentbox_cli order_trace >/dev/null
bin="$root/build/agentbox"
trace="$root/build/bench/order_trace"
work="$(mktemp -d /tmp/agentbox-order.XXXXXX)"
trap 'rm -rf "$work"' EXIT

# Every function's entry: nm's defined text symbols (local ones too).
nm --defined-only "$bin" | awk '$2 ~ /^[TtWw]$/ { print $1, $3 }' >"$work/functions"

# A workspace as an agent's task has one: a git repository with a file.
mkdir "$work/ws"
git -C "$work/ws" init -q
echo 'print("hello")' >"$work/ws/main.py"
# Settled (changed over a second ago), so that the scans' caches keep its
# directories and the later runs take the cached path, as an agent's do.
sleep 2

n=0
traced() {
  n=$((n + 1))
  (cd "$work/ws" && "$trace" "$work/functions" "$work/order.$n" -- "$bin" "$@") >/dev/null
}
traced run -- /bin/true
traced run -- /bin/sh -c 'echo hi >out.txt; cat main.py >/dev/null'
traced run --memory 512Mi --max-processes 256 -- /bin/true
traced run --allow-domain example.test -- /bin/true
# A session over MCP: the front end, the world and its init, a call of each tool.
printf '%s\n' \
  '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"order","version":"1"}}}' \
  '{"jsonrpc":"2.0","method":"notifications/initialized"}' \
  '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"bash","arguments":{"command":"true"}}}' \
  '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"main.py"}}}' \
  '{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"write_file","arguments":{"path":"new.txt","content":"x"}}}' \
  '{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"edit_file","arguments":{"path":"new.txt","old":"x","new":"y"}}}' \
  >"$work/mcp.in"
traced mcp --workspace "$work/ws" --state-dir "$work/state" --log-file "$work/mcp.log" <"$work/mcp.in"

# First reached first; a name once.
for i in $(seq 1 "$n"); do cat "$work/order.$i"; done | awk '!seen[$0]++' >"$root/src/cli/startup.order"
echo "src/cli/startup.order: $(wc -l <"$root/src/cli/startup.order") functions"
