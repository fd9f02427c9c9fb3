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
#     test_hostile.sh and test_faults.sh once more with build-asan's kexd, pytest on
#     client/python/tests with /usr/bin/python3 (the Debian python, which has
#     grpc and numpy), and tests/fuzz/libfuzzer.sh (build-fuzz: clang,
#     libFuzzer, its suite fuzz) -- in two lanes at once (KEX_TEST_LANES=1: in turn).
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
# The integration scripts and pytest run in two lanes at once (KEX_TEST_LANES=1: one after another): much
# of their time is waiting on kexd processes, sockets and timeouts.  The lanes are balanced by measured time
# (the longest, compile-bound scripts in one lane, everything else in the other).  Each writes its own log; a
# line says when each ends, and the logs are printed whole, in order, once both lanes are done.
mkdir -p build/integration-logs
heavy_scripts=" test_submit test_sources test_stress test_trace test_faults test_tune "
lane_heavy=() lane_light=()
for script in "${scripts_found[@]}"; do
  if [[ "$heavy_scripts" == *" $(basename "$script" .sh) "* ]]; then lane_heavy+=("$script"); else lane_light+=("$script"); fi
done

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
run_lane() { # run_lane SCRIPT...
  local script
  for script in "$@"; do
    run_one "$script" "build/integration-logs/$(basename "$script" .sh).log" env KEX_BUILD_DIR="$PWD/build" bash "$script"
  done
}
run_heavy_lane() {
  run_lane "${lane_heavy[@]}"
  # the fault sweep and kill -9 rounds again with build-asan's kexd: nothing leaks on any failure path
  if [ -x build-asan/daemon/kexd ] && [ -f tests/integration/test_faults.sh ]; then
    run_one "tests/integration/test_faults.sh (build-asan)" build/integration-logs/test_faults-asan.log \
      env KEX_BUILD_DIR="$PWD/build-asan" bash tests/integration/test_faults.sh
  fi
  if [ -d client/python/tests ]; then
    rm -f build/pytest-junit.xml
    run_one "pytest client/python/tests" build/integration-logs/pytest.log \
      env KEX_BUILD_DIR="$PWD/build" /usr/bin/python3 -m pytest -q client/python/tests --junitxml=build/pytest-junit.xml
  fi
}
run_light_lane() {
  # the fuzz targets as libFuzzer binaries (clang), a few seconds each; skipped without a suitable clang.  In
  # this lane: its clang build overlaps the heavy lane's waits instead of adding to the run
  rm -f build-fuzz/meson-logs/testlog.json
  run_one "tests/fuzz/libfuzzer.sh" build/integration-logs/libfuzzer.log bash tests/fuzz/libfuzzer.sh build-fuzz
  run_lane "${lane_light[@]}"
  # the hostile inputs again under ASan+UBSan (the kexd of build-asan)
  if [ -x build-asan/daemon/kexd ]; then
    run_one "tests/integration/test_hostile.sh (build-asan)" build/integration-logs/test_hostile-asan.log \
      env KEX_BUILD_DIR="$PWD/build-asan" bash tests/integration/test_hostile.sh
  fi
}
echo "== integration scripts and pytest (${KEX_TEST_LANES:-2} lanes) =="
if [ "${KEX_TEST_LANES:-2}" = 1 ]; then
  run_heavy_lane
  run_light_lane
else
  run_heavy_lane &
  heavy_pid=$!
  run_light_lane
  wait "$heavy_pid"
fi
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
if [ -d client/python/tests ]; then
  echo "== pytest client/python/tests =="
  cat build/integration-logs/pytest.log
  summary_args+=(--junit "pytest client/python/tests" build/pytest-junit.xml "$(cat build/integration-logs/pytest.log.rc 2>/dev/null || echo 1)")
else
  skip "pytest client/python/tests" "client/python/tests does not exist yet"
fi

/usr/bin/python3 scripts/summarize.py "${summary_args[@]}"
