"""The CF-1.8 NetCDF-4 files of the writer: one per field and output time, one per field and window.

A file is written under a temporary name (:func:`enkflow.fsutil.atomic_output`) and renamed
when complete, so a reader, or a run after a ``kill -9``, never sees a half-written file under
its final name.
"""

from __future__ import annotations

import os
import time as _time
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np

from enkflow.output.config import FieldSpec, OutputConfig

INT16_FILL = np.int16(-32768)
_INT16_SPAN = 65534.0  # codes -32767 .. 32767; -32768 is the fill value


def packing(spec: FieldSpec) -> tuple[float, float, float]:
    """(scale_factor, add_offset, error bound) of the 16-bit packing of ``spec``'s pack_range."""
    lo, hi = spec.pack_bounds()
    scale = (hi - lo) / _INT16_SPAN
    return scale, (hi + lo) / 2.0, scale / 2.0


def pack(x: np.ndarray, spec: FieldSpec) -> tuple[np.ndarray, int]:
    """``x`` as int16 codes (NaN -> fill); the count of values outside pack_range (not packed: the caller errs)."""
    scale, offset, _ = packing(spec)
    lo, hi = spec.pack_bounds()
    with np.errstate(invalid="ignore"):
        outside = int(np.count_nonzero((x < lo) | (x > hi)))
        codes = np.rint((np.asarray(x, dtype=np.float64) - offset) / scale)
    nan = np.isnan(codes)
    codes = np.clip(np.where(nan, 0.0, codes), -32767, 32767).astype(np.int16)
    codes[nan] = INT16_FILL
    return codes, outside


def _compression(cfg: OutputConfig) -> dict[str, Any]:
    if cfg.compression == "none":
        return {}
    return {"compression": cfg.compression or "zlib", "complevel": cfg.complevel}


def _attrs(var: Any, **attrs: Any) -> None:
    var.setncatts({k: v for k, v in attrs.items() if v is not None})


def _history(what: str) -> str:
    return f"{_time.strftime('%Y-%m-%dT%H:%M:%SZ', _time.gmtime())} enkflow.output writer (pid {os.getpid()}): {what}"


def _coordinates(ds: Any, cfg: OutputConfig, dims: list[str], coords: dict[str, np.ndarray]) -> None:
    for d in dims:
        spec = cfg.dims[d]
        ds.createDimension(d, spec.size)
        values = coords.get(d)
        if values is None and spec.start is not None:
            values = spec.start + spec.step * np.arange(spec.size, dtype=np.float64)
        if values is not None:
            v = ds.createVariable(d, "f8", (d,))
            _attrs(v, units=spec.units, standard_name=spec.standard_name, long_name=spec.long_name, axis=spec.axis)
            v[:] = values


def _time_coord(ds: Any, cfg: OutputConfig, bounds: bool = False) -> Any:
    ds.createDimension("time", None)
    v = ds.createVariable("time", "f8", ("time",))
    _attrs(v, units=cfg.time_units, calendar=cfg.calendar, standard_name="time", axis="T")
    if bounds:
        ds.createDimension("nv", 2)
        v.bounds = "time_bnds"
        ds.createVariable("time_bnds", "f8", ("time", "nv"))
    return v


def _global(ds: Any, cfg: OutputConfig, what: str) -> None:
    ds.setncatts({"Conventions": "CF-1.8", "title": cfg.title, "source": "enkflow", "institution": "enkflow user",
                  "history": _history(what)})


def _field_attrs(var: Any, name: str, spec: FieldSpec, cell_methods: str | None, what: str = "") -> None:
    long_name = spec.long_name or name.replace("_", " ")
    _attrs(var, units=spec.units, standard_name=spec.standard_name,
           long_name=f"{long_name}{what}", cell_methods=cell_methods)


