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
# kex --version against meson's version; --server HOST meaning HOST:50051
# (a second kexd on :50051 when that port is free); the start-kexd line of
# an unreachable server; exit 2 for a missing input file in every command;
# stats --json against every StatsReply/JobStats field of the proto; the
# same --device/--repeat/--beam/--json through the server; run --check on a
# case (PASS) and on a tampered copy (FAIL, exit 1) in both modes; top
# --once --json listing an open job, and top on a pseudo-terminal quitting
# on q; doctor listing the OpenCL devices kexd sees, the cache file and the
# server; tune's bar (percent, ETA) on a pseudo-terminal, plain lines
# elsewhere with a best that never goes up; kernels numbered from 1 in run
# and tune; in-process plan and run without --server.
#
# Env: KEX_BUILD_DIR (default build), KEXD (default $KEX_BUILD_DIR/daemon/kexd),
# KEX_CASES_DIR (default ../shared/cases).  Last line: "N passed, N failed".
. "$(dirname "$0")/lib.bash"
kex=$build/kex
unset KEX_SERVER KEX_JOB KEX_TOKEN
[ -x "$kex" ] || { bad "kex is built ($kex)"; finish; }

# its own beam cache file, so tune/cache never see the user's cache
start_kexd --grace 2 --cache "$tmp/cache.db"
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
if [ "$rc" = 0 ] && [[ "$job" =~ ^[0-9a-f]{32}\.[^@]+@[^[:space:]]+$ ]]; then ok "job open prints a token"; else bad "job open prints a token"; fi
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
  if [ "$rc" = 0 ] && grep -q "^kernel 1: " "$tmp/out" && ! grep -q "^kernel 0: " "$tmp/out" && grep -q "^output 0: float32 (10,) " "$tmp/out"; then ok "run --server: exit 0, prints kernels (numbered from 1) and outputs"; else bad "run --server: exit 0, prints kernels (numbered from 1) and outputs"; fi
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
  run "$kex" cache show --cache "$tmp/local.db" "${key:0:12}"
  if [ "$rc" = 0 ] && grep -qE "^created_at: +[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$" "$tmp/out"; then ok "cache show: created_at is ISO 8601"; else bad "cache show: created_at is ISO 8601"; sed 's/^/# /' "$tmp/out" "$tmp/err"; fi
  run "$kex" cache show --cache "$tmp/local.db" --graph "$tmp/no-such-graph.json" "${key:0:12}"
  if [ "$rc" = 2 ]; then ok "cache show --graph of a missing file: exit 2"; else bad "cache show --graph of a missing file: exit 2 (rc $rc)"; sed 's/^/# /' "$tmp/err"; fi
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

