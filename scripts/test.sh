#!/usr/bin/env bash
# test.sh - THE test command: every test kex has, one summary, one closing line.
#
#  1. scripts/setup.sh --test (installs missing Debian packages, clang-15 for libFuzzer too).
#  2. build/ (normal) and build-asan/ (-Dsanitize=true: ASan + UBSan), each
#     configured (or reconfigured) and built with `ninja -k 0`.
#  3. meson test -C build (every suite); meson test -C build-asan --suite unit;
#     When a build fails, the tests whose executables are up to date still run;
#     the others count as failed ("did not build"), never as stale passes.
#  4. every tests/integration/*.sh (each prints its own "N passed, N failed"),
#     test_hostile.sh, test_faults.sh and test_tenants.sh once more with build-asan's kexd, pytest on
#     client/python/tests with /usr/bin/python3 (the Debian python, which has
#     grpc and numpy), and tests/fuzz/libfuzzer.sh (build-fuzz: clang,
#     libFuzzer, its suite fuzz) -- as jobs on two workers, longest first (KEX_TEST_LANES=1: in turn).
#  5. scripts/summarize.py: a per-suite table, then as the very last line
#     "N passed, N failed".  Exits non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
exec 2>&1 # one stream, so the closing line really is last
export KEX_SOURCE_ROOT=$PWD
export KEX_METRICS=off # kexds started by tests serve no metrics (the default port is one for all); test_metrics asks
export GRPC_ENABLE_FORK_SUPPORT=0 # pytest too: see tests/integration/lib.bash

summary_args=()
fail() { summary_args+=(--fail "$1" "$2"); echo "FAILED: $1 ($2)"; }
skip() { summary_args+=(--skip "$1" "$2"); echo "skipped: $1 ($2)"; }

if ! scripts/setup.sh --test; then
  fail "setup" "scripts/setup.sh failed"
fi

# Names of the tests in build dir $1 (optionally only suite $2) whose
# executable ninja considers up to date, as "ok NAME" or "stale NAME".
test_freshness() {
  meson introspect "$1" --tests | /usr/bin/python3 -c '
import json, os, subprocess, sys
build, suite = sys.argv[1], sys.argv[2]
for t in json.load(sys.stdin):
    if suite and not any(s.split(":")[-1] == suite for s in t["suite"]):
        continue
    exe = os.path.relpath(t["cmd"][0], build)
    out = subprocess.run(["ninja", "-C", build, "-n", exe], capture_output=True, text=True).stdout
    print(("ok " if "no work to do" in out else "stale ") + t["name"])
' "$1" "${2:-}"
}

# meson names a wrapped run's log after the wrapper (testlog-lsan_retry.sh.json): give it the name summarize.py reads.
wrapped_log() {
  local d=$1/meson-logs
  if [ -f "$d/testlog-lsan_retry.sh.json" ]; then mv -f "$d/testlog-lsan_retry.sh.json" "$d/testlog.json"; fi
}

