#!/usr/bin/env bash
# test_fleet_clients.sh - clients that know a fleet: test_fleet_clients.py
# starts three real kexds on free 127.0.0.1 ports and drives libkex (the
# tests/programs/fleet_test.c), the Python client and the kex CLI through the
# list "127.0.0.1:PA,127.0.0.1:PB,127.0.0.1:PC": jobs spread over the nodes,
# each job's calls go to its node, and after node B is killed its jobs fail
# UNAVAILABLE naming it while new jobs land on A and C.
#
# Env: KEX_BUILD_DIR (default build: daemon/kexd, tests/fleet_test, kex); FLEET_TEST and KEX_CLI
# override the last two (e.g. from an ASan build).
# The last line of the output is "N passed, N failed"; exit 1 on any failure.
. "$(dirname "$0")/lib.bash"
fleet_test=${FLEET_TEST:-$build/tests/fleet_test}
cli=${KEX_CLI:-$build/kex}
[ -x "$fleet_test" ] || { bad "fleet_test is built ($fleet_test not found)"; finish; }
[ -x "$cli" ] || { bad "kex is built ($cli not found)"; finish; }
command -v openssl >/dev/null || { bad "openssl is installed"; finish; }
run_py test_fleet_clients.py KEX_FLEET_TMP="$tmp" KEXD="$kexd" FLEET_TEST="$fleet_test" KEX_CLI="$cli" \
  KEX_PYTHON_DIR="$root/client/python" PYTHONPATH="$root/tests/integration"
finish
