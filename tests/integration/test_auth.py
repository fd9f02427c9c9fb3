"""test_auth.py - kexd --auth against one real kexd with TLS, tokens, JSON logs and metrics.

Run by test_auth.sh, which makes the tokens (kex auth token), the --auth
file and the certificates, and passes in the environment: KEXD, KEX,
KEX_STUBS, KEXD_TMP, KEXD_AUTH, TOK_<NAME> and ENTRY_<NAME> (the --auth
entries).  Tenants: ops (admin), alice (user: max_jobs 2, max_bytes 4096,
max_weight 4, max_beam 2), bob (user, no limits), carol (user, may_tune
false); dave is only in the file SIGHUP loads.  kexd runs with --max-beam 3,
--max-submits-per-job 1, --max-tunes-per-device 1 and --max-search-queue 0
(a search finding the slot held is refused at once instead of waiting:
test_tenants.py part 8 has the line), and _BusyWork keeps the cpu device
busy so that calls stay in flight.  Prints "ok - ..." /
"FAIL - ..." per check and, last, "N passed, N failed".
"""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.environ["KEX_STUBS"])

import grpc  # noqa: E402
import health_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402
from kex.v1 import kex_pb2, kex_pb2_grpc  # noqa: E402
from kexdtest import add_graph, check, desc, free_port, rpc_error, run  # noqa: E402

KEXD, KEX, TMP, AUTH = os.environ["KEXD"], os.environ["KEX"], os.environ["KEXD_TMP"], os.environ["KEXD_AUTH"]
TOK = {n: os.environ["TOK_" + n.upper()] for n in ("ops", "alice", "bob", "carol", "dave")}
CA = os.path.join(TMP, "ca.pem")
LOG = os.path.join(TMP, "kexd-auth.log")
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
RE = grpc.StatusCode.RESOURCE_EXHAUSTED


def md(who):
    return (("authorization", f"Bearer {TOK[who]}"),)


def code_says(e, code, *words):
    return e is not None and e.code() == code and all(w in e.details() for w in words)


def read_log():
    with open(LOG) as f:
        return f.read()


class Server:
    def __init__(self):
        self.port, self.mport = free_port(), free_port()
        self.log = open(LOG, "w")
        self.proc = subprocess.Popen(
            [KEXD, "--listen", f"127.0.0.1:{self.port}", "--device", "cpu", "--cache", os.path.join(TMP, "auth-cache.db"),
             "--auth", AUTH, "--tls-cert", os.path.join(TMP, "server.pem"), "--tls-key", os.path.join(TMP, "server.key"),
             "--log-format", "json", "--metrics", f"127.0.0.1:{self.mport}", "--max-beam", "3",
             "--max-submits-per-job", "1", "--max-tunes-per-device", "1", "--max-search-queue", "0", "--test-busy-work",
             "--grace", "1"],
            stdout=self.log, stderr=subprocess.STDOUT)
        with open(CA, "rb") as f:
            self.ch = grpc.secure_channel(f"127.0.0.1:{self.port}", grpc.ssl_channel_credentials(f.read()))
        self.kex = kex_pb2_grpc.KexStub(self.ch)
        self.health = health_pb2_grpc.HealthStub(self.ch)
        self.busy = self.ch.unary_unary("/kex.v1.Kex/_BusyWork", request_serializer=kex_pb2.BusyWorkRequest.SerializeToString,
                                        response_deserializer=kex_pb2.BusyWorkReply.FromString)

    def healthy(self, timeout=20):
        end = time.time() + timeout
        while time.time() < end and self.proc.poll() is None:
            try:
                if self.health.Check(health_pb2.HealthCheckRequest(), timeout=0.5).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                time.sleep(0.1)
        return False

    def open(self, who, weight=0):
        return self.kex.OpenJob(kex_pb2.OpenJobRequest(name=f"{who}-job", weight=weight), metadata=md(who), timeout=10).job

    def metrics(self):
        from prometheus_client.parser import text_string_to_metric_families
        c = http.client.HTTPConnection("127.0.0.1", self.mport, timeout=10)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        out = {}
        for f in text_string_to_metric_families(text):
            for s in f.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out


def submit(k, who, job, width=0):
    """The last SubmitEvent of a Submit (raises grpc.RpcError)."""
    req = kex_pb2.SubmitRequest(job=job, graph=add_graph(), only_done=True, free_outputs=True)
    if width:
        req.beam.beam_width = width
    return list(k.kex.Submit(req, metadata=md(who), timeout=30))[-1]


