#!/usr/bin/env bash
# test_tenants.sh - one tenant cannot hurt another: test_tenants.py runs a
# hostile co-tenant against kexd --auth instances of its own (tokens and
# --auth files made there): bytes pinned by a stalled Download stay charged,
# the job table per tenant and eviction, forged log lines, listing methods
# without a token, malformed job tokens, the kex CLI's token sources,
# the metrics listener's rules, the cache's visibility per tenant, and the
# compile budget (max_compile_seconds, --tenant-compile-budget).
#
# Env: KEX_BUILD_DIR (default build).  Last line "N passed, N failed".
. "$(dirname "$0")/lib.bash"
kex=${KEX:-$build/kex}
[ -x "$kex" ] || { bad "kex is built ($kex)"; finish; }
run_py test_tenants.py KEXD="$kexd" KEX="$kex" KEXD_TMP="$tmp"
finish
