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
env KEX_STUBS="$tmp" KEXD="$kexd" KEXD_TMP="$tmp" KEXD_ASAN=$asan $PY tests/stress/stress.py \
  --clients "${KEX_STRESS_CLIENTS:-8}" --calls "${KEX_STRESS_CALLS:-30}" | tee "$tmp/py.out"
last=$(tail -n 1 "$tmp/py.out")
if [[ "$last" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
  passed=$((passed + BASH_REMATCH[1]))
  failed=$((failed + BASH_REMATCH[2]))
else
  bad "stress.py printed its closing line (got: $last)"
fi
finish
