"""test_tenants.py - one tenant cannot hurt another (kexd --auth against a hostile co-tenant).

Run by test_tenants.sh with KEXD, KEX, KEXD_TMP and KEX_STUBS in the
environment.  Each part starts a kexd of its own (loopback, --auth with
tokens made here, --device cpu, no cache file unless it needs one) and
stops it as one check:

1. bytes a stalled Download pins after Free or CloseJob stay charged to its
   tenant (max_bytes both sides) until the stream ends;
2. the job table per tenant: --tenant-max-jobs (both sides) and eviction
   from a full table only of the evicting tenant's own idle jobs;
3. log lines cannot be forged (control characters escaped), an unknown
   :path without a token is UNAUTHENTICATED, no part of a token is logged;
4. a malformed job token is NOT_FOUND / INVALID_ARGUMENT, never
   FAILED_PRECONDITION naming another node;
5. the kex CLI takes KEX_TOKEN and --token-file; --token warns;
6. the metrics listener: non-loopback refused without TLS+auth or
   --insecure, a taken default port is a warning, slow clients time out;
7. the cache: a user lists and reads only entries its tenant made;
8. the compile budget: max_compile_seconds and --tenant-compile-budget
   (the flag's bounds, a bad entry refused at load), a tenant past its
   budget refused new compiles while its cached kernels still run, and the
   others unaffected.
9. searches share a device's slots: with --max-tunes-per-device 1 while
   alice's search holds the slot, bob's Tune and carol's beam Submit wait
   and then run (they were refused RESOURCE_EXHAUSTED); a waiting search
   ends by its deadline or a client cancel and leaves no slot taken; the
   line's limits (--max-search-queue, --max-search-queue-per-payer) refuse
   past them, naming the flag; SIGTERM ends a waiting search UNAVAILABLE.

KEX_TENANTS_PARTS="2,3" runs only those parts.  Prints "ok - ..." /
"FAIL - ..." per check and, last, "N passed, N failed".
"""
import hashlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.environ["KEX_STUBS"])

import grpc  # noqa: E402
from kex.v1 import kex_pb2, kex_pb2_grpc  # noqa: E402
from kexdtest import Kexd, add_graph, binary_graph, check, desc, free_port, rpc_error, run  # noqa: E402

KEXD, KEX, TMP = os.environ["KEXD"], os.environ["KEX"], os.environ["KEXD_TMP"]
MiB = 1 << 20
RE, NF, U = grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAUTHENTICATED
TOK = {n: secrets.token_hex(32) for n in ("ops", "alice", "bob", "carol", "mallory")}


def md(who):
    return (("authorization", f"Bearer {TOK[who]}"),)


def auth_file(name, **limits):
    """An --auth file: ops admin, the others users; limits: tenant -> extra keys of its entry."""
    tenants = []
    for who, tok in TOK.items():
        e = {"name": who, "role": "admin" if who == "ops" else "user",
             "token_sha256": hashlib.sha256(tok.encode()).hexdigest()}
        e.update(limits.get(who, {}))
        tenants.append(e)
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        json.dump({"tenants": tenants}, f)
    return path


class Server(Kexd):
    """A kexd --auth of a part's own, with a channel and a stub."""

    def __init__(self, auth, *args, **kw):
        super().__init__(KEXD, TMP, "--device", "cpu", "--cache", "", "--auth", auth, "--grace", "1", *args, **kw)
        self.ch = grpc.insecure_channel(f"127.0.0.1:{self.port}",
                                        options=[("grpc.max_receive_message_length", 64 * MiB)])
        self.kex = kex_pb2_grpc.KexStub(self.ch)

    def open(self, who, name="", memory=0):
        return self.kex.OpenJob(kex_pb2.OpenJobRequest(name=name or f"{who}-job", memory_limit=memory),
                                metadata=md(who), timeout=10).job

    def tenant(self, who):
        """who's TenantStats as GetStats shows it to who."""
        r = self.kex.GetStats(kex_pb2.GetStatsRequest(), metadata=md(who), timeout=10)
        return next((t for t in r.tenant_stats if t.name == who), None)

    def held(self, who):
        t = self.tenant(who)
        return t.bytes_held if t else 0

    def upload(self, who, job, n, chunk=MiB):
        def reqs():
            yield kex_pb2.UploadRequest(job=job, header=kex_pb2.UploadHeader(dtype="uint8", shape=[n]))
            for off in range(0, n, chunk):
                yield kex_pb2.UploadRequest(chunk=b"\7" * min(chunk, n - off))
        return self.kex.Upload(reqs(), metadata=md(who), timeout=60).handle

    def close(self):
        self.ch.close()
        self.stop()


def wait_for(cond, timeout=10.0):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


# ---- 1. bytes a stalled Download pins stay charged ----

