"""The compiled local-analysis kernel (``_c/lanes.c``), called through ctypes.

The C library is built by the package's normal build (``pip install -e .``);
see ``_c/lanes.c`` for the algorithm. This module only checks and passes
arrays; domains whose QL iteration failed are returned for the caller to redo
with LAPACK.
"""

from __future__ import annotations

import numpy as np

from enkflow.analysis import clib


def local_analysis(
    X: np.ndarray,
    dom_offsets: np.ndarray,
    dom_rows: np.ndarray,
    ob_offsets: np.ndarray,
    ob_idx: np.ndarray,
    ob_sw: np.ndarray,
    Yp: np.ndarray,
    dy: np.ndarray,
    gamma: float,
    post: float = 1.0,
    rtpp: float = 0.0,
    rtps: float = 0.0,
    stage: int = 3,
    gamma_dom: np.ndarray | None = None,
) -> np.ndarray:
    """Analyse every domain, updating ``X`` in place.

    ``X`` (n_rows, N) F-order; domain k owns rows ``dom_rows[dom_offsets[k]:
    dom_offsets[k+1]]`` and observations ``ob_idx[ob_offsets[k]:...]`` with
    ``ob_sw`` = sqrt(taper weight / error variance); ``Yp`` (n_obs, N) C-order
    observation anomalies; ``dy`` (n_obs,) innovations; ``gamma`` = rho (N-1), or per domain
    ``gamma_dom`` (n_dom,) where given (adaptive prior inflation; ``gamma`` is then unused).
    ``stage`` 1 or 2 stops after building the matrices or after the
    eigen-decomposition (profiling only; X is then not updated).
    Returns the indices of domains left for a LAPACK redo (normally empty).
    """
    n_dom = dom_offsets.size - 1
    gptr = None
    if gamma_dom is not None:
        gamma_dom = np.ascontiguousarray(gamma_dom, dtype=np.float64)
        if gamma_dom.shape != (n_dom,) or not (np.isfinite(gamma_dom).all() and (gamma_dom > 0).all()):
            raise ValueError(f"gamma_dom must be ({n_dom},) finite and > 0")
        gptr = gamma_dom.ctypes.data
    failed = np.empty(max(n_dom, 1), np.int64)
    nf = clib.lib().enk_local_analysis(
        X, X.shape[0], X.shape[1], n_dom, dom_offsets, dom_rows, ob_offsets, ob_idx,
        np.ascontiguousarray(ob_sw, dtype=np.float64), Yp, np.ascontiguousarray(dy, dtype=np.float64),
        gamma, gptr, post, rtpp, rtps, stage, failed,
    )
    if nf < 0:
        raise MemoryError("local analysis kernel could not allocate its work space")
    return failed[:nf]
