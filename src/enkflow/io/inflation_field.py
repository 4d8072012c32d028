"""The adaptive inflation field's file (:mod:`enkflow.analysis.adaptive_inflation`), one per cycle.

``inflation.nc`` in the cycle's directory holds the posterior field of the cycle, (n_rows, 2):
``inflation(row)`` the covariance inflation factor of every state row and ``inflation_sd(row)``
the standard deviation of its estimate, and optionally ``row_coords(row, coord)``. The next
cycle's analysis (a new analysis task, or a restarted server) continues from it.
"""

from __future__ import annotations

import os
import time

import netCDF4
import numpy as np

from enkflow.errors import FileFormatError, InputError
from enkflow.fsutil import atomic_output

FILE_NAME = "inflation.nc"


def read_field(path: str | os.PathLike[str], n_rows: int) -> np.ndarray:
    """The factors a previous cycle wrote with :func:`write_field`: (n_rows,) float64. A missing
    file, another number of rows or a value that is not finite and > 0 is an InputError naming it."""
    return _read(path, n_rows, with_sd=False)[0]


def read_state(path: str | os.PathLike[str], n_rows: int, sd_missing: float) -> np.ndarray:
    """The field (n_rows, 2) a previous cycle wrote with :func:`write_field`: the factors and the
    standard deviations of the estimates. A file without ``inflation_sd`` (written before the
    deviation was carried) gives ``sd_missing`` everywhere. Errors as :func:`read_field`."""
    f, sd = _read(path, n_rows, with_sd=True)
    return np.column_stack([f, np.full(n_rows, float(sd_missing)) if sd is None else sd])


def _read(path: str | os.PathLike[str], n_rows: int, with_sd: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """``(inflation, inflation_sd or None)`` of the file, each checked: n_rows values, finite and > 0."""
    sd = None
    try:
        with netCDF4.Dataset(path, "r") as ds:
            if "inflation" not in ds.variables:
                raise FileFormatError("no variable 'inflation'", path=str(path), variable="inflation")
            ds.set_auto_mask(False)
            f = np.asarray(ds.variables["inflation"][:], dtype=np.float64).reshape(-1)
            if with_sd and "inflation_sd" in ds.variables:
                sd = np.asarray(ds.variables["inflation_sd"][:], dtype=np.float64).reshape(-1)
    except OSError as exc:
        raise InputError(f"cannot read the previous cycle's adaptive inflation field {path}: {exc} (it carries the "
                         "inflation from cycle to cycle)", item=str(path)) from None
    for name, v in (("inflation", f), ("inflation_sd", sd)):
        if v is not None:
            _check(v, n_rows, path, name)
    return f, sd


def _check(f: np.ndarray, n_rows: int, path: str | os.PathLike[str], name: str) -> None:
    if f.size != n_rows:
        raise FileFormatError(f"the inflation field has {f.size} rows, the state {n_rows}", path=str(path),
                              variable=name)
    if not (np.isfinite(f).all() and (f > 0).all()):
        raise FileFormatError("the inflation field holds values that are not finite and > 0", path=str(path),
                              variable=name)


def write_field(path: str | os.PathLike[str], field: np.ndarray, *, cycle: int, coords: np.ndarray | None = None) -> None:
    """Write the posterior field (n_rows, 2) of ``cycle`` atomically to ``path`` (NetCDF-4):
    ``inflation(row)``, ``inflation_sd(row)`` and, with ``coords`` (n_rows, n_dim), ``row_coords(row, coord)``."""
    if field.ndim != 2 or field.shape[1] != 2:
        raise InputError(f"an adaptive inflation field is (n_rows, 2), got {field.shape}", item="infl_field")
    with atomic_output(path) as tmp:
        ds = netCDF4.Dataset(tmp, "w", format="NETCDF4")
        try:
            ds.createDimension("row", field.shape[0])
            v = ds.createVariable("inflation", "f8", ("row",))
            v.long_name = "adaptive prior covariance inflation factor of each state row (Miyoshi 2011)"
            v.units = "1"
            v[:] = field[:, 0]
            v = ds.createVariable("inflation_sd", "f8", ("row",))
            v.long_name = "standard deviation of the inflation factor's estimate"
            v.units = "1"
            v[:] = field[:, 1]
            if coords is not None:
                c = np.asarray(coords, dtype=np.float64).reshape(field.shape[0], -1)
                ds.createDimension("coord", c.shape[1])
                cv = ds.createVariable("row_coords", "f8", ("row", "coord"))
                cv.long_name = "localization coordinates of each state row"
                cv[:] = c
            ds.setncatts({"Conventions": "CF-1.8", "title": f"enkflow adaptive inflation, cycle {cycle}",
                          "source": "enkflow", "cycle": np.int32(cycle),
                          "history": f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} enkflow"})
        finally:
            ds.close()


