#!/usr/bin/env bash
# Builds and runs the MCP round-trip benchmark (bench/mcp_bench.cc).
#
#   bench/mcp.sh [ROUNDS]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh" >/dev/null
"$root/build/bench/mcp_bench" "$@"
