"""test_fleet_clients.py - clients that know a fleet: three real kexds on 127.0.0.1.

Run by test_fleet_clients.sh, which passes in the environment: KEXD (the
binary), FLEET_TEST (tests/fleet_test: libkex driven line by line), KEX_CLI
(the kex binary), KEX_PYTHON_DIR (client/python) and KEX_STUBS.

Three kexds (node-a, node-b, node-c; each its own SQLite cache file, cpu
device) are one fleet, "127.0.0.1:PA,127.0.0.1:PB,127.0.0.1:PC".  Checked:
kexd's side (OpenJob names the node and its address, the token carries
them, another node's token is FAILED_PRECONDITION naming its node, bad
--node-name/--advertise values stop kexd); jobs opened through the list with
libkex (one client), the Python client and the kex CLI spread over the nodes
(each node's GetStats agrees) and every job's Upload/Submit/Download runs on
its node; then node B is killed (SIGKILL): B's jobs fail UNAVAILABLE naming
node-b and its address in all three clients, new jobs land on A and C only,
and A's and C's jobs keep working.  Prints "N passed, N failed" last.
"""
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

from kexdtest import check, desc, launch, rpc_error, run, start_kexd, stop  # noqa: E402
import grpc  # noqa: E402
import health_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402

KEXD = os.environ["KEXD"]
FLEET_TEST = os.environ["FLEET_TEST"]
KEX_CLI = os.environ["KEX_CLI"]
# the Python client's package is `kex` too (the stubs' kex.v1 is not used here): it goes first, and its own stubs
# (generated from the same proto/kex/v1/kex.proto) serve the direct calls
sys.path.insert(0, os.environ["KEX_PYTHON_DIR"])
import kex  # noqa: E402
from kex._client import pb as kex_pb2, pb_grpc as kex_pb2_grpc  # noqa: E402

NAMES = ("node-a", "node-b", "node-c")
NPY = None  # a float32[4] .npy file the CLI uploads (main writes it)
TOKEN = re.compile(r"^[0-9a-f]{32}\.([A-Za-z0-9._:/\[\]-]+)@(\S+)$")


def node_of(token):
    """The node name a kexd token names ("" when it is not one)."""
    m = TOKEN.match(token or "")
    return m.group(1) if m else ""


def stats(port):
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        return kex_pb2_grpc.KexStub(ch).GetStats(kex_pb2.GetStatsRequest(), timeout=5)


def fleet_cmd(proc, line):
    """Send one command to fleet_test; its "job ..." lines as (token, ok, rest)."""
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    out = []
    for text in proc.stdout:
        text = text.rstrip("\n")
        if text == "done":
            return out
        parts = text.split(" ", 3)
        out.append((parts[1], parts[2] == "ok", parts[3] if len(parts) > 3 else ""))
    raise RuntimeError("fleet_test ended early")


def cli(*args):
    return subprocess.run([KEX_CLI, *args], capture_output=True, text=True, timeout=60)


def main():
    tmp = os.environ.get("KEX_FLEET_TMP") or tempfile.mkdtemp(prefix="kex-fleet-")
    global NPY
    NPY = os.path.join(tmp, "a.npy")
    np.save(NPY, np.arange(4, dtype=np.float32))
    procs, ports = {}, {}
    for name in NAMES:
        proc, port, healthy = start_kexd(KEXD, tmp, "--device", "cpu", "--metrics", "off", "--grace", "1",
                                         "--cache", os.path.join(tmp, f"cache-{name}.db"), "--node-name", name)
        procs[name], ports[name] = proc, port
        check(f"{name} answers health on 127.0.0.1:{port}", healthy)
    addr = {n: f"127.0.0.1:{ports[n]}" for n in NAMES}
    target = ",".join(addr[n] for n in NAMES)
    try:
        server_side(addr, tmp)
        fleet_run(target, addr, procs, ports)
    finally:
        for name, proc in procs.items():
            if proc.poll() is None:
                check(f"{name} exits 0 at SIGTERM", stop(proc) == 0)
    tls_fleet(tmp)


