"""Localization tapers and the radius conventions.

A taper maps a distance to a weight in [0, 1] that multiplies R^{-1}
(observation localization). Radius conventions (the trap every user falls in):

- Gaspari-Cohn: ``half_width`` c is the GC support half-width; the weight is
  0 at and beyond 2c. PDAF's "cut-off radius" is 2c, so c = cutoff / 2.
- Gaussian: ``half_width`` is the standard length scale L in exp(-d^2 / 2L^2);
  it is cut off at 2 * sqrt(10/3) L (the distance at which GC with the same
  curvature at 0 vanishes), where the weight is below 1.3e-3.
- Step: weight 1 for d < 2c (the same support as GC with half-width c).

`support(taper, half_width)` gives the distance beyond which the weight is 0;
the local search uses it as its radius.
"""

from __future__ import annotations

import numpy as np

from enkflow.config import RadiusConvention, Taper
from enkflow.errors import InputError

# Gaussian with the same second derivative at 0 as GC(c) has L = c * sqrt(3/10).
_GAUSS_L_PER_C = np.sqrt(0.3)


def half_width(radius: float, convention: RadiusConvention) -> float:
    """The GC half-width c for ``radius`` read under ``convention``."""
    if not (np.isfinite(radius) and radius > 0):
        raise InputError(f"localization radius must be a finite number > 0, got {radius!r}", item="localization.radius")
    return radius / 2.0 if convention is RadiusConvention.CUTOFF else float(radius)


def support(taper: Taper, c: float | np.ndarray) -> float | np.ndarray:
    """Distance at and beyond which the weight is zero (of each half-width where ``c`` is an array)."""
    return 2.0 * c


def gaspari_cohn(r: np.ndarray) -> np.ndarray:
    """Gaspari & Cohn (1999) eq. 4.10 as a function of r = d / c; 0 for r >= 2."""
    r = np.abs(np.asarray(r, dtype=np.float64))
    w = np.zeros_like(r)
    m1 = r <= 1.0
    m2 = (r > 1.0) & (r < 2.0)
    x = r[m1]
    w[m1] = (((-0.25 * x + 0.5) * x + 0.625) * x - 5.0 / 3.0) * x * x + 1.0
    x = r[m2]
    w[m2] = ((((x / 12.0 - 0.5) * x + 0.625) * x + 5.0 / 3.0) * x - 5.0) * x + 4.0 - 2.0 / (3.0 * x)
    return np.maximum(w, 0.0)


def weights(taper: Taper, dist: np.ndarray, c: float) -> np.ndarray:
    """Taper weights for distances ``dist`` (any shape, same units as ``c``)."""
    d = np.asarray(dist, dtype=np.float64)
    if taper is Taper.GASPARI_COHN:
        return gaspari_cohn(d / c)
    if taper is Taper.GAUSSIAN:
        L = c * _GAUSS_L_PER_C
        return np.where(d < 2.0 * c, np.exp(-0.5 * (d / L) ** 2), 0.0)
    if taper is Taper.STEP:
        return np.where(d < 2.0 * c, 1.0, 0.0)
    raise InputError(f"unknown taper {taper!r}; choose one of {[t.value for t in Taper]}", item="localization.taper")
