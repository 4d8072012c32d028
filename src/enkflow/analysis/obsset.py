"""An observation set: values, error variances, coordinates and kinds.

Defined with the analysis (which consumes it); `enkflow.obs` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np

from enkflow.errors import InputError


@dataclass(frozen=True, eq=False)
class ObsSet:
    """Observations of one analysis time.

    Attributes
    ----------
    values : (n_obs,) float64
        Observed values y.
    error_var : (n_obs,) float64
        Observation error variances, the diagonal of R; all > 0.
    coords : (n_obs, n_dim) float64
        Locations in the localization metric's coordinates: (lon, lat) in
        degrees on the sphere, the state coordinates' units on the Cartesian or periodic metric.
    kinds : (n_obs,) int32
        Observation kind codes (0 when there is only one kind).
    half_width : (n_obs,) float64 or None
        Localization half-width of each observation (the metric's units), where observation kinds
        have their own radius; None: the filter's localization for all.
    vcoord : (n_obs,) float64 or None
        Vertical coordinate of each observation (levels or the configured vertical coordinate's
        units), for vertical localization; None: the observations have none.
    """

    values: np.ndarray
    error_var: np.ndarray
    coords: np.ndarray
    # None (the default) becomes zeros (n_obs,) in __post_init__, so readers always see an array; cast because
    # a dataclass field has one type for its parameter and its attribute.
    kinds: np.ndarray = field(default=cast(np.ndarray, None))
    half_width: np.ndarray | None = None
    vcoord: np.ndarray | None = None

    def __post_init__(self) -> None:
        v = np.ascontiguousarray(self.values, dtype=np.float64).reshape(-1)
        n = v.size
        r = np.ascontiguousarray(self.error_var, dtype=np.float64).reshape(-1)
        c = np.asarray(self.coords, dtype=np.float64)
        if c.ndim == 1:
            c = c.reshape(-1, 1)
        c = np.ascontiguousarray(c)
        k = np.zeros(n, np.int32) if self.kinds is None else np.ascontiguousarray(self.kinds, dtype=np.int32)
        if r.shape != (n,):
            raise InputError(f"obs.error_var has shape {r.shape}, expected ({n},) like obs.values", item="obs.error_var")
        if c.shape[0] != n:
            raise InputError(f"obs.coords has {c.shape[0]} rows, expected {n} (one per observation)", item="obs.coords")
        if k.shape != (n,):
            raise InputError(f"obs.kinds has shape {k.shape}, expected ({n},)", item="obs.kinds")
        for name, a in (("obs.values", v), ("obs.error_var", r), ("obs.coords", c)):
            bad = ~np.isfinite(a)
            if bad.any():
                first = np.argwhere(bad)[0]
                raise InputError(f"{name} holds NaN or Inf at index {tuple(int(i) for i in first)}", item=name, index=tuple(int(i) for i in first))
        if n and (r <= 0).any():
            i = int(np.argmax(r <= 0))
            raise InputError(f"obs.error_var must be > 0; observation {i} has {float(r[i])}", item="obs.error_var", index=i)
        object.__setattr__(self, "values", v)
        object.__setattr__(self, "error_var", r)
        object.__setattr__(self, "coords", c)
        object.__setattr__(self, "kinds", k)
        for name in ("half_width", "vcoord"):
            a = getattr(self, name)
            if a is None:
                continue
            a = np.ascontiguousarray(a, dtype=np.float64).reshape(-1)
            if a.shape != (n,):
                raise InputError(f"obs.{name} has shape {a.shape}, expected ({n},)", item=f"obs.{name}")
            bad = ~np.isfinite(a) if name == "vcoord" else ~(np.isfinite(a) & (a > 0))
            if bad.any():
                i = int(np.argmax(bad))
                raise InputError(f"obs.{name}[{i}] = {float(a[i])!r} is not valid", item=f"obs.{name}", index=i)
            object.__setattr__(self, name, a)

    @property
    def n_obs(self) -> int:
        return int(self.values.size)

    def subset(self, idx: np.ndarray) -> "ObsSet":
        """The observations at positions ``idx``."""
        return ObsSet(self.values[idx], self.error_var[idx], self.coords[idx], self.kinds[idx],
                      None if self.half_width is None else self.half_width[idx],
                      None if self.vcoord is None else self.vcoord[idx])
