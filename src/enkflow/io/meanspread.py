"""Analysis mean and spread files: CF NetCDF-4 with the restart file's coordinates."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np

from enkflow.errors import FileFormatError, InputError, StorageError
from enkflow.fsutil import atomic_output
from enkflow.io.lustre import setstripe
from enkflow.parallel import Comm, SerialComm
from enkflow.state import StateLayout

_KEEP_ATTRS = ("units", "long_name", "standard_name", "coordinates", "axis", "positive", "calendar", "bounds")


# The rows per block of ensemble_mean_spread: a caller that streams the state in multiples of it from row 0
# gets the same bits as one call on the whole ensemble (each row's sums run over the members as there).
STAT_BLOCK_ROWS = 65536


def ensemble_mean_spread(X: np.ndarray, block: int = STAT_BLOCK_ROWS) -> tuple[np.ndarray, np.ndarray]:
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
    mean, spread = gather_mean_spread(X, layout, comm)
    if mean is not None and spread is not None:
        MeanSpreadTemplate.read(layout).write(mean_path, spread_path, mean, spread, title=title, n_ens=X.shape[1])
    comm.barrier()


def gather_mean_spread(X: np.ndarray, layout: StateLayout, comm: Comm,
                       root: int = 0) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """The mean and spread (n_rows,) of the whole state from every rank's row block ``X``
    (n_local_rows, n_ens), on rank ``root``; (None, None) on the others (collective). Only the
    writing rank holds the whole state's statistics: 16 bytes per row on every rank would be the
    largest array of a rank's analysis for a large state."""
    mean_l, spread_l = ensemble_mean_spread(np.asarray(X, dtype=np.float64))
    counts = [int(c) for c in comm.allgather_obj(int(mean_l.size))]
    if sum(counts) != layout.n_rows:  # the same counts on every rank: all raise
        raise InputError(f"the row blocks add up to {sum(counts)} rows, the layout has {layout.n_rows}", item="X")
    out = np.empty((2, layout.n_rows)) if comm.rank == root else None
    reqs = [comm.igatherv(np.ascontiguousarray(x), out[i] if out is not None else None, counts, root)
            for i, x in enumerate((mean_l, spread_l))]
    for r in reqs:
        r.wait()
    return (out[0], out[1]) if out is not None else (None, None)


@dataclass(frozen=True)
class _Var:
    name: str
    dtype: np.dtype
    dims: tuple[str, ...]
    attrs: dict[str, Any]
    data: np.ndarray | None = None  # a coordinate's values; None for a state variable


@dataclass(frozen=True)
class MeanSpreadTemplate:
    """What the mean and spread files copy from the template (dimensions, coordinate variables,
    the state variables' attributes)."""

    layout: StateLayout
    dims: dict[str, int | None]  # None: unlimited
    coords: tuple[_Var, ...]
    variables: tuple[_Var, ...]

    source: str = ""  # the template named in the files (default: the layout's)

    @classmethod
    def read(cls, layout: StateLayout, source: str | os.PathLike[str] | None = None) -> "MeanSpreadTemplate":
        """From ``layout``'s template; ``source``: the file the written files name as their template
        (when ``layout`` was read from a copy of it)."""
        try:
            src = netCDF4.Dataset(layout.template, "r")
        except OSError as exc:
            raise FileFormatError(f"cannot open the template: {exc}", path=layout.template) from None
        try:
            src.set_auto_maskandscale(False)
            needed: list[str] = []
            for v in layout.variables:
                sv = src.variables[v.name]
                aux = str(sv.getncattr("coordinates")).split() if "coordinates" in sv.ncattrs() else []
                for c in list(v.dims) + aux:
                    if c in src.variables and c not in needed and c not in layout.names:
                        needed.append(c)
            dims: dict[str, int | None] = {}
            for name in list(layout.names) + needed:
                for d in src.variables[name].dimensions:
                    if d not in dims:
                        dim = src.dimensions[d]
                        dims[d] = None if dim.isunlimited() else len(dim)
            coords = tuple(_Var(c, src.variables[c].dtype, src.variables[c].dimensions,
                                {k: src.variables[c].getncattr(k) for k in src.variables[c].ncattrs() if k != "_FillValue"},
                                np.asarray(src.variables[c][...])) for c in needed)
            variables = []
            for v in layout.variables:
                sv = src.variables[v.name]
                attrs = {k: sv.getncattr(k) for k in sv.ncattrs() if k in _KEEP_ATTRS}
                attrs["long_name"] = sv.getncattr("long_name") if "long_name" in sv.ncattrs() else v.name
                variables.append(_Var(v.name, np.dtype("f8"), tuple(v.dims), attrs))
        finally:
            src.close()
        return cls(layout, dims, coords, tuple(variables), os.path.abspath(source or layout.template))

    def write(self, mean_path: str | os.PathLike[str], spread_path: str | os.PathLike[str] | None,
              mean: np.ndarray, spread: np.ndarray, *, title: str, n_ens: int) -> None:
        """The mean file (and the spread file) of the state's ``mean`` and ``spread`` (n_rows,)."""
        self._write(Path(mean_path), mean, "mean", title, n_ens)
        if spread_path is not None:
            self._write(Path(spread_path), spread, "standard_deviation", title, n_ens)

    def _write(self, path: Path, x: np.ndarray, stat: str, title: str, n_ens: int) -> None:
        fields = self.layout.to_fields(x, fill=np.nan)
        try:
            self._write_file(path, fields, stat, title, n_ens)
        except (OSError, RuntimeError) as exc:  # netCDF's HDF errors (a full disk) are RuntimeErrors
            raise StorageError(f"writing the ensemble {stat.replace('_', ' ')} failed: {exc}", path=str(path)) from None

    def _write_file(self, path: Path, fields: dict[str, np.ndarray], stat: str, title: str, n_ens: int) -> None:
        with atomic_output(path) as tmp:
            setstripe(tmp)
            with netCDF4.Dataset(tmp, "w", format="NETCDF4") as dst:
                for d, n in self.dims.items():
                    dst.createDimension(d, n)
                for c in self.coords:
                    out = dst.createVariable(c.name, c.dtype, c.dims)
                    out.setncatts(c.attrs)
                    out[...] = c.data
                for v, lv in zip(self.variables, self.layout.variables):
                    out = dst.createVariable(v.name, "f8", v.dims, fill_value=netCDF4.default_fillvals["f8"])
                    out.setncatts(v.attrs)
                    out.long_name = f"{v.attrs['long_name']} (ensemble {stat.replace('_', ' ')})"
                    out.cell_methods = f"member: {stat}"
                    f = fields[v.name]
                    out[...] = np.ma.masked_invalid(f) if lv.index is not None else f
                dst.setncatts({
                    "Conventions": "CF-1.8", "title": f"{title}: ensemble {stat.replace('_', ' ')}",
                    "source": "enkflow", "ensemble_size": np.int32(n_ens),
                    "template": self.source or os.path.abspath(self.layout.template),
                    "history": f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} enkflow write_mean_spread",
                })
