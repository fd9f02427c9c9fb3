"""test_hostile.py - what an attacker on the same machine tried, against real kexd processes.

Run by test_hostile.sh, which passes in the environment: KEXD (the binary),
KEX_STUBS (the generated kex_pb2*.py and health_pb2*.py) and KEXD_TMP (a
scratch directory).  Every check starts the kexd it needs (127.0.0.1, a free
port, its own cache file) with the flags under test, so each limit is tried
on both sides of its value.  Prints "ok - ..." / "FAIL - ..." per check and,
last, "N passed, N failed"; exit status 1 when anything failed.

Covered (the urgent issue's findings): a burst of idle connections under a
small descriptor limit (both the connection cap and descriptor exhaustion),
connections that never finish the HTTP/2 handshake or sit idle, tokens with
trailing bytes after a NUL, non-UTF-8 strings, COPY to an unknown device,
the default and maximum job memory, jobs per peer and a full job table,
job weight, ImportCache bytes per stream and streams at once, Download's
smallest chunk, shapes that overflow; malformed protobuf (overlong varints,
wrong wire types, lying length prefixes, deep group nesting), cycles and
forward references, unknown ops and dtypes, zero-sized shapes, other jobs'
buffer handles; and that the daemon keeps serving and its descriptors and
memory return to where they started.
"""
import os
import resource
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.environ["KEX_STUBS"])

import grpc  # noqa: E402
import health_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402
from kex.v1 import kex_pb2, kex_pb2_grpc  # noqa: E402
import kexdtest  # noqa: E402
from kexdtest import check, desc, rpc_error, run  # noqa: E402

KEXD = os.environ["KEXD"]
TMP = os.environ["KEXD_TMP"]
ASAN = os.environ.get("KEXD_ASAN") == "1"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


class Kexd(kexdtest.Kexd):
    """A kexd on a free port (cpu, a cache file of its own) with extra flags; nofile: its descriptor limit
    (soft and hard).  Waits until it answers health, else raises."""

    count = 0

    def __init__(self, *flags, nofile=None):
        Kexd.count += 1

        def limit():
            if nofile:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        super().__init__(KEXD, TMP, "--device", "cpu", "--cache", os.path.join(TMP, f"cache-{Kexd.count}.db"), *flags,
                         preexec_fn=limit)
        self.channel = None
        if not self.wait_healthy(15 if not ASAN else 60):
            raise RuntimeError(f"kexd {' '.join(flags)} did not become healthy:\n{self.read_log()}")
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.kex = kex_pb2_grpc.KexStub(self.channel)

    def health(self, timeout=2.0):
        """SERVING, or the status code of a fresh channel's Check."""
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as ch:
            try:
                r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
                return r.status
            except grpc.RpcError as e:
                return e.code()

    def fds(self):
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def raw(self, method, data, timeout=5):
        """Call /kex.v1.Kex/METHOD with raw request bytes; the reply bytes, or the RpcError."""
        fn = self.channel.unary_unary(f"/kex.v1.Kex/{method}", request_serializer=None, response_deserializer=None)
        try:
            return fn(data, timeout=timeout)
        except grpc.RpcError as e:
            return e

    def stop(self):
        if self.channel:
            self.channel.close()
        super().stop()


def code_and(e, code, *words):
    return e is not None and e.code() == code and all(w in e.details() for w in words)




def field(num, payload):
    """One length-delimited protobuf field (wire type 2)."""
    n, out = len(payload), bytearray([num << 3 | 2])
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out) + payload


def open_job(k, **kw):
    return k.kex.OpenJob(kex_pb2.OpenJobRequest(**kw), timeout=5).job


def node(op, **kw):
    n = kex_pb2.Node(op=op, src=kw.pop("src", []), dtype=kw.pop("dtype", ""), shape=kw.pop("shape", []),
                     device=kw.pop("device", ""), axis=kw.pop("axis", []))
    if "new_shape" in kw:
        n.new_shape.values.extend(kw.pop("new_shape"))
        n.new_shape.SetInParent()
    if "strides" in kw:
        n.strides.values.extend(kw.pop("strides"))
        n.strides.SetInParent()
    if "fill" in kw:
        n.fill_value.CopyFrom(kex_pb2.Scalar(float_value=kw.pop("fill")))
    assert not kw, kw
    return n


def add_graph(device_of_copy=None):
    """a + b (float32[4]), optionally COPYed to a device."""
    nodes = [node("BUFFER", dtype="float32", shape=[4], fill=1.5), node("BUFFER", dtype="float32", shape=[4], fill=2.0),
             node("ADD", src=[0, 1])]
    if device_of_copy is not None:
        nodes.append(node("COPY", src=[2], device=device_of_copy))
    return kex_pb2.Graph(device="cpu", nodes=nodes, outputs=[len(nodes) - 1])


def submit(k, job, graph):
    return list(k.kex.Submit(kex_pb2.SubmitRequest(job=job, graph=graph), timeout=120))


def hold_connections(port, n, send):
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.connect(("127.0.0.1", port))
        if send:
            s.sendall(send)
        socks.append(s)
    return socks


def closed_by_server(socks, seconds):
    """How many of socks the server closed within `seconds`."""
    for s in socks:
        s.settimeout(0.05)
    closed, end = set(), time.time() + seconds
    while time.time() < end and len(closed) < len(socks):
        for i, s in enumerate(socks):
            if i in closed:
                continue
            try:
                if s.recv(65536) == b"":
                    closed.add(i)
            except socket.timeout:
                pass
            except OSError:
                closed.add(i)
    for s in socks:
        s.close()
    return len(closed)


