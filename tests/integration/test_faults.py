"""test_faults.py - device faults and kill -9 through a real kexd.

Run by test_faults.sh (short form) and bench/faults (long form), which pass
in the environment: KEXD (the binary), KEXD_TMP (a scratch directory),
KEX_STUBS (the generated stubs), FAULTS_MAX_N (the highest N swept per kind
and graph; 0: every N until the Submit succeeds), FAULTS_GRAPHS ("short" or
"long": which graphs are swept), FAULTS_KILL_ROUNDS (kill -9 rounds),
FAULTS_SEED, and optionally FAULTS_JSON (a file the counts are written to).

Faults: kexd --test-fault KIND:N makes the N-th call of KIND (alloc,
compile, launch, copy) of each device instance fail, so one kexd is started
per KIND:N and graph (the counter is process-wide).  Each faulted Submit
must fail INTERNAL with the injected failure and the place it happened (a
kernel, a buffer, an input node, a copy, an output); then the daemon answers
health, the job holds and reserves nothing, the next Submit returns numpy's
result, and kexd exits 0 at SIGTERM.  N past the last operation the graph
needs makes the Submit succeed: that ends the sweep of the kind (the count of
operations is found, not assumed).

kill -9: one cache file; each round kills kexd at a random moment of a
Submit with beam (writes programs and beam rows), a Tune, or an ImportCache,
then checks PRAGMA integrity_check, that every row is whole (beam rows: opts,
name, times, AST text hashing to the key; program rows: source and binary
hashing to their recorded SHA-256), that `kex cache ls --json` reads the
file, and that a kexd restarted on the file serves a correct Submit.
"""
import hashlib
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import threading
import time

import kexdtest  # noqa: E402
from kexdtest import check, desc, run, stop, wait_healthy  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from kex.v1 import kex_pb2, kex_pb2_grpc  # noqa: E402

KEXD = os.environ["KEXD"]
KEX = os.environ.get("KEX_CLI", "")
TMP = os.environ["KEXD_TMP"]
MAX_N = int(os.environ.get("FAULTS_MAX_N", "6"))
GRAPHS = os.environ.get("FAULTS_GRAPHS", "short")
KILL_ROUNDS = int(os.environ.get("FAULTS_KILL_ROUNDS", "10"))
SEED = int(os.environ.get("FAULTS_SEED", "14"))
KINDS = ("compile", "alloc", "launch", "copy")
# where a fault of each kind may be reported: a kernel (E_/r_ names), a buffer, an input node, a copy, an output
PLACE = re.compile(r"\b(?:[Er]_\w+|kernel \d+|allocating buffer \d+|node \d+ \(BUFFER\)|copy|output \d+)")

figures = {"kinds": {k: {"injected": 0, "survived": 0} for k in KINDS}, "graphs": {}, "kill_rounds": 0,
           "kill_rounds_passed": 0, "integrity_ok": 0, "integrity_failed": 0, "kill_points": {},
           "killed_mid_call": 0}


def N(**kw):
    return kex_pb2.Node(**kw)


def arange(shape):
    return N(op="BUFFER", dtype="float32", shape=shape, fill_arange=True)


def g_rowsum_sq(n=16):
    """(sum(arange, axis=1))^2: two kernels."""
    g = kex_pb2.Graph(device="cpu", nodes=[arange([n, n]), N(op="REDUCE_SUM", src=[0], axis=[1]),
                                          N(op="CONTIGUOUS", src=[1]), N(op="MUL", src=[2, 2])], outputs=[3])
    return g, np.arange(n * n, dtype=np.float32).reshape(n, n).sum(1) ** 2


def g_matmul(n=16):
    """arange(n, n) @ arange(n, n).T / n^2 + 1, then sum of rows: several kernels."""
    x = arange([n, n])
    nodes = [x, arange([n, n]),
             N(op="RESHAPE", src=[0], new_shape=kex_pb2.Ints(values=[n, 1, n])),
             N(op="EXPAND", src=[2], new_shape=kex_pb2.Ints(values=[n, n, n])),
             N(op="RESHAPE", src=[1], new_shape=kex_pb2.Ints(values=[1, n, n])),
             N(op="EXPAND", src=[4], new_shape=kex_pb2.Ints(values=[n, n, n])),
             N(op="MUL", src=[3, 5]), N(op="REDUCE_SUM", src=[6], axis=[2]),
             N(op="RESHAPE", src=[7], new_shape=kex_pb2.Ints(values=[n, n])), N(op="CONTIGUOUS", src=[8]),
             N(op="REDUCE_SUM", src=[9], axis=[0]), N(op="CONTIGUOUS", src=[10])]
    a = np.arange(n * n, dtype=np.float64).reshape(n, n)
    return kex_pb2.Graph(device="cpu", nodes=nodes, outputs=[9, 11]), [(a @ a.T).astype(np.float32),
                                                                        (a @ a.T).sum(0).astype(np.float32)]


