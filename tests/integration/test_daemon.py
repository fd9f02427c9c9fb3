"""test_daemon.py - a real kexd, driven over gRPC by the Debian python (grpcio).

Run by test_daemon.sh, which starts the kexd under test and passes, in the
environment: KEXD (the binary), KEXD_PORT (where it listens, started with
--max-message KEXD_MAX_MESSAGE), KEX_STUBS (a folder with the generated
kex/v1/kex_pb2*.py and health_pb2*.py), KEX_CASES_DIR (the scheduler cases),
KEXD_TMP (a scratch folder).  Some checks start their own kexd (second on the
same port, SIGTERM, lease, --plan-warm-bytes; kexdtest, logs in KEXD_TMP).
Prints one line per check ("ok - ..." / "FAIL - ...") and, last,
"N passed, N failed".  Exit status 1 when anything failed.
"""
import base64
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.environ["KEX_STUBS"])

import grpc  # noqa: E402
import health_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402
from kex.v1 import kex_pb2, kex_pb2_grpc  # noqa: E402
import kexdtest  # noqa: E402
from kexdtest import check, exit_status, graph_pb, launch, rpc_error, run, sigterm, stop, wait_healthy  # noqa: E402

KEXD = os.environ["KEXD"]
PORT = int(os.environ["KEXD_PORT"])
MAX_MESSAGE = int(os.environ["KEXD_MAX_MESSAGE"])
CASES_DIR = os.environ["KEX_CASES_DIR"]
TMP = os.environ["KEXD_TMP"]
CHANNEL_OPTS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


def start_kexd(*args):
    return kexdtest.start_kexd(KEXD, TMP, *args)


def plan_warm_checks():
    """--plan-warm-bytes on both sides: every case's Plan reply (both rule sets, twice over, so each graph meets the
    views the others left) is the same from a kexd with warm states off, one with room to keep them (on the loop
    thread, and on the worker pool), and one whose 1-byte limit empties its state after every Plan; the debug log
    says which kept and which reset."""
    names = json.load(open(os.path.join(CASES_DIR, "INDEX.json")))
    graphs = [graph_pb(json.load(open(os.path.join(CASES_DIR, n + ".json")))["graph"]) for n in names]
    variants = [("off", ["--plan-warm-bytes", "0"]), ("64 MiB", ["--plan-warm-bytes", str(64 << 20)]),
                ("1 byte", ["--plan-warm-bytes", "1"]),
                ("64 MiB, worker pool", ["--plan-warm-bytes", str(64 << 20), "--plan-inline-nodes", "0"])]
    replies, logs = {}, {}
    for label, args in variants:
        proc, port = launch(KEXD, TMP, "--log", "debug", "--metrics", "off", "--device", "opencl,cpu", *args)
        logs[label] = proc.log
        try:
            if not check(f"kexd --plan-warm-bytes ({label}) starts", wait_healthy(port, proc)):
                return
            ch = grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTS)
            k = kex_pb2_grpc.KexStub(ch)
            job = k.OpenJob(kex_pb2.OpenJobRequest(name="warm"), timeout=5).job
            out = []
            for _ in range(2):
                for g in graphs:
                    for dev in ("opencl", "cpu"):
                        g.device = dev
                        try:
                            r = k.Plan(kex_pb2.PlanRequest(job=job, graph=g), timeout=60)
                            r.schedule_us = 0
                            out.append(r.SerializeToString())
                        except grpc.RpcError as e:
                            out.append(f"{e.code()} {e.details()}".encode())
            replies[label] = out
            ch.close()
            rc, _ = sigterm(proc, timeout=20)
            check(f"kexd --plan-warm-bytes ({label}) exits 0 at SIGTERM (under ASan: nothing leaked)", rc == 0,
                  f"rc {rc}")
        finally:
            stop(proc)
    ref = replies["off"]
    for label, _ in variants[1:]:
        same = [i for i, (a, b) in enumerate(zip(ref, replies[label])) if a != b]
        check(f"--plan-warm-bytes {label}: all {len(ref)} Plan replies are the ones with warm states off",
              len(replies[label]) == len(ref) and not same, f"first differing Plan: {same[:1]}")
    nplans = len(ref)

    def warm_lines(label):
        return [tuple(int(x) for x in m.groups()) for m in
                re.finditer(r"warm state (\d+) bytes after (\d+) replays, (\d+) resets", open(logs[label]).read())]
    check("--plan-warm-bytes 0: no Plan keeps a warm state", warm_lines("off") == [] and nplans > 100,
          str(warm_lines("off")[:1]))
    w = warm_lines("64 MiB")
    check(f"--plan-warm-bytes 64 MiB: the loop thread's state served all {nplans} Plans without a reset, under "
          "the limit", len(w) == nplans and w[-1][1] == nplans and w[-1][2] == 0 and 0 < w[-1][0] <= 64 << 20,
          str(w[-1:]))
    w = warm_lines("1 byte")
    check("--plan-warm-bytes 1: the state is emptied after every Plan (0 bytes kept)",
          len(w) == nplans and w[-1][1] == nplans and w[-1][2] == nplans and all(b == 0 for b, _, _ in w),
          str(w[-1:]))
    w = warm_lines("64 MiB, worker pool")
    check("--plan-warm-bytes 64 MiB on the worker pool: each thread's state keeps, none resets",
          len(w) == nplans and all(r == 0 for _, _, r in w) and max(n for _, n, _ in w) > 1, str(w[-1:]))


