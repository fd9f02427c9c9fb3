"""test_jobs.py - buffers, per-job memory accounting and fair queueing in a real kexd.

Run by test_jobs.sh, which starts the kexd under test (--test-busy-work,
--max-message KEXD_MAX_MESSAGE) and passes, in the environment: KEXD (the
binary), KEXD_PORT, KEXD_MAX_MESSAGE, KEX_STUBS (the generated kex_pb2*.py
and health_pb2*.py), KEXD_TMP (a scratch folder).  The lease, fairness and
SIGTERM checks start their own kexd (kexdtest.start_kexd, logs in KEXD_TMP).  Prints one line per check ("ok - ..." / "FAIL - ...") and, last,
"N passed, N failed".  Exit status 1 when anything failed.

Fairness is measured with the test-only /kex.v1.Kex/_BusyWork method
(kexd --test-busy-work): items of busy CPU work on the device runner, charged
to a job like kernels.  Shares are per-job device time from GetStats over the
same window while both jobs still have items queued.
"""
import os
import random
import sys
import time

sys.path.insert(0, os.environ["KEX_STUBS"])

import grpc  # noqa: E402
import health_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402
from kex.v1 import kex_pb2, kex_pb2_grpc  # noqa: E402
import kexdtest  # noqa: E402
from kexdtest import check, desc, log_clean, read_log, rpc_error, run, sigterm, stop  # noqa: E402

KEXD = os.environ["KEXD"]
PORT = int(os.environ["KEXD_PORT"])
MAX_MESSAGE = int(os.environ["KEXD_MAX_MESSAGE"])
CHANNEL_OPTS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
MiB = 1 << 20
TMP = os.environ["KEXD_TMP"]


def start_kexd(*args):
    return kexdtest.start_kexd(KEXD, TMP, *args)


def upload_reqs(job, dtype, shape, data, chunk=256 * 1024, device=""):
    yield kex_pb2.UploadRequest(job=job, header=kex_pb2.UploadHeader(dtype=dtype, shape=shape, device=device))
    for i in range(0, len(data), chunk):
        yield kex_pb2.UploadRequest(chunk=data[i:i + chunk])


def upload(kex, job, dtype, shape, data, **kw):
    return kex.Upload(upload_reqs(job, dtype, shape, data, **kw), timeout=30)


def download(kex, job, handle, chunk_bytes=0):
    chunks = list(kex.Download(kex_pb2.DownloadRequest(job=job, handle=handle, chunk_bytes=chunk_bytes), timeout=30))
    return b"".join(c.data for c in chunks), chunks


def job_stats(kex, job):
    return kex.GetStats(kex_pb2.GetStatsRequest(job=job), timeout=5).job_stats[0]


def busy_stub(ch):
    return ch.unary_unary("/kex.v1.Kex/_BusyWork", request_serializer=kex_pb2.BusyWorkRequest.SerializeToString,
                          response_deserializer=kex_pb2.BusyWorkReply.FromString)


