"""The serial filter's analysis of this rank's rows (:class:`~enkflow.analysis.serial_filter.EnSRF`).

Every rank assimilates every observation into the replicated H(x) and into its own rows. A row's
result does not depend on the rank that holds it, so with :attr:`LocalGeometry.balance` the rows
move to contiguous ranges of equal estimated cost (the observations within each row's support,
counted every ``stride``-th row, plus one) and back, as a local filter's do
(:func:`enkflow.experiment.decomposition.balanced_rows`), which reports the balance either way.
"""

from __future__ import annotations

import time

import numpy as np

from enkflow.analysis import Geometry, ObsSet
from enkflow.analysis import balance as _balance
from enkflow.analysis.serial_filter import EnSRF, factor_at_obs
from enkflow.experiment.cycle_diagnostics import BalanceReport
from enkflow.experiment.cycling import EnsembleStore
from enkflow.experiment.decomposition import LocalGeometry, all_row_coords, balanced_rows


def serial_analysis(flt: EnSRF, local: LocalGeometry, store: EnsembleStore, X: np.ndarray, HX: np.ndarray,
                    y: ObsSet, cycle: int, infl: np.ndarray | None) -> tuple[np.ndarray, BalanceReport]:
    """The analysis of this rank's rows ``X`` (row_stop - row_start, N) of ``store``, with every
    row's localization coordinates ``local.row_coords``; collective. ``infl`` (same rows, 2): the
    adaptive inflation field, updated in place; the factor at each observation comes from the full
    field."""
    t0 = time.perf_counter()
    rc = all_row_coords(local, store)
    obs_factor = None
    if infl is not None:
        obs_factor = factor_at_obs(store.comm.allgather_rows(np.ascontiguousarray(infl)), rc, y, flt.localization)
    cost = _row_costs(flt, rc, y, store, local.stride)

    def analyse(Xb: np.ndarray, fb: np.ndarray | None, a0: int, a1: int) -> np.ndarray:
        return flt.analyze(Xb, HX, y, coords=rc[a0:a1], cycle=cycle, infl_field=fb, obs_factor=obs_factor)

    Xa, report = balanced_rows(local, store, X, infl, cost, flt.stats, t0, analyse)
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