# ---- the version, addresses, messages ----
want_ver=$(meson introspect "$build" --projectinfo 2>/dev/null | $PY -c 'import json,sys; print(json.load(sys.stdin)["version"])' 2>/dev/null)
[ -n "$want_ver" ] || want_ver=$(sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" meson.build | head -1)
run "$kex" --version
if [ "$rc" = 0 ] && [ "$(cat "$tmp/out")" = "kex $want_ver" ]; then ok "kex --version prints meson's project version ($want_ver)"; else bad "kex --version prints meson's project version ($want_ver; got: $(cat "$tmp/out"))"; fi
run "$kex" "${S[@]}" --version
if [ "$rc" = 0 ] && [ "$(cat "$tmp/out")" = "kex $want_ver" ]; then ok "kex --server ADDR --version: the same"; else bad "kex --server ADDR --version: the same"; fi

run "$kex" --server 127.0.0.1:1 plan "$cases/basic_binop_fusion.json"
if [ "$rc" = 1 ] && grep -q "scripts/run.sh" "$tmp/err" && grep -q "kexd --listen 127.0.0.1:1" "$tmp/err"; then ok "an unreachable server: one more line on how to start kexd (scripts/run.sh, kexd --listen ADDR)"; else bad "an unreachable server: one more line on how to start kexd"; sed 's/^/# /' "$tmp/err"; fi
run "$kex" stats
if [ "$rc" = 2 ] && grep -q "scripts/run.sh" "$tmp/err"; then ok "stats without a server: exit 2, says how to start one"; else bad "stats without a server: exit 2, says how to start one"; fi

# --server HOST without a port is HOST:50051
port_free=$($PY -c 'import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try: s.bind(("127.0.0.1", 50051)); print(1)
except OSError: print(0)')
if [ "$port_free" = 1 ]; then
  "$kexd" --listen 127.0.0.1:50051 --grace 1 --cache "" >"$tmp/kexd50051.log" 2>&1 &
  pid2=$!
  for _ in $(seq 1 100); do
    $PY -c 'import socket; socket.create_connection(("127.0.0.1", 50051), 0.2)' 2>/dev/null && break
    sleep 0.1
  done
  run "$kex" --server 127.0.0.1 job open --name port-default-check
  run "$kex" --server 127.0.0.1 stats
  if [ "$rc" = 0 ] && grep -q "^job port-default-check: " "$tmp/out"; then ok "--server 127.0.0.1 (no port) reaches the kexd started on :50051"; else bad "--server 127.0.0.1 (no port) reaches the kexd started on :50051"; sed 's/^/# /' "$tmp/err"; fi
  kill -TERM "$pid2" 2>/dev/null
  wait "$pid2" 2>/dev/null
  pid2=""
fi
run "$kex" --server 127.0.0.1 stats
if [ "$rc" = 0 ] || grep -q "127.0.0.1:50051" "$tmp/err"; then ok "--server 127.0.0.1 tries 127.0.0.1:50051 (rc $rc)"; else bad "--server 127.0.0.1 tries 127.0.0.1:50051 (rc $rc)"; sed 's/^/# /' "$tmp/err"; fi

# a missing input file is bad input (exit 2), in-process and through the server
missing=0
for c in "plan" "run" "run --check" "tune"; do
  run "$kex" $c "$tmp/nonexistent.json"
  [ "$rc" = 2 ] || { missing=$((missing + 1)); echo "# in-process $c: rc $rc"; }
  run "$kex" "${S[@]}" $c "$tmp/nonexistent.json"
  [ "$rc" = 2 ] || { missing=$((missing + 1)); echo "# --server $c: rc $rc"; }
done
if [ "$missing" = 0 ]; then ok "a missing input file: exit 2 (plan, run, run --check, tune; in-process and --server)"; else bad "a missing input file: exit 2 ($missing commands did not)"; fi

# ---- stats: every StatsReply field ----
run "$kex" "${S[@]}" job open --name stats-check --memory-limit 1048576
sjob=$(cat "$tmp/out")
run "$kex" "${S[@]}" stats --json --job "$sjob"
if [ "$rc" = 0 ] && $PY - "$tmp/out" proto/kex/v1/kex.proto <<'PYEOF'; then ok "stats --json: every StatsReply and JobStats field of the proto, and an ISO 8601 start"; else bad "stats --json: every StatsReply and JobStats field of the proto, and an ISO 8601 start"; fi
import json, re, sys
d = json.load(open(sys.argv[1]))
proto = open(sys.argv[2]).read()
def fields(msg):
    body = re.search(r"message %s \{(.*?)\n\}" % msg, proto, re.S).group(1)
    return [m.group(1) for m in re.finditer(r"^\s*(?:repeated\s+)?\w+\s+(\w+)\s*=\s*\d+;", body, re.M)]
want, jwant = fields("StatsReply"), fields("JobStats")
assert len(want) >= 28 and {"connections_open", "connections_refused", "jobs_evicted"} <= set(want), want
missing = [f for f in want if f not in d]
assert not missing, missing
assert len(d["job_stats"]) == 1 and d["job_stats"][0]["name"] == "stats-check", d["job_stats"]
jmissing = [f for f in jwant if f not in d["job_stats"][0]]
assert not jmissing, jmissing
assert d["connections_open"] >= 1 and d["job_stats"][0]["memory_limit"] == 1048576, d
assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", d["started"]), d["started"]
PYEOF
run "$kex" "${S[@]}" stats
if [ "$rc" = 0 ] && grep -q "^connections: [1-9][0-9]* open, [0-9]* refused$" "$tmp/out" && grep -q "evicted" "$tmp/out" && grep -q "^schedule cache: " "$tmp/out" && grep -q "^program cache: " "$tmp/out" && grep -q "^beam cache: .*searches: " "$tmp/out" && grep -q "^submissions: .* done, .* failed" "$tmp/out" && grep -Eq "^uptime: .* \(started [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z\)$" "$tmp/out"; then ok "stats: the new counters (connections, evictions, caches, submissions) and an ISO 8601 start"; else bad "stats: the new counters and an ISO 8601 start"; sed 's/^/# /' "$tmp/out"; fi

# ---- the same flags in both modes ----
"$kex" run --device cpu --json "$tmp/num.json" >"$tmp/cpu_local.json" 2>/dev/null
run "$kex" "${S[@]}" run --device cpu --json "$tmp/num.json"
if [ "$rc" = 0 ] && $PY -c '
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert [k["name"] for k in a["kernels"]] == [k["name"] for k in b["kernels"]], (a["kernels"], b["kernels"])
assert [o["data"] for o in a["outputs"]] == [o["data"] for o in b["outputs"]]' "$tmp/out" "$tmp/cpu_local.json"; then ok "run --server --device cpu: the server runs on cpu (the in-process cpu kernels and bytes)"; else bad "run --server --device cpu: the server runs on cpu (the in-process cpu kernels and bytes)"; fi
cp "$tmp/out" "$tmp/cpu_remote.json"
if $PY -c '
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
sys.exit(0 if [k["opts"] for k in a["kernels"]] == [k["opts"] for k in b["kernels"]] else 1)' "$tmp/cpu_remote.json" "$tmp/cpu_local.json"; then ok "run --server reports the applied opts per kernel, as in-process"; else bad "run --server reports the applied opts per kernel, as in-process"; fi
run "$kex" "${S[@]}" run --device no-such-device "$tmp/num.json"
if [ "$rc" = 2 ] && grep -q "INVALID_ARGUMENT" "$tmp/err" && grep -q "no-such-device" "$tmp/err"; then ok "run --server --device of a device the server lacks: exit 2 naming it"; else bad "run --server --device of a device the server lacks: exit 2 naming it"; fi
run "$kex" "${S[@]}" plan --device cpu --json "$cases/assign_contiguous_permute.json"
want_cpu=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["kernels"]["cpu"])' "$cases/assign_contiguous_permute.json")
got_cpu=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["kernels"])' "$tmp/out" 2>/dev/null)
if [ "$rc" = 0 ] && [ "$got_cpu" = "$want_cpu" ]; then ok "plan --server --device cpu: $want_cpu kernels, tinygrad's CLANG count"; else bad "plan --server --device cpu: $want_cpu kernels, tinygrad's CLANG count (got $got_cpu)"; fi
before=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["submissions"])' <("$kex" "${S[@]}" stats --json))
run "$kex" "${S[@]}" run --device cpu --repeat 3 "$tmp/num.json"
after=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["submissions"])' <("$kex" "${S[@]}" stats --json))
if [ "$rc" = 0 ] && [ $((after - before)) = 4 ] && grep -q "^timed run 3/3$" "$tmp/err" && grep -q "^kernel 1: " "$tmp/out"; then ok "run --server --repeat 3: a warm-up and 3 timed submissions, kernels printed"; else bad "run --server --repeat 3: a warm-up and 3 timed submissions (submissions +$((after - before)), rc $rc)"; fi
run "$kex" "${S[@]}" run --repeat 0 "$tmp/num.json"
if [ "$rc" = 2 ]; then ok "run --server --repeat 0: exit 2"; else bad "run --server --repeat 0: exit 2"; fi
run "$kex" "${S[@]}" run --beam 1 --device cpu "$tmp/num.json"
if [ "$rc" = 0 ] && grep -q "^output 0: float32 (10,) " "$tmp/out"; then ok "run --server --beam 1: exit 0"; else bad "run --server --beam 1: exit 0"; fi

