"""test_fleet.py - the fleet cache (kexd --fleet-cache): three kexds share beam results through a real redis-server.

The test starts redis-server on a free 127.0.0.1 port (no persistence) and three kexds (A, B, C), each with its own
SQLite file, device cpu and --fleet-cache redis://127.0.0.1:PORT, and checks, with GetStats and the keys in Redis:
  - a Tune on A publishes its result; B's Submit with beam then uses it with 0 searches and the right numbers;
  - A and C tuning the same two-kernel graph at once run one search per kernel between them;
  - an entry for another device identity, put under the key B asks for, is refused (B searches, keeps nothing of
    it in its file);
  - a lease left by a node that died is waited for, then taken over when it expires;
  - Redis stopped mid-run: beam Submits keep succeeding (searched locally), the outage is logged once and shown in
    GetStats; after Redis restarts on the same port the nodes reconnect by themselves, log it once, publish what
    they searched meanwhile, and a new result published by A reaches B (0 searches);
  - what a hostile Redis writer leaves is bounded: a lease with no expiry is taken over at once (not waited on
    for --fleet-wait-max), a value over the size limit is refused unread, a well-formed entry whose opts do not
    fit the kernel counts as rejected (not a hit), and a wait on a peer's lease does not hold a pool worker (a
    --workers 1 node still compiles another job's new graph meanwhile).
Env: KEXD (the binary), KEXD_TMP.  Last line "N passed, N failed".
"""
import json
import os
import subprocess
import sys
import time
import threading

import kexdtest
from kexdtest import check, free_port, start_kexd, stop

from kex.v1 import kex_pb2, kex_pb2_grpc  # noqa: E402
import grpc  # noqa: E402
import numpy as np  # noqa: E402

KEXD = os.environ["KEXD"]
TMP = os.environ["KEXD_TMP"]


def N(**kw):
    return kex_pb2.Node(**kw)


def g_rowsum(n=16):
    """sum(x, axis=1) of an n x n float32 buffer of ones: one reduce kernel."""
    return kex_pb2.Graph(device="cpu", nodes=[
        N(op="BUFFER", dtype="float32", shape=[n, n], fill_value=kex_pb2.Scalar(float_value=1.0)),
        N(op="REDUCE_SUM", src=[0], axis=[1]), N(op="CONTIGUOUS", src=[1])], outputs=[2])


def g_rowsum_sq(n=16):
    """(sum(x, axis=1))^2: a reduce kernel, then an elementwise one."""
    return kex_pb2.Graph(device="cpu", nodes=[N(op="BUFFER", dtype="float32", shape=[n, n], fill_random=3),
                                              N(op="REDUCE_SUM", src=[0], axis=[1]), N(op="CONTIGUOUS", src=[1]),
                                              N(op="MUL", src=[2, 2])], outputs=[3])


def g_add(n=16):
    """arange(n) + 2: one elementwise kernel."""
    return kex_pb2.Graph(device="cpu", nodes=[N(op="BUFFER", dtype="float32", shape=[n], fill_arange=True),
                                              N(op="BUFFER", dtype="float32", shape=[n],
                                                fill_value=kex_pb2.Scalar(float_value=2.0)),
                                              N(op="ADD", src=[0, 1])], outputs=[2])