def _define_field(ds: Any, cfg: OutputConfig, name: str, coords: dict[str, np.ndarray],
                  comp: dict[str, Any] | None) -> Any:
    """The coordinates, ``member(member)`` (an ensemble field's only realization coordinate) and the
    field itself (``write_members``; else None), ``(time, member, dims...)`` or ``(time, dims...)``;
    ``comp``: NetCDF-4's compression (chunked by member and time), None in a CDF-5 file."""
    spec = cfg.fields[name]
    _coordinates(ds, cfg, spec.dims, coords)
    if spec.ensemble:
        ds.createDimension("member", cfg.members)
        m = ds.createVariable("member", "i4", ("member",))
        _attrs(m, long_name="ensemble member", standard_name="realization", units="1")
        m[:] = np.arange(1, cfg.members + 1, dtype=np.int32)
    if not cfg.write_members:
        return None
    lead = ("time", "member") if spec.ensemble else ("time",)
    comp = {} if comp is None else dict(comp, chunksizes=(1,) * len(lead) + cfg.shape(name))
    if spec.dtype == "int16":
        scale, offset, err = packing(spec)
        v = ds.createVariable(name, "i2", lead + tuple(spec.dims), fill_value=INT16_FILL, **comp)
        v.set_auto_maskandscale(False)
        _attrs(v, scale_factor=np.float64(scale), add_offset=np.float64(offset),
               packing_error_bound=np.float64(err),
               comment="16-bit packing: |unpacked - original| <= packing_error_bound",
               valid_min=np.int16(-32767), valid_max=np.int16(32767))
    else:
        v = ds.createVariable(name, "f4" if spec.dtype == "float32" else "f8", lead + tuple(spec.dims), **comp)
    _field_attrs(v, name, spec, None)
    return v


def _define_statistics(ds: Any, cfg: OutputConfig, name: str, comp: dict[str, Any]) -> None:
    """``NAME_mean`` and (with 2 members or more) ``NAME_spread`` of an ensemble field with
    ``diagnostics``; ``realization`` in ``cell_methods`` is the standard name of ``member``."""
    spec = cfg.fields[name]
    if not (spec.ensemble and cfg.diagnostics):
        return
    dims = ("time",) + tuple(spec.dims)
    v = ds.createVariable(f"{name}_mean", "f8", dims, **comp)
    _field_attrs(v, name, spec, "realization: mean", f" (ensemble mean of {cfg.members} members)")
    if cfg.members >= 2:
        v = ds.createVariable(f"{name}_spread", "f8", dims, **comp)
        _field_attrs(v, name, spec, "realization: standard_deviation",
                     f" (ensemble spread of {cfg.members} members, ddof=1)")


def _define_reduction(ds: Any, cfg: OutputConfig, name: str, red: str, size: int | None) -> None:
    """``NAME_RED``: user reduction ``red`` per time, a number (``size`` None) or ``size`` values."""
    dims: tuple[str, ...] = ("time",)
    if size is not None:
        ds.createDimension(f"{red}_n", size)
        dims = ("time", f"{red}_n")
    v = ds.createVariable(f"{name}_{red}", "f8", dims)
    _attrs(v, long_name=f"{red} of {name}" + (" (ensemble mean)" if cfg.fields[name].ensemble else ""),
           comment=f"user reduction {cfg.reductions[red]}")


def reduction_value(name: str, red: str, raw: Any) -> np.ndarray:
    """The value of reduction ``red`` as float64; raises ValueError unless a number or a 1-D array."""
    value = np.asarray(raw, dtype=np.float64)
    if value.ndim > 1:
        raise ValueError(f"reduction {red} of {name} returned an array of shape {value.shape}: a number or a 1-D array")
    return value


def define_series(path: Path, cfg: OutputConfig, name: str, coords: dict[str, np.ndarray],
                  reduction_sizes: dict[str, int | None]) -> None:
    """The growing file of field ``name`` at ``path``, with no record: CDF-5 (NetCDF-3 64-bit data,
    no compression), every variable of a time along the unlimited ``time``
    (:class:`enkflow.output.record_file.RecordFile` appends them)."""
    with netCDF4.Dataset(path, "w", format="NETCDF3_64BIT_DATA") as ds:
        _global(ds, cfg, f"{name}, one record per output time")
        _time_coord(ds, cfg)
        _define_field(ds, cfg, name, coords, None)
        _define_statistics(ds, cfg, name, {})
        for red, size in reduction_sizes.items():
            _define_reduction(ds, cfg, name, red, size)


