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
"$kexd" --listen "127.0.0.1:$port" --max-message "$max_message" --grace 2 --test-busy-work >"$tmp/kexd.log" 2>&1 &
pid=$!

need_healthy

run_py test_jobs.py KEXD="$kexd" KEXD_PORT="$port" KEXD_MAX_MESSAGE="$max_message" KEX_CASES_DIR="$cases"

if kill -0 "$pid" 2>/dev/null; then
  ok "kexd is still running after every check (it never exits on bad input)"
  kill -TERM "$pid"
  rc=""
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
if grep -qiE 'AddressSanitizer|runtime error|Segmentation|Aborted' "$tmp/kexd.log"; then
  bad "kexd log is free of sanitizer reports and crashes"
  cat "$tmp/kexd.log"
else
  ok "kexd log is free of sanitizer reports and crashes"
fi
finish
