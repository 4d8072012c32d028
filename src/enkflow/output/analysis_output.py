"""The analysis's per-cycle statistics through the asynchronous output server.

Each cycle, :func:`enkflow.experiment.cycling.analyse` hands every rank's rows of
the forecast mean, the analysis mean and spread, and the analysis increment to
:class:`AnalysisOutput` (a :class:`~enkflow.experiment.cycling.StatsSink`), which
adds them as regions of the output server's fields (:class:`enkflow.output.Output`)
and returns at once: the writer process assembles the ranks' rows and writes the
CF NetCDF files while the analysis goes on (updating the restarts, or, online,
the next forecast). Nothing is gathered across ranks.

Files (one per statistic, state variable and cycle), under the experiment's cycle directories::

    EXPDIR/cycles/NNNN/soil_moisture_forecast_mean.nc      (time = cycle number, then the variable's dimensions)
    EXPDIR/cycles/NNNN/soil_moisture_forecast_spread.nc    (standard deviation, ddof = 1)
    EXPDIR/cycles/NNNN/soil_moisture_analysis_mean.nc
    EXPDIR/cycles/NNNN/soil_moisture_analysis_spread.nc
    EXPDIR/cycles/NNNN/soil_moisture_analysis_increment.nc (analysis minus forecast mean)

float64 in the state's own layout: the variable's dimensions as the restart template has them (a leading
``time`` or ``member`` dimension of size 1 left out: the file's own ``time`` is the cycle), their coordinate
variables where the template has one-dimensional ones, units from the restart; points the state's mask
leaves out are NaN (missing to xarray). A rank adds the elements from its first row's up to the next rank's
first row's, masked ones as NaN, as hyper-rectangular regions of the variable, so the ranks together cover
every element once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np

from enkflow.errors import EnkflowError
from enkflow.output.client import Output
from enkflow.output.config import DimSpec, FieldSpec, OutputConfig
from enkflow.output.remote import RemoteOutput
from enkflow.state import StateLayout
from enkflow.state.layout import StateVariable

_RESERVED = ("time", "member")  # the statistics files' own dimensions

STATS = ("forecast_mean", "forecast_spread", "analysis_mean", "analysis_spread", "analysis_increment")
_WHAT = {"forecast_mean": "forecast ensemble mean", "forecast_spread": "forecast ensemble spread (standard deviation)",
         "analysis_mean": "analysis ensemble mean",
         "analysis_spread": "analysis ensemble spread (standard deviation)",
         "analysis_increment": "analysis increment (analysis minus forecast ensemble mean)"}


def service_dir(expdir: str | os.PathLike[str]) -> Path:
    """Where an offline study's output service keeps its ``address`` and ``token`` files."""
    return Path(expdir) / "output_service"


def field_name(variable: str, stat: str) -> str:
    return f"{variable}_{stat}"


def _template_attrs(layout: StateLayout) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    with netCDF4.Dataset(layout.template) as ds:
        for v in layout.variables:
            var = ds.variables[v.name]
            out[v.name] = {k: str(var.getncattr(k)) for k in ("units", "long_name") if k in var.ncattrs()}
    return out


@dataclass(frozen=True)
class _Grid:
    """The statistics files' dimensions: per state variable its output dimensions (``dims``) and shape
    (``shape``), every dimension's :class:`DimSpec` (``specs``) and the values of the template's
    one-dimensional coordinate variables (``coords``)."""

    dims: dict[str, list[str]]
    shape: dict[str, tuple[int, ...]]
    specs: dict[str, DimSpec]
    coords: dict[str, list[float]]


def _grid(layout: StateLayout) -> _Grid:
    dims: dict[str, list[str]] = {}
    shape: dict[str, tuple[int, ...]] = {}
    specs: dict[str, DimSpec] = {}
    coords: dict[str, list[float]] = {}
    with netCDF4.Dataset(layout.template) as ds:
        for v in layout.variables:
            kept = [(d, n) for d, n in zip(v.dims, v.shape) if not (d in _RESERVED and n == 1)] or [(f"{v.name}_points", 1)]
            dims[v.name], shape[v.name] = [], tuple(n for _, n in kept)
            for d, n in kept:
                out = d if d not in _RESERVED and (d not in specs or specs[d].size == n) else f"{v.name}_{d}"
                dims[v.name].append(out)
                if out in specs:
                    continue
                cv = ds.variables.get(d)
                one_d = cv is not None and cv.dimensions == (d,) and np.issubdtype(cv.dtype, np.number)
                a = {k: str(cv.getncattr(k)) for k in ("units", "standard_name", "long_name", "axis")
                     if one_d and k in cv.ncattrs()}
                specs[out] = DimSpec(size=n, units=a.get("units"), standard_name=a.get("standard_name"),
                                     long_name=a.get("long_name", f"dimension {d} of {v.name}"),
                                     axis=a.get("axis") if a.get("axis") in ("X", "Y", "Z") else None)
                if one_d:
                    coords[out] = np.asarray(cv[:], dtype=np.float64).tolist()
    return _Grid(dims, shape, specs, coords)


