"""Client.tune and kex.cache against the session's kexd (conftest.py starts it
with its own cache file): a tune searches, a second one comes from the cache;
list filters and pages, get, export to paths and file objects, delete, import
(binary and text, several messages, refused lines).  Skipped, with the
server's message, while kexd answers Tune with UNIMPLEMENTED.
"""
import io
import re

import grpc
import numpy as np
import pytest

import kex


@pytest.fixture(scope="module")
def tuned(client):
    """Tune two tiny cpu graphs (beam 1): (elementwise result, reduction result, progress events)."""
    x = kex.tensor(np.arange(32, dtype=np.float32).reshape(4, 8), client=client)
    events = []
    try:
        ew = client.tune(x * 2 + 1, beam=1, progress=events.append, device="cpu", timeout=120)
    except kex.Error as e:
        if e.code == grpc.StatusCode.UNIMPLEMENTED:
            pytest.skip(f"kexd answers Tune with UNIMPLEMENTED: {e.details}")
        raise
    red = x.sum(axis=1).tune(beam=1, device="cpu", timeout=120)
    return ew, red, events


def test_tune_searches_then_hits_the_cache(client, tuned):
    ew, red, events = tuned
    assert len(ew) == 1 and len(red) == 1
    r = ew[0]
    assert re.fullmatch(r"[0-9a-f]{64}", r.ast_key)
    assert r.us > 0 and r.hand_us > 0 and r.search_s > 0 and not r.from_cache
    assert r.name and r.kernel and all(isinstance(o, str) for o in r.opts)
    assert r.entry.device.startswith("kind=cpu;") and r.entry.identity.kind == "cpu"
    assert red[0].ast_key != r.ast_key
    # events: kernel 1 of 1, progress first, one finished event last
    assert events and all(ev.i == 1 and ev.n == 1 for ev in events)
    assert [ev.finished for ev in events] == [False] * (len(events) - 1) + [True]
    again = client.tune(kex.tensor(np.arange(32, dtype=np.float32).reshape(4, 8), client=client) * 2 + 1, beam=1,
                        device="cpu", timeout=120)
    assert again[0].from_cache and again[0].ast_key == r.ast_key and again[0].opts == r.opts


def test_list_filters(client, tuned):
    key = tuned[0][0].ast_key
    entries = kex.cache.list(client, key_prefix=key[:8])
    assert [e.key for e in entries] == [key]
    assert list(entries[0].opts) == tuned[0][0].opts and entries[0].search_opts and entries[0].codegen
    assert key in [e.key for e in kex.cache.list(client, device="kind=cpu", max_age_s=3600)]
    assert kex.cache.list(client, kernel="no-such-kernel") == []
    with pytest.raises(kex.Error) as e:
        kex.cache.list(client, key_prefix="xyz")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_list_pages(client, tuned):
    keys = {tuned[0][0].ast_key, tuned[1][0].ast_key}
    one_page = kex.cache.list(client, device="kind=cpu")
    by_one = kex.cache.list(client, device="kind=cpu", page_size=1)
    assert len(one_page) >= 2 and keys <= {e.key for e in by_one}
    assert [e.key for e in by_one] == [e.key for e in one_page]


def test_get(client, tuned):
    r = tuned[0][0]
    e = kex.cache.get(client, r.ast_key)
    assert e.key == r.ast_key and e.kernel_name == r.name and list(e.opts) == r.opts
    assert e.ast_text.startswith("kex.ast.v1") and e.source
    assert kex.cache.get(client, r.ast_key, device=e.device).key == r.ast_key
    with pytest.raises(kex.Error) as err:
        kex.cache.get(client, "0" * 64)
    assert err.value.code == grpc.StatusCode.NOT_FOUND


def test_export_delete_import(client, tuned, tmp_path):
    key = tuned[0][0].ast_key
    path = tmp_path / "export.jsonl"
    n = kex.cache.export(client, str(path))
    data = path.read_bytes()
    assert n >= 2 and data.startswith(b'{"format":"kex.cache.export.v1"') and key.encode() in data
    buf = io.BytesIO()
    assert kex.cache.export(client, buf, key_prefix=key) == 1 and key.encode() in buf.getvalue()
    text = io.StringIO()
    kex.cache.export(client, text)
    assert text.getvalue().encode() == data

    with pytest.raises(ValueError):
        kex.cache.delete(client)
    assert kex.cache.delete(client, key_prefix=key) == 1
    with pytest.raises(kex.Error) as err:
        kex.cache.get(client, key)
    assert err.value.code == grpc.StatusCode.NOT_FOUND

    r = kex.cache.import_file(client, str(path))
    assert (r.imported, r.rejected, list(r.errors)) == (n, 0, [])
    assert kex.cache.get(client, key).key == key
    # a text file object works as well
    r = kex.cache.import_file(client, io.StringIO(data.decode()))
    assert r.imported == n and r.rejected == 0


def test_import_several_messages_and_bad_lines(client, tuned):
    key = tuned[0][0].ast_key
    buf = io.BytesIO()
    kex.cache.export(client, buf, key_prefix=key)
    header, line = buf.getvalue().splitlines(keepends=True)[:2]
    copies = (2 * kex.cache.IMPORT_CHUNK) // len(line) + 2
    r = kex.cache.import_file(client, io.BytesIO(header + line * copies))
    assert r.imported == copies and r.rejected == 0
    r = kex.cache.import_file(client, io.BytesIO(header + line + b'{"type":"beam","ast_key":"nothex"}\n'))
    assert r.imported == 1 and r.rejected == 1 and "line 3" in r.errors[0]
    with pytest.raises(kex.Error) as err:
        kex.cache.import_file(client, io.BytesIO(b"not an export\n"))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_tune_bad_input(client, tuned):
    with pytest.raises(TypeError):
        client.tune("not a graph")
    g = kex.graph_pb([kex.tensor(np.ones(4, np.float32), client=client).node])
    g.nodes[0].op = "FROB"
    with pytest.raises(kex.Error) as err:
        client.tune(g, beam=1, device="cpu")
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "node 0" in err.value.details
