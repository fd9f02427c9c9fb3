#!/usr/bin/env bash
# test_trace.sh - SubmitRequest.trace: the done event's Chrome trace-event
# JSON checked against the kernels that ran (test_trace.py, through the
# Python stubs), and `kex run --server ADDR --trace FILE`.
#
# Env: KEX_BUILD_DIR (default build).  Last line "N passed, N failed".
. "$(dirname "$0")/lib.bash"
run_py test_trace.py KEXD="$kexd" KEXD_TMP="$tmp" KEX_CLI="$build/kex"
finish
