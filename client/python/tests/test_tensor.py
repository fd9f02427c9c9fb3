"""The kex Tensor against numpy (values, broadcasting, dtype promotion), kernel
counts through plan() against tinygrad's, and error codes and messages."""
import math

import grpc
import numpy as np
import pytest

import kex

rng = np.random.default_rng(0)


def rand(*shape, dtype=np.float32, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def T(a, client):
    return kex.tensor(a, client=client)


def close(got, want, rtol=1e-5, atol=1e-5):
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)


# ---- elementwise and broadcasting ----

BINARY = [("add", lambda a, b: a + b), ("sub", lambda a, b: a - b), ("mul", lambda a, b: a * b),
          ("div", lambda a, b: a / b)]
SHAPES = [((4, 5), (4, 5)), ((4, 5), (5,)), ((3, 1, 5), (4, 1)), ((), (2, 3)), ((2, 3, 1), (1, 1, 4))]


@pytest.mark.parametrize("name,fn", BINARY)
@pytest.mark.parametrize("sa,sb", SHAPES)
def test_binary_broadcast(client, evaluate, name, fn, sa, sb):
    a, b = rand(*sa), rand(*sb, lo=0.5, hi=2.0)
    close(evaluate(fn(T(a, client), T(b, client))), fn(a, b))


@pytest.mark.parametrize("name,fn", BINARY)
def test_scalar_operands(client, evaluate, name, fn):
    a = rand(3, 4, lo=0.5, hi=2.0)
    close(evaluate(fn(T(a, client), 3.0)), fn(a, np.float32(3.0)))
    close(evaluate(fn(2.5, T(a, client))), fn(np.float32(2.5), a))


@pytest.mark.parametrize("op", ["<", ">", "==", "<=", ">=", "!="])
def test_comparisons(client, evaluate, op):
    a = rng.integers(0, 4, size=(4, 6)).astype(np.float32)
    b = rng.integers(0, 4, size=(6,)).astype(np.float32)
    f = eval(f"lambda x, y: x {op} y")
    t = f(T(a, client), T(b, client))
    assert t.dtype == "bool"
    np.testing.assert_array_equal(evaluate(t), f(a, b))
    np.testing.assert_array_equal(evaluate(f(T(a, client), 2.0)), f(a, np.float32(2.0)))


def test_where_and_logical_not(client, evaluate):
    a, b, c = rand(4, 5), rand(4, 5), rand(5)
    close(evaluate((T(a, client) > 0).where(T(b, client), T(c, client))), np.where(a > 0, b, c))
    close(evaluate((T(a, client) > 0).where(1.0, T(c, client))), np.where(a > 0, np.float32(1), c))
    np.testing.assert_array_equal(evaluate((T(a, client) > 0).logical_not()), ~(a > 0))


UNARY = [("exp", np.exp, -2, 2), ("log", np.log, 0.1, 4), ("sqrt", np.sqrt, 0.0, 4), ("sin", np.sin, -3, 3),
         ("relu", lambda x: np.maximum(x, 0), -2, 2), ("sigmoid", lambda x: 1 / (1 + np.exp(-x)), -4, 4),
         ("tanh", np.tanh, -3, 3), ("neg", np.negative, -2, 2), ("abs", np.abs, -2, 2),
         ("reciprocal", lambda x: 1 / x, 0.5, 2)]


@pytest.mark.parametrize("name,fn,lo,hi", UNARY)
def test_unary(client, evaluate, name, fn, lo, hi):
    a = rand(5, 7, lo=lo, hi=hi)
    close(evaluate(getattr(T(a, client), name)()), fn(a), rtol=1e-4, atol=1e-5)


# ---- dtype promotion (tinygrad's lattice, not numpy's where they differ) ----

@pytest.mark.parametrize("da,db,want", [
    ("int32", "float32", "float32"), ("int8", "uint8", "int16"), ("bool", "int32", "int32"),
    ("uint32", "int32", "int64"), ("int64", "float16", "float16"), ("int64", "uint64", "float16"),
    ("float16", "float32", "float32"), ("uint8", "uint16", "uint16"), ("bool", "bool", "bool")])
def test_promotion(client, da, db, want):
    a = kex.tensor(np.ones(3, dtype=da), client=client)
    b = kex.tensor(np.ones(3, dtype=db), client=client)
    assert (a + b).dtype == want
    assert kex.dtypes.least_upper_dtype(da, db) == want


def test_python_scalars_take_the_tensor_dtype(client, evaluate):
    i = kex.tensor(np.arange(6, dtype=np.int32), client=client)
    assert (i + 1).dtype == "int32"
    assert (i + 1.5).dtype == "float32"       # a float scalar on an int tensor: default_float
    assert (i / 2).dtype == "float32"         # div upcasts to float
    h = kex.tensor(np.ones(3, np.float16), client=client)
    assert (h * 3).dtype == "float16"
    b = kex.tensor(np.array([True, False]), client=client)
    assert (b + 1).dtype == "int32"
    np.testing.assert_array_equal(evaluate(i * 3 - 1), np.arange(6, dtype=np.int32) * 3 - 1)
    close(evaluate(i + 1.5), np.arange(6, dtype=np.float32) + 1.5)


