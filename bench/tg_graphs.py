#!/usr/bin/env python3
"""bench/tg_graphs.py - kex graphs of tinygrad programs the cases do not have.

The performance issue names six graphs; two of its programs have no graph in
../shared/cases: a transformer block (forward) and a GELU MLP forward +
backward.  This script runs each program with tinygrad 0.9.0
(../shared/anchors) and records every LazyBuffer method the Tensor code calls
(top-level calls only: what a method calls inside itself is what replaying
the call does again) as one kex.graph.v1 node, in call order -- the reverse
of replay_graph.py's node-to-call mapping.  Replaying the recorded graph
therefore makes the same calls on the same LazyBuffers.  It checks that the
kernel count of tinygrad's create_schedule on the program's own outputs
equals replay_graph.count of the recorded graph, and writes
bench/graphs/NAME.json (a bare graph; bench/plan.py times it).

Usage: /usr/bin/python3 bench/tg_graphs.py [--out bench/graphs]
Needs python3-numpy and python3-tqdm (tinygrad's imports); GPU=1 rules, as bench/plan.py.
"""
import argparse
import functools
import gc
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANCHORS = os.path.join(ROOT, "..", "shared", "anchors")


class Recorder:
    """Turns top-level LazyBuffer calls into kex.graph.v1 nodes (install() patches the class)."""

    def __init__(self):
        self.nodes, self.index, self.keep, self.depth = [], {}, [], 0

    def src(self, lb):
        if id(lb) not in self.index:
            raise ValueError("a source LazyBuffer was not made by a recorded call")
        return self.index[id(lb)]

    def add(self, lb, node):
        self.nodes.append(node)
        self.index[id(lb)] = len(self.nodes) - 1
        self.keep.append(lb)  # ids stay unique while the recording lives
        return lb

    def node(self, name, args, kwargs):
        """The node of the call name(*args, **kwargs) (args[0] is self except for loadop)."""
        from replay_graph import kex_dtype
        from tinygrad.ops import LoadOps, ReduceOps
        me = args[0] if name != "loadop" else None
        if name == "loadop":
            op, shape, dtype, device = args[:4]
            arg = args[4] if len(args) > 4 else kwargs.get("arg")
            if op is LoadOps.EMPTY:
                return {"op": "EMPTY", "dtype": kex_dtype(dtype), "shape": list(shape)}
            if op is LoadOps.CONST and shape == ():
                return {"op": "CONST", "dtype": kex_dtype(dtype), "shape": [], "value": json_value(arg)}
            raise ValueError(f"loadop {op} is not expressible")
        if name == "const":
            shape = args[2] if len(args) > 2 else kwargs.get("shape")
            shape = me.shape if shape is None else shape
            return {"op": "CONST", "dtype": kex_dtype(me.dtype), "shape": list(shape), "value": json_value(args[1])}
        if name == "e":
            return {"op": args[1].name, "src": [self.src(x) for x in (me, *args[2:])]}
        if name == "r":
            return {"op": "REDUCE_SUM" if args[1] is ReduceOps.SUM else "REDUCE_MAX", "src": [self.src(me)],
                    "axis": list(args[2])}
        if name == "cast":
            bitcast = args[2] if len(args) > 2 else kwargs.get("bitcast", False)
            return {"op": "BITCAST" if bitcast else "CAST", "src": [self.src(me)], "dtype": kex_dtype(args[1])}
        if name in ("reshape", "expand", "permute", "stride"):
            return {"op": name.upper(), "src": [self.src(me)], "arg": list(args[1])}
        if name in ("pad", "shrink"):
            return {"op": name.upper(), "src": [self.src(me)], "arg": [list(p) for p in args[1]]}
        if name == "contiguous":
            return {"op": "CONTIGUOUS", "src": [self.src(me)]}
        if name == "assign":
            return {"op": "ASSIGN", "src": [self.src(args[1]), self.src(me)]}
        raise ValueError(f"LazyBuffer.{name} is not recorded")

    def wrap(self, name, fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            if self.depth:
                return fn(*args, **kwargs)
            node = None if name == "loadop" else self.node(name, args, kwargs)  # sources before the call
            self.depth += 1
            try:
                lb = fn(*args, **kwargs)
            finally:
                self.depth -= 1
            return self.add(lb, node or self.node(name, args, kwargs))
        return call

    METHODS = ("e", "r", "cast", "reshape", "expand", "permute", "stride", "pad", "shrink", "contiguous", "assign",
               "const", "loadop")

    def install(self):
        from tinygrad.lazy import LazyBuffer
        self.saved = {n: LazyBuffer.__dict__[n] for n in self.METHODS}
        for n in self.METHODS:
            w = self.wrap(n, getattr(LazyBuffer, n))
            setattr(LazyBuffer, n, staticmethod(w) if n == "loadop" else w)

    def uninstall(self):
        from tinygrad.lazy import LazyBuffer
        for n, f in self.saved.items():
            setattr(LazyBuffer, n, f)

    def graph(self, outs):
        return {"format": "kex.graph.v1", "device": "default", "nodes": self.nodes,
                "outputs": [self.src(t.lazydata) for t in outs]}


def json_value(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else "inf" if v > 0 else "-inf"
    return v


def layernorm(x, w, b):
    return x.layernorm(axis=-1, eps=1e-5) * w + b


def transformer_block():
    """Pre-norm block, forward: x + attn(ln1(x)); that + mlp(ln2(that)); causal attention, 4 heads, GELU MLP."""
    from tinygrad import Tensor
    B, T, D, H = 2, 64, 128, 4
    x = Tensor.empty(B, T, D)
    p = {n: Tensor.empty(*s) for n, s in [("ln1_w", (D,)), ("ln1_b", (D,)), ("wq", (D, D)), ("wk", (D, D)),
                                           ("wv", (D, D)), ("wo", (D, D)), ("ln2_w", (D,)), ("ln2_b", (D,)),
                                           ("w1", (D, 4 * D)), ("b1", (4 * D,)), ("w2", (4 * D, D)), ("b2", (D,))]}
    h = layernorm(x, p["ln1_w"], p["ln1_b"])
    q, k, v = (h.linear(p[w]).reshape(B, T, H, D // H).transpose(1, 2) for w in ("wq", "wk", "wv"))
    a = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
    x = x + a.linear(p["wo"])
    h = layernorm(x, p["ln2_w"], p["ln2_b"])
    return [x + h.linear(p["w1"], p["b1"]).gelu().linear(p["w2"], p["b2"])]


def gelu_mlp_fwd_bwd():
    """Two linear layers with GELU between, mean-square loss, backward: the loss and the four gradients."""
    from tinygrad import Tensor
    B, D, Hd = 64, 256, 1024
    x, y = Tensor.empty(B, D), Tensor.empty(B, D)
    w1, b1 = Tensor.empty(D, Hd, requires_grad=True), Tensor.empty(Hd, requires_grad=True)
    w2, b2 = Tensor.empty(Hd, D, requires_grad=True), Tensor.empty(D, requires_grad=True)
    loss = (x.linear(w1, b1).gelu().linear(w2, b2) - y).square().mean()
    loss.backward()
    return [loss, w1.grad, b1.grad, w2.grad, b2.grad]


PROGRAMS = {"transformer_block": transformer_block, "gelu_mlp_fwd_bwd": gelu_mlp_fwd_bwd}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "graphs"))
    a = ap.parse_args()
    sys.path[:0] = [ANCHORS, os.path.join(ANCHORS, "tinygrad-0.9.0")]
    os.environ.setdefault("GPU", "1")
    import replay_graph
    from tinygrad.engine.schedule import create_schedule
    os.makedirs(a.out, exist_ok=True)
    bad = 0
    for name, prog in PROGRAMS.items():
        rec = Recorder()
        rec.install()
        try:
            outs = prog()
        finally:
            rec.uninstall()
        g = rec.graph(outs)
        direct = replay_graph.count_kernels(create_schedule([t.lazydata for t in outs]))
        # the program's LazyBuffers go before the replay: alive, its scheduled ones (made of constants alone, such as
        # the causal mask) would be lazycache hits for the replay, which would then schedule less
        del outs, rec
        gc.collect()
        replayed, _, _ = replay_graph.count(g)
        ok = direct == replayed
        bad += not ok
        json.dump(g, open(os.path.join(a.out, name + ".json"), "w"), indent=None, separators=(",", ":"))
        print(f"{name}: {len(g['nodes'])} nodes, tinygrad's kernels {direct}, replayed {replayed}: "
              f"{'same' if ok else 'DIFFERENT'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
