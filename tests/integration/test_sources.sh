#!/usr/bin/env bash
# test_sources.sh - `kex run` (in-process) and a Submit through kexd emit the
# same kernel sources for every case in ../shared/cases, on each device
# (cpu and PoCL's opencl): both take their plan from the plan
# builder (realize/plan.h), which writes every kernel it lowers to
# $KEX_DUMP_SOURCES/NAME.  Starts a real kexd (devices cpu,opencl,
# --schedule-cache 0 so every Submit builds its plan) with KEX_DUMP_SOURCES
# set, runs each case's graph with `kex run --device D` and with `kex
# --server ADDR run --device D`, and compares the two folders of sources
# byte for byte.  A case that fails on a device (PoCL has no fp16) is still
# compared: the plan is built before anything compiles.
#
# Env: KEX_BUILD_DIR, KEX_CASES_DIR (as the other scripts); KEX_SOURCES_EVERY=N
# compares every Nth case (by name order; default 6 in the test command, whose
# time budget cannot hold ~2 compiles of every kernel on both devices; 1 for
# every case, the long form: KEX_SOURCES_EVERY=1 bash tests/integration/test_sources.sh).
# The last line of the output is "N passed, N failed"; exit 1 on any failure.
. "$(dirname "$0")/lib.bash"
kex="$build/kex"
devices="cpu,opencl"
mkdir -p "$tmp/dump" "$tmp/g" "$tmp/pocl"
KEX_DUMP_SOURCES="$tmp/dump" start_kexd --device "$devices" --schedule-cache 0 --cache "$tmp/cache.db"

# every case's graph as its own file
every=${KEX_SOURCES_EVERY:-6}
$PY - "$cases" "$tmp/g" "$every" <<'EOF'
import json, sys
cases, out, every = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i, name in enumerate(sorted(json.load(open(f"{cases}/INDEX.json")))):
    if i % every == 0:
        json.dump(json.load(open(f"{cases}/{name}.json"))["graph"], open(f"{out}/{name}.json", "w"))
EOF
ncases=$(ls "$tmp/g" | wc -l)
if [ "$ncases" -gt 0 ]; then ok "$ncases case graphs extracted (1 in $every)"; else bad "case graphs extracted from $cases"; finish; fi

for dev in ${devices//,/ }; do
  same=0 differ=0 empty=0 kernels=0 first=""
  for g in "$tmp/g"/*.json; do
    c=$(basename "$g" .json)
    a="$tmp/a/$dev/$c" b="$tmp/b/$dev/$c"
    mkdir -p "$a" "$b"
    POCL_CACHE_DIR="$tmp/pocl" KEX_DUMP_SOURCES="$a" "$kex" run --device "$dev" "$g" >/dev/null 2>"$tmp/err.local"
    if ! "$kex" --server "127.0.0.1:$port" run --device "$dev" "$g" >/dev/null 2>"$tmp/err.remote" &&
      ! grep -q "float16 is not supported\|CL_BUILD_PROGRAM_FAILURE" "$tmp/err.remote"; then
      echo "# $dev $c: Submit failed: $(tail -n 1 "$tmp/err.remote")"
    fi
    find "$tmp/dump" -maxdepth 1 -type f -exec mv -t "$b" {} +
    n=$(ls "$a" | wc -l)
    if [ "$n" = 0 ] && [ -z "$(ls "$b")" ]; then
      empty=$((empty + 1)) # no kernel (everything folded or a view)
    elif diff -r "$a" "$b" >"$tmp/diff" 2>&1; then
      same=$((same + 1))
      kernels=$((kernels + n))
    else
      differ=$((differ + 1))
      [ -z "$first" ] && first="$c: $(head -c 400 "$tmp/diff")"
    fi
  done
  if [ "$differ" = 0 ] && [ "$same" -gt 0 ]; then
    ok "$dev: kex run and Submit emit the same sources ($same cases, $kernels kernels; $empty cases without kernels)"
  else
    bad "$dev: kex run and Submit emit the same sources ($differ of $((same + differ)) cases differ; first: $first)"
  fi
done

if kill -0 "$pid" 2>/dev/null; then
  stop_kexd
else
  bad "kexd was still running after every case"
  pid=""
fi
finish
