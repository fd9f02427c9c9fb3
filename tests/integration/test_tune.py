"""test_tune.py - Tune and the beam-cache RPCs in a real kexd.

Run by test_tune.sh, which starts the kexd under test (--device cpu,opencl,
--cache KEXD_CACHE) and passes, in the environment: KEXD (the binary),
KEXD_PORT, KEXD_CACHE, KEXD_TMP (a scratch directory), KEX_STUBS (the
generated kex_pb2*.py and health_pb2*.py).  The kill -9, shared-file,
drain, attack (nothing imported ever runs; imported opts are checked at use)
and new-file race (two kexds creating one cache file at once) checks start
their own kexds.  Prints one line per check ("ok - ..." /
"FAIL - ..." / "skip - ...") and, last, "N passed, N failed".  Exit status 1
when anything failed.

Graphs are tiny (16x16 reductions) and searches narrow (beam 1, one check
with beam 2), so the whole file runs in about a minute on a 2-core VM.
"""
import base64
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.environ["KEX_STUBS"])

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from kex.v1 import kex_pb2, kex_pb2_grpc  # noqa: E402
import kexdtest  # noqa: E402
from kexdtest import check, desc, launch, sigterm, skip, stop, wait_healthy  # noqa: E402

KEXD = os.environ["KEXD"]
PORT = int(os.environ["KEXD_PORT"])
CACHE = os.environ["KEXD_CACHE"]
TMP = os.environ["KEXD_TMP"]


def code_of(fn):
    """The status code fn() raised (None when it did not), and the error."""
    try:
        fn()
    except grpc.RpcError as e:
        return e.code(), e
    return None, None


def start_kexd(*args):
    return kexdtest.start_kexd(KEXD, TMP, *args)


def own_kexd(what, path, *args):
    """A kexd of a check's own (device cpu, the cache file path, args): (proc, port, channel, stub) once it answers
    health; else None, after one failed check WHAT."""
    proc, port, up = start_kexd("--device", "cpu", "--cache", path, *args)
    if not check(what, up):
        stop(proc)
        return None
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    return proc, port, ch, kex_pb2_grpc.KexStub(ch)


# ---- graphs ----

def N(**kw):
    return kex_pb2.Node(**kw)


def g_rowsum(n=16, device="cpu", fill="arange"):
    """sum(x, axis=1) of an n x n float32 buffer: one reduce kernel."""
    src = N(op="BUFFER", dtype="float32", shape=[n, n], fill_arange=True) if fill == "arange" else \
        N(op="BUFFER", dtype="float32", shape=[n, n], fill_value=kex_pb2.Scalar(float_value=1.0))
    return kex_pb2.Graph(device=device, nodes=[src, N(op="REDUCE_SUM", src=[0], axis=[1]), N(op="CONTIGUOUS", src=[1])],
                         outputs=[2])


def g_rowsum_sq(n=16, device="cpu"):
    """(sum(x, axis=1))^2: a reduce kernel, then an elementwise one."""
    return kex_pb2.Graph(device=device, nodes=[N(op="BUFFER", dtype="float32", shape=[n, n], fill_random=3),
                                               N(op="REDUCE_SUM", src=[0], axis=[1]), N(op="CONTIGUOUS", src=[1]),
                                               N(op="MUL", src=[2, 2])], outputs=[3])


def g_matmul(n=32, device="cpu", seed=1):
    """an n x n matmul: a kernel with a wide search space (slow to search)."""
    nodes = [N(op="BUFFER", dtype="float32", shape=[n, n], fill_random=seed),
             N(op="BUFFER", dtype="float32", shape=[n, n], fill_random=seed + 1)]
    nodes += [N(op="RESHAPE", src=[0], new_shape=kex_pb2.Ints(values=[n, 1, n])),
              N(op="EXPAND", src=[2], new_shape=kex_pb2.Ints(values=[n, n, n])),
              N(op="PERMUTE", src=[1], order=kex_pb2.Ints(values=[1, 0])),
              N(op="RESHAPE", src=[4], new_shape=kex_pb2.Ints(values=[1, n, n])),
              N(op="EXPAND", src=[5], new_shape=kex_pb2.Ints(values=[n, n, n])),
              N(op="MUL", src=[3, 6]), N(op="REDUCE_SUM", src=[7], axis=[2]),
              N(op="RESHAPE", src=[8], new_shape=kex_pb2.Ints(values=[n, n])), N(op="CONTIGUOUS", src=[9])]
    return kex_pb2.Graph(device=device, nodes=nodes, outputs=[10])


def g_add(n=16, device="cpu"):
    """arange(n) + 2: one elementwise kernel (a+b)."""
    return kex_pb2.Graph(device=device, nodes=[N(op="BUFFER", dtype="float32", shape=[n], fill_arange=True),
                                               N(op="BUFFER", dtype="float32", shape=[n],
                                                 fill_value=kex_pb2.Scalar(float_value=2.0)),
                                               N(op="ADD", src=[0, 1])], outputs=[2])


def submit_out(kex, job, graph, beam=0, timeout=60):
    """(the first output as float32, or None; the events) of a Submit with return_bytes."""
    req = kex_pb2.SubmitRequest(job=job, graph=graph, return_bytes=True)
    if beam:
        req.beam.beam_width = beam
    evs = list(kex.Submit(req, timeout=timeout))
    done = evs[-1].done if evs and evs[-1].WhichOneof("event") == "done" else None
    return (np.frombuffer(done.outputs[0].data, dtype=np.float32) if done else None), evs


def tune(kex, job, graph, width=1, timeout=120, **kw):
    """(events, wall seconds) of a Tune; raises grpc.RpcError on an error status."""
    t0 = time.time()
    evs = list(kex.Tune(kex_pb2.TuneRequest(job=job, graph=graph, beam=kex_pb2.BeamOptions(beam_width=width, **kw)),
                        timeout=timeout))
    return evs, time.time() - t0


def finished(evs):
    return [e for e in evs if e.finished]


def stats(kex, job=""):
    return kex.GetStats(kex_pb2.GetStatsRequest(job=job), timeout=5)


def open_job(kex, name):
    return kex.OpenJob(kex_pb2.OpenJobRequest(name=name), timeout=5).job


def list_all(kex, job, limit=0, **filt):
    out, token, pages = [], "", 0
    while True:
        r = kex.ListCache(kex_pb2.ListCacheRequest(job=job, filter=kex_pb2.CacheFilter(**filt), limit=limit,
                                                   page_token=token), timeout=10)
        out += list(r.entries)
        pages += 1
        token = r.next_page_token
        if not token or pages > 1000:
            return out, pages


