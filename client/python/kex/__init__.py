"""kex: the Python client of kexd, with a lazy Tensor API after tinygrad 0.9.0's.

    import kex, numpy as np
    kex.connect("127.0.0.1:50051")              # opens a job, closed at exit
    x = kex.tensor(np.random.rand(4, 8).astype(np.float32))
    print((x @ x.T).softmax().plan().kernels)   # schedule only
    print((x * 2 + 1).numpy())                  # runs on kexd (Submit)
    print(np.ones(8) + x)                       # numpy defers to the Tensor: a lazy Tensor
    print(kex.arange(10).argmax().item())       # 9
    print(kex.default_client().tune(x.exp(), beam=2))   # beam search on kexd
    print(kex.cache.list(kex.default_client()))         # what kexd's beam cache knows

help(kex.Tensor) lists the operations; help(kex.Client) the connection.
"""
import os as _os

from ._client import Client, Error, TuneResult, connect, default_client
from . import cache, dtypes
from .tensor import (Tensor, arange, empty, eye, full, graph_json, graph_pb, manual_seed, normal, ones, rand, randint,
                     randn, tensor, uniform, zeros)

__all__ = ["Client", "Error", "Tensor", "TuneResult", "arange", "cache", "connect", "default_client", "dtypes", "empty",
           "eye", "full", "graph_json", "graph_pb", "manual_seed", "normal", "ones", "rand", "randint", "randn",
           "tensor", "uniform", "zeros", "__version__"]


def _version():
    """The project's version: the top-level meson.build's (its one source).

    An installed wheel carries it in kex/_version.py (written by the build
    backend from meson.build); from the source tree it is read from meson.build."""
    try:
        from ._version import version
        return version
    except ImportError:
        pass
    from ._buildtools import meson_version
    here = _os.path.dirname(_os.path.abspath(__file__))
    try:
        return meson_version(_os.path.join(here, "..", "..", "..", "meson.build"))
    except (OSError, ValueError):
        pass
    try:
        from importlib.metadata import version as _dist_version
        return _dist_version("kex")
    except Exception:  # noqa: BLE001
        return "0+unknown"


__version__ = _version()
