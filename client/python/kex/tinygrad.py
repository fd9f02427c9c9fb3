"""kex.tinygrad: kexd as a tinygrad 0.9.0 device.

    import kex.tinygrad                      # or kex.tinygrad.install(server="host:50051", token=...)
    from tinygrad import Tensor, Device
    Device.DEFAULT = "KEX"                   # or run the program with KEX=1, or say device="KEX"
    x = Tensor.rand(64, 64, requires_grad=True)
    (x @ x).relu().sum().backward()
    print(x.grad.numpy())                    # scheduled, tuned, cached and run by kexd

The device is "KEX" (kexd's default device) and "KEX:<name>" for each device kexd lists
(`KEX:opencl`, `KEX:cpu`).  The connection is opened on first use from install()'s arguments or the
environment: KEX_SERVER (default 127.0.0.1:50051), KEX_TOKEN, KEX_ROOT_CERTS, KEX_CLIENT_CERT and
KEX_CLIENT_KEY (as the other kex clients take them).

How it works.  tinygrad's frontend (Tensor, autograd, nn, optim, TinyJit, nn.state) runs unchanged on
the client.  Every LazyBuffer call that makes a KEX LazyBuffer is recorded (the call, its sources and,
for an `e` that reads a contiguous child, that child): these calls are exactly kex's graph format
(../shared/graph-format.md), which kexd replays with tinygrad's own folding and view rules.  When
tinygrad schedules (realize(), numpy(), item(), a TinyJit step), the KEX part of the request becomes one
schedule item whose run is one Submit of the recorded calls the outputs need: tinygrad's scheduler,
linearizer and compilers never see a KEX LazyBuffer.  Realized KEX buffers stay on kexd as the job's
buffers and later graphs name them by handle; host data is sent once (inline in the Submit, or by Upload
when large), bytes come back only for what the program reads (inline in the done event), and buffers
tinygrad frees are freed on kexd (Free, batched before the next call).  TinyJit captures the Submit as
one exec item, so a jitted step replays the prepared graph with the step's new input handles, and kexd,
which keeps the graph of a repeated step (Submit keep_as / graph_ref), receives only those handles and the
step's new host data.  tinygrad's BEAM=N asks kexd for a beam search of width N (its results are cached on
kexd, for every client of it).
"""
import hashlib
import itertools
import os
import sys
import types
import weakref

import grpc
import numpy as np

try:
    import tinygrad  # noqa: F401  (the optional dependency: pip install kex[tinygrad])
except ImportError as _e:  # pragma: no cover - depends on the environment
    raise ImportError("kex.tinygrad needs tinygrad 0.9.0 (pip install 'kex[tinygrad]', or put "
                      "../shared/anchors/tinygrad-0.9.0 on PYTHONPATH)") from _e

import tinygrad.engine.realize as _tg_realize
import tinygrad.engine.schedule as _tg_schedule
import tinygrad.tensor as _tg_tensor
from tinygrad.device import Allocator, Buffer, Compiled, Device
from tinygrad.dtype import dtypes
from tinygrad.engine.schedule import ScheduleItem
from tinygrad.helpers import BEAM
from tinygrad.lazy import LazyBuffer
from tinygrad.ops import LazyOp, LoadOps, ReduceOps
from tinygrad.renderer import Renderer
from tinygrad.shape.symbolic import Variable

from ._client import Client, Error, pb
from .tensor import fill_node

__all__ = ["install", "client", "stats", "KexError"]

DEFAULT_SERVER = "127.0.0.1:50051"
INLINE_UPLOAD_MAX = 1 << 20     # host data up to this many bytes travels inside the Submit; more goes by Upload
INLINE_RETURN_MAX = 4 << 20     # bytes the program reads come back in the done event up to this size, else Download
INLINE_RETURN_SMALL = 256       # outputs this small come back in the done event whether or not they are read
_DEBUG = os.environ.get("KEX_DEBUG", "") not in ("", "0")
KEPT_REMEMBER = 4096           # graph keys this process remembers having sent (kexd keeps the repeated ones)
FREE_BATCH = 256                # freed handles wait for the next call, or until this many are queued


class KexError(Error, RuntimeError):
    """A kexd call made for a KEX tensor failed: .code (grpc.StatusCode) and .details (kexd's message)."""


# ---- the connection ----

_cfg = {}
_conn = None
_stats = {"submits": 0, "ref_submits": 0, "request_bytes": 0, "uploads": 0, "downloads": 0, "frees": 0, "graph_bytes": 0, "upload_bytes": 0,
          "download_bytes": 0, "inline_bytes": 0}


