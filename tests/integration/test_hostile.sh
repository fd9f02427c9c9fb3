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
run_py test_hostile.py KEXD="$kexd" KEXD_TMP="$tmp" KEXD_ASAN=$asan
finish
