#!/usr/bin/env bash
# bench/gpu.sh - kex on a GPU machine: its device tests and kernel benchmarks,
# with tinygrad 0.9.0 timed beside them, in one script that works the first
# time it meets the machine.
#
#   bench/gpu.sh pack [DIR]   here, on Debian 12 after the README's setup: build
#                             kex and put what the GPU machine needs in
#                             DIR/kex-gpu.tar.gz (DIR defaults to .gpu, which
#                             git ignores)
#   bench/gpu.sh run [DIR [OUT]]  on the GPU machine: unpack DIR's bundle, find the
#                             machine's OpenCL driver, run the opencl device
#                             tests, bench_kernels, bench_beam and tinygrad on
#                             the same graphs, and write gpu.json (into $OUT
#                             when set, else bench/results/) with a log beside it
#   bench/gpu.sh selftest     pack, then run against this machine's OpenCL
#                             (PoCL) in quick mode, into a temporary folder
#
# A GPU machine is bare and offline: no meson, no gRPC, maybe another
# distribution.  So nothing is built there.  The bundle holds kex's binaries,
# every shared library they load (Debian 12's, glibc and its loader included),
# the cases, the bench graphs and the tinygrad anchor.  pack sets each
# binary's ELF interpreter to the bundled loader at the fixed path the bundle
# is unpacked to ($bundle below) and its RPATH to the bundled libraries
# (patchelf), so the machine's own distribution does not matter, and a
# binary that re-executes itself (/proc/self/exe: the opencl device's build
# helpers) starts the same way.  Only the OpenCL driver is the machine's:
# OCL_ICD_VENDORS when set, else the first libnvidia-opencl.so.1 found in the
# driver's folders, else the machine's /etc/OpenCL/vendors.
#
# With the device tool: command "bench/gpu.sh run .gpu", carry [".gpu"],
# timeout_s 540 (after `bench/gpu.sh pack` here).  Each step has a time limit
# and the whole run a deadline (KEX_GPU_DEADLINE, 480 s), so a step that
# hangs on a new driver still leaves gpu.json with what finished.
#
# Environment: KEX_BUILD_DIR (pack: the build folder, default build),
# KEX_GPU_QUICK=1 (smaller runs), KEX_GPU_PYTHON (tinygrad's python, default
# python3), KEX_GPU_DEADLINE (seconds), KEX_GPU_DRIVER_DIRS (the folders
# searched for libnvidia-opencl.so.1; tests/integration/test_gpu_script.sh
# points it at a stand-in).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
shared=${KEX_SHARED_DIR:-$root/../shared}
bundle=/tmp/kex-gpu # where run unpacks the bundle: the binaries' interpreter path
bins=(bench_kernels bench_beam kex tests/test_devices tests/test_run tests/test_ops)

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# pack DIR: build the binaries and write DIR/kex-gpu.tar.gz.
pack() {
  local dir=${1:-$root/.gpu} build=${KEX_BUILD_DIR:-$root/build}
  [ -f "$build/build.ninja" ] || { "$root/scripts/setup.sh" && "$root/scripts/configure.sh" "$build"; }
  ninja -C "$build" "${bins[@]}" >/dev/null
  local stage
  stage=$(mktemp -d)
  mkdir -p "$stage/kex/bin" "$stage/kex/lib" "$dir"
  command -v patchelf >/dev/null || "$root/scripts/setup.sh" --test
  local b
  for b in "${bins[@]}"; do
    strip --strip-debug -o "$stage/kex/bin/$(basename "$b")" "$build/$b"
    patchelf --set-interpreter "$bundle/kex/lib/ld.so" --force-rpath --set-rpath '$ORIGIN/../lib' \
      "$stage/kex/bin/$(basename "$b")"
  done
  # Every library the binaries load, by the path ldd resolves (ocl-icd's
  # libOpenCL.so.1 among them), and the loader itself.
  ldd "${bins[@]/#/$build/}" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}' | sort -u |
    while read -r lib; do cp -L "$lib" "$stage/kex/lib/"; done
  cp -L "$(ldd "$build/kex" | awk '$1 ~ /^\/.*ld-linux/ {print $1}')" "$stage/kex/lib/ld.so"
  cp -r "$shared/cases" "$shared/bench-graphs" "$shared/anchors" "$stage/kex/"
  cp "$root/bench/gpu_tinygrad.py" "$stage/kex/"
  git -C "$root" rev-parse HEAD >"$stage/kex/COMMIT" 2>/dev/null || echo unknown >"$stage/kex/COMMIT"
  tar -C "$stage" -czf "$dir/kex-gpu.tar.gz" kex
  echo "gpu.sh: $dir/kex-gpu.tar.gz ($(du -h "$dir/kex-gpu.tar.gz" | cut -f1), kex $(cut -c1-12 "$stage/kex/COMMIT"))"
  rm -rf "$stage"
}

