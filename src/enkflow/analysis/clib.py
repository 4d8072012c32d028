"""The analysis's compiled library (``_c/lanes.c``: the local-analysis kernel;
``_c/search.c``: the blocked local search; ``_c/serial.c``: the serial filter's observation loop),
loaded once with ctypes.

The library is built by the package's normal build (``pip install -e .``).
``ENKFLOW_LANES_LIB`` names another build of it (an older commit's, for
comparisons).
"""

from __future__ import annotations

import ctypes
import os
from functools import cache
from importlib.util import find_spec

import numpy as np

from enkflow.errors import EnkflowError

_i64p = np.ctypeslib.ndpointer(dtype=np.int64, flags="C_CONTIGUOUS")
_f64c = np.ctypeslib.ndpointer(dtype=np.float64, flags="C_CONTIGUOUS")
_f64f = np.ctypeslib.ndpointer(dtype=np.float64, flags="F_CONTIGUOUS")
_i64, _int, _dbl = ctypes.c_int64, ctypes.c_int, ctypes.c_double

_SIGNATURES = {
    "enk_local_analysis": [_f64f, _i64, _int, _i64, _i64p, _i64p, _i64p, _i64p, _f64c, _f64c, _f64c,
                           _dbl, ctypes.c_void_p, _dbl, _dbl, _dbl, _int, _i64p],
    "enk_domain_blocks": [_i64, _int, _f64c, _dbl, _dbl, _i64, _i64p],
    "enk_block_pairs": [_i64, _i64p, _int, _f64c, _f64c, _dbl, _i64p, _i64p, _dbl, _i64, _i64p, _i64p, _f64c],
    "enk_serial_update": [_i64, _i64, _i64, _i64p, _i64p, _f64c, _i64p, _i64p, _f64c, _f64c, _f64c, _f64c, _f64c,
                          _f64c, _f64c],
}


@cache
def lib() -> ctypes.CDLL:
    """The loaded library, every function's argument types declared."""
    path = os.environ.get("ENKFLOW_LANES_LIB")
    if not path:
        spec = find_spec("enkflow.analysis._lanes")
        if spec is None or spec.origin is None:
            raise EnkflowError(
                "the compiled analysis kernel enkflow.analysis._lanes is not built; "
                "reinstall with `pip install -e .` (needs a C compiler)"
            )
        path = spec.origin
    handle = ctypes.CDLL(path)
    for name, argtypes in _SIGNATURES.items():
        f = getattr(handle, name)
        f.restype = ctypes.c_int64
        f.argtypes = argtypes
    return handle
