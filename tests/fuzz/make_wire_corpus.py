"""make_wire_corpus.py - seeds for fuzz_wire from ../shared/cases: each case's graph as a
SubmitRequest and a PlanRequest, plus one well-formed request of every other method (and a few
that the wire check must refuse: NUL in a token, non-UTF-8 names).  Each file is one byte
choosing the method (its index in fuzz_wire.c's `requests`), then the serialized message.

  /usr/bin/python3 tests/fuzz/make_wire_corpus.py STUBS_DIR CASES_DIR OUT_DIR

STUBS_DIR holds kex/v1/kex_pb2.py (python3 -m grpc_tools.protoc -I proto --python_out=STUBS_DIR
kex/v1/kex.proto).  The files are committed; rerun only to refresh them.
"""
import glob
import json
import os
import sys

sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from graphpb import graph_pb, node_pb as node  # noqa: E402,F401  (node: make_rpc_corpus.py's)
from kex.v1 import kex_pb2 as pb  # noqa: E402

INDEX = {"Submit": 0, "Plan": 1, "OpenJob": 2, "CloseJob": 3, "HoldJob": 4, "Upload": 5, "Download": 6, "Free": 7,
         "Tune": 8, "ListCache": 9, "GetCacheEntry": 10, "ExportCache": 11, "ImportCache": 12, "DeleteCache": 13,
         "ListDevices": 14, "GetStats": 15}
TOKEN = "0123456789abcdef0123456789abcdef"


def main():
    cases, out = sys.argv[2], sys.argv[3]
    os.makedirs(out, exist_ok=True)
    seeds = {}
    for path in sorted(glob.glob(os.path.join(cases, "*.json"))):
        name = os.path.basename(path)[:-5]
        d = json.load(open(path))
        if "graph" not in d:
            continue
        g = d["graph"]
        gp = graph_pb(g)
        if len(gp.SerializeToString()) > 65536:
            continue
        seeds[f"submit_{name}"] = ("Submit", pb.SubmitRequest(job=TOKEN, graph=gp))
        seeds[f"plan_{name}"] = ("Plan", pb.PlanRequest(job=TOKEN, graph=gp))
    seeds["open_job"] = ("OpenJob", pb.OpenJobRequest(name="tenant", weight=2, memory_limit=1 << 20))
    seeds["close_job"] = ("CloseJob", pb.CloseJobRequest(job=TOKEN))
    seeds["close_job_nul"] = ("CloseJob", pb.CloseJobRequest(job=TOKEN + "\0junk"))
    seeds["hold_job"] = ("HoldJob", pb.HoldJobRequest(job=TOKEN))
    seeds["upload"] = ("Upload", pb.UploadRequest(job=TOKEN, header=pb.UploadHeader(dtype="float32", shape=[4])))
    seeds["download"] = ("Download", pb.DownloadRequest(job=TOKEN, handle=TOKEN, chunk_bytes=65536))
    seeds["free"] = ("Free", pb.FreeRequest(job=TOKEN, handles=[TOKEN, TOKEN]))
    seeds["get_stats"] = ("GetStats", pb.GetStatsRequest(job=TOKEN))
    seeds["list_devices"] = ("ListDevices", pb.ListDevicesRequest())
    seeds["import"] = ("ImportCache", pb.ImportCacheRequest(job=TOKEN, data=b'{"format":"kex.cache.export.v1"}\n'))
    for key, (method, msg) in seeds.items():
        with open(os.path.join(out, key), "wb") as f:
            f.write(bytes([INDEX[method]]) + msg.SerializeToString())
    # strings the wire check refuses, written by hand: OpenJob.name (field 1) non-UTF-8, an overlong encoding
    for key, raw in (("open_job_latin1", b"\x0a\x04caf\xe9"), ("open_job_overlong", b"\x0a\x02\xc0\xaf"),
                     ("open_job_surrogate", b"\x0a\x03\xed\xa0\x80"), ("truncated_varint", b"\x0a\xff\xff")):
        with open(os.path.join(out, key), "wb") as f:
            f.write(bytes([INDEX["OpenJob"]]) + raw)
    print(f"wrote {len(seeds) + 4} seeds to {out}")


if __name__ == "__main__":
    main()
