#!/usr/bin/env bash
# test_faults.sh - device faults and kill -9 through real kexds (issue 14, item 4),
# short form: the fault device (kexd --test-fault KIND:N) swept over N = 1..6 for
# each kind (compile, alloc, launch, copy) on two multi-kernel graphs, and 10 kill -9
# rounds at random points of Submit, Tune and ImportCache on one SQLite cache file.
# test_faults.py starts every kexd itself (one per KIND:N: the fault counter is
# process-wide) and checks each of them exits 0; this script then checks their logs
# are free of sanitizer reports and crashes.  bench/faults runs the long form.
#
# Env: KEX_BUILD_DIR (default build; build-asan runs it against the ASan kexd),
# FAULTS_MAX_N, FAULTS_GRAPHS, FAULTS_KILL_ROUNDS, FAULTS_SEED, FAULTS_JSON (see
# test_faults.py).  The last line is "N passed, N failed"; exit 1 on any failure.
. "$(dirname "$0")/lib.bash"
run_py test_faults.py KEXD="$kexd" KEX_CLI="$build/kex" KEXD_TMP="$tmp" FAULTS_MAX_N="${FAULTS_MAX_N:-6}" \
  FAULTS_GRAPHS="${FAULTS_GRAPHS:-short}" FAULTS_KILL_ROUNDS="${FAULTS_KILL_ROUNDS:-10}" \
  FAULTS_SEED="${FAULTS_SEED:-14}" FAULTS_JSON="${FAULTS_JSON:-}"
# the kill -9 rounds' kexds die by design: their logs may end anywhere, but never in a report
if grep -lqiE 'AddressSanitizer|LeakSanitizer|runtime error|Segmentation|Aborted' "$tmp"/kexd-*.log 2>/dev/null; then
  bad "kexd logs are free of sanitizer reports and crashes"
  grep -iE -B2 -A20 'AddressSanitizer|LeakSanitizer|runtime error|Segmentation|Aborted' "$tmp"/kexd-*.log | head -80
else
  ok "kexd logs are free of sanitizer reports and crashes ($(ls "$tmp"/kexd-*.log 2>/dev/null | wc -l) kexds)"
fi
finish