def pinned_bytes():
    s = Server(auth_file("auth-bytes.json", mallory={"max_bytes": 33 * MiB}))
    try:
        if not check("1: kexd --auth (mallory max_bytes 33 MiB) serves", s.wait_healthy(), s.read_log()[-2000:]):
            return
        for how in ("Free", "CloseJob"):
            job = s.open("mallory", memory=64 * MiB)
            h = s.upload("mallory", job, 32 * MiB)
            check(f"1/{how}: mallory holds the 32 MiB buffer it uploaded", s.held("mallory") == 32 * MiB,
                  s.held("mallory"))
            dl = s.kex.Download(kex_pb2.DownloadRequest(job=job, handle=h, chunk_bytes=64 << 10), metadata=md("mallory"),
                                timeout=120)
            first = next(dl)
            check(f"1/{how}: a Download's first chunk arrives (then mallory stops reading)",
                  first.total_bytes == 32 * MiB and len(first.data) == 64 << 10, (first.total_bytes, len(first.data)))
            time.sleep(0.5)  # the flow-control windows fill; the stream stalls with the buffer referenced
            if how == "Free":
                s.kex.Free(kex_pb2.FreeRequest(job=job, handles=[h]), metadata=md("mallory"), timeout=10)
            else:
                s.kex.CloseJob(kex_pb2.CloseJobRequest(job=job), metadata=md("mallory"), timeout=10)
                job = s.open("mallory", memory=64 * MiB)
            held = s.held("mallory")
            check(f"1/{how}: after {how}, the buffer a stalled Download still reads stays charged to mallory "
                  f"(bytes_held 32 MiB, not 0)", held == 32 * MiB, held)
            e = rpc_error(s.upload, "mallory", job, 2 * MiB)
            check(f"1/{how}: so a 2 MiB upload is over mallory's max_bytes 33 MiB: RESOURCE_EXHAUSTED naming it",
                  e is not None and e.code() == RE and "max_bytes" in e.details(), desc(e))
            small = rpc_error(s.upload, "mallory", job, 512 << 10)
            check(f"1/{how}: a 512 KiB upload still fits under the limit", small is None, desc(small))
            dl.cancel()
            check(f"1/{how}: once the Download ends, the 32 MiB go back (bytes_held 512 KiB)",
                  wait_for(lambda: s.held("mallory") == 512 << 10), s.held("mallory"))
            e = rpc_error(s.upload, "mallory", job, 32 * MiB)
            check(f"1/{how}: and 32 MiB fit again", e is None, desc(e))
            s.kex.CloseJob(kex_pb2.CloseJobRequest(job=job), metadata=md("mallory"), timeout=10)
            check(f"1/{how}: CloseJob gives everything back (bytes_held 0)", wait_for(lambda: s.held("mallory") == 0),
                  s.held("mallory"))
    finally:
        s.close()


# ---- 2. the job table per tenant ----

def alive(s, who, job):
    return rpc_error(s.kex.GetStats, kex_pb2.GetStatsRequest(job=job), metadata=md(who), timeout=10) is None


def job_table():
    out = subprocess.run([KEXD, "--help"], capture_output=True, text=True, timeout=10).stdout
    check("2: kexd --help lists --tenant-max-jobs with its default and KEX_TENANT_MAX_JOBS",
          re.search(r"--tenant-max-jobs N .*\(default \d+\) \[KEX_TENANT_MAX_JOBS\]", out), out[:300])
    s = Server(auth_file("auth-jobs.json", carol={"max_jobs": 4}), "--tenant-max-jobs", "2")
    try:
        if not check("2: kexd --auth --tenant-max-jobs 2 serves", s.wait_healthy(), s.read_log()[-2000:]):
            return
        a = [s.open("alice"), s.open("alice")]
        e = rpc_error(s.open, "alice")
        check("2: alice opens 2 jobs; a 3rd is over --tenant-max-jobs 2: RESOURCE_EXHAUSTED naming the tenant and flag",
              e is not None and e.code() == RE and "alice" in e.details() and "--tenant-max-jobs" in e.details(), desc(e))
        check("2: bob still opens a job (alice's limit is alice's)", rpc_error(s.open, "bob") is None)
        c = [s.open("carol") for _ in range(4)]
        e = rpc_error(s.open, "carol")
        check("2: carol's own max_jobs 4 in --auth wins over the default: 4 open, the 5th refused",
              len(c) == 4 and e is not None and e.code() == RE and "max_jobs" in e.details(), desc(e))
        s.kex.CloseJob(kex_pb2.CloseJobRequest(job=a[0]), metadata=md("alice"), timeout=10)
        check("2: after closing one, alice opens another", rpc_error(s.open, "alice") is None)
    finally:
        s.close()


def eviction():
    """Only flags older than --tenant-max-jobs: alice's limit from --auth."""
    s = Server(auth_file("auth-evict.json", alice={"max_jobs": 3}), "--max-jobs", "4", "--job-evict-idle", "0.3")
    try:
        if not check("2: kexd --auth --max-jobs 4 --job-evict-idle 0.3 serves", s.wait_healthy(), s.read_log()[-2000:]):
            return
        a = [s.open("alice") for _ in range(3)]
        b = s.open("bob")
        time.sleep(0.6)  # every job idle past --job-evict-idle
        e = rpc_error(s.open, "mallory")
        check("2: the table full of others' idle jobs: mallory's OpenJob is RESOURCE_EXHAUSTED naming --max-jobs",
              e is not None and e.code() == RE and "--max-jobs" in e.details(), desc(e))
        check("2: and no job of alice or bob was evicted for mallory",
              all(alive(s, "alice", j) for j in a) and alive(s, "bob", b))
        time.sleep(0.6)
        b2 = rpc_error(s.open, "bob")
        check("2: bob's OpenJob in the full table evicts bob's own idle job", b2 is None and not alive(s, "bob", b),
              desc(b2))
        check("2: alice's jobs are all still open", all(alive(s, "alice", j) for j in a))
        st = s.kex.GetStats(kex_pb2.GetStatsRequest(), metadata=md("ops"), timeout=10)
        check("2: GetStats counts the one eviction", st.jobs_evicted == 1, st.jobs_evicted)
    finally:
        s.close()


# ---- 3. logs cannot be forged; methods cannot be listed; no part of a token is logged ----

FORGED = "2030-01-01T00:00:00.000Z info  access method=DeleteCache tenant=ops"


def raw_call(s, path, who=None):
    """A unary call to path with an empty request: (code, details)."""
    fn = s.ch.unary_unary(path, request_serializer=lambda b: b, response_deserializer=lambda b: b)
    e = rpc_error(fn, b"", metadata=md(who) if who else None, timeout=10)
    return (e.code(), e.details()) if e else (grpc.StatusCode.OK, "")


