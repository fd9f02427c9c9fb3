"""Factories and habits with tinygrad 0.9.0's semantics (tensor.py of
../shared/anchors/tinygrad-0.9.0): zeros/ones/full/arange/eye, seeded
rand/randn, argmax/argmin, shape/dtype/ndim/numel/device/to, the casts,
lists of ints as int32, repr, and a docstring on every public name."""
import inspect
import pydoc

import numpy as np
import pytest

import kex

rng = np.random.default_rng(2)


# ---- full, zeros, ones, arange, eye ----

def test_zeros_ones_full(client, evaluate):
    z = kex.zeros(2, 3, client=client)
    assert z.shape == (2, 3) and z.dtype == "float32"
    np.testing.assert_array_equal(evaluate(z), np.zeros((2, 3), np.float32))
    o = kex.Tensor.ones((4,), dtype="int32", client=client)
    assert o.dtype == "int32"
    np.testing.assert_array_equal(evaluate(o), np.ones(4, np.int32))
    assert kex.full((2, 2), 42, client=client).dtype == "int32"          # tinygrad: the value's dtype
    assert kex.full((2, 2), 4.5, client=client).dtype == "float32"
    assert kex.full((2,), False, client=client).dtype == "bool"
    np.testing.assert_array_equal(evaluate(kex.full((2, 3), 7, client=client)), np.full((2, 3), 7, np.int32))
    assert kex.zeros(3, dtype=kex.dtypes.half, client=client).dtype == "float16"
    assert kex.ones(3, dtype=np.int8, client=client).dtype == "int8"
    x = kex.tensor(rng.standard_normal((3, 2)).astype(np.float32), client=client)
    assert x.zeros_like().shape == (3, 2) and x.ones_like(dtype="int32").dtype == "int32"
    np.testing.assert_array_equal(evaluate(x.full_like(2.5)), np.full((3, 2), 2.5, np.float32))


@pytest.mark.parametrize("args,kw", [((5,), {}), ((5, 10), {}), ((5, 10, 2), {}), ((5.5, 10, 2), {}),
                                     ((10, 0, -3), {}), ((0, 1, 0.25), {}), ((1,), {}), ((7,), {"dtype": "float32"}),
                                     ((-4, 4), {"dtype": "int8"})])
def test_arange(client, evaluate, args, kw):
    t = kex.arange(*args, client=client, **kw)
    want = np.arange(*args)
    want_dtype = kw.get("dtype") or ("float32" if any(isinstance(a, float) for a in args) else "int32")
    assert t.dtype == want_dtype and t.shape == want.shape
    np.testing.assert_allclose(evaluate(t).astype(np.float64), want.astype(np.float64), rtol=1e-6, atol=1e-6)


def test_arange_is_one_kernel_as_tinygrad(client):
    assert kex.arange(16, client=client).plan().kernels == 1     # the cumsum folds (loop_collapse)
    assert kex.arange(0, client=client).shape == (0,)
    with pytest.raises(ValueError):
        kex.arange(1, 5, 0)


def test_eye(client, evaluate):
    e = kex.eye(4, client=client)
    assert e.shape == (4, 4) and e.dtype == "float32"
    np.testing.assert_array_equal(evaluate(e), np.eye(4, dtype=np.float32))
    np.testing.assert_array_equal(evaluate(kex.Tensor.eye(3, dtype="int32", client=client)), np.eye(3, dtype=np.int32))


# ---- random, seeded as tinygrad ----

def test_rand_seeding(client, needs_submit):
    kex.manual_seed(1234)
    a, b = kex.rand(4, 5, client=client), kex.rand(4, 5, client=client)
    kex.manual_seed(1234)
    a2, b2 = kex.rand(4, 5, client=client), kex.rand(4, 5, client=client)
    av, bv = a.numpy(), b.numpy()
    assert av.shape == (4, 5) and av.dtype == np.float32
    assert ((av >= 0) & (av < 1)).all() and av.std() > 0.1
    np.testing.assert_array_equal(av, a2.numpy())      # the same seed: the same tensors, in order
    np.testing.assert_array_equal(bv, b2.numpy())
    assert not np.array_equal(av, bv)                   # each rand takes the next seed
    np.testing.assert_array_equal(a.numpy(), av)        # a tensor keeps its values
    kex.Tensor.manual_seed(1235)                         # seed s: the n-th rand draws with s + n, so the
    np.testing.assert_array_equal(kex.Tensor.rand(4, 5, client=client).numpy(), bv)   # first after 1235 is b
    with pytest.raises(ValueError):
        kex.manual_seed(-1)