def upload(k, who, job, n):
    def reqs():
        yield kex_pb2.UploadRequest(job=job, header=kex_pb2.UploadHeader(dtype="uint8", shape=[n]))
        yield kex_pb2.UploadRequest(chunk=b"\1" * n)
    return k.kex.Upload(reqs(), metadata=md(who), timeout=10)


def identity(k):
    """No token, a wrong token, not Bearer: UNAUTHENTICATED; the health check is open."""
    check("the health check needs no token (SERVING over TLS)",
          k.health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == health_pb2.HealthCheckResponse.SERVING)
    U = grpc.StatusCode.UNAUTHENTICATED
    e = rpc_error(k.kex.OpenJob, kex_pb2.OpenJobRequest(name="x"), timeout=5)
    check("OpenJob with no token: UNAUTHENTICATED saying so", code_says(e, U, "no authorization"), desc(e))
    wrong = "f" * 64
    e = rpc_error(k.kex.OpenJob, kex_pb2.OpenJobRequest(name="x"), metadata=(("authorization", f"Bearer {wrong}"),),
                  timeout=5)
    check("OpenJob with a wrong token: UNAUTHENTICATED (unknown token)", code_says(e, U, "unknown token"), desc(e))
    e = rpc_error(k.kex.GetStats, kex_pb2.GetStatsRequest(), metadata=(("authorization", f"Basic {TOK['ops']}"),),
                  timeout=5)
    check("GetStats with authorization Basic ...: UNAUTHENTICATED", code_says(e, U, "Bearer"), desc(e))
    e = rpc_error(k.kex.ListDevices, kex_pb2.ListDevicesRequest(), timeout=5)
    check("ListDevices with no token: UNAUTHENTICATED", code_says(e, U), desc(e))
    time.sleep(0.2)
    log = read_log()
    check("the refusal is logged naming the peer and the method",
          re.search(r"unauthenticated call to OpenJob from ipv4:127\.0\.0\.1: an unknown token", log), log[-1500:])
    check("the log never holds the wrong token", wrong not in log)


def roles_and_jobs(k):
    """Jobs belong to their tenant; the cache's admin methods; may_tune; GetStats by role."""
    ja, jb, jo, jc = k.open("alice"), k.open("bob"), k.open("ops"), k.open("carol")
    check("alice, bob, ops and carol each open a job with their token",
          all(len(j.split(".")[0]) == 32 for j in (ja, jb, jo, jc)))
    NF, PD = grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED
    e = rpc_error(k.kex.CloseJob, kex_pb2.CloseJobRequest(job=ja), metadata=md("bob"), timeout=5)
    check("bob closing alice's job: NOT_FOUND", code_says(e, NF, "unknown job token"), desc(e))
    e = rpc_error(k.kex.GetStats, kex_pb2.GetStatsRequest(job=ja), metadata=md("ops"), timeout=5)
    check("even an admin naming alice's job: NOT_FOUND (jobs belong to their tenant)", code_says(e, NF), desc(e))
    e = rpc_error(upload, k, "bob", ja, 8)
    check("bob uploading into alice's job: NOT_FOUND", code_says(e, NF), desc(e))
    check("alice still names her job (GetStats)",
          k.kex.GetStats(kex_pb2.GetStatsRequest(job=ja), metadata=md("alice"), timeout=5).job_stats[0].tenant == "alice")
    for what, fn in (("DeleteCache", lambda: k.kex.DeleteCache(kex_pb2.DeleteCacheRequest(job=ja), metadata=md("alice"),
                                                                 timeout=5)),
                     ("ExportCache", lambda: list(k.kex.ExportCache(kex_pb2.ExportCacheRequest(job=ja),
                                                                    metadata=md("alice"), timeout=5))),
                     ("ImportCache", lambda: k.kex.ImportCache(iter([kex_pb2.ImportCacheRequest(job=ja, data=b"{}")]),
                                                               metadata=md("alice"), timeout=5))):
        e = rpc_error(fn)
        check(f"a user calling {what}: PERMISSION_DENIED naming the tenant", code_says(e, PD, "alice", "admins"), desc(e))
    e = rpc_error(k.kex.ListCache, kex_pb2.ListCacheRequest(job=ja), metadata=md("alice"), timeout=5)
    check("a user may list the beam cache", e is None, desc(e))
    e = rpc_error(k.kex.DeleteCache, kex_pb2.DeleteCacheRequest(job=jo), metadata=md("ops"), timeout=5)
    check("an admin may DeleteCache", e is None, desc(e))
    e = rpc_error(lambda: list(k.kex.ExportCache(kex_pb2.ExportCacheRequest(job=jo), metadata=md("ops"), timeout=5)))
    check("an admin may ExportCache", e is None, desc(e))
    e = rpc_error(lambda: list(k.kex.Tune(kex_pb2.TuneRequest(job=jc, graph=add_graph()), metadata=md("carol"),
                                          timeout=5)))
    check("carol (may_tune false) calling Tune: PERMISSION_DENIED", code_says(e, PD, "may_tune"), desc(e))
    r = k.kex.GetStats(kex_pb2.GetStatsRequest(), metadata=md("alice"), timeout=5)
    check("a user's GetStats shows only its tenant",
          r.tenant == "alice" and [t.name for t in r.tenant_stats] == ["alice"] and
          {j.tenant for j in r.job_stats} == {"alice"} and r.calls == 0 and r.jobs_open == 1, str(r)[:600])
    r = k.kex.GetStats(kex_pb2.GetStatsRequest(), metadata=md("ops"), timeout=5)
    check("an admin's GetStats shows every tenant and the server's counters",
          {"ops", "alice", "bob", "carol"} <= {t.name for t in r.tenant_stats} and
          {"ops", "alice", "bob", "carol"} <= {j.tenant for j in r.job_stats} and r.calls > 0 and r.jobs_open == 4,
          str(r)[:600])
    return ja, jb, jo


