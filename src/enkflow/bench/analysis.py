"""`enkflow bench analysis`: time per grid point of the local analysis against
a straightforward per-point NumPy/LAPACK implementation, in one run.

Problem (the PDAF comparison case): smooth Gaussian random fields on an
nx x ny Cartesian grid, N members; H = identity at a random fraction of the
points with error std ``obs_std``; Gaspari-Cohn weights reaching zero at
``cutoff`` grid units (PDAF's cut-off radius; half-width c = cutoff / 2); one
local domain per grid point.

The compiled kernel analyses every point. The baseline
(:mod:`enkflow.bench.baseline`: one batched SciPy KD-tree search, then per
point the N x N matrix, LAPACK eigendecomposition and transform) runs on a
random sample of points and is extrapolated per point; the two are compared on
that sample (relative max difference). Two ratios come from the same run:

* whole analysis: the baseline's search + transform time per point against
  enkflow's core time per point (wall time x ranks / points);
* kernel only: the baseline's per-point LAPACK transform time against the
  compiled kernel's time per point (summed over ranks), search excluded on
  both sides.

The compiled kernel's time is split into matrix build, eigen and transform by
re-running a sample of points with the kernel stopped after each stage (best of
three rounds).

With ``ranks`` > 1 the same program runs under mpiexec: each rank owns a row
block, computes its part of H X, the parts are summed (Allreduce), and each
rank analyses its own points.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from enkflow.analysis import LETKF, Geometry, LocalDomains, Localization, ObsSet
from enkflow.analysis.kernels import local_analysis
from enkflow.bench.baseline import baseline_letkf
from enkflow.bench.fields import gaussian_random_field
from enkflow.config import Metric, RadiusConvention
from enkflow.errors import InputError
from enkflow.obs import LinearObsOperator
from enkflow.parallel import Comm, RowBlocks, get_comm


@dataclass(frozen=True, kw_only=True)
class AnalysisBenchSetup:
    nx: int = 1000
    ny: int = 1000
    members: int = 40
    obs_fraction: float = 0.1
    obs_std: float = 0.25
    cutoff: float = 10.0
    length: float = 8.0  # correlation length of the fields, grid units
    baseline_points: int = 2000
    profile_points: int = 20000  # points of the kernel's stage split (three rounds)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.nx < 2 or self.ny < 2:
            raise InputError("--nx and --ny must be >= 2", item="nx")
        if self.members < 2:
            raise InputError(f"--members must be >= 2, got {self.members}", item="members")
        if not 0 < self.obs_fraction <= 1:
            raise InputError(f"--obs-fraction must be in (0, 1], got {self.obs_fraction}", item="obs_fraction")
        if not self.obs_std > 0:
            raise InputError(f"--obs-std must be > 0, got {self.obs_std}", item="obs_std")
        if not self.cutoff > 0:
            raise InputError(f"--cutoff must be > 0, got {self.cutoff}", item="cutoff")


# Thread-count variables of the BLAS/LAPACK builds NumPy and SciPy may load.
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def _problem(s: AnalysisBenchSetup, start: int, stop: int):
    """This rank's rows of the ensemble, the observations and their operator.

    Every rank draws the same fields from the same seed and keeps its rows,
    so the problem is identical whatever the rank count.
    """
    rng = np.random.default_rng(s.seed)
    n = s.nx * s.ny
    truth = gaussian_random_field(rng, s.nx, s.ny, s.length).ravel()
    X = np.empty((stop - start, s.members), order="F")
    for k in range(s.members):
        X[:, k] = (truth + gaussian_random_field(rng, s.nx, s.ny, s.length).ravel())[start:stop]
    n_obs = max(1, int(round(s.obs_fraction * n)))
    where = np.sort(rng.choice(n, n_obs, replace=False))
    y = truth[where] + s.obs_std * rng.standard_normal(n_obs)
    coords = np.column_stack((where // s.ny, where % s.ny)).astype(float)
    obs = ObsSet(y, np.full(n_obs, s.obs_std**2), coords)
    return X, obs, LinearObsOperator.selection(where, n), truth[start:stop]


def _grid_coords(s: AnalysisBenchSetup, start: int, stop: int) -> np.ndarray:
    r = np.arange(start, stop)
    return np.column_stack((r // s.ny, r % s.ny)).astype(float)


@dataclass
class _RankAnalysis:
    """One rank's analysis of its rows [start, stop): the problem, the filter, and its figures."""

    start: int
    stop: int
    Xa: np.ndarray  # (stop - start, members): the analysis, in place of the prior
    Xf: np.ndarray | None  # the prior, kept on rank 0 for the baseline and the stage split
    HX: np.ndarray  # (n_obs, members)
    obs: ObsSet
    loc: Localization
    coords: np.ndarray  # (stop - start, 2): the rows' grid coordinates
    domains: LocalDomains
    geo: Geometry
    flt: LETKF
    rmse_prior: float
    rmse_analysis: float
    seconds: float  # the local analysis, wall


