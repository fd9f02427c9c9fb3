#!/usr/bin/env bash
# test_fairness.sh - the short form of tests/stress/fairness.py: while 8 stress clients load one real kexd
# (their own jobs, stress.py's mixed calls), two saturating jobs get their shares of device time at 1:1 and
# 3:1 within 5 points, and a tiny job's Submit p99 stays within one heavy item + its own run + a fixed
# allowance while a heavy job floods its device.  The long form is bench/stress (more rounds and Submits).
#
# Env: KEX_BUILD_DIR (default build).  Last line "N passed, N failed".
. "$(dirname "$0")/lib.bash"
asan=0
grep -q '"sanitize", "value": true' "$build/meson-info/intro-buildoptions.json" 2>/dev/null && asan=1
run_py ../stress/fairness.py KEXD="$kexd" KEXD_TMP="$tmp" KEXD_ASAN=$asan KEX_STRESS_CLIENTS="${KEX_STRESS_CLIENTS:-8}"
finish
