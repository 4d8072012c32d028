"""Blocked local search: the (domain, observation) pairs within a radius,
found block by block (``_c/search.c`` says why).

Domains are cut, in their given order, into blocks of neighbours (at most
``BLOCK_MAX`` domains, all within ``RHO_FRACTION`` of the radius of the
block's first domain). One KD-tree search per block lists the candidate
observations within r + rho of that first domain; the compiled loop then
measures every domain of the block against the candidates. The pairs come
out by domain, observations ascending, with no sort of the pairs, and a
pair's distance depends only on its two points: the result does not depend
on where the blocks fall (so not on the rank count either).

All coordinates here are embedded (``Geometry._embed``) and distances are in
embedded units (chords on the sphere).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from scipy.spatial import cKDTree

from enkflow.analysis import clib

BLOCK_MAX = 256  # domains per block, at most
RHO_FRACTION = 0.25  # block radius / search radius: at most (1.25)^2 candidates per pair on a 2-D surface


@dataclass(frozen=True)
class BlockedPairs:
    """A search planned for ``n_dom`` domains.

    ``starts`` (n_blocks + 1,) domain boundaries of the blocks; block b's
    candidate observations are ``cand[cand_offsets[b]:cand_offsets[b+1]]``,
    ascending. ``pts`` (n_dom, n_dim) domain and ``obs`` (n_obs, n_dim)
    observation coordinates, C-order; ``box`` the period (0: none); ``r``
    the search radius.
    """

    starts: np.ndarray
    cand_offsets: np.ndarray
    cand: np.ndarray
    pts: np.ndarray
    obs: np.ndarray
    box: float
    r: float

    @classmethod
    def plan(cls, pts: np.ndarray, obs: np.ndarray, tree: cKDTree, box: float, r: float) -> "BlockedPairs":
        """Blocks and their candidates; ``tree`` is the KD-tree of ``obs``."""
        pts = np.ascontiguousarray(pts, dtype=np.float64)
        n, ndim = pts.shape
        rho = RHO_FRACTION * r
        starts = np.empty(n + 1, np.int64)
        nb = int(clib.lib().enk_domain_blocks(n, ndim, pts, box, rho, BLOCK_MAX, starts)) if n else 0
        starts = starts[: nb + 1] if n else np.zeros(1, np.int64)
        centres = pts[starts[:-1]]
        n_obs = obs.shape[0]
        if nb and n_obs:
            ctree = cKDTree(centres, boxsize=box or None, balanced_tree=False)
            # The slack keeps every true candidate despite rounding; extra ones are measured and dropped.
            pr = ctree.sparse_distance_matrix(tree, (r + rho) * (1.0 + 1e-9), output_type="ndarray")
            key = pr["i"].astype(np.int64) * n_obs + pr["j"]
            key.sort()
            block = key // n_obs
            cand = key - block * n_obs
        else:
            block = cand = np.zeros(0, np.int64)
        offsets = np.zeros(nb + 1, np.int64)
        np.cumsum(np.bincount(block, minlength=nb), out=offsets[1:])
        return cls(starts, offsets, cand, pts, np.ascontiguousarray(obs, dtype=np.float64), float(box), float(r))

    @property
    def n_blocks(self) -> int:
        return self.starts.size - 1

    def bounds(self) -> np.ndarray:
        """(n_blocks,) pairs each block can yield at most: its domains times its candidates."""
        return np.diff(self.starts) * np.diff(self.cand_offsets)

    def parts(self, max_pairs: int) -> Iterator[tuple[int, int]]:
        """Consecutive domain ranges ``(start, stop)`` at block boundaries whose pairs fit in
        about ``max_pairs`` (a single block that does not fit is a range of its own)."""
        cum = np.cumsum(self.bounds())
        lo = 0
        while lo < self.n_blocks:
            base = cum[lo - 1] if lo else 0
            hi = max(int(np.searchsorted(cum, base + max_pairs, side="right")), lo + 1)
            yield int(self.starts[lo]), int(self.starts[hi])
            lo = hi

    def pairs(self, start: int = 0, stop: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(offsets, idx, dist)`` CSR of the pairs within ``r`` for domains ``[start, stop)``
        (block boundaries): offsets (stop - start + 1,), idx (nnz,) observations ascending
        within a domain, dist (nnz,) embedded distances."""
        stop = self.pts.shape[0] if stop is None else stop
        b0, b1 = np.searchsorted(self.starts, [start, stop])
        if not 0 <= start <= stop <= self.pts.shape[0] or self.starts[b0] != start or self.starts[b1] != stop:
            raise ValueError(f"domains [{start}, {stop}) do not start and end at block boundaries")
        cap = int(self.bounds()[b0:b1].sum())
        offsets = np.zeros(stop - start + 1, np.int64)
        idx = np.empty(cap, np.int64)
        dist = np.empty(cap, np.float64)
        if b1 > b0:
            starts = np.ascontiguousarray(self.starts[b0 : b1 + 1])
            coff = np.ascontiguousarray(self.cand_offsets[b0 : b1 + 1])
            n = clib.lib().enk_block_pairs(b1 - b0, starts, self.pts.shape[1], self.pts, self.obs, self.box, coff,
                                           self.cand, self.r, cap, offsets, idx, dist)
            if n < 0:  # cannot happen: cap is an upper bound
                raise RuntimeError("blocked local search overflowed its bound")
        else:
            n = 0
        return offsets, idx[:n], dist[:n]
