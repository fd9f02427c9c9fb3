"""pytest fixtures: one kexd for the session, a kex.Client on it, and an
`evaluate` that computes a Tensor: through Submit when kexd has it, else
through the in-process `kex run --device cpu` on the same graph JSON (so the
client's decomposition is checked numerically either way).

kexd is $KEXD, else $KEX_BUILD_DIR/daemon/kexd (default build/), with its
beam cache in a temporary directory; nothing is built here.
"""
import base64
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
import kex  # noqa: E402
import kexd_proc  # noqa: E402  (this folder's)
import grpc  # noqa: E402


def _build_dir():
    b = os.environ.get("KEX_BUILD_DIR", "build")
    return b if os.path.isabs(b) else os.path.join(ROOT, b)


@pytest.fixture(scope="session")
def kexd_addr():
    kexd = kexd_proc.kexd_path()
    if not os.access(kexd, os.X_OK):
        pytest.fail(f"kexd is not built ({kexd})")
    try:  # its own beam cache file: Tune and the cache tests never touch the user's cache
        k = kexd_proc.Kexd(kexd=kexd)
    except RuntimeError as e:
        pytest.fail(str(e))
    yield k.addr
    k.stop()


@pytest.fixture(scope="session")
def client(kexd_addr):
    c = kex.connect(kexd_addr)
    yield c
    c.close()


@pytest.fixture(scope="session")
def submit_unavailable(client):
    """None when kexd runs Submit, else the server's reason (UNIMPLEMENTED message)."""
    try:
        (kex.tensor(np.ones(2, np.float32), client=client) + 1).numpy(timeout=60)
        return None
    except kex.Error as e:
        if e.code == grpc.StatusCode.UNIMPLEMENTED:
            return e.details
        raise


@pytest.fixture
def needs_submit(submit_unavailable):
    if submit_unavailable:
        pytest.skip(f"kexd answers Submit with UNIMPLEMENTED: {submit_unavailable}")


def _run_in_process(t):
    kexbin = os.path.join(_build_dir(), "kex")
    if not os.access(kexbin, os.X_OK):
        pytest.skip(f"neither Submit nor the in-process runner ({kexbin}) is available")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(t.contiguous().graph_json(), f)
    try:
        r = subprocess.run([kexbin, "run", "--device", "cpu", "--json", f.name], capture_output=True, text=True,
                           timeout=120)
    finally:
        os.unlink(f.name)
    assert r.returncode == 0, r.stderr
    o = json.loads(r.stdout)["outputs"][0]
    assert o["dtype"] == t.dtype
    return np.frombuffer(base64.b64decode(o["data"]), dtype=kex.dtypes.to_numpy(o["dtype"])).reshape(o["shape"])


@pytest.fixture(scope="session")
def evaluate(submit_unavailable):
    def ev(t):
        return _run_in_process(t) if submit_unavailable else t.numpy(timeout=120)
    return ev
