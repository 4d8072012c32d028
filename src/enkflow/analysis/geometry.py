"""Localization as a geometry service: for a batch of analysis domains, which
observations are within reach, and how far away.

Metrics (coordinates and units):

- ``sphere``: (lon, lat) in degrees; great-circle distance in km on a sphere
  of radius 6371 km. The search uses a KD-tree on 3-D unit vectors with the
  chordal radius 2 sin(d / 2R).
- ``cartesian``: 1, 2 or 3 coordinates in the state coordinates' units (grid index steps where the
  state has none); Euclidean distance.
- ``periodic``: one coordinate on a ring of ``period``, in that coordinate's units.

Results come as CSR arrays, observation indices sorted within each domain,
so the analysis adds the same terms in the same order whatever the rank count.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from scipy.spatial import cKDTree

from enkflow.analysis.search import RHO_FRACTION, BlockedPairs
from enkflow.config import Metric
from enkflow.errors import InputError

EARTH_RADIUS_KM = 6371.0


def chord_radius(metric: Metric, r: float) -> float:
    """A distance ``r`` of ``metric`` (km on the sphere) between embedded locations (:func:`embed`), with the
    search's slack."""
    if metric is Metric.SPHERE:
        ang = min(r / EARTH_RADIUS_KM, np.pi)
        return float(2.0 * np.sin(0.5 * ang) * (1.0 + 1e-12))
    return float(r)


def search_reach_chord(metric: Metric, r: float) -> float:
    """The embedded distance within which a search of radius ``r`` may look at an observation (its
    candidates, :mod:`enkflow.analysis.search`): the chordal radius plus the search blocks' extent."""
    return chord_radius(metric, r) * (1.0 + RHO_FRACTION)


def embed(metric: Metric, coords: np.ndarray) -> np.ndarray:
    """Coordinates (n, n_dim) as the search measures them: unit-sphere x, y, z on the sphere, else themselves."""
    c = np.asarray(coords, dtype=np.float64)
    c = c[:, None] if c.ndim == 1 else c
    return lonlat_to_xyz(c) if metric is Metric.SPHERE else np.ascontiguousarray(c)


def lonlat_to_xyz(coords: np.ndarray) -> np.ndarray:
    """(n, 2) lon/lat degrees -> (n, 3) unit vectors."""
    lon = np.deg2rad(coords[:, 0])
    lat = np.deg2rad(coords[:, 1])
    c = np.cos(lat)
    return np.column_stack((c * np.cos(lon), c * np.sin(lon), np.sin(lat)))


@dataclass(frozen=True)
class Neighbours:
    """Observations near each of ``n_dom`` domains, CSR layout.

    ``offsets`` (n_dom + 1,) int64; ``idx`` (nnz,) int64 observation indices,
    ascending within a domain; ``dist`` (nnz,) float64 distances (km on the
    sphere, the coordinates' units otherwise).
    """

    offsets: np.ndarray
    idx: np.ndarray
    dist: np.ndarray

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def select(self, keep: np.ndarray) -> "Neighbours":
        """The pairs where ``keep`` (nnz,) bool is set, same layout."""
        if keep.all():
            return self
        n_dom = self.offsets.size - 1
        dom = np.repeat(np.arange(n_dom), self.counts)[keep]
        offsets = np.zeros_like(self.offsets)
        np.cumsum(np.bincount(dom, minlength=n_dom), out=offsets[1:])
        return Neighbours(offsets, self.idx[keep], self.dist[keep])


def _nearest(offsets: np.ndarray, dist: np.ndarray, k: int) -> np.ndarray:
    """Mask (n_pairs,) of the ``k`` nearest pairs of each domain of the CSR ``offsets`` (ties: the lower
    observation index, as the pairs are in ascending observation order within a domain)."""
    n_dom = offsets.size - 1
    dom = np.repeat(np.arange(n_dom), np.diff(offsets))
    order = np.lexsort((np.arange(dist.size), dist, dom))  # by domain, then distance, then position
    rank = np.empty(dist.size, np.int64)
    rank[order] = np.arange(dist.size) - offsets[dom[order]]
    return rank < k


