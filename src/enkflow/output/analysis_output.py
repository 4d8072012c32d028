"""The analysis's per-cycle statistics through the asynchronous output server.

Each cycle, :func:`enkflow.experiment.cycling.analyse` hands every rank's rows of
the forecast mean, the analysis mean and spread, and the analysis increment to
:class:`AnalysisOutput` (a :class:`~enkflow.experiment.cycling.StatsSink`), which
adds them as regions of the output server's fields (:class:`enkflow.output.Output`)
and returns at once: the writer process assembles the ranks' rows and writes the
CF NetCDF files while the analysis goes on (updating the restarts, or, online,
the next forecast). Nothing is gathered across ranks.

Files (one per statistic, state variable and cycle), under the experiment's cycle directories::

    EXPDIR/cycles/NNNN/soil_moisture_forecast_mean.nc      (time = cycle number, the variable's points)
    EXPDIR/cycles/NNNN/soil_moisture_analysis_mean.nc
    EXPDIR/cycles/NNNN/soil_moisture_analysis_spread.nc    (standard deviation, ddof = 1)
    EXPDIR/cycles/NNNN/soil_moisture_analysis_increment.nc (analysis minus forecast mean)

float64, the values the state rows hold (a masked variable: its unmasked points, in the
layout's order; a variable of several dimensions: flattened in C order), units from the restart.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np

from enkflow.errors import EnkflowError
from enkflow.output.client import Output
from enkflow.output.config import DimSpec, FieldSpec, OutputConfig
from enkflow.output.remote import RemoteOutput
from enkflow.state import StateLayout

STATS = ("forecast_mean", "analysis_mean", "analysis_spread", "analysis_increment")
_WHAT = {"forecast_mean": "forecast ensemble mean", "analysis_mean": "analysis ensemble mean",
         "analysis_spread": "analysis ensemble spread (standard deviation)",
         "analysis_increment": "analysis increment (analysis minus forecast ensemble mean)"}
_CELL = {"forecast_mean": "member: mean", "analysis_mean": "member: mean", "analysis_spread": "member: standard_deviation",
         "analysis_increment": "member: mean"}


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


def output_config(layout: StateLayout, directory: str | os.PathLike[str], *, compression: str = "zlib",
                  complevel: int = 1, writer_timeout: float = 60.0, tcp_bind: str | None = None) -> OutputConfig:
    """The output server's configuration of the analysis statistics of ``layout``'s variables
    (the keyword arguments: ``[analysis_output]``'s, :meth:`AnalysisOutputSection.writer_settings`;
    ``tcp_bind``: ranks on other nodes add to the writer, over TCP (CURVE) on this interface or address)."""
    attrs = _template_attrs(layout)
    dims: dict[str, DimSpec] = {}
    fields: dict[str, FieldSpec] = {}
    for v in layout.variables:
        dim = v.dims[0] if v.index is None and len(v.dims) == 1 else f"{v.name}_points"
        if dim in dims and dims[dim].size != v.n_rows or dim in ("time", "member"):
            dim = f"{v.name}_points"
        dims[dim] = DimSpec(size=v.n_rows, long_name=f"points of {v.name} in the state")
        a = attrs[v.name]
        for stat in STATS:
            fields[field_name(v.name, stat)] = FieldSpec(
                dims=[dim], units=a.get("units"), ensemble=False, dtype="float64",
                long_name=f"{a.get('long_name', v.name)}: {_WHAT[stat]}")
    n_bytes = 8 * layout.n_rows * len(STATS)
    return OutputConfig(
        directory=str(directory), file="{time:04g}/{field}.nc", dims=dims, fields=fields, diagnostics=False,
        writers=1, buffer_mb=max(64.0, 2.0 * n_bytes / 2**20), compression=compression, complevel=complevel,
        nan="warn", time_units="1", title="enkflow analysis statistics (time: the cycle number)",
        writer_timeout=writer_timeout, **({"transport": "tcp", "bind": tcp_bind} if tcp_bind is not None else {}))


class AnalysisOutput:
    """A :class:`~enkflow.experiment.cycling.StatsSink` writing through :class:`enkflow.output.Output`.

    Collective construction and :meth:`close` over ``comm`` (rank 0 starts the writer);
    :meth:`add` is rank-local and returns at once. ``directory``: the experiment's
    ``cycles`` directory (files go to ``NNNN/`` below it)."""

    def __init__(self, layout: StateLayout, directory: str | os.PathLike[str], comm=None, *, remote=None,
                 **settings: Any):
        self.layout = layout
        self.cfg = output_config(layout, Path(directory), **settings)
        self.remote = remote is not None
        if remote is not None:
            self.out = remote
        else:
            self.out = Output(self.cfg, comm=comm)
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
                lo = p.row_start - p.var.rows.start
                self.out.add(field_name(p.var.name, stat), x[p.row_start - row_start:p.row_stop - row_start],
                             float(cycle), region=(slice(lo, lo + p.n_rows),))
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
