"""tinygrad 0.9.0's operator suite (test/test_ops.py) on KEX against CLANG, a sample (issue 29 item 3).

Every KEX_TG_OPS_EVERY-th case (default 12, from KEX_TG_OPS_OFFSET, default 0) of the suite's list, in source
order, is one test: its forward outputs and gradients on device KEX (kex.tinygrad on the session's kexd) must
match tinygrad's CLANG device's, with the case's tolerances (tg_ops_diff.py says how; torch is a stand-in).
A case the reference cannot run is skipped with its reason.  The whole suite: bench/tinygrad_ops.py.
KEX_TG_OPS_DEVICE runs the sample on another tinygrad device instead (no kexd then).
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tg_ops_diff as T  # noqa: E402

EVERY = max(1, int(os.environ.get("KEX_TG_OPS_EVERY", "12")))
OFFSET = int(os.environ.get("KEX_TG_OPS_OFFSET", "0"))
DEVICE = os.environ.get("KEX_TG_OPS_DEVICE", "KEX")


def _sample():
    try:
        runner = T.Runner(dut=DEVICE)
        return runner, T.sample_every(runner.discover(), EVERY, OFFSET), None
    except Exception as e:  # ImportError above all: no tinygrad at ../shared/anchors
        return None, [], f"tinygrad 0.9.0's test_ops.py cannot be loaded from {T.tinygrad_root()}: {T._describe(e)}"


_RUNNER, _CASES, _WHY = _sample()


@pytest.fixture(scope="module")
def tg_results(request):
    """{method: {case id: CaseResult}}, filled a method at a time (its sampled cases together)."""
    if DEVICE.upper() == "KEX":
        why = T.kex_tinygrad_ready()
        if why:
            pytest.skip(f"kex.tinygrad is not ready: {why}")
        T.install_device("KEX", request.getfixturevalue("kexd_addr"))
    return {}


_PARAMS = ([pytest.param(c, id=c.id) for c in _CASES] if _RUNNER else
           [pytest.param(None, id="tinygrad-missing", marks=pytest.mark.skip(reason=_WHY))])


@pytest.mark.parametrize("case", _PARAMS)
def test_tinygrad_op(case, tg_results):
    m = case.method
    if m not in tg_results:
        tg_results[m] = {r.id: r for r in _RUNNER.run_method(m, select={c.id for c in _CASES if c.method == m})}
    r = tg_results[m].get(case.id)
    assert r is not None, f"{case.id} was not run"
    if r.forward == "left_out":
        pytest.skip(f"the reference cannot run it: {r.forward_reason}")
    problems = [why if why.startswith(what) else f"{what}: {why}"
                for what, st, why in (("forward", r.forward, r.forward_reason), ("backward", r.backward, r.backward_reason))
                if st == "fail"]
    assert not problems, (f"{case.id} (test_ops.py:{r.line}, {r.desc}) on {DEVICE}: " + "; ".join(problems) +
                          (f"\n{r.trace}" if r.trace else ""))
