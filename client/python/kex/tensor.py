"""A lazy Tensor that builds a kex graph (shared/graph-format.md) in the client.

Every method decomposes into LazyBuffer-level graph nodes exactly as
tinygrad 0.9.0's Tensor and function.py do (the daemon replays them with the
same folding rules, so the same program gives the same kernels): Python
scalars become 0-d CONSTs in the tensor's dtype, reshaped to all-1 dims and
expanded; binary ops broadcast and promote with least_upper_dtype; exp is
EXP2(x*1/ln2), log is LOG2(x)*ln2, relu MAX(x,0), sigmoid 1/(1+EXP2(x*-1/ln2)),
tanh 2*sigmoid(2x)-1; a >= b is (a<b) == False; slicing is SHRINK, a STRIDE
of +-1s, then pad/reshape/shrink for steps; matmul is reshape + permute +
MUL + REDUCE_SUM.  Nothing is computed until realize()/numpy()/plan().
"""
import base64
import functools
import math

import numpy as np

from . import dtypes as dt
from ._client import Error, default_client, pb


def _prod(xs):
    return functools.reduce(lambda a, b: a * b, xs, 1)


class _Node:
    """One graph node: op, sources, JSON-form fields, and its shape and dtype."""
    __slots__ = ("op", "src", "fields", "shape", "dtype")

    def __init__(self, op, src, shape, dtype, /, **fields):
        self.op, self.src, self.shape, self.dtype, self.fields = op, tuple(src), tuple(shape), dtype, fields


def _serialize(outputs):
    """The reachable nodes in topological order: (list of (node, JSON dict), output indices)."""
    index, order = {}, []
    stack = [(n, False) for n in reversed(outputs)]
    while stack:
        n, expanded = stack.pop()
        if id(n) in index:
            continue
        if expanded or not n.src:
            if id(n) not in index:
                index[id(n)] = len(order)
                order.append(n)
            continue
        stack.append((n, True))
        for s in reversed(n.src):
            if id(s) not in index:
                stack.append((s, False))
    return order, index, [index[id(o)] for o in outputs]


def graph_json(outputs, device="default"):
    """The kex.graph.v1 JSON dict of the graph that realizes `outputs` (nodes)."""
    order, index, outs = _serialize(outputs)
    nodes = []
    for n in order:
        d = {"op": n.op}
        if n.src:
            d["src"] = [index[id(s)] for s in n.src]
        for k, v in n.fields.items():
            d[k] = base64.b64encode(v).decode() if k == "data" else v
        nodes.append(d)
    return {"format": "kex.graph.v1", "device": device, "nodes": nodes, "outputs": outs}


def _scalar_pb(v):
    if isinstance(v, bool):
        return pb.Scalar(bool_value=v)
    if isinstance(v, int):
        return pb.Scalar(int_value=v)
    if isinstance(v, str):
        return pb.Scalar(special=v)
    if math.isnan(v):
        return pb.Scalar(special="nan")
    if math.isinf(v):
        return pb.Scalar(special="inf" if v > 0 else "-inf")
    return pb.Scalar(float_value=v)


def graph_pb(outputs, device=""):
    """The protobuf Graph that realizes `outputs` (nodes)."""
    order, index, outs = _serialize(outputs)
    g = pb.Graph(format="kex.graph.v1", device=device, outputs=outs)
    for n in order:
        m = g.nodes.add(op=n.op, src=[index[id(s)] for s in n.src])
        f = n.fields
        if "dtype" in f:
            m.dtype = f["dtype"]
        if "shape" in f:
            m.shape.extend(f["shape"])
        if "arg" in f:
            if n.op in ("RESHAPE", "EXPAND"):
                m.new_shape.values.extend(f["arg"])
            elif n.op == "PERMUTE":
                m.order.values.extend(f["arg"])
            elif n.op == "STRIDE":
                m.strides.values.extend(f["arg"])
            else:
                for a, b in f["arg"]:
                    m.pairs.pairs.add(first=a, second=b)
        if "axis" in f:
            m.axis.extend(f["axis"])
        if "value" in f:
            m.value.CopyFrom(_scalar_pb(f["value"]))
        if "data" in f:
            m.data = f["data"]
        if "buffer" in f:
            m.buffer = f["buffer"]
        if "fill" in f:
            k, v = next(iter(f["fill"].items()))
            if k == "random":
                m.fill_random = v
            elif k == "arange":
                m.fill_arange = True
            else:
                m.fill_value.CopyFrom(_scalar_pb(v))
    return g