def export(kex, job, **filt):
    chunks = list(kex.ExportCache(kex_pb2.ExportCacheRequest(job=job, filter=kex_pb2.CacheFilter(**filt)), timeout=30))
    return b"".join(c.data for c in chunks), chunks


def import_(kex, job, data, chunk=700):
    def reqs():
        yield kex_pb2.ImportCacheRequest(job=job)
        for i in range(0, len(data), chunk):
            yield kex_pb2.ImportCacheRequest(data=data[i:i + chunk])
    return kex.ImportCache(reqs(), timeout=30)


def entry_id(e):
    return (e.key, e.device, e.search_opts, e.codegen)


# ---- the checks ----

def check_tune_stream(kex, job):
    """Tune streams progress, then one finished event per kernel, then OK; a repeat is all cache."""
    g = g_rowsum_sq()
    evs, wall = tune(kex, job, g)
    fin = finished(evs)
    n = evs[-1].n if evs else 0
    check("Tune: the stream ends with the finished event of kernel n/n", evs and evs[-1].finished and
          evs[-1].i == n and n == 2, [(e.i, e.n, e.finished, e.phase) for e in evs])
    check("Tune: one finished event per kernel, in order", [e.i for e in fin] == list(range(1, n + 1)),
          [e.i for e in fin])
    order_ok = all(evs[k].i <= evs[k + 1].i for k in range(len(evs) - 1)) and \
        all(not (e.finished is False and any(f.i == e.i and evs.index(f) < evs.index(e) for f in fin)) for e in evs)
    check("Tune: progress events of a kernel come before its finished event", order_ok)
    prog = [e for e in evs if not e.finished]
    check("Tune: a fresh search streams progress (phase, candidates, best so far)",
          len(prog) >= 1 and all(e.phase in ("hand", "search", "compare", "done", "cache") for e in prog) and
          any(e.phase == "search" and e.compiled > 0 for e in prog),
          [(e.phase, e.round, e.compiled, e.timed, round(e.best_us, 2)) for e in prog])
    check("Tune: progress is throttled (at most ~10 events/s plus one per kernel)",
          len(prog) <= 10 * wall + 2 * n + 2, f"{len(prog)} progress events in {wall:.2f} s")
    ok = True
    why = ""
    for e in fin:
        en = e.entry
        good = (len(en.key) == 64 and en.identity.kind == "cpu" and en.device.startswith("kind=cpu;") and
                "beam=1;" in en.search_opts and en.codegen and en.kernel_name and en.best_us > 0 and
                en.baseline_us > 0 and not e.from_cache and en.candidates > 0 and en.created_unix > 0 and e.kernel)
        if not good:
            ok, why = False, str(e)
    check("Tune: finished events carry the cache entry (key, identity, search options, opts, times)", ok, why)
    evs2, wall2 = tune(kex, job, g)
    fin2 = finished(evs2)
    check("Tune again: every kernel comes from the cache, nothing compiled",
          len(fin2) == n and all(e.from_cache and e.compiled == 0 and e.timed == 0 for e in fin2),
          [(e.i, e.from_cache, e.compiled) for e in fin2])
    check("Tune again: the same entries (key, opts, kernel name)",
          [(e.entry.key, list(e.entry.opts), e.entry.kernel_name) for e in fin2] ==
          [(e.entry.key, list(e.entry.opts), e.entry.kernel_name) for e in fin])
    # what the cached Tune costs against the search is a timing target: bench/beam.c's (cache_hit_ms), not a check
    print(f"# Tune rowsum_sq beam 1 cpu: first {wall:.3f} s, cached {wall2 * 1e3:.1f} ms")
    return fin


def check_opencl(kex, job):
    g = g_rowsum(device="opencl")
    try:
        evs, wall = tune(kex, job, g)
    except grpc.RpcError as e:
        if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL) and "opencl" in (e.details() or "").lower():
            skip("Tune on opencl", f"no OpenCL device: {e.details()[:160]}")
            return
        check("Tune on opencl", False, desc(e))
        return
    fin = finished(evs)
    check("Tune on opencl: one finished kernel with an opencl identity",
          len(fin) == 1 and fin[0].entry.identity.kind.startswith("opencl") and not fin[0].from_cache,
          [str(e.entry.identity) for e in fin])
    evs2, wall2 = tune(kex, job, g)
    check("Tune on opencl again: from the cache", [e.from_cache for e in finished(evs2)] == [True])
    print(f"# Tune rowsum beam 1 opencl: first {wall:.3f} s, cached {wall2 * 1e3:.1f} ms")


