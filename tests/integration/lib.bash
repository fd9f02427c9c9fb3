# lib.bash - the shared start of the kexd integration scripts (sourced, not run):
# strict mode, the repository root as cwd, ok/bad/skip/finish counters whose last line is
# "N passed, N failed", the kexd binary ($kexd; $KEXD overrides), a temp dir ($tmp) cleaned up on
# exit (killing $pid and $pid2 if still running), Python stubs in $tmp, a free 127.0.0.1 port
# ($port), and the one way the scripts start and stop their kexd: start_kexd, stop_kexd, end_kexd.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
PY=/usr/bin/python3
build=${KEX_BUILD_DIR:-build}
case "$build" in /*) ;; *) build="$root/$build" ;; esac
cases=${KEX_CASES_DIR:-$root/../shared/cases}
max_message=4194304
# an ASan build: PoCL/LLVM keep their compiler state for the life of the process (third-party only)
export LSAN_OPTIONS="suppressions=$root/tests/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
# an ASan build: PoCL's LLVM, building programs on the worker pool's threads, replaces each such thread's
# alternate signal stack with a malloc'd one (llvm Signals.inc, CreateSigAltStack), and ASan's thread
# teardown then fails to munmap it ("failed to deallocate 0x12000 bytes", exit 1 at SIGTERM).
# Third-party only: ASan keeps no alternate stack of its own.
export ASAN_OPTIONS="use_sigaltstack=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
# every kexd a test starts serves no metrics unless it asks (the default 127.0.0.1:9464 is one port for all)
export KEX_METRICS=off
# grpcio's fork support makes every fork (each kexd, redis-server or kex a Python test starts) wait for
# gRPC's thread pool to go idle; a pool thread still busy with a closed channel's call then blocks the fork
# for ever ("Waiting for thread pool to idle before forking", seen once in test_hostile).  The children exec
# at once and use no gRPC state, so the tests need no fork support.
export GRPC_ENABLE_FORK_SUPPORT=0

passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok - $1"; }
bad() { failed=$((failed + 1)); echo "FAIL - $1"; }
skip() { echo "skip - $1"; }
finish() {
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}

kexd=${KEXD:-}
for c in "$build/daemon/kexd" "$build/kexd"; do
  if [ -z "$kexd" ] && [ -x "$c" ]; then kexd=$c; fi
done
if [ -z "$kexd" ] || [ ! -x "$kexd" ]; then
  bad "kexd is built (${kexd:-$build/daemon/kexd} not found)"
  finish
fi

tmp=$(mktemp -d)
pid=""  # the kexd start_kexd started
pid2="" # a second one some scripts start themselves
cleanup() {
  for p in $pid $pid2; do
    if kill -0 "$p" 2>/dev/null; then kill -KILL "$p" 2>/dev/null; fi
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

# Python stubs from the same .proto files the C code comes from
if $PY -m grpc_tools.protoc -I proto --python_out="$tmp" --grpc_python_out="$tmp" kex/v1/kex.proto &&
  $PY -m grpc_tools.protoc -I proto/grpc/health/v1 --python_out="$tmp" --grpc_python_out="$tmp" health.proto; then
  ok "python stubs generate from proto/"
else
  bad "python stubs generate from proto/"
  finish
fi

port=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# need_healthy: wait (up to ~10 s) for the kexd started as $pid on $port to answer
# health SERVING; counts one check, and on failure prints $tmp/kexd.log and finishes.
need_healthy() {
  local healthy=0
  for _ in $(seq 1 100); do
    if $PY - "$tmp" "$port" <<'PYEOF' 2>/dev/null; then healthy=1; break; fi
import sys
sys.path.insert(0, sys.argv[1])
import grpc, health_pb2, health_pb2_grpc
with grpc.insecure_channel("127.0.0.1:" + sys.argv[2]) as ch:
    r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=0.5)
sys.exit(0 if r.status == health_pb2.HealthCheckResponse.SERVING else 1)
PYEOF
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ "$healthy" = 1 ]; then
    ok "kexd on 127.0.0.1:$port answers health SERVING"
  else
    bad "kexd on 127.0.0.1:$port answers health SERVING"
    cat "$tmp/kexd.log"
    finish
  fi
}

# launch_kexd ARGS...: kexd --listen 127.0.0.1:$port ARGS in the background ($pid), its output in
# $tmp/kexd.log, PoCL's cache in $tmp/pocl (unless POCL_CACHE_DIR is set).  Not waited for.
launch_kexd() {
  POCL_CACHE_DIR=${POCL_CACHE_DIR:-$tmp/pocl} "$kexd" --listen "127.0.0.1:$port" "$@" >"$tmp/kexd.log" 2>&1 &
  pid=$!
}

# start_kexd ARGS...: launch_kexd ARGS, then need_healthy (one check; the script finishes if it fails).
start_kexd() {
  launch_kexd "$@"
  need_healthy
}

# stop_kexd [NAME]: SIGTERM to the kexd started as $pid, and one check that it exits 0 ("kexd NAME exits
# 0 at SIGTERM"; SIGKILL after 30 s; the end of its log shown on failure).
stop_kexd() {
  local rc
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid"
  rc=$?
  pid=""
  if [ "$rc" -eq 0 ]; then ok "kexd${1:+ $1} exits 0 at SIGTERM"; else
    bad "kexd${1:+ $1} exits 0 at SIGTERM (rc $rc)"
    tail -n 40 "$tmp/kexd.log" | sed 's/^/# /'
  fi
}

# end_kexd: the end of a script whose checks the kexd of start_kexd served: one check that it still
# runs (it never exits on bad input), stop_kexd, and check_logs_clean.
end_kexd() {
  if kill -0 "$pid" 2>/dev/null; then
    ok "kexd is still running after every check (it never exits on bad input)"
    stop_kexd
  else
    bad "kexd is still running after every check"
    wait "$pid"
    pid=""
  fi
  check_logs_clean
}

# check_logs_clean: one check that no kexd log in $tmp holds a sanitizer report or a crash (the reports shown).
check_logs_clean() {
  local pat='AddressSanitizer|LeakSanitizer|runtime error|Segmentation|Aborted'
  if grep -qiE "$pat" "$tmp"/kexd*.log 2>/dev/null; then
    bad "kexd logs are free of sanitizer reports and crashes"
    grep -iE -B2 -A20 "$pat" "$tmp"/kexd*.log | head -80
  else
    ok "kexd logs are free of sanitizer reports and crashes"
  fi
}

# run_py SCRIPT [VAR=VALUE...]: run tests/integration/SCRIPT with the Debian python and
# the given environment (KEX_STUBS=$tmp is always set), show its lines, and add its
# closing "N passed, N failed" to the counts (a missing closing line is one failure).
run_py() {
  local script=$1 last
  shift
  env KEX_STUBS="$tmp" "$@" $PY "tests/integration/$script" | tee "$tmp/py.out"
  last=$(tail -n 1 "$tmp/py.out")
  if [[ "$last" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    passed=$((passed + BASH_REMATCH[1]))
    failed=$((failed + BASH_REMATCH[2]))
  else
    bad "$script printed its closing line (got: $last)"
  fi
}
