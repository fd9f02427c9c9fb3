#!/usr/bin/env python3
"""bench/plan.py - kexd's warm scheduler beside tinygrad 0.9.0's, in one run.

For each graph: kexd's Plan (a long-running server, so every cache it keeps
is warm; `schedule_us` is the server's own replay + schedule + memory plan
time: protobuf decode, graph validation and building the reply are outside
it) called --reps times after --warmup untimed calls over one libkex
connection (build/client/libkex.so through ctypes, one job; the median and
the minimum), and tinygrad's
LazyBuffer replay (`replay_graph.build`) + `create_schedule` on the same
graph in this process, also after warm-up.  Both medians, their ratio, and
the machine's load go to bench/results/plan.json.  With --cli, also the old
way of calling kexd: one `kex plan --json` process (a new connection) per
call, whose schedule_us is higher because the process start and the new
connection leave kexd's caches cold (the `kex_cli_*` fields).  With
--before KEXD, a second kexd (an earlier build) is timed the same way in the
same run, its calls interleaved with the first kexd's in blocks, against the
same tinygrad medians (the `kex_before_*` fields and `ratio_before`): tinygrad's own time swings 2-3x with the machine's load
between runs, so before/after ratios from separate runs do not compare.

Like for like: tinygrad's time is its thread's CPU time (on a loaded machine
its millisecond spans, timed by the wall clock, would also hold the time
other processes ran; kexd's spans of tens of microseconds rarely do; the
wall time is kept as tinygrad_wall_us).  Its timed span is the replay and
create_schedule only
(not memory_planner), each build starting from no live LazyBuffers of an
earlier build (held ones would be lazycache hits, already scheduled, and the
build would schedule less); kexd's span also holds its memory planner, so the
ratio is conservative.  kexd's side is its wall-clock schedule_us (the
`ratio`), so a Plan that loses its core to another process counts that time;
kexd also logs (at debug, read from its log) the thread CPU time of the same
span, whose median gives `kex_plan_schedule_cpu_us` and `ratio_cpu`, like
for like with tinygrad's CPU time (absent for an earlier kexd that does not
log it).

Graphs, the issue's six: elementwise chains of 100 and 1,000 ADDs (the
`bench_sched` chains), a transformer block and a GELU MLP forward+backward
(bench/graphs/, recorded from tinygrad programs by bench/tg_graphs.py),
causal scaled-dot-product attention (extra_attention_causal) and conv +
batchnorm + Adam (fold_conv_batchnorm_optim_adam) from ../shared/cases/;
then three more cases (resnet_block_eval, sgd_4convs_fuse,
extra_layernorm_affine).  `six_min_ratio` is over the six.

Usage: /usr/bin/python3 bench/plan.py [--kexd build/daemon/kexd] [--libkex build/client/libkex.so] [--kex build/kex]
                                      [--reps 30] [--warmup 5] [--cli] [--before OLD_KEXD]
Needs python3-numpy and python3-tqdm (tinygrad's imports).
"""
import argparse
import ctypes
import gc
import json
import os
import platform
import re
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
GRAPHS = os.path.join(ROOT, "bench", "graphs")
# (row name, where the graph comes from): the six first
SIX = [("chain_100", "chain"), ("chain_1000", "chain"), ("transformer_block", "bench"),
       ("extra_attention_causal", "case"), ("fold_conv_batchnorm_optim_adam", "case"), ("gelu_mlp_fwd_bwd", "bench")]
MORE = [("resnet_block_eval", "case"), ("sgd_4convs_fuse", "case"), ("extra_layernorm_affine", "case")]


def chain(n):
    nodes = [{"op": "BUFFER", "dtype": "float32", "shape": [1024], "fill": {"random": 1}}]
    for i in range(n):
        nodes.append({"op": "ADD", "src": [i, 0]})
    return {"format": "kex.graph.v1", "device": "default", "nodes": nodes, "outputs": [n]}


def load(name, where):
    if where == "chain":
        return chain(int(name.split("_")[1]))
    if where == "bench":
        return json.load(open(os.path.join(GRAPHS, name + ".json")))
    return json.load(open(os.path.join(CASES, name + ".json")))["graph"]


class PlanHead(ctypes.Structure):
    """The leading fields of libkex's kex_plan (client/libkex.h)."""
    _fields_ = [("kernels", ctypes.c_uint32), ("schedule_us", ctypes.c_double)]