def test_mixed_dtype_values(client, evaluate):
    a = rng.integers(-5, 5, size=(3, 4)).astype(np.int32)
    b = rand(4)
    t = T(a, client) * T(b, client)
    assert t.dtype == "float32"
    close(evaluate(t), a.astype(np.float32) * b)
    close(evaluate(T(a, client).cast("float32") / 3), a.astype(np.float32) / 3)


# ---- reduce ----

@pytest.mark.parametrize("op", ["sum", "max", "mean"])
@pytest.mark.parametrize("axis,keepdim", [(None, False), (0, False), (1, True), ((0, 2), False), (-1, True)])
def test_reduce(client, evaluate, op, axis, keepdim):
    a = rand(3, 4, 5)
    t = getattr(T(a, client), op)(axis=axis, keepdim=keepdim)
    want = getattr(np, op)(a, axis=axis, keepdims=keepdim)
    assert t.shape == np.shape(want)
    close(evaluate(t), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_int_sum_accumulates_in_int32(client, evaluate):
    a = rng.integers(0, 100, size=(8, 16)).astype(np.int8)
    t = T(a, client).sum(1)
    assert t.dtype == "int32"
    np.testing.assert_array_equal(evaluate(t), a.astype(np.int32).sum(1))


def test_softmax(client, evaluate):
    a = rand(4, 6, 10)
    e = np.exp(a - a.max(-1, keepdims=True))
    close(evaluate(T(a, client).softmax()), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


# ---- movement ----

def test_movement(client, evaluate):
    a = rand(2, 3, 4)
    t = T(a, client)
    close(evaluate(t.reshape(6, 4)), a.reshape(6, 4))
    close(evaluate(t.reshape(-1, 2)), a.reshape(-1, 2))
    close(evaluate(t.permute(2, 0, 1)), a.transpose(2, 0, 1))
    close(evaluate(t[:, :1].expand(2, 5, 4)), np.broadcast_to(a[:, :1], (2, 5, 4)))
    close(evaluate(t.pad(((1, 0), None, (0, 2)))), np.pad(a, ((1, 0), (0, 0), (0, 2))))
    close(evaluate(t.pad(((0, 1), None, None), value=3.0)), np.pad(a, ((0, 1), (0, 0), (0, 0)), constant_values=3))
    close(evaluate(t.shrink(((0, 1), (1, 3), None))), a[0:1, 1:3])
    close(evaluate(t.flip(1)), a[:, ::-1])


@pytest.mark.parametrize("idx", [np.s_[1:3, ::2], np.s_[1], np.s_[-1, 2], np.s_[::-1], np.s_[..., 1],
                                 np.s_[None, 0:2, None], np.s_[:, 3:0:-2], np.s_[0, :, ::3]])
def test_slicing(client, evaluate, idx):
    a = rand(4, 5, 6)
    t = T(a, client)[idx]
    assert t.shape == a[idx].shape
    close(evaluate(t), a[idx])


def test_matmul(client, evaluate):
    a, b, v = rand(5, 7), rand(7, 3), rand(7)
    close(evaluate(T(a, client) @ T(b, client)), a @ b, rtol=1e-5, atol=1e-5)
    close(evaluate(T(a, client) @ T(v, client)), a @ v, rtol=1e-5, atol=1e-5)
    x, y = rand(2, 4, 5), rand(2, 5, 3)
    close(evaluate(T(x, client) @ T(y, client)), x @ y, rtol=1e-5, atol=1e-5)


def test_contiguous_and_cast(client, evaluate):
    a = rand(3, 4)
    close(evaluate(T(a, client).T.contiguous()), a.T)
    np.testing.assert_array_equal(evaluate(T(a, client).cast("int32")), a.astype(np.int32))


# ---- Submit-only: numpy(), realize(), assign ----

def test_numpy_roundtrip(client, needs_submit):
    a = rand(16, 16)
    close((T(a, client) * 2).numpy(), a * 2)


def test_realize_then_reuse(client, needs_submit):
    a = rand(8)
    t = (T(a, client) + 1).realize()
    assert t.node.op == "BUFFER" and "buffer" in t.node.fields
    close((t * 3).numpy(), (a + 1) * 3)


def test_assign(client, needs_submit):
    a, b = rand(6), rand(6)
    w = T(a, client)
    w.assign(w - T(b, client) * 0.5).realize()
    close(w.numpy(), a - b * 0.5)
    w.assign(w * 2).realize()
    close(w.numpy(), (a - b * 0.5) * 2)


# ---- kernel counts through plan(), against tinygrad 0.9.0 ----

def test_plan_softmax_is_3_kernels(client):
    x = kex.tensor(rand(4, 12, 64, 64), client=client)
    assert x.softmax().plan().kernels == 3


def test_plan_contiguous_add_is_2_kernels(client):
    x, y, z = (kex.tensor(rand(10), client=client) for _ in range(3))
    assert ((x + y).contiguous() + z).plan().kernels == 2


def test_plan_counts(client):
    a = kex.tensor(rand(16, 32), client=client)
    b = kex.tensor(rand(32, 8), client=client)
    assert (a @ b).plan().kernels == 1                  # reshape/expand + MUL + SUM fuse
    assert (a + a * 2).plan().kernels == 1              # elementwise chain
    assert a.sum(1).relu().sum(0).plan().kernels == 2   # a reduce cannot feed another in one kernel
    assert (a.exp() + 1).sum().plan().kernels == 1
    assert a.tanh().plan().kernels == 1
    assert (a * 0).plan().kernels == 0                  # x*0 folds to a CONST: no kernel
    o0 = a.sum() + 2; o1 = a.sum() + 4                  # spec 15: the lazycache makes both sums one node
    assert o0.plan(o1, o0 * o1).kernels == 1            # MULTIOUTPUT: 1 kernel with 3 stores
    big = kex.tensor(rng.standard_normal(1 << 16).astype(np.float32), client=client)
    assert big.sum().plan().kernels == 2                # split reduce (ratio >= 32768)


def test_plan_reply_items(client):
    a = kex.tensor(rand(4, 4), client=client)
    r = (a + 1).plan()
    kinds = [i.kind for i in r.items]
    assert kinds.count("kernel") == r.kernels == 1
    assert any("ADD" in line for it in r.items for line in it.ast)


# ---- errors ----

def test_numpy_without_submit_raises_kex_error(client, submit_unavailable):
    if not submit_unavailable:
        pytest.skip("kexd implements Submit")
    with pytest.raises(kex.Error) as e:
        (kex.tensor(rand(3), client=client) + 1).numpy()
    assert e.value.code == grpc.StatusCode.UNIMPLEMENTED
    assert e.value.details == submit_unavailable and "Submit" in e.value.details


def test_unknown_job_is_not_found(kexd_addr):
    c = kex.Client(kexd_addr, job="0123456789abcdef0123456789abcdef")
    with pytest.raises(kex.Error) as e:
        kex.tensor(rand(2), client=c).sum().plan()
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    assert "unknown job token" in e.value.details
    c.close()


def test_invalid_graph_names_the_node(client):
    g = kex.graph_pb([])
    g.nodes.add(op="EMPTY", dtype="float32", shape=[4])
    n = g.nodes.add(op="RESHAPE", src=[0])
    n.new_shape.values.extend([3])
    g.outputs.append(1)
    with pytest.raises(kex.Error) as e:
        client.plan(g)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "node 1" in e.value.details and "element count" in e.value.details


def test_client_side_errors(client):
    a = kex.tensor(rand(2, 3), client=client)
    with pytest.raises(ValueError):
        a.reshape(4, 2)
    with pytest.raises(ValueError):
        a + kex.tensor(rand(4), client=client)
    with pytest.raises(IndexError):
        a[5]
    with pytest.raises(ValueError):
        a @ kex.tensor(rand(2, 3), client=client)


def test_upload_download_free(client):
    a = rng.integers(0, 1000, size=(3, 70000)).astype(np.int64)  # 1.7 MB: several chunks
    h = client.upload(a)
    dtype, shape, data = client.download(h)
    assert dtype == "int64" and shape == a.shape and data == a.tobytes()
    assert client.free([h]) == 1
    with pytest.raises(kex.Error) as e:
        client.download(h)
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_devices_and_stats(client):
    devs = client.devices()
    assert sum(d.is_default for d in devs) == 1
    s = client.stats()
    assert s.jobs_open >= 1 and s.calls > 0


def test_submit_trace(client, needs_submit):
    """Client.submit(..., trace=True): the done event's trace_json is a Chrome trace whose run spans are the kernels."""
    import json
    from kex.tensor import graph_pb
    t = (kex.tensor(np.arange(16, dtype=np.float32).reshape(4, 4), client=client) * 2).sum(axis=1)
    done = client.submit(graph_pb([t.node]), trace=True, timeout=60)
    doc = json.loads(done.trace_json)
    runs = [e["name"] for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "run" and e["name"] != "copy"
            and not e["name"].startswith("setup")]
    assert runs == [k.kernel for k in done.kernels]
    assert client.submit(graph_pb([t.node]), timeout=60).trace_json == ""


def test_submit_events_one_by_one(client, needs_submit):
    """Client.submit asks for batched events (a quick cached Submit is one message on the wire); on_event still
    gets each event on its own, in order, none carrying others."""
    from kex.tensor import graph_pb
    t = kex.tensor(np.arange(8, dtype=np.float32), client=client) + 1
    g = graph_pb([t.node])
    for i in range(3):  # the first compiles; the later ones are cached and quick
        evs = []
        done = client.submit(g, timeout=60, on_event=evs.append)
        kinds = [e.WhichOneof("event") for e in evs]
        assert kinds[:2] == ["accepted", "scheduled"] and kinds[-1] == "done", kinds
        assert kinds.count("running") == len(done.kernels) >= 1, kinds
        assert all(len(e.following) == 0 for e in evs)
        assert evs[-1].done == done
        assert np.array_equal(np.frombuffer(done.outputs[0].data, np.float32), np.arange(8, dtype=np.float32) + 1)
