"""kexdtest.py - what the kexd integration scripts (test_*.py) share.

The counters and their output ("ok - ...", "FAIL - ...", "skip - ...", and
last "N passed, N failed", which the .sh wrappers add up), calling an RPC and
keeping its error, a free 127.0.0.1 port, starting a kexd of a test's own
(launch, start_kexd, Kexd: its own port and log, PoCL cache in the scratch
folder, KEX_METRICS=off from lib.bash unless the test says otherwise) and
stopping it, waiting for a kexd to answer health SERVING, a JSON graph
(graph-format.md) as a kex.v1 Graph, and running a script's main so that a
crash of the test itself is one failed check, never a silent pass.  The
generated stubs are on sys.path already (KEX_STUBS) when this is imported.
"""
import os
import signal
import socket
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.environ["KEX_STUBS"])

import grpc  # noqa: E402
import health_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402
from graphpb import graph_pb, node_pb, scalar  # noqa: E402,F401  (re-exported for the test scripts)
from ports import free_port  # noqa: E402,F401  (re-exported for the test scripts)

counts = {"passed": 0, "failed": 0}


def check(name, cond, detail=""):
    """One check: prints ok/FAIL with the detail, counts it, returns cond."""
    if cond:
        counts["passed"] += 1
        print(f"ok - {name}")
    else:
        counts["failed"] += 1
        print(f"FAIL - {name}{': ' + str(detail) if detail else ''}")
    sys.stdout.flush()
    return cond


def skip(name, why):
    """A check that cannot run here, with the reason (not counted)."""
    print(f"skip - {name}: {why}")


def rpc_error(fn, *args, **kw):
    """The grpc.RpcError fn raises, or None when it succeeds."""
    try:
        fn(*args, **kw)
    except grpc.RpcError as e:
        return e
    return None


def desc(e):
    """An RPC error (or anything else) as one line for a FAIL detail."""
    if e is None:
        return "no error"
    return f"{e.code()} {e.details()}" if isinstance(e, grpc.RpcError) else repr(e)[:300]


def wait_healthy(port, proc=None, timeout=10.0):
    """True once 127.0.0.1:port answers health SERVING; False at timeout or when proc exits."""
    end = time.time() + timeout
    while time.time() < end:  # the port first: a channel that fails to connect backs off (seconds) before retrying
        if proc is not None and proc.poll() is not None:
            return False
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.01)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.time() < end:
            if proc is not None and proc.poll() is not None:
                return False
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5).status == \
                        health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    return False


def launch(kexd, tmp, *args, env=None, log=None, **popen):
    """(proc, port) of `kexd --listen 127.0.0.1:PORT *args` on a free port, not waited for.

    Its output goes to log (default tmp/kexd-PORT.log; proc.log is the path), PoCL's cache to tmp/pocl, and
    its environment is this one (KEX_METRICS=off from lib.bash) updated by env, where a value None removes the
    variable.  popen: more subprocess.Popen arguments (preexec_fn, ...)."""
    port = free_port()
    log = log or os.path.join(tmp, f"kexd-{port}.log")
    e = dict(os.environ, POCL_CACHE_DIR=os.path.join(tmp, "pocl"))
    for k, v in (env or {}).items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    with open(log, "w") as f:
        proc = subprocess.Popen([kexd, "--listen", f"127.0.0.1:{port}", *args], stdout=f,
                                stderr=subprocess.STDOUT, env=e, **popen)
    proc.log = log
    return proc, port


def start_kexd(kexd, tmp, *args, timeout=20.0, **kw):
    """(proc, port, healthy) of launch(kexd, tmp, *args, **kw), waited for until it answers health SERVING."""
    proc, port = launch(kexd, tmp, *args, **kw)
    return proc, port, wait_healthy(port, proc, timeout)


def stop(proc, timeout=20):
    """SIGTERM, then the exit status (SIGKILL after timeout seconds)."""
    proc.terminate()
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def exit_status(proc, timeout):
    """proc's exit status, or None when it still runs after timeout seconds."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def sigterm(proc, timeout=10):
    """SIGTERM, then (exit status or None after timeout seconds, the seconds it took)."""
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    return exit_status(proc, timeout), time.time() - t0


def read_log(proc):
    """What the kexd launch() started has written to its log so far."""
    with open(proc.log, errors="replace") as f:
        return f.read()


def log_clean(text):
    """True when a kexd's output holds no sanitizer report and no crash."""
    return not any(w in text for w in ("AddressSanitizer", "LeakSanitizer", "runtime error", "Segmentation", "Aborted"))


class Kexd:
    """A kexd of a test's own: launch()'s process (.proc, .port, .log_path), stopped as one check."""

    def __init__(self, kexd, tmp, *args, **kw):
        self.proc, self.port = launch(kexd, tmp, *args, **kw)
        self.log_path = self.proc.log

    def read_log(self):
        return read_log(self.proc)

    def wait_healthy(self, timeout=20.0):
        return wait_healthy(self.port, self.proc, timeout)

    def stop(self):
        """SIGTERM; one check: exit 0 within 30 s and a log without a sanitizer report or crash."""
        rc = stop(self.proc, timeout=30)
        log = self.read_log()
        check(f"kexd (port {self.port}) exits 0 at SIGTERM, no sanitizer report or crash",
              rc == 0 and log_clean(log), f"rc {rc}; {log[-2000:]}")


def binary_graph(op, a, b, n):
    """op(x, y) of two float32[n] buffers filled with a and b, on cpu, as a kex.v1 Graph."""
    from kex.v1 import kex_pb2

    def buf(fill):
        node = kex_pb2.Node(op="BUFFER", dtype="float32", shape=[n])
        node.fill_value.CopyFrom(kex_pb2.Scalar(float_value=fill))
        return node
    return kex_pb2.Graph(device="cpu", nodes=[buf(a), buf(b), kex_pb2.Node(op=op, src=[0, 1])], outputs=[2])


def add_graph():
    """a + b (float32[4], filled with 1.5 and 2.0) on cpu, as a kex.v1 Graph."""
    return binary_graph("ADD", 1.5, 2.0, 4)


def run(main, name):
    """Run main(); a crash is one failed check.  Prints the closing line and exits 1 on any failure."""
    try:
        main()
    except Exception as exc:  # a crash of the test itself is one failed check, never a silent pass
        traceback.print_exc()
        check(f"{name} ran to the end", False, repr(exc))
    print(f"{counts['passed']} passed, {counts['failed']} failed")
    sys.exit(1 if counts["failed"] else 0)
