"""bench/rpc.py - kexd RPC latency and throughput from a Python grpcio client.

Starts its own kexd (--device cpu, a fresh --cache in a temporary directory)
and measures, for `--seconds` each after a warm-up, at 1 and 8 calls in
flight (8 client threads on one channel).  The seconds are split in
`--rounds` rounds that take turns over the kinds, so a change of the
machine's load weighs on every kind alike; ratio_to_health_rounds is the
median over rounds of a round's p50 over that round's health p50.

  health         grpc.health.v1.Health/Check                the RPC floor
  submit         a tiny cached Submit with default options  one RPC, every event; freeing the
                 (16-element add, same structure every      buffers is the client's own later
                 call, every event, the output kept as a    call: each thread frees 64 handles
                 job buffer with its bytes inline)          with one Free, outside the latency
  submit_free    the same + a Free of its output after      the whole Submit path with
                 each: two RPCs                             both caches hit: two RPCs
  submit_inline  the same with free_outputs: the output     one RPC, every event
                 comes inline and is not kept, no Free
  submit_min     free_outputs + only_done: the stream is    one RPC, one message
                 the done event alone
  submit_batched "submit" with batched_events, as kex's     one RPC, every event; a quick
                 clients send it                            Submit's stream is one message
  client_submit  kex.Client.submit (client/python), its     what a Python user of kex pays
                 defaults; handles freed later as "submit"

plus single-shot Submit latencies: first Submit (structure miss + compile),
repeated Submit (structure hit), a new structure whose programs are already
loaded (structure miss, program memory hit), and first Submit after a restart
with the same --cache (program from SQLite).  Outputs are freed as it goes.
Then it runs the C half, build/bench_rpc (bench/rpc_c.c: the same calls from
gRPC C core and through libkex, against a kexd of its own), and writes both
halves to bench/results/rpc.json (p50/p99 in us, calls/s, each with its ratio
to the health check of the same run).  Client and server share this
machine's cores.

Usage: /usr/bin/python3 bench/rpc.py [--kexd build/daemon/kexd] [--bench-rpc build/bench_rpc] [--seconds 2]
                                    [--rounds 10] [--out bench/results/rpc.json]
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from ports import free_port  # noqa: E402


def stubs(tmp):
    """The health stubs (kex's own come with the kex package, client/python)."""
    subprocess.check_call([sys.executable, "-m", "grpc_tools.protoc", "-I",
                           os.path.join(ROOT, "proto/grpc/health/v1"), f"--python_out={tmp}",
                           f"--grpc_python_out={tmp}", "health.proto"])
    sys.path.insert(0, tmp)




def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def cpu_s(pid):
    """CPU seconds (user + system) process pid has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(r):
    """The issue's numbers: health and default-Submit p50 at 1 in flight, their ratio, submissions/s at 8 in
    flight, for the C client and this Python one (and the same of r["before"] when present)."""
    def one(x):
        out = {}
        for who, d in (("python", x), ("c", x.get("c", {}))):
            if "submit_inflight1" not in d:
                continue
            out[who] = {"load_average_before": d.get("load_average_before"),
                        "health_p50_us": round(d["health_inflight1"]["p50_us"], 1),
                        "submit_p50_us": round(d["submit_inflight1"]["p50_us"], 1),
                        "submit_ratio_to_health": round(d["submit_inflight1"]["ratio_to_health_rounds"], 2),
                        "submit_per_s_inflight8": round(d["submit_inflight8"]["calls_per_s"])}
            # the client libraries' Submit (batched events): kex.Client from Python, libkex from C
            for row in ("submit_batched", "client_submit", "libkex", "batched_async"):
                if f"{row}_inflight1" in d:
                    out[who][f"{row}_p50_us"] = round(d[f"{row}_inflight1"]["p50_us"], 1)
                    out[who][f"{row}_ratio_to_health"] = round(d[f"{row}_inflight1"].get(
                        "ratio_to_health_rounds", d[f"{row}_inflight1"].get("ratio_to_health", 0)), 2)
                    out[who][f"{row}_per_s_inflight8"] = round(d[f"{row}_inflight8"]["calls_per_s"])
            if "health_async_inflight8" in d:  # one client thread driving all 8 calls
                out[who]["health_async_per_s_inflight8"] = round(d["health_async_inflight8"]["calls_per_s"])
            for row in ("submit_batched", "batched_async"):
                if "kexd_cpu_us_per_call" in d.get(f"{row}_inflight8", {}):
                    out[who][f"kexd_cpu_us_per_{row}_inflight8"] = round(d[f"{row}_inflight8"]["kexd_cpu_us_per_call"])
            if "kexd_cpu_us_per_call" in d["submit_inflight8"]:
                out[who]["kexd_cpu_us_per_submit_inflight8"] = round(d["submit_inflight8"]["kexd_cpu_us_per_call"])
                out[who]["kexd_cpu_us_per_health_inflight8"] = round(d["health_inflight8"]["kexd_cpu_us_per_call"])
        return out
    s = {"after": one(r)} if "before" in r else one(r)
    if "before" in r:
        s["before"] = one(r["before"])
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kexd", default=os.path.join(ROOT, "build/daemon/kexd"))
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--before", default="", help="an earlier run's JSON (another kexd): kept under \"before\" and "
                    "compared in a summary")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/rpc.json"))
    ap.add_argument("--bench-rpc", default=os.path.join(ROOT, "build/bench_rpc"), help="the C half ('' to skip)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    stubs(tmp)
    import grpc
    import grpc.experimental
    import health_pb2
    import health_pb2_grpc
    sys.path.insert(0, os.path.join(ROOT, "client", "python"))
    import kex as kexpkg  # the Python client, kex.Client
    from kex._pb import kex_pb2, kex_pb2_grpc

    cache = os.path.join(tmp, "cache.db")

    def start():
        port = free_port()
        proc = subprocess.Popen([args.kexd, "--listen", f"127.0.0.1:{port}", "--device", "cpu", "--cache", cache,
                                 "--log", "warn", "--metrics", "off"])
        # the channel option kex.Client uses (client/python/kex/_client.py, _CHANNEL_OPTIONS): the thread that
        # iterates a server stream reads it, instead of getting each event handed over by gRPC's channel thread
        ch = grpc.insecure_channel(f"127.0.0.1:{port}",
                                   [(grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)])
        h = health_pb2_grpc.HealthStub(ch)
        for _ in range(200):
            try:
                h.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
                break
            except grpc.RpcError:
                time.sleep(0.05)
        return proc, ch, port

    def graph(n=16, value=1.0, dummy=None):
        N = kex_pb2.Node
        nodes = [N(op="BUFFER", dtype="float32", shape=[n], fill_random=1),
                 N(op="CONST", dtype="float32", shape=[], value=kex_pb2.Scalar(float_value=value)),
                 N(op="RESHAPE", src=[1], new_shape=kex_pb2.Ints(values=[1])),
                 N(op="EXPAND", src=[2], new_shape=kex_pb2.Ints(values=[n])),
                 N(op="ADD", src=[0, 3])]
        if dummy is not None:
            nodes.append(N(op="CONST", dtype="float32", shape=[], value=kex_pb2.Scalar(float_value=dummy)))
        return kex_pb2.Graph(device="cpu", nodes=nodes, outputs=[4])

    def default_submit(kex, job, g):
        """One Submit with default options; its Done (every event read, checked)."""
        evs = list(kex.Submit(kex_pb2.SubmitRequest(job=job, graph=g), timeout=60))
        kinds = [e.WhichOneof("event") for e in evs]
        if kinds[:2] != ["accepted", "scheduled"] or "running" not in kinds or kinds[-1] != "done":
            raise SystemExit(f"bench/rpc.py: unexpected Submit stream: {kinds}")
        d = evs[-1].done
        if not d.outputs[0].handle or not d.outputs[0].has_data:
            raise SystemExit("bench/rpc.py: the default Submit's output is not a buffer with inline bytes")
        return d

    def batched_submit(kex, job, g):
        """default_submit with batched_events (as kex's clients send it): its Done, every event checked."""
        kinds = []
        for msg in kex.Submit(kex_pb2.SubmitRequest(job=job, graph=g, batched_events=True), timeout=60):
            kinds.append(msg.WhichOneof("event"))
            kinds += [e.WhichOneof("event") for e in msg.following]
            last = (msg.following[-1] if msg.following else msg)
        if kinds[:2] != ["accepted", "scheduled"] or "running" not in kinds or kinds[-1] != "done":
            raise SystemExit(f"bench/rpc.py: unexpected batched Submit stream: {kinds}")
        return last.done

    def timed_submit(kex, job, g):
        t0 = time.perf_counter()
        d = default_submit(kex, job, g)
        us = (time.perf_counter() - t0) * 1e6
        kex.Free(kex_pb2.FreeRequest(job=job, handles=[o.handle for o in d.outputs]), timeout=5)
        return us, d

    local = threading.local()

    def kept_submit(kex, job, g, how=None):
        """A default Submit whose output handle this thread frees later, 64 with one Free (untimed)."""
        kept = getattr(local, "kept", None)
        if kept is None:
            kept = local.kept = []
        kept.append((how or default_submit)(kex, job, g).outputs[0].handle)

    def client_submit(g):
        """kex.Client.submit (the Python package: default options), its output handle freed later as above."""
        kept = getattr(local, "client_kept", None)
        if kept is None:
            kept = local.client_kept = []
        d = client.submit(g)
        if not d.outputs[0].handle or not d.outputs[0].has_data:
            raise SystemExit("bench/rpc.py: kex.Client.submit's output is not a buffer with inline bytes")
        kept.append(d.outputs[0].handle)

    def flush_kept(kex, job):
        kept = getattr(local, "kept", None)
        if kept:
            kex.Free(kex_pb2.FreeRequest(job=job, handles=kept), timeout=5)
            local.kept = []
        kept = getattr(local, "client_kept", None)
        if kept:
            client.free(kept)
            local.client_kept = []

    def submit_one_rpc(kex, job, g, only_done):
        evs = list(kex.Submit(kex_pb2.SubmitRequest(job=job, graph=g, free_outputs=True, only_done=only_done),
                              timeout=60))
        o = evs[-1].done.outputs[0]
        if not o.has_data or o.handle or (only_done and len(evs) != 1) or (not only_done and len(evs) < 4):
            raise SystemExit(f"bench/rpc.py: unexpected Submit stream: {[e.WhichOneof('event') for e in evs]}")

    load = os.getloadavg()
    results = {"benchmark": "rpc", "client": "python grpcio (sync stubs, threads)", "seconds": args.seconds,
               "machine": f"{os.cpu_count()} CPUs ({platform.machine()}, {platform.system()} {platform.release()}); "
                          f"load average before the run {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
               "load_average_before": [round(x, 2) for x in load], "rounds": args.rounds,
               "notes": "kexd --device cpu; client and server share the machine's cores; latencies in us; "
                        "submit = Submit with default options (one RPC, all events, the output a job buffer with "
                        "inline bytes; its thread frees 64 handles with one Free outside the timed call); "
                        "submit_free = Submit + Free of its output (two RPCs); submit_inline = Submit with "
                        "free_outputs (one RPC, all events); submit_min = free_outputs + only_done (one RPC, one "
                        "message); submit_batched = submit with batched_events (every event; those ready together "
                        "in one message), as kex's clients send it; client_submit = kex.Client.submit, the Python "
                        "package, default options (batched), output handles freed 64 at a time outside the timed "
                        "call; ratio_to_health = p50 / the health p50 at the same in-flight count; "
                        "ratio_to_health_rounds = the median over the interleaved rounds of that ratio; "
                        "kexd_cpu_us_per_call / client_cpu_us_per_call = CPU time (user + system, all threads) "
                        "of kexd / of this Python client per call: with 2 cores, calls/s can never pass "
                        "2e6 / (their sum)"}
    proc, ch, port = start()
    kex = kex_pb2_grpc.KexStub(ch)
    health = health_pb2_grpc.HealthStub(ch)
    client = kexpkg.Client(f"127.0.0.1:{port}")
    job = kex.OpenJob(kex_pb2.OpenJobRequest(name="bench"), timeout=5).job
    single = {}
    single["first_submit_us"], _ = timed_submit(kex, job, graph())
    single["repeated_submit_us"] = pct([timed_submit(kex, job, graph())[0] for _ in range(20)], 0.5)
    # the structure cache's saving: a graph with one more, unused CONST node (a new value each call) is a new
    # structure -- replay, schedule and render again -- whose kernel source is the same, so its program is a
    # memory hit: the difference to the repeated Submit is what the structure cache saves
    single["structure_miss_program_hit_us"] = pct([timed_submit(kex, job, graph(dummy=1000.0 + i))[0]
                                                   for i in range(20)], 0.5)
    calls = {
        "health": lambda: health.Check(health_pb2.HealthCheckRequest(), timeout=5),
        "submit": lambda: kept_submit(kex, job, graph()),
        "submit_free": lambda: timed_submit(kex, job, graph()),
        "submit_inline": lambda: submit_one_rpc(kex, job, graph(), False),
        "submit_min": lambda: submit_one_rpc(kex, job, graph(), True),
        "submit_batched": lambda: kept_submit(kex, job, graph(), batched_submit),
        "client_submit": lambda: client_submit(graph()),
    }
    for inflight in (1, 8):
        lat = {name: [] for name in calls}
        wall = {name: 0.0 for name in calls}
        server_cpu = {name: 0.0 for name in calls}
        client_cpu = {name: 0.0 for name in calls}
        rounds = {name: [] for name in calls}
        lock = threading.Lock()
        for r in range(args.rounds):  # the kinds take turns: health, submit, ..., health, submit, ...
            for name, fn in calls.items():
                mine_all = []
                stop_at = [0.0]

                def worker():
                    mine = []
                    while time.perf_counter() < stop_at[0]:
                        t0 = time.perf_counter()
                        fn()
                        mine.append((time.perf_counter() - t0) * 1e6)
                        if len(getattr(local, "kept", None) or []) + len(getattr(local, "client_kept", None) or []) >= 64:
                            flush_kept(kex, job)
                    flush_kept(kex, job)
                    with lock:
                        mine_all.extend(mine)
                for _ in range(50 if r == 0 else 5):
                    fn()  # warm-up
                flush_kept(kex, job)
                stop_at[0] = time.perf_counter() + args.seconds / args.rounds
                ts = [threading.Thread(target=worker) for _ in range(inflight)]
                t0, s0, c0 = time.perf_counter(), cpu_s(proc.pid), sum(os.times()[:2])
                [t.start() for t in ts]
                [t.join() for t in ts]
                wall[name] += time.perf_counter() - t0
                server_cpu[name] += cpu_s(proc.pid) - s0
                client_cpu[name] += sum(os.times()[:2]) - c0
                lat[name].extend(mine_all)
                rounds[name].append(pct(mine_all, 0.5))
        for name in calls:
            xs = lat[name]
            row = {"p50_us": pct(xs, 0.5), "p99_us": pct(xs, 0.99), "calls_per_s": len(xs) / wall[name],
                   "calls": len(xs), "kexd_cpu_us_per_call": server_cpu[name] / max(len(xs), 1) * 1e6,
                   "client_cpu_us_per_call": client_cpu[name] / max(len(xs), 1) * 1e6}
            line = f"{name:14s} {inflight} in flight: p50 {row['p50_us']:8.0f} us  p99 {row['p99_us']:8.0f} us  " \
                   f"{row['calls_per_s']:8.0f} calls/s"
            if name != "health":
                row["ratio_to_health"] = row["p50_us"] / results[f"health_inflight{inflight}"]["p50_us"]
                row["ratio_to_health_rounds"] = pct([a / h for a, h in zip(rounds[name], rounds["health"]) if h],
                                                    0.5)
                line += f"  {row['ratio_to_health_rounds']:.2f}x health (median of {args.rounds} rounds)"
            results[f"{name}_inflight{inflight}"] = row
            print(line, flush=True)
    stats = kex.GetStats(kex_pb2.GetStatsRequest(), timeout=5)
    results["server_stats"] = {"schedule_cache_hits": stats.schedule_cache_hits,
                               "schedule_cache_misses": stats.schedule_cache_misses,
                               "program_cache_memory_hits": stats.program_cache_memory_hits,
                               "program_cache_sqlite_hits": stats.program_cache_sqlite_hits,
                               "program_cache_misses": stats.program_cache_misses}
    client.close()
    ch.close()
    proc.terminate()
    proc.wait()
    # restart with the same --cache: the program comes from SQLite
    proc, ch, _ = start()
    kex = kex_pb2_grpc.KexStub(ch)
    job = kex.OpenJob(kex_pb2.OpenJobRequest(name="bench"), timeout=5).job
    single["after_restart_submit_us"], d = timed_submit(kex, job, graph())
    single["after_restart_programs_sqlite"] = d.programs_sqlite
    ch.close()
    proc.terminate()
    proc.wait()
    results["single_submit"] = single
    print(json.dumps(single, indent=1))
    if args.bench_rpc:  # the C half: its own kexd, the same calls from gRPC C core and libkex
        cj = os.path.join(tmp, "c.json")
        subprocess.check_call([args.bench_rpc, "--kexd", args.kexd, "--seconds", str(args.seconds), "--rounds",
                               str(args.rounds), "--json", cj])
        with open(cj) as f:
            c = json.load(f)
        for k, v in c.items():
            if isinstance(v, dict) and not k.startswith("health"):  # async kinds against the async health
                base = "health_async_inflight" if k.startswith("batched_async") else "health_inflight"
                v["ratio_to_health"] = v["p50_us"] / c[base + k.rsplit("inflight", 1)[1]]["p50_us"]
        results["c"] = c
    if args.before:
        with open(args.before) as f:
            results["before"] = json.load(f)
        results["before"].pop("before", None)
    results["summary"] = summary(results)
    print(json.dumps(results["summary"], indent=1))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
