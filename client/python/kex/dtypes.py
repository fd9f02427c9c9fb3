"""kex dtypes: graph-format names, tinygrad 0.9.0's promotion lattice.

least_upper_dtype is tinygrad's: the smallest (by priority) dtype in the
intersection of the upward closures of the promotion lattice.
"""
import numpy as np

# name: (priority, itemsize, kind)  kind: b bool, i signed, u unsigned, f float
DTYPES = {
    "bool": (0, 1, "b"), "int8": (1, 1, "i"), "uint8": (2, 1, "u"), "int16": (3, 2, "i"), "uint16": (4, 2, "u"),
    "int32": (5, 4, "i"), "uint32": (6, 4, "u"), "int64": (7, 8, "i"), "uint64": (8, 8, "u"),
    "float16": (9, 2, "f"), "bfloat16": (10, 2, "f"), "float32": (11, 4, "f"), "float64": (12, 8, "f"),
}
default_float = "float32"
default_int = "int32"

_lattice = {
    "bool": ["int8", "uint8"], "int8": ["int16"], "int16": ["int32"], "int32": ["int64"],
    "int64": ["float16", "bfloat16"], "uint8": ["int16", "uint16"], "uint16": ["int32", "uint32"],
    "uint32": ["int64", "uint64"], "uint64": ["float16", "bfloat16"], "float16": ["float32"],
    "bfloat16": ["float32"], "float32": ["float64"], "float64": [],
}


def _upward(d):
    out, stack = {d}, [d]
    while stack:
        for p in _lattice[stack.pop()]:
            if p not in out:
                out.add(p)
                stack.append(p)
    return out


def least_upper_dtype(*ds):
    common = set.intersection(*(_upward(d) for d in ds))
    return min(common, key=lambda d: DTYPES[d][0])


def is_float(d): return DTYPES[d][2] == "f"
def is_int(d): return DTYPES[d][2] in "iu"
def is_unsigned(d): return DTYPES[d][2] == "u"
def itemsize(d): return DTYPES[d][1]


def least_upper_float(d):
    return d if is_float(d) else least_upper_dtype(d, default_float)


def sum_acc_dtype(d):
    if is_unsigned(d):
        return least_upper_dtype(d, "uint32")
    if is_int(d) or d == "bool":
        return least_upper_dtype(d, "int32")
    return least_upper_dtype(d, "float32")


def from_py(x):
    """tinygrad's dtypes.from_py: float -> default_float, bool -> bool, int -> default_int."""
    if isinstance(x, bool):
        return "bool"
    if isinstance(x, float):
        return default_float
    return default_int


def as_const(x, d):
    if is_int(d):
        return int(x)
    if is_float(d):
        return float(x)
    return bool(x)


def from_numpy(npd):
    name = np.dtype(npd).name
    if name not in DTYPES:
        raise TypeError(f"kex: numpy dtype {name} has no kex dtype")
    return name


def to_numpy(d):
    if d == "bfloat16":
        raise TypeError("kex: numpy has no bfloat16")
    return np.dtype(d)
