"""kex dtypes: graph-format names, tinygrad 0.9.0's promotion lattice.

A kex dtype is its graph-format name, a str: "float32", "int32", "bool", ...
The module-level constants (kex.dtypes.float32, .half, .int, ...) are those
strings, for tinygrad-style code (`dtype=kex.dtypes.float16`); every dtype
argument also takes a numpy dtype or type (np.float16).

least_upper_dtype is tinygrad's: the smallest (by priority) dtype in the
intersection of the upward closures of the promotion lattice.
"""
import builtins

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
    """tinygrad's promotion: the lowest-priority dtype every one of `ds` promotes to."""
    common = set.intersection(*(_upward(d) for d in ds))
    return min(common, key=lambda d: DTYPES[d][0])


def is_float(d):
    """Whether d is a floating-point dtype."""
    return DTYPES[d][2] == "f"


def is_int(d):
    """Whether d is a (signed or unsigned) integer dtype; bool is not."""
    return DTYPES[d][2] in "iu"


def is_unsigned(d):
    """Whether d is an unsigned integer dtype."""
    return DTYPES[d][2] == "u"


def itemsize(d):
    """Bytes per element of d."""
    return DTYPES[d][1]


def least_upper_float(d):
    """d when it is a float, else the float it promotes to with default_float (tinygrad's)."""
    return d if is_float(d) else least_upper_dtype(d, default_float)


def sum_acc_dtype(d):
    """The dtype a sum of d accumulates in (tinygrad's sum_acc_dtype)."""
    if is_unsigned(d):
        return least_upper_dtype(d, "uint32")
    if is_int(d) or d == "bool":
        return least_upper_dtype(d, "int32")
    return least_upper_dtype(d, "float32")


def from_py(x):
    """tinygrad's dtypes.from_py: float -> default_float, bool -> bool, int -> default_int."""
    if builtins.isinstance(x, builtins.bool):
        return "bool"
    if builtins.isinstance(x, builtins.float):
        return default_float
    return default_int


def as_const(x, d):
    """x as the Python value a CONST of dtype d holds (tinygrad's dtypes.as_const)."""
    if is_int(d):
        return builtins.int(x)
    if is_float(d):
        return builtins.float(x)
    return builtins.bool(x)


def from_numpy(npd):
    """The kex dtype of a numpy dtype (TypeError when kex has none)."""
    name = np.dtype(npd).name
    if name not in DTYPES:
        raise TypeError(f"kex: numpy dtype {name} has no kex dtype")
    return name


def to_numpy(d):
    """The numpy dtype of kex dtype d (TypeError for bfloat16, which numpy lacks)."""
    if d == "bfloat16":
        raise TypeError("kex: numpy has no bfloat16")
    return np.dtype(d)


def normalize(d):
    """A kex dtype name from a name ("float32"), a numpy dtype or type (np.float16), or None (None)."""
    if d is None:
        return None
    if builtins.isinstance(d, builtins.str):
        if d in DTYPES:
            return d
        if d in _aliases:
            return _aliases[d]
        raise TypeError(f"kex: unknown dtype {d!r} (one of {', '.join(DTYPES)})")
    try:
        return from_numpy(np.dtype(d))
    except (TypeError, ValueError):
        raise TypeError(f"kex: {d!r} is not a dtype") from None


_aliases = {"half": "float16", "float": "float32", "double": "float64", "int": "int32", "long": "int64",
            "uchar": "uint8", "char": "int8", "short": "int16", "ushort": "uint16", "uint": "uint32",
            "ulong": "uint64", "bool_": "bool"}

# tinygrad-style constants: kex.dtypes.float32 == "float32", kex.dtypes.half == "float16", ...
globals().update({name: name for name in DTYPES})
globals().update(_aliases)
