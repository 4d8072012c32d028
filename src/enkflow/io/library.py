"""The slow path: variables without one contiguous byte range (chunked, compressed, interleaved
records) are read and written through the NetCDF library, one leading-axis hyperslab at a time.

The NetCDF-C and HDF5 libraries are not thread-safe, so every call holds one process-wide lock;
this path is therefore serial within a process. A kill during a library write to a chunked
NetCDF-4 variable may leave HDF5 metadata inconsistent (HDF5 is not crash-atomic), so the
crash-safety guarantee of :mod:`enkflow.io.wal` covers the byte-offset path fully and this path
only as far as HDF5 survives an interrupted write.
"""

from __future__ import annotations

import sys
import threading

import netCDF4
import numpy as np

from enkflow.errors import FileFormatError
from enkflow.io.storage import VarStorage
from enkflow.state import Piece

LOCK = threading.Lock()
_NOTICED: set[tuple[str, str]] = set()


def notice(path: str, vs: VarStorage) -> None:
    """One line per variable and process saying why and what it costs."""
    key = (vs.name, vs.reason)
    if key in _NOTICED:
        return
    _NOTICED.add(key)
    print(
        f"enkflow.io: notice: variable '{vs.name}' ({vs.reason}, e.g. {path}) goes through the NetCDF library "
        "hyperslab by hyperslab: serial, one decode/encode per member, typically 3-10x slower than the byte-offset "
        "path; store state variables contiguous and uncompressed for full speed",
        file=sys.stderr,
    )


def slab_bounds(vs: VarStorage, piece: Piece) -> tuple[int, int, int]:
    """``(i0, i1, inner)``: the leading-axis index range covering the piece's elements and the
    number of elements per leading index."""
    inner = int(np.prod(vs.shape[1:], dtype=np.int64)) if len(vs.shape) > 1 else 1
    i0 = piece.elem_start // inner
    i1 = -(-piece.elem_stop // inner)
    return i0, i1, inner


def _open(path: str, mode: str) -> netCDF4.Dataset:
    try:
        ds = netCDF4.Dataset(path, mode)
    except OSError as exc:
        raise FileFormatError(f"NetCDF library cannot open the file ({mode!r}): {exc}", path=path) from None
    ds.set_auto_maskandscale(False)
    return ds


def read_slab(path: str, name: str, i0: int, i1: int) -> np.ndarray:
    """``var[i0:i1]`` flattened, in the file's dtype."""
    with LOCK:
        ds = _open(path, "r")
        try:
            return np.asarray(ds.variables[name][i0:i1]).reshape(-1)
        finally:
            ds.close()


def write_slab(path: str, name: str, i0: int, i1: int, values: np.ndarray) -> None:
    """``var[i0:i1] = values`` (flat, reshaped to the slab)."""
    with LOCK:
        ds = _open(path, "r+")
        try:
            v = ds.variables[name]
            v[i0:i1] = values.reshape((i1 - i0,) + tuple(v.shape[1:]))
        finally:
            ds.close()


def read_piece(path: str, vs: VarStorage, piece: Piece, dst: np.ndarray) -> None:
    """Fill ``dst`` (piece.n_rows,) float64 with the piece's values."""
    i0, i1, inner = slab_bounds(vs, piece)
    flat = read_slab(path, vs.name, i0, i1)
    lo = piece.elem_start - i0 * inner
    if piece.select is None:
        dst[:] = flat[lo : lo + piece.n_rows]
    else:
        dst[:] = flat[lo + piece.select]


def merged_slab(path: str, vs: VarStorage, piece: Piece, src: np.ndarray) -> tuple[int, int, np.ndarray]:
    """``(i0, i1, slab)``: the covering slab as in the file with the piece's rows replaced by
    ``src`` (converted to the file's dtype); the other elements keep their values."""
    i0, i1, inner = slab_bounds(vs, piece)
    flat = read_slab(path, vs.name, i0, i1).copy()
    lo = piece.elem_start - i0 * inner
    if piece.select is None:
        flat[lo : lo + piece.n_rows] = src
    else:
        flat[lo + piece.select] = src
    return i0, i1, flat
