#!/usr/bin/env bash
# test_gpu_script.sh - bench/gpu.sh works the first time it meets a GPU machine: its bundle is built from
# this build, unpacked and run the way the device tool runs it (quick mode), against this machine's PoCL
# standing in for NVIDIA's driver.  The stand-in is a folder holding PoCL's ICD library under the name
# libnvidia-opencl.so.1 (in a mirror of PoCL's folders) in KEX_GPU_DRIVER_DIRS, with OCL_ICD_VENDORS unset, so the driver search, the
# vendors file it writes, the bundled loader and RPATH, the device tests, both benchmarks, tinygrad beside
# them and gpu.json are the ones a GPU machine gets.
#
# Env: KEX_BUILD_DIR (default build).  Last line "N passed, N failed".
. "$(dirname "$0")/lib.bash"

if bench/gpu.sh >/dev/null 2>&1; then bad "gpu.sh without a command exits non-zero"; else ok "gpu.sh without a command exits non-zero"; fi

if KEX_BUILD_DIR="$build" bench/gpu.sh pack "$tmp/gpu" >"$tmp/pack.log" 2>&1; then
  ok "gpu.sh pack builds the bundle"
else
  bad "gpu.sh pack builds the bundle"; cat "$tmp/pack.log"; finish
fi
size=$(stat -c %s "$tmp/gpu/kex-gpu.tar.gz")
# the device tool carries at most 64 MiB with the working tree
if [ "$size" -lt $((48 * 1024 * 1024)) ]; then ok "bundle fits the device tool's carry ($size bytes)"; else bad "bundle is $size bytes"; fi
mkdir "$tmp/bundle"
tar -C "$tmp/bundle" -xzf "$tmp/gpu/kex-gpu.tar.gz"
interp=$(patchelf --print-interpreter "$tmp/bundle/kex/bin/test_run")
[ "$interp" = /tmp/kex-gpu/kex/lib/ld.so ] && ok "binaries start through the bundled loader" || bad "interpreter is $interp"
[ -f "$tmp/bundle/kex/lib/libOpenCL.so.1" ] && [ -f "$tmp/bundle/kex/lib/libc.so.6" ] &&
  [ -f "$tmp/bundle/kex/cases/INDEX.json" ] && [ -f "$tmp/bundle/kex/anchors/replay_graph.py" ] &&
  ok "bundle holds the ICD loader, glibc, the cases and the tinygrad anchor" || bad "bundle contents"

# the stand-in driver folder
pocl=$(sed -n 1p /etc/OpenCL/vendors/pocl.icd)
# a bare file name (Debian's pocl.icd): the folder the loader finds PoCL in
case "$pocl" in /*) ;; *) pocl=$(dirname "$(ldconfig -p | awk '/libpocl/ {print $NF; exit}')")/$pocl ;; esac
# PoCL finds its device drivers (pocl/ beside it) and headers (../../share/pocl) from the path it was
# opened by: the stand-in mirrors that layout
pocl_dir=$(dirname "$(readlink -f "$pocl")")
driver=$tmp/usr/lib/driver
mkdir -p "$driver" "$tmp/usr/share"
ln -s "$pocl" "$driver/libnvidia-opencl.so.1"
ln -s "$pocl_dir/pocl" "$driver/pocl"
ln -s "$(readlink -f "$pocl_dir/../../share/pocl")" "$tmp/usr/share/pocl"

if env -u OCL_ICD_VENDORS KEX_GPU_QUICK=1 KEX_GPU_PYTHON=$PY KEX_GPU_DRIVER_DIRS="$driver" \
  bench/gpu.sh run "$tmp/gpu" "$tmp/out" >"$tmp/run.log" 2>&1; then
  ok "gpu.sh run exits 0"
else
  bad "gpu.sh run exits 0"
fi
cat "$tmp/run.log"
[ -f "$tmp/out/gpu-log.txt" ] && ok "gpu-log.txt written" || bad "gpu-log.txt written"
$PY - "$tmp/out/gpu.json" >"$tmp/check.out" 2>&1 <<'PY'
import json, os, sys
j = json.load(open(sys.argv[1]))
def check(cond, what): print(("ok - " if cond else "FAIL - ") + what)
vend = j.get("opencl_vendors") or ""
icd = j.get("opencl_icd", {}).get("nvidia.icd", "") if os.path.basename(vend) == "vendors" else ""
check(icd.endswith("/driver/libnvidia-opencl.so.1"), "the driver search found the stand-in and wrote its vendors file")
devs = [d for p in (j.get("doctor") or {}).get("platforms", []) for d in p.get("devices", [])]
check(len(devs) >= 1, "kex doctor saw the stand-in driver's device (%d)" % len(devs))
for name in ("test_devices", "test_run", "test_ops"):
  t = j["tests"].get(name, {})
  check(t.get("rc") == "0" and t.get("passed", 0) > 0 and t.get("failed") == 0,
        "%s ran on the bundle: %s" % (name, json.dumps(t)))
check(j["tests"]["test_run"]["skipped"] > 0, "KEX_TEST_DEVICES=opencl left the cpu entries out")
rows = j.get("side_by_side", [])
hand = [r for r in rows if r.get("kex_hand_us") and r.get("tinygrad_beam0_us")]
check(len(hand) >= 1, "hand-coded kernels timed beside tinygrad BEAM=0: %s" % json.dumps(hand))
beam = [r for r in rows if r.get("kex_beam2_us")]
check(len(beam) >= 1 and beam[0]["kex_search_s"] > 0, "beam search timed: %s" % json.dumps(beam))
check(any(r.get("output_checked") is True for r in (j.get("kernels") or {}).get("results", [])),
      "bench_kernels checked its output against OpenBLAS")
check(len(j.get("kex_commit", "")) == 40, "gpu.json names the commit")
PY
while read -r line; do
  case "$line" in "ok - "*) ok "${line#ok - }" ;; "FAIL - "*) bad "${line#FAIL - }" ;; *) bad "gpu.json check: $line" ;; esac
done <"$tmp/check.out"
[ -e /tmp/kex-gpu ] && bad "the unpacked bundle is removed after the run" || ok "the unpacked bundle is removed after the run"
finish
