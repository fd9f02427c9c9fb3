"""The connection to kexd: a gRPC channel, a job, and kex.Error.

Stubs come from proto/kex/v1/kex.proto.  An installed wheel carries them
(kex/_pb/, generated when it was built); in the source tree (or when a build
could not make them) they are generated into kex/_pb/ on first import, with
grpc_tools (Debian: python3-grpc-tools), and again when the tree's .proto is
newer than them.
"""
import json
import os
import socket
import warnings
import weakref

import grpc
import grpc.experimental

from . import _buildtools

_here = os.path.dirname(os.path.abspath(__file__))
_tree_proto = os.path.normpath(os.path.join(_here, "..", "..", "..", "proto", "kex", "v1", "kex.proto"))
_pkg_proto = os.path.join(_here, "_proto", "kex.proto")  # the copy a wheel or sdist carries


def _load_stubs():
    pb_dir = os.path.join(_here, "_pb")
    marker = os.path.join(pb_dir, "kex_pb2_grpc.py")
    have = os.path.exists(marker)
    in_tree = os.path.isfile(_tree_proto)
    proto = _tree_proto if in_tree else _pkg_proto
    stale = have and in_tree and os.path.getmtime(_tree_proto) > os.path.getmtime(marker)
    if not have or stale:
        try:
            _buildtools.generate(proto, pb_dir)
        except (RuntimeError, OSError) as e:
            if not have:
                raise ImportError(f"kex: the gRPC stubs are missing and cannot be generated ({e}); install "
                                  f"grpcio-tools (Debian: python3-grpc-tools) or run client/python/gen_stubs.sh"
                                  ) from e
            warnings.warn(f"kex: {proto} is newer than kex/_pb/ and regenerating the stubs failed ({e}); "
                          f"using the old stubs", RuntimeWarning, stacklevel=2)
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
    def from_rpc(cls, e, node=None):
        """The kex.Error of a grpc.RpcError; node ("NAME at ADDR") is named when it is unavailable."""
        if node and e.code() == grpc.StatusCode.UNAVAILABLE:
            return cls(e.code(), f"node {node} is unavailable; the job lives there, so its calls go nowhere else "
                                 f"({e.details()})")
        return cls(e.code(), e.details())


def _events(msg):
    """The events of one Submit stream message: msg itself (without its `following`), then those it carries."""
    if not msg.following:
        return (msg,)
    first = pb.SubmitEvent()
    first.CopyFrom(msg)
    first.ClearField("following")
    return (first, *msg.following)


def _call(fn, *args, node=None, **kwargs):
    try:
        return fn(*args, **kwargs)
    except grpc.RpcError as e:
        raise Error.from_rpc(e, node) from None


# ---- fleets: a target of several kexds ----

_ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
# A server stream (Submit's events, Download's chunks) is read by the thread that iterates it, not handed over
# from gRPC's channel thread one message at a time: a tiny Submit's four events cost one thread hop fewer each.
# Every event still arrives; only who reads them changes.
_CHANNEL_OPTIONS = [(grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]
_SERVERS_MAX = 64  # items of a server list (as libkex)
_fleets = {}  # (target, credentials' files) -> the channel every Client of this process opens its jobs on


def _list_host(item):
    """(host, family) of an "IP:PORT" or "[IPv6]:PORT" item of a server list; ValueError for anything else."""
    host, sep, port = item.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"kex: {item!r}: a server list takes IP:PORT items ([v6]:PORT); for names use "
                         f"dns:///NAME:PORT")
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
            return host, family
        except OSError:
            pass
    raise ValueError(f"kex: {item!r}: a server list takes IP addresses; for names use dns:///NAME:PORT")


def _fleet(addr):
    """(gRPC target, the list's items or None, the name TLS checks) when addr names a fleet, else None.

    "a:1,b:2" (IP literals, all IPv4 or all IPv6; also in "ipv4:"/"ipv6:" form) becomes "ipv4:a:1,b:2";
    "dns:..." is a fleet as it is."""
    if addr.startswith("dns:"):
        return addr, None, None
    items = (addr[5:] if addr.startswith(("ipv4:", "ipv6:")) else addr).split(",")
    if len(items) == 1:
        return None
    if len(items) > _SERVERS_MAX:
        raise ValueError(f"kex: a server list takes at most {_SERVERS_MAX} addresses, not {len(items)}")
    hosts = [_list_host(i) for i in items]
    if len({f for _, f in hosts}) != 1:
        raise ValueError(f"kex: {addr!r}: a server list is all IPv4 or all IPv6")
    scheme = "ipv4:" if hosts[0][1] == socket.AF_INET else "ipv6:"
    return scheme + ",".join(items), items, hosts[0][0]


def _token_node(job):
    """("NAME", "ADDR") of a kexd token "HEX.NAME@ADDR", or None when it names no node."""
    if len(job) <= 33 or job[32] != ".":
        return None
    name, at, addr = job[33:].partition("@")
    return (name, addr) if at and addr else None


