"""make_rpc_corpus.py - seeds for fuzz_rpc, fuzz_stream and fuzz_cache from ../shared/cases.

  rpc/     each case's graph as a SubmitRequest (first byte 0) and a PlanRequest (1) naming the fuzz
           targets' job (TOKEN), plus graphs that must be refused: a cycle/forward reference, an unknown
           op, dtype and device, zero-sized and overflowing shapes, the fixed buffer (HANDLE) with the
           wrong shape, another job's token.
  stream/  Upload (first byte bit 0 clear) and ImportCache (set) streams as fuzz_stream.c frames them
           (2-byte little-endian length, then the message; bits 1-2 of the first byte: how the stream
           ends): good ones, short and long uploads, a second header, a chunk before the header, two
           jobs in one stream, shapes over the limits, an export split mid-line, a program line; each
           good one also broken, cancelled, and cancelled after the end.
  cache/   fuzz_cache.c's modes: export files (0), and a damaged beam (1), program (2) and device (3)
           row: each column overwritten with a value of each SQLite type.

  /usr/bin/python3 tests/fuzz/make_rpc_corpus.py STUBS_DIR CASES_DIR OUT_DIR

STUBS_DIR and CASES_DIR as for make_wire_corpus.py (whose graph conversion this reuses); OUT_DIR is
tests/fuzz/corpus.  The files are committed; rerun only to refresh them.
"""
import glob
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_wire_corpus as w  # noqa: E402  (puts STUBS_DIR on sys.path)

pb = w.pb
TOKEN = w.TOKEN  # fuzz_rpc.c's and fuzz_stream.c's job
HANDLE = "fedcba9876543210fedcba9876543210"  # fuzz_rpc.c's float32 [4] buffer
OTHER = "ffffffffffffffffffffffffffffffff"  # a token no job has
HEADER = '{"format":"kex.cache.export.v1","schema":3}\n'
DEV = {"kind": "cpu", "vendor": "fuzz", "name": "fuzz device", "driver_version": "1", "compiler_version": "cc 1"}


def beam_line(**over):
    o = {"type": "beam", "ast_key": "01" * 32, "device": DEV, "search_opts": "beam=2", "codegen_version": "kex-fuzz",
         "opts": "UPCAST(0,4) LOCAL(0,16)", "best_time_s": 1.5e-05, "hand_time_s": 2e-05, "search_time_s": 1.0,
         "candidates": 10, "kernel_name": "r_16_8_8", "created_at": 1718000000, "ast_text": None}
    o.update(over)
    return json.dumps(o) + "\n"


def frames(kind, msgs, ending=0):
    """fuzz_stream.c's input: bit 0 of the first byte the method, bits 1-2 how the stream ends."""
    out = bytes([kind | ending << 1])
    for m in msgs:
        b = m if isinstance(m, bytes) else m.SerializeToString()
        out += struct.pack("<H", len(b)) + b
    return out


def graph(nodes, outputs, device=""):
    return pb.Graph(format="kex.graph.v1", device=device, nodes=[w.node(n) for n in nodes], outputs=outputs)


