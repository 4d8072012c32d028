"""Serial ensemble square-root filter with covariance localization (EnSRF/EAKF).

The observations are assimilated one at a time, in the order of the observation set (after quality
control). For observation j with prior ensemble y (N,) = H(x)_j, anomalies y' (N,), innovation
d = y_j^o - mean(y), error variance r and prior variance v = y'.y' / (N - 1), the scalar square-root
update is (Whitaker & Hamill 2002, eqs. 10-13; Anderson 2003, eqs. 4.5-4.6 with a scalar
observation, the same update):

- observation space: mean increment  dm = v / (v + r) d,  anomalies  y'_new = s y',
  s = sqrt(r / (v + r))  (the anomaly factor 1 - alpha~ K H of Whitaker & Hamill's eq. 13);
- every other quantity z (a state row, or the prior H(x)_k of an observation k > j not yet
  assimilated) by linear regression on y (Anderson 2003, eq. 4.7), localized by the Gaspari-Cohn
  weight w of its distance to observation j (Hamill et al. 2001):
  beta = w z'.y' / y'.y',  mean(z) += beta dm,  z' += beta (s - 1) y'.

The state rows get w of the state-observation distance, the later observations' priors w of the
observation-observation distance; both use observation j's half-width (its kind's own radius where
it has one, :attr:`ObsSet.half_width`) and, with vertical localization, the product with the
vertical taper. Prior inflation (fixed) multiplies the anomalies of the rows and of H(x) first;
posterior inflation, RTPP and RTPS act on the result (:func:`~enkflow.analysis.inflation.inflate_posterior`).

Parallel algorithm (Anderson & Collins 2007, with the observation priors replicated): every rank
holds the full prior H(x) (n_obs, N), updates all of it identically, and updates its own state rows.
A row's result depends only on the observation sequence and the row itself (its weights are
functions of its coordinates and the observation's; the sums run over the members of that row,
row by row), so it has the same bits at any rank count.

Adaptive inflation (a scheme with :meth:`~enkflow.analysis.adaptive_inflation.AdaptiveScheme.update_serial`, as in DART; prior
inflation only): every row's
covariance factor lambda (the carried field, (n_rows, 2)) multiplies its prior covariance, and each
observation's prior is inflated by the factor at the observation (``obs_factor``); then, for every
observation, the factors of the rows within its support are updated before the rows are
(weight = localization x |correlation of the row with the observation| for DART's schemes, Anderson 2009,
sec. 3; the localization weight alone for a scheme that is not ``correlation_weighted``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from enkflow.analysis import clib
from enkflow.analysis import taper as _taper
from enkflow.analysis.adaptive_inflation import AdaptiveScheme
from enkflow.analysis.geometry import Geometry, Neighbours
from enkflow.analysis.global_filters import Filter
from enkflow.analysis.inflation import inflate_posterior
from enkflow.analysis.local_filters import LocalStats
from enkflow.analysis.localization import Localization
from enkflow.analysis.obsset import ObsSet
from enkflow.config import AdaptiveTarget
from enkflow.errors import InputError


@dataclass(frozen=True)
class _Pairs:
    """CSR of the neighbours of a range of observations: ``offsets`` (n + 1,), ``idx`` (nnz,) rows or
    observations ascending within an observation, ``weight`` (nnz,) localization weights in (0, 1]."""

    offsets: np.ndarray
    idx: np.ndarray
    weight: np.ndarray


@dataclass
class _Ensemble:
    """Mean ``mean`` (n,) and anomalies ``anom`` (n, N) C order, updated in place."""

    mean: np.ndarray
    anom: np.ndarray

    @classmethod
    def of(cls, E: np.ndarray, scale: np.ndarray | float) -> "_Ensemble":
        E = np.ascontiguousarray(E, dtype=np.float64)
        mean = E.mean(axis=1)
        anom = E - mean[:, None]
        anom *= scale
        return cls(mean, anom)

    def regress(self, p: _Pairs, j: int, y: np.ndarray, yy: float, dm: float, ds: np.ndarray) -> np.ndarray:
        """Update the rows ``p.idx[p.offsets[j]:p.offsets[j+1]]`` by regression on the anomalies ``y``
        (N,) with ``yy`` = y.y: mean += beta dm, anomalies += beta ds (ds = (s - 1) y); returns beta."""
        sl = slice(p.offsets[j], p.offsets[j + 1])
        rows = p.idx[sl]
        Z = self.anom[rows]
        # Elementwise products summed per row (not a BLAS product): a row's bits do not depend on its neighbours.
        beta = p.weight[sl] * ((Z * y).sum(axis=1) / yy)
        self.mean[rows] += beta * dm
        Z += beta[:, None] * ds
        self.anom[rows] = Z
        return beta


@dataclass(frozen=True)
class _Adaptive:
    """An adaptive scheme with the rows' field ``field`` (n_rows, 2), updated in place, the factor at
    each observation ``obs_factor`` (n_obs,), and (:meth:`with_prior`) each observation's prior variance
    without the adaptive factor ``prior_var`` and innovation ``innovation`` (n_obs,), as they were before
    the first observation of the cycle was assimilated."""

    scheme: AdaptiveScheme
    field: np.ndarray
    obs_factor: np.ndarray
    prior_var: np.ndarray | None = None
    innovation: np.ndarray | None = None

    def with_prior(self, ys: _Ensemble, obs: ObsSet) -> "_Adaptive":
        """This scheme with the cycle's original observation priors ``ys`` (before any update): the factor
        scales the original prior covariance, so each observation's update of it takes the original
        statistics (DART's ``orig_obs_prior_mean``/``_var``), not those left by the observations before it."""
        var = np.einsum("ij,ij->i", ys.anom, ys.anom) / (ys.anom.shape[1] - 1) / self.obs_factor
        return replace(self, prior_var=var, innovation=obs.values - ys.mean)

    @classmethod
    def of(cls, scheme: AdaptiveScheme | None, field: np.ndarray | None, obs_factor: np.ndarray | None, n_rows: int,
           n_obs: int) -> "_Adaptive | None":
        """The scheme with its checked arrays, or None without a scheme."""
        if scheme is None:
            return None
        if scheme.target is not AdaptiveTarget.PRIOR:
            raise InputError("the serial filter estimates prior inflation only (adaptive_target = 'prior')",
                             item="inflation.adaptive_target")
        if field is None or field.shape != (n_rows, 2) or field.dtype != np.float64:
            raise InputError(f"adaptive inflation needs the inflation field of the rows, float64 ({n_rows}, 2)",
                             item="infl_field")
        if not (np.isfinite(field).all() and (field > 0).all()):
            raise InputError("the inflation field holds values that are not finite and > 0", item="infl_field")
        if obs_factor is None or obs_factor.shape != (n_obs,) or not (np.isfinite(obs_factor).all()
                                                                       and (obs_factor > 0).all()):
            raise InputError(f"adaptive inflation needs the factor at each observation, ({n_obs},) finite and > 0",
                             item="obs_factor")
        return cls(scheme, field, obs_factor)

    def update(self, xs: _Ensemble, rows: _Pairs, k: int, j: int, y: np.ndarray, yy: float, r: float) -> None:
        """The factors of the rows within the support of observation ``k`` of the chunk (``j`` of the
        set), weighted by localization (x |correlation| where the scheme asks, Anderson 2009, sec. 3), before the
        rows are updated."""
        sl = slice(rows.offsets[k], rows.offsets[k + 1])
        idx = rows.idx[sl]
        weight = rows.weight[sl]
        if self.scheme.correlation_weighted:
            Z = xs.anom[idx]
            zz = (Z * Z).sum(axis=1)
            with np.errstate(divide="ignore", invalid="ignore"):
                weight = weight * np.where(zz > 0, np.abs((Z * y).sum(axis=1)) / np.sqrt(zz * yy), 0.0)
        self.field[idx] = self.scheme.update_serial(self.field[idx], weight, float(self.prior_var[j]), r,
                                                    float(self.innovation[j]), members=y.size)


@dataclass(frozen=True, kw_only=True)
class EnSRF(Filter):
    """Serial EnSRF/EAKF with covariance localization (module docstring). ``localization``: the
    taper, half-width, metric and vertical taper, as for the local filters; ``adaptive``: an adaptive
    inflation scheme with a serial update, or None; ``chunk``: observations per neighbour search,
    ``max_pairs``: (observation, row) pairs per update, about (both bound the neighbour lists' memory)."""

    localization: Localization
    adaptive: AdaptiveScheme | None = None
    chunk: int = 4096
    max_pairs: int = 2_000_000  # (observation, row) pairs per update call, about (bounds memory)
    # The local filters' statistics, a row counted as a domain: mean_local_obs is the observations per row.
    stats: LocalStats = field(default_factory=LocalStats, compare=False, repr=False)

    def as_serial(self) -> "EnSRF":
        return self

    def analyze(self, X: np.ndarray, HX: np.ndarray, obs: ObsSet, *, coords: np.ndarray | None = None, cycle: int = 0,
                infl_field: np.ndarray | None = None, obs_factor: np.ndarray | None = None) -> np.ndarray:
        """The analysis of this rank's rows (deterministic: ``cycle`` is not used).

        ``X`` (n_rows, N) prior rows of this rank; ``HX`` (n_obs, N) the full prior in observation
        space; ``coords`` (n_rows, n_dim) the rows' localization coordinates (with vertical
        localization the vertical coordinate last). With ``adaptive``: ``infl_field`` (n_rows, 2)
        float64, the rows' covariance factor and its deviation, replaced in place by the posterior
        ones; ``obs_factor`` (n_obs,) the factor at each observation (:func:`factor_at_obs`).
        Returns the analysis (n_rows, N), Fortran order."""
        self._check(X, HX, obs)
        loc = self.localization.for_obs(obs)
        obs_geo = Geometry(loc.metric, obs.coords, loc.period)
        hcoords, row_z = self._row_coords(X, coords, obs, obs_geo)
        adapt = _Adaptive.of(self.adaptive, infl_field, obs_factor, X.shape[0], obs.n_obs)
        lam = self.inflation.prior
        row_scale = lam if adapt is None else lam * np.sqrt(adapt.field[:, 0])[:, None]
        obs_scale = lam if adapt is None else lam * np.sqrt(adapt.obs_factor)[:, None]
        # C order throughout: every row reduced by the same contiguous loop, whatever the number of rows
        # (a lone row is also F-contiguous, and numpy would reduce it another way).
        Xc = np.ascontiguousarray(X, dtype=np.float64)
        xs, ys = _Ensemble.of(Xc, row_scale), _Ensemble.of(HX, obs_scale)
        if adapt is not None:
            adapt = adapt.with_prior(ys, obs)
        rows_geo = Geometry(loc.metric, hcoords, loc.period)
        st = self.stats
        for start, row_pairs, obs_pairs in self._chunks(loc, rows_geo, obs_geo, obs, row_z):
            t0 = time.perf_counter()
            self._assimilate(xs, ys, obs, start, row_pairs, obs_pairs, adapt)
            st.kernel_s += time.perf_counter() - t0
            st.n_local_obs += int(row_pairs.idx.size)
        st.n_domains += X.shape[0]
        Xa = xs.mean[:, None] + xs.anom
        inflate_posterior(Xa, Xc, self.inflation)
        return np.asfortranarray(Xa)

    def _row_coords(self, X: np.ndarray, coords: np.ndarray | None, obs: ObsSet,
                    obs_geo: Geometry) -> tuple[np.ndarray, np.ndarray | None]:
        """The rows' horizontal coordinates (n_rows, n_dim) and vertical one (n_rows,) or None, checked."""
        if coords is None:
            raise InputError("the serial filter needs the coordinates of its state rows", item="coords")
        c = np.asarray(coords, dtype=np.float64)
        c = c[:, None] if c.ndim == 1 else c
        if c.shape[0] != X.shape[0]:
            raise InputError(f"coords has {c.shape[0]} rows, the ensemble {X.shape[0]}", item="coords")
        if self.localization.vertical and obs.vcoord is None:
            raise InputError("vertical localization needs each observation's vertical coordinate (ObsSet.vcoord)",
                             item="obs.vcoord")
        h, z = self.localization.horizontal(c)
        obs_geo.check_domain_coords(h)
        return h, z

    def _chunks(self, loc: Localization, rows_geo: Geometry, obs_geo: Geometry, obs: ObsSet,
                row_z: np.ndarray | None) -> Iterator[tuple[int, _Pairs, _Pairs]]:
        """``(start, row pairs, observation pairs)`` of consecutive ranges of at most ``chunk``
        observations and about ``max_pairs`` (observation, row) pairs: the rows and the later
        observations within each observation's support, with their weights. Timed into ``search_s``."""
        for first in range(0, obs.n_obs, self.chunk):
            t0 = time.perf_counter()
            last = min(first + self.chunk, obs.n_obs)
            search = rows_geo.search(obs.coords[first:last], loc.support)
            self.stats.search_s += time.perf_counter() - t0
            for a, b in search.parts(self.max_pairs):
                t0 = time.perf_counter()
                start, stop = first + a, first + b
                oz = None if obs.vcoord is None else obs.vcoord[start:stop]
                rows = _weighted(loc, search.neighbours(a, b), start, oz, row_z)
                later = _weighted(loc, obs_geo.neighbours(obs.coords[start:stop], loc.support), start, oz, obs.vcoord)
                later = _select(later, later.idx > np.repeat(np.arange(start, stop), np.diff(later.offsets)))
                self.stats.search_s += time.perf_counter() - t0
                yield start, rows, later

    def _assimilate(self, xs: _Ensemble, ys: _Ensemble, obs: ObsSet, start: int, rows: _Pairs, later: _Pairs,
                    adapt: _Adaptive | None) -> None:
        """The observations ``start, start + 1, ...`` of the chunk one after the other: the compiled
        loop (``_c/serial.c``), or with adaptive inflation, whose scheme is Python, this one."""
        if adapt is None:
            n = rows.offsets.size - 1
            skipped = clib.lib().enk_serial_update(n, start, xs.anom.shape[1], rows.offsets, rows.idx, rows.weight,
                                                   later.offsets, later.idx, later.weight, obs.values, obs.error_var,
                                                   xs.mean, xs.anom, ys.mean, ys.anom)
            if skipped < 0:
                raise MemoryError("the serial filter's work buffer could not be allocated")
            return
        N1 = xs.anom.shape[1] - 1
        for k in range(rows.offsets.size - 1):
            j = start + k
            y = ys.anom[j].copy()
            yy = float((y * y).sum())
            if yy == 0.0:  # no spread: nothing regresses on this observation
                continue
            v, r = yy / N1, float(obs.error_var[j])
            d = float(obs.values[j] - ys.mean[j])
            dm = v / (v + r) * d
            ds = (np.sqrt(r / (v + r)) - 1.0) * y
            if adapt is not None:
                adapt.update(xs, rows, k, j, y, yy, r)
            xs.regress(rows, k, y, yy, dm, ds)
            ys.regress(later, k, y, yy, dm, ds)
            ys.mean[j] += dm
            ys.anom[j] += ds


def _weighted(loc: Localization, nb: Neighbours, start: int, oz: np.ndarray | None,
              other_z: np.ndarray | None) -> _Pairs:
    """The localization weights of neighbours ``nb`` (CSR by observation, from ``start``): the taper of
    each observation's own half-width, times the vertical taper of ``|oz - other_z|``; zero weights dropped."""
    n = nb.offsets.size - 1
    hw = loc.half_width if loc.obs_half_width is None else np.repeat(loc.obs_half_width[start:start + n], nb.counts)
    p = _Pairs(nb.offsets, nb.idx, _taper.weights(loc.taper, nb.dist, hw))
    if loc.vertical and oz is not None and other_z is not None:
        off, idx, wt = loc.vertical_weights(p.offsets, p.idx, p.weight, oz, other_z)
        p = _Pairs(off, idx, wt)
    return _select(p, p.weight > 0.0)


def _select(p: _Pairs, keep: np.ndarray) -> _Pairs:
    """The pairs of ``p`` where ``keep`` (nnz,) bool, same layout."""
    if keep.all():
        return p
    n = p.offsets.size - 1
    owner = np.repeat(np.arange(n), np.diff(p.offsets))[keep]
    offsets = np.zeros_like(p.offsets)
    np.cumsum(np.bincount(owner, minlength=n), out=offsets[1:])
    return _Pairs(offsets, p.idx[keep], p.weight[keep])


def factor_at_obs(field: np.ndarray, row_coords: np.ndarray, obs: ObsSet, localization: Localization) -> np.ndarray:
    """The covariance factor at each observation (n_obs,): that of the nearest state row within the
    localization's support (1 where none is), from the full field ``field`` (n_rows, 2) and every row's
    coordinates ``row_coords`` (n_rows, n_dim; the horizontal ones are used). Exact for observations
    of a state row; the same on every rank."""
    h = localization.horizontal(row_coords)[0]
    nb = Geometry(localization.metric, h, localization.period).nearest(obs.coords, localization.support, 1)
    out = np.ones(obs.n_obs)
    has = np.diff(nb.offsets) > 0
    out[has] = field[nb.idx, 0]
    return out
