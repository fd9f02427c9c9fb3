#!/usr/bin/env python3
"""bench/plan_rpc.py - what a client waits for on a Plan, beside the span bench/plan.py times.

For each of bench/plan.py's six graphs: --reps Plan calls after --warmup,
over one libkex connection (build/client/libkex.so through ctypes, as
plan.py calls it), to a kexd on a free port.  The medians of the call's
wall time (libkex parsing the graph text, the RPC, kexd's decode, checks,
replay + schedule + memory plan, the reply and its unpacking) and of
kexd's schedule_us (the span plan.py compares with tinygrad) go to
bench/results/plan_rpc.json.

Usage: /usr/bin/python3 bench/plan_rpc.py [--kexd build/daemon/kexd] [--libkex build/client/libkex.so]
                                          [--reps 200] [--warmup 20]
"""
import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import plan  # noqa: E402  (its graphs, its libkex wrapper, its kexd start)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kexd", default=os.path.join(ROOT, "build", "daemon", "kexd"))
    ap.add_argument("--libkex", default=os.path.join(ROOT, "build", "client", "libkex.so"))
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "plan_rpc.json"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="kex-bench-plan-rpc-")
    proc, addr = plan.start_kexd(a.kexd, tmp, "kexd")
    rows, load_before = [], os.getloadavg()
    try:
        time.sleep(1.0)
        client = plan.Libkex(a.libkex, addr)
        for name, where in plan.SIX:
            text = json.dumps(plan.load(name, where)).encode()
            for _ in range(a.warmup):
                client.plan(text)
            wall, span = [], []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                us, kernels = client.plan(text)
                wall.append((time.perf_counter() - t0) * 1e6)
                span.append(us)
            row = {"graph": name, "kernels": kernels, "rpc_wall_us": round(statistics.median(wall), 1),
                   "schedule_us": round(statistics.median(span), 1)}
            row["span_share"] = round(row["schedule_us"] / row["rpc_wall_us"], 3)
            rows.append(row)
            print(f"{name:32s} Plan RPC {row['rpc_wall_us']:8.1f} us  schedule_us {row['schedule_us']:7.1f} us  "
                  f"({100 * row['span_share']:.0f}% of the call)  kernels {kernels}", flush=True)
        client.close()
    finally:
        proc.terminate()
        proc.wait()
    doc = {"what": "Plan RPC wall time through libkex (graph text in, reply out) and kexd's schedule_us, medians",
           "reps": a.reps, "warmup": a.warmup, "load_avg_before": load_before, "load_avg": os.getloadavg(),
           "machine": platform.platform(), "cpus": os.cpu_count(), "rows": rows}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    json.dump(doc, open(a.out, "w"), indent=1)
    print(f"-> {a.out}")


if __name__ == "__main__":
    main()
