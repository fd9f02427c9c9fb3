#!/usr/bin/env bash
# test_daemon.sh - kexd end to end: start a real kexd on a free 127.0.0.1
# port, wait for health, run test_daemon.py (Debian python + grpcio) against
# it, then stop it with SIGTERM and check it exits 0 and never crashed.
#
# Env: KEX_BUILD_DIR (default build; kexd is $KEX_BUILD_DIR/daemon/kexd),
# KEX_CASES_DIR (default ../shared/cases from the repository root).
# The last line of the output is "N passed, N failed"; exit 1 on any failure.
. "$(dirname "$0")/lib.bash"
start_kexd --max-message "$max_message" --grace 2
run_py test_daemon.py KEXD="$kexd" KEXD_PORT="$port" KEXD_MAX_MESSAGE="$max_message" KEX_CASES_DIR="$cases" KEXD_TMP="$tmp"
end_kexd
finish