def output_config(layout: StateLayout, directory: str | os.PathLike[str], *, compression: str = "zlib",
                  complevel: int = 1, writer_timeout: float = 60.0, tcp_bind: str | None = None) -> OutputConfig:
    """The output server's configuration of the analysis statistics of ``layout``'s variables
    (the keyword arguments: ``[analysis_output]``'s, :meth:`AnalysisOutputSection.writer_settings`;
    ``tcp_bind``: ranks on other nodes add to the writer, over TCP (CURVE) on this interface or address).
    Its coordinate values: :func:`statistics_coords`."""
    attrs = _template_attrs(layout)
    grid = _grid(layout)
    fields: dict[str, FieldSpec] = {}
    for v in layout.variables:
        a = attrs[v.name]
        for stat in STATS:
            fields[field_name(v.name, stat)] = FieldSpec(
                dims=grid.dims[v.name], units=a.get("units"), ensemble=False, dtype="float64",
                long_name=f"{a.get('long_name', v.name)}: {_WHAT[stat]}")
    n_bytes = 8 * sum(v.n_elems for v in layout.variables) * len(STATS)
    masked = any(v.index is not None for v in layout.variables)
    return OutputConfig(
        directory=str(directory), file="{time:04g}/{field}.nc", dims=grid.specs, fields=fields, diagnostics=False,
        writers=1, buffer_mb=max(64.0, 2.0 * n_bytes / 2**20), compression=compression, complevel=complevel,
        # The masked points are NaN by design; without a mask a NaN is the analysis's and is warned about.
        nan="allow" if masked else "warn", time_units="1", title="enkflow analysis statistics (time: the cycle number)",
        writer_timeout=writer_timeout, **({"transport": "tcp", "bind": tcp_bind} if tcp_bind is not None else {}))


def statistics_coords(layout: StateLayout) -> dict[str, list[float]]:
    """The coordinate values of the statistics files' dimensions (``Output(coords=...)``)."""
    return _grid(layout).coords


def flat_blocks(lo: int, hi: int, shape: tuple[int, ...]) -> Iterator[tuple[tuple[slice, ...], int, int]]:
    """The C-order elements ``[lo, hi)`` of an array of ``shape`` as hyper-rectangles, in order:
    ``(region, offset, size)``, ``offset`` counted from ``lo`` (at most 2 len(shape) - 1 of them)."""
    if lo >= hi:
        return
    if len(shape) == 1:
        yield (slice(lo, hi),), 0, hi - lo
        return
    inner = int(np.prod(shape[1:], dtype=np.int64))
    full = tuple(slice(0, n) for n in shape[1:])
    i0, r0 = divmod(lo, inner)
    i1, r1 = divmod(hi, inner)
    if i0 == i1:
        for reg, off, n in flat_blocks(r0, r1, shape[1:]):
            yield (slice(i0, i0 + 1), *reg), off, n
        return
    pos = 0
    if r0:
        for reg, off, n in flat_blocks(r0, inner, shape[1:]):
            yield (slice(i0, i0 + 1), *reg), off, n
        pos, i0 = inner - r0, i0 + 1
    if i1 > i0:
        yield (slice(i0, i1), *full), pos, (i1 - i0) * inner
        pos += (i1 - i0) * inner
    if r1:
        for reg, off, n in flat_blocks(0, r1, shape[1:]):
            yield (slice(i1, i1 + 1), *reg), pos + off, n


