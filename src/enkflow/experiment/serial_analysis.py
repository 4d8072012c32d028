"""The serial filter's analysis of this rank's rows (:class:`~enkflow.analysis.serial_filter.EnSRF`).

Every rank assimilates every observation into the replicated H(x) and into its own rows. A row's
result does not depend on the rank that holds it, so with :attr:`LocalGeometry.balance` the rows
move to contiguous ranges of equal estimated cost (the observations within each row's support,
counted every ``stride``-th row, plus one) and back, as a local filter's do
(:mod:`enkflow.experiment.decomposition`); the report is a
:class:`~enkflow.experiment.cycle_diagnostics.BalanceReport` either way.
"""

from __future__ import annotations

import time

import numpy as np

from enkflow.analysis import Geometry, ObsSet
from enkflow.analysis import balance as _balance
from enkflow.analysis.serial_filter import EnSRF, factor_at_obs
from enkflow.experiment.cycle_diagnostics import BalanceReport
from enkflow.experiment.cycling import EnsembleStore
from enkflow.experiment.decomposition import LocalGeometry, RowExchange, all_row_coords, store_bounds


def serial_analysis(flt: EnSRF, local: LocalGeometry, store: EnsembleStore, X: np.ndarray, HX: np.ndarray,
                    y: ObsSet, cycle: int, infl: np.ndarray | None) -> tuple[np.ndarray, BalanceReport]:
    """The analysis of this rank's rows ``X`` (row_stop - row_start, N) of ``store``, with every
    row's localization coordinates ``local.row_coords``; collective. ``infl`` (same rows, 2): the
    adaptive inflation field, updated in place; the factor at each observation comes from the full
    field."""
    comm = store.comm
    t0 = time.perf_counter()
    rc, io = all_row_coords(local, store), store_bounds(store)
    obs_factor = None
    if infl is not None:
        obs_factor = factor_at_obs(comm.allgather_rows(np.ascontiguousarray(infl)), rc, y, flt.localization)
    bounds = _balance.split_equal_cost(_row_costs(flt, rc, y, store, local.stride), comm.size) if local.balance else io
    a0, a1 = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    t1 = time.perf_counter()
    move = RowExchange(comm, io, bounds) if local.balance else None
    Xb = move.there(X) if move is not None else X
    fb = move.there(infl) if move is not None and infl is not None else infl  # the field's rows travel with X's
    t2 = time.perf_counter()
    st = flt.stats
    s0, k0, p0 = st.search_s, st.kernel_s, st.n_local_obs
    c0, w0 = time.process_time(), time.perf_counter()
    Xa = flt.analyze(Xb, HX, y, coords=rc[a0:a1], cycle=cycle, infl_field=fb, obs_factor=obs_factor)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    t3 = time.perf_counter()
    comm.barrier()  # the wait for the slowest rank, timed apart from the exchange
    t3b = time.perf_counter()
    if move is not None:
        Xa = move.back(Xa)
        if infl is not None and fb is not None:
            infl[...] = move.back(fb)
    t4 = time.perf_counter()
    ranks = np.array(comm.allgather_obj((wall, cpu, st.search_s - s0, st.kernel_s - k0, st.n_local_obs - p0)),
                     dtype=np.float64).reshape(-1, 5)
    total = float(ranks[:, 4].sum()) or 1.0
    report = BalanceReport(
        imbalance_est=_balance.imbalance(ranks[:, 4]), imbalance_cpu=_balance.imbalance(ranks[:, 1]),
        imbalance_wall=_balance.imbalance(ranks[:, 0]), balance_s=t1 - t0, redistribute_s=(t2 - t1) + (t4 - t3b),
        wait_s=t3b - t3, balanced=local.balance, rank_analysis_s=ranks[:, 0].tolist(), rank_cpu_s=ranks[:, 1].tolist(),
        rank_est_work=(ranks[:, 4] / total).tolist(), rank_rows=np.diff(bounds).astype(np.float64).tolist(),
        rank_search_s=ranks[:, 2].tolist(), rank_kernel_s=ranks[:, 3].tolist())
    return np.asfortranarray(Xa), report


def _row_costs(flt: EnSRF, rc: np.ndarray, y: ObsSet, store: EnsembleStore, stride: int) -> np.ndarray:
    """The estimated cost of every state row (n_rows,), the same on every rank (collective): one plus
    the observations within its support, counted every ``stride``-th row where the row lives, interpolated."""
    loc = flt.localization.for_obs(y)
    sample = _balance.sample_rows(store.n_rows, stride)
    mine = sample[(sample >= store.row_start) & (sample < store.row_stop)]
    geometry = Geometry(loc.metric, y.coords, loc.period)
    counts = store.comm.allgather_rows(geometry.counts(loc.horizontal(rc[mine])[0], loc.support).astype(np.float64))
    return 1.0 + _balance.interpolate_counts(sample, counts, store.n_rows)
