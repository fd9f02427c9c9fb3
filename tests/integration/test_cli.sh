#!/usr/bin/env bash
# test_cli.sh - the kex command line, in-process and against a real kexd
# (kex --server ADDR ... / KEX_SERVER): outputs, exit codes and messages.
#
# Starts kexd on a free 127.0.0.1 port and checks: help texts; plan through
# the server prints what the in-process plan prints (minus the kernel
# name/opts notes the Plan reply does not carry) and the same JSON kernel
# counts; devices, stats, job open|close, upload/download of a .npy byte for
# byte; the exit codes 2 (usage, INVALID_ARGUMENT, NOT_FOUND) and 1
# (UNAVAILABLE, UNIMPLEMENTED); run (a skip line while Submit is
# UNIMPLEMENTED, else outputs equal to the in-process run); in-process plan
# and run without --server.
#
# Env: KEX_BUILD_DIR (default build), KEXD (default $KEX_BUILD_DIR/daemon/kexd),
# KEX_CASES_DIR (default ../shared/cases).  Last line: "N passed, N failed".
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
PY=/usr/bin/python3
build=${KEX_BUILD_DIR:-build}
case "$build" in /*) ;; *) build="$root/$build" ;; esac
cases=${KEX_CASES_DIR:-$root/../shared/cases}
kex=$build/kex
kexd=${KEXD:-$build/daemon/kexd}
unset KEX_SERVER KEX_JOB KEX_TOKEN

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

[ -x "$kex" ] || { bad "kex is built ($kex)"; finish; }
[ -x "$kexd" ] || { bad "kexd is built ($kexd)"; finish; }

tmp=$(mktemp -d)
pid=""
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

port=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$kexd" --listen "127.0.0.1:$port" --grace 2 >"$tmp/kexd.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  $PY -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.2)' "$port" 2>/dev/null && break
  sleep 0.1
done
S=(--server "127.0.0.1:$port")

# run CMD...: stdout -> $tmp/out, stderr -> $tmp/err, exit code -> $rc
run() {
  "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
}

# ---- help and usage ----
run "$kex" --help
if [ "$rc" = 0 ] && grep -q -- "--server ADDR" "$tmp/out"; then ok "kex --help exits 0 and mentions --server"; else bad "kex --help exits 0 and mentions --server"; fi
run "$kex" "${S[@]}" help
if [ "$rc" = 0 ] && grep -q "download" "$tmp/out" && grep -q "job open" "$tmp/out"; then ok "kex --server ADDR help lists the server commands"; else bad "kex --server ADDR help lists the server commands"; fi
run "$kex" "${S[@]}" run --help
if [ "$rc" = 0 ] && grep -q -- "--out DIR" "$tmp/out"; then ok "kex --server ADDR run --help exits 0"; else bad "kex --server ADDR run --help exits 0"; fi
run "$kex" devices
if [ "$rc" = 2 ] && grep -q "needs a server" "$tmp/err"; then ok "kex devices without a server: exit 2 saying it needs one"; else bad "kex devices without a server: exit 2 saying it needs one"; fi
run "$kex" --server
if [ "$rc" = 2 ]; then ok "kex --server without a value: exit 2"; else bad "kex --server without a value: exit 2"; fi
run "$kex" "${S[@]}" plan
if [ "$rc" = 2 ] && grep -q "expected one graph file" "$tmp/err"; then ok "kex --server ADDR plan without a file: exit 2"; else bad "kex --server ADDR plan without a file: exit 2"; fi
run "$kex" "${S[@]}" frobnicate
if [ "$rc" = 2 ]; then ok "an unknown server command: exit 2"; else bad "an unknown server command: exit 2"; fi

# ---- plan: the server prints what the in-process plan prints ----
same=0
total=0
for name in basic_binop_fusion softmax_fusion contiguous_add extra_matmul_bias_relu assign_contiguous_permute; do
  f=$cases/$name.json
  [ -f "$f" ] || continue
  total=$((total + 1))
  "$kex" plan "$f" 2>/dev/null | grep -v '^  kernel ' >"$tmp/local.txt"
  lrc=${PIPESTATUS[0]}
  "$kex" "${S[@]}" plan "$f" >"$tmp/remote.txt" 2>"$tmp/err"
  rrc=$?
  if [ "$lrc" = "$rrc" ] && cmp -s "$tmp/local.txt" "$tmp/remote.txt"; then same=$((same + 1)); else
    echo "# $name differs (in-process rc $lrc, server rc $rrc)"
    diff "$tmp/local.txt" "$tmp/remote.txt" | head -5
  fi
done
if [ "$same" = "$total" ] && [ "$total" -gt 0 ]; then ok "plan: --server output equals the in-process output ($same of $total cases)"; else bad "plan: --server output equals the in-process output ($same of $total cases)"; fi
f=$cases/softmax_fusion.json
want=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["kernels"]["opencl"])' "$f")
run env KEX_SERVER="127.0.0.1:$port" "$kex" plan --json "$f"
got=$($PY -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["kernels"], sum(i["kind"]=="kernel" for i in d["items"]))' "$tmp/out" 2>/dev/null)
if [ "$rc" = 0 ] && [ "$got" = "$want $want" ]; then ok "plan --json through KEX_SERVER: $want kernels as tinygrad (got: $got)"; else bad "plan --json through KEX_SERVER: $want kernels as tinygrad (got: $got)"; fi

echo '{"nodes":[{"op":"EMPTY","dtype":"float32","shape":[4]},{"op":"RESHAPE","src":[0],"arg":[3]}],"outputs":[1]}' >"$tmp/bad.json"
run "$kex" "${S[@]}" plan "$tmp/bad.json"
if [ "$rc" = 2 ] && grep -q "INVALID_ARGUMENT: node 1" "$tmp/err"; then ok "plan of an invalid graph: exit 2, INVALID_ARGUMENT naming node 1"; else bad "plan of an invalid graph: exit 2, INVALID_ARGUMENT naming node 1"; fi
sed 's/^/# /' "$tmp/err"
run "$kex" "${S[@]}" plan "$tmp/nonexistent.json"
if [ "$rc" = 2 ] && grep -q "cannot open" "$tmp/err"; then ok "plan of a missing file: exit 2"; else bad "plan of a missing file: exit 2"; fi
run "$kex" --server 127.0.0.1:1 plan "$cases/basic_binop_fusion.json"
if [ "$rc" = 1 ] && grep -q "UNAVAILABLE" "$tmp/err"; then ok "an unreachable server: exit 1, UNAVAILABLE"; else bad "an unreachable server: exit 1, UNAVAILABLE"; fi

# ---- devices, stats ----
run "$kex" "${S[@]}" devices
if [ "$rc" = 0 ] && grep -q "^default: " "$tmp/out"; then ok "devices: exit 0, names a default device"; else bad "devices: exit 0, names a default device"; fi
run "$kex" "${S[@]}" devices --json
if [ "$rc" = 0 ] && $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if sum(x["is_default"] for x in d)==1 else 1)' "$tmp/out"; then ok "devices --json: a list with exactly one default"; else bad "devices --json: a list with exactly one default"; fi
run "$kex" "${S[@]}" stats
if [ "$rc" = 0 ] && grep -q "^uptime: " "$tmp/out" && grep -q "^calls: " "$tmp/out"; then ok "stats: exit 0 with uptime and calls"; else bad "stats: exit 0 with uptime and calls"; fi

# ---- jobs and buffers ----
run "$kex" "${S[@]}" job open --name cli-test --weight 3
job=$(cat "$tmp/out")
if [ "$rc" = 0 ] && [[ "$job" =~ ^[0-9a-f]{32,}$ ]]; then ok "job open prints a token"; else bad "job open prints a token"; fi
$PY -c 'import numpy as np, sys; np.save(sys.argv[1], (np.arange(3*5*7, dtype=np.float32).reshape(3, 5, 7) - 50) / 3)' "$tmp/a.npy"
run "$kex" "${S[@]}" upload --job "$job" "$tmp/a.npy"
handle=$(cat "$tmp/out")
if [ "$rc" = 0 ] && [[ "$handle" =~ ^[0-9a-f]+$ ]]; then ok "upload --job prints a handle"; else bad "upload --job prints a handle"; fi
run env KEX_JOB="$job" "$kex" "${S[@]}" download "$handle" --out "$tmp/b.npy"
if [ "$rc" = 0 ] && $PY -c 'import numpy as np, sys; a, b = np.load(sys.argv[1]), np.load(sys.argv[2]); sys.exit(0 if a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes() else 1)' "$tmp/a.npy" "$tmp/b.npy"; then ok "download --out (job from KEX_JOB) writes the same array"; else bad "download --out (job from KEX_JOB) writes the same array"; fi
run "$kex" "${S[@]}" download --job "$job" "$handle"
if [ "$rc" = 0 ] && grep -q '^float32 (3, 5, 7) \[-16.6667, -16.3333, -16, ' "$tmp/out"; then ok "download prints dtype, shape and the leading values"; else bad "download prints dtype, shape and the leading values"; fi
run "$kex" "${S[@]}" stats --job "$job"
if [ "$rc" = 0 ] && grep -q "^job cli-test: weight 3, 1 buffers" "$tmp/out"; then ok "stats --job: the job holds 1 buffer"; else bad "stats --job: the job holds 1 buffer"; fi
run "$kex" "${S[@]}" download --job "$job" 0123456789abcdef0123456789abcdef
if [ "$rc" = 2 ] && grep -q "NOT_FOUND" "$tmp/err"; then ok "download of an unknown handle: exit 2, NOT_FOUND"; else bad "download of an unknown handle: exit 2, NOT_FOUND"; fi
run "$kex" "${S[@]}" upload --job "$job" "$tmp/bad.json"
if [ "$rc" = 2 ] && grep -q "not a .npy" "$tmp/err"; then ok "upload of a file that is not .npy: exit 2"; else bad "upload of a file that is not .npy: exit 2"; fi
run "$kex" "${S[@]}" job close "$job"
if [ "$rc" = 0 ]; then ok "job close: exit 0"; else bad "job close: exit 0"; fi
run "$kex" "${S[@]}" job close "$job"
if [ "$rc" = 2 ] && grep -q "NOT_FOUND: .*unknown job token" "$tmp/err"; then ok "closing it again: exit 2, NOT_FOUND with the server's message"; else bad "closing it again: exit 2, NOT_FOUND with the server's message"; fi
run "$kex" "${S[@]}" download --job "$job" "$handle"
if [ "$rc" = 2 ]; then ok "a closed job's buffer: exit 2"; else bad "a closed job's buffer: exit 2"; fi

# ---- run ----
$PY -c 'import json,sys; json.dump(json.load(open(sys.argv[1]))["numeric"]["graph"], open(sys.argv[2], "w"))' "$cases/basic_binop_fusion.json" "$tmp/num.json"
run "$kex" "${S[@]}" run "$tmp/num.json"
if [ "$rc" != 0 ] && grep -q "UNIMPLEMENTED" "$tmp/err"; then
  if [ "$rc" = 1 ]; then ok "run while Submit is UNIMPLEMENTED: exit 1 with the server's message"; else bad "run while Submit is UNIMPLEMENTED: exit 1 with the server's message"; fi
  skip "run --server outputs equal the in-process run (kexd: $(cat "$tmp/err"))"
else
  if [ "$rc" = 0 ] && grep -q "^kernel 0: " "$tmp/out" && grep -q "^output 0: float32 (10,) " "$tmp/out"; then ok "run --server: exit 0, prints kernels and outputs"; else bad "run --server: exit 0, prints kernels and outputs"; fi
  if grep -q "^scheduled: " "$tmp/err"; then ok "run --server: progress lines on stderr when not a terminal"; else bad "run --server: progress lines on stderr when not a terminal"; fi
  run "$kex" "${S[@]}" run --json --out "$tmp/outdir" "$tmp/num.json"
  "$kex" run --device cpu --json "$tmp/num.json" >"$tmp/local.json" 2>/dev/null
  if [ "$rc" = 0 ] && $PY -c '
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
sys.exit(0 if [o["data"] for o in a["outputs"]] == [o["data"] for o in b["outputs"]] else 1)' "$tmp/out" "$tmp/local.json"; then ok "run --json --server: output bytes equal the in-process run"; else bad "run --json --server: output bytes equal the in-process run"; fi
  if [ -f "$tmp/outdir/out0.npy" ]; then ok "run --out writes out0.npy"; else bad "run --out writes out0.npy"; fi
fi

# ---- in-process, no server ----
run "$kex" plan "$cases/basic_binop_fusion.json"
if [ "$rc" = 0 ] && grep -q "^kernels: 1$" "$tmp/out"; then ok "in-process plan: exit 0, kernels: 1"; else bad "in-process plan: exit 0, kernels: 1"; fi
run "$kex" run --device cpu "$tmp/num.json"
if [ "$rc" = 0 ] && grep -q "^output 0: float32 (10,) " "$tmp/out"; then ok "in-process run on cpu: exit 0 with an output line"; else bad "in-process run on cpu: exit 0 with an output line"; fi
run "$kex" plan "$tmp/bad.json"
if [ "$rc" = 2 ]; then ok "in-process plan of an invalid graph: exit 2"; else bad "in-process plan of an invalid graph: exit 2"; fi

if kill -0 "$pid" 2>/dev/null; then
  kill -TERM "$pid"
  wait "$pid"
  rc=$?
  pid=""
  if [ "$rc" = 0 ]; then ok "kexd exits 0 at SIGTERM"; else bad "kexd exits 0 at SIGTERM"; fi
else
  bad "kexd is still running after the checks"
fi
finish