def logs():
    s = Server(auth_file("auth-logs.json"))
    try:
        if not check("3: kexd --auth (text log) serves", s.wait_healthy(), s.read_log()[-2000:]):
            return
        name = f"evil\n{FORGED} peer=x status=OK ms=1\r\x1b[2J\x07\\"
        job = s.open("mallory", name=name)
        s.kex.CloseJob(kex_pb2.CloseJobRequest(job=job), metadata=md("mallory"), timeout=10)
        paths = {}
        for path in ("/kex.v1.Kex/NoSuchMethod", "/kex.v1.Kex/Open Job tenant=ops", "/nope/x", "/kex.v1.Kex/X\x1b[2J"):
            paths[path] = (raw_call(s, path), raw_call(s, path, "mallory"))
        known = raw_call(s, "/kex.v1.Kex/OpenJob")
        check("3: a known method without a token: UNAUTHENTICATED", known[0] == U, known)
        check("3: an unregistered :path without a token: UNAUTHENTICATED, as a known method (methods cannot be listed)",
              all(a[0] == U for a, _ in paths.values()), {p: a for p, (a, _) in paths.items()})
        check("3: an unregistered :path with a tenant's token: UNIMPLEMENTED",
              all(b[0] == grpc.StatusCode.UNIMPLEMENTED for _, b in paths.values()),
              {p: b for p, (_, b) in paths.items()})
        time.sleep(0.3)
        log = s.read_log()
        check("3: a job name with newlines cannot forge a log line (no line starts with the forged time stamp)",
              not any(ln.startswith("2030-01-01") for ln in log.splitlines()), log[-1500:])
        check("3: the job name is in the log, its newline escaped as \\n", "evil\\n2030-01-01T00:00:00.000Z" in log,
              log[-1500:])
        check("3: no carriage return, ESC or BEL from a client reaches the log", not re.search("[\r\x1b\x07]", log),
              repr([ln for ln in log.splitlines() if re.search("[\r\x1b\x07]", ln)][:3]))
        check("3: control characters are escaped as \\r, \\xNN (and \\ as \\\\)", "\\r\\x1b[2J\\x07\\\\" in log,
              log[-1500:])
        check("3: a method path with spaces cannot pass for another access-log field (its value is quoted)",
              not re.search(r"access method=Open Job", log) and re.search(r'access method="Open Job tenant=ops"', log),
              [ln for ln in log.splitlines() if "Open Job" in ln][:3])
        check("3: no part of the job's token is logged (no 8 leading hex of it)", job[:8] not in log, job[:8])
        ids = re.findall(r" job=([0-9a-f]{8}) ", log)
        check("3: the job's log lines carry a log id of 8 hex, the same on each", len(set(ids)) == 1 and len(ids) >= 2,
              ids)
    finally:
        s.close()


# ---- 4. tokens parse strictly ----

def tokens():
    s = Server(auth_file("auth-tokens.json"))
    try:
        if not check("4: kexd --auth serves", s.wait_healthy(), s.read_log()[-2000:]):
            return
        t = s.open("mallory")
        hexpart, _, suffix = t.partition(".")
        node, _, addr = suffix.partition("@")
        call = lambda tok: rpc_error(s.kex.GetStats, kex_pb2.GetStatsRequest(job=tok), metadata=md("mallory"), timeout=10)
        check("4: the job's own token works", call(t) is None, desc(call(t)))
        bad = {"one more digit (a port over 65535)": t + "1", "one more letter": t + "x", "one more '@'": t + "@",
               "one more character in the name": f"{hexpart}.{node}x@{addr}",
               "this node's name, another address": f"{hexpart}.{node}@10.0.0.9:50051",
               "port 99999": f"{hexpart}.other@127.0.0.1:99999", "port 0": f"{hexpart}.other@127.0.0.1:0",
               "port with a leading zero": f"{hexpart}.other@127.0.0.1:050051", "no port": f"{hexpart}.other@host",
               "IPv6 port 70000": f"{hexpart}.other@[::1]:70000", "two colons": f"{hexpart}.other@a:1:2",
               "upper-case hex": t.upper(), "33 hex": hexpart + "0." + suffix}
        got = {what: call(tok) for what, tok in bad.items()}
        ok_codes = (NF, grpc.StatusCode.INVALID_ARGUMENT)
        for what, e in got.items():
            check(f"4: a malformed token ({what}): NOT_FOUND or INVALID_ARGUMENT, never FAILED_PRECONDITION",
                  e is not None and e.code() in ok_codes, desc(e))
        for what, tok in (("name@10.0.0.9:50051", f"{hexpart}.other@10.0.0.9:50051"),
                          ("name@[::1]:65535", f"{hexpart}.other@[::1]:65535"),
                          ("name@dns:///kex.example:50051", f"{hexpart}.other@dns:///kex.example:50051")):
            e = call(tok)
            check(f"4: a well-formed token of another node ({what}): FAILED_PRECONDITION naming it",
                  e is not None and e.code() == grpc.StatusCode.FAILED_PRECONDITION and "node other" in e.details(),
                  desc(e))
    finally:
        s.close()
    for adv, good in (("127.0.0.1:65536", False), ("127.0.0.1:0", False), ("host", False), ("[::1]:65535", True)):
        try:
            p = subprocess.run([KEXD, "--listen", f"127.0.0.1:{free_port()}", "--advertise", adv, "--device", "cpu",
                                "--cache", "", "--metrics", "off", "--lease", "bad" if good else "60"],
                               capture_output=True, text=True, timeout=10)
        except subprocess.TimeoutExpired as e:  # it started (killed by subprocess.run)
            p = subprocess.CompletedProcess(e.cmd, None, "", "(started and ran)")
        if good:  # --lease bad stops it after --advertise was taken
            check(f"4: --advertise {adv} is taken", "--advertise" not in p.stderr and "--lease" in p.stderr, p.stderr)
        else:
            check(f"4: --advertise {adv} is refused at start (exit 2) naming it", p.returncode == 2 and
                  f'--advertise "{adv}"' in p.stderr, (p.returncode, p.stderr[-500:]))


