"""A lazy Tensor that builds a kex graph (shared/graph-format.md) in the client.

Every method decomposes into LazyBuffer-level graph nodes exactly as
tinygrad 0.9.0's Tensor and function.py do (the daemon replays them with the
same folding rules, so the same program gives the same kernels): Python
scalars become 0-d CONSTs in the tensor's dtype, reshaped to all-1 dims and
expanded; binary ops broadcast and promote with least_upper_dtype; exp is
EXP2(x*1/ln2), log is LOG2(x)*ln2, relu MAX(x,0), sigmoid 1/(1+EXP2(x*-1/ln2)),
tanh 2*sigmoid(2x)-1, cos sin(pi/2-x); a >= b is (a<b) == False; slicing is
SHRINK, a STRIDE of +-1s, then pad/reshape/shrink for steps; matmul is
reshape + permute + MUL + REDUCE_SUM; arange is a cumsum of a full tensor
(pad + pool + REDUCE_SUM, which the daemon folds like tinygrad); argmax
compares with the max and picks the first index with a reversed arange.
Nothing is computed until realize()/numpy()/plan().

Devices: kexd runs a graph on one device, the outputs' (a tensor's device is
its inputs' or COPY's; none means the server's default).  t.to(d) of a lazy
tensor is a COPY node, so its graph runs on d; a tensor holding buffers on
kexd is copied through the client.

numpy interop: np.asarray(t) (t.__array__) is the computed data;
numpy's operators defer to the Tensor (__array_ufunc__ = None), so
`np.ones(3) + t` is a Tensor; numpy arrays and lists in an operation become
Tensors of their own dtype, numpy scalars act like Python scalars.
bool(t), int(t), float(t) and t.item() compute a one-element tensor.
"""
import base64
import builtins
import functools
import math
import time

import numpy as np

from . import dtypes as dt
from ._client import Error, default_client, pb

# numpy() keeps a host copy of results up to this size (repr, bool(), item() reuse it);
# repr downloads a realized buffer up to this size for its preview
_HOST_CACHE_MAX = 1 << 20
# numpy() asks for the result's bytes inline in the Done event up to this size, else Downloads them
_INLINE_MAX = 1 << 20


def _prod(xs):
    return functools.reduce(lambda a, b: a * b, xs, 1)


def _argfix(*x):
    """tinygrad's argfix: f(2, 3) and f((2, 3)) alike."""
    if x and isinstance(x[0], (tuple, list)):
        if len(x) != 1:
            raise ValueError(f"bad arg {x}")
        return tuple(x[0])
    return x


def _flatten(ls):
    return [x for sub in ls for x in sub]


def _fully_flatten(ls):
    return [x for sub in ls for x in (_fully_flatten(sub) if isinstance(sub, (list, tuple)) else [sub])]


class _Node:
    """One graph node: op, sources, JSON-form fields, and its shape, dtype and device.

    device: the node's "device" field (inputs, COPY), else the first device
    among its sources; None means the graph's device.
    """
    __slots__ = ("op", "src", "fields", "shape", "dtype", "device")

    def __init__(self, op, src, shape, dtype, /, **fields):
        self.op, self.src, self.shape, self.dtype, self.fields = op, tuple(src), tuple(shape), dtype, fields
        self.device = fields.get("device") or next((s.device for s in self.src if s.device), None)


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


def _graph_device(outputs):
    """The device a graph of `outputs` (nodes) runs on: theirs, or None (the server's default).

    kexd runs a submission on one device, the graph's: every node without a device
    of its own runs there, and every held buffer must be there."""
    devs = {n.device for n in outputs if n.device}
    if len(devs) > 1:
        raise ValueError(f"kex: outputs on different devices ({', '.join(sorted(devs))}) cannot be computed in one "
                         f"graph; realize them separately")
    return devs.pop() if devs else None


def graph_json(outputs, device=None):
    """The kex.graph.v1 JSON dict of the graph that realizes `outputs` (nodes).

    device: the graph's device; None: the outputs' device, else "default"."""
    device = device or _graph_device(outputs) or "default"
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


_SCALAR_FIELDS = ((bool, "bool_value"), (int, "int_value"), (str, "special"))  # bool before int: a bool is an int


def _scalar_pb(v):
    """A node's value as kex.v1.Scalar: bool, int, a special name, or a float (nan and the infinities by name)."""
    for kind, field in _SCALAR_FIELDS:
        if isinstance(v, kind):
            return pb.Scalar(**{field: v})
    if not math.isfinite(v):
        return pb.Scalar(special="nan" if math.isnan(v) else "inf" if v > 0 else "-inf")
    return pb.Scalar(float_value=v)


def fill_node(m, f):
    """Set node m's (a kex.v1.Node with its op) dtype, shape, movement arg, axis and value from fields f."""
    if "dtype" in f:
        m.dtype = f["dtype"]
    if "shape" in f:
        m.shape.extend(f["shape"])
    if "arg" in f:
        if m.op in ("RESHAPE", "EXPAND"):
            m.new_shape.values.extend(f["arg"])
        elif m.op == "PERMUTE":
            m.order.values.extend(f["arg"])
        elif m.op == "STRIDE":
            m.strides.values.extend(f["arg"])
        else:
            for a, b in f["arg"]:
                m.pairs.pairs.add(first=a, second=b)
    if "axis" in f:
        m.axis.extend(f["axis"])
    if "value" in f:
        m.value.CopyFrom(_scalar_pb(f["value"]))


def graph_pb(outputs, device=None):
    """The protobuf Graph (kex.v1.Graph) that realizes `outputs` (nodes).

    device: the graph's device; None: the outputs' device, else "" (the server's default)."""
    device = device or _graph_device(outputs) or ""
    order, index, outs = _serialize(outputs)
    g = pb.Graph(format="kex.graph.v1", device=device, outputs=outs)
    for n in order:
        m = g.nodes.add(op=n.op, src=[index[id(s)] for s in n.src])
        f = n.fields
        fill_node(m, f)
        if "data" in f:
            m.data = f["data"]
        if "buffer" in f:
            m.buffer = f["buffer"]
        if "device" in f:
            m.device = f["device"]
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