def tls_fleet(tmp):
    """Two kexds with TLS and --auth: the list works with --root-certs and a bearer token (kex and Python)."""
    cert, key, auth, secret = (os.path.join(tmp, "node.pem"), os.path.join(tmp, "node.key"),
                               os.path.join(tmp, "auth.json"), "fleet-secret")
    made = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                           "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1", "-addext",
                           "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert], capture_output=True)
    if not check("openssl makes the nodes' self-signed certificate", made.returncode == 0, made.stderr[-300:]):
        return
    with open(auth, "w") as f:
        json.dump({"tenants": [{"name": "fleet", "role": "user",
                                "token_sha256": hashlib.sha256(secret.encode()).hexdigest()}]}, f)
    procs, addrs = [], []
    creds = grpc.ssl_channel_credentials(open(cert, "rb").read())
    try:
        for name in ("node-t1", "node-t2"):
            proc, port = launch(KEXD, tmp, "--device", "cpu", "--metrics", "off", "--grace", "1", "--cache",
                                os.path.join(tmp, f"{name}.db"), "--node-name", name, "--tls-cert", cert, "--tls-key",
                                key, "--auth", auth, log=os.path.join(tmp, f"{name}.log"))
            procs.append(proc)
            addrs.append(f"127.0.0.1:{port}")
            check(f"{name} answers health over TLS", tls_healthy(addrs[-1], creds, procs[-1]))
        target = ",".join(addrs)
        sec = ["--server", target, "--root-certs", cert, "--token", secret]
        jobs = [cli(*sec, "job", "open").stdout.strip() for _ in range(4)]
        check("kex --root-certs --token with a list: jobs open on the TLS nodes", all(node_of(t) for t in jobs), jobs)
        ups = [cli(*sec, "upload", "--job", t, NPY) for t in jobs if node_of(t)]
        check("kex: each job's upload reaches its node over TLS with the token", ups and
              all(u.returncode == 0 for u in ups), [u.stderr for u in ups if u.returncode])
        pcs = [kex.Client(target, root_certs=cert, token=secret) for _ in range(4)]
        while len(pcs) < 16 and len({node_of(pc.job) for pc in pcs}) < 2:
            pcs.append(kex.Client(target, root_certs=cert, token=secret))
        check("python: Clients with root_certs and token spread over both TLS nodes",
              {node_of(pc.job) for pc in pcs} == {"node-t1", "node-t2"}, [pc.node for pc in pcs])
        check("python: their calls reach their nodes over TLS",
              all(pc.download(pc.upload(np.ones(4, np.float32)))[1] == (4,) for pc in pcs))
        for pc in pcs:
            pc.close()
    finally:
        for i, proc in enumerate(procs):
            check(f"node-t{i + 1} exits 0 at SIGTERM", stop(proc) == 0)


def tls_healthy(addr, creds, proc, timeout=20.0):
    """True once addr answers health SERVING over TLS (the port first, as kexdtest.wait_healthy)."""
    end = time.time() + timeout
    while time.time() < end and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", int(addr.rsplit(":", 1)[1])), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.01)
    with grpc.secure_channel(addr, creds) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.time() < end and proc.poll() is None:
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError as e:
                time.sleep(0.1)
    return False


def server_side(addr, tmp):
    """OpenJob names its node; another node's token is FAILED_PRECONDITION naming it; bad flags stop kexd."""
    with grpc.insecure_channel(addr["node-a"]) as ca, grpc.insecure_channel(addr["node-b"]) as cb:
        sa, sb = kex_pb2_grpc.KexStub(ca), kex_pb2_grpc.KexStub(cb)
        r = sa.OpenJob(kex_pb2.OpenJobRequest(name="direct"), timeout=5)
        check("OpenJob names the node and its advertised address (default: --listen)",
              r.node == "node-a" and r.advertise == addr["node-a"], f"{r.node} {r.advertise}")
        check("the token is HEX.NODE@ADVERTISE", r.job == f"{r.job[:32]}.node-a@{addr['node-a']}" and
              node_of(r.job) == "node-a", r.job)
        e = rpc_error(sb.GetStats, kex_pb2.GetStatsRequest(job=r.job), timeout=5)
        check("node-a's token at node-b: FAILED_PRECONDITION naming node-a, its address and node-b",
              e is not None and e.code() == grpc.StatusCode.FAILED_PRECONDITION and
              f"node node-a at {addr['node-a']}" in e.details() and "this is node node-b" in e.details(), desc(e))
        check("the bare HEX part of the token works at its node",
              rpc_error(sa.GetStats, kex_pb2.GetStatsRequest(job=r.job[:32]), timeout=5) is None)
        forged = ("0" * 32) + r.job[32:]
        e = rpc_error(sa.GetStats, kex_pb2.GetStatsRequest(job=forged), timeout=5)
        check("a forged HEX with node-a's tail: NOT_FOUND", e is not None and e.code() == grpc.StatusCode.NOT_FOUND,
              desc(e))
        e = rpc_error(sa.GetStats, kex_pb2.GetStatsRequest(job=r.job[:32] + ".node-a@10.0.0.9:1"), timeout=5)
        check("the right HEX with this node's name and another address: NOT_FOUND (a damaged token of this node, "
              "never FAILED_PRECONDITION naming a node)", e is not None and e.code() == grpc.StatusCode.NOT_FOUND,
              desc(e))
        e = rpc_error(sa.GetStats, kex_pb2.GetStatsRequest(job=r.job[:32] + ".node-z@10.0.0.9:1"), timeout=5)
        check("the right HEX with another node's name and address: FAILED_PRECONDITION (it names another node)",
              e is not None and e.code() == grpc.StatusCode.FAILED_PRECONDITION and "node-z" in e.details(), desc(e))
        sa.CloseJob(kex_pb2.CloseJobRequest(job=r.job), timeout=5)
    with_max = start_kexd(KEXD, tmp, "--device", "cpu", "--metrics", "off", "--cache", "", "--node-name", "n" * 31,
                          "--advertise", "a" * 56 + ":50051")
    if check("kexd takes a 31-character --node-name and a 62-character --advertise", with_max[2]):
        p = cli("--server", f"127.0.0.1:{with_max[1]}", "job", "open")
        t = p.stdout.strip()
        check("... and its 127-character token fits libkex's KEX_TOKEN_MAX intact (kex job open)",
              len(t) == 127 and t.endswith(".%s@%s:50051" % ("n" * 31, "a" * 56)), t)
    stop(with_max[0])
    for flag, value in (("--node-name", "bad name"), ("--node-name", "n" * 32), ("--advertise", "a@b:1"),
                        ("--advertise", "h" * 63)):
        p = subprocess.run([KEXD, "--listen", "127.0.0.1:1", "--metrics", "off", flag, value], capture_output=True,
                           text=True, timeout=20)
        check(f"kexd {flag} {value[:12]}...: exit 2 naming the flag", p.returncode == 2 and flag in p.stderr,
              f"rc {p.returncode} {p.stderr.strip()[:200]}")


