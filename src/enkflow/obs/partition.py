"""Which rank owns an observation, and which ranks' local domains can see it.

An observation is *owned* by the rank whose I/O row block holds the lowest state row of its H row (the
owner computes its H(x), its quality control and its statistics). For the analysis, each rank's domains
are cut into a few *windows* of whole chunks of the local filter (its ``chunk`` domains per search and kernel
call) and about equal estimated cost, which all ranks analyse in the same rounds; a window *holds* an observation when the observation lies within
the blocked local search's reach (:func:`enkflow.analysis.geometry.search_reach_chord`: the radius plus the
search blocks' extent) of the window's bounding box. Then every observation the search weighs, and every
candidate it counts to cut a chunk into parts, is held: each part, each batch of domains and each domain's
list of observations is the replicated layout's, while a rank holds one window's observations at a time.
The box, the vertical taper and the kinds' own smaller radii make it a superset; the search drops the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from enkflow.analysis.balance import split_equal_cost
from enkflow.analysis.geometry import embed, search_reach_chord
from enkflow.config import Metric
from enkflow.parallel import Comm

#: Relative slack on the reach: a superset where rounding could tip a boundary case.
SLACK = 1e-6


def owners(first_row: np.ndarray, io_bounds: np.ndarray) -> np.ndarray:
    """The rank (n,) int64 whose block of ``io_bounds`` (P + 1,) holds each state row ``first_row`` (n,)."""
    return np.searchsorted(np.asarray(io_bounds, dtype=np.int64), first_row, side="right") - 1


def windows_of_equal_cost(chunk_cost: np.ndarray, chunks: list[tuple[int, int]], rounds: int) -> list[tuple[int, int]]:
    """``rounds`` consecutive domain ranges ``(start, stop)`` (some may be empty) of whole ``chunks`` (the
    local filter's ranges of domains, in order) and about equal total ``chunk_cost`` (len(chunks),)."""
    b = split_equal_cost(np.asarray(chunk_cost, dtype=np.float64), rounds)
    out = []
    for i in range(rounds):
        c0, c1 = int(b[i]), int(b[i + 1])
        out.append((chunks[c0][0], chunks[c1 - 1][1]) if c1 > c0 else (0, 0))
    return out


@dataclass(frozen=True)
class DomainWindows:
    """Every rank's windows: ``rank`` and ``window`` (n_boxes,) int64, and the bounding boxes ``lo``, ``hi``
    (n_boxes, n_embedded_dim) of their domains' embedded horizontal coordinates; ``metric`` and ``period``
    measure the distance to a box (a ring's box is an arc [lo, hi])."""

    rank: np.ndarray
    window: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    metric: Metric
    period: float | None

    @classmethod
    def gather(cls, comm: Comm, metric: Metric, period: float | None,
               boxes: list[tuple[int, np.ndarray, np.ndarray]]) -> "DomainWindows":
        """Every rank's ``boxes`` (window, lo, hi) of its non-empty windows, the same on every rank (collective)."""
        every = comm.allgather_obj([(w, lo.tolist(), hi.tolist()) for w, lo, hi in boxes])
        rank = [p for p, b in enumerate(every) for _ in b]
        window = [x[0] for b in every for x in b]
        lo = [x[1] for b in every for x in b]
        hi = [x[2] for b in every for x in b]
        d = len(lo[0]) if lo else 1
        return cls(np.array(rank, np.int64), np.array(window, np.int64), np.array(lo, np.float64).reshape(-1, d),
                   np.array(hi, np.float64).reshape(-1, d), metric, period)

    def holders(self, coords: np.ndarray, support: float, window: int) -> tuple[np.ndarray, np.ndarray]:
        """``(rank, obs)``, each (n_pairs,) int64: every rank whose window ``window`` holds observation ``i``
        at ``coords`` (n, n_dim) for a search of radius ``support``; observations ascending within a rank."""
        reach = search_reach_chord(self.metric, support) * (1.0 + SLACK)
        emb = embed(self.metric, coords)
        ranks, idx = [], []
        for b in np.flatnonzero(self.window == window):
            near = np.flatnonzero(self._box_distance(emb, self.lo[b], self.hi[b]) <= reach)
            ranks.append(np.full(near.size, self.rank[b], np.int64))
            idx.append(near.astype(np.int64))
        if not ranks:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(ranks), np.concatenate(idx)

    def _box_distance(self, emb: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """(n,) distance from each embedded location to the box [lo, hi] (on the ring: to the arc)."""
        if self.metric is Metric.PERIODIC and self.period is not None:
            x = emb[:, 0]
            inside = (x >= lo[0]) & (x <= hi[0])
            to_lo, to_hi = np.mod(lo[0] - x, self.period), np.mod(x - hi[0], self.period)
            return np.where(inside, 0.0, np.minimum(to_lo, to_hi))
        gap = np.maximum(np.maximum(lo - emb, emb - hi), 0.0)
        return np.sqrt((gap * gap).sum(axis=1))


def box_of(metric: Metric, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bounding box (lo, hi) of domain coordinates (n, n_dim; n >= 1) in the search's embedded coordinates."""
    emb = embed(metric, coords)
    return emb.min(axis=0), emb.max(axis=0)