# ---- 5. the CLI keeps tokens out of argv ----

def cli_tokens():
    s = Server(auth_file("auth-cli.json"))
    try:
        if not check("5: kexd --auth serves", s.wait_healthy(), s.read_log()[-2000:]):
            return
        base = [KEX, "--server", f"127.0.0.1:{s.port}"]
        env = {k: v for k, v in os.environ.items() if k not in ("KEX_TOKEN", "KEX_SERVER", "KEX_JOB")}

        def kex(*args, **extra):
            r = subprocess.run(base + list(args), capture_output=True, text=True, timeout=60, env=dict(env, **extra))
            return r.returncode, r.stdout, r.stderr

        def tenant_of(out):
            try:
                return json.loads(out).get("tenant")
            except ValueError:
                return None

        rc, out, err = kex("stats", "--json", KEX_TOKEN=TOK["alice"])
        check("5: KEX_TOKEN: kex stats is served as alice, no warning", rc == 0 and tenant_of(out) == "alice" and
              "warning" not in err, (rc, out[:200], err))
        path = os.path.join(TMP, "alice.token")
        with open(path, "w") as f:
            f.write(TOK["alice"] + "\n")
        os.chmod(path, 0o600)
        rc, out, err = kex("--token-file", path, "stats", "--json")
        check("5: --token-file PATH (a 0600 file, the token and a newline): served as alice, no warning",
              rc == 0 and tenant_of(out) == "alice" and "warning" not in err, (rc, out[:200], err))
        rc, out, err = kex("--token-file", path, "stats", "--json", KEX_TOKEN=TOK["bob"])
        check("5: --token-file wins over KEX_TOKEN", rc == 0 and tenant_of(out) == "alice", (rc, out[:200], err))
        os.chmod(path, 0o644)
        rc, out, err = kex("--token-file", path, "stats", "--json")
        check("5: a --token-file others may read still works, with a warning to chmod 600 it",
              rc == 0 and tenant_of(out) == "alice" and "chmod 600" in err, (rc, err))
        rc, out, err = kex("--token", TOK["bob"], "stats", "--json")
        check("5: --token T still works (served as bob) but warns that ps shows it",
              rc == 0 and tenant_of(out) == "bob" and "warning" in err and "ps" in err, (rc, out[:200], err))
        check("5: the warning does not repeat the token", TOK["bob"] not in err, err)
        missing = os.path.join(TMP, "no-such.token")
        rc, out, err = kex("--token-file", missing, "stats")
        check("5: a --token-file that cannot be read: exit 2 naming it", rc == 2 and missing in err, (rc, err))
        empty = os.path.join(TMP, "empty.token")
        open(empty, "w").close()
        rc, out, err = kex("--token-file", empty, "stats")
        check("5: an empty --token-file: exit 2 saying so", rc == 2 and "no token" in err, (rc, err))
        rc, out, err = kex("--token", TOK["bob"], "--token-file", path, "stats")
        check("5: --token and --token-file together: exit 2", rc == 2, (rc, err))
        rc, out, err = kex("stats", "--json")
        check("5: no token at all: refused UNAUTHENTICATED", rc != 0 and "UNAUTHENTICATED" in err, (rc, err))
    finally:
        s.close()


# ---- 6. the metrics listener follows the gRPC rule ----

def start_status(k, timeout=20):
    """A kexd's exit status within timeout seconds, or "running" once it answers health."""
    if k.wait_healthy(timeout):
        return "running"
    try:
        return k.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return "hung"


def metrics_rules():
    auth = auth_file("auth-metrics.json")
    for flags, why in ((["--metrics", "0.0.0.0:{p}"], "--auth and TLS"),
                       (["--metrics", "[::]:{p}", "--auth", auth], "TLS")):
        p = free_port()
        k = Kexd(KEXD, TMP, "--device", "cpu", "--cache", "", *[f.format(p=p) for f in flags], env={"KEX_METRICS": None})
        rc = start_status(k)
        log = k.read_log()
        check(f"6: {' '.join(flags[:2]).format(p=p)} without {why}: refused at start (exit 2) saying why and naming "
              f"--insecure", rc == 2 and "refusing to serve metrics" in log and "--insecure" in log, (rc, log[-600:]))
        if rc == "running":
            k.stop()
    p = free_port()
    k = Kexd(KEXD, TMP, "--device", "cpu", "--cache", "", "--metrics", f"0.0.0.0:{p}", "--insecure",
             env={"KEX_METRICS": None})
    rc = start_status(k)
    check("6: --metrics 0.0.0.0:PORT --insecure: kexd starts and serves them", rc == "running" and
          http_status(("127.0.0.1", p)) == 200, (rc, k.read_log()[-600:]))
    if rc == "running":
        k.stop()
    # the default address taken (by this test, or by anyone else): a warning, and kexd runs without metrics
    held = socket.socket()
    try:
        held.bind(("127.0.0.1", 9464))
        held.listen(1)
    except OSError:
        held.close()
        held = None  # someone else holds it: taken all the same
    k = Kexd(KEXD, TMP, "--device", "cpu", "--cache", "", env={"KEX_METRICS": None})
    rc = start_status(k)
    log = k.read_log()
    check("6: the default metrics port taken: kexd warns and runs without metrics",
          rc == "running" and "running without metrics" in log and "127.0.0.1:9464" in log, (rc, log[-600:]))
    if rc == "running":
        k.stop()
    k = Kexd(KEXD, TMP, "--device", "cpu", "--cache", "", "--metrics", "127.0.0.1:9464", env={"KEX_METRICS": None})
    rc = start_status(k)
    check("6: the same address given with --metrics: still exit 1 naming it", rc == 1 and
          "127.0.0.1:9464" in k.read_log(), (rc, k.read_log()[-600:]))
    if rc == "running":
        k.stop()
    if held:
        held.close()