def test_rand_dtypes_and_randn(client, needs_submit):
    kex.manual_seed(7)
    h = kex.rand(64, dtype="float16", client=client)
    assert h.dtype == "float16" and ((h.numpy() >= 0) & (h.numpy() < 1)).all()
    i = kex.rand(8, dtype="int32", client=client)      # tinygrad: float32 in [0, 1) cast: zeros
    assert i.dtype == "int32" and (i.numpy() == 0).all()
    n = kex.randn(20000, client=client).numpy()
    assert n.dtype == np.float32 and abs(n.mean()) < 0.05 and abs(n.std() - 1) < 0.05
    r = kex.randint(1000, low=3, high=7, client=client).numpy()
    assert r.dtype == np.int32 and r.min() >= 3 and r.max() <= 6 and len(set(r.tolist())) == 4
    u = kex.uniform(1000, low=-2.0, high=2.0, client=client).numpy()
    assert u.min() >= -2 and u.max() < 2 and u.min() < -1.5


# ---- argmax / argmin ----

@pytest.mark.parametrize("axis,keepdim", [(None, False), (0, False), (1, False), (-1, True), (2, False)])
def test_argmax_argmin(client, evaluate, axis, keepdim):
    a = rng.integers(0, 5, size=(3, 4, 5)).astype(np.float32)      # ties: the first index wins, as numpy
    t = kex.tensor(a, client=client)
    for name in ("argmax", "argmin"):
        r = getattr(t, name)(axis=axis, keepdim=keepdim)
        want = getattr(np, name)(a, axis=axis)
        if keepdim and axis is not None:
            want = np.expand_dims(want, axis)
        assert r.dtype == "int32" and r.shape == np.shape(want), (name, r.shape)
        np.testing.assert_array_equal(evaluate(r), want)


def test_argmax_of_the_tinygrad_docstring(client, evaluate):
    t = kex.tensor([[1, 0, 2], [5, 4, 3]], client=client)
    assert evaluate(t.argmax()) == 3
    np.testing.assert_array_equal(evaluate(t.argmax(axis=0)), [1, 1, 1])
    np.testing.assert_array_equal(evaluate(t.argmax(axis=1)), [2, 0])
    np.testing.assert_array_equal(evaluate(t.argmin(axis=1)), [1, 2])


# ---- properties, device, casts, lists ----

def test_properties(client):
    t = kex.tensor(np.zeros((2, 3, 4), np.float16), client=client)
    assert t.shape == (2, 3, 4) and t.dtype == "float16" and t.ndim == 3 and t.numel() == 24
    assert t.element_size() == 2 and t.nbytes() == 48 and t.is_floating_point()
    assert t.sum(axis=1).shape == (2, 4) and t.sum().ndim == 0 and t.sum().numel() == 1


def test_device_and_to(client, needs_submit):
    names = [d.name for d in client.devices()]
    default = next(d.name for d in client.devices() if d.is_default)
    t = kex.tensor(np.arange(6, dtype=np.float32), client=client)
    assert t.device == default and (t + 1).device == default
    assert t.to(default) is t and t.to(None) is t
    other = next((n for n in names if n != default and ":" not in n), None)
    if other is None:
        pytest.skip(f"kexd has one device ({names})")
    c = t.to(other)
    assert c.device == other and c.node.op == "COPY"
    y = (c * 2 + 1).sum()                             # constants follow the tensor to its device
    assert y.device == other
    assert y.item() == pytest.approx(float((np.arange(6) * 2 + 1).sum()))
    z = kex.zeros(3, device=other, client=client)
    assert z.device == other and z.numpy().tolist() == [0, 0, 0]
    r = (c + 1).realize()                             # a realized buffer stays on its device
    assert r.device == other and r.numpy().tolist() == [1, 2, 3, 4, 5, 6]
    assert (r + kex.ones(6, device=other, client=client)).numpy().tolist() == [2, 3, 4, 5, 6, 7]
    h = (t * 10).realize()                            # held on the default device ...
    assert h.device == default
    moved = h.to(other)                               # ... its bytes copied to the other one
    assert moved.device == other and (moved + 1).numpy().tolist() == [1, 11, 21, 31, 41, 51]
    assert (moved - 1).to(default).numpy().tolist() == [-1, 9, 19, 29, 39, 49]
    u = kex.tensor(np.ones(6, np.float32), device=other, upload=True, client=client)
    assert u.device == other and (u + moved).numpy().tolist() == [1, 11, 21, 31, 41, 51]
    with pytest.raises(ValueError, match="different devices"):
        h.realize(r)                                  # kexd runs one graph on one device


