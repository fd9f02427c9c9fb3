"""The connection to kexd: a gRPC channel, a job, and kex.Error.

Stubs come from proto/kex/v1/kex.proto (client/python/gen_stubs.sh); when
they are missing and grpc_tools is importable they are generated on import.
"""
import os
import subprocess
import sys

import grpc

_here = os.path.dirname(os.path.abspath(__file__))


def _load_stubs():
    pb_dir = os.path.join(_here, "_pb")
    if not os.path.exists(os.path.join(pb_dir, "kex_pb2_grpc.py")):
        script = os.path.join(_here, "..", "gen_stubs.sh")
        env = dict(os.environ, KEX_PYTHON=sys.executable)
        try:
            subprocess.run(["bash", script], check=True, env=env, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise ImportError(f"kex: the gRPC stubs are missing and cannot be generated ({e}); "
                              f"run client/python/gen_stubs.sh with a python that has grpc_tools") from e
    from ._pb import kex_pb2, kex_pb2_grpc
    return kex_pb2, kex_pb2_grpc


pb, pb_grpc = _load_stubs()


class Error(Exception):
    """A kexd call failed: .code is the grpc.StatusCode, .details the server's message."""

    def __init__(self, code, details):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    @classmethod
    def from_rpc(cls, e):
        return cls(e.code(), e.details())


def _call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except grpc.RpcError as e:
        raise Error.from_rpc(e) from None


class Client:
    """One channel to kexd and the job its tensors live in.

    job=None opens a job (closed by close()); a given token is used as is and
    left open.  Usable as a context manager.
    """

    def __init__(self, addr, job=None, weight=1, memory_limit=0, name="kex-python", token=None,
                 root_certs=None, timeout=60.0):
        if root_certs:
            with open(root_certs, "rb") as f:
                creds = grpc.ssl_channel_credentials(f.read())
            self.channel = grpc.secure_channel(addr, creds)
        else:
            self.channel = grpc.insecure_channel(addr)
        self.stub = pb_grpc.KexStub(self.channel)
        self.timeout = timeout
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.owns_job = job is None
        if job is None:
            r = _call(self.stub.OpenJob, pb.OpenJobRequest(name=name, weight=weight, memory_limit=memory_limit),
                      timeout=timeout, metadata=self.metadata)
            job = r.job
        self.job = job

    def close(self):
        if self.channel is None:
            return
        if self.owns_job:
            try:
                self.stub.CloseJob(pb.CloseJobRequest(job=self.job), timeout=self.timeout, metadata=self.metadata)
            except grpc.RpcError:
                pass
        self.channel.close()
        self.channel = None
        global _default
        if _default is self:
            _default = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- calls ----
    def plan(self, graph):
        return _call(self.stub.Plan, pb.PlanRequest(job=self.job, graph=graph), timeout=self.timeout,
                     metadata=self.metadata)

    def submit(self, graph, return_bytes=True, timeout=None, on_event=None):
        """Run a graph; returns the Done event.  on_event(event) sees every event."""
        done = None
        try:
            for ev in self.stub.Submit(pb.SubmitRequest(job=self.job, graph=graph, return_bytes=return_bytes),
                                       timeout=timeout, metadata=self.metadata):
                if on_event:
                    on_event(ev)
                if ev.WhichOneof("event") == "done":
                    done = ev.done
        except grpc.RpcError as e:
            raise Error.from_rpc(e) from None
        if done is None:
            raise Error(grpc.StatusCode.INTERNAL, "Submit ended without a done event")
        return done

    def upload(self, array, device=""):
        from .dtypes import from_numpy
        import numpy as np
        a = np.ascontiguousarray(array)
        data = a.tobytes()
        chunk = 1 << 20

        def parts():
            yield pb.UploadRequest(job=self.job, header=pb.UploadHeader(dtype=from_numpy(a.dtype), shape=a.shape,
                                                                        device=device))
            for i in range(0, len(data), chunk):
                yield pb.UploadRequest(job=self.job, chunk=data[i:i + chunk])

        return _call(self.stub.Upload, parts(), timeout=self.timeout, metadata=self.metadata).handle

    def download(self, handle):
        """(dtype name, shape, bytes) of a buffer the job holds."""
        buf, dtype, shape = bytearray(), None, None
        try:
            for ch in self.stub.Download(pb.DownloadRequest(job=self.job, handle=handle), timeout=self.timeout,
                                         metadata=self.metadata):
                if dtype is None:
                    dtype, shape = ch.dtype, tuple(ch.shape)
                buf += ch.data
        except grpc.RpcError as e:
            raise Error.from_rpc(e) from None
        return dtype, shape, bytes(buf)

    def free(self, handles):
        return _call(self.stub.Free, pb.FreeRequest(job=self.job, handles=list(handles)), timeout=self.timeout,
                     metadata=self.metadata).freed

    def devices(self):
        return list(_call(self.stub.ListDevices, pb.ListDevicesRequest(job=self.job), timeout=self.timeout,
                          metadata=self.metadata).devices)

    def stats(self):
        return _call(self.stub.GetStats, pb.GetStatsRequest(job=self.job), timeout=self.timeout,
                     metadata=self.metadata)

    def tune(self, tensor_or_graph, beam=2, progress=None, device=None, timeout=None):
        """Beam-search every kernel of a graph on kexd (results go to the server's cache).

        tensor_or_graph: a Tensor, a list of Tensors, or a kex.v1.Graph message.
        device overrides the graph's device ("cpu", "opencl", ...).  progress(event)
        sees every TuneEvent (i, n, kernel, phase, round, compiled, timed, best_us,
        finished, ...).  Returns one TuneResult per kernel, in schedule order.
        """
        graph = _as_graph(tensor_or_graph)
        if device:
            graph.device = device
        req = pb.TuneRequest(job=self.job, graph=graph, beam=pb.BeamOptions(beam_width=beam))
        results = {}
        try:
            for ev in self.stub.Tune(req, timeout=timeout, metadata=self.metadata):
                if progress:
                    progress(ev)
                if ev.finished:
                    results[ev.i] = TuneResult.from_event(ev)
        except grpc.RpcError as e:
            raise Error.from_rpc(e) from None
        return [results[i] for i in sorted(results)]

    def tensor(self, data, dtype=None, upload=False):
        from .tensor import Tensor
        return Tensor(data, dtype=dtype, client=self, upload=upload)


def _as_graph(x):
    """A kex.v1.Graph from a Graph message, a Tensor or a list of Tensors (a copy: callers may edit it)."""
    from .tensor import Tensor, graph_pb
    if isinstance(x, pb.Graph):
        g = pb.Graph()
        g.CopyFrom(x)
        return g
    if isinstance(x, Tensor):
        return graph_pb([x.node])
    if isinstance(x, (list, tuple)) and x and all(isinstance(t, Tensor) for t in x):
        return graph_pb([t.node for t in x])
    raise TypeError(f"kex: expected a Tensor, a list of Tensors or a kex.v1.Graph, not {type(x).__name__}")


class TuneResult:
    """One kernel of a tune: the chosen opts and their time against the hand-coded opts.

    kernel: the hand-coded name; name: the name with the chosen opts; opts: a list
    of strings ("UPCAST(0,4)"); us / hand_us: microseconds; search_s: seconds spent;
    from_cache: nothing was searched; entry: the CacheEntry message.
    """

    __slots__ = ("i", "kernel", "name", "ast_key", "opts", "us", "hand_us", "search_s", "from_cache", "hand_won",
                 "entry")

    @classmethod
    def from_event(cls, ev):
        r = cls()
        r.i, r.kernel, r.entry = ev.i, ev.kernel, ev.entry
        r.name, r.ast_key, r.opts = ev.entry.kernel_name, ev.entry.key, list(ev.entry.opts)
        r.us, r.hand_us = ev.entry.best_us, ev.entry.baseline_us
        r.search_s, r.from_cache, r.hand_won = ev.search_s, ev.from_cache, ev.hand_won
        return r

    def __repr__(self):
        return (f"<kex.TuneResult {self.name} {' '.join(self.opts) or '(no opts)'} {self.us:.2f} us "
                f"(hand-coded {self.hand_us:.2f} us){' cached' if self.from_cache else ''}>")


_default = None


def connect(addr, job=None, weight=1, memory_limit=0, **kwargs):
    """Connect to kexd at addr and make it the default client of new tensors."""
    global _default
    _default = Client(addr, job=job, weight=weight, memory_limit=memory_limit, **kwargs)
    return _default


def default_client():
    if _default is None:
        raise RuntimeError("kex: no connection; call kex.connect(addr) first")
    return _default
