"""tinygrad 0.9.0's operator suite (test/test_ops.py) run differentially, without torch.

test_ops.py checks tinygrad against torch: every `helper_test_op(shps, torch_fxn, tinygrad_fxn, ...)` call builds
the same inputs for both, runs the two functions, compares the forward outputs and, unless forward_only, the
gradients of `(out+1).square().mean()`.  torch cannot be installed here, so this module runs each case twice with
tinygrad instead: once on a reference device (CLANG) and once on the device under test (KEX, or any tinygrad
device), and compares the device's forward outputs and gradients with the reference's, with the case's own
atol/rtol (grad_atol/grad_rtol for gradients), shape and dtype exactly.

How test_ops.py is loaded:
  * `import torch` gets a stand-in module: any attribute, call or operator on it is lazy (it gives another
    stand-in), and anything that needs a value from torch (bool, len, iter, .numpy(), .item(), ...) raises
    NeedsTorch.  torch.randint is real (numpy-backed, seeded per run): it only makes index inputs for the
    tinygrad side, and both devices get the same ones.  Cases whose tinygrad side needs torch fail on the
    reference and are left out as "needs torch".
  * The source is compiled with each top-level statement of every test method wrapped, so a statement that
    needs torch (e.g. `self.assertEqual(torch.tensor([2,2]).argmax().numpy(), ...)`) is skipped on the
    reference and then on the device too, instead of ending the method; the statements after it still run.
    A helper_test_op call lexically inside `with self.assertRaises(...)` is an expected-exception case: it
    re-raises what tinygrad raised.
  * helper_test_op, prepare_test_op (numpy inputs: same shapes, same np.random.seed(0) uniform(low, high) draw in
    dtypes.default_float, or `vals` with torch.tensor's dtypes: python floats float32, ints int64, bools bool,
    numpy arrays as they are) and TestOps.helper_test_exception (tinygrad side only: the device must raise one
    of the expected exceptions, as the reference does) are replaced.

A test method is run once per device with Device.DEFAULT switched (test_ops creates its tensors with plain
Tensor(...)), with np.random.seed(1337) (as test_ops' __main__), Tensor.manual_seed(0) and the stand-in's
randint seed reset before each run, so both runs build identical inputs.  Case ids:
  TestOps.test_add#k        the k-th helper_test_op call of the method (k from 0, in call order; loops count)
  TestOps.test_dot!exc#k    the k-th helper_test_exception call (or helper_test_op inside assertRaises)
  TestOps.test_argmax:direct  the method's own assertions (assert, self.assert*, np.testing.assert_*), when it
                            has some outside helper calls: passes when the method body runs through on the device
Per case: forward and (unless forward_only) backward are each "pass", "fail" (reason: the mismatch with its
max abs diff, or the exception) or "left_out" (the reference itself raised, or needs torch: not counted).

Library use:  r = Runner(dut="KEX"); cases = r.discover(); results = r.run(select=...)
"""
import ast
import contextlib
import os
import re
import signal
import sys
import threading
import time
import traceback
import types
import unittest
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DEFAULT_TINYGRAD = os.path.normpath(os.path.join(ROOT, "..", "shared", "anchors", "tinygrad-0.9.0"))


def tinygrad_root():
    """The tinygrad 0.9.0 checkout: $KEX_TINYGRAD_ROOT, else ../shared/anchors/tinygrad-0.9.0 beside the repo."""
    return os.environ.get("KEX_TINYGRAD_ROOT") or DEFAULT_TINYGRAD


# ---------------------------------------------------------------------------------------------------------------
# the torch stand-in

class NeedsTorch(Exception):
    """A value from torch was needed (torch is a stand-in here)."""


class CaseTimeout(Exception):
    """A case (or a method body) ran past its time limit."""


class _State:
    touched = False  # torch's stand-in was used since the last reset


_STATE = _State()


def _touch():
    _STATE.touched = True


class _Opaque:
    """A torch value that is never computed: operations give more of them, asking for a value raises NeedsTorch."""
    __slots__ = ("_kex_path",)

    def __init__(self, path):
        _touch()
        object.__setattr__(self, "_kex_path", path)

    def __repr__(self):
        return f"<torch stand-in {self._kex_path}>"

    def __getattr__(self, name):
        if name in ("__name__", "__qualname__"):  # e.g. self.subTest(op=torch_op.__name__)
            return self._kex_path.rsplit(".", 1)[-1]
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Opaque(f"{self._kex_path}.{name}")

    def __setattr__(self, name, value):
        _touch()

    def __call__(self, *a, **k):
        return _Opaque(f"{self._kex_path}(...)")

    def _need(self, *a, **k):
        _touch()
        raise NeedsTorch(f"needs torch ({self._kex_path})")

    __bool__ = __len__ = __iter__ = __index__ = __int__ = __float__ = __complex__ = __array__ = _need
    numpy = item = tolist = _need

    def __hash__(self):
        return id(self)


