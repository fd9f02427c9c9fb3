"""Kept graphs: Submit keep_as / graph_ref / bindings, and their limits on both sides
(--max-kept-graphs, --max-kept-graph-bytes), against a kexd of this test's own."""

import grpc
import numpy as np
import pytest

import kex
from kex._client import pb
from kexd_proc import Kexd

MAX_BYTES = 4096


@pytest.fixture(scope="module")
def stub():
    with Kexd("--max-kept-graphs", "2", "--max-kept-graph-bytes", str(MAX_BYTES)) as k:
        c = kex.Client(k.addr)
        yield c
        c.close()


def graph(scale, n=4):
    """x (a BUFFER, bound per run) * scale + 1."""
    g = pb.Graph(format="kex.graph.v1")
    g.nodes.add(op="BUFFER", dtype="float32", shape=[n], data=np.zeros(n, np.float32).tobytes())
    g.nodes.add(op="CONST", dtype="float32", shape=[n], value=pb.Scalar(float_value=scale))
    g.nodes.add(op="MUL", src=[0, 1])
    g.nodes.add(op="CONST", dtype="float32", shape=[n], value=pb.Scalar(float_value=1.0))
    g.nodes.add(op="ADD", src=[2, 3])
    g.outputs.append(4)
    return g


def submit(c, **kw):
    req = pb.SubmitRequest(job=kw.pop("job", c.job), only_done=True, return_bytes=True, **kw)
    done = None
    for msg in c.stub.Submit(req, timeout=60):
        for ev in (msg, *msg.following):
            if ev.WhichOneof("event") == "done":
                done = ev.done
    return np.frombuffer(done.outputs[0].data, np.float32)


def code(fn):
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details()


def test_kept_graph_runs_with_new_bindings(stub):
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(submit(stub, graph=graph(2.0), keep_as="double"), np.ones(4, np.float32))
    got = submit(stub, graph_ref="double", bindings=[pb.Binding(node=0, data=x.tobytes())])
    np.testing.assert_array_equal(got, x * 2 + 1)
    h = stub.upload(x + 10)
    np.testing.assert_array_equal(submit(stub, graph_ref="double", bindings=[pb.Binding(node=0, buffer=h)]),
                                  (x + 10) * 2 + 1)


def test_refusals_name_what_is_wrong(stub):
    submit(stub, graph=graph(3.0), keep_as="triple")
    assert code(lambda: submit(stub, graph_ref="never"))[0] == grpc.StatusCode.NOT_FOUND
    c, msg = code(lambda: submit(stub, graph_ref="triple", bindings=[pb.Binding(node=2, data=b"1234")]))
    assert c == grpc.StatusCode.INVALID_ARGUMENT and "not a BUFFER node" in msg
    c, msg = code(lambda: submit(stub, graph=graph(1.0), graph_ref="triple"))
    assert c == grpc.StatusCode.INVALID_ARGUMENT
    c, msg = code(lambda: submit(stub, graph=graph(1.0), bindings=[pb.Binding(node=0, data=b"")]))
    assert c == grpc.StatusCode.INVALID_ARGUMENT and "graph_ref" in msg
    c, msg = code(lambda: submit(stub, graph=graph(1.0), keep_as="bad id!"))
    assert c == grpc.StatusCode.INVALID_ARGUMENT and "keep_as" in msg
    other = kex.Client(stub.addr)   # another job: it keeps nothing of this one's
    try:
        assert code(lambda: submit(other, graph_ref="triple"))[0] == grpc.StatusCode.NOT_FOUND
    finally:
        other.close()


def test_count_limit_both_sides(stub):
    """--max-kept-graphs 2: two graphs stay; a third evicts the least recently used of the job."""
    x = np.ones(4, np.float32).tobytes()
    submit(stub, graph=graph(4.0), keep_as="a")
    submit(stub, graph=graph(5.0), keep_as="b")
    submit(stub, graph_ref="a", bindings=[pb.Binding(node=0, data=x)])   # at the limit: both kept
    submit(stub, graph_ref="b", bindings=[pb.Binding(node=0, data=x)])
    submit(stub, graph=graph(6.0), keep_as="c")                          # over: "a" (least recently used) goes
    assert code(lambda: submit(stub, graph_ref="a"))[0] == grpc.StatusCode.NOT_FOUND
    np.testing.assert_array_equal(submit(stub, graph_ref="b", bindings=[pb.Binding(node=0, data=x)]), [6] * 4)
    np.testing.assert_array_equal(submit(stub, graph_ref="c", bindings=[pb.Binding(node=0, data=x)]), [7] * 4)


def test_byte_limit_both_sides(stub):
    """--max-kept-graph-bytes 4096: a graph under it is kept, one over it is refused naming the limit."""
    small, big = graph(7.0, n=64), graph(7.0, n=2048)   # 256 bytes of data; 8 KiB of data
    assert small.ByteSize() < MAX_BYTES < big.ByteSize()
    submit(stub, graph=small, keep_as="small")
    submit(stub, graph_ref="small", bindings=[pb.Binding(node=0, data=np.ones(64, np.float32).tobytes())])
    c, msg = code(lambda: submit(stub, graph=big, keep_as="big"))
    assert c == grpc.StatusCode.RESOURCE_EXHAUSTED and "--max-kept-graph-bytes" in msg
