"""kexd's beam cache: list, get, export, import and delete what Tune learned.

    import kex
    c = kex.connect("127.0.0.1:50051")
    for e in kex.cache.list(c, device="kind=cpu", max_age_s=3600):
        print(e.key[:16], e.kernel_name, " ".join(e.opts), e.best_us, e.baseline_us)
    kex.cache.export(c, "beam.jsonl")          # the export file of search/cache.h
    kex.cache.delete(c, all=True)
    print(kex.cache.import_file(c, "beam.jsonl").imported)

Entries are kex.v1.CacheEntry messages (key, device, identity, kernel_name,
opts, best_us, baseline_us, search_ms, candidates, created_unix, search_opts,
codegen; get() adds ast_text and source).  `client` may be None: the default
client of kex.connect.  Server errors raise kex.Error (NOT_FOUND for an
unknown key, INVALID_ARGUMENT for a bad filter or import header).
"""
import builtins
import io
import os

import grpc

from ._client import Error, _call, default_client, pb

IMPORT_CHUNK = 1 << 20   # bytes per ImportCache message
PAGE = 1000              # entries asked for per ListCache page

__all__ = ["list", "get", "export", "import_file", "delete", "IMPORT_CHUNK"]


def _client(client):
    return client if client is not None else default_client()


def _filter(device=None, kernel=None, key_prefix=None, max_age_s=None):
    if max_age_s is not None and max_age_s < 0:
        raise ValueError(f"kex.cache: max_age_s must be >= 0, not {max_age_s}")
    return pb.CacheFilter(device=device or "", kernel_name=kernel or "", key_prefix=key_prefix or "",
                          max_age_s=int(max_age_s or 0))


def list(client=None, device=None, kernel=None, key_prefix=None, max_age_s=None, page_size=PAGE):  # noqa: A001
    """Every entry matching the filter, in key order (all pages of ListCache).

    device: substring of the rendered device identity ("kind=cpu"); kernel:
    substring of the kernel name; key_prefix: hex prefix of the AST key;
    max_age_s: only entries made at most this many seconds ago.
    """
    c = _client(client)
    f = _filter(device, kernel, key_prefix, max_age_s)
    out, token = [], ""
    while True:
        r = _call(c.stub.ListCache, pb.ListCacheRequest(job=c.job, filter=f, limit=page_size, page_token=token),
                  timeout=c.timeout, metadata=c.metadata, node=c.node)
        out.extend(r.entries)
        if not r.next_page_token:
            return out
        if r.next_page_token == token:
            raise Error(grpc.StatusCode.INTERNAL, f"ListCache returned the same page token twice ({token!r})")
        token = r.next_page_token


def get(client, key, device=None):
    """The newest entry for key (64 hex) on device (the rendered identity; None = any), with ast_text and source."""
    c = _client(client)
    return _call(c.stub.GetCacheEntry, pb.GetCacheEntryRequest(job=c.job, key=key, device=device or ""),
                 timeout=c.timeout, metadata=c.metadata, node=c.node)


def _open(path_or_file, mode):
    if isinstance(path_or_file, (str, bytes, os.PathLike)):
        return builtins.open(path_or_file, mode), True
    return path_or_file, False


def export(client, path_or_file, device=None, kernel=None, key_prefix=None, max_age_s=None, timeout=None):
    """Write the entries matching the filter to a path or a file object (binary or text) in the
    export format of search/cache.h (JSON lines); returns how many entries the server wrote."""
    c = _client(client)
    req = pb.ExportCacheRequest(job=c.job, filter=_filter(device, kernel, key_prefix, max_age_s))
    f, owned = _open(path_or_file, "wb")
    text = isinstance(f, io.TextIOBase)
    n = 0
    try:
        for ch in c.stub.ExportCache(req, timeout=timeout, metadata=c.metadata):
            if ch.data:
                f.write(ch.data.decode("utf-8") if text else ch.data)
            if ch.entries:
                n = ch.entries
    except grpc.RpcError as e:
        raise Error.from_rpc(e, c.node) from None
    finally:
        if owned:
            f.close()
    return n


def import_file(client, path_or_file, timeout=None):
    """Send an export file (a path or a file object, binary or text) to kexd's cache, streamed in
    IMPORT_CHUNK messages.  Returns the ImportCacheReply: .imported, .rejected, .errors (the
    server's messages for refused lines, "line 3: ...")."""
    c = _client(client)
    f, owned = _open(path_or_file, "rb")
    # a text file gives characters: at most 4 UTF-8 bytes each
    size = IMPORT_CHUNK // 4 if isinstance(f, io.TextIOBase) else IMPORT_CHUNK

    def messages():
        first = True
        while True:
            data = f.read(size)
            if isinstance(data, str):
                data = data.encode("utf-8")
            if data or first:
                # the job goes in the first message only
                yield pb.ImportCacheRequest(job=c.job if first else "", data=data)
            first = False
            if len(data) == 0:
                return

    try:
        return _call(c.stub.ImportCache, messages(), timeout=timeout, metadata=c.metadata, node=c.node)
    finally:
        if owned:
            f.close()


def delete(client=None, device=None, kernel=None, key_prefix=None, max_age_s=None, all=False):  # noqa: A002
    """Delete the entries matching the filter; with no filter, only when all=True.  Returns how many."""
    c = _client(client)
    if not (device or kernel or key_prefix or max_age_s or all):
        raise ValueError("kex.cache.delete: give a filter (device, kernel, key_prefix, max_age_s) or all=True")
    return _call(c.stub.DeleteCache, pb.DeleteCacheRequest(job=c.job, filter=_filter(device, kernel, key_prefix,
                                                                                       max_age_s)),
                 timeout=c.timeout, metadata=c.metadata, node=c.node).deleted
