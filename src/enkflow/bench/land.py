"""`enkflow bench land`: the synthetic global land problem of Zheng et al.
(GMD 2020) analysed from its restart files, as an offline cycle would.

``enkflow synth`` writes the member, truth and observation files in a child
process (so the land-mask package's memory is not counted here); then this
process reads the N_e restarts, runs the local filter on the sphere, updates
the files in place (crash-safe) and writes the analysis mean and spread. It
reports the RMSE of the prior and analysis means against the truth, the time
of each stage and the peak resident memory against the ensemble's size.

Each analysis runs in a child process (this module's ``__main__``), under
``mpiexec -n ranks`` when ``ranks`` > 1, so that its peak memory is its own; with
``balance`` (default) every rank analyses rows of equal estimated cost, otherwise
its I/O row block. Either way the report gives each rank's seconds in the local
filter (wall and CPU), its share of the estimated work and the imbalance (max /
mean over ranks), the observations it held and owned, its observation-space and
H(x) exchange bytes and its peak RSS.

The layouts of the observations (``[analysis] observations``, :class:`LayoutRuns`)
are compared in the same invocation: the replicated layout first, on a copy of
the members (:mod:`enkflow.bench.land_layouts`), then the distributed one on the
files themselves.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.bench.land_layouts import LayoutRuns, compare_layouts, layout_lines, same_analysis, scratch_copy
from enkflow.config import AnalysisConfig, ObsLayout
from enkflow.errors import InputError
from enkflow.experiment.analysis_step import AnalysisFiles, analyse_files
from enkflow.io.config import IOConfig
from enkflow.parallel import get_comm
from enkflow.parallel.program import find_program
from enkflow.state import StateConfig

STATE_VAR = "soil_moisture"
MEAN_FILE, SPREAD_FILE = "analysis_mean.nc", "analysis_spread.nc"
ANALYSED = "analysed"  # in a --dir given: the last layout's analysed members, mean and spread


@dataclass(frozen=True, kw_only=True)
class LandBenchSetup:
    size: str = "medium"
    members: int = 40
    cutoff_km: float = 150.0  # GC weight reaches 0 here (PDAF's cut-off radius)
    method: str = "lestkf"
    seed: int = 0
    ranks: int = 1
    balance: bool = True
    max_obs: int | None = None  # the optional cap on local observations (approximate)
    obs_fraction: float | None = None  # observations per land point (synth's --obs-fraction); None: synth's default
    observations: ObsLayout = ObsLayout.DISTRIBUTED  # the layout of one analysis ([analysis] observations)

    @classmethod
    def from_json(cls, text: str) -> LandBenchSetup:
        """The setup :func:`_analyse` hands its child process (``json.dumps(asdict(s))``)."""
        fields = json.loads(text)
        return cls(**fields | {"observations": ObsLayout(fields["observations"])})


def _synthesize(s: LandBenchSetup, out: Path) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "enkflow", "synth", "--size", s.size, "--members", str(s.members),
           "--out", str(out), "--seed", str(s.seed)]
    if s.obs_fraction is not None:
        cmd += ["--obs-fraction", repr(s.obs_fraction)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise InputError(f"enkflow synth failed:\n{proc.stderr[-2000:]}", item="size")
    return time.perf_counter() - t0


def _file_obs_fraction(s: LandBenchSetup, obs_path: Path) -> float | None:
    """The observations per land point ``obs_path`` was synthesized with (None: not a synth file);
    InputError where ``s.obs_fraction`` asks for another."""
    with netCDF4.Dataset(obs_path) as ds:
        found = float(ds.getncattr("obs_fraction")) if "obs_fraction" in ds.ncattrs() else None
    if s.obs_fraction is not None and found != s.obs_fraction:
        raise InputError(f"{obs_path} holds observations for --obs-fraction {found}, not {s.obs_fraction}: "
                         "use another --dir (or leave --obs-fraction out)", item="obs_fraction")
    return found


def _analyse(s: LandBenchSetup, d: Path) -> dict:
    """Analyse the files in ``d`` once, in a child process (under mpiexec for ``s.ranks`` > 1)."""
    cmd = [sys.executable, "-m", "enkflow.bench.land", json.dumps(asdict(s)), str(d)]
    env = None
    if s.ranks > 1:
        mpiexec = find_program("mpiexec")
        if mpiexec is None:
            raise InputError("--ranks > 1 needs mpiexec (the `mpich` wheel: pip install mpich)", item="ranks")
        cmd = [mpiexec, "-n", str(s.ranks), *cmd]
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise InputError(f"the analysis ({s.observations.value} observations, {s.ranks} rank(s)) failed "
                         f"(exit {proc.returncode}):\n{proc.stderr[-2000:]}", item="ranks")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(s: LandBenchSetup, directory: Path | None = None, keep: bool = False,
        layouts: LayoutRuns = LayoutRuns.BOTH) -> dict:
    """Synthesize (unless ``directory`` already holds the files) and analyse them with each of
    ``layouts`` in turn (the replicated first; both start from the same forecast); the report of
    :func:`~enkflow.bench.land_layouts.compare_layouts`.

    The analysis updates the members in place, so each layout analyses its own copy of them,
    except the last one in a directory of our own: a ``directory`` given keeps its forecast (a
    second run there analyses the same problem as the first), and the last layout's analysis
    (members, mean and spread) is left in its :data:`ANALYSED` directory."""
    own = directory is None
    d = Path(tempfile.mkdtemp(prefix="enkflow-land-")) if own else Path(directory)
    copies: list[Path] = []
    try:
        synth_s = 0.0
        if not (d / "obs.nc").exists():
            d.mkdir(parents=True, exist_ok=True)
            synth_s = _synthesize(s, d)
        paths = [d / f"member_{m:04d}.nc" for m in range(1, s.members + 1)]
        missing = [p for p in paths if not p.exists()]
        if missing:
            raise InputError(f"{missing[0]} is missing: the directory holds fewer than {s.members} members", item="members")
        fraction = _file_obs_fraction(s, d / "obs.nc")
        runs = layouts.layouts
        reports, wheres = {}, []
        for i, layout in enumerate(runs):  # one after the other: their memory is never held at once
            in_place = own and i == len(runs) - 1
            if not in_place:
                copies.append(scratch_copy(d, paths, layout))
            wheres.append(d if in_place else copies[-1])
            reports[layout] = _analyse(replace(s, observations=layout), wheres[-1])
        identical = (None if len(wheres) < 2
                     else same_analysis(wheres[0], wheres[1], [p.name for p in paths] + [MEAN_FILE, SPREAD_FILE]))
        res = compare_layouts(reports, identical)
        if not own:
            shutil.rmtree(d / ANALYSED, ignore_errors=True)
            copies.pop().rename(d / ANALYSED)
        return res | {"obs_fraction": fraction, "synth_s": synth_s}
    finally:
        for c in copies:
            shutil.rmtree(c, ignore_errors=True)
        if own and not keep:
            shutil.rmtree(d, ignore_errors=True)


def analyse_dir(s: LandBenchSetup, d: Path) -> dict | None:
    """Analyse the files in ``d`` on this process's ranks (collective); the report on rank 0, None elsewhere."""
    comm = get_comm()
    paths = [d / f"member_{m:04d}.nc" for m in range(1, s.members + 1)]
    with netCDF4.Dataset(d / "truth.nc") as ds:
        truth = np.asarray(ds.variables[STATE_VAR][:], dtype=np.float64)
    state = StateConfig(variables=[STATE_VAR], coordinates=["land_lon", "land_lat"])
    analysis = AnalysisConfig.model_validate({
        "method": s.method,
        "localization": {"radius": s.cutoff_km, "convention": "cutoff", "metric": "sphere", "max_obs": s.max_obs},
        "observations": s.observations.value,
    })
    comm.barrier()
    t0 = time.perf_counter()
    res = analyse_files(paths, d / "obs.nc", state, analysis, IOConfig(), comm=comm, truth=truth, balance=s.balance,
                        files=AnalysisFiles(mean=d / MEAN_FILE, spread=d / SPREAD_FILE))
    comm.barrier()
    total = time.perf_counter() - t0
    # Stage seconds and local-filter statistics of the slowest rank; local obs averaged over all points.
    ranks = comm.allgather_obj({k: res[k] for k in ("read_s", "analysis_s", "update_s", "output_s", "search_s", "kernel_s")}
                               | {"n_dom_obs": res.get("mean_local_obs", 0.0) * res.get("rank_rows", [0] * comm.size)[comm.rank],
                                  "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0})
    if comm.rank != 0:
        return None
    for k in ("read_s", "analysis_s", "update_s", "output_s", "search_s", "kernel_s"):
        res[k] = max(r[k] for r in ranks)
    res["mean_local_obs"] = sum(r["n_dom_obs"] for r in ranks) / truth.size
    ens_mb = truth.size * s.members * 8 / 2**20
    peak = max(r["peak"] for r in ranks)
    return {
        "size": s.size, "members": s.members, "n_state": int(truth.size), "cutoff_km": s.cutoff_km, "max_obs": s.max_obs,
        "method": s.method, "ranks": comm.size, "balance": s.balance, "observations": s.observations.value,
        "total_s": total, **res, "rank_peak_rss_mb": [r["peak"] for r in ranks],
        "imbalance": res["imbalance_cpu"],  # wall seconds mislead when ranks oversubscribe the cores
        "ms_per_point": res["analysis_s"] / truth.size * 1e3,
        "rmse_ratio": res["rmse_analysis"] / res["rmse_prior"],
        "ensemble_mb": ens_mb, "peak_rss_mb": peak, "peak_rss_over_ensemble": peak / ens_mb,
    }


def main_json(s: LandBenchSetup, directory: Path | None, keep: bool, as_json: bool, layouts: LayoutRuns) -> int:
    res = run(s, directory, keep, layouts)
    print(
        f"land {res['size']}: {res['n_state']} points x {res['members']} members, cut-off {res['cutoff_km']} km, "
        f"{res['mean_local_obs']:.0f} local obs per point\n"
        f"  RMSE vs truth: prior {res['rmse_prior']:.4f} -> analysis {res['rmse_analysis']:.4f} "
        f"(ratio {res['rmse_ratio']:.2f})\n"
        f"  read {res['read_s']:.1f} s, analysis {res['analysis_s']:.1f} s ({res['ms_per_point']:.3f} ms/point; "
        f"local search {res['search_s']:.1f} s, kernel {res['kernel_s']:.1f} s), "
        f"update {res['update_s']:.1f} s, mean/spread {res['output_s']:.1f} s\n"
        f"  peak RSS {res['peak_rss_mb']:.0f} MB = {res['peak_rss_over_ensemble']:.2f} x the ensemble ({res['ensemble_mb']:.0f} MB)"
        f"{' (largest rank)' if res['ranks'] > 1 else ''}\n"
        f"  {res['ranks']} rank(s), {'balanced (equal estimated work)' if res['balance'] else 'I/O row blocks'}: "
        f"imbalance (max/mean) estimated {res['imbalance_est']:.2f}, CPU {res['imbalance_cpu']:.2f}, "
        f"wall {res['imbalance_wall']:.2f}; estimate {res['balance_s']:.2f} s, redistribution {res['redistribute_s']:.2f} s"
    )
    for r in range(res["ranks"]):
        print(f"    rank {r}: {int(res['rank_rows'][r])} rows, est. work {100 * res['rank_est_work'][r]:.1f}%, "
              f"local filter {res['rank_analysis_s'][r]:.2f} s wall, {res['rank_cpu_s'][r]:.2f} s CPU "
              f"(search {res['rank_search_s'][r]:.2f} s, kernel {res['rank_kernel_s'][r]:.2f} s)")
    print(layout_lines(res))
    if as_json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":  # the analysis (each rank under mpiexec), started by _analyse()
    _res = analyse_dir(LandBenchSetup.from_json(sys.argv[1]), Path(sys.argv[2]))
    if _res is not None:
        print(json.dumps(_res))
