"""numpy interop and the Python protocols of kex.Tensor, against numpy's answers:
np.asarray(t) is the data, numpy's operators defer to the Tensor
(__array_ufunc__ = None), arrays and numpy scalars mix into Tensor
expressions, and bool/int/float/len/format behave as in tinygrad/torch
(bool of a one-element tensor is its computed value)."""
import numpy as np
import pytest

import kex

rng = np.random.default_rng(1)


def rand(*shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


@pytest.fixture
def T(client, needs_submit):
    return lambda a, **kw: kex.tensor(a, client=client, **kw)


def test_asarray_is_the_data(T):
    a = rand(3, 4)
    t = T(a) * 2 + 1
    got = np.asarray(t)
    assert isinstance(got, np.ndarray) and got.shape == (3, 4) and got.dtype == np.float32
    np.testing.assert_allclose(got, a * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(np.array(t, dtype=np.float64), (a * 2 + 1).astype(np.float64), rtol=1e-6)
    assert np.asarray(T(a).sum(axis=1)).shape == (3,)
    np.testing.assert_allclose(np.mean(np.asarray(T(a))), a.mean(), rtol=1e-5)


@pytest.mark.parametrize("expr", ["n + t", "n - t", "n * t", "n / t", "n < t", "n > t", "n == t", "n <= t",
                                  "t + n", "t * n", "t - n", "t / n", "t >= n"])
def test_numpy_operators_defer_to_the_tensor(T, expr):
    a, b = rand(3, 4), rand(4, lo=0.5, hi=2.0)
    r = eval(expr, {"t": T(a), "n": b})
    assert isinstance(r, kex.Tensor), type(r)       # not an object array of Tensors
    want = eval(expr, {"t": a, "n": b})
    assert r.shape == want.shape
    np.testing.assert_allclose(r.numpy().astype(np.float64), want.astype(np.float64), rtol=1e-5, atol=1e-6)


def test_numpy_float64_array_promotes_like_numpy(T):
    a = rand(5)
    r = np.ones(5) + T(a)                            # float64 + float32 -> float64, in numpy and here
    assert isinstance(r, kex.Tensor) and r.dtype == "float64"
    np.testing.assert_allclose(r.numpy(), np.ones(5) + a)


def test_numpy_matmul_both_ways(T):
    a, w = rand(3, 4), rand(4, 2)
    r = a @ T(w)
    assert isinstance(r, kex.Tensor)
    np.testing.assert_allclose(r.numpy(), a @ w, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose((T(a) @ w).numpy(), a @ w, rtol=1e-5, atol=1e-5)


def test_numpy_scalars_act_like_python_scalars(T):
    h = T(np.ones(3, np.float16))
    assert (h * np.float64(2.5)).dtype == "float16"  # weak, as a Python float
    i = T(np.arange(3, dtype=np.int32))
    assert (i + np.int64(1)).dtype == "int32"
    r = np.int64(2) * i
    assert isinstance(r, kex.Tensor) and r.dtype == "int32"
    np.testing.assert_array_equal(r.numpy(), [0, 2, 4])
    assert isinstance(np.float32(1.5) - h, kex.Tensor)


def test_where_maximum_assign_take_arrays(T):
    a, b = rand(6), rand(6)
    np.testing.assert_allclose((T(a) > 0).where(b, 0.0).numpy(), np.where(a > 0, b, 0))
    np.testing.assert_allclose(T(a).maximum(b).numpy(), np.maximum(a, b))
    w = T(a)
    w.assign(b).realize()
    np.testing.assert_allclose(w.numpy(), b)


def test_bool_is_the_real_answer(T):
    a = rand(10)
    x = T(a)
    assert bool(x.sum() < 0) == bool(a.sum() < 0)
    assert bool(x.sum() > 0) == bool(a.sum() > 0)
    assert bool(x.max() >= x.min())
    assert not bool((x * 0).sum() != 0)
    assert bool(T(np.array([0.0], np.float32))) is False
    flag = "pos" if x.sum() > 0 else "neg"       # an if on a Tensor computes it
    assert flag == ("pos" if a.sum() > 0 else "neg")
    with pytest.raises(ValueError, match="ambiguous"):
        bool(x)
    with pytest.raises(ValueError):
        bool(T(np.zeros((0,), np.float32)))


def test_int_float_len_format(T):
    a = np.array([[1.5, -2.25, 3.0]], np.float32)
    x = T(a)
    assert float(x.sum()) == pytest.approx(2.25)
    assert int(x[0, 2]) == 3 and isinstance(int(x[0, 2]), int)
    assert int(T([7, 8, 9])[1]) == 8
    with pytest.raises(ValueError, match="one-element"):
        float(x)
    with pytest.raises(ValueError, match="one-element"):
        int(x)
    assert len(x) == 1 and len(T(rand(4, 2))) == 4 and len(kex.Tensor(3.0, client=x.client)) == 1  # tinygrad: 0-d is 1
    assert f"{x.sum():.3f}" == "2.250"
    assert x.sum().item() == pytest.approx(2.25)
    with pytest.raises(ValueError):
        x.item()
    assert [r.shape for r in T(rand(3, 2))] == [(2,), (2,), (2,)]   # iteration: one tensor per row


def test_results_are_cached_until_the_tensor_changes(client, T, monkeypatch):
    submits = []
    real = client.submit
    monkeypatch.setattr(client, "submit", lambda *a, **kw: submits.append(1) or real(*a, **kw))
    a = rand(4)
    x = T(a) + 1
    np.asarray(x)
    assert len(submits) == 1
    np.asarray(x), x.tolist(), x.numpy(), repr(x)   # x's value is known now: no more Submits
    assert len(submits) == 1
    assert bool(x.sum() > -100) and len(submits) == 2
    w = T(a)
    w.assign(w * 2).realize()                       # a new value: not a cached one
    np.testing.assert_allclose(np.asarray(w), a * 2)
    w.assign(w + 1).realize()
    np.testing.assert_allclose(np.asarray(w), a * 2 + 1)


def test_results_over_4mib(client, needs_submit):
    """numpy() of a 4.4 MB result: Downloaded in chunks, not inline over gRPC's 4 MiB message limit."""
    x = kex.full((1100, 1000), 3.0, client=client) + 1
    a = np.asarray(x)
    assert a.shape == (1100, 1000) and (a == 4).all()
