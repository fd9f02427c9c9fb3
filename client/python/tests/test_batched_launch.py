"""Batched launches: a submission's kernels go to the device back to back, about --launch-quantum of device
time per fair-queue item (kexd's JobStats.items_done counts the items), with the same results; with
--launch-quantum 0 every kernel is an item of its own.  A graph's identical kernels compile once."""

import numpy as np

import kex
from kex._client import pb
from kexd_proc import Kexd

N = 60


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
    with Kexd("--launch-quantum", quantum) as k:
        c = kex.Client(k.addr)
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


def test_one_kernel_per_item_with_quantum_0():
    assert items_per_submit("0") == [N + 2] * 3   # setup, N kernels, finish


def test_kernels_batched_by_the_quantum():
    counts = items_per_submit("0.002")
    assert counts[0] < N + 2 and counts[-1] <= counts[0], counts   # 8 a batch at first, then by the quantum
    assert counts[-1] >= 3, counts