# ---- 2. descriptors and connections ----

def burst(flags, what):
    """Under ulimit -n 256: 300 idle connections, then all closed; a new client is served within 5 s."""
    k = Kexd(*flags, nofile=256)
    fds0 = k.fds()
    socks = hold_connections(k.port, 300, PREFACE)
    time.sleep(1.0)
    alive = k.proc.poll() is None
    for s in socks:
        s.close()
    t0, served = time.time(), False
    while time.time() - t0 < 5:
        if k.health(1.0) == health_pb2.HealthCheckResponse.SERVING:
            served = True
            break
        time.sleep(0.1)
    after = time.time() - t0
    check(f"{what}: after 300 idle connections under ulimit -n 256 are closed, a new client is served within 5 s",
          alive and served, f"served {served} after {after:.1f} s\n{k.read_log()[-1500:]}")
    st = k.kex.GetStats(kex_pb2.GetStatsRequest(), timeout=5)
    check(f"{what}: GetStats counts the connections closed at accept", st.connections_refused >= 1, str(st))
    time.sleep(0.5)
    check(f"{what}: descriptors return to where they started (+4)", k.fds() <= fds0 + 4, f"{fds0} -> {k.fds()}")
    log = k.read_log()
    check(f"{what}: the log names both descriptor limits and the refusals",
          "descriptors: soft limit 256" in log and "hard limit 256" in log and "closed" in log and "at accept" in log,
          log[-1500:])
    k.stop()


def connections():
    burst([], "connection cap sized from the limit (192)")
    burst(["--max-connections", "5000"], "cap above the descriptors (exhaustion path)")

    # the cap on both sides: --max-connections 10 admits 10, closes the 11th at accept
    k = Kexd("--max-connections", "10")
    socks = hold_connections(k.port, 9, PREFACE + EMPTY_SETTINGS)  # + the test's own channel = 10
    time.sleep(0.3)
    st = k.kex.GetStats(kex_pb2.GetStatsRequest(), timeout=5)
    check("--max-connections 10: 10 connections are open, none refused", st.connections_open == 10 and
          st.connections_refused == 0, str(st))
    extra = hold_connections(k.port, 1, PREFACE + EMPTY_SETTINGS)
    check("--max-connections 10: the 11th connection is closed at accept", closed_by_server(extra, 3) == 1)
    for s in socks:
        s.close()
    time.sleep(0.3)
    check("--max-connections 10: once they close, a new client is served",
          k.health() == health_pb2.HealthCheckResponse.SERVING)
    k.stop()

    # calls at once on one connection: --max-streams 2 holds a 3rd call until one ends
    k = Kexd("--max-streams", "2")
    health = health_pb2_grpc.HealthStub(k.channel)
    watches = [health.Watch(health_pb2.HealthCheckRequest(), timeout=30) for _ in range(2)]
    firsts = [next(w).status for w in watches]
    e = rpc_error(health.Check, health_pb2.HealthCheckRequest(), timeout=1.0)
    check("--max-streams 2: with 2 calls open on a connection, a 3rd waits (DEADLINE_EXCEEDED after 1 s)",
          firsts == [health_pb2.HealthCheckResponse.SERVING] * 2 and
          e is not None and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, desc(e))
    watches[0].cancel()
    time.sleep(0.2)
    e = rpc_error(health.Check, health_pb2.HealthCheckRequest(), timeout=5.0)
    check("--max-streams 2: once one ends, the next call is served", e is None, desc(e))
    watches[1].cancel()
    k.stop()

    # handshake and idle timeouts
    k = Kexd("--handshake-timeout", "1", "--idle-timeout", "2")
    nothing = hold_connections(k.port, 10, b"")
    preface = hold_connections(k.port, 10, PREFACE)
    n1, n2 = closed_by_server(nothing, 4), closed_by_server(preface, 4)
    check("--handshake-timeout 1: connections that send nothing or only the preface are closed",
          n1 == 10 and n2 == 10, f"{n1}/10, {n2}/10")
    settled = hold_connections(k.port, 10, PREFACE + EMPTY_SETTINGS)
    t0 = time.time()
    n3 = closed_by_server(settled, 6)
    check("--idle-timeout 2: connections that finished the handshake but make no call are closed after it",
          n3 == 10 and time.time() - t0 >= 1.5, f"{n3}/10 after {time.time() - t0:.1f} s")
    k.stop()


# ---- 3/4. limits and exact validation through a real kexd ----