def buffers(kex):
    rnd = random.Random(7)
    job = kex.OpenJob(kex_pb2.OpenJobRequest(name="buffers", weight=1), timeout=5).job

    # round trips on the default device (and one on cpu)
    handles = []
    for dtype, shape, n, device in (("uint8", [1], 1, ""), ("uint8", [MiB + 1], MiB + 1, ""),
                                    ("float32", [2, 1024, 1024], 8 * MiB, ""), ("int16", [3, 5], 30, "cpu")):
        data = rnd.randbytes(n)
        try:
            r = upload(kex, job, dtype, shape, data, device=device)
            back, chunks = download(kex, job, r.handle)
            first = chunks[0]
            where = device or "default"
            check(f"Upload/Download {dtype} {shape} ({n} bytes, {where} device): bytes intact",
                  back == data and r.bytes == n, f"{len(back)} bytes back, reply {r.bytes}")
            check(f"Download {n} bytes: first chunk says dtype, shape, total; chunks <= 1 MiB and in order",
                  first.dtype == dtype and list(first.shape) == shape and first.total_bytes == n
                  and all(len(c.data) <= MiB for c in chunks)
                  and [c.offset for c in chunks] == [sum(len(x.data) for x in chunks[:i]) for i in range(len(chunks))],
                  f"{first.dtype} {list(first.shape)} {first.total_bytes}, {[len(c.data) for c in chunks][:10]}")
            handles.append((r.handle, data))
        except grpc.RpcError as e:
            check(f"Upload/Download {dtype} {shape} on {device or 'default'}", False, desc(e))
    check("handles are distinct and >= 32 hex characters",
          len({h for h, _ in handles}) == len(handles)
          and all(len(h) >= 32 and all(c in "0123456789abcdef" for c in h) for h, _ in handles), str(handles)[:200])
    if handles:
        h, data = handles[1] if len(handles) > 1 else handles[0]
        back, chunks = download(kex, job, h, chunk_bytes=100000)
        check("Download with chunk_bytes 100000: chunks of 100000 bytes, bytes intact",
              back == data and all(len(c.data) == 100000 for c in chunks[:-1]), str([len(c.data) for c in chunks][:5]))
    r = upload(kex, job, "float32", [0, 4], b"")
    back, chunks = download(kex, job, r.handle)
    check("a 0-element buffer uploads and downloads as one empty chunk",
          r.bytes == 0 and back == b"" and len(chunks) == 1 and chunks[0].total_bytes == 0, str(chunks))
    st = job_stats(kex, job)
    want = sum(len(d) for _, d in handles)
    check(f"GetStats(job): bytes held {want}, {len(handles) + 1} buffers, name and weight",
          st.bytes_held == want and st.buffers == len(handles) + 1 and st.name == "buffers" and st.weight == 1
          and st.bytes_reserved == 0, str(st))

    # Free
    h0 = handles[0][0]
    r = kex.Free(kex_pb2.FreeRequest(job=job, handles=[h0]), timeout=5)
    check("Free: freed 1", r.freed == 1, str(r))
    e = rpc_error(download, kex, job, h0)
    check("Download of a freed handle: NOT_FOUND", e is not None and e.code() == grpc.StatusCode.NOT_FOUND, desc(e))
    e = rpc_error(kex.Free, kex_pb2.FreeRequest(job=job, handles=[h0]), timeout=5)
    check("Free of a freed handle: NOT_FOUND", e is not None and e.code() == grpc.StatusCode.NOT_FOUND, desc(e))
    st = job_stats(kex, job)
    check("Free: bytes held drop by the freed buffer's size", st.bytes_held == want - 1, str(st))

    # bad uploads: INVALID_ARGUMENT, nothing held or reserved afterwards
    before = job_stats(kex, job)
    bad = [
        ("3 bytes short", upload_reqs(job, "float32", [4, 4], b"\0" * 61), "got 61 bytes", grpc.StatusCode.INVALID_ARGUMENT),
        ("1 byte over", upload_reqs(job, "float32", [4, 4], b"\0" * 65), "more than the 64 bytes",
         grpc.StatusCode.INVALID_ARGUMENT),
        ("unknown dtype", upload_reqs(job, "float33", [4], b"\0" * 16), "unknown dtype", grpc.StatusCode.INVALID_ARGUMENT),
        ("no header", iter([kex_pb2.UploadRequest(job=job, chunk=b"abc")]), "header", grpc.StatusCode.INVALID_ARGUMENT),
        ("a negative dim", upload_reqs(job, "uint8", [2, -1], b""), "negative", grpc.StatusCode.INVALID_ARGUMENT),
        ("an unknown device", upload_reqs(job, "uint8", [2], b"ab", device="tpu"), "device",
         grpc.StatusCode.INVALID_ARGUMENT),
        ("two headers", iter([kex_pb2.UploadRequest(job=job, header=kex_pb2.UploadHeader(dtype="uint8", shape=[1])),
                              kex_pb2.UploadRequest(header=kex_pb2.UploadHeader(dtype="uint8", shape=[1]))]),
         "second header", grpc.StatusCode.INVALID_ARGUMENT),
        ("an empty stream", iter([]), "header", grpc.StatusCode.INVALID_ARGUMENT),
        ("an unknown job", upload_reqs("0" * 32, "uint8", [1], b"a"), "unknown job", grpc.StatusCode.NOT_FOUND),
        ("17 dims", upload_reqs(job, "uint8", [1] * 17, b"a"), "17 dims, more than the limit of 16 (--max-dims)",
         grpc.StatusCode.RESOURCE_EXHAUSTED),
    ]
    for what, reqs, word, code in bad:
        e = rpc_error(kex.Upload, reqs, timeout=10)
        check(f"Upload with {what}: {code.name} saying \"{word}\"",
              e is not None and e.code() == code and word in e.details(), desc(e))
    after = job_stats(kex, job)
    check("after the bad uploads nothing more is held or reserved",
          after.bytes_held == before.bytes_held and after.buffers == before.buffers and after.bytes_reserved == 0,
          f"{before} -> {after}")
    h = health_pb2_grpc.HealthStub(grpc.insecure_channel(f"127.0.0.1:{PORT}")).Check(health_pb2.HealthCheckRequest(),
                                                                                     timeout=5)
    data = rnd.randbytes(1000)
    r = upload(kex, job, "uint8", [1000], data)
    check("kexd keeps serving after bad uploads (health, a good upload round trip)",
          h.status == health_pb2.HealthCheckResponse.SERVING and download(kex, job, r.handle)[0] == data)

    # two jobs: handles are isolated; a quota hit in one does not touch the other
    a = kex.OpenJob(kex_pb2.OpenJobRequest(name="a", memory_limit=MiB), timeout=5).job
    b = kex.OpenJob(kex_pb2.OpenJobRequest(name="b"), timeout=5).job
    da, db = rnd.randbytes(MiB), rnd.randbytes(3 * MiB)
    ha = upload(kex, a, "uint8", [MiB], da).handle
    hb = upload(kex, b, "uint8", [3 * MiB], db).handle
    e = rpc_error(download, kex, b, ha)
    check("job B downloading job A's handle: NOT_FOUND", e is not None and e.code() == grpc.StatusCode.NOT_FOUND,
          desc(e))
    e = rpc_error(kex.Free, kex_pb2.FreeRequest(job=b, handles=[ha]), timeout=5)
    check("job B freeing job A's handle: NOT_FOUND, and A's buffer is intact",
          e is not None and e.code() == grpc.StatusCode.NOT_FOUND and download(kex, a, ha)[0] == da, desc(e))
    e = rpc_error(upload, kex, a, "uint8", [1], b"x")
    want_msg = "job 'a' would hold 1048577 bytes, over its memory limit of 1048576 bytes"
    check("job A at its 1 MiB limit uploading 1 more byte: RESOURCE_EXHAUSTED naming the limit and the amount",
          e is not None and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and want_msg in e.details(), desc(e))
    e = rpc_error(upload, kex, a, "uint8", [2 * MiB], b"\0" * (2 * MiB))
    check("job A uploading 2 MiB over its limit: RESOURCE_EXHAUSTED",
          e is not None and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "memory limit" in e.details(), desc(e))
    db2 = rnd.randbytes(2 * MiB)
    try:
        hb2 = upload(kex, b, "float64", [2 * MiB // 8], db2).handle
        ok = download(kex, b, hb2)[0] == db2 and download(kex, b, hb)[0] == db
    except grpc.RpcError as e:
        ok = False
    check("meanwhile job B's uploads and downloads still succeed", ok)
    sa, sb = job_stats(kex, a), job_stats(kex, b)
    check("GetStats: A holds 1 MiB (its limit), B holds 5 MiB",
          sa.bytes_held == MiB and sa.memory_limit == MiB and sb.bytes_held == 5 * MiB and sb.buffers == 2,
          f"{sa} {sb}")
    kex.Free(kex_pb2.FreeRequest(job=a, handles=[ha]), timeout=5)
    r = upload(kex, a, "uint8", [1], b"x")
    check("after a Free, job A can upload again under its limit", r.bytes == 1)
    # many buffers and jobs, freed and closed in random order: the handle and token indexes (jobs.c) stay right
    many = kex.OpenJob(kex_pb2.OpenJobRequest(name="many"), timeout=5).job
    held = {upload(kex, many, "int32", [1], i.to_bytes(4, "little")).handle: i for i in range(240)}
    order = list(held)
    rnd.shuffle(order)
    gone = order[:160]
    for k in range(0, len(gone), 16):
        kex.Free(kex_pb2.FreeRequest(job=many, handles=gone[k:k + 16]), timeout=5)
    for i in range(240, 280):
        held[upload(kex, many, "int32", [1], i.to_bytes(4, "little")).handle] = i
    kept = {h: i for h, i in held.items() if h not in gone[:160]}
    right = all(int.from_bytes(download(kex, many, h)[0], "little") == i for h, i in kept.items())
    lost = [h for h in gone if rpc_error(download, kex, many, h) is None]
    check("240 buffers, 160 freed in shuffled Frees, 40 more uploaded: each of the 120 held downloads its own "
          "bytes, every freed handle is NOT_FOUND, GetStats counts 120",
          right and not lost and job_stats(kex, many).buffers == 120, f"{len(lost)} freed handles still found")
    e = rpc_error(kex.Free, kex_pb2.FreeRequest(job=many, handles=[order[200], gone[0]]), timeout=5)
    check("a Free naming a held and a freed handle: NOT_FOUND, nothing freed",
          e is not None and e.code() == grpc.StatusCode.NOT_FOUND and job_stats(kex, many).buffers == 120, desc(e))
    e = rpc_error(kex.Free, kex_pb2.FreeRequest(job=many, handles=[order[200][:-1] + "x"]), timeout=5)
    check("a handle one character off: NOT_FOUND", e is not None and e.code() == grpc.StatusCode.NOT_FOUND, desc(e))
    toks = [kex.OpenJob(kex_pb2.OpenJobRequest(name=f"j{i}"), timeout=5).job for i in range(60)]
    rnd.shuffle(toks)
    for t in toks[:40]:
        kex.CloseJob(kex_pb2.CloseJobRequest(job=t), timeout=5)
    open_ok = all(job_stats(kex, t).name.startswith("j") for t in toks[40:])
    closed = [t for t in toks[:40] if rpc_error(job_stats, kex, t) is None]
    check("60 jobs, 40 closed in shuffled order: the 20 open ones resolve, every closed token is NOT_FOUND",
          open_ok and not closed, f"{len(closed)} closed tokens still resolve")
    for t in toks[40:] + [many]:
        kex.CloseJob(kex_pb2.CloseJobRequest(job=t), timeout=5)

    # a concurrent upload stream counts against the limit while in flight
    a2 = kex.OpenJob(kex_pb2.OpenJobRequest(name="a2", memory_limit=MiB), timeout=5).job
    gate = []

    def slow():
        yield kex_pb2.UploadRequest(job=a2, header=kex_pb2.UploadHeader(dtype="uint8", shape=[MiB]))
        while not gate:
            time.sleep(0.01)
        yield kex_pb2.UploadRequest(chunk=b"\0" * MiB)
    fut = kex.Upload.future(slow(), timeout=30)
    time.sleep(0.2)
    st = job_stats(kex, a2)
    e = rpc_error(upload, kex, a2, "uint8", [1], b"y")
    gate.append(1)
    r = fut.result()
    check("an upload in flight reserves its bytes: a second one over the limit is RESOURCE_EXHAUSTED",
          st.bytes_reserved == MiB and e is not None and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
          and r.bytes == MiB, f"{st} {desc(e)}")

    # a Download cancelled mid-stream, a CloseJob during a Download: the buffer is freed once, kexd keeps serving
    c = kex.OpenJob(kex_pb2.OpenJobRequest(name="cancels"), timeout=5).job
    hc = upload(kex, c, "uint8", [8 * MiB], b"\3" * (8 * MiB)).handle
    it = kex.Download(kex_pb2.DownloadRequest(job=c, handle=hc, chunk_bytes=65536), timeout=30)
    first = next(it)
    it.cancel()
    time.sleep(0.2)
    r = kex.Free(kex_pb2.FreeRequest(job=c, handles=[hc]), timeout=5)
    st = job_stats(kex, c)
    check("a Download cancelled after its first chunk: the buffer still frees (freed 1, 0 bytes held)",
          len(first.data) == 65536 and r.freed == 1 and st.bytes_held == 0 and st.buffers == 0, f"{r} {st}")
    hc = upload(kex, c, "uint8", [8 * MiB], b"\4" * (8 * MiB)).handle
    it = kex.Download(kex_pb2.DownloadRequest(job=c, handle=hc, chunk_bytes=65536), timeout=30)
    first = next(it)
    s0 = kex.GetStats(kex_pb2.GetStatsRequest(), timeout=5)
    kex.CloseJob(kex_pb2.CloseJobRequest(job=c), timeout=5)
    e = rpc_error(lambda: [x for x in it])
    time.sleep(0.2)
    s1 = kex.GetStats(kex_pb2.GetStatsRequest(), timeout=5)
    check("CloseJob during a Download: the stream ends with an error naming the closed job, the buffer is freed",
          e is not None and "closed" in e.details() and s0.bytes_held - s1.bytes_held == 8 * MiB
          and s1.buffers_freed == s0.buffers_freed + 1, f"{desc(e)}; {s0.bytes_held} -> {s1.bytes_held}")

    # CloseJob frees every buffer of the job
    total0 = kex.GetStats(kex_pb2.GetStatsRequest(), timeout=5)
    kex.CloseJob(kex_pb2.CloseJobRequest(job=b), timeout=5)
    total1 = kex.GetStats(kex_pb2.GetStatsRequest(), timeout=5)
    check("CloseJob: the daemon's bytes held drop by the job's 5 MiB, its records are freed",
          total0.bytes_held - total1.bytes_held == 5 * MiB and total1.buffers_freed - total0.buffers_freed == 2
          and "b" not in [j.name for j in total1.job_stats], f"{total0.bytes_held} -> {total1.bytes_held}")
    e = rpc_error(download, kex, b, hb)
    check("after CloseJob its handles are NOT_FOUND", e is not None and e.code() == grpc.StatusCode.NOT_FOUND, desc(e))
    for t in (job, a, a2):
        kex.CloseJob(kex_pb2.CloseJobRequest(job=t), timeout=5)
    s = kex.GetStats(kex_pb2.GetStatsRequest(), timeout=5)
    check("every job closed: GetStats bytes held 0, no job listed", s.bytes_held == 0 and len(s.job_stats) == 0,
          str(s.bytes_held))


def lease_expiry():
    proc, port, ok = start_kexd("--lease", "1")
    if not check("kexd --lease 1 starts", ok):
        stop(proc)
        return
    ch = grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTS)
    kex = kex_pb2_grpc.KexStub(ch)
    idle = kex.OpenJob(kex_pb2.OpenJobRequest(name="idle"), timeout=5).job
    busy = kex.OpenJob(kex_pb2.OpenJobRequest(name="busy"), timeout=5).job
    upload(kex, idle, "uint8", [2 * MiB], b"\1" * (2 * MiB))
    hb = upload(kex, busy, "uint8", [1000], b"\2" * 1000).handle
    s0 = kex.GetStats(kex_pb2.GetStatsRequest(), timeout=5)
    end = time.time() + 2.2
    while time.time() < end:
        kex.GetStats(kex_pb2.GetStatsRequest(job=busy), timeout=5)
        time.sleep(0.3)
    s1 = kex.GetStats(kex_pb2.GetStatsRequest(), timeout=5)
    check("lease expiry frees the idle job's 2 MiB (bytes held 2 MiB + 1000 -> 1000)",
          s0.bytes_held == 2 * MiB + 1000 and s1.bytes_held == 1000 and s1.jobs_expired == 1
          and s1.buffers_freed == s0.buffers_freed + 1, f"{s0.bytes_held} -> {s1.bytes_held}, {s1.jobs_expired}")
    check("the job that kept calling still has its buffer", download(kex, busy, hb)[0] == b"\2" * 1000)
    ch.close()
    rc, _ = sigterm(proc)
    check("kexd --lease 1 exits 0 at SIGTERM", rc == 0, f"rc {rc}")
    stop(proc)


def shares(kex, busy, weights, ms=2.0, items=3000, warm=0.3, window=1.2, late=None):
    """Open jobs with these weights, saturate them, return each job's share of device time over a window."""
    jobs = [kex.OpenJob(kex_pb2.OpenJobRequest(name=f"w{w}-{i}", weight=w), timeout=5).job
            for i, w in enumerate(weights)]
    for i, j in enumerate(jobs):
        if late is not None and i == late:
            continue
        busy(kex_pb2.BusyWorkRequest(job=j, items=items, ms=ms), timeout=10)
    if late is not None:
        time.sleep(1.0)  # the others run alone for a while; the late one must not have banked that as credit
        busy(kex_pb2.BusyWorkRequest(job=jobs[late], items=items, ms=ms), timeout=10)
    time.sleep(warm)
    s0 = [job_stats(kex, j) for j in jobs]
    time.sleep(window)
    s1 = [job_stats(kex, j) for j in jobs]
    dt = [b.device_time_s - a.device_time_s for a, b in zip(s0, s1)]
    saturated = all(x.queued > 0 for x in s1)
    for j in jobs:
        kex.CloseJob(kex_pb2.CloseJobRequest(job=j), timeout=5)
    total = sum(dt) or 1e-9
    return [x / total for x in dt], saturated, total


def fairness():
    proc, port, ok = start_kexd("--test-busy-work", "--device", "cpu", "--grace", "1")
    if not check("kexd --test-busy-work --device cpu starts", ok):
        stop(proc)
        return
    ch = grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTS)
    kex = kex_pb2_grpc.KexStub(ch)
    busy = busy_stub(ch)
    sh, sat, total = shares(kex, busy, [1, 1])
    print(f"info: weights 1:1 -> shares {sh[0] * 100:.1f}% / {sh[1] * 100:.1f}% of {total:.2f} s device time")
    check(f"weights 1:1, both saturating: job 1 gets 50% +- 10 of the device ({sh[0] * 100:.1f}%)",
          sat and abs(sh[0] - 0.5) <= 0.10, f"saturated {sat}, shares {sh}")
    sh, sat, total = shares(kex, busy, [3, 1])
    print(f"info: weights 3:1 -> shares {sh[0] * 100:.1f}% / {sh[1] * 100:.1f}% of {total:.2f} s device time")
    check(f"weights 3:1, both saturating: the weight-3 job gets 75% +- 10 ({sh[0] * 100:.1f}%)",
          sat and abs(sh[0] - 0.75) <= 0.10, f"saturated {sat}, shares {sh}")
    check("the runner is busy for the whole window (device time ~ wall time)", 0.8 * 1.2 <= total <= 1.3,
          f"{total:.2f} s")
    sh, sat, total = shares(kex, busy, [1, 1], late=1, window=0.8)
    print(f"info: 1:1, one job idle for 1 s first -> shares {sh[0] * 100:.1f}% / {sh[1] * 100:.1f}%")
    check(f"a job idle for 1 s banks no credit: after it joins, 1:1 shares stay 50% +- 10 ({sh[1] * 100:.1f}%)",
          sat and abs(sh[1] - 0.5) <= 0.10, f"saturated {sat}, shares {sh}")
    # CloseJob cancels queued work: the device goes idle at once
    j = kex.OpenJob(kex_pb2.OpenJobRequest(name="cancel"), timeout=5).job
    busy(kex_pb2.BusyWorkRequest(job=j, items=5000, ms=2), timeout=10)
    time.sleep(0.1)
    kex.CloseJob(kex_pb2.CloseJobRequest(job=j), timeout=5)
    j2 = kex.OpenJob(kex_pb2.OpenJobRequest(name="after"), timeout=5).job
    t0 = time.time()
    busy(kex_pb2.BusyWorkRequest(job=j2, items=1, ms=1), timeout=10)
    while job_stats(kex, j2).items_done < 1 and time.time() - t0 < 5:
        time.sleep(0.005)
    took = time.time() - t0
    check(f"CloseJob cancels the job's ~10 s of queued work: the next job's item runs in {took * 1e3:.0f} ms",
          took < 0.5, f"{took:.2f} s")
    e = rpc_error(busy, kex_pb2.BusyWorkRequest(job=j2, items=1, ms=5000), timeout=5)
    check("_BusyWork with ms over its limit: INVALID_ARGUMENT",
          e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT, desc(e))
    # SIGTERM with ~50 s of items queued for two jobs (and a buffer held): exit 0, promptly
    for w in (1, 2):
        j = kex.OpenJob(kex_pb2.OpenJobRequest(name=f"term{w}", weight=w), timeout=5).job
        busy(kex_pb2.BusyWorkRequest(job=j, items=5000, ms=5), timeout=10)
    upload(kex, j2, "uint8", [MiB], b"\0" * MiB)
    gate = []

    def hanging():
        yield kex_pb2.UploadRequest(job=j2, header=kex_pb2.UploadHeader(dtype="uint8", shape=[1000]))
        yield kex_pb2.UploadRequest(chunk=b"\0" * 10)
        while not gate:
            time.sleep(0.01)
    fut = kex.Upload.future(hanging(), timeout=30)
    time.sleep(0.2)
    rc, took = sigterm(proc)
    gate.append(1)
    e = rpc_error(fut.result)
    check("the Upload stream open at SIGTERM ends with an error status (not a hang)", e is not None, desc(e))
    ch.close()
    out = read_log(proc)
    check(f"SIGTERM with ~50 s of device work queued and an Upload open: exit 0 in {took:.2f} s (grace 1 s)",
          rc == 0 and took < 5,
          f"rc {rc}; {out[-500:]}")
    check("the busy-work kexd log is free of sanitizer reports and crashes", log_clean(out), out[-800:])
    stop(proc)


