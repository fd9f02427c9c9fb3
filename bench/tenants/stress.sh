#!/usr/bin/env bash
# bench/tenants/stress.sh [--rounds 10] [--calls 10000] [--json OUT] - the long forms of issue 31's
# findings against a real kexd --auth: bench/tenants/stress.py (10 x 32 MiB pins behind stalled
# Downloads, 10,000 unauthenticated calls).  Env: KEX_BUILD_DIR (default build); KEXD for another kexd.
# Last line "N passed, N failed".
. "$(dirname "$0")/../../tests/integration/lib.bash"
env KEX_STUBS="$tmp" KEXD="$kexd" KEX="${KEX:-$build/kex}" KEXD_TMP="$tmp" PYTHONPATH="$root/tests/integration" \
  $PY "$root/bench/tenants/stress.py" "$@"
