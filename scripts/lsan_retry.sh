#!/usr/bin/env bash
# lsan_retry.sh CMD [ARG...] - meson test's --wrapper for the ASan build's unit tests (scripts/test.sh).
#
# Runs CMD.  When it fails and its output says that LeakSanitizer itself
# failed ("LeakSanitizer has encountered a fatal error": its tracer thread
# could not stop the process's threads, which happens on a loaded machine;
# it is not a leak report), CMD runs once more and this says so on stderr.
# Any other failure, a leak report included, stands as it is.
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
"$@" >"$out" 2>"$err"
rc=$?
cat "$out"
cat "$err" >&2
if [ "$rc" -ne 0 ] && grep -q "LeakSanitizer has encountered a fatal error" "$err" "$out"; then
  echo "lsan_retry.sh: LeakSanitizer's tracer failed (exit $rc; not a leak report): running $1 once more" >&2
  "$@"
  exit $?
fi
exit "$rc"
