"""kex.tinygrad: tinygrad 0.9.0 programs on device KEX (a real kexd), checked against tinygrad's CLANG device.

tinygrad comes from ../shared/anchors/tinygrad-0.9.0 (the tests skip, saying so, when it is missing)."""
import os
import socket
import sys
import tempfile
import time

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
TINYGRAD = os.path.normpath(os.path.join(ROOT, "..", "shared", "anchors", "tinygrad-0.9.0"))
if os.path.isdir(TINYGRAD) and TINYGRAD not in sys.path:
    sys.path.insert(0, TINYGRAD)
tinygrad = pytest.importorskip("tinygrad", reason=f"tinygrad 0.9.0 is not importable (looked in {TINYGRAD})")

import kex.tinygrad as kt  # noqa: E402
from kex.tinygrad import KexError  # noqa: E402
from tinygrad import Device, Tensor, TinyJit, dtypes, nn  # noqa: E402
from tinygrad.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def kex_device(kexd_addr):
    kt.install(server=kexd_addr)
    yield
    Device.DEFAULT = "CLANG"


def on(device, fn, seed=0):
    """fn() with tinygrad's default device `device` and seed; its Tensors' numpy values (a list)."""
    old = Device.DEFAULT
    Device.DEFAULT = device
    try:
        Tensor.manual_seed(seed)
        np.random.seed(seed)
        out = fn()
        out = out if isinstance(out, (list, tuple)) else [out]
        return [o.numpy() if isinstance(o, Tensor) else np.asarray(o) for o in out]
    finally:
        Device.DEFAULT = old


def same(fn, atol=1e-5, rtol=1e-5, seed=0):
    want, got = on("CLANG", fn, seed), on("KEX", fn, seed)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert w.shape == g.shape and w.dtype == g.dtype
        np.testing.assert_allclose(g, w, atol=atol, rtol=rtol)
    return got