def tenant_limits(k, ja, jb):
    """Each of alice's limits refuses her, RESOURCE_EXHAUSTED naming it, while bob keeps working."""
    e = rpc_error(k.open, "alice", weight=5)
    check("alice OpenJob weight 5: RESOURCE_EXHAUSTED naming max_weight", code_says(e, RE, "max_weight", "alice"), desc(e))
    ja2 = k.open("alice")
    e = rpc_error(k.open, "alice")
    check("alice's third job: RESOURCE_EXHAUSTED naming max_jobs", code_says(e, RE, "max_jobs", "alice"), desc(e))
    e = rpc_error(k.open, "bob", weight=5)
    jb2 = None if e else k.open("bob")
    check("meanwhile bob opens jobs of weight 5 and more", e is None and jb2, desc(e))
    r = upload(k, "alice", ja, 3000)
    check("alice uploads 3000 bytes", r.bytes == 3000)
    e = rpc_error(upload, k, "alice", ja2, 2000)
    check("alice's 2000 more bytes in her other job: RESOURCE_EXHAUSTED naming max_bytes (the tenant's total)",
          code_says(e, RE, "max_bytes", "alice"), desc(e))
    check("meanwhile bob uploads 8000 bytes", upload(k, "bob", jb, 8000).bytes == 8000)
    e = rpc_error(submit, k, "alice", ja, width=3)
    check("alice's Submit with beam width 3: RESOURCE_EXHAUSTED naming max_beam", code_says(e, RE, "max_beam", "alice"),
          desc(e))
    e = rpc_error(submit, k, "bob", jb, width=4)
    check("bob's Submit with beam width 4: RESOURCE_EXHAUSTED naming --max-beam", code_says(e, RE, "--max-beam"), desc(e))
    ev = submit(k, "alice", ja)
    check("alice's plain Submit still runs", ev.HasField("done"), str(ev)[:300])
    ev = submit(k, "bob", jb)
    check("bob's plain Submit runs", ev.HasField("done"), str(ev)[:300])
    m = k.metrics()
    check("metrics: kex_tenant_refused_total{tenant=alice} counts her 4 refusals, bob's none",
          m.get(("kex_tenant_refused_total", (("tenant", "alice"),))) == 4 and
          m.get(("kex_tenant_refused_total", (("tenant", "bob"),))) == 0, {k_: v for k_, v in m.items() if "tenant" in k_[0]})
    check("metrics: kex_tenant_jobs_open and kex_tenant_held_bytes by tenant",
          m.get(("kex_tenant_jobs_open", (("tenant", "alice"),))) == 2 and
          m.get(("kex_tenant_held_bytes", (("tenant", "alice"),))) == 3000 and
          m.get(("kex_tenant_held_bytes", (("tenant", "bob"),))) == 8000)
    check("metrics: kex_tenant_submissions_total by tenant (1 alice, 1 bob: refused ones do not count)",
          m.get(("kex_tenant_submissions_total", (("tenant", "alice"),))) == 1 and
          m.get(("kex_tenant_submissions_total", (("tenant", "bob"),))) == 1,
          {k_: v for k_, v in m.items() if "submissions" in k_[0]})
    check("metrics: kex_auth_refused_total counts the UNAUTHENTICATED and PERMISSION_DENIED calls",
          m.get(("kex_auth_refused_total", (("code", "UNAUTHENTICATED"),))) == 4 and
          m.get(("kex_auth_refused_total", (("code", "PERMISSION_DENIED"),))) == 4)