def g_add3(n=64):
    """(arange + 2) * arange - 1, and its max: elementwise and a reduce over fresh inputs."""
    nodes = [arange([n]), N(op="BUFFER", dtype="float32", shape=[n], fill_value=kex_pb2.Scalar(float_value=2.0)),
             N(op="ADD", src=[0, 1]), N(op="CONTIGUOUS", src=[2]), N(op="MUL", src=[3, 0]),
             N(op="CONST", dtype="float32", shape=[n], value=kex_pb2.Scalar(float_value=1.0)),
             N(op="SUB", src=[4, 5]), N(op="CONTIGUOUS", src=[6]), N(op="REDUCE_MAX", src=[7], axis=[0]),
             N(op="CONTIGUOUS", src=[8])]
    a = np.arange(n, dtype=np.float32)
    e = (a + 2) * a - 1
    return kex_pb2.Graph(device="cpu", nodes=nodes, outputs=[7, 9]), [e, np.array([e.max()], np.float32)]


def g_chain(k=5, n=32):
    """x, x*2+x, ...: k elementwise kernels, each forced by a CONTIGUOUS, and the sum of the last."""
    nodes, cur = [arange([n])], 0
    a = np.arange(n, dtype=np.float32)
    e = a.copy()
    for i in range(k):
        nodes += [N(op="CONST", dtype="float32", shape=[n], value=kex_pb2.Scalar(float_value=float(i + 1))),
                  N(op="MUL", src=[cur, len(nodes)]), N(op="ADD", src=[len(nodes) + 1, 0]),
                  N(op="CONTIGUOUS", src=[len(nodes) + 2])]
        cur = len(nodes) - 1
        e = e * (i + 1) + a
    nodes += [N(op="REDUCE_SUM", src=[cur], axis=[0]), N(op="CONTIGUOUS", src=[len(nodes)])]
    return kex_pb2.Graph(device="cpu", nodes=nodes, outputs=[cur, len(nodes) - 1]), [e, np.array([e.sum()],
                                                                                           np.float32)]


def graphs():
    gs = {"rowsum_sq": g_rowsum_sq(), "matmul_rowsum": g_matmul(), "matmul_rowsum_keep": g_matmul()}
    if GRAPHS == "long":
        gs.update({"add_mul_max": g_add3(), "rowsum_sq_48": g_rowsum_sq(48), "matmul_rowsum_8": g_matmul(8),
                   "chain5": g_chain(5), "chain8": g_chain(8, 48),
                   "chain5_keep": g_chain(5)})
    return gs


def start_kexd(*args):
    return kexdtest.start_kexd(KEXD, TMP, *args)


def open_job(kex, name):
    return kex.OpenJob(kex_pb2.OpenJobRequest(name=name), timeout=5).job


SUBMITS = [0]


def submit(kex, job, graph, timeout=60, keep=False, **kw):
    """All events of a Submit with the outputs' bytes; keep: its outputs stay as buffers of the job too.  Every
    other Submit asks for batched_events (the events ready together in one message), so that both ways of writing
    the stream meet every fault; the events come back one per list item either way."""
    SUBMITS[0] += 1
    msgs = kex.Submit(kex_pb2.SubmitRequest(job=job, graph=graph, return_bytes=True, free_outputs=not keep,
                                            batched_events=SUBMITS[0] % 2 == 0, **kw), timeout=timeout)
    return [e for m in msgs for e in (m, *m.following)]


def outputs_right(evs, expect):
    """True when the done event's outputs equal numpy's (float32 within 1e-4 relative)."""
    if not evs or evs[-1].WhichOneof("event") != "done":
        return False
    exp = expect if isinstance(expect, list) else [expect]
    outs = evs[-1].done.outputs
    return len(outs) == len(exp) and all(
        np.allclose(np.frombuffer(o.data, np.float32), e.reshape(-1), rtol=1e-4, atol=1e-3) for o, e in zip(outs, exp))


# ---- (a) the fault sweep ----