def check_list_get(kex, job):
    every, pages = list_all(kex, job)
    check("ListCache: lists what Tune stored", len(every) >= 3, len(every))
    paged, npages = list_all(kex, job, limit=1)
    check("ListCache: limit 1 pages through the same entries in the same order",
          [entry_id(e) for e in paged] == [entry_id(e) for e in every] and npages == len(every),
          f"{npages} pages for {len(every)}")
    cpu, _ = list_all(kex, job, device="kind=cpu;")
    check("ListCache filter device: only that device's entries",
          cpu and all(e.identity.kind == "cpu" for e in cpu) and len(cpu) < len(every), [e.device for e in every])
    name = every[0].kernel_name
    byname, _ = list_all(kex, job, kernel_name=name)
    check("ListCache filter kernel_name", byname and all(name in e.kernel_name for e in byname))
    key = every[-1].key
    bykey, _ = list_all(kex, job, key_prefix=key[:10].upper())
    check("ListCache filter key_prefix (either case)", bykey and all(e.key.startswith(key[:10]) for e in bykey))
    fresh, _ = list_all(kex, job, max_age_s=3600)
    check("ListCache filter max_age_s keeps fresh entries", len(fresh) == len(every))
    c, e = code_of(lambda: kex.ListCache(kex_pb2.ListCacheRequest(job=job, limit=1001), timeout=5))
    check("ListCache limit 1001: INVALID_ARGUMENT", c == grpc.StatusCode.INVALID_ARGUMENT, desc(e))
    r = kex.ListCache(kex_pb2.ListCacheRequest(job=job, limit=1000), timeout=5)
    check("ListCache limit 1000: accepted, no next page", len(r.entries) == len(every) and r.next_page_token == "")
    c, e = code_of(lambda: kex.ListCache(kex_pb2.ListCacheRequest(job=job, page_token="garbage"), timeout=5))
    check("ListCache bad page_token: INVALID_ARGUMENT", c == grpc.StatusCode.INVALID_ARGUMENT, desc(e))
    tok = kex.ListCache(kex_pb2.ListCacheRequest(job=job, limit=1), timeout=5).next_page_token
    c, e = code_of(lambda: kex.ListCache(kex_pb2.ListCacheRequest(job=job, limit=1, page_token=tok,
                                                                  filter=kex_pb2.CacheFilter(kernel_name="E")),
                                         timeout=5))
    check("ListCache page_token of another filter: INVALID_ARGUMENT", c == grpc.StatusCode.INVALID_ARGUMENT, desc(e))
    c, e = code_of(lambda: kex.ListCache(kex_pb2.ListCacheRequest(job=job, filter=kex_pb2.CacheFilter(
        key_prefix="xyz")), timeout=5))
    check("ListCache key_prefix not hex: INVALID_ARGUMENT", c == grpc.StatusCode.INVALID_ARGUMENT, desc(e))
    # GetCacheEntry
    ent = cpu[0]
    g = kex.GetCacheEntry(kex_pb2.GetCacheEntryRequest(job=job, key=ent.key, device=ent.device), timeout=10)
    check("GetCacheEntry: ast_text is the canonical text the key hashes",
          g.ast_text.startswith("kex.ast.v1\n") and hashlib.sha256(g.ast_text.encode()).hexdigest() == ent.key,
          g.ast_text[:80])
    check("GetCacheEntry: source is the kernel rendered with the entry's opts (this kexd rendered it)",
          g.kernel_name in g.source and "void" in g.source, g.source[:200])
    check("GetCacheEntry: the entry's fields match ListCache's",
          (g.key, g.device, list(g.opts), g.kernel_name, g.search_opts) ==
          (ent.key, ent.device, list(ent.opts), ent.kernel_name, ent.search_opts))
    g2 = kex.GetCacheEntry(kex_pb2.GetCacheEntryRequest(job=job, key=ent.key), timeout=10)
    check("GetCacheEntry without device: the newest entry for the key", g2.key == ent.key)
    c, e = code_of(lambda: kex.GetCacheEntry(kex_pb2.GetCacheEntryRequest(job=job, key="0" * 64), timeout=5))
    check("GetCacheEntry unknown key: NOT_FOUND", c == grpc.StatusCode.NOT_FOUND, desc(e))
    c, e = code_of(lambda: kex.GetCacheEntry(kex_pb2.GetCacheEntryRequest(job=job, key="abc"), timeout=5))
    check("GetCacheEntry malformed key: INVALID_ARGUMENT", c == grpc.StatusCode.INVALID_ARGUMENT, desc(e))
    return every


def check_export_import(kex, job, every):
    data, chunks = export(kex, job)
    lines = data.decode().splitlines()
    beams = [json.loads(ln) for ln in lines[1:] if json.loads(ln)["type"] == "beam"]
    check("ExportCache: the export file (header, a line per entry), last chunk counts the entries",
          json.loads(lines[0])["format"] == "kex.cache.export.v1" and len(beams) == len(every) and
          chunks[-1].entries == len(lines) - 1 and all(len(c.data) <= (1 << 20) for c in chunks),
          f"{len(beams)} beam lines, {len(every)} entries, last chunk entries {chunks[-1].entries}")
    r = kex.DeleteCache(kex_pb2.DeleteCacheRequest(job=job), timeout=10)
    left, _ = list_all(kex, job)
    check("DeleteCache: every beam entry deleted", r.deleted == len(every) and not left, f"{r.deleted} deleted")
    r = import_(kex, job, data)
    back, _ = list_all(kex, job)
    check("ImportCache: every line imported, nothing rejected", r.imported == len(lines) - 1 and r.rejected == 0,
          str(r))
    check("Export -> Delete -> Import round-trips the entries",
          [(entry_id(e), list(e.opts), e.kernel_name, e.best_us, e.created_unix) for e in back] ==
          [(entry_id(e), list(e.opts), e.kernel_name, e.best_us, e.created_unix) for e in every])
    # bad imports
    c, e = code_of(lambda: import_(kex, job, b'{"format":"something.else"}\n'))
    check("ImportCache with a wrong header: INVALID_ARGUMENT", c == grpc.StatusCode.INVALID_ARGUMENT, desc(e))
    bad = dict(beams[0], ast_key="zz")
    mixed = (lines[0] + "\n" + json.dumps(beams[0]) + "\n" + json.dumps(bad) + "\n").encode()
    r = import_(kex, job, mixed)
    check("ImportCache with one bad line: OK, 1 imported, 1 rejected, the line named",
          r.imported == 1 and r.rejected == 1 and any("line 3" in x for x in r.errors), str(r))
    c, e = code_of(lambda: kex.ImportCache(iter([kex_pb2.ImportCacheRequest(job="nope", data=data)]), timeout=5))
    check("ImportCache with an unknown job: NOT_FOUND", c == grpc.StatusCode.NOT_FOUND, desc(e))
    return lines[0], beams


def check_foreign_identity(kex, job, header, beams):
    """An entry for another device is stored under that identity, never used here."""
    g = g_rowsum()
    fin = finished(tune(kex, job, g)[0])
    key = fin[0].entry.key
    mine = [b for b in beams if b["ast_key"] == key and "beam=1;" in b["search_opts"]]
    if not mine:  # the rowsum kernel was tuned just now: export it
        data, _ = export(kex, job, key_prefix=key)
        mine = [json.loads(ln) for ln in data.decode().splitlines()[1:]]
    foreign = json.loads(json.dumps(mine[0]))
    foreign["device"]["name"] = "Some Other Machine 9000"
    foreign["created_at"] = 1000000000  # 2001: also checks max_age_s
    r = import_(kex, job, (header + "\n" + json.dumps(foreign) + "\n").encode())
    check("ImportCache: an entry for another device identity is accepted", r.imported == 1, str(r))
    other, _ = list_all(kex, job, device="Some Other Machine 9000")
    check("ListCache: the imported entry is listed under its own identity",
          len(other) == 1 and other[0].identity.name == "Some Other Machine 9000" and other[0].key == key)
    old, _ = list_all(kex, job, max_age_s=3600, key_prefix=key)
    check("ListCache max_age_s leaves out the 2001 entry", all(e.identity.name != "Some Other Machine 9000" for e in old)
          and len(old) >= 1)
    g3 = kex.GetCacheEntry(kex_pb2.GetCacheEntryRequest(job=job, key=key, device=other[0].device), timeout=5)
    g4 = kex.GetCacheEntry(kex_pb2.GetCacheEntryRequest(job=job, key=key, device=fin[0].entry.device), timeout=5)
    check("GetCacheEntry of the imported entry: ast_text kept; the source of its kind (cpu) and opts, as rendered here",
          g3.ast_text == g4.ast_text and g3.source and g3.source == g4.source, g3.source[:80])
    dev = fin[0].entry.device
    d = kex.DeleteCache(kex_pb2.DeleteCacheRequest(job=job, filter=kex_pb2.CacheFilter(key_prefix=key, device=dev)),
                        timeout=5)
    check("DeleteCache with filters deletes only this device's entries for the key", d.deleted >= 1 and
          len(list_all(kex, job, device="Some Other Machine 9000")[0]) == 1, d.deleted)
    s0 = stats(kex)
    fin2 = finished(tune(kex, job, g)[0])
    s1 = stats(kex)
    check("Tune after the foreign import searches again for this device (the foreign entry is never used)",
          [e.from_cache for e in fin2] == [False] and s1.searches_run == s0.searches_run + 1,
          f"{[e.from_cache for e in fin2]} searches {s0.searches_run}->{s1.searches_run}")
    return fin2[0]


