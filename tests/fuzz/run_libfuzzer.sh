#!/usr/bin/env bash
# run_libfuzzer.sh BINARY SECONDS CORPUS_DIR... - a bounded libFuzzer run of one
# fuzz target (built with -Dfuzzer=true): the corpus folders are copied into a
# fresh temporary folder (libFuzzer adds what it finds there, never to the
# source tree), then BINARY fuzzes it for SECONDS.  Prints libFuzzer's final
# stats; exits non-zero on a crash, leak, sanitizer report or timeout, after
# copying the input that did it to fuzz-artifacts/ beside BINARY.
set -uo pipefail
bin=$1 secs=$2
shift 2
name=$(basename "$bin")
work=$(mktemp -d "${TMPDIR:-/tmp}/kex-libfuzzer-$name.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$work/artifacts"
n=0
for dir in "$@"; do
  [ -d "$dir" ] || continue
  for f in "$dir"/*; do
    [ -f "$f" ] || continue
    case $f in *.pending) continue ;; esac # a known crash not fixed yet (bench/fuzz)
    cp "$f" "$work/corpus/seed-$n"
    n=$((n + 1))
  done
done
echo "$name: $n seeds, ${secs}s"
"$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -max_len=65536 -print_final_stats=1 \
  -artifact_prefix="$work/artifacts/" "$work/corpus" >"$work/log" 2>&1
rc=$?
grep -E '^(stat::|#[0-9]+ +DONE|INFO: Loaded|==[0-9]+==ERROR|SUMMARY)' "$work/log" | head -n 30
if [ $rc -ne 0 ]; then
  tail -n 60 "$work/log"
  keep="$(dirname "$bin")/fuzz-artifacts"
  mkdir -p "$keep"
  cp "$work"/artifacts/* "$keep"/ 2>/dev/null && echo "$name: the failing inputs are in $keep"
  echo "$name: libFuzzer exited $rc"
  exit 1
fi
echo "$name: ok"
