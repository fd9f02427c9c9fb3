#!/usr/bin/env bash
# bench/tenants/lease_storm.sh [--kernels 8] [--json OUT] - a Redis writer's lease storm against a fleet node:
# bench/tenants/lease_storm.py with a redis-server and two kexds of its own (127.0.0.1, free ports).
# Env: KEX_BUILD_DIR (default build); KEXD for another kexd.  Last line "N passed, N failed".
. "$(dirname "$0")/../../tests/integration/lib.bash"
env KEX_STUBS="$tmp" KEXD="$kexd" KEXD_TMP="$tmp" PYTHONPATH="$root/tests/integration" \
  $PY "$root/bench/tenants/lease_storm.py" "$@"