def searches_run(k):
    return k.kex.GetStats(kex_pb2.GetStatsRequest(), metadata=md("ops"), timeout=5).searches_run


def keep_then_beam(k, tenant, job, width):
    """(the done-or-last event of a plain Submit that keeps its graph as "g", the error of a graph_ref Submit of
    it with beam width `width`)."""
    req = kex_pb2.SubmitRequest(job=job, graph=add_graph(), only_done=True, free_outputs=True, keep_as="g")
    ev = list(k.kex.Submit(req, metadata=md(tenant), timeout=30))[-1]
    req = kex_pb2.SubmitRequest(job=job, graph_ref="g", only_done=True, free_outputs=True)
    req.beam.beam_width = width
    return ev, rpc_error(lambda: list(k.kex.Submit(req, metadata=md(tenant), timeout=30)))


def beam_permission(k):
    """A search is a permission wherever it starts: a beam Submit needs may_tune, as Tune does (issue 31;
    before, carol's beam Submit ran a search)."""
    PD = grpc.StatusCode.PERMISSION_DENIED
    jc, jb = k.open("carol"), k.open("bob")
    s0 = searches_run(k)
    e = rpc_error(submit, k, "carol", jc, width=3)
    check("carol (may_tune false) Submitting with beam width 3: PERMISSION_DENIED naming may_tune, no search run",
          code_says(e, PD, "may_tune", "carol") and searches_run(k) == s0, (desc(e), searches_run(k) - s0))
    ev, e = keep_then_beam(k, "carol", jc, 3)
    check("carol's plain Submit (keep_as) runs", ev.HasField("done"), str(ev)[:300])
    check("carol's graph_ref Submit with beam width 3: PERMISSION_DENIED too, no search run",
          code_says(e, PD, "may_tune") and searches_run(k) == s0, (desc(e), searches_run(k) - s0))
    ev = submit(k, "bob", jb, width=3)
    check("bob (may_tune) Submitting with beam width 3 runs a search (searches_run +1)",
          ev.HasField("done") and searches_run(k) == s0 + 1, (str(ev)[:300], searches_run(k) - s0))
    m = k.metrics()
    srch = {t: m.get(("kex_tenant_search_seconds_total", (("tenant", t),)), 0) for t in ("bob", "carol")}
    comp = sum(v for k_, v in m.items() if k_[0] == "kex_tenant_compile_seconds_total")
    check("metrics: the search's seconds are charged to bob (kex_tenant_search_seconds_total), none to carol; "
          "compile seconds are charged to the tenants whose Submits compiled",
          srch["bob"] > 0 and srch["carol"] == 0 and comp > 0, (srch, comp))
    k.kex.CloseJob(kex_pb2.CloseJobRequest(job=jc), metadata=md("carol"), timeout=5)
    k.kex.CloseJob(kex_pb2.CloseJobRequest(job=jb), metadata=md("bob"), timeout=5)