@dataclass(frozen=True)
class Geometry:
    """Distance metric and local search over a fixed set of observation locations."""

    metric: Metric
    obs_coords: np.ndarray  # (n_obs, n_dim)
    period: float | None = None
    _tree: cKDTree = field(init=False, repr=False, compare=False)
    _embedded: np.ndarray = field(init=False, repr=False, compare=False)  # (n_obs, n_embedded_dim)

    def __post_init__(self) -> None:
        c = np.asarray(self.obs_coords, dtype=np.float64)
        if c.ndim == 1:
            c = c[:, None]
        self._check_coords(c, "obs.coords")
        object.__setattr__(self, "obs_coords", c)
        emb = np.ascontiguousarray(self._embed(c))
        object.__setattr__(self, "_embedded", emb)
        object.__setattr__(self, "_tree", cKDTree(emb, boxsize=self._boxsize(), balanced_tree=False))

    def _boxsize(self) -> float | None:
        return self.period if self.metric is Metric.PERIODIC else None

    def _check_coords(self, c: np.ndarray, name: str) -> None:
        ndim = c.shape[1]
        if self.metric is Metric.SPHERE:
            if ndim != 2:
                raise InputError(f"{name}: the sphere metric needs (lon, lat) pairs, got {ndim} column(s)", item=name)
            bad = np.flatnonzero((np.abs(c[:, 1]) > 90.0) | ~np.isfinite(c).all(axis=1))
            if bad.size:
                raise InputError(f"{name}[{bad[0]}] = {tuple(c[bad[0]])} is not a valid (lon, lat) in degrees (|lat| <= 90)", item=name, index=int(bad[0]))
        elif self.metric is Metric.PERIODIC:
            if ndim != 1:
                raise InputError(f"{name}: the periodic metric takes one coordinate, got {ndim}", item=name)
            if self.period is None or self.period <= 0:
                raise InputError("the periodic metric needs period > 0", item="localization.period")
            bad = np.flatnonzero((c[:, 0] < 0) | (c[:, 0] >= self.period) | ~np.isfinite(c[:, 0]))
            if bad.size:
                raise InputError(f"{name}[{bad[0]}] = {c[bad[0], 0]} is outside the domain [0, {self.period})", item=name, index=int(bad[0]))
        else:
            if not 1 <= ndim <= 3:
                raise InputError(f"{name}: the Cartesian metric takes 1 to 3 coordinates, got {ndim}", item=name)
            bad = np.flatnonzero(~np.isfinite(c).all(axis=1))
            if bad.size:
                raise InputError(f"{name}[{bad[0]}] is not finite", item=name, index=int(bad[0]))

    def check_domain_coords(self, dom_coords: np.ndarray) -> None:
        """Raise InputError unless ``dom_coords`` (n_dom, n_dim) are valid in this metric."""
        dc = np.asarray(dom_coords, dtype=np.float64)
        dc = dc[:, None] if dc.ndim == 1 else dc
        if dc.shape[1] != self.obs_coords.shape[1]:
            raise InputError(
                f"domain coordinates have {dc.shape[1]} column(s), the observations {self.obs_coords.shape[1]}",
                item="domain coordinates",
            )
        self._check_coords(dc, "domain coordinates")

    def _embed(self, c: np.ndarray) -> np.ndarray:
        return embed(self.metric, c)

    def _search_radius(self, r: float) -> float:
        return chord_radius(self.metric, r)

    def chord_to_distance(self, chord: np.ndarray) -> np.ndarray:
        if self.metric is Metric.SPHERE:
            return 2.0 * EARTH_RADIUS_KM * np.arcsin(np.minimum(0.5 * chord, 1.0))
        return chord

    def distances(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Distance between matching rows of coordinate arrays ``a`` and ``b`` (n, n_dim)."""
        if self.metric is Metric.SPHERE:
            return self.chord_to_distance(np.linalg.norm(lonlat_to_xyz(a) - lonlat_to_xyz(b), axis=1))
        diff = np.abs(a - b)
        if self.metric is Metric.PERIODIC:
            diff = np.minimum(diff, self.period - diff)
        return np.sqrt((diff * diff).sum(axis=1))

    def counts(self, dom_coords: np.ndarray, radius: float) -> np.ndarray:
        """Number of observations within ``radius`` of each domain (n_dom,) int64, without listing them."""
        dc = np.asarray(dom_coords, dtype=np.float64)
        dc = dc[:, None] if dc.ndim == 1 else dc
        if dc.shape[0] == 0 or self.obs_coords.shape[0] == 0:
            return np.zeros(dc.shape[0], np.int64)
        return np.asarray(self._tree.query_ball_point(self._embed(dc), self._search_radius(radius), return_length=True), dtype=np.int64)

    def nearest(self, dom_coords: np.ndarray, radius: float, k: int) -> Neighbours:
        """The ``k`` nearest observations closer than ``radius`` to each domain centre (fewer where
        fewer are that close), in ascending observation order; ties at the k-th distance go to the
        lower observation index. One k-nearest query per domain: cheaper than listing every
        observation within the radius where that radius holds many more than ``k``."""
        dc = np.asarray(dom_coords, dtype=np.float64)
        dc = dc[:, None] if dc.ndim == 1 else dc
        self._check_coords(dc, "domain coordinates")
        n_dom, n_obs = dc.shape[0], self.obs_coords.shape[0]
        if n_dom == 0 or n_obs == 0:
            return Neighbours(np.zeros(n_dom + 1, np.int64), np.zeros(0, np.int64), np.zeros(0))
        kq = min(k + 1, n_obs)
        chord, j = self._tree.query(self._embed(dc), k=kq, distance_upper_bound=self._search_radius(radius))
        chord, j = chord.reshape(n_dom, kq), j.reshape(n_dom, kq)
        # A tie across the k-th place: the query's order among equals is not defined, so those domains
        # take the exact route (every neighbour, then the k nearest by distance and index).
        tie = np.zeros(n_dom, bool) if kq <= k else np.isfinite(chord[:, k]) & (chord[:, k - 1] == chord[:, k])
        chord, j = chord[:, :k], j[:, :k]
        dist = self.chord_to_distance(np.where(np.isfinite(chord), chord, 0.0))
        ok = np.isfinite(chord) & (dist < radius) & ~tie[:, None]
        dom_of = np.broadcast_to(np.arange(n_dom)[:, None], ok.shape)[ok]
        idx, dd = j[ok].astype(np.int64), dist[ok]
        if tie.any():
            t = np.flatnonzero(tie)
            nb = self.neighbours(dc[t], radius)
            keep = _nearest(nb.offsets, nb.dist, k)
            dom_of = np.concatenate([dom_of, np.repeat(t, nb.counts)[keep]])
            idx, dd = np.concatenate([idx, nb.idx[keep]]), np.concatenate([dd, nb.dist[keep]])
        order = np.lexsort((idx, dom_of))
        offsets = np.zeros(n_dom + 1, np.int64)
        np.cumsum(np.bincount(dom_of, minlength=n_dom), out=offsets[1:])
        return Neighbours(offsets, idx[order], dd[order])

    def search(self, dom_coords: np.ndarray, radius: float) -> "LocalSearch":
        """A planned search for the observations strictly closer than ``radius`` to each domain
        centre: ``dom_coords`` (n_dom, n_dim) in the metric's coordinates, ``radius`` in km
        (sphere) or the coordinates' units. Neighbouring domains should be neighbours in the given order
        (rows of a grid are), as the search runs per block of consecutive domains."""
        dc = np.asarray(dom_coords, dtype=np.float64)
        if dc.ndim == 1:
            dc = dc[:, None]
        self._check_coords(dc, "domain coordinates")
        plan = BlockedPairs.plan(self._embed(dc), self._embedded, self._tree, self._boxsize() or 0.0,
                                 self._search_radius(radius))
        return LocalSearch(self, float(radius), plan)

    def neighbours(self, dom_coords: np.ndarray, radius: float) -> Neighbours:
        """Observations strictly closer than ``radius`` to each domain centre (see :meth:`search`)."""
        return self.search(dom_coords, radius).neighbours()


@dataclass(frozen=True)
class LocalSearch:
    """The blocked search of :meth:`Geometry.search`: split it into :meth:`parts` of bounded size,
    and list each part's :meth:`neighbours`."""

    geometry: Geometry
    radius: float
    plan: BlockedPairs

    @property
    def n_domains(self) -> int:
        return self.plan.pts.shape[0]

    def parts(self, max_pairs: int) -> Iterator[tuple[int, int]]:
        """Consecutive domain ranges ``(start, stop)`` of about ``max_pairs`` candidate pairs at most."""
        return self.plan.parts(max_pairs)

    def neighbours(self, start: int = 0, stop: int | None = None) -> Neighbours:
        """The neighbours of domains ``[start, stop)``, a range of :meth:`parts` (default: all)."""
        offsets, idx, chord = self.plan.pairs(start, stop)
        nb = Neighbours(offsets, idx, self.geometry.chord_to_distance(chord))
        # The chordal radius carries a little slack: the exact distance decides.
        return nb.select(nb.dist < self.radius)