def _shutdown(channel, stub, job, owns_job, timeout, metadata, hold=None):
    """Close what a Client holds: its job (if it opened it) and its channel.

    A module-level function, so the weakref.finalize that calls it holds no
    reference to the Client: it runs once, from close(), when the Client is
    garbage-collected, or at interpreter exit (atexit), whichever comes first.
    """
    if owns_job:
        try:
            stub.CloseJob(pb.CloseJobRequest(job=job), timeout=min(timeout or 5.0, 5.0), metadata=metadata)
        except Exception:  # noqa: BLE001 - a server gone away, or a channel torn down at exit: nothing to do
            pass
    if hold is not None:
        try:
            hold.cancel()
        except Exception:  # noqa: BLE001
            pass
    try:
        channel.close()
    except Exception:  # noqa: BLE001
        pass


def _hold(stub, job, timeout, metadata):
    """Start HoldJob for a job this process opened: kexd closes the job (and frees its buffers) as soon as
    the call ends, so a process that is killed never leaves its job behind until the lease runs out.
    The call object is returned (kept open in the background by gRPC); None when kexd has no HoldJob."""
    try:
        call = stub.HoldJob(pb.HoldJobRequest(job=job), metadata=metadata)
        next(call)  # the "held" event: the hold is in place
        return call
    except (grpc.RpcError, StopIteration, AttributeError):
        return None


