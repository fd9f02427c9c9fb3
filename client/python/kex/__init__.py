"""kex: the Python client of kexd, with a small lazy Tensor API.

    import kex, numpy as np
    kex.connect("127.0.0.1:50051")
    x = kex.tensor(np.random.rand(4, 8).astype(np.float32))
    print((x @ x.T).softmax().plan().kernels)   # schedule only
    print((x * 2 + 1).numpy())                  # runs on kexd (Submit)
"""
from ._client import Client, Error, connect, default_client
from . import dtypes
from .tensor import Tensor, graph_json, graph_pb, tensor

__all__ = ["Client", "Error", "Tensor", "connect", "default_client", "dtypes", "graph_json", "graph_pb", "tensor"]
__version__ = "0.1.0"