def rpc_seeds(cases):
    seeds = {}
    for path in sorted(glob.glob(os.path.join(cases, "*.json"))):
        d = json.load(open(path))
        if "graph" not in d:
            continue
        g = d["graph"]
        gp = w.graph_pb(g)
        if len(gp.SerializeToString()) > 65536:
            continue
        name = os.path.basename(path)[:-5]
        seeds[f"submit_{name}"] = bytes([0]) + pb.SubmitRequest(job=TOKEN, graph=gp).SerializeToString()
        seeds[f"plan_{name}"] = bytes([1]) + pb.PlanRequest(job=TOKEN, graph=gp).SerializeToString()
    buf = {"op": "BUFFER", "dtype": "float32", "shape": [4], "fill": {"arange": True}}
    bad = {
        "forward_ref": graph([{"op": "NEG", "src": [1]}, buf], [0]),
        "self_cycle": graph([buf, {"op": "ADD", "src": [1, 0]}], [1]),
        "unknown_op": graph([buf, {"op": "FROB", "src": [0]}], [1]),
        "unknown_dtype": graph([{"op": "BUFFER", "dtype": "float128", "shape": [4], "fill": {"arange": True}}], [0]),
        "unknown_device": graph([buf], [0], device="tpu:7"),
        "zero_shape": graph([{"op": "BUFFER", "dtype": "float32", "shape": [0, 4], "fill": {"arange": True}},
                             {"op": "REDUCE_SUM", "src": [0], "axis": [0]}], [1]),
        "overflow_shape": graph([{"op": "BUFFER", "dtype": "float32", "shape": [1 << 31, 1 << 31, 1 << 31],
                                  "fill": {"arange": True}}], [0]),
        "negative_shape": graph([{"op": "BUFFER", "dtype": "float32", "shape": [-1], "fill": {"arange": True}}], [0]),
        "reshape_overflow": graph([buf, {"op": "RESHAPE", "src": [0], "arg": [1 << 62, 4]}], [1]),
        "output_out_of_range": graph([buf], [5]),
    }
    handle = pb.Node(op="BUFFER", dtype="float32", shape=[4], buffer=HANDLE)
    wrong = pb.Node(op="BUFFER", dtype="float32", shape=[8], buffer=HANDLE)
    add = pb.Node(op="ADD", src=[0, 0])
    bad["own_buffer"] = pb.Graph(nodes=[handle, add], outputs=[1])
    bad["buffer_wrong_shape"] = pb.Graph(nodes=[wrong, add], outputs=[1])
    bad["unknown_handle"] = pb.Graph(nodes=[pb.Node(op="BUFFER", dtype="float32", shape=[4], buffer=OTHER)], outputs=[0])
    for name, gp in bad.items():
        seeds[f"submit_{name}"] = bytes([0]) + pb.SubmitRequest(job=TOKEN, graph=gp).SerializeToString()
        seeds[f"plan_{name}"] = bytes([1]) + pb.PlanRequest(job=TOKEN, graph=gp).SerializeToString()
    seeds["submit_other_job"] = bytes([0]) + pb.SubmitRequest(job=OTHER, graph=bad["own_buffer"]).SerializeToString()
    seeds["submit_beam"] = bytes([0]) + pb.SubmitRequest(
        job=TOKEN, graph=bad["own_buffer"], beam=pb.BeamOptions(beam_width=2)).SerializeToString()
    return seeds


