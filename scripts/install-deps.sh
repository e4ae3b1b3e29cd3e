#!/usr/bin/env bash
# Installs the Debian packages agentbox needs to build, test and benchmark.
# Idempotent: asks apt only for what is missing. Needs root (or sudo).
set -euo pipefail

packages=(
  # build
  cmake ninja-build g++ make pkg-config git
  # the linker: links in a fifth of GNU ld's time, and lays out the start-up order
  lld
  # libraries
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libseccomp-dev
  # large request bodies (a file's content) parsed ~10x faster than nlohmann's lexer
  rapidjson-dev
  # the egress proxy: Asio/Beast (header-only), IDNA host names (static: libunistring too)
  libboost-dev libidn2-dev libunistring-dev
  # the TLS terminator (per-run CA, verified upstreams) and the git push check (zlib);
  # the openssl CLI makes the tests' CA and servers' certificates
  libssl-dev zlib1g-dev openssl ca-certificates
  # tests, fuzzing, benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev python3 curl patch procps
  # the escape battery's compat suite
  nodejs
  # the demo's readable reports; anchors for the benchmarks
  jq bubblewrap util-linux iproute2 passwd
  # the container test: Podman's default seccomp profile (/usr/share/containers/seccomp.json)
  golang-github-containers-common
  # disk_gib by project quotas: the e2e test and the bench make a loop-mounted ext4
  e2fsprogs mount
  # the transparent-egress e2e test: an ssh server inside the test's network namespace
  openssh-server
  # sandbox.isolation: container runs the command on gVisor's kernel
  runsc
  # sandbox.isolation: microvm: QEMU (virtiofsd comes with qemu-system-common) and
  # a Debian guest kernel, whose virtio modules the build puts in the guest image
  qemu-system-x86 linux-image-cloud-amd64
)

# npm installs the MCP tests' client (tests/mcp). Debian packages it apart
# from nodejs; a Node.js build that ships its own npm conflicts with that package.
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing: ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
# No package may start a service here (the containers packages bring units):
# a policy-rc.d that refuses every start, for the length of the install, where
# the host has none of its own.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' | "${sudo_cmd[@]}" tee /usr/sbin/policy-rc.d >/dev/null
  "${sudo_cmd[@]}" chmod 755 /usr/sbin/policy-rc.d
  trap '"${sudo_cmd[@]}" rm -f /usr/sbin/policy-rc.d' EXIT
fi
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
