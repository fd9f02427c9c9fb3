#!/bin/bash
# bench/cpu_busy.sh - the cpu device's microsecond kernels on a quiet machine
# and with one core kept busy by another process, side by side for two builds.
#
#   bench/cpu_busy.sh [BEFORE_BUILD_DIR] AFTER_BUILD_DIR [REPEAT]
#
# The graphs are the bench graphs shrunk to the sizes of the beam search's
# repeatability tests (sum and multiply-add of 64K floats, a 64x64 matmul),
# written to a temporary folder under the file names bench_kernels knows
# (sum4M.json, muladd4M.json, softmax4096x1024.json: the matmul's numbers go
# unchecked under that name).  "busy" runs `yes` pinned to the last CPU.  Each
# condition runs both builds twice, interleaved; the medians (µs, hand-coded
# opts, `repeat` device-timed runs each) print one line per build and run,
# with the load average.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -ge 2 ]; then before=$1; after=$2; else before=""; after=${1:-$here/build}; fi
repeat=${3:-300}
src=${KEX_BENCH_GRAPHS_DIR:-$here/../shared/bench-graphs}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"; [ -n "${yes_pid:-}" ] && kill "$yes_pid" 2>/dev/null || true' EXIT
/usr/bin/python3 - "$src" "$tmp" <<'PY'
import json, sys
src, out = sys.argv[1], sys.argv[2]
def shrink(name, target, subs):
    s = open(f"{src}/{name}").read()
    for a, b in subs: s = s.replace(a, b)
    json.loads(s)
    open(f"{out}/{target}", "w").write(s)
shrink("sum4M.json", "sum4M.json", [("4194304", "65536"), ("4*1024*1024", "64*1024")])
shrink("muladd4M.json", "muladd4M.json", [("4194304", "65536"), ("4*1024*1024", "64*1024")])
shrink("matmul512.json", "softmax4096x1024.json", [("512", "64")])
PY
last=$(( $(nproc) - 1 ))
for cond in quiet busy; do
  if [ "$cond" = busy ]; then taskset -c "$last" yes >/dev/null & yes_pid=$!; sleep 0.5; fi
  for run in 1 2; do
    for side in before after; do
      dir=${!side}; [ -n "$dir" ] || continue
      "$dir/bench_kernels" --graphs "$tmp" --device cpu --repeat "$repeat" --out "$tmp/$side.json" >/dev/null 2>&1
      /usr/bin/python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
names = {"sum4M": "sum64K", "muladd4M": "muladd64K", "softmax4096x1024": "matmul64"}
print("%-5s %-6s run %s  load %-16s %s" % (sys.argv[2], sys.argv[3], sys.argv[4], open("/proc/loadavg").read().split(" ")[0],
      "  ".join("%s %.1f" % (names[r["graph"]], r["kex_us"]) for r in d["results"] if "kex_us" in r)))' \
        "$tmp/$side.json" "$cond" "$side" "$run"
    done
  done
  if [ "$cond" = busy ]; then kill "$yes_pid"; wait "$yes_pid" 2>/dev/null || true; yes_pid=""; fi
done
