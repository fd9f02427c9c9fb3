"""kexdtest.py - what the kexd integration scripts (test_*.py) share.

The counters and their output ("ok - ...", "FAIL - ...", and last "N passed,
N failed", which the .sh wrappers add up), calling an RPC and keeping its
error, a free 127.0.0.1 port, waiting for a kexd to answer health SERVING,
and running a script's main so that a crash of the test itself is one failed
check, never a silent pass.  The generated stubs are on sys.path already
(KEX_STUBS) when this is imported.
"""
import os
import socket
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.environ["KEX_STUBS"])

import grpc  # noqa: E402
import health_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402
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


def start_kexd(kexd, tmp, *args, timeout=20.0):
    """(proc, port, healthy) of `kexd --listen 127.0.0.1:PORT *args`, logging to tmp/kexd-PORT.log."""
    port = free_port()
    env = dict(os.environ, POCL_CACHE_DIR=os.path.join(tmp, "pocl"))
    with open(os.path.join(tmp, f"kexd-{port}.log"), "w") as log:
        proc = subprocess.Popen([kexd, "--listen", f"127.0.0.1:{port}", *args], stdout=log,
                                stderr=subprocess.STDOUT, env=env)
    return proc, port, wait_healthy(port, proc, timeout)


def stop(proc):
    """SIGTERM, then the exit status (SIGKILL after 20 s)."""
    proc.terminate()
    try:
        return proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def add_graph():
    """a + b (float32[4], filled with 1.5 and 2.0) on cpu, as a kex.v1 Graph."""
    from kex.v1 import kex_pb2

    def buf(fill):
        n = kex_pb2.Node(op="BUFFER", dtype="float32", shape=[4])
        n.fill_value.CopyFrom(kex_pb2.Scalar(float_value=fill))
        return n
    return kex_pb2.Graph(device="cpu", nodes=[buf(1.5), buf(2.0), kex_pb2.Node(op="ADD", src=[0, 1])], outputs=[2])


def run(main, name):
    """Run main(); a crash is one failed check.  Prints the closing line and exits 1 on any failure."""
    try:
        main()
    except Exception as exc:  # a crash of the test itself is one failed check, never a silent pass
        traceback.print_exc()
        check(f"{name} ran to the end", False, repr(exc))
    print(f"{counts['passed']} passed, {counts['failed']} failed")
    sys.exit(1 if counts["failed"] else 0)