def data(*shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_device_is_known():
    assert Device.canonicalize("kex") == "KEX"
    t = Tensor([1, 2, 3], device="KEX")
    assert t.device == "KEX"
    assert t.tolist() == [1, 2, 3]
    assert (t * 2).sum().item() == 12


def test_elementwise_reduce_movement():
    def prog():
        a, b = Tensor(data(4, 6)), Tensor(data(4, 6, seed=2))
        return [(a + b).relu(), (a * b).sum(axis=1), a.max(axis=0), a.permute(1, 0)[1:4, ::2].exp(),
                a.pad(((1, 0), (0, 2))).reshape(5, 8).cumsum(1), (a < b).where(a, b), a.cast(dtypes.int32),
                Tensor.arange(10) * 3, a.repeat(2, 2, 2, 2, 2)[0, 0, 0], a.softmax(1), a @ b.T]
    same(prog, atol=1e-4)


def test_one_submit_per_realize_and_no_local_kernels(monkeypatch):
    import tinygrad.engine.realize as tre
    compiled = []
    real = tre.get_runner
    monkeypatch.setattr(tre, "get_runner", lambda dname, ast: compiled.append(dname) or real(dname, ast))
    a = Tensor(data(8, 8), device="KEX")
    b = ((a @ a).relu().sum(axis=0) + a.max()).exp2()
    c = (a - 1).square().mean()
    before = kt.stats()["submits"]
    Tensor.realize(b, c)
    assert kt.stats()["submits"] == before + 1
    b.numpy(), c.item()   # realized already: bytes only, no Submit
    assert kt.stats()["submits"] == before + 1
    d = (b * c).numpy()   # one Submit, bytes inline in its done event
    assert kt.stats()["submits"] == before + 2
    assert compiled == [], f"tinygrad compiled kernels for {compiled}"
    np.testing.assert_allclose(d, b.numpy() * c.numpy(), rtol=1e-6)


def test_backward_matches_clang():
    def prog():
        x = Tensor(data(3, 5), requires_grad=True)
        w = Tensor(data(5, 4, seed=3), requires_grad=True)
        loss = (x @ w).gelu().log_softmax(1).mean() + x.abs().max() * 0.1
        loss.backward()
        return [loss, x.grad, w.grad]
    same(prog, atol=1e-5)


def test_nn_layers_forward_backward():
    def prog():
        conv, bn = nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4)
        ln, gn, emb, lin = nn.LayerNorm(8), nn.GroupNorm(2, 4), nn.Embedding(10, 8), nn.Linear(8, 3)
        x = Tensor(data(2, 2, 4, 4))
        idx = Tensor(np.array([[1, 2, 3, 9]], dtype=np.int32))
        for p in (conv.weight, conv.bias, bn.weight, bn.bias, ln.weight, gn.weight, emb.weight, lin.weight):
            p.requires_grad = True   # as an optimizer would set them
        with Tensor.train():
            h = gn(bn(conv(x)).relu()).reshape(2, 8, 8).permute(0, 2, 1)
            e = emb(idx)
            out = lin(ln(h).mean(1)).sum() + lin(e).sum()
            out.backward()
        grads = [conv.weight.grad, bn.weight.grad, ln.weight.grad, emb.weight.grad, lin.weight.grad]
        assert all(g is not None for g in grads), [g is None for g in grads]
        return [out, *grads]
    same(prog, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("opt", ["SGD", "Adam", "AdamW", "LAMB"])
def test_optimizers(opt):
    def prog():
        lin = nn.Linear(6, 3)
        o = getattr(nn.optim, opt)(get_parameters(lin), lr=0.05)
        x, y = Tensor(data(16, 6)), Tensor(np.arange(16, dtype=np.int32) % 3)
        losses = []
        with Tensor.train():
            for _ in range(4):
                o.zero_grad()
                loss = lin(x).sparse_categorical_crossentropy(y).backward()
                o.step()
                losses.append(loss.item())   # read after the step: the step's own loss, as tinygrad gives it
        return [np.array(losses, np.float32), lin.weight]
    got = same(prog, atol=1e-5, rtol=1e-4)
    assert got[0][-1] < got[0][0]


def test_rand_and_dropout_follow_tinygrads_seeding():
    def prog():
        a = Tensor.rand(3, 4)
        b = Tensor.randn(5)
        with Tensor.train():
            d = Tensor.ones(64).dropout(0.5)
        return [a, b, d, Tensor.uniform(2, 2, low=-1, high=1)]
    same(prog, atol=1e-6)


def test_assign_updates_in_place():
    w = Tensor(data(4), device="KEX").realize()
    handle = w.lazydata.base.realized._buf.handle
    w.assign(w * 2 + 1).realize()
    assert w.lazydata.base.realized._buf.handle == handle
    np.testing.assert_allclose(w.numpy(), data(4) * 2 + 1, rtol=1e-6)


def test_host_copies_are_upload_and_download():
    big = np.arange(1 << 19, dtype=np.float32)   # 2 MiB: more than goes inline
    s0 = kt.stats()
    t = Tensor(big, device="KEX").realize()
    s1 = kt.stats()
    assert s1["uploads"] == s0["uploads"] + 1 and s1["upload_bytes"] - s0["upload_bytes"] == big.nbytes
    back = t.to("CLANG").realize()
    s2 = kt.stats()
    assert s2["downloads"] == s1["downloads"] + 1 and s2["submits"] == s1["submits"]
    np.testing.assert_array_equal(back.numpy(), big)
    np.testing.assert_array_equal(Tensor(back.numpy(), device="KEX")[::1000].numpy(), big[::1000])


def test_tinyjit_step_sends_only_new_inputs():
    Device.DEFAULT = "KEX"
    try:
        Tensor.manual_seed(0)
        lin = nn.Linear(8, 4)
        opt = nn.optim.Adam(get_parameters(lin), lr=0.01)

        @TinyJit
        def step(x, y):
            with Tensor.train():
                opt.zero_grad()
                loss = lin(x).sparse_categorical_crossentropy(y).backward()
                opt.step()
                return loss.realize()

        xs = [data(32, 8, seed=s) for s in range(6)]
        ys = [np.arange(32, dtype=np.int32) % 4 for _ in range(6)]
        losses, per_call = [], []
        for x, y in zip(xs, ys):
            s0 = kt.stats()
            losses.append(step(Tensor(x), Tensor(y)).item())
            s1 = kt.stats()
            per_call.append({k: s1[k] - s0[k] for k in s1})
        assert step.cnt == 6 and len(step.jit_cache) >= 1
        for c in per_call[2:]:   # replays: one Submit for the new inputs, one for the step (kexd keeps its graph)
            assert c["submits"] == 2 and c["ref_submits"] >= 1, per_call
            assert c["inline_bytes"] == xs[0].nbytes + ys[0].nbytes, per_call
        assert per_call[-1]["graph_bytes"] < per_call[0]["graph_bytes"] / 10, per_call
    finally:
        Device.DEFAULT = "CLANG"
    want = on("CLANG", lambda: _jit_reference(xs, ys))[0]
    np.testing.assert_allclose(np.array(losses, np.float32), want, rtol=1e-4, atol=1e-5)


def _jit_reference(xs, ys):
    lin = nn.Linear(8, 4)
    opt = nn.optim.Adam(get_parameters(lin), lr=0.01)
    out = []
    with Tensor.train():
        for x, y in zip(xs, ys):
            opt.zero_grad()
            loss = lin(Tensor(x)).sparse_categorical_crossentropy(Tensor(y)).backward()
            opt.step()
            out.append(loss.item())
    return np.array(out, np.float32)


def test_state_dict_through_the_host(tmp_path):
    Device.DEFAULT = "KEX"
    try:
        Tensor.manual_seed(1)
        a, b = nn.Linear(5, 2), nn.Linear(5, 2)
        path = str(tmp_path / "w.safetensors")
        safe_save(get_state_dict(a), path)
        load_state_dict(b, safe_load(path))
        x = Tensor(data(3, 5))
        np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())
        assert b.weight.device == "KEX"
    finally:
        Device.DEFAULT = "CLANG"


