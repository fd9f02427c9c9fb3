"""Batched launches: a submission's kernels go to the device back to back, about --launch-quantum of device
time per fair-queue item (kexd's JobStats.items_done counts the items), with the same results; with
--launch-quantum 0 every kernel is an item of its own.  A graph's identical kernels compile once."""
import os
import socket
import subprocess
import tempfile
import time

import numpy as np
import pytest

import kex
from kex._client import pb

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
N = 60


def kexd(*flags):
    b = os.environ.get("KEX_BUILD_DIR", "build")
    exe = os.environ.get("KEXD") or os.path.join(b if os.path.isabs(b) else os.path.join(ROOT, b), "daemon", "kexd")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    d = tempfile.TemporaryDirectory(prefix="kex-batch-")
    p = subprocess.Popen([exe, "--listen", f"127.0.0.1:{port}", "--metrics", "off", "--grace", "1", "--cache",
                          os.path.join(d.name, "c.db"), *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    return p, d, f"127.0.0.1:{port}"


def chain():
    """x, then N times (x * 0.5 + 1) realized: N kernels, one after another."""
    g = pb.Graph(format="kex.graph.v1")
    g.nodes.add(op="BUFFER", dtype="float32", shape=[256], data=np.arange(256, dtype=np.float32).tobytes())
    last = 0
    for _ in range(N):
        h = len(g.nodes)
        g.nodes.add(op="CONST", dtype="float32", shape=[256], value=pb.Scalar(float_value=0.5))
        g.nodes.add(op="MUL", src=[last, h])
        g.nodes.add(op="CONST", dtype="float32", shape=[256], value=pb.Scalar(float_value=1.0))
        g.nodes.add(op="ADD", src=[h + 1, h + 2])
        g.nodes.add(op="CONTIGUOUS", src=[h + 3])
        last = h + 4
    g.outputs.append(last)
    return g


def items_per_submit(quantum):
    p, d, addr = kexd("--launch-quantum", quantum)
    try:
        c = kex.Client(addr)
        want = np.arange(256, dtype=np.float32)
        for _ in range(N):
            want = want * 0.5 + 1
        counts = []
        for run in range(3):   # the first run has no kernel times yet; later ones batch by the quantum
            before = c.stats().job_stats[0].items_done
            done = c.submit(chain(), return_bytes=True)
            counts.append(c.stats().job_stats[0].items_done - before)
            if run == 0:   # N identical kernels (E_..., E_...n1, ...): compiled once
                assert done.programs_compiled == 1, done.programs_compiled
            assert len(done.kernels) == N
            np.testing.assert_allclose(np.frombuffer(done.outputs[0].data, np.float32), want, rtol=1e-6)
        c.close()
        return counts
    finally:
        p.terminate()
        p.wait(10)
        d.cleanup()


def test_one_kernel_per_item_with_quantum_0():
    assert items_per_submit("0") == [N + 2] * 3   # setup, N kernels, finish


def test_kernels_batched_by_the_quantum():
    counts = items_per_submit("0.002")
    assert counts[0] < N + 2 and counts[-1] <= counts[0], counts   # 8 a batch at first, then by the quantum
    assert counts[-1] >= 3, counts
