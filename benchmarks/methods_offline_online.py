"""Each analysis method through an offline and an online study of the demo problem: the same bits
(issue 26, acceptance 3).

    python benchmarks/methods_offline_online.py [--dir DIR] [--members 8] [--cycles 3] [--only NAME]

For every case of :data:`CASES` (each method of issue 26, with and without an adaptive scheme, LETKF as the
reference) it runs ``enkflow demo``'s twin experiment twice, ``mode = "offline"`` (restart files, the job
scheme, the analysis task) and ``mode = "online"`` (the assimilation server and runners), and compares
every member's final restart and every cycle's analysis mean and spread, value for value. Prints one line per
case and a JSON last line; exits 1 if a case differs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.apps.demo import DemoSettings, run_demo
from enkflow.config import AdaptiveTarget, Method

CASES: dict[str, dict] = {
    "letkf": {},
    "ensrf": {"method": Method.ENSRF},
    "ensrf+anderson2009": {"method": Method.ENSRF, "adaptive": "anderson2009"},
    "lnetf": {"method": Method.LNETF, "method_options": {"rs": 2.0, "rotate": True}},
    "lnetf+gharamti2018 posterior": {"method": Method.LNETF, "method_options": {"rs": 2.0},
                                     "adaptive": "gharamti2018", "adaptive_target": AdaptiveTarget.POSTERIOR},
    "enkf-n": {"method": Method.ENKF_N, "method_options": {"xn": 2.0, "rotate": True}},
    "letkf+gharamti2018": {"adaptive": "gharamti2018"},
}


def _var(path: Path) -> np.ndarray:
    with netCDF4.Dataset(path) as ds:
        return np.asarray(ds["soil_moisture"][:])


def _outputs(d: Path, members: int, cycles: int) -> list[Path]:
    files = [Path(f"members/member_{m:04d}.nc") for m in range(1, members + 1)]
    return files + [Path(f"run/cycles/{k:04d}/analysis_{s}.nc") for k in range(1, cycles + 1) for s in ("mean", "spread")]


def compare(work: Path, name: str, members: int, cycles: int) -> dict:
    """One case both ways; the files that differ."""
    out = {}
    for mode in ("offline", "online"):
        s = DemoSettings(members=members, cycles=cycles, mode=mode, runners=2, **CASES[name])
        out[mode] = run_demo(work / mode, s, say=lambda _: None)
    differ = [str(f) for f in _outputs(work, members, cycles)
              if not np.array_equal(_var(work / "offline" / f), _var(work / "online" / f))]
    return {"case": name, "identical": not differ, "differ": differ, "rmse_offline": out["offline"]["rmse"][cycles],
            "rmse_online": out["online"]["rmse"][cycles]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a temporary one, removed)")
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--only", action="append", choices=sorted(CASES), help="a case; repeatable")
    a = ap.parse_args()
    root = a.dir or Path(tempfile.mkdtemp(prefix="enkflow-methods-"))
    rows = []
    try:
        for name in a.only or CASES:
            r = compare(root / name.replace(" ", "_").replace("+", "_"), name, a.members, a.cycles)
            rows.append(r)
            print(f"{name:30s} {'identical' if r['identical'] else 'DIFFERENT ' + ', '.join(r['differ'])}  "
                  f"(final analysis RMSE {r['rmse_offline']:.5f} offline, {r['rmse_online']:.5f} online)", flush=True)
    finally:
        if a.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(rows))
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