# build_and_test DIR SUITE [MESON_OPTION...]: configure, build, run the tests (a -Dsanitize=true build's under
# scripts/lsan_retry.sh: a LeakSanitizer that fails itself on a loaded machine gets one more run).
build_and_test() {
  local dir=$1 suite=$2
  shift 2
  local suite_args=()
  [ -n "$suite" ] && suite_args=(--suite "$suite")
  local wrap_args=()
  case " $* " in *" -Dsanitize=true "*) wrap_args=(--wrapper "$PWD/scripts/lsan_retry.sh") ;; esac
  mkdir -p "$dir"
  rm -f "$dir/meson-logs/testlog.json" "$dir/meson-logs/testlog-lsan_retry.sh.json"
  echo "== $dir: configure =="
  if ! scripts/configure.sh "$dir" "$@" >"$dir/configure-output.txt" 2>&1; then
    tail -n 30 "$dir/configure-output.txt"
    fail "$dir: configure" "meson setup failed, see $dir/configure-output.txt"
    return
  fi
  echo "== $dir: build =="
  if ninja -C "$dir" -k 0 >"$dir/build-output.txt" 2>&1; then
    echo "== $dir: meson test${suite:+ --suite $suite} =="
    meson test -C "$dir" --no-rebuild --print-errorlogs "${wrap_args[@]}" "${suite_args[@]}"
    wrapped_log "$dir"
    summary_args+=(--meson "$dir")
    return
  fi
  grep -E -A12 '^FAILED:' "$dir/build-output.txt" | head -n 80
  fail "$dir: build" "compile errors, see $dir/build-output.txt"
  local fresh=() state name
  while read -r state name; do
    if [ "$state" = ok ]; then
      fresh+=("$name")
    else
      fail "$dir: $name" "did not build"
    fi
  done < <(test_freshness "$dir" "$suite")
  if [ ${#fresh[@]} -gt 0 ]; then
    echo "== $dir: meson test (the ${#fresh[@]} tests that built) =="
    meson test -C "$dir" --no-rebuild --print-errorlogs "${wrap_args[@]}" "${fresh[@]}"
    wrapped_log "$dir"
    summary_args+=(--meson "$dir")
  fi
}

build_and_test build ""
build_and_test build-asan unit -Dsanitize=true

shopt -s nullglob
scripts_found=(tests/integration/*.sh)
shopt -u nullglob
if [ ${#scripts_found[@]} -eq 0 ]; then
  skip "integration tests" "no tests/integration/*.sh yet"
fi
# The integration scripts, the build-asan reruns, pytest and the libFuzzer runs are jobs on two workers at once
# (KEX_TEST_LANES=N: N workers; 1: one after another): much of their time is waiting on kexd processes, sockets
# and timeouts.  The jobs are queued longest first by the seconds each took on a fresh 2-vCPU machine (its
# PoCL kernel cache empty), and each worker takes the next one when its last ends, so the two finish close
# together whatever the machine (the fixed split into two lanes it replaces had 393 s of jobs in one lane and
# 308 s in the other there).  Each job writes its own log; a line says when each ends, and the logs are printed
# whole, in a fixed order, once all are done.
mkdir -p build/integration-logs
rm -f build-fuzz/meson-logs/testlog.json build/pytest-junit.xml

# run_one NAME LOG CMD...: run a test command with its output in LOG and its exit status in LOG.rc
run_one() {
  local name=$1 log=$2 t0=$SECONDS
  shift 2
  # a hung script fails (124) instead of holding the run: none takes more than 3 minutes here
  timeout --kill-after=10 "${KEX_SCRIPT_TIMEOUT:-600}" "$@" >"$log" 2>&1
  local rc=$?
  [ "$rc" = 124 ] && echo "FAILED: $name did not finish in ${KEX_SCRIPT_TIMEOUT:-600} s" >>"$log"
  echo "$rc" >"$log.rc"
  echo "-- done: $name (exit $rc, $((SECONDS - t0)) s): $(tail -n 1 "$log")"
}
# run_job JOB: one queued job (a tests/integration script path, or a name below)
run_job() {
  case $1 in
    libfuzzer) # the fuzz targets as libFuzzer binaries (clang), a few seconds each; skipped without a suitable clang
      run_one "tests/fuzz/libfuzzer.sh" build/integration-logs/libfuzzer.log bash tests/fuzz/libfuzzer.sh build-fuzz ;;
    faults-asan) # the fault sweep and kill -9 rounds again with build-asan's kexd: nothing leaks on any failure path
      run_one "tests/integration/test_faults.sh (build-asan)" build/integration-logs/test_faults-asan.log \
        env KEX_BUILD_DIR="$PWD/build-asan" bash tests/integration/test_faults.sh ;;
    hostile-asan) # the hostile inputs again under ASan+UBSan (the kexd of build-asan)
      run_one "tests/integration/test_hostile.sh (build-asan)" build/integration-logs/test_hostile-asan.log \
        env KEX_BUILD_DIR="$PWD/build-asan" bash tests/integration/test_hostile.sh ;;
    tenants-asan) # a hostile co-tenant's checks again under ASan+UBSan
      run_one "tests/integration/test_tenants.sh (build-asan)" build/integration-logs/test_tenants-asan.log \
        env KEX_BUILD_DIR="$PWD/build-asan" bash tests/integration/test_tenants.sh ;;
    pytest)
      run_one "pytest client/python/tests" build/integration-logs/pytest.log \
        env KEX_BUILD_DIR="$PWD/build" /usr/bin/python3 -m pytest -q client/python/tests --junitxml=build/pytest-junit.xml ;;
    *) run_one "$1" "build/integration-logs/$(basename "$1" .sh).log" env KEX_BUILD_DIR="$PWD/build" bash "$1" ;;
  esac
}
# job_seconds JOB: what it took on the fresh machine (tests/integration/test_*.sh by name); a new script counts 30
job_seconds() {
  case $(basename "$1" .sh) in
    pytest) echo 104 ;; test_submit) echo 99 ;; test_sources) echo 79 ;; libfuzzer) echo 77 ;; test_tune) echo 57 ;;
    test_gpu_script) echo 44 ;; test_cli) echo 35 ;; test_faults | faults-asan) echo 24 ;; hostile-asan) echo 23 ;;
    test_auth | test_hostile) echo 22 ;; test_fairness) echo 20 ;; test_fleet) echo 18 ;; test_jobs) echo 14 ;;
    test_daemon) echo 13 ;; test_fleet_clients) echo 8 ;; test_stress | test_libkex | test_tls) echo 5 ;;
    test_metrics) echo 2 ;; test_trace) echo 1 ;; tenants-asan) echo 45 ;; *) echo 30 ;;
  esac
}
jobs_all=(libfuzzer "${scripts_found[@]}")
[ -x build-asan/daemon/kexd ] && [ -f tests/integration/test_faults.sh ] && jobs_all+=(faults-asan)
[ -x build-asan/daemon/kexd ] && jobs_all+=(hostile-asan)
[ -x build-asan/daemon/kexd ] && [ -f tests/integration/test_tenants.sh ] && jobs_all+=(tenants-asan)
[ -d client/python/tests ] && jobs_all+=(pytest)
queue=build/integration-logs/queue
for job in "${jobs_all[@]}"; do echo "$(job_seconds "$job") $job"; done | sort -k1,1nr -k2,2 | cut -d' ' -f2- >"$queue"
echo 0 >"$queue.next"
# next_job: the queue's next line (under a lock: the workers share it), or nothing when it is empty
next_job() {
  (
    flock 9
    local n
    n=$(cat "$queue.next")
    echo $((n + 1)) >"$queue.next"
    sed -n "$((n + 1))p" "$queue"
  ) 9>"$queue.lock"
}
run_worker() {
  local job
  while job=$(next_job) && [ -n "$job" ]; do run_job "$job"; done
}
lanes=${KEX_TEST_LANES:-2}
echo "== integration scripts, pytest and libFuzzer ($lanes workers, longest first) =="
worker_pids=()
for ((w = 1; w < lanes; w++)); do
  run_worker &
  worker_pids+=($!)
done
run_worker
[ ${#worker_pids[@]} -gt 0 ] && wait "${worker_pids[@]}"
for script in "${scripts_found[@]}"; do
  log="build/integration-logs/$(basename "$script" .sh).log"
  echo "== $script =="
  cat "$log"
  summary_args+=(--script "$script" "$log" "$(cat "$log.rc" 2>/dev/null || echo 1)")
done
echo "== tests/fuzz/libfuzzer.sh (build-fuzz) =="
cat build/integration-logs/libfuzzer.log
case $(cat build/integration-logs/libfuzzer.log.rc 2>/dev/null || echo 2) in
  0 | 1) summary_args+=(--meson build-fuzz) ;;
  77) skip "libFuzzer runs (build-fuzz)" "$(grep -m1 '^skipped:' build/integration-logs/libfuzzer.log | sed 's/^skipped: //')" ;;
  *) fail "build-fuzz" "did not configure or build (clang, -Dfuzzer=true)" ;;
esac
log=build/integration-logs/test_hostile-asan.log
if [ -x build-asan/daemon/kexd ]; then
  echo "== tests/integration/test_hostile.sh (build-asan) =="
  cat "$log"
  summary_args+=(--script "tests/integration/test_hostile.sh (build-asan)" "$log" "$(cat "$log.rc" 2>/dev/null || echo 1)")
else
  fail "tests/integration/test_hostile.sh (build-asan)" "build-asan/daemon/kexd did not build"
fi
log=build/integration-logs/test_faults-asan.log
if [ -x build-asan/daemon/kexd ] && [ -f tests/integration/test_faults.sh ]; then
  echo "== tests/integration/test_faults.sh (build-asan) =="
  cat "$log"
  summary_args+=(--script "tests/integration/test_faults.sh (build-asan)" "$log" "$(cat "$log.rc" 2>/dev/null || echo 1)")
fi
log=build/integration-logs/test_tenants-asan.log
if [ -x build-asan/daemon/kexd ] && [ -f tests/integration/test_tenants.sh ]; then
  echo "== tests/integration/test_tenants.sh (build-asan) =="
  cat "$log"
  summary_args+=(--script "tests/integration/test_tenants.sh (build-asan)" "$log" "$(cat "$log.rc" 2>/dev/null || echo 1)")
fi
if [ -d client/python/tests ]; then
  echo "== pytest client/python/tests =="
  cat build/integration-logs/pytest.log
  summary_args+=(--junit "pytest client/python/tests" build/pytest-junit.xml "$(cat build/integration-logs/pytest.log.rc 2>/dev/null || echo 1)")
else
  skip "pytest client/python/tests" "client/python/tests does not exist yet"
fi

/usr/bin/python3 scripts/summarize.py "${summary_args[@]}"