def test_freed_buffers_are_freed_on_kexd():
    """1,000 steps, each a Submit that updates a weight in place and makes a temporary tinygrad then frees:
    the job's bytes on kexd stay flat."""
    c = kt.client()

    def held():
        return c.stats().job_stats[0].bytes_held

    w = Tensor(data(256), device="KEX").realize()

    def step():
        tmp = (w * 3).contiguous()
        w.assign(w * 0.5 + (tmp + 1).exp().log() * 0.1)
        Tensor.realize(w, tmp)

    for _ in range(20):
        step()
    kt._flush_frees()
    base = held()
    s0 = kt.stats()["submits"]
    for _ in range(1000):
        step()
    kt._flush_frees()
    assert kt.stats()["submits"] - s0 == 1000
    assert held() <= base, f"job bytes grew from {base} to {held()}"
    assert np.isfinite(w.numpy()).all()


def test_errors_name_the_status():
    from kex.tinygrad import KexError
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    dead = f"127.0.0.1:{s.getsockname()[1]}"
    s.close()
    good = kt._cfg["server"]
    kt.install(server=dead)
    try:
        t0 = time.time()
        with pytest.raises(KexError) as e:
            Tensor([1.0], device="KEX").realize()
        assert "UNAVAILABLE" in str(e.value) and "kexd --listen" in str(e.value)
        assert time.time() - t0 < 30
    finally:
        kt.install(server=good)
    with pytest.raises(KexError) as e:   # kexd refuses the graph, naming the node
        Tensor.empty(1 << 40, device="KEX", dtype=dtypes.uint8).realize()
    assert e.value.code.name in ("RESOURCE_EXHAUSTED", "INVALID_ARGUMENT") and "node" in str(e.value)


def test_kexd_devices_by_name():
    """KEX:<name> is a device kexd serves (opencl, cpu); a tensor moves between them through the host."""
    names = [d.name for d in kt.client().devices() if d.name in ("opencl", "cpu")]   # the ones it serves by default
    assert names
    a = Tensor(data(2, 3), device=f"KEX:{names[0]}")
    for n in names:
        b = (a * 2).to(f"KEX:{n}")
        assert b.device == f"KEX:{n}"
        np.testing.assert_allclose((b + 1).numpy(), data(2, 3) * 2 + 1, rtol=1e-6)
    with pytest.raises(KexError) as e:
        Tensor([1.0], device="KEX:nosuchdevice").realize()
    assert e.value.code.name == "INVALID_ARGUMENT" and "nosuchdevice" in str(e.value)


def test_zero_size_tensors():
    def prog():
        z = Tensor(np.zeros((4, 0), np.float32))
        a, b = Tensor(np.ones((45, 0, 9), np.float32)), Tensor(np.ones((45, 0, 9), np.float32))
        return [z.sum(axis=1), z.sum(), Tensor(data(8, 8)) @ Tensor(np.ones((8, 0), np.float32)), a.cat(b, dim=0),
                Tensor(np.ones((1, 0, 3, 0, 5), np.float32)).mean(axis=(1, 3))]
    same(prog)


def test_a_failed_submit_leaves_its_inputs_usable():
    i = Tensor(np.array([0, 1], np.int32), device="KEX")
    with pytest.raises(KexError) as e:   # refused by kexd: more dims than --max-dims
        (i.reshape(*[1] * 39, 2).permute(*range(39, -1, -1)) + 1).sum(0).numpy()
    assert e.value.code.name == "RESOURCE_EXHAUSTED" and "dims" in str(e.value)
    assert (i + 1).tolist() == [1, 2]


def test_beam_asks_kexd_for_a_search():
    from tinygrad.helpers import Context
    c = kt.client()
    before = c.stats()
    with Context(BEAM=2):
        got = (Tensor(data(64), device="KEX") * 3 + 1).numpy()   # one small kernel: a quick search
    after = c.stats()
    assert after.searches_run + after.beam_cache_hits > before.searches_run + before.beam_cache_hits
    np.testing.assert_allclose(got, data(64) * 3 + 1, rtol=1e-6)
