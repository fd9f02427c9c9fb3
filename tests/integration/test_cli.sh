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
# UNIMPLEMENTED, else outputs equal to the in-process run); tune --server
# then cache ls|show|export|rm|import --server (a skip line while Tune is
# UNIMPLEMENTED): the entry appears, --json parses with the in-process keys,
# the export round-trips through rm and import and imports in-process too;
# in-process plan and run without --server.
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
# its own beam cache file, so tune/cache never see the user's cache
"$kexd" --listen "127.0.0.1:$port" --grace 2 --cache "$tmp/cache.db" >"$tmp/kexd.log" 2>&1 &
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

# ---- tune and the cache through the server ----
tg=$tmp/tune.json
echo '{"device":"cpu","nodes":[{"op":"BUFFER","dtype":"float32","shape":[16],"fill":{"random":1}},{"op":"BUFFER","dtype":"float32","shape":[16],"fill":{"random":2}},{"op":"MUL","src":[0,1]}],"outputs":[2]}' >"$tg"
run "$kex" "${S[@]}" tune --beam 1 "$tg"
if [ "$rc" != 0 ] && grep -q "UNIMPLEMENTED" "$tmp/err"; then
  if [ "$rc" = 1 ]; then ok "tune while Tune is UNIMPLEMENTED: exit 1 with the server's message"; else bad "tune while Tune is UNIMPLEMENTED: exit 1 with the server's message"; fi
  skip "tune and cache --server (kexd: $(cat "$tmp/err"))"
