#!/usr/bin/env bash
# test_stress.sh - the short form of tests/stress/stress.py: 8 clients with their own jobs, 30 mixed calls
# each (Submits tiny, matmul and multi-kernel, uploads, downloads, cancels, deadlines, closes mid-stream)
# against one real kexd; 0 unexpected errors, outputs equal to numpy's, GetStats agreeing, no buffer left
# held, RSS and descriptors flat after warm-up.  The long form is bench/stress.
#
# Env: KEX_BUILD_DIR (default build).  Last line "N passed, N failed".
. "$(dirname "$0")/lib.bash"
asan=0
grep -q '"sanitize", "value": true' "$build/meson-info/intro-buildoptions.json" 2>/dev/null && asan=1
run_py ../stress/stress.py KEXD="$kexd" KEXD_TMP="$tmp" KEXD_ASAN=$asan \
  KEX_STRESS_CLIENTS="${KEX_STRESS_CLIENTS:-8}" KEX_STRESS_CALLS="${KEX_STRESS_CALLS:-30}"
finish
