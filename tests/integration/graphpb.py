"""graphpb.py - a JSON graph (graph-format.md) as kex.v1 protobuf messages: Scalar, Node, Graph.

For the Python tests (through kexdtest.py) and the fuzz corpus generators (tests/fuzz/make_*_corpus.py).
The generated stubs (kex/v1/kex_pb2.py) must be on sys.path when a function here is called.
"""
import base64


def scalar(v):
    from kex.v1 import kex_pb2
    if isinstance(v, bool):
        return kex_pb2.Scalar(bool_value=v)
    if isinstance(v, int):
        return kex_pb2.Scalar(int_value=v)
    if isinstance(v, float):
        return kex_pb2.Scalar(float_value=v)
    return kex_pb2.Scalar(special=v)


def node_pb(n):
    from kex.v1 import kex_pb2
    p = kex_pb2.Node(op=n["op"], src=n.get("src", []), dtype=n.get("dtype", ""), shape=n.get("shape", []),
                     axis=n.get("axis", []), device=n.get("device", ""))
    if "arg" in n:
        a = n["arg"]
        if n["op"] in ("RESHAPE", "EXPAND"):
            p.new_shape.values.extend(a)
            p.new_shape.SetInParent()
        elif n["op"] == "PERMUTE":
            p.order.values.extend(a)
            p.order.SetInParent()
        elif n["op"] in ("PAD", "SHRINK"):
            p.pairs.pairs.extend(kex_pb2.Pair(first=x, second=y) for x, y in a)
            p.pairs.SetInParent()
        elif n["op"] == "STRIDE":
            p.strides.values.extend(a)
            p.strides.SetInParent()
    if "value" in n:
        p.value.CopyFrom(scalar(n["value"]))
    if "data" in n:
        p.data = base64.b64decode(n["data"])
    if "fill" in n:
        f = n["fill"]
        if "random" in f:
            p.fill_random = f["random"]
        elif "arange" in f:
            p.fill_arange = f["arange"]
        else:
            p.fill_value.CopyFrom(scalar(f["value"]))
    if "buffer" in n:
        p.buffer = n["buffer"]
    return p


def graph_pb(g, device=None):
    """A JSON graph as a kex.v1 Graph, on device (default: the graph's own "device", else kexd's default)."""
    from kex.v1 import kex_pb2
    return kex_pb2.Graph(format=g.get("format", ""), device=g.get("device", "") if device is None else device,
                         nodes=[node_pb(n) for n in g["nodes"]], outputs=g["outputs"])
