"""stress.py - the long forms of "one tenant cannot hurt another" (issue 31), run by stress.sh.

  pins     tenant mallory (max_bytes 33 MiB) tries --rounds times: open a job, upload 32 MiB, start a
           Download, read one chunk, stop reading, Free.  Before the fix each round's Free dropped the
           accounting to 0 while the stalled Download kept the buffer alive: 10 rounds, accounting 0,
           kexd's RSS +336 MiB.  Now the pinned bytes stay charged: one upload is accepted, the rest
           RESOURCE_EXHAUSTED, and kexd's RSS grows by about one buffer.
  unauth   --calls calls without a token, half to unregistered paths and half to OpenJob: every one
           UNAUTHENTICATED (none UNIMPLEMENTED: methods cannot be listed), kexd's RSS bounded, and a
           tenant's call served at once afterwards.

Prints "ok - ..." / "FAIL - ..." per check, the figures, and last "N passed, N failed"; --json OUT
writes the figures.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.environ["KEX_STUBS"])
import grpc  # noqa: E402
from kex.v1 import kex_pb2  # noqa: E402

import test_tenants as T  # noqa: E402
from kexdtest import check, run  # noqa: E402

MiB = T.MiB


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def pins(rounds, out):
    s = T.Server(T.auth_file("auth-pins.json", mallory={"max_bytes": 33 * MiB}))
    streams, accepted, refused, held = [], 0, 0, []
    try:
        if not check("pins: kexd --auth (mallory max_bytes 33 MiB) serves", s.wait_healthy()):
            return
        rss0 = rss_mib(s.proc.pid)
        for _ in range(rounds):
            job = s.open("mallory", memory=64 * MiB)
            try:
                h = s.upload("mallory", job, 32 * MiB)
            except grpc.RpcError as e:
                refused += e.code() == T.RE
                held.append(s.held("mallory"))
                continue
            accepted += 1
            dl = s.kex.Download(kex_pb2.DownloadRequest(job=job, handle=h, chunk_bytes=64 << 10),
                                metadata=T.md("mallory"), timeout=300)
            next(dl)
            streams.append(dl)
            time.sleep(0.3)  # the stream stalls with the buffer referenced
            s.kex.Free(kex_pb2.FreeRequest(job=job, handles=[h]), metadata=T.md("mallory"), timeout=10)
            held.append(s.held("mallory"))
        rss1 = rss_mib(s.proc.pid)
        out["pins"] = {"rounds": rounds, "uploads_accepted": accepted, "uploads_refused": refused,
                       "bytes_held_mib_per_round": [round(h / MiB, 1) for h in held],
                       "kexd_rss_mib_start": round(rss0, 1), "kexd_rss_mib_end": round(rss1, 1),
                       "kexd_rss_growth_mib": round(rss1 - rss0, 1)}
        check(f"pins: of {rounds} rounds one 32 MiB upload is accepted, the rest RESOURCE_EXHAUSTED",
              accepted == 1 and refused == rounds - 1, out["pins"])
        check("pins: mallory's accounting never drops below the 32 MiB a stalled Download pins",
              all(h >= 32 * MiB for h in held), held)
        check("pins: kexd's RSS grows by about one buffer (< 80 MiB), not one per round",
              rss1 - rss0 < 80, f"{rss1 - rss0:.1f} MiB")
        for dl in streams:
            dl.cancel()
        check("pins: once the Downloads end, mallory holds nothing", T.wait_for(lambda: s.held("mallory") == 0),
              s.held("mallory"))
    finally:
        s.close()


def unauth(calls, out):
    s = T.Server(T.auth_file("auth-unauth.json"))
    try:
        if not check("unauth: kexd --auth serves", s.wait_healthy()):
            return
        rss0 = rss_mib(s.proc.pid)
        codes, t0 = {}, time.time()
        ident = lambda b: b  # noqa: E731
        for i in range(calls):
            path = f"/kex.v1.Kex/Nope{i % 97}" if i % 2 else "/kex.v1.Kex/OpenJob"
            call = s.ch.unary_unary(path, request_serializer=ident, response_deserializer=ident)
            try:
                call(b"", timeout=10)
                codes["OK"] = codes.get("OK", 0) + 1
            except grpc.RpcError as e:
                codes[e.code().name] = codes.get(e.code().name, 0) + 1
        wall = time.time() - t0
        rss1 = rss_mib(s.proc.pid)
        t1 = time.time()
        job = s.open("alice")
        served = time.time() - t1
        out["unauth"] = {"calls": calls, "codes": codes, "wall_s": round(wall, 2),
                         "calls_per_s": round(calls / wall), "kexd_rss_growth_mib": round(rss1 - rss0, 1),
                         "tenant_call_after_s": round(served, 4)}
        check(f"unauth: all {calls} calls without a token are UNAUTHENTICATED (none UNIMPLEMENTED: nothing to list)",
              codes == {"UNAUTHENTICATED": calls}, codes)
        check("unauth: kexd's RSS grows < 16 MiB over them", rss1 - rss0 < 16, f"{rss1 - rss0:.1f} MiB")
        check("unauth: alice's OpenJob right after is served (< 1 s)", bool(job) and served < 1.0, served)
    finally:
        s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    out = {"command": f"bench/tenants/stress.sh --rounds {a.rounds} --calls {a.calls}",
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "loadavg": [round(x, 2) for x in os.getloadavg()]}
    pins(a.rounds, out)
    unauth(a.calls, out)
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    run(main, "bench/tenants/stress.py")
