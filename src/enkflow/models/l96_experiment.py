"""Twin experiments on Lorenz-96 in the set-up of Sakov & Oke (2008).

Every variable observed at every step (dt = 0.05) with R = I; the truth and
the observations come from one seeded generator, the filter's randomness
(initial ensemble, perturbed observations) from another, so methods compared
with the same seed see the same truth and observations.
Scores are time means after the burn-in: ``rmse_a`` the RMSE of the analysis
mean against the truth, ``spread_a`` sqrt(mean ensemble variance).

The cycles are :func:`~enkflow.experiment.cycling.run_cycles` and
:func:`~enkflow.experiment.cycling.analyse` on an in-memory ensemble
(:class:`~enkflow.experiment.cycling.ArrayStore`), the nature run as the
observation space and a propagator stepping both.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

from enkflow.analysis import Filter, Geometry, LocalDomains
from enkflow.analysis.factory import make_filter as build
from enkflow.config import AnalysisConfig, Method, Metric
from enkflow.errors import InputError
from enkflow.experiment.cycling import ArrayStore, LocalGeometry, analyse, run_cycles
from enkflow.models import lorenz96 as l96
from enkflow.obs import ObsSet
from enkflow.parallel import Comm


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
    adaptive: str = "none"  # "miyoshi2011": adaptive prior inflation (local methods), Miyoshi (2011) defaults

    def __post_init__(self) -> None:
        if self.members < 2:
            raise InputError(f"--members must be >= 2, got {self.members}", item="members")
        if self.cycles < 1 or self.burn_in < 0:
            raise InputError("--cycles must be >= 1 and --burn-in >= 0", item="cycles")
        if not (self.radius > 0):
            raise InputError(f"--radius must be > 0, got {self.radius}", item="radius")
        if self.domain_size < 1 or l96.N_VARS % self.domain_size:
            raise InputError(f"--domain-size must divide {l96.N_VARS}, got {self.domain_size}", item="domain_size")
        if self.adaptive not in ("none", "miyoshi2011"):
            raise InputError(f"--adaptive must be none or miyoshi2011, got {self.adaptive!r}", item="adaptive")
        if self.adaptive != "none" and not self.method.is_local:
            raise InputError(f"--adaptive needs a local method (letkf, lestkf), not {self.method.value}", item="adaptive")


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


def make_filter(s: L96Setup) -> Filter:
    """The filter of ``s``: posterior inflation (DAPPER's convention), GC half-width
    ``radius`` on the ring of 40 points for the local methods."""
    cfg = {"method": s.method.value, "seed": s.seed, "inflation": {"posterior": s.inflation, "adaptive": s.adaptive}}
    if s.method.is_local:
        cfg["localization"] = {"radius": s.radius, "metric": "periodic", "period": float(l96.N_VARS)}
    return build(AnalysisConfig.model_validate(cfg))


class NatureRun:
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
        return ObsSet(self.y, self.error_var, self.coords)

    def apply(self, cycle: int, X: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        return X.copy(order="K")  # a copy: a local analysis overwrites X

    def apply_mean(self, cycle: int, x: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        return x


@dataclass
class Forecast:
    """The :class:`~enkflow.experiment.cycling.Propagator`: one step of the nature run and of every member."""

    nature: NatureRun
    store: ArrayStore

    def forecast(self, cycle: int) -> None:
        self.nature.advance()
        self.store.X = l96.step(self.store.X)


def run(s: L96Setup, progress=None) -> L96Result:
    """Cycle burn-in + cycles analyses; returns the time-mean scores after the burn-in."""
    nature_rng = np.random.default_rng([s.seed, 0])
    fil_rng = np.random.default_rng([s.seed, 1])
    n = l96.N_VARS
    nature = NatureRun(l96.spin_up(nature_rng), nature_rng, s.obs_std)
    store = ArrayStore(nature.truth[:, None] + fil_rng.standard_normal((n, s.members)))
    f = make_filter(s)
    local = None
    if s.method.is_local:
        k = s.domain_size
        centres = (np.arange(n // k) * k + 0.5 * (k - 1)).astype(float)
        local = LocalGeometry(LocalDomains.from_groups(np.arange(n) // k, centres),
                              Geometry(Metric.PERIODIC, nature.coords, float(n)))
    total = s.burn_in + s.cycles
    sums = np.zeros(4)
    adaptive = getattr(f, "adaptive", None)
    field = adaptive.initial_field(n) if adaptive is not None else None  # carried in memory from cycle to cycle

    def analysis(c: int) -> dict[str, float]:
        nonlocal field
        if adaptive is not None:
            field = adaptive.forecast(field).copy()
        Xa, diag = analyse(store, nature, f, c, local=local, truth=nature.truth, infl_field=field)
        if not np.isfinite(Xa).all():
            raise InputError(f"the ensemble diverged (NaN/Inf) at cycle {c}; try more inflation", item="ensemble")
        if c >= s.burn_in:
            diag["spread"] = np.sqrt(np.mean(Xa.var(axis=1, ddof=1)))
        return diag

    def cycle_end(c: int, diag: dict[str, float]) -> None:
        nonlocal sums
        if c >= s.burn_in:
            sums += (diag["rmse_analysis"], diag["spread"], diag["rmse_prior"], diag.get("inflation_mean", 1.0))
        if progress and (c + 1) % 1000 == 0:
            progress(c + 1, total)

    forecast = Forecast(nature, store)
    run_cycles(range(s.burn_in), forecast, analysis, on_cycle_end=cycle_end)
    t0 = time.perf_counter()
    run_cycles(range(s.burn_in, total), forecast, analysis, on_cycle_end=cycle_end)
    dt = time.perf_counter() - t0
    m = sums / s.cycles
    return L96Result(float(m[0]), float(m[1]), float(m[2]), dt / s.cycles, s.cycles, float(m[3]))