def http_status(addr, source=None, timeout=5):
    """The status of GET /metrics on addr from source address (None: any); None when it fails."""
    try:
        c = socket.create_connection(addr, timeout=timeout, source_address=(source, 0) if source else None)
        c.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        data = b""
        while True:
            b = c.recv(65536)
            if not b:
                break
            data += b
        c.close()
        m = re.match(rb"HTTP/1\.[01] (\d+)", data)
        return int(m.group(1)) if m else None
    except OSError:
        return None


def closed_within(sock, seconds):
    """True when the server closes sock (EOF or reset) within seconds."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except socket.timeout:
        return False
    except OSError:
        return True


def slow_clients():
    p = free_port()
    k = Kexd(KEXD, TMP, "--device", "cpu", "--cache", "", "--metrics", f"127.0.0.1:{p}", env={"KEX_METRICS": None})
    try:
        if not check("6: kexd with --metrics serves", k.wait_healthy(), k.read_log()[-1000:]):
            return
        slow = []
        for _ in range(20):  # a slow client from 127.0.0.2: half a request each, then nothing
            try:
                c = socket.create_connection(("127.0.0.1", p), timeout=5, source_address=("127.0.0.2", 0))
                c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                slow.append(c)
            except OSError:
                pass
        time.sleep(0.3)
        t0 = time.time()
        st = http_status(("127.0.0.1", p), source="127.0.0.1")
        check("6: 20 stalled connections from one address: a scrape from another is still answered 200 at once",
              st == 200 and time.time() - t0 < 2, (st, time.time() - t0))
        kept = [c for c in slow if not closed_within(c, 0.2)]
        check("6: one client address holds at most 4 metrics connections (the rest closed at once)",
              len(kept) == 4, len(kept))
        t0 = time.time()
        gone = all(closed_within(c, 8) for c in kept)
        took = time.time() - t0
        check("6: a stalled request is closed by the per-connection timeout (3 s), not before 2 s",
              gone and 2.0 <= took + 0.5 <= 6.5, (gone, round(took + 0.5, 1)))
        for c in slow:
            c.close()
        # libmicrohttpd forgets a closed connection at its next loop turn: give it a moment, not a promise
        check("6: then the address may connect again",
              wait_for(lambda: http_status(("127.0.0.1", p), source="127.0.0.2") == 200, timeout=5))
    finally:
        k.stop()


# ---- 7. cache visibility per tenant ----

def mul_graph():
    """a * b (float32[8], 3.0 and 0.5) on cpu: another kernel than add_graph's."""
    return binary_graph("MUL", 3.0, 0.5, 8)


def cache_visibility():
    s = Server(auth_file("auth-cache.json"), "--cache", os.path.join(TMP, "tenants-cache.db"))
    try:
        if not check("7: kexd --auth with a cache file serves", s.wait_healthy(), s.read_log()[-2000:]):
            return
        ja, jb, jo = s.open("alice"), s.open("bob"), s.open("ops")

        def tune(who, job, graph):
            evs = list(s.kex.Tune(kex_pb2.TuneRequest(job=job, graph=graph, beam=kex_pb2.BeamOptions(beam_width=2)),
                                  metadata=md(who), timeout=300))
            return [e.entry for e in evs if e.finished]

        def listed(who, job):
            return list(s.kex.ListCache(kex_pb2.ListCacheRequest(job=job), metadata=md(who), timeout=30).entries)

        mine = tune("alice", ja, add_graph())
        check("7: alice's Tune makes a cache entry", len(mine) == 1 and mine[0].key, mine)
        key = mine[0].key
        la = listed("alice", ja)
        check("7: alice lists her entry, marked as hers", [e.key for e in la] == [key] and la[0].tenant == "alice",
              [(e.key[:8], e.tenant) for e in la])
        lb = listed("bob", jb)
        check("7: bob lists none of alice's entries", key not in [e.key for e in lb], [(e.key[:8], e.tenant) for e in lb])
        e = rpc_error(s.kex.GetCacheEntry, kex_pb2.GetCacheEntryRequest(job=jb, key=key), metadata=md("bob"), timeout=30)
        check("7: bob's GetCacheEntry of alice's key: NOT_FOUND", e is not None and e.code() == NF, desc(e))
        got = s.kex.GetCacheEntry(kex_pb2.GetCacheEntryRequest(job=ja, key=key), metadata=md("alice"), timeout=30)
        check("7: alice's GetCacheEntry of it: the entry", got.key == key and got.tenant == "alice", got.tenant)
        lo = listed("ops", jo)
        check("7: the admin lists every entry, with the tenant that made it",
              [(x.key, x.tenant) for x in lo] == [(key, "alice")], [(x.key[:8], x.tenant) for x in lo])
        got = rpc_error(s.kex.GetCacheEntry, kex_pb2.GetCacheEntryRequest(job=jo, key=key), metadata=md("ops"), timeout=30)
        check("7: the admin reads it too", got is None, desc(got))
        before = s.kex.GetStats(kex_pb2.GetStatsRequest(), metadata=md("ops"), timeout=10)
        req = kex_pb2.SubmitRequest(job=jb, graph=add_graph(), only_done=True, free_outputs=True)
        req.beam.beam_width = 2
        last = list(s.kex.Submit(req, metadata=md("bob"), timeout=300))[-1]
        after = s.kex.GetStats(kex_pb2.GetStatsRequest(), metadata=md("ops"), timeout=10)
        check("7: bob's beam Submit of the same kernel still uses alice's entry (a beam cache hit, no search)",
              after.beam_cache_hits == before.beam_cache_hits + 1 and after.searches_run == before.searches_run,
              (before.beam_cache_hits, after.beam_cache_hits, before.searches_run, after.searches_run, str(last)[:200]))
        his = tune("bob", jb, mul_graph())
        lb = listed("bob", jb)
        check("7: bob's own Tune: bob lists exactly his entry", len(his) == 1 and
              [(x.key, x.tenant) for x in lb] == [(his[0].key, "bob")], [(x.key[:8], x.tenant) for x in lb])
        check("7: the admin lists both", len(listed("ops", jo)) == 2)
    finally:
        s.close()


