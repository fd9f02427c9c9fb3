"""test_tls.py - one TLS probe of kexd for test_tls.sh (not a test list of its own).

usage: test_tls.py stubs|client ADDR [--ca PEM] [--cert PEM --key PEM]

stubs: with the grpc stubs in $KEX_STUBS, health Check then OpenJob and
CloseJob; client: the kex Python package's kex.Client (its OpenJob), then
devices() and close().  A secure channel when --ca or --cert is given, else
plaintext.  Prints "SERVED" when every call succeeds, else "REFUSED CODE
details" with the first failing call's gRPC status; exits 0 either way (the
shell script judges the line), 1 only for a probe that cannot run.
"""
import argparse
import os
import sys

import grpc

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TIMEOUT_S = 5.0


def read(path):
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def probe_stubs(a):
    sys.path.insert(0, os.environ["KEX_STUBS"])
    import health_pb2
    import health_pb2_grpc
    from kex.v1 import kex_pb2, kex_pb2_grpc

    if a.ca or a.cert:
        ch = grpc.secure_channel(a.addr, grpc.ssl_channel_credentials(read(a.ca), read(a.key), read(a.cert)))
    else:
        ch = grpc.insecure_channel(a.addr)
    with ch:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT_S)
        if r.status != health_pb2.HealthCheckResponse.SERVING:
            return f"NOT_SERVING {r.status}"
        kex = kex_pb2_grpc.KexStub(ch)
        job = kex.OpenJob(kex_pb2.OpenJobRequest(name="test-tls"), timeout=TIMEOUT_S).job
        if not job:
            return "NO_JOB"
        kex.CloseJob(kex_pb2.CloseJobRequest(job=job), timeout=TIMEOUT_S)
    return "SERVED"


def probe_client(a):
    sys.path.insert(0, os.path.join(ROOT, "client", "python"))
    import kex

    try:
        c = kex.Client(a.addr, root_certs=a.ca, client_cert=a.cert, client_key=a.key, timeout=TIMEOUT_S)
    except kex.Error as e:
        return f"REFUSED {e.code.name} {e.details}"
    with c:
        c.devices()
    return "SERVED"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["stubs", "client"])
    p.add_argument("addr")
    p.add_argument("--ca")
    p.add_argument("--cert")
    p.add_argument("--key")
    a = p.parse_args()
    try:
        print(probe_stubs(a) if a.mode == "stubs" else probe_client(a))
    except grpc.RpcError as e:
        print(f"REFUSED {e.code().name} {e.details()}")


main()