def check_width_and_submit(kex, job, rowsum_entry):
    # Submit with beam 1 uses the cached opts: import crafted opts for this key, device and width
    data, _ = export(kex, job, key_prefix=rowsum_entry.entry.key, device=rowsum_entry.entry.device)
    lines = data.decode().splitlines()
    b1 = [json.loads(ln) for ln in lines[1:] if "beam=1;" in json.loads(ln)["search_opts"]]
    if not check("the beam 1 entry of the rowsum kernel exports", len(b1) == 1, len(b1)):
        return
    crafted = dict(b1[0], opts="UPCAST(0,8) UNROLL(0,2)", kernel_name="crafted")  # neither is a beam action
    r = import_(kex, job, (lines[0] + "\n" + json.dumps(crafted) + "\n").encode())
    check("ImportCache replaces the entry with crafted opts", r.imported == 1, str(r))
    g0 = kex.GetCacheEntry(kex_pb2.GetCacheEntryRequest(job=job, key=rowsum_entry.entry.key,
                                                        device=rowsum_entry.entry.device), timeout=5)
    check("GetCacheEntry of opts this kexd never rendered: source is empty, ast_text is not",
          g0.source == "" and g0.ast_text and list(g0.opts) == ["UPCAST(0,8)", "UNROLL(0,2)"], g0.source[:80])
    s0 = stats(kex)
    evs = list(kex.Submit(kex_pb2.SubmitRequest(job=job, graph=g_rowsum(fill="value"), return_bytes=True,
                                                beam=kex_pb2.BeamOptions(beam_width=1)), timeout=60))
    s1 = stats(kex)
    names = list(evs[1].scheduled.kernels) if len(evs) > 1 else []
    got = kex.GetCacheEntry(kex_pb2.GetCacheEntryRequest(job=job, key=rowsum_entry.entry.key,
                                                         device=rowsum_entry.entry.device), timeout=5)
    check("Submit with beam: no search, the kernel's opts came from the cache",
          s1.searches_run == s0.searches_run and s1.beam_cache_hits == s0.beam_cache_hits + 1,
          f"searches {s0.searches_run}->{s1.searches_run}, hits {s0.beam_cache_hits}->{s1.beam_cache_hits}")
    check("Submit with beam: the kernel is named for the crafted opts (UPCAST(0,8) UNROLL(0,2))",
          len(names) == 1 and names[0] != rowsum_entry.entry.kernel_name and names[0] in got.source and
          list(got.opts) == ["UPCAST(0,8)", "UNROLL(0,2)"], f"{names} vs tuned {rowsum_entry.entry.kernel_name}")
    done = evs[-1].done if evs and evs[-1].WhichOneof("event") == "done" else None
    out = np.frombuffer(done.outputs[0].data, dtype=np.float32) if done else None
    check("Submit with beam: the numbers are right (16 rows of 16 ones)", out is not None and out.shape == (16,) and
          np.all(out == 16.0), out)
    # and with the tuned opts of a Tune (the names in the Submit's events carry them)
    evs2, _ = tune(kex, job, g_rowsum_sq(n=8))
    tuned = [e.entry.kernel_name for e in finished(evs2)]
    evs3 = list(kex.Submit(kex_pb2.SubmitRequest(job=job, graph=g_rowsum_sq(n=8),
                                                 beam=kex_pb2.BeamOptions(beam_width=1)), timeout=60))
    sched = [e for e in evs3 if e.WhichOneof("event") == "scheduled"]
    check("Submit with beam after a Tune: the scheduled kernels carry the tuned opts' names",
          sched and list(sched[0].scheduled.kernels) == tuned, f"{sched[0].scheduled.kernels if sched else None} "
                                                                f"vs {tuned}")
    evs4 = list(kex.Submit(kex_pb2.SubmitRequest(job=job, graph=g_rowsum(fill="value")), timeout=60))
    s4 = [e for e in evs4 if e.WhichOneof("event") == "scheduled"]
    check("Submit without beam after a beam Submit of the same graph: hand-coded (the structure key has the width)",
          s4 and list(s4[0].scheduled.kernels) != names and not evs4[0].accepted.schedule_cached,
          f"{list(s4[0].scheduled.kernels) if s4 else None}")
    g = g_rowsum()
    fin = finished(tune(kex, job, g, width=2)[0])
    check("Tune with beam 2 after beam 1: a miss (the width is part of the key)",
          [e.from_cache for e in fin] == [False] and "beam=2;" in fin[0].entry.search_opts)


def check_deadline(kex, job):
    s0 = stats(kex)
    t0 = time.time()
    c, e = code_of(lambda: tune(kex, job, g_matmul(n=64), width=4, timeout=1.5))
    took = time.time() - t0
    check("Tune with a 1.5 s deadline: DEADLINE_EXCEEDED", c == grpc.StatusCode.DEADLINE_EXCEEDED, desc(e))
    drained = False
    st = None
    end = time.time() + 10
    while time.time() < end:
        st = stats(kex, job)
        js = st.job_stats[0]
        if js.queued == 0 and js.running == 0 and st.searches_cancelled > s0.searches_cancelled:
            drained = True
            break
        time.sleep(0.05)
    check("after the deadline: nothing of the job left queued or running, the search counted as cancelled", drained,
          str(st.job_stats[0]) if st else "")
    print(f"# Tune deadline 1.5 s: the client saw the status after {took:.2f} s; drained "
          f"{time.time() - t0 - took:.2f} s later")
    s1 = stats(kex)
    check("GetStats: beam counters (hits, misses, searches run, cancelled)",
          s1.beam_cache_hits > 0 and s1.beam_cache_misses > 0 and s1.searches_run >= s1.searches_cancelled > 0,
          f"{s1.beam_cache_hits} {s1.beam_cache_misses} {s1.searches_run} {s1.searches_cancelled}")