def _json_value(v):
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


# ---- LazyBuffer-level constructors ----

def _e(op, *srcs):
    out = "bool" if op in ("CMPLT", "CMPEQ") else srcs[-1].dtype
    return _Node(op, srcs, srcs[0].shape, out)


def _const_node(value, dtype, shape=()):
    return _Node("CONST", (), shape, dtype, dtype=dtype, shape=list(shape), value=_json_value(dt.as_const(value, dtype)))


class Tensor:
    """A lazy tensor on a kexd connection (kex.connect sets the default one)."""

    def __init__(self, data, dtype=None, client=None, upload=False, _node=None):
        self.client = client
        if _node is not None:
            self.node = _node
            return
        if isinstance(data, Tensor):
            self.node, self.client = data.node, data.client
            return
        if isinstance(data, (bool, int, float)) and not isinstance(data, np.generic):
            d = dtype or dt.from_py(data)
            self.node = _const_node(data, d)
            return
        a = np.asarray(data)
        if dtype is not None:
            a = a.astype(dt.to_numpy(dtype))
        elif a.dtype == np.float64 and not isinstance(data, np.ndarray):
            a = a.astype(np.float32)  # Python lists of floats take default_float, as tinygrad
        a = np.ascontiguousarray(a)
        d = dt.from_numpy(a.dtype)
        if upload:
            handle = self._client().upload(a)
            self.node = _Node("BUFFER", (), a.shape, d, dtype=d, shape=list(a.shape), buffer=handle)
        else:
            self.node = _Node("BUFFER", (), a.shape, d, dtype=d, shape=list(a.shape), data=a.tobytes())

    def _client(self):
        return self.client if self.client is not None else default_client()

    def _new(self, node):
        return Tensor(None, client=self.client, _node=node)

    # ---- properties ----
    @property
    def shape(self): return self.node.shape
    @property
    def dtype(self): return self.node.dtype
    @property
    def ndim(self): return len(self.node.shape)
    def numel(self): return _prod(self.shape)
    def __repr__(self): return f"<kex.Tensor {self.node.op} shape={self.shape} dtype={self.dtype}>"

    # ---- graph, realize ----
    def graph_json(self, *more):
        return graph_json([self.node] + [t.node for t in more])

    def plan(self, *more):
        """Schedule this tensor (and `more`) on kexd without running: the PlanReply (.kernels, .items)."""
        return self._client().plan(graph_pb([self.node] + [t.node for t in more]))

    def tune(self, *more, beam=2, progress=None, device=None, timeout=None):
        """Beam-search the kernels of this tensor (and `more`) on kexd: a list of kex.TuneResult."""
        return self._client().tune([self] + list(more), beam=beam, progress=progress, device=device, timeout=timeout)

    def realize(self, *more, timeout=None):
        """Compute this tensor (and `more`) on kexd; each becomes a buffer the job holds."""
        ts = [self] + list(more)
        done = self._client().submit(graph_pb([t.node for t in ts]), return_bytes=False, timeout=timeout)
        for t, o in zip(ts, done.outputs):
            t.node = _Node("BUFFER", (), tuple(o.shape), o.dtype, dtype=o.dtype, shape=list(o.shape), buffer=o.handle)
        return self

    def numpy(self, timeout=None):
        """Realize self.contiguous() and return it as a numpy array (inline bytes or a Download)."""
        c = self._client()
        src = self.contiguous()
        done = c.submit(graph_pb([src.node]), return_bytes=True, timeout=timeout)
        o = done.outputs[0]
        data = o.data if o.has_data else c.download(o.handle)[2]
        # free the output unless it is a buffer the graph already held (contiguous() of a
        # realized buffer is that buffer, as in tinygrad)
        held = {n.fields.get("buffer") for n in _serialize([src.node])[0]}
        if o.handle and o.handle not in held:
            try:
                c.free([o.handle])
            except Error:
                pass
        return np.frombuffer(data, dtype=dt.to_numpy(o.dtype)).reshape(tuple(o.shape)).copy()

    def item(self): return self.numpy().item()
    def tolist(self): return self.numpy().tolist()

    # ---- movement ----
    def _resolve_dim(self, d, outer=False):
        n = max(1, self.ndim + outer)
        if not -n <= d < n:
            raise IndexError(f"dim={d} out of range {[-n, n - 1]}")
        return d + self.ndim + outer if d < 0 else d

    def reshape(self, shape, *args):
        new = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,) + args
        new = tuple(-_prod(self.shape) // _prod(new) if s == -1 else (s if s is not None else self.shape[i])
                    for i, s in enumerate(new))
        if _prod(new) != _prod(self.shape):
            raise ValueError(f"cannot reshape {self.shape} to {new}")
        return self if new == self.shape else self._new(_Node("RESHAPE", (self.node,), new, self.dtype, arg=list(new)))

    def _broadcast_to(self, shape):
        shape = tuple(shape)
        if shape == self.shape:
            return self
        if self.ndim > len(shape):
            raise ValueError(f"cannot broadcast tensor with shape={self.shape} to {shape=}")
        r = (1,) * (len(shape) - self.ndim) + self.shape
        if not all(a in (b, 1) for a, b in zip(r, shape)):
            raise ValueError(f"cannot broadcast tensor with shape={self.shape} to {shape=}")
        x = self.reshape(r)
        return x if x.shape == shape else x._new(_Node("EXPAND", (x.node,), shape, x.dtype, arg=list(shape)))

    def expand(self, shape, *args):
        new = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,) + args
        old = (1,) * (len(new) - self.ndim) + self.shape
        return self._broadcast_to(tuple(o if s == -1 or s is None else s for s, o in zip(new, old)))

    def permute(self, order, *args):
        order = tuple(order) if isinstance(order, (tuple, list)) else (order,) + args
        order = tuple(self._resolve_dim(o) for o in order)
        if sorted(order) != list(range(self.ndim)):
            raise ValueError(f"invalid permutation {order} of {self.shape}")
        return self._new(_Node("PERMUTE", (self.node,), tuple(self.shape[o] for o in order), self.dtype,
                               arg=list(order)))

    def transpose(self, ax1=1, ax2=0):
        order = list(range(self.ndim))
        order[ax1], order[ax2] = order[ax2], order[ax1]
        return self.permute(order)

    @property
    def T(self): return self.transpose()

    def flip(self, axis, *args):
        axis = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,) + args
        axis = {self._resolve_dim(a) for a in axis}
        return self._new(_Node("STRIDE", (self.node,), self.shape, self.dtype,
                               arg=[-1 if i in axis else 1 for i in range(self.ndim)]))

    def shrink(self, arg):
        if all(x is None or tuple(x) == (0, s) for x, s in zip(arg, self.shape)):
            return self
        arg = [list(x) if x is not None else [0, s] for x, s in zip(arg, self.shape)]
        for (b, e), s in zip(arg, self.shape):
            if not 0 <= b <= e <= s:
                raise ValueError(f"shrink {arg} out of range of {self.shape}")
        return self._new(_Node("SHRINK", (self.node,), tuple(e - b for b, e in arg), self.dtype, arg=arg))

    def pad(self, arg, value=0.0):
        if all(x is None or tuple(x) == (0, 0) for x in arg):
            return self
        narg = [list(x) if x is not None else [0, 0] for x in arg]
        ret = self._new(_Node("PAD", (self.node,), tuple(s + b + a for s, (b, a) in zip(self.shape, narg)),
                              self.dtype, arg=narg))
        if value == 0:
            return ret
        ones = Tensor.full(self.shape, 1, dtype=self.dtype, client=self.client)
        return ret + ones.pad(narg).where(0, value)

    def __getitem__(self, indices):
        if not isinstance(indices, tuple):
            indices = (indices,)
        indices = list(indices)
        for i in indices:
            if not (i is None or i is Ellipsis or isinstance(i, (int, slice))):
                raise IndexError(f"kex: index {i!r} not supported (int, slice, None, ...)")
        ell = [k for k, i in enumerate(indices) if i is Ellipsis]
        if len(ell) > 1:
            raise IndexError("indices can only have a single ellipsis ('...')")
        num = len(indices) - len(ell) - sum(1 for i in indices if i is None)
        if num > self.ndim:
            raise IndexError(f"too many indices={num} for ndim={self.ndim}")
        fill = ell[0] if ell else len(indices)
        indices[fill:fill + 1] = [slice(None)] * (self.ndim - num)
        none_dims = [k for k, i in enumerate(indices) if i is None]
        filt = [i for i in indices if i is not None]
        int_dims = [k for k, i in enumerate(filt) if isinstance(i, int)]
        parsed = []
        for k, i in enumerate(filt):
            size = self.shape[k]
            if isinstance(i, int):
                if i >= size or i < -size:
                    raise IndexError(f"index={i} is out of bounds on dim={k} with size={size}")
                parsed.append(((i, i + 1), 1) if i >= 0 else ((size + i, size + i + 1), 1))
            else:
                if i.step == 0:
                    raise ValueError(f"index={i} on dim={k} cannot have 0 as step")
                s, e, st = i.indices(size)
                parsed.append(((0, 0) if st * (e - s) < 0 else (s, e) if st > 0 else (e + 1, s + 1), st))
        new_slice, strides = zip(*parsed) if parsed else ((), ())
        ret = self.shrink(new_slice).flip(tuple(k for k, s in enumerate(strides) if s < 0))
        if any(abs(s) != 1 for s in strides):
            strides = tuple(abs(s) for s in strides)
            ret = ret.pad(tuple((0, -(-sh // s) * s - sh) for s, sh in zip(strides, ret.shape)))
            ret = ret.reshape(tuple(x for s, sh in zip(strides, ret.shape) for x in (sh // s, s)))
            ret = ret.shrink(tuple(x for sh in ret.shape[::2] for x in ((0, sh), (0, 1)))).reshape(ret.shape[::2])
        new_shape = list(ret.shape)
        for d in none_dims:
            new_shape.insert(d, 1)
        for d in tuple(d + sum(1 for n in none_dims if d >= n) for d in reversed(int_dims)):
            new_shape.pop(d)
        return ret.reshape(new_shape)

    # ---- creation helpers ----
    @staticmethod
    def full(shape, value, dtype=None, client=None):
        shape = tuple(shape)
        t = Tensor(value, dtype=dtype, client=client)
        return t.reshape((1,) * len(shape)).expand(shape)

    # ---- elementwise (LazyBuffer calls, tinygrad's function.py) ----
    def _const(self, v):
        return _const_node(v, self.dtype, self.shape)

    def cast(self, dtype):
        return self if dtype == self.dtype else self._new(_Node("CAST", (self.node,), self.shape, dtype, dtype=dtype))

    def contiguous(self):
        return self._new(_Node("CONTIGUOUS", (self.node,), self.shape, self.dtype))

    def _broadcasted(self, y, reverse=False, match_dtype=True):
        x = self
        if not isinstance(y, Tensor):
            if not isinstance(y, (bool, int, float)):
                raise TypeError(f"kex: cannot combine a Tensor with {type(y).__name__}")
            if dt.is_float(x.dtype) or (dt.is_int(x.dtype) and isinstance(y, int) and not isinstance(y, bool)):
                y_dtype = x.dtype
            else:
                y_dtype = dt.from_py(y)
            y = Tensor(dt.as_const(y, y_dtype), dtype=y_dtype, client=self.client)
        if match_dtype:
            out = dt.least_upper_dtype(x.dtype, y.dtype)
            x, y = x.cast(out), y.cast(out)
        if reverse:
            x, y = y, x
        shape = _broadcast_shape(x.shape, y.shape)
        return x._broadcast_to(shape), y._broadcast_to(shape)

    def _binop(self, op, y, reverse=False):
        x, y = self._broadcasted(y, reverse)
        return x._new(_e(op, x.node, y.node))

    def add(self, y, reverse=False): return self._binop("ADD", y, reverse)
    def sub(self, y, reverse=False): return self._binop("SUB", y, reverse)
    def mul(self, y, reverse=False): return self._binop("MUL", y, reverse)
    def xor(self, y, reverse=False): return self._binop("XOR", y, reverse)

    def div(self, y, reverse=False):
        n, d = self._broadcasted(y, reverse)
        n, d = n.cast(dt.least_upper_float(n.dtype)), d.cast(dt.least_upper_float(d.dtype))
        return n._new(_e("DIV", n.node, d.node))

    def __add__(self, y): return self.add(y)
    def __radd__(self, y): return self.add(y, True)
    def __sub__(self, y): return self.sub(y)
    def __rsub__(self, y): return self.sub(y, True)
    def __mul__(self, y): return self.mul(y)
    def __rmul__(self, y): return self.mul(y, True)
    def __truediv__(self, y): return self.div(y)
    def __rtruediv__(self, y): return self.div(y, True)
    def __xor__(self, y): return self.xor(y)
    def __neg__(self): return self.neg()
    def __matmul__(self, y): return self.matmul(y)
    def __rmatmul__(self, y): return self.matmul(y, True)

    def __lt__(self, y): return self._binop("CMPLT", y, False)
    def __gt__(self, y): return self._binop("CMPLT", y, True)
    def __eq__(self, y): return self._binop("CMPEQ", y, True)  # type: ignore[override]
    def __ge__(self, y): return (self < y).logical_not()
    def __le__(self, y): return (self > y).logical_not()
    def __ne__(self, y): return (self == y).logical_not()  # type: ignore[override]
    __hash__ = object.__hash__

    def logical_not(self):
        x, y = self._broadcasted(False)
        return x._new(_e("CMPEQ", x.node, y.node))

    def neg(self):
        return self._new(_e("NEG", self.node)) if self.dtype != "bool" else self.logical_not()

    def _unary(self, op, cast_float=True):
        x = self.cast(dt.least_upper_float(self.dtype)) if cast_float else self
        return x._new(_e(op, x.node))

    def sqrt(self): return self._unary("SQRT")
    def sin(self): return self._unary("SIN")

    def exp(self):
        x = self.cast(dt.least_upper_float(self.dtype))
        return x._new(_e("EXP2", _e("MUL", x.node, x._const(1 / math.log(2)))))

    def log(self):
        x = self.cast(dt.least_upper_float(self.dtype))
        return x._new(_e("MUL", _e("LOG2", x.node), x._const(math.log(2))))

    def relu(self):
        return self._new(_e("MAX", self.node, self._const(0)))

    def sigmoid(self):
        x = self.cast(dt.least_upper_float(self.dtype))
        e = _e("EXP2", _e("MUL", x.node, x._const(-1 / math.log(2))))
        return x._new(_e("DIV", x._const(1), _e("ADD", x._const(1), e)))

    def tanh(self): return 2.0 * ((2.0 * self).sigmoid()) - 1.0
    def reciprocal(self):
        x = self.cast(dt.least_upper_float(self.dtype))
        return x._new(_e("DIV", x._const(1), x.node))
    def square(self): return self * self
    def abs(self): return self.relu() + (-self).relu()
    def maximum(self, y):
        return (self < y).where(y, (self == y).where(((self * 0.5 + y * 0.5).cast(self.dtype)), self))
    def minimum(self, y): return -((-self).maximum(-y))

    def where(self, a, b):
        if isinstance(a, Tensor):
            a, b = a._broadcasted(b)
        elif isinstance(b, Tensor):
            b, a = b._broadcasted(a)
        x_, y = self._broadcasted(a, match_dtype=False)
        x, z = x_._broadcasted(b, match_dtype=False)
        y, z = y._broadcasted(z)
        c = x.cast("bool")
        return c._new(_Node("WHERE", (c.node, y.node, z.node), c.shape, y.dtype))

    # ---- reduce ----
    def _reduce(self, op, axis=None, keepdim=False):
        if self.ndim == 0:
            if axis is not None and axis not in (-1, 0):
                raise IndexError(f"axis={axis} out of range of [-1, 0]")
            axis = None
        ax = tuple(range(self.ndim)) if axis is None else ((axis,) if isinstance(axis, int) else tuple(axis))
        ax = tuple(self._resolve_dim(a) for a in ax)
        shape = tuple(1 if i in ax else s for i, s in enumerate(self.shape))
        ret = self._new(_Node(op, (self.node,), shape, self.dtype, axis=list(ax)))
        return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in ax))

    def sum(self, axis=None, keepdim=False, acc_dtype=None):
        ret = self.cast(acc_dtype or dt.sum_acc_dtype(self.dtype))._reduce("REDUCE_SUM", axis, keepdim)
        return ret.cast(self.dtype) if self.dtype in ("float16", "bfloat16") else ret

    def max(self, axis=None, keepdim=False): return self._reduce("REDUCE_MAX", axis, keepdim)
    def min(self, axis=None, keepdim=False): return -((-self).max(axis=axis, keepdim=keepdim))

    def mean(self, axis=None, keepdim=False):
        out = self.dtype if dt.is_float(self.dtype) else "float32"
        num = self.cast(dt.sum_acc_dtype(self.dtype)).sum(axis=axis, keepdim=keepdim)
        ax = tuple(range(self.ndim)) if axis is None else ((axis,) if isinstance(axis, int) else tuple(axis))
        ax = {self._resolve_dim(a) for a in ax} if self.ndim else set()
        return num.div(_prod(s for i, s in enumerate(self.shape) if i in ax and s != 1)).cast(out)

    def softmax(self, axis=-1):
        m = self - self.max(axis=axis, keepdim=True)
        e = m.exp()
        return e.div(e.sum(axis=axis, keepdim=True))

    def log_softmax(self, axis=-1):
        m = self - self.max(axis=axis, keepdim=True)
        return m - m.exp().sum(axis=axis, keepdim=True).log()

    # ---- matmul ----
    def dot(self, w, acc_dtype=None):
        n1, n2 = self.ndim, w.ndim
        if n1 == 0 or n2 == 0:
            raise ValueError(f"both arguments to matmul need to be at least 1D, but they are {n1}D and {n2}D")
        if self.shape[-1] != w.shape[-min(n2, 2)]:
            raise ValueError(f"Input Tensor shapes {self.shape} and {w.shape} cannot be multiplied "
                             f"({self.shape[-1]} != {w.shape[-min(n2, 2)]})")
        k = min(n1 - 1, n2 - 1, 1)
        x = self.reshape(*self.shape[0:-1], *[1] * k, self.shape[-1])
        w = w.reshape(*w.shape[0:-2], *[1] * k, *w.shape[-min(n2, 2):]).transpose(-1, -min(n2, 2))
        return (x * w).sum(-1, acc_dtype=acc_dtype).cast(dt.least_upper_dtype(x.dtype, w.dtype))

    def matmul(self, x, reverse=False, acc_dtype=None):
        return x.dot(self, acc_dtype=acc_dtype) if reverse else self.dot(x, acc_dtype=acc_dtype)

    # ---- assign ----
    def assign(self, x):
        """Write x into this tensor's buffer on kexd (an ASSIGN node); an unrealized target just takes x."""
        if not isinstance(x, Tensor):
            x = Tensor.full(self.shape, x, dtype=self.dtype, client=self.client)
        if x.shape != self.shape or x.dtype != self.dtype:
            raise ValueError(f"assign shape/dtype mismatch: {self.shape} {self.dtype} vs {x.shape} {x.dtype}")
        n = self.node
        if n.op != "BUFFER":
            self.node = x.node
            return self
        if "buffer" not in n.fields:  # inline data: make it a buffer the job holds first
            a = np.frombuffer(n.fields["data"], dtype=dt.to_numpy(n.dtype)).reshape(n.shape)
            handle = self._client().upload(a)
            n = self.node = _Node("BUFFER", (), n.shape, n.dtype, dtype=n.dtype, shape=list(n.shape), buffer=handle)
        self.node = _Node("ASSIGN", (x.node, n), n.shape, n.dtype)
        return self


def _broadcast_shape(*shapes):
    n = max(len(s) for s in shapes)
    padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded):
        big = max(dims)
        if any(d not in (1, big) for d in dims):
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(0 if 0 in dims else big)
    return tuple(out)


def tensor(data, dtype=None, client=None, upload=False):
    """A Tensor of numpy/list data (inline in the graph; upload=True sends it once with Upload)."""
    return Tensor(data, dtype=dtype, client=client, upload=upload)
