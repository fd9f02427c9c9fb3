#!/usr/bin/env bash
# setup.sh [--test] - install the Debian 12 packages kex builds and tests with.
#
# Idempotent: each package is checked with dpkg-query and only the missing
# ones are installed (apt-get update runs first, and only then).  Prints
# nothing when everything is already present.  Uses sudo only when not root.
# --test (scripts/test.sh) adds what only the tests need: clang-15, whose
# libFuzzer builds the fuzz targets (tests/fuzz/libfuzzer.sh; Debian 12's
# default clang 14 cannot compile _Float16 on x86-64), installed without its
# recommends (PoCL already brings the LLVM 15 libraries it uses), and patchelf
# (bench/gpu.sh pack, which the test command checks with its selftest).
set -euo pipefail

packages=(
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
  libuv1-dev ocl-icd-opencl-dev opencl-headers pocl-opencl-icd clinfo
  libsqlite3-dev libcmocka-dev meson ninja-build libjansson-dev
  python3-grpcio python3-grpc-tools python3-protobuf python3-numpy python3-pytest python3-venv
  libopenblas-dev libssl-dev pkg-config gcc
  libmicrohttpd-dev python3-prometheus-client
  python3-tqdm  # tinygrad 0.9.0 (../shared/anchors) imports it: bench/plan.py, bench/tg_graphs.py
  python3-sklearn  # its bundled digits data set: examples/tinygrad_digits.py (nothing downloaded)
  libhiredis-dev redis-server
)

test_packages=(clang-15 patchelf)

# The packages of "$@" that dpkg does not list as installed.
missing_of() {
  for pkg in "$@"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [ "$status" = "install ok installed" ] || echo "$pkg"
  done
}

mapfile -t missing < <(missing_of "${packages[@]}")
missing_test=()
[ "${1:-}" = --test ] && mapfile -t missing_test < <(missing_of "${test_packages[@]}")
[ ${#missing[@]} -eq 0 ] && [ ${#missing_test[@]} -eq 0 ] && exit 0

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  sudo=(sudo)
fi

echo "setup: installing ${missing[*]} ${missing_test[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update
[ ${#missing[@]} -eq 0 ] || "${sudo[@]}" apt-get install -y "${missing[@]}"
[ ${#missing_test[@]} -eq 0 ] || "${sudo[@]}" apt-get install -y --no-install-recommends "${missing_test[@]}"
