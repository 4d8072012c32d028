"""Local filters: LETKF (Hunt et al. 2007) and LESTKF (Nerger et al. 2012).

One local analysis per domain, using the observations within the taper's
support, with R^{-1} multiplied by the taper weight (observation
localization). Domains are processed in chunks: the local search for a chunk
runs, then the compiled kernel analyses the chunk, so memory stays bounded.

With symmetric square roots LETKF and LESTKF give the same analysis
ensemble; the compiled kernel computes that common result. The ``stats``
field accumulates timings over calls (it is the one mutable part of a filter). The
``reference`` kernel runs each filter's own per-domain LAPACK formulation
(the exact baseline that tests and benchmarks compare against).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from enkflow.analysis.adaptive_inflation import AdaptiveScheme
from enkflow.analysis.domains import LocalDomains
from enkflow.analysis.geometry import Geometry
from enkflow.analysis.global_filters import Filter
from enkflow.analysis.inflation import inflate_posterior
from enkflow.analysis.kernels import local_analysis
from enkflow.analysis.local_inflation import inflate_rows, update_domains
from enkflow.analysis.localization import Localization
from enkflow.analysis.obsset import ObsSet
from enkflow.analysis.transforms import estkf_weights, letkf_weights
from enkflow.config import AdaptiveTarget, Kernel
from enkflow.errors import InputError


@dataclass
class LocalStats:
    """Where the time went (seconds) and how big the local problems were."""

    search_s: float = 0.0
    kernel_s: float = 0.0
    n_domains: int = 0
    n_local_obs: int = 0
    fallbacks: int = 0

    @property
    def mean_local_obs(self) -> float:
        return self.n_local_obs / self.n_domains if self.n_domains else 0.0


@dataclass(frozen=True, kw_only=True)
class LocalFilter(Filter):
    """Base of the local filters: one analysis per domain of rows (:meth:`analyze`), with the
    observations its :class:`Localization` selects. A new local filter derives from it and sets
    ``_weights``; the cycle driver finds it local through :meth:`as_local`."""

    localization: Localization
    kernel: Kernel = Kernel.COMPILED
    chunk: int = 8192  # domains per local-search + kernel call, at most
    max_pairs: int = 2_000_000  # (domain, observation) pairs per call, about (bounds memory)
    stats: LocalStats = field(default_factory=LocalStats, compare=False, repr=False)
    # Adaptive inflation per domain (on top of inflation.prior / posterior); analyze() then needs infl_field.
    adaptive: AdaptiveScheme | None = None

    _weights = staticmethod(letkf_weights)

    def as_local(self) -> LocalFilter:
        return self

    def obs_geometry(self, obs: ObsSet) -> Geometry:
        """The search geometry of the observations ``obs`` in this filter's metric."""
        return Geometry(self.localization.metric, obs.coords, self.localization.period)

    def local_obs_counts(self, coords: np.ndarray, geometry: Geometry) -> np.ndarray:
        """How many observations of ``geometry`` a domain at each of ``coords`` (n, n_dim; with
        vertical localization the vertical coordinate last) analyses: (n,) float64, at most
        ``localization.max_obs``. The work of a domain grows with it (:mod:`enkflow.analysis.balance`)."""
        loc = self.localization
        h = loc.horizontal(coords)[0]
        geometry.check_domain_coords(h)
        counts = geometry.counts(h, loc.support).astype(np.float64)
        if loc.max_obs is not None:  # a capped domain analyses at most max_obs observations
            counts = np.minimum(counts, float(loc.max_obs))
        return counts

    def analyze(
        self,
        X: np.ndarray,
        HX: np.ndarray,
        obs: ObsSet,
        *,
        domains: LocalDomains,
        out: np.ndarray | None = None,
        geometry: Geometry | None = None,
        cycle: int = 0,
        infl_field: np.ndarray | None = None,
        consume_hx: bool = False,
    ) -> np.ndarray:
        """Local analysis of the rows in ``domains`` (``cycle`` selects a subclass's random draws).

        ``X`` (n_rows, N) prior rows of this rank; ``HX`` (n_obs, N) the full
        observation-space ensemble; ``out`` (n_rows, N) F-order may be ``X``
        itself for an in-place update. Rows in no domain are copied unchanged.
        ``infl_field`` (n_rows, 2) float64, with ``adaptive`` only: the prior covariance inflation
        factor of every row and the standard deviation of its estimate, replaced in place by the
        posterior ones; the posterior factor inflated this analysis, its prior or its analysis
        covariance as the scheme's ``target`` says (:mod:`enkflow.analysis.local_inflation`).
        ``consume_hx``: ``HX`` (C-order float64) may be overwritten: its perturbations are made in place
        (the same values), so the analysis holds one (n_obs, N) array instead of two.
        """
        self._check(X, HX, obs)
        if self.adaptive is not None:
            if infl_field is None or infl_field.shape != (X.shape[0], 2) or infl_field.dtype != np.float64:
                raise InputError(f"adaptive inflation needs the inflation field of the rows, float64 ({X.shape[0]}, 2)",
                                 item="infl_field")
            if not (np.isfinite(infl_field).all() and (infl_field > 0).all()):
                raise InputError("the inflation field holds values that are not finite and > 0", item="infl_field")
        if domains.rows.size and (domains.rows.min() < 0 or domains.rows.max() >= X.shape[0]):
            raise InputError(f"domain rows must lie in [0, {X.shape[0]})", item="domains")
        # Every check runs before the first row is written.
        geometry = geometry or self.obs_geometry(obs)
        geometry.check_domain_coords(self.localization.horizontal(domains.coords)[0])
        if self.localization.vertical and obs.vcoord is None:
            raise InputError("vertical localization needs each observation's vertical coordinate (ObsSet.vcoord)",
                             item="obs.vcoord")
        if out is None:
            out = np.array(X, order="F", copy=True)
        elif out is not X:
            if out.shape != X.shape or not out.flags.f_contiguous:
                raise InputError(f"out must be an F-ordered array of shape {X.shape}", item="out")
            out[...] = X
        elif not X.flags.f_contiguous:
            raise InputError("an in-place analysis (out=X) needs X in Fortran order", item="X")
        Yp, dy = self._departures(HX, obs, consume_hx)
        rinv = 1.0 / obs.error_var
        rho = self.inflation.forgetting_factor
        N = X.shape[1]
        st = self.stats
        # The adaptive factor multiplies the covariance already inflated by the fixed prior factor
        # (1 / rho): its innovation statistic takes the variance of that prior.
        yvar = np.einsum("ij,ij->i", Yp, Yp) / (N - 1) / rho if self.adaptive is not None else None
        for sub, offsets, idx, wt in self._local_obs(geometry, domains, obs):
            t1 = time.perf_counter()
            rho_k, gamma_dom, factor = rho, None, None
            if self.adaptive is not None:
                factor = update_domains(self.adaptive, infl_field, sub, offsets, idx, wt, rinv, dy, yvar, out, Yp)
                if self.adaptive.target is AdaptiveTarget.PRIOR:
                    rho_k, factor = rho / factor, None
                    gamma_dom = rho_k * (N - 1)
            self._analyse_chunk(out, sub, offsets, idx, wt * rinv[idx], Yp, dy, rho_k, gamma_dom, cycle)
            if factor is not None:  # a posterior factor: after the fixed posterior inflation, RTPP, RTPS
                inflate_rows(out, sub, factor)
            st.kernel_s += time.perf_counter() - t1
            st.n_domains += sub.n_domains
            st.n_local_obs += int(idx.size)
        return out

    @staticmethod
    def _departures(HX: np.ndarray, obs: ObsSet, consume_hx: bool) -> tuple[np.ndarray, np.ndarray]:
        """``(Yp, dy)``: the perturbations of ``HX`` about its ensemble mean (n_obs, N) C-order, in place
        where ``consume_hx`` allows it, and the innovations of the mean (n_obs,)."""
        mean = HX.mean(axis=1)
        dy = obs.values - mean
        if consume_hx and HX.flags.c_contiguous and HX.dtype == np.float64:
            HX -= mean[:, None]
            return HX, dy
        return np.ascontiguousarray(HX - mean[:, None]), dy

    def _analyse_chunk(self, out: np.ndarray, sub: LocalDomains, offsets: np.ndarray, idx: np.ndarray,
                       rinv_w: np.ndarray, Yp: np.ndarray, dy: np.ndarray, rho_k: float | np.ndarray,
                       gamma_dom: np.ndarray | None, cycle: int) -> None:
        """Analyse the domains ``sub`` in ``out`` (rows in F order), their observations ``idx`` in CSR
        ``offsets`` with R^{-1} times the taper weight ``rinv_w``; ``rho_k`` the forgetting factor
        (scalar, or (n_dom,) with adaptive inflation, then ``gamma_dom`` = rho_k (N - 1)). The hook a
        local filter with another per-domain analysis overrides (:mod:`enkflow.analysis.lnetf`);
        ``cycle`` selects its random draws. Here: the square-root transform, compiled or reference."""
        if self.kernel is Kernel.REFERENCE:
            self._reference(out, sub, offsets, idx, rinv_w, Yp, dy, rho_k)
            return
        N = out.shape[1]
        failed = local_analysis(
            out, sub.offsets, sub.rows, offsets, idx, np.sqrt(rinv_w), Yp, dy, self.inflation.forgetting_factor * (N - 1),
            self.inflation.posterior, self.inflation.rtpp, self.inflation.rtps, gamma_dom=gamma_dom,
        )
        if failed.size:
            # QL did not converge for these domains (not seen in practice): redo them exactly.
            self.stats.fallbacks += int(failed.size)
            self._reference(out, sub, offsets, idx, rinv_w, Yp, dy, rho_k, domains=failed)

    def _local_obs(self, geometry: Geometry, domains: LocalDomains, obs: ObsSet | None = None):
        """``(sub, offsets, idx, weight)`` for consecutive ranges ``sub`` of at most ``chunk``
        domains and about ``max_pairs`` (domain, observation) pairs, so that memory stays bounded
        where observations crowd (near the poles of a lon-lat grid). Timed into ``search_s``.
        ``obs``: the observations, for their per-kind localization radii (``ObsSet.half_width``)."""
        loc = self.localization if obs is None else self.localization.for_obs(obs)
        hcoords, dom_z = loc.horizontal(domains.coords)  # dom_z: the domains' vertical coordinate, or None
        obs_z = None if obs is None else obs.vcoord
        for start in range(0, domains.n_domains, self.chunk):
            stop = min(start + self.chunk, domains.n_domains)
            t0 = time.perf_counter()
            search = None
            if loc.max_obs is None:
                search = geometry.search(hcoords[start:stop], loc.support)
                ranges = search.parts(self.max_pairs)
            else:  # at most max_obs pairs per domain: the chunk bounds the memory
                ranges = iter([(0, stop - start)])
            self.stats.search_s += time.perf_counter() - t0
            for a, b in ranges:
                t0 = time.perf_counter()
                if search is not None:
                    nb = search.neighbours(a, b)
                else:
                    nb = geometry.nearest(hcoords[start + a : start + b], loc.support, loc.max_obs)
                offsets, idx, wt = loc.weights(nb)
                if dom_z is not None:
                    offsets, idx, wt = loc.vertical_weights(offsets, idx, wt, dom_z[start + a : start + b], obs_z)
                self.stats.search_s += time.perf_counter() - t0
                yield domains.subset(start + a, start + b), offsets, idx, wt

    def _reference(self, out, sub, offsets, idx, rinv_w, Yp, dy, rho, domains=None) -> None:
        for k in range(sub.n_domains) if domains is None else domains:
            rows = sub.rows[sub.offsets[k] : sub.offsets[k + 1]]
            sl = slice(offsets[k], offsets[k + 1])
            o = idx[sl]
            w, W = self._weights(dy[o], Yp[o], rinv_w[sl], rho[k] if np.ndim(rho) else rho)
            Xf = out[rows]
            xbar = Xf.mean(axis=1, keepdims=True)
            Xa = xbar + (Xf - xbar) @ (w[:, None] + W)
            inflate_posterior(Xa, Xf, self.inflation)
            out[rows] = Xa


@dataclass(frozen=True, kw_only=True)
class LETKF(LocalFilter):
    """Local ensemble transform Kalman filter (Hunt et al. 2007), symmetric square root."""

    _weights = staticmethod(letkf_weights)


@dataclass(frozen=True, kw_only=True)
class LESTKF(LocalFilter):
    """Local error-subspace transform Kalman filter (Nerger et al. 2012)."""

    _weights = staticmethod(estkf_weights)
