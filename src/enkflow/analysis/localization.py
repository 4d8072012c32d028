"""Observation localization settings: taper, half-width and metric, and the
local-observation query that turns them into (indices, weights)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from enkflow.analysis import taper as _taper
from enkflow.analysis.geometry import Geometry, Neighbours
from enkflow.config import LocalizationConfig, Metric, RadiusConvention, Taper
from enkflow.errors import InputError


@dataclass(frozen=True, kw_only=True)
class Localization:
    """``half_width`` is the GC half-width c (km on the sphere, the
    coordinates' units otherwise); weights vanish at distance 2c. Build from a PDAF-style cut-off
    radius with ``Localization.from_radius(r, RadiusConvention.CUTOFF, ...)``."""

    half_width: float
    taper: Taper = Taper.GASPARI_COHN
    metric: Metric = Metric.CARTESIAN
    period: float | None = None
    # At most this many observations per domain, the nearest (an approximation; None: all of them).
    max_obs: int | None = None
    # Per-observation half-widths (observation kinds with their own radius, ObsSet.half_width), set by
    # for_obs for one analysis; None: half_width for every observation.
    obs_half_width: np.ndarray | None = field(default=None, compare=False, repr=False)
    # Vertical localization: the GC half-width of a second taper on the vertical distance (levels or the
    # vertical coordinate's units). Domain coordinates then carry the vertical coordinate as their last
    # column, observations theirs in ObsSet.vcoord; the weight is the product of the two tapers.
    vertical_half_width: float | None = None
    vertical_taper: Taper | None = None

    def __post_init__(self) -> None:
        if not (np.isfinite(self.half_width) and self.half_width > 0):
            raise InputError(f"localization half-width must be > 0, got {self.half_width!r}", item="localization.radius")
        if self.metric is Metric.PERIODIC and not (self.period and self.period > 0):
            raise InputError("the periodic metric needs period > 0", item="localization.period")
        if self.vertical_half_width is not None and not (np.isfinite(self.vertical_half_width)
                                                         and self.vertical_half_width > 0):
            raise InputError(f"vertical half-width must be > 0, got {self.vertical_half_width!r}",
                             item="localization.vertical_radius")
        if self.max_obs is not None and self.max_obs < 1:
            raise InputError(f"localization.max_obs must be >= 1, got {self.max_obs}", item="localization.max_obs")

    @classmethod
    def from_radius(cls, radius: float, convention: RadiusConvention = RadiusConvention.HALF_WIDTH, **kw) -> "Localization":
        return cls(half_width=_taper.half_width(radius, convention), **kw)

    @classmethod
    def from_config(cls, cfg: LocalizationConfig) -> "Localization":
        vr = getattr(cfg, "vertical_radius", None)
        return cls.from_radius(cfg.radius, cfg.convention, taper=cfg.taper, metric=cfg.metric, period=cfg.period,
                               max_obs=getattr(cfg, "max_obs", None),
                               vertical_half_width=None if vr is None else _taper.half_width(vr, cfg.convention),
                               vertical_taper=getattr(cfg, "vertical_taper", None))

    @property
    def vertical(self) -> bool:
        return self.vertical_half_width is not None

    def horizontal(self, dom_coords: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``(horizontal coordinates, vertical coordinate or None)`` of domain coordinates (n_dom, n_dim):
        with vertical localization the last column is the vertical coordinate."""
        dc = np.asarray(dom_coords, dtype=np.float64)
        dc = dc[:, None] if dc.ndim == 1 else dc
        if not self.vertical:
            return dc, None
        if dc.shape[1] < 2:
            raise InputError("vertical localization needs domain coordinates with the vertical coordinate as their "
                             f"last column; got {dc.shape[1]} column(s)", item="domain coordinates")
        return dc[:, :-1], np.ascontiguousarray(dc[:, -1])

    def vertical_weights(self, offsets: np.ndarray, idx: np.ndarray, wt: np.ndarray, dom_z: np.ndarray,
                         obs_z: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The CSR ``(offsets, idx, wt)`` of horizontal weights times the vertical taper of
        ``|dom_z[domain] - obs_z[idx]|``; pairs of zero weight dropped."""
        if obs_z is None:
            raise InputError("vertical localization needs each observation's vertical coordinate (ObsSet.vcoord: "
                             "the observation file's 'level', or the observed row's)", item="obs.vcoord")
        dom = np.repeat(np.arange(offsets.size - 1), np.diff(offsets))
        w = wt * _taper.weights(self.vertical_taper or self.taper, np.abs(dom_z[dom] - obs_z[idx]),
                                self.vertical_half_width)
        keep = w > 0.0
        if keep.all():
            return offsets, idx, w
        new = np.zeros_like(offsets)
        np.cumsum(np.bincount(dom[keep], minlength=offsets.size - 1), out=new[1:])
        return new, idx[keep], w[keep]

    def for_obs(self, obs) -> "Localization":
        """This localization for the observations ``obs`` (an ObsSet): with their own half-widths
        (``obs.half_width``, per kind) where they have them."""
        if getattr(obs, "half_width", None) is None:
            return self if self.obs_half_width is None else dataclasses.replace(self, obs_half_width=None)
        return dataclasses.replace(self, obs_half_width=obs.half_width)

    @property
    def support(self) -> float:
        """Distance at and beyond which observations have zero weight (the largest over the observations'
        half-widths where they have their own)."""
        c = self.half_width
        if self.obs_half_width is not None and self.obs_half_width.size:
            c = max(c, float(self.obs_half_width.max()))
        return _taper.support(self.taper, c)

    def local_obs(self, geometry: Geometry, dom_coords: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(offsets, idx, weight)`` CSR of the observations with non-zero weight per domain
        (with ``max_obs``, the ``max_obs`` nearest of them), observations ascending within a domain."""
        if self.max_obs is None:
            nb = geometry.neighbours(dom_coords, self.support)
        else:
            nb = geometry.nearest(dom_coords, self.support, self.max_obs)
        return self.weights(nb)

    def weights(self, nb: Neighbours) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(offsets, idx, weight)``: the taper weights of the neighbours ``nb``, pairs of zero weight dropped."""
        c = self.half_width if self.obs_half_width is None else self.obs_half_width[nb.idx]
        wt = _taper.weights(self.taper, nb.dist, c)
        keep = wt > 0.0
        nb = nb.select(keep)
        return nb.offsets, nb.idx, wt if keep.all() else wt[keep]