def _analyse(s: AnalysisBenchSetup, comm: Comm) -> _RankAnalysis:
    """This rank's rows analysed by LETKF, timed between barriers."""
    n = s.nx * s.ny
    start, stop = RowBlocks(n, comm.size).bounds(comm.rank)
    X, obs, H, truth = _problem(s, start, stop)
    HX = H.apply(X, start, comm)
    loc = Localization.from_radius(s.cutoff, RadiusConvention.CUTOFF, metric=Metric.CARTESIAN)
    coords = _grid_coords(s, start, stop)
    domains = LocalDomains.per_row(coords)
    geo = Geometry(Metric.CARTESIAN, obs.coords)
    f = LETKF(localization=loc)
    prior_rmse = float(np.sqrt(np.mean((X.mean(axis=1) - truth) ** 2)))
    Xf = X.copy(order="F") if comm.rank == 0 else None

    comm.barrier()
    t0 = time.perf_counter()
    Xa = f.analyze(X, HX, obs, domains=domains, out=X, geometry=geo)
    t_local = time.perf_counter() - t0
    comm.barrier()
    post_rmse = float(np.sqrt(np.mean((Xa.mean(axis=1) - truth) ** 2)))
    return _RankAnalysis(start, stop, Xa, Xf, HX, obs, loc, coords, domains, geo, f, prior_rmse, post_rmse, t_local)


def _baseline(s: AnalysisBenchSetup, a: _RankAnalysis, Xf: np.ndarray) -> tuple[dict[str, float], int, float]:
    """The baseline on a random sample of rank 0's points: its ms per point by stage, the sample's
    size, and the relative max difference from enkflow's analysis there."""
    rng = np.random.default_rng(s.seed + 1)
    rows = a.stop - a.start
    sample = np.sort(rng.choice(rows, min(s.baseline_points, rows), replace=False))
    ref, tb = baseline_letkf(Xf, a.HX, a.obs, a.loc, a.coords, sample, a.flt.inflation.forgetting_factor)
    rel = float(np.abs(ref - a.Xa[sample]).max() / np.abs(ref).max())
    return {k: v / sample.size * 1e3 for k, v in tb.items()}, int(sample.size), rel


def _stage_fractions(s: AnalysisBenchSetup, a: _RankAnalysis, Xf: np.ndarray) -> np.ndarray:
    """The compiled kernel's time split into (build, eigen, transform), fractions summing to 1: the
    kernel stopped after each stage on a sample of points."""
    prof = a.domains.subset(0, min(s.profile_points, a.domains.n_domains))
    off, idx, wt = a.loc.local_obs(a.geo, prof.coords)
    Yp = np.ascontiguousarray(a.HX - a.HX.mean(axis=1, keepdims=True))
    dy = a.obs.values - a.HX.mean(axis=1)
    sw = np.sqrt(wt / a.obs.error_var[idx])
    gamma = a.flt.inflation.forgetting_factor * (s.members - 1)
    # Best of three rounds per stage: the split is a difference of times, and one
    # slow run (a shared machine) would otherwise show as a negative stage.
    stage_t = [np.inf] * 3
    for _ in range(3):
        for k, stage in enumerate((1, 2, 3)):
            work = Xf[: prof.rows.max() + 1].copy(order="F")
            t1 = time.perf_counter()
            local_analysis(work, prof.offsets, prof.rows, off, idx, sw, Yp, dy, gamma, stage=stage)
            stage_t[k] = min(stage_t[k], time.perf_counter() - t1)
    frac = np.diff([0.0, *stage_t]) / max(stage_t[-1], 1e-12)
    frac = np.clip(frac, 0.0, None)
    return frac / frac.sum()


