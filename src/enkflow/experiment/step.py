"""One analysis step for every mode: what it is made of, the one factory, and the algorithm.

:func:`build_step` makes the :class:`AnalysisStep` of an ``[analysis]`` configuration once
(after JEDI/OOPS's ``LocalEnsembleSolverFactory``): the filter, a local filter's geometry and
decomposition over the ranks, the adaptive inflation field's carrier and the sinks. The offline
analysis task (:mod:`enkflow.experiment.analysis_step`), the online server
(:mod:`enkflow.online.experiment`) and Lorenz-96 in process and online
(:mod:`enkflow.apps.l96`, :mod:`enkflow.apps.l96_online`) all call it, and all run
:func:`analyse`, which reads as the algorithm (after OOPS's ``LocalEnsembleDA::execute``)::

    X = store.gather(k)                      # this rank's rows of the forecast ensemble
    y, HX = observations, H X                # whole on every rank, or each rank its own (distributed)
    y, HX = quality control(y, HX)           # each observation's verdict the same on every rank
    Xa = filter(X, HX, y)                    # global, or local over the ranks' domains
    diagnostics, obs_diag.nc, inflation field
    store.scatter(k, Xa, record)             # the member files commit the record with the update
    statistics, mean and spread              # the sinks

Shapes: ``X`` (n_local_rows, N) float64 Fortran order, ``HX`` (n_obs, N) the same on every rank where the
observations are replicated (:mod:`enkflow.experiment.obs_replicated`); distributed by locality
(:mod:`enkflow.experiment.obs_distributed`), (n_own, N) on each rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from enkflow.analysis import Filter
from enkflow.analysis.factory import make_filter
from enkflow.config import AnalysisConfig, LocalizationConfig, ObsLayout
from enkflow.errors import InputError
from enkflow.experiment.cycle_diagnostics import CycleDiagnostics, InflationSummary, LocalFilterStats
from enkflow.experiment.cycling import EnsembleStore, NoOutput, ObservationSpace, OutputSink, StatsSink
from enkflow.experiment.decomposition import LocalGeometry
from enkflow.experiment.obs_distributed import DistributedObs, distributes
from enkflow.experiment.obs_replicated import ReplicatedObs
from enkflow.experiment.inflation import InflationCarrier
from enkflow.io.meanspread import ensemble_mean_spread
from enkflow.obs.diagnostics import ObsDiagnosticsWriter
from enkflow.obs.vertical import localization_coords
from enkflow.parallel import Comm
from enkflow.state import StateLayout


class TruthRows(Protocol):
    """A truth's state rows, sliced by row range (``t[r0:r1]``, (r1 - r0,) float64): the whole state in memory
    (an ndarray) or a file read on demand (:class:`~enkflow.experiment.verification.TruthFile`), of which a rank
    reads only its own rows."""

    def __getitem__(self, rows: slice, /) -> np.ndarray: ...


def _no_truth(cycle: int) -> TruthRows | None:
    return None


@dataclass
class AnalysisStep:
    """One cycle's analysis, everything but the ensemble and the observations.

    ``filter``; ``local``: a local filter's domains and their decomposition over the ranks (None
    for a global filter); ``inflation``: the adaptive inflation field's carrier (a filter with
    ``adaptive``); the sinks ``obs_diag`` (each cycle's ``obs_diag.nc``), ``stats`` (the ensemble
    statistics of each rank's rows) and ``output`` (the analysis: mean and spread files, scores);
    ``truth(cycle)`` (the state's rows, sliced by each rank to its own) for the RMSE diagnostics, or None.
    The serial filter's ``local`` holds
    the coordinates of every row (its rows need no domains)."""

    filter: Filter
    local: LocalGeometry | None = None
    inflation: InflationCarrier | None = None
    obs_diag: ObsDiagnosticsWriter | None = None
    stats: StatsSink | None = None
    output: OutputSink = field(default_factory=NoOutput)
    truth: Callable[[int], TruthRows | None] = _no_truth
    obs_layout: ObsLayout = ObsLayout.REPLICATED
    obs_windows: int = 1

    def __post_init__(self) -> None:
        if (self.filter.as_local() is None and self.filter.as_serial() is None) != (self.local is None):
            raise InputError("a local or the serial filter needs its LocalGeometry, a global filter none", item="local")


@dataclass(frozen=True)
class StateRows:
    """The state rows as the factory needs them: ``n_rows``, and either the ``layout`` of the
    restart files (local domains by location, the work balanced over the ranks, coordinates in
    the inflation field's files) or the fixed domains and geometry of a local filter (``local``)."""

    n_rows: int
    layout: StateLayout | None = None
    local: LocalGeometry | None = None

    @classmethod
    def of_layout(cls, layout: StateLayout) -> "StateRows":
        return cls(layout.n_rows, layout=layout)

    @property
    def coords(self) -> np.ndarray | None:
        return self.layout.coords if self.layout is not None else None

    def local_geometry(self, localization: LocalizationConfig | None, balance: bool) -> LocalGeometry:
        if self.local is not None:
            return self.local
        if self.layout is None:
            raise InputError("a local filter needs the state's layout or fixed domains", item="rows")
        # With vertical localization the rows' vertical coordinate is a last column: domains per point and level.
        return LocalGeometry(row_coords=localization_coords(self.layout, localization), balance=balance)


def build_step(analysis: AnalysisConfig, rows: StateRows, comm: Comm, *, cycle_dir: Callable[[int], Path] | None = None,
               first_cycle: int = 0, stats: StatsSink | None = None, output: OutputSink | None = None,
               truth: Callable[[int], TruthRows | None] | None = None, balance: bool | None = None) -> AnalysisStep:
    """The analysis step of ``analysis`` on ``rows``, for the ranks of ``comm``.

    ``cycle_dir(cycle)``: the directory of each cycle's ``obs_diag.nc`` and adaptive inflation
    field (None: neither is written, the field stays in memory); ``first_cycle``: the study's first
    cycle (its inflation field is the initial one). ``stats``, ``output``, ``truth``: see
    :class:`AnalysisStep`. ``balance`` (local filters on a layout's rows; fixed domains keep theirs): rows
    of equal estimated work on every rank; None: ``analysis.balance`` where there are several ranks. The balance is reported where the rows
    come from a layout (the coordinates of every row known), whether they move or not; the serial filter's rows
    are balanced in the same way."""
    flt = make_filter(analysis)
    lf, sf = flt.as_local(), flt.as_serial()
    local, inflation = None, None
    if lf is not None or sf is not None:
        # One rank has nothing to balance: its rows stay where they are.
        equal_cost = (analysis.balance and comm.size > 1) if balance is None else balance
        local = rows.local_geometry(analysis.localization, equal_cost)
        if sf is not None and local.row_coords is None:
            raise InputError("the serial filter needs the coordinates of every state row", item="rows")
    scheme = lf.adaptive if lf is not None else sf.adaptive if sf is not None else None
    if scheme is not None:
        inflation = InflationCarrier(scheme, rows.n_rows, comm, dir_of=cycle_dir, first_cycle=first_cycle,
                                     coords=rows.coords)
    obs_diag = None
    if cycle_dir is not None:
        metric = analysis.localization.metric if analysis.localization is not None else None
        obs_diag = ObsDiagnosticsWriter(cycle_dir, comm.rank, metric)
    return AnalysisStep(flt, local, inflation, obs_diag, stats, output or NoOutput(), truth or _no_truth,
                        analysis.observations, analysis.observation_windows)


def analyse(step: AnalysisStep, store: EnsembleStore, obs: ObservationSpace, cycle: int) -> tuple[np.ndarray, CycleDiagnostics]:
    """The analysis of ``cycle``: gather, H X, quality control, assimilate, record, scatter, the
    sinks. Collective over ``store.comm``. Returns this rank's rows of the analysis (as stored: the
    scatter may round them to the files' type) and the diagnostics (:class:`CycleDiagnostics`).

    The observations the quality control rejects (decided from each observation's full H(x), so the
    same on every rank) are left out of the analysis and of ``n_obs``, ``omb_rms`` and ``oma_rms``. The
    observations are whole on every rank or distributed by locality (:func:`cycle_observations`), with
    the same results. The forecast and analysis means and spreads and the increment of this rank's rows
    go to ``step.stats`` as :func:`enkflow.io.meanspread.ensemble_mean_spread` computes them (the values
    of the mean and spread files, bitwise). The adaptive inflation field's posterior is kept (and
    written) before the store commits the analysis, so that a redo of a committed cycle finds it."""
    # The inflation field first: a missing one is an error before the store has begun its update.
    infl = step.inflation.prior(cycle, store.row_start, store.row_stop) if step.inflation is not None else None
    X = store.gather(cycle)
    t0 = time.perf_counter()
    # Before the in-place analysis overwrites X.
    forecast = ensemble_mean_spread(X) if step.stats is not None else None
    t_fmean = time.perf_counter() - t0
    cyc = cycle_observations(step, store, obs, cycle)
    diag = cyc.observe(X)
    truth = step.truth(cycle)
    prior_mean = X.mean(axis=1) if truth is not None else None
    Xa, diag.balance = cyc.assimilate(step.filter, step.local, X, infl)
    diag.oma_rms = cyc.oma(Xa)
    diag.obs_layout = cyc.report()
    _record(step, store, diag, Xa, truth, prior_mean, infl)
    diag.analysis_s = time.perf_counter() - t0
    Xa = np.asfortranarray(Xa)
    if step.obs_diag is not None:
        diag.obs_diag_s = cyc.write_diagnostics(step.obs_diag, Xa)
    if step.inflation is not None and infl is not None:
        step.inflation.posterior(cycle, infl)
    store.scatter(cycle, Xa, diag.record())
    if step.stats is not None and forecast is not None:
        diag.stats_s = t_fmean + _add_statistics(step.stats, cycle, store.row_start, forecast, Xa)
    step.output.write(cycle, Xa, store.row_start, diag)
    return Xa, diag


def cycle_observations(step: AnalysisStep, store: EnsembleStore, obs: ObservationSpace,
                       cycle: int) -> ReplicatedObs | DistributedObs:
    """The cycle's observations as the step keeps them: distributed by locality where the step asks for
    it (``[analysis] observations``), its filter is local with domains by location and ``obs`` reads a
    file (:meth:`~enkflow.experiment.cycling.ObservationSpace.source`); else whole on every rank."""
    lf = step.filter.as_local()
    if step.obs_layout is ObsLayout.DISTRIBUTED and distributes(lf, step.local):
        source = obs.source(cycle)
        if source is not None:
            return DistributedObs(source, store, cycle, obs.share(cycle, store.comm), step.obs_windows)
    return ReplicatedObs(obs, store, cycle)


def _record(step: AnalysisStep, store: EnsembleStore, diag: CycleDiagnostics, Xa: np.ndarray,
            truth: TruthRows | None, prior_mean: np.ndarray | None, infl: np.ndarray | None) -> None:
    """The local filter's statistics, the RMSE against ``truth`` (this rank's rows of it) of the forecast mean
    ``prior_mean`` and of the analysis mean, and the inflation factors' range (collective)."""
    comm = store.comm
    lf, sf = step.filter.as_local(), step.filter.as_serial()
    st = lf.stats if lf is not None else sf.stats if sf is not None else None
    if st is not None:
        diag.local = LocalFilterStats(st.mean_local_obs, st.search_s, st.kernel_s)
    if truth is not None and prior_mean is not None:
        tl = truth[store.row_start:store.row_stop]
        sq = comm.allreduce_sum(np.array([np.sum((prior_mean - tl) ** 2), np.sum((Xa.mean(axis=1) - tl) ** 2)]))
        diag.rmse_prior = float(np.sqrt(sq[0] / store.n_rows))
        diag.rmse_analysis = float(np.sqrt(sq[1] / store.n_rows))
    if infl is not None:
        fac = infl[:, 0]
        ext = np.array(comm.allgather_obj((float(fac.sum()), float(fac.min(initial=np.inf)),
                                           float(fac.max(initial=-np.inf)))), dtype=np.float64).reshape(-1, 3)
        diag.inflation = InflationSummary(float(ext[:, 0].sum() / store.n_rows), float(ext[:, 1].min()),
                                          float(ext[:, 2].max()))


def _add_statistics(stats: StatsSink, cycle: int, row_start: int, forecast: tuple[np.ndarray, np.ndarray],
                    Xa: np.ndarray) -> float:
    """Hand this rank's rows of the forecast mean and spread ``forecast``, the analysis mean and spread and the
    increment to ``stats``; its seconds."""
    t0 = time.perf_counter()
    fmean, fspread = forecast
    amean, aspread = ensemble_mean_spread(Xa)
    stats.add(cycle, row_start, {"forecast_mean": fmean, "forecast_spread": fspread, "analysis_mean": amean,
                                 "analysis_spread": aspread, "analysis_increment": amean - fmean})
    return time.perf_counter() - t0