def stream_seeds():
    hdr = pb.UploadRequest(job=TOKEN, header=pb.UploadHeader(dtype="float32", shape=[4]))
    chunk = pb.UploadRequest(chunk=b"\0" * 16)
    half = pb.UploadRequest(chunk=b"\1" * 8)
    lines = HEADER + beam_line() + beam_line(ast_key="02" * 32, opts="")
    seeds = {
        "upload": frames(0, [hdr, chunk]),
        "upload_short": frames(0, [hdr, half]),
        "upload_over": frames(0, [hdr, chunk, half]),
        "upload_no_header": frames(0, []),
        "upload_empty_message": frames(0, [hdr, b""]),
        "upload_zero_sized": frames(0, [pb.UploadRequest(job=TOKEN, header=pb.UploadHeader(dtype="float32", shape=[0, 4]))]),
        "upload_over_job_memory": frames(0, [pb.UploadRequest(job=TOKEN, header=pb.UploadHeader(
            dtype="float32", shape=[1 << 20, 4]))]),
        "upload_overflow_shape": frames(0, [pb.UploadRequest(job=TOKEN, header=pb.UploadHeader(
            dtype="float32", shape=[1 << 62, 1 << 62]))]),
        "upload_unknown_device": frames(0, [pb.UploadRequest(job=TOKEN, header=pb.UploadHeader(
            dtype="float32", shape=[4], device="tpu"))]),
        "upload_other_job": frames(0, [pb.UploadRequest(job=OTHER, header=pb.UploadHeader(dtype="float32", shape=[4]))]),
        "upload_halves": frames(0, [hdr, half, half]),
        "upload_second_header": frames(0, [hdr, hdr, chunk]),
        "upload_chunk_first": frames(0, [chunk, hdr]),
        "upload_two_jobs": frames(0, [hdr, pb.UploadRequest(job=OTHER, chunk=b"\0" * 16)]),
        "upload_bad_dtype": frames(0, [pb.UploadRequest(job=TOKEN, header=pb.UploadHeader(dtype="qint3", shape=[4]))]),
        "import": frames(1, [pb.ImportCacheRequest(job=TOKEN, data=lines.encode())]),
        "import_split": frames(1, [pb.ImportCacheRequest(job=TOKEN, data=lines[:70].encode()),
                                   pb.ImportCacheRequest(data=lines[70:].encode())]),
        "import_program_line": frames(1, [pb.ImportCacheRequest(job=TOKEN, data=(
            HEADER + '{"type":"program","binary":"AAAA"}\n' + beam_line()).encode())]),
        "import_two_jobs": frames(1, [pb.ImportCacheRequest(job=TOKEN, data=HEADER.encode()),
                                      pb.ImportCacheRequest(job=OTHER, data=beam_line().encode())]),
        "import_no_job": frames(1, [pb.ImportCacheRequest(data=HEADER.encode())]),
        "import_empty": frames(1, [pb.ImportCacheRequest(job=TOKEN)]),
    }
    for ending in (1, 2, 3):  # broken, cancelled, cancelled after the end
        seeds[f"upload_end{ending}"] = frames(0, [hdr, chunk], ending)
        seeds[f"upload_short_end{ending}"] = frames(0, [hdr, half], ending)
        seeds[f"import_end{ending}"] = frames(1, [pb.ImportCacheRequest(job=TOKEN, data=lines.encode())], ending)
    return seeds


def cache_seeds():
    seeds = {
        "import_good": b"\0" + (HEADER + beam_line() + beam_line(ast_key="ab" * 32, opts="NOLOCALS")).encode(),
        "import_bad_header": b"\0" + b'{"format":"kex.cache.export.v0"}\n' + beam_line().encode(),
        "import_bad_fields": b"\0" + (HEADER + beam_line(ast_key="zz") + beam_line(best_time_s=-1.0) +
                                      beam_line(opts="UPCAST(0,") + beam_line(candidates="x") +
                                      beam_line(ast_text="kex.ast.v1\nnot the key")).encode(),
        "import_not_json": b"\0" + HEADER.encode() + b"{\"type\":\"beam\",\n\xff\xfe\n",
    }
    values = {0: b"", 1: struct.pack("<q", -1), 2: struct.pack("<d", float("nan")), 3: b"UPCAST(9,99999999999)",
              4: b"\0\1\2"}
    for mode, ncols in ((1, 12), (2, 7), (3, 7)):
        for col in range(ncols):
            for typ, v in values.items():
                seeds[f"row{mode}_col{col}_type{typ}"] = bytes([mode, col, typ]) + v
    return seeds


def main():
    cases, out = sys.argv[2], sys.argv[3]
    total = 0
    for sub, seeds in (("rpc", rpc_seeds(cases)), ("stream", stream_seeds()), ("cache", cache_seeds())):
        os.makedirs(os.path.join(out, sub), exist_ok=True)
        for key, data in seeds.items():
            with open(os.path.join(out, sub, key), "wb") as f:
                f.write(data)
        total += len(seeds)
        print(f"wrote {len(seeds)} seeds to {os.path.join(out, sub)}")


if __name__ == "__main__":
    main()
