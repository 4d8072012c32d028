"""Twin experiments on Lorenz-96 in the set-up of Sakov & Oke (2008).

Every variable observed at every step (dt = 0.05) with R = I; the truth and
the observations come from one seeded generator, the filter's randomness
(initial ensemble, perturbed observations) from another, so methods compared
with the same seed see the same truth and observations.
Scores are time means after the burn-in: ``rmse_a`` the RMSE of the analysis
mean against the truth, ``spread_a`` sqrt(mean ensemble variance).

The cycles are :func:`~enkflow.experiment.cycling.run_cycles` and
:func:`~enkflow.experiment.step.analyse` on an in-memory ensemble
(:class:`~enkflow.experiment.cycling.ArrayStore`), the nature run as the
observation space and a propagator stepping both; the analysis step is the one
:func:`~enkflow.experiment.step.build_step` makes of :func:`analysis_config`
(:func:`make_step`, which :mod:`enkflow.apps.l96_online` uses as well).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from enkflow.analysis import Geometry, LocalDomains
from enkflow.config import AdaptiveInflation, AdaptiveTarget, AnalysisConfig, Method, Metric, validate
from enkflow.errors import InputError
from enkflow.experiment.cycle_diagnostics import CycleDiagnostics
from enkflow.experiment.cycling import ArrayStore, ObservationSpace, OutputSink, run_cycles
from enkflow.experiment.decomposition import LocalGeometry
from enkflow.experiment.step import AnalysisStep, StateRows, analyse, build_step
from enkflow.models import lorenz96 as l96
from enkflow.obs import ObsSet
from enkflow.parallel import Comm, SerialComm


@dataclass(frozen=True, kw_only=True)
class L96Setup:
    method: Method
    members: int
    inflation: float = 1.0  # posterior multiplicative factor on anomalies
    radius: float = 7.28  # GC half-width c in grid units (local methods)
    domain_size: int = 2  # neighbouring points per local domain
    cycles: int = 10_000  # analysis cycles after the burn-in
    burn_in: int = 400
    obs_std: float = 1.0
    seed: int = 0
    # Adaptive inflation (local methods) at the scheme's defaults; its name (e.g. "gharamti2018") is taken too.
    adaptive: AdaptiveInflation = AdaptiveInflation.NONE
    xn: float = 1.0  # enkf-n: the hyperprior's certainty (DAPPER's xN)
    rs: float = 1.0  # lnetf: DAPPER's Rs, the factor on the observation error standard deviations in the weights
    rotate: bool = False  # enkf-n, lnetf: random mean-preserving rotation of the analysis anomalies (DAPPER's rot=True)
    adaptive_target: AdaptiveTarget = AdaptiveTarget.PRIOR  # gharamti2018, anderson2009: prior or posterior
    adaptive_damping: float | None = None  # gharamti2018, anderson2009: DART's inf_damping (None: 0.9)

    def __post_init__(self) -> None:
        if self.members < 2:
            raise InputError(f"--members must be >= 2, got {self.members}", item="members")
        if self.cycles < 1 or self.burn_in < 0:
            raise InputError("--cycles must be >= 1 and --burn-in >= 0", item="cycles")
        if not (self.radius > 0):
            raise InputError(f"--radius must be > 0, got {self.radius}", item="radius")
        if not (np.isfinite(self.xn) and self.xn > 0):
            raise InputError(f"--xn must be a finite number > 0, got {self.xn}", item="xn")
        if self.method is not Method.ENKF_N and self.xn != 1.0:
            raise InputError(f"--xn is an option of --method enkf-n, not {self.method.value}", item="xn")
        if self.domain_size < 1 or l96.N_VARS % self.domain_size:
            raise InputError(f"--domain-size must divide {l96.N_VARS}, got {self.domain_size}", item="domain_size")
        try:
            object.__setattr__(self, "adaptive", AdaptiveInflation(self.adaptive))
            object.__setattr__(self, "adaptive_target", AdaptiveTarget(self.adaptive_target))
        except ValueError:
            raise InputError(f"--adaptive must be one of {', '.join(a.value for a in AdaptiveInflation)} and "
                             f"--adaptive-target prior or posterior, got {self.adaptive!r}, {self.adaptive_target!r}",
                             item="adaptive") from None
        if not (self.rs > 0):
            raise InputError(f"--rs must be > 0, got {self.rs}", item="rs")
        if self.method is not Method.LNETF and self.rs != 1.0:
            raise InputError(f"--rs is an option of --method lnetf, not {self.method.value}", item="rs")
        if self.method not in (Method.ENKF_N, Method.LNETF) and self.rotate:
            raise InputError(f"--rotate is an option of --method enkf-n and lnetf, not {self.method.value}", item="rotate")
        if self.adaptive is not AdaptiveInflation.NONE and not (self.method.is_local or self.method is Method.ENSRF):
            raise InputError(f"--adaptive needs a local method (letkf, lestkf, lnetf) or ensrf, not {self.method.value}",
                             item="adaptive")
        analysis_config(self)  # an option the [analysis] schema refuses is a ConfigError naming its key, now


@dataclass(frozen=True)
class L96Result:
    rmse_a: float
    spread_a: float
    rmse_f: float
    seconds_per_cycle: float
    cycles: int
    inflation_mean: float = 1.0  # adaptive: time mean of the field's mean covariance factor after the burn-in

    def as_dict(self) -> dict:
        return asdict(self)


def analysis_config(s: L96Setup) -> AnalysisConfig:
    """The ``[analysis]`` configuration of ``s``: posterior inflation (DAPPER's convention), GC
    half-width ``radius`` on the ring of 40 points for the methods that localize, the EnKF-N's options."""
    cfg: dict = {"method": s.method.value, "seed": s.seed,
                 "inflation": {"posterior": s.inflation, "adaptive": s.adaptive.value}}
    if s.adaptive_target is not AdaptiveTarget.PRIOR:
        cfg["inflation"]["adaptive_target"] = s.adaptive_target.value
    if s.adaptive_damping is not None:
        cfg["inflation"]["adaptive_damping"] = s.adaptive_damping
    if s.method is Method.ENKF_N:
        cfg["enkf_n"] = {"xn": s.xn, "rotate": s.rotate}
    if s.method is Method.LNETF:
        cfg["lnetf"] = {"rs": s.rs, "rotate": s.rotate}
    if s.method.needs_localization:
        cfg["localization"] = {"radius": s.radius, "metric": "periodic", "period": float(l96.N_VARS)}
    return validate(AnalysisConfig, cfg, prefix="analysis")


def make_step(s: L96Setup, coords: np.ndarray, truth: Callable[[int], np.ndarray | None], output: OutputSink,
              analysis: AnalysisConfig | None = None) -> AnalysisStep:
    """The analysis step of ``s`` (or of ``analysis``, its configuration changed), one process: the
    local methods' domains are ``domain_size`` neighbouring points of the ring, observed at ``coords``;
    the serial filter's rows are at their ring positions."""
    n, k = l96.N_VARS, s.domain_size
    centres = (np.arange(n // k) * k + 0.5 * (k - 1)).astype(float)
    ring = LocalGeometry(LocalDomains.from_groups(np.arange(n) // k, centres), Geometry(Metric.PERIODIC, coords, float(n)))
    if s.method is Method.ENSRF:
        ring = LocalGeometry(row_coords=np.arange(n, dtype=float)[:, None])
    return build_step(analysis or analysis_config(s), StateRows(n, local=ring), SerialComm(), truth=truth, output=output)


class NatureRun(ObservationSpace):
    """The truth of the twin experiment and its observations: an
    :class:`~enkflow.experiment.cycling.ObservationSpace` observing every variable (H = I)
    with errors of standard deviation ``obs_std`` drawn from ``rng``."""

    def __init__(self, truth: np.ndarray, rng: np.random.Generator, obs_std: float):
        self.truth, self.rng, self.obs_std = truth, rng, obs_std
        self.coords = np.arange(truth.size, dtype=float)
        self.error_var = np.full(truth.size, obs_std**2)
        self.y: np.ndarray | None = None

    def advance(self) -> None:
        """One step of the truth, then its observations."""
        self.truth = l96.step(self.truth)
        self.y = self.truth + self.obs_std * self.rng.standard_normal(self.truth.size)

    def observations(self, cycle: int) -> ObsSet:
        if self.y is None:
            raise InputError(f"cycle {cycle}: the nature run has not been advanced to its first observations", item="y")
        return ObsSet(self.y, self.error_var, self.coords)

    def apply(self, cycle: int, X: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        return X.copy(order="K")  # a copy: a local analysis overwrites X

    def apply_analysis(self, cycle: int, Xa: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        return Xa


class Scores(OutputSink):
    """The output of a twin experiment: the sums of the scores after the burn-in (the analysis RMSE,
    the spread, the forecast RMSE and the adaptive inflation's mean factor). A diverged ensemble is
    an error naming the cycle."""

    def __init__(self, burn_in: int):
        self.burn_in = burn_in
        self.sums = np.zeros(4)

    def write(self, cycle: int, Xa: np.ndarray, row_start: int, diagnostics: CycleDiagnostics) -> None:
        if not np.isfinite(Xa).all():
            raise InputError(f"the ensemble diverged (NaN/Inf) at cycle {cycle}; try more inflation", item="ensemble")
        d = diagnostics
        if cycle >= self.burn_in and d.rmse_analysis is not None and d.rmse_prior is not None:
            self.sums += (d.rmse_analysis, np.sqrt(np.mean(Xa.var(axis=1, ddof=1))), d.rmse_prior,
                          d.inflation.mean if d.inflation is not None else 1.0)

    def result(self, cycles: int, seconds_per_cycle: float) -> L96Result:
        """The time means over the ``cycles`` scored cycles."""
        m = self.sums / cycles
        return L96Result(float(m[0]), float(m[1]), float(m[2]), seconds_per_cycle, cycles, float(m[3]))


@dataclass
class Forecast:
    """The :class:`~enkflow.experiment.cycling.Propagator`: one step of the nature run and of every member."""

    nature: NatureRun
    store: ArrayStore

    def forecast(self, cycle: int) -> None:
        self.nature.advance()
        self.store.X = l96.step(self.store.X)


def run(s: L96Setup, progress: Callable[[int, int], None] | None = None, *,
        analysis: AnalysisConfig | None = None) -> L96Result:
    """Cycle burn-in + cycles analyses; returns the time-mean scores after the burn-in. ``analysis``:
    the ``[analysis]`` configuration instead of :func:`analysis_config`'s (benchmarks, tests)."""
    nature_rng = np.random.default_rng([s.seed, 0])
    fil_rng = np.random.default_rng([s.seed, 1])
    nature = NatureRun(l96.spin_up(nature_rng), nature_rng, s.obs_std)
    store = ArrayStore(nature.truth[:, None] + fil_rng.standard_normal((l96.N_VARS, s.members)))
    scores = Scores(s.burn_in)
    step = make_step(s, nature.coords, lambda c: nature.truth, scores, analysis)
    total = s.burn_in + s.cycles

    def cycle_end(c: int, diag: CycleDiagnostics) -> None:
        if progress and (c + 1) % 1000 == 0:
            progress(c + 1, total)

    forecast = Forecast(nature, store)
    run_cycles(range(s.burn_in), forecast, lambda c: analyse(step, store, nature, c)[1], on_cycle_end=cycle_end)
    t0 = time.perf_counter()
    run_cycles(range(s.burn_in, total), forecast, lambda c: analyse(step, store, nature, c)[1], on_cycle_end=cycle_end)
    return scores.result(s.cycles, (time.perf_counter() - t0) / s.cycles)
