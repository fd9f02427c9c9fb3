"""test_submit.py - Submit in a real kexd: numbers, handles, jobs, limits, deadlines, caches.

Run by test_submit.sh, which starts the kexd under test (--device cpu,opencl,
--cache KEXD_CACHE) and passes, in the environment: KEXD (the binary),
KEXD_PORT, KEXD_CACHE, KEXD_TMP (a scratch directory), KEX_STUBS (the
generated kex_pb2*.py and health_pb2*.py), KEX_CASES_DIR.  The restart, fault
and cache-timing checks start their own kexd.  Prints one line per check
("ok - ..." / "FAIL - ..." / "skip - ...") and, last, "N passed, N failed".
Exit status 1 when anything failed.

Numbers: every `numeric` case of the cases directory is submitted on cpu and
on opencl (float16 cases are skipped on opencl when the device refuses the
dtype, with its reason) and each output is compared with the case's
expected bytes at the case's rtol/atol (exactly for ints and bools).
"""
import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.environ["KEX_STUBS"])

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from kex.v1 import kex_pb2, kex_pb2_grpc  # noqa: E402
import kexdtest  # noqa: E402
from kexdtest import check, desc, graph_pb, skip, stop  # noqa: E402

KEXD = os.environ["KEXD"]
PORT = int(os.environ["KEXD_PORT"])
CACHE = os.environ["KEXD_CACHE"]
TMP = os.environ["KEXD_TMP"]
CASES = os.environ["KEX_CASES_DIR"]
CHANNEL_OPTS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]

NP_DTYPES = {"bool": np.bool_, "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16,
             "int32": np.int32, "uint32": np.uint32, "int64": np.int64, "uint64": np.uint64,
             "float16": np.float16, "float32": np.float32, "float64": np.float64}


def start_kexd(*args, env=None):
    """A kexd of its own on a free port (env: extra environment variables); (process, port, healthy)."""
    return kexdtest.start_kexd(KEXD, TMP, *args, env=env, timeout=30)


def submit(kex, job, graph, timeout=60, **kw):
    """All events of a Submit; raises grpc.RpcError on an error status."""
    return list(kex.Submit(kex_pb2.SubmitRequest(job=job, graph=graph, **kw), timeout=timeout))


def done_of(events):
    return events[-1].done


def upload(kex, job, dtype, shape, data, device=""):
    def reqs():
        yield kex_pb2.UploadRequest(job=job, header=kex_pb2.UploadHeader(dtype=dtype, shape=shape, device=device))
        yield kex_pb2.UploadRequest(chunk=data)
    return kex.Upload(reqs(), timeout=30).handle


def download(kex, job, handle):
    return b"".join(c.data for c in kex.Download(kex_pb2.DownloadRequest(job=job, handle=handle), timeout=30))


def stats(kex, job=""):
    return kex.GetStats(kex_pb2.GetStatsRequest(job=job), timeout=5)


def open_job(kex, name, **kw):
    return kex.OpenJob(kex_pb2.OpenJobRequest(name=name, **kw), timeout=5).job


def close_to(got, exp, dtype, rtol, atol):
    if got.shape != exp.shape:
        return False, f"shape {got.shape} != {exp.shape}"
    if dtype in ("float16", "float32", "float64"):
        ok = np.allclose(got.astype(np.float64), exp.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)
    else:
        ok = np.array_equal(got, exp)
    if ok:
        return True, ""
    d = np.abs(got.astype(np.float64) - exp.astype(np.float64))
    return False, f"max abs err {np.nanmax(d) if d.size else 0}"


# ---- graphs built here ----

def g_add_const(dtype, shape, src, value=1.0, device="cpu"):
    """out = src + value, src a BUFFER node dict."""
    return {"device": device, "nodes": [src, {"op": "CONST", "dtype": dtype, "shape": [], "value": value},
                                        {"op": "RESHAPE", "src": [1], "arg": [1] * len(shape)},
                                        {"op": "EXPAND", "src": [2], "arg": shape},
                                        {"op": "ADD", "src": [0, 3]}], "outputs": [4]}


def g_matmul_chain(n, k, seed=1, device="cpu", distinct=False):
    """k chained n x n matmuls of random inputs: k kernels of n^3 MACs each (distinct: each scaled by its own
    constant, so the k kernels have k sources, each compiled on its own)."""
    nodes = [{"op": "BUFFER", "dtype": "float32", "shape": [n, n], "fill": {"random": seed}}]
    cur = 0
    for i in range(k):
        nodes.append({"op": "BUFFER", "dtype": "float32", "shape": [n, n], "fill": {"random": seed + i + 1}})
        w = len(nodes) - 1
        a = len(nodes)
        nodes += [{"op": "RESHAPE", "src": [cur], "arg": [n, 1, n]}, {"op": "EXPAND", "src": [a], "arg": [n, n, n]},
                  {"op": "PERMUTE", "src": [w], "arg": [1, 0]}, {"op": "RESHAPE", "src": [a + 2], "arg": [1, n, n]},
                  {"op": "EXPAND", "src": [a + 3], "arg": [n, n, n]}, {"op": "MUL", "src": [a + 1, a + 4]},
                  {"op": "REDUCE_SUM", "src": [a + 5], "axis": [2]}, {"op": "RESHAPE", "src": [a + 6], "arg": [n, n]}]
        if distinct:
            nodes += [{"op": "CONST", "dtype": "float32", "shape": [n, n], "value": 1.0 + 1.0 / (i + 2)},
                      {"op": "MUL", "src": [a + 7, a + 8]}]
        nodes.append({"op": "CONTIGUOUS", "src": [len(nodes) - 1]})
        cur = len(nodes) - 1
    return {"device": device, "nodes": nodes, "outputs": [cur]}