class AnalysisOutput:
    """A :class:`~enkflow.experiment.cycling.StatsSink` writing through :class:`enkflow.output.Output`.

    Collective construction and :meth:`close` over ``comm`` (rank 0 starts the writer);
    :meth:`add` is rank-local and returns at once. ``directory``: the experiment's
    ``cycles`` directory (files go to ``NNNN/`` below it)."""

    def __init__(self, layout: StateLayout, directory: str | os.PathLike[str], comm=None, *, remote=None,
                 **settings: Any):
        self.layout = layout
        self.cfg = output_config(layout, Path(directory), **settings)
        self.grid = _grid(layout)
        self.remote = remote is not None
        if remote is not None:
            self.out = remote
        else:
            self.out = Output(self.cfg, comm=comm, coords=self.grid.coords)
        self.add_s = 0.0

    @classmethod
    def through_service(cls, layout: StateLayout, directory: str | os.PathLike[str], service: str | os.PathLike[str],
                        cycle: int, comm=None, **settings: Any) -> "AnalysisOutput | None":
        """Every rank a client of the study's output service (:mod:`enkflow.output.service`) whose
        ``address`` and ``token`` are in ``service``, after rank 0 discarded what an earlier attempt
        of ``cycle`` added (collective). None on every rank when rank 0 finds no such service, or
        one serving other fields (the caller then starts its own writer)."""
        want = output_config(layout, Path(directory), **settings)
        remote, why = None, ""
        if comm is None or comm.rank == 0:
            try:
                remote = RemoteOutput.from_dir(service, timeout=10.0)
                if not _same_fields(remote.cfg, want):
                    why = f"the output service in {service} serves other fields"
                else:
                    remote.discard(float(cycle))  # a rerun's pieces replace the earlier attempt's
            except (EnkflowError, OSError) as exc:
                why = f"no output service: {exc}"
            if why and remote is not None:
                remote.close(wait=False)
                remote = None
        if comm is not None:
            why = comm.bcast(why, root=0)
        if why:
            logging.getLogger("enkflow.output").info("analysis statistics: %s; starting this task's own writer", why)
            return None
        if comm is not None:
            comm.barrier()  # the discard is done before any rank adds
            if comm.rank != 0:
                remote = RemoteOutput.from_dir(service, timeout=30.0)
        return cls(layout, directory, comm, remote=remote, **settings)

    def add(self, cycle: int, row_start: int, rows: dict[str, np.ndarray]) -> None:
        """This rank's rows ``row_start:`` of some of the statistics (any of :data:`STATS`)."""
        t0 = time.perf_counter()
        for stat, x in rows.items():
            x = np.asarray(x, dtype=np.float64)
            for p in self.layout.pieces(row_start, row_start + x.shape[0]):
                v = p.var
                lo, chunk = _elements(v, p.row_start - v.row0, p.row_stop - v.row0,
                                      x[p.row_start - row_start:p.row_stop - row_start])
                shape = self.grid.shape[v.name]
                for region, off, n in flat_blocks(lo, lo + chunk.size, shape):
                    block = tuple(r.stop - r.start for r in region)
                    self.out.add(field_name(v.name, stat), chunk[off:off + n].reshape(block), float(cycle), region=region)
        self.add_s += time.perf_counter() - t0

    def sync(self) -> None:
        self.out.sync()

    def stats(self) -> dict:
        return self.out.stats()

    def close(self) -> None:
        """Wait until everything added is written and stop the writer (collective). Through the
        service: only until the service has received this rank's adds (it writes them later)."""
        if self.remote:
            self.out.close(wait=False)
        else:
            self.out.close()

    def abandon(self) -> None:
        """After an error on this rank: stop the writer without the collective close (what it had
        not written is lost; no file is left under its final name half-written). Through the
        service: disconnect; the next attempt of the cycle discards what this one added."""
        out, self.out = self.out, None
        del out  # Output's finalizer kills its writers and removes its runtime directory


def _same_fields(a: OutputConfig, b: OutputConfig) -> bool:
    """Whether the service's configuration ``a`` writes what ``b`` asks for, where ``b`` asks for it."""
    keys = ("dims", "fields", "file", "compression", "complevel", "nan", "time_units")
    da, db = a.model_dump(mode="json"), b.model_dump(mode="json")
    return all(da[k] == db[k] for k in keys) and Path(a.directory).resolve() == Path(b.directory).resolve()


def _elements(v: StateVariable, r0: int, r1: int, x: np.ndarray) -> tuple[int, np.ndarray]:
    """The elements a rank adds for its local rows ``[r0, r1)`` of ``v`` with values ``x``: from its first
    row's element up to the next rows' first element (the variable's first and last rows: its first and
    last elements), masked elements NaN. Returns the first element and the values."""
    if v.index is None:
        return r0, x
    lo = 0 if r0 == 0 else int(v.index[r0])
    hi = v.n_elems if r1 == v.n_rows else int(v.index[r1])
    chunk = np.full(hi - lo, np.nan)
    chunk[v.index[r0:r1] - lo] = x
    return lo, chunk
