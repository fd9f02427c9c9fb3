"""test_trace.py - a Submit's trace (SubmitRequest.trace, Done.trace_json) against a real kexd.

Run by test_trace.sh with KEXD, KEX_STUBS, KEXD_TMP and KEX_CLI in the
environment.  One kexd on the cpu device with a fresh SQLite cache.  A
two-kernel graph submitted with trace=True: the JSON parses as Chrome
trace-event format (every event has ph/pid/tid/ts, "X" events a dur, tracks
named by "M" events), holds the request, plan, lowering, compile, queue-wait,
run and output spans, and its run spans name the kernels of the done event in
order.  The same graph again: a structure-cache hit (no lowering, no compile
spans), run spans again.  Without trace: no trace_json.  `kex run --trace`
writes the same kind of file.  Prints "ok - ..." / "FAIL - ..." per check
and last "N passed, N failed".
"""
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.environ["KEX_STUBS"])

import grpc  # noqa: E402
from kex.v1 import kex_pb2, kex_pb2_grpc  # noqa: E402
from kexdtest import check, launch, log_clean, read_log, run, stop, wait_healthy  # noqa: E402

KEXD = os.environ["KEXD"]
TMP = os.environ["KEXD_TMP"]
CLI = os.environ["KEX_CLI"]
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def graph():
    """a = arange(256).reshape(16,16); s = a.sum(1); m = (a + s).max(0): two kernels, outputs [m, s]."""
    N = kex_pb2.Node
    a = N(op="BUFFER", dtype="float32", shape=[16, 16], fill_arange=True)
    s = N(op="REDUCE_SUM", src=[0], axis=[1])
    e = N(op="EXPAND", src=[1], new_shape=kex_pb2.Ints(values=[16, 16]))
    d = N(op="ADD", src=[0, 2])
    m = N(op="REDUCE_MAX", src=[3], axis=[0])
    return kex_pb2.Graph(device="cpu", nodes=[a, s, e, d, m], outputs=[4, 1])


def submit(stub, job, trace):
    done = None
    for ev in stub.Submit(kex_pb2.SubmitRequest(job=job, graph=graph(), return_bytes=True, trace=trace), timeout=120):
        if ev.WhichOneof("event") == "done":
            done = ev.done
    return done


def spans(doc, cat=None):
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and (cat is None or e["cat"] == cat)]


def well_formed(doc, label):
    evs = doc.get("traceEvents")
    check(f"{label}: traceEvents is a list of events", isinstance(evs, list) and len(evs) > 0)
    if not isinstance(evs, list):
        return
    bad = [e for e in evs if not {"name", "ph", "pid"} <= set(e) or (e["ph"] == "X" and not {"ts", "dur", "tid"} <= set(e))]
    check(f"{label}: every event has name/ph/pid (and X events ts/dur/tid)", not bad, bad[:2])
    tracks = {e["tid"]: e["args"]["name"] for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    used = {e["tid"] for e in spans(doc)}
    check(f"{label}: every span's track is named", used <= set(tracks), (used, tracks))
    check(f"{label}: durations are >= 0", all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans(doc)))
    ts = [e["ts"] for e in spans(doc)]
    check(f"{label}: spans are sorted by start", ts == sorted(ts))
    return tracks


