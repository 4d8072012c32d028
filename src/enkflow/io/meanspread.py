"""Analysis mean and spread files: CF NetCDF-4 with the restart file's coordinates."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from enkflow.errors import FileFormatError, InputError
from enkflow.io.lustre import setstripe
from enkflow.parallel import Comm, SerialComm
from enkflow.state import StateLayout

_KEEP_ATTRS = ("units", "long_name", "standard_name", "coordinates", "axis", "positive", "calendar", "bounds")


def ensemble_mean_spread(X: np.ndarray, block: int = 65536) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise mean and spread (standard deviation, ddof=1; 0 for one member) of ``X``
    (n_rows, n_ens) -> two (n_rows,) float64 arrays. Works in blocks of ``block`` rows so
    that no temporary of the ensemble's size is made."""
    n = X.shape[0]
    mean = np.empty(n)
    spread = np.zeros(n)
    for r0 in range(0, n, block):
        xb = X[r0 : r0 + block]
        mean[r0 : r0 + block] = xb.mean(axis=1)
        if X.shape[1] > 1:
            spread[r0 : r0 + block] = xb.std(axis=1, ddof=1)
    return mean, spread


def write_mean_spread(
    X: np.ndarray,
    layout: StateLayout,
    mean_path: str | os.PathLike[str],
    spread_path: str | os.PathLike[str] | None = None,
    *,
    comm: Comm | None = None,
    title: str = "enkflow analysis",
) -> None:
    """Write the ensemble mean (and spread) of the state as CF NetCDF-4 files.

    ``X`` is this rank's row block (n_local_rows, n_ens) of the row-block decomposition over
    ``comm``. Each state variable keeps its name, dimensions, units and coordinates (the
    template's coordinate and auxiliary coordinate variables are copied); points outside the
    mask hold the fill value. Collective; rank 0 writes (atomically: temporary file + rename).
    """
    comm = comm or SerialComm()
    mean_l, spread_l = ensemble_mean_spread(np.asarray(X, dtype=np.float64))
    mean = comm.allgather_rows(mean_l)
    spread = comm.allgather_rows(spread_l)
    if mean.size != layout.n_rows:
        raise InputError(f"the row blocks add up to {mean.size} rows, the layout has {layout.n_rows}", item="X")
    if comm.rank == 0:
        _write(Path(mean_path), layout, mean, "mean", title, X.shape[1])
        if spread_path is not None:
            _write(Path(spread_path), layout, spread, "standard_deviation", title, X.shape[1])
    comm.barrier()


def _write(path: Path, layout: StateLayout, x: np.ndarray, stat: str, title: str, n_ens: int) -> None:
    import netCDF4

    fields = layout.to_fields(x, fill=np.nan)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    setstripe(tmp)
    try:
        src = netCDF4.Dataset(layout.template, "r")
    except OSError as exc:
        raise FileFormatError(f"cannot open the template: {exc}", path=layout.template) from None
    try:
        src.set_auto_maskandscale(False)
        dst = netCDF4.Dataset(tmp, "w", format="NETCDF4")
        try:
            needed_vars: list[str] = []
            for v in layout.variables:
                sv = src.variables[v.name]
                aux = str(sv.getncattr("coordinates")).split() if "coordinates" in sv.ncattrs() else []
                for c in list(v.dims) + aux:
                    if c in src.variables and c not in needed_vars and c not in layout.names:
                        needed_vars.append(c)
            dims: list[str] = []
            for name in list(layout.names) + needed_vars:
                for d in src.variables[name].dimensions:
                    if d not in dims:
                        dims.append(d)
            for d in dims:
                dim = src.dimensions[d]
                dst.createDimension(d, None if dim.isunlimited() else len(dim))
            for c in needed_vars:
                sv = src.variables[c]
                out = dst.createVariable(c, sv.dtype, sv.dimensions)
                out.setncatts({k: sv.getncattr(k) for k in sv.ncattrs() if k != "_FillValue"})
                out[...] = sv[...]
            for v in layout.variables:
                sv = src.variables[v.name]
                out = dst.createVariable(v.name, "f8", v.dims, fill_value=netCDF4.default_fillvals["f8"])
                out.setncatts({k: sv.getncattr(k) for k in sv.ncattrs() if k in _KEEP_ATTRS})
                ln = sv.getncattr("long_name") if "long_name" in sv.ncattrs() else v.name
                out.long_name = f"{ln} (ensemble {stat.replace('_', ' ')})"
                out.cell_methods = f"member: {stat}"
                f = fields[v.name]
                out[...] = np.ma.masked_invalid(f) if v.index is not None else f
            dst.setncatts({
                "Conventions": "CF-1.8", "title": f"{title}: ensemble {stat.replace('_', ' ')}",
                "source": "enkflow", "ensemble_size": np.int32(n_ens), "template": os.path.abspath(layout.template),
                "history": f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} enkflow write_mean_spread",
            })
        finally:
            dst.close()
    finally:
        src.close()
    os.replace(tmp, path)