class Redis:
    """A redis-server of the test's own on a free port, and redis-cli against it."""

    def __init__(self):
        self.port = free_port()
        self.proc = None

    def start(self):
        self.log = open(os.path.join(TMP, "redis.log"), "a")
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no"], stdout=self.log, stderr=subprocess.STDOUT)
        end = time.time() + 10
        while time.time() < end:
            if self.cli("PING").strip() == "PONG":
                return True
            time.sleep(0.05)
        return False

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)

    def cli(self, *args):
        r = subprocess.run(["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args], capture_output=True,
                           text=True, timeout=10)
        return r.stdout

    def keys(self, pattern):
        return [k for k in self.cli("--scan", "--pattern", pattern).split("\n") if k]


class Node:
    def __init__(self, name, redis_port, *extra):
        self.name = name
        self.cache = os.path.join(TMP, f"{name}.db")
        self.proc, self.port, self.healthy = start_kexd(
            KEXD, TMP, "--device", "cpu", "--cache", self.cache, "--fleet-cache", f"redis://127.0.0.1:{redis_port}",
            "--fleet-lease", "3", "--fleet-timeout", "0.5", *extra)
        self.log = os.path.join(TMP, f"kexd-{self.port}.log")
        self.ch = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.kex = kex_pb2_grpc.KexStub(self.ch)
        self.job = self.kex.OpenJob(kex_pb2.OpenJobRequest(name=name), timeout=5).job if self.healthy else ""

    def stats(self):
        return self.kex.GetStats(kex_pb2.GetStatsRequest(), timeout=5)

    def tune(self, graph, width=1):
        evs = list(self.kex.Tune(kex_pb2.TuneRequest(job=self.job, graph=graph,
                                                     beam=kex_pb2.BeamOptions(beam_width=width)), timeout=120))
        return [e for e in evs if e.finished]

    def submit(self, graph, width=1):
        req = kex_pb2.SubmitRequest(job=self.job, graph=graph, return_bytes=True)
        req.beam.beam_width = width
        evs = list(self.kex.Submit(req, timeout=120))
        done = evs[-1].done if evs and evs[-1].WhichOneof("event") == "done" else None
        return np.frombuffer(done.outputs[0].data, dtype=np.float32) if done else None

    def log_text(self):
        with open(self.log) as f:
            return f.read()

    def wait_state(self, state, timeout=15):
        end = time.time() + timeout
        while time.time() < end:
            if self.stats().fleet.state == state:
                return True
            time.sleep(0.1)
        return False


def main():
    redis = Redis()
    if not check("redis-server starts on a free port (no persistence)", redis.start()):
        return
    nodes = []
    try:
        run_checks(redis, nodes)
    finally:
        for n in nodes:
            n.ch.close()
            check(f"kexd {n.name} exits 0 at SIGTERM", stop(n.proc) == 0)
        if redis.proc.poll() is None:
            redis.stop()


def run_checks(redis, nodes):
    mport = free_port()
    a, b = Node("A", redis.port), Node("B", redis.port)
    c = Node("C", redis.port, "--metrics", f"127.0.0.1:{mport}")
    nodes += [a, b, c]
    if not check("three kexds with --fleet-cache answer health", a.healthy and b.healthy and c.healthy):
        return
    check("every node connects (GetStats fleet.state up)", all(n.wait_state("up") for n in nodes),
          [n.stats().fleet.state for n in nodes])

    # 1. a Tune on A reaches B
    fin = a.tune(g_rowsum())
    sa = a.stats()
    keys = redis.keys("kex:v1:beam:*")
    check("Tune on A: one search, published to Redis under kex:v1:beam:<sha256>",
          len(fin) == 1 and not fin[0].from_cache and sa.searches_run == 1 and sa.fleet.published == 1 and
          len(keys) == 1 and len(keys[0]) == len("kex:v1:beam:") + 64, f"{sa.searches_run} {sa.fleet} {keys}")
    value = json.loads(redis.cli("GET", keys[0])) if keys else {}
    check("the value is the cache export line (type beam, the device identity, opts, no binary)",
          value.get("type") == "beam" and value.get("device", {}).get("kind") == "cpu" and "opts" in value and
          "binary" not in value and "program" not in json.dumps(value), str(value)[:200])
    check("no lease is left once A's search ended", redis.keys("kex:v1:lease:*") == [], redis.keys("kex:v1:lease:*"))
    out = b.submit(g_rowsum())
    sb = b.stats()
    check("B's Submit with beam uses A's result: 0 searches, 1 fleet hit, a beam cache hit",
          sb.searches_run == 0 and sb.fleet.hits == 1 and sb.beam_cache_hits == 1,
          f"searches {sb.searches_run} fleet {sb.fleet} hits {sb.beam_cache_hits}")
    check("B's Submit: the numbers are right (16 rows of 16 ones)",
          out is not None and out.shape == (16,) and np.all(out == 16.0), out)
    lst = b.kex.ListCache(kex_pb2.ListCacheRequest(job=b.job), timeout=10).entries
    check("B keeps the fetched result in its own SQLite file", len(lst) == 1 and lst[0].key.lower() == value["ast_key"].lower(),
          len(lst))

    # 2. two nodes tune the same graph at once: one search per kernel
    s0 = [n.stats().searches_run for n in (a, c)]
    h0 = sum(n.stats().fleet.hits for n in (a, c))
    res = {}
    threads = [threading.Thread(target=lambda n=n: res.__setitem__(n.name, n.tune(g_rowsum_sq(24)))) for n in (a, c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s1 = [n.stats() for n in (a, c)]
    searched = sum(x.searches_run for x in s1) - sum(s0)
    check("A and C tune the same 2-kernel graph at once: both finish with 2 kernels",
          len(res.get("A", [])) == 2 and len(res.get("C", [])) == 2, {k: len(v) for k, v in res.items()})
    check("... and run one search per kernel between them (2, not 4)", searched == 2,
          f"{searched} searches; A {s1[0].fleet} C {s1[1].fleet}")
    check("... the node that did not search waited on the other's lease or took its result",
          sum(x.fleet.hits for x in s1) - h0 == 2, [x.fleet.hits for x in s1])
    import urllib.request
    text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
    check("C's metrics: kex_fleet_up 1 and the fleet counters",
          "kex_fleet_up 1" in text and "kex_fleet_hits_total" in text and "kex_fleet_published_total" in text and
          "kex_fleet_lease_waits_total" in text and "kex_fleet_errors_total" in text, text[-400:])

    # 3. an entry for another device identity is never used
    before = set(redis.keys("kex:v1:beam:*"))
    a.tune(g_add())
    add_keys = [k for k in redis.keys("kex:v1:beam:*") if k not in before]
    if check("A's g_add result is in Redis", len(add_keys) == 1, add_keys):
        v = json.loads(redis.cli("GET", add_keys[0]))
        v["device"]["name"] = "another-device"
        redis.cli("SET", add_keys[0], json.dumps(v))
        sb0 = b.stats()
        out = b.submit(g_add())
        sb1 = b.stats()
        check("B refuses the entry made for another device under its key and searches itself",
              sb1.searches_run == sb0.searches_run + 1 and sb1.fleet.rejected == sb0.fleet.rejected + 1 and
              sb1.fleet.hits == sb0.fleet.hits, f"searches {sb0.searches_run}->{sb1.searches_run} {sb1.fleet}")
        check("... and the Submit's numbers are right", out is not None and np.all(out == np.arange(16) + 2), out)
        other = b.kex.ListCache(kex_pb2.ListCacheRequest(job=b.job, filter=kex_pb2.CacheFilter(
            device="another-device")), timeout=10).entries
        check("... and keeps nothing of it in its SQLite file", len(other) == 0, len(other))
        check("... and publishes its own result over it",
              json.loads(redis.cli("GET", add_keys[0]))["device"]["name"] != "another-device")

        # a lease whose holder died: the waiter takes the search over when it expires
        redis.cli("DEL", add_keys[0])
        redis.cli("SET", add_keys[0].replace(":beam:", ":lease:"), "a-node-that-died", "PX", "2000")
        sc0, t0 = c.stats(), time.time()
        out = c.submit(g_add())
        sc1, waited = c.stats(), time.time() - t0
        check("a lease left by a node that died: C waits for it, then takes the search over when it expires",
              sc1.fleet.lease_waits == sc0.fleet.lease_waits + 1 and sc1.fleet.takeovers == sc0.fleet.takeovers + 1 and
              sc1.searches_run == sc0.searches_run + 1 and waited >= 1.5 and out is not None and
              np.all(out == np.arange(16) + 2), f"{waited:.1f} s, {sc1.fleet}")
        check("... and publishes the result", redis.cli("GET", add_keys[0]).startswith("{"))

    # 4. Redis stopped mid-run: degrade, then resume without a restart
    searches0 = b.stats().searches_run
    redis.stop()
    oks = []
    for n in (16, 24):
        out = b.submit(g_rowsum(n * 2))
        oks.append(out is not None and np.all(out == n * 2))
    sb = b.stats()
    check("Redis stopped: B's beam Submits keep succeeding (searched locally)",
          all(oks) and sb.searches_run == searches0 + 2,
          f"{oks} searches {sb.searches_run}")
    check("... and GetStats shows the fleet down, with an outage and errors counted",
          b.wait_state("down", 5) and b.stats().fleet.outages == 1 and b.stats().fleet.errors > 0, b.stats().fleet)
    time.sleep(1.5)  # several reconnect attempts
    if not check("redis-server restarts on the same port", redis.start()):
        return
    check("every node reconnects by itself (fleet.state up again)", all(n.wait_state("up", 15) for n in nodes),
          [n.stats().fleet.state for n in nodes])
    log = b.log_text()
    check("B logged the outage once and the recovery once",
          log.count("unreachable (") == 1 and log.count("reachable again") == 1,
          f"{log.count('unreachable (')} {log.count('reachable again')}")
    end = time.time() + 5
    while len(redis.keys("kex:v1:beam:*")) < 2 and time.time() < end:
        time.sleep(0.1)
    check("... and published the 2 results it searched while Redis was down (the restarted Redis had none)",
          len(redis.keys("kex:v1:beam:*")) == 2 and "published 2 results searched while it was unreachable" in
          b.log_text(), redis.keys("kex:v1:beam:*"))
    fin = a.tune(g_rowsum(40))
    sb0 = b.stats()
    out = b.submit(g_rowsum(40))
    sb1 = b.stats()
    check("after Redis returns, a new result from A reaches B (0 searches, 1 fleet hit)",
          len(fin) == 1 and sb1.searches_run == sb0.searches_run and sb1.fleet.hits == sb0.fleet.hits + 1 and
          out is not None and np.all(out == 40), f"searches {sb0.searches_run}->{sb1.searches_run} {sb1.fleet}")

    hostile_writer_checks(redis, nodes)


def hostile_writer_checks(redis, nodes):
    a, b, c = nodes[:3]

    def fresh_key(graph):
        before = set(redis.keys("kex:v1:beam:*"))
        a.tune(graph)
        new = [k for k in redis.keys("kex:v1:beam:*") if k not in before]
        return new[0] if len(new) == 1 else None

    # a lease with no expiry: taken over at once
    key = fresh_key(g_add(20))
    if check("A's g_add(20) result is in Redis", key is not None):
        redis.cli("DEL", key)
        redis.cli("SET", key.replace(":beam:", ":lease:"), "a-stuck-writer")  # no PX: it never expires
        s0, t0 = c.stats(), time.time()
        out = c.submit(g_add(20))
        s1, took = c.stats(), time.time() - t0
        check("a lease with no expiry is taken over at once (not waited on): C searches, counted rejected",
              took < 60 and s1.searches_run == s0.searches_run + 1 and s1.fleet.rejected == s0.fleet.rejected + 1 and
              out is not None and np.all(out == np.arange(20) + 2), f"{took:.1f} s {s1.fleet}")
    # a value over the size limit: refused by its length, never read
    key = fresh_key(g_rowsum(44))
    if check("A's g_rowsum(44) result is in Redis", key is not None):
        redis.cli("SETRANGE", key, str(2 << 20), "x")  # 2 MiB: over KEXD_FLEET_VALUE_MAX
        s0 = b.stats()
        out = b.submit(g_rowsum(44))
        s1 = b.stats()
        check("a value over the size limit is refused unread (logged with its length), counted rejected; B searches",
              s1.fleet.rejected == s0.fleet.rejected + 1 and s1.fleet.hits == s0.fleet.hits and
              s1.searches_run == s0.searches_run + 1 and "refused unread" in b.log_text() and out is not None and
              np.all(out == 44), f"{s1.fleet}")
    # a well-formed entry whose opts do not fit the kernel: rejected, not a hit
    key = fresh_key(g_rowsum(52))
    if check("A's g_rowsum(52) result is in Redis", key is not None):
        v = json.loads(redis.cli("GET", key))
        v["opts"] = "UPCAST(7,4)"
        redis.cli("SET", key, json.dumps(v))
        s0 = b.stats()
        out = b.submit(g_rowsum(52))
        s1 = b.stats()
        check("a well-formed entry whose opts do not fit the kernel counts as rejected, not a hit; B searches",
              s1.fleet.rejected == s0.fleet.rejected + 1 and s1.fleet.hits == s0.fleet.hits and
              s1.searches_run == s0.searches_run + 1 and out is not None and np.all(out == 52), f"{s1.fleet}")
        check("... and B's result replaces it in Redis", json.loads(redis.cli("GET", key)).get("opts") != "UPCAST(7,4)")
    # a wait on a peer's lease does not hold the only pool worker
    d = Node("D", redis.port, "--workers", "1", "--fleet-wait-max", "30")
    nodes.append(d)
    key = fresh_key(g_rowsum(60))
    if check("a --workers 1 node D answers; A's g_rowsum(60) result is in Redis", d.healthy and key is not None):
        redis.cli("DEL", key)
        redis.cli("SET", key.replace(":beam:", ":lease:"), "a-busy-peer", "PX", "2500")
        res = {}
        t = threading.Thread(target=lambda: res.__setitem__("beam", d.submit(g_rowsum(60))))
        t.start()
        time.sleep(0.5)  # D's search waits on the lease
        t0 = time.time()
        out = d.submit(g_add(28), width=0)
        took = time.time() - t0
        t.join()
        s = d.stats()
        check("while D's only worker's search waits on a peer's lease, another Submit of a new graph compiles and "
              "finishes before the lease ends", out is not None and np.all(out == np.arange(28) + 2) and took < 1.8 and
              s.fleet.lease_waits == 1, f"{took:.2f} s {s.fleet}")
        check("... and the waiting search then takes over and finishes right",
              res.get("beam") is not None and np.all(res["beam"] == 60) and s.fleet.takeovers == 1, s.fleet)


if __name__ == "__main__":
    kexdtest.run(main, "test_fleet.py")