def one_fault(kind, n, name, graph, expect):
    """kexd --test-fault kind:n, one Submit of graph: 'failed' (checked), 'succeeded', or None (broken).
    A graph named *_keep keeps its outputs as buffers (their allocations and copies are faulted too)."""
    keep = name.endswith("_keep")
    cache = "" if kind == "compile" else WARM  # compile faults need compiles; the rest load programs from SQLite
    proc, port, up = start_kexd("--device", "cpu", "--cache", cache, "--compile-slots", "1", "--grace", "2",
                                "--test-fault", f"{kind}:{n}")
    if not check(f"{kind}:{n} {name}: kexd starts", up):
        proc.kill()
        proc.wait()
        return None
    result = None
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        kex = kex_pb2_grpc.KexStub(ch)
        job = open_job(kex, "f")
        e, evs = None, None
        try:
            evs = submit(kex, job, graph, keep=keep)
        except grpc.RpcError as err:
            e = err
        if e is None:
            result = "succeeded"
            check(f"{kind}:{n} {name}: past the graph's {kind} calls the Submit succeeds with numpy's result",
                  outputs_right(evs, expect))
        else:
            result = "failed"
            figures["kinds"][kind]["injected"] += 1
            d = e.details() or ""
            print(f"# {kind}:{n} {name}: {desc(e)}")
            named = e.code() == grpc.StatusCode.INTERNAL and f"injected failure of {kind} call #{n}" in d and \
                PLACE.search(d.split("fault device")[0]) is not None
            alive = wait_healthy(port, proc, timeout=5)
            js = kex.GetStats(kex_pb2.GetStatsRequest(job=job), timeout=5)
            clean = js.job_stats[0].bytes_held == 0 and js.job_stats[0].bytes_reserved == 0 and js.bytes_held == 0
            try:
                again = outputs_right(submit(kex, job, graph), expect)
            except grpc.RpcError as err2:
                again, d = False, d + " / then: " + desc(err2)
            ok = check(f"{kind}:{n} {name}: INTERNAL naming the place; then health SERVING, nothing held or "
                       f"reserved, the next Submit right", named and alive and clean and again,
                       f"{desc(e)}; alive={alive} clean={clean} again={again}")
            if ok:
                figures["kinds"][kind]["survived"] += 1
    rc = stop(proc)
    check(f"{kind}:{n} {name}: kexd exits 0 at SIGTERM", rc == 0, f"rc {rc}")
    return result


WARM = os.path.join(TMP, "warm.db")


def sweep():
    gs = graphs()
    proc, port, up = start_kexd("--device", "cpu", "--cache", WARM, "--grace", "2")
    if check("a kexd without faults fills a program cache with the graphs' kernels", up):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            kex = kex_pb2_grpc.KexStub(ch)
            job = open_job(kex, "warm")
            check("... and computes each graph as numpy does",
                  all(outputs_right(submit(kex, job, g), e) for g, e in gs.values()))
    check("... and exits 0 at SIGTERM", stop(proc) == 0)
    for name, (graph, expect) in gs.items():
        ops = figures["graphs"].setdefault(name, {})
        for kind in KINDS:
            n = 1
            while True:
                r = one_fault(kind, n, name, graph, expect)
                if r != "failed":
                    if r == "succeeded":
                        ops[kind] = n - 1
                    break
                if MAX_N and n >= MAX_N:
                    ops[kind] = f">={n}"
                    break
                n += 1
            check(f"{name}: the {kind} sweep found at least one {kind} call to fail",
                  ops.get(kind) not in (None, 0), str(ops.get(kind)))


# ---- (b) kill -9 rounds ----

def rows_whole(path):
    """(integrity_check result, whole?, detail) of the cache file."""
    db = sqlite3.connect(path)
    try:
        integ = db.execute("PRAGMA integrity_check").fetchall()
        beams = db.execute("SELECT hex(ast_key), opts, kernel_name, best_time_s, ast_text, search_opts, "
                           "codegen_version FROM beam_results").fetchall()
        progs = db.execute("SELECT hex(source_sha256), source, binary, hex(binary_sha256), kernel_name "
                           "FROM programs").fetchall()
    finally:
        db.close()
    bad = [r[0][:16] for r in beams if not (r[1] is not None and r[2] and r[3] is not None and r[3] > 0 and r[5] and
                                           r[6] and (r[4] is None or
                                                     hashlib.sha256(r[4].encode()).hexdigest().upper() == r[0]))]
    bad += [r[0][:16] for r in progs if not (r[1] and r[2] and r[4] and
                                             hashlib.sha256(r[1].encode()).hexdigest().upper() == r[0] and
                                             hashlib.sha256(r[2]).hexdigest().upper() == r[3])]
    return integ, not bad, f"{len(beams)} beam rows, {len(progs)} programs, bad: {bad[:4]}"