# ---- run --check CASE.json ----
$PY - "$cases/softmax_fusion.json" "$tmp/tampered.json" <<'PYEOF'
import base64, json, struct, sys
d = json.load(open(sys.argv[1]))
e = d["numeric"]["expected"][0]
raw = bytearray(base64.b64decode(e["data"]))
v = struct.unpack_from("<f", raw, 40)[0]
struct.pack_into("<f", raw, 40, v + 0.5)       # element 10, far outside rtol/atol
e["data"] = base64.b64encode(bytes(raw)).decode()
json.dump(d, open(sys.argv[2], "w"))
PYEOF
for mode in in-process server; do
  if [ "$mode" = server ]; then M=("${S[@]}"); else M=(); fi
  run "$kex" "${M[@]}" run --check --device cpu "$cases/softmax_fusion.json"
  if [ "$rc" = 0 ] && grep -q "^output 0: PASS float32 (4, 12, 64, 64)" "$tmp/out" && grep -q "^check: 1 of 1 outputs passed$" "$tmp/out"; then ok "run --check ($mode): softmax_fusion passes, exit 0"; else bad "run --check ($mode): softmax_fusion passes, exit 0 (rc $rc)"; sed 's/^/# /' "$tmp/out" "$tmp/err"; fi
  run "$kex" "${M[@]}" run --check --device cpu "$tmp/tampered.json"
  if [ "$rc" = 1 ] && grep -q "^output 0: FAIL float32 .*1 of 196608 values out of tolerance, first \[10\]" "$tmp/out"; then ok "run --check ($mode): a tampered copy fails naming the value, exit 1"; else bad "run --check ($mode): a tampered copy fails naming the value, exit 1 (rc $rc)"; sed 's/^/# /' "$tmp/out"; fi