def test_casts(client, evaluate):
    t = kex.tensor([-1, 2, 3], client=client)
    assert t.float().dtype == "float32" and t.half().dtype == "float16" and t.int().dtype == "int32"
    assert t.bool().dtype == "bool" and t.cast(np.float64).dtype == "float64"
    np.testing.assert_array_equal(evaluate(kex.tensor([1.7, -2.2], client=client).int()), [1, -2])
    np.testing.assert_array_equal(evaluate(t.float() / 2), [-0.5, 1, 1.5])


def test_python_lists_take_tinygrad_dtypes(client, evaluate):
    i = kex.tensor([1, 2, 3], client=client)
    assert i.dtype == "int32"                          # numpy would say int64
    assert kex.tensor([[1, 2], [3, 4]], client=client).dtype == "int32"
    assert kex.tensor([1.0, 2], client=client).dtype == "float32"
    assert kex.tensor([True, False], client=client).dtype == "bool"
    assert kex.tensor([], client=client).dtype == "float32"
    assert kex.tensor([1, 2], dtype="int64", client=client).dtype == "int64"
    assert kex.tensor(np.array([1, 2]), client=client).dtype == "int64"   # a numpy array keeps its dtype
    np.testing.assert_array_equal(evaluate(i * 2), [2, 4, 6])
    assert (i + [10, 20, 30]).dtype == "int32"


def test_repr(client, needs_submit):
    default = next(d.name for d in client.devices() if d.is_default)
    x = kex.tensor(np.arange(4, dtype=np.float32), client=client) * 2
    r = repr(x)
    assert r.startswith("<kex.Tensor") and "shape=(4,)" in r and "dtype=float32" in r and f"device={default}" in r
    assert "lazy" in r and "[" not in r.split("device=")[1]
    x.realize()
    r = repr(x)
    assert "lazy" not in r and "[0. 2. 4. 6.]" in r
    y = kex.tensor(np.arange(10000, dtype=np.int32).reshape(100, 100), client=client) + 1
    y.numpy()
    r = repr(y)
    assert "shape=(100, 100)" in r and "dtype=int32" in r and "..." in r and "10000" in r and len(r) < 600
    assert "1" in repr(kex.tensor([1], client=client))   # inline data is realized data


# ---- documentation ----

def _undocumented(obj, names):
    out = []
    for n in names:
        a = inspect.getattr_static(obj, n) if inspect.isclass(obj) else getattr(obj, n)
        if isinstance(a, (str, int, float, type(inspect.getattr_static(kex.TuneResult, "us")))):
            continue  # constants and __slots__ members (documented in their class)
        f = a.fget if isinstance(a, property) else getattr(a, "__func__", a)
        if not (getattr(f, "__doc__", None) or "").strip():
            out.append(f"{getattr(obj, '__name__', obj)}.{n}")
    return out


def test_every_public_name_has_a_docstring():
    missing = _undocumented(kex, kex.__all__)
    for cls in (kex.Tensor, kex.Client, kex.TuneResult, kex.Error):
        missing += _undocumented(cls, [n for n in vars(cls) if not n.startswith("_")])
    missing += _undocumented(kex.cache, kex.cache.__all__)
    missing += _undocumented(kex.dtypes, [n for n, v in vars(kex.dtypes).items()
                                          if not n.startswith("_") and inspect.isfunction(v)])
    assert not missing, missing


def test_help_says_something_useful():
    text = pydoc.render_doc(kex.Tensor.softmax, renderer=pydoc.plaintext)
    assert "axis" in text and "exp" in text and "sum" in text
    assert "numpy" in pydoc.render_doc(kex.Tensor, renderer=pydoc.plaintext)
    assert "seed" in pydoc.render_doc(kex.rand, renderer=pydoc.plaintext)
