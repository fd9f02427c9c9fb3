"""matmul_bench.py - time N x N float32 matmuls on kexd against numpy.

    PYTHONPATH=client/python /usr/bin/python3 examples/matmul_bench.py 127.0.0.1:50051 [N ...]

Prints, per size, the kernel count from plan(), the server's kernel time
(Done.kernels run_us), the end-to-end time of a submission and numpy's time.
"""
import sys
import time

import numpy as np

import kex

addr = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
sizes = [int(s) for s in sys.argv[2:]] or [256, 512, 1024]
c = kex.connect(addr)
rng = np.random.default_rng(0)
print(f"{'N':>6} {'kernels':>8} {'kernel ms':>10} {'e2e ms':>9} {'numpy ms':>9} {'GFLOP/s':>8} {'max err':>8}")
for n in sizes:
    A = rng.standard_normal((n, n)).astype(np.float32)
    B = rng.standard_normal((n, n)).astype(np.float32)
    a, b = kex.tensor(A, upload=True), kex.tensor(B, upload=True)
    out = (a @ b).contiguous()
    kernels = 0
    g = kex.graph_pb([out.node])
    best_kernel, best_e2e = float("inf"), float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        done = c.submit(g, return_bytes=False)
        best_e2e = min(best_e2e, time.perf_counter() - t0)
        best_kernel = min(best_kernel, sum(k.run_us for k in done.kernels) / 1e6)
        kernels = len(done.kernels)
        c.free([o.handle for o in done.outputs])
    t0 = time.perf_counter()
    ref = A @ B
    t_np = time.perf_counter() - t0
    err = float(np.abs(out.numpy() - ref).max())
    print(f"{n:>6} {kernels:>8} {best_kernel * 1e3:>10.2f} {best_e2e * 1e3:>9.2f} {t_np * 1e3:>9.2f} "
          f"{2 * n ** 3 / best_kernel / 1e9:>8.1f} {err:>8.1e}")