# ---- 8. the compile budget ----

def budget_graph(n):
    """a + b of float32[n] on cpu: each n is a kernel of its own (the size is in its source)."""
    return binary_graph("ADD", 1.0, 2.0, n)


def scrape(port):
    import urllib.request
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def compile_budget():
    out = subprocess.run([KEXD, "--help"], capture_output=True, text=True, timeout=10).stdout
    check("8: kexd --help lists --tenant-compile-budget, default 0 (unlimited), KEX_TENANT_COMPILE_BUDGET",
          re.search(r"--tenant-compile-budget SECONDS .*\(default 0\) \[KEX_TENANT_COMPILE_BUDGET\]", out), out[:300])
    bad = {}
    for value in ("-1", "-0.001", "nan", "inf", "1000000.5", "1h"):
        p = subprocess.run([KEXD, "--tenant-compile-budget", value, "--help"], capture_output=True, text=True, timeout=10)
        if p.returncode != 2 or "--tenant-compile-budget" not in p.stderr or "[0, 1e+06]" not in p.stderr:
            bad[value] = (p.returncode, p.stderr[-200:])
    check("8: --tenant-compile-budget below 0, past 1e6 s or not a number: exit 2 naming the flag and its range",
          not bad, bad)
    ends = {v: subprocess.run([KEXD, "--tenant-compile-budget", v, "--help"], capture_output=True, timeout=10).returncode
            for v in ("0", "1000000")}
    check("8: --tenant-compile-budget 0 and 1000000 (the bounds) are taken", ends == {"0": 0, "1000000": 0}, ends)
    k = Kexd(KEXD, TMP, "--device", "cpu", "--cache", "", "--auth",
             auth_file("auth-budget-bad.json", alice={"max_compile_seconds": 0}))
    rc = start_status(k)
    log = k.read_log()
    check("8: an --auth entry with max_compile_seconds 0: kexd stops at load (exit 1) naming the entry and field",
          rc == 1 and "alice" in log and "max_compile_seconds must be a number" in log, (rc, log[-600:]))
    if rc == "running":
        k.stop()
    mport = free_port()
    # alice: a budget so small that her first compile spends it all; carol: a large one; bob: none (no flag)
    s = Server(auth_file("auth-budget.json", alice={"max_compile_seconds": 0.001},
                         carol={"max_compile_seconds": 3600}),
               "--cache", os.path.join(TMP, "budget-cache.db"), "--max-programs", "1",
               "--metrics", f"127.0.0.1:{mport}")
    try:
        if not check("8: kexd --auth (alice max_compile_seconds 0.001, carol 3600) serves", s.wait_healthy(),
                     s.read_log()[-2000:]):
            return
        jobs = {who: s.open(who) for who in ("alice", "bob", "carol")}

        def submit(who, n):
            req = kex_pb2.SubmitRequest(job=jobs[who], graph=budget_graph(n), only_done=True, free_outputs=True)
            return rpc_error(lambda: list(s.kex.Submit(req, metadata=md(who), timeout=60)))

        e = submit("alice", 5)
        check("8: alice's first new graph compiles (budget left when it starts)", e is None, desc(e))
        e = submit("alice", 6)
        check("8: her second new graph: RESOURCE_EXHAUSTED naming alice, max_compile_seconds 0.001 and when the next "
              "compile is possible", e is not None and e.code() == RE and "alice" in e.details() and
              "max_compile_seconds 0.001" in e.details() and re.search(r"next compile is possible in [0-9.]+ s",
                                                                       e.details()), desc(e))
        e = submit("alice", 5)
        check("8: the first graph again (its program loaded) still runs for alice", e is None, desc(e))
        e = [submit("bob", 6), submit("bob", 7)]
        check("8: bob (no budget) compiles two new graphs, one of them the graph alice was refused", e == [None, None],
              [desc(x) for x in e])
        e = [submit("carol", 8), submit("carol", 9)]
        check("8: carol (max_compile_seconds 3600) compiles two new graphs", e == [None, None], [desc(x) for x in e])
        before = s.kex.GetStats(kex_pb2.GetStatsRequest(), metadata=md("ops"), timeout=10)
        e = [submit("alice", 5), submit("alice", 6)]
        after = s.kex.GetStats(kex_pb2.GetStatsRequest(), metadata=md("ops"), timeout=10)
        hits = (after.program_cache_sqlite_hits - before.program_cache_sqlite_hits,
                after.program_cache_misses - before.program_cache_misses)
        check("8: alice runs her first graph and the one bob compiled, both read from the program cache file "
              "(--max-programs 1 unloaded them), nothing compiled", e == [None, None] and hits == (2, 0),
              ([desc(x) for x in e], hits))
        e = submit("alice", 10)
        check("8: a new graph of alice's is still refused", e is not None and e.code() == RE, desc(e))
        text = scrape(mport)
        got = {who: re.search(r'^kex_tenant_compile_budget_refused_total\{tenant="%s"\} (\S+)$' % who, text, re.M)
               for who in ("alice", "bob", "carol")}
        got = {who: m.group(1) if m else None for who, m in got.items()}
        check("8: kex_tenant_compile_budget_refused_total: alice 2, bob 0, carol 0",
              got == {"alice": "2", "bob": "0", "carol": "0"}, got)
    finally:
        s.close()
    # the flag: every tenant whose entry sets no max_compile_seconds
    s = Server(auth_file("auth-budget-flag.json", carol={"max_compile_seconds": 3600}),
               "--tenant-compile-budget", "0.001")
    try:
        if not check("8: kexd --auth --tenant-compile-budget 0.001 serves", s.wait_healthy(), s.read_log()[-2000:]):
            return
        jobs = {who: s.open(who) for who in ("bob", "carol")}

        def submit(who, n):
            req = kex_pb2.SubmitRequest(job=jobs[who], graph=budget_graph(n), only_done=True, free_outputs=True)
            return rpc_error(lambda: list(s.kex.Submit(req, metadata=md(who), timeout=60)))

        e = [submit("bob", 5), submit("bob", 6)]
        check("8: --tenant-compile-budget 0.001: bob's first new graph compiles, the second is RESOURCE_EXHAUSTED "
              "naming the flag", e[0] is None and e[1] is not None and e[1].code() == RE and
              "--tenant-compile-budget" in e[1].details(), [desc(x) for x in e])
        e = [submit("carol", 7), submit("carol", 8)]
        check("8: carol's own max_compile_seconds 3600 wins over the flag: both compile", e == [None, None],
              [desc(x) for x in e])
    finally:
        s.close()


