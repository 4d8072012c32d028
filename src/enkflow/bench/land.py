"""`enkflow bench land`: the synthetic global land problem of Zheng et al.
(GMD 2020) analysed from its restart files, as an offline cycle would.

``enkflow synth`` writes the member, truth and observation files in a child
process (so the land-mask package's memory is not counted here); then this
process reads the N_e restarts, runs the local filter on the sphere, updates
the files in place (crash-safe) and writes the analysis mean and spread. It
reports the RMSE of the prior and analysis means against the truth, the time
of each stage and the peak resident memory against the ensemble's size.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from enkflow.config import AnalysisConfig
from enkflow.errors import InputError
from enkflow.io.config import IOConfig
from enkflow.state import StateConfig

STATE_VAR = "soil_moisture"


@dataclass(frozen=True, kw_only=True)
class LandBenchSetup:
    size: str = "medium"
    members: int = 40
    cutoff_km: float = 150.0  # GC weight reaches 0 here (PDAF's cut-off radius)
    method: str = "lestkf"
    seed: int = 0


def _synthesize(s: LandBenchSetup, out: Path) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "enkflow", "synth", "--size", s.size, "--members", str(s.members),
           "--out", str(out), "--seed", str(s.seed)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise InputError(f"enkflow synth failed:\n{proc.stderr[-2000:]}", item="size")
    return time.perf_counter() - t0


def run(s: LandBenchSetup, directory: Path | None = None, keep: bool = False) -> dict:
    """Synthesize (unless ``directory`` already holds the files) and analyse once."""
    import netCDF4

    from enkflow.experiment.analysis_step import analyse_files

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
        with netCDF4.Dataset(d / "truth.nc") as ds:
            truth = np.asarray(ds.variables[STATE_VAR][:], dtype=np.float64)
        state = StateConfig(variables=[STATE_VAR], coordinates=["land_lon", "land_lat"])
        analysis = AnalysisConfig.model_validate({
            "method": s.method,
            "localization": {"radius": s.cutoff_km, "convention": "cutoff", "metric": "sphere"},
        })
        t0 = time.perf_counter()
        res = analyse_files(paths, d / "obs.nc", state, analysis, IOConfig(), truth=truth,
                            mean_path=d / "analysis_mean.nc", spread_path=d / "analysis_spread.nc")
        total = time.perf_counter() - t0
        ens_mb = truth.size * s.members * 8 / 2**20
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        return {
            "size": s.size, "members": s.members, "n_state": int(truth.size), "cutoff_km": s.cutoff_km,
            "method": s.method, "synth_s": synth_s, "total_s": total, **res,
            "ms_per_point": res["analysis_s"] / truth.size * 1e3,
            "rmse_ratio": res["rmse_analysis"] / res["rmse_prior"],
            "ensemble_mb": ens_mb, "peak_rss_mb": peak, "peak_rss_over_ensemble": peak / ens_mb,
        }
    finally:
        if own and not keep:
            shutil.rmtree(d, ignore_errors=True)


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
    )
    if as_json:
        print(json.dumps(res))
    return 0