def check_bad_input(kex, job):
    bad_graph = kex_pb2.Graph(device="cpu", nodes=[N(op="NOPE")], outputs=[0])
    c, e = code_of(lambda: tune(kex, job, bad_graph))
    check("Tune with a bad graph: INVALID_ARGUMENT naming the node", c == grpc.StatusCode.INVALID_ARGUMENT and
          "node 0" in e.details(), desc(e))
    c, e = code_of(lambda: tune(kex, "not-a-job", g_rowsum()))
    check("Tune with an unknown job: NOT_FOUND", c == grpc.StatusCode.NOT_FOUND, desc(e))
    c, e = code_of(lambda: tune(kex, "", g_rowsum()))
    check("Tune without a job: INVALID_ARGUMENT", c == grpc.StatusCode.INVALID_ARGUMENT, desc(e))
    c, e = code_of(lambda: list(kex.Tune(kex_pb2.TuneRequest(job=job), timeout=5)))
    check("Tune without a graph: INVALID_ARGUMENT", c == grpc.StatusCode.INVALID_ARGUMENT, desc(e))
    c, e = code_of(lambda: tune(kex, job, g_rowsum(), width=65))
    check("Tune with beam_width 65: INVALID_ARGUMENT", c == grpc.StatusCode.INVALID_ARGUMENT, desc(e))
    c, e = code_of(lambda: tune(kex, job, g_rowsum(device="tpu")))
    check("Tune on an unknown device: INVALID_ARGUMENT", c == grpc.StatusCode.INVALID_ARGUMENT, desc(e))
    for name, fn in [("ListCache", lambda: kex.ListCache(kex_pb2.ListCacheRequest(job="nope"), timeout=5)),
                     ("GetCacheEntry", lambda: kex.GetCacheEntry(kex_pb2.GetCacheEntryRequest(job="nope", key="0" * 64),
                                                                 timeout=5)),
                     ("ExportCache", lambda: list(kex.ExportCache(kex_pb2.ExportCacheRequest(job="nope"), timeout=5))),
                     ("DeleteCache", lambda: kex.DeleteCache(kex_pb2.DeleteCacheRequest(job="nope"), timeout=5))]:
        c, e = code_of(fn)
        check(f"{name} with an unknown job: NOT_FOUND", c == grpc.StatusCode.NOT_FOUND, desc(e))
    c, e = code_of(lambda: list(kex.Submit(kex_pb2.SubmitRequest(job=job, graph=g_rowsum(),
                                                            beam=kex_pb2.BeamOptions(beam_width=100)), timeout=5)))
    check("Submit with beam_width 100: INVALID_ARGUMENT", c == grpc.StatusCode.INVALID_ARGUMENT, desc(e))
    evs, _ = tune(kex, job, g_rowsum())
    check("after the bad requests the daemon still tunes", len(finished(evs)) == 1)


def check_cancel(kex, job):
    """A client cancel stops the search; the daemon frees what it held and keeps serving."""
    s0 = stats(kex)
    it = kex.Tune(kex_pb2.TuneRequest(job=job, graph=g_matmul(n=48), beam=kex_pb2.BeamOptions(beam_width=4)),
                  timeout=60)
    first = next(it)
    it.cancel()
    end = time.time() + 10
    st = None
    while time.time() < end:
        st = stats(kex, job)
        if st.searches_cancelled > s0.searches_cancelled and st.job_stats[0].queued == 0 and \
                st.job_stats[0].running == 0:
            break
        time.sleep(0.05)
    check("Tune cancelled by the client after its first event: the search stops, nothing left queued",
          st.searches_cancelled > s0.searches_cancelled and st.job_stats[0].queued == 0, f"first {first.phase}")


def check_sharing(kex, job):
    """Another job's Submit during a Tune on the same device runs between the search's device items."""
    other = open_job(kex, "other")
    g = g_rowsum(n=8)
    list(kex.Submit(kex_pb2.SubmitRequest(job=other, graph=g), timeout=60))  # compiled and loaded: only runs now
    got = []
    it = kex.Tune(kex_pb2.TuneRequest(job=job, graph=g_matmul(n=64), beam=kex_pb2.BeamOptions(beam_width=4)),
                  timeout=60)

    def run():
        try:
            for ev in it:
                got.append(ev)
        except grpc.RpcError:
            pass
    th = threading.Thread(target=run)
    th.start()
    time.sleep(1.0)
    t0 = time.time()
    evs = list(kex.Submit(kex_pb2.SubmitRequest(job=other, graph=g), timeout=60))
    took = time.time() - t0
    searching = th.is_alive() and not any(e.finished for e in got)
    it.cancel()
    th.join(30)
    check("a Submit of another job during a Tune on the same device finishes while the search goes on",
          evs and evs[-1].WhichOneof("event") == "done" and took < 3 and searching,
          f"{took:.2f} s, search still running: {searching}")
    print(f"# Submit (cached, 8x8 rowsum) of another job during a cpu search: {took * 1e3:.0f} ms")


def tune_in_background(kex, job, graph, width):
    """A Tune of graph on a thread of its own: (the thread, a dict that gets "e", the RpcError it ends with)."""
    err = {}

    def run():
        try:
            list(kex.Tune(kex_pb2.TuneRequest(job=job, graph=graph, beam=kex_pb2.BeamOptions(beam_width=width)),
                          timeout=60))
        except grpc.RpcError as e:
            err["e"] = e
    th = threading.Thread(target=run)
    th.start()
    return th, err


