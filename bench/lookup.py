"""bench/lookup.py - what looking up buffer handles costs kexd's loop thread when a job holds many buffers.

A kexd of its own (KEXD, the first argument); a job uploads N 16-byte buffers (default 8192), then: the p50 of
Frees of 256 held handles each, and one Free of the rest (N - 2048, or N/2 when N < 4096), timed while another thread's GetStats
calls measure how long the loop is held.  Run it with two kexds to compare (before/after a change).

usage: /usr/bin/python3 bench/lookup.py KEXD [N]"""
import os, sys, time, subprocess, tempfile, threading, statistics
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests/integration")); sys.path.insert(0, os.path.join(ROOT, "client/python"))
import grpc
from ports import free_port
from kex._pb import kex_pb2, kex_pb2_grpc
N = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
port = free_port()
p = subprocess.Popen([sys.argv[1], "--listen", f"127.0.0.1:{port}", "--device", "cpu", "--cache", "", "--metrics", "off",
                      "--log", "warn", "--max-message", str(64 << 20)])
ch = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)])
k = kex_pb2_grpc.KexStub(ch)
for _ in range(100):
    try: job = k.OpenJob(kex_pb2.OpenJobRequest(name="lookup"), timeout=1).job; break
    except grpc.RpcError: time.sleep(0.1)
def up():
    return k.Upload(iter([kex_pb2.UploadRequest(job=job, header=kex_pb2.UploadHeader(dtype="uint8", shape=[16])),
                          kex_pb2.UploadRequest(chunk=b"\1" * 16)]), timeout=10).handle
hs = [up() for _ in range(N)]
# Free 256 at a time from a job still holding most: time each
ts = []
first = min(2048, N // 2) // 256 * 256  # freed 256 at a time; the rest in one Free
for i in range(0, first, 256):
    t0 = time.perf_counter(); k.Free(kex_pb2.FreeRequest(job=job, handles=hs[i:i + 256]), timeout=60); ts.append(time.perf_counter() - t0)
print(f"{sys.argv[1]}: N={N}: Free of 256 handles p50 {statistics.median(ts)*1e3:.2f} ms")
# one Free of all the rest, with GetStats probes meanwhile
rest = hs[first:]
lat = []
stop = [False]
def probe():
    while not stop[0]:
        t0 = time.perf_counter(); k.GetStats(kex_pb2.GetStatsRequest(), timeout=60); lat.append(time.perf_counter() - t0)
th = threading.Thread(target=probe); th.start()
t0 = time.perf_counter(); k.Free(kex_pb2.FreeRequest(job=job, handles=rest), timeout=600); t1 = time.perf_counter()
stop[0] = True; th.join()
print(f"  one Free of {len(rest)} handles: {(t1-t0)*1e3:.1f} ms; another client's GetStats meanwhile: max {max(lat)*1e3:.1f} ms")
p.terminate(); p.wait()
