"""stress.py - load without loss: N clients, each with its own job and channel, against one real kexd.

  KEXD=... KEX_STUBS=... KEXD_TMP=... /usr/bin/python3 tests/stress/stress.py --clients 8 --calls 40 [--json OUT]

(--clients and --calls default to $KEX_STRESS_CLIENTS and $KEX_STRESS_CALLS, else 8 and 40.)

Each client makes --calls calls, a fixed mix drawn from its own seeded generator: Submit of a tiny
graph (a + b, inputs inline), of a 16x16 matmul (one input uploaded, read by handle; output downloaded
by handle, then freed), of a multi-kernel graph (two reductions and an elementwise tail); Upload then
Download of random bytes, then Free; a Submit cancelled after its first event; a Submit under a 1 ms
deadline; an Upload whose client gives up after the header (closed mid-stream).  Checks:

  - 0 unexpected errors (a cancel may only end CANCELLED, a deadline only DEADLINE_EXCEEDED or done);
  - every output equal to numpy's (allclose for the float reductions);
  - GetStats agrees with what the clients did: submissions counted, done at least the clients' done
    count, jobs opened and closed, every job's buffers 0 and bytes_held 0 before CloseJob;
  - the daemon's RSS and descriptors after the run within 10% (descriptors: +4) of where they were
    after the warm-up (the first tenth of the calls), and kexd exits 0 at SIGTERM without a sanitizer
    report.

Prints "ok - ..." / "FAIL - ..." and last "N passed, N failed" (kexdtest); --json writes the figures
(calls, clients, errors, Submit p50/p99 in ms after the warm-up, RSS and descriptors after the warm-up
and at the end).
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from kexdtest import check, free_port, run, wait_healthy  # noqa: E402  (puts KEX_STUBS on sys.path)

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from kex.v1 import kex_pb2, kex_pb2_grpc  # noqa: E402

KEXD = os.environ["KEXD"]
TMP = os.environ["KEXD_TMP"]
ASAN = os.environ.get("KEXD_ASAN") == "1"
OPS = ["tiny", "tiny", "matmul", "multi", "updown", "cancel", "deadline", "close_mid"]


def buf(arr):
    return kex_pb2.Node(op="BUFFER", dtype="float32", shape=list(arr.shape), data=arr.astype(np.float32).tobytes())


def ints(kind, vals):
    n = kex_pb2.Node()
    getattr(n, kind).values.extend(vals)
    getattr(n, kind).SetInParent()
    return n


def mv(op, src, kind, vals):
    n = ints(kind, vals)
    n.op, n.src[:] = op, [src]
    return n


def g_tiny(a, b):
    return kex_pb2.Graph(device="cpu", nodes=[buf(a), buf(b), kex_pb2.Node(op="ADD", src=[0, 1])], outputs=[2])


def g_matmul(handle, n, b):
    """handle (n x n, uploaded) @ b (inline)."""
    nodes = [kex_pb2.Node(op="BUFFER", dtype="float32", shape=[n, n], buffer=handle), buf(b),
             mv("RESHAPE", 0, "new_shape", [n, 1, n]), mv("EXPAND", 2, "new_shape", [n, n, n]),
             mv("PERMUTE", 1, "order", [1, 0]), mv("RESHAPE", 4, "new_shape", [1, n, n]),
             mv("EXPAND", 5, "new_shape", [n, n, n]), kex_pb2.Node(op="MUL", src=[3, 6]),
             kex_pb2.Node(op="REDUCE_SUM", src=[7], axis=[2]), mv("RESHAPE", 8, "new_shape", [n, n])]
    return kex_pb2.Graph(device="cpu", nodes=nodes, outputs=[9])


def g_multi(a):
    """(sum over rows, materialized) then max over the result's row sums: two reductions, two outputs."""
    r, c = a.shape
    nodes = [buf(a), kex_pb2.Node(op="REDUCE_SUM", src=[0], axis=[1]), kex_pb2.Node(op="CONTIGUOUS", src=[1]),
             kex_pb2.Node(op="EXP2", src=[0]), kex_pb2.Node(op="REDUCE_MAX", src=[3], axis=[0, 1]),
             mv("RESHAPE", 2, "new_shape", [r]), mv("RESHAPE", 4, "new_shape", [])]
    return kex_pb2.Graph(device="cpu", nodes=nodes, outputs=[5, 6])


