#!/usr/bin/env python3
"""bench/beam_vs_tinygrad.py - kex's BEAM search against tinygrad 0.9.0's BEAM=2, same kernels, side by side.

For each graph, in one run and interleaved (kex, tinygrad, kex, tinygrad, ...), each side searches every kernel of
the graph with beam width 2 in a fresh process, with its own search cache empty (kex: a new --cache file; tinygrad:
a new CACHEDB), on the OpenCL device (PoCL here), in three PoCL states:

  cold   POCL_KERNEL_CACHE=0 and an empty POCL_CACHE_DIR: every build and every first launch generates code;
  first  PoCL's kernel cache on, its folder empty (this run fills it; kex's build helpers work through it);
  warm   PoCL's kernel cache on, its folder as the side's own `first` run left it.

Reported per graph, mode and side: search seconds (kex: the sum of `kex tune --json`'s search_s; tinygrad: the wall
time of lower_schedule_item, where its beam_search runs), the process's wall seconds, candidates compiled (kex: its
count; tinygrad: calls of the device's compiler) and per second, and the picked kernels' time (kex: the final
comparison's full-size median, `us`; tinygrad: the median of --repeat runs of its lowered kernel, profiling events;
both sum over the graph's kernels).  Ratio = kex search s / tinygrad search s.  Load average before and after.
Then every pick of the graph (each side, each mode) is timed again in one process by one timer, interleaved
(--retime-rounds rounds; 0: none): its opts applied to tinygrad's kernel of the same AST (kex's opts are tinygrad's
actions), so a pick's speed is compared free of the load each search met; retimed_vs_best = its time / the best
pick's.  Off by default: its absolute times disagreed with both sides' own (sum4M's first kernel with kex's opts
GROUP(0,8) LOCAL(0,2): 2.4 ms retimed, 0.27 ms in kex's search, 0.3-0.7 ms in tinygrad's), not yet explained.

usage: /usr/bin/python3 bench/beam_vs_tinygrad.py [--graphs matmul512,sum4M] [--modes cold,first,warm]
           [--kex build/kex] [--kex-before PATH] [--kex-args '...'] [--out bench/results/beam-speed.json]
           [--no-tinygrad]
--kex-before adds a third side, another kex binary (e.g. one built from the commit before a change), run the same
way right after kex; ratios are against tinygrad for both.
Graph names are looked up in ../shared/bench-graphs, then bench/graphs.  Needs /usr/bin/python3 (numpy).
"""
import argparse, json, os, shutil, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANCHORS = os.path.join(ROOT, "..", "shared", "anchors")
GRAPH_DIRS = [os.path.join(ROOT, "..", "shared", "bench-graphs"), os.path.join(ROOT, "bench", "graphs")]

# The tinygrad side, run as its own process: search (lower_schedule_item runs beam_search under BEAM=2), then time
# every picked kernel.  Prints one JSON line.
TINYGRAD_SIDE = r'''
import json, os, statistics, sys, time
sys.path[:0] = [sys.argv[1], os.path.join(sys.argv[1], "tinygrad-0.9.0")]
import replay_graph
from tinygrad.device import Device
from tinygrad.engine.realize import lower_schedule_item
from tinygrad.engine.schedule import create_schedule
graph = json.load(open(sys.argv[2])); graph = graph.get("graph", graph)
_, outs = replay_graph.build(graph, alloc=True)
dev = Device[Device.DEFAULT]
compiles = [0, 0.0]
comp = dev.compiler.compile
def counted(src):
  t = time.perf_counter()
  try: return comp(src)
  finally: compiles[0] += 1; compiles[1] += time.perf_counter() - t
dev.compiler.compile = counted
import tinygrad.engine.realize as realize
opts_seen, get_kernel = [], realize.get_kernel
def recorded(*args, **kw):
  k = get_kernel(*args, **kw)
  opts_seen.append(" ".join(f"{o.op.name}({o.axis},{o.amt})" for o in k.applied_opts))
  return k
realize.get_kernel = recorded
sched = create_schedule(outs)
t0 = time.perf_counter()
items = [lower_schedule_item(si) for si in sched]
search_s = time.perf_counter() - t0
kernel_us = []
for ei in items:
  if ei.prg is None or not hasattr(ei.prg, "p"):
    ei.run(do_update_stats=False); continue
  ei.run(wait=True, do_update_stats=False)
  kernel_us.append(statistics.median(ei.run(wait=True, do_update_stats=False) * 1e6 for _ in range(int(sys.argv[3]))))
print(json.dumps({"search_s": search_s, "compiled": compiles[0], "compile_s": compiles[1], "kernel_us": kernel_us,
                  "names": [ei.prg.p.name for ei in items if ei.prg is not None and hasattr(ei.prg, "p")],
                  "opts": opts_seen}))
'''

