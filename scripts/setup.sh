#!/usr/bin/env bash
# setup.sh - install the Debian 12 packages kex builds and tests with.
#
# Idempotent: each package is checked with dpkg-query and only the missing
# ones are installed (apt-get update runs first, and only then).  Prints
# nothing when everything is already present.  Uses sudo only when not root.
set -euo pipefail

packages=(
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
  libuv1-dev ocl-icd-opencl-dev opencl-headers pocl-opencl-icd clinfo
  libsqlite3-dev libcmocka-dev meson ninja-build libjansson-dev
  python3-grpcio python3-grpc-tools python3-protobuf python3-numpy python3-pytest python3-venv
  libopenblas-dev libssl-dev pkg-config gcc
  libmicrohttpd-dev python3-prometheus-client
  python3-tqdm  # tinygrad 0.9.0 (../shared/anchors) imports it: bench/plan.py, bench/tg_graphs.py
  libhiredis-dev redis-server
)

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  if [ "$status" != "install ok installed" ]; then
    missing+=("$pkg")
  fi
done

[ ${#missing[@]} -eq 0 ] && exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  sudo=(sudo)
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update
"${sudo[@]}" apt-get install -y "${missing[@]}"
