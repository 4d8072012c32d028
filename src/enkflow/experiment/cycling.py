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
from enkflow.analysis import balance as _balance
from enkflow.errors import InputError
from enkflow.io.meanspread import ensemble_mean_spread
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
    """Receives each cycle's analysis (rank-local rows) and its diagnostics. A sink that writes in
    the background also has ``wait()``: returns once what it was given is written, raises its errors."""

    def write(self, cycle: int, Xa: np.ndarray, row_start: int, diagnostics: dict[str, float]) -> None: ...


@runtime_checkable
class StatsSink(Protocol):
    """Receives each cycle's ensemble statistics of this rank's rows, from :func:`analyse`.

    ``rows`` maps ``forecast_mean``, ``analysis_mean``, ``analysis_spread`` (standard deviation,
    ddof = 1) and ``analysis_increment`` (analysis minus forecast mean) to (row_stop - row_start,)
    float64 arrays of state rows ``row_start:``. Not collective: a rank hands its rows on and goes
    on (an asynchronous output, :class:`enkflow.output.analysis_output.AnalysisOutput`)."""

    def add(self, cycle: int, row_start: int, rows: dict[str, np.ndarray]) -> None: ...


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

    def wait(self) -> None:
        return None


@dataclass(frozen=True)
class LocalGeometry:
    """What a local filter needs of the state rows of this rank: its domains and, optionally,
    the geometry of every row (None: the domains carry their own coordinates).

    ``row_coords`` (n_rows, n_dim): the coordinates of every state row (all ranks' rows), which
    a balanced analysis (``analyse(..., balance=True)``) needs to build the domains of the rows
    it receives (by location). With it, ``domains`` may be None: the domains of this rank's
    rows are then built by location when needed."""

    domains: LocalDomains | None = None
    geometry: Geometry | None = None
    row_coords: np.ndarray | None = None

    def domains_for(self, start: int, stop: int) -> LocalDomains:
        """The domains of rows ``start:stop``: ``domains`` where given (they are this rank's), else
        rows grouped by location from ``row_coords``."""
        if self.domains is not None:
            return self.domains
        if self.row_coords is None:
            raise InputError("LocalGeometry needs domains or row_coords", item="local")
        return LocalDomains.by_location(self.row_coords[start:stop])

    def kwargs(self, start: int = 0, stop: int = 0) -> dict:
        kw: dict = {"domains": self.domains_for(start, stop)}
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
    balance: bool | None = None,
    balance_stride: int = 64,
    stats: StatsSink | None = None,
    infl_field: np.ndarray | None = None,
    obs_diag=None,
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

    ``balance`` (local filters with ``local``): None (default) analyses this rank's rows as
    they come, and reports nothing more. False does the same and reports the balance (below).
    True gives every rank a contiguous range of rows of equal estimated cost (local
    observations x N^2 + 4.5 N^3, the local observations counted every ``balance_stride``-th row
    and interpolated; :mod:`enkflow.analysis.balance`), moves the forecast rows there from the
    store's row blocks with ``comm.alltoallv_rows``, analyses them with domains built by
    location from ``local.row_coords``, and moves the analysis back before the scatter; H X
    stays computed on the store's blocks. Every domain's analysis is the same computation on
    whichever rank it runs, so the result is the same as with None, but for the last bits where the
    compiled kernel's batches of eight domains fall differently (docs/analysis.md).
    With ``balance`` set the diagnostics add ``imbalance_est`` (max/mean of the ranks'
    estimated work), ``imbalance_cpu`` and ``imbalance_wall`` (of the ranks' seconds in the
    local filter), ``balance_s`` (estimate and split), ``redistribute_s`` (both exchanges) and
    ``wait_s`` (this rank's wait for the slowest before the exchange back),
    and, after ``before_update`` has run (so not in its record), the per-rank lists
    ``rank_analysis_s``, ``rank_cpu_s``, ``rank_est_work`` (share of the total), ``rank_rows``,
    ``rank_search_s`` and ``rank_kernel_s`` (the local filter's split), the same on every rank.
    With ``localization.max_obs`` a domain's estimated observations are capped at it.

    ``stats`` receives this rank's rows of the forecast mean, the analysis mean and spread (of
    the analysis as stored: after the scatter, which may round it to the files' type) and the
    increment (:class:`StatsSink`), computed as :func:`enkflow.io.meanspread.ensemble_mean_spread`
    computes them (so the values equal those of the mean and spread files, bitwise);
    ``stats_s`` is the time they took on this rank.

    Quality control: where ``obs`` has a ``qc`` (:class:`enkflow.analysis.qc.QualityControl`, e.g.
    :class:`enkflow.obs.space.FileObservations`), the observations it rejects (decided from the full
    ``HX``, so the same on every rank) are left out of the analysis and of ``omb_rms``/``oma_rms``/``n_obs``;
    the diagnostics add ``qc_rejected``, ``qc_gross``, ``qc_buddy`` and ``qc_rejected:KIND`` per kind
    (names from ``obs.kind_names`` where it has them).

    ``infl_field`` (row_stop - row_start, 2): this rank's rows of the adaptive inflation field of a
    local filter with ``adaptive`` set (factor, deviation of its estimate), updated in place
    (:mod:`enkflow.analysis.adaptive_inflation`); the diagnostics add ``inflation_mean``,
    ``inflation_min`` and ``inflation_max`` of the factors over all rows.

    ``obs_diag`` (:class:`enkflow.obs.diagnostics.ObsDiagnosticsWriter`): the observation-space
    diagnostics file of the cycle (every observation's prior and posterior H(x) mean and spread and
    QC flag; H applied to the analysis ensemble, collective), written before ``before_update``
    runs; ``obs_diag_s`` its seconds.
    """
    comm = store.comm
    X = store.gather(cycle)
    t0 = time.perf_counter()
    # The forecast mean before the in-place analysis overwrites X.
    fmean = _ensemble_mean(X) if stats is not None else None
    t_stats = time.perf_counter() - t0
    y = obs.observations(cycle)
    HX = obs.apply(cycle, X, store.row_start, comm)
    y_all, HX_all = y, HX  # every observation, QC-rejected ones included (obs_diag)
    # Quality control from the full HX (the same on every rank): every rank rejects the same observations.
    qc, qc_flags, qc_keep, qc_diag = getattr(obs, "qc", None), None, None, {}
    if qc is not None:
        qc_res = qc.check(y, HX)
        qc_flags, qc_diag = qc_res.flags, qc_res.counts(y.kinds, getattr(obs, "kind_names", None))
        if qc_flags.any():
            qc_keep = qc_res.keep
            y, HX = y.subset(qc_keep), HX[qc_keep]
    omb = float(np.sqrt(np.mean((y.values - HX.mean(axis=1)) ** 2))) if y.n_obs else 0.0
    prior_mean = X.mean(axis=1) if truth is not None else None
    per_rank: dict[str, list[float]] = {}
    if balance is not None and local is not None and isinstance(flt, (LETKF, LESTKF)):
        Xa, bdiag, per_rank = _decomposed_analysis(store, flt, X, HX, y, cycle, local, bool(balance), balance_stride,
                                                   infl_field)
    else:
        bdiag = {}
        kw: dict = {}
        if local is not None:
            kw = {**local.kwargs(store.row_start, store.row_stop), "out": X}
        if infl_field is not None:
            kw["infl_field"] = infl_field
        Xa = flt.analyze(X, HX, y, cycle=cycle, **kw)
    hxa = obs.apply_mean(cycle, np.ascontiguousarray(Xa.mean(axis=1)), store.row_start, comm)
    if qc_keep is not None:
        hxa = hxa[qc_keep]
    oma = float(np.sqrt(np.mean((y.values - hxa) ** 2))) if y.n_obs else 0.0
    diag: dict[str, float] = {"n_obs": float(y.n_obs), "omb_rms": omb, "oma_rms": oma, **bdiag, **qc_diag}
    if isinstance(flt, (LETKF, LESTKF)):
        diag.update(mean_local_obs=flt.stats.mean_local_obs, search_s=flt.stats.search_s, kernel_s=flt.stats.kernel_s)
    if truth is not None:
        tl = truth[store.row_start:store.row_stop]
        sq = comm.allreduce_sum(np.array([np.sum((prior_mean - tl) ** 2), np.sum((Xa.mean(axis=1) - tl) ** 2)]))
        diag["rmse_prior"] = float(np.sqrt(sq[0] / store.n_rows))
        diag["rmse_analysis"] = float(np.sqrt(sq[1] / store.n_rows))
    if infl_field is not None:
        fac = infl_field[:, 0]
        ext = np.array(comm.allgather_obj((float(fac.sum()), float(fac.min(initial=np.inf)),
                                           float(fac.max(initial=-np.inf)))), dtype=np.float64).reshape(-1, 3)
        diag.update(inflation_mean=float(ext[:, 0].sum() / store.n_rows), inflation_min=float(ext[:, 1].min()),
                    inflation_max=float(ext[:, 2].max()))
    diag["analysis_s"] = time.perf_counter() - t0
    Xa = np.asfortranarray(Xa)
    if obs_diag is not None:
        from enkflow.obs.diagnostics import record

        t1 = time.perf_counter()
        record(obs_diag, obs, cycle, y_all, HX_all, Xa, store.row_start, comm, qc_flags)
        diag["obs_diag_s"] = time.perf_counter() - t1
    if before_update is not None:
        before_update(Xa, diag)
    diag.update(per_rank)  # type: ignore[arg-type]
    store.scatter(cycle, Xa)
    if stats is not None:
        t1 = time.perf_counter()
        amean, aspread = ensemble_mean_spread(Xa)
        stats.add(cycle, store.row_start, {"forecast_mean": fmean, "analysis_mean": amean, "analysis_spread": aspread,
                                           "analysis_increment": amean - fmean})
        diag["stats_s"] = t_stats + time.perf_counter() - t1
    return Xa, diag


def _decomposed_analysis(
    store: EnsembleStore, flt: LETKF | LESTKF, X: np.ndarray, HX: np.ndarray, y: ObsSet, cycle: int,
    local: LocalGeometry, balance: bool, stride: int, infl_field: np.ndarray | None = None,
) -> tuple[np.ndarray, dict[str, float], dict[str, list[float]]]:
    """The local analysis of :func:`analyse` with ``balance`` set: estimate every row's cost,
    analyse the rows of the equal-cost range (``balance``) or of the store's block, and time it.
    ``X`` (row_stop - row_start, N) is overwritten with the analysis and returned."""
    comm = store.comm
    t0 = time.perf_counter()
    if local.row_coords is None:
        raise InputError("a balanced analysis needs the coordinates of every state row (LocalGeometry.row_coords)",
                         item="local.row_coords")
    rc = np.asarray(local.row_coords, dtype=np.float64)
    rc = rc[:, None] if rc.ndim == 1 else rc
    if rc.shape[0] != store.n_rows:
        raise InputError(f"row_coords has {rc.shape[0]} rows, the state {store.n_rows}", item="local.row_coords")
    loc = flt.localization
    geometry = local.geometry or Geometry(loc.metric, y.coords, loc.period)
    blocks = np.array(comm.allgather_obj((store.row_start, store.row_stop)), dtype=np.int64).reshape(-1, 2)
    io_bounds = np.append(blocks[:, 0], blocks[-1, 1])
    if io_bounds[0] != 0 or io_bounds[-1] != store.n_rows or np.any(blocks[1:, 0] != blocks[:-1, 1]):
        raise InputError("a balanced analysis needs the ranks' row blocks contiguous and in rank order", item="store")
    sample = _balance.sample_rows(store.n_rows, stride)
    mine = sample[(sample >= store.row_start) & (sample < store.row_stop)]
    hmine = loc.horizontal(rc[mine])[0]  # with vertical localization, rc's last column is the vertical
    geometry.check_domain_coords(hmine)
    counts = comm.allgather_rows(geometry.counts(hmine, loc.support).astype(np.float64))
    if loc.max_obs is not None:  # a capped domain analyses at most max_obs observations
        counts = np.minimum(counts, float(loc.max_obs))
    cost = _balance.domain_cost(_balance.interpolate_counts(sample, counts, store.n_rows), X.shape[1])
    bounds = _balance.split_equal_cost(cost, comm.size) if balance else io_bounds
    a0, a1 = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    t1 = time.perf_counter()
    if balance:
        send, recv = _balance.exchange_counts(io_bounds, bounds, comm.rank)
        Xb = comm.alltoallv_rows(X, send, recv)
    else:
        Xb = X
    t2 = time.perf_counter()
    domains = local.domains_for(a0, a1) if not balance else LocalDomains.by_location(rc[a0:a1])
    c0 = time.process_time()
    w0 = time.perf_counter()
    s0, k0 = flt.stats.search_s, flt.stats.kernel_s
    fkw: dict = {}
    if infl_field is not None:  # the field's rows travel with the rows of X
        fkw["infl_field"] = comm.alltoallv_rows(infl_field, send, recv) if balance else infl_field
    Xb = flt.analyze(Xb, HX, y, cycle=cycle, domains=domains, geometry=geometry, out=Xb, **fkw)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    search, kernel = flt.stats.search_s - s0, flt.stats.kernel_s - k0
    t3 = time.perf_counter()
    comm.barrier()  # the wait for the slowest rank, timed apart from the exchange
    t3b = time.perf_counter()
    if balance:
        X[...] = comm.alltoallv_rows(Xb, recv, send)
        if infl_field is not None:
            infl_field[...] = comm.alltoallv_rows(fkw["infl_field"], recv, send)
    t4 = time.perf_counter()
    work = _balance.part_costs(cost, bounds)
    total = float(work.sum()) or 1.0
    rows = np.diff(bounds).astype(np.float64)
    ranks = comm.allgather_obj((wall, cpu, search, kernel))
    r_wall = [float(r[0]) for r in ranks]
    r_cpu = [float(r[1]) for r in ranks]
    diag = {
        "imbalance_est": _balance.imbalance(work), "imbalance_cpu": _balance.imbalance(r_cpu),
        "imbalance_wall": _balance.imbalance(r_wall), "balance_s": t1 - t0, "redistribute_s": (t2 - t1) + (t4 - t3b),
        "wait_s": t3b - t3,
        "balanced": float(balance),
    }
    per_rank = {"rank_analysis_s": r_wall, "rank_cpu_s": r_cpu, "rank_est_work": [float(w) / total for w in work],
                "rank_rows": rows.tolist(), "rank_search_s": [float(r[2]) for r in ranks],
                "rank_kernel_s": [float(r[3]) for r in ranks]}
    return X, diag, per_rank


def _ensemble_mean(X: np.ndarray, block: int = 65536) -> np.ndarray:
    """The row-wise mean of ``X`` (n_rows, N) as :func:`~enkflow.io.meanspread.ensemble_mean_spread`
    computes it (the same blocks, the same bits), without the spread."""
    mean = np.empty(X.shape[0])
    for r0 in range(0, X.shape[0], block):
        mean[r0:r0 + block] = X[r0:r0 + block].mean(axis=1)
    return mean


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