# The vendors folder for the ICD loader: OCL_ICD_VENDORS, else NVIDIA's
# library from the driver's folders, else the system's; empty when none.
find_vendors() {
  local work=$1 lib d
  if [ -n "${OCL_ICD_VENDORS:-}" ]; then echo "$OCL_ICD_VENDORS"; return; fi
  for d in ${KEX_GPU_DRIVER_DIRS:-/usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64 \
    /usr/lib /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib}; do
    for lib in "$d"/libnvidia-opencl.so.1 "$d"/libnvidia-opencl.so.*; do
      if [ -f "$lib" ]; then
        mkdir -p "$work/vendors"
        echo "$lib" >"$work/vendors/nvidia.icd"
        echo "$work/vendors"
        return
      fi
    done
  done
  [ -d /etc/OpenCL/vendors ] && echo /etc/OpenCL/vendors
}

# step NAME LIMIT CMD...: run CMD under the smaller of LIMIT and what is left
# of the deadline; its output goes to $work/NAME.log, its time and exit
# status to $work/steps.tsv.  A step never stops the run.
step() {
  local name=$1 limit=$2 left
  shift 2
  left=$((deadline - SECONDS))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 5 ]; then
    printf '%s\t%s\t%s\n' "$name" skipped 0 >>"$work/steps.tsv"
    echo "gpu.sh: $name skipped: the deadline is reached"
    return 0
  fi
  local t0=$SECONDS rc=0
  echo "gpu.sh: $name (limit ${limit}s)"
  timeout -k 5 "$limit" "$@" >"$work/$name.log" 2>&1 || rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" $((SECONDS - t0)) >>"$work/steps.tsv"
  tail -n 3 "$work/$name.log" | cut -c1-300 | sed "s/^/  $name: /"
}

