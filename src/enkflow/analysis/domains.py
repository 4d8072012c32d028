"""Local analysis domains: which state rows are analysed together, and where.

A domain is a set of state rows sharing one local analysis (one set of local
observations and weights), located at one point. Usually a domain is one grid
point (all rows at that location: several variables or levels); a batch of
neighbouring points gives fewer, cheaper analyses at some accuracy cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from enkflow.errors import InputError


@dataclass(frozen=True)
class LocalDomains:
    """CSR grouping of a rank's rows into domains.

    ``offsets`` (n_dom + 1,) int64; ``rows`` (n,) int64 row indices (local to
    the rank's block), domain k owning ``rows[offsets[k]:offsets[k+1]]``;
    ``coords`` (n_dom, n_dim) float64 the domain centres.
    """

    offsets: np.ndarray
    rows: np.ndarray
    coords: np.ndarray

    def __post_init__(self) -> None:
        c = np.asarray(self.coords, dtype=np.float64)
        if c.ndim == 1:
            c = c[:, None]
        object.__setattr__(self, "coords", np.ascontiguousarray(c))
        object.__setattr__(self, "offsets", np.ascontiguousarray(self.offsets, dtype=np.int64))
        object.__setattr__(self, "rows", np.ascontiguousarray(self.rows, dtype=np.int64))
        if self.offsets.shape != (c.shape[0] + 1,) or self.offsets[0] != 0 or self.offsets[-1] != self.rows.size:
            raise InputError("domain offsets do not match rows and coordinates", item="domains")

    @property
    def n_domains(self) -> int:
        return int(self.coords.shape[0])

    @classmethod
    def per_row(cls, coords: np.ndarray) -> "LocalDomains":
        """One domain per row, at ``coords`` (n_rows, n_dim)."""
        c = np.asarray(coords, dtype=np.float64)
        n = c.shape[0]
        return cls(np.arange(n + 1, dtype=np.int64), np.arange(n, dtype=np.int64), c)

    @classmethod
    def by_location(cls, coords: np.ndarray) -> "LocalDomains":
        """Rows with identical coordinates (e.g. the levels or variables of one
        grid point) share a domain; domains ordered by first appearance."""
        c = np.asarray(coords, dtype=np.float64)
        if c.ndim == 1:
            c = c[:, None]
        _, first, inverse = np.unique(c, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        # Renumber groups in order of first appearance so the domain order is the row order.
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        return cls.from_groups(rank[inverse], c[np.sort(first)])

    @classmethod
    def from_groups(cls, group: np.ndarray, centres: np.ndarray) -> "LocalDomains":
        """Rows grouped by ``group`` (n_rows,) ints in [0, n_dom); ``centres`` (n_dom, n_dim)."""
        g = np.asarray(group, dtype=np.int64)
        n_dom = np.asarray(centres).shape[0]
        if g.size and (g.min() < 0 or g.max() >= n_dom):
            raise InputError(f"domain group ids must lie in [0, {n_dom})", item="domains")
        rows = np.argsort(g, kind="stable")
        offsets = np.zeros(n_dom + 1, np.int64)
        np.cumsum(np.bincount(g, minlength=n_dom), out=offsets[1:])
        return cls(offsets, rows, centres)

    def subset(self, start: int, stop: int) -> "LocalDomains":
        """Domains ``start:stop`` (offsets rebased)."""
        o = self.offsets[start : stop + 1]
        return LocalDomains(o - o[0], self.rows[o[0] : o[-1]], self.coords[start:stop])
