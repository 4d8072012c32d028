"""What the online benchmarks' server assimilates: the exchange problem and the Lorenz-96 problem.

*exchange*: one float64 field of ``n`` elements; member ``m`` starts as ``m``
plus a small ramp; ETKF of :data:`N_OBS_EXCHANGE` evenly spaced elements.
*l96*: Lorenz-96 members (40 variables) around a spun-up truth; ETKF of every
variable, observed each cycle (H = I, R = I). With ``check`` both keep the
checksums of the initial ensemble, every forecast and every analysis
(:mod:`enkflow.bench.online_checks`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from enkflow.analysis import ETKF
from enkflow.bench.online_checks import member_sums
from enkflow.experiment.cycle_diagnostics import CycleDiagnostics
from enkflow.experiment.cycling import ObservationSpace, OutputSink
from enkflow.experiment.step import AnalysisStep
from enkflow.models import lorenz96 as l96
from enkflow.obs import ObsSet
from enkflow.online.fields import Field
from enkflow.online.server import Problem
from enkflow.online.store import MemoryStore
from enkflow.parallel import Comm

N_OBS_EXCHANGE = 64


class SparseObs(ObservationSpace):
    """The exchange problem's observation space: ``n_obs`` state elements, evenly spaced; with
    ``sums``, the forecast checksums of every member (by cycle, in ``forecasts``)."""

    def __init__(self, n: int, n_members: int, seed: int, sums: bool):
        self.n_obs = min(N_OBS_EXCHANGE, n)
        self.idx = np.linspace(0, n - 1, self.n_obs).astype(np.int64)
        self.n_members, self.seed, self.sums = n_members, seed, sums
        self.forecasts: dict[int, list[int]] = {}

    def observations(self, cycle: int) -> ObsSet:
        rng = np.random.default_rng([self.seed, 7, cycle])
        y = (self.n_members + 1) / 2 + rng.standard_normal(self.n_obs)
        return ObsSet(y, np.ones(self.n_obs), self.idx.astype(float))

    def _select(self, X: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        out = np.zeros((self.n_obs,) + X.shape[1:])
        sel = (self.idx >= row_start) & (self.idx < row_start + X.shape[0])
        out[sel] = X[self.idx[sel] - row_start]
        return comm.allreduce_sum(out)

    def apply(self, cycle: int, X: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        if self.sums:
            self.forecasts[cycle] = member_sums(X, row_start, comm)
        return self._select(X, row_start, comm)

    def apply_analysis(self, cycle: int, Xa: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        return self._select(Xa, row_start, comm)


class L96Obs(ObservationSpace):
    """Lorenz-96 twin: the truth advanced ``nsteps`` RK4 steps per cycle, every variable observed
    (H = I, R = I); the same on every rank (seeded by cycle)."""

    def __init__(self, seed: int, nsteps: int, sums: bool = False):
        self.seed, self.nsteps, self.sums = seed, nsteps, sums
        self.forecasts: dict[int, list[int]] = {}
        self.truth0 = l96.spin_up(np.random.default_rng([seed, 0]))
        self._truth = {0: self.truth0}

    def truth(self, cycle: int) -> np.ndarray:
        if cycle not in self._truth:
            x = self.truth(cycle - 1)
            for _ in range(self.nsteps):
                x = l96.step(x)
            self._truth[cycle] = x
        return self._truth[cycle]

    def observations(self, cycle: int) -> ObsSet:
        t = self.truth(cycle)
        y = t + np.random.default_rng([self.seed, 2, cycle]).standard_normal(t.size)
        return ObsSet(y, np.ones(t.size), np.arange(t.size, dtype=float))

    def apply(self, cycle: int, X: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        if self.sums:
            self.forecasts[cycle] = member_sums(X, row_start, comm)
        return comm.allgather_rows(np.ascontiguousarray(X))

    def apply_analysis(self, cycle: int, Xa: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        return comm.allgather_rows(np.ascontiguousarray(Xa))


class SumSink(OutputSink):
    """An output sink keeping each cycle's analysis checksums (or nothing)."""

    def __init__(self, comm: Comm, sums: bool):
        self.comm, self.sums = comm, sums
        self.analyses: dict[int, list[int]] = {}

    def write(self, cycle: int, Xa: np.ndarray, row_start: int, diagnostics: CycleDiagnostics) -> None:
        if self.sums:
            self.analyses[cycle] = member_sums(Xa, row_start, self.comm)


@dataclass
class BenchProblem:
    """A benchmark's :class:`Problem` and what it records: the forecasts' checksums (``obs``), the
    analyses' (``sink``) and, once the server filled its store, the initial ensemble's (``initial``)."""

    problem: Problem
    obs: SparseObs | L96Obs
    sink: SumSink
    initial: list[int]


def exchange_problem(n: int, members: int, nsteps: int, seed: int, check: bool, comm: Comm) -> BenchProblem:
    obs = SparseObs(n, members, seed, check)
    sink = SumSink(comm, check)
    initial_sums: list[int] = []

    def initial(store: MemoryStore) -> None:
        lo, hi = store.ranges[0]
        ramp = 1e-7 * np.arange(lo, hi, dtype=np.float64)
        for m in range(1, store.n_members + 1):
            np.add(ramp, float(m), out=store.column(0, m))
        if check:
            initial_sums.extend(member_sums(store.parts[0], store.row_start, comm))

    problem = Problem((Field("x", "float64", (n,)),), members, initial, lambda cycle: nsteps, obs,
                      AnalysisStep(ETKF(), output=sink))
    return BenchProblem(problem, obs, sink, initial_sums)


def l96_problem(members: int, nsteps: int, seed: int, check: bool, comm: Comm) -> BenchProblem:
    obs = L96Obs(seed, nsteps, check)
    sink = SumSink(comm, check)
    initial_sums: list[int] = []

    def initial(store: MemoryStore) -> None:
        X = obs.truth0[:, None] + np.random.default_rng([seed, 1]).standard_normal((obs.truth0.size, members))
        store.parts[0][...] = X[store.row_start:store.row_stop]
        if check:
            initial_sums.extend(member_sums(store.parts[0], store.row_start, comm))

    problem = Problem((Field("x", "float64", (40,)),), members, initial, lambda cycle: nsteps, obs,
                      AnalysisStep(ETKF(), output=sink, truth=obs.truth))
    return BenchProblem(problem, obs, sink, initial_sums)