def not_served_without_flag():
    proc, port, ok = start_kexd("--device", "cpu,opencl:no-such-device")
    if check("kexd without --test-busy-work, devices cpu,opencl:no-such-device starts", ok):
        ch = grpc.insecure_channel(f"127.0.0.1:{port}")
        e = rpc_error(busy_stub(ch), kex_pb2.BusyWorkRequest(items=1, ms=1), timeout=5)
        check("without --test-busy-work, _BusyWork is UNIMPLEMENTED",
              e is not None and e.code() == grpc.StatusCode.UNIMPLEMENTED, desc(e))
        kex = kex_pb2_grpc.KexStub(ch)
        j = kex.OpenJob(kex_pb2.OpenJobRequest(name="nodev"), timeout=5).job
        e = rpc_error(upload, kex, j, "uint8", [4], b"abcd", device="opencl:no-such-device")
        check("Upload to a device that cannot be opened: UNAVAILABLE saying so (twice: it is retried), no crash",
              e is not None and e.code() == grpc.StatusCode.UNAVAILABLE and "cannot be opened" in e.details()
              and "cannot be opened" in desc(rpc_error(upload, kex, j, "uint8", [4], b"abcd",
                                                       device="opencl:no-such-device")), desc(e))
        r = upload(kex, j, "uint8", [4], b"abcd")
        check("... and the cpu device keeps working", download(kex, j, r.handle)[0] == b"abcd")
        s = kex.GetStats(kex_pb2.GetStatsRequest(job=j), timeout=5)
        check("the failed uploads reserve nothing", s.job_stats[0].bytes_reserved == 0 and s.bytes_held == 4, str(s))
        ch.close()
    stop(proc)


def main():
    ch = grpc.insecure_channel(f"127.0.0.1:{PORT}", options=CHANNEL_OPTS)
    kex = kex_pb2_grpc.KexStub(ch)
    buffers(kex)
    ch.close()
    lease_expiry()
    fairness()
    not_served_without_flag()


if __name__ == "__main__":
    run(main, "test_jobs.py")