run() {
  local dir=${1:-$root/.gpu} out=${2:-${OUT:-$root/bench/results}} quick=${KEX_GPU_QUICK:-0}
  deadline=$((SECONDS + ${KEX_GPU_DEADLINE:-480}))
  work=$(mktemp -d)
  mkdir -p "$out"
  rm -rf "$bundle"
  mkdir -p "$bundle"
  tar -C "$bundle" -xzf "$dir/kex-gpu.tar.gz"
  local k=$bundle/kex vendors
  vendors=$(find_vendors "$work")
  [ -n "$vendors" ] || { echo "gpu.sh: no OpenCL driver found (set OCL_ICD_VENDORS)" >&2; exit 1; }
  export OCL_ICD_VENDORS=$vendors
  # The driver's own libraries (libcuda beside libnvidia-opencl) are found
  # through LD_LIBRARY_PATH; the bundle's come first (RPATH wins over it).
  local libpath="" icd
  for icd in "$vendors"/*.icd; do
    case $(cat "$icd") in /*) libpath=$libpath:$(dirname "$(cat "$icd")") ;; esac
  done
  [ -d /usr/local/nvidia/lib64 ] && libpath=$libpath:/usr/local/nvidia/lib64
  export LD_LIBRARY_PATH=${libpath#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export KEX_CASES_DIR=$k/cases KEX_BENCH_GRAPHS_DIR=$k/bench-graphs KEX_TEST_DEVICES=opencl
  export TMPDIR=$work POCL_CACHE_DIR=$work/pocl-cache
  echo "gpu.sh: OpenCL vendors $vendors: $(cat "$vendors"/*.icd | tr '\n' ' ')"
  : >"$work/steps.tsv"
  local sample=1 repeat=20 beam_args=() tg_repeat=20 only=()
  if [ "$quick" = 1 ]; then
    sample=48 repeat=3 tg_repeat=3 only=(--only matmul512) beam_args=(--only matmul512 --max-candidates 4 --max-rounds 1)
  fi
  step doctor 30 "$k/bin/kex" doctor --json
  step test_devices 60 "$k/bin/test_devices"
  step test_run 150 env KEX_TEST_SAMPLE=$sample "$k/bin/test_run"
  step test_ops 150 env KEX_TEST_SAMPLE=$sample "$k/bin/test_ops"
  step bench_kernels 90 "$k/bin/bench_kernels" --device opencl --repeat $repeat \
    --out "$work/kernels.json" "${only[@]}"
  step bench_beam 150 "$k/bin/bench_beam" --device opencl --out "$work/beam.json" "${beam_args[@]}"
  local py=${KEX_GPU_PYTHON:-python3} tg=(--anchors "$k/anchors" --graphs "$k/bench-graphs" --repeat $tg_repeat "${only[@]}")
  export KEX_GPU_LIBOPENCL=$k/lib/libOpenCL.so.1
  step tinygrad_beam0 60 env GPU=1 BEAM=0 "$py" "$k/gpu_tinygrad.py" "${tg[@]}"
  [ "$quick" = 1 ] || step tinygrad_beam2 120 env GPU=1 BEAM=2 "$py" "$k/gpu_tinygrad.py" "${tg[@]}"
  local nv=""
  command -v nvidia-smi >/dev/null && nv=$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
    --format=csv,noheader 2>/dev/null || true)
  "$py" - "$work" "$out" "$nv" "$quick" "$k/COMMIT" <<'PY'
import json, os, re, sys, platform
work, out, nv, quick, commit_file = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5]
def text(name):
  try: return open(os.path.join(work, name), errors="replace").read()
  except OSError: return ""
def js(name, last_line=False):
  t = text(name).strip()
  if last_line: t = t.splitlines()[-1] if t else ""
  try: return json.loads(t)
  except ValueError: return None
steps = {}
for line in text("steps.tsv").splitlines():
  name, rc, secs = line.split("\t")
  steps[name] = {"rc": rc, "seconds": int(secs)}
tests = {}
for name in ("test_devices", "test_run", "test_ops"):
  log = text(name + ".log")
  count = lambda tag: sum(int(m) for m in re.findall(r"\[  %s  \] (\d+) test" % tag, log))
  tests[name] = dict(steps.get(name, {}), passed=count("PASSED"), failed=count("FAILED"),
                     skipped=len(re.findall(r"^\[  SKIPPED \]", log, re.M)))
kernels, beam = js("kernels.json"), js("beam.json")
tg = {b: js("tinygrad_beam%d.log" % b, last_line=True) for b in (0, 2)}
def tg_us(b, graph):
  for row in (tg[b] or {}).get("graphs", []):
    if row.get("graph") == graph and "us" in row: return row["us"]
side = []
for row in (kernels or {}).get("results", []):
  if row.get("device") != "opencl": continue
  t = tg_us(0, row["graph"])
  side.append({"graph": row["graph"], "kex_hand_us": row.get("kex_us"), "tinygrad_beam0_us": t,
               "speedup_vs_tinygrad": t / row["kex_us"] if t and row.get("kex_us") else None})
for row in (beam or {}).get("results", []):
  if row.get("device") != "opencl": continue
  t = tg_us(2, row["graph"])
  side.append({"graph": row["graph"], "kex_beam2_us": row.get("beam_us"), "tinygrad_beam2_us": t,
               "kex_search_s": row.get("search_s"),
               "tinygrad_search_s": (steps.get("tinygrad_beam2") or {}).get("seconds"),
               "speedup_vs_tinygrad": t / row["beam_us"] if t and row.get("beam_us") else None})
doctor = js("doctor.log")
result = {
  "bench": "gpu", "quick": quick, "kex_commit": open(commit_file).read().strip(),
  "machine": {"uname": " ".join(platform.uname()), "cpus": os.cpu_count(),
              "loadavg": open("/proc/loadavg").read().split()[:3], "nvidia_smi": nv or None},
  "opencl_vendors": os.environ.get("OCL_ICD_VENDORS"),
  "opencl_icd": {f: open(os.path.join(os.environ["OCL_ICD_VENDORS"], f)).read().strip()
                 for f in sorted(os.listdir(os.environ["OCL_ICD_VENDORS"])) if f.endswith(".icd")},
  "doctor": doctor, "steps": steps, "tests": tests, "side_by_side": side,
  "kernels": kernels, "beam": beam, "tinygrad": {"beam0": tg[0], "beam2": tg[2]},
  "notes": "kex binaries and libraries from bench/gpu.sh pack (Debian 12), started through the bundled loader; "
           "the OpenCL driver is the machine's. Kernel times are OpenCL profiling-event medians on both sides; "
           "tinygrad 0.9.0 runs the same graphs with GPU=1 (BEAM=0 hand-coded opts, BEAM=2 its beam search) in the same run.",
}
with open(os.path.join(out, "gpu.json"), "w") as f: json.dump(result, f, indent=1)
failed = [n for n, t in tests.items() if t.get("failed") or t.get("rc") not in ("0", None)]
print("gpu.sh: %s/gpu.json: tests %s; %d side-by-side rows%s" % (out,
      ", ".join("%s %d passed %d failed" % (n, t["passed"], t["failed"]) for n, t in tests.items()), len(side),
      "; FAILED: " + " ".join(failed) if failed else ""))
PY
  # The log: each step's failures with the lines before them, then its end.
  for f in "$work"/*.log; do
    echo "=== $(basename "$f")"
    grep -B 12 -A 2 '^\[  ERROR   \]\|^\[  FAILED  \] [a-z]' "$f" | head -n 200 || true
    echo "--- last lines"
    tail -n 40 "$f"
  done >"$out/gpu-log.txt"
  rm -rf "$work" "$bundle"
}

case ${1:-} in
  pack) pack "${2:-}" ;;
  run) run "${2:-}" "${3:-}" ;;
  selftest)
    t=$(mktemp -d)
    pack "$t"
    KEX_GPU_QUICK=1 KEX_GPU_PYTHON=${KEX_GPU_PYTHON:-/usr/bin/python3} run "$t" "$t/out"
    python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(json.dumps(j['tests']))" "$t/out/gpu.json"
    echo "gpu.sh selftest: $t/out/gpu.json"
    ;;
  *) usage ;;
esac