def server_limits(k, jb, jo):
    """--max-submits-per-job 1 and --max-tunes-per-device 1 (--max-search-queue 0) while the cpu runner is kept busy."""
    k.busy(kex_pb2.BusyWorkRequest(job=jb, items=3, ms=300), metadata=md("bob"), timeout=5)
    req = kex_pb2.SubmitRequest(job=jb, graph=add_graph(), only_done=True, free_outputs=True)
    first = k.kex.Submit(req, metadata=md("bob"), timeout=30)
    time.sleep(0.2)
    e = rpc_error(lambda: list(k.kex.Submit(req, metadata=md("bob"), timeout=10)))
    check("a second Submit while one is in flight for the job: RESOURCE_EXHAUSTED naming --max-submits-per-job",
          code_says(e, RE, "--max-submits-per-job"), desc(e))
    k.busy(kex_pb2.BusyWorkRequest(job=jo, items=3, ms=300), metadata=md("ops"), timeout=5)
    tune = k.kex.Tune(kex_pb2.TuneRequest(job=jo, graph=add_graph()), metadata=md("ops"), timeout=60)
    time.sleep(0.2)
    e = rpc_error(lambda: list(k.kex.Tune(kex_pb2.TuneRequest(job=jb, graph=add_graph()), metadata=md("bob"),
                                          timeout=10)))
    check("a second Tune on the device: RESOURCE_EXHAUSTED naming --max-tunes-per-device and --max-search-queue",
          code_says(e, RE, "--max-tunes-per-device", "--max-search-queue"), desc(e))
    jb2 = k.open("bob")
    s0 = searches_run(k)
    e = rpc_error(submit, k, "bob", jb2, width=2)
    check("a beam Submit while the Tune runs: RESOURCE_EXHAUSTED naming --max-tunes-per-device, as Tune's "
          "(issue 31: it used to search beside it)", code_says(e, RE, "--max-tunes-per-device", "searches"), desc(e))
    ev, e = keep_then_beam(k, "bob", jb2, 2)
    check("meanwhile a plain Submit runs", ev.HasField("done"), str(ev)[:300])
    check("a graph_ref Submit with beam while the Tune runs: RESOURCE_EXHAUSTED naming --max-tunes-per-device",
          code_says(e, RE, "--max-tunes-per-device"), desc(e))
    e = rpc_error(lambda: list(first))
    check("the first Submit finishes OK", e is None, desc(e))
    e = rpc_error(lambda: list(tune))
    check("the first Tune finishes OK", e is None, desc(e))
    ev = submit(k, "bob", jb)
    check("once it ended, the job may Submit again", ev.HasField("done"))
    check("the refused beam Submits ran no search (only the Tune's)", searches_run(k) <= s0 + 1, searches_run(k) - s0)
    ev = submit(k, "bob", jb2, width=2)
    check("once the Tune ended, a beam Submit runs", ev.HasField("done"), str(ev)[:300])


def reload(k, jb):
    """SIGHUP swaps in a good file without dropping calls and keeps the old tenants on a bad one."""
    k.busy(kex_pb2.BusyWorkRequest(job=jb, items=3, ms=300), metadata=md("bob"), timeout=5)
    inflight = k.kex.Submit(kex_pb2.SubmitRequest(job=jb, graph=add_graph(), only_done=True, free_outputs=True),
                            metadata=md("bob"), timeout=30)
    time.sleep(0.1)
    with open(AUTH, "w") as f:  # bob out, dave in
        f.write('{"tenants": [%s, %s, %s, %s]}\n' % (os.environ["ENTRY_OPS"], os.environ["ENTRY_ALICE"],
                                                   os.environ["ENTRY_CAROL"], os.environ["ENTRY_DAVE"]))
    k.proc.send_signal(signal.SIGHUP)
    end = time.time() + 10
    while time.time() < end and "reloaded: 4 tenants" not in read_log():
        time.sleep(0.05)
    check("SIGHUP reloads the file (logged)", "reloaded: 4 tenants" in read_log(), read_log()[-800:])
    e = rpc_error(lambda: list(inflight))
    check("bob's Submit in flight across the reload finishes OK (no call dropped)", e is None, desc(e))
    e = rpc_error(k.open, "bob")
    check("after the reload bob's token is UNAUTHENTICATED", code_says(e, grpc.StatusCode.UNAUTHENTICATED), desc(e))
    jd = k.open("dave")
    check("after the reload dave's token opens a job", len(jd.split(".")[0]) == 32)
    with open(AUTH, "w") as f:
        f.write('{"tenants": [%s, {"name": "eve", "role": "user"}]}\n' % os.environ["ENTRY_OPS"])
    k.proc.send_signal(signal.SIGHUP)
    end = time.time() + 10
    while time.time() < end and "keeping the 4 tenants" not in read_log():
        time.sleep(0.05)
    check("a malformed file at SIGHUP: an error naming the entry, the old tenants kept",
          re.search(r'tenants\[1\] \(\\?"eve\\?"\): \\?"token_sha256\\?" must be.*keeping the 4 tenants', read_log()),
          read_log()[-800:])
    check("dave still works after the bad reload", len(k.open("dave").split(".")[0]) == 32)
    m = k.metrics()
    check("metrics: kex_auth_reloads_total ok 1, error 1",
          m.get(("kex_auth_reloads_total", (("result", "ok"),))) == 1 and
          m.get(("kex_auth_reloads_total", (("result", "error"),))) == 1)