done
run "$kex" "${S[@]}" run --check --json "$tmp/tampered.json"
if [ "$rc" = 1 ] && $PY -c '
import json, sys
c = json.load(open(sys.argv[1]))["check"]
assert c["passed"] is False and c["outputs"][0]["mismatches"] == 1 and c["outputs"][0]["pass"] is False, c' "$tmp/out"; then ok "run --check --json --server: check.passed false, 1 mismatch"; else bad "run --check --json --server: check.passed false, 1 mismatch"; fi
run "$kex" run --check "$tmp/num.json"
if [ "$rc" = 2 ] && grep -q "not a case with a numeric graph" "$tmp/err"; then ok "run --check of a plain graph: exit 2, not a case"; else bad "run --check of a plain graph: exit 2, not a case"; fi

# ---- top ----
run "$kex" "${S[@]}" job open --name top-check --weight 4
tjob=$(cat "$tmp/out")
"$kex" "${S[@]}" run --job "$tjob" --device cpu "$tmp/num.json" >/dev/null 2>&1
run "$kex" "${S[@]}" top --once --json --interval 0.2
if [ "$rc" = 0 ] && $PY - "$tmp/out" <<'PYEOF'; then ok "top --once --json: parses, lists the open job, device busy, bytes held, cache hit rates, ISO 8601 time"; else bad "top --once --json: parses, lists the open job, ..."; cat "$tmp/out" "$tmp/err"; fi
import json, re, sys
d = json.load(open(sys.argv[1]))
j = [x for x in d["jobs"] if x["name"] == "top-check"]
assert len(j) == 1 and j[0]["weight"] == 4 and j[0]["items_done"] >= 1 and j[0]["bytes_held"] > 0, d["jobs"]
assert {"queued", "running", "busy", "device_time_s", "memory_limit", "buffers"} <= set(j[0]), j[0]
assert {"queued", "running", "device_busy", "bytes_held", "jobs_open", "uptime_s"} <= set(d), d
assert d["device_busy"] is not None and d["device_busy"] >= 0 and d["interval_s"] > 0.1, d
assert set(d["cache_hit_rates"]) == {"schedule", "program", "beam"}, d["cache_hit_rates"]
assert 0 <= d["cache_hit_rates"]["program"] <= 1, d["cache_hit_rates"]
assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", d["time"]), d["time"]
PYEOF
run "$kex" "${S[@]}" top --once --interval 0
if [ "$rc" = 0 ] && grep -q "^top-check  *4 " "$tmp/out" && grep -q "cache hit rates: schedule" "$tmp/out" && grep -q "device busy: -" "$tmp/out"; then ok "top --once --interval 0: the job's row, one sample (no busy share)"; else bad "top --once --interval 0: the job's row, one sample"; sed 's/^/# /' "$tmp/out"; fi
# on a terminal: redrawn every second until q
$PY - "$kex" "127.0.0.1:$port" "$root/tests/integration" >"$tmp/top_tty.txt" 2>&1 <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[3])
from on_tty import run_on_tty
rc, out = run_on_tty([sys.argv[1], "--server", sys.argv[2], "top"], keys=b"q", after=2.6, timeout=10)
print("rc", rc, "views", out.count(b"kex top "), "job", out.count(b"top-check"), "restored", out.endswith(b"\x1b[?1049l"))
PYEOF
if grep -q "^rc 0 views [2-9] job [2-9] restored True$" "$tmp/top_tty.txt"; then ok "top on a terminal: redrawn each second, q quits (exit 0, screen restored)"; else bad "top on a terminal: redrawn each second, q quits"; sed 's/^/# /' "$tmp/top_tty.txt"; fi
run "$kex" top --once
if [ "$rc" = 2 ] && grep -q "needs a server" "$tmp/err"; then ok "top without a server: exit 2"; else bad "top without a server: exit 2"; fi
"$kex" "${S[@]}" job close "$tjob" >/dev/null 2>&1
"$kex" "${S[@]}" job close "$sjob" >/dev/null 2>&1

