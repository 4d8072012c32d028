"""`enkflow bench land`: the synthetic global land problem of Zheng et al.
(GMD 2020) analysed from its restart files, as an offline cycle would.

``enkflow synth`` writes the member, truth and observation files in a child
process (so the land-mask package's memory is not counted here); then this
process reads the N_e restarts, runs the local filter on the sphere, updates
the files in place (crash-safe) and writes the analysis mean and spread. It
reports the RMSE of the prior and analysis means against the truth, the time
of each stage and the peak resident memory against the ensemble's size.

With ``ranks`` > 1 the analysis runs under ``mpiexec -n ranks`` (this module's
``__main__``, one process per rank); with ``balance`` (default) every rank
analyses rows of equal estimated cost, otherwise its I/O row block. Either way
the report gives each rank's seconds in the local filter (wall and CPU), its
share of the estimated work and the imbalance (max / mean over ranks).
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
from dataclasses import asdict, dataclass
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.config import AnalysisConfig
from enkflow.errors import InputError
from enkflow.experiment.analysis_step import AnalysisFiles, analyse_files
from enkflow.io.config import IOConfig
from enkflow.parallel import get_comm
from enkflow.parallel.program import find_program
from enkflow.state import StateConfig

STATE_VAR = "soil_moisture"


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


def _synthesize(s: LandBenchSetup, out: Path) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "enkflow", "synth", "--size", s.size, "--members", str(s.members),
           "--out", str(out), "--seed", str(s.seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise InputError(f"enkflow synth failed:\n{proc.stderr[-2000:]}", item="size")
    return time.perf_counter() - t0


def run(s: LandBenchSetup, directory: Path | None = None, keep: bool = False) -> dict:
    """Synthesize (unless ``directory`` already holds the files) and analyse once, in this
    process (``s.ranks`` == 1) or under mpiexec."""
    own = directory is None
    d = Path(tempfile.mkdtemp(prefix="enkflow-land-")) if own else Path(directory)
    try:
        synth_s = 0.0
        if not (d / "obs.nc").exists():
            d.mkdir(parents=True, exist_ok=True)
            synth_s = _synthesize(s, d)
        paths = [d / f"member_{m:04d}.nc" for m in range(1, s.members + 1)]
        missing = [p for p in paths if not p.exists()]
        if missing:
            raise InputError(f"{missing[0]} is missing: the directory holds fewer than {s.members} members", item="members")
        if s.ranks <= 1:
            res = analyse_dir(s, d)
        else:
            mpiexec = find_program("mpiexec")
            if mpiexec is None:
                raise InputError("--ranks > 1 needs mpiexec (the `mpich` wheel: pip install mpich)", item="ranks")
            env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
            cmd = [mpiexec, "-n", str(s.ranks), sys.executable, "-m", "enkflow.bench.land", json.dumps(asdict(s)), str(d)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                raise InputError(f"mpiexec -n {s.ranks} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}", item="ranks")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
        res["synth_s"] = synth_s
        return res
    finally:
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
    })
    comm.barrier()
    t0 = time.perf_counter()
    res = analyse_files(paths, d / "obs.nc", state, analysis, IOConfig(), comm=comm, truth=truth, balance=s.balance,
                        files=AnalysisFiles(mean=d / "analysis_mean.nc", spread=d / "analysis_spread.nc"))
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
        "method": s.method, "ranks": comm.size, "balance": s.balance, "total_s": total, **res,
        "imbalance": res["imbalance_cpu"],  # wall seconds mislead when ranks oversubscribe the cores
        "ms_per_point": res["analysis_s"] / truth.size * 1e3,
        "rmse_ratio": res["rmse_analysis"] / res["rmse_prior"],
        "ensemble_mb": ens_mb, "peak_rss_mb": peak, "peak_rss_over_ensemble": peak / ens_mb,
    }


def main_json(s: LandBenchSetup, directory: Path | None, keep: bool, as_json: bool) -> int:
    res = run(s, directory, keep)
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
    if as_json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":  # each rank under mpiexec, started by run()
    _res = analyse_dir(LandBenchSetup(**json.loads(sys.argv[1])), Path(sys.argv[2]))
    if _res is not None:
        print(json.dumps(_res))
