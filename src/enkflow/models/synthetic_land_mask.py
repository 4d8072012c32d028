"""The GLOBE land mask of the ``global-land-mask`` package, read row by row.

``global_land_mask.globe`` decompresses its whole 21600 x 43200 mask (933 MB of
bools) when imported, so even a 72 x 36 grid cost about 1 GB of memory. A
regular grid only needs one mask row per grid latitude and one column per grid
longitude, so this module inflates the package's ``mask.npy`` as a stream and
keeps just those rows: memory is a few MB whatever the grid. The lookup is
the package's own (:func:`globe.lat_to_index` / :func:`globe.lon_to_index`,
same float operations), so the result equals ``globe.is_land`` bit for bit.
"""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path
from typing import IO

import numpy as np

from enkflow.errors import FileFormatError, InputError

_MASK_FILE = "globe_combined_mask_compressed.npz"
# Rows inflated per read: 64 x 43200 bytes, about 2.8 MB of buffer.
_CHUNK_ROWS = 64


def _mask_path() -> Path:
    # find_spec does not execute the package (its __init__ would load the full mask).
    spec = importlib.util.find_spec("global_land_mask")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("the package global-land-mask is not installed (pip install global-land-mask)",
                         item="global_land_mask")
    return Path(next(iter(spec.submodule_search_locations))) / _MASK_FILE


def _axis_index(x: np.ndarray, axis: np.ndarray, limit: float, name: str) -> np.ndarray:
    """``globe.lat_to_index`` / ``lon_to_index``: the mask row (column) of each latitude
    (longitude) in degrees, ``limit`` 90 (180)."""
    x = np.array(x, dtype=np.float64)
    if np.any(np.abs(x) > limit):
        raise InputError(f"{name}s must lie in [-{limit:g}, {limit:g}] degrees", item=name)
    x[x > axis.max()] = axis.max()
    x[x < axis.min()] = axis.min()
    return ((x - axis[0]) / (axis[1] - axis[0])).astype("int")


def _lat_index(lat: np.ndarray, axis: np.ndarray) -> np.ndarray:
    return _axis_index(lat, axis, 90.0, "latitude")


def _lon_index(lon: np.ndarray, axis: np.ndarray) -> np.ndarray:
    return _axis_index(lon, axis, 180.0, "longitude")


def _read_rows(fh: IO[bytes], path: Path, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Mask values at ``rows`` (ascending, unique) x ``cols`` from an open ``mask.npy`` stream."""
    version = np.lib.format.read_magic(fh)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(fh)
    if len(shape) != 2 or fortran or dtype != np.dtype(bool):
        raise FileFormatError(f"unexpected mask layout: shape {shape}, dtype {dtype}, Fortran order {fortran}",
                              path=str(path), variable="mask")
    n_row, n_col = shape
    out = np.empty((rows.size, cols.size), dtype=bool)
    k = 0  # next wanted row
    for start in range(0, int(rows[-1]) + 1, _CHUNK_ROWS):
        stop = min(start + _CHUNK_ROWS, n_row)
        raw = fh.read((stop - start) * n_col)
        if len(raw) != (stop - start) * n_col:
            raise FileFormatError(f"mask ends early, before row {stop}", path=str(path), variable="mask")
        block = np.frombuffer(raw, dtype=bool).reshape(stop - start, n_col)
        while k < rows.size and rows[k] < stop:
            out[k] = block[rows[k] - start, cols]
            k += 1
    return out


def globe_land(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """(n_lat, n_lon) bool: ``globe.is_land(lat[:, None], lon[None, :])`` without the full mask.

    Parameters
    ----------
    lat : (n_lat,) float
        Latitudes in degrees north, in [-90, 90].
    lon : (n_lon,) float
        Longitudes in degrees east, in [-180, 180].
    """
    path = _mask_path()
    lat = np.asarray(lat, dtype=np.float64).reshape(-1)
    lon = np.asarray(lon, dtype=np.float64).reshape(-1)
    try:
        with zipfile.ZipFile(path) as z:
            with z.open("lat.npy") as fh:
                lat_axis = np.load(fh)
            with z.open("lon.npy") as fh:
                lon_axis = np.load(fh)
            r = _lat_index(lat, lat_axis)
            c = _lon_index(lon, lon_axis)
            if r.size == 0 or c.size == 0:
                return np.zeros((r.size, c.size), dtype=bool)
            uniq, where = np.unique(r, return_inverse=True)
            with z.open("mask.npy") as fh:
                ocean = _read_rows(fh, path, uniq, c)
    except InputError:
        raise
    except (OSError, zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise FileFormatError(f"cannot read the land mask: {exc}", path=str(path)) from None
    # The package's mask is True over the ocean.
    return ~ocean[where.reshape(-1)]
