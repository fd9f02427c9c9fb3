#!/usr/bin/env bash
# test_jobs.sh - kexd buffers, memory accounting and fair queueing end to
# end: start a real kexd on a free 127.0.0.1 port (with the test-only
# --test-busy-work facility), wait for health, run test_jobs.py (Debian
# python + grpcio) against it, then stop it with SIGTERM and check it exits 0
# and never crashed.
#
# Env: KEX_BUILD_DIR (default build; kexd is $KEX_BUILD_DIR/daemon/kexd),
# KEX_CASES_DIR (default ../shared/cases from the repository root).
# The last line of the output is "N passed, N failed"; exit 1 on any failure.
. "$(dirname "$0")/lib.bash"
start_kexd --max-message "$max_message" --grace 2 --test-busy-work
run_py test_jobs.py KEXD="$kexd" KEXD_PORT="$port" KEXD_MAX_MESSAGE="$max_message" KEX_CASES_DIR="$cases" KEXD_TMP="$tmp"
end_kexd
finish
