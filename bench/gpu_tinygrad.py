#!/usr/bin/env python3
"""bench/gpu_tinygrad.py - tinygrad 0.9.0's kernel times on this machine's OpenCL device, the baseline of bench/gpu.sh.

For each graph of the bench-graphs folder (the graphs bench_kernels and bench_beam time), tinygrad replays it
(../shared/anchors/replay_graph.py), schedules it, lowers every kernel (hand-coded opts, or a BEAM search when
BEAM is set in the environment, as tinygrad reads it at import) and times each kernel as the median of --repeat
runs after a warm-up, from OpenCL's profiling events (the same clock kex's opencl device reads).  Prints, after
each graph, one line with the JSON object so far: {"beam": N, "device": "...", "graphs": [{"graph", "kernels", "us", "kernel_us": [...]}]}; a graph tinygrad
cannot run has "error" instead.  tinygrad's search cache goes to a temporary folder, so BEAM always searches.
KEX_GPU_LIBOPENCL names an OpenCL ICD loader for tinygrad to use when ctypes finds none on the machine.

usage: GPU=1 [BEAM=N] python3 bench/gpu_tinygrad.py --anchors DIR --graphs DIR [--repeat N] [--only SUBSTR]
"""
import argparse, json, os, statistics, sys, tempfile


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--anchors", required=True)
  ap.add_argument("--graphs", required=True)
  ap.add_argument("--repeat", type=int, default=20)
  ap.add_argument("--only", default="")
  a = ap.parse_args()
  os.environ.setdefault("CACHEDB", os.path.join(tempfile.mkdtemp(prefix="kex-tg-"), "cache.db"))
  lib = os.environ.get("KEX_GPU_LIBOPENCL")
  if lib:  # no OpenCL ICD loader where ctypes looks (a bare GPU machine): hand tinygrad bench/gpu.sh's copy
    import ctypes.util
    found = ctypes.util.find_library
    ctypes.util.find_library = lambda name: (found(name) or lib) if name == "OpenCL" else found(name)
  sys.path[:0] = [a.anchors, os.path.join(a.anchors, "tinygrad-0.9.0")]
  import replay_graph
  from tinygrad.device import Device
  from tinygrad.engine.realize import lower_schedule_item
  from tinygrad.engine.schedule import create_schedule

  rows = []
  for name in sorted(os.listdir(a.graphs)):
    if not name.endswith(".json") or a.only not in name: continue
    row = {"graph": name[:-5]}
    try:
      with open(os.path.join(a.graphs, name)) as f: graph = json.load(f)
      graph = graph.get("graph", graph)
      _, outs = replay_graph.build(graph, alloc=True)
      items = [lower_schedule_item(si) for si in create_schedule(outs)]
      kernel_us = []
      for ei in items:
        if ei.prg is None or not hasattr(ei.prg, "p"):
          ei.run(do_update_stats=False)  # copies and views: run once, not timed
          continue
        ei.run(wait=True, do_update_stats=False)
        t = [ei.run(wait=True, do_update_stats=False) * 1e6 for _ in range(a.repeat)]
        kernel_us.append(statistics.median(t))
      row.update(kernels=len(kernel_us), us=sum(kernel_us), kernel_us=kernel_us)
    except Exception as e:  # a graph tinygrad cannot replay or run is reported, not fatal
      row["error"] = f"{type(e).__name__}: {e}"[:300]
    rows.append(row)
    # the whole object so far after every graph: a run stopped at its time limit still leaves its last line
    print(json.dumps({"beam": int(os.environ.get("BEAM", "0") or 0), "device": Device.DEFAULT,
                      "repeat": a.repeat, "graphs": rows}), flush=True)


if __name__ == "__main__":
  main()