class Client:
    """One channel to kexd and the job its tensors live in.

    job=None opens a job, which this Client closes: on close(), on leaving a
    `with` block, when the Client is garbage-collected, or at the latest when
    the interpreter exits (so a script that never calls close() does not leave
    its job and buffers on the server until the lease runs out).  A job it
    opens is also held (HoldJob): if the process is killed, kexd closes the
    job as soon as the connection breaks.  A given job token is used as is and
    left open.

    addr: "host:port", or a fleet of kexds: "ip:port,ip:port,..." or
    "dns:///name:port".  A fleet's jobs are opened through one channel per
    process with gRPC's round_robin policy (so new jobs spread over the live
    nodes), and every call of the job goes to the node that opened it (the
    address in its token): if that node dies they fail UNAVAILABLE naming
    it.  weight and memory_limit: the job's share and byte limit
    (OpenJob); name: the job's name in kexd's stats; token: a bearer token sent
    as `authorization`; root_certs: a PEM file for TLS; client_cert and
    client_key: PEM files of this client's certificate and key, for a kexd
    that requires client certificates (mutual TLS; they imply TLS, with the
    system roots when root_certs is None); timeout: seconds per unary call.
    """

    def __init__(self, addr, job=None, weight=1, memory_limit=0, name="kex-python", token=None,
                 root_certs=None, timeout=60.0, client_cert=None, client_key=None):
        if bool(client_cert) != bool(client_key):
            raise ValueError("client_cert and client_key go together")
        creds = None
        if root_certs or client_cert:
            def read(path):
                if not path:
                    return None
                with open(path, "rb") as f:
                    return f.read()
            creds = grpc.ssl_channel_credentials(read(root_certs), read(client_key), read(client_cert))

        def channel(target, options=()):
            options = list(options) + _CHANNEL_OPTIONS
            return grpc.secure_channel(target, creds, options) if creds else grpc.insecure_channel(target, options)

        fleet = _fleet(addr)
        self.addr = addr
        self.node = None  # a fleet's job: "NAME at ADDR" of the node that holds it
        self.timeout = timeout
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.owns_job = job is None
        self._devices = None
        if fleet:
            target, items, tls_name = fleet
            key = (target, root_certs, client_cert, client_key)
            if key not in _fleets:  # one per process: round_robin spreads the jobs of all its Clients
                opts = [("grpc.service_config", _ROUND_ROBIN)]
                if creds and tls_name:
                    opts.append(("grpc.ssl_target_name_override", tls_name))
                _fleets[key] = channel(target, opts)
            if job is None:
                r = _call(pb_grpc.KexStub(_fleets[key]).OpenJob,
                          pb.OpenJobRequest(name=name, weight=weight, memory_limit=memory_limit), timeout=timeout,
                          metadata=self.metadata)
                job = r.job
            node = _token_node(job)
            if node is None:
                raise ValueError(f"kex: job token {job[:8]}... names no node, so a fleet cannot route its calls")
            if items is not None and node[1] not in items:
                raise ValueError(f"kex: the job's token names node {node[0]} at {node[1]}, which is not one of "
                                 f"{addr}: its calls go nowhere else")
            self.node = f"{node[0]} at {node[1]}"
            self.channel = channel(node[1])  # the job's calls: pinned to its node
        else:
            self.channel = channel(addr)
        self.stub = pb_grpc.KexStub(self.channel)
        if job is None:
            try:
                r = _call(self.stub.OpenJob, pb.OpenJobRequest(name=name, weight=weight, memory_limit=memory_limit),
                          timeout=timeout, metadata=self.metadata, node=self.node)
            except BaseException:
                self.channel.close()
                raise
            job = r.job
        self.job = job
        self._hold = _hold(self.stub, job, timeout, self.metadata) if self.owns_job else None
        self._finalizer = weakref.finalize(self, _shutdown, self.channel, self.stub, job, self.owns_job, timeout,
                                           self.metadata, self._hold)

    @property
    def closed(self):
        """True once close() ran (or the job was closed at exit)."""
        return not self._finalizer.alive

    def close(self):
        """Close the job (when this Client opened it) and the channel.  Idempotent."""
        if self.channel is None:
            return
        self._finalizer()
        self.channel = None
        global _default
        if _default is self:
            _default = None

    def __repr__(self):
        state = "closed" if self.closed else "open"
        return f"<kex.Client {self.addr} job {self.job[:8]}... {'owned' if self.owns_job else 'borrowed'}, {state}>"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- calls ----
    def plan(self, graph):
        """Schedule a kex.v1.Graph on kexd without running it: the PlanReply (.kernels, .items)."""
        return _call(self.stub.Plan, pb.PlanRequest(job=self.job, graph=graph), timeout=self.timeout,
                     metadata=self.metadata, node=self.node)

    def submit(self, graph, return_bytes=True, timeout=None, on_event=None, trace=False):
        """Run a graph; returns the Done event.  on_event(event) sees every event.

        trace=True: the server records the submission and the Done event's
        trace_json holds it as Chrome trace-event JSON (open it in Perfetto)."""
        done = None
        try:
            # batched_events: the events ready together come in one message (a quick Submit's whole stream is one
            # message and the status); on_event still sees each event on its own, in order
            for msg in self.stub.Submit(pb.SubmitRequest(job=self.job, graph=graph, return_bytes=return_bytes,
                                                         trace=bool(trace), batched_events=True),
                                        timeout=timeout, metadata=self.metadata):
                for ev in _events(msg) if on_event else (msg, *msg.following):
                    if on_event:
                        on_event(ev)
                    if ev.WhichOneof("event") == "done":
                        done = ev.done
        except grpc.RpcError as e:
            raise Error.from_rpc(e, self.node) from None
        if done is None:
            raise Error(grpc.StatusCode.INTERNAL, "Submit ended without a done event")
        return done

    def upload(self, array, device="", dtype=None):
        """Send a numpy array to kexd (streamed in 1 MiB chunks); the handle of the buffer the job now holds.

        device: a server device name ("" or None: the default); dtype: the kex dtype
        to declare instead of the array's (bfloat16 bytes travel as a uint16 array)."""
        from .dtypes import from_numpy
        import numpy as np
        a = np.ascontiguousarray(array)
        data = a.tobytes()
        chunk = 1 << 20

        def parts():
            yield pb.UploadRequest(job=self.job, header=pb.UploadHeader(dtype=dtype or from_numpy(a.dtype),
                                                                        shape=a.shape, device=device or ""))
            for i in range(0, len(data), chunk):
                yield pb.UploadRequest(job=self.job, chunk=data[i:i + chunk])

        return _call(self.stub.Upload, parts(), timeout=self.timeout, metadata=self.metadata, node=self.node).handle

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
            raise Error.from_rpc(e, self.node) from None
        return dtype, shape, bytes(buf)

    def free(self, handles):
        """Free buffers the job holds; the number freed."""
        return _call(self.stub.Free, pb.FreeRequest(job=self.job, handles=list(handles)), timeout=self.timeout,
                     metadata=self.metadata, node=self.node).freed

    def devices(self):
        """The server's devices (kex.v1.Device messages: name, kind, is_default, available, ...)."""
        return list(_call(self.stub.ListDevices, pb.ListDevicesRequest(job=self.job), timeout=self.timeout,
                          metadata=self.metadata, node=self.node).devices)

    def default_device(self):
        """The name of the server's default device (the one graphs without a device run on); asked once."""
        if self._devices is None:
            self._devices = self.devices()
        for d in self._devices:
            if d.is_default:
                return d.name
        return "default"

    def stats(self):
        """GetStats for this job: the server's counters (jobs_open, calls, ...)."""
        return _call(self.stub.GetStats, pb.GetStatsRequest(job=self.job), timeout=self.timeout,
                     metadata=self.metadata, node=self.node)

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
            raise Error.from_rpc(e, self.node) from None
        return [results[i] for i in sorted(results)]

    def tensor(self, data, dtype=None, upload=False, device=None):
        """A kex.Tensor of `data` on this client (see kex.tensor)."""
        from .tensor import Tensor
        return Tensor(data, dtype=dtype, client=self, upload=upload, device=device)


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
        """The TuneResult of a finished TuneEvent."""
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
    """The Client of the last kex.connect() (RuntimeError when there is none)."""
    if _default is None:
        raise RuntimeError("kex: no connection; call kex.connect(addr) first")
    return _default
