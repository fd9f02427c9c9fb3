#!/usr/bin/env python3
"""bench/pocl_candidates.py - beam candidates' OpenCL sources for bench/pocl_costs.c, from tinygrad 0.9.0.

Writes a JSON list [{"src", "name", "global", "local"}] of the first kernel of GRAPH: every round-1 action of
tinygrad's BEAM (engine/search.py get_linearizer_actions) and every action of the first two of those, rendered by
tinygrad's OpenCL renderer -- the kind of sources a beam round compiles.

usage: /usr/bin/python3 bench/pocl_candidates.py GRAPH.json OUT.json
"""
import json, os, sys

ANCHORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "anchors")
sys.path[:0] = [ANCHORS, os.path.join(ANCHORS, "tinygrad-0.9.0")]
os.environ["GPU"] = "1"
import replay_graph  # noqa: E402
from tinygrad.codegen.linearizer import Linearizer  # noqa: E402
from tinygrad.device import Device  # noqa: E402
from tinygrad.engine.schedule import create_schedule  # noqa: E402
from tinygrad.engine.search import get_linearizer_actions  # noqa: E402

graph = json.load(open(sys.argv[1]))
graph = graph.get("graph", graph)
_, outs = replay_graph.build(graph, alloc=False)
si = [si for si in create_schedule(outs) if si.ast[0].op.name == "STORE"][0]
lin = Linearizer(*si.ast, opts=Device["GPU"].renderer)
lins = list(get_linearizer_actions(lin, include_0=False).values())
for l in lins[:2]: lins += list(get_linearizer_actions(l, include_0=False).values())
out = []
for l in lins:
    try:
        l.linearize()
        p = l.to_program()
    except Exception:  # an action tinygrad cannot render is no candidate
        continue
    out.append({"src": p.src, "name": p.function_name, "global": p.global_size, "local": p.local_size})
json.dump(out, open(sys.argv[2], "w"))
print(f"{len(out)} candidates")
