"""test_metrics.py - kexd's Prometheus endpoint (--metrics) against real kexd processes.

Run by test_metrics.sh, which passes in the environment: KEXD (the binary),
KEX_STUBS (the generated stubs) and KEXD_TMP (a scratch directory).  Starts
a kexd with --metrics on a free port, makes known calls (health, OpenJob,
two Submits of one small graph, calls that fail NOT_FOUND, an unknown
method), scrapes /metrics, parses it with prometheus_client's parser and
checks every family against the calls made and against GetStats.  Then:
--metrics off listens on the gRPC port alone, KEX_METRICS is read, a taken
metrics port or a malformed address makes kexd exit 1 naming it.  Prints
"ok - ..." / "FAIL - ..." per check and, last, "N passed, N failed".
"""
import http.client
import os
import re
import socket
import sys
import time

sys.path.insert(0, os.environ["KEX_STUBS"])

import grpc  # noqa: E402
import health_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402
from kex.v1 import kex_pb2, kex_pb2_grpc  # noqa: E402
import kexdtest  # noqa: E402
from kexdtest import add_graph, check, desc, exit_status, free_port, rpc_error, run, wait_healthy  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

KEXD = os.environ["KEXD"]
TMP = os.environ["KEXD_TMP"]
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SVC = "/kex.v1.Kex/"


class Kexd(kexdtest.Kexd):
    """A kexd on a free gRPC port (cpu, a cache file of its own) with extra flags and environment, and the
    default metrics address unless it says otherwise (KEX_METRICS unset); not waited for."""

    count = 0

    def __init__(self, *flags, env=None):
        Kexd.count += 1
        super().__init__(KEXD, TMP, "--device", "cpu", "--cache", os.path.join(TMP, f"cache-metrics-{Kexd.count}.db"),
                         *flags, env={"KEX_METRICS": None, **(env or {})})

    def listening_ports(self):
        """The TCP ports this process listens on (its socket inodes matched against /proc/net/tcp{,6})."""
        inodes = set()
        for fd in os.listdir(f"/proc/{self.proc.pid}/fd"):
            try:
                m = re.match(r"socket:\[(\d+)\]", os.readlink(f"/proc/{self.proc.pid}/fd/{fd}"))
            except OSError:
                continue
            if m:
                inodes.add(m.group(1))
        ports = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                for line in f.readlines()[1:]:
                    cols = line.split()
                    if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                        ports.add(int(cols[1].split(":")[1], 16))
        return ports


def start_refused(k):
    """The exit status of a kexd that should refuse to start: within 30 s, else "still running" (then killed)."""
    rc = exit_status(k.proc, 30)
    if rc is None:
        k.proc.kill()
        k.proc.wait()
        rc = "still running"
    return rc