def fleet_run(target, addr, procs, ports):
    a_c = {"node-a", "node-c"}
    # ---- libkex: one client, nine jobs ----
    ft = subprocess.Popen([FLEET_TEST, target], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    first = fleet_cmd(ft, "open 9")
    while len(first) < 30 and len({node_of(t) for t, _, _ in first}) < 3:  # a loaded machine: a node connects late
        first += fleet_cmd(ft, "open 3")
    check("libkex: jobs opened through the list, each one's Upload/Submit/Download ok on its node",
          len(first) >= 9 and all(ok for _, ok, _ in first), first)
    per_node = {n: sum(node_of(t) == n for t, _, _ in first) for n in NAMES}
    check("libkex: round_robin spread the jobs over all three nodes", all(per_node.values()), per_node)
    open_now = {n: stats(ports[n]).jobs_open for n in NAMES}
    check("each node's GetStats holds exactly the jobs whose tokens name it", open_now == per_node,
          f"stats {open_now} tokens {per_node}")

    # ---- Python: six Clients ----
    pcs = [kex.Client(target, name=f"py{i}") for i in range(6)]
    while len(pcs) < 20 and len({node_of(pc.job) for pc in pcs}) < 2:
        pcs.append(kex.Client(target, name=f"py{len(pcs)}"))
    py_nodes = {pc.node.split(" at ")[0] for pc in pcs}
    check("python: the Clients' jobs spread over the nodes (one fleet channel per process)", len(py_nodes) >= 2,
          [pc.node for pc in pcs])
    check("python: Client.node is NAME at ADVERTISE, the address its calls go to",
          all(pc.node == f"{node_of(pc.job)} at {addr[node_of(pc.job)]}" for pc in pcs), [pc.node for pc in pcs])
    graph = kex_pb2.Graph(device="cpu", outputs=[1])

    def py_round(pc):
        h = pc.upload(np.array([1, 2, 3, 4], dtype=np.float32))
        g = kex_pb2.Graph()
        g.CopyFrom(graph)
        g.nodes.add(op="BUFFER", dtype="float32", shape=[4], buffer=h)
        g.nodes.add(op="ADD", src=[0, 0])
        done = pc.submit(g, return_bytes=False)
        _, _, data = pc.download(done.outputs[0].handle)
        return np.frombuffer(data, dtype=np.float32).tolist() == [2, 4, 6, 8]

    check("python: every Client's Upload/Submit/Download runs on its node", all(py_round(pc) for pc in pcs))

    # ---- the kex CLI ----
    cli_jobs = [cli("--server", target, "job", "open").stdout.strip() for _ in range(6)]
    check("kex --server LIST job open: tokens naming a node of the list", all(node_of(t) in NAMES for t in cli_jobs),
          cli_jobs)
    p = cli("--server", target, "job", "open", "--json")
    j = json.loads(p.stdout or "{}")
    check("kex job open --json: node and advertise of the job's node", j.get("node") in NAMES and
          j.get("advertise") == addr.get(j.get("node")) and node_of(j.get("job")) == j.get("node"), p.stdout)
    cli_jobs.append(j.get("job", ""))
    ups = [cli("--server", target, "upload", "--job", t, NPY) for t in cli_jobs]
    check("kex upload --job TOKEN goes to the token's node", all(u.returncode == 0 for u in ups),
          [u.stderr for u in ups if u.returncode])

    p = cli("--server", f"kexd.invalid:1,{addr['node-a']}", "health")
    check("kex: a list with a host name is refused, pointing at dns:///", p.returncode != 0 and "dns:///" in p.stderr,
          p.stderr)
    p = cli("--server", "127.0.0.1,kexd.invalid", "health")  # refused before dialing: names the list it got
    check("kex: list items without a port get :50051 each", "127.0.0.1:50051,kexd.invalid:50051" in p.stderr,
          p.stderr)
    try:
        kex.Client(f"kexd.invalid:1,{addr['node-a']}")
        e = None
    except ValueError as x:
        e = x
    check("python: a list with a host name is refused, pointing at dns:///", e is not None and "dns:///" in str(e),
          repr(e))

    for n, good in ((64, True), (65, False)):  # libkex's limit on a list, both sides (nothing is dialed)
        p = subprocess.run([FLEET_TEST, ",".join(f"127.0.0.1:{i}" for i in range(1, n + 1))], input="quit\n",
                           capture_output=True, text=True, timeout=30)
        check(f"libkex: a list of {n} servers is {'taken' if good else 'refused, naming the limit'}",
              (p.returncode == 0) if good else (p.returncode == 1 and "at most 64" in p.stderr), p.stderr[-300:])

    # ---- node B dies ----
    procs["node-b"].kill()
    procs["node-b"].wait()
    b_addr = addr["node-b"]
    again = fleet_cmd(ft, "use")
    b_fail = [(t, rest) for t, ok, rest in again if node_of(t) == "node-b"]
    check("libkex: B's jobs fail UNAVAILABLE naming node-b and its address",
          b_fail and all(rest.startswith("UNAVAILABLE") and f"node node-b at {b_addr}" in rest for _, rest in b_fail),
          b_fail[:2])
    check("libkex: A's and C's jobs keep working",
          all(ok for t, ok, _ in again if node_of(t) in a_c) and sum(node_of(t) in a_c for t, _, _ in again) ==
          len(first) - len(b_fail), [x for x in again if not x[1]][:3])
    later = fleet_cmd(ft, "open 6")
    while len(later) < 24 and len({node_of(t) for t, _, _ in later}) < 2:
        later += fleet_cmd(ft, "open 3")
    check("libkex: new jobs land on A and C only (and work)",
          len(later) >= 6 and all(ok and node_of(t) in a_c for t, ok, _ in later), later)
    check("libkex: round_robin uses both live nodes", {node_of(t) for t, _, _ in later} == a_c, later)
    ft.stdin.write("quit\n")
    ft.stdin.flush()
    check("fleet_test exits 0", ft.wait(timeout=60) == 0)

    on_b = [pc for pc in pcs if pc.node.startswith("node-b ")]
    errs = []
    for pc in on_b:
        try:
            pc.upload(np.zeros(4, dtype=np.float32))
            errs.append(None)
        except kex.Error as e:
            errs.append(e)
    check("python: a Client on node-b fails UNAVAILABLE naming node-b and its address",
          all(e is not None and e.code == grpc.StatusCode.UNAVAILABLE and f"node node-b at {b_addr}" in e.details
              for e in errs), [str(e) for e in errs])
    check("python: the Clients on A and C keep working", all(py_round(pc) for pc in pcs if pc not in on_b))
    new_pcs = [kex.Client(target, name=f"py-after-{i}") for i in range(4)]
    check("python: new Clients' jobs land on A and C only",
          all(node_of(pc.job) in a_c for pc in new_pcs) and all(py_round(pc) for pc in new_pcs),
          [pc.node for pc in new_pcs])
    for pc in pcs + new_pcs:
        pc.close()

    b_cli = [t for t in cli_jobs if node_of(t) == "node-b"]
    if b_cli:
        p = cli("--server", target, "upload", "--job", b_cli[0], NPY)
        check("kex: a job on node-b fails UNAVAILABLE naming node-b and its address",
              p.returncode == 1 and "UNAVAILABLE" in p.stderr and f"node node-b at {b_addr}" in p.stderr, p.stderr)
    else:
        check("kex: (no CLI job landed on node-b to check)", True)
    new_cli = [cli("--server", target, "job", "open").stdout.strip() for _ in range(4)]
    check("kex: new jobs land on A and C only", all(node_of(t) in a_c for t in new_cli), new_cli)
    for t in cli_jobs + new_cli:
        if node_of(t) in a_c:
            cli("--server", target, "job", "close", t)
    left = {n: stats(ports[n]).jobs_open for n in a_c}
    check("every job on A and C was closed by its client", left == {"node-a": 0, "node-c": 0}, left)


if __name__ == "__main__":
    run(main, "test_fleet_clients.py")