def limits():
    k = Kexd("--max-jobs-per-peer", "4", "--job-memory-default", "1048576", "--job-memory-max", "8388608",

             "--import-max-bytes", "4096", "--import-streams", "2", "--download-chunk-min", "1024")
    a = open_job(k, name="tenant-a")

    # tokens compare whole: TOKEN\0junk is not TOKEN
    e = rpc_error(k.kex.CloseJob, kex_pb2.CloseJobRequest(job=a + "\0junk"), timeout=5)
    st = k.kex.GetStats(kex_pb2.GetStatsRequest(job=a), timeout=5)
    check("a token followed by \\0junk is INVALID_ARGUMENT naming the NUL, and the real job stays open",
          code_and(e, grpc.StatusCode.INVALID_ARGUMENT, "NUL") and st.jobs_open >= 1, desc(e))
    e = rpc_error(k.kex.CloseJob, kex_pb2.CloseJobRequest(job=a + "x"), timeout=5)
    st = k.kex.GetStats(kex_pb2.GetStatsRequest(job=a), timeout=5)
    check("a token with one extra character is this node's token damaged, not another node's: NOT_FOUND (never "
          "FAILED_PRECONDITION naming a node), and the real job stays open",
          code_and(e, grpc.StatusCode.NOT_FOUND) and st.jobs_open >= 1, desc(e))
    e = rpc_error(k.kex.CloseJob, kex_pb2.CloseJobRequest(job=a[:32] + "0" + a[32:]), timeout=5)
    check("a token with one extra hex character is unknown (NOT_FOUND)", code_and(e, grpc.StatusCode.NOT_FOUND),
          desc(e))

    # strings are UTF-8: a non-UTF-8 job name is refused and GetStats stays decodable
    r = k.raw("OpenJob", field(1, b"bad\xff\xfename"))
    check("OpenJob with a non-UTF-8 name is INVALID_ARGUMENT naming the field",
          isinstance(r, grpc.RpcError) and r.code() == grpc.StatusCode.INVALID_ARGUMENT and "`name`" in r.details()
          and "UTF-8" in r.details(), r if isinstance(r, bytes) else desc(r))
    r = k.raw("OpenJob", field(1, "naïve-ok".encode()))
    check("OpenJob with a valid UTF-8 name (non-ASCII) is accepted", isinstance(r, bytes), desc(r))
    st = rpc_error(k.kex.GetStats, kex_pb2.GetStatsRequest(), timeout=5)
    check("GetStats still decodes in grpcio after the bad names", st is None, desc(st))
    r = k.raw("OpenJob", field(1, b"\xed\xa0\x80surrogate"))
    check("a UTF-16 surrogate encoded in UTF-8 is refused", isinstance(r, grpc.RpcError) and
          r.code() == grpc.StatusCode.INVALID_ARGUMENT, r)
    # a bad string deep in a message: the error names the whole path to it
    r = k.raw("Plan", field(2, field(3, field(1, b"ADD") + field(3, b"float\xff32"))))
    check("a non-UTF-8 dtype in a Plan's node names `graph.nodes.dtype`",
          isinstance(r, grpc.RpcError) and r.code() == grpc.StatusCode.INVALID_ARGUMENT
          and "`graph.nodes.dtype`" in r.details(), r if isinstance(r, bytes) else desc(r))

    # an unknown device anywhere in a graph
    e = rpc_error(submit, k, a, add_graph("nope"))
    check("COPY to device \"nope\" is INVALID_ARGUMENT naming the node and the device",
          code_and(e, grpc.StatusCode.INVALID_ARGUMENT, "node 3", "nope"), desc(e))
    ev = submit(k, a, add_graph("cpu"))
    check("COPY to a device kexd has is served", ev and ev[-1].HasField("done"), ev[-1] if ev else ev)

    # job memory: 0 gets the default, the maximum on both sides
    st = k.kex.GetStats(kex_pb2.GetStatsRequest(job=a), timeout=5).job_stats[0]
    check("memory_limit 0 gets --job-memory-default (1048576), not infinity", st.memory_limit == 1048576, str(st))
    e = rpc_error(open_job, k, name="big", memory_limit=8388609)
    check("memory_limit one byte over --job-memory-max is RESOURCE_EXHAUSTED naming the flag and the value",
          code_and(e, grpc.StatusCode.RESOURCE_EXHAUSTED, "--job-memory-max", "8388609"), desc(e))
    j = open_job(k, name="max", memory_limit=8388608)
    check("memory_limit exactly --job-memory-max is accepted", bool(j))
    k.kex.CloseJob(kex_pb2.CloseJobRequest(job=j), timeout=5)
    up = lambda job, n: k.kex.Upload(iter([kex_pb2.UploadRequest(job=job, header=kex_pb2.UploadHeader(dtype="uint8", shape=[n])),
                                          kex_pb2.UploadRequest(chunk=b"\1" * n)]), timeout=10)
    e = rpc_error(up, a, 2 * 1048576)
    check("a default-limited job cannot upload 2 MiB (RESOURCE_EXHAUSTED)",
          code_and(e, grpc.StatusCode.RESOURCE_EXHAUSTED), desc(e))

    # weight
    e = rpc_error(open_job, k, name="heavy", weight=1001)
    check("weight 1001 is RESOURCE_EXHAUSTED naming --max-weight (1000)",
          code_and(e, grpc.StatusCode.RESOURCE_EXHAUSTED, "1000", "--max-weight"), desc(e))
    j = open_job(k, name="w", weight=1000)
    k.kex.CloseJob(kex_pb2.CloseJobRequest(job=j), timeout=5)
    check("weight 1000 is accepted", bool(j))

    # jobs per peer: a (open) + naïve-ok (open) + 2 more = 4; the 5th is refused
    b = open_job(k, name="b")
    c = open_job(k, name="c")
    e = rpc_error(open_job, k, name="d")
    check("the 5th job of one client address is RESOURCE_EXHAUSTED naming --max-jobs-per-peer",
          code_and(e, grpc.StatusCode.RESOURCE_EXHAUSTED, "--max-jobs-per-peer", "127.0.0.1"), desc(e))
    k.kex.CloseJob(kex_pb2.CloseJobRequest(job=c), timeout=5)
    d = rpc_error(open_job, k, name="d")
    check("after one closes, the 4th is accepted again", d is None, desc(d))

    # Download's smallest chunk, both sides
    h = up(a, 4096).handle
    e = rpc_error(lambda: list(k.kex.Download(kex_pb2.DownloadRequest(job=a, handle=h, chunk_bytes=1023), timeout=10)))
    check("Download chunk_bytes 1023 (< --download-chunk-min 1024) is RESOURCE_EXHAUSTED naming the flag",
          code_and(e, grpc.StatusCode.RESOURCE_EXHAUSTED, "--download-chunk-min", "1023"), desc(e))
    ch = list(k.kex.Download(kex_pb2.DownloadRequest(job=a, handle=h, chunk_bytes=1024), timeout=10))
    check("Download chunk_bytes 1024 gives 4 chunks of 1024 bytes", len(ch) == 4 and all(len(x.data) == 1024 for x in ch),
          [len(x.data) for x in ch])

    # ImportCache: bytes per stream, both sides; streams at once
    head = b'{"format":"kex.cache.export.v1","schema":2}\n'

    def imp(job, chunks):
        reqs = [kex_pb2.ImportCacheRequest(job=job, data=chunks[0])] + [kex_pb2.ImportCacheRequest(data=x) for x in chunks[1:]]
        return k.kex.ImportCache(iter(reqs), timeout=10)

    e = rpc_error(imp, a, [head, b" " * (4097 - len(head))])
    check("an ImportCache stream of 4097 bytes (> --import-max-bytes 4096) is RESOURCE_EXHAUSTED naming the flag",
          code_and(e, grpc.StatusCode.RESOURCE_EXHAUSTED, "--import-max-bytes"), desc(e))
    e = rpc_error(imp, a, [head, b"\n" * (4096 - len(head))])
    check("an ImportCache stream of exactly 4096 bytes is read to the end (not refused for size)",
          e is None or "--import-max-bytes" not in e.details(), desc(e))

    import queue
    import threading
    gates = [queue.Queue() for _ in range(2)]

    def held(q):
        yield kex_pb2.ImportCacheRequest(job=a, data=head)
        q.get()

    futs = [k.kex.ImportCache.future(held(q), timeout=20) for q in gates]
    time.sleep(0.5)
    e = rpc_error(imp, a, [head])
    check("a 3rd ImportCache stream while 2 are open is RESOURCE_EXHAUSTED naming --import-streams",
          code_and(e, grpc.StatusCode.RESOURCE_EXHAUSTED, "--import-streams"), desc(e))
    for q in gates:
        q.put(1)
    for f in futs:
        try:
            f.result()
        except grpc.RpcError:
            pass
    e = rpc_error(imp, a, [head])
    check("once they end, a new ImportCache stream is accepted", e is None, desc(e))
    threading.enumerate()

    # shapes that overflow: refused, never undefined behaviour, kexd keeps serving
    bad = [
        ("a shape [2^32, 2^32, 0]", [node("BUFFER", dtype="float32", shape=[1 << 32, 1 << 32, 0], fill=1.0)]),
        ("a shape [2^62+1, 4, 0] (over the element limit with a 0 dim)",
         [node("BUFFER", dtype="float32", shape=[(1 << 62) + 1, 4, 0], fill=1.0)]),
        ("RESHAPE [0] -> [0, 2^62, 2^62]",
         [node("BUFFER", dtype="float32", shape=[0], fill=1.0), node("RESHAPE", src=[0], new_shape=[0, 1 << 62, 1 << 62])]),
        ("a STRIDE of INT64_MIN",
         [node("BUFFER", dtype="float32", shape=[4], fill=1.0), node("STRIDE", src=[0], strides=[-(1 << 63)])]),
        ("a shape of -1", [node("BUFFER", dtype="float32", shape=[-1], fill=1.0)]),
    ]
    for what, nodes in bad:
        e = rpc_error(submit, k, a, kex_pb2.Graph(device="cpu", nodes=nodes, outputs=[len(nodes) - 1]))
        check(f"{what} is refused (INVALID_ARGUMENT or RESOURCE_EXHAUSTED naming node)",
              e is not None and e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED)
              and "node" in e.details(), desc(e))
    # graph depth and kernel size: a long chain is refused at once, never compiled for seconds under a lock
    def chain(n, contiguous_every=0):
        nodes = [node("BUFFER", dtype="float32", shape=[4], fill=1.0)]
        for i in range(n):
            nodes.append(node("ADD", src=[len(nodes) - 1, 0]))
            if contiguous_every and (i + 1) % contiguous_every == 0:
                nodes.append(node("CONTIGUOUS", src=[len(nodes) - 1]))
        return kex_pb2.Graph(device="cpu", nodes=nodes, outputs=[len(nodes) - 1])

    t0 = time.time()
    e = rpc_error(submit, k, a, chain(100000))
    check("a 100,000-node chain is RESOURCE_EXHAUSTED naming the depth limit (4096), within 10 s",
          code_and(e, grpc.StatusCode.RESOURCE_EXHAUSTED, "4096") and time.time() - t0 < 10,
          f"{desc(e)} after {time.time() - t0:.1f} s")
    ev = submit(k, a, chain(1000))
    done = ev[-1].done if ev and ev[-1].HasField("done") else None
    check("a 1,000-op chain runs fused in one kernel under the default limits (1 + 1000 * 1 = 1001)",
          done is not None and len(done.kernels) == 1 and done.outputs[0].data == struct.pack("<4f", *[1001.0] * 4),
          str(done)[:300])
    ev = rpc_error(submit, k, a, chain(250, contiguous_every=50))
    check("a chain split by CONTIGUOUS every 50 ops runs", ev is None, desc(ev))
    # the default --max-dims is the hard maximum, 16 (tinygrad's repeat and conv reach 12)
    ev = rpc_error(submit, k, a, kex_pb2.Graph(device="cpu", nodes=[node("BUFFER", dtype="float32", shape=[1] * 16,
                                                                         fill=1.0), node("NEG", src=[0])], outputs=[1]))
    check("a 16-dim graph runs under the default --max-dims", ev is None, desc(ev))
    e = rpc_error(submit, k, a, kex_pb2.Graph(device="cpu", nodes=[node("BUFFER", dtype="float32", shape=[1] * 17,
                                                                        fill=1.0), node("NEG", src=[0])], outputs=[1]))
    check("a 17-dim one is RESOURCE_EXHAUSTED naming the limit",
          code_and(e, grpc.StatusCode.RESOURCE_EXHAUSTED, "17 dims, more than the limit of 16 (--max-dims)"), desc(e))
    check("kexd still serves after every hostile input", k.health() == health_pb2.HealthCheckResponse.SERVING)
    ev = submit(k, a, add_graph())
    check("and a+b still runs", ev and ev[-1].HasField("done"))

    # repeat a round of refusals (after one warm-up round: caches open): descriptors and memory come back
    for i in range(201):
        if i == 1:
            time.sleep(0.3)
            fds0, rss0 = k.fds(), k.rss_kib()
        k.raw("OpenJob", field(1, b"\xff"))
        rpc_error(k.kex.CloseJob, kex_pb2.CloseJobRequest(job=a + "\0"), timeout=5)
        rpc_error(submit, k, a, add_graph("nope"))
    time.sleep(0.3)
    fds1, rss1 = k.fds(), k.rss_kib()
    check("after 600 refused calls, descriptors are where they started (+2)", fds1 <= fds0 + 2, f"{fds0} -> {fds1}")
    check("and memory grew by less than 32 MiB", rss1 - rss0 < 32 * 1024, f"{rss0} -> {rss1} KiB")
    for j in (a, b):
        rpc_error(k.kex.CloseJob, kex_pb2.CloseJobRequest(job=j), timeout=5)
    k.stop()

    # buffers per job, both sides
    k = Kexd("--max-buffers-per-job", "3")
    j = open_job(k, name="many")

    def up16():
        return k.kex.Upload(iter([kex_pb2.UploadRequest(job=j, header=kex_pb2.UploadHeader(dtype="uint8", shape=[16])),
                                  kex_pb2.UploadRequest(chunk=b"\1" * 16)]), timeout=10)

    held = [up16().handle for _ in range(3)]
    e = rpc_error(up16)
    check("--max-buffers-per-job 3: 3 uploads held, the 4th RESOURCE_EXHAUSTED naming the flag",
          len(held) == 3 and code_and(e, grpc.StatusCode.RESOURCE_EXHAUSTED, "--max-buffers-per-job"), desc(e))
    k.kex.Free(kex_pb2.FreeRequest(job=j, handles=held[:1]), timeout=5)
    try:
        held = held[1:] + [up16().handle]
    except grpc.RpcError as err:
        held = held[1:] + [f"upload refused: {desc(err)}"]
    check("after one is freed, the next upload is accepted", len(held[2]) == 32, held[2])
    # a Free names at most as many handles as the job may hold (each is a lookup on the loop thread)
    e = rpc_error(k.kex.Free, kex_pb2.FreeRequest(job=j, handles=held[:2] + ["0" * 32, "1" * 32]), timeout=5)
    check("--max-buffers-per-job 3: a Free naming 4 handles is RESOURCE_EXHAUSTED naming the flag, nothing freed",
          code_and(e, grpc.StatusCode.RESOURCE_EXHAUSTED, "--max-buffers-per-job") and
          k.kex.GetStats(kex_pb2.GetStatsRequest(job=j), timeout=5).job_stats[0].buffers == 3, desc(e))
    e = rpc_error(k.kex.Free, kex_pb2.FreeRequest(job=j, handles=held[:2] + ["0" * 32]), timeout=5)
    check("... naming 3 (the limit) is looked up: NOT_FOUND for the unknown one, nothing freed",
          code_and(e, grpc.StatusCode.NOT_FOUND, "handle 2") and
          k.kex.GetStats(kex_pb2.GetStatsRequest(job=j), timeout=5).job_stats[0].buffers == 3, desc(e))
    r = k.kex.Free(kex_pb2.FreeRequest(job=j, handles=held[:2] + held[:1]), timeout=5)
    check("... and 3 handles that it holds (one named twice) are freed", r.freed == 2, str(r))
    k.stop()

    # a full job table: the job idle longest makes room, only once it has been idle --job-evict-idle
    k = Kexd("--max-jobs", "3", "--job-evict-idle", "1")
    jobs = [open_job(k, name=f"j{i}") for i in range(3)]
    e = rpc_error(open_job, k, name="late")
    check("a full table of jobs used just now refuses a 4th (RESOURCE_EXHAUSTED naming --max-jobs)",
          code_and(e, grpc.StatusCode.RESOURCE_EXHAUSTED, "--max-jobs"), desc(e))
    time.sleep(1.3)
    k.kex.GetStats(kex_pb2.GetStatsRequest(job=jobs[1]), timeout=5)  # renews j1 and ...
    k.kex.GetStats(kex_pb2.GetStatsRequest(job=jobs[2]), timeout=5)  # ... j2: j0 is idle longest
    late = rpc_error(open_job, k, name="late")
    e0 = rpc_error(k.kex.GetStats, kex_pb2.GetStatsRequest(job=jobs[0]), timeout=5)
    e1 = rpc_error(k.kex.GetStats, kex_pb2.GetStatsRequest(job=jobs[1]), timeout=5)
    st = k.kex.GetStats(kex_pb2.GetStatsRequest(), timeout=5)
    check("after --job-evict-idle, the job idle longest is closed to make room; the others stay",
          late is None and code_and(e0, grpc.StatusCode.NOT_FOUND) and e1 is None and st.jobs_evicted == 1,
          f"{desc(late)}; {desc(e0)}; {desc(e1)}; evicted {st.jobs_evicted}")
    k.stop()