def _lazy_op(name):
    def op(self, *a, **k):
        return _Opaque(f"({self._kex_path}).__{name}__")
    return op


for _n in ("add radd sub rsub mul rmul truediv rtruediv floordiv rfloordiv pow rpow matmul rmatmul mod rmod and rand "
           "or ror xor rxor lshift rlshift rshift rrshift neg pos abs invert eq ne lt le gt ge getitem").split():
    setattr(_Opaque, f"__{_n}__", _lazy_op(_n))


class _Data(_Opaque):
    """A torch tensor with real data (from torch.randint): .detach(), .cpu() and .numpy() work, the rest is lazy."""
    __slots__ = ("_kex_arr",)

    def __init__(self, path, arr):
        super().__init__(path)
        object.__setattr__(self, "_kex_arr", arr)

    def detach(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return self._kex_arr.copy()

    @property
    def shape(self):
        return self._kex_arr.shape


class _DType(_Opaque):
    __slots__ = ("_kex_np",)

    def __init__(self, name, np_dtype):
        super().__init__(f"torch.{name}")
        object.__setattr__(self, "_kex_np", np_dtype)


_TORCH_DTYPES = {"float32": np.float32, "float": np.float32, "float16": np.float16, "half": np.float16,
                 "float64": np.float64, "double": np.float64, "int8": np.int8, "uint8": np.uint8, "int16": np.int16,
                 "short": np.int16, "int32": np.int32, "int": np.int32, "int64": np.int64, "long": np.int64,
                 "bool": np.bool_}


class _TorchRNG:
    rng = np.random.RandomState(0)


def _reset_torch_rng(seed=0):
    _TorchRNG.rng = np.random.RandomState(seed)


def _randint(*args, size=None, dtype=None, low=None, high=None, requires_grad=False, **_):
    """torch.randint(high, size) / (low, high, size): numpy draws (not torch's), the same on every run."""
    _touch()
    args = list(args)
    if size is None and args and isinstance(args[-1], (tuple, list)):
        size = args.pop()
    if len(args) == 1:
        high = args[0]
    elif len(args) == 2:
        low, high = args
    low = 0 if low is None else low
    npdt = dtype._kex_np if isinstance(dtype, _DType) else np.int64
    return _Data("torch.randint(...)", _TorchRNG.rng.randint(low, high, size=tuple(size)).astype(npdt))


def make_torch_stand_in():
    m = types.ModuleType("torch")
    m.__file__ = "<kex torch stand-in>"
    m.__kex_stand_in__ = True
    m.randint = _randint

    def __getattr__(name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name in _TORCH_DTYPES:
            return _DType(name, _TORCH_DTYPES[name])
        return _Opaque(f"torch.{name}")
    m.__getattr__ = __getattr__
    return m


# ---------------------------------------------------------------------------------------------------------------
# loading test_ops.py

_HELPERS = ("helper_test_op", "helper_test_exception")


def _call_name(node):
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


class _DirectFinder(ast.NodeVisitor):
    """Finds assertions (assert, *.assert*(...)) outside helper calls, and calls of helpers (self._x() counts)."""

    def __init__(self):
        self.direct = False
        self.calls_helper = False

    def visit_Call(self, node):
        n = _call_name(node)
        if n in _HELPERS:
            self.calls_helper = True
            return
        if n and n.startswith("assert"):
            self.direct = True
        if (isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "self" and n.startswith("_")):
            self.calls_helper = True
        self.generic_visit(node)

    def visit_Assert(self, node):
        self.direct = True
        self.generic_visit(node)


class _MarkExpectRaise(ast.NodeTransformer):
    """helper_test_op(...) inside `with self.assertRaises(...)` gets _kex_expect_raise=True."""

    def __init__(self):
        self.depth = 0

    def visit_With(self, node):
        raises = any(isinstance(i.context_expr, ast.Call) and (_call_name(i.context_expr) or "").startswith("assertRaises")
                     for i in node.items)
        self.depth += raises
        self.generic_visit(node)
        self.depth -= raises
        return node

    def visit_Call(self, node):
        self.generic_visit(node)
        if self.depth and _call_name(node) == "helper_test_op":
            node.keywords.append(ast.keyword(arg="_kex_expect_raise", value=ast.Constant(True)))
        return node


@dataclass
class StmtInfo:
    method: str
    line: int
    direct: bool       # has assertions outside helper calls
    direct_only: bool  # ... and calls no helper


@dataclass
class MethodInfo:
    cls: str
    name: str
    line: int
    stmts: List[int] = field(default_factory=list)

    @property
    def id(self):
        return f"{self.cls}.{self.name}"


def _set_loc(node, line):
    for n in ast.walk(node):
        if "lineno" in n._attributes:
            n.lineno, n.end_lineno, n.col_offset, n.end_col_offset = line, line, 0, 0


_WRAP = """
if _kex_hooks.enter(0):
    try:
        pass
    except BaseException as _kex_e:
        _kex_hooks.failed(0, _kex_e)
"""


class TestOpsModule:
    """test_ops.py compiled with its statements wrapped and its helpers replaced (see the module's docstring)."""

    def __init__(self, root=None):
        self.root = root or tinygrad_root()
        self.path = os.path.join(self.root, "test", "test_ops.py")
        if not os.path.exists(self.path):
            raise ImportError(f"no {self.path}")
        if self.root not in sys.path:
            sys.path.insert(0, self.root)
        import tinygrad  # noqa: F401  (ImportError: tinygrad cannot be imported)
        if not os.path.abspath(tinygrad.__file__).startswith(os.path.abspath(self.root)):
            raise ImportError(f"tinygrad is imported from {tinygrad.__file__}, not from {self.root}")
        self.stmts: List[StmtInfo] = []
        self.methods: Dict[str, MethodInfo] = {}
        with open(self.path) as f:
            tree = ast.parse(f.read(), self.path)
        _MarkExpectRaise().visit(tree)
        for cls in tree.body:
            if not isinstance(cls, ast.ClassDef):
                continue
            if not any((isinstance(b, ast.Attribute) and b.attr == "TestCase") or (isinstance(b, ast.Name) and b.id == "TestCase")
                       for b in cls.bases):
                continue
            for fn in cls.body:
                if not (isinstance(fn, ast.FunctionDef) and fn.name.startswith("test")):
                    continue
                mi = MethodInfo(cls.name, fn.name, fn.lineno)
                self.methods[mi.id] = mi
                body = []
                for stmt in fn.body:
                    finder = _DirectFinder()
                    finder.visit(stmt)
                    sid = len(self.stmts)
                    self.stmts.append(StmtInfo(mi.id, stmt.lineno, finder.direct, finder.direct and not finder.calls_helper))
                    mi.stmts.append(sid)
                    wrap = ast.parse(_WRAP.replace("(0", f"({sid}")).body[0]
                    _set_loc(wrap, stmt.lineno)
                    wrap.body[0].body = [stmt]
                    body.append(wrap)
                fn.body = body
        ast.fix_missing_locations(tree)
        code = compile(tree, self.path, "exec")
        mod = types.ModuleType("kex_tinygrad_test_ops")
        mod.__file__ = self.path
        mod._kex_hooks = _HOOKS
        saved = sys.modules.get("torch")
        sys.modules["torch"] = make_torch_stand_in()
        try:
            exec(code, mod.__dict__)
        finally:
            if saved is None:
                del sys.modules["torch"]
            else:
                sys.modules["torch"] = saved
        mod.helper_test_op = _helper_test_op
        mod.prepare_test_op = _prepare_test_op
        for mi in self.methods.values():
            cls = getattr(mod, mi.cls)
            if hasattr(cls, "helper_test_exception"):
                cls.helper_test_exception = _helper_test_exception
        self.module = mod

    def method_ids(self):
        return sorted(self.methods, key=lambda m: self.methods[m].line)


_LOADED: Dict[str, TestOpsModule] = {}


def load(root=None) -> TestOpsModule:
    root = root or tinygrad_root()
    if root not in _LOADED:
        _LOADED[root] = TestOpsModule(root)
    return _LOADED[root]


# ---------------------------------------------------------------------------------------------------------------
# one run of one test method

def _trace(e, frames=12):
    return "".join(traceback.format_exception(type(e), e, e.__traceback__, limit=-frames))


def _describe(e, limit=400):
    msg = " ".join(str(e).split())
    s = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    if len(s) > limit:
        s = s[:limit] + " ..."
    tb = traceback.extract_tb(e.__traceback__)
    here = os.path.abspath(__file__)
    frames = [f for f in tb if os.path.abspath(f.filename) != here]
    if frames and not isinstance(e, (NeedsTorch, CaseTimeout)):
        f = frames[-1]
        fn = f.filename
        for base in (ROOT, tinygrad_root()):
            if os.path.abspath(fn).startswith(os.path.abspath(base) + os.sep):
                fn = os.path.relpath(fn, base)
        s += f" [at {fn}:{f.lineno} in {f.name}]"
    return s


@contextlib.contextmanager
def _time_limit(seconds):
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise CaseTimeout(f"no result within {seconds:g} s")
    old = signal.signal(signal.SIGALRM, on_alarm)
    prev_left, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        if prev_left:
            signal.setitimer(signal.ITIMER_REAL, max(prev_left - (time.monotonic() - start), 0.001))


@dataclass
class _Exec:
    fwd: Optional[np.ndarray] = None
    fwd_err: Optional[str] = None
    grads: Optional[List[np.ndarray]] = None
    bwd_err: Optional[str] = None
    exc_type: Optional[type] = None  # expected-exception cases: what was raised
    expected_ok: Optional[bool] = None  # helper_test_exception: raised one of the expected exceptions
    touched: bool = False
    seconds: float = 0.0
    device: Optional[str] = None  # where the output was
    trace: str = ""  # the traceback of the exception (forward's or backward's)


@dataclass
class _Seen:
    id: str
    kind: str  # "op" or "exc"
    line: int
    desc: str
    forward_only: bool = True
    atol: float = 0.0
    rtol: float = 0.0
    grad_atol: float = 0.0
    grad_rtol: float = 0.0


class _Ctx:
    def __init__(self, mode, method, select=None, ref=None, case_timeout=None):
        self.mode = mode  # "discover", "ref" or "dut"
        self.method = method
        self.select = select
        self.ref = ref  # the reference's _Ctx (in a "dut" run)
        self.case_timeout = case_timeout
        self.counters = {"op": 0, "exc": 0}
        self.seen: Dict[str, _Seen] = {}
        self.execs: Dict[str, _Exec] = {}
        self.skipped: Dict[int, str] = {}  # statement -> why it was skipped (needs torch)
        self.stmt: Optional[int] = None
        self.abort: Optional[str] = None  # the body raised (not a case)
        self.abort_stmt: Optional[int] = None
        self.skip: Optional[str] = None  # unittest.SkipTest

    def next_id(self, kind):
        k = self.counters[kind]
        self.counters[kind] += 1
        return f"{self.method}#{k}" if kind == "op" else f"{self.method}!exc#{k}"

    def selected(self, cid):
        return self.mode != "discover" and (self.select is None or cid in self.select)


class _Current:
    ctx: Optional[_Ctx] = None


class _Hooks:
    """Called by the wrapped statements of test_ops.py."""

    def enter(self, sid):
        ctx = _Current.ctx
        _STATE.touched = False
        if ctx is None:
            return True
        if ctx.mode == "dut" and sid in ctx.ref.skipped:
            return False
        if ctx.mode == "discover" and _LOADED_STMTS[sid].direct_only:
            return False
        ctx.stmt = sid
        return True

    def failed(self, sid, e):
        ctx = _Current.ctx
        if (ctx is None or isinstance(e, (KeyboardInterrupt, SystemExit, unittest.SkipTest, CaseTimeout))
                or ctx.mode == "dut"):
            raise e
        if isinstance(e, NeedsTorch) or _STATE.touched:
            ctx.skipped[sid] = _describe(e, 160)
            return
        raise e


_HOOKS = _Hooks()
_LOADED_STMTS: List[StmtInfo] = []


def _torch_like_array(x):
    """torch.tensor(x)'s numpy: python floats float32, python ints int64, bools bool; numpy arrays keep theirs."""
    if isinstance(x, np.ndarray):
        return x
    a = np.array(x)
    if a.dtype == np.float64 and not isinstance(x, np.floating):
        a = a.astype(np.float32)
    return a


def _input_arrays(low, high, shps, vals):
    from tinygrad import dtypes
    if shps is None:
        return [_torch_like_array(x) for x in vals]
    np.random.seed(0)
    return [np.asarray(np.random.uniform(low=low, high=high, size=size).astype(dtypes.default_float.np)) for size in shps]


def _prepare_test_op(low, high, shps, vals, forward_only=False):
    """test_ops' prepare_test_op without torch: (numpy inputs, tinygrad Tensors on Device.DEFAULT)."""
    from tinygrad import Tensor
    arrays = _input_arrays(low, high, shps, vals)
    return arrays, [Tensor(a, requires_grad=not forward_only) for a in arrays]


def _short(v, limit=60):
    s = repr(v)
    if isinstance(v, np.ndarray):
        s = f"array{v.shape}:{v.dtype}"
    elif isinstance(v, (list, tuple)):
        s = "[" + ", ".join(_short(x, limit) for x in v) + "]"
    return s if len(s) <= limit else s[:limit] + "..."


def _execute(fxn, shps, vals, low, high, forward_only, backward, timeout, expect_raise=False):
    r = _Exec()
    saved = _STATE.touched
    _STATE.touched = False
    st = time.monotonic()
    ret = tst = None
    try:
        with _time_limit(timeout):
            _, tst = _prepare_test_op(low, high, shps, vals, forward_only)
            ret = fxn(*tst).realize()
            r.device = ret.device
            r.fwd = ret.numpy()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:
        r.fwd_err = _describe(e)
        r.exc_type = type(e)
        r.trace = _trace(e)
        if expect_raise:
            r.touched = _STATE.touched
            _STATE.touched = saved or r.touched
            r.seconds = time.monotonic() - st
            raise
    if backward and r.fwd_err is None:
        try:
            with _time_limit(timeout):
                (ret + 1).square().mean().backward()
                for tt in tst:
                    tt.grad.realize()
                r.grads = [tt.grad.numpy() for tt in tst]
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:
            r.bwd_err = _describe(e)
            r.trace = _trace(e)
    r.touched = _STATE.touched
    _STATE.touched = saved or r.touched
    r.seconds = time.monotonic() - st
    return r


def compare(what, dut, ref, atol, rtol):
    """None when dut matches ref (shape, dtype, allclose with NaNs equal), else the reason."""
    if dut.shape != ref.shape:
        return f"{what}: shape {dut.shape}, reference {ref.shape}"
    if dut.dtype != ref.dtype:
        return f"{what}: dtype {dut.dtype}, reference {ref.dtype}"
    try:
        np.testing.assert_allclose(dut, ref, atol=atol, rtol=rtol)
        return None
    except AssertionError:
        pass
    d, r = dut.astype(np.float64), ref.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~np.isclose(d, r, atol=atol, rtol=rtol, equal_nan=True)
        diff = np.where(bad, np.abs(d - r), 0.0)
    diff = np.where(np.isnan(diff), np.inf, diff)
    idx = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.size else ()
    idx_s = ",".join(map(str, idx))
    return (f"{what}: {int(bad.sum())}/{bad.size} differ, max abs diff {float(diff[idx]):.3g} at [{idx_s}] "
            f"(device {dut[idx]!r}, reference {ref[idx]!r}; atol={atol:g} rtol={rtol:g})")


def _helper_test_op(shps, torch_fxn, tinygrad_fxn=None, atol=1e-6, rtol=1e-3, grad_atol=1e-4, grad_rtol=1e-3,
                    forward_only=False, vals=None, low=-1.5, high=1.5, _kex_expect_raise=False):
    ctx = _Current.ctx
    if ctx is None:
        raise RuntimeError("helper_test_op outside a tg_ops_diff run")
    kind = "exc" if _kex_expect_raise else "op"
    cid = ctx.next_id(kind)
    desc = f"shapes {_short(shps)}" if shps is not None else f"vals {_short(vals)}"
    if low != -1.5 or high != 1.5:
        desc += f" low={low:g} high={high:g}"
    if forward_only:
        desc += " forward_only"
    ctx.seen[cid] = _Seen(cid, kind, sys._getframe(1).f_lineno, desc, bool(forward_only), atol, rtol, grad_atol, grad_rtol)
    if not ctx.selected(cid):
        return
    fxn = tinygrad_fxn if tinygrad_fxn is not None else torch_fxn
    backward = not forward_only
    if ctx.mode == "dut":
        ref = ctx.ref.execs.get(cid)
        if ref is None or (kind == "op" and ref.fwd_err is not None):
            return  # the reference could not run it: left out, not run here
        backward = backward and ref.bwd_err is None
    if kind == "exc":
        try:
            ctx.execs[cid] = _execute(fxn, shps, vals, low, high, True, False, ctx.case_timeout, expect_raise=True)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:
            ctx.execs[cid] = _Exec(fwd_err=_describe(e), exc_type=type(e))
            raise
        return
    ctx.execs[cid] = _execute(fxn, shps, vals, low, high, forward_only, backward, ctx.case_timeout)


def _helper_test_exception(self, shps, torch_fxn, tinygrad_fxn, expected, exact=False, vals=None, low=-1.5, high=1.5):
    """The tinygrad half of TestOps.helper_test_exception: tinygrad_fxn must raise one of `expected`."""
    ctx = _Current.ctx
    if ctx is None:
        raise RuntimeError("helper_test_exception outside a tg_ops_diff run")
    cid = ctx.next_id("exc")
    ctx.seen[cid] = _Seen(cid, "exc", sys._getframe(1).f_lineno,
                          (f"shapes {_short(shps)}" if shps is not None else f"vals {_short(vals)}") +
                          f" expects {getattr(expected, '__name__', None) or '/'.join(x.__name__ for x in expected)}")
    if not ctx.selected(cid):
        return
    if ctx.mode == "dut" and not getattr(ctx.ref.execs.get(cid), "expected_ok", False):
        return  # the reference did not raise as expected: left out
    r = _Exec()
    st = time.monotonic()
    saved = _STATE.touched
    _STATE.touched = False
    try:
        with _time_limit(ctx.case_timeout):
            _, tst = _prepare_test_op(low, high, shps, vals)
            tinygrad_fxn(*tst)
        r.fwd_err = None
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:
        r.exc_type = type(e)
        r.fwd_err = _describe(e)
    r.touched = _STATE.touched
    _STATE.touched = saved or r.touched
    r.seconds = time.monotonic() - st
    r.expected_ok = r.exc_type is not None and issubclass(r.exc_type, expected)
    ctx.execs[cid] = r


# ---------------------------------------------------------------------------------------------------------------
# the runner

@dataclass
class CaseInfo:
    id: str
    method: str
    kind: str  # "op", "exc", "direct"
    line: int
    desc: str = ""
    forward_only: bool = True


@dataclass
class CaseResult:
    id: str
    method: str
    kind: str
    line: int
    desc: str
    forward: str                    # "pass", "fail", "left_out"
    forward_reason: str = ""
    backward: Optional[str] = None  # None: forward_only (or not an op case)
    backward_reason: str = ""
    seconds: float = 0.0
    trace: str = ""  # the device's exception, when it raised: its traceback

    @property
    def failed(self):
        return self.forward == "fail" or self.backward == "fail"


@dataclass
class Note:
    """Something of a method the reference could not run that is not a case of its own."""
    method: str
    line: int
    text: str


def _where(tm, ctx):
    return f"test_ops.py:{tm.stmts[ctx.abort_stmt].line}" if ctx.abort_stmt is not None else "test_ops.py"


class Runner:
    """Runs test_ops' cases on `ref` (the reference) and on `dut` (the device under test), and compares them.

    case_timeout: seconds for one case's forward (and again for its backward) on one device, 0: none;
    method_timeout: seconds for one method body on one device, 0: none."""

    def __init__(self, dut, ref="CLANG", case_timeout=120.0, method_timeout=900.0, root=None, log=None):
        self.tm = load(root)
        _LOADED_STMTS[:] = self.tm.stmts
        self.dut, self.ref = dut, ref
        self.case_timeout, self.method_timeout = case_timeout, method_timeout
        self.log = log
        self.notes: List[Note] = []
        from tinygrad import Device
        self.dut_canonical, self.ref_canonical = Device.canonicalize(dut), Device.canonicalize(ref)
        self._cases: Optional[List[CaseInfo]] = None

    # -- one body run
    def _run_body(self, method_id, ctx, device):
        from tinygrad import Device, Tensor
        mi = self.tm.methods[method_id]
        cls = getattr(self.tm.module, mi.cls)
        _LOADED_STMTS[:] = self.tm.stmts
        prev = Device.DEFAULT
        Device.DEFAULT = device
        _Current.ctx = ctx
        try:
            np.random.seed(1337)
            _reset_torch_rng(0)
            with _time_limit(self.method_timeout):
                Tensor.manual_seed(0)
                obj = cls(mi.name)
                getattr(obj, mi.name)()
        except unittest.SkipTest as e:
            ctx.skip = str(e) or "skipped"
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:
            ctx.abort = _describe(e)
            ctx.abort_stmt = ctx.stmt
        finally:
            _Current.ctx = None
            Device.DEFAULT = prev

    def _stmt_index(self, method_id, sid):
        return self.tm.methods[method_id].stmts.index(sid)

    def has_direct(self, method_id):
        return any(self.tm.stmts[s].direct for s in self.tm.methods[method_id].stmts)

    # -- discovery
    def discover(self, methods=None) -> List[CaseInfo]:
        """Every case, in source order: the helper calls as the reference's body makes them (helpers do not run;
        statements with only assertions are not run) and a :direct case per method with assertions of its own."""
        if self._cases is not None and methods is None:
            return self._cases
        out = []
        for mid in (methods or self.tm.method_ids()):
            mi = self.tm.methods[mid]
            ctx = _Ctx("discover", mid)
            self._run_body(mid, ctx, self.ref)
            for s in ctx.seen.values():
                out.append(CaseInfo(s.id, mid, s.kind, s.line, s.desc, s.forward_only))
            if self.has_direct(mid) and ctx.skip is None:
                out.append(CaseInfo(f"{mid}:direct", mid, "direct", mi.line, "the method's own assertions"))
        if methods is None:
            self._cases = out
        return out

    # -- a method on both devices
    def run_method(self, method_id, select=None) -> List[CaseResult]:
        """The method's cases (all, or those of `select`, a set of case ids) on both devices, compared."""
        mi = self.tm.methods[method_id]
        t0 = time.monotonic()
        rctx = _Ctx("ref", method_id, select, case_timeout=self.case_timeout)
        self._run_body(method_id, rctx, self.ref)
        dctx = _Ctx("dut", method_id, select, ref=rctx, case_timeout=self.case_timeout)
        if rctx.skip is None:
            self._run_body(method_id, dctx, self.dut)
        results = []
        tm = self.tm
        if rctx.skip is not None:
            self.notes.append(Note(method_id, mi.line, f"skipped on the reference: {rctx.skip}"))
        for sid, why in rctx.skipped.items():
            self.notes.append(Note(method_id, tm.stmts[sid].line, f"statement skipped (needs torch): {why}"))
        if rctx.abort is not None:
            self.notes.append(Note(method_id, mi.line, f"reference body raised at {_where(tm, rctx)}, the cases after "
                                                       f"it are not enumerated: {rctx.abort}"))
        dut_abort = (f"not reached: the method body raised on {self.dut} at {_where(tm, dctx)}: {dctx.abort}"
                     if dctx.abort is not None else f"not reached on {self.dut}")
        for cid, s in rctx.seen.items():
            if not rctx.selected(cid):
                continue
            ref = rctx.execs.get(cid)
            res = CaseResult(cid, method_id, s.kind, s.line, s.desc, "left_out",
                             backward=None if (s.forward_only or s.kind != "op") else "left_out")
            results.append(res)
            if s.kind == "exc":
                if ref.expected_ok is False or (ref.expected_ok is None and ref.exc_type is None):
                    res.forward_reason = (("needs torch: " if ref.touched else "reference did not raise as expected: ")
                                          + (ref.fwd_err or "no exception"))
                    continue
                d = dctx.execs.get(cid)
                if d is None:
                    res.forward, res.forward_reason = "fail", dut_abort
                elif d.expected_ok is not None:  # helper_test_exception
                    res.forward = "pass" if d.expected_ok else "fail"
                    if not d.expected_ok:
                        res.forward_reason = f"expected exception not raised: {d.fwd_err or 'no exception'}"
                else:  # helper_test_op in assertRaises: the same exception type as the reference
                    ok = d.exc_type is not None and d.exc_type is ref.exc_type
                    res.forward = "pass" if ok else "fail"
                    if not ok:
                        res.forward_reason = f"raised {d.fwd_err or 'nothing'}, reference raised {ref.fwd_err}"
                res.seconds = d.seconds if d else 0.0
                continue
            if ref.fwd_err is not None:
                res.forward_reason = ("needs torch: " if ref.touched else "reference raised: ") + ref.fwd_err
                if res.backward:
                    res.backward_reason = "forward left out"
                continue
            d = dctx.execs.get(cid)
            if d is None:
                res.forward, res.forward_reason = "fail", dut_abort
                if res.backward:
                    res.backward, res.backward_reason = "fail", dut_abort
                continue
            res.seconds = d.seconds
            res.trace = d.trace
            if d.fwd_err is not None:
                res.forward, res.forward_reason = "fail", d.fwd_err
            elif d.device != self.dut_canonical and ref.device == self.ref_canonical:
                res.forward, res.forward_reason = "fail", f"forward: the output is on {d.device}, not on {self.dut}"
            else:
                why = compare("forward", d.fwd, ref.fwd, s.atol, s.rtol)
                res.forward, res.forward_reason = ("fail", why) if why else ("pass", "")
            if res.backward is None:
                continue
            if ref.bwd_err is not None:
                res.backward_reason = ("needs torch: " if ref.touched else "reference raised: ") + ref.bwd_err
            elif d.fwd_err is not None:
                res.backward, res.backward_reason = "fail", "forward raised"
            elif d.bwd_err is not None:
                res.backward, res.backward_reason = "fail", d.bwd_err
            else:
                why = None
                for i, (g, rg) in enumerate(zip(d.grads, ref.grads)):
                    why = compare(f"backward pass tensor {i}", g, rg, s.grad_atol, s.grad_rtol)
                    if why:
                        break
                res.backward, res.backward_reason = ("fail", why) if why else ("pass", "")
        did = f"{method_id}:direct"
        if self.has_direct(method_id) and rctx.skip is None and (select is None or did in select):
            res = CaseResult(did, method_id, "direct", mi.line, "the method's own assertions", "left_out")
            direct = [s for s in mi.stmts if tm.stmts[s].direct]
            if rctx.abort is not None:
                res.forward_reason = f"reference raised at {_where(tm, rctx)}: {rctx.abort}"
            elif all(s in rctx.skipped for s in direct):
                res.forward_reason = "needs torch: " + "; ".join(rctx.skipped[s] for s in direct)[:300]
            elif dctx.abort is not None:
                res.forward, res.forward_reason = "fail", f"raised at {_where(tm, dctx)}: {dctx.abort}"
            else:
                res.forward = "pass"
            results.append(res)
        if self.log:
            n_fail = sum(r.failed for r in results)
            self.log(f"{method_id}: {len(results)} cases, {n_fail} failing, {time.monotonic() - t0:.1f} s")
        return results

    def run(self, select=None, methods=None) -> List[CaseResult]:
        """All methods (or `methods`), all cases (or those in `select`)."""
        out = []
        for mid in (methods or self.tm.method_ids()):
            if select is not None and not any(c.split("#")[0].split("!")[0].split(":")[0] == mid for c in select):
                continue
            out.extend(self.run_method(mid, select))
        return out


def case_method(case_id):
    return re.split(r"[#!:]", case_id, maxsplit=1)[0]


def sample_every(cases, k, offset=0):
    """Every k-th case (deterministic), from `offset`."""
    return [c for i, c in enumerate(cases) if i % k == offset % k]


def sample_n(cases, n):
    """n cases spread evenly over the list (deterministic)."""
    if n >= len(cases):
        return list(cases)
    return [cases[(i * len(cases)) // n] for i in range(n)]


def totals(results):
    """{"forward": (pass, fail, left_out), "backward": ..., "exception": ..., "direct": ...}"""
    t = {k: [0, 0, 0] for k in ("forward", "backward", "exception", "direct")}
    idx = {"pass": 0, "fail": 1, "left_out": 2}
    for r in results:
        if r.kind == "op":
            t["forward"][idx[r.forward]] += 1
            if r.backward is not None:
                t["backward"][idx[r.backward]] += 1
        else:
            t["exception" if r.kind == "exc" else "direct"][idx[r.forward]] += 1
    return {k: tuple(v) for k, v in t.items()}


def install_device(device, server=None):
    """Makes `device` usable in tinygrad: KEX through kex.tinygrad.install(server=...); others are tinygrad's."""
    if device.upper() != "KEX":
        return
    for p in (tinygrad_root(), os.path.join(ROOT, "client", "python")):
        if p not in sys.path:
            sys.path.insert(0, p)
    import importlib
    kt = importlib.import_module("kex.tinygrad")
    if not hasattr(kt, "install"):
        raise ImportError("kex.tinygrad has no install()")
    kt.install(server=server)


def kex_tinygrad_ready():
    """None when client/python/kex/tinygrad.py exists and defines install(), else why not."""
    p = os.path.join(ROOT, "client", "python", "kex", "tinygrad.py")
    if not os.path.exists(p):
        return f"{os.path.relpath(p, ROOT)} does not exist yet"
    with open(p) as f:
        if not re.search(r"^def install\(", f.read(), re.M):
            return f"{os.path.relpath(p, ROOT)} has no install() yet"
    return None
