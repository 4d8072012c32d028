"""The observations of a cycle distributed by locality (``[analysis] observations = "distributed"``, local
filters on located rows): each rank owns the observations whose H row starts in its I/O block and holds,
for its local analyses, those its domains can see (:mod:`enkflow.obs.distributed_space`). The results,
the diagnostics and ``obs_diag.nc`` are the replicated layout's, bit for bit (docs/analysis.md).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from enkflow.analysis import LocalDomains, LocalFilter
from enkflow.analysis import balance as _balance
from enkflow.analysis.qc import ACCEPTED, QCResult
from enkflow.config import Metric
from enkflow.experiment.cycle_diagnostics import BalanceReport, CycleDiagnostics, ObsLayoutReport
from enkflow.experiment.cycling import EnsembleStore
from enkflow.experiment.decomposition import LocalGeometry, all_row_coords, balanced_rows, store_bounds
from enkflow.obs.diagnostics import ObsDiagnosticsWriter
from enkflow.obs.distributed_space import ObsFileSource, OwnedObservations, ReadShare, kept_max, read_share
from enkflow.obs.gathered import RootOrder
from enkflow.obs.partition import DomainWindows, box_of, windows_of_equal_cost


class DistributedObs:
    """One cycle's observations of ``source`` owned and held by the ranks of ``store`` (collective methods);
    ``share``: this rank's share of the file where it was read already; ``rounds``: the windows in which
    every rank analyses its domains, holding one window's observations at a time
    (``[analysis] observation_windows``)."""

    def __init__(self, source: ObsFileSource, store: EnsembleStore, cycle: int, share: ReadShare | None = None,
                 rounds: int = 1):
        self.store, self.cycle, self.comm, self.rounds = store, cycle, store.comm, rounds
        self.io_bounds = store_bounds(store)
        self.owned = OwnedObservations(share or read_share(source, store.comm), store.comm, self.io_bounds,
                                       store.n_rows, source)
        self._bytes = 0.0
        self._held = 0
        self._window_s = 0.0

    def observe(self, X: np.ndarray) -> CycleDiagnostics:
        """H of the forecast rows ``X`` for the owned observations, their quality control and the
        cycle's observation diagnostics (each observation counted once, in the file's order)."""
        o = self.owned
        self.HX = o.forecast_hx(X)
        self.hx_bytes = float(o.exchange.bytes_moved)
        self._note_bytes(self.HX.nbytes + o.exchange.pieces_bytes(X.shape[1]) + o.records.nbytes)
        self.qc = o.quality_control()
        self.flags = o.qc_flags(self.qc, self.HX)
        self.keep = self.flags == ACCEPTED
        self.order = RootOrder.of(self.comm, o.ids, o.n_total)
        y = o.records.obs
        omb = self.order.rms(y.values - self.HX.mean(axis=1), self.keep)
        n_kept = int(self.comm.allreduce_sum(np.array([float(np.count_nonzero(self.keep))]))[0])
        return CycleDiagnostics(n_obs=n_kept, omb_rms=omb, qc=self._qc_counts() if self.qc is not None else {})

    def _qc_counts(self) -> dict[str, float]:
        o = self.owned
        flags = self.order.gather(self.flags)
        kinds = self.order.gather(o.records.obs.kinds)
        counts = None
        if flags is not None and kinds is not None:
            counts = QCResult(flags).counts(kinds, dict(o.kind_names))
        return self.comm.bcast(counts)

    def assimilate(self, lf: LocalFilter, local: LocalGeometry, X: np.ndarray,
                   infl: np.ndarray | None) -> tuple[np.ndarray, BalanceReport]:
        """The local analysis of the ranks' domains (balanced or in the I/O row blocks, as the replicated
        layout splits them), in place of ``X``: each rank's domains window by window
        (:mod:`enkflow.obs.partition`), each window with the observations it can see."""
        t0 = time.perf_counter()
        store, comm = self.store, self.comm
        rc = all_row_coords(local, store)
        cost = self._row_costs(lf, local, rc, X.shape[1])
        bounds = _balance.split_equal_cost(cost, comm.size) if local.balance else self.io_bounds
        a0, a1 = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
        domains = LocalDomains.by_location(rc[a0:a1]) if local.balance else local.domains_for(a0, a1)
        flt = self._searching(lf)
        loc = flt.localization
        mine = self._windows(domains, cost[a0:a1], lf.chunk)
        windows = DomainWindows.gather(comm, loc.metric, loc.period, [
            (w, *box_of(loc.metric, loc.horizontal(domains.coords[s:e])[0])) for w, (s, e) in enumerate(mine) if e > s])

        def analyse(Xb: np.ndarray, fb: np.ndarray | None, b0: int, b1: int) -> np.ndarray:
            for w, (s, e) in enumerate(mine):
                t = time.perf_counter()
                # The ranks reach a window at different times: they wait here, where waiting gives
                # the core back, not spinning in the exchange's first collective.
                self.comm.barrier()
                held = self.owned.held(self.keep, self.HX, windows, loc.support, w)
                self._window_s += time.perf_counter() - t
                self._held = max(self._held, held.n)
                # The owned H(x), this window's (its perturbations made in place), both sets' own arrays.
                self._note_bytes(self.HX.nbytes + held.hx.nbytes + held.nbytes + self.owned.records.nbytes)
                if e > s:
                    flt.analyze(Xb, held.hx, held.obs, cycle=self.cycle, domains=domains.subset(s, e),
                                geometry=flt.obs_geometry(held.obs), out=Xb, infl_field=fb, consume_hx=True)
            return Xb

        Xa, report = balanced_rows(local, store, X, infl, cost, lf.stats, t0, analyse)
        self.hx_bytes += float(self.owned.routed_bytes)
        if Xa is not X:
            X[...] = Xa
        return X, report

    def _windows(self, domains: LocalDomains, row_cost: np.ndarray, chunk: int) -> list[tuple[int, int]]:
        """This rank's :attr:`rounds` windows of ``domains``: whole chunks of ``chunk`` domains, of about equal
        estimated cost (``row_cost`` (n_rows,) of the rows the domains index), so that the ranks, which
        exchange the observations of each round together, wait little for each other."""
        dom_cost = np.add.reduceat(row_cost[domains.rows], domains.offsets[:-1]) if domains.n_domains else np.zeros(0)
        chunks = [(s, min(s + chunk, domains.n_domains)) for s in range(0, domains.n_domains, chunk)]
        chunk_cost = np.add.reduceat(dom_cost, [s for s, _ in chunks]) if chunks else np.zeros(0)
        return windows_of_equal_cost(chunk_cost, chunks, self.rounds)

    def _searching(self, lf: LocalFilter) -> LocalFilter:
        """``lf`` whose localization searches as far as over every rank's kept observations: the largest
        of its half-width and the kept observations' own (per kind), as a whole-file analysis does."""
        loc = lf.localization
        c = kept_max(self.comm, self.owned.records.obs.half_width, self.keep)
        if c is None or c <= loc.half_width:
            return lf
        return dataclasses.replace(lf, localization=dataclasses.replace(loc, half_width=c))

    def _row_costs(self, lf: LocalFilter, local: LocalGeometry, rc: np.ndarray, n_members: int) -> np.ndarray:
        """Every row's estimated cost (n_rows,), the replicated layout's: the kept observations within
        the localization support of every ``local.stride``-th row, counted by their owners and summed."""
        loc = lf.localization
        sample = _balance.sample_rows(rc.shape[0], local.stride)
        h = loc.horizontal(rc[sample])[0]
        counts = self.owned.sample_counts(self.keep, loc.metric, loc.period, h, loc.support)
        if loc.max_obs is not None:
            counts = np.minimum(counts, float(loc.max_obs))
        return _balance.domain_cost(_balance.interpolate_counts(sample, counts, rc.shape[0]), n_members)

    def oma(self, Xa: np.ndarray) -> float:
        """RMS of the kept observations minus H of the analysis mean of this rank's rows ``Xa``."""
        mean = np.ascontiguousarray(Xa.mean(axis=1))[:, None]
        return self.order.rms(self.owned.records.obs.values - self.owned.exchange.apply(mean)[:, 0], self.keep)

    def write_diagnostics(self, writer: ObsDiagnosticsWriter, Xa: np.ndarray) -> float:
        """``obs_diag.nc`` of every observation from the owners' H(x) of the forecast and of the analysis
        members ``Xa`` (this rank's rows), gathered on rank 0 in the file's order; its seconds."""
        t0 = time.perf_counter()
        o = self.owned
        HXa = o.exchange.apply(Xa)
        writer.write_distributed(self.cycle, self.order, o.records.obs, self.HX, HXa, self.flags, o.kind_names,
                                 Metric.SPHERE if o.lonlat else None)
        return time.perf_counter() - t0

    def _note_bytes(self, n: float) -> None:
        self._bytes = max(self._bytes, float(n))

    def report(self) -> ObsLayoutReport:
        every = np.array(self.comm.allgather_obj((float(self._held), float(self.owned.records.n), self._bytes,
                                                  self.hx_bytes, self._window_s)), dtype=np.float64).reshape(-1, 5)
        return ObsLayoutReport(True, *(every[:, k].tolist() for k in range(5)))


def distributes(lf: LocalFilter | None, local: LocalGeometry | None) -> bool:
    """Whether a local analysis can take its observations distributed: a local filter (not the serial
    one) whose domains are the rows grouped by location, with no fixed search geometry."""
    return (lf is not None and local is not None and local.row_coords is not None and local.domains is None
            and local.geometry is None)