else
  if [ "$rc" = 0 ] && grep -q "^kernel 1: .* us  (hand-coded .* us.*)  search " "$tmp/out"; then ok "tune --server: exit 0, one searched kernel line"; else bad "tune --server: exit 0, one searched kernel line (rc $rc)"; sed 's/^/# /' "$tmp/out" "$tmp/err"; fi
  if grep -q "^kernel 1/1 .* round .*: candidates .* compiled .* timed " "$tmp/err"; then ok "tune --server: plain progress lines on stderr"; else bad "tune --server: plain progress lines on stderr"; fi
  run env KEX_SERVER="127.0.0.1:$port" "$kex" tune --beam 1 --json "$tg"
  cp "$tmp/out" "$tmp/tune_remote.json"
  "$kex" tune --device cpu --beam 1 --json --cache "$tmp/local.db" "$tg" >"$tmp/tune_local.json" 2>/dev/null
  key=$($PY -c '
import json, sys
r, l = json.load(open(sys.argv[1]))["kernels"], json.load(open(sys.argv[2]))["kernels"]
k = r[0]
assert len(r) == 1 and k["from_cache"] is True and k["us"] > 0 and k["hand_us"] > 0 and k["search_s"] >= 0, k
assert sorted(k) == sorted(l[0]), (sorted(k), sorted(l[0]))
assert k["ast_key"] == l[0]["ast_key"], (k["ast_key"], l[0]["ast_key"])
print(k["ast_key"])' "$tmp/tune_remote.json" "$tmp/tune_local.json" 2>"$tmp/pyerr")
  if [ "$rc" = 0 ] && [ ${#key} = 64 ]; then ok "tune --json through KEX_SERVER: from the cache now, the in-process keys and AST key"; else bad "tune --json through KEX_SERVER: from the cache now, the in-process keys and AST key"; sed 's/^/# /' "$tmp/pyerr"; fi
  run "$kex" "${S[@]}" cache ls
  if [ "$rc" = 0 ] && grep -q "^${key:0:16}  cpu " "$tmp/out" && grep -q "^1 entry in 127.0.0.1:$port$" "$tmp/out"; then ok "cache ls --server: the tuned entry, 1 entry"; else bad "cache ls --server: the tuned entry, 1 entry"; sed 's/^/# /' "$tmp/out" "$tmp/err"; fi
  run "$kex" "${S[@]}" cache ls --json --device kind=cpu --max-age 1h
  if [ "$rc" = 0 ] && $PY -c '
import json, sys
d = json.load(open(sys.argv[1])); e = d["entries"]
assert len(e) == 1 and e[0]["ast_key"] == sys.argv[2] and e[0]["us"] > 0 and e[0]["device"].startswith("kind=cpu;"), d
assert {"search_opts", "codegen_version", "kernel_name", "opts", "hand_us", "candidates", "created_at"} <= set(e[0])' "$tmp/out" "$key"; then ok "cache ls --json --server with filters: the entry"; else bad "cache ls --json --server with filters: the entry"; fi
  run "$kex" "${S[@]}" cache ls --json --name no-such-kernel
  if [ "$rc" = 0 ] && $PY -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["entries"] == [] else 1)' "$tmp/out"; then ok "cache ls --server --name that matches nothing: no entries"; else bad "cache ls --server --name that matches nothing: no entries"; fi
  run "$kex" "${S[@]}" cache show --json "${key:0:10}"
  if [ "$rc" = 0 ] && $PY -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["ast_key"] == sys.argv[2] and d["ast_text"].startswith("kex.ast.v1") and d["source"], d' "$tmp/out" "$key"; then ok "cache show --json --server: the entry with its AST text and source"; else bad "cache show --json --server: the entry with its AST text and source"; fi
  run "$kex" "${S[@]}" cache show ffffffffffff
  if [ "$rc" = 2 ] && grep -q "no entry with AST key prefix" "$tmp/err"; then ok "cache show --server of an unknown prefix: exit 2"; else bad "cache show --server of an unknown prefix: exit 2"; fi
  run "$kex" "${S[@]}" cache ls --ast xyz
  if [ "$rc" = 2 ] && grep -q "INVALID_ARGUMENT" "$tmp/err"; then ok "cache ls --server --ast xyz: exit 2, INVALID_ARGUMENT"; else bad "cache ls --server --ast xyz: exit 2, INVALID_ARGUMENT"; fi
  run "$kex" "${S[@]}" cache export --out "$tmp/export.jsonl"
  if [ "$rc" = 0 ] && grep -q "^exported [1-9][0-9]* entries$" "$tmp/out" && head -1 "$tmp/export.jsonl" | grep -q '"kex.cache.export.v1"' && grep -q "$key" "$tmp/export.jsonl"; then ok "cache export --server --out: the header and the entry"; else bad "cache export --server --out: the header and the entry"; fi
  run "$kex" "${S[@]}" cache rm
  if [ "$rc" = 2 ]; then ok "cache rm --server without a filter or --all: exit 2"; else bad "cache rm --server without a filter or --all: exit 2"; fi
  run "$kex" "${S[@]}" cache rm --all --json
  if [ "$rc" = 0 ] && grep -q '^{"deleted":1}$' "$tmp/out"; then ok "cache rm --all --json --server: deleted 1"; else bad "cache rm --all --json --server: deleted 1"; cat "$tmp/out"; fi
  run "$kex" "${S[@]}" cache ls
  if [ "$rc" = 0 ] && grep -q "^0 entries in " "$tmp/out"; then ok "cache ls --server after rm: 0 entries"; else bad "cache ls --server after rm: 0 entries"; fi
  run "$kex" "${S[@]}" cache import --json "$tmp/export.jsonl"
  if [ "$rc" = 0 ] && $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if d["imported"] >= 1 and d["rejected"] == 0 and d["errors"] == [] else 1)' "$tmp/out"; then ok "cache import --json --server: the export comes back"; else bad "cache import --json --server: the export comes back"; fi
  run "$kex" "${S[@]}" cache ls
  if [ "$rc" = 0 ] && grep -q "^${key:0:16}  cpu " "$tmp/out"; then ok "cache ls --server after import: the entry again"; else bad "cache ls --server after import: the entry again"; fi
  run "$kex" cache import --cache "$tmp/imported.db" "$tmp/export.jsonl"
  if [ "$rc" = 0 ] && grep -q "^imported [1-9][0-9]*, rejected 0$" "$tmp/out"; then ok "the server's export imports in-process too"; else bad "the server's export imports in-process too"; fi
  { head -1 "$tmp/export.jsonl"; echo '{"type":"beam","ast_key":"nothex"}'; } >"$tmp/bad.jsonl"
  run "$kex" "${S[@]}" cache import "$tmp/bad.jsonl"
  if [ "$rc" = 2 ] && grep -q "INVALID_ARGUMENT: .*line 2" "$tmp/err"; then ok "cache import --server of a bad line: exit 2 naming line 2"; else bad "cache import --server of a bad line: exit 2 naming line 2"; fi
  sed 's/^/# /' "$tmp/err"
  run "$kex" "${S[@]}" tune --beam 1 "$tmp/bad.json"
  if [ "$rc" = 2 ] && grep -q "INVALID_ARGUMENT: node 1" "$tmp/err"; then ok "tune --server of an invalid graph: exit 2 naming node 1"; else bad "tune --server of an invalid graph: exit 2 naming node 1"; fi
  run "$kex" "${S[@]}" tune --max-rounds 2 "$tg"
  if [ "$rc" = 2 ] && grep -q "in-process only" "$tmp/err"; then ok "tune --server --max-rounds: exit 2, in-process only"; else bad "tune --server --max-rounds: exit 2, in-process only"; fi
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
