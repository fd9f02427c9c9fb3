#!/usr/bin/env python3
"""bench/plan.py - kexd's warm scheduler beside tinygrad 0.9.0's, in one run.

For each graph: kexd's Plan (a long-running server, so every cache it keeps
is warm; `schedule_us` is the server's own replay + schedule time, decode
excluded) called --reps times after --warmup untimed calls, and tinygrad's
LazyBuffer replay (`replay_graph.build`) + `create_schedule` on the same
graph in this process, also after warm-up.  Both medians, their ratio, and
the machine's load go to bench/results/plan.json.

Graphs: elementwise chains of 100 and 1,000 ADDs (the `bench_sched`
chains), and the `../shared/cases/` graphs closest to the programs the
performance issue names: causal scaled-dot-product attention
(extra_attention_causal), conv + batchnorm + Adam
(fold_conv_batchnorm_optim_adam), a ResNet block (resnet_block_eval), 4 convs
+ SGD (sgd_4convs_fuse), layernorm (extra_layernorm_affine).  (There is no
transformer-block or GELU-MLP case in ../shared/cases; the table says which
graph each row is.)

Usage: /usr/bin/python3 bench/plan.py [--kexd build/daemon/kexd] [--kex build/kex] [--reps 30] [--warmup 5]
Needs python3-numpy and python3-tqdm (tinygrad's imports).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from ports import free_port  # noqa: E402
ANCHORS = os.path.join(ROOT, "..", "shared", "anchors")
CASES = os.path.join(ROOT, "..", "shared", "cases")
CASE_GRAPHS = ["extra_attention_causal", "fold_conv_batchnorm_optim_adam", "resnet_block_eval", "sgd_4convs_fuse",
               "extra_layernorm_affine"]


def chain(n):
    nodes = [{"op": "BUFFER", "dtype": "float32", "shape": [1024], "fill": {"random": 1}}]
    for i in range(n):
        nodes.append({"op": "ADD", "src": [i, 0]})
    return {"format": "kex.graph.v1", "device": "default", "nodes": nodes, "outputs": [n]}




def kex_side(kex, addr, path, reps, warmup):
    out = []
    for i in range(warmup + reps):
        r = subprocess.run([kex, "--server", addr, "plan", "--json", path], capture_output=True, text=True, check=True)
        doc = json.loads(r.stdout)
        if i >= warmup:
            out.append(doc["schedule_us"])
    return statistics.median(out), doc["kernels"]


def tinygrad_side(graph, reps, warmup):
    import replay_graph
    from tinygrad.engine.schedule import create_schedule
    from tinygrad.ops import LoadOps
    out = []
    kernels = 0
    for i in range(warmup + reps):
        t0 = time.perf_counter()
        _, outs = replay_graph.build(graph)
        sched = create_schedule(outs)
        t1 = time.perf_counter()
        if i == 0:  # the first build's count: later builds of the same graph can hit tinygrad's lazycache and
            kernels = len([s for s in sched if s.ast[0].op not in LoadOps])  # schedule less (so time less)
        if i >= warmup:
            out.append((t1 - t0) * 1e6)
    return statistics.median(out), kernels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kexd", default=os.path.join(ROOT, "build", "daemon", "kexd"))
    ap.add_argument("--kex", default=os.path.join(ROOT, "build", "kex"))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "plan.json"))
    a = ap.parse_args()
    sys.path[:0] = [ANCHORS, os.path.join(ANCHORS, "tinygrad-0.9.0")]
    os.environ.setdefault("GPU", "1")  # tinygrad's GPU device rules, as kexd's opencl target
    graphs = [("chain_100", chain(100)), ("chain_1000", chain(1000))]
    for c in CASE_GRAPHS:
        graphs.append((c, json.load(open(os.path.join(CASES, c + ".json")))["graph"]))
    tmp = tempfile.mkdtemp(prefix="kex-bench-plan-")
    port = free_port()
    log = open(os.path.join(tmp, "kexd.log"), "w")
    kexd = subprocess.Popen([a.kexd, "--listen", f"127.0.0.1:{port}", "--device", "opencl", "--cache",
                             os.path.join(tmp, "cache.db"), "--metrics", "off",
                             "--max-kernel-depth", "2048"],  # the 1,000-ADD chain: one kernel 1,001 levels deep
                            stdout=log, stderr=subprocess.STDOUT)
    rows = []
    try:
        time.sleep(1.0)
        for name, g in graphs:
            path = os.path.join(tmp, name + ".json")
            json.dump(g, open(path, "w"))
            kex_us, kex_k = kex_side(a.kex, f"127.0.0.1:{port}", path, a.reps, a.warmup)
            tg_us, tg_k = tinygrad_side(g, a.reps, a.warmup)
            rows.append({"graph": name, "nodes": len(g["nodes"]), "kex_plan_schedule_us": round(kex_us, 2),
                         "tinygrad_replay_schedule_us": round(tg_us, 2), "ratio": round(tg_us / kex_us, 1),
                         "kernels_kex": kex_k, "kernels_tinygrad": tg_k})
            print(f"{name:34s} {len(g['nodes']):6d} nodes  kex {kex_us:10.1f} us  tinygrad {tg_us:11.1f} us  "
                  f"{tg_us / kex_us:7.1f}x  kernels {kex_k}/{tg_k}", flush=True)
    finally:
        kexd.terminate()
        kexd.wait()
    ratios = [r["ratio"] for r in rows]
    doc = {"what": "kexd Plan schedule_us (warm server, opencl target rules) vs tinygrad 0.9.0 replay_graph.build + "
                   "create_schedule (GPU=1), medians after warm-up, same machine, same run",
           "note": "tinygrad's later builds of one graph may hit its lazycache and schedule fewer items, which "
                   "makes its time lower (the ratio conservative); kernels_tinygrad is its first build's count",
           "reps": a.reps, "warmup": a.warmup, "load_avg": os.getloadavg(), "machine": platform.platform(),
           "cpus": os.cpu_count(), "rows": rows, "median_ratio": statistics.median(ratios), "min_ratio": min(ratios)}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    json.dump(doc, open(a.out, "w"), indent=1)
    print(f"median ratio {doc['median_ratio']:.1f}x, min {doc['min_ratio']:.1f}x -> {a.out}")


if __name__ == "__main__":
    main()
