"""A local filter's analysis of this rank's rows: which domains, on which rank, and the balance.

A local filter analyses each domain of rows on its own (:meth:`LocalFilter.analyze`), so the
rows may be analysed by any rank. :func:`local_analysis` analyses the rows of the store's row
block as they come, or, where the coordinates of every state row are known
(:attr:`LocalGeometry.row_coords`), estimates every row's cost (local observations x N^2 +
4.5 N^3, :mod:`enkflow.analysis.balance`), and with :attr:`LocalGeometry.balance` moves the
rows to ranks of equal estimated cost and back (``comm.alltoallv_rows``), reporting the balance
either way. Every domain's analysis is the same computation on whichever rank it runs, so the
result is the same, but for the last bits where the compiled kernel's batches of eight domains
fall differently (docs/analysis.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from enkflow.analysis import Geometry, LocalDomains, LocalFilter, LocalStats, ObsSet
from enkflow.analysis import balance as _balance
from enkflow.errors import InputError
from enkflow.experiment.cycle_diagnostics import BalanceReport
from enkflow.experiment.cycling import EnsembleStore
from enkflow.parallel import Comm


@dataclass(frozen=True)
class LocalGeometry:
    """What a local filter needs of the state rows: their domains and how the ranks share them.

    ``domains``: fixed domains of this rank's rows (e.g. Lorenz-96's groups of points), or None:
    rows grouped by location from ``row_coords``. ``geometry``: the observations' search geometry
    where it is fixed (None: built from each cycle's observations). ``row_coords`` (n_rows, n_dim):
    the localization coordinates of every state row (all ranks'; with vertical localization the
    vertical coordinate last); with them the analysis estimates every row's cost and reports the
    balance, and ``balance`` gives every rank a contiguous range of rows of equal estimated cost
    (the local observations counted every ``stride``-th row and interpolated)."""

    domains: LocalDomains | None = None
    geometry: Geometry | None = None
    row_coords: np.ndarray | None = None
    balance: bool = False
    stride: int = 64
    _built: dict[tuple[int, int], LocalDomains] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.domains is None and self.row_coords is None:
            raise InputError("LocalGeometry needs domains or row_coords", item="local")
        if self.balance and self.row_coords is None:
            raise InputError("a balanced analysis needs the coordinates of every state row (LocalGeometry.row_coords)",
                             item="local.row_coords")

    def domains_for(self, start: int, stop: int) -> LocalDomains:
        """The domains of rows ``start:stop``: ``domains`` where given (they are this rank's), else
        the rows grouped by location (kept for the next cycle's same rows)."""
        if self.domains is not None:
            return self.domains
        built = self._built.get((start, stop))
        if built is None:
            if self.row_coords is None:
                raise InputError("LocalGeometry needs domains or row_coords", item="local")
            built = LocalDomains.by_location(self.row_coords[start:stop])
            self._built.clear()
            self._built[start, stop] = built
        return built


def local_analysis(flt: LocalFilter, local: LocalGeometry, store: EnsembleStore, X: np.ndarray, HX: np.ndarray,
                   y: ObsSet, cycle: int, infl: np.ndarray | None) -> tuple[np.ndarray, BalanceReport | None]:
    """The local analysis of this rank's rows ``X`` (row_stop - row_start, N) of ``store``, in
    place (``X`` is returned); collective. ``infl`` (same rows, 2): the adaptive inflation field,
    updated in place. The balance report where ``local.row_coords`` are known, else None."""
    if local.row_coords is None:
        Xa = flt.analyze(X, HX, y, cycle=cycle, domains=local.domains_for(store.row_start, store.row_stop),
                         geometry=local.geometry, out=X, infl_field=infl)
        return Xa, None
    return _balanced(flt, local, store, X, HX, y, cycle, infl)


def _balanced(flt: LocalFilter, local: LocalGeometry, store: EnsembleStore, X: np.ndarray, HX: np.ndarray, y: ObsSet,
              cycle: int, infl: np.ndarray | None) -> tuple[np.ndarray, BalanceReport]:
    """:func:`local_analysis` with the cost of every row estimated: the rows of the equal-cost
    range (``local.balance``) or of the store's block analysed, timed and reported."""
    t0 = time.perf_counter()
    rc = all_row_coords(local, store)
    geometry = local.geometry or flt.obs_geometry(y)
    cost = _row_costs(flt, geometry, rc, store, local.stride, X.shape[1])

    def analyse(Xb: np.ndarray, fb: np.ndarray | None, a0: int, a1: int) -> np.ndarray:
        domains = LocalDomains.by_location(rc[a0:a1]) if local.balance else local.domains_for(a0, a1)
        return flt.analyze(Xb, HX, y, cycle=cycle, domains=domains, geometry=geometry, out=Xb, infl_field=fb)

    Xa, report = balanced_rows(local, store, X, infl, cost, flt.stats, t0, analyse)
    if Xa is not X:
        X[...] = Xa
    return X, report


def balanced_rows(local: LocalGeometry, store: EnsembleStore, X: np.ndarray, infl: np.ndarray | None,
                  cost: np.ndarray, stats: LocalStats, t0: float,
                  analyse: Callable[[np.ndarray, np.ndarray | None, int, int], np.ndarray]) -> tuple[np.ndarray, BalanceReport]:
    """The analysis of this rank's rows ``X`` of ``store`` by ``analyse(Xb, fb, a0, a1)`` (the rows
    ``a0:a1`` and their inflation field rows, or None; returns their analysis, ``Xb`` itself where in
    place) on the rows of the equal-``cost`` range (``local.balance``; ``cost`` (n_rows,)) or of the
    store's block, moved there and back with the field ``infl`` (updated in place); timed (``stats``:
    the filter's search and kernel seconds; ``t0``: when the cost estimate began) and reported."""
    comm = store.comm
    io = store_bounds(store)
    bounds = _balance.split_equal_cost(cost, comm.size) if local.balance else io
    a0, a1 = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    t1 = time.perf_counter()
    move = RowExchange(comm, io, bounds) if local.balance else None
    Xb = move.there(X) if move is not None else X
    fb = move.there(infl) if move is not None and infl is not None else infl  # the field's rows travel with X's
    t2 = time.perf_counter()
    c0, w0 = time.process_time(), time.perf_counter()
    s0, k0 = stats.search_s, stats.kernel_s
    Xa = analyse(Xb, fb, a0, a1)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    search, kernel = stats.search_s - s0, stats.kernel_s - k0
    t3 = time.perf_counter()
    comm.barrier()  # the wait for the slowest rank, timed apart from the exchange
    t3b = time.perf_counter()
    if move is not None:
        Xa = move.back(Xa)
        if infl is not None and fb is not None:
            infl[...] = move.back(fb)
    t4 = time.perf_counter()
    work = _balance.part_costs(cost, bounds)
    total = float(work.sum()) or 1.0
    ranks = np.array(comm.allgather_obj((wall, cpu, search, kernel)), dtype=np.float64).reshape(-1, 4)
    report = BalanceReport(
        imbalance_est=_balance.imbalance(work), imbalance_cpu=_balance.imbalance(ranks[:, 1].tolist()),
        imbalance_wall=_balance.imbalance(ranks[:, 0].tolist()), balance_s=t1 - t0,
        redistribute_s=(t2 - t1) + (t4 - t3b), wait_s=t3b - t3, balanced=local.balance,
        rank_analysis_s=ranks[:, 0].tolist(), rank_cpu_s=ranks[:, 1].tolist(),
        rank_est_work=[float(w) / total for w in work], rank_rows=np.diff(bounds).astype(np.float64).tolist(),
        rank_search_s=ranks[:, 2].tolist(), rank_kernel_s=ranks[:, 3].tolist())
    return Xa, report


def all_row_coords(local: LocalGeometry, store: EnsembleStore) -> np.ndarray:
    """``local.row_coords`` as (n_rows, n_dim) float64, checked against the store."""
    rc = np.asarray(local.row_coords, dtype=np.float64)
    rc = rc[:, None] if rc.ndim == 1 else rc
    if rc.shape[0] != store.n_rows:
        raise InputError(f"row_coords has {rc.shape[0]} rows, the state {store.n_rows}", item="local.row_coords")
    return rc


def store_bounds(store: EnsembleStore) -> np.ndarray:
    """The ranks' row blocks of the store as bounds (P + 1,); collective."""
    blocks = np.array(store.comm.allgather_obj((store.row_start, store.row_stop)), dtype=np.int64).reshape(-1, 2)
    bounds = np.append(blocks[:, 0], blocks[-1, 1])
    if bounds[0] != 0 or bounds[-1] != store.n_rows or np.any(blocks[1:, 0] != blocks[:-1, 1]):
        raise InputError("a balanced analysis needs the ranks' row blocks contiguous and in rank order", item="store")
    return bounds


def _row_costs(flt: LocalFilter, geometry: Geometry, rc: np.ndarray, store: EnsembleStore, stride: int,
               n_members: int) -> np.ndarray:
    """The estimated cost of every state row (n_rows,), the same on every rank (collective): the
    local observations of every ``stride``-th row, counted where the row lives, interpolated."""
    sample = _balance.sample_rows(store.n_rows, stride)
    mine = sample[(sample >= store.row_start) & (sample < store.row_stop)]
    counts = store.comm.allgather_rows(flt.local_obs_counts(rc[mine], geometry))
    return _balance.domain_cost(_balance.interpolate_counts(sample, counts, store.n_rows), n_members)


class RowExchange:
    """Rows moved from the store's blocks (``io_bounds``) to the analysis ranges (``bounds``) and back."""

    def __init__(self, comm: Comm, io_bounds: np.ndarray, bounds: np.ndarray):
        self.comm = comm
        self.send, self.recv = _balance.exchange_counts(io_bounds, bounds, comm.rank)

    def there(self, rows: np.ndarray) -> np.ndarray:
        return self.comm.alltoallv_rows(rows, self.send, self.recv)

    def back(self, rows: np.ndarray) -> np.ndarray:
        return self.comm.alltoallv_rows(rows, self.recv, self.send)