class TimeFile:
    """The file of one field at one time, open under its temporary name while pieces arrive."""

    def __init__(self, tmp: Path, cfg: OutputConfig, name: str, t: float, coords: dict[str, np.ndarray]) -> None:
        self.cfg, self.name, self.spec = cfg, name, cfg.fields[name]
        self.ds = netCDF4.Dataset(tmp, "w", format="NETCDF4")
        try:
            _global(self.ds, cfg, f"{name} at time {t:g}")
            _time_coord(self.ds, cfg)[0] = t
            comp = _compression(cfg)
            self.var = _define_field(self.ds, cfg, name, coords, comp)
            _define_statistics(self.ds, cfg, name, comp)
        except BaseException:
            self.ds.close()
            raise

    def write(self, x: np.ndarray, member: int | None, region: tuple[slice, ...]) -> int:
        """Store one piece; returns the count of values outside pack_range (int16 only; then nothing is stored)."""
        if self.var is None:
            return 0
        key = (0, member - 1) + region if member is not None else (0,) + region
        if self.spec.dtype == "int16":
            codes, outside = pack(x, self.spec)
            if outside:
                return outside
            self.var[key] = codes
        else:
            self.var[key] = x
        return 0

    def diagnostics(self, mean: np.ndarray | None, spread: np.ndarray | None,
                    reductions: dict[str, np.ndarray]) -> None:
        ds = self.ds
        if mean is not None and f"{self.name}_mean" in ds.variables:
            ds[f"{self.name}_mean"][0] = mean
        if spread is not None and f"{self.name}_spread" in ds.variables:
            ds[f"{self.name}_spread"][0] = spread
        for red, raw in reductions.items():
            value = reduction_value(self.name, red, raw)
            _define_reduction(ds, self.cfg, self.name, red, value.size if value.ndim == 1 else None)
            ds[f"{self.name}_{red}"][0] = value

    def close(self) -> None:
        self.ds.close()


WINDOW_STATISTICS = ("mean", "min", "max")  # NAME_mean, NAME_min, NAME_max over a window


def _define_window(ds: Any, cfg: OutputConfig, name: str, window: str, length: float,
                   coords: dict[str, np.ndarray], comp: dict[str, Any]) -> None:
    spec = cfg.fields[name]
    what = " of the ensemble mean" if spec.ensemble else ""
    base = "realization: mean " if spec.ensemble else ""
    ds.setncatts({"window": window, "window_length": np.float64(length)})
    _time_coord(ds, cfg, bounds=True)
    _coordinates(ds, cfg, spec.dims, coords)
    dims = ("time",) + tuple(spec.dims)
    for suffix, method, label in zip(WINDOW_STATISTICS, ("mean", "minimum", "maximum"),
                                     ("time mean", "minimum", "maximum")):
        v = ds.createVariable(f"{name}_{suffix}", "f8", dims, **comp)
        _field_attrs(v, name, spec, f"{base}time: {method}", f" ({label}{what} over the {window} window)")


def write_window(tmp: Path, cfg: OutputConfig, name: str, window: str, start: float, length: float,
                 times: list[float], stats: tuple[np.ndarray, np.ndarray, np.ndarray],
                 coords: dict[str, np.ndarray], complete: bool) -> None:
    """The time mean, minimum and maximum (``stats``) of ``name`` over one window, as a CF file at ``tmp``."""
    with netCDF4.Dataset(tmp, "w", format="NETCDF4") as ds:
        _global(ds, cfg, f"{name} {window} window from {start:g}, {len(times)} times")
        _define_window(ds, cfg, name, window, length, coords, _compression(cfg))
        ds.setncatts({"number_of_times": np.int32(len(times)), "window_complete": np.int32(1 if complete else 0)})
        ds["time"][0] = start + length / 2.0
        ds["time_bnds"][0, :] = (start, start + length)
        for suffix, data in zip(WINDOW_STATISTICS, stats):
            ds[f"{name}_{suffix}"][0] = data


def define_window_series(path: Path, cfg: OutputConfig, name: str, window: str, length: float,
                         coords: dict[str, np.ndarray]) -> None:
    """The growing file of ``name``'s ``window`` statistics at ``path`` (CDF-5, no record; one record
    per window, ``time`` at its middle): what the one-window files hold as attributes is per record here."""
    with netCDF4.Dataset(path, "w", format="NETCDF3_64BIT_DATA") as ds:
        _global(ds, cfg, f"{name} {window} windows, one record per window")
        _define_window(ds, cfg, name, window, length, coords, {})
        v = ds.createVariable("number_of_times", "i4", ("time",))
        _attrs(v, long_name="number of output times in the window", units="1")
        v = ds.createVariable("window_complete", "i4", ("time",))
        _attrs(v, long_name="whether every time of the window was counted", flag_values=np.int32([0, 1]),
               flag_meanings="incomplete complete")