CLIENT = r'''
import os, sys, time
sys.path.insert(0, os.environ["KEX_STUBS"])
import grpc
from kex.v1 import kex_pb2, kex_pb2_grpc
ch = grpc.insecure_channel("127.0.0.1:" + sys.argv[1])
kex = kex_pb2_grpc.KexStub(ch)
job = kex.OpenJob(kex_pb2.OpenJobRequest(name="doomed"), timeout=5).job
hold = kex.HoldJob(kex_pb2.HoldJobRequest(job=job))
next(hold)
n = 1 << 20
kex.Upload(iter([kex_pb2.UploadRequest(job=job, header=kex_pb2.UploadHeader(dtype="uint8", shape=[n])),
                 kex_pb2.UploadRequest(chunk=b"\1" * n)]), timeout=10)
print(job, flush=True)
time.sleep(600)
'''


def vanished_clients():
    """Finding 6: a client killed after its result arrived leaves nothing behind when it held its job."""
    k = Kexd("--lease", "1")
    base = k.kex.GetStats(kex_pb2.GetStatsRequest(), timeout=5).bytes_held
    p = subprocess.Popen([sys.executable, "-c", CLIENT, str(k.port)], stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ))
    job = p.stdout.readline().strip()
    time.sleep(2.0)  # past the 1 s lease: the hold keeps the job
    st = k.kex.GetStats(kex_pb2.GetStatsRequest(), timeout=5)
    check("a held job outlives its lease while its client lives (1 MiB still held after 2 s of --lease 1)",
          bool(job) and st.bytes_held == base + (1 << 20), f"{job!r} {st.bytes_held}")
    p.kill()
    p.wait()
    t0, gone = time.time(), False
    while time.time() - t0 < 5:
        st = k.kex.GetStats(kex_pb2.GetStatsRequest(), timeout=5)
        if st.bytes_held == base and rpc_error(k.kex.GetStats, kex_pb2.GetStatsRequest(job=job), timeout=5):
            gone = True
            break
        time.sleep(0.1)
    check("a client killed with SIGKILL: its held job is closed and its buffers freed within 5 s",
          gone, f"{time.time() - t0:.1f} s, held {st.bytes_held} (base {base})")

    j = open_job(k, name="twice")
    h1 = k.kex.HoldJob(kex_pb2.HoldJobRequest(job=j), timeout=30)
    first = next(h1)
    e = rpc_error(lambda: next(k.kex.HoldJob(kex_pb2.HoldJobRequest(job=j), timeout=5)))
    check("HoldJob: held, and a second hold of the same job is ALREADY_EXISTS",
          first.held and code_and(e, grpc.StatusCode.ALREADY_EXISTS), desc(e))
    k.kex.CloseJob(kex_pb2.CloseJobRequest(job=j), timeout=5)
    rest = rpc_error(lambda: list(h1))
    check("CloseJob of a held job ends its HoldJob call with OK", rest is None, desc(rest))
    j = open_job(k, name="cancelled")
    h2 = k.kex.HoldJob(kex_pb2.HoldJobRequest(job=j), timeout=30)
    next(h2)
    h2.cancel()
    time.sleep(0.3)
    e = rpc_error(k.kex.GetStats, kex_pb2.GetStatsRequest(job=j), timeout=5)
    check("a cancelled HoldJob closes its job", code_and(e, grpc.StatusCode.NOT_FOUND), desc(e))
    unheld = open_job(k, name="unheld")
    time.sleep(2.5)
    e = rpc_error(k.kex.GetStats, kex_pb2.GetStatsRequest(job=unheld), timeout=5)
    check("an unheld job still expires by its lease", code_and(e, grpc.StatusCode.NOT_FOUND), desc(e))
    k.stop()


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def malformed():
    """Bytes no client library would send, graphs no planner would make, other jobs' handles: each refused
    with the status it should get and a message naming what was wrong; kexd serves on between them and gives
    its descriptors and memory back."""
    k = Kexd()
    a, b = open_job(k, name="owner"), open_job(k, name="intruder")
    fds0, rss0 = k.fds(), k.rss_kib()
    bad_bytes = [
        ("an overlong varint (11 bytes) as OpenJob.weight", "OpenJob", b"\x10" + b"\xff" * 10 + b"\x01"),
        ("a length prefix of 2^63 on OpenJob.name", "OpenJob", b"\x0a" + varint(1 << 63) + b"abc"),
        ("a length prefix 100 bytes past the end", "OpenJob", b"\x0a\x64" + b"x" * 5),
        ("a length prefix that lies inside a nested message (Submit.graph)", "Submit",
         field(1, a.encode()) + b"\x12\x05" + b"\x1a\x20" + b"\0" * 3),
        ("OpenJob.name (a string) sent as a varint (wrong wire type 0)", "OpenJob", b"\x08\x05"),
        ("Submit.graph (a message) sent as a fixed64 (wrong wire type 1)", "Submit", field(1, a.encode()) + b"\x11" + b"\0" * 8),
        ("wire type 7 (none such)", "GetStats", b"\x0f\x00"),
        ("100,000 nested start-group tags (deep nesting)", "GetStats", b"\x0b" * 100000),
        ("a field number of 0", "OpenJob", b"\x02\x01x"),
        ("a truncated tag", "CloseJob", b"\x8a"),
    ]
    for what, method, data in bad_bytes:
        e = k.raw(method, data)
        check(f"{what}: INVALID_ARGUMENT naming the message (not a valid ...)",
              isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.INVALID_ARGUMENT and
              "not a valid" in e.details(), desc(e) if isinstance(e, grpc.RpcError) else f"accepted: {e!r}"[:200])
    check("kexd serves after the malformed bytes", k.health() == health_pb2.HealthCheckResponse.SERVING)

    def graph(nodes, outputs):
        return kex_pb2.Graph(device="cpu", nodes=nodes, outputs=outputs)

    buf4 = node("BUFFER", dtype="float32", shape=[4], fill=1.0)
    bad_graphs = [
        ("a node whose source is itself (a cycle)", graph([buf4, node("ADD", src=[1, 0])], [1]), "node 1"),
        ("a forward reference", graph([node("NEG", src=[1]), buf4], [0]), "node 0"),
        ("an output past the last node", graph([buf4], [7]), "output"),
        ("an unknown op", graph([buf4, node("FROBNICATE", src=[0])], [1]), "FROBNICATE"),
        ("an unknown dtype", graph([node("BUFFER", dtype="float128", shape=[4], fill=1.0)], [0]), "float128"),
        ("an op with too many sources", graph([buf4, node("NEG", src=[0, 0])], [1]), "node 1"),
    ]
    for what, g, word in bad_graphs:
        e = rpc_error(submit, k, a, g)
        check(f"Submit of {what} is INVALID_ARGUMENT naming it ({word})",
              code_and(e, grpc.StatusCode.INVALID_ARGUMENT, word), desc(e))
        e = rpc_error(k.kex.Plan, kex_pb2.PlanRequest(job=a, graph=g), timeout=10)
        check(f"Plan of {what} is INVALID_ARGUMENT too", code_and(e, grpc.StatusCode.INVALID_ARGUMENT, word), desc(e))

    # zero-sized shapes: a [0, 4] buffer summed over its empty axis is four zeros, like numpy's
    try:
        d = submit(k, a, graph([node("BUFFER", dtype="float32", shape=[0, 4], fill=1.0),
                                node("REDUCE_SUM", src=[0], axis=[0])], [1]))[-1].done
        check("a zero-sized [0, 4] buffer summed over axis 0 is four zeros (numpy: np.zeros((0,4)).sum(0))",
              list(d.outputs[0].shape) in ([1, 4], [4]) and d.outputs[0].data == b"\0" * 16, str(d.outputs[0])[:200])
        k.kex.Free(kex_pb2.FreeRequest(job=a, handles=[o.handle for o in d.outputs if o.handle]), timeout=5)
    except grpc.RpcError as ev:
        check("a zero-sized [0, 4] buffer summed over axis 0 runs", False, desc(ev))
    e = rpc_error(submit, k, a, graph([node("BUFFER", dtype="float32", shape=[1 << 40, 1 << 40], fill=1.0)], [0]))
    check("a [2^40, 2^40] shape (elements overflow 64 bits when multiplied by the dtype size) is refused naming node 0",
          e is not None and e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED) and
          "node 0" in e.details(), desc(e))

    # another job's handles: the intruder cannot read, use or free the owner's buffer
    h = k.kex.Upload(iter([kex_pb2.UploadRequest(job=a, header=kex_pb2.UploadHeader(dtype="float32", shape=[4])),
                           kex_pb2.UploadRequest(chunk=b"\1" * 16)]), timeout=10).handle
    g = graph([kex_pb2.Node(op="BUFFER", dtype="float32", shape=[4], buffer=h), node("NEG", src=[0])], [1])
    e = rpc_error(submit, k, b, g)
    check("Submit reading another job's buffer handle is NOT_FOUND (the job holds no such buffer)",
          code_and(e, grpc.StatusCode.NOT_FOUND, "unknown buffer handle"), desc(e))
    e = rpc_error(lambda: list(k.kex.Download(kex_pb2.DownloadRequest(job=b, handle=h), timeout=10)))
    check("Download of another job's handle is NOT_FOUND", code_and(e, grpc.StatusCode.NOT_FOUND), desc(e))
    e = rpc_error(k.kex.Free, kex_pb2.FreeRequest(job=b, handles=[h]), timeout=10)
    check("Free of another job's handle is NOT_FOUND", code_and(e, grpc.StatusCode.NOT_FOUND), desc(e))
    got = b"".join(c.data for c in k.kex.Download(kex_pb2.DownloadRequest(job=a, handle=h), timeout=10))
    check("and the owner's buffer is untouched", got == b"\1" * 16, got[:32])
    e = rpc_error(k.kex.GetStats, kex_pb2.GetStatsRequest(job=h), timeout=5)
    check("a buffer handle used as a job token is NOT_FOUND", code_and(e, grpc.StatusCode.NOT_FOUND), desc(e))
    k.kex.Free(kex_pb2.FreeRequest(job=a, handles=[h]), timeout=10)

    # a round of all of it again, then descriptors and memory are back where they were
    for _ in range(50):
        for _, method, data in bad_bytes[:-3]:
            k.raw(method, data)
        rpc_error(submit, k, b, g)
    time.sleep(0.3)
    fds1, rss1 = k.fds(), k.rss_kib()
    check("after the malformed rounds, descriptors are where they started (+2)", fds1 <= fds0 + 2, f"{fds0} -> {fds1}")
    check("and memory grew by less than 32 MiB", rss1 - rss0 < 32 * 1024, f"{rss0} -> {rss1} KiB")
    check("kexd still serves", k.health() == health_pb2.HealthCheckResponse.SERVING)
    k.stop()