# ---- 9. searches wait for a slot, fairly ----

class Search(threading.Thread):
    """A search of who's as a call of its own: a Tune (width 1), or a Submit with beam.beam_width 1 (submit=True);
    .error (the RpcError it ended with, or None), .ok (a Tune's finished event, a Submit's done event arrived),
    .ended (time.time() at its end)."""

    def __init__(self, s, who, job, graph, submit=False, timeout=60):
        super().__init__()
        self.s, self.who, self.job, self.graph, self.submit, self.timeout = s, who, job, graph, submit, timeout
        self.error, self.ok, self.ended, self.it = None, False, None, None
        self.start()

    def run(self):
        beam = kex_pb2.BeamOptions(beam_width=1)
        if self.submit:
            self.it = self.s.kex.Submit(kex_pb2.SubmitRequest(job=self.job, graph=self.graph, beam=beam, only_done=True,
                                                              free_outputs=True), metadata=md(self.who),
                                        timeout=self.timeout)
        else:
            self.it = self.s.kex.Tune(kex_pb2.TuneRequest(job=self.job, graph=self.graph, beam=beam),
                                      metadata=md(self.who), timeout=self.timeout)
        try:
            evs = list(self.it)
            self.ok = any(e.finished for e in evs) if not self.submit else evs[-1].HasField("done")
        except grpc.RpcError as e:
            self.error = e
        self.ended = time.time()


def hold_slot(s, busy, job, s_=1.2):
    """alice's search holds the device's one slot for at least s_ seconds: her job's device flow is first kept busy
    (_BusyWork) so her Tune's timing runs wait behind it.  Returns her Search."""
    busy(kex_pb2.BusyWorkRequest(job=job, items=4, ms=int(s_ * 250)), metadata=md("alice"), timeout=5)
    a = Search(s, "alice", job, add_graph())
    time.sleep(0.2)
    return a


def sub_graph():
    """a - b (float32[8], 3.0 and 0.5) on cpu: a kernel of its own."""
    return binary_graph("SUB", 3.0, 0.5, 8)


