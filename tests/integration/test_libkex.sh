#!/usr/bin/env bash
# test_libkex.sh - libkex end to end: start a real kexd on a free 127.0.0.1
# port, wait until it answers, run the C test program libkex_test against it
# (jobs, plan kernel counts, upload/download, devices, stats, error codes and
# messages, submit, tune and the cache API, each a skip line while kexd
# answers UNIMPLEMENTED), then stop
# kexd with SIGTERM and check it exits 0 and never crashed.
#
# Env: KEX_BUILD_DIR (default build: $KEX_BUILD_DIR/daemon/kexd and
# $KEX_BUILD_DIR/tests/libkex_test), KEX_CASES_DIR (default ../shared/cases).
# The last line of the output is "N passed, N failed"; exit 1 on any failure.
. "$(dirname "$0")/lib.bash"
testprog=$build/tests/libkex_test
[ -x "$testprog" ] || { bad "libkex_test is built ($testprog not found)"; finish; }

# its own beam cache file: Tune's results never touch the user's cache, and a first tune really searches
start_kexd --grace 2 --cache "$tmp/cache.db"

timeout 300 "$testprog" "127.0.0.1:$port" "$cases" | tee "$tmp/test.out"
rc=${PIPESTATUS[0]}
last=$(tail -n 1 "$tmp/test.out")
if [[ "$last" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
  passed=$((passed + BASH_REMATCH[1]))
  failed=$((failed + BASH_REMATCH[2]))
  [ "$rc" -le 1 ] || bad "libkex_test exits cleanly (rc $rc)"
else
  bad "libkex_test printed its closing line (rc $rc, got: $last)"
fi

# libkex as an installed library: it exports exactly what its installed headers declare, and
# examples/hello.c builds against an install with pkg-config and runs against this kexd
want=$(grep -ohE "\b(kex_[a-z_0-9]+)\(" client/libkex.h core/errors.h | tr -d '(' | sort -u)
have=$(nm -D --defined-only "$build/client/libkex.so" | awk '{print $3}' | sed 's/@.*//' | grep -v '^KEX_0$' | sort -u)
if [ -n "$want" ] && [ "$want" = "$have" ]; then
  ok "libkex.so exports exactly the $(echo "$want" | wc -l) functions its installed headers declare"
else
  bad "libkex.so exports exactly what its installed headers declare"
  diff <(echo "$want") <(echo "$have") | head -20
fi
soname=$(readelf -d "$build/client/libkex.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
if [ "$soname" = "libkex.so.0" ]; then ok "libkex.so has the soname libkex.so.0"; else bad "libkex.so soname (got '$soname')"; fi
dest=$tmp/dest
if meson install -C "$build" --no-rebuild --destdir "$dest" >"$tmp/install.log" 2>&1; then
  pc=$(find "$dest" -name kex.pc | head -n 1)
  lib=$(dirname "$(find "$dest" -name 'libkex.so' | head -n 1)")
  flags=$(PKG_CONFIG_SYSROOT_DIR="$dest" PKG_CONFIG_PATH="$(dirname "$pc")" pkg-config --cflags --libs kex)
  if [ -n "$pc" ] && cc -o "$tmp/hello" examples/hello.c $flags 2>"$tmp/cc.log"; then
    ok "examples/hello.c builds from an install with pkg-config --cflags --libs kex"
    out=$(LD_LIBRARY_PATH="$lib" timeout 60 "$tmp/hello" "127.0.0.1:$port" 2>&1)
    if echo "$out" | grep -q "^result: 22 44 66 88$" && echo "$out" | grep -q "^plan: 1 kernel"; then
      ok "the installed hello runs against kexd: plan 1 kernel, result 22 44 66 88"
    else
      bad "the installed hello runs against kexd (got: $out)"
    fi
  else
    bad "examples/hello.c builds from an install with pkg-config (flags: $flags)"
    cat "$tmp/cc.log"
  fi
else
  bad "meson install --destdir works"
  tail -n 20 "$tmp/install.log"
fi

end_kexd
finish