def graph_limits():
    """Each graph limit a client meets, just under (planned) and just over (RESOURCE_EXHAUSTED naming the flag),
    through Plan: the limits are the builder's, the same for Submit."""
    k = Kexd("--max-nodes", "8", "--max-outputs", "2", "--max-dims", "3", "--max-elements", "1024",
             "--max-inline-bytes", "64")
    j = open_job(k, name="limits")

    def plan(nodes, outputs):
        return rpc_error(k.kex.Plan, kex_pb2.PlanRequest(job=j, graph=kex_pb2.Graph(device="cpu", nodes=nodes,
                                                                                  outputs=outputs)), timeout=10)

    def chain(n):
        return [node("BUFFER", dtype="float32", shape=[4], fill=1.0)] + [node("NEG", src=[i]) for i in range(n - 1)]

    def data(nbytes):
        return kex_pb2.Node(op="BUFFER", dtype="uint8", shape=[nbytes], data=b"\1" * nbytes)

    def both_sides(sides, what, naming):
        """Each (flag, word, under, over) of sides: `under` is planned, `over` is RESOURCE_EXHAUSTED naming word."""
        for flag, word, under, over in sides:
            e = plan(*under)
            check(f"{flag}: {what} at the limit is planned", e is None, desc(e))
            e = plan(*over)
            check(f"{flag}: one over is RESOURCE_EXHAUSTED naming {naming.format(word)}",
                  e is not None and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and word in e.details(), desc(e))

    sides = [
        ("--max-nodes 8", "nodes", (chain(8), [7]), (chain(9), [8])),
        ("--max-outputs 2", "outputs", (chain(3), [1, 2]), (chain(3), [0, 1, 2])),
        ("--max-dims 3", "dims", ([node("BUFFER", dtype="float32", shape=[2, 2, 2], fill=1.0)], [0]),
         ([node("BUFFER", dtype="float32", shape=[2, 2, 2, 1], fill=1.0)], [0])),
        ("--max-elements 1024", "elements", ([node("BUFFER", dtype="float32", shape=[32, 32], fill=1.0)], [0]),
         ([node("BUFFER", dtype="float32", shape=[1025], fill=1.0)], [0])),
        ("--max-inline-bytes 64", "bytes", ([data(64)], [0]), ([data(65)], [0])),
    ]
    both_sides(sides, "a graph", "the {} limit")
    check("kexd still serves", k.health() == health_pb2.HealthCheckResponse.SERVING)
    k.stop()

    # the kernel limits: unary(n) (BUFFER, then n - 1 NEGs and EXP2s in turn: NEG of NEG would cancel) is a kernel
    # n + 1 levels deep with n operations; tree(7) and tree(8) are 5 levels deep with 7 and 8 operations
    k = Kexd("--max-kernel-depth", "5", "--max-kernel-ops", "7")
    j = open_job(k, name="kernel-limits")

    def unary(n):
        return [node("BUFFER", dtype="float32", shape=[4], fill=1.0)] + \
            [node("EXP2" if i % 2 else "NEG", src=[i]) for i in range(n - 1)]

    def tree(ops):
        nodes = [node("BUFFER", dtype="float32", shape=[4], fill=1.0), node("NEG", src=[0]), node("EXP2", src=[0]),
                 node("ADD", src=[1, 2]), node("LOG2", src=[0])]
        nodes += [node("ADD", src=[4, 0]), node("ADD", src=[3, 5])] if ops == 7 else \
            [node("SIN", src=[0]), node("ADD", src=[4, 5]), node("ADD", src=[3, 6])]
        return nodes, [len(nodes) - 1]

    sides = [("--max-kernel-depth 5", "(max_kernel_depth)", (unary(4), [3]), (unary(5), [4])),
             ("--max-kernel-ops 7", "(max_kernel_ops)", tree(7), tree(8))]
    both_sides(sides, "a kernel", "{}")
    k.stop()


def main():
    malformed()
    graph_limits()
    connections()
    limits()
    vanished_clients()


if __name__ == "__main__":
    run(main, "test_hostile.py")
