"""lease_storm.py - a hostile Redis writer's lease storm against a fleet node (issue 31), run by lease_storm.sh.

Node A tunes --kernels new one-kernel graphs, publishing their results; the writer then deletes every
result and sets a lease with no expiry on each key.  Node B (--workers 2) submits all of them at once with
beam width 1 and, meanwhile, another job's plain Submit of a new graph.  Before the fix each beam Submit
waited --fleet-wait-max (600 s) for a lease that never expires, holding a worker; now every lease is taken
over at once (counted in fleet.rejected), the searches run, and the plain Submit is not held up.
Prints "ok - ..." / "FAIL - ..." per check, the figures, and last "N passed, N failed".
"""
import argparse
import json
import os
import threading
import time

import numpy as np

import test_fleet as F
from kexdtest import check, run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", type=int, default=8)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    redis = F.Redis()
    if not check("redis-server starts on a free port", redis.start()):
        return
    nodes = []
    try:
        A = F.Node("A", redis.port)
        B = F.Node("B", redis.port, "--workers", "2", "--max-tunes-per-device", str(max(4, a.kernels)))
        nodes += [A, B]
        if not check("two kexds with --fleet-cache serve and connect", A.healthy and B.healthy and
                     A.wait_state("up") and B.wait_state("up")):
            return
        sizes = [64 + 4 * i for i in range(a.kernels)]
        keys = []
        for n in sizes:
            before = set(redis.keys("kex:v1:beam:*"))
            A.tune(F.g_add(n))
            keys += [k for k in redis.keys("kex:v1:beam:*") if k not in before]
        check(f"A published {a.kernels} results", len(keys) == a.kernels, len(keys))
        for k in keys:
            redis.cli("DEL", k)
            redis.cli("SET", k.replace(":beam:", ":lease:"), "a-stuck-writer")  # no expiry
        s0, res, t0 = B.stats(), {}, time.time()
        threads = [threading.Thread(target=lambda n=n: res.__setitem__(n, B.submit(F.g_add(n)))) for n in sizes]
        for t in threads:
            t.start()
        time.sleep(0.3)
        t1 = time.time()
        plain = B.submit(F.g_rowsum(36), width=0)
        plain_s = time.time() - t1
        for t in threads:
            t.join()
        wall = time.time() - t0
        s1 = B.stats()
        out = {"kernels": a.kernels, "wall_s": round(wall, 2), "plain_submit_s": round(plain_s, 3),
               "rejected": s1.fleet.rejected - s0.fleet.rejected, "searches": s1.searches_run - s0.searches_run,
               "lease_waits": s1.fleet.lease_waits - s0.fleet.lease_waits,
               "loadavg": [round(x, 2) for x in os.getloadavg()]}
        print(json.dumps(out, indent=1))
        check(f"all {a.kernels} beam Submits finish right, each lease taken over at once (rejected +{a.kernels})",
              all(res.get(n) is not None and np.all(res[n] == np.arange(n) + 2) for n in sizes) and
              out["rejected"] == a.kernels and out["searches"] == a.kernels and out["lease_waits"] == 0, out)
        check("the storm ends in searching time, far from --fleet-wait-max (600 s)", wall < 120, wall)
        # searches are the pool's background work: the plain Submit's planning and compile wait at most for a
        # worker to end the search it runs (seconds), never for a lease (--fleet-wait-max)
        check("another job's plain Submit of a new graph meanwhile finishes within the storm's time, not a lease's",
              plain is not None and np.all(plain == 36) and plain_s < wall + 1, (plain_s, wall))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
    finally:
        for n in nodes:
            n.ch.close()
            F.stop(n.proc)
        redis.stop()


if __name__ == "__main__":
    run(main, "bench/tenants/lease_storm.py")
