#!/usr/bin/env bash
# test_hostile.sh - what an attacker tried, against real kexd processes: a
# connection burst under a small descriptor limit, handshake/idle timeouts,
# ambiguous strings, unknown devices, every client-chosen quantity on both
# sides of its limit, overflowing shapes; the daemon keeps serving and gives
# back its descriptors and memory.  test_hostile.py starts each kexd it needs.
#
# Env: KEX_BUILD_DIR (default build; an ASan build is noticed and given more
# time), KEX_CASES_DIR (unused here).  Last line "N passed, N failed".
. "$(dirname "$0")/lib.bash"
asan=0
if grep -q "b_sanitize=address" "$build/meson-info/intro-buildoptions.json" 2>/dev/null ||
  grep -q '"sanitize", "value": true' "$build/meson-info/intro-buildoptions.json" 2>/dev/null; then
  asan=1
fi
KEXD="$kexd" KEX_STUBS="$tmp" KEXD_TMP="$tmp" KEXD_ASAN=$asan $PY tests/integration/test_hostile.py | tee "$tmp/py.out"
last=$(tail -n 1 "$tmp/py.out")
if [[ "$last" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
  passed=$((passed + BASH_REMATCH[1]))
  failed=$((failed + BASH_REMATCH[2]))
else
  bad "test_hostile.py printed its closing line (got: $last)"
fi
finish