def g_slow_compile(x, terms, device="cpu"):
    """sum_i sin(x * a_i + b_i), `terms` of them added as a balanced tree: one wide kernel that takes cc
    seconds (300 terms: ~3 s here), within the graph's depth and per-kernel limits."""
    n = len(x)
    nodes = [{"op": "BUFFER", "dtype": "float32", "shape": [n], "data": base64.b64encode(x.tobytes()).decode()}]

    def const(v):
        nodes.extend([{"op": "CONST", "dtype": "float32", "shape": [], "value": v},
                      {"op": "RESHAPE", "src": [len(nodes)], "arg": [1]},
                      {"op": "EXPAND", "src": [len(nodes) + 1], "arg": [n]}])
        return len(nodes) - 1
    level = []
    for i in range(terms):
        a = const(1.0 + i * 1e-3)
        nodes.append({"op": "MUL", "src": [0, a]})
        b = const(i * 1e-2)
        nodes.append({"op": "ADD", "src": [len(nodes) - 4, b]})
        nodes.append({"op": "SIN", "src": [len(nodes) - 1]})
        level.append(len(nodes) - 1)
    while len(level) > 1:
        nxt = []
        for j in range(0, len(level) - 1, 2):
            nodes.append({"op": "ADD", "src": [level[j], level[j + 1]]})
            nxt.append(len(nodes) - 1)
        level = nxt + level[len(level) - len(level) % 2:]
    return {"device": device, "nodes": nodes, "outputs": [level[0]]}


def slow_compile_ref(x, terms):
    x = x.astype(np.float64)
    return sum(np.sin(x * (1.0 + i * 1e-3) + i * 1e-2) for i in range(terms))


def loaded_cpu_programs(pid):
    """The kernels a kexd's cpu device has dlopen()ed now: distinct p<N>.so files mapped (cpu.c's load names)."""
    import re
    with open(f"/proc/{pid}/maps") as f:
        return len({m.group(0) for m in re.finditer(r"/kex-cpu-[^/\s]+/p\d+\.so", f.read())})


def pbg(g):
    return graph_pb(g, g.get("device", ""))


def run_cases(kex, job, device, every=1):
    names = json.load(open(os.path.join(CASES, "INDEX.json")))
    names = [n for i, n in enumerate(names) if i % every == 0]
    npass = nfail = nskip = 0
    fails = []
    t0 = time.time()
    for name in names:
        case = json.load(open(os.path.join(CASES, name + ".json")))
        num = case.get("numeric")
        if not num:
            continue
        try:
            done = done_of(submit(kex, job, graph_pb(num["graph"], device), return_bytes=True))
        except grpc.RpcError as e:
            if device == "opencl" and e.code() == grpc.StatusCode.UNIMPLEMENTED and "float16" in (e.details() or ""):
                nskip += 1
                skip(f"{device}: {name}", f"the device refuses float16: {e.details()[:120]}")
                continue
            nfail += 1
            fails.append(f"{name}: {desc(e)[:300]}")
            continue
        ok = len(done.outputs) == len(num["expected"])
        why = "" if ok else f"{len(done.outputs)} outputs, expected {len(num['expected'])}"
        for out, exp in zip(done.outputs, num["expected"]):
            dt = NP_DTYPES[exp["dtype"]]
            e = np.frombuffer(base64.b64decode(exp["data"]), dtype=dt).reshape(exp["shape"])
            if not out.has_data or out.dtype != exp["dtype"]:
                ok, why = False, f"dtype {out.dtype} has_data {out.has_data}"
                break
            g = np.frombuffer(out.data, dtype=dt).reshape(list(out.shape))
            good, why = close_to(g, e, exp["dtype"], num.get("rtol", 1e-4), num.get("atol", 1e-5))
            ok = ok and good
            if not good:
                break
        # free the outputs: the job's memory stays small
        kex.Free(kex_pb2.FreeRequest(job=job, handles=[o.handle for o in done.outputs]), timeout=5)
        if ok:
            npass += 1
        else:
            nfail += 1
            fails.append(f"{name}: {why}")
    subset = "" if every == 1 else f" (every {every}th case: PoCL compiles take ~0.3 s a case)"
    check(f"{device}{subset}: {npass} numeric cases match tinygrad's outputs ({nskip} skipped, {time.time() - t0:.1f} s)",
          nfail == 0, "; ".join(fails[:6]))