def check_job_close_and_timeout(kex):
    """CloseJob during a Tune stops it (NOT_FOUND); beam.timeout_ms bounds one kernel's search."""
    job = open_job(kex, "closing")
    th, err = tune_in_background(kex, job, g_matmul(n=40), 4)
    time.sleep(0.8)
    t0 = time.time()
    kex.CloseJob(kex_pb2.CloseJobRequest(job=job), timeout=5)
    th.join(30)
    took = time.time() - t0
    check("CloseJob during a Tune: the Tune ends with NOT_FOUND soon after", "e" in err and
          err["e"].code() == grpc.StatusCode.NOT_FOUND and took < 10, f"{desc(err.get('e'))} after {took:.2f} s")
    job = open_job(kex, "timeout")
    before = len(list_all(kex, job)[0])
    t0 = time.time()
    c, e = code_of(lambda: tune(kex, job, g_matmul(n=56), width=4, timeout=60, timeout_ms=700))
    took = time.time() - t0
    check("beam.timeout_ms 700: DEADLINE_EXCEEDED naming the kernel, well before the client's deadline",
          c == grpc.StatusCode.DEADLINE_EXCEEDED and "kernel 1/1" in e.details() and "timeout" in e.details() and
          took < 10, f"{desc(e)} after {took:.2f} s")
    after = len(list_all(kex, job)[0])
    check("beam.timeout_ms: nothing stored for the kernel", after == before, f"{before} -> {after} entries")


def check_kill9():
    """kill -9 in the middle of a Tune: the cache file opens, passes integrity_check, holds whole entries."""
    path = os.path.join(TMP, "kill9.db")
    started = own_kexd("kill -9: a second kexd starts", path)
    if not started:
        return
    proc, port, ch, kex = started
    job = open_job(kex, "k9")
    got = []

    def run():
        try:
            for ev in kex.Tune(kex_pb2.TuneRequest(job=job, graph=g_rowsum_sq(), beam=kex_pb2.BeamOptions(
                    beam_width=1)), timeout=60):
                got.append(ev)
            for ev in kex.Tune(kex_pb2.TuneRequest(job=job, graph=g_matmul(n=64), beam=kex_pb2.BeamOptions(
                    beam_width=4)), timeout=60):
                got.append(ev)
        except grpc.RpcError:
            pass
    th = threading.Thread(target=run)
    th.start()
    end = time.time() + 30
    while time.time() < end and sum(e.finished for e in got) < 2:
        time.sleep(0.02)
    time.sleep(0.7)  # inside the matmul's search
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    th.join(timeout=30)
    ch.close()
    try:
        db = sqlite3.connect(path)
        integ = db.execute("PRAGMA integrity_check").fetchall()
        rows = db.execute("SELECT hex(ast_key), opts, kernel_name, best_time_s, ast_text FROM beam_results").fetchall()
        db.close()
    except sqlite3.Error as e:
        check("kill -9: the cache file opens", False, str(e))
        return
    check("kill -9 mid-Tune: PRAGMA integrity_check is ok", integ == [("ok",)], integ)
    whole = all(r[1] is not None and r[2] and r[3] is not None and r[3] > 0 and r[4] and
                hashlib.sha256(r[4].encode()).hexdigest().upper() == r[0] for r in rows)
    check("kill -9 mid-Tune: only whole entries (the finished kernels; every row complete, its AST text hashing to "
          "its key)", whole and len(rows) == sum(e.finished for e in got) and len(rows) >= 2,
          f"{len(rows)} rows, {sum(e.finished for e in got)} finished")
    proc, port, up = start_kexd("--device", "cpu", "--cache", path)
    if up:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            k2 = kex_pb2_grpc.KexStub(ch)
            j2 = open_job(k2, "after")
            n = len(list_all(k2, j2)[0])
            fin = finished(tune(k2, j2, g_rowsum_sq())[0])
        check("kill -9: a new kexd lists the entries and serves them from the cache",
              n == len(rows) and all(e.from_cache for e in fin), f"{n} listed, {[e.from_cache for e in fin]}")
    else:
        check("kill -9: a new kexd starts on the file", False)
    stop(proc)


def check_shared_file():
    """Two kexd processes on one cache file: both Tune and List fine, and see each other's entries."""
    path = os.path.join(TMP, "shared.db")
    p1, port1, up1 = start_kexd("--device", "cpu", "--cache", path)
    p2, port2, up2 = start_kexd("--device", "cpu", "--cache", path)
    if not check("shared file: two kexds start on one cache file", up1 and up2):
        p1.kill(), p2.kill()
        return
    c1 = grpc.insecure_channel(f"127.0.0.1:{port1}")
    c2 = grpc.insecure_channel(f"127.0.0.1:{port2}")
    k1, k2 = kex_pb2_grpc.KexStub(c1), kex_pb2_grpc.KexStub(c2)
    j1, j2 = open_job(k1, "a"), open_job(k2, "b")
    res = {}

    def run(name, kex, job, g):
        try:
            res[name] = finished(tune(kex, job, g)[0])
        except grpc.RpcError as e:
            res[name] = e
    t1 = threading.Thread(target=run, args=("a", k1, j1, g_rowsum_sq()))
    t2 = threading.Thread(target=run, args=("b", k2, j2, g_rowsum(n=32)))
    t1.start(), t2.start()
    t1.join(120), t2.join(120)
    ok = isinstance(res.get("a"), list) and isinstance(res.get("b"), list)
    check("shared file: both kexds Tune at the same time", ok and len(res["a"]) == 2 and len(res["b"]) == 1,
          {k: (v if isinstance(v, list) else desc(v)) for k, v in res.items()} if not ok else "")
    l1, l2 = list_all(k1, j1)[0], list_all(k2, j2)[0]
    check("shared file: each lists all three entries",
          len(l1) == 3 and [entry_id(e) for e in l1] == [entry_id(e) for e in l2], f"{len(l1)} / {len(l2)}")
    fin = finished(tune(k2, j2, g_rowsum_sq())[0])
    check("shared file: the other kexd's result is a cache hit", [e.from_cache for e in fin] == [True, True])
    c1.close(), c2.close()
    check("shared file: both exit 0 at SIGTERM", stop(p1) == 0 and stop(p2) == 0)


def check_drain():
    """SIGTERM during a Tune: the search is cancelled after the grace period and kexd exits 0."""
    path = os.path.join(TMP, "drain.db")
    started = own_kexd("drain: a kexd with --grace 1 starts", path, "--grace", "1")
    if not started:
        return
    proc, port, ch, kex = started
    job = open_job(kex, "d")
    th, err = tune_in_background(kex, job, g_matmul(n=64), 4)
    time.sleep(1.0)
    rc, took = sigterm(proc, timeout=20)
    if rc is None:
        stop(proc)
        rc = "hung"
    th.join(10)
    ch.close()
    check("drain: SIGTERM mid-Tune, kexd exits 0 within the grace period plus one candidate",
          rc == 0 and took < 10, f"rc {rc} after {took:.2f} s")
    check("drain: the Tune ends with an error status", "e" in err and err["e"].code() in (
        grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), desc(err.get("e")))
    print(f"# drain with --grace 1 during a search: exit after {took:.2f} s")


