"""Writing an observation file (:mod:`enkflow.obs.fileformat`) from an :class:`ObsFile`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

import netCDF4
import numpy as np

from enkflow.errors import InputError
from enkflow.obs.fileformat import (ERROR_STD, KIND, LAT, LEVEL, LON, OBS_DIM, STATE_INDEX, TIME, VALUE,
                                    WRITABLE_FORMATS, ObsFile, WritableFormat)

_COORD_ATTRS = {
    LON: {"standard_name": "longitude", "long_name": "observation longitude", "units": "degrees_east"},
    LAT: {"standard_name": "latitude", "long_name": "observation latitude", "units": "degrees_north"},
}


def _writable(format: str) -> TypeGuard[WritableFormat]:
    return format in WRITABLE_FORMATS


def write_obs_file(
    path: str | Path,
    data: ObsFile,
    *,
    format: str = "NETCDF4",
    units: str = "1",
    kind_names: Sequence[str] | None = None,
    coord_names: Sequence[str] = (LON, LAT),
) -> None:
    """Write ``data`` as an observation file at ``path`` (overwriting it, not atomically).

    Parameters
    ----------
    data : ObsFile
        ``data.obs.coords`` (n_obs, len(coord_names)): lon, lat in degrees by default.
        ``data.attrs`` become global attributes; ``state_index``, ``time`` and ``obs.vcoord``
        (as ``level``) are written where not None.
    format : str
        netCDF4-python format name, one of :data:`~enkflow.obs.fileformat.WRITABLE_FORMATS`.
    units : str
        Units of ``value`` and ``error_std`` (CF/UDUNITS string).
    kind_names : sequence of str, optional
        Names of kind codes 0, 1, ...; written as CF ``flag_values``/``flag_meanings``.
    coord_names : sequence of str
        The coordinate variables: ``("lon", "lat")``, or ``("x",)``, ``("x", "y")``, ``("x", "y", "z")``.
    """
    if not _writable(format):
        raise InputError(f"format {format!r} cannot hold int64 state_index; use one of {', '.join(WRITABLE_FORMATS)}", item="format")
    obs = data.obs
    if obs.coords.shape[1] != len(coord_names):
        raise InputError(f"obs.coords has {obs.coords.shape[1]} columns, expected {len(coord_names)} "
                         f"({', '.join(coord_names)})", item="obs.coords")
    # HDF5 cannot lay out a zero-length variable contiguously.
    extra: dict[str, Any] = {"contiguous": True} if format.startswith("NETCDF4") and obs.n_obs else {}
    with netCDF4.Dataset(path, "w", format=format) as ds:
        ds.set_fill_off()
        ds.createDimension(OBS_DIM, obs.n_obs)

        def var(name: str, dtype: str, values: np.ndarray, attrs: Mapping[str, Any]) -> None:
            v = ds.createVariable(name, dtype, (OBS_DIM,), **extra)
            v.setncatts(dict(attrs))
            v[:] = values

        var(VALUE, "f8", obs.values, {"long_name": "observed value", "units": units})
        var(ERROR_STD, "f8", np.sqrt(obs.error_var), {"long_name": "observation error standard deviation", "units": units})
        for k, name in enumerate(coord_names):
            var(name, "f8", obs.coords[:, k], _COORD_ATTRS.get(name, {"long_name": f"observation coordinate {name}",
                                                                      "units": "1"}))
        if data.state_index is not None:
            var(STATE_INDEX, "i8", data.state_index, {"long_name": "0-based state-vector row observed (H selects it)",
                                                      "units": "1"})
        if data.time is not None:
            var(TIME, "f8", data.time, {"long_name": "observation time relative to the analysis time",
                                        "units": "model time unit"})
        if obs.vcoord is not None:
            var(LEVEL, "f8", obs.vcoord, {"long_name": "observation vertical coordinate", "units": "1"})
        kind_attrs: dict[str, Any] = {"long_name": "observation kind code"}
        if kind_names:
            kind_attrs["flag_values"] = np.arange(len(kind_names), dtype=np.int32)
            kind_attrs["flag_meanings"] = " ".join(kind_names)
        var(KIND, "i4", obs.kinds, kind_attrs)
        ds.setncatts(dict(data.attrs))