def searches():
    s = Server(auth_file("auth-search.json"), "--max-tunes-per-device", "1", "--test-busy-work")
    busy = s.ch.unary_unary("/kex.v1.Kex/_BusyWork", request_serializer=kex_pb2.BusyWorkRequest.SerializeToString,
                            response_deserializer=kex_pb2.BusyWorkReply.FromString)
    try:
        if not check("9: kexd --auth --max-tunes-per-device 1 serves", s.wait_healthy(), s.read_log()[-2000:]):
            return
        ja, jb, jc = s.open("alice"), s.open("bob"), s.open("carol")
        a = hold_slot(s, busy, ja)
        b = Search(s, "bob", jb, mul_graph())
        c = Search(s, "carol", jc, sub_graph(), submit=True)
        for x in (a, b, c):
            x.join(60)
        check("9: alice's search holds the only slot and finishes", a.ok and a.error is None, desc(a.error))
        check("9: bob's Tune meanwhile waits for the slot, then runs to its finished event (it was RESOURCE_EXHAUSTED)",
              b.ok and b.error is None and b.ended > a.ended, (desc(b.error), b.ended and b.ended - a.ended))
        check("9: carol's Submit with beam.beam_width waits too, then runs to its done event",
              c.ok and c.error is None and c.ended > a.ended, (desc(c.error), c.ended and c.ended - a.ended))
        a = hold_slot(s, busy, ja)
        t0 = time.time()
        d = Search(s, "bob", jb, mul_graph(), timeout=0.6)
        x = Search(s, "carol", jc, sub_graph())
        d.join(30)
        took = time.time() - t0
        time.sleep(0.1)
        x.it.cancel()
        x.join(30)
        check("9: a waiting search whose deadline passes ends DEADLINE_EXCEEDED (after waiting, not refused at once)",
              d.error is not None and d.error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and took >= 0.5,
              (desc(d.error), round(took, 2)))
        check("9: a waiting search the client cancels ends CANCELLED",
              x.error is not None and x.error.code() == grpc.StatusCode.CANCELLED, desc(x.error))
        a.join(60)
        t0 = time.time()
        e = Search(s, "bob", jb, mul_graph(), timeout=20)
        e.join(30)
        check("9: once alice's search ends, bob's next search runs at once: the two that left the line hold no slot",
              a.ok and e.ok and e.error is None and time.time() - t0 < 10, (desc(a.error), desc(e.error)))
        a = hold_slot(s, busy, ja)
        jc2 = s.open("carol")
        w = Search(s, "carol", jc2, sub_graph(), timeout=30)
        time.sleep(0.3)
        s.kex.CloseJob(kex_pb2.CloseJobRequest(job=jc2), metadata=md("carol"), timeout=10)
        w.join(10)
        a.join(60)
        check("9: closing a job ends its search waiting for a slot at once, NOT_FOUND (not when the slot comes)",
              w.error is not None and w.error.code() == grpc.StatusCode.NOT_FOUND and "closed" in w.error.details()
              and w.ended is not None and a.ended is not None and w.ended < a.ended,
              (desc(w.error), w.ended and a.ended and round(a.ended - w.ended, 2)))
    finally:
        s.close()
    s = Server(auth_file("auth-search-queue.json"), "--max-tunes-per-device", "1", "--max-search-queue", "2",
               "--max-search-queue-per-payer", "1", "--test-busy-work")
    busy = s.ch.unary_unary("/kex.v1.Kex/_BusyWork", request_serializer=kex_pb2.BusyWorkRequest.SerializeToString,
                            response_deserializer=kex_pb2.BusyWorkReply.FromString)
    try:
        if not check("9: kexd --max-search-queue 2 --max-search-queue-per-payer 1 serves", s.wait_healthy(),
                     s.read_log()[-2000:]):
            return
        ja, jb, jc, jm = s.open("alice"), s.open("bob"), s.open("carol"), s.open("mallory")
        a = hold_slot(s, busy, ja)
        b = Search(s, "bob", jb, mul_graph())
        time.sleep(0.1)
        e = rpc_error(lambda: list(s.kex.Tune(kex_pb2.TuneRequest(job=jb, graph=sub_graph()), metadata=md("bob"),
                                              timeout=10)))
        check("9: bob's second waiting search: RESOURCE_EXHAUSTED naming tenant 'bob' and --max-search-queue-per-payer",
              e is not None and e.code() == RE and "tenant 'bob'" in e.details() and
              "--max-search-queue-per-payer" in e.details(), desc(e))
        c = Search(s, "carol", jc, sub_graph())
        time.sleep(0.1)
        e = rpc_error(lambda: list(s.kex.Tune(kex_pb2.TuneRequest(job=jm, graph=sub_graph()), metadata=md("mallory"),
                                              timeout=10)))
        check("9: mallory's search with the line full (2): RESOURCE_EXHAUSTED naming --max-search-queue",
              e is not None and e.code() == RE and "--max-search-queue)" in e.details(), desc(e))
        for x in (a, b, c):
            x.join(60)
        check("9: the searches in line run once the slot is free", a.ok and b.ok and c.ok,
              (desc(a.error), desc(b.error), desc(c.error)))
        a = hold_slot(s, busy, ja)
        w = Search(s, "bob", jb, mul_graph())
        time.sleep(0.2)
        t0 = time.time()
        s.proc.send_signal(signal.SIGTERM)
        w.join(30)
        check("9: SIGTERM ends a waiting search at once (its stop hook, not the cancel after --grace): UNAVAILABLE, "
              "kexd is stopping", w.error is not None and w.error.code() == grpc.StatusCode.UNAVAILABLE and
              "kexd is stopping" in w.error.details(), (desc(w.error), round(time.time() - t0, 2)))
        a.join(30)
    finally:
        s.close()
    s = Server(auth_file("auth-search-lease.json"), "--max-tunes-per-device", "1", "--lease", "1", "--test-busy-work")
    busy = s.ch.unary_unary("/kex.v1.Kex/_BusyWork", request_serializer=kex_pb2.BusyWorkRequest.SerializeToString,
                            response_deserializer=kex_pb2.BusyWorkReply.FromString)
    try:
        if not check("9: kexd --lease 1 --max-tunes-per-device 1 serves", s.wait_healthy(), s.read_log()[-2000:]):
            return
        ja, jb = s.open("alice"), s.open("bob")
        a = hold_slot(s, busy, ja, 2.5)
        b = Search(s, "bob", jb, mul_graph())
        a.join(60)
        b.join(60)
        check("9: a job whose search holds or waits for a slot longer than its lease (1 s) does not expire: both "
              "searches finish", a.ok and b.ok and a.error is None and b.error is None and b.ended > a.ended,
              (desc(a.error), desc(b.error)))
    finally:
        s.close()


PARTS = {"1": lambda: pinned_bytes(), "2": lambda: (job_table(), eviction()), "3": logs, "4": tokens, "5": cli_tokens, "6": lambda: (metrics_rules(), slow_clients()), "7": cache_visibility,
         "8": compile_budget, "9": searches}


def main():
    only = os.environ.get("KEX_TENANTS_PARTS")  # "2,3": run only those parts (checking one fix at a time)
    for k, part in PARTS.items():
        if not only or k in only.split(","):
            part()


if __name__ == "__main__":
    run(main, "test_tenants.py")
