"""kex: the Python client of kexd, with a small lazy Tensor API.

    import kex, numpy as np
    kex.connect("127.0.0.1:50051")
    x = kex.tensor(np.random.rand(4, 8).astype(np.float32))
    print((x @ x.T).softmax().plan().kernels)   # schedule only
    print((x * 2 + 1).numpy())                  # runs on kexd (Submit)
    print(kex.default_client().tune(x.exp(), beam=2))   # beam search on kexd
    print(kex.cache.list(kex.default_client()))         # what kexd's beam cache knows
"""
from ._client import Client, Error, TuneResult, connect, default_client
from . import cache, dtypes
from .tensor import Tensor, graph_json, graph_pb, tensor

__all__ = ["Client", "Error", "Tensor", "TuneResult", "cache", "connect", "default_client", "dtypes", "graph_json",
           "graph_pb", "tensor"]
__version__ = "0.1.0"
