"""Shared helpers of the I/O tests: expected values through netCDF4, file bytes outside the state."""

from __future__ import annotations

import numpy as np

from enkflow.io import read_structure
from enkflow.state import StateLayout


def netcdf4_state(path: str, layout: StateLayout) -> np.ndarray:
    """The state vector of one file as netCDF4-python reads it (float64, layout order)."""
    import netCDF4

    ds = netCDF4.Dataset(path, "r")
    try:
        ds.set_auto_maskandscale(False)
        parts = []
        for v in layout.variables:
            a = np.asarray(ds.variables[v.name][...], dtype=np.float64).reshape(-1)
            parts.append(a if v.index is None else a[v.index])
        return np.concatenate(parts)
    finally:
        ds.close()


def netcdf4_X(paths: list[str], layout: StateLayout) -> np.ndarray:
    return np.asfortranarray(np.stack([netcdf4_state(p, layout) for p in paths], axis=1))


def bytes_outside_state(path: str, layout: StateLayout) -> bytes:
    """The file's bytes with the state variables' byte ranges cut out (contiguous layouts)."""
    fs = read_structure(path)
    raw = bytearray(open(path, "rb").read())
    for v in sorted((fs.variables[n] for n in layout.names), key=lambda s: -s.offset):  # type: ignore[arg-type,operator,return-value]
        del raw[v.offset : v.offset + v.nbytes]
    return bytes(raw)


def expected_after_update(path: str, layout: StateLayout, x: np.ndarray) -> dict[str, np.ndarray]:
    """Each state variable's full array after writing state vector ``x`` into ``path``:
    masked-out points keep the file's values; values round to the file's dtype."""
    import netCDF4

    ds = netCDF4.Dataset(path, "r")
    try:
        ds.set_auto_maskandscale(False)
        out = {}
        for v in layout.variables:
            a = np.array(ds.variables[v.name][...]).reshape(-1)
            vals = x[v.rows].astype(a.dtype)
            if v.index is None:
                a[:] = vals
            else:
                a[v.index] = vals
            out[v.name] = a.reshape(v.shape)
        return out
    finally:
        ds.close()
