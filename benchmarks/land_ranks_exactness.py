"""Issue 11, acceptance 3: the exact analysis of the land problem is the same at every rank count,
balanced or not, and the same as a reference build's (e.g. the code before the balanced analysis).

    python benchmarks/land_ranks_exactness.py --src DIR --ranks 1,2,3,8 [--reference-src OLD/src] [--work W]
        [--size small] [--method ensrf]

``DIR`` holds a synthesized problem (``enkflow synth --size medium --members 40 --out DIR``); it is
not modified: every run gets a fresh copy, because ``enkflow bench land`` updates the members in
place. ``--reference-src`` is the ``src/`` of another checkout (``git worktree add OLD COMMIT``,
with its compiled ``_lanes*.so`` built in place), run at 1 rank with ``PYTHONPATH`` pointing at it.
Prints each run's timings and imbalance, then the largest absolute difference of every run's
analysis ensemble (all members) from the first run's, and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import netCDF4
import numpy as np

VAR = "soil_moisture"


def _copy(src: Path, dst: Path) -> int:
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    members = sorted(src.glob("member_*.nc"))
    for p in members + [src / "obs.nc", src / "truth.nc"]:
        shutil.copy2(p, dst / p.name)
    return len(members)


def _bench(d: Path, members: int, ranks: int, size: str, method: str | None, env: dict | None = None,
           new_cli: bool = True) -> dict:
    cmd = [sys.executable, "-m", "enkflow", "bench", "land", "--size", size, "--members", str(members),
           "--dir", str(d), "--json"]
    if method is not None:  # None: the bench's default (a reference checkout may not know the option)
        cmd += ["--method", method]
    if new_cli:
        cmd += ["--ranks", str(ranks)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ensemble(d: Path, members: int) -> np.ndarray:
    out = []
    for m in range(1, members + 1):
        with netCDF4.Dataset(d / f"member_{m:04d}.nc") as ds:
            out.append(np.asarray(ds.variables[VAR][:], dtype=np.float64))
    return np.stack(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, required=True, help="a synthesized land problem (left unchanged)")
    ap.add_argument("--ranks", default="1,2,3,8")
    ap.add_argument("--reference-src", type=Path, help="src/ of a reference checkout, run at 1 rank")
    ap.add_argument("--work", type=Path, default=Path("land-exactness"))
    ap.add_argument("--size", default="medium", help="the size the problem in --src was synthesized at")
    ap.add_argument("--method", default=None, help="the analysis method (default: the bench's, lestkf)")
    a = ap.parse_args()
    runs: list[tuple[str, Path, dict]] = []
    if a.reference_src:
        d = a.work / "reference"
        members = _copy(a.src, d)
        env = dict(os.environ, PYTHONPATH=str(a.reference_src.resolve()))
        runs.append(("reference, 1 rank", d, _bench(d, members, 1, a.size, a.method, env, new_cli=False)))
    for p in (int(x) for x in a.ranks.split(",")):
        d = a.work / f"ranks{p}"
        members = _copy(a.src, d)
        runs.append((f"{p} rank(s), balanced", d, _bench(d, members, p, a.size, a.method)))
    first = _ensemble(runs[0][1], members)
    scale = float(np.abs(first).max())
    report = []
    for name, d, res in runs:
        diff = float(np.abs(_ensemble(d, members) - first).max())
        report.append({"run": name, "analysis_s": res["analysis_s"], "imbalance_est": res.get("imbalance_est"),
                       "imbalance_cpu": res.get("imbalance_cpu"), "rmse_analysis": res["rmse_analysis"],
                       "max_abs_diff": diff, "max_rel_diff": diff / scale})
        print(f"{name:24s} analysis {res['analysis_s']:7.1f} s  imbalance est {res.get('imbalance_est', float('nan')):.2f} "
              f"CPU {res.get('imbalance_cpu', float('nan')):.2f}  RMSE {res['rmse_analysis']:.7f}  "
              f"max |diff| vs {runs[0][0]}: {diff:.3g}")
    print(json.dumps({"runs": report, "max_rel_diff": max(r["max_rel_diff"] for r in report)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