class Libkex:
    """One libkex connection and job: Plan calls as a long-lived client makes them."""

    def __init__(self, path, addr):
        self.lib = ctypes.CDLL(path)
        self.lib.kex_plan_graph.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                            ctypes.POINTER(ctypes.POINTER(PlanHead)), ctypes.c_void_p]
        self.lib.kex_plan_free.argtypes = [ctypes.POINTER(PlanHead)]
        self.lib.kex_client_connect.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                                ctypes.c_void_p]
        self.lib.kex_job_open.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint64,
                                          ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p]
        self.lib.kex_client_close.argtypes = [ctypes.c_void_p]
        self.st = ctypes.create_string_buffer(4096)  # a kex_status (two ints and the message), with room to spare
        self.client = ctypes.c_void_p()
        self.job = ctypes.create_string_buffer(128)  # KEX_TOKEN_MAX
        self.check(self.lib.kex_client_connect(addr.encode(), None, ctypes.byref(self.client), self.st))
        for _ in range(100):  # kexd may still be starting (a loaded machine): up to 20 s
            if not self.lib.kex_job_open(self.client, b"bench-plan", 1, 0, self.job, None, self.st):
                return
            time.sleep(0.2)
        self.check(self.lib.kex_job_open(self.client, b"bench-plan", 1, 0, self.job, None, self.st))

    def check(self, rc):
        if rc:
            raise RuntimeError(f"libkex: {rc}: {self.st.raw[8:].split(bytes(1))[0].decode(errors='replace')}")

    def plan(self, text):
        p = ctypes.POINTER(PlanHead)()
        self.check(self.lib.kex_plan_graph(self.client, self.job.value, text, ctypes.byref(p), self.st))
        r = (p.contents.schedule_us, p.contents.kernels)
        self.lib.kex_plan_free(p)
        return r

    def close(self):
        self.lib.kex_client_close(self.client)


def kex_sides(clients, graph, reps, warmup, blocks=5):
    """Each client's (median, min, kernels) of schedule_us: warm-up calls, then reps calls each, in `blocks`
    interleaved blocks (client 0's block, client 1's, ...), so that load changes during the run hit all alike."""
    text = json.dumps(graph).encode()
    out = [[] for _ in clients]
    kernels = [None] * len(clients)
    for c in clients:
        for _ in range(warmup):
            c.plan(text)
    for b in range(blocks):
        n = reps // blocks + (1 if b < reps % blocks else 0)
        for i, c in enumerate(clients):
            for _ in range(n):
                us, kernels[i] = c.plan(text)
                out[i].append(us)
    return [(statistics.median(o), min(o), k) for o, k in zip(out, kernels)]


def kex_cli_side(kex, addr, path, reps, warmup):
    out = []
    for i in range(warmup + reps):
        r = subprocess.run([kex, "--server", addr, "plan", "--json", path], capture_output=True, text=True, check=True)
        if i >= warmup:
            out.append(json.loads(r.stdout)["schedule_us"])
    return statistics.median(out)


def tinygrad_side(graph, reps, warmup):
    import replay_graph
    from tinygrad.engine.schedule import create_schedule
    cpu, wall, counts = [], [], set()
    for i in range(warmup + reps):
        gc.collect()  # no live LazyBuffers of the last build (see the file comment); outside the timed span
        t0, c0 = time.perf_counter(), time.thread_time()
        _, outs = replay_graph.build(graph)
        sched = create_schedule(outs)
        t1, c1 = time.perf_counter(), time.thread_time()
        counts.add(replay_graph.count_kernels(sched))
        del outs, sched, _
        if i >= warmup:
            cpu.append((c1 - c0) * 1e6)
            wall.append((t1 - t0) * 1e6)
    if len(counts) != 1:
        raise RuntimeError(f"tinygrad scheduled different kernel counts across builds: {sorted(counts)}")
    return statistics.median(cpu), statistics.median(wall), counts.pop()


def plan_cpu_us(log_path, pos):
    """The thread CPU times of the Plans kexd logged (at debug) from byte pos of its log on, in order."""
    with open(log_path, errors="replace") as f:
        f.seek(pos)
        text = f.read()
    return [float(m.group(1)) for m in re.finditer(r"kernels in [0-9.]+ us [(]thread CPU ([0-9.]+) us[)]", text)]