def http_get(port, path="/metrics", method="GET"):
    """(status, content type, body) of one HTTP request to 127.0.0.1:port."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request(method, path)
        r = c.getresponse()
        return r.status, r.getheader("Content-Type", ""), r.read().decode()
    finally:
        c.close()


def scrape(port):
    """{family name: family} of one scrape, and the text."""
    status, ctype, text = http_get(port)
    if status != 200:
        raise RuntimeError(f"GET /metrics: HTTP {status}")
    return {f.name: f for f in text_string_to_metric_families(text)}, text


def value(fams, family, sample=None, **labels):
    """The value of the family's sample (named `sample`, default the family's own) with exactly these labels."""
    f = fams.get(family)
    if f is None:
        return None
    for s in f.samples:
        if (sample is None or s.name == sample) and s.labels == labels:
            return s.value
    return None


def rpcs(fams, method, code):
    return value(fams, "kex_rpcs", "kex_rpcs_total", method=method if "/" in method or method == "unknown" else SVC + method,
                 code=code) or 0


def check_families(fams, text):
    """Every promised family is there, with its type and HELP text."""
    want = {"kex_build_info": "gauge", "kex_uptime_seconds": "gauge", "kex_rpcs": "counter",
            "kex_submissions": "counter", "kex_submissions_failed": "counter", "kex_submission_seconds": "histogram",
            "kex_kernel_run_seconds": "counter", "kex_held_bytes": "gauge", "kex_jobs_open": "gauge",
            "kex_program_cache_hits": "counter", "kex_program_cache_misses": "counter",
            "kex_schedule_cache_hits": "counter", "kex_schedule_cache_misses": "counter",
            "kex_beam_cache_hits": "counter", "kex_beam_cache_misses": "counter", "kex_beam_searches": "counter",
            "kex_connections_open": "gauge", "kex_connections_refused": "counter",
            "kex_beam_search_seconds": "counter", "kex_queue_wait_seconds": "histogram",
            "kex_device_busy_seconds": "counter", "kex_device_held_bytes": "gauge", "kex_device_searches": "gauge",
            "kex_device_searches_waiting": "gauge"}
    wrong = {n: (fams[n].type if n in fams else None) for n, t in want.items() if n not in fams or fams[n].type != t}
    check("every family is served with its TYPE", not wrong, wrong)
    nohelp = [n for n in want if n in fams and not fams[n].documentation]
    check("every family has a HELP line", not nohelp, nohelp)
    check("every sample name has the kex_ prefix",
          all(s.name.startswith("kex_") for f in fams.values() for s in f.samples), text[:500])


def main_scrape():
    port = free_port()
    k = Kexd("--metrics", f"127.0.0.1:{port}")
    if not check("kexd with --metrics 127.0.0.1:PORT answers health", wait_healthy(k.port, k.proc, 30),
                 k.read_log()[-2000:]):
        return
    check("the log names the metrics address", f"metrics on http://127.0.0.1:{port}/metrics" in k.read_log(),
          k.read_log()[-1000:])
    check("kexd listens on exactly the gRPC and the metrics ports", k.listening_ports() == {k.port, port},
          k.listening_ports())
    status, ctype, text = http_get(port)
    check("GET /metrics is 200 in the text format 0.0.4", status == 200 and ctype.startswith("text/plain")
          and "version=0.0.4" in ctype, f"{status} {ctype}")
    check("GET /other is 404", http_get(port, "/other")[0] == 404)
    check("POST /metrics is 405", http_get(port, method="POST")[0] == 405)
    before, _ = scrape(port)
    version = re.search(r"version\s*:\s*'([^']+)'", open(os.path.join(ROOT, "meson.build")).read()).group(1)
    check(f"kex_build_info{{version=\"{version}\"}} is 1 (meson's project version)",
          value(before, "kex_build_info", version=version) == 1,
          [s for s in before["kex_build_info"].samples] if "kex_build_info" in before else "missing")
    checks_before = rpcs(before, "/grpc.health.v1.Health/Check", "OK")

    ch = grpc.insecure_channel(f"127.0.0.1:{k.port}")
    kex = kex_pb2_grpc.KexStub(ch)
    health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    job = kex.OpenJob(kex_pb2.OpenJobRequest(name="metrics"), timeout=5).job
    t0 = time.time()
    evs = list(kex.Submit(kex_pb2.SubmitRequest(job=job, graph=add_graph()), timeout=120))
    first_s = time.time() - t0
    ok_done = any(e.WhichOneof("event") == "done" for e in evs)
    check("a Submit of a + b succeeds", ok_done, evs[-1:] if evs else "no events")
    t0 = time.time()
    list(kex.Submit(kex_pb2.SubmitRequest(job=job, graph=add_graph()), timeout=120))
    both_s = first_s + time.time() - t0
    e1 = rpc_error(kex.GetStats, kex_pb2.GetStatsRequest(job="0" * 32), timeout=5)
    e2 = rpc_error(kex.CloseJob, kex_pb2.CloseJobRequest(job="f" * 32), timeout=5)
    check("GetStats and CloseJob of an unknown job fail NOT_FOUND",
          e1 is not None and e1.code() == grpc.StatusCode.NOT_FOUND and e2 is not None
          and e2.code() == grpc.StatusCode.NOT_FOUND, f"{desc(e1)}; {desc(e2)}")
    nosuch = ch.unary_unary("/kex.v1.Kex/NoSuchMethod", request_serializer=None, response_deserializer=None)
    e3 = rpc_error(nosuch, b"", timeout=5)
    check("an unregistered method is UNIMPLEMENTED", e3 is not None and e3.code() == grpc.StatusCode.UNIMPLEMENTED,
          desc(e3))
    watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=30)
    first = next(watch)
    watch.cancel()
    check("a health Watch sends SERVING, then the client cancels it",
          first.status == health_pb2.HealthCheckResponse.SERVING)
    stats = kex.GetStats(kex_pb2.GetStatsRequest(), timeout=5)

    fams, text = scrape(port)
    check_families(fams, text)
    check("health Check OK grew by the one Check made",
          rpcs(fams, "/grpc.health.v1.Health/Check", "OK") == checks_before + 1,
          (checks_before, rpcs(fams, "/grpc.health.v1.Health/Check", "OK")))
    check("OpenJob OK is 1", rpcs(fams, "OpenJob", "OK") == 1, rpcs(fams, "OpenJob", "OK"))
    check("Submit OK is 2", rpcs(fams, "Submit", "OK") == 2, rpcs(fams, "Submit", "OK"))
    check("GetStats NOT_FOUND is 1 and GetStats OK is 1 (the failing call's status code label)",
          rpcs(fams, "GetStats", "NOT_FOUND") == 1 and rpcs(fams, "GetStats", "OK") == 1,
          [s for s in fams["kex_rpcs"].samples if "GetStats" in s.labels.get("method", "")])
    check("CloseJob NOT_FOUND is 1, and no CloseJob OK series", rpcs(fams, "CloseJob", "NOT_FOUND") == 1
          and value(fams, "kex_rpcs", "kex_rpcs_total", method=SVC + "CloseJob", code="OK") is None)
    check("the unregistered method counts as method=\"unknown\" UNIMPLEMENTED",
          rpcs(fams, "unknown", "UNIMPLEMENTED") == 1 and not any("NoSuchMethod" in s.labels.get("method", "")
                                                                  for s in fams["kex_rpcs"].samples))
    end = time.time() + 5
    while rpcs(fams, "/grpc.health.v1.Health/Watch", "CANCELLED") == 0 and time.time() < end:
        time.sleep(0.05)  # the cancel reaches kexd on its own time
        fams, text = scrape(port)
    check("the Watch the client cancelled counts as CANCELLED, once, and never as OK",
          rpcs(fams, "/grpc.health.v1.Health/Watch", "CANCELLED") == 1
          and rpcs(fams, "/grpc.health.v1.Health/Watch", "OK") == 0,
          [s for s in fams["kex_rpcs"].samples if "Watch" in s.labels.get("method", "")])
    check("kex_submissions_total is 2, none failed", value(fams, "kex_submissions", "kex_submissions_total") == 2
          and value(fams, "kex_submissions_failed", "kex_submissions_failed_total") == 0)
    h = {s.labels.get("le"): s.value for s in fams["kex_submission_seconds"].samples
         if s.name == "kex_submission_seconds_bucket"}
    count = value(fams, "kex_submission_seconds", "kex_submission_seconds_count")
    total = value(fams, "kex_submission_seconds", "kex_submission_seconds_sum")
    les = sorted((float(le), v) for le, v in h.items())
    check("the submission histogram counts the 2 Submits, +Inf == count, buckets cumulative",
          count == 2 and h.get("+Inf") == 2 and all(a[1] <= b[1] for a, b in zip(les, les[1:])), (count, h))
    check("the histogram's sum is positive and at most the clients' wall time", total is not None
          and 0 < total <= both_s + 0.01, (total, both_s))
    ks = value(fams, "kex_kernel_run_seconds", "kex_kernel_run_seconds_total")
    check("kernel run seconds are positive and less than the submissions took", ks is not None and 0 < ks < total,
          (ks, total))
    check("jobs open 1; bytes held 32 (the job holds both Submits' float32[4] outputs), as GetStats says",
          value(fams, "kex_jobs_open") == 1 and value(fams, "kex_held_bytes") == 32 == stats.bytes_held,
          (value(fams, "kex_jobs_open"), value(fams, "kex_held_bytes"), stats.bytes_held))
    check("schedule cache: 1 miss then 1 hit (as GetStats says)",
          value(fams, "kex_schedule_cache_misses", "kex_schedule_cache_misses_total") == 1 == stats.schedule_cache_misses
          and value(fams, "kex_schedule_cache_hits", "kex_schedule_cache_hits_total") == 1 == stats.schedule_cache_hits)
    pm = value(fams, "kex_program_cache_hits", "kex_program_cache_hits_total", tier="memory")
    ps = value(fams, "kex_program_cache_hits", "kex_program_cache_hits_total", tier="sqlite")
    pmiss = value(fams, "kex_program_cache_misses", "kex_program_cache_misses_total")
    check("program cache: 1 compile then 1 memory hit (as GetStats says)",
          (pmiss, pm, ps) == (1, 1, 0) == (stats.program_cache_misses, stats.program_cache_memory_hits,
                                          stats.program_cache_sqlite_hits), (pmiss, pm, ps, stats))
    check("beam cache and searches agree with GetStats (no beam asked: 0)",
          (value(fams, "kex_beam_cache_hits", "kex_beam_cache_hits_total"),
           value(fams, "kex_beam_cache_misses", "kex_beam_cache_misses_total"),
           value(fams, "kex_beam_searches", "kex_beam_searches_total"))
          == (stats.beam_cache_hits, stats.beam_cache_misses, stats.searches_run) == (0, 0, 0))
    check("beam search seconds: 0 (no search ran)",
          value(fams, "kex_beam_search_seconds", "kex_beam_search_seconds_total") == 0)
    # by device: the Submits' items (setup, kernel, finish each) and the Download waited in device cpu's queue
    qc = value(fams, "kex_queue_wait_seconds", "kex_queue_wait_seconds_count", device="cpu")
    qinf = value(fams, "kex_queue_wait_seconds", "kex_queue_wait_seconds_bucket", device="cpu", le="+Inf")
    qsum = value(fams, "kex_queue_wait_seconds", "kex_queue_wait_seconds_sum", device="cpu")
    check("queue wait on device cpu: one observation per device item (at least 3 per Submit), +Inf == count",
          qc is not None and qc >= 6 and qinf == qc and 0 <= qsum <= both_s, (qc, qinf, qsum))
    busy = value(fams, "kex_device_busy_seconds", "kex_device_busy_seconds_total", device="cpu")
    check("device cpu was busy for more than its kernels ran and less than the Submits took",
          busy is not None and ks <= busy <= both_s + 0.01, (busy, ks, both_s))
    check("device cpu holds the job's 32 bytes (the sum over devices is kex_held_bytes)",
          value(fams, "kex_device_held_bytes", device="cpu") == 32 == value(fams, "kex_held_bytes"),
          value(fams, "kex_device_held_bytes", device="cpu"))
    check("connections open agree with GetStats; scrapes are not counted as connections",
          value(fams, "kex_connections_open") == stats.connections_open >= 1
          and value(fams, "kex_connections_refused", "kex_connections_refused_total", reason="limit") == 0,
          (value(fams, "kex_connections_open"), stats.connections_open))
    ch.close()
    # scrapes in a row while calls run: every one parses, counters never go down
    prev, monotone = None, True
    for _ in range(5):
        f, _ = scrape(port)
        cur = value(f, "kex_rpcs", "kex_rpcs_total", method="/grpc.health.v1.Health/Check", code="OK")
        if prev is not None and cur < prev:
            monotone = False
        prev = cur
        wait_healthy(k.port, k.proc, 5)
    check("five scrapes between health checks parse and the Check count never goes down", monotone)
    k.stop()
    s = socket.socket()
    check("the metrics port is closed after kexd stopped", s.connect_ex(("127.0.0.1", port)) != 0)
    s.close()


def main_off_env_taken():
    k = Kexd("--metrics", "off")
    if check("kexd with --metrics off answers health", wait_healthy(k.port, k.proc, 30), k.read_log()[-2000:]):
        check("--metrics off: kexd listens on the gRPC port alone", k.listening_ports() == {k.port},
              k.listening_ports())
    k.stop()

    port = free_port()
    k = Kexd(env={"KEX_METRICS": f"127.0.0.1:{port}"})
    if check("kexd with KEX_METRICS=127.0.0.1:PORT answers health", wait_healthy(k.port, k.proc, 30)):
        status, _, text = http_get(port)
        check("KEX_METRICS is read: /metrics is served there", status == 200 and "kex_build_info" in text, status)
    k.stop()

    port = free_port()
    k = Kexd("--metrics", "off", env={"KEX_METRICS": f"127.0.0.1:{port}"})
    if check("--metrics off wins over KEX_METRICS", wait_healthy(k.port, k.proc, 30)):
        check("... and nothing listens on KEX_METRICS's port", k.listening_ports() == {k.port}, k.listening_ports())
    k.stop()

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    tport = taken.getsockname()[1]
    k = Kexd("--metrics", f"127.0.0.1:{tport}")
    rc = start_refused(k)
    log = k.read_log()
    check("a taken metrics port: kexd exits 1 naming the address and the reason",
          rc == 1 and f"127.0.0.1:{tport}" in log and "in use" in log, f"rc {rc}; {log[-1500:]}")
    check("... and never served gRPC", "kexd listening" not in log, log[-800:])
    taken.close()

    for bad in ("nonsense", "127.0.0.1:", "127.0.0.1:notaport"):
        k = Kexd("--metrics", bad)
        rc = start_refused(k)
        log = k.read_log()
        check(f"--metrics {bad!r}: kexd exits 1 naming it", rc == 1 and bad in log, f"rc {rc}; {log[-800:]}")


def main():
    main_scrape()
    main_off_env_taken()


run(main, "test_metrics.py")
