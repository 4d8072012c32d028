"""One cycle driver for every mode, written against four small interfaces.

A data-assimilation cycle is: advance every member (``Propagator``), gather the
forecast ensemble as this rank's row block (``EnsembleStore``), apply H and
assimilate the cycle's observations (``ObservationSpace`` and a filter), scatter
the analysis back and hand it to the output (``OutputSink``)::

    for k in cycles:                # run_cycles(cycles, propagator, analysis, on_cycle_end=...)
        propagator.forecast(k)
        diag = analysis(k)          # analyse(store, obs, filter, k, ...) where it runs in-process
        on_cycle_end(k, diag)       # scores, bookkeeping

Offline files with the job scheme (:mod:`enkflow.experiment.driver`), online
server and runners (:mod:`enkflow.online`) and in-process Lorenz-96
(:mod:`enkflow.models.l96_experiment`) implement these interfaces; the analysis
itself is the one function :func:`analyse` (after JEDI/OOPS
``LocalEnsembleDA::execute``: the algorithm reads the same whatever stores the
ensemble or runs the model).

The in-memory :class:`ArrayStore` serves Lorenz-96, the online server and tests;
:class:`enkflow.experiment.file_store.FileStore` the member restart files.

Shapes: ``X`` is the ensemble of this rank's rows, (n_local_rows, N),
Fortran order (one member contiguous), float64; ``HX`` is (n_obs, N) and the
same on every rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from enkflow.analysis import LESTKF, LETKF, Filter, Geometry, LocalDomains
from enkflow.errors import InputError
from enkflow.obs import ObsSet
from enkflow.parallel import Comm, SerialComm


@runtime_checkable
class EnsembleStore(Protocol):
    """Where the ensemble lives between cycles, seen by one rank of ``comm``.

    This rank owns the state rows ``row_start:row_stop`` of ``n_rows``.
    """

    comm: Comm
    n_rows: int
    n_members: int
    row_start: int
    row_stop: int

    def gather(self, cycle: int) -> np.ndarray:
        """The forecast ensemble of this rank's rows, (row_stop - row_start, N), float64, Fortran order.
        The caller may overwrite it (the analysis is computed in place where it can)."""
        ...

    def scatter(self, cycle: int, Xa: np.ndarray) -> None:
        """Store the analysis ``Xa`` (same shape as :meth:`gather`'s) as the next cycle's initial ensemble."""
        ...


@runtime_checkable
class Propagator(Protocol):
    """Advances every member of the ensemble by one cycle's forecast length."""

    def forecast(self, cycle: int) -> None: ...


@runtime_checkable
class ObservationSpace(Protocol):
    """The observations of a cycle and the operator H, applied rank-locally."""

    def observations(self, cycle: int) -> ObsSet:
        """``y`` (n_obs,), the error variances and the observation coordinates."""
        ...

    def apply(self, cycle: int, X: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        """``H X``, (n_obs, N), from this rank's rows ``X`` (n_local_rows, N) starting at ``row_start``;
        collective: every rank returns the full product."""
        ...

    def apply_mean(self, cycle: int, x: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        """``H x`` (n_obs,) of one state's rows ``x`` (n_local_rows,), e.g. the analysis mean; collective.
        Where H(x) came from an external operator stage run on the forecasts, this is the
        state-row selection of the observations."""
        ...


@runtime_checkable
class OutputSink(Protocol):
    """Receives each cycle's analysis (rank-local rows) and its diagnostics."""

    def write(self, cycle: int, Xa: np.ndarray, row_start: int, diagnostics: dict[str, float]) -> None: ...


class ArrayStore:
    """An :class:`EnsembleStore` in memory: this rank's rows ``X`` (n_local_rows, N), starting at
    state row ``row_start`` of ``n_rows`` (default: the rows of every rank, summed over ``comm``,
    which makes the constructor collective; ``comm`` defaults to a :class:`SerialComm`).

    :meth:`gather` hands out the held array itself, no copy (an in-place analysis overwrites
    it); :meth:`scatter` keeps the array it is given. A propagator may replace ``X``.
    """

    def __init__(self, X: np.ndarray, *, comm: Comm | None = None, row_start: int = 0, n_rows: int | None = None):
        self.X = np.asfortranarray(X, dtype=np.float64)
        if self.X.ndim != 2:
            raise InputError(f"the ensemble must be (n_rows, N), got shape {self.X.shape}", item="X")
        self.comm = comm or SerialComm()
        self.n_members = self.X.shape[1]
        self.row_start = row_start
        self.row_stop = row_start + self.X.shape[0]
        if n_rows is None:
            n_rows = int(self.comm.allreduce_sum(np.array([self.X.shape[0]]))[0])
        self.n_rows = n_rows

    def gather(self, cycle: int) -> np.ndarray:
        return self.X

    def scatter(self, cycle: int, Xa: np.ndarray) -> None:
        if Xa.shape != (self.row_stop - self.row_start, self.n_members):
            raise InputError(f"the analysis has shape {Xa.shape}, the store holds {self.X.shape}", item="Xa")
        self.X = Xa


class NoOutput:
    """An output sink that keeps nothing."""

    def write(self, cycle: int, Xa: np.ndarray, row_start: int, diagnostics: dict[str, float]) -> None:
        return None


@dataclass(frozen=True)
class LocalGeometry:
    """What a local filter needs of the state rows of this rank: its domains and, optionally,
    the geometry of every row (None: the domains carry their own coordinates)."""

    domains: LocalDomains
    geometry: Geometry | None = None

    def kwargs(self) -> dict:
        kw: dict = {"domains": self.domains}
        if self.geometry is not None:
            kw["geometry"] = self.geometry
        return kw


def analyse(
    store: EnsembleStore,
    obs: ObservationSpace,
    flt: Filter,
    cycle: int,
    *,
    local: LocalGeometry | None = None,
    truth: np.ndarray | None = None,
    before_update: Callable[[np.ndarray, dict[str, float]], None] | None = None,
) -> tuple[np.ndarray, dict[str, float]]:
    """The analysis of ``cycle``: gather, apply H, assimilate, scatter. Collective over ``store.comm``.

    ``local`` gives the local filters their domains (this rank's rows); ``truth``
    (n_rows,) adds ``rmse_prior``/``rmse_analysis``; ``before_update(Xa, diag)``
    runs between the assimilation and the scatter (offline mode hands the
    diagnostics to the completion record that commits with the update there).
    Returns the analysis of this rank's rows and the diagnostics: ``n_obs``,
    ``omb_rms``, ``oma_rms`` (observation minus background / analysis mean), the
    local filters' ``mean_local_obs`` / ``search_s`` / ``kernel_s``, and
    ``analysis_s`` (seconds).
    """
    comm = store.comm
    X = store.gather(cycle)
    t0 = time.perf_counter()
    y = obs.observations(cycle)
    HX = obs.apply(cycle, X, store.row_start, comm)
    omb = float(np.sqrt(np.mean((y.values - HX.mean(axis=1)) ** 2))) if y.n_obs else 0.0
    prior_mean = X.mean(axis=1) if truth is not None else None
    kw: dict = {}
    if local is not None:
        kw = {**local.kwargs(), "out": X}
    Xa = flt.analyze(X, HX, y, cycle=cycle, **kw)
    hxa = obs.apply_mean(cycle, np.ascontiguousarray(Xa.mean(axis=1)), store.row_start, comm)
    oma = float(np.sqrt(np.mean((y.values - hxa) ** 2))) if y.n_obs else 0.0
    diag: dict[str, float] = {"n_obs": float(y.n_obs), "omb_rms": omb, "oma_rms": oma}
    if isinstance(flt, (LETKF, LESTKF)):
        diag.update(mean_local_obs=flt.stats.mean_local_obs, search_s=flt.stats.search_s, kernel_s=flt.stats.kernel_s)
    if truth is not None:
        tl = truth[store.row_start:store.row_stop]
        sq = comm.allreduce_sum(np.array([np.sum((prior_mean - tl) ** 2), np.sum((Xa.mean(axis=1) - tl) ** 2)]))
        diag["rmse_prior"] = float(np.sqrt(sq[0] / store.n_rows))
        diag["rmse_analysis"] = float(np.sqrt(sq[1] / store.n_rows))
    diag["analysis_s"] = time.perf_counter() - t0
    Xa = np.asfortranarray(Xa)
    if before_update is not None:
        before_update(Xa, diag)
    store.scatter(cycle, Xa)
    return Xa, diag


def run_cycles(
    cycles: Iterable[int],
    propagator: Propagator,
    analysis: Callable[[int], dict[str, float]],
    *,
    on_cycle_end: Callable[[int, dict[str, float]], None] | None = None,
) -> list[int]:
    """The cycle loop: forecast, analysis, end-of-cycle hook; returns the cycles run.

    ``analysis(k)`` is :func:`analyse` bound to a store, observation space and
    filter where the analysis runs in this process (online, Lorenz-96), or the
    offline job scheme's analysis task, which calls the same :func:`analyse` in
    its own (MPI) process.
    """
    done = []
    for k in cycles:
        propagator.forecast(k)
        diag = analysis(k)
        if on_cycle_end is not None:
            on_cycle_end(k, diag)
        done.append(k)
    return done