def start_kexd(path, tmp, name):
    """A kexd on a free port with its own cache file: (process, address)."""
    addr = f"127.0.0.1:{free_port()}"
    log = open(os.path.join(tmp, name + ".log"), "w")
    proc = subprocess.Popen([path, "--listen", addr, "--device", "opencl", "--cache", os.path.join(tmp, name + ".db"),
                             "--metrics", "off", "--log", "debug",  # each Plan logs its thread CPU time
                             "--max-kernel-depth", "2048"],  # the 1,000-ADD chain: one kernel 1,001 levels deep
                            stdout=log, stderr=subprocess.STDOUT)
    return proc, addr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kexd", default=os.path.join(ROOT, "build", "daemon", "kexd"))
    ap.add_argument("--libkex", default=os.path.join(ROOT, "build", "client", "libkex.so"))
    ap.add_argument("--kex", default=os.path.join(ROOT, "build", "kex"))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--cli", action="store_true", help="also time one `kex plan` process per call")
    ap.add_argument("--before", metavar="KEXD", help="also time this kexd (an earlier build) in the same run: the "
                    "kex_before_* fields")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "plan.json"))
    a = ap.parse_args()
    sys.path[:0] = [ANCHORS, os.path.join(ANCHORS, "tinygrad-0.9.0")]
    os.environ.setdefault("GPU", "1")  # tinygrad's GPU device rules, as kexd's opencl target
    tmp = tempfile.mkdtemp(prefix="kex-bench-plan-")
    servers = [start_kexd(a.kexd, tmp, "kexd")] + ([start_kexd(a.before, tmp, "before")] if a.before else [])
    rows = []
    load_before = os.getloadavg()
    try:
        time.sleep(1.0)
        client = Libkex(a.libkex, servers[0][1])
        addr = servers[0][1]
        before = Libkex(a.libkex, servers[1][1]) if a.before else None
        log_path, log_pos = os.path.join(tmp, "kexd.log"), 0
        for name, where in SIX + MORE:
            g = load(name, where)
            sides = kex_sides([client] + ([before] if before else []), g, a.reps, a.warmup)
            cpu = plan_cpu_us(log_path, log_pos)[-a.reps:]
            log_pos = os.path.getsize(log_path)
            kex_us, kex_min, kex_k = sides[0]
            if before:
                b_us, b_min, b_k = sides[1]
                assert b_k == kex_k, f"{name}: kernels {kex_k}, before {b_k}"
            tg_us, tg_wall_us, tg_k = tinygrad_side(g, a.reps, a.warmup)
            extra = {}
            if len(cpu) == a.reps:  # an earlier kexd does not log it
                cpu_us = statistics.median(cpu)
                extra = {"kex_plan_schedule_cpu_us": round(cpu_us, 2), "ratio_cpu": round(tg_us / cpu_us, 1)}
            row = {"graph": name, "six": (name, where) in SIX, "nodes": len(g["nodes"]), **extra,
                   "kex_plan_schedule_us": round(kex_us, 2), "kex_plan_schedule_min_us": round(kex_min, 2),
                   "tinygrad_replay_schedule_us": round(tg_us, 2),
                   "tinygrad_wall_us": round(tg_wall_us, 2), "ratio": round(tg_us / kex_us, 1),
                   "kernels_kex": kex_k, "kernels_tinygrad": tg_k}
            cli = ""
            if before:
                row.update(kex_before_schedule_us=round(b_us, 2), kex_before_schedule_min_us=round(b_min, 2),
                           ratio_before=round(tg_us / b_us, 1))
                cli += f"  (before {b_us:8.1f} us {tg_us / b_us:6.1f}x)"
            if a.cli:
                path = os.path.join(tmp, name + ".json")
                json.dump(g, open(path, "w"))
                cli_us = kex_cli_side(a.kex, addr, path, a.reps, a.warmup)
                row.update(kex_cli_schedule_us=round(cli_us, 2), kex_cli_ratio=round(tg_us / cli_us, 1))
                cli += f"  (kex plan CLI {cli_us:8.1f} us {tg_us / cli_us:6.1f}x)"
            rows.append(row)
            if extra:
                cli += f"  (kex thread CPU {extra['kex_plan_schedule_cpu_us']:8.1f} us {extra['ratio_cpu']:6.1f}x)"
            print(f"{name:34s} {len(g['nodes']):6d} nodes  kex {kex_us:9.1f} us  tinygrad {tg_us:11.1f} us  "
                  f"{tg_us / kex_us:7.1f}x  kernels {kex_k}/{tg_k}{cli}", flush=True)
        client.close()
        if before:
            before.close()
    finally:
        for proc, _ in servers:
            proc.terminate()
            proc.wait()
    ratios = [r["ratio"] for r in rows]
    six = [r["ratio"] for r in rows if r["six"]]
    doc = {"what": "kexd Plan schedule_us (warm server, opencl target rules, one libkex connection) vs tinygrad 0.9.0 "
                   "replay_graph.build + create_schedule (GPU=1), medians after warm-up, same machine, same run",
           "note": "kexd's schedule_us is replay + schedule + memory plan (decode, validation and the reply are "
                   "outside it); tinygrad's span is replay + create_schedule (its memory_planner is not in it), each "
                   "build with no live LazyBuffers of an earlier one, and its kernel count is checked equal across "
                   "builds. tinygrad_replay_schedule_us (and every ratio) is its thread's CPU time: its spans are "
                   "milliseconds long, and on a loaded machine (2 cores here) wall time adds whatever time other "
                   "processes held the core, while kexd's spans of tens of microseconds rarely include a switch; "
                   "tinygrad_wall_us is its wall time. kex_cli_* (with --cli): one `kex plan` process and connection per call, as this "
                   "benchmark called kexd before",
           "reps": a.reps, "warmup": a.warmup, "load_avg": os.getloadavg(), "load_avg_before": load_before,
           "machine": platform.platform(), "cpus": os.cpu_count(), "rows": rows,
           "median_ratio": statistics.median(ratios), "min_ratio": min(ratios), "six_min_ratio": min(six)}
    if a.before:
        doc["before"] = {"kexd": a.before, "six_min_ratio": min(r["ratio_before"] for r in rows if r["six"]),
                         "median_ratio": statistics.median(r["ratio_before"] for r in rows)}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    json.dump(doc, open(a.out, "w"), indent=1)
    print(f"six graphs: min {doc['six_min_ratio']:.1f}x; all: median {doc['median_ratio']:.1f}x, "
          f"min {doc['min_ratio']:.1f}x -> {a.out}")


if __name__ == "__main__":
    main()
