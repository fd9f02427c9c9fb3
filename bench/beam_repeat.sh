#!/bin/bash
# bench/beam_repeat.sh [RUNS] [busy] - the six beam repeatability checks, RUNS times in a row (default 5).
#
# Each run is build/tests/test_beam with KEX_TEST_BEAM_REPEATABLE=1 and
# KEX_TEST_FILTER='repeatable_*' (6 kernels x 2 fresh searches, about 80 s),
# at KEX_LOG=debug, its log kept under $KEX_REPEAT_LOGS (default: a new
# temporary folder, printed), so a flip can be read back decision by
# decision.  With "busy", `taskset -c 1 yes` keeps one core busy throughout.
# One line per run (the checks that failed, or ok, and the load average),
# then "N of RUNS passed".  bench/results/beam-repeatable.md quotes it.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5} busy=${2:-}
logs=${KEX_REPEAT_LOGS:-$(mktemp -d /tmp/kex_beam_repeat.XXXXXX)}
mkdir -p "$logs"
echo "logs in $logs"
yp=
if [ "$busy" = busy ]; then
  taskset -c 1 yes >/dev/null &
  yp=$!
  trap 'kill $yp 2>/dev/null' EXIT
fi
pass=0
for i in $(seq "$runs"); do
  log=$logs/run$i.log
  KEX_LOG=debug KEX_TEST_BEAM_REPEATABLE=1 KEX_TEST_FILTER='repeatable_*' build/tests/test_beam >"$log" 2>&1
  failed=$(grep -E '^\[  FAILED  \] repeatable' "$log" | sort -u | sed 's/.*repeatable_//' | tr '\n' ' ')
  if ! grep -q '^\[  PASSED  \] 6 test' "$log" && [ -z "$failed" ]; then failed="(did not run: see $log)"; fi
  [ -z "$failed" ] && pass=$((pass + 1))
  echo "run $i: ${failed:-ok} (load $(cut -d' ' -f1 /proc/loadavg))"
done
echo "$pass of $runs passed${busy:+ (one core busy)}"