# ---- doctor ----
run "$kex" "${S[@]}" doctor --json --cache "$tmp/cache.db"
"$kex" "${S[@]}" devices --json >"$tmp/devs.json" 2>/dev/null
if [ "$rc" = 0 ] && $PY - "$tmp/out" "$tmp/devs.json" "$tmp/cache.db" <<'PYEOF'; then ok "doctor --json: the OpenCL devices kexd sees (PoCL's here) with capabilities, the cache file and its size, the server answers"; else bad "doctor --json: the OpenCL devices, the cache file and its size, the server answers"; sed 's/^/# /' "$tmp/out"; fi
import json, os, re, sys
d, devs = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
mine = sorted(x["name"] for p in d["platforms"] for x in p["devices"])
theirs = sorted(x["device_name"] for x in devs if x["kind"] == "opencl" and x["name"].startswith("opencl:"))
assert mine == theirs, (mine, theirs)
for p in d["platforms"]:
    for x in p["devices"]:
        assert "error" in x or ({"global_mem", "compute_units", "has_local", "supports_fp16", "supports_fp64", "driver_version"} <= set(x) and x["global_mem"] > 0), x
if os.path.exists("/etc/OpenCL/vendors") and any("pocl" in f for f in os.listdir("/etc/OpenCL/vendors")):
    assert any(p["name"] == "Portable Computing Language" and p["devices"] for p in d["platforms"]), d["platforms"]
assert d["cpu"]["kind"] == "cpu" and d["cpu"]["compute_units"] >= 1, d["cpu"]
c = d["cache"]
assert c["path"] == sys.argv[3] and c["exists"] and c["bytes"] == os.path.getsize(sys.argv[3]), c
assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", c["modified"]), c
assert d["server"]["answers"] is True and d["server"]["devices"] and d["ok"] is True, d["server"]
PYEOF
run "$kex" doctor --cache "$tmp/cache.db"
pocl_name=$($PY -c 'import json,sys; print(next((x["device_name"] for x in json.load(open(sys.argv[1])) if x["kind"] == "opencl"), ""))' "$tmp/devs.json")
if [ "$rc" = 0 ] && grep -q "^OpenCL platforms and devices:" "$tmp/out" && { [ -z "$pocl_name" ] || grep -qF "    $pocl_name" "$tmp/out"; } && grep -q "^cache: $tmp/cache.db" "$tmp/out" && grep -q "float16 " "$tmp/out"; then ok "doctor: lists the OpenCL device ($pocl_name) with its capabilities and the cache file"; else bad "doctor: lists the OpenCL device ($pocl_name) with its capabilities and the cache file"; sed 's/^/# /' "$tmp/out"; fi
run "$kex" --server 127.0.0.1:1 doctor
if [ "$rc" = 1 ] && grep -q "^kexd at 127.0.0.1:1 " "$tmp/out" && grep -q "no answer: UNAVAILABLE" "$tmp/out" && grep -q "kexd --listen 127.0.0.1:1" "$tmp/out"; then ok "doctor --server of a silent address: exit 1, says it does not answer and how to start kexd"; else bad "doctor --server of a silent address: exit 1, says how to start kexd"; sed 's/^/# /' "$tmp/out"; fi