def run_rank(s: AnalysisBenchSetup) -> dict | None:
    """Run the benchmark on this rank; rank 0 returns the figures."""
    comm = get_comm()
    a = _analyse(s, comm)
    rows = a.stop - a.start
    t_wall = comm.allgather_obj(a.seconds)
    sq = comm.allgather_obj((a.rmse_prior**2 * rows, a.rmse_analysis**2 * rows))
    rss = comm.allgather_obj(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)
    stats = comm.allgather_obj((a.flt.stats.search_s, a.flt.stats.kernel_s, a.flt.stats.n_local_obs,
                                a.flt.stats.fallbacks))
    if comm.rank != 0:
        return None
    assert a.Xf is not None  # rank 0 keeps the prior
    base_split, n_sample, rel = _baseline(s, a, a.Xf)
    frac = _stage_fractions(s, a, a.Xf)
    n = s.nx * s.ny
    per_pt_ms = max(t_wall) / n * 1e3
    # The baseline runs on one core: compare per core, so that the ratios do
    # not count the MPI speed-up (that is speedup_by_ranks).
    core_ms = per_pt_ms * comm.size
    kernel_ms = sum(st[1] for st in stats) / n * 1e3  # summed over ranks: per core
    base_ms = sum(base_split.values())
    base_kernel_ms = base_ms - base_split["search"]
    sum_sq = np.sum(sq, axis=0)
    return {
        "nx": s.nx,
        "ny": s.ny,
        "members": s.members,
        "ranks": comm.size,
        "n_obs": a.obs.n_obs,
        "mean_local_obs": sum(st[2] for st in stats) / n,
        "ms_per_point": per_pt_ms,
        "core_ms_per_point": core_ms,
        "kernel_ms_per_point": kernel_ms,
        "wall_s": max(t_wall),
        "split_ms_per_point": {
            "search": sum(st[0] for st in stats) / n * 1e3,
            "build": kernel_ms * frac[0],
            "eigen": kernel_ms * frac[1],
            "transform": kernel_ms * frac[2],
        },
        "baseline": "batched SciPy KD-tree search, per-point LAPACK dsyevd",
        "baseline_ms_per_point": base_ms,
        "baseline_kernel_ms_per_point": base_kernel_ms,
        "baseline_split_ms_per_point": base_split,
        "baseline_points": n_sample,
        "speedup_vs_baseline": base_ms / core_ms,
        "kernel_speedup_vs_baseline": base_kernel_ms / max(kernel_ms, 1e-12),
        "max_rel_diff_vs_baseline": rel,
        "rmse_prior": float(np.sqrt(sum_sq[0] / n)),
        "rmse_analysis": float(np.sqrt(sum_sq[1] / n)),
        "peak_rss_mb": max(rss),
        "ensemble_mb": n * s.members * 8 / 2**20,
        "fallback_domains": sum(st[3] for st in stats),
    }


def run(s: AnalysisBenchSetup, ranks: int) -> dict:
    """Run in a child process (``ranks`` == 1) or under mpiexec with ``ranks`` processes.

    Either way BLAS/LAPACK run single-threaded: the compiled kernel uses one
    core per rank, so the baseline gets one core too; a multi-threaded LAPACK
    is also slower on N x N matrices this small (measured 0.9 against 0.09 ms
    per dsyevd with two OpenBLAS threads on two busy cores).
    """
    cmd = [sys.executable, "-m", "enkflow.bench.analysis", json.dumps(asdict(s))]
    if ranks > 1:
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        if not os.path.exists(mpiexec):
            raise InputError("--ranks > 1 needs mpiexec next to the Python executable (the `mpich` wheel)", item="ranks")
        cmd = [mpiexec, "-n", str(ranks), *cmd]
    env = dict(os.environ, **{k: "1" for k in _THREAD_VARS})
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        what = f"mpiexec -n {ranks}" if ranks > 1 else "the benchmark process"
        raise InputError(f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}", item="ranks")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":  # the child process (each rank under mpiexec) started by run()
    _res = run_rank(AnalysisBenchSetup(**json.loads(sys.argv[1])))
    if _res is not None:
        print(json.dumps(_res))