def install(server=None, token=None, root_certs=None, client_cert=None, client_key=None, default=None, timeout=60.0,
            name="kex-tinygrad"):
    """Make the device KEX known to tinygrad (idempotent) and set where it connects.

    server: "host:port" (default: $KEX_SERVER, else 127.0.0.1:50051); token, root_certs, client_cert,
    client_key: as kex.Client (default: $KEX_TOKEN, $KEX_ROOT_CERTS, $KEX_CLIENT_CERT, $KEX_CLIENT_KEY).
    default=True makes KEX tinygrad's Device.DEFAULT (KEX=1 in the environment does too).
    The connection (a kexd job) opens on first use; a new server closes the old connection."""
    global _conn
    new = {"server": server or os.environ.get("KEX_SERVER") or DEFAULT_SERVER,
           "token": token or os.environ.get("KEX_TOKEN") or None,
           "root_certs": root_certs or os.environ.get("KEX_ROOT_CERTS") or None,
           "client_cert": client_cert or os.environ.get("KEX_CLIENT_CERT") or None,
           "client_key": client_key or os.environ.get("KEX_CLIENT_KEY") or None,
           "timeout": timeout, "name": name}
    if _conn is not None and new != _cfg:
        _conn.close()   # its job and every buffer in it go: KEX buffers made so far are not usable with the new one
        _conn = None
        _pending_free.clear()
        _handle_refs.clear()
        _kept.clear()
    _cfg.clear()
    _cfg.update(new)
    _patch()
    if default or (default is None and os.environ.get("KEX") == "1"):
        Device.DEFAULT = "KEX"


def client():
    """The kex.Client (the kexd job) KEX tensors live in; opened on first use."""
    global _conn
    if _conn is None or _conn.closed:
        if not _cfg:
            install()
        c = _cfg
        try:
            _conn = Client(c["server"], token=c["token"], root_certs=c["root_certs"], client_cert=c["client_cert"],
                           client_key=c["client_key"], timeout=c["timeout"], name=c["name"])
        except Error as e:
            raise _error(e.code, e.details) from None
    return _conn


def stats():
    """Counters of this process's calls to kexd: submits, uploads, downloads, frees and their bytes."""
    return dict(_stats)


def _error(code, details):
    if code == grpc.StatusCode.UNAVAILABLE:
        addr = _cfg.get("server", DEFAULT_SERVER)
        details = (f"kexd at {addr} is unavailable ({details}); start one with `scripts/run.sh` or "
                   f"`kexd --listen {addr}`, or point KEX_SERVER at a running kexd")
    elif code == grpc.StatusCode.UNAUTHENTICATED:
        details = f"{details} (set KEX_TOKEN or install(token=...))"
    return KexError(code, details)


def _rpc(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Error as e:
        raise _error(e.code, e.details) from None
    except grpc.RpcError as e:
        raise _error(e.code(), e.details()) from None


# ---- dtypes ----

_KEX_DTYPE = {dtypes.bool: "bool", dtypes.int8: "int8", dtypes.uint8: "uint8", dtypes.int16: "int16",
              dtypes.uint16: "uint16", dtypes.int32: "int32", dtypes.uint32: "uint32", dtypes.int64: "int64",
              dtypes.uint64: "uint64", dtypes.float16: "float16", dtypes.bfloat16: "bfloat16",
              dtypes.float32: "float32", dtypes.float64: "float64"}
_TG_DTYPE = {v: k for k, v in _KEX_DTYPE.items()}


def _kdtype(dt):
    try:
        return _KEX_DTYPE[dt]
    except KeyError:
        raise NotImplementedError(f"kex.tinygrad: dtype {dt} is not supported on KEX") from None


def _is_kex(device):
    return isinstance(device, str) and (device == "KEX" or device.startswith("KEX:"))


def _server_device(device):
    """kexd's device name of a tinygrad KEX device ("" for kexd's default)."""
    return device.split(":", 1)[1] if ":" in device else ""


def _ints(shape):
    if not all(isinstance(s, int) for s in shape):
        raise NotImplementedError(f"kex.tinygrad: symbolic shape {shape} is not supported on KEX")
    return list(shape)


# ---- buffers: a kexd handle per tinygrad Buffer ----

_handle_refs = {}     # handle -> number of KexBufs naming it (an ASSIGN's output is its target's)
_pending_free = []
_epoch = [0]          # Submits so far: bytes a done event brought are good until the next Submit
_kept = {}            # graph key -> (the Client it was sent on, whether kexd was asked to keep it)


class KexBuf:
    """The opaque of a KEX Buffer: the kexd handle once a Submit or Upload filled it, the held dtype and shape."""
    __slots__ = ("nbytes", "dtype", "handle", "shape", "data", "epoch", "__weakref__")

    def __init__(self, nbytes):
        self.nbytes, self.dtype, self.handle, self.shape, self.data, self.epoch = nbytes, None, None, None, None, -1

    def bind(self, handle, dtype, shape, data=None):
        """Name kexd buffer `handle` (dtype name, shape); the old one, if another, is released."""
        if handle != self.handle:
            _handle_refs[handle] = _handle_refs.get(handle, 0) + 1
            self.release()
            self.handle = handle
        self.dtype, self.shape, self.data, self.epoch = dtype, tuple(shape), data, _epoch[0]

    def release(self):
        h, self.handle, self.data = self.handle, None, None
        if h is None:
            return
        n = _handle_refs.get(h, 1) - 1
        if n > 0:
            _handle_refs[h] = n
            return
        _handle_refs.pop(h, None)
        _pending_free.append(h)

    def __repr__(self):
        return f"<KexBuf {self.handle[:8] if self.handle else 'unbound'} {self.dtype} {self.shape}>"


def _flush_frees():
    if not _pending_free:
        return
    if _conn is None or _conn.closed:
        _pending_free.clear()   # the job is gone, and its buffers with it
        return
    hs = list(dict.fromkeys(_pending_free))
    _pending_free.clear()
    _stats["frees"] += 1
    try:
        _rpc(_conn.free, hs)
    except KexError as e:
        if e.code != grpc.StatusCode.NOT_FOUND:   # gone already (the job was closed and reopened): nothing to free
            raise
        for h in hs:   # free the others one by one
            try:
                _rpc(_conn.free, [h])
            except KexError:
                pass


def _np_view(mv, itemsize, count):
    a = np.frombuffer(mv, dtype=np.uint8)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize]).reshape(count)