# Re-timing the picks in one process, by one timer: each pick's opts applied to tinygrad's kernel of the same AST
# (kex's opts are tinygrad's actions), rendered by tinygrad, timed in interleaved rounds (every pick once per round,
# ROUNDS rounds of RUNS runs each); the median of all its runs.  Prints {"label": [us per kernel], ...}.
RETIME = r'''
import json, os, statistics, sys
sys.path[:0] = [sys.argv[1], os.path.join(sys.argv[1], "tinygrad-0.9.0")]
import replay_graph
from tinygrad.device import Device
from tinygrad.codegen.linearizer import Linearizer
from tinygrad.codegen.kernel import Opt, OptOps
from tinygrad.engine.realize import CompiledRunner
from tinygrad.engine.schedule import create_schedule
from tinygrad.engine.search import bufs_from_lin
graph = json.load(open(sys.argv[2])); graph = graph.get("graph", graph)
picks = json.loads(sys.argv[3])  # {label: [opts text per kernel]}
_, outs = replay_graph.build(graph, alloc=False)
asts = [si.ast for si in create_schedule(outs) if si.ast[0].op.name == "STORE"]
dev = Device[Device.DEFAULT]
def parse(text):
  out = []
  for t in text.split():
    op, rest = t.split("(")
    axis, amt = rest.rstrip(")").split(",")
    out.append(Opt(OptOps[op], int(axis), int(amt)))
  return out
res = {label: [] for label in picks}
for i, ast in enumerate(asts):
  runners, bufs = {}, None
  for label, opts in picks.items():
    if i >= len(opts): continue
    k = Linearizer(*ast, opts=dev.renderer)
    for o in parse(opts[i]): k.apply_opt(o)
    if bufs is None: bufs = bufs_from_lin(k)
    runners[label] = CompiledRunner(k.to_program())
  times = {label: [] for label in runners}
  for label, r in runners.items(): r(bufs, {}, wait=True)  # warm-up: code generation
  for _ in range(int(sys.argv[4])):
    for label, r in runners.items(): times[label] += [r(bufs, {}, wait=True) * 1e6 for _ in range(int(sys.argv[5]))]
  for label in runners: res[label].append(statistics.median(times[label]))
print(json.dumps(res))
'''


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def graph_path(name):
    for d in GRAPH_DIRS:
        p = os.path.join(d, name + ".json")
        if os.path.exists(p): return p
    raise SystemExit(f"no graph {name} in {GRAPH_DIRS}")


def pocl_env(mode, cache_dir):
    env = dict(os.environ, POCL_CACHE_DIR=cache_dir)
    env["POCL_KERNEL_CACHE"] = "0" if mode == "cold" else "1"
    return env


def run_kex(a, graph, mode, cache_dir, work, binary=None):
    db = os.path.join(work, f"kex-{mode}-{time.monotonic_ns()}.db")
    cmd = [binary or a.kex, "tune", "--device", "opencl", "--beam", "2", "--json", "--cache", db, *a.kex_args.split(), graph]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=pocl_env(mode, cache_dir), capture_output=True, text=True, timeout=a.timeout)
    wall = time.perf_counter() - t0
    if p.returncode:
        return {"error": p.stderr[-400:], "wall_s": wall}
    ks = json.loads(p.stdout.strip().splitlines()[-1])["kernels"]
    return {"search_s": sum(k["search_s"] for k in ks), "wall_s": wall, "compiled": sum(k["compiled"] for k in ks),
            "kernel_us": [k["us"] for k in ks], "names": [k["name"] for k in ks], "opts": [k["opts"] for k in ks]}


