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
cache="$tmp/cache.db"
POCL_CACHE_DIR="$tmp/pocl" "$kexd" --listen "127.0.0.1:$port" --max-message "$max_message" --grace 2 --device cpu,opencl \
  --cache "$cache" >"$tmp/kexd.log" 2>&1 &
pid=$!

need_healthy

KEXD_CACHE="$cache" POCL_CACHE_DIR="$tmp/pocl" KEXD_TMP="$tmp" KEXD="$kexd" KEXD_PORT="$port" KEX_STUBS="$tmp" \
  $PY tests/integration/test_tune.py | tee "$tmp/py.out"
last=$(tail -n 1 "$tmp/py.out")
if [[ "$last" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
  passed=$((passed + BASH_REMATCH[1]))
  failed=$((failed + BASH_REMATCH[2]))
else
  bad "test_tune.py printed its closing line (got: $last)"
fi

if kill -0 "$pid" 2>/dev/null; then
  ok "kexd is still running after every check (it never exits on bad input)"
  kill -TERM "$pid"
  for _ in $(seq 1 100); do
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 0.1
  done
  wait "$pid"
  rc=$?
  pid=""
  if [ "$rc" -eq 0 ]; then ok "kexd exits 0 at SIGTERM"; else bad "kexd exits 0 at SIGTERM (rc $rc)"; fi
else
  bad "kexd is still running after every check"
  wait "$pid"
  pid=""
fi
check_logs_clean
finish