def _dev(device):
    return {"device": device} if device else {}


def _const_node(value, dtype, shape=(), device=None):
    return _Node("CONST", (), shape, dtype, dtype=dtype, shape=list(shape), value=_json_value(dt.as_const(value, dtype)),
                 **_dev(device))


def _input_node(a, device=None, **contents):
    """A BUFFER node of numpy array a's dtype and shape with `contents` (data=, buffer=, fill=)."""
    d = dt.from_numpy(a.dtype)
    return _Node("BUFFER", (), a.shape, d, dtype=d, shape=list(a.shape), **contents, **_dev(device))


class Tensor:
    """A lazy tensor on a kexd connection, with tinygrad 0.9.0's Tensor API.

    Tensor(data, dtype=None, client=None, upload=False, device=None)

    data: a Python scalar (a 0-d CONST: float -> float32, int -> int32, bool ->
    bool, as tinygrad), a list (ints -> int32, floats -> float32, bools ->
    bool), a numpy array (its dtype; a 0-d array or numpy scalar is a CONST),
    or another Tensor.  dtype: a kex dtype name ("float16"), a
    kex.dtypes constant or a numpy dtype.  client: the kex.Client (default: the
    one of kex.connect, looked up when the tensor is computed).  upload=True
    sends the data once with Upload instead of inline in every graph.  device:
    one of the server's device names (client.devices()); None is the server's
    default device.

    Operations build a graph; plan(), realize(), numpy() (and np.asarray,
    bool, int, float, item, tolist) send it to kexd.
    """

    _seed = int(time.time())  # tinygrad's: the seed of the next rand() is _seed + 1

    # numpy: ndarray op Tensor -> NotImplemented, so Python calls the Tensor's reflected op
    __array_ufunc__ = None

    def __init__(self, data, dtype=None, client=None, upload=False, device=None, _node=None):
        self.client = client
        self._host = None  # (node, ndarray): the computed value of that node, kept by numpy()
        if _node is not None:
            self.node = _node
            return
        dtype = dt.normalize(dtype)
        if isinstance(data, Tensor):
            self.node, self.client = data.node, client if client is not None else data.client
            if dtype is not None:
                self.node = self.cast(dtype).node
            if device is not None:
                self.node = self.to(device).node
            return
        if data is None:  # tinygrad: an empty float tensor
            d = dtype or dt.default_float
            self.node = _Node("EMPTY", (), (0,), d, dtype=d, shape=[0], **_dev(device))
            return
        if isinstance(data, (bool, int, float)) and not isinstance(data, np.generic):
            d = dtype or dt.from_py(data)
            self.node = _const_node(data, d, (), device)
            return
        if isinstance(data, (np.generic, np.ndarray)) and np.ndim(data) == 0 and not upload:
            # tinygrad: a 0-d array is a CONST of its dtype
            d = dtype or dt.from_numpy(np.asarray(data).dtype)
            self.node = _const_node(np.asarray(data).item(), d, (), device)
            return
        if isinstance(data, (list, tuple)):
            if dtype is None:
                flat = _fully_flatten(data)
                if flat and all(isinstance(x, bool) for x in flat):
                    dtype = "bool"
                elif flat and all(isinstance(x, int) for x in flat):
                    dtype = dt.default_int
                else:
                    dtype = dt.default_float
            a = np.array(data, dtype=np.float32 if dtype == "bfloat16" else dt.to_numpy(dtype))
        else:
            a = np.asarray(data)
            if dtype is not None:
                a = a.astype(np.float32 if dtype == "bfloat16" else dt.to_numpy(dtype))
        a = np.ascontiguousarray(a)
        if upload:
            c = self._client()
            self.node = _input_node(a, device or c.default_device(), buffer=c.upload(a, device=device or ""))
        else:
            self.node = _input_node(a, device, data=a.tobytes())
        if dtype == "bfloat16":
            self.node = self.cast("bfloat16").node

    def _client(self):
        return self.client if self.client is not None else default_client()

    def _new(self, node):
        return Tensor(None, client=self.client, _node=node)

    def _like(self, data, dtype=None):
        """data as a Tensor on this tensor's client and device."""
        return data if isinstance(data, Tensor) else Tensor(data, dtype=dtype, client=self.client,
                                                            device=self.node.device)

    # ---- properties ----
    @property
    def shape(self):
        """The shape, a tuple of ints."""
        return self.node.shape

    @property
    def dtype(self):
        """The dtype's name: "float32", "int32", "bool", ..."""
        return self.node.dtype

    @property
    def ndim(self):
        """The number of dimensions, len(shape)."""
        return len(self.node.shape)

    @property
    def device(self):
        """The name of the server device this tensor lives on ("cpu", "opencl", ...).

        A tensor created without a device is on the server's default device, whose
        name the client asks once (ListDevices)."""
        return self.node.device or self._client().default_device()

    def numel(self):
        """The number of elements, prod(shape)."""
        return _prod(self.shape)

    def element_size(self):
        """Bytes per element."""
        return dt.itemsize(self.dtype)

    def nbytes(self):
        """Bytes of the whole tensor, numel() * element_size()."""
        return self.numel() * self.element_size()

    def is_floating_point(self):
        """Whether the dtype is a float dtype."""
        return dt.is_float(self.dtype)

    # ---- Python protocols ----
    def _device_for_repr(self):
        if self.node.device:
            return self.node.device
        try:
            return self._client().default_device()
        except Exception:  # noqa: BLE001 - no connection: repr still works
            return "default"

    def _cached(self):
        h = self._host
        return h[1] if h is not None and h[0] is self.node else None

    def _preview(self):
        """The values when they are known without computing anything (None when not)."""
        a = self._cached()
        if a is not None:
            return a
        n = self.node
        if n.op != "BUFFER" or self.dtype == "bfloat16":
            return None
        if "data" in n.fields:
            return np.frombuffer(n.fields["data"], dtype=dt.to_numpy(n.dtype)).reshape(n.shape)
        if "buffer" in n.fields and self.nbytes() <= _HOST_CACHE_MAX:
            try:
                _, shape, data = self._client().download(n.fields["buffer"])
            except Exception:  # noqa: BLE001 - a freed buffer, a closed job: no preview
                return None
            a = np.frombuffer(data, dtype=dt.to_numpy(n.dtype)).reshape(shape)
            self._host = (n, a)
            return a
        return None

    def __repr__(self):
        """<kex.Tensor shape=... dtype=... device=...> and, once realized, a preview of the values."""
        head = f"<kex.Tensor shape={self.shape} dtype={self.dtype} device={self._device_for_repr()}"
        a = self._preview()
        if a is None:
            state = "realized" if self.node.op == "BUFFER" and "buffer" in self.node.fields else "lazy"
            return f"{head} {state} {self.node.op}>"
        text = np.array2string(a, threshold=32, edgeitems=3, precision=4)
        return f"{head}\n{text}>" if "\n" in text else f"{head} {text}>"

    def __format__(self, spec):
        """f"{t:.3f}" formats the value of a one-element tensor; other specs apply to repr(t)."""
        if spec and self.numel() == 1:
            return format(self.item(), spec)
        return format(repr(self), spec)

    def __bool__(self):
        """The truth of a one-element tensor (computed on kexd); ValueError for any other size."""
        if self.numel() != 1:
            raise ValueError(f"the truth value of a kex.Tensor with {self.numel()} elements (shape {self.shape}) "
                             f"is ambiguous; only one-element tensors have one")
        return builtins.bool(self.item())

    def __int__(self):
        """int() of a one-element tensor (computed on kexd); ValueError for any other size."""
        return builtins.int(self._one_element("int"))

    def __float__(self):
        """float() of a one-element tensor (computed on kexd); ValueError for any other size."""
        return builtins.float(self._one_element("float"))

    def _one_element(self, what):
        if self.numel() != 1:
            raise ValueError(f"only one-element tensors can be converted to Python scalars ({what}() of a "
                             f"kex.Tensor of shape {self.shape})")
        return self.item()

    def __len__(self):
        """shape[0] (1 for a 0-d tensor, as tinygrad)."""
        return self.shape[0] if self.ndim else 1

    def __array__(self, dtype=None, copy=None):
        """np.asarray(t) / np.array(t): the computed data (self.numpy()), cast to dtype if given."""
        a = self.numpy()
        return a if dtype is None else a.astype(dtype, copy=False)

    # ---- graph, realize ----
    def graph_json(self, *more):
        """The kex.graph.v1 JSON dict that computes this tensor (and `more`): `kex run`'s input format."""
        return graph_json([self.node] + [t.node for t in more])

    def plan(self, *more):
        """Schedule this tensor (and `more`) on kexd without running: the PlanReply (.kernels, .items)."""
        return self._client().plan(graph_pb([self.node] + [t.node for t in more]))

    def tune(self, *more, beam=2, progress=None, device=None, timeout=None):
        """Beam-search the kernels of this tensor (and `more`) on kexd: a list of kex.TuneResult."""
        return self._client().tune([self] + list(more), beam=beam, progress=progress, device=device, timeout=timeout)

    def realize(self, *more, timeout=None):
        """Compute this tensor (and `more`) on kexd in one submission; each becomes a buffer the job holds.

        Returns self.  Later graphs that use the tensor start from that buffer."""
        ts = [self] + list(more)
        c = self._client()
        # a held buffer lives on one device: name it (the default device's name when the graph has none)
        device = _graph_device([t.node for t in ts]) or c.default_device()
        done = c.submit(graph_pb([t.node for t in ts]), return_bytes=False, timeout=timeout)
        for t, o in zip(ts, done.outputs):
            t.node = _Node("BUFFER", (), tuple(o.shape), o.dtype, dtype=o.dtype, shape=list(o.shape),
                           buffer=o.handle, **_dev(device))
        return self

    def numpy(self, timeout=None):
        """The tensor's values as a new numpy array, computed on kexd (Submit of self.contiguous()).

        The result's bytes come inline or by Download; the output buffer is freed
        (unless it is one the graph already held).  A bfloat16 tensor comes back
        as float32 (numpy has no bfloat16), as in tinygrad.  Results up to 1 MiB
        are remembered until the tensor changes (assign, realize), so bool(t),
        t.item() and repr(t) after numpy() do not compute again."""
        if self.dtype == "bfloat16":
            return self.float().numpy(timeout=timeout)
        a = self._cached()
        if a is not None:
            return a.copy()
        n = self.node
        if n.op == "BUFFER" and "data" in n.fields:  # inline data: nothing to compute
            return np.frombuffer(n.fields["data"], dtype=dt.to_numpy(n.dtype)).reshape(n.shape).copy()
        c = self._client()
        src = self.contiguous()
        # small results come inline in the Done event; bigger ones by Download, in chunks (an inline
        # answer over gRPC's default 4 MiB message limit would be refused by this client's channel)
        done = c.submit(graph_pb([src.node]), return_bytes=self.nbytes() <= _INLINE_MAX, timeout=timeout)
        o = done.outputs[0]
        data = o.data if o.has_data else c.download(o.handle)[2]
        # free the output unless it is a buffer the graph already held (contiguous() of a
        # realized buffer is that buffer, as in tinygrad)
        held = {m.fields.get("buffer") for m in _serialize([src.node])[0]}
        if o.handle and o.handle not in held:
            try:
                c.free([o.handle])
            except Error:
                pass
        a = np.frombuffer(data, dtype=dt.to_numpy(o.dtype)).reshape(tuple(o.shape)).copy()
        if a.nbytes <= _HOST_CACHE_MAX:
            self._host = (n, a.copy())
        return a

    def item(self):
        """The value of a one-element tensor as a Python number (computed on kexd)."""
        if self.numel() != 1:
            raise ValueError(f"item() needs a one-element tensor, not shape {self.shape}")
        return self.numpy().item()

    def tolist(self):
        """The values as (nested) Python lists (computed on kexd)."""
        return self.numpy().tolist()

    # ---- devices and dtypes ----
    def to(self, device):
        """This tensor on `device` (a server device name, see client.devices()); self when it is there.

        None means the server's default device.  kexd runs a graph on one device, so
        a lazy tensor becomes a COPY node and its whole graph runs on `device`; a
        tensor that holds buffers on kexd (realized, uploaded) is computed where it
        is and its bytes are copied to `device` now, through the client."""
        c = self._client()
        if device is None:
            device = c.default_device()
        if not isinstance(device, str) or not device:
            raise TypeError(f"kex: a device is a server device name (see client.devices()), not {device!r}")
        if device == self.device:
            return self
        if not any("buffer" in n.fields for n in _serialize([self.node])[0]):
            return self._new(_Node("COPY", (self.node,), self.shape, self.dtype, device=device))
        src = self
        if not (self.node.op == "BUFFER" and "buffer" in self.node.fields):
            src = Tensor(self, client=self.client).contiguous().realize()
        _, shape, data = c.download(src.node.fields["buffer"])
        if src is not self:
            try:
                c.free([src.node.fields["buffer"]])
            except Error:
                pass
        raw = np.frombuffer(data, dtype=np.uint16 if self.dtype == "bfloat16" else dt.to_numpy(self.dtype))
        handle = c.upload(raw.reshape(shape), device=device, dtype=self.dtype)
        return self._new(_Node("BUFFER", (), self.shape, self.dtype, dtype=self.dtype, shape=list(self.shape),
                               buffer=handle, device=device))

    def cast(self, dtype):
        """This tensor converted to `dtype` (a CAST node; the same tensor when the dtype is already that)."""
        dtype = dt.normalize(dtype)
        return self if dtype == self.dtype else self._new(_Node("CAST", (self.node,), self.shape, dtype, dtype=dtype))

    def float(self):
        """cast("float32")."""
        return self.cast("float32")

    def half(self):
        """cast("float16")."""
        return self.cast("float16")

    def int(self):
        """cast("int32")."""
        return self.cast("int32")

    def bool(self):
        """cast("bool") (nonzero is True)."""
        return self.cast("bool")

    def contiguous(self):
        """A CONTIGUOUS of this tensor: realized in its own buffer, in row-major order."""
        return self._new(_Node("CONTIGUOUS", (self.node,), self.shape, self.dtype))

    # ---- movement ----
    def _resolve_dim(self, d, outer=False):
        n = max(1, self.ndim + outer)
        if not -n <= d < n:
            raise IndexError(f"dim={d} out of range {[-n, n - 1]}")
        return d + self.ndim + outer if d < 0 else d

    def reshape(self, shape, *args):
        """The same elements in a new shape; one dim may be -1 (inferred), None keeps that dim."""
        new = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,) + args
        new = tuple(s if s is not None else self.shape[i] for i, s in enumerate(new))
        if new.count(-1) > 1:
            raise ValueError(f"only one dimension can be inferred in reshape to {new}")
        new = tuple(-_prod(self.shape) // _prod(new) if s == -1 else s for s in new)
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
        """Broadcast size-1 dims to `shape` (-1 or None keeps a dim; new leading dims are added)."""
        new = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,) + args
        old = (1,) * (len(new) - self.ndim) + self.shape
        return self._broadcast_to(tuple(o if s == -1 or s is None else s for s, o in zip(new, old)))

    def permute(self, order, *args):
        """The dims in a new order: permute(2, 0, 1)."""
        order = tuple(order) if isinstance(order, (tuple, list)) else (order,) + args
        order = tuple(self._resolve_dim(o) for o in order)
        if sorted(order) != list(range(self.ndim)):
            raise ValueError(f"invalid permutation {order} of {self.shape}")
        return self._new(_Node("PERMUTE", (self.node,), tuple(self.shape[o] for o in order), self.dtype,
                               arg=list(order)))

    def transpose(self, ax1=1, ax2=0):
        """Swap two dims (default: the first two)."""
        order = list(range(self.ndim))
        order[ax1], order[ax2] = order[ax2], order[ax1]
        return self.permute(order)

    @property
    def T(self):
        """transpose(): the first two dims swapped."""
        return self.transpose()

    def flatten(self, start_dim=0, end_dim=-1):
        """Dims start_dim..end_dim merged into one."""
        start_dim, end_dim = self._resolve_dim(start_dim), self._resolve_dim(end_dim)
        return self.reshape(self.shape[:start_dim] + (_prod(self.shape[start_dim:end_dim + 1]),) +
                            self.shape[end_dim + 1:])

    def flip(self, axis, *args):
        """The elements in reverse order along the given axes (a STRIDE of -1s)."""
        axis = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,) + args
        axis = {self._resolve_dim(a) for a in axis}
        return self._new(_Node("STRIDE", (self.node,), self.shape, self.dtype,
                               arg=[-1 if i in axis else 1 for i in range(self.ndim)]))

    def shrink(self, arg):
        """A sub-box: one (begin, end) per dim, None keeps a dim."""
        if all(x is None or tuple(x) == (0, s) for x, s in zip(arg, self.shape)):
            return self
        arg = [list(x) if x is not None else [0, s] for x, s in zip(arg, self.shape)]
        for (b, e), s in zip(arg, self.shape):
            if not 0 <= b <= e <= s:
                raise ValueError(f"shrink {arg} out of range of {self.shape}")
        return self._new(_Node("SHRINK", (self.node,), tuple(e - b for b, e in arg), self.dtype, arg=arg))

    def pad(self, arg, value=0.0):
        """Pad each dim by (before, after) elements of `value` (None: no padding on that dim)."""
        if all(x is None or tuple(x) == (0, 0) for x in arg):
            return self
        narg = [list(x) if x is not None else [0, 0] for x in arg]
        ret = self._new(_Node("PAD", (self.node,), tuple(s + b + a for s, (b, a) in zip(self.shape, narg)),
                              self.dtype, arg=narg))
        if value == 0:
            return ret
        return ret + self.ones_like().pad(narg).where(0, value)

    def _slice(self, arg, value=0):
        arg_ = tuple(a if a is not None else (0, s) for s, a in zip(self.shape, arg))
        padding = tuple((max(0, -lo), max(0, hi - s)) for s, (lo, hi) in zip(self.shape, arg_))
        return self.pad(padding, value=value).shrink(tuple((lo + pl, hi + pl) for (lo, hi), (pl, _) in
                                                           zip(arg_, padding)))

    def pad2d(self, padding, value=0.0):
        """Pad the last dims, torch-style: (left, right, top, bottom, ...); negative values crop."""
        slc = [(-p0, s + p1) for p0, p1, s in zip(padding[::2], padding[1::2], self.shape[::-1])][::-1]
        return self._slice([(0, s) for s in self.shape[:-(len(padding) // 2)]] + slc, value=value)

    def repeat(self, repeats, *args):
        """Tile the tensor: repeat(2, 3) repeats dim 0 twice and dim 1 three times (numpy's tile)."""
        repeats = _argfix(repeats, *args)
        base_shape = (1,) * (len(repeats) - self.ndim) + self.shape
        new_shape = [x for b in base_shape for x in [1, b]]
        expand_shape = [x for rs in zip(repeats, base_shape) for x in rs]
        final_shape = [r * s for r, s in zip(repeats, base_shape)]
        return self.reshape(new_shape).expand(expand_shape).reshape(final_shape)

    def _pool(self, k_, stride=1, dilation=1):
        """tinygrad's _pool: windows of size k_ over the last len(k_) dims, as new trailing dims."""
        if len(self.shape) < len(k_):
            raise ValueError(f"can't pool {self.shape} with {k_}")
        s_ = (stride,) * len(k_) if isinstance(stride, int) else tuple(stride)
        d_ = (dilation,) * len(k_) if isinstance(dilation, int) else tuple(dilation)
        noop_, i_ = [None] * len(self.shape[:-len(k_)]), self.shape[-len(k_):]
        if any(k > s for k, s in zip(k_, s_)) or any(d != 1 for d in d_):
            o_ = [(i - d * (k - 1) - 1) // s + 1 for i, d, k, s in zip(i_, d_, k_, s_)]
            xup = self.repeat([1] * len(noop_) + [math.ceil(k * (i + d) / i) for k, i, d in zip(k_, i_, d_)])
            xup = xup.shrink(tuple(noop_ + [(0, k * (i + d)) for k, i, d in zip(k_, i_, d_)])).reshape(
                noop_ + _flatten((k, i + d) for k, i, d in zip(k_, i_, d_)))
            xup = xup.shrink(noop_ + _flatten(((0, k), (0, o * s)) for k, o, s in zip(k_, o_, s_))).reshape(
                noop_ + _flatten((k, o, s) for k, o, s in zip(k_, o_, s_)))
            xup = xup.shrink(noop_ + _flatten(((0, k), (0, o), (0, 1)) for k, o in zip(k_, o_))).reshape(
                noop_ + _flatten((k, o) for k, o in zip(k_, o_)))
            return xup.permute(*range(len(noop_)), *[len(noop_) + i * 2 + 1 for i in range(len(i_))],
                               *[len(noop_) + i * 2 for i in range(len(i_))])
        o_ = [(i + (s - k)) // s for i, s, k in zip(i_, s_, k_)]
        xup = self.pad(tuple(noop_ + [(0, max(0, o * s - i)) for i, o, s in zip(i_, o_, s_)])).shrink(
            tuple(noop_ + [(0, o * s) for o, s in zip(o_, s_)]))
        xup = xup.reshape(noop_ + _flatten(((o, s) for o, s in zip(o_, s_))))
        xup = xup.shrink(noop_ + _flatten(((0, o), (0, k)) for o, k in zip(o_, k_)))
        return xup.permute(*range(len(noop_)), *[len(noop_) + i * 2 for i in range(len(i_))],
                           *[len(noop_) + i * 2 + 1 for i in range(len(i_))])

    def _cumsum(self, axis=0, _first_zero=False):
        pl_sz = self.shape[axis] - builtins.int(not _first_zero and self.shape[axis] != 0)
        return self.transpose(axis, -1).pad2d((pl_sz, 0))._pool((self.shape[axis] or 1,)).sum(-1).transpose(axis, -1)

    def __getitem__(self, indices):
        """numpy-style basic indexing: ints, slices (any step), None and one Ellipsis."""
        if not isinstance(indices, tuple):
            indices = (indices,)
        indices = list(indices)
        for i in indices:
            if not (i is None or i is Ellipsis or isinstance(i, (builtins.int, slice))):
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
        int_dims = [k for k, i in enumerate(filt) if isinstance(i, builtins.int)]
        parsed = []
        for k, i in enumerate(filt):
            size = self.shape[k]
            if isinstance(i, builtins.int):
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

    # ---- creation (tinygrad 0.9.0's factories) ----
    @staticmethod
    def full(shape, fill_value, dtype=None, device=None, client=None):
        """A tensor of `shape` where every element is fill_value (a CONST, reshaped and expanded).

        The dtype is the value's (float -> float32, int -> int32, bool -> bool) unless given.
        Example: Tensor.full((2, 3), 42) is int32."""
        shape = _argfix(shape)
        return Tensor(fill_value, dtype=dtype, client=client, device=device).reshape((1,) * len(shape)).expand(shape)

    @staticmethod
    def zeros(*shape, dtype=None, device=None, client=None):
        """A tensor of zeros: zeros(2, 3) or zeros((2, 3)); float32 unless dtype is given."""
        return Tensor.full(_argfix(*shape), 0.0, dtype=dtype, device=device, client=client)

    @staticmethod
    def ones(*shape, dtype=None, device=None, client=None):
        """A tensor of ones: ones(2, 3) or ones((2, 3)); float32 unless dtype is given."""
        return Tensor.full(_argfix(*shape), 1.0, dtype=dtype, device=device, client=client)

    @staticmethod
    def empty(*shape, dtype=None, device=None, client=None):
        """A tensor with undefined contents (an EMPTY node); float32 unless dtype is given."""
        shape, dtype = _argfix(*shape), dt.normalize(dtype) or dt.default_float
        return Tensor(None, client=client, _node=_Node("EMPTY", (), shape, dtype, dtype=dtype, shape=list(shape),
                                                       **_dev(device)))

    @staticmethod
    def arange(start, stop=None, step=1, dtype=None, device=None, client=None):
        """[start, stop) in steps of `step`, ceil((stop - start) / step) elements; arange(n) is 0..n-1.

        int32 when start, stop and step are all ints, else float32 (as tinygrad).
        Built as tinygrad builds it: a cumsum of full(n, step) plus (start - step).
        Example: Tensor.arange(5, 10, 2) -> [5, 7, 9]."""
        if stop is None:
            stop, start = start, 0
        if not all(isinstance(x, (builtins.int, builtins.float)) for x in (start, stop, step)):
            raise TypeError(f"arange needs numbers, not {start=}, {stop=}, {step=}")
        if step == 0:
            raise ValueError("arange: step must not be 0")
        dtype = dt.normalize(dtype) or (dt.default_float if any(isinstance(x, builtins.float) for x in
                                                                (start, stop, step)) else dt.default_int)
        n = max(0, math.ceil((stop - start) / step))
        return (Tensor.full((n,), step, dtype=dtype, device=device, client=client)._cumsum() + (start - step)).cast(
            dtype)

    @staticmethod
    def eye(dim, dtype=None, device=None, client=None):
        """The dim x dim identity matrix (float32 unless dtype is given)."""
        return Tensor.ones((dim, 1), dtype=dtype, device=device, client=client).pad((None, (0, dim))).flatten() \
            .shrink(((0, dim * dim),)).reshape(dim, dim)

    def full_like(self, fill_value, dtype=None, device=None):
        """full(self.shape, fill_value) with this tensor's dtype, device and client unless given."""
        return Tensor.full(self.shape, fill_value, dtype=dtype or self.dtype, device=device or self.node.device,
                           client=self.client)

    def zeros_like(self, dtype=None, device=None):
        """full_like(0)."""
        return self.full_like(0, dtype=dtype, device=device)

    def ones_like(self, dtype=None, device=None):
        """full_like(1)."""
        return self.full_like(1, dtype=dtype, device=device)

    # ---- random (seeded as tinygrad 0.9.0) ----
    @staticmethod
    def manual_seed(seed=0):
        """Seed the random factories: after manual_seed(s), the n-th rand() draws with seed s + n.

        As in tinygrad 0.9.0 (without THREEFRY), every random buffer takes the next
        seed; without manual_seed the first seed is the time the module was
        imported.  The values are kexd's generator's (graph-format.md's
        `fill_random`), not numpy's, so they differ from tinygrad's numbers; the
        same seed gives the same tensors every time."""
        if not isinstance(seed, builtins.int) or seed < 0:
            raise ValueError(f"manual_seed needs a non-negative int, not {seed!r}")
        Tensor._seed = seed

    @staticmethod
    def rand(*shape, dtype=None, device=None, client=None):
        """Uniform random values in [0, 1): rand(2, 3); float32 unless dtype is given.

        A BUFFER kexd fills from the next seed (see manual_seed).  A non-float dtype
        draws float32 and casts, as tinygrad does."""
        shape, dtype = _argfix(*shape), dt.normalize(dtype) or dt.default_float
        if dtype not in ("float16", "float32", "float64"):
            return Tensor.rand(*shape, dtype="float32", device=device, client=client).cast(dtype)
        Tensor._seed += 1
        node = _Node("BUFFER", (), shape, dtype, dtype=dtype, shape=list(shape),
                     fill={"random": Tensor._seed & 0xFFFFFFFFFFFFFFFF}, **_dev(device))
        return Tensor(None, client=client, _node=node)

    @staticmethod
    def randn(*shape, dtype=None, device=None, client=None):
        """Standard normal random values (Box-Muller over rand((2, *shape)), as tinygrad)."""
        src = Tensor.rand((2, *_argfix(*shape)), dtype="float32", device=device, client=client)
        return src[0].mul(2 * math.pi).cos().mul((1 - src[1]).log().mul(-2).sqrt()).cast(
            dt.normalize(dtype) or dt.default_float)

    @staticmethod
    def uniform(*shape, low=0.0, high=1.0, dtype=None, device=None, client=None):
        """Uniform random values in [low, high): (high - low) * rand(...) cast to dtype, plus low."""
        return ((high - low) * Tensor.rand(*shape, device=device, client=client)).cast(
            dt.normalize(dtype) or dt.default_float) + low

    @staticmethod
    def randint(*shape, low=0, high=10, dtype="int32", device=None, client=None):
        """Random integers in [low, high) (uniform(...) in an int dtype)."""
        if not isinstance(low, builtins.int) or not isinstance(high, builtins.int):
            raise TypeError(f"{low=} and {high=} must be integers")
        dtype = dt.normalize(dtype)
        if not dt.is_int(dtype):
            raise TypeError(f"{dtype=} must be int")
        return Tensor.uniform(*shape, low=low, high=high, dtype=dtype, device=device, client=client)

    @staticmethod
    def normal(*shape, mean=0.0, std=1.0, dtype=None, device=None, client=None):
        """Normal random values: std * randn(...) + mean."""
        return (std * Tensor.randn(*shape, dtype=dtype, device=device, client=client)) + mean

    # ---- elementwise (LazyBuffer calls, tinygrad's function.py) ----
    def _const(self, v):
        return _const_node(v, self.dtype, self.shape, self.node.device)

    def _broadcasted(self, y, reverse=False, match_dtype=True):
        x = self
        if isinstance(y, np.generic):
            y = y.item()  # numpy scalars behave like Python scalars (they take the tensor's dtype)
        if isinstance(y, (np.ndarray, list, tuple)):
            y = self._like(y)
        if not isinstance(y, Tensor):
            if not isinstance(y, (bool, builtins.int, builtins.float)):
                raise TypeError(f"kex: cannot combine a Tensor with {type(y).__name__}")
            if dt.is_float(x.dtype) or (dt.is_int(x.dtype) and isinstance(y, builtins.int) and not isinstance(y, bool)):
                y_dtype = x.dtype
            else:
                y_dtype = dt.from_py(y)
            y = Tensor(dt.as_const(y, y_dtype), dtype=y_dtype, client=self.client, device=self.node.device)
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

    def add(self, y, reverse=False):
        """self + y, broadcast and promoted as tinygrad (a Python scalar takes the tensor's dtype)."""
        return self._binop("ADD", y, reverse)

    def sub(self, y, reverse=False):
        """self - y (y - self with reverse=True)."""
        return self._binop("SUB", y, reverse)

    def mul(self, y, reverse=False):
        """self * y."""
        return self._binop("MUL", y, reverse)

    def xor(self, y, reverse=False):
        """self ^ y (bool and int dtypes)."""
        return self._binop("XOR", y, reverse)

    def div(self, y, reverse=False):
        """self / y, always in a float dtype (ints are upcast first, as tinygrad)."""
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
    def __rxor__(self, y): return self.xor(y, True)
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
        """Elementwise not, as a bool tensor (x == False)."""
        x, y = self._broadcasted(False)
        return x._new(_e("CMPEQ", x.node, y.node))

    def neg(self):
        """-self (logical_not for bool)."""
        return self._new(_e("NEG", self.node)) if self.dtype != "bool" else self.logical_not()

    def _unary(self, op, cast_float=True):
        x = self.cast(dt.least_upper_float(self.dtype)) if cast_float else self
        return x._new(_e(op, x.node))

    def sqrt(self):
        """Elementwise square root (ints are upcast to float32)."""
        return self._unary("SQRT")

    def sin(self):
        """Elementwise sine."""
        return self._unary("SIN")

    def cos(self):
        """Elementwise cosine, sin(pi/2 - x) as tinygrad."""
        return ((math.pi / 2) - self).sin()

    def exp(self):
        """Elementwise e**x, EXP2(x * 1/ln 2) as tinygrad."""
        x = self.cast(dt.least_upper_float(self.dtype))
        return x._new(_e("EXP2", _e("MUL", x.node, x._const(1 / math.log(2)))))

    def log(self):
        """Elementwise natural log, LOG2(x) * ln 2 as tinygrad."""
        x = self.cast(dt.least_upper_float(self.dtype))
        return x._new(_e("MUL", _e("LOG2", x.node), x._const(math.log(2))))

    def relu(self):
        """max(x, 0) elementwise."""
        return self._new(_e("MAX", self.node, self._const(0)))

    def sigmoid(self):
        """1 / (1 + e**-x), with EXP2 as tinygrad."""
        x = self.cast(dt.least_upper_float(self.dtype))
        e = _e("EXP2", _e("MUL", x.node, x._const(-1 / math.log(2))))
        return x._new(_e("DIV", x._const(1), _e("ADD", x._const(1), e)))

    def tanh(self):
        """Hyperbolic tangent, 2 * sigmoid(2x) - 1 as tinygrad."""
        return 2.0 * ((2.0 * self).sigmoid()) - 1.0

    def reciprocal(self):
        """1 / x elementwise (in a float dtype)."""
        x = self.cast(dt.least_upper_float(self.dtype))
        return x._new(_e("DIV", x._const(1), x.node))

    def square(self):
        """x * x."""
        return self * self

    def abs(self):
        """|x|, relu(x) + relu(-x) as tinygrad."""
        return self.relu() + (-self).relu()

    def maximum(self, y):
        """Elementwise max of self and y (a tensor, array or scalar)."""
        y = self._like(y) if isinstance(y, (np.ndarray, list, tuple)) else y
        return (self < y).where(y, (self == y).where(((self * 0.5 + y * 0.5).cast(self.dtype)), self))

    def minimum(self, y):
        """Elementwise min of self and y."""
        y = self._like(y) if isinstance(y, (np.ndarray, list, tuple)) else y
        return -((-self).maximum(-y))

    def where(self, a, b):
        """a where self is true (nonzero), else b; a and b broadcast and promote."""
        if isinstance(a, (np.ndarray, list, tuple)):
            a = self._like(a)
        if isinstance(b, (np.ndarray, list, tuple)):
            b = self._like(b)
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
        ax = tuple(range(self.ndim)) if axis is None else ((axis,) if isinstance(axis, builtins.int) else tuple(axis))
        ax = tuple(self._resolve_dim(a) for a in ax)
        shape = tuple(1 if i in ax else s for i, s in enumerate(self.shape))
        ret = self._new(_Node(op, (self.node,), shape, self.dtype, axis=list(ax)))
        return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in ax))

    def sum(self, axis=None, keepdim=False, acc_dtype=None):
        """The sum over `axis` (an int, a tuple, or None for all), accumulated as tinygrad (ints in int32)."""
        ret = self.cast(acc_dtype or dt.sum_acc_dtype(self.dtype))._reduce("REDUCE_SUM", axis, keepdim)
        return ret.cast(self.dtype) if self.dtype in ("float16", "bfloat16") else ret

    def max(self, axis=None, keepdim=False):
        """The maximum over `axis` (None: all elements)."""
        return self._reduce("REDUCE_MAX", axis, keepdim)

    def min(self, axis=None, keepdim=False):
        """The minimum over `axis`, -max(-x)."""
        return -((-self).max(axis=axis, keepdim=keepdim))

    def mean(self, axis=None, keepdim=False):
        """The mean over `axis` (float32 for int tensors)."""
        out = self.dtype if dt.is_float(self.dtype) else "float32"
        num = self.cast(dt.sum_acc_dtype(self.dtype)).sum(axis=axis, keepdim=keepdim)
        ax = tuple(range(self.ndim)) if axis is None else ((axis,) if isinstance(axis, builtins.int) else tuple(axis))
        ax = {self._resolve_dim(a) for a in ax} if self.ndim else set()
        return num.div(_prod(s for i, s in enumerate(self.shape) if i in ax and s != 1)).cast(out)

    def softmax(self, axis=-1):
        """Softmax along `axis` (default: the last): exp(x - max) / sum(exp(x - max)).

        As tinygrad 0.9.0: m = x - x.max(axis, keepdim=True); e = m.exp();
        e / e.sum(axis, keepdim=True) -- three kernels on kexd (the max, the sum,
        the division), each row sums to 1.  Ints are computed in float32.

            >>> x = kex.tensor([[1.0, 2.0, 3.0]])
            >>> x.softmax().numpy()      # array([[0.09, 0.2447, 0.6652]])
        """
        m = self - self.max(axis=axis, keepdim=True)
        e = m.exp()
        return e.div(e.sum(axis=axis, keepdim=True))

    def log_softmax(self, axis=-1):
        """log(softmax(x)) along `axis`, computed stably: m - log(sum(exp(m))) with m = x - max."""
        m = self - self.max(axis=axis, keepdim=True)
        return m - m.exp().sum(axis=axis, keepdim=True).log()

    def argmax(self, axis=None, keepdim=False):
        """The index (int32) of the maximum along `axis`; the flat index when axis is None.

        The first index wins a tie, as in numpy and tinygrad."""
        if axis is None:
            idx = (self == self.max(axis)) * Tensor.arange(self.numel() - 1, -1, -1, device=self.node.device,
                                                           client=self.client).reshape(self.shape)
            return (self.numel() - idx.max() - 1).cast("int32")
        axis = self._resolve_dim(axis)
        m = self == self.max(axis=axis, keepdim=True)
        idx = m * Tensor.arange(self.shape[axis] - 1, -1, -1, device=self.node.device, client=self.client).reshape(
            self.shape[axis], *[1] * (self.ndim - axis - 1))
        return (self.shape[axis] - idx.max(axis=axis, keepdim=keepdim) - 1).cast("int32")

    def argmin(self, axis=None, keepdim=False):
        """The index (int32) of the minimum along `axis`, (-x).argmax()."""
        return (-self).argmax(axis=axis, keepdim=keepdim)

    # ---- matmul ----
    def dot(self, w, acc_dtype=None):
        """Matrix product as numpy's matmul: 1-D and batched operands broadcast (reshape + MUL + sum)."""
        w = self._like(w)
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
        """self @ x (x @ self with reverse=True); see dot."""
        x = self._like(x)
        return x.dot(self, acc_dtype=acc_dtype) if reverse else self.dot(x, acc_dtype=acc_dtype)

    # ---- assign ----
    def assign(self, x):
        """Write x into this tensor's buffer on kexd (an ASSIGN node); an unrealized target just takes x."""
        if not isinstance(x, Tensor):
            if isinstance(x, (np.ndarray, list, tuple)):
                x = self._like(x, dtype=self.dtype)
            else:
                x = Tensor.full(self.shape, x, dtype=self.dtype, device=self.node.device, client=self.client)
        if x.shape != self.shape or x.dtype != self.dtype:
            raise ValueError(f"assign shape/dtype mismatch: {self.shape} {self.dtype} vs {x.shape} {x.dtype}")
        n = self.node
        if n.op != "BUFFER":
            self.node = x.node
            return self
        if "buffer" not in n.fields:  # inline data: make it a buffer the job holds first
            a = np.frombuffer(n.fields["data"], dtype=dt.to_numpy(n.dtype)).reshape(n.shape)
            c = self._client()
            handle = c.upload(a, device=n.device or "")
            n = self.node = _input_node(a, n.device or c.default_device(), buffer=handle)
        self.node = _Node("ASSIGN", (x.node, n), n.shape, n.dtype)
        return self


def _broadcast_shape(*shapes):
    n = max(len(s) for s in shapes)
    padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
    out = []
    for dims in zip(*padded):
        size = 0 if 0 in dims else max(dims)
        if any(d not in (1, size) for d in dims):
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(size)
    return tuple(out)


def tensor(data, dtype=None, client=None, upload=False, device=None):
    """A Tensor of numpy/list/scalar data (inline in the graph; upload=True sends it once with Upload).

    Lists of ints are int32, of floats float32, of bools bool (as tinygrad); a
    numpy array keeps its dtype.  See kex.Tensor."""
    return Tensor(data, dtype=dtype, client=client, upload=upload, device=device)


# module-level factories, as kex.zeros(2, 3), kex.arange(10), ... (the Tensor staticmethods)
full, zeros, ones, empty, arange, eye = Tensor.full, Tensor.zeros, Tensor.ones, Tensor.empty, Tensor.arange, Tensor.eye
rand, randn, randint, uniform, normal = Tensor.rand, Tensor.randn, Tensor.randint, Tensor.uniform, Tensor.normal
manual_seed = Tensor.manual_seed