def evil_so(kernel_name, marker, path):
    """A shared object like the cpu device loads: a constructor that leaves `marker`, a kernel that writes 1337."""
    src = f"""#include <stdio.h>
__attribute__((constructor)) static void kex_test_pwn(void) {{
  FILE *f = fopen("{marker}", "w");
  if (f) {{ fputs("ran inside kexd\\n", f); fclose(f); }}
}}
void {kernel_name}(void **bufs, const int *ints, int gidx_start, int gidx_end) {{
  float *out = bufs[0];
  (void)ints; (void)gidx_end;
  if (gidx_start == 0) for (int i = 0; i < 16; i++) out[i] = 1337.0f;
}}
"""
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-x", "c", "-", "-o", path], input=src.encode(), check=True,
                   capture_output=True)
    with open(path, "rb") as f:
        return f.read()


def program_rows(path):
    """The program rows of a cache file: (source SHA-256 hex, kernel name, device identity dict, binary SHA-256 hex)."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT lower(hex(p.source_sha256)), p.kernel_name, d.kind, d.vendor, d.name, "
                          "d.driver_version, d.compiler_version, lower(hex(p.binary_sha256)) FROM programs p "
                          "JOIN devices d ON d.id = p.device_id ORDER BY 1").fetchall()
    finally:
        db.close()
    keys = ("kind", "vendor", "name", "driver_version", "compiler_version")
    return [(r[0], r[1], dict(zip(keys, r[2:7])), r[7]) for r in rows]


def check_attack():
    """The attack, step by step: an imported "program" line must never run; imported opts are checked at use.

    Job A submits a+b.  An attacker job exports the cache, reads the SHA-256 of the a+b kernel's source (from the
    file: exports no longer carry programs), crafts "program" lines with a shared object of its own for it (a
    constructor that leaves a marker file, a kernel that writes 1337) and ImportCache's them, alone and inside an
    old-style export with a beam line whose opts do not apply.  The lines are refused, the file keeps the programs
    kexd compiled, and job A's Submits -- before and after a restart, when the program comes from the file -- give
    the right numbers, the marker never appears; the beam entry with unusable opts is dropped at use and searched
    again."""
    t0 = time.time()
    path = os.path.join(TMP, "attack.db")
    marker = os.path.join(TMP, "attack-marker")
    want = np.arange(16, dtype=np.float32) + 2
    started = own_kexd("attack: a kexd starts on its own cache file", path)
    if not started:
        return
    proc, port, ch, kex = started
    job_a, attacker = open_job(kex, "victim"), open_job(kex, "attacker")
    out, _ = submit_out(kex, job_a, g_add())
    check("attack: job A's a+b gives arange(16) + 2", out is not None and np.array_equal(out, want), out)
    out, _ = submit_out(kex, job_a, g_add(), beam=1)
    check("attack: job A's a+b with beam 1 gives the same numbers (its opts are now in the cache)",
          out is not None and np.array_equal(out, want), out)
    data, _ = export(kex, attacker)
    lines = data.decode().splitlines()
    entries = [json.loads(ln) for ln in lines[1:]]
    check("attack: ExportCache carries beam results only, no compiled program",
          entries and all(e["type"] == "beam" for e in entries) and json.loads(lines[0])["schema"] >= 3,
          [e["type"] for e in entries])
    rows = program_rows(path)
    if not check("attack: the file holds the programs kexd compiled for job A", len(rows) >= 1, rows):
        stop(proc)
        return
    forged, forged_sha = [], set()
    for i, (src_sha, kname, dev, _) in enumerate(rows):
        blob = evil_so(kname, marker, os.path.join(TMP, f"evil{i}.so"))
        forged_sha.add(hashlib.sha256(blob).hexdigest())
        forged.append(json.dumps({"type": "program", "source_sha256": src_sha, "device": dev, "kernel_name": kname,
                                  "binary": base64.b64encode(blob).decode(), "created_at": int(time.time())}))
    old_header = json.dumps({"format": "kex.cache.export.v1", "schema": 2})
    c, e = code_of(lambda: import_(kex, attacker, (old_header + "\n" + "\n".join(forged) + "\n").encode(), chunk=65536))
    check("attack: ImportCache of program lines only: INVALID_ARGUMENT, line 2 refused, compiled programs never "
          "imported", c == grpc.StatusCode.INVALID_ARGUMENT and "line 2" in e.details() and
          "compiled programs are never imported" in e.details(), desc(e))
    add_beam = [b for b in entries if "beam=1;" in b["search_opts"]]
    if not check("attack: the beam 1 entry of the a+b kernel exports", len(add_beam) == 1, len(add_beam)):
        stop(proc)
        return
    crafted = dict(add_beam[0], opts="UPCAST(5,7)", kernel_name="crafted")  # there is no axis 5
    mixed = "\n".join([old_header, json.dumps(crafted)] + forged) + "\n"
    r = import_(kex, attacker, mixed.encode(), chunk=65536)
    refused = [f"line {3 + i}: type \"program\" refused: compiled programs are never imported" for i in range(len(forged))]
    check("attack: an old-style export with a beam line and program lines: OK, the beam line imported, each program "
          "line refused by number", r.imported == 1 and r.rejected == len(forged) and
          all(any(x.startswith(w) for x in r.errors) for w in refused), str(r))
    check("attack: the file still holds exactly the programs kexd compiled (same binaries)",
          program_rows(path) == rows, program_rows(path))
    out, _ = submit_out(kex, job_a, g_add())
    check("attack: job A's next a+b: the right numbers, nothing of the attacker's ran",
          out is not None and np.array_equal(out, want) and not os.path.exists(marker), out)
    ch.close()
    check("attack: kexd exits 0 at SIGTERM", stop(proc) == 0)
    # a new kexd on the file: its programs now come from SQLite, verified against the source it renders
    proc, port, up = start_kexd("--device", "cpu", "--cache", path)
    if not check("attack: a new kexd starts on the attacked file", up):
        proc.kill()
        return
    log = os.path.join(TMP, f"kexd-{port}.log")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        kex = kex_pb2_grpc.KexStub(ch)
        job = open_job(kex, "victim-again")
        s0 = stats(kex)
        out, _ = submit_out(kex, job, g_add())
        s1 = stats(kex)
        check("attack, after a restart: a+b right, its program loaded from the file (verified), nothing of the "
              "attacker's ran", out is not None and np.array_equal(out, want) and not os.path.exists(marker) and
              s1.program_cache_sqlite_hits == s0.program_cache_sqlite_hits + 1,
              f"{out} sqlite hits {s0.program_cache_sqlite_hits}->{s1.program_cache_sqlite_hits}")
        out, _ = submit_out(kex, job, g_add(), beam=1)
        s2 = stats(kex)
        g = kex.GetCacheEntry(kex_pb2.GetCacheEntryRequest(job=job, key=crafted["ast_key"]), timeout=5)
        with open(log) as f:
            logged = f.read()
        check("attack: the imported opts that do not apply are dropped at use (logged with the key), the kernel "
              "searched as on a miss, the numbers right",
              out is not None and np.array_equal(out, want) and s2.searches_run == s1.searches_run + 1 and
              s2.beam_cache_hits == s1.beam_cache_hits and "UPCAST(5,7)" not in list(g.opts) and
              g.kernel_name != "crafted" and crafted["ast_key"] in logged and "dropped" in logged,
              f"{out} searches {s1.searches_run}->{s2.searches_run} hits {s1.beam_cache_hits}->{s2.beam_cache_hits} "
              f"opts {list(g.opts)}")
    check("attack: the new kexd exits 0 at SIGTERM", stop(proc) == 0)
    # the same rule in-process: kex cache import
    kexcli = os.path.join(os.path.dirname(os.path.dirname(KEXD)), "kex")
    if os.access(kexcli, os.X_OK):
        bad = os.path.join(TMP, "attack-export.jsonl")
        with open(bad, "w") as f:
            f.write(mixed)
        p = subprocess.run([kexcli, "cache", "import", "--json", "--cache", path, bad], capture_output=True, text=True,
                           timeout=30)
        rep = json.loads(p.stdout or "{}")
        check("attack: kex cache import of the same file: exit 2, the beam line imported, the program lines refused",
              p.returncode == 2 and rep.get("imported") == 1 and rep.get("rejected") == len(forged) and
              "compiled programs are never imported" in p.stderr, f"rc {p.returncode} {p.stdout} {p.stderr}")
        # the beam=1 Submit above may have stored the program of the kernel its search picked (which one depends on
        # timing): kexd's own rows may grow, but every earlier row is unchanged and no forged binary is stored
        now = program_rows(path)
        key = lambda r: (r[0], r[1], tuple(sorted(r[2].items())), r[3])  # noqa: E731
        check("attack: after all that, the file holds kexd's programs (the earlier ones unchanged) and no forged "
              "binary", {key(r) for r in rows} <= {key(r) for r in now} and not any(r[3] in forged_sha for r in now),
              (rows, now))
    else:
        skip("attack: kex cache import", f"{kexcli} not built")
    print(f"# attack: {time.time() - t0:.1f} s")


def check_new_file_race(rounds=20, tunes=3):
    """Two kexds started together on one NEW cache file, both tuning at once, 20 times: no open ever fails.

    Each kexd gets `tunes` Tunes at the same instant (every Tune opens its own handle on the file), so several
    connections of two processes create and set up the one new file together -- where SQLite's busy timeout does
    not cover the WAL switch and the schema transaction."""
    bad = []
    t0 = time.time()
    for rnd in range(rounds):
        path = os.path.join(TMP, f"race-{rnd}", "cache.db")
        procs = []
        for _ in range(2):
            procs.append(launch(KEXD, TMP, "--device", "cpu", "--cache", path))
        if not all(wait_healthy(port, p) for p, port in procs):
            bad.append(f"round {rnd}: a kexd did not start")
            for p, _ in procs:
                p.kill()
                p.wait()
            continue
        chans = [grpc.insecure_channel(f"127.0.0.1:{port}") for _, port in procs]
        stubs = [kex_pb2_grpc.KexStub(c) for c in chans]
        jobs = [open_job(k, f"race{i}") for i, k in enumerate(stubs)]
        go = threading.Barrier(2 * tunes)
        res = {}

        def run(i, t):
            go.wait()
            try:
                # upcast and local limits of 1 leave the search nothing to try: a search costs two compiles
                res[i, t] = finished(tune(stubs[i], jobs[i], g_add(n=4 + t), timeout=60, max_upcast=1, max_local=1)[0])
            except grpc.RpcError as e:
                res[i, t] = e
        ths = [threading.Thread(target=run, args=(i, t)) for i in range(2) for t in range(tunes)]
        for th in ths:
            th.start()
        for th in ths:
            th.join(90)
        for k in sorted(res.keys() | {(i, t) for i in range(2) for t in range(tunes)}):
            v = res.get(k)
            if not isinstance(v, list) or len(v) != 1:
                bad.append(f"round {rnd} kexd {k[0]} tune {k[1]}: {desc(v) if isinstance(v, grpc.RpcError) else v}")
        for c in chans:
            c.close()
        for p, _ in procs:
            if stop(p) != 0:
                bad.append(f"round {rnd}: a kexd did not exit 0")
    check(f"new cache file: two kexds started together, {tunes} Tunes each at once, {rounds} rounds, 0 failures",
          not bad, f"{len(bad)} failed: " + "; ".join(bad[:4]))
    print(f"# new-file race: {rounds} rounds of two kexds x {tunes} Tunes in {time.time() - t0:.1f} s")


def main():
    t0 = time.time()
    ch = grpc.insecure_channel(f"127.0.0.1:{PORT}")
    kex = kex_pb2_grpc.KexStub(ch)
    job = open_job(kex, "tune")
    try:
        check_tune_stream(kex, job)
        check_opencl(kex, job)
        every = check_list_get(kex, job)
        header, beams = check_export_import(kex, job, every)
        rowsum = check_foreign_identity(kex, job, header, beams)
        check_width_and_submit(kex, job, rowsum)
        check_bad_input(kex, job)
        check_deadline(kex, job)
        check_cancel(kex, job)
        check_job_close_and_timeout(kex)
        check_sharing(kex, job)
    except Exception as e:  # a failure must not hide the other checks' count
        check("test_tune.py ran to the end", False, f"{type(e).__name__}: {e}")
    finally:
        ch.close()
    for fn in (check_kill9, check_shared_file, check_drain, check_attack, check_new_file_race):
        try:
            fn()
        except Exception as e:
            check(f"{fn.__name__} ran to the end", False, f"{type(e).__name__}: {e}")
    print(f"# test_tune.py took {time.time() - t0:.1f} s")


if __name__ == "__main__":
    kexdtest.run(main, "test_tune.py")