def run_tinygrad(a, graph, mode, cache_dir, work):
    env = pocl_env(mode, cache_dir)
    env.update(GPU="1", BEAM="2", CACHEDB=os.path.join(work, f"tg-{mode}-{time.monotonic_ns()}.db"))
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", TINYGRAD_SIDE, ANCHORS, graph, str(a.repeat)], env=env,
                       capture_output=True, text=True, timeout=a.timeout)
    wall = time.perf_counter() - t0
    if p.returncode:
        return {"error": p.stderr[-400:], "wall_s": wall}
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["wall_s"] = wall
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--graphs", default="matmul512,sum4M")
    ap.add_argument("--modes", default="cold,first,warm")
    ap.add_argument("--kex", default=os.path.join(ROOT, "build", "kex"))
    ap.add_argument("--kex-before", default="")
    ap.add_argument("--kex-args", default="")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", default="")
    ap.add_argument("--no-tinygrad", action="store_true")
    ap.add_argument("--retime-rounds", type=int, default=0)
    a = ap.parse_args()
    modes = a.modes.split(",")
    if "warm" in modes and "first" not in modes:
        modes.insert(modes.index("warm"), "first")  # warm needs the folder a first run filled
    rows, load0 = [], loadavg()
    for name in a.graphs.split(","):
        graph = graph_path(name)
        work = tempfile.mkdtemp(prefix="kex-beam-vs-tg-")
        sides = {"kex": run_kex}
        if a.kex_before:
            sides["kex_before"] = lambda a, g, m, c, w: run_kex(a, g, m, c, w, a.kex_before)
        if not a.no_tinygrad:
            sides["tinygrad"] = run_tinygrad
        dirs = {s: os.path.join(work, "pocl-" + s) for s in sides}
        for mode in modes:
            row = {"graph": name, "mode": mode, "load_before": loadavg()}
            for side, fn in sides.items():
                d = dirs[side] if mode != "cold" else os.path.join(work, f"pocl-cold-{side}-{time.monotonic_ns()}")
                if mode == "first" and os.path.exists(d): shutil.rmtree(d)
                os.makedirs(d, exist_ok=True)
                r = fn(a, graph, mode, d, work)
                if "search_s" in r and r["search_s"] > 0:
                    r["compiled_per_s"] = r["compiled"] / r["search_s"]
                    r["us"] = sum(r["kernel_us"])
                row[side] = r
            row["load_after"] = loadavg()
            k, kb, t = row.get("kex", {}), row.get("kex_before", {}), row.get("tinygrad", {})
            if "search_s" in k and "search_s" in t:
                row["ratio"] = k["search_s"] / t["search_s"]
                row["pick_ratio"] = k["us"] / t["us"]  # < 1: kex's pick is faster
            if "search_s" in kb and "search_s" in t:
                row["ratio_before"] = kb["search_s"] / t["search_s"]
                row["pick_ratio_before"] = kb["us"] / t["us"]
            rows.append(row)
            def fmt(r):
                if "error" in r: return "error: " + r["error"][-120:].replace("\n", " ")
                return (f"search {r['search_s']:7.1f} s (wall {r['wall_s']:6.1f}) compiled {r['compiled']:4d} "
                        f"({r['compiled_per_s']:5.1f}/s) pick {r['us']:10.1f} us")
            print(f"{name:12s} {mode:5s} kex:    {fmt(k)}", flush=True)
            if kb: print(f"{'':12s} {'':5s} before: {fmt(kb)}", flush=True)
            if t: print(f"{'':12s} {'':5s} tg:     {fmt(t)}", flush=True)
            if "ratio" in row:
                before = (f" (before: {row['ratio_before']:.3f}, pick {row['pick_ratio_before']:.2f})"
                          if "ratio_before" in row else "")
                print(f"{'':12s} {'':5s} ratio kex/tg {row['ratio']:.3f}, pick kex/tg {row['pick_ratio']:.2f}{before}, "
                      f"load {row['load_before']} -> {row['load_after']}", flush=True)
        if a.retime_rounds > 0:
            picks = {f"{r['mode']}/{side}": r[side]["opts"] for r in rows if r["graph"] == name
                     for side in ("kex", "kex_before", "tinygrad") if "opts" in r.get(side, {})}
            env = dict(os.environ, GPU="1", POCL_CACHE_DIR=os.path.join(work, "pocl-retime"))
            p = subprocess.run([sys.executable, "-c", RETIME, ANCHORS, graph, json.dumps(picks), str(a.retime_rounds),
                                "5"], env=env, capture_output=True, text=True, timeout=a.timeout)
            if p.returncode == 0:
                us = json.loads(p.stdout.strip().splitlines()[-1])
                best = min(sum(v) for v in us.values())
                for r in rows:
                    for side in ("kex", "kex_before", "tinygrad"):
                        key = f"{r['mode']}/{side}"
                        if r["graph"] == name and key in us:
                            r[side]["retimed_us"] = sum(us[key])
                            r[side]["retimed_vs_best"] = sum(us[key]) / best
                print(f"{name:12s} picks retimed (one process, interleaved; x the best pick): " +
                      ", ".join(f"{k} {sum(v):.1f} us ({sum(v) / best:.2f})" for k, v in us.items()), flush=True)
            else:
                print(f"{name}: retiming failed: {p.stderr[-300:]}", flush=True)
        shutil.rmtree(work, ignore_errors=True)
    doc = {"bench": "beam_vs_tinygrad", "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
           "load_start": load0, "load_end": loadavg(), "rows": rows}
    if a.out:
        with open(a.out, "w") as f: json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
