#!/usr/bin/env bash
# test_fleet.sh - the fleet cache (kexd --fleet-cache) end to end: test_fleet.py
# starts a real redis-server (a free 127.0.0.1 port, no persistence) and three
# kexds that share beam results through it; then the kexd logs are checked for
# sanitizer reports and crashes.
#
# Env: KEX_BUILD_DIR (default build).  Last line "N passed, N failed".
. "$(dirname "$0")/lib.bash"
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  bad "redis-server and redis-cli are installed (scripts/setup.sh)"
  finish
fi
run_py test_fleet.py KEXD="$kexd" KEXD_TMP="$tmp"
check_logs_clean
finish
