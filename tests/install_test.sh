#!/usr/bin/env bash
# `cmake --install` puts the binary, headers, CMake package and pkg-config file
# in place, and a project outside the tree can build against them.
#   tests/install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1" src="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -x "$work/prefix/bin/agentbox"
test -f "$work/prefix/include/agentbox/confine.h"
test -f "$work/prefix/share/agentbox/apparmor/agentbox"
test -f "$work/prefix/lib/cmake/agentbox/agentboxConfig.cmake" || test -f "$work/prefix/lib/x86_64-linux-gnu/cmake/agentbox/agentboxConfig.cmake"
pc="$(find "$work/prefix" -name agentbox.pc)"
test -n "$pc"
PKG_CONFIG_PATH="$(dirname "$pc")" pkg-config --cflags --libs agentbox | grep -q -- "-lagentbox"
"$work/prefix/bin/agentbox" --version | grep -q agentbox
cmake -S "$src/tests/install_consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
out="$("$work/consumer/consumer")"
echo "consumer: $out"
[[ "$out" == full\ * ]]
