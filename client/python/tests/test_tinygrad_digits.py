"""examples/tinygrad_digits.py, a short run through kexd: tinygrad's device KEX
(kex.tinygrad) on the session's kexd trains the small CNN on scikit-learn's
digits for 30 steps; the loss falls and the test accuracy beats chance (0.1)
by far (on CLANG these 30 steps reach about 0.94, the loss 2.5 -> 0.2).
"""
import importlib.util
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "tinygrad_digits.py")
TINYGRAD = os.path.join(ROOT, "..", "shared", "anchors", "tinygrad-0.9.0")


def _example():
    pytest.importorskip("sklearn", reason="scikit-learn (python3-sklearn) is not installed")
    if os.path.isdir(TINYGRAD) and TINYGRAD not in sys.path:
        sys.path.append(TINYGRAD)
    pytest.importorskip("tinygrad", reason=f"tinygrad is not importable (looked in {TINYGRAD} too)")
    spec = importlib.util.spec_from_file_location("tinygrad_digits", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _check_short_run(mod, device, steps=30):
    r = mod.train(device, steps=steps, batch=32, seed=0)
    losses = r["losses"]
    assert len(losses) == steps and all(l == l for l in losses), losses  # no NaN
    first, last = sum(losses[:3]) / 3, sum(losses[-5:]) / 5
    assert last < 0.5 * first, f"loss did not fall: first 3 steps {first:.3f}, last 5 {last:.3f}"
    assert r["test_accuracy"] > 0.5, f"test accuracy {r['test_accuracy']:.3f} (chance is 0.1)"
    return r


def test_digits_short_run_on_kex(kexd_addr):
    mod = _example()
    try:
        import kex.tinygrad
    except ImportError as e:
        pytest.skip(f"kex.tinygrad is not importable: {e}")
    kex.tinygrad.install(server=kexd_addr)
    r = _check_short_run(mod, "KEX")
    print(f"KEX: test accuracy {r['test_accuracy']:.3f}, {r['steps_per_s']:.1f} steps/s")