def out_array(o):
    return np.frombuffer(o.data, np.float32).reshape(list(o.shape))


class Client(threading.Thread):
    def __init__(self, idx, port, calls, shared):
        super().__init__(daemon=True)
        self.idx, self.port, self.calls, self.shared = idx, port, calls, shared
        self.rng = random.Random(1000 + idx)
        self.nrng = np.random.default_rng(1000 + idx)
        self.errors = []
        self.wrong = []
        self.counts = {k: 0 for k in OPS}
        self.submits = self.done = self.expired = 0
        self.latency_ms = []
        self.job = None
        self.warm = False

    def err(self, what, e):
        self.errors.append(f"client {self.idx} {what}: {e.code() if isinstance(e, grpc.RpcError) else ''} "
                           f"{e.details() if isinstance(e, grpc.RpcError) else repr(e)}"[:300])

    def submit(self, graph, timeout=60, **kw):
        self.submits += 1
        t0 = time.time()
        ev = list(self.kex.Submit(kex_pb2.SubmitRequest(job=self.job, graph=graph, **kw), timeout=timeout))
        if self.warm:  # the warm-up's first compiles are not the latency under load
            self.latency_ms.append((time.time() - t0) * 1e3)
        if ev and ev[-1].HasField("done"):
            self.done += 1
        return ev[-1].done

    def upload(self, arr):
        def reqs():
            yield kex_pb2.UploadRequest(job=self.job, header=kex_pb2.UploadHeader(dtype="float32", shape=list(arr.shape)))
            yield kex_pb2.UploadRequest(chunk=arr.astype(np.float32).tobytes())
        return self.kex.Upload(reqs(), timeout=30).handle

    def download(self, handle):
        return b"".join(c.data for c in self.kex.Download(kex_pb2.DownloadRequest(job=self.job, handle=handle),
                                                           timeout=30))

    def free(self, *handles):
        self.kex.Free(kex_pb2.FreeRequest(job=self.job, handles=list(handles)), timeout=10)

    def one(self, op):
        n = self.nrng
        if op == "tiny":
            a, b = n.standard_normal(16).astype(np.float32), n.standard_normal(16).astype(np.float32)
            d = self.submit(g_tiny(a, b), free_outputs=True)
            if not np.array_equal(out_array(d.outputs[0]), a + b):
                self.wrong.append(f"client {self.idx} tiny")
        elif op == "matmul":
            a, b = n.standard_normal((16, 16)).astype(np.float32), n.standard_normal((16, 16)).astype(np.float32)
            h = self.upload(a)
            d = self.submit(g_matmul(h, 16, b), inline_output_max_bytes=1)
            got = np.frombuffer(self.download(d.outputs[0].handle), np.float32).reshape(16, 16)
            self.free(h, d.outputs[0].handle)
            if not np.allclose(got, a @ b, rtol=1e-4, atol=1e-4):
                self.wrong.append(f"client {self.idx} matmul")
        elif op == "multi":
            a = n.standard_normal((8, 32)).astype(np.float32)
            d = self.submit(g_multi(a), free_outputs=True)
            s, m = out_array(d.outputs[0]), out_array(d.outputs[1])
            if not (np.allclose(s, a.sum(axis=1), rtol=1e-4, atol=1e-4) and np.allclose(m, np.exp2(a).max())):
                self.wrong.append(f"client {self.idx} multi")
        elif op == "updown":
            a = n.standard_normal(int(n.integers(1, 4096))).astype(np.float32)
            h = self.upload(a)
            got = self.download(h)
            self.free(h)
            if got != a.tobytes():
                self.wrong.append(f"client {self.idx} updown")
        elif op == "cancel":
            self.submits += 1
            call = self.kex.Submit(kex_pb2.SubmitRequest(job=self.job, graph=g_multi(n.standard_normal((8, 32))
                                                                                      .astype(np.float32)),
                                                         free_outputs=True), timeout=60)
            try:
                for ev in call:
                    if ev.HasField("done"):
                        self.done += 1
                    call.cancel()
                    break
                for _ in call:
                    pass
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.CANCELLED:
                    self.err("cancel", e)
        elif op == "deadline":
            a = n.standard_normal(16).astype(np.float32)
            try:
                self.submit(g_tiny(a, a), timeout=0.001, free_outputs=True)
            except grpc.RpcError as e:
                self.expired += 1  # it may have expired before kexd saw it: then kexd never counted it
                if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    self.err("deadline", e)
        elif op == "close_mid":
            def reqs():
                yield kex_pb2.UploadRequest(job=self.job, header=kex_pb2.UploadHeader(dtype="float32", shape=[1024]))
                yield kex_pb2.UploadRequest(chunk=b"\0" * 1024)
                raise RuntimeError("the client gives up mid-stream")
            try:
                self.kex.Upload(reqs(), timeout=30)
                self.errors.append(f"client {self.idx} close_mid: an upload of 1 KiB of 4 KiB succeeded")
            except grpc.RpcError as e:
                if e.code() not in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN):
                    self.err("close_mid", e)
        self.counts[op] += 1

    def run(self):
        try:
            with grpc.insecure_channel(f"127.0.0.1:{self.port}") as ch:
                self.kex = kex_pb2_grpc.KexStub(ch)
                self.job = self.kex.OpenJob(kex_pb2.OpenJobRequest(name=f"stress-{self.idx}", weight=1), timeout=10).job
                warmup = list(dict.fromkeys(OPS))  # one of each first: every kernel compiled, every path taken
                for i in range(self.calls):
                    if i == min(len(warmup), self.calls):
                        self.shared["warm"].wait()  # the main thread samples RSS once every client is warm
                        self.warm = True
                    op = warmup[i] if i < len(warmup) else self.rng.choice(OPS)
                    try:
                        self.one(op)
                    except grpc.RpcError as e:
                        self.err(op, e)
                self.shared["end"].wait()  # the main thread checks the jobs' stats, then they close
                self.shared["closed"].wait()
                self.kex.CloseJob(kex_pb2.CloseJobRequest(job=self.job), timeout=10)
        except Exception as e:  # noqa: BLE001 - any crash of a client is an unexpected error
            self.err("client", e)
            for b in ("warm", "end", "closed"):
                self.shared[b].abort()


