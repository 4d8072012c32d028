"""The serial filter's analysis of this rank's rows (:class:`~enkflow.analysis.serial_filter.EnSRF`).

Every rank assimilates every observation into its own row block of the store (no rows move: a row's
result does not depend on the rank that holds it) and into the replicated H(x). The report is a
:class:`~enkflow.experiment.cycle_diagnostics.BalanceReport` of the store's blocks: each rank's
share of the (observation, row) updates as its estimated work, its seconds in the filter.
"""

from __future__ import annotations

import time

import numpy as np

from enkflow.analysis import ObsSet
from enkflow.analysis import balance as _balance
from enkflow.analysis.serial_filter import EnSRF, factor_at_obs
from enkflow.experiment.cycle_diagnostics import BalanceReport
from enkflow.experiment.cycling import EnsembleStore


def serial_analysis(flt: EnSRF, row_coords: np.ndarray, store: EnsembleStore, X: np.ndarray, HX: np.ndarray,
                    y: ObsSet, cycle: int, infl: np.ndarray | None) -> tuple[np.ndarray, BalanceReport]:
    """The analysis of this rank's rows ``X`` (row_stop - row_start, N) of ``store``, whose
    localization coordinates are ``row_coords[row_start:row_stop]`` (``row_coords``: every row's,
    (n_rows, n_dim)); collective. ``infl`` (same rows, 2): the adaptive inflation field, updated in
    place; the factor at each observation comes from the full field."""
    comm = store.comm
    obs_factor = None
    if infl is not None:
        obs_factor = factor_at_obs(comm.allgather_rows(np.ascontiguousarray(infl)), row_coords, y, flt.localization)
    st = flt.stats
    s0, k0, p0 = st.search_s, st.kernel_s, st.n_local_obs
    c0, w0 = time.process_time(), time.perf_counter()
    Xa = flt.analyze(X, HX, y, coords=row_coords[store.row_start:store.row_stop], cycle=cycle, infl_field=infl,
                     obs_factor=obs_factor)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    t0 = time.perf_counter()
    comm.barrier()  # the wait for the slowest rank
    wait = time.perf_counter() - t0
    ranks = np.array(comm.allgather_obj((wall, cpu, st.search_s - s0, st.kernel_s - k0, st.n_local_obs - p0,
                                         X.shape[0])), dtype=np.float64).reshape(-1, 6)
    total = float(ranks[:, 4].sum()) or 1.0
    report = BalanceReport(
        imbalance_est=_balance.imbalance(ranks[:, 4]), imbalance_cpu=_balance.imbalance(ranks[:, 1]),
        imbalance_wall=_balance.imbalance(ranks[:, 0]), balance_s=0.0, redistribute_s=0.0, wait_s=wait, balanced=False,
        rank_analysis_s=ranks[:, 0].tolist(), rank_cpu_s=ranks[:, 1].tolist(),
        rank_est_work=(ranks[:, 4] / total).tolist(), rank_rows=ranks[:, 5].tolist(),
        rank_search_s=ranks[:, 2].tolist(), rank_kernel_s=ranks[:, 3].tolist())
    return Xa, report