# ---- tune progress: a bar with percent and ETA on a terminal, plain lines elsewhere; best never goes up ----
tg2=$tmp/tune2.json
$PY -c 'import json,sys; json.dump(json.load(open(sys.argv[1]))["graph"], open(sys.argv[2], "w"))' "$cases/softmax_fusion.json" "$tg2"
$PY - "$kex" "$tg2" "$root/tests/integration" >"$tmp/tune_tty.txt" 2>&1 <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[3])
from on_tty import run_on_tty
rc, out = run_on_tty([sys.argv[1], "tune", "--device", "cpu", "--beam", "1", "--no-cache", "--max-rounds", "1",
                      "--max-candidates", "4", sys.argv[2]])
text = out.decode(errors="replace")
# the bar is redrawn in place: "\r\x1b[K" before each state; one line per state here
print("redraws", text.count("\r\x1b[K["))
sys.stdout.write(text.replace("\x1b[K", "").replace("\r\n", "\n").replace("\r", "\n"))
print("\nrc", rc)
PYEOF
if grep -q "^rc 0$" "$tmp/tune_tty.txt" && grep -q "^redraws [1-9][0-9]" "$tmp/tune_tty.txt" && grep -Eq '^\[#*\.*\] +[0-9]+%  ETA [0-9-]+:[0-9-]+  kernel 2/3 ' "$tmp/tune_tty.txt" && grep -q "100%  3 kernels tuned in " "$tmp/tune_tty.txt" && grep -q "^kernel 3: " "$tmp/tune_tty.txt"; then ok "tune on a terminal: a bar with percent and ETA, kernel i/n, the result lines"; else bad "tune on a terminal: a bar with percent and ETA"; tr '\r' '\n' <"$tmp/tune_tty.txt" | tail -5 | sed 's/^/# /'; fi
run "$kex" tune --device cpu --beam 2 --no-cache --max-candidates 8 "$tg2"
if [ "$rc" = 0 ] && ! grep -q $'\r' "$tmp/err" && ! grep -q "ETA" "$tmp/err" && $PY - "$tmp/err" <<'PYEOF'; then ok "tune elsewhere: plain lines, and the best shown for a kernel never goes up"; else bad "tune elsewhere: plain lines, and the best shown for a kernel never goes up"; sed 's/^/# /' "$tmp/err"; fi
import re, sys
best = {}
lines = 0
for line in open(sys.argv[1]):
    m = re.match(r"kernel (\d+)/3 (\w+) round \d+: .* best ([0-9.]+) us$", line)
    if not m:
        continue
    lines += 1
    k, v = int(m.group(1)), float(m.group(3))
    assert v <= best.get(k, v), (line, best[k])
    best[k] = v
assert lines >= 6 and sorted(best) == [1, 2, 3], (lines, best)
PYEOF

# ---- in-process, no server ----
run "$kex" plan "$cases/basic_binop_fusion.json"
if [ "$rc" = 0 ] && grep -q "^kernels: 1$" "$tmp/out"; then ok "in-process plan: exit 0, kernels: 1"; else bad "in-process plan: exit 0, kernels: 1"; fi
run "$kex" run --device cpu "$tmp/num.json"
if [ "$rc" = 0 ] && grep -q "^output 0: float32 (10,) " "$tmp/out" && grep -q "^kernel 1: " "$tmp/out" && ! grep -q "^kernel 0: " "$tmp/out"; then ok "in-process run on cpu: exit 0, kernels numbered from 1 (as tune numbers them), an output line"; else bad "in-process run on cpu: exit 0, kernels numbered from 1 (as tune numbers them), an output line"; fi
run "$kex" plan "$tmp/bad.json"
if [ "$rc" = 2 ]; then ok "in-process plan of an invalid graph: exit 2"; else bad "in-process plan of an invalid graph: exit 2"; fi

end_kexd
finish
