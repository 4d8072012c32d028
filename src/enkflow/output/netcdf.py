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
    return {"compression": cfg.compression, "complevel": cfg.complevel}


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


def _time_coord(ds: Any, cfg: OutputConfig, t: float, bounds: tuple[float, float] | None = None) -> None:
    ds.createDimension("time", None)
    v = ds.createVariable("time", "f8", ("time",))
    _attrs(v, units=cfg.time_units, calendar=cfg.calendar, standard_name="time", axis="T")
    v[0] = t
    if bounds is not None:
        ds.createDimension("nv", 2)
        v.bounds = "time_bnds"
        b = ds.createVariable("time_bnds", "f8", ("time", "nv"))
        b[0, :] = bounds


def _global(ds: Any, cfg: OutputConfig, what: str) -> None:
    ds.setncatts({"Conventions": "CF-1.8", "title": cfg.title, "source": "enkflow", "institution": "enkflow user",
                  "history": _history(what)})


def _field_attrs(var: Any, name: str, spec: FieldSpec, cell_methods: str | None, what: str = "") -> None:
    long_name = spec.long_name or name.replace("_", " ")
    _attrs(var, units=spec.units, standard_name=spec.standard_name,
           long_name=f"{long_name}{what}", cell_methods=cell_methods)


def _realization(ds: Any, n: int) -> None:
    """The scalar coordinate that ``cell_methods = "realization: ..."`` names (CF 7.3: the reduced member axis)."""
    v = ds.createVariable("realization", "i4", ())
    _attrs(v, standard_name="realization", long_name="number of ensemble members reduced", units="1")
    v.assignValue(n)


class TimeFile:
    """The file of one field at one time, open under its temporary name while pieces arrive."""

    def __init__(self, tmp: Path, cfg: OutputConfig, name: str, t: float, coords: dict[str, np.ndarray]) -> None:
        self.cfg, self.name, self.spec = cfg, name, cfg.fields[name]
        self.ds = netCDF4.Dataset(tmp, "w", format="NETCDF4")
        try:
            ds = self.ds
            _global(ds, cfg, f"{name} at time {t:g}")
            _time_coord(ds, cfg, t)
            _coordinates(ds, cfg, self.spec.dims, coords)
            shape = cfg.shape(name)
            if self.spec.ensemble:
                ds.createDimension("member", cfg.members)
                m = ds.createVariable("member", "i4", ("member",))
                _attrs(m, long_name="ensemble member", standard_name="realization", units="1")
                m[:] = np.arange(1, cfg.members + 1, dtype=np.int32)
            self.var = None
            if cfg.write_members:
                lead = ("time", "member") if self.spec.ensemble else ("time",)
                chunks = (1,) * len(lead) + shape
                comp = _compression(cfg)
                if self.spec.dtype == "int16":
                    scale, offset, err = packing(self.spec)
                    v = ds.createVariable(name, "i2", lead + tuple(self.spec.dims), fill_value=INT16_FILL,
                                          chunksizes=chunks, **comp)
                    v.set_auto_maskandscale(False)
                    _attrs(v, scale_factor=np.float64(scale), add_offset=np.float64(offset),
                           packing_error_bound=np.float64(err),
                           comment="16-bit packing: |unpacked - original| <= packing_error_bound",
                           valid_min=np.int16(-32767), valid_max=np.int16(32767))
                else:
                    v = ds.createVariable(name, "f4" if self.spec.dtype == "float32" else "f8",
                                          lead + tuple(self.spec.dims), chunksizes=chunks, **comp)
                _field_attrs(v, name, self.spec, None)
                self.var = v
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
        ds, dims = self.ds, ("time",) + tuple(self.spec.dims)
        comp = _compression(self.cfg)
        if mean is not None:
            _realization(ds, self.cfg.members)
            v = ds.createVariable(f"{self.name}_mean", "f8", dims, **comp)
            _field_attrs(v, self.name, self.spec, "realization: mean", " (ensemble mean)")
            v.coordinates = "realization"
            v[0] = mean
        if spread is not None:
            v = ds.createVariable(f"{self.name}_spread", "f8", dims, **comp)
            _field_attrs(v, self.name, self.spec, "realization: standard_deviation", " (ensemble spread, ddof=1)")
            v.coordinates = "realization"
            v[0] = spread
        for red, raw in reductions.items():
            value = np.asarray(raw, dtype=np.float64)
            if value.ndim > 1:
                raise ValueError(f"reduction {red} returned an array of shape {value.shape}: a number or a 1-D array")
            rdims: tuple[str, ...] = ("time",)
            if value.ndim == 1:
                ds.createDimension(f"{red}_n", value.size)
                rdims = ("time", f"{red}_n")
            v = ds.createVariable(f"{self.name}_{red}", "f8", rdims)
            _attrs(v, long_name=f"{red} of {self.name}" + (" (ensemble mean)" if self.spec.ensemble else ""),
                   comment=f"user reduction {self.cfg.reductions[red]}")
            v[0] = value

    def close(self) -> None:
        self.ds.close()


def write_window(tmp: Path, cfg: OutputConfig, name: str, window: str, start: float, length: float,
                 times: list[float], mean: np.ndarray, minimum: np.ndarray, maximum: np.ndarray,
                 coords: dict[str, np.ndarray], complete: bool) -> None:
    """The time mean, minimum and maximum of ``name`` over one window, as a CF file at ``tmp``."""
    spec = cfg.fields[name]
    what = " of the ensemble mean" if spec.ensemble else ""
    base = "realization: mean " if spec.ensemble else ""
    with netCDF4.Dataset(tmp, "w", format="NETCDF4") as ds:
        _global(ds, cfg, f"{name} {window} window from {start:g}, {len(times)} times")
        ds.setncatts({"window": window, "window_length": np.float64(length), "number_of_times": np.int32(len(times)),
                      "window_complete": np.int32(1 if complete else 0)})
        _time_coord(ds, cfg, start + length / 2.0, (start, start + length))
        _coordinates(ds, cfg, spec.dims, coords)
        dims = ("time",) + tuple(spec.dims)
        comp = _compression(cfg)
        if spec.ensemble:
            _realization(ds, cfg.members)
        for suffix, data, method, label in (("mean", mean, "mean", "time mean"), ("min", minimum, "minimum", "minimum"),
                                            ("max", maximum, "maximum", "maximum")):
            v = ds.createVariable(f"{name}_{suffix}", "f8", dims, **comp)
            _field_attrs(v, name, spec, f"{base}time: {method}", f" ({label}{what} over the {window} window)")
            if spec.ensemble:
                v.coordinates = "realization"
            v[0] = data
