#!/usr/bin/env bash
# test_tune.sh - kexd Tune and the beam-cache RPCs end to end: start a real
# kexd (devices cpu,opencl, its own --cache file) on a free 127.0.0.1 port,
# wait for health, run test_tune.py (Debian python + grpcio) against it, then
# stop it with SIGTERM and check it exits 0 and never crashed.  The kill -9,
# shared-file, drain, attack and new-file race checks start their own kexds.
#
# Env: KEX_BUILD_DIR (default build; KEX_BUILD_DIR=build-asan runs it against
# the ASan build's kexd).  The last line of the output is "N passed, N failed";
# exit 1 on any failure.
. "$(dirname "$0")/lib.bash"
start_kexd --max-message "$max_message" --grace 2 --device cpu,opencl --cache "$tmp/cache.db"
run_py test_tune.py KEXD_CACHE="$tmp/cache.db" POCL_CACHE_DIR="$tmp/pocl" KEXD_TMP="$tmp" KEXD="$kexd" KEXD_PORT="$port"
end_kexd
finish