def kill_rounds():
    path = os.path.join(TMP, "kill.db")
    rng = random.Random(SEED)
    proc, port, up = start_kexd("--device", "cpu", "--cache", path, "--grace", "2")
    if not check("kill -9: kexd starts on a new cache file", up):
        proc.kill()
        return
    # an export to import: Tune two graphs once
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        kex = kex_pb2_grpc.KexStub(ch)
        job = open_job(kex, "seed")
        for g in (g_rowsum_sq(24)[0], g_matmul(12)[0]):
            list(kex.Tune(kex_pb2.TuneRequest(job=job, graph=g, beam=kex_pb2.BeamOptions(beam_width=1)), timeout=60))
        export = b"".join(c.data for c in kex.ExportCache(kex_pb2.ExportCacheRequest(job=job), timeout=30))
    lines = export.split(b"\n")
    check("kill -9: an export to import (header and entries)", len([x for x in lines[1:] if x]) >= 2, len(lines))
    # the import body: the entries repeated, so the import runs long enough to be killed inside
    body = lines[0] + b"\n" + b"\n".join([x for x in lines[1:] if x] * 200) + b"\n"
    for rnd in range(1, KILL_ROUNDS + 1):
        what = rng.choice(("submit", "tune", "import"))
        n = rng.randrange(6, 40)  # a new shape: a new search and new programs
        delay = rng.uniform(0.0, 0.6)
        figures["kill_points"][what] = figures["kill_points"].get(what, 0) + 1
        ch = grpc.insecure_channel(f"127.0.0.1:{port}")
        kex = kex_pb2_grpc.KexStub(ch)
        job = open_job(kex, f"r{rnd}")

        def work():
            try:
                if what == "submit":
                    submit(kex, job, g_matmul(n)[0], beam=kex_pb2.BeamOptions(beam_width=2))
                elif what == "tune":
                    list(kex.Tune(kex_pb2.TuneRequest(job=job, graph=g_rowsum_sq(n)[0],
                                                      beam=kex_pb2.BeamOptions(beam_width=2)), timeout=60))
                else:
                    def reqs():
                        yield kex_pb2.ImportCacheRequest(job=job)
                        for i in range(0, len(body), 4096):
                            yield kex_pb2.ImportCacheRequest(data=body[i:i + 4096])
                    kex.ImportCache(reqs(), timeout=60)
            except grpc.RpcError:
                pass
        th = threading.Thread(target=work)
        th.start()
        time.sleep(delay)
        mid = th.is_alive()  # the call had not ended: the kill landed inside it
        figures["killed_mid_call"] += mid
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        th.join(timeout=60)
        ch.close()
        figures["kill_rounds"] += 1
        try:
            integ, whole, detail = rows_whole(path)
        except sqlite3.Error as e:
            integ, whole, detail = [("error",)], False, str(e)
        integ_ok = integ == [("ok",)]
        figures["integrity_ok" if integ_ok else "integrity_failed"] += 1
        listed = True
        if KEX:
            r = subprocess.run([KEX, "cache", "ls", "--cache", path, "--json"], capture_output=True, text=True,
                               timeout=30)
            try:
                listed = r.returncode == 0 and isinstance(json.loads(r.stdout), (list, dict))
            except ValueError:
                listed = False
        proc, port, up = start_kexd("--device", "cpu", "--cache", path, "--grace", "2")
        served = False
        if up:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch2:
                k2 = kex_pb2_grpc.KexStub(ch2)
                graph, expect = g_rowsum_sq(n)
                try:
                    served = outputs_right(submit(k2, open_job(k2, "after"), graph), expect)
                except grpc.RpcError as e:
                    detail += " / " + desc(e)
        ok = check(f"kill -9 round {rnd} ({what} n={n}, after {delay:.2f} s{'' if mid else ', after the call'}): integrity_check ok, whole rows, "
                   f"kex cache ls reads it, a restarted kexd serves", integ_ok and whole and listed and served,
                   f"integrity={integ[:2]} whole={whole} listed={listed} served={served}; {detail}")
        if ok:
            figures["kill_rounds_passed"] += 1
        if not up:
            proc.kill()
            proc.wait()
            proc, port, up = start_kexd("--device", "cpu", "--cache", path, "--grace", "2")
            if not up:
                return
    check("kill -9: the last kexd exits 0 at SIGTERM", stop(proc) == 0)
    check("kill -9: most kills landed inside a call", figures["killed_mid_call"] * 2 > figures["kill_rounds"] or
          not KILL_ROUNDS,
          f"{figures['killed_mid_call']} of {figures['kill_rounds']}")


def main():
    t0 = time.time()
    sweep()
    t1 = time.time()
    kill_rounds()
    t2 = time.time()
    figures["sweep_s"], figures["kill_s"] = round(t1 - t0, 1), round(t2 - t1, 1)
    print(f"# faults: {json.dumps(figures)}")
    if os.environ.get("FAULTS_JSON"):
        with open(os.environ["FAULTS_JSON"], "w") as f:
            json.dump(figures, f, indent=1)


run(main, "test_faults.py")