def cli(k):
    base = [KEX, "--server", f"127.0.0.1:{k.port}", "--root-certs", CA]
    r = subprocess.run(base + ["health"], capture_output=True, text=True, timeout=30)
    check("kex health (TLS, no token): SERVING, exit 0", r.returncode == 0 and r.stdout.strip() == "SERVING",
          (r.returncode, r.stdout, r.stderr))
    r = subprocess.run(base + ["--token", TOK["dave"], "stats", "--json"], capture_output=True, text=True, timeout=30)
    check("kex --token TOKEN stats: the CLI sends the bearer token", r.returncode == 0, (r.returncode, r.stderr))
    r = subprocess.run(base + ["stats"], capture_output=True, text=True, timeout=30)
    check("kex stats without a token: fails UNAUTHENTICATED", r.returncode != 0 and "UNAUTHENTICATED" in r.stderr,
          (r.returncode, r.stderr))
    prog = ("import sys; sys.path.insert(0, sys.argv[1]); import kex\n"
            "with kex.Client(sys.argv[2], root_certs=sys.argv[3], token=sys.argv[4] or None, timeout=10) as c:\n"
            "    print(c.stats().tenant)\n")
    py = [sys.executable, "-c", prog, os.path.join(ROOT, "client", "python"), f"127.0.0.1:{k.port}", CA]
    r = subprocess.run(py + [TOK["dave"]], capture_output=True, text=True, timeout=60)
    check("the Python package's Client(token=...) is served as its tenant", r.returncode == 0 and
          r.stdout.strip() == "dave", (r.returncode, r.stdout, r.stderr[-500:]))
    r = subprocess.run(py + [""], capture_output=True, text=True, timeout=60)
    check("the Python package without a token: refused UNAUTHENTICATED", r.returncode != 0 and
          "UNAUTHENTICATED" in r.stderr, (r.returncode, r.stderr[-500:]))


def json_log(k):
    lines = read_log().splitlines()
    objs, bad = [], []
    for ln in lines:
        try:
            objs.append(json.loads(ln))
        except ValueError:
            bad.append(ln)
    check("--log-format json: every line is one JSON object with ts, level and msg",
          not bad and objs and all({"ts", "level", "msg"} <= o.keys() for o in objs), bad[:3])
    acc = [o for o in objs if o.get("msg") == "access"]
    fields_ok = lambda o: (re.fullmatch(r"\w+", o.get("method", "")) and o.get("tenant") and o.get("peer")
                           and re.fullmatch(r"[A-Z_]+", o.get("status", "")) and re.fullmatch(r"[0-9.]+", o.get("ms", "")))
    check("access lines: method, tenant, peer, status, milliseconds as JSON fields", acc and all(fields_ok(o) for o in acc),
          [o for o in acc if not fields_ok(o)][:3])
    check("an OpenJob's access line names the tenant and carries the job",
          any(o["method"] == "OpenJob" and o["tenant"] == "alice" and o["peer"] == "ipv4:127.0.0.1" and o["status"] == "OK"
              and re.fullmatch(r"[0-9a-f]{8}", o.get("job", "")) for o in acc))
    check("refused calls are access-logged with their status",
          any(o["status"] == "UNAUTHENTICATED" and o["tenant"] == "-" for o in acc) and
          any(o["method"] == "DeleteCache" and o["tenant"] == "alice" and o["status"] == "PERMISSION_DENIED" for o in acc))
    log = read_log()
    check("no token appears anywhere in the log", not any(t in log for t in TOK.values()))
    check("the log is free of sanitizer reports", not re.search(r"AddressSanitizer|LeakSanitizer|runtime error:", log),
          log[-1500:])


def main():
    k = Server()
    try:
        if not check("kexd with --auth, TLS, --log-format json and --metrics serves health", k.healthy(),
                     read_log()[-2000:]):
            return
        identity(k)
        ja, jb, jo = roles_and_jobs(k)
        tenant_limits(k, ja, jb)
        beam_permission(k)
        server_limits(k, jb, jo)
        reload(k, jb)
        cli(k)
        k.proc.send_signal(signal.SIGTERM)
        check("kexd exits 0 at SIGTERM", k.proc.wait(timeout=20) == 0)
        json_log(k)
    finally:
        if k.proc.poll() is None:
            k.proc.kill()
        k.ch.close()


if __name__ == "__main__":
    run(main, "test_auth.py")
