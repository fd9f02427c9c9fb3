#!/bin/bash
# bench/rpc_ab.sh OLD_KEXD NEW_KEXD [INFLIGHT] [PAIRS] - two kexd binaries side by side, paired.
#
# Starts both (--device cpu, a fresh cache each, 127.0.0.1 on free ports) and
# alternates 1.5 s blocks of `bench_rpc --only submit_batched --inflight N`
# between them, PAIRS times (default 8 in flight, 12 pairs).  Each block
# gives calls/s and kexd's CPU per Submit (from /proc/PID/stat); the
# summary is each side's median and the per-pair ratios new/old, so a
# machine whose speed drifts (a shared VM's states) weighs on both alike.
# bench/results/rpc.md quotes its output.
set -euo pipefail
OLD=$1 NEW=$2 INF=${3:-8} N=${4:-12}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH=${KEX_BENCH_RPC:-$ROOT/build/bench_rpc}
TMP=$(mktemp -d)
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PO=$(port) PN=$(port)
"$OLD" --listen 127.0.0.1:$PO --device cpu --cache "$TMP/old.db" --log warn --metrics off & KO=$!
"$NEW" --listen 127.0.0.1:$PN --device cpu --cache "$TMP/new.db" --log warn --metrics off & KN=$!
trap 'kill $KO $KN 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
sleep 1.5
for p in $PO $PN; do "$BENCH" --server 127.0.0.1:$p --only submit_batched --inflight 1 --seconds 1 --rounds 1 >/dev/null; done
cpu() { awk '{print $14 + $15}' /proc/$1/stat; }
for i in $(seq "$N"); do
  for side in old new; do
    if [ $side = old ]; then pid=$KO port=$PO; else pid=$KN port=$PN; fi
    t0=$(cpu $pid)
    line=$("$BENCH" --server 127.0.0.1:$port --only "${KEX_AB_KIND:-submit_batched}" --inflight "$INF" --seconds 1.5 --rounds 1 | grep "^${KEX_AB_KIND:-submit_batched} ")
    t1=$(cpu $pid)
    echo "$side $(echo "$line" | awk '{for (i = 1; i <= NF; i++) if ($i == "calls/s") print $(i-1)}') $t0 $t1"
  done
done | /usr/bin/python3 -c '
import os, statistics as st, sys
hz = os.sysconf("SC_CLK_TCK")
d = {"old": [], "new": []}
for line in sys.stdin:
    side, rate, t0, t1 = line.split()
    rate = float(rate)
    d[side].append((rate, (float(t1) - float(t0)) / hz / (rate * 1.5) * 1e6))
for side in ("old", "new"):
    print(f"{side}: calls/s median {st.median(r for r, _ in d[side]):.0f}, kexd CPU per Submit median "
          f"{st.median(c for _, c in d[side]):.1f} us")
rr = [n[0] / o[0] for o, n in zip(d["old"], d["new"])]
cr = [n[1] / o[1] for o, n in zip(d["old"], d["new"])]
print(f"new/old calls/s per pair: median {st.median(rr):.3f} (min {min(rr):.3f}, max {max(rr):.3f})")
print(f"new/old kexd CPU per pair: median {st.median(cr):.3f} (min {min(cr):.3f}, max {max(cr):.3f})")
'