def main():
    proc, port = launch(KEXD, TMP, "--device", "cpu", "--cache", os.path.join(TMP, "trace-cache.db"))
    try:
        if not check("kexd answers health", wait_healthy(port, proc)):
            return
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = kex_pb2_grpc.KexStub(ch)
            job = stub.OpenJob(kex_pb2.OpenJobRequest(name="trace")).job
            d1 = submit(stub, job, True)
            check("traced Submit: a done event", d1 is not None)
            kernels = [k.kernel for k in d1.kernels]
            check("the graph runs as 2 kernels", len(kernels) == 2, kernels)
            m = struct.unpack("16f", d1.outputs[0].data)
            s = struct.unpack("16f", d1.outputs[1].data)
            check("outputs are right (s = 256i + 120, m = 4200 + j)",
                  list(s) == [256 * i + 120 for i in range(16)] and list(m) == [4200 + j for j in range(16)], (s, m))
            check("Done.trace_json is set", bool(d1.trace_json))
            doc = json.loads(d1.trace_json)
            tracks = well_formed(doc, "first")
            names = {e["name"] for e in spans(doc)}
            for n in ["decode (protobuf)", "validate + graph from protobuf", "structure cache: miss", "replay + schedule", "queue wait (fair queue)",
                      "setup: load programs, allocate, inputs in", "outputs: device to host, free", "done event",
                      "program cache: SQLite lookup"]:
                check(f"first: a '{n}' span", n in names, sorted(names))
            lowered = [e["name"] for e in spans(doc, "lower")]
            check("first: one lower span per kernel, the done event's names in order", lowered == kernels,
                  (lowered, kernels))
            compiled = sorted(e["name"] for e in spans(doc, "compile") if e["name"] in kernels)
            check("first: a compile span per kernel (a fresh cache compiles both)", compiled == sorted(kernels), compiled)
            runs = [e for e in spans(doc, "run") if e["name"] in kernels]
            check("first: run spans name the kernels in order", [e["name"] for e in runs] == kernels, runs)
            check("first: run spans are on the device track", all(tracks[e["tid"]] == "device cpu" for e in runs),
                  [tracks.get(e["tid"]) for e in runs])
            check("first: run spans say which kernel of how many",
                  [e["args"]["detail"] for e in runs] == [f"kernel {i + 1} of 2" for i in range(2)], runs)
            total = max(e["ts"] + e["dur"] for e in spans(doc)) - min(e["ts"] for e in spans(doc))
            check("first: the trace spans no more than the submission's total_us", total <= d1.total_us + 1000,
                  (total, d1.total_us))
            q = [e for e in spans(doc) if e["name"] == "queue wait (fair queue)"]
            setup = [e for e in spans(doc) if e["name"].startswith("setup")]
            check("first: the queue wait ends where setup starts", q and setup and q[0]["ts"] + q[0]["dur"] <= setup[0]["ts"] + 1,
                  (q, setup))
            check("otherData names the submission", "Submit" in doc.get("otherData", {}).get("label", ""), doc.get("otherData"))

            d2 = submit(stub, job, True)
            doc2 = json.loads(d2.trace_json) if d2 and d2.trace_json else {"traceEvents": []}
            well_formed(doc2, "second")
            names2 = {e["name"] for e in spans(doc2)}
            check("second: a structure-cache hit", "structure cache: hit" in names2, sorted(names2))
            check("second: no lowering and no compile", not spans(doc2, "lower") and not spans(doc2, "compile"),
                  sorted(names2))
            check("second: the kernels ran again", [e["name"] for e in spans(doc2, "run") if e["name"] in kernels] == kernels)

            d3 = submit(stub, job, False)
            check("untraced Submit: no trace_json", d3 is not None and d3.trace_json == "")

        # the CLI: kex --server ADDR run --trace FILE
        out = os.path.join(TMP, "cli-trace.json")
        r = subprocess.run([CLI, "--server", f"127.0.0.1:{port}", "run", "--trace", out,
                            os.path.join(ROOT, "examples", "graphs", "add.json")], capture_output=True, text=True,
                           timeout=120)
        check("kex run --trace exits 0", r.returncode == 0, r.stderr[-500:])
        try:
            cdoc = json.load(open(out))
        except (OSError, ValueError) as e:
            cdoc = {"traceEvents": []}
            check("kex run --trace wrote JSON", False, repr(e))
        cruns = [e for e in spans(cdoc, "run") if e["name"] != "copy"]
        check("kex run --trace: the file has the run spans", len(cruns) >= 1, cdoc)
        notdir = os.path.join(TMP, "a-file")
        open(notdir, "w").close()
        bad_path = os.path.join(notdir, "t.json")  # under a regular file: ENOTDIR
        r = subprocess.run([CLI, "--server", f"127.0.0.1:{port}", "run", "--trace", bad_path,
                            os.path.join(ROOT, "examples", "graphs", "add.json")], capture_output=True, text=True,
                           timeout=120)
        check("kex run --trace to an unwritable path fails naming it",
              r.returncode != 0 and bad_path in r.stderr, r.stderr[-300:])
    finally:
        rc = stop(proc)
    text = read_log(proc)
    check("kexd exits 0 at SIGTERM", rc == 0, rc)
    check("the kexd log is free of sanitizer reports", log_clean(text), text[-1500:])


run(main, "test_trace")