def main():
    ch = grpc.insecure_channel(f"127.0.0.1:{PORT}", options=CHANNEL_OPTS)
    kex = kex_pb2_grpc.KexStub(ch)
    health = health_pb2_grpc.HealthStub(ch)

    # health
    r = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
    check("health: Check('') is SERVING", r.status == health_pb2.HealthCheckResponse.SERVING, str(r))
    r = health.Check(health_pb2.HealthCheckRequest(service="kex.v1.Kex"), timeout=5)
    check("health: Check('kex.v1.Kex') is SERVING", r.status == health_pb2.HealthCheckResponse.SERVING, str(r))
    e = rpc_error(health.Check, health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
    check("health: an unknown service is NOT_FOUND", e is not None and e.code() == grpc.StatusCode.NOT_FOUND,
          repr(e))

    # jobs
    tokens = [kex.OpenJob(kex_pb2.OpenJobRequest(name=f"t{i}", weight=1), timeout=5).job for i in range(8)]
    check("OpenJob: 8 tokens are distinct", len(set(tokens)) == 8, str(tokens))
    check("OpenJob: tokens are >= 32 hex characters, then \".NODE@ADVERTISE\" (the node that holds the job)",
          all(all(c in "0123456789abcdef" for c in t[:32]) and t[32:] == f".127.0.0.1:{PORT}@127.0.0.1:{PORT}"
              for t in tokens), str(tokens))
    job = tokens[0]
    small = graph_pb({"nodes": [{"op": "EMPTY", "dtype": "float32", "shape": [10]},
                                {"op": "EMPTY", "dtype": "float32", "shape": [10]},
                                {"op": "ADD", "src": [0, 1]}], "outputs": [2]})
    r = kex.Plan(kex_pb2.PlanRequest(job=tokens[1], graph=small), timeout=5)
    check("Plan with an open job works", r.kernels == 1, str(r))
    kex.CloseJob(kex_pb2.CloseJobRequest(job=tokens[1]), timeout=5)
    e = rpc_error(kex.Plan, kex_pb2.PlanRequest(job=tokens[1], graph=small), timeout=5)
    check("CloseJob, then Plan with its token: NOT_FOUND", e is not None and e.code() == grpc.StatusCode.NOT_FOUND,
          repr(e))
    e = rpc_error(kex.CloseJob, kex_pb2.CloseJobRequest(job=tokens[1]), timeout=5)
    check("CloseJob twice: NOT_FOUND", e is not None and e.code() == grpc.StatusCode.NOT_FOUND, repr(e))
    e = rpc_error(kex.Plan, kex_pb2.PlanRequest(job="0" * 32, graph=small), timeout=5)
    check("a guessed token: NOT_FOUND", e is not None and e.code() == grpc.StatusCode.NOT_FOUND, repr(e))
    e = rpc_error(kex.Plan, kex_pb2.PlanRequest(graph=small), timeout=5)
    check("no token: INVALID_ARGUMENT", e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT, repr(e))

    # unknown method
    nope = ch.unary_unary("/kex.v1.Kex/Nope")
    t0 = time.time()
    e = rpc_error(nope, b"", timeout=5)
    check("unknown method /kex.v1.Kex/Nope: UNIMPLEMENTED at once",
          e is not None and e.code() == grpc.StatusCode.UNIMPLEMENTED and time.time() - t0 < 1, repr(e))

    # every case
    names = json.load(open(os.path.join(CASES_DIR, "INDEX.json")))
    lat = []
    for name in names:
        case = json.load(open(os.path.join(CASES_DIR, name + ".json")))
        want = case["kernels"]["opencl"]
        req = kex_pb2.PlanRequest(job=job, graph=graph_pb(case["graph"]))
        try:
            t0 = time.perf_counter()
            r = kex.Plan(req, timeout=60)
            lat.append((name, time.perf_counter() - t0, r.schedule_us, len(case["graph"]["nodes"])))
            labels_ok = [i.label for i in r.items] == case["items"] if case.get("items") and \
                case["kernels"]["opencl"] == case["kernels"].get("cpu") else True
            check(f"Plan {name}: {r.kernels} kernels (tinygrad: {want})", r.kernels == want and labels_ok,
                  f"items {[i.label for i in r.items]}")
        except grpc.RpcError as e:
            check(f"Plan {name}", False, f"{e.code()} {e.details()}")

    # bad graph: a reshape that changes the element count
    bad = graph_pb({"nodes": [{"op": "EMPTY", "dtype": "float32", "shape": [4, 4]},
                              {"op": "RESHAPE", "src": [0], "arg": [5]}], "outputs": [1]})
    e = rpc_error(kex.Plan, kex_pb2.PlanRequest(job=job, graph=bad), timeout=5)
    check("Plan of a reshape 16 -> 5 elements: INVALID_ARGUMENT naming node 1",
          e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT and "node 1" in e.details(),
          repr(e) if e is None else f"{e.code()} {e.details()}")
    r = kex.Plan(kex_pb2.PlanRequest(job=job, graph=small), timeout=5)
    check("kexd keeps serving after a bad graph", r.kernels == 1)
    bad = graph_pb({"nodes": [{"op": "EMPTY", "dtype": "float32", "shape": [4]},
                              {"op": "PERMUTE", "src": [0], "arg": [0]}], "outputs": [1]})
    bad.nodes[1].ClearField("order")
    bad.nodes[1].new_shape.values.extend([4])
    e = rpc_error(kex.Plan, kex_pb2.PlanRequest(job=job, graph=bad), timeout=5)
    check("PERMUTE with new_shape instead of order: INVALID_ARGUMENT naming node 1",
          e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT and "node 1" in e.details(), repr(e))
    bad = graph_pb({"nodes": [{"op": "BUFFER", "dtype": "float32", "shape": [4], "buffer": "h123"}], "outputs": [0]})
    e = rpc_error(kex.Plan, kex_pb2.PlanRequest(job=job, graph=bad), timeout=5)
    check("an unknown buffer handle: NOT_FOUND naming node 0",
          e is not None and e.code() == grpc.StatusCode.NOT_FOUND and "node 0" in e.details(), repr(e))
    bad = graph_pb({"nodes": [{"op": "EMPTY", "dtype": "float32", "shape": [4]},
                              {"op": "ADD", "src": [0, 1]}], "outputs": [1]})
    e = rpc_error(kex.Plan, kex_pb2.PlanRequest(job=job, graph=bad), timeout=5)
    check("a source that is not earlier: INVALID_ARGUMENT naming node 1",
          e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT and "node 1" in e.details(), repr(e))
    bad = graph_pb({"nodes": [{"op": "EMPTY", "dtype": "float32", "shape": [2] * 17}], "outputs": [0]})
    e = rpc_error(kex.Plan, kex_pb2.PlanRequest(job=job, graph=bad), timeout=5)
    check("17 dims (limit 16): RESOURCE_EXHAUSTED naming node 0 and --max-dims",
          e is not None and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "node 0" in e.details() and
          "(--max-dims)" in e.details(), repr(e))
    plan_raw = ch.unary_unary("/kex.v1.Kex/Plan")
    e = rpc_error(plan_raw, b"\xff\xff\xff\xff", timeout=5)
    check("Plan of bytes that are not a PlanRequest: INVALID_ARGUMENT",
          e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT, repr(e))
    r = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
    check("kexd keeps serving after malformed bytes", r.status == health_pb2.HealthCheckResponse.SERVING)

    # a message over --max-message
    n = MAX_MESSAGE // 4 + 1024
    big = graph_pb({"nodes": [{"op": "BUFFER", "dtype": "float32", "shape": [n],
                               "data": base64.b64encode(b"\0" * (4 * n)).decode()}], "outputs": [0]})
    e = rpc_error(kex.Plan, kex_pb2.PlanRequest(job=job, graph=big), timeout=20)
    check(f"a {4 * n}-byte request (limit {MAX_MESSAGE}): RESOURCE_EXHAUSTED",
          e is not None and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, repr(e))
    n = MAX_MESSAGE // 8
    fits = graph_pb({"nodes": [{"op": "BUFFER", "dtype": "float32", "shape": [n],
                                "data": base64.b64encode(b"\0" * (4 * n)).decode()}], "outputs": [0]})
    r = kex.Plan(kex_pb2.PlanRequest(job=job, graph=fits), timeout=20)
    check(f"a {4 * n}-byte request under the limit is planned", r.kernels == 0 and len(r.items) == 0, str(r)[:200])

    # Submit is served (test_submit.sh checks it in depth)
    evs = []
    e = rpc_error(lambda: evs.extend(kex.Submit(kex_pb2.SubmitRequest(job=job, graph=small), timeout=60)))
    check("Submit: the stream ends with done", e is None and evs and evs[-1].WhichOneof("event") == "done",
          repr(e) if e is not None else str(evs[-1:])[:200])

    # a done event over --max-message (its inline bytes): RESOURCE_EXHAUSTED naming the limit, after the progress
    # events -- also when they are batched (they would have gone out with the done event)
    n = MAX_MESSAGE // 4 + 1024
    huge = graph_pb({"nodes": [{"op": "EMPTY", "dtype": "float32", "shape": [n]},
                               {"op": "EMPTY", "dtype": "float32", "shape": [n]},
                               {"op": "ADD", "src": [0, 1]}], "outputs": [2]})
    for batched in (False, True):
        for _ in range(2):  # the second: structure cached and the kernel quick last time (a batched stream holds)
            evs = []
            e = rpc_error(lambda: evs.extend(kex.Submit(kex_pb2.SubmitRequest(job=job, graph=huge, free_outputs=True,
                                                                              batched_events=batched), timeout=60)))
        kinds = [x.WhichOneof("event") for m in evs for x in (m, *m.following)]
        check(f"a {4 * n}-byte done event (limit {MAX_MESSAGE}){' batched' if batched else ''}: RESOURCE_EXHAUSTED "
              "naming --max-message, after accepted, scheduled and running",
              e is not None and e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-message" in e.details() and
              kinds[:2] == ["accepted", "scheduled"] and "running" in kinds and "done" not in kinds,
              f"{kinds} {e!r}"[:300])

    # Tune and the cache RPCs are served (test_tune.sh checks them in depth; this kexd has no --cache of its own,
    # so only requests that are refused before any cache access)
    e = rpc_error(lambda: next(kex.Tune(kex_pb2.TuneRequest(job=job), timeout=5)))
    check("Tune without a graph: INVALID_ARGUMENT (served)",
          e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT and "graph" in e.details(), repr(e))
    e = rpc_error(kex.ListCache, kex_pb2.ListCacheRequest(job="no-such-job"), timeout=5)
    check("ListCache with an unknown job: NOT_FOUND (served)", e is not None and e.code() == grpc.StatusCode.NOT_FOUND,
          repr(e))
    e = rpc_error(kex.Upload, iter([kex_pb2.UploadRequest(job=job)]), timeout=5)
    check("Upload (client stream) without a header: INVALID_ARGUMENT (test_jobs.py covers buffers)",
          e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT and "header" in e.details(), repr(e))

    # devices and stats
    r = kex.ListDevices(kex_pb2.ListDevicesRequest(), timeout=5)
    check("ListDevices: the configured devices, the first is the default",
          [d.name for d in r.devices][:2] == ["opencl", "cpu"] and r.devices[0].is_default, str(r))
    s = kex.GetStats(kex_pb2.GetStatsRequest(), timeout=5)
    check("GetStats: jobs opened/closed and plans counted",
          s.jobs_opened >= 8 and s.jobs_closed >= 1 and s.plans >= len(names) and s.plan_errors >= 5
          and s.kernels_planned > 0 and s.calls > len(names), str(s))

    # Plan latency (information, not a check: timing targets live in bench/)
    small_lat = []
    for _ in range(200):
        t0 = time.perf_counter()
        kex.Plan(kex_pb2.PlanRequest(job=job, graph=small), timeout=5)
        small_lat.append(time.perf_counter() - t0)
    print(f"info: Plan round trip, 3-node graph: p50 {statistics.median(small_lat) * 1e6:.0f} us "
          f"(200 calls); all {len(lat)} cases: {sum(x[1] for x in lat) * 1e3:.0f} ms total, "
          f"slowest {max(lat, key=lambda x: x[1])[0]} {max(x[1] for x in lat) * 1e3:.1f} ms "
          f"(schedule {max(lat, key=lambda x: x[1])[2]:.0f} us)")
    ch.close()

    # a second kexd on the same port
    p = subprocess.run([KEXD, "--listen", f"127.0.0.1:{PORT}"], capture_output=True, text=True, timeout=20)
    check("a second kexd on the same port exits 1 saying the address is in use",
          p.returncode == 1 and "in use" in p.stderr, f"rc {p.returncode}: {p.stderr[-300:]}")

    # SIGTERM with a call in flight (a health Watch stream): the stream ends cleanly, kexd exits 0
    proc, port, ok = start_kexd("--grace", "1")
    if check("kexd for the SIGTERM check starts", ok):
        ch2 = grpc.insecure_channel(f"127.0.0.1:{port}")
        watch = health_pb2_grpc.HealthStub(ch2).Watch(health_pb2.HealthCheckRequest(), timeout=30)
        first = next(watch)
        t0 = time.time()
        proc.send_signal(signal.SIGTERM)
        rest = []
        err = None
        try:
            rest = [m.status for m in watch]
        except grpc.RpcError as e:
            err = e
        rc = exit_status(proc, 10)
        took = time.time() - t0
        check("SIGTERM: the in-flight Watch stream gets NOT_SERVING and ends OK",
              first.status == health_pb2.HealthCheckResponse.SERVING and err is None
              and rest == [health_pb2.HealthCheckResponse.NOT_SERVING], f"{rest} {err!r}")
        check(f"SIGTERM with a call in flight: exit 0 (in {took:.2f} s, grace 1 s)", rc == 0 and took < 5,
              f"rc {rc}")
        ch2.close()
    stop(proc)

    plan_warm_checks()

    # SIGTERM with a unary call in flight on the worker pool (large graph, --plan-inline-nodes 0)
    proc, port, ok = start_kexd("--grace", "5", "--plan-inline-nodes", "0")
    if check("kexd for the SIGTERM-during-Plan check starts", ok):
        ch3 = grpc.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTS)
        k3 = kex_pb2_grpc.KexStub(ch3)
        j3 = k3.OpenJob(kex_pb2.OpenJobRequest(name="sigterm"), timeout=5).job
        chain = [{"op": "EMPTY", "dtype": "float32", "shape": [64, 64]}]
        for i in range(4000):
            chain.append({"op": "ADD" if i % 2 else "MUL", "src": [len(chain) - 1, 0]})
            if i % 50 == 49:
                chain.append({"op": "CONTIGUOUS", "src": [len(chain) - 1]})
        fut = k3.Plan.future(kex_pb2.PlanRequest(job=j3, graph=graph_pb({"nodes": chain,
                                                                          "outputs": [len(chain) - 1]})), timeout=60)
        time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        try:
            r = fut.result()
            res = f"{r.kernels} kernels"
        except grpc.RpcError as e:
            res = f"{e.code()} {e.details()}"
        rc = exit_status(proc, 15)
        check(f"SIGTERM during a Plan: the Plan finishes ({res}) and kexd exits 0", rc == 0 and "kernels" in res,
              f"rc {rc}")
        ch3.close()
    stop(proc)

    # lease expiry
    proc, port, ok = start_kexd("--lease", "1")
    if check("kexd --lease 1 starts", ok):
        ch4 = grpc.insecure_channel(f"127.0.0.1:{port}")
        k4 = kex_pb2_grpc.KexStub(ch4)
        idle = k4.OpenJob(kex_pb2.OpenJobRequest(name="idle"), timeout=5).job
        busy = k4.OpenJob(kex_pb2.OpenJobRequest(name="busy"), timeout=5).job
        r = k4.Plan(kex_pb2.PlanRequest(job=idle, graph=small), timeout=5)
        end = time.time() + 2.2
        while time.time() < end:
            k4.Plan(kex_pb2.PlanRequest(job=busy, graph=small), timeout=5)
            time.sleep(0.3)
        e = rpc_error(k4.Plan, kex_pb2.PlanRequest(job=idle, graph=small), timeout=5)
        check("lease 1 s: an idle job's token is NOT_FOUND after 2.2 s",
              e is not None and e.code() == grpc.StatusCode.NOT_FOUND, repr(e))
        e = rpc_error(k4.Plan, kex_pb2.PlanRequest(job=busy, graph=small), timeout=5)
        check("lease 1 s: a job used every 0.3 s is still open after 2.2 s", e is None, repr(e))
        s = k4.GetStats(kex_pb2.GetStatsRequest(), timeout=5)
        check("GetStats counts the expired job", s.jobs_expired == 1 and s.jobs_open == 1, str(s))
        ch4.close()
        rc, _ = sigterm(proc)
        check("kexd --lease 1 exits 0 at SIGTERM", rc == 0, f"rc {rc}")
    stop(proc)


if __name__ == "__main__":
    run(main, "test_daemon.py")