def main():
    ch = grpc.insecure_channel(f"127.0.0.1:{PORT}", options=CHANNEL_OPTS)
    kex = kex_pb2_grpc.KexStub(ch)
    job = open_job(kex, "submit")

    # ---- the event stream ----
    x = np.arange(12, dtype=np.float32)
    g = g_add_const("float32", [12], {"op": "BUFFER", "dtype": "float32", "shape": [12],
                                      "data": base64.b64encode(x.tobytes()).decode()})
    evs = submit(kex, job, pbg(g))
    kinds = [e.WhichOneof("event") for e in evs]
    check("Submit streams accepted, scheduled, compiling, running, done", kinds[0] == "accepted" and
          kinds[1] == "scheduled" and "compiling" in kinds and "running" in kinds and kinds[-1] == "done", str(kinds))
    d = evs[-1].done
    check("done: the output's dtype, shape, inline bytes and a handle",
          d.outputs[0].dtype == "float32" and list(d.outputs[0].shape) == [12] and d.outputs[0].has_data and
          np.array_equal(np.frombuffer(d.outputs[0].data, np.float32), x + 1) and len(d.outputs[0].handle) == 32,
          str(d.outputs[0])[:200])
    check("done: per-kernel times in us", len(d.kernels) == 1 and d.kernels[0].run_us > 0, str(d.kernels))
    check("the output handle downloads the same bytes", download(kex, job, d.outputs[0].handle) == (x + 1).tobytes())
    st = stats(kex, job).job_stats[0]
    check("the output is a job buffer, counted in bytes_held", st.buffers == 1 and st.bytes_held == 48, str(st))
    d2 = done_of(submit(kex, job, pbg(g), inline_output_max_bytes=16))
    check("inline_output_max_bytes 16: a 48-byte output comes without bytes", not d2.outputs[0].has_data)
    kex.Free(kex_pb2.FreeRequest(job=job, handles=[d.outputs[0].handle, d2.outputs[0].handle]), timeout=5)

    # ---- free_outputs: the outputs come back as bytes only; nothing is left for a Free ----
    held = stats(kex, job).job_stats[0]
    evs = submit(kex, job, pbg(g), free_outputs=True, inline_output_max_bytes=16)
    kinds = [e.WhichOneof("event") for e in evs]
    d3 = evs[-1].done
    check("free_outputs: the full event stream (accepted, scheduled, running, done)",
          kinds[0] == "accepted" and kinds[1] == "scheduled" and "running" in kinds and kinds[-1] == "done", str(kinds))
    check("free_outputs: the output's bytes inline (over inline_output_max_bytes too), no handle",
          d3.outputs[0].has_data and d3.outputs[0].handle == "" and d3.outputs[0].bytes == 48 and
          list(d3.outputs[0].shape) == [12] and np.array_equal(np.frombuffer(d3.outputs[0].data, np.float32), x + 1),
          str(d3.outputs[0])[:200])
    st = stats(kex, job).job_stats[0]
    check("free_outputs: the job holds no new buffer", st.buffers == held.buffers and st.bytes_held == held.bytes_held,
          f"before {held.buffers}/{held.bytes_held}, after {st.buffers}/{st.bytes_held}")
    evs = submit(kex, job, pbg(g), only_done=True, free_outputs=True)
    kinds = [e.WhichOneof("event") for e in evs]
    check("only_done: the stream is the done event alone, with the output's bytes",
          kinds == ["done"] and evs[0].done.outputs[0].has_data and
          np.array_equal(np.frombuffer(evs[0].done.outputs[0].data, np.float32), x + 1), str(kinds))
    e = None
    try:
        submit(kex, job, pbg(g_add_const("float32", [4], {"op": "BUFFER", "dtype": "float32", "shape": [4],
                                                           "buffer": "e" * 32})), only_done=True)
    except grpc.RpcError as err:
        e = err
    check("only_done: an error is still a status (NOT_FOUND naming the node)",
          e is not None and e.code() == grpc.StatusCode.NOT_FOUND and "node 0" in e.details(), desc(e))
    # a view of the result (gathered) and a folded constant (filled) as outputs: bytes only as well
    gv = json.loads(json.dumps(g))
    gv["nodes"] += [{"op": "RESHAPE", "src": [4], "arg": [3, 4]}, {"op": "PERMUTE", "src": [5], "arg": [1, 0]},
                    {"op": "CONST", "dtype": "float32", "shape": [], "value": 2.5},
                    {"op": "RESHAPE", "src": [7], "arg": [1]}, {"op": "EXPAND", "src": [8], "arg": [5]}]
    gv["outputs"] = [6, 9]
    d4 = done_of(submit(kex, job, pbg(gv), free_outputs=True))
    check("free_outputs: a permuted view output comes gathered, without a handle",
          d4.outputs[0].handle == "" and list(d4.outputs[0].shape) == [4, 3] and
          np.array_equal(np.frombuffer(d4.outputs[0].data, np.float32).reshape(4, 3), (x + 1).reshape(3, 4).T),
          str(d4.outputs[0])[:200])
    check("free_outputs: a constant output comes filled, without a handle",
          d4.outputs[1].handle == "" and np.array_equal(np.frombuffer(d4.outputs[1].data, np.float32),
                                                        np.full(5, 2.5, np.float32)), str(d4.outputs[1])[:200])
    st = stats(kex, job).job_stats[0]
    check("free_outputs: still no new buffer after view and constant outputs",
          st.buffers == held.buffers and st.bytes_held == held.bytes_held, f"after {st.buffers}/{st.bytes_held}")
    e = None
    try:
        kex.Free(kex_pb2.FreeRequest(job=job, handles=[""]), timeout=5)
    except grpc.RpcError as err:
        e = err
    check("free_outputs: the empty handle names no buffer (Free: NOT_FOUND)",
          e is not None and e.code() == grpc.StatusCode.NOT_FOUND, desc(e))

    # ---- numbers: every numeric case ----
    run_cases(kex, job, "cpu")
    run_cases(kex, job, "opencl", 1 if os.environ.get("KEX_SUBMIT_ALL_OPENCL") else 3)

    # ---- inputs by handle ----
    a = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    h = upload(kex, job, "float32", [4, 8], a.tobytes(), device="cpu")
    d = done_of(submit(kex, job, pbg(g_add_const("float32", [4, 8], {"op": "BUFFER", "dtype": "float32",
                                                                        "shape": [4, 8], "buffer": h}, 2.0))))
    out = np.frombuffer(download(kex, job, d.outputs[0].handle), np.float32).reshape(4, 8)
    check("upload an input, submit a graph reading it by handle, download the output", np.allclose(out, a + 2))
    # ASSIGN into the job's buffer: written in place, same handle out
    gas = g_add_const("float32", [4, 8], {"op": "BUFFER", "dtype": "float32", "shape": [4, 8], "buffer": h}, 1.0)
    gas["nodes"].append({"op": "ASSIGN", "src": [4, 0]})
    gas["outputs"] = [5]
    d = done_of(submit(kex, job, pbg(gas)))
    check("ASSIGN to a job buffer writes it in place (same handle, new bytes)",
          d.outputs[0].handle == h and np.allclose(np.frombuffer(download(kex, job, h), np.float32), (a + 1).ravel()),
          str(d.outputs[0].handle))
    d = done_of(submit(kex, job, pbg(gas), free_outputs=True))
    check("free_outputs: an ASSIGN target keeps its handle and stays held (bytes inline too)",
          d.outputs[0].handle == h and d.outputs[0].has_data and
          np.allclose(np.frombuffer(d.outputs[0].data, np.float32), (a + 2).ravel()) and
          np.allclose(np.frombuffer(download(kex, job, h), np.float32), (a + 2).ravel()), str(d.outputs[0])[:200])
    e = None
    try:
        submit(kex, job, pbg(g_add_const("float32", [4, 8], {"op": "BUFFER", "dtype": "float32", "shape": [4, 8],
                                                              "buffer": "f" * 32})))
    except grpc.RpcError as err:
        e = err
    check("an unknown handle: NOT_FOUND naming the node", e is not None and e.code() == grpc.StatusCode.NOT_FOUND and
          "node 0" in e.details(), desc(e))
    e = None
    try:
        submit(kex, job, pbg(g_add_const("float32", [32], {"op": "BUFFER", "dtype": "float32", "shape": [32],
                                                          "buffer": h})))
    except grpc.RpcError as err:
        e = err
    check("a handle with another shape: INVALID_ARGUMENT", e is not None and
          e.code() == grpc.StatusCode.INVALID_ARGUMENT, desc(e))

    # ---- two jobs at once, isolated ----
    jb = open_job(kex, "other")
    e = None
    try:
        submit(kex, jb, pbg(g_add_const("float32", [4, 8], {"op": "BUFFER", "dtype": "float32", "shape": [4, 8],
                                                             "buffer": h})))
    except grpc.RpcError as err:
        e = err
    check("job B naming job A's handle: NOT_FOUND", e is not None and e.code() == grpc.StatusCode.NOT_FOUND, desc(e))
    results = {}

    def worker(j, tag, v):
        gg = g_add_const("float32", [1000], {"op": "BUFFER", "dtype": "float32", "shape": [1000],
                                             "fill": {"value": v}}, 1.0)
        r = []
        for _ in range(5):
            dd = done_of(submit(kex, j, pbg(gg)))
            r.append(np.frombuffer(dd.outputs[0].data, np.float32)[0])
        results[tag] = r
    t1 = threading.Thread(target=worker, args=(job, "a", 1.0))
    t2 = threading.Thread(target=worker, args=(jb, "b", 5.0))
    t1.start(), t2.start(), t1.join(), t2.join()
    check("two jobs submitting at once each get their own results",
          results.get("a") == [2.0] * 5 and results.get("b") == [6.0] * 5, str(results))
    sa, sb = stats(kex, job).job_stats[0], stats(kex, jb).job_stats[0]
    check("each job holds only its own outputs", sb.buffers == 5 and sa.buffers >= 5, f"{sa.buffers} {sb.buffers}")

    # ---- memory limit ----
    jl = open_job(kex, "small", memory_limit=4096)
    e = None
    try:
        submit(kex, jl, pbg(g_add_const("float32", [4096], {"op": "BUFFER", "dtype": "float32", "shape": [4096],
                                                             "fill": {"random": 1}})))
    except grpc.RpcError as err:
        e = err
    check("a submission over the job's memory limit: RESOURCE_EXHAUSTED",
          e is not None and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "memory limit" in e.details(), desc(e))
    dd = done_of(submit(kex, jb, pbg(g_add_const("float32", [8], {"op": "BUFFER", "dtype": "float32", "shape": [8],
                                                                  "fill": {"value": 1.0}}))))
    check("... while the other job keeps working", np.frombuffer(dd.outputs[0].data, np.float32)[0] == 2.0)
    sl = stats(kex, jl).job_stats[0]
    check("the refused job holds and reserves nothing", sl.bytes_held == 0 and sl.bytes_reserved == 0, str(sl))

    # ---- deadline and cancel free what they held ----
    jd = open_job(kex, "deadline")
    big = pbg(g_matmul_chain(256, 12, device="cpu", distinct=True))  # 12 compiles, then 12 kernels
    before = stats(kex)
    e = None
    t0 = time.time()
    try:
        submit(kex, jd, big, timeout=0.3)
    except grpc.RpcError as err:
        e = err
    check("a short deadline on a big graph: DEADLINE_EXCEEDED",
          e is not None and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, desc(e))

    def settled(j):
        end = time.time() + 20
        while time.time() < end:
            s = stats(kex, j).job_stats[0]
            if s.queued == 0 and s.running == 0 and s.bytes_reserved == 0:
                return s
            time.sleep(0.05)
        return stats(kex, j).job_stats[0]
    s = settled(jd)
    check("after the deadline: queued work stopped, nothing held or reserved",
          s.bytes_held == 0 and s.bytes_reserved == 0 and s.buffers == 0 and stats(kex).bytes_held ==
          before.bytes_held, str(s))
    # the 12 kernels go to the device in batches (8 for a plan that never ran: 2 batches, 4 items with setup and
    # finish); the deadline acts before the device and between batches
    check("... and the deadline stopped the work early (not all 12 kernels ran)", s.items_done < 4,
          f"{s.items_done} items ran")
    it = kex.Submit(kex_pb2.SubmitRequest(job=jd, graph=pbg(g_matmul_chain(256, 12, seed=9, device="cpu", distinct=True))),
                    timeout=60)
    first = next(it)
    it.cancel()
    e = None
    try:
        for _ in it:
            pass
    except grpc.RpcError as err:
        e = err
    s = settled(jd)
    check("cancel after accepted: CANCELLED, buffers freed (GetStats)",
          first.WhichOneof("event") == "accepted" and e is not None and e.code() == grpc.StatusCode.CANCELLED and
          s.bytes_held == 0 and s.bytes_reserved == 0 and stats(kex).bytes_held == before.bytes_held, str(s))
    after = stats(kex)
    check("failed submissions are counted", after.submissions_failed >= before.submissions_failed + 2,
          f"{before.submissions_failed} -> {after.submissions_failed}")

    # ---- a quick cached Submit's progress events wait in gRPC's buffer only on an idle device ----
    # (submit.c, sub_more: they may travel with the done event when the chain starts at once; behind another
    # job's long kernel "scheduled" must leave at once, not when the device is free)
    jq, jbusy = open_job(kex, "quick"), open_job(kex, "busy")
    tiny = pbg(g_add_const("float32", [16], {"op": "BUFFER", "dtype": "float32", "shape": [16],
                                             "fill": {"value": 1.0}}))
    for _ in range(2):  # structure and programs cached, and its kernel quick last time
        submit(kex, jq, tiny, free_outputs=True)

    # ---- batched_events: the same events, those ready together in one message ----
    plain = submit(kex, jq, tiny, free_outputs=True)
    msgs = list(kex.Submit(kex_pb2.SubmitRequest(job=jq, graph=tiny, free_outputs=True, batched_events=True),
                           timeout=60))
    flat = [e for m in msgs for e in (m, *m.following)]
    check("batched_events: the events, flattened, are the unbatched stream's (kinds and order)",
          [e.WhichOneof("event") for e in flat] == [e.WhichOneof("event") for e in plain] and
          [e.WhichOneof("event") for e in flat][:2] == ["accepted", "scheduled"] and
          flat[-1].WhichOneof("event") == "done",
          f"batched {[e.WhichOneof('event') for e in flat]}, plain {[e.WhichOneof('event') for e in plain]}")
    check("batched_events: a quick cached Submit on an idle device is one message (its events and done)",
          len(msgs) == 1 and all(not e.following for e in msgs[0].following),
          f"{len(msgs)} messages: {[[m.WhichOneof('event')] + [e.WhichOneof('event') for e in m.following] for m in msgs]}")
    check("without batched_events every message is one event",
          all(not e.following for e in plain) and len(plain) >= 4, f"{len(plain)} messages")
    out_b, out_p = flat[-1].done.outputs[0], plain[-1].done.outputs[0]
    check("batched_events: the done event's output is the same",
          out_b.has_data and out_b.data == out_p.data and not out_b.handle, "")

    gaps = {False: [], True: []}
    for attempt in range(6):
        batched = attempt % 2 == 1  # the two ways take turns behind the same kind of kernel
        # one kernel long enough to wait behind on any machine (a 1600^2 matmul, 8 GFLOP; 2048 is over the
        # element limit of one view), summed to one number so that its output stays small
        glong = g_matmul_chain(1600, 1, seed=20 + attempt)
        glong["nodes"].append({"op": "REDUCE_SUM", "src": [glong["outputs"][0]], "axis": [0, 1]})
        glong["outputs"] = [len(glong["nodes"]) - 1]
        done0 = stats(kex, jbusy).job_stats[0].items_done
        long = kex.Submit(kex_pb2.SubmitRequest(job=jbusy, graph=pbg(glong)), timeout=300)
        # behind its kernel, not its SETUP item (the random inputs take ~30 ms to make there, and a quick Submit
        # posted then runs before the kernel by fair queueing, done in ~30 ms): wait for an item of it to run
        # after SETUP is done
        end = time.time() + 120
        while time.time() < end:
            js = stats(kex, jbusy).job_stats[0]
            if js.running > 0 and js.items_done > done0:
                break
            time.sleep(0.002)
        t0 = time.time()
        seen = {}
        for msg in kex.Submit(kex_pb2.SubmitRequest(job=jq, graph=tiny, free_outputs=True, batched_events=batched),
                              timeout=300):
            for ev in (msg, *msg.following):
                seen.setdefault(ev.WhichOneof("event"), time.time() - t0)
        for _ in long:
            pass
        if "scheduled" in seen and "done" in seen:
            gaps[batched].append((seen["scheduled"], seen["done"]))
        if all(any(d > 0.05 for _, d in gaps[b]) for b in gaps):  # each waited behind a long kernel once
            break
    for batched, what in ((False, ""), (True, " (batched_events: no holding either)")):
        sched_t, done_t = max(gaps[batched], key=lambda g: g[1]) if gaps[batched] else (1.0, 0.0)
        check(f"a quick Submit behind another job's long kernel: 'scheduled' leaves at once, not with 'done'{what}",
              done_t > 0.05 and sched_t < done_t / 2, f"(scheduled s, done s) per attempt: {gaps[batched]}")

    # ---- a client that vanishes before its done event went out: its outputs do not stay held ----
    # (a kexd of its own: the done event must be larger than the stream's flow-control window, so that a client
    # that reads nothing holds it up -- 32 MB inline, over test_submit.sh's --max-message)
    pv, portv, okv = start_kexd("--device", "cpu", "--cache", os.path.join(TMP, "vanish.db"), "--max-message",
                                str(64 << 20))
    if check("a kexd with --max-message 64 MiB starts", okv):
        with grpc.insecure_channel(f"127.0.0.1:{portv}", options=CHANNEL_OPTS) as cv:
            kv = kex_pb2_grpc.KexStub(cv)
            jv = open_job(kv, "vanish")
            held0 = stats(kv, jv).job_stats[0]
            nv = 8 << 20  # 32 MB, inline in the done event
            child = (
                "import os, signal, sys\n"
                "sys.path.insert(0, os.environ['KEX_STUBS'])\n"
                "import grpc\n"
                "from kex.v1 import kex_pb2, kex_pb2_grpc\n"
                "g = kex_pb2.Graph.FromString(sys.stdin.buffer.read())\n"
                "ch = grpc.insecure_channel('127.0.0.1:' + sys.argv[1], "
                "options=[('grpc.max_receive_message_length', -1)])\n"
                "it = kex_pb2_grpc.KexStub(ch).Submit(kex_pb2.SubmitRequest(job=sys.argv[2], graph=g, "
                "inline_output_max_bytes=64 << 20), timeout=120)\n"
                "next(it)\n"
                "os.kill(os.getpid(), signal.SIGSTOP)  # alive, reading nothing: the done event cannot go out\n"
                "for _ in it: pass\n")
            gvan = pbg(g_add_const("float32", [nv], {"op": "BUFFER", "dtype": "float32", "shape": [nv],
                                                     "fill": {"value": 1.0}}))
            cp = subprocess.Popen([sys.executable, "-c", child, str(portv), jv], stdin=subprocess.PIPE)
            cp.stdin.write(gvan.SerializeToString())
            cp.stdin.close()
            _, wst = os.waitpid(cp.pid, os.WUNTRACED)
            stopped = os.WIFSTOPPED(wst)
            end = time.time() + 60
            while time.time() < end:  # the submission ran and recorded its output; its done event is stuck
                sv = stats(kv, jv).job_stats[0]
                if sv.bytes_held > held0.bytes_held and sv.queued == 0 and sv.running == 0:
                    break
                time.sleep(0.05)
            during = stats(kv, jv).job_stats[0].bytes_held
            os.kill(cp.pid, signal.SIGKILL)
            cp.wait()
            end = time.time() + 15
            while time.time() < end:
                sv = stats(kv, jv).job_stats[0]
                if sv.bytes_held == held0.bytes_held:
                    break
                time.sleep(0.05)
            check("a client stopped before its done event went out, then killed (SIGKILL): the job's held bytes "
                  "return to what they were", stopped and during == held0.bytes_held + 4 * nv and
                  sv.bytes_held == held0.bytes_held and sv.buffers == held0.buffers,
                  f"stopped {stopped}, held {held0.bytes_held} -> {during} -> {sv.bytes_held}")
            d = done_of(submit(kv, jv, gvan, inline_output_max_bytes=64 << 20))
            sv = stats(kv, jv).job_stats[0]
            check("... while a client that reads its done event keeps its output (a handle, held)",
                  len(d.outputs[0].handle) == 32 and len(d.outputs[0].data) == 4 * nv and
                  sv.bytes_held == held0.bytes_held + 4 * nv, f"held {sv.bytes_held}")
        check("the --max-message 64 MiB kexd exits 0 at SIGTERM", stop(pv) == 0)

    # ---- compile slots: a small graph does not wait behind another job's huge compile ----
    ja, jb2 = open_job(kex, "huge-compile"), open_job(kex, "small")
    slow_terms = 300
    xa = np.linspace(-1, 1, 16, dtype=np.float32)
    order, lock, a_started = [], threading.Lock(), threading.Event()
    a_out = {}

    def huge():
        try:
            for ev in kex.Submit(kex_pb2.SubmitRequest(job=ja, graph=pbg(g_slow_compile(xa, slow_terms))),
                                  timeout=300):
                if ev.WhichOneof("event") == "compiling":
                    a_started.set()
                if ev.WhichOneof("event") == "done":
                    a_out["done"] = ev.done
        except grpc.RpcError as err:
            a_out["error"] = desc(err)
        a_started.set()
        with lock:
            order.append("A")
    ta = threading.Thread(target=huge)
    ta.start()
    a_started.wait(120)
    xb = np.arange(40, dtype=np.float32)
    try:
        db = done_of(submit(kex, jb2, pbg(g_add_const("float32", [40], {
            "op": "BUFFER", "dtype": "float32", "shape": [40], "data": base64.b64encode(xb.tobytes()).decode()}, 0.25))))
        b_ok = np.array_equal(np.frombuffer(db.outputs[0].data, np.float32), xb + 0.25)
    except grpc.RpcError as err:
        b_ok = desc(err)
    with lock:
        order.append("B")
    ta.join()
    da = a_out.get("done")
    a_ok = da is not None and da.programs_compiled == 1 and np.allclose(
        np.frombuffer(da.outputs[0].data, np.float32), slow_compile_ref(xa, slow_terms), rtol=1e-3, atol=1e-3)
    check("job B's small Submit, sent while job A's one huge kernel compiles, finishes first (both right)",
          order == ["B", "A"] and b_ok is True and a_ok, f"order {order}, B {b_ok}, A {a_out.get('error', '')}"
          f"{'' if da is None else f'compile {da.kernels[0].compile_us / 1e6:.1f} s'}")

    # ---- the structure cache ----
    s0 = stats(kex)
    gs = g_add_const("float32", [64], {"op": "BUFFER", "dtype": "float32", "shape": [64], "fill": {"random": 5}})
    ev1 = submit(kex, job, pbg(gs))
    gs["nodes"][0]["fill"] = {"random": 6}  # same structure, other data
    ev2 = submit(kex, job, pbg(gs))
    s1 = stats(kex)
    check("a repeated structure (other data) hits the structure cache",
          ev2[0].accepted.schedule_cached and ev2[-1].done.schedule_cached and
          s1.schedule_cache_hits == s0.schedule_cache_hits + 1, f"{s0.schedule_cache_hits} -> {s1.schedule_cache_hits}")
    check("... and its programs come from memory, not compiled again",
          ev2[-1].done.programs_memory == 1 and ev2[-1].done.programs_compiled == 0 and
          s1.program_cache_memory_hits > s0.program_cache_memory_hits, str(ev2[-1].done)[-200:])
    o1 = np.frombuffer(ev1[-1].done.outputs[0].data, np.float32)
    o2 = np.frombuffer(ev2[-1].done.outputs[0].data, np.float32)
    check("... with the new data's result", not np.array_equal(o1, o2) and o2.min() >= 1.0)
    gs["nodes"][1]["value"] = 3.0  # a constant is structure: a miss
    ev3 = submit(kex, job, pbg(gs))
    check("a different constant is another structure (a miss)", not ev3[0].accepted.schedule_cached)
    print(f"# structure cache: Submit p50 miss(render+cached program) vs hit: see bench; "
          f"hit total_us {ev2[-1].done.total_us:.0f}, miss {ev1[-1].done.total_us:.0f}")

    # ---- the program cache in SQLite: a restarted kexd does not compile again ----
    own_cache = os.path.join(TMP, "restart.db")
    gr = pbg(g_add_const("float32", [33], {"op": "BUFFER", "dtype": "float32", "shape": [33],
                                           "fill": {"random": 2}}, 7.0))
    p1, port1, ok1 = start_kexd("--device", "cpu", "--cache", own_cache)
    t_first = t_after = None
    if check("a second kexd with its own --cache starts", ok1):
        with grpc.insecure_channel(f"127.0.0.1:{port1}") as c1:
            k1 = kex_pb2_grpc.KexStub(c1)
            j1 = open_job(k1, "r")
            d1 = done_of(submit(k1, j1, gr))
            check("first Submit compiles (a miss) and stores the program", d1.programs_compiled == 1 and
                  stats(k1).program_cache_misses == 1, str(d1)[-160:])
            t_first = d1.total_us
        check("it stops cleanly at SIGTERM", stop(p1) == 0)
    p2, port2, ok2 = start_kexd("--device", "cpu", "--cache", own_cache)
    if check("restarted with the same --cache", ok2):
        with grpc.insecure_channel(f"127.0.0.1:{port2}") as c2:
            k2 = kex_pb2_grpc.KexStub(c2)
            j2 = open_job(k2, "r")
            d2 = done_of(submit(k2, j2, gr))
            s2 = stats(k2)
            check("after the restart the program comes from SQLite (no compile)",
                  d2.programs_sqlite == 1 and d2.programs_compiled == 0 and s2.program_cache_sqlite_hits == 1 and
                  s2.program_cache_misses == 0, str(s2)[-300:])
            t_after = d2.total_us
        stop(p2)
    if t_first and t_after:
        print(f"# program cache: first Submit {t_first:.0f} us, after restart (SQLite) {t_after:.0f} us")

    # ---- a compile failure is INTERNAL with the message; kexd keeps serving ----
    p3, port3, ok3 = start_kexd("--device", "cpu", "--cache", "", "--test-fault", "compile:1")
    if check("kexd --test-fault compile:1 starts", ok3):
        with grpc.insecure_channel(f"127.0.0.1:{port3}") as c3:
            k3 = kex_pb2_grpc.KexStub(c3)
            j3 = open_job(k3, "f")
            e = None
            try:
                submit(k3, j3, gr)
            except grpc.RpcError as err:
                e = err
            check("a compile failure: INTERNAL naming the kernel and the failure",
                  e is not None and e.code() == grpc.StatusCode.INTERNAL and "compil" in e.details() and
                  "injected failure" in e.details(), desc(e))
            s3 = stats(k3, j3).job_stats[0]
            check("... nothing held or reserved after it", s3.bytes_held == 0 and s3.bytes_reserved == 0, str(s3))
            d3 = done_of(submit(k3, j3, gr))
            check("... and the next Submit works", len(d3.outputs) == 1)
        check("the faulted kexd exits 0 at SIGTERM", stop(p3) == 0)

    # ---- loaded programs are bounded: LRU past KEX_MAX_PROGRAMS, reloaded from SQLite ----
    p4, port4, ok4 = start_kexd("--device", "cpu", "--cache", os.path.join(TMP, "lru.db"), env={"KEX_MAX_PROGRAMS": "4"})
    if check("a kexd with KEX_MAX_PROGRAMS=4 starts", ok4):
        with grpc.insecure_channel(f"127.0.0.1:{port4}") as c4:
            k4 = kex_pb2_grpc.KexStub(c4)
            j4 = open_job(k4, "lru")
            x4 = np.arange(33, dtype=np.float32)

            def g4(i):  # another constant, another kernel source
                return pbg(g_add_const("float32", [33], {"op": "BUFFER", "dtype": "float32", "shape": [33], "data":
                                                        base64.b64encode(x4.tobytes()).decode()}, 100.0 + i))
            right, compiled = True, 0
            for i in range(10):
                d4 = done_of(submit(k4, j4, g4(i), free_outputs=True))
                right = right and np.array_equal(np.frombuffer(d4.outputs[0].data, np.float32), x4 + 100 + i)
                compiled += d4.programs_compiled
            check("10 distinct kernels: every result right, each compiled once", right and compiled == 10,
                  f"{compiled} compiled")
            end, n4 = time.time() + 10, -1
            while time.time() < end:  # unloading is an item on the device runner: it may trail the done event
                n4 = loaded_cpu_programs(p4.pid)
                if n4 <= 4:
                    break
                time.sleep(0.05)
            check("... and kexd has 4 programs (.so files) mapped, not 10", n4 == 4, f"{n4} mapped")
            d_last = done_of(submit(k4, j4, g4(9), free_outputs=True))
            check("the most recent kernel is still loaded (a memory hit)",
                  d_last.programs_memory == 1 and d_last.programs_sqlite == 0 and d_last.programs_compiled == 0,
                  str(d_last)[-200:])
            d_first = done_of(submit(k4, j4, g4(0), free_outputs=True))
            check("the first kernel again: right, and loaded again from SQLite (it was unloaded)",
                  np.array_equal(np.frombuffer(d_first.outputs[0].data, np.float32), x4 + 100) and
                  d_first.programs_sqlite == 1 and d_first.programs_memory == 0 and d_first.programs_compiled == 0,
                  str(d_first)[-200:])
            end = time.time() + 10
            while time.time() < end and loaded_cpu_programs(p4.pid) > 4:
                time.sleep(0.05)
            n4 = loaded_cpu_programs(p4.pid)
            check("... and still 4 programs mapped", n4 == 4, f"{n4} mapped")
        check("the KEX_MAX_PROGRAMS=4 kexd exits 0 at SIGTERM", stop(p4) == 0)

    # ---- a kernel over the kernel time limit fails the submission; kexd keeps serving ----
    p5, port5, ok5 = start_kexd("--device", "cpu", "--cache", os.path.join(TMP, "limit.db"),
                                env={"KEX_KERNEL_TIME_LIMIT": "0.1"})
    if check("a kexd with KEX_KERNEL_TIME_LIMIT=0.1 starts", ok5):
        with grpc.insecure_channel(f"127.0.0.1:{port5}") as c5:
            k5 = kex_pb2_grpc.KexStub(c5)
            j5 = open_job(k5, "limit")
            e = None
            t0 = time.time()
            try:  # a 1600^3 matmul: 4.1e9 multiply-adds, seconds on any CPU kexd may run on
                submit(k5, j5, pbg(g_matmul_chain(1600, 1)), timeout=120)
            except grpc.RpcError as err:
                e = err
            took = time.time() - t0
            check("a kernel running past the limit: DEADLINE_EXCEEDED naming the kernel and the limit",
                  e is not None and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and
                  "kernel time limit of 0.1 s" in e.details() and "kernel r_" in e.details(), desc(e))
            print(f"# kernel time limit: the long kernel failed after {took:.2f} s")
            s5 = stats(k5, j5).job_stats[0]
            check("... nothing held or reserved after it", s5.bytes_held == 0 and s5.bytes_reserved == 0, str(s5))
            d5 = done_of(submit(k5, j5, pbg(g_add_const("float32", [8], {"op": "BUFFER", "dtype": "float32",
                                                                          "shape": [8], "fill": {"value": 1.0}})),
                                free_outputs=True))
            check("... and the next Submit (a short kernel) works",
                  np.array_equal(np.frombuffer(d5.outputs[0].data, np.float32), np.full(8, 2, np.float32)))
        check("the KEX_KERNEL_TIME_LIMIT kexd exits 0 at SIGTERM", stop(p5) == 0)

    # ---- counters ----
    sf = stats(kex)
    check("GetStats counts submissions done and failed, cache hits and misses",
          sf.submissions_done > 100 and sf.submissions_failed >= 4 and sf.schedule_cache_misses > 50 and
          sf.program_cache_misses > 50, str(sf)[-400:])
    bad = []
    for f in sorted(os.listdir(TMP)):
        if f.startswith("kexd-") and f.endswith(".log"):
            text = open(os.path.join(TMP, f)).read()
            if any(w in text for w in ("AddressSanitizer", "runtime error", "Segmentation", "Aborted")):
                bad.append(f)
    check("the extra kexds' logs are free of sanitizer reports and crashes", not bad, ", ".join(bad))
    ch.close()


if __name__ == "__main__":
    kexdtest.run(main, "test_submit.py")
