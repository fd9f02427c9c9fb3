#!/usr/bin/env bash
# libfuzzer.sh [--build-only] [BUILD_DIR] - the libFuzzer form of the fuzz targets.
#
# Picks a clang that can build kex with libFuzzer (the first of clang-19 ...
# clang-15, clang that compiles _Float16 and links -fsanitize=fuzzer),
# configures BUILD_DIR (default build-fuzz) with it (-Dsanitize=true
# -Dfuzzer=true; -Dwerror=false: clang's warnings are not gcc's), builds only
# the fuzz targets, then runs meson's 'fuzz' suite: each target a few seconds
# over a copy of its corpus (tests/fuzz/run_libfuzzer.sh).
# Exit 0 all passed; 1 a test failed; 2 it did not configure or build;
# 77 skipped: no suitable clang (the reason is printed).
set -uo pipefail
cd "$(dirname "$0")/../.."
build_only=0
if [ "${1:-}" = --build-only ]; then
  build_only=1
  shift
fi
dir=${1:-build-fuzz}
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '#include <stdint.h>\n#include <stddef.h>\n_Float16 h;\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' >"$probe/p.c"
cc=
for c in clang-19 clang-18 clang-17 clang-16 clang-15 clang; do
  if command -v "$c" >/dev/null && "$c" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>/dev/null; then
    cc=$c
    break
  fi
done
if [ -z "$cc" ]; then
  echo "skipped: no clang that builds kex for libFuzzer (needs _Float16 and -fsanitize=fuzzer: apt-get install clang-15)"
  exit 77
fi
targets=(tests/fuzz_graph tests/fuzz_wire tests/fuzz_rpc tests/fuzz_stream tests/fuzz_cache)
echo "== $dir: configure ($cc, libFuzzer) =="
if ! CC=$cc scripts/configure.sh "$dir" -Dsanitize=true -Dfuzzer=true -Dwerror=false >"$probe/configure.txt" 2>&1; then
  tail -n 30 "$probe/configure.txt"
  exit 2
fi
echo "== $dir: build ${targets[*]} =="
if ! ninja -C "$dir" "${targets[@]}" >"$probe/build.txt" 2>&1; then
  grep -E -A12 '^FAILED:' "$probe/build.txt" | head -n 60
  exit 2
fi
[ $build_only = 1 ] && exit 0
echo "== $dir: meson test --suite fuzz =="
meson test -C "$dir" --no-rebuild --print-errorlogs --suite fuzz