def _upload(kb, mv, dt, device, shape=None):
    """Upload bytes into a new kexd buffer of dtype dt and `shape` (default: (count,)); bind it to kb."""
    c = client()
    _flush_frees()
    a = _np_view(mv, dt.itemsize, len(mv) // dt.itemsize)
    if shape is not None:
        a = a.reshape(shape)
    h = _rpc(c.upload, a, device=_server_device(device), dtype=_kdtype(dt))
    _stats["uploads"] += 1
    _stats["upload_bytes"] += len(mv)
    kb.bind(h, _kdtype(dt), a.shape)
    return h


class KexAllocator(Allocator):
    """Buffers are kexd job buffers: allocation is free (a handle comes with the first Submit or copyin),
    copyin is Upload, copyout is the bytes a done event brought or Download, free is a batched Free."""

    def __init__(self, device):
        self.device = device

    def _alloc(self, size, options):
        return KexBuf(size)

    def _free(self, opaque, options):
        opaque.release()
        if len(_pending_free) >= FREE_BATCH:
            try:
                _flush_frees()
            except Exception:  # noqa: BLE001 - called from Buffer.__del__: the next call flushes again
                pass

    def copyin(self, dest, src):
        _upload(dest, src, dest.dtype or dtypes.uint8, self.device)

    def copyout(self, dest, src):
        if src.data is not None and src.epoch == _epoch[0] and len(src.data) == len(dest):
            dest[:] = src.data
            return
        if src.handle is None:
            raise KexError(grpc.StatusCode.FAILED_PRECONDITION,
                           "kex.tinygrad: this KEX buffer was never computed (its Submit failed or never ran)")
        _, _, data = _rpc(client().download, src.handle)
        _stats["downloads"] += 1
        _stats["download_bytes"] += len(data)
        if len(data) != len(dest):
            raise KexError(grpc.StatusCode.INTERNAL, f"kexd returned {len(data)} bytes for a {len(dest)}-byte buffer")
        dest[:] = data


class KEXDevice(Compiled):
    """tinygrad's view of kexd: an allocator only; kernels are kexd's (no renderer, compiler or runtime here)."""

    def __init__(self, device):
        super().__init__(device, KexAllocator(device), Renderer(), None, None)


# ---- recording: LazyBuffer calls that make KEX LazyBuffers ----

_seq = itertools.count()
_depth = [0]


class _Rec:
    """One recorded call: kind "n" a node (op, fields, srcs), "b" a realized buffer, "h" host data (x = the host
    LazyBuffer), "c" a CUSTOM loadop (x = its function); deps: LazyBuffers whose calls must be replayed first."""
    __slots__ = ("seq", "kind", "op", "f", "srcs", "deps", "x", "lb", "shape")

    def __init__(self, kind, op, f, srcs=(), deps=(), x=None, lb=None, seq=None):
        self.seq = next(_seq) if seq is None else seq
        self.kind, self.op, self.f, self.srcs, self.deps, self.x, self.lb = kind, op, f, tuple(srcs), tuple(deps), x, lb
        self.shape = None   # the shape of the LazyBuffer the call returned


def _json_value(v):
    if isinstance(v, Variable):
        raise NotImplementedError("kex.tinygrad: symbolic (Variable) constants are not supported on KEX")
    return v


def _record(lb, rec):
    d = lb.__dict__
    if rec.shape is None:
        rec.shape = _ints(lb.shape)
    if "_kex_rec" not in d:
        d["_kex_rec"] = rec
    elif rec.op == "CONTIGUOUS":     # contiguous() of a contiguous base: its side effect (forced_realize) replays
        d.setdefault("_kex_fx", []).append(rec)
    else:
        return
    b = lb.base
    if b is lb and rec.kind == "n":
        _pending.add(lb)
    if b is not lb and "_kex_rec" not in b.__dict__ and lb.st.contiguous and lb.size == b.size:
        b.__dict__["_kex_alias"] = rec   # a base made inside a call: its bytes are this view's


def _call_rec(name, args, kwargs):
    """The _Rec of LazyBuffer.name(*args, **kwargs) (args[0] is self)."""
    me = args[0]
    if name == "e":
        op, srcs = args[1], (me, *args[2:])
        deps = []
        for s in srcs:
            cc = s.base.contiguous_child if s is s.base else None
            if cc and (root := cc[0]()) is not None:
                deps.append(root)
        if kwargs.get("arg") is not None:
            raise NotImplementedError(f"kex.tinygrad: {op} with an arg is not supported on KEX")
        return _Rec("n", op.name, {}, srcs, deps)
    if name == "r":
        op = "REDUCE_SUM" if args[1] is ReduceOps.SUM else "REDUCE_MAX"
        return _Rec("n", op, {"axis": list(args[2])}, (me,))
    if name == "cast":
        bitcast = args[2] if len(args) > 2 else kwargs.get("bitcast", False)
        return _Rec("n", "BITCAST" if bitcast else "CAST", {"dtype": _kdtype(args[1])}, (me,))
    if name in ("reshape", "expand", "permute", "stride"):
        return _Rec("n", name.upper(), {"arg": _ints(args[1])}, (me,))
    if name in ("pad", "shrink"):
        return _Rec("n", name.upper(), {"arg": [_ints(p) for p in args[1]]}, (me,))
    if name == "contiguous":
        return _Rec("n", "CONTIGUOUS", {}, (me,))
    if name == "assign":
        return _Rec("n", "ASSIGN", {}, (args[1], me))
    if name == "const":
        shape = args[2] if len(args) > 2 else kwargs.get("shape")
        shape = me.shape if shape is None else shape
        return _Rec("n", "CONST", {"dtype": _kdtype(me.dtype), "shape": _ints(shape), "value": _json_value(args[1])})
    raise AssertionError(name)


def _loadop_rec(lb, op, shape, dtype, arg):
    if op is LoadOps.EMPTY:
        return _Rec("n", "EMPTY", {"dtype": _kdtype(dtype), "shape": _ints(shape)})
    if op is LoadOps.CONST:
        return _Rec("n", "CONST", {"dtype": _kdtype(dtype), "shape": _ints(shape), "value": _json_value(arg)})
    if op is LoadOps.CUSTOM:
        return _Rec("c", "BUFFER", {"dtype": _kdtype(dtype), "shape": _ints(shape)}, x=arg, lb=weakref.ref(lb))
    raise NotImplementedError(f"kex.tinygrad: LazyBuffer.loadop({op}) is not supported on KEX")


_pending = weakref.WeakSet()   # recorded KEX bases (maybe realized since): what an ASSIGN may have to compute first


def _assign_readers(closure):
    """Live unrealized KEX bases outside `closure` that read the old value of a target the closure's ASSIGNs
    write, and that no other such base reads: tinygrad computes them in the same schedule (the loss a
    training step reads after opt.step()), so they become outputs of the same Submit."""
    targets = {id(r.srcs[1].base) for r in closure if r.op == "ASSIGN"}
    if not targets:
        return []
    inside = {id(r) for r in closure}
    memo = {}

    def reads(rec):
        k = id(rec)
        if k not in memo:
            memo[k] = False
            memo[k] = rec.kind == "n" and any(id(s.base) in targets or reads(_rec_of(s)) for s in rec.srcs)
        return memo[k]

    cands = [lb for lb in list(_pending) if hasattr(lb, "srcs") and id(lb.__dict__.get("_kex_rec")) not in inside]
    used = {id(s.base) for lb in cands for s in lb.__dict__["_kex_rec"].srcs}
    return [lb for lb in cands if id(lb) not in used and reads(lb.__dict__["_kex_rec"])]


_METHODS = ("e", "r", "cast", "reshape", "expand", "permute", "stride", "pad", "shrink", "contiguous", "assign",
            "const")
_orig = {}


def _wrap(name, fn):
    def call(*args, **kwargs):
        if _depth[0] or not _is_kex(args[0].device):
            return fn(*args, **kwargs)
        rec = _call_rec(name, args, kwargs)    # before the call: e() reads contiguous_child as it was
        _depth[0] += 1
        try:
            lb = fn(*args, **kwargs)
        finally:
            _depth[0] -= 1
        _record(lb, rec)
        if name == "cast" and lb.base is not lb and "_kex_rec" not in lb.base.__dict__:
            # a cast before a view (CAST_BEFORE_VIEW): its base is self.base's cast, a call of its own
            sb = args[0].base
            if "_kex_rec" in sb.__dict__ or sb.realized is not None:
                _record(lb.base, _Rec("n", rec.op, dict(rec.f), (sb,)))
        return lb
    call.__name__, call.__doc__ = fn.__name__, fn.__doc__
    return call


def _loadop(op, shape, dtype, device, arg=None, src=(), enable_cache=False):
    lb = _orig["loadop"](op, shape, dtype, device, arg, src, enable_cache)
    if not _depth[0] and _is_kex(device) and op is not LoadOps.ASSIGN:
        _record(lb, _loadop_rec(lb, op, shape, dtype, arg))
    return lb


def _copy_to_device(self, device, force=False):
    src_kex, dst_kex = _is_kex(self.device), _is_kex(device)
    if not (src_kex or dst_kex) or self.device == device:
        return _orig["copy_to_device"](self, device, force)
    if src_kex and dst_kex:   # one kexd device to another: through the host (a Download, then an upload)
        return _copy_to_device(_copy_to_device(self, "CLANG"), device)
    if self.is_unrealized_const():
        if dst_kex and any(v.mask is not None for v in self.st.views):
            return _copy_to_device(_orig["contiguous"](self), device, force)
        if dst_kex:   # a constant moves as a constant
            c = LazyBuffer.loadop(LoadOps.CONST, (), self.dtype, device, arg=self.base.arg)
            return c.reshape((1,) * len(self.shape)).expand(self.shape)
        return _orig["copy_to_device"](self, device, force)
    if dst_kex and self.size == 0:   # nothing to move: tinygrad's zero-size buffers are constants
        return LazyBuffer.loadop(LoadOps.CONST, self.shape, self.dtype, device, arg=0)
    if dst_kex:   # host -> KEX: the host base's bytes, once, as a KEX base (reshaped to this view's shape)
        host = self if self.st.contiguous and self.size == self.base.size else _orig["contiguous"](self)
        hb = host.base
        b = _orig["_copy"](hb, device)
        _record(b, _Rec("h", "BUFFER", {"dtype": _kdtype(hb.dtype), "shape": _ints(hb.shape)}, x=hb,
                        lb=weakref.ref(b)))
        return b if hb.shape == self.shape else b.reshape(self.shape)
    # KEX -> host: a contiguous KEX buffer of this view's elements, then tinygrad's copy of it
    c = self if self.st.contiguous and self.size == self.base.size else self.contiguous()
    return c.base._copy(device)._view(c.st)


def _patch():
    if _orig:
        return
    if "KEX" not in Device._devices:
        Device._devices.append("KEX")
    mod = types.ModuleType("tinygrad.runtime.ops_kex", "kexd as a tinygrad device (kex.tinygrad)")
    mod.KEXDevice = KEXDevice
    sys.modules["tinygrad.runtime.ops_kex"] = mod
    for n in _METHODS:
        _orig[n] = LazyBuffer.__dict__[n]
        setattr(LazyBuffer, n, _wrap(n, _orig[n]))
    _orig["loadop"] = LazyBuffer.__dict__["loadop"].__func__
    LazyBuffer.loadop = staticmethod(_loadop)
    _orig["copy_to_device"] = LazyBuffer.__dict__["copy_to_device"]
    LazyBuffer.copy_to_device = _copy_to_device
    _orig["_copy"] = LazyBuffer.__dict__["_copy"]
    _orig["create_schedule_with_vars"] = _tg_schedule.create_schedule_with_vars
    _tg_schedule.create_schedule_with_vars = _create_schedule_with_vars
    _tg_tensor.create_schedule_with_vars = _create_schedule_with_vars
    _orig["allocate"] = Buffer.allocate
    Buffer.allocate = _buffer_allocate


def _buffer_allocate(self, opaque=None):
    ret = _orig["allocate"](self, opaque)
    if self._base is None and _is_kex(self.device) and isinstance(self._buf, KexBuf) and self._buf.dtype is None:
        self._buf.dtype = self.dtype    # copyin uploads with the Buffer's dtype
    return ret


# ---- scheduling: the KEX part of a request becomes one Submit ----

def _rec_of(lb):
    r = lb.__dict__.get("_kex_rec")
    if r is not None:
        return r
    if lb.base is lb and lb.realized is not None:
        r = _buffer_rec(lb, lb.buffer, lb.shape)
        lb.__dict__["_kex_rec"] = r
        return r
    raise NotImplementedError(f"kex.tinygrad: {lb} was made by a LazyBuffer call kex does not record")


def _buffer_rec(lb, buf, held_shape):
    return _Rec("b", "BUFFER", {"dtype": _kdtype(buf.dtype), "shape": _ints(held_shape), "lbshape": _ints(lb.shape)},
                x=buf, seq=-1)


def _needed(outs):
    """{KEX base LazyBuffer: want its bytes} that `outs` need computed, and the non-KEX outs."""
    needed, rest, seen, stack = {}, [], set(), []
    for x in outs:
        if _is_kex(x.device):
            needed.setdefault(x.base, False)
        else:
            rest.append(x)
            stack.append(x)
    while stack:
        b = stack.pop().base
        if id(b) in seen or b.realized is not None:
            continue
        seen.add(id(b))
        if _is_kex(b.device):
            needed[b] = True
            continue
        stack.extend(getattr(b, "srcs", ()))
    return needed, rest


def _create_schedule_with_vars(outs, seen=None):
    if seen is None:
        seen = set()
    needed, rest = _needed(outs)
    needed = {b: w for b, w in needed.items() if b.realized is None and b.op is not LoadOps.CONST and b.size}
    if not needed:
        return _orig["create_schedule_with_vars"](rest, seen) if rest else ([], {})
    schedule, var_vals = [], {}
    item, host_pre = _kex_item(needed, outs)
    if host_pre:   # host data a KEX graph reads that is not computed yet
        pre, vv = _create_schedule_with_vars(host_pre, seen)
        schedule += pre
        var_vals.update(vv)
    if item is not None:
        schedule.append(item)
    if rest:
        s, vv = _orig["create_schedule_with_vars"](rest, seen)
        schedule += s
        var_vals.update(vv)
    return schedule, var_vals


class _Builder:
    """The pb.Graph of the recorded calls some outputs need."""

    def __init__(self, device):
        self.g = pb.Graph(format="kex.graph.v1", device=_server_device(device))
        self.index = {}          # id(_Rec) -> node index
        self.inputs = []         # (node index, Buffer)
        self.hosts = []          # (node index, host base LazyBuffer)
        self.fns = []            # (node index, function, its KEX LazyBuffer or None)
        self.made = []           # ("h"/"c" rec, its KEX LazyBuffer): outputs too

    def closure(self, roots):
        seen, order, stack = set(), [], list(roots)
        while stack:
            r = stack.pop()
            if id(r) in seen:
                continue
            seen.add(id(r))
            order.append(r)
            for lb in r.srcs + r.deps:
                stack.append(_rec_of(lb))
                stack.extend(lb.__dict__.get("_kex_fx", ()))
        disc = {id(r): i for i, r in enumerate(order)}
        return sorted(order, key=lambda r: (r.seq, disc[id(r)]))

    def node_of(self, lb):
        return self.index[id(_rec_of(lb))]

    def emit(self, r):
        g, f = self.g, r.f
        if r.kind == "b":
            kb = getattr(r.x, "_buf", None)
            if kb is not None and kb.handle is not None:   # computed: the shape and dtype kexd holds it in
                f = dict(f, shape=list(kb.shape), dtype=kb.dtype)
        m = g.nodes.add(op=r.op, src=[self.node_of(s) for s in r.srcs])
        fill_node(m, f)
        i = len(g.nodes) - 1
        if r.kind == "b":
            m.buffer = "?"
            self.inputs.append((i, r.x))
            if f["shape"] != f["lbshape"]:   # held in another shape (a view's bytes): same elements
                g.nodes.add(op="RESHAPE", src=[i]).new_shape.values.extend(f["lbshape"])
                i += 1
        elif r.kind in ("h", "c"):
            m.data = b""
            if r.kind == "h":
                self.hosts.append((i, r.x))
            lb = r.lb()
            if r.kind == "c":
                self.fns.append((i, r.x, lb))
            if lb is not None and lb.base is lb and hasattr(lb, "srcs"):
                self.made.append((r, lb))
        self.index[id(r)] = i


def _custom_order(outs):
    """{id(CUSTOM base): its turn}: the order tinygrad's scheduler runs CUSTOM loadops (Tensor.rand's
    custom_random, which takes the next seed) for these outs -- the outs' own bases first, then a depth-first
    walk of the sources in order -- so KEX draws the same numbers as tinygrad's own devices."""
    order, seen, stack = {}, set(), []
    for x in outs:
        b = x.base
        if b.realized is None and getattr(b, "op", None) is LoadOps.CUSTOM and id(b) not in order:
            order[id(b)] = len(order)
    stack = list(reversed(outs))
    while stack:
        buf = stack.pop()
        if id(buf) in seen or buf.base.realized is not None:
            continue
        if buf.base is not buf:
            stack.append(buf.base)
            continue
        seen.add(id(buf))
        if buf.op is LoadOps.CUSTOM and id(buf) not in order:
            order[id(buf)] = len(order)
        stack.extend(reversed(buf.srcs))
    return order


def _kex_item(needed, all_outs=()):
    """The ScheduleItem (one Submit) that computes `needed`, and host LazyBuffers to realize before it."""
    outs = []
    for b, want in needed.items():
        rec = b.__dict__.get("_kex_rec") or b.__dict__.get("_kex_alias")
        if rec is None:
            if want:
                raise NotImplementedError(f"kex.tinygrad: {b} is needed but was made by a call kex does not record")
            continue   # stays lazy: a later graph computes it where it is used
        outs.append((rec, b, want))
    if not outs:
        return None, []
    device = outs[0][1].device
    if any(b.device != device for _, b, _ in outs):
        raise NotImplementedError("kex.tinygrad: one realize() over several KEX devices")
    bld = _Builder(device)
    closure = bld.closure([r for r, _, _ in outs])
    extra = [lb for lb in _assign_readers(closure) if lb.device == device and lb not in needed]
    if extra:
        outs += [(lb.__dict__["_kex_rec"], lb, False) for lb in extra]
        closure = bld.closure([r for r, _, _ in outs])
    for r in closure:
        bld.emit(r)
    have = {id(b) for _, b, _ in outs}
    outs += [(r, lb, False) for r, lb in bld.made if id(lb) not in have and lb.size]
    bld.g.outputs.extend(bld.index[id(r)] for r, _, _ in outs)
    host_pre = [hb for _, hb in bld.hosts if hb.base.realized is None]
    if len(bld.fns) > 1:
        turn = _custom_order(all_outs)
        bld.fns.sort(key=lambda f: turn.get(id(f[2]), len(turn) + f[0]))
    # tinygrad's own bookkeeping: these LazyBuffers are scheduled (realized, as its scheduler marks them)
    out_bufs, undo = [], []
    for r, b, _ in outs:
        held = _held_shape(r, b)
        out_bufs.append(b.buffer)
        d = b.__dict__
        undo.append((b, d.get("srcs"), d.get("_kex_rec"), d.get("_kex_fx"), d.get("_kex_alias")))
        if hasattr(b, "srcs"):
            del b.srcs
        d.pop("_kex_fx", None)
        d.pop("_kex_alias", None)
        d["_kex_rec"] = _buffer_rec(b, b.buffer, held)
    ins = [buf for _, buf in bld.inputs]
    call = _KexCall(bld, [w for _, _, w in outs], len(out_bufs), undo)
    ast = tuple(LazyOp(LoadOps.CUSTOM, (), call) for _ in out_bufs)
    return ScheduleItem(ast, tuple(out_bufs) + tuple(ins)), host_pre


def _held_shape(r, b):
    """The shape of the buffer kexd holds for output b made by call r: an ASSIGN's is its target's, an alias's
    (a base made inside a call) the view's, else the call's result's."""
    if r.op == "ASSIGN":
        return list(_rec_of(r.srcs[1].base).f["shape"])
    return list(r.shape)


class _KexCall:
    """A prepared Submit: run by tinygrad as a CUSTOM exec item over (outputs..., input buffers...)."""

    def __init__(self, bld, want, nout, undo=()):
        self.g, self.inputs, self.hosts = bld.g, bld.inputs, bld.hosts
        self.fns = [(i, fn) for i, fn, _ in bld.fns]   # not their LazyBuffers: a replay keeps none alive
        self.want, self.nout = want, nout
        # until the first run succeeds: how to make the outputs lazy again (a failed Submit computed nothing)
        self.undo = list(undo)
        self.__name__ = f"kex {len(self.g.nodes)} nodes -> {nout}"
        # the graph's identity: the same calls on the same kinds of inputs give the same bytes (BUFFER nodes are
        # placeholders here), so a training step's graph is named again by this key instead of sent again
        self.key = hashlib.sha256(self.g.SerializeToString(deterministic=True)).hexdigest()[:40]
        self.jit_hint = bool(_tg_realize.capturing)   # TinyJit is capturing: it will replay this graph
        self.device = "KEX:" + self.g.device if self.g.device else "KEX"

    def __call__(self, *rawbufs):
        try:
            self._run(rawbufs)
        except BaseException:
            self._unschedule()
            raise
        self.undo = None

    def _unschedule(self):
        """The outputs are lazy again, as before their schedule (their sources and records back): a later
        realize tries them anew instead of reading buffers that were never computed."""
        for b, srcs, rec, fx, alias in self.undo or ():
            kb = getattr(b.buffer, "_buf", None)
            if b.__dict__.get("_kex_rec") is None or b.__dict__["_kex_rec"].kind != "b" or (kb and kb.handle):
                continue   # computed by now, or scheduled again since
            if srcs is not None:
                b.srcs = srcs
            for k, v in (("_kex_rec", rec), ("_kex_fx", fx), ("_kex_alias", alias)):
                if v is None:
                    b.__dict__.pop(k, None)
                else:
                    b.__dict__[k] = v
        self.undo = None

    def _run(self, rawbufs):
        c = client()
        _flush_frees()
        binds = []   # (node, "buffer" or "data", value): this run's contents of the graph's BUFFER nodes
        for k, (i, _) in enumerate(self.inputs):
            kb = rawbufs[self.nout + k]._buf
            if kb.handle is None:
                raise KexError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"kex.tinygrad: node {i} reads a KEX buffer that was never computed (its Submit "
                               f"failed or never ran)")
            binds.append((i, "buffer", kb.handle))
        for i, hb in self.hosts:
            binds.append((i, *self._host_data(hb.base.realized, self.g.nodes[i].shape)))
        for i, fn in self.fns:
            n = self.g.nodes[i]
            out = _HostOut(_TG_DTYPE[n.dtype], int(np.prod(n.shape, dtype=np.int64)))
            fn(out)
            binds.append((i, "data", out.data))
        wants = [b.nbytes for b, w in zip(rawbufs[:self.nout], self.want) if w]
        imax = max(wants) if wants and max(wants) <= INLINE_RETURN_MAX else 1
        imax = max(imax, INLINE_RETURN_SMALL)   # a loss, an accuracy: read right after, without a Download
        _epoch[0] += 1
        done = None
        kept = _kept.get(self.key)
        if kept is not None and kept[0] is c and kept[1]:   # kexd keeps this graph: send only the bindings
            try:
                done = self._submit(c, imax, binds, ref=True)
            except KexError as e:
                if e.code != grpc.StatusCode.NOT_FOUND or "graph_ref" not in str(e):
                    raise
                kept = None   # gone (the job's least recently used): send it whole again
        if done is None:   # the second time a graph runs (or one TinyJit captures), kexd is asked to keep it
            keep = (kept is not None and kept[0] is c) or self.jit_hint
            done = self._submit(c, imax, binds, ref=False, keep=keep)
            _kept.pop(self.key, None)
            _kept[self.key] = (c, keep)
            while len(_kept) > KEPT_REMEMBER:
                _kept.pop(next(iter(_kept)))
        if len(done.outputs) != self.nout:
            raise KexError(grpc.StatusCode.INTERNAL, "kex.tinygrad: Submit ended without its outputs")
        for k, (buf, o) in enumerate(zip(rawbufs[:self.nout], done.outputs)):
            if o.bytes != buf.nbytes:
                raise KexError(grpc.StatusCode.INTERNAL, f"kex.tinygrad: output {k}: kexd made {o.bytes} bytes, "
                                                         f"tinygrad expects {buf.nbytes}")
            data = o.data if o.has_data else None
            buf._buf.bind(o.handle, o.dtype, o.shape, data)

    def _submit(self, c, imax, binds, ref, keep=False):
        req = pb.SubmitRequest(job=c.job, only_done=True, batched_events=True, inline_output_max_bytes=max(imax, 1))
        if BEAM.value > 0:   # tinygrad's BEAM=N (JITBEAM while TinyJit captures): kexd searches, and caches the result
            req.beam.beam_width = BEAM.value
        if ref:
            req.graph_ref = self.key
            for i, kind, v in binds:
                req.bindings.add(node=i, **{kind: v})
            _stats["ref_submits"] += 1
        else:
            g = self.g
            for i, kind, v in binds:
                setattr(g.nodes[i], kind, v)
            req.graph.CopyFrom(g)
            if keep:
                req.keep_as = self.key
            _stats["graph_bytes"] += g.ByteSize()
        _stats["submits"] += 1
        _stats["request_bytes"] += req.ByteSize()
        if _DEBUG:
            print(f"kex.tinygrad: Submit {len(self.g.nodes)} nodes{' (kept graph)' if ref else ''}, {self.nout} "
                  f"outputs ({', '.join(self.g.nodes[i].op for i in self.g.outputs)})", file=sys.stderr)
        done = None
        try:
            for msg in c.stub.Submit(req, timeout=None, metadata=c.metadata):
                for ev in (msg, *msg.following):
                    if ev.WhichOneof("event") == "done":
                        done = ev.done
        except grpc.RpcError as e:
            raise _error(e.code(), e.details()) from None
        if done is None:
            raise KexError(grpc.StatusCode.INTERNAL, "kex.tinygrad: Submit ended without a done event")
        return done

    def _host_data(self, hbuf, shape):
        """("data", bytes) of a host buffer, or ("buffer", handle) when it is large and went by Upload."""
        mv = hbuf.as_buffer()
        if len(mv) <= INLINE_UPLOAD_MAX:
            _stats["inline_bytes"] += len(mv)
            return "data", bytes(mv)
        kb = KexBuf(len(mv))
        h = _upload(kb, mv, hbuf.dtype, self.device, tuple(shape))
        kb.handle = None   # the Submit's output (the same buffer) takes over the handle's reference
        _handle_refs[h] -= 1
        return "buffer", h


class _HostOut:
    """The output a CUSTOM loadop's function (tinygrad's custom_random) writes into: its bytes."""

    def __init__(self, dtype, size):
        self.dtype, self.size, self.device, self.data = dtype, size, "CLANG", b""
        self.nbytes = size * dtype.itemsize

    def copyin(self, mv):
        self.data = bytes(mv)
        return self


if os.environ.get("KEX_TINYGRAD_NO_INSTALL") != "1":
    install()