def proc_figures(pid):
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=int(os.environ.get("KEX_STRESS_CLIENTS", "8")))
    ap.add_argument("--calls", type=int, default=int(os.environ.get("KEX_STRESS_CALLS", "40")))
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    port = free_port()
    log_path = os.path.join(TMP, "kexd-stress.log")
    log = open(log_path, "w")
    proc = subprocess.Popen([KEXD, "--listen", f"127.0.0.1:{port}", "--device", "cpu",
                             "--cache", os.path.join(TMP, "stress-cache.db"), "--max-jobs", str(a.clients + 8),
                             "--max-jobs-per-peer", str(a.clients + 8)], stdout=log, stderr=subprocess.STDOUT)
    try:
        check("kexd starts", wait_healthy(port, proc, 60 if ASAN else 15))
        shared = {"warm": threading.Barrier(a.clients + 1), "end": threading.Barrier(a.clients + 1),
                  "closed": threading.Barrier(a.clients + 1)}
        clients = [Client(i, port, a.calls, shared) for i in range(a.clients)]
        ch = grpc.insecure_channel(f"127.0.0.1:{port}")
        kex = kex_pb2_grpc.KexStub(ch)
        s0 = kex.GetStats(kex_pb2.GetStatsRequest(), timeout=10)
        t0 = time.time()
        for c in clients:
            c.start()
        shared["warm"].wait(timeout=600)
        time.sleep(0.2)
        rss0, fds0 = proc_figures(proc.pid)
        shared["end"].wait(timeout=1800)
        wall = time.time() - t0
        s1 = kex.GetStats(kex_pb2.GetStatsRequest(), timeout=10)
        held = [(j.name, j.buffers, j.bytes_held) for j in s1.job_stats if j.buffers or j.bytes_held]
        shared["closed"].wait(timeout=60)
        for c in clients:
            c.join(timeout=60)
        time.sleep(0.5)
        rss1, fds1 = proc_figures(proc.pid)
        s2 = kex.GetStats(kex_pb2.GetStatsRequest(), timeout=10)
        ch.close()

        errors = [e for c in clients for e in c.errors]
        wrong = [w for c in clients for w in c.wrong]
        calls = sum(sum(c.counts.values()) for c in clients)
        submits, done = sum(c.submits for c in clients), sum(c.done for c in clients)
        lat = sorted(x for c in clients for x in c.latency_ms)
        p50 = lat[len(lat) // 2] if lat else 0.0
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else 0.0
        mix = {op: sum(c.counts[op] for c in clients) for op in OPS}
        print(f"# {a.clients} clients, {calls} calls in {wall:.1f} s ({mix}); Submit p50 {p50:.1f} ms, p99 {p99:.1f} ms;"
              f" RSS {rss0} -> {rss1} KiB, descriptors {fds0} -> {fds1}")
        check(f"{a.clients} clients made all {a.clients * a.calls} calls", calls == a.clients * a.calls, f"{calls}")
        check("0 unexpected errors", not errors, "; ".join(errors[:5]))
        check("every output equals numpy's", not wrong, "; ".join(wrong[:5]))
        expired = sum(c.expired for c in clients)
        got = s1.submissions - s0.submissions
        check("GetStats: submissions grew by the clients' Submit calls (less those that expired before arriving)",
              submits - expired <= got <= submits, f"{got}, clients made {submits} ({expired} expired at 1 ms)")
        check("GetStats: every submission counted ended done or failed; done at least the done events clients saw",
              s1.submissions_done - s0.submissions_done >= done and
              (s1.submissions_done - s0.submissions_done) + (s1.submissions_failed - s0.submissions_failed) == got,
              f"done {s1.submissions_done - s0.submissions_done} (clients saw {done}), failed "
              f"{s1.submissions_failed - s0.submissions_failed}, counted {got}")
        check("GetStats: the clients' jobs were opened and are open", s1.jobs_opened - s0.jobs_opened == a.clients and
              s1.jobs_open == s0.jobs_open + a.clients, f"opened {s1.jobs_opened - s0.jobs_opened}, open {s1.jobs_open}")
        check("no buffer left held at the end (every job: 0 buffers, 0 bytes)", not held and s1.bytes_held == 0,
              f"{held[:5]} bytes_held {s1.bytes_held}")
        check("GetStats: after CloseJob every job is closed", s2.jobs_open == s0.jobs_open and
              s2.jobs_closed - s0.jobs_closed == a.clients, f"open {s2.jobs_open}, closed {s2.jobs_closed}")
        if ASAN:  # ASan's quarantine holds freed memory back (256 MiB by default): RSS grows by design there
            print(f"# RSS not checked under ASan (quarantine): {rss0} -> {rss1} KiB")
        else:
            check("RSS after the run within 10% of after the warm-up", rss1 <= rss0 * 1.10, f"{rss0} -> {rss1} KiB")
        check("descriptors after the run where they were after the warm-up (+4)", fds1 <= fds0 + 4, f"{fds0} -> {fds1}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"clients": a.clients, "calls": calls, "calls_per_client": a.calls, "mix": mix,
                           "wall_s": round(wall, 1), "unexpected_errors": len(errors), "wrong_outputs": len(wrong),
                           "submits": submits, "submit_p50_ms": round(p50, 2), "submit_p99_ms": round(p99, 2),
                           "rss_kib_after_warmup": rss0, "rss_kib_end": rss1, "fds_after_warmup": fds0,
                           "fds_end": fds1}, f, indent=2)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        log.close()
        text = open(log_path).read()
        check("kexd exits 0 at SIGTERM, no sanitizer report", rc == 0 and not any(
            w in text for w in ("AddressSanitizer", "runtime error", "LeakSanitizer")), f"rc {rc}; {text[-1500:]}")


if __name__ == "__main__":
    run(main, "stress.py")
